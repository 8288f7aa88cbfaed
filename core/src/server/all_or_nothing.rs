//! All-or-nothing messages: a data message flagged `FLAG_ALL_OR_NOTHING` is a unit.
//!
//! If any command does not end holding what it asked for, every lock command of the message is
//! undone (words, holds and fences restored from a copy taken before each command) so nothing
//! stays held. The data path runs one message at a time, so nobody can observe the
//! intermediate state and the undo is exact. The failing commands keep their own status; the
//! undone ones report `Eagain` ("nothing held, try again").
//!
//! This file owns the unit's scratch (undo copies, the locks to wake or forget holders on) and
//! its undo; each command still runs through `data.rs`'s lock command, which calls back here
//! just before its word step. Beyond that step it writes only its undo, to the lock slots its
//! own commands changed, and the follow-ups any message has (waking waiters, forgetting the
//! holders a fair preemption voided) once the unit's outcome is known.

use super::Server;
use crate::config::BATCH_MAX;
use crate::ids::ClientId;
use crate::manager::{LockValue, ValueBlock};
use crate::proto::{Command, CommandResult};
use crate::status::Status;
use crate::table::LockCell;

/// A copy of one lock slot's state for this client, taken before a command of an
/// all-or-nothing message touched it.
#[derive(Clone, Copy)]
struct Undo {
    lock: u32,
    cell: LockCell,
    hold: u8,
    value: LockValue,
}

impl Default for Undo {
    fn default() -> Self {
        Undo {
            lock: 0,
            cell: LockCell::default(),
            hold: 0,
            value: LockValue::FRESH,
        }
    }
}

/// Per-message scratch: undo records and fair locks whose other holders were preempted.
struct Scratch {
    undo: [Undo; BATCH_MAX],
    undo_len: usize,
    preempted: [u32; BATCH_MAX],
    preempted_len: usize,
}

/// Whether a command of an all-or-nothing message ended holding what it asked for.
#[inline]
fn holds_what_it_asked(r: &CommandResult) -> bool {
    matches!(r.status, Status::Success | Status::AlreadyLocked)
}

impl<'r> Server<'r> {
    /// The all-or-nothing variant: every lock command's slot is copied before it runs, and if
    /// any command does not end holding what it asked for, the copies are written back.
    #[cold]
    pub(super) fn execute_all_or_nothing(
        &mut self,
        slot: u32,
        me: ClientId,
        n: usize,
        (command, block): (
            &impl Fn(usize) -> Command,
            &impl Fn(usize) -> Option<ValueBlock>,
        ),
        results: &mut [CommandResult],
        now_ms: u64,
    ) {
        let mut s = Scratch {
            undo: [Undo::default(); BATCH_MAX],
            undo_len: 0,
            preempted: [0; BATCH_MAX],
            preempted_len: 0,
        };
        let mut released = [0u32; BATCH_MAX];
        let mut released_len = 0;
        // Locks on which a holder's grant lapsed: released whatever becomes of the unit.
        let mut lapsed = [0u32; BATCH_MAX];
        let mut lapsed_len = 0;
        for (i, r) in results.iter_mut().enumerate().take(n) {
            // Object commands were refused before we got here.
            let Command::Lock(c) = command(i) else {
                continue;
            };
            if c.wait_ms != 0 {
                *r = CommandResult::status(self.refuse(Status::Einval));
                continue;
            }
            if let Some(refused) = self.cluster_refusal(slot, &Command::Lock(c), now_ms) {
                *r = refused;
                continue;
            }
            // The slot is copied after the command's checks and its revoke decision, just
            // before its word step: revokes and lapses stay outside the undo — a grant that
            // lapsed stays released (and a revoke sent stays sent) whatever becomes of the
            // unit, and the copy must not bring a lapsed holder back into the word with no
            // record to unlock it — and a command refused by a check (kind, retained lock)
            // runs no decision at all, as it would alone.
            let record = |server: &Self, lock: u32| server.record_undo(slot, lock, &mut s);
            let written = block(i);
            let (out, note) =
                self.lock_command_with(slot, me, &c, written.as_ref(), now_ms, record);
            self.count_min_hold(note, false);
            if note.lapsed {
                lapsed[lapsed_len] = c.lock;
                lapsed_len += 1;
            }
            if note.fair_preempted {
                s.preempted[s.preempted_len] = c.lock;
                s.preempted_len += 1;
            }
            // A lapse is also a release; listed once, its waiters are retried once.
            if note.released && !note.lapsed {
                released[released_len] = c.lock;
                released_len += 1;
            }
            *r = out;
        }
        if !results.iter().all(holds_what_it_asked) {
            self.roll_back(slot, &mut s, results);
            released_len = 0;
        }
        for &lock in &s.preempted[..s.preempted_len] {
            self.forget_preempted_holders(lock, slot);
        }
        if self.waiting > 0 {
            for &lock in released[..released_len].iter().chain(&lapsed[..lapsed_len]) {
                self.wake_waiters(lock, now_ms);
            }
        }
    }

    /// Copies client `slot`'s state of lock slot `lock` for the unit's undo.
    fn record_undo(&self, slot: u32, lock: u32, s: &mut Scratch) {
        s.undo[s.undo_len] = Undo {
            lock,
            cell: self.t.lock_cells[lock as usize],
            hold: self.t.lock_holds.get(slot, lock),
            value: self.t.lock_values[lock as usize],
        };
        s.undo_len += 1;
    }

    /// Restores every slot the message changed, newest first, and reports the undone commands.
    fn roll_back(&mut self, slot: u32, s: &mut Scratch, results: &mut [CommandResult]) {
        for u in s.undo[..s.undo_len].iter().rev() {
            self.t.lock_cells[u.lock as usize] = u.cell;
            self.t.lock_holds.set(slot, u.lock, u.hold);
            self.t.lock_values[u.lock as usize] = u.value;
        }
        // Nobody was displaced after all.
        s.preempted_len = 0;
        for r in results {
            if holds_what_it_asked(r) {
                *r = CommandResult::status(Status::Eagain);
            }
        }
    }
}
