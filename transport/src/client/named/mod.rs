//! The native lock API: typed lock handles, guards that unlock on drop, blocking and async.
//!
//! This module owns [`Locks`] (a cheap-to-clone handle on one client registration), the typed
//! lock handles ([`AtomicLock`], [`RwLock`], [`FairLock`]: one lock name resolved once), their
//! guards (named as tokio's and parking_lot's: [`AtomicLockGuard`], [`RwLockReadGuard`],
//! [`RwLockWriteGuard`], [`FairLockReadGuard`], [`FairLockWriteGuard`]), lock sets
//! ([`GuardSet`]), and the bookkeeping that lets any number of threads and tasks share one
//! registration. It drives a reference-shaped [`Client`] over any [`Connection`], so the
//! simulators drive guards through the same code as a real link. It uses the client's public
//! calls, plus a few crate-internal ones made for it: the client's clock, whether an
//! asynchronous operation is outstanding and finishing one a dropped future left behind
//! (blocking or polled), and completing a pipelined batch without waiting.
//!
//! ```
//! use std::time::Duration;
//!
//! use dlock_core::Config;
//! use dlock_transport::client::{ClientConfig, Endpoint, Locks};
//! use dlock_transport::runtime::{ServerConfig, ServerHandle};
//!
//! let server = ServerHandle::start(ServerConfig::new(Config {
//!     locks_max: 64,
//!     clients_max: 4,
//!     objects_max: 4,
//!     ..Config::default()
//! }))?;
//! let a = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
//! let b = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
//! let rg_a = a.atomic("t1/rg7")?;
//! let rg_b = b.atomic("t1/rg7")?;
//!
//! let lease = Duration::from_secs(5);
//! let guard = rg_a.try_lock(lease)?;
//! // Every write the lock protects carries the token; storage refuses older ones.
//! let token = guard.token();
//! assert!(rg_b.try_lock(lease).unwrap_err().is_would_block());
//!
//! guard.unlock()?; // or drop it
//! let again = rg_b.try_lock(lease)?;
//! assert!(again.token() > token);
//! # drop(again);
//! # drop((rg_a, rg_b, a, b));
//! # server.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Kinds are types
//!
//! | handle       | take, once          | take, waiting on the server     | guard(s)                                  | lease          |
//! |--------------|---------------------|---------------------------------|-------------------------------------------|----------------|
//! | [`AtomicLock`] | `try_lock(lease)`  | `lock(opts)`, `lock_async(opts)` | [`AtomicLockGuard`]                        | per grant      |
//! | [`RwLock`]   | `try_read()`, `try_write()` | `read(wait)`, `write(wait)`, `read_async`, `write_async` | [`RwLockReadGuard`], [`RwLockWriteGuard`] | the client's   |
//! | [`FairLock`] | `try_read(lease)`, `try_write(lease)` | `read(opts)`, `write(opts)`, `read_async`, `write_async` | [`FairLockReadGuard`], [`FairLockWriteGuard`] | per grant |
//!
//! An atomic lock has no shared mode, so its handle has no `read` and a set takes it without
//! one: asking for a shared grant does not compile. An RW grant has no lease of its own on the
//! server (it lasts while the client's does, [`Locks::heartbeat`]), so RW calls take none and
//! RW guards have no `extend`. (The compile-fail doc tests of
//! `claims::a_kind_error_does_not_compile` check each of these.)
//!
//! Waiting calls take [`LockOptions`] (`lease` and `wait` named, so the two durations cannot be
//! swapped); every duration becomes the protocol's milliseconds by the core's one rule
//! ([`dlock_core::time::duration_to_ms`]: rounded up, so a lease lasts at least as asked). A
//! zero lease is refused (`Invalid`): the reference reads it as "answer from the cache", which
//! grants nothing.
//!
//! # Blocking and async
//!
//! Every taking call has a blocking form and an `_async` one (the crate's convention, as
//! [`Client::lock_async`]); a guard has [`unlock`](RwLockWriteGuard::unlock) and
//! [`unlock_async`](RwLockWriteGuard::unlock_async). The futures need no runtime: they are
//! woken by the connection (a [`Mux`](super::Mux)'s reader; other links ask to be polled again
//! at once), and a wait for a guard of the same handle by a small timer thread of this module.
//! A waiting future that is dropped before it resolves leaves its request parked on the server
//! until it is granted or its wait runs out (for atomic and RW locks at most one 20 ms slice,
//! see below): the handle's next call finishes it, and gives back a grant nobody took.
//!
//! A guard is `Send`, `'static` and holds no thread, no lock of this process and no borrow:
//! holding one across `.await` is sound, and excludes other clients (and other guards of the
//! handle) for as long as it lives.
//!
//! # Dropping a guard
//!
//! Dropping a guard sends its unlock without waiting for the reply: the lock is released when
//! the server executes the unlock, microseconds later, and the guard's token is stale from the
//! drop. The reply is read by the handle's next call, which reports an error it carries to the
//! drop hook ([`Locks::set_drop_hook`], by default a `tracing` warning; never a panic). A drop
//! waits for the network only to read a reply the server has already sent: when four unlock
//! messages of the handle are still unanswered (the connection's pipeline is full), or when a
//! waiting request whose future was dropped is still on the server. When another thread or
//! task of the handle is using the client at that moment, the unlock is queued and that caller
//! sends it as soon as it is done (for a fair lock's wait, which is one request, when the wait
//! ends: give threads that wait on contended fair locks a handle of their own). Use `unlock()`
//! (or `unlock_async().await`) to wait for the unlock and see its error.
//!
//! An unlock that cannot be sent (the connection failed) goes to the hook too, and the grant
//! stays on the server until the client's lease ends. The client's record still says "held"
//! then; the handle's next request for that lock gives the grant back before it asks, so a
//! guard always stands for a grant the server made for it, never for a stale one re-entered.
//!
//! # Sharing one registration
//!
//! A [`Client`] is one registration used by one caller at a time (`&mut self`). A [`Locks`]
//! lends it to one call at a time (a *turn*: the client is taken out of the handle, so no
//! mutex is held while the network is used, and a future can keep it across polls); the
//! handle's bookkeeping sits behind a mutex held for a few instructions only, so `Debug`, a
//! drop or a waiting task never waits behind a network call for it.
//!
//! The server sees one client per registration, so it cannot keep two guards of one handle
//! apart; the handle does. It counts the guards it has out per lock and mode:
//!
//! | this handle holds | asked     | `try_*`                    | waiting call                        |
//! |-------------------|-----------|----------------------------|-------------------------------------|
//! | nothing           | any       | asks the server            | asks the server                     |
//! | shared            | shared    | re-entry (one more guard)  | re-entry (one more guard)           |
//! | shared            | exclusive | `WouldBlock`               | waits for those guards, then server |
//! | exclusive         | any       | `WouldBlock`               | waits for that guard, then server   |
//!
//! So two threads sharing a handle exclude each other as two handles would. The reference
//! client's re-entrancy (a second exclusive `trylock` of the same instance succeeds) is not
//! offered: a guard is a proof of exclusion, and a re-entrant "exclusive" guard held by another
//! thread would not be one. Shared re-entry uses the client's count, so the lock is released on
//! the server when the last shared guard goes.
//!
//! # Waiting
//!
//! A waiting call waits on the server, which answers the moment the lock is granted. For atomic
//! and RW locks the wait goes in slices of at most 20 ms with the client given back between
//! them, so other calls of the handle (an unlock, another lock) get in while one waits; those
//! kinds keep no queue position a slice could lose. A fair lock's wait is one request for the
//! whole wait, because a ticket given back between slices would lose its place in the queue,
//! which is what a fair lock is for.
//!
//! # Fair locks and tickets
//!
//! A fair lock grants in ticket order. Its waiting calls queue with a ticket and wait in the
//! queue for the whole wait; the server gives the ticket up if the wait runs out. A `try_*`
//! that finds others queued first is refused (`WouldBlock`), but the server has queued it
//! (`EAGAIN` with a ticket), and that ticket stays with the registration, in view:
//! [`FairLock::queued`] says it is there, the next call on the name in that mode (a `try_`
//! or a wait, from any clone of the handle) asks with it and keeps the place, a call in the
//! other mode is `Invalid` (the reference's `ETICKET`), [`FairLock::leave_queue`] gives it
//! back, and so does the release of the last handle on the name.
//!
//! Why not give it back at once, so that a try left nothing behind? The lock word keeps a
//! ticket's number in line whether or not anyone still holds it: when the holder leaves, an
//! abandoned ticket is "now serving" until the hand-off window (2 s) passes and a later ticket
//! may go past it, so each try given back at once would cost every waiter behind it up to two
//! seconds, and a caller retrying a try would queue behind its own abandoned tickets each
//! time. Kept and reused, the ticket is served in its turn.
//!
//! # Lock value blocks
//!
//! A lock can carry 32 bytes for the engine (a page's LSN, the node with its newest copy: the
//! Linux DLM's lock value block; `dlock_core::manager::value`). A handle asks for them with
//! `set_value_blocks(true)`; every guard of the lock then returns the block its grant came with
//! ([`RwLockReadGuard::value`], …), `valid` false when an exclusive holder was lost without
//! writing it. An exclusive guard (atomic, RW write, fair write) writes one with `set_value`,
//! written by its unlock, whether dropped or explicit. A read guard has no `set_value`: readers
//! cannot write the block. A [`GuardSet`] neither returns nor writes blocks.
//!
//! # Names
//!
//! Resolving a name ([`Locks::atomic`], [`Locks::rw`], [`Locks::fair`]) is a control exchange
//! and blocks; so is releasing one, which the handle does at the start of its next call once
//! the last handle on the name is gone (a drop does not wait for it). Async code resolves its
//! names once and keeps the handles: a handle is cheap to clone and to keep.
//!
//! # Allocation
//!
//! Resolving a name ([`Locks::rw`], …) allocates its handle; a set allocates its list of
//! entries. Taking a guard, dropping it and unlocking it allocate nothing once the handle's
//! bookkeeping has grown to the number of guards out at once (its maps keep their capacity). A
//! future that finds the client or a lock of its own handle busy clones its waker into the
//! handle's waiting list (and, for a deadline, the timer's) once.
//!
//! # After a transport failure
//!
//! After an [`ErrorKind::Disconnected`](super::ErrorKind::Disconnected) the client's record of a
//! lock may still say "held"; connect a new handle rather than go on with this one.

mod acquire;
mod claims;
mod guard;
mod kinds;
mod set;
mod timer;
mod turn;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use dlock_core::manager::value::ValueBlock;
use dlock_core::{ClientId, LockId, LockKind, Mode, Status};

pub use guard::{
    AtomicLockGuard, FairLockReadGuard, FairLockWriteGuard, RwLockReadGuard, RwLockWriteGuard,
};
pub use kinds::{AtomicLock, FairLock, LockOptions, RwLock};
pub use set::{GuardSet, SetEntry, SetMode};

use super::error::{Error, Op};
use super::link::Link;
use super::{Client, ClientConfig, Connection};
use kinds::Named;
use turn::Orphan;

/// Where errors that a drop cannot return go.
type DropHook = Arc<dyn Fn(&Error) + Send + Sync>;

/// A handle on one client registration, for the native lock API. Cheap to clone; the clones
/// share the registration, the guards' bookkeeping and the drop hook. Generic over the
/// [`Connection`] its client runs over (a [`Link`] unless a test or simulator gives another).
/// See the module doc.
pub struct Locks<C: Connection = Link> {
    shared: Arc<Shared<C>>,
}

impl<C: Connection> Clone for Locks<C> {
    fn clone(&self) -> Self {
        Locks {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<C: Connection> {
    /// The registration's client id, kept outside the mutex so that `Debug` and
    /// [`Locks::client_id`] never wait; written when a turn gives the client back.
    client_id: AtomicU32,
    state: Mutex<State<C>>,
    /// Signalled whenever the client comes back or a guard lets its lock go.
    changed: Condvar,
}

/// What the mutex protects. It is held for bookkeeping only, never across the network.
struct State<C: Connection> {
    /// The client, `None` while lent out for a turn.
    client: Option<Box<Client<C>>>,
    /// An asynchronous request whose future was dropped before its answer came: the next turn
    /// finishes it.
    orphan: Option<Orphan>,
    /// How many live handles use each lock id; the client's reference on the server is released
    /// when the count reaches zero (the server keeps one reference per client however often it
    /// is asked).
    names: HashMap<LockId, u32>,
    /// The grants this handle's guards hold, per lock.
    held: HashMap<LockId, Hold>,
    /// Unlocks of dropped guards (and fair tickets given back) not sent yet: the client was
    /// lent out when they were dropped. Whoever has it sends them before giving it back.
    unlocks: Vec<(LockId, Option<ValueBlock>)>,
    /// Lock references whose last handle went, released at the start of the next turn.
    releases: Vec<LockId>,
    /// Tasks waiting for the client or for a guard of this handle to let go.
    wakers: Vec<Waker>,
    /// Errors of drops (and of requests whose futures were dropped) met during a turn, for the
    /// hook once the client is given back.
    failures: Vec<Error>,
    hook: Option<DropHook>,
}

/// One lock's guards on this handle.
#[derive(Clone, Copy, Debug)]
struct Hold {
    mode: Mode,
    /// Live guards (always 1 for exclusive).
    guards: u32,
}

impl<C: Connection> State<C> {
    /// Whether a guard of this handle holds `id` in a mode that excludes `mode`.
    fn conflicts(&self, id: LockId, mode: Mode) -> bool {
        self.held
            .get(&id)
            .is_some_and(|h| h.mode == Mode::Exclusive || mode == Mode::Exclusive)
    }

    fn hold(&mut self, id: LockId, mode: Mode) {
        let h = self.held.entry(id).or_insert(Hold { mode, guards: 0 });
        debug_assert!(h.mode == mode, "a conflicting grant was not refused");
        h.guards += 1;
    }

    /// One guard of `id` is gone.
    fn unhold(&mut self, id: LockId) {
        if let Some(h) = self.held.get_mut(&id) {
            h.guards -= 1;
            if h.guards == 0 {
                self.held.remove(&id);
            }
        }
    }

    /// One handle on `id` is gone; true when it was the last.
    fn uncount(&mut self, id: LockId) -> bool {
        let Some(n) = self.names.get_mut(&id) else {
            // Every handle counted its id when it was made; a missing count would be a bug
            // here, and this runs in `Drop`, where a panic could abort, so it is only asserted
            // in tests.
            debug_assert!(false, "a lock handle's id was not counted");
            return false;
        };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        self.names.remove(&id);
        true
    }
}

impl<C: Connection> fmt::Debug for Locks<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the state's mutex: a Debug print must not wait for anything.
        f.debug_struct("Locks")
            .field("client", &self.client_id())
            .finish_non_exhaustive()
    }
}

impl<C: Connection> From<Client<C>> for Locks<C> {
    fn from(client: Client<C>) -> Locks<C> {
        Locks::new(client)
    }
}

impl Locks<Link> {
    /// Registers a new client instance and wraps it ([`Client::connect`]: a server that
    /// cannot be reached is `NotReady`, with the I/O error as the source).
    pub fn connect(cfg: ClientConfig) -> Result<Locks, Error> {
        Client::connect(cfg).map(Locks::new)
    }
}

impl<C: Connection> Locks<C> {
    /// Wraps a registered client (for code that also uses the reference-shaped calls, or a
    /// client over a connection of a test's or a simulator's own).
    pub fn new(client: Client<C>) -> Locks<C> {
        Locks {
            shared: Arc::new(Shared {
                client_id: AtomicU32::new(client.id().get()),
                state: Mutex::new(State {
                    client: Some(Box::new(client)),
                    orphan: None,
                    names: HashMap::new(),
                    held: HashMap::new(),
                    unlocks: Vec::new(),
                    releases: Vec::new(),
                    wakers: Vec::new(),
                    failures: Vec::new(),
                    hook: None,
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// The atomic lock `name`: exclusive only, each grant with a lease.
    pub fn atomic(&self, name: impl AsRef<[u8]>) -> Result<AtomicLock<C>, Error> {
        self.named(LockKind::Atomic, name.as_ref()).map(AtomicLock)
    }

    /// The reader-writer lock `name`: shared or exclusive, a grant lasting while the client's
    /// lease does.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let table = locks.rw("t1")?;
    /// let reader = table.try_read()?;
    /// let other = table.try_read()?; // readers share
    /// assert!(table.try_write().unwrap_err().is_would_block());
    /// drop((reader, other));
    /// let writer = table.write(std::time::Duration::from_secs(1))?; // waits up to 1 s
    /// writer.unlock()?;
    /// # drop((table, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rw(&self, name: impl AsRef<[u8]>) -> Result<RwLock<C>, Error> {
        self.named(LockKind::Rw, name.as_ref()).map(RwLock)
    }

    /// The fair lock `name`: shared or exclusive, granted in arrival order, each grant with a
    /// lease.
    pub fn fair(&self, name: impl AsRef<[u8]>) -> Result<FairLock<C>, Error> {
        self.named(LockKind::Fair, name.as_ref()).map(FairLock)
    }

    /// The lock `name` of `kind`, created on the server if it does not exist (`get_lock`, once;
    /// the id is kept). `Invalid` when the name exists with another kind or is empty or longer
    /// than the server's limit (512 bytes by default).
    fn named(&self, kind: LockKind, name: &[u8]) -> Result<Arc<Named<C>>, Error> {
        let mut turn = self.turn();
        turn.settle();
        let id = turn.client().get_lock(kind, name)?;
        *self.state().names.entry(id).or_insert(0) += 1;
        Ok(Arc::new(Named::new(self.clone(), id, kind, name)))
    }

    /// Sets where errors go that a drop cannot return (a guard's unlock, a name's release, the
    /// request of a future dropped before its answer), for this handle and its clones. The hook
    /// hears of an error when the call that met it (usually the handle's next call) is done
    /// with the client, on that call's thread and with nothing of the handle locked, so it may
    /// use the handle. The default logs a `tracing` warning.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use dlock_transport::client::{ClientConfig, Endpoint, ErrorKind, Locks};
    ///
    /// let a = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let b = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let lost = Arc::new(Mutex::new(Vec::new()));
    /// let sink = Arc::clone(&lost);
    /// a.set_drop_hook(move |e| sink.lock().unwrap().push(e.kind()));
    /// let guard = a.atomic("x")?.try_lock(Duration::from_millis(50))?;
    /// std::thread::sleep(Duration::from_millis(200)); // the lease runs out,
    /// let theirs = b.atomic("x")?.try_lock(Duration::from_secs(5))?; // and b takes the lock
    /// drop(guard); // sends the unlock, which the server refuses: the grant is not a's any more
    /// a.heartbeat()?; // a's next call reads the answer and tells the hook
    /// assert_eq!(*lost.lock().unwrap(), [ErrorKind::NotHeld]);
    /// # drop((theirs, a, b));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_drop_hook(&self, hook: impl Fn(&Error) + Send + Sync + 'static) {
        self.state().hook = Some(Arc::new(hook));
    }

    /// Renews the client's lease, which keeps every RW grant of the registration (atomic and
    /// fair grants have leases of their own: their guards' `extend`).
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let writer = locks.rw("t1")?.try_write()?;
    /// locks.heartbeat()?; // well within the client's lease: the write grant stays
    /// # drop((writer, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn heartbeat(&self) -> Result<(), Error> {
        let mut turn = self.turn();
        turn.settle();
        turn.client().heartbeat()
    }

    /// The registration's client id; never waits.
    pub fn client_id(&self) -> ClientId {
        // Relaxed: the id is a value of its own, published with nothing else.
        let raw = self.shared.client_id.load(Ordering::Relaxed);
        ClientId::new(raw).expect("a registered client's id is never zero")
    }

    /// Runs `f` on the client, for the reference-shaped calls this API does not cover (objects,
    /// stats, `reinit`), after the unlocks of dropped guards have been answered. Do not unlock
    /// or release locks a guard or handle of this API holds: their drop would then fail; and
    /// leave no pipelined batch or asynchronous operation outstanding (the handle's next call
    /// would finish it and drop its result). Waits while another caller of the handle uses the
    /// client.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// // Transaction ids come from an object, which the reference-shaped client reaches.
    /// let xid = locks.with_client(|c| {
    ///     c.atomic64_create(b"txn-id", 1, 30)?;
    ///     let id = c.atomic64_get(b"txn-id", 30)?;
    ///     c.atomic64_faa(id, 1)
    /// })?;
    /// assert_eq!(xid, 1);
    /// # drop(locks);
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client<C>) -> R) -> R {
        let mut turn = self.turn();
        turn.settle();
        f(turn.client())
    }

    /// Tries to lock every entry of `entries` once, in as few messages as the batch limit
    /// allows (31 locks per message), and returns one guard for the set: see [`GuardSet`].
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use std::time::Duration;
    /// use dlock_core::Mode;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks, SetMode};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let row_groups = (0..8)
    ///     .map(|rg| locks.rw(format!("orders/rg-{rg}")))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// // All or nothing: either every row group is held, or none is.
    /// let entries = row_groups.iter().map(|rg| (rg, Mode::Exclusive));
    /// let set = locks.try_lock_all(entries, Duration::from_secs(5), SetMode::AllOrNothing)?;
    /// assert!(set.is_complete() && set.len() == 8);
    /// drop(set); // unlocks all eight
    /// # drop((row_groups, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// An entry is an [`AtomicLock`] (exclusive), or an [`RwLock`] or [`FairLock`] with a
    /// [`Mode`]: a shared atomic entry does not compile. `lease` is the lease of the atomic and
    /// fair grants (RW grants have none).
    ///
    /// Unlike the reference's batches (and [`Client::batch_trylock`]), a set has no size limit:
    /// more than 31 locks go in several messages, and an empty set is granted without asking
    /// the server. A set of up to 31 is one message, taken atomically on the server; a larger
    /// one is taken message by message, so another client may see part of it held for a moment
    /// even when the call then fails all or nothing.
    ///
    /// [`SetMode::AllOrNothing`]: either every lock is granted or the call fails and none
    /// stays held (each message is undone by the server itself, and the messages before it are
    /// unlocked). [`SetMode::PerItem`]: the set holds what was granted ([`GuardSet::token`]
    /// says which; a refused fair lock keeps its place, as after `try_write`); the call fails,
    /// with nothing held, when a message fails as a whole or a lock is refused for another
    /// reason than being busy (the server no longer knows the client, say). A lock that a guard
    /// of this handle holds in a conflicting mode counts as busy. `Invalid` for a lock of
    /// another handle or a lock listed twice.
    pub fn try_lock_all<'a, E>(
        &self,
        entries: impl IntoIterator<Item = E>,
        lease: Duration,
        set_mode: SetMode,
    ) -> Result<GuardSet<C>, Error>
    where
        E: Into<SetEntry<'a, C>>,
        C: 'a,
    {
        set::try_lock_all(self, entries, lease, set_mode)
    }

    /// The bookkeeping, also after a thread panicked holding it: every update under it leaves
    /// it consistent between statements, and refusing every later unlock would leak grants
    /// until their leases ran out.
    fn state(&self) -> MutexGuard<'_, State<C>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps an error no caller can receive for the drop hook, which hears of it when the turn
    /// that met it has given the client back ([`Locks::tell_hook`]).
    fn report(&self, e: Error) {
        self.state().failures.push(e);
    }

    /// Tells the drop hook (or the log) about the errors reported meanwhile. Called with the
    /// client given back and nothing locked, so the hook may use the handle.
    fn tell_hook(&self) {
        let (failures, hook) = {
            let mut st = self.state();
            if st.failures.is_empty() {
                return;
            }
            (std::mem::take(&mut st.failures), st.hook.clone())
        };
        for e in &failures {
            match &hook {
                Some(hook) => hook(e),
                None => tracing::warn!(error = %e, "dlock: error in a drop"),
            }
        }
    }

    fn same(&self, other: &Locks<C>) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// `lease` in the protocol's milliseconds (the core's rule); zero is `Invalid`, because the
/// reference reads a zero lease as "answer from the cache", which grants nothing.
fn lease_ms(op: Op, lease: Duration) -> Result<u32, Error> {
    if lease.is_zero() {
        return Err(op.err(Status::Einval));
    }
    Ok(dlock_core::time::duration_to_ms(lease))
}
