//! The guards of cached RW locks: dropping one releases it locally (no message); the last guard
//! of a revoked lock gives the lock back to the server as it drops.

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
}
