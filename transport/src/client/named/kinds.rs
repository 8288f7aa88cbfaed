//! The typed lock handles: [`AtomicLock`], [`RwLock`] and [`FairLock`], each one lock name
//! resolved on the server once, offering exactly the calls its kind supports.
//!
//! All three wrap one [`Named`] (the handle, id, kind and name) behind an `Arc`: cloning a
//! handle is a reference count, and the client's reference on the server is released when the
//! last clone and the last guard of the name are gone. Their waiting calls take
//! [`LockOptions`] where a grant has a lease, a bare wait where it has none (RW).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{LockId, LockKind, Mode};

use super::acquire::Ask;
use super::guard::{
    AtomicLockGuard, FairLockReadGuard, FairLockWriteGuard, RwLockReadGuard, RwLockWriteGuard,
};
use super::turn::release_reference;
use super::{Connection, Error, Locks};
use crate::client::link::Link;

/// How long a grant lasts and how long to wait for it: the two durations of a waiting request,
/// named so that they cannot be given in the wrong order.
///
/// ```
/// use std::time::Duration;
/// use dlock_transport::client::LockOptions;
///
/// let opts = LockOptions::new(Duration::from_secs(30)).with_wait(Duration::from_secs(1));
/// assert_eq!(opts, LockOptions { lease: Duration::from_secs(30), wait: Duration::from_secs(1) });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockOptions {
    /// How long the grant lasts unless extended. Not zero.
    pub lease: Duration,
    /// How long the request may wait on the server for the lock; zero asks once (and still
    /// gives the server a millisecond).
    pub wait: Duration,
}

impl LockOptions {
    /// A grant of `lease`, asked for once (no wait).
    pub const fn new(lease: Duration) -> LockOptions {
        LockOptions {
            lease,
            wait: Duration::ZERO,
        }
    }

    /// The same, waiting up to `wait` for the lock.
    pub const fn with_wait(self, wait: Duration) -> LockOptions {
        LockOptions { wait, ..self }
    }
}

/// One lock name on one handle.
pub(super) struct Named<C: Connection> {
    pub(super) locks: Locks<C>,
    pub(super) id: LockId,
    pub(super) kind: LockKind,
    name: Box<[u8]>,
    /// Cleared once the reference was released explicitly.
    armed: bool,
}

impl<C: Connection> Named<C> {
    pub(super) fn new(locks: Locks<C>, id: LockId, kind: LockKind, name: &[u8]) -> Named<C> {
        Named {
            locks,
            id,
            kind,
            name: name.into(),
            armed: true,
        }
    }

    /// Drops this handle's count on the id and, at zero, releases the client's reference now.
    fn release_now(&mut self) -> Result<(), Error> {
        self.armed = false;
        let mut turn = self.locks.turn();
        turn.settle();
        let last = self.locks.state().uncount(self.id);
        if last {
            release_reference(turn.client(), self.id)
        } else {
            Ok(())
        }
    }
}

impl<C: Connection> Drop for Named<C> {
    fn drop(&mut self) {
        if self.armed {
            // Released at the handle's next turn: a drop does not wait for the server.
            let mut st = self.locks.state();
            if st.uncount(self.id) {
                st.releases.push(self.id);
            }
        }
    }
}

impl<C: Connection> fmt::Debug for Named<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("kind", &self.kind)
            .field("id", &self.id)
            .finish()
    }
}

/// What every handle type has: `Clone`, `Debug`, its name and id, and an explicit release.
macro_rules! handle {
    ($name:ident) => {
        impl<C: Connection> Clone for $name<C> {
            fn clone(&self) -> Self {
                $name(Arc::clone(&self.0))
            }
        }

        impl<C: Connection> fmt::Debug for $name<C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($name)).field(&self.0).finish()
            }
        }

        impl<C: Connection> $name<C> {
            /// The lock's name.
            pub fn name(&self) -> &[u8] {
                &self.0.name
            }

            /// The lock's id on the server, for the reference-shaped calls.
            pub fn id(&self) -> LockId {
                self.0.id
            }

            /// Asks for the lock's value block with every grant from now on (`on`), or stops
            /// asking: each guard's `value()` then returns it. The setting belongs to the
            /// registration's record of the lock, so it holds for every handle and guard of
            /// this name on this [`Locks`] (as [`Client::set_value_blocks`](crate::client::Client::set_value_blocks)).
            /// Waits for the client like any call of the handle.
            pub fn set_value_blocks(&self, on: bool) -> Result<(), Error> {
                self.0
                    .locks
                    .with_client(|c| c.set_value_blocks(self.0.id, on))
            }

            /// Asks for every grant of the lock from now on to be retained if this
            /// registration dies holding it (`on`), or stops asking: see
            /// [`Client::set_retain`](crate::client::Client::set_retain). Like
            /// `set_value_blocks`, a setting of the registration's record of the lock.
            pub fn set_retain(&self, on: bool) -> Result<(), Error> {
                self.0.locks.with_client(|c| c.set_retain(self.0.id, on))
            }

            /// Drops this handle and, when it is the last on the name (no clone, no guard
            /// left), releases the client's reference on the server now, returning the error
            /// a drop would report to the hook (a drop releases it at the handle's next call).
            pub fn release(self) -> Result<(), Error> {
                match Arc::try_unwrap(self.0) {
                    Ok(mut named) => named.release_now(),
                    // Another clone or a guard still uses the name: the last one releases it.
                    Err(_) => Ok(()),
                }
            }
        }
    };
}

/// An atomic lock: exclusive only, each grant with a lease of its own ([`Locks::atomic`]).
///
/// ```
/// # use dlock_core::Config;
/// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
/// # let server = ServerHandle::start(ServerConfig::new(Config {
/// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
/// # }))?;
/// use std::time::Duration;
/// use dlock_transport::client::{ClientConfig, Endpoint, LockOptions, Locks};
///
/// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
/// let rg = locks.atomic("orders/rg-17")?;
/// let lease = Duration::from_secs(5);
/// let guard = rg.try_lock(lease)?; // once
/// assert!(rg.try_lock(lease).unwrap_err().is_would_block()); // the guard excludes
/// drop(guard);
/// let guard = rg.lock(LockOptions::new(lease).with_wait(Duration::from_secs(1)))?; // waits
/// # drop((guard, rg, locks));
/// # server.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AtomicLock<C: Connection = Link>(pub(super) Arc<Named<C>>);
handle!(AtomicLock);

impl<C: Connection> AtomicLock<C> {
    /// Takes the lock for `lease` if it is free; never waits. `WouldBlock` when it is held (by
    /// another client, or another guard of this handle).
    pub fn try_lock(&self, lease: Duration) -> Result<AtomicLockGuard<C>, Error> {
        let ask = Ask::once(Mode::Exclusive, Some(lease))?;
        self.0.acquire(ask).map(AtomicLockGuard)
    }

    /// Takes the lock for `opts.lease`, waiting up to `opts.wait` on the server; `TimedOut`
    /// when the wait runs out.
    pub fn lock(&self, opts: LockOptions) -> Result<AtomicLockGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Exclusive, Some(opts.lease), opts.wait)?;
        self.0.acquire(ask).map(AtomicLockGuard)
    }

    /// [`AtomicLock::lock`] as a future, for any executor; it holds no thread while it waits.
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
    /// let rg = locks.atomic("orders/rg-17")?;
    /// let opts = LockOptions::new(Duration::from_secs(5)).with_wait(Duration::from_secs(1));
    /// block_on(async {
    ///     let guard = rg.lock_async(opts).await?;
    ///     // ... writes carrying guard.token(), across .await points ...
    ///     guard.unlock_async().await
    /// })?;
    /// # drop((rg, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn lock_async(&self, opts: LockOptions) -> Result<AtomicLockGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Exclusive, Some(opts.lease), opts.wait)?;
        self.0.acquire_async(ask).await.map(AtomicLockGuard)
    }
}

/// A reader-writer lock: shared or exclusive, a grant lasting while the client's lease does
/// ([`Locks::rw`] has an example of the blocking calls, [`RwLockWriteGuard`] of the async
/// ones).
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
/// let (a, b) = (
///     Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?,
///     Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?,
/// );
/// let (ta, tb) = (a.rw("t1")?, b.rw("t1")?);
/// let reader = ta.read(Duration::from_secs(1))?;
/// assert!(tb.try_write().unwrap_err().is_would_block());
/// let other_reader = tb.try_read()?; // readers share
/// # drop((reader, other_reader, ta, tb, a, b));
/// # server.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RwLock<C: Connection = Link>(pub(super) Arc<Named<C>>);
handle!(RwLock);

impl<C: Connection> RwLock<C> {
    /// Takes the lock shared if no writer holds it; never waits. `WouldBlock` otherwise.
    pub fn try_read(&self) -> Result<RwLockReadGuard<C>, Error> {
        let ask = Ask::once(Mode::Shared, None)?;
        self.0.acquire(ask).map(RwLockReadGuard)
    }

    /// Takes the lock exclusive if it is free; never waits. `WouldBlock` otherwise.
    pub fn try_write(&self) -> Result<RwLockWriteGuard<C>, Error> {
        let ask = Ask::once(Mode::Exclusive, None)?;
        self.0.acquire(ask).map(RwLockWriteGuard)
    }

    /// Takes the lock shared, waiting up to `wait` on the server; `TimedOut` when it runs out.
    pub fn read(&self, wait: Duration) -> Result<RwLockReadGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Shared, None, wait)?;
        self.0.acquire(ask).map(RwLockReadGuard)
    }

    /// Takes the lock exclusive, waiting up to `wait` on the server; `TimedOut` when it runs
    /// out.
    pub fn write(&self, wait: Duration) -> Result<RwLockWriteGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Exclusive, None, wait)?;
        self.0.acquire(ask).map(RwLockWriteGuard)
    }

    /// [`RwLock::read`] as a future, for any executor; it holds no thread while it waits.
    pub async fn read_async(&self, wait: Duration) -> Result<RwLockReadGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Shared, None, wait)?;
        self.0.acquire_async(ask).await.map(RwLockReadGuard)
    }

    /// [`RwLock::write`] as a future, for any executor ([`RwLockWriteGuard`] has an example).
    pub async fn write_async(&self, wait: Duration) -> Result<RwLockWriteGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Exclusive, None, wait)?;
        self.0.acquire_async(ask).await.map(RwLockWriteGuard)
    }
}

/// A fair lock: shared or exclusive, granted in arrival order, each grant with a lease of its
/// own ([`Locks::fair`]). A `try_` that finds others queued first is refused and keeps a place
/// in the queue for the registration ([`FairLock::queued`]); see "Fair locks and tickets" in
/// the module doc.
///
/// ```
/// # use dlock_core::Config;
/// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
/// # let server = ServerHandle::start(ServerConfig::new(Config {
/// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
/// # }))?;
/// use std::time::Duration;
/// use dlock_core::Mode;
/// use dlock_transport::client::{ClientConfig, Endpoint, LockOptions, Locks};
///
/// let a = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
/// let b = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
/// let (qa, qb) = (a.fair("queue")?, b.fair("queue")?);
/// let lease = Duration::from_secs(5);
/// let writer = qa.try_write(lease)?;
/// // Refused, and queued behind the writer: the place is kept for the next call.
/// assert!(qb.try_read(lease).unwrap_err().is_would_block());
/// assert_eq!(qb.queued(), Some(Mode::Shared));
/// drop(writer);
/// // Asks with the ticket, waiting in the queue up to a second.
/// let reader = qb.read(LockOptions::new(lease).with_wait(Duration::from_secs(1)))?;
/// assert_eq!(qb.queued(), None);
/// # drop((reader, qa, qb, a, b));
/// # server.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FairLock<C: Connection = Link>(pub(super) Arc<Named<C>>);
handle!(FairLock);

impl<C: Connection> FairLock<C> {
    /// Takes the lock shared for `lease` if no writer holds it and nobody is queued first;
    /// never waits. `WouldBlock` otherwise, with a place in the queue kept
    /// ([`FairLock::queued`]); `Invalid` while the registration is queued for writing.
    pub fn try_read(&self, lease: Duration) -> Result<FairLockReadGuard<C>, Error> {
        let ask = Ask::once(Mode::Shared, Some(lease))?;
        self.0.acquire(ask).map(FairLockReadGuard)
    }

    /// Takes the lock exclusive for `lease` if it is free and nobody is queued first; never
    /// waits. `WouldBlock` otherwise, with a place in the queue kept ([`FairLock::queued`]);
    /// `Invalid` while the registration is queued for reading.
    pub fn try_write(&self, lease: Duration) -> Result<FairLockWriteGuard<C>, Error> {
        let ask = Ask::once(Mode::Exclusive, Some(lease))?;
        self.0.acquire(ask).map(FairLockWriteGuard)
    }

    /// Queues for the lock shared and waits in the queue up to `opts.wait` (one request: the
    /// place is kept for the whole wait); `TimedOut`, with the place given up, when it runs out.
    pub fn read(&self, opts: LockOptions) -> Result<FairLockReadGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Shared, Some(opts.lease), opts.wait)?;
        self.0.acquire(ask).map(FairLockReadGuard)
    }

    /// [`FairLock::read`] in exclusive mode.
    pub fn write(&self, opts: LockOptions) -> Result<FairLockWriteGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Exclusive, Some(opts.lease), opts.wait)?;
        self.0.acquire(ask).map(FairLockWriteGuard)
    }

    /// [`FairLock::read`] as a future, for any executor; it holds no thread while it waits.
    pub async fn read_async(&self, opts: LockOptions) -> Result<FairLockReadGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Shared, Some(opts.lease), opts.wait)?;
        self.0.acquire_async(ask).await.map(FairLockReadGuard)
    }

    /// [`FairLock::write`] as a future, for any executor; it holds no thread while it waits.
    pub async fn write_async(&self, opts: LockOptions) -> Result<FairLockWriteGuard<C>, Error> {
        let ask = Ask::waiting(Mode::Exclusive, Some(opts.lease), opts.wait)?;
        self.0.acquire_async(ask).await.map(FairLockWriteGuard)
    }

    /// The mode this registration is queued for on the lock, if a refused `try_` (or a set)
    /// left it a ticket: its next call on the name in that mode asks with the ticket and keeps
    /// the place. See "Fair locks and tickets" in the module doc.
    pub fn queued(&self) -> Option<Mode> {
        let mut turn = self.0.locks.turn();
        turn.settle();
        let id = self.0.id;
        turn.client()
            .local_lock(id)
            .and_then(|l| l.state.ticket_mode())
    }

    /// Gives back the ticket a refused `try_` left (nothing when there is none), and waits for
    /// the server's answer: the place in the queue is gone.
    pub fn leave_queue(&self) -> Result<(), Error> {
        let mut turn = self.0.locks.turn();
        turn.settle();
        let id = self.0.id;
        let queued = turn.client().local_lock(id).map(|l| l.state.ticket_mode());
        match queued {
            Some(Some(_)) => turn.client().unlock(id).map(drop),
            _ => Ok(()),
        }
    }
}
