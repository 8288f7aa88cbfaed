//! Retained locks on the server: a dead client's grants that asked to be retained
//! (`LockFlags::RETAIN`) stay held by it until a recoverer's [`Server::recovery_done`]
//! (`manager::retain` has the rules; `clients.rs`'s `remove_client` keeps them at a death).
//!
//! # Where a retained grant stands in the way
//!
//! An acquisition (a first attempt or a fair ticket retry) on a lock with a retained grant is
//! refused `LockRetained` before the lock word is consulted, when:
//!
//! | lock kind | retained grant | request   | refused                                   |
//! |-----------|----------------|-----------|-------------------------------------------|
//! | RW        | exclusive      | any       | yes                                       |
//! | RW        | shared         | exclusive | yes                                       |
//! | RW        | shared         | shared    | no: the word grants readers beside it     |
//! | atomic    | (exclusive)    | (exclusive) | yes                                     |
//! | fair      | any            | any       | yes                                       |
//!
//! Checking before the word is what keeps the grant: an atomic or fair grant has a lease in
//! its word, and the word would let a request take over a grant whose lease ran out (an
//! expired atomic owner, a fair timeout preemption). A fair lock refuses readers beside a
//! retained reader too, conservatively: a shared ticket retry may preempt an expired holder
//! in the fair word, which would void the retained grant. A waiting request that is refused so
//! stays parked, retried when a grant on the lock is released (a `recovery_done` releases
//! through the same path), and is answered `LockRetained` rather than `Etimeout` when its
//! deadline passes still blocked by one.
//!
//! While no slot retains (the common case) an acquisition pays one comparison; while one does,
//! an acquisition scans the lock's column of the holds grid up to the client table's high-water
//! mark. (A per-lock count of retained grants would make that constant; the per-lock manager
//! record the design doc plans for cached grants is where it would live.)
//!
//! # The dead client's entry
//!
//! A retaining entry is out of the client index, so nothing can speak for the dead client (its
//! requests and its `client_reinit` find no registration), and its slot is off the free list
//! until `recovery_done` frees it. [`Server::recovery_done`] finds it by a scan of the table:
//! the call is a control-path rarity.

use super::{Counter, FrameError, Server};
use crate::config::BATCH_MAX;
use crate::ids::{ClientId, LockId, LockKind, Mode};
use crate::manager::GrantState;
use crate::manager::retain::{Life, RecoveryDone, Role, may_list_retained, recovery_done};
use crate::proto::{
    Batch, ControlHeader, ControlResponse, ListRetained, RetainedEntry, RetainedPage,
    encode_control_response,
};
use crate::status::Status;
use crate::table::{ClientState, SlotState};

/// One retained grant, as [`Server::retained`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retained {
    /// The dead client holding it.
    pub client: u32,
    /// The lock.
    pub lock: LockId,
    /// The lock's kind.
    pub kind: LockKind,
    /// The mode retained.
    pub mode: Mode,
}

impl Server<'_> {
    /// Whether a dead client's retained grant on lock slot `lock`, of `kind`, stands in the way
    /// of an acquisition in `mode` (module doc: the table).
    #[inline]
    pub(super) fn retained_blocks(&self, lock: u32, kind: LockKind, mode: Mode) -> bool {
        self.retaining > 0 && self.retained_blocks_scan(lock, kind, mode)
    }

    #[cold]
    fn retained_blocks_scan(&self, lock: u32, kind: LockKind, mode: Mode) -> bool {
        (0..self.t.client_free.high_water()).any(|slot| {
            self.t.clients[slot as usize].client_state() == ClientState::Retaining
                && GrantState::from_bits(self.t.lock_holds.get(slot, lock))
                    .ok()
                    .and_then(GrantState::grant_mode)
                    .is_some_and(|held| {
                        kind != LockKind::Rw || held == Mode::Exclusive || mode == Mode::Exclusive
                    })
        })
    }

    /// The slot of dead client `raw`, retaining grants.
    pub(super) fn retaining_slot(&self, raw: u32) -> Option<u32> {
        if raw == 0 || self.retaining == 0 {
            return None;
        }
        (0..self.t.client_free.high_water()).find(|&slot| {
            let c = &self.t.clients[slot as usize];
            c.id == raw && c.client_state() == ClientState::Retaining
        })
    }

    /// How many dead clients retain grants now.
    #[inline]
    pub fn retaining_clients(&self) -> u32 {
        self.retaining
    }

    /// `recovery_done(dead)` from a caller with `role` (the runtime's decision, never the
    /// caller's claim): a recoverer that replayed dead client `dead`'s work releases the grants
    /// it retains and frees its slot; returns how many grants were released. Without the role
    /// `Einval`, counted in `recovery_done_refused`, whatever the target (so a caller without
    /// it learns nothing of who retains); with it, `ClientNotInit` for an id no client has and
    /// `Einval` for a live client, which releases its own grants.
    pub fn recovery_done(&mut self, role: Role, dead: u32, now_ms: u64) -> Result<u32, Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self.retaining_slot(dead);
        let target = match slot {
            Some(_) => Some(Life::Retaining),
            None => self
                .client_slot(dead)
                .and_then(|s| Life::of(self.t.clients[s as usize].client_state())),
        };
        match (recovery_done(role, target), slot) {
            (RecoveryDone::Release, Some(slot)) => Ok(self.release_retained(slot, dead, now_ms)),
            (RecoveryDone::Unauthorised, _) => {
                self.stats.bump(Counter::RecoveryDoneRefused);
                Err(self.refuse(Status::Einval))
            }
            (outcome, _) => Err(self.refuse(outcome.status())),
        }
    }

    /// Releases every grant retaining slot `slot` (dead client `raw`) keeps, as its unlocks
    /// would (waking the locks' waiters), drops its lock references and frees the slot.
    fn release_retained(&mut self, slot: u32, raw: u32, now_ms: u64) -> u32 {
        let Some(me) = ClientId::new(raw) else {
            return 0;
        };
        let (mut released, mut from) = (0, 0);
        while let Some((lock, bits)) = self.t.lock_holds.next_in_row(slot, from) {
            from = lock + 1;
            let mode = GrantState::from_bits(bits)
                .ok()
                .and_then(GrantState::grant_mode);
            self.release_grant(slot, me, lock, mode, now_ms);
            self.wake_slot_waiters(lock, now_ms);
            released += 1;
        }
        self.release_all_lock_refs(slot);
        self.free_client_slot(slot);
        self.retaining -= 1;
        self.stats.add(Counter::RetainedReleased, released.into());
        released
    }

    /// Lists retained grants (`ListRetained`) for a caller with `role`: of dead client `client`
    /// (0: every one), from `cursor` (0: the start; else the `next` of the previous page), into
    /// `out`. Returns how many were written and the cursor of the next page (0: no more). The
    /// cursor is a position in the table (slot and lock), opaque to the caller. Without the
    /// role `Einval`, counted as a refused `recovery_done`.
    pub fn retained(
        &mut self,
        role: Role,
        client: u32,
        cursor: u64,
        out: &mut [Retained],
    ) -> Result<(usize, u64), Status> {
        self.stats.bump(Counter::ControlRequests);
        if out.is_empty() {
            return Err(self.refuse(Status::Einval));
        }
        if !may_list_retained(role) {
            self.stats.bump(Counter::RecoveryDoneRefused);
            return Err(self.refuse(Status::Einval));
        }
        let (mut slot, mut from) = ((cursor >> 32) as u32, cursor as u32);
        let mut n = 0;
        while slot < self.t.client_free.high_water() {
            let c = self.t.clients[slot as usize];
            let listed =
                c.client_state() == ClientState::Retaining && (client == 0 || c.id == client);
            while listed && let Some((lock, bits)) = self.t.lock_holds.next_in_row(slot, from) {
                if n == out.len() {
                    return Ok((n, u64::from(slot) << 32 | u64::from(lock)));
                }
                from = lock + 1;
                let (Some(mode), state) = (
                    GrantState::from_bits(bits)
                        .ok()
                        .and_then(GrantState::grant_mode),
                    SlotState(self.t.lock_meta[lock as usize].state),
                ) else {
                    continue;
                };
                out[n] = Retained {
                    client: c.id,
                    lock: LockId::new(lock, state.generation()),
                    kind: state.kind(),
                    mode,
                };
                n += 1;
            }
            (slot, from) = (slot + 1, 0);
        }
        Ok((n, 0))
    }

    /// The name of the lock `id` names, if it is live (for a `ListRetained` page).
    pub fn lock_name(&self, id: LockId) -> Option<&[u8]> {
        let index = id.index() as usize;
        let state = SlotState(self.t.lock_meta.get(index)?.state);
        (state.generation() == id.generation()).then(|| self.t.lock_names[index].name())
    }
}

impl Server<'_> {
    /// Answers a `ListRetained` request (header `header`) from a sender with `role` into `out`;
    /// returns the reply's length. Its entries borrow the locks' names from the tables, so the
    /// page is encoded here.
    pub(super) fn list_retained_frame(
        &mut self,
        role: Role,
        header: &ControlHeader,
        q: ListRetained,
        out: &mut [u8],
    ) -> Result<usize, FrameError> {
        let blank = Retained {
            client: 0,
            lock: LockId::new(0, 1),
            kind: LockKind::Atomic,
            mode: Mode::Exclusive,
        };
        let mut found = [blank; BATCH_MAX];
        let listed = self.retained(role, q.client, q.cursor, &mut found);
        let reply = |status: Status| ControlHeader {
            word: status as u16 as u32,
            ..*header
        };
        let (n, next) = match listed {
            Ok(page) => page,
            Err(s) => {
                return Ok(encode_control_response(
                    &reply(s),
                    &ControlResponse::Empty,
                    out,
                )?);
            }
        };
        let mut entries = [RetainedEntry {
            client: 0,
            lock: 0,
            kind: LockKind::Atomic,
            mode: Mode::Exclusive,
            name: &[],
        }; BATCH_MAX];
        for (e, r) in entries.iter_mut().zip(&found[..n]) {
            *e = RetainedEntry {
                client: r.client,
                lock: r.lock.raw(),
                kind: r.kind,
                mode: r.mode,
                // A retained lock is referenced by its dead holder, so it is live and named.
                name: self.lock_name(r.lock).unwrap_or(&[]),
            };
        }
        let page = RetainedPage {
            next,
            entries: Batch::from_slice(&entries[..n]),
        };
        let body = ControlResponse::Retained(page);
        Ok(encode_control_response(
            &reply(Status::Success),
            &body,
            out,
        )?)
    }
}
