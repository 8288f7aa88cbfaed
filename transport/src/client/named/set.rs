//! Batches: several locks taken in as few messages as the batch limit allows, held by one
//! [`GuardSet`] and unlocked together.
//!
//! The set owns a clone of each [`NamedLock`] rather than borrowing it, so it is `'static` and
//! can go to async code as it is: a clone is one reference-count increment, nothing next to the
//! round trip that took the lock.

use std::collections::HashSet;
use std::time::Duration;

use dlock_core::config::BATCH_MAX;
use dlock_core::{FencingToken, LockId, LockKind, Mode, Status};

use super::{Locks, NamedLock, lease_ms};
use crate::client::error::{Error, Op};

/// Grants of several locks in one mode, released together when dropped
/// ([`Locks::try_lock_all`]).
#[must_use = "dropping a guard set unlocks at once"]
#[derive(Debug)]
pub struct GuardSet {
    locks: Locks,
    mode: Mode,
    /// Every lock asked for, in the caller's order, with its grant's token when granted.
    entries: Vec<(NamedLock, Option<FencingToken>)>,
    /// Cleared once unlocked explicitly.
    armed: bool,
}

pub(super) fn try_lock_all(
    locks: &Locks,
    requested: &[&NamedLock],
    mode: Mode,
    lease: Duration,
    all_or_nothing: bool,
) -> Result<GuardSet, Error> {
    let lease_ms = lease_ms(Op::TryLock, lease)?;
    let mut ids = HashSet::with_capacity(requested.len());
    if requested
        .iter()
        .any(|l| !locks.same(l.locks()) || !ids.insert(l.id()))
    {
        return Err(Op::BatchTryLock.err(Status::Einval));
    }
    // Declared before the state guard so that on an early return the guard goes first and the
    // set's drop can take the state to unlock what was granted.
    let mut set = GuardSet {
        locks: locks.clone(),
        mode,
        entries: requested.iter().map(|&l| (l.clone(), None)).collect(),
        armed: true,
    };
    let mut st = locks.state();
    // The status to blame if something was refused.
    let mut refused: Option<Status> = None;
    // A guard of this handle holding a lock in a conflicting mode makes it busy; the server
    // would not see the conflict (it is the same client).
    let asked: Vec<usize> = (0..requested.len())
        .filter(|&i| {
            let free = !st.conflicts(requested[i].id(), mode);
            if !free {
                blame(&mut refused, Status::Fail);
            }
            free
        })
        .collect();
    if all_or_nothing && refused.is_some() {
        set.armed = false;
        return Err(Op::BatchTryLock.err(Status::Fail));
    }
    let mut requests = [(
        requested.first().map_or(NO_LOCK, |l| l.id()),
        mode,
        lease_ms,
    ); BATCH_MAX];
    let mut out = [Err(Status::Einval); BATCH_MAX];
    for chunk in asked.chunks(BATCH_MAX) {
        let n = chunk.len();
        for (r, &i) in requests.iter_mut().zip(chunk) {
            r.0 = requested[i].id();
        }
        // On an error the set's drop unlocks the messages granted before this one.
        st.client
            .batch_trylock(&requests[..n], all_or_nothing, &mut out[..n])?;
        for (r, &i) in out[..n].iter().zip(chunk) {
            match *r {
                Ok(grant) => {
                    st.hold(requested[i].id(), mode);
                    set.entries[i].1 = Some(grant.token);
                }
                // A fair lock refused per item keeps its ticket, as after `try_lock`.
                Err(s) => blame(&mut refused, s),
            }
        }
        if all_or_nothing && refused.is_some() {
            break;
        }
    }
    drop(st);
    match refused {
        // The set's drop unlocks the messages granted before the refused one.
        Some(s) if all_or_nothing => Err(Op::BatchTryLock.err(s)),
        _ => Ok(set),
    }
}

/// Notes `s` as the reason a lock was refused, unless a better one is known: in an undone
/// all-or-nothing message the entries that had worked say `Eagain`, so any other status is the
/// real reason.
fn blame(refused: &mut Option<Status>, s: Status) {
    if refused.is_none_or(|r| r == Status::Eagain) {
        *refused = Some(s);
    }
}

/// Fills unused request slots when nothing was asked; never sent.
const NO_LOCK: LockId = LockId::new(0, 1);

impl GuardSet {
    /// The mode every grant of the set is held in.
    #[inline]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How many locks the set holds.
    pub fn len(&self) -> usize {
        self.granted().count()
    }

    /// Whether the set holds nothing (every lock was busy).
    pub fn is_empty(&self) -> bool {
        self.granted().next().is_none()
    }

    /// Whether every lock asked for was granted (always, for an all-or-nothing set).
    pub fn is_complete(&self) -> bool {
        self.entries.iter().all(|(_, t)| t.is_some())
    }

    /// The token of the `i`-th lock asked for; `None` when it was not granted (or `i` is out of
    /// range).
    pub fn token(&self, i: usize) -> Option<FencingToken> {
        self.entries.get(i).and_then(|&(_, t)| t)
    }

    /// The locks held, with their tokens, in the order they were asked for.
    pub fn iter(&self) -> impl Iterator<Item = (&NamedLock, FencingToken)> + '_ {
        self.granted()
    }

    /// Extends every grant to at least `lease` from now (31 per message); RW grants by renewing
    /// the client's lease. Returns the first error; the other grants are extended all the same.
    pub fn extend(&mut self, lease: Duration) -> Result<(), Error> {
        let lease_ms = lease.as_nanos().div_ceil(1_000_000).min(u32::MAX as u128) as u32;
        let leased: Vec<(LockId, Mode, u32)> = self
            .granted()
            .filter(|(l, _)| l.kind() != LockKind::Rw)
            .map(|(l, _)| (l.id(), self.mode, lease_ms))
            .collect();
        let has_rw = self.granted().any(|(l, _)| l.kind() == LockKind::Rw);
        let mut st = self.locks.state();
        let mut first: Option<Error> = None;
        let mut out = [Err(Status::Einval); BATCH_MAX];
        for chunk in leased.chunks(BATCH_MAX) {
            let n = chunk.len();
            let failed = match st.client.batch_lock_extend(chunk, &mut out[..n]) {
                Err(e) => Some(e),
                Ok(()) => out[..n]
                    .iter()
                    .find_map(|r| r.err())
                    .map(|s| Op::BatchExtend.err(s)),
            };
            first = first.or(failed);
        }
        if has_rw && let Err(e) = st.client.heartbeat() {
            first = first.or(Some(e));
        }
        first.map_or(Ok(()), Err)
    }

    /// Unlocks every grant now; returns the first error (every grant is given up all the same).
    pub fn unlock(mut self) -> Result<(), Error> {
        self.armed = false;
        let mut first = None;
        self.release_all(|e| {
            first.get_or_insert(e);
        });
        first.map_or(Ok(()), Err)
    }

    fn granted(&self) -> impl Iterator<Item = (&NamedLock, FencingToken)> + '_ {
        self.entries.iter().filter_map(|(l, t)| t.map(|t| (l, t)))
    }

    /// Unlocks every grant, 31 per message; each error goes to `failed`, after the handle's
    /// state is let go (so a drop hook may use the handle).
    fn release_all(&self, mut failed: impl FnMut(Error)) {
        let ids: Vec<LockId> = self.granted().map(|(l, _)| l.id()).collect();
        if ids.is_empty() {
            return;
        }
        let mut errors = Vec::new();
        let mut st = self.locks.state();
        let mut out = [Err(Status::Einval); BATCH_MAX];
        for chunk in ids.chunks(BATCH_MAX) {
            let n = chunk.len();
            match st.client.batch_unlock(chunk, &mut out[..n]) {
                Err(e) => errors.push(e),
                Ok(()) => errors.extend(
                    out[..n]
                        .iter()
                        .filter_map(|r| r.err())
                        .map(|s| Op::BatchUnlock.err(s)),
                ),
            }
            for &id in chunk {
                st.unhold(id);
            }
        }
        drop(st);
        self.locks.notify_released();
        errors.into_iter().for_each(&mut failed);
    }
}

impl Drop for GuardSet {
    fn drop(&mut self) {
        if self.armed {
            self.release_all(|e| self.locks.report(&e));
        }
    }
}
