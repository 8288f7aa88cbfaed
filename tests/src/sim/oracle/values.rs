//! The oracle's rule for lock value blocks: a block read with a grant after a valid release is
//! the block last written, and one read after an exclusive holder was lost without writing it
//! (death, deinit) or after a failover is invalid, unless a re-claim offered a valid one (the
//! real client's claims carry the block their grant came with; the model clients' supply none).
//!
//! The model follows each lock name's block from what crosses the wire:
//!
//! | event                                                        | the model's block     |
//! |--------------------------------------------------------------|-----------------------|
//! | the name gets a lock id it did not have (created anew)        | unknown              |
//! | a recovering server restores the name from a claim            | invalid              |
//! | it accepts a grant's claim offering a valid block, newer than any taken so far (or the first) | that block, valid (`LockValue::reclaim`) |
//! | an exclusive unlock or downgrade carrying a block succeeds    | that block, valid    |
//! | an exclusive holder removed while its grant runs              | invalid              |
//! | one removed, or taken over, whose grant the model saw run out | unknown (the server invalidates only a holder still in the word) |
//! | a grant reads a block                                         | checked against the model, then the model takes it |
//!
//! "Unknown" checks nothing and learns from the next read; it is where the model cannot tell
//! what the server knows (an expired holder's word, a lapse the server ran lazily).

use dlock_core::manager::value::{ValueBlock, ValueRead, seq_after};

/// What the model knows of one lock name's value block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Block {
    /// Nothing to check against.
    #[default]
    Unknown,
    /// The block last written (or read valid), which the next read must return, valid.
    Known(ValueBlock),
    /// Lost without a write: the next read must say invalid.
    Invalid,
}

/// The value blocks of every lock name, and the lock id each one belongs to.
#[derive(Debug, Default)]
pub struct Values {
    blocks: Vec<Block>,
    ids: Vec<u32>,
    /// The write count of the block a recovering server took from a claim, per name, while
    /// it is the model's block: a later claim's block replaces it only if newer.
    reclaimed: Vec<Option<u32>>,
    /// Blocks read and compared.
    pub checks: u64,
}

impl Values {
    /// The model for `names` lock names, knowing nothing.
    pub fn new(names: usize) -> Self {
        Values {
            blocks: vec![Block::Unknown; names],
            ids: vec![0; names],
            reclaimed: vec![None; names],
            checks: 0,
        }
    }

    /// A new server took over: lock ids start afresh (the same id may name another lock).
    pub fn new_incarnation(&mut self) {
        self.ids.fill(0);
    }

    /// Name `name` now has lock id `raw`: a new id is a new lock, whose block the model does
    /// not know, or, restored by a claim (`claimed`), an invalid one.
    pub fn named(&mut self, name: usize, raw: u32, claimed: bool) {
        if self.ids[name] != raw {
            self.ids[name] = raw;
            self.reclaimed[name] = None;
            self.blocks[name] = match claimed {
                true => Block::Invalid,
                false => Block::Unknown,
            };
        }
    }

    /// A recovering server accepted a claim of a grant of `name` offering `offered`: it takes
    /// a valid block if its own is invalid or the offer is newer.
    pub fn reclaim(&mut self, name: usize, offered: &ValueRead) {
        let take = offered.valid
            && match (self.blocks[name], self.reclaimed[name]) {
                (Block::Invalid, _) => true,
                (_, Some(seq)) => seq_after(offered.seq, seq),
                // Known or unknown apart from a claim: the server's seq is not the model's.
                (_, None) => false,
            };
        if take {
            self.blocks[name] = Block::Known(offered.block);
            self.reclaimed[name] = Some(offered.seq);
        }
    }

    /// What the model knows of `name`'s block now.
    pub fn block(&self, name: usize) -> Block {
        self.blocks[name]
    }

    /// An exclusive release of `name` succeeded, writing `written` if any.
    pub fn released(&mut self, name: usize, written: Option<ValueBlock>) {
        if let Some(b) = written {
            self.blocks[name] = Block::Known(b);
            self.reclaimed[name] = None;
        }
    }

    /// An exclusive grant of `name` ended without a release: `running` if the model saw it
    /// still run (the server then invalidates the block), else the model cannot tell.
    pub fn lost(&mut self, name: usize, running: bool) {
        self.blocks[name] = match running {
            true => Block::Invalid,
            false => Block::Unknown,
        };
        self.reclaimed[name] = None;
    }

    /// A grant of `name` to `client` at `now` read `read`: checked, then taken as the block.
    pub fn read(
        &mut self,
        name: usize,
        read: &ValueRead,
        client: u32,
        now: u64,
    ) -> Result<(), String> {
        self.checks += 1;
        // A known block may be read invalid: the server also invalidates it for losses the
        // model does not see (a fair grant passed by its queue, a lapse run lazily), and the
        // model learns it from the read. What it may never read is another block as valid.
        let wrong = match self.blocks[name] {
            Block::Unknown => false,
            Block::Known(b) => read.valid && read.block != b,
            Block::Invalid => read.valid,
        };
        if wrong {
            return Err(format!(
                "lock {name}: client {client:#x} granted at {now} read the value block {:?} (valid {}, seq {}), \
                 while the model's is {:?}",
                &read.block.as_bytes()[..8],
                read.valid,
                read.seq,
                self.blocks[name]
            ));
        }
        self.blocks[name] = match read.valid {
            true => Block::Known(read.block),
            false => Block::Invalid,
        };
        // A grant ends the recovery the claims were part of: no claim comes after it.
        self.reclaimed[name] = None;
        Ok(())
    }
}
