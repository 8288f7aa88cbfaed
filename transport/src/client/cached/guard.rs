//! The guards of cached RW locks: dropping one releases it locally (no message); the last guard
//! of a revoked lock gives the lock back to the server as it drops. A write guard may turn the
//! grant shared in place ([`CachedWriteGuard::downgrade`]).

use std::time::Duration;

use dlock_core::manager::cache::Reply;
use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::{FencingToken, LockId, Mode, Status};

use super::CachedLocks;
use crate::client::Connection;
use crate::client::error::{Error, Op};
use crate::client::link::Link;

/// What both guards hold.
pub(super) struct Held<C: Connection> {
    pub(super) locks: CachedLocks<C>,
    /// The handle's place (`CachedRwLock`): the lock's id may change under a guard, at a
    /// failover.
    pub(super) key: usize,
    /// The handle's generation when the guard was taken: a failover that forgets the lock
    /// ends the guard's claim on the handle's entry.
    pub(super) generation: u64,
    /// The id when the guard was taken.
    pub(super) id: LockId,
    pub(super) mode: Mode,
    pub(super) token: FencingToken,
    pub(super) value: Option<ValueRead>,
}

impl<C: Connection> Drop for Held<C> {
    fn drop(&mut self) {
        // Kept cached, or given back now if a revoke waits for this guard.
        let mut st = self.locks.state();
        if let Some(id) = st.current_of(self.key, self.generation) {
            st.release(id, self.mode);
        }
        if st.waiters > 0 {
            self.locks.shared.changed.notify_all();
        }
    }
}

/// A shared guard of a cached RW lock.
pub struct CachedReadGuard<C: Connection = Link>(pub(super) Held<C>);

/// An exclusive guard of a cached RW lock.
pub struct CachedWriteGuard<C: Connection = Link>(pub(super) Held<C>);

impl<C: Connection> std::fmt::Debug for CachedReadGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedReadGuard")
            .field("id", &self.0.id)
            .field("token", &self.0.token)
            .finish()
    }
}

impl<C: Connection> std::fmt::Debug for CachedWriteGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedWriteGuard")
            .field("id", &self.0.id)
            .field("token", &self.0.token)
            .finish()
    }
}

impl<C: Connection> CachedReadGuard<C> {
    /// The fencing token of the server's grant this guard stands on (the same for every
    /// local guard of one grant: the storage sees one holder, this client).
    pub fn token(&self) -> FencingToken {
        self.0.token
    }

    /// The lock's value block, when the lock asks for it: as the grant returned it, or as a
    /// local writer of the same grant set it since.
    pub fn value(&self) -> Option<ValueRead> {
        self.0.value
    }
}

impl<C: Connection> CachedWriteGuard<C> {
    /// See [`CachedReadGuard::token`].
    pub fn token(&self) -> FencingToken {
        self.0.token
    }

    /// See [`CachedReadGuard::value`].
    pub fn value(&self) -> Option<ValueRead> {
        self.0.value
    }

    /// Sets the lock's value block: local guards taken after this one read it, and the
    /// give-back to the server writes it. `Einval` for more than 32 bytes.
    pub fn set_value(&mut self, block: &[u8]) -> Result<(), Error> {
        let block = ValueBlock::from_slice(block).map_err(|s| Op::StageValue.err(s))?;
        let mut st = self.0.locks.state();
        let id = st.current_of(self.0.key, self.0.generation);
        let e = id
            .and_then(|id| st.entries.get_mut(&id))
            .ok_or_else(|| Op::StageValue.err(Status::LockNotGet))?;
        let seq = e.value.map_or(0, |v| v.seq).wrapping_add(1);
        let read = ValueRead {
            block,
            seq,
            valid: true,
        };
        (e.value, e.staged, self.0.value) = (Some(read), Some(block), Some(read));
        Ok(())
    }

    /// Turns the exclusive grant shared in place, of the engine's own accord (a revoke that
    /// wants shared does the same when the writer is done): the server downgrades the grant,
    /// writing the block set with [`CachedWriteGuard::set_value`] as an exclusive give-back
    /// writes it; the lock stays cached, shared; and this guard's user reads on under the
    /// returned guard, with other local readers, while other clients may take the lock shared.
    ///
    /// On an error the use has ended, as if the guard had been dropped: `LockNotGet` when a
    /// failover forgot the lock since the guard was taken; `Fail` when the server no longer
    /// held the grant (a revoke it lapsed, or the lease: the work done under the guard was not
    /// protected); a connection's failure, the downgrade then owed and sent again at the next
    /// look, the grant exclusive until it goes.
    pub fn downgrade(self) -> Result<CachedReadGuard<C>, Error> {
        // Dropped after the state below (declared first): an error ends this user's use.
        let mut held = self.0;
        let locks = held.locks.clone();
        let mut st = locks.state();
        // Revokes first, as at every call: one may already want the lock back.
        st.pump()?;
        let id = st
            .current_of(held.key, held.generation)
            .ok_or_else(|| Op::Downgrade.err(Status::LockNotGet))?;
        let e = st.entries.get_mut(&id).expect("a handle's entry");
        let op = e
            .cache
            .downgrade()
            .ok_or_else(|| Op::Downgrade.err(Status::Einval))?;
        // The record counts this user as a reader from here on, whatever the server answers.
        held.mode = Mode::Shared;
        let done = match st.drive(id, op, Duration::ZERO) {
            (Reply::Lost, _) => Err(Op::Downgrade.err(Status::Fail)),
            (Reply::Send(_), err) => Err(err.unwrap_or_else(|| Op::Downgrade.err(Status::Fail))),
            _ => Ok(()),
        };
        // Local readers waiting for the writer may go on under the shared grant.
        if st.waiters > 0 {
            locks.shared.changed.notify_all();
        }
        drop(st);
        done.map(|()| CachedReadGuard(held))
    }
}
