//! One grant's guards: [`Guard`] borrows its [`NamedLock`], [`OwnedGuard`] owns a handle on it
//! (for async code and other threads). Both unlock on drop and send the error, if any, to the
//! handle's drop hook.

use std::time::Duration;

use dlock_core::{FencingToken, Mode};

use super::NamedLock;
use crate::client::error::Error;

/// A grant of a [`NamedLock`], released when dropped.
///
/// Pass [`Guard::token`] with every write the lock protects: if the lease ran out and someone
/// else was granted the lock, their token is larger and storage can refuse ours. Dropping the
/// guard unlocks; [`Guard::unlock`] does the same and returns the error.
#[must_use = "dropping a guard unlocks at once"]
#[derive(Debug)]
pub struct Guard<'a> {
    lock: &'a NamedLock,
    mode: Mode,
    token: FencingToken,
    /// Cleared when the grant was handed on (unlocked explicitly, or to an owned guard).
    armed: bool,
}

impl<'a> Guard<'a> {
    pub(super) fn new(lock: &'a NamedLock, mode: Mode, token: FencingToken) -> Self {
        Guard {
            lock,
            mode,
            token,
            armed: true,
        }
    }

    /// The grant's fencing token.
    #[inline]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The mode held.
    #[inline]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The lock this guard holds.
    #[inline]
    pub fn lock(&self) -> &'a NamedLock {
        self.lock
    }

    /// Extends the grant to at least `lease` from now; zero only checks that it is still held.
    /// An RW grant has no lease of its own: this renews the client's, which keeps it.
    /// `NotHeld` when the grant was lost.
    pub fn extend(&mut self, lease: Duration) -> Result<(), Error> {
        self.lock.extend_grant(self.mode, lease)
    }

    /// Unlocks now, returning the error a drop would send to the hook.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.armed = false;
        self.lock.release_grant()
    }

    /// The same grant as an [`OwnedGuard`]: `'static` and `Send`, to move into a task or thread.
    /// Async code holds one across `.await` points: it blocks nobody while it waits, and
    /// dropping it (or its task) unlocks.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use std::time::Duration;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let row_group = locks.atomic("orders/rg-17")?;
    /// let guard = row_group.try_exclusive(Duration::from_secs(5))?;
    /// let owned = guard.into_owned();
    /// let token = owned.token();
    /// std::thread::spawn(move || {
    ///     // ... writes carrying `token` ...
    ///     owned.unlock()
    /// })
    /// .join()
    /// .unwrap()?;
    /// # let _ = token;
    /// # drop((row_group, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_owned(mut self) -> OwnedGuard {
        self.armed = false;
        OwnedGuard {
            lock: self.lock.clone(),
            mode: self.mode,
            token: self.token,
            armed: true,
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.lock.release_grant()
        {
            self.lock.locks().report(&e);
        }
    }
}

/// A grant that owns a handle on its lock: [`Guard::into_owned`]. Released when dropped.
#[must_use = "dropping a guard unlocks at once"]
#[derive(Debug)]
pub struct OwnedGuard {
    lock: NamedLock,
    mode: Mode,
    token: FencingToken,
    armed: bool,
}

impl OwnedGuard {
    /// The grant's fencing token.
    #[inline]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The mode held.
    #[inline]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The lock this guard holds.
    #[inline]
    pub fn lock(&self) -> &NamedLock {
        &self.lock
    }

    /// [`Guard::extend`].
    pub fn extend(&mut self, lease: Duration) -> Result<(), Error> {
        self.lock.extend_grant(self.mode, lease)
    }

    /// Unlocks now, returning the error a drop would send to the hook.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.armed = false;
        self.lock.release_grant()
    }
}

impl Drop for OwnedGuard {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.lock.release_grant()
        {
            self.lock.locks().report(&e);
        }
    }
}
