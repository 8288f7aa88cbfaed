//! A [`super::CachedLocks`]' look at its connection (the handle's module doc): the events read
//! and acted on — a revoke by the lock's record, an event-ring overflow by every record — the
//! engine told of each revoke acted on, and the ops owed by earlier looks sent again. Whatever
//! goes to the server goes through `exchange` ([`State::drive`]).

use std::time::Duration;

use dlock_core::LockId;
use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::{OnRevoke, on_overflow};
use dlock_core::proto::Event;

use super::Revoked;
use super::exchange::duration_ms;
use super::state::State;
use crate::client::Connection;
use crate::client::error::Error;

impl<C: Connection> State<C> {
    /// Reads the events the server sent and acts on them (the handle's module doc), and sends what
    /// is owed still. Returns whether a lock was given back or downgraded.
    ///
    /// While no entry holds anything on the server or owes a give-back, and nothing is watched, the
    /// look is left for later when
    /// [`Client::events_may_wait`](crate::client::Client::events_may_wait) allows it (the row-group
    /// cache's rule, `dlock_engine_glue::rowgroup`): no revoke is for anything held, any unread one
    /// is for a grant given back since (which the look would ignore), and no lost connection owes
    /// its report, so nothing cached is used while the look waits. Over TCP a guard on an uncached
    /// lock then pays no `recv` on top of its request; the first grant held makes every call look
    /// again.
    pub(super) fn pump(&mut self) -> Result<bool, Error> {
        // Events name the ids the server has now.
        self.follow_renumbering();
        if self.engaged == 0 && self.watch.is_empty() && self.client.events_may_wait() {
            return Ok(false);
        }
        let mut events = std::mem::take(&mut self.events);
        let read = self.client.poll_events(|e| events.push(e));
        let mut moved = false;
        if !events.is_empty() {
            let now = self.client.now_ms();
            for e in events.drain(..) {
                moved |= self.note(e, now);
            }
        }
        self.events = events;
        read?;
        // Only the locks that owe a message or wait for their users: the look is proportional
        // to what changed, not to every lock the handle has — and a local hit with nothing
        // watched reads no clock.
        if self.watch.is_empty() {
            return Ok(moved);
        }
        let (lease_ms, now) = (duration_ms(self.client.lease()), self.client.now_ms());
        let mut watch = std::mem::take(&mut self.watch);
        let mut owed = Vec::new();
        watch.retain(|id| {
            let Some(e) = self.entries.get_mut(id) else {
                return false;
            };
            warn_overdue(*id, &e.cache, &mut e.warned, now, lease_ms);
            if let Some(op) = e.owed.take() {
                owed.push((*id, op));
            }
            e.watched = e.cache.revoke().is_some();
            e.watched
        });
        self.watch = watch;
        for (id, op) in owed {
            drop(self.drive(id, op, Duration::ZERO));
            moved = true;
        }
        Ok(moved)
    }

    /// Acts on one event (a revoke for a lock not held, or for an earlier grant than the one
    /// held, is ignored by the record), read at `now`; whether a lock was given back or
    /// downgraded.
    fn note(&mut self, e: Event, now: u64) -> bool {
        match e {
            Event::Revoke {
                lock,
                wanted,
                fence,
            } => {
                let Some(entry) = self.entries.get_mut(&lock) else {
                    return false;
                };
                let act = entry.cache.on_revoke(wanted, fence, now);
                self.revoked(lock, act, Revoked::Lock { lock, wanted })
            }
            Event::Overflow => {
                let mut acts = Vec::new();
                let locks = self.entries.iter_mut().map(|(&id, e)| (id, &mut e.cache));
                on_overflow(locks, now, |id, act| acts.push((id, act)));
                let mut moved = false;
                for (id, act) in acts {
                    moved |= self.revoked(id, act, Revoked::All);
                }
                moved
            }
        }
    }

    /// What a revoke of `id` decided: sent now, or left to the users; the engine is told.
    fn revoked(&mut self, id: LockId, act: OnRevoke, notice: Revoked) -> bool {
        match act {
            OnRevoke::Ignore => return false,
            OnRevoke::Deferred => self.watch(id),
            // A `Lost` answer is logged by `drive`; nothing else is left to do here.
            OnRevoke::Send(op) => drop(self.drive(id, op, Duration::ZERO)),
        }
        self.notices.push(notice);
        matches!(act, OnRevoke::Send(_))
    }
}

/// Warns once (`warned`) that the users of cached lock `id` outlived its revoke by
/// `timeout_ms` on the client's clock: the server has let the grant go, and their work was not
/// protected since. Shared with the C ABI's cached locks, which warn the same way.
pub fn warn_overdue(id: LockId, cache: &CachedLock, warned: &mut bool, now: u64, timeout_ms: u32) {
    if cache.revoke().is_none() {
        *warned = false;
    } else if !*warned && cache.revoke_overdue(now, timeout_ms) {
        *warned = true;
        tracing::warn!(lock = ?id, "dlock: cached lock users outlived its revoke");
    }
}
