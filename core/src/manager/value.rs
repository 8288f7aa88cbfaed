//! Lock value blocks: 32 bytes carried with each lock, written by exclusive holders and handed
//! to every grant, invalid once an exclusive holder is lost without writing.
//!
//! The rules are the Linux DLM's lock value block (LVB), which it took from the VMS lock
//! manager: a holder in a mode that can write (PW or EX there; exclusive here) writes the
//! block when it converts down or unlocks, every grant returns the current block, and when a
//! holder that could write goes away without doing so — its node died — the block is marked
//! invalid (the DLM's `DLM_SBF_VALNOTVALID`), because the holder may have changed what the
//! block describes. Readers cannot write. A sequence number counts the writes (the DLM's
//! `lvbseq`), which is how a recovering server picks the newest copy a re-claim offers.
//!
//! # Why 32 bytes
//!
//! 32 is the Linux DLM's `DLM_LVB_LEN` and holds what an engine puts there: a page LSN (8), the
//! node holding the newest copy (4), an epoch or version (8), a CRC of the block (4) and spare.
//! 16 bytes cannot hold an LSN, a node, an epoch and a CRC together. Each of the 31 commands
//! of a message may return one, so a response grows by 31 × 40 bytes (block, sequence, flags;
//! see `proto::value`), which the mailboxes must hold; the per-lock cost is 40 bytes
//! (51,200 locks: 2 MB).
//!
//! # Transitions
//!
//! | state        | event                                                       | after                          |
//! |--------------|-------------------------------------------------------------|--------------------------------|
//! | (new lock)   | created                                                     | zeros, valid, seq 0 ([`LockValue::FRESH`]) |
//! | any          | exclusive unlock or downgrade carrying a block              | that block, valid, seq + 1     |
//! | any          | exclusive unlock or downgrade without a block               | unchanged                      |
//! | any          | shared unlock carrying a block                              | unchanged; the write is ignored |
//! | any          | an exclusive grant lost: death, deinit, lapse, expiry taken over, preemption | invalid (bytes and seq kept) |
//! | any          | a shared grant lost                                         | unchanged                      |
//! | (failover)   | the replacement server creates the lock                     | zeros, invalid, seq 0 ([`LockValue::UNKNOWN`]) |
//! | recovering   | a re-claim of a grant supplies a valid block, newer (or ours invalid) | that block, valid, its seq |
//!
//! A re-claim of a *shared* grant may restore the block too, beyond the integration spec (which
//! names only exclusive re-claimers): while a client held a shared grant no exclusive holder
//! could write, so the block it received is the block the failed server held. The Linux DLM's
//! recovery likewise takes the block from a PR holder when no PW/EX holder is left.

use crate::ids::Mode;
use crate::status::Status;

/// Bytes in a lock value block.
pub const VALUE_BLOCK_LEN: usize = 32;

/// A lock value block: opaque bytes the engine keeps with a lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ValueBlock(pub [u8; VALUE_BLOCK_LEN]);

impl ValueBlock {
    /// All zeros.
    pub const ZERO: ValueBlock = ValueBlock([0; VALUE_BLOCK_LEN]);

    /// The block holding `bytes`, zero-padded: `Einval` for more than [`VALUE_BLOCK_LEN`] bytes
    /// (the API boundary's check; an engine with 16 bytes to keep passes 16).
    #[inline]
    pub fn from_slice(bytes: &[u8]) -> Result<ValueBlock, Status> {
        let mut block = ValueBlock::ZERO;
        block
            .0
            .get_mut(..bytes.len())
            .ok_or(Status::Einval)?
            .copy_from_slice(bytes);
        Ok(block)
    }

    /// The bytes.
    #[inline]
    pub const fn as_bytes(&self) -> &[u8; VALUE_BLOCK_LEN] {
        &self.0
    }
}

/// A lock's value block as a grant returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRead {
    /// The bytes (the last ones written, also when invalid).
    pub block: ValueBlock,
    /// Writes so far, mod 2^32.
    pub seq: u32,
    /// False once an exclusive holder was lost without writing, until the next write.
    pub valid: bool,
}

/// What became of a write offered with an unlock or downgrade ([`LockValue::release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum ValueWrite {
    /// The block was stored.
    Written,
    /// Nothing was offered; the block is as it was.
    Unchanged,
    /// A shared holder offered a block: readers cannot write (count it; the unlock proceeds).
    Ignored,
}

/// One lock's value block with its sequence and validity: 40 bytes of integers, and all zeros
/// is [`LockValue::FRESH`], so a zeroed region part needs no initialisation. The server writes
/// `FRESH` when it creates a lock in a slot used before (a new lock must not inherit its
/// predecessor's block), and [`LockValue::UNKNOWN`] when it creates one while recovering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct LockValue {
    block: [u8; VALUE_BLOCK_LEN],
    seq: u32,
    flags: u32,
}

static_assertions::const_assert_eq!(core::mem::size_of::<LockValue>(), 40);

impl LockValue {
    /// The flag bit set while the block is invalid (so that zero is valid).
    const INVALID: u32 = 1;

    /// A lock just created: zeros, valid.
    pub const FRESH: LockValue = LockValue {
        block: [0; VALUE_BLOCK_LEN],
        seq: 0,
        flags: 0,
    };

    /// A lock created by a replacement server after a failover, before any re-claim: nothing
    /// is known, so the block is invalid.
    pub const UNKNOWN: LockValue = LockValue {
        block: [0; VALUE_BLOCK_LEN],
        seq: 0,
        flags: Self::INVALID,
    };

    /// What a grant returns.
    #[inline]
    pub const fn read(&self) -> ValueRead {
        ValueRead {
            block: ValueBlock(self.block),
            seq: self.seq,
            valid: self.flags & Self::INVALID == 0,
        }
    }

    /// An unlock or downgrade of a grant in `mode`, offering `written` (module doc).
    #[inline]
    pub fn release(&mut self, mode: Mode, written: Option<&ValueBlock>) -> ValueWrite {
        match (mode, written) {
            (_, None) => ValueWrite::Unchanged,
            (Mode::Shared, Some(_)) => ValueWrite::Ignored,
            (Mode::Exclusive, Some(b)) => {
                self.block = b.0;
                self.seq = self.seq.wrapping_add(1);
                self.flags &= !Self::INVALID;
                ValueWrite::Written
            }
        }
    }

    /// A grant in `mode` ended without its holder's unlock or downgrade: its client died or
    /// deinitialised, its revoke lapsed, its expired grant was taken over, or it was preempted.
    /// An exclusive holder may have changed what the block describes, so it is invalid now.
    #[inline]
    pub fn grant_lost(&mut self, mode: Mode) {
        if mode == Mode::Exclusive {
            self.flags |= Self::INVALID;
        }
    }

    /// A re-claim after a failover offers the block its grant came with; true if it was taken
    /// (valid, and newer than ours or ours invalid).
    #[inline]
    pub fn reclaim(&mut self, offered: &ValueRead) -> bool {
        let ours = self.read();
        let take = offered.valid && (!ours.valid || seq_after(offered.seq, ours.seq));
        if take {
            self.block = offered.block.0;
            self.seq = offered.seq;
            self.flags &= !Self::INVALID;
        }
        take
    }
}

/// Whether write count `a` is later than `b`, mod 2^32 (as fair tickets compare mod 2^16).
#[inline]
pub const fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use Mode::{Exclusive as EX, Shared as SH};

    fn block(b: u8) -> ValueBlock {
        ValueBlock([b; VALUE_BLOCK_LEN])
    }

    #[test]
    fn a_block_longer_than_32_bytes_is_einval_and_a_shorter_one_is_padded() {
        assert_eq!(ValueBlock::from_slice(&[1; 33]), Err(Status::Einval));
        assert_eq!(ValueBlock::from_slice(&[1; 1000]), Err(Status::Einval));
        assert_eq!(ValueBlock::from_slice(&[7; 32]), Ok(block(7)));
        let short = ValueBlock::from_slice(&[9; 16]).unwrap();
        assert_eq!(short.as_bytes()[..16], [9; 16]);
        assert_eq!(short.as_bytes()[16..], [0; 16]);
        assert_eq!(ValueBlock::from_slice(&[]), Ok(ValueBlock::ZERO));
    }

    #[test]
    fn a_zeroed_record_is_a_fresh_lock() {
        let zeroed = LockValue {
            block: [0; VALUE_BLOCK_LEN],
            seq: 0,
            flags: 0,
        };
        assert_eq!(zeroed, LockValue::FRESH);
    }

    #[test]
    fn a_new_lock_has_a_valid_zero_block_and_a_failed_over_one_an_invalid_one() {
        let r = LockValue::FRESH.read();
        assert_eq!((r.block, r.seq, r.valid), (ValueBlock::ZERO, 0, true));
        assert!(!LockValue::UNKNOWN.read().valid);
    }

    #[test]
    fn an_exclusive_release_writes_and_counts_and_a_silent_one_keeps_the_block() {
        let mut v = LockValue::FRESH;
        assert_eq!(v.release(EX, Some(&block(3))), ValueWrite::Written);
        assert_eq!(
            v.read(),
            ValueRead {
                block: block(3),
                seq: 1,
                valid: true
            }
        );
        assert_eq!(v.release(EX, None), ValueWrite::Unchanged);
        assert_eq!(
            v.read(),
            ValueRead {
                block: block(3),
                seq: 1,
                valid: true
            }
        );
        // A downgrade is an exclusive release that keeps a shared grant: the same rule.
        assert_eq!(v.release(EX, Some(&block(4))), ValueWrite::Written);
        assert_eq!((v.read().block, v.read().seq), (block(4), 2));
    }

    #[test]
    fn a_reader_cannot_write() {
        let mut v = LockValue::FRESH;
        assert_eq!(v.release(SH, Some(&block(5))), ValueWrite::Ignored);
        assert_eq!(v, LockValue::FRESH);
        assert_eq!(v.release(SH, None), ValueWrite::Unchanged);
    }

    #[test]
    fn an_exclusive_holder_lost_without_writing_invalidates_until_the_next_write() {
        let mut v = LockValue::FRESH;
        assert_eq!(v.release(EX, Some(&block(1))), ValueWrite::Written);
        v.grant_lost(SH);
        assert!(v.read().valid, "a reader's death changes nothing");
        v.grant_lost(EX);
        let r = v.read();
        assert_eq!(
            (r.block, r.seq, r.valid),
            (block(1), 1, false),
            "bytes kept, invalid"
        );
        assert_eq!(v.release(EX, None), ValueWrite::Unchanged);
        assert!(
            !v.read().valid,
            "a release without a block does not make it valid"
        );
        assert_eq!(v.release(EX, Some(&block(2))), ValueWrite::Written);
        assert_eq!(
            v.read(),
            ValueRead {
                block: block(2),
                seq: 2,
                valid: true
            }
        );
    }

    #[test]
    fn after_a_failover_the_newest_valid_reclaimed_block_wins() {
        let mut v = LockValue::UNKNOWN;
        let offer = |b: u8, seq: u32, valid: bool| ValueRead {
            block: block(b),
            seq,
            valid,
        };
        assert!(
            !v.reclaim(&offer(1, 9, false)),
            "an invalid copy restores nothing"
        );
        assert!(!v.read().valid);
        assert!(v.reclaim(&offer(2, 5, true)));
        assert!(!v.reclaim(&offer(3, 4, true)), "an older copy");
        assert!(!v.reclaim(&offer(3, 5, true)), "the same write again");
        assert!(v.reclaim(&offer(4, 6, true)));
        assert_eq!(v.read(), offer(4, 6, true));
        // The count wraps: 1 is after u32::MAX.
        let mut w = LockValue::UNKNOWN;
        assert!(w.reclaim(&offer(5, u32::MAX, true)));
        assert!(w.reclaim(&offer(6, 1, true)));
        assert_eq!(w.read().seq, 1);
    }

    #[test]
    fn write_counts_compare_mod_2_32() {
        assert!(seq_after(1, 0) && !seq_after(0, 1) && !seq_after(5, 5));
        assert!(seq_after(0, u32::MAX));
        assert!(seq_after(0x7FFF_FFFF, 0) && !seq_after(0x8000_0000, 0));
    }
}
