//! The guards: one grant each, named as tokio and parking_lot name theirs, released when
//! dropped.
//!
//! Every guard type wraps one [`Held`]: the grant (its lock, mode and fencing token) and the
//! drop that gives it back without waiting (see "Dropping a guard" in the module doc of
//! `named`). The types differ only in what they allow: a guard of a lock with leases (atomic,
//! fair) can be extended, an RW guard cannot (its grant lasts while the client's lease does).
//! A guard owns a handle on its lock rather than borrowing it, so it is `'static` and `Send`
//! (over a real link) and goes into a task or another thread as it is: the handle is one
//! reference count, nothing next to the round trip that took the lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::{FencingToken, Mode};

use super::kinds::Named;
use super::{Connection, Error};
use crate::client::link::Link;

/// One grant, given back when dropped (unless disarmed: unlocked explicitly).
pub(super) struct Held<C: Connection> {
    lock: Arc<Named<C>>,
    mode: Mode,
    token: FencingToken,
    /// The value block the grant returned (when the lock asks for it).
    value: Option<ValueRead>,
    /// The block the unlock writes (exclusive guards only: `set_value`).
    write: Option<ValueBlock>,
    armed: bool,
}

impl<C: Connection> Held<C> {
    pub(super) fn new(
        lock: Arc<Named<C>>,
        mode: Mode,
        token: FencingToken,
        value: Option<ValueRead>,
    ) -> Held<C> {
        Held {
            lock,
            mode,
            token,
            value,
            write: None,
            armed: true,
        }
    }

    /// The unlock is the caller's from here.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    /// The block the unlock writes (see [`Named::unlock`]).
    pub(super) fn write(&self) -> Option<ValueBlock> {
        self.write
    }

    fn unlock(mut self) -> Result<(), Error> {
        self.disarm();
        self.lock.unlock(self.write)
    }

    async fn unlock_async(mut self) -> Result<(), Error> {
        let lock = Arc::clone(&self.lock);
        lock.unlock_async(&mut self).await
    }

    fn extend(&mut self, lease: Duration) -> Result<(), Error> {
        self.lock.extend(self.mode, lease)
    }

    fn fmt(&self, f: &mut fmt::Formatter<'_>, name: &str) -> fmt::Result {
        f.debug_struct(name)
            .field("lock", &self.lock)
            .field("mode", &self.mode)
            .field("token", &self.token)
            .field("value", &self.value)
            .finish()
    }
}

impl<C: Connection> Drop for Held<C> {
    fn drop(&mut self) {
        if self.armed {
            self.lock.locks.let_go([(self.lock.id, self.write)]);
        }
    }
}

/// A guard type: `$name`, with the docs given, over one [`Held`].
macro_rules! guard {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[must_use = "dropping a guard unlocks at once"]
        pub struct $name<C: Connection = Link>(pub(super) Held<C>);

        impl<C: Connection> $name<C> {
            /// The grant's fencing token: pass it with every write the lock protects. A grant
            /// given after this one (once this guard is gone, or its lease ran out) carries a
            /// larger token, so storage can refuse writes made under this one.
            #[inline]
            pub fn token(&self) -> FencingToken {
                self.0.token
            }

            /// The lock's value block as this grant returned it, when the lock asks for it
            /// (the handle's `set_value_blocks`): the bytes last written by an exclusive
            /// holder's unlock, with `valid` false when such a holder was lost without
            /// writing (its client died, its lease ran out) or a server failover left the
            /// block unknown. `None` when the lock does not ask.
            #[inline]
            pub fn value(&self) -> Option<ValueRead> {
                self.0.value
            }

            /// Unlocks now and waits for the server's answer: the error a drop would report to
            /// the drop hook (`NotHeld` when the grant was lost, its lease having run out).
            pub fn unlock(self) -> Result<(), Error> {
                self.0.unlock()
            }

            /// [`unlock`](Self::unlock) as a future, for any executor. Dropped before it
            /// resolves, it leaves the unlock to the guard's drop (before the request was sent)
            /// or to the handle's next call (after).
            pub async fn unlock_async(self) -> Result<(), Error> {
                self.0.unlock_async().await
            }
        }

        impl<C: Connection> fmt::Debug for $name<C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f, stringify!($name))
            }
        }
    };
}

/// `set_value` for the guards of exclusive grants: only an exclusive holder writes the value
/// block.
macro_rules! set_value {
    ($name:ident) => {
        impl<C: Connection> $name<C> {
            /// Sets the lock's value block this guard's unlock writes (its drop, `unlock` or
            /// `unlock_async`): the next grant of the lock, to any client that asks for the
            /// block, returns it, valid. Without a call the unlock leaves the block as it was.
            /// A second call replaces the first. (An engine with fewer than 32 bytes to keep
            /// pads them; the reference-shaped `Client::stage_value` takes a slice and refuses
            /// more than 32 bytes.)
            #[inline]
            pub fn set_value(&mut self, block: &[u8; 32]) {
                self.0.write = Some(ValueBlock(*block));
            }
        }
    };
}

/// `extend` for the guards of locks whose grants have leases of their own.
macro_rules! extend {
    ($name:ident) => {
        impl<C: Connection> $name<C> {
            /// Extends the grant to at least `lease` from now; zero only checks that it is still
            /// held. `NotHeld` when the grant was lost.
            pub fn extend(&mut self, lease: Duration) -> Result<(), Error> {
                self.0.extend(lease)
            }
        }
    };
}

guard! {
    /// An atomic lock held ([`AtomicLock`](super::AtomicLock)'s `try_lock`, `lock`,
    /// `lock_async`); unlocked when dropped.
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
    /// let mut guard = locks.atomic("orders/rg-17")?.try_lock(Duration::from_millis(500))?;
    /// guard.extend(Duration::from_secs(30))?; // a longer transaction than planned
    /// let token = guard.token();
    /// // Guards are 'static and Send: this one unlocks on another thread.
    /// std::thread::spawn(move || guard.unlock()).join().unwrap()?;
    /// # let _ = token;
    /// # drop(locks);
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    AtomicLockGuard
}
extend!(AtomicLockGuard);
set_value!(AtomicLockGuard);

guard! {
    /// A reader-writer lock held shared ([`RwLock`](super::RwLock)'s `try_read`, `read`,
    /// `read_async`); unlocked when dropped. The grant lasts while the client's lease does
    /// ([`Locks::heartbeat`](super::Locks::heartbeat)), so it has no `extend`.
    RwLockReadGuard
}

guard! {
    /// A reader-writer lock held exclusive ([`RwLock`](super::RwLock)'s `try_write`, `write`,
    /// `write_async`); unlocked when dropped. The grant lasts while the client's lease does
    /// ([`Locks::heartbeat`](super::Locks::heartbeat)), so it has no `extend`.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl std::task::Wake for Unpark {
    /// #         fn wake(self: std::sync::Arc<Self>) { self.0.unpark() }
    /// #     }
    /// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         match f.as_mut().poll(&mut cx) {
    /// #             std::task::Poll::Ready(v) => return v,
    /// #             std::task::Poll::Pending => std::thread::park(),
    /// #         }
    /// #     }
    /// # }
    /// use std::time::Duration;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let table = locks.rw("orders")?;
    /// // Any executor will do; this one is a few lines of std.
    /// block_on(async {
    ///     let writer = table.write_async(Duration::from_secs(1)).await?;
    ///     // ... writes carrying writer.token(), across any number of .await points ...
    ///     writer.unlock_async().await
    /// })?;
    /// # drop((table, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    RwLockWriteGuard
}
set_value!(RwLockWriteGuard);

guard! {
    /// A fair lock held shared ([`FairLock`](super::FairLock)'s `try_read`, `read`,
    /// `read_async`); unlocked when dropped.
    FairLockReadGuard
}
extend!(FairLockReadGuard);

guard! {
    /// A fair lock held exclusive ([`FairLock`](super::FairLock)'s `try_write`, `write`,
    /// `write_async`); unlocked when dropped.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl std::task::Wake for Unpark {
    /// #         fn wake(self: std::sync::Arc<Self>) { self.0.unpark() }
    /// #     }
    /// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         match f.as_mut().poll(&mut cx) {
    /// #             std::task::Poll::Ready(v) => return v,
    /// #             std::task::Poll::Pending => std::thread::park(),
    /// #         }
    /// #     }
    /// # }
    /// use std::time::Duration;
    /// use dlock_transport::client::{ClientConfig, Endpoint, LockOptions, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let queue = locks.fair("jobs")?;
    /// let opts = LockOptions::new(Duration::from_secs(2)).with_wait(Duration::from_secs(1));
    /// block_on(async {
    ///     let mut writer = queue.write_async(opts).await?; // waits in line, in order
    ///     writer.extend(Duration::from_secs(10))?; // a longer job than planned
    ///     writer.unlock_async().await
    /// })?;
    /// # drop((queue, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    FairLockWriteGuard
}
extend!(FairLockWriteGuard);
set_value!(FairLockWriteGuard);
