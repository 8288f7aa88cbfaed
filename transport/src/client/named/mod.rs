//! The native lock API: named locks, and guards that unlock on drop.
//!
//! This module owns [`Locks`] (a cheap-to-clone handle on one client registration),
//! [`NamedLock`] (one lock name resolved once), the guards ([`Guard`], [`OwnedGuard`],
//! [`GuardSet`]) and the bookkeeping that makes several guards of one handle safe to hold at
//! once. It reaches the server only through [`Client`]'s public, reference-shaped calls, which
//! stay as they are for the C ABI and for code ported from the reference.
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
//! let guard = rg_a.try_exclusive(lease)?;
//! // Every write the lock protects carries the token; storage refuses older ones.
//! let token = guard.token();
//! assert!(rg_b.try_exclusive(lease).unwrap_err().is_would_block());
//!
//! drop(guard); // unlocks
//! let again = rg_b.try_exclusive(lease)?;
//! assert!(again.token() > token);
//! # drop(again);
//! # drop((rg_a, rg_b, a, b));
//! # server.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Sharing one registration
//!
//! A [`Client`] is one registration used by one thread at a time (`&mut self`), so guards
//! that outlive a call, several at once, across threads, need shared ownership: a [`Locks`] is an
//! `Arc<Mutex<…>>` around the client, `Send + Sync`, and every guard reaches the client through
//! it. The mutex is held for one request at a time, never while a guard is merely alive.
//!
//! The server sees one client per registration, so it cannot keep two guards of one handle
//! apart; the handle does. It counts the guards it has out per lock and mode:
//!
//! | this handle holds | asked     | `try_lock`                 | `lock(wait)`                        |
//! |-------------------|-----------|----------------------------|-------------------------------------|
//! | nothing           | any       | asks the server            | asks the server                     |
//! | shared            | shared    | re-entry (one more guard)  | re-entry (one more guard)           |
//! | shared            | exclusive | `WouldBlock`               | waits for those guards, then server |
//! | exclusive         | any       | `WouldBlock`               | waits for that guard, then server   |
//!
//! So two threads sharing a handle exclude each other as two handles would. The reference
//! client's re-entrancy (a second exclusive `trylock` of the same instance succeeds) is not
//! offered here: a guard is a proof of exclusion, and a re-entrant "exclusive" guard held by
//! another thread would not be one. Shared re-entry uses the client's count, so the lock is
//! released on the server when the last shared guard goes.
//!
//! # Waiting
//!
//! `lock(wait)` waits on the server, which answers the moment the lock is granted. For atomic
//! and RW locks the wait goes in slices of at most 20 ms with the handle's mutex let go between
//! them, so other guards of the handle can unlock (and other threads take other locks) while one
//! thread waits; those kinds keep no queue position a slice could lose. A fair lock's wait is one
//! request for the whole wait, because giving the ticket back between slices would lose its
//! place in the queue, which is what a fair lock is for: the handle is busy for that wait, so a
//! thread that waits on contended fair locks should have a handle of its own.
//!
//! # Fair locks and tickets
//!
//! A fair lock grants in ticket order. A `try_lock` that finds others first is refused
//! (`WouldBlock`) but leaves the handle queued with a ticket, as the reference's `trylock` does:
//! the handle's next attempt in the same mode retries with that ticket and keeps its place. The
//! ticket is not given back at once because an abandoned ticket stalls the queue until the
//! hand-off window passes and a later ticket's retry goes past it; a caller that gave up after
//! every refusal would queue a new ticket behind its own abandoned one each time and never be
//! served. Asking in the other mode while queued is `Invalid` (the reference's `Eticket`). The
//! ticket is given back when the last handle on the [`NamedLock`] is released.
//!
//! # Leases and times
//!
//! Every time is a [`Duration`], rounded up to the millisecond the protocol carries (a lease
//! shorter than asked could end before the caller expects) and capped at `u32::MAX` ms. A zero
//! lease is refused (`Invalid`): the reference reads it as "answer from the cache", which grants
//! nothing. RW grants have no lease on the server; they last while the client's lease does, so
//! extending an RW guard renews the client's lease (a heartbeat).
//!
//! # Errors on drop
//!
//! Dropping a guard unlocks it; dropping the last handle of a [`NamedLock`] releases the lock
//! name's reference. Neither can return an error, so errors go to the handle's drop hook
//! ([`Locks::set_drop_hook`]), by default a `tracing` warning, never a panic. Use
//! [`Guard::unlock`] and [`NamedLock::release`] to see them as `Result`s.
//!
//! After a transport failure ([`ErrorKind::Disconnected`](super::ErrorKind::Disconnected)) the
//! client's record of a lock may still say "held"; connect a new handle rather than go on with
//! this one.

mod guard;
mod set;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{ClientId, FencingToken, LockId, LockKind, Mode, Status};

pub use guard::{Guard, OwnedGuard};
pub use set::GuardSet;

use super::error::{Error, Op};
use super::{Client, ClientConfig};

/// The longest server-side wait of one request for an atomic or RW lock; the handle's other
/// users get the client between two such requests.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// The longest wait the client's `lock()` carries (its `wait_ms` is 32 bits); longer waits are
/// cut to it, which also keeps `Instant + wait` from overflowing.
const WAIT_MAX: Duration = Duration::from_millis(u32::MAX as u64);

/// Where errors that a drop cannot return go.
type DropHook = Arc<dyn Fn(&Error) + Send + Sync>;

/// A handle on one client registration, for the native lock API. Cheap to clone; the clones
/// share the registration, the guards' bookkeeping and the drop hook. See the module doc.
#[derive(Clone)]
pub struct Locks {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a guard of this handle gives its lock back.
    released: Condvar,
}

/// What the mutex protects: the client and what this handle's guards hold through it.
struct State {
    client: Client,
    /// How many live [`NamedLock`] handles use each lock id; the client's reference on the server
    /// is released when the count reaches zero (the server keeps one reference per client
    /// however often it is asked).
    names: HashMap<LockId, u32>,
    /// The grants this handle's guards hold, per lock.
    held: HashMap<LockId, Hold>,
    hook: Option<DropHook>,
}

/// One lock's guards on this handle.
#[derive(Clone, Copy, Debug)]
struct Hold {
    mode: Mode,
    /// Live guards (always 1 for exclusive).
    guards: u32,
}

impl State {
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
}

impl fmt::Debug for Locks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state();
        f.debug_struct("Locks")
            .field("client", &st.client.id())
            .field("names", &st.names.len())
            .field("held", &st.held.len())
            .finish()
    }
}

impl From<Client> for Locks {
    fn from(client: Client) -> Locks {
        Locks::new(client)
    }
}

impl Locks {
    /// Registers a new client instance and wraps it ([`Client::connect`]: a server that
    /// cannot be reached is `NotReady`, with the I/O error as the source).
    pub fn connect(cfg: ClientConfig) -> Result<Locks, Error> {
        Client::connect(cfg).map(Locks::new)
    }

    /// Wraps a registered client (for code that also uses the reference-shaped calls).
    pub fn new(client: Client) -> Locks {
        Locks {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    client,
                    names: HashMap::new(),
                    held: HashMap::new(),
                    hook: None,
                }),
                released: Condvar::new(),
            }),
        }
    }

    /// The atomic lock `name`: exclusive only, with a lease.
    pub fn atomic(&self, name: impl AsRef<[u8]>) -> Result<NamedLock, Error> {
        self.named(LockKind::Atomic, name.as_ref())
    }

    /// The reader-writer lock `name`: shared or exclusive, lasting while the client's lease does.
    pub fn rw(&self, name: impl AsRef<[u8]>) -> Result<NamedLock, Error> {
        self.named(LockKind::Rw, name.as_ref())
    }

    /// The fair lock `name`: shared or exclusive, granted in arrival order, with a lease.
    pub fn fair(&self, name: impl AsRef<[u8]>) -> Result<NamedLock, Error> {
        self.named(LockKind::Fair, name.as_ref())
    }

    /// The lock `name` of `kind`, created on the server if it does not exist (`get_lock`, once;
    /// the id is kept). `Invalid` when the name exists with another kind or is empty or longer
    /// than the server's limit (512 bytes by default).
    pub fn named(&self, kind: LockKind, name: &[u8]) -> Result<NamedLock, Error> {
        let id = {
            let mut st = self.state();
            let id = st.client.get_lock(kind, name)?;
            *st.names.entry(id).or_insert(0) += 1;
            id
        };
        Ok(NamedLock {
            inner: Arc::new(NamedInner {
                locks: self.clone(),
                id,
                kind,
                name: name.into(),
                armed: true,
            }),
        })
    }

    /// Sets where errors go that a drop cannot return (a guard's unlock, a name's release), for
    /// this handle and its clones. The hook runs on the dropping thread, without the handle's
    /// lock held, so it may use the handle. The default logs a `tracing` warning.
    pub fn set_drop_hook(&self, hook: impl Fn(&Error) + Send + Sync + 'static) {
        self.state().hook = Some(Arc::new(hook));
    }

    /// Renews the client's lease, which keeps every RW grant of the registration (atomic and
    /// fair grants have leases of their own: [`Guard::extend`]).
    pub fn heartbeat(&self) -> Result<(), Error> {
        self.state().client.heartbeat()
    }

    /// The registration's client id.
    pub fn client_id(&self) -> ClientId {
        self.state().client.id()
    }

    /// Runs `f` on the client, for the reference-shaped calls this API does not cover (objects,
    /// stats, `reinit`). Do not unlock or release locks a guard or [`NamedLock`] of this handle
    /// holds: their drop would then fail. Blocks while another thread uses the handle.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client) -> R) -> R {
        f(&mut self.state().client)
    }

    /// Tries to lock every lock of `locks` in `mode` for `lease`, in as few messages as the batch
    /// limit allows (31 locks per message), and returns one guard for the set.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use std::time::Duration;
    /// use dlock_core::Mode;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let row_groups = (0..8)
    ///     .map(|rg| locks.atomic(format!("orders/rg-{rg}")))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let all: Vec<_> = row_groups.iter().collect();
    /// // All or nothing: either every row group is held, or none is.
    /// let set = locks.try_lock_all(&all, Mode::Exclusive, Duration::from_secs(5), true)?;
    /// assert!(set.is_complete());
    /// drop(set); // unlocks all eight
    /// # drop(all);
    /// # drop((row_groups, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Unlike the reference's batches (and [`Client::batch_trylock`]), a set has no size limit:
    /// more than 31 locks go in several messages, and an empty list gives an empty set without
    /// asking the server. A set of up to 31 is one message, taken atomically on the server;
    /// a larger one is taken message by message, so another client may see part of it held
    /// for a moment even when the call then fails all or nothing.
    ///
    /// With `all_or_nothing` either every lock is granted or the call fails and none stays held
    /// (each message is undone by the server itself, and the messages before it are unlocked).
    /// Without it the set holds what was granted ([`GuardSet::token`] says which, and a refused
    /// fair lock keeps its ticket as after [`NamedLock::try_lock`]); the call fails only when a
    /// message fails as a whole, and then nothing stays held. A lock that a guard of this handle
    /// holds in a conflicting mode counts as busy. `Invalid` for a lock of another handle or a lock listed
    /// twice.
    pub fn try_lock_all(
        &self,
        locks: &[&NamedLock],
        mode: Mode,
        lease: Duration,
        all_or_nothing: bool,
    ) -> Result<GuardSet, Error> {
        set::try_lock_all(self, locks, mode, lease, all_or_nothing)
    }

    /// The state, also after a thread panicked holding it: the client's calls do not panic on
    /// their own (bad input is a status), so its records are as the last completed call left
    /// them, and refusing every later unlock would leak grants until their leases ran out.
    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the drop hook (or the log) about an error no caller can receive.
    fn report(&self, e: &Error) {
        let hook = self.state().hook.clone();
        match hook {
            Some(hook) => hook(e),
            None => tracing::warn!(error = %e, "dlock: error in a drop"),
        }
    }

    /// Wakes the threads waiting for a guard of this handle to let a lock go.
    fn notify_released(&self) {
        self.shared.released.notify_all();
    }

    fn same(&self, other: &Locks) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// One lock name, resolved on the server once. Cheap to clone; the client's reference to the
/// lock is released when the last clone (and the last [`OwnedGuard`] of it) is dropped, or with
/// [`NamedLock::release`].
#[derive(Clone)]
pub struct NamedLock {
    inner: Arc<NamedInner>,
}

struct NamedInner {
    locks: Locks,
    id: LockId,
    kind: LockKind,
    name: Box<[u8]>,
    /// Cleared once the reference was released explicitly.
    armed: bool,
}

impl fmt::Debug for NamedLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedLock")
            .field("name", &String::from_utf8_lossy(&self.inner.name))
            .field("kind", &self.inner.kind)
            .field("id", &self.inner.id)
            .finish()
    }
}

impl NamedLock {
    /// Tries once to take the lock in `mode` for `lease`; never waits. `WouldBlock` when it is
    /// held in a conflicting mode (by another client, or another guard of this handle) or, for a
    /// fair lock, when others are queued first: then this handle keeps its ticket, and its next
    /// `try_lock` or `lock` in the same mode asks with it (see the module doc).
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use std::time::Duration;
    /// use dlock_core::Mode;
    /// use dlock_transport::client::{ClientConfig, Endpoint, Locks};
    ///
    /// let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let table = locks.rw("t1")?;
    /// let reader = table.try_lock(Mode::Shared, Duration::from_secs(5))?;
    /// let other = table.try_lock(Mode::Shared, Duration::from_secs(5))?; // readers share
    /// assert!(table.try_exclusive(Duration::from_secs(5)).unwrap_err().is_would_block());
    /// drop((reader, other));
    /// let mut writer = table.lock(Mode::Exclusive, Duration::from_secs(1), Duration::from_secs(5))?;
    /// writer.extend(Duration::from_secs(10))?; // a longer transaction
    /// writer.unlock()?; // or just drop it
    /// # drop((table, locks));
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_lock(&self, mode: Mode, lease: Duration) -> Result<Guard<'_>, Error> {
        let lease_ms = lease_ms(Op::TryLock, lease)?;
        let token = self.acquire(Op::TryLock, mode, lease_ms, None)?;
        Ok(Guard::new(self, mode, token))
    }

    /// Takes the lock in `mode` for `lease`, waiting up to `wait` for it (see the module doc on
    /// how the wait shares the handle). `TimedOut` when the wait runs out.
    pub fn lock(&self, mode: Mode, wait: Duration, lease: Duration) -> Result<Guard<'_>, Error> {
        let lease_ms = lease_ms(Op::Lock, lease)?;
        let deadline = Instant::now() + wait.min(WAIT_MAX);
        let token = self.acquire(Op::Lock, mode, lease_ms, Some(deadline))?;
        Ok(Guard::new(self, mode, token))
    }

    /// [`NamedLock::try_lock`] in exclusive mode.
    pub fn try_exclusive(&self, lease: Duration) -> Result<Guard<'_>, Error> {
        self.try_lock(Mode::Exclusive, lease)
    }

    /// [`NamedLock::try_lock`] in shared mode (RW and fair locks).
    pub fn try_shared(&self, lease: Duration) -> Result<Guard<'_>, Error> {
        self.try_lock(Mode::Shared, lease)
    }

    /// The lock's name.
    pub fn name(&self) -> &[u8] {
        &self.inner.name
    }

    /// The lock's kind.
    pub fn kind(&self) -> LockKind {
        self.inner.kind
    }

    /// The lock's id on the server, for the reference-shaped calls.
    pub fn id(&self) -> LockId {
        self.inner.id
    }

    /// The handle this lock was resolved through.
    pub fn locks(&self) -> &Locks {
        &self.inner.locks
    }

    /// Drops this handle on the name, and when it is the last one (no clone, no
    /// [`OwnedGuard`] left) releases the client's reference on the server now, reporting the
    /// error instead of sending it to the drop hook.
    pub fn release(self) -> Result<(), Error> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.armed = false;
                inner.release_reference()
            }
            // Another clone still uses the name: the last one releases it.
            Err(_) => Ok(()),
        }
    }

    /// Takes a grant (see the table in the module doc); returns its token.
    fn acquire(
        &self,
        op: Op,
        mode: Mode,
        lease_ms: u32,
        deadline: Option<Instant>,
    ) -> Result<FencingToken, Error> {
        let (locks, id, kind) = (&self.inner.locks, self.inner.id, self.inner.kind);
        let mut st = locks.state();
        let mut asked = false;
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if st.conflicts(id, mode) {
                // The server cannot see this conflict (one client holds both): wait for the
                // guard here, with the client free for it to unlock.
                let Some(left) = left else {
                    return Err(op.err(Status::Fail));
                };
                if left.is_zero() {
                    return Err(op.err(Status::Etimeout));
                }
                st = locks
                    .shared
                    .released
                    .wait_timeout(st, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            let granted = match left {
                None => st.client.trylock(id, mode, lease_ms),
                // A zero wait still asks once, as `try_lock` would.
                Some(left) if left.is_zero() && asked => Err(op.err(Status::Etimeout)),
                Some(left) if kind == LockKind::Fair => st.client.lock(id, mode, lease_ms, left),
                Some(left) => st.client.lock(id, mode, lease_ms, left.min(WAIT_SLICE)),
            };
            asked = true;
            match granted {
                Ok(grant) => {
                    st.hold(id, mode);
                    return Ok(grant.token);
                }
                Err(e)
                    if e.status() == Status::Etimeout
                        && kind != LockKind::Fair
                        && deadline.is_some_and(|d| Instant::now() < d) =>
                {
                    // One slice ran out: let the handle's other users in before the next.
                    drop(st);
                    std::thread::yield_now();
                    st = locks.state();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Unlocks one guard's grant; the guard is gone whatever the answer.
    fn release_grant(&self) -> Result<(), Error> {
        let (locks, id) = (&self.inner.locks, self.inner.id);
        let mut st = locks.state();
        let unlocked = st.client.unlock(id);
        st.unhold(id);
        drop(st);
        locks.notify_released();
        unlocked.map(drop)
    }

    /// Extends one guard's grant, held in `mode`, to at least `lease` from now (RW: renews the
    /// client's lease).
    fn extend_grant(&self, mode: Mode, lease: Duration) -> Result<(), Error> {
        let lease_ms = lease.as_nanos().div_ceil(1_000_000).min(u32::MAX as u128) as u32;
        let (locks, id) = (&self.inner.locks, self.inner.id);
        let mut st = locks.state();
        match self.inner.kind {
            LockKind::Rw => st.client.heartbeat(),
            _ => st.client.lock_extend(id, mode, lease_ms).map(drop),
        }
    }
}

impl NamedInner {
    /// Drops this handle's count on the id and, at zero, the client's reference on the server.
    fn release_reference(&self) -> Result<(), Error> {
        let mut st = self.locks.state();
        // Every `NamedLock` counted its id when it was made; a missing count would be a bug here,
        // and this runs in `Drop`, where a panic could abort, so it is only asserted in tests.
        let Some(n) = st.names.get_mut(&self.id) else {
            debug_assert!(false, "a NamedLock's id was not counted");
            return Ok(());
        };
        *n -= 1;
        if *n > 0 {
            return Ok(());
        }
        st.names.remove(&self.id);
        match st.client.release_lock(self.id) {
            // A refused fair `try_lock` left this handle queued; nobody will retry now.
            Err(e) if e.status() == Status::TicketToUnlock => st
                .client
                .unlock(self.id)
                .and_then(|_| st.client.release_lock(self.id)),
            other => other,
        }
    }
}

impl Drop for NamedInner {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.release_reference()
        {
            self.locks.report(&e);
        }
    }
}

/// `lease` in the protocol's milliseconds: rounded up (a shorter lease than asked could end
/// before the caller expects), capped at `u32::MAX`; zero is `Invalid` (the reference reads a
/// zero lease as "answer from the cache", which grants nothing).
fn lease_ms(op: Op, lease: Duration) -> Result<u32, Error> {
    if lease.is_zero() {
        return Err(op.err(Status::Einval));
    }
    Ok(lease.as_nanos().div_ceil(1_000_000).min(u32::MAX as u128) as u32)
}

/// Handles, names and owned guards cross threads and are shared between them.
const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Locks>();
    is_send_sync::<NamedLock>();
    is_send_sync::<OwnedGuard>();
    is_send_sync::<GuardSet>();
    is_send_sync::<Guard<'static>>();
};
