//! A cached RW lock's handle, [`CachedRwLock`]: a guard taken locally when the cached grant
//! covers it, else asked of the server (through `exchange`), and a waiting call's wait — in
//! slices on the server, or on the handle's condition variable while a guard of its own or a
//! give-back is in the way — with the revokes looked at before each try.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use dlock_core::manager::cache::{Acquire, Reply};
use dlock_core::{LockId, Mode, Status};

use super::guard::{self, CachedReadGuard, CachedWriteGuard};
use super::state::State;
use super::{CachedLocks, WAIT_SLICE};
use crate::client::Connection;
use crate::client::error::{Error, ErrorKind, Op};
use crate::client::link::Link;

/// A cached RW lock of a [`CachedLocks`] (the handle's module doc). It names its lock by its place
/// in the handle's table, not by id: a failover may give the lock another id
/// (`follow_renumbering`).
pub struct CachedRwLock<C: Connection = Link> {
    pub(super) locks: CachedLocks<C>,
    pub(super) key: usize,
}

impl<C: Connection> std::fmt::Debug for CachedRwLock<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedRwLock")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<C: Connection> CachedRwLock<C> {
    /// The lock's id now (a failover may change it); `None` while the client holds no
    /// reference to it — after a failover whose replacement refused its claim, until the next
    /// guard takes the lock again — since the id the handle had then may name another lock.
    pub fn id(&self) -> Option<LockId> {
        self.locks.state().current(self.key)
    }

    /// The mode this client holds the lock in on the server (cached or in use), if any.
    pub fn held(&self) -> Option<Mode> {
        let mut st = self.locks.state();
        let id = st.current(self.key)?;
        st.entries.get(&id).and_then(|e| e.cache.held())
    }

    /// Asks for the lock's value block with every grant from now on (`on`): guards then
    /// return it ([`CachedReadGuard::value`]), and a write guard may set it.
    pub fn set_value_blocks(&self, on: bool) -> Result<(), Error> {
        let mut st = self.locks.state();
        let id = st.id_of(self.key)?;
        st.client.set_value_blocks(id, on)
    }

    /// A read guard without waiting: local when the lock is cached (the handle's module doc), else
    /// asked of the server once. `WouldBlock` when busy.
    pub fn try_read(&self) -> Result<CachedReadGuard<C>, Error> {
        self.take(Mode::Shared, None).map(CachedReadGuard)
    }

    /// A write guard without waiting (see [`CachedRwLock::try_read`]).
    pub fn try_write(&self) -> Result<CachedWriteGuard<C>, Error> {
        self.take(Mode::Exclusive, None).map(CachedWriteGuard)
    }

    /// A read guard, waiting up to `wait` (for this handle's writer, or on the server).
    pub fn read(&self, wait: Duration) -> Result<CachedReadGuard<C>, Error> {
        self.take(Mode::Shared, Some(Instant::now() + wait))
            .map(CachedReadGuard)
    }

    /// A write guard, waiting up to `wait`.
    pub fn write(&self, wait: Duration) -> Result<CachedWriteGuard<C>, Error> {
        self.take(Mode::Exclusive, Some(Instant::now() + wait))
            .map(CachedWriteGuard)
    }

    /// Takes a guard in `mode`, waiting until `deadline` (`None`: not at all).
    fn take(&self, mode: Mode, deadline: Option<Instant>) -> Result<guard::Held<C>, Error> {
        let mut st = self.locks.state();
        loop {
            // Revokes first: a lock asked back takes no new guard.
            if st.pump()? && st.waiters > 0 {
                self.locks.shared.changed.notify_all();
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let id = st.id_of(self.key)?;
            let e = st.entries.get_mut(&id).expect("a handle's entry");
            let refused = match e.cache.acquire(mode) {
                Acquire::Local => {
                    st.local_hits += 1;
                    return Ok(self.held_guard(&st, id, mode));
                }
                Acquire::Refuse(s) => return Err(Op::TryLock.err(s)),
                Acquire::Send(op) => {
                    let slice = left.map_or(Duration::ZERO, |l| l.min(WAIT_SLICE));
                    match st.drive(id, op, slice) {
                        (Reply::Granted, _) => return Ok(self.held_guard(&st, id, mode)),
                        // A shared grant given back for a writer: ask again.
                        (Reply::AskAgain, _) => continue,
                        (Reply::Refused(s), err) => Some(err.unwrap_or(Op::TryLock.err(s))),
                        // The give-back that must go first did not reach the server: its
                        // failure is the answer, not "busy" (it is owed, sent at the next look).
                        (Reply::Send(_), Some(err)) => return Err(err),
                        _ => None,
                    }
                }
                // A give-back owed from before, which the look above sent again in vain.
                Acquire::Wait if e.owed.is_some() => return Err(Op::Unlock.err(e.failed)),
                Acquire::Wait => None,
            };
            // Busy here (a guard of this handle, a give-back) or on the server.
            match (refused, left) {
                (Some(err), _) if !retry(&err) => return Err(err),
                (Some(err), None) => return Err(err),
                (None, None) => return Err(Op::TryLock.err(Status::Fail)),
                (_, Some(l)) if l.is_zero() => return Err(Op::Lock.err(Status::Etimeout)),
                // The server's slice ran out: let go of the client a moment, look again.
                (Some(_), Some(_)) => {
                    drop(st);
                    std::thread::yield_now();
                    st = self.locks.state();
                }
                (None, Some(l)) => {
                    st.waiters += 1;
                    st = self
                        .locks
                        .shared
                        .changed
                        .wait_timeout(st, l.min(WAIT_SLICE))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                    st.waiters -= 1;
                }
            }
        }
    }

    fn held_guard(&self, st: &State<C>, id: LockId, mode: Mode) -> guard::Held<C> {
        let e = &st.entries[&id];
        guard::Held {
            locks: self.locks.clone(),
            key: self.key,
            generation: st.handles[self.key].generation,
            id,
            mode,
            token: e.token,
            value: e.value,
        }
    }
}

/// Whether a refusal from the server is "busy" (a waiting call tries again).
fn retry(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}
