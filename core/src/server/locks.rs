//! Named locks: `get_lock` and `release_lock` (control path).
//!
//! A lock exists while at least one client holds a reference to it. `get_lock` creates the lock
//! or joins it by name (1–512 opaque bytes, compared byte-exactly) and records the client's
//! reference; `release_lock` drops it, refused while the client still holds a grant or a ticket.
//! When the last reference goes, the slot is freed and its generation moves on, so every id
//! issued for it becomes stale.

use super::{Counter, Server};
use crate::config::NAME_LEN_MAX;
use crate::ids::{ClientId, LockId, LockKind, Mode, next_generation};
use crate::manager::{GrantState, LockValue};
use crate::status::Status;
use crate::table::{LockCell, LockMeta, SlotState};
use crate::word::{atomic, rw};

/// Whether `name` is a valid lock or object name.
#[inline]
pub(super) fn valid_name(name: &[u8]) -> bool {
    (1..=NAME_LEN_MAX).contains(&name.len())
}

impl<'r> Server<'r> {
    /// Creates or joins the lock `name` of `kind` and records client `raw`'s reference.
    /// Idempotent for a client that already holds a reference. A name that exists with another
    /// kind is `Einval` (the reference returns -1).
    pub fn get_lock(
        &mut self,
        raw: u32,
        kind: LockKind,
        name: &[u8],
        now_ms: u64,
    ) -> Result<LockId, Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(raw, now_ms)
            .map_err(|s| self.refuse(s))?;
        self.get_lock_for(slot, kind, name, now_ms)
            .map_err(|s| self.refuse(s))
    }

    /// `get_lock` for a client slot already checked.
    ///
    /// On a cluster server the name's partition must be owned and served here now (else
    /// `PartitionMoved`, or `NotReady` while it recovers); a re-claim goes through
    /// [`Self::claim_lock_for`] instead.
    pub(super) fn get_lock_for(
        &mut self,
        slot: u32,
        kind: LockKind,
        name: &[u8],
        now_ms: u64,
    ) -> Result<LockId, Status> {
        if !valid_name(name) {
            return Err(Status::Einval);
        }
        let partition = self.partition_for_name(name, now_ms)?;
        self.lock_in(slot, kind, name, partition)
    }

    /// Creates or joins lock `name` of `kind` in `partition` (already checked) for `slot`.
    pub(super) fn lock_in(
        &mut self,
        slot: u32,
        kind: LockKind,
        name: &[u8],
        partition: u16,
    ) -> Result<LockId, Status> {
        let hash = crate::table::index::hash_name(self.name_key, name);
        let names = &*self.t.lock_names;
        if let Some(lock) = self
            .t
            .lock_index
            .find(hash, |i| names[i as usize].name() == name)
        {
            let state = SlotState(self.t.lock_meta[lock as usize].state);
            if state.kind() != kind {
                return Err(Status::Einval);
            }
            self.add_lock_ref(slot, lock);
            return Ok(LockId::new(lock, state.generation()));
        }
        let lock = self.t.lock_free.pop().ok_or(Status::ServerNoResource)?;
        let generation =
            next_generation(SlotState(self.t.lock_meta[lock as usize].state).generation());
        self.t.lock_meta[lock as usize] = LockMeta {
            state: SlotState::live(generation, kind).in_partition(partition).0,
            refs: 0,
        };
        self.t.lock_cells[lock as usize] = LockCell::default();
        self.t.lock_manager[lock as usize] = crate::table::LockManagerCell::default();
        // A new lock never inherits its slot's last block. One created while the server
        // recovers may be one a failed server held, whose block nobody knows until a re-claim
        // supplies it: invalid until then (the Linux DLM's rule after recovery).
        self.t.lock_values[lock as usize] = match self.recovering {
            0 => LockValue::FRESH,
            _ => LockValue::UNKNOWN,
        };
        self.t.lock_names[lock as usize].set(hash, name);
        self.t.lock_index.insert(hash, lock);
        self.add_lock_ref(slot, lock);
        Ok(LockId::new(lock, generation))
    }

    /// The slot of the live lock named `name`.
    pub(super) fn find_lock(&self, name: &[u8]) -> Option<u32> {
        self.find_lock_hashed(crate::table::index::hash_name(self.name_key, name), name)
    }

    fn find_lock_hashed(&self, hash: u32, name: &[u8]) -> Option<u32> {
        let names = &*self.t.lock_names;
        self.t
            .lock_index
            .find(hash, |i| names[i as usize].name() == name)
    }

    fn add_lock_ref(&mut self, slot: u32, lock: u32) {
        if self.t.lock_refs.get(slot, lock) == 0 {
            self.t.lock_refs.set(slot, lock, 1);
            self.t.lock_meta[lock as usize].refs += 1;
            self.t.clients[slot as usize].lock_refs += 1;
        }
    }

    /// Drops client `raw`'s reference to `lock`. Refused with `Fail` while the client holds a
    /// grant on it and `TicketToUnlock` while it holds a fair-lock ticket.
    pub fn release_lock(&mut self, raw: u32, lock: u32, now_ms: u64) -> Result<(), Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(raw, now_ms)
            .map_err(|s| self.refuse(s))?;
        self.release_lock_for(slot, lock)
            .map_err(|s| self.refuse(s))
    }

    /// `release_lock` for a client slot already checked.
    pub(super) fn release_lock_for(&mut self, slot: u32, raw_lock: u32) -> Result<(), Status> {
        let id = self.referenced_lock(slot, raw_lock)?;
        let me = ClientId::new(self.t.clients[slot as usize].id).ok_or(Status::ClientNotInit)?;
        let hold = self.current_hold(slot, me, id.index());
        if hold.ticket_mode().is_some() {
            return Err(Status::TicketToUnlock);
        }
        if !hold.is_none() {
            return Err(Status::Fail);
        }
        self.drop_lock_ref(slot, id);
        Ok(())
    }

    /// The lock `raw_lock` if it is live at the id's generation and client `slot` references it.
    #[inline]
    pub(super) fn referenced_lock(&self, slot: u32, raw_lock: u32) -> Result<LockId, Status> {
        self.referenced_lock_state(slot, raw_lock).map(|(id, _)| id)
    }

    /// [`Self::referenced_lock`] with the slot's state (kind and generation).
    #[inline]
    pub(super) fn referenced_lock_state(
        &self,
        slot: u32,
        raw_lock: u32,
    ) -> Result<(LockId, SlotState), Status> {
        let id = LockId::from_raw(raw_lock).ok_or(Status::Einval)?;
        let index = id.index();
        let meta = self
            .t
            .lock_meta
            .get(index as usize)
            .ok_or(Status::LockNotGet)?;
        let state = SlotState(meta.state);
        if !state.is_live()
            || state.generation() != id.generation()
            || self.t.lock_refs.get(slot, index) == 0
        {
            return Err(Status::LockNotGet);
        }
        Ok((id, state))
    }

    /// What client `slot` holds on `lock`, as the holds grid records it. A code no state has
    /// (only a bug or memory scribbled from outside can write one) reads as nothing held: the
    /// data path never panics on it, and a grant it hid is one the lock word still names.
    #[inline]
    pub(super) fn recorded_hold(&self, slot: u32, lock: u32) -> GrantState {
        GrantState::from_bits(self.t.lock_holds.get(slot, lock)).unwrap_or(GrantState::None)
    }

    /// What client `slot` holds on `lock`, after discarding an exclusive record that the lock
    /// word no longer backs (the grant was taken over after it expired).
    ///
    /// Always inlined: left to the compiler, it was called out of line from the data path's
    /// command loop, once per command.
    #[inline(always)]
    pub(super) fn current_hold(&mut self, slot: u32, me: ClientId, lock: u32) -> GrantState {
        let hold = self.recorded_hold(slot, lock);
        if hold.grant_mode() != Some(Mode::Exclusive) {
            return hold;
        }
        let kind = SlotState(self.t.lock_meta[lock as usize].state).kind();
        if exclusive_owner(kind, &self.t.lock_cells[lock as usize]) == me.get() {
            hold
        } else {
            self.t.lock_holds.set(slot, lock, GrantState::None.bits());
            GrantState::None
        }
    }

    /// Removes client `slot`'s reference to `id` and frees the lock when it was the last.
    pub(super) fn drop_lock_ref(&mut self, slot: u32, id: LockId) {
        let lock = id.index();
        self.t.lock_refs.set(slot, lock, 0);
        self.t.lock_holds.set(slot, lock, GrantState::None.bits());
        self.t.clients[slot as usize].lock_refs -= 1;
        let meta = &mut self.t.lock_meta[lock as usize];
        meta.refs -= 1;
        if meta.refs == 0 {
            meta.state = SlotState(meta.state).freed().0;
            let name = &self.t.lock_names[lock as usize];
            self.t.lock_index.remove(name.hash, lock);
            self.t.lock_free.push(lock);
        }
    }
}

/// The client the word of a `kind` lock names as its exclusive holder (0: none). The holds
/// record says who holds; the word says whether that grant is still the live one (an expired
/// atomic or fair grant may have been taken over since).
#[inline]
pub(super) fn exclusive_owner(kind: LockKind, cell: &LockCell) -> u32 {
    match kind {
        LockKind::Atomic => atomic::AtomicWord::from_bits(cell.word).owner(),
        LockKind::Rw => rw::RwWord::from_bits(cell.word).owner(),
        // The fair lock keeps its exclusive owner beside the word (`fair::FairLock::owner`).
        LockKind::Fair => cell.ext,
    }
}
