//! Cached RW locks: grants an engine keeps after its local users are done, re-used locally,
//! and given back when the server asks (MANAGER-SPEC §5; the server's side is
//! `dlock_core::server`'s `revokes.rs`).
//!
//! A [`CachedLocks`] is one client registration whose RW locks are asked for as *cacheable*
//! ([`Client::set_cacheable`]). The first guard of a lock asks the server; dropping the last
//! guard keeps the grant (no message), and the next guard in a mode the grant covers is handed
//! out locally (no message). When another client asks for a conflicting mode, the server sends
//! this one a revoke (once its minimum hold is over); the handle reads it whenever it looks at
//! its connection — every call that takes a guard, and [`Revokes::try_recv`], the channel the
//! engine polls — and acts on it itself. While it holds no grant on the server and owes no
//! give-back, the look waits as long as the client's trust bound allows (`State::pump`).
//!
//! The rules are `dlock_core::manager::cache`'s [`CachedLock`], one record per lock, which
//! this module drives (its module doc has the tables; the simulators can reach it there). In
//! short:
//!
//! | a revoke wanting | local guards                 | the handle                                           |
//! |------------------|------------------------------|------------------------------------------------------|
//! | anything         | (lock not held, or held under a newer grant) | ignores it (a stale or foreign revoke)  |
//! | exclusive        | none                         | gives the lock back now (an unlock)                  |
//! | exclusive        | some                         | takes no new guard; the last guard's drop gives it back |
//! | shared           | readers or none (held exclusive) | downgrades now: its readers go on under the shared grant |
//! | shared           | a writer                     | downgrades when the writer's guard drops             |
//!
//! Every revoke acted on is also told to the engine ([`Revoked`]), so that it can hurry the
//! users in the way; an event-ring overflow is [`Revoked::All`] and revokes every cached lock.
//! What a lock protects must be written back before its last guard drops, as before any
//! unlock: the give-back may follow at once.
//!
//! The client's calls go through one mutex (the registration is one client, used by one
//! caller at a time on the wire): a guard's drop that gives a lock back sends its message with
//! it held, and a waiting call waits on the server in slices of [`WAIT_SLICE`], looking at its
//! events and letting go of the mutex between them, so that a revoke is acted on while a
//! thread of the handle waits for another lock (two engines each waiting for the lock the
//! other caches would otherwise wait until their revokes lapsed). Its locks are asked for with
//! `WAKE_ON_REVOKE` ([`Client::set_wake_on_revoke`]), so a revoke that comes while the slice
//! is parked on the server ends the slice at once rather than at its end.
//!
//! A holder that does not look at its connection does not see its revokes, and loses the
//! grant at the server's revoke timeout (the client's lease by default) as if its lease ran
//! out: poll [`Revokes::try_recv`] from the engine's loop. Users that outlive a revoke by the
//! client's lease are warned about (`tracing`): their grant is gone.
//!
//! A handle names its lock by its place in the table of handles, not by id: after a failover
//! the client's re-claim files its records under the ids the replacement gave them
//! ([`Client::renumberings`]), and the handles follow by name, so a guard never takes whatever
//! lock inherited its lock's old id.
//!
//! Revokes that may have been lost come as [`Revoked::All`] too ([`Client::poll_events`],
//! `dlock_core::manager::trust`): after a reconnection or a failover (whose recovery re-claims
//! no cached grant), and, over TCP or RDMA, when no data request was answered within the revoke
//! timeout ([`ClientConfig::revoke_timeout`], the lease by default) — a revoke still on its way
//! may have lapsed. Every cached lock is then given back and asked for again at its next guard.

mod drive;
mod guard;
mod notices;
mod wait;

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::{Acquire, OnRevoke, Release, Reply, ServerOp, on_overflow};
use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::proto::Event;
use dlock_core::table::EVENT_RING_LEN;
use dlock_core::{FencingToken, LockId, LockKind, Mode, Status};

pub use drive::{Driven, SENDS_MAX, SENDS_TOTAL_MAX, drive_op, send_op};
pub use guard::{CachedReadGuard, CachedWriteGuard};
pub use notices::{NOTICES_MAX, Notices};
pub use wait::{WAIT_SLICE, wait_sliced};

use super::error::{Error, ErrorKind, Op};
use super::link::Link;
use super::{Client, ClientConfig, Connection, IdMap};

/// What the engine is told through [`Revokes::try_recv`]: flush what a lock protects, it is
/// being given back (now, or when its last guard drops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// Another client wants `lock` in mode `wanted`.
    Lock { lock: LockId, wanted: Mode },
    /// Revokes were lost (the event ring, or this queue, overflowed): every cached lock is
    /// being given back.
    All,
}

/// A handle on one registration for cached RW locks (module doc). Cheap to clone; the clones
/// share the registration.
pub struct CachedLocks<C: Connection = Link> {
    shared: Arc<Shared<C>>,
}

impl<C: Connection> Clone for CachedLocks<C> {
    fn clone(&self) -> Self {
        CachedLocks {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Connection> std::fmt::Debug for CachedLocks<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedLocks").finish_non_exhaustive()
    }
}

struct Shared<C: Connection> {
    state: Mutex<State<C>>,
    /// Signalled when a guard drops or a lock is given back.
    changed: Condvar,
}

struct State<C: Connection> {
    client: Client<C>,
    /// Per lock, under the id the client's record has now (revokes name it). Hashed by the
    /// client's fixed id hasher, not a randomly keyed one: an overflow gives the idle locks back
    /// and a renumbering rebuilds the watch list in the map's order, which is then the same on
    /// every run with the same ids, so the real-client simulator replays a seed exactly.
    entries: IdMap<LockId, Entry>,
    /// Per handle ([`CachedRwLock::key`]): its lock's name and the id it has now. A failover
    /// renumbers locks ([`Client::renumberings`]); the ids follow by name (`follow_renumbering`).
    handles: Vec<Handle>,
    /// The client's [`Client::renumberings`] when the ids last followed.
    renumberings: u64,
    /// What the engine has not read yet.
    notices: Notices<Revoked>,
    /// The locks each look must visit: a give-back owed, or a revoke waiting for the local
    /// users (to warn once it is overdue). Every other entry is left alone.
    watch: Vec<LockId>,
    /// Events read off the connection, before they are acted on (kept for its capacity).
    events: Vec<Event>,
    /// Guards handed out with no message, for tests and the engine's own accounting.
    local_hits: u64,
    /// Threads waiting on [`Shared::changed`]: a dropped guard wakes them only if there are
    /// any, since a notify with no waiter is still a system call (std's futex condvar).
    waiters: u32,
    /// The entries that are [`Entry::engaged`]. While there are none and nothing is watched,
    /// a look at the events may wait as long as the client's trust bound holds (`pump`).
    engaged: usize,
}

/// One lock's cached grant: the core's record, and what the guards read.
#[derive(Clone, Copy, Debug)]
struct Entry {
    cache: CachedLock,
    token: FencingToken,
    /// The block the grant came with, or the last one a local writer set.
    value: Option<ValueRead>,
    /// A block a local writer set, written to the server with the give-back or downgrade.
    staged: Option<ValueBlock>,
    /// A give-back or downgrade the server did not answer: sent again at the next look.
    owed: Option<ServerOp>,
    /// The status the owed op's last send failed with: what a guard that must wait for it
    /// is told (the connection's failure, not "busy").
    failed: Status,
    /// Users outlived a revoke past the lease: warned once.
    warned: bool,
    /// In [`State::watch`] (a flag, not a search of the list: an overflow watches every lock).
    watched: bool,
    /// Counted in [`State::engaged`]: the record holds a grant (or gives one back) on the
    /// server, or a give-back is owed. Set by [`State::settle`] after every exchange with the
    /// server, the only place where a record comes to hold something or stops holding it.
    engaged: bool,
}

impl Entry {
    const fn new() -> Self {
        Entry {
            cache: CachedLock::new(LockKind::Rw),
            token: FencingToken(0),
            value: None,
            staged: None,
            owed: None,
            failed: Status::Success,
            warned: false,
            watched: false,
            engaged: false,
        }
    }

    /// Whether the server may send a revoke this entry must hear ([`Entry::engaged`]).
    fn engages(&self) -> bool {
        self.cache.held().is_some() || self.cache.giving_back() || self.owed.is_some()
    }
}

/// A cached lock's name and current id (`State::handles`).
#[derive(Debug)]
struct Handle {
    name: Box<[u8]>,
    id: LockId,
    /// A failover's re-claim forgot the client's reference (the replacement refused it): the
    /// next use asks for the lock again.
    forgotten: bool,
    /// Counts the forgettings: a guard from before one belongs to a grant that is gone, and
    /// must not release the users of the grant taken afresh (`State::current_of`).
    generation: u64,
}

impl CachedLocks<Link> {
    /// Registers a new client instance and wraps it.
    pub fn connect(cfg: ClientConfig) -> Result<CachedLocks, Error> {
        Client::connect(cfg).map(CachedLocks::new)
    }
}

impl<C: Connection> CachedLocks<C> {
    /// Wraps a registered client.
    pub fn new(client: Client<C>) -> CachedLocks<C> {
        CachedLocks {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    client,
                    entries: IdMap::default(),
                    handles: Vec::new(),
                    renumberings: 0,
                    notices: Notices::new(Revoked::All),
                    watch: Vec::new(),
                    events: Vec::with_capacity(EVENT_RING_LEN + 1),
                    local_hits: 0,
                    waiters: 0,
                    engaged: 0,
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// The cached RW lock `name` (created on the server if it does not exist), its grants
    /// asked for as cacheable.
    pub fn rw(&self, name: impl AsRef<[u8]>) -> Result<CachedRwLock<C>, Error> {
        let name = name.as_ref();
        let mut st = self.state();
        st.follow_renumbering();
        let id = st.reference(name)?;
        // Room for a look that watches every lock (an overflow), made here rather than there.
        let n = st.entries.len().saturating_sub(st.watch.len());
        st.watch.reserve(n);
        let key = match st.handles.iter().position(|h| *h.name == *name) {
            Some(key) => {
                // A handle a failover forgot has its reference again, under this id.
                (st.handles[key].id, st.handles[key].forgotten) = (id, false);
                key
            }
            None => {
                let name = name.into();
                st.handles.push(Handle {
                    name,
                    id,
                    forgotten: false,
                    generation: 0,
                });
                st.handles.len() - 1
            }
        };
        Ok(CachedRwLock {
            locks: self.clone(),
            key,
        })
    }

    /// The channel of revoke notices the engine polls.
    pub fn revokes(&self) -> Revokes<C> {
        Revokes {
            locks: self.clone(),
        }
    }

    /// Guards handed out locally, with no message to the server.
    pub fn local_hits(&self) -> u64 {
        self.state().local_hits
    }

    /// Runs `f` on the client (stats, objects), with every give-back due already sent. Do not
    /// unlock the cached locks through it.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client<C>) -> R) -> R {
        let mut st = self.state();
        let r = f(&mut st.client);
        // A failover's re-claim made through it renumbers the locks.
        st.follow_renumbering();
        r
    }

    fn state(&self) -> MutexGuard<'_, State<C>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Connection> State<C> {
    /// Takes a reference to the RW lock `name` for the cache (cacheable, its waits ended by a
    /// revoke: module doc) and makes its entry; its id.
    fn reference(&mut self, name: &[u8]) -> Result<LockId, Error> {
        let id = self.client.get_lock(LockKind::Rw, name)?;
        self.client.set_cacheable(id, true)?;
        // A waiting call ends its slice when this client is revoked (module doc).
        self.client.set_wake_on_revoke(id, true)?;
        self.entries.entry(id).or_insert(Entry::new());
        Ok(id)
    }

    /// After a failover's re-claim filed the client's records under a replacement's ids
    /// ([`Client::renumberings`]): every handle's id and entry follow their lock by name. A
    /// replacement numbers its locks afresh, so an id kept from before names another lock of
    /// the client, or none: a guard taken under it would hold the wrong lock. One comparison
    /// when nothing changed; run before any id is used or any event read.
    fn follow_renumbering(&mut self) {
        let now = self.client.renumberings();
        if now == self.renumberings {
            return;
        }
        self.renumberings = now;
        if !self.entries.is_empty() {
            // The failover re-claimed no cached grant (module doc), and the notices the engine
            // has not read name ids from before.
            self.notices.renumbered();
        }
        let mut before = std::mem::take(&mut self.entries);
        for h in &mut self.handles {
            // A handle forgotten at an earlier failover keeps an id from before it, which the
            // replacement may have given another lock: that entry is not this handle's.
            let entry = if h.forgotten {
                None
            } else {
                before.remove(&h.id)
            };
            match self.client.lock_id(LockKind::Rw, &h.name) {
                Some(id) => {
                    self.entries.insert(id, entry.unwrap_or(Entry::new()));
                    (h.id, h.forgotten) = (id, false);
                }
                None if h.forgotten => {}
                None => {
                    h.forgotten = true;
                    h.generation += 1;
                }
            }
        }
        // The watch list named the old ids: it is rebuilt from the entries that still owe a
        // message or wait for their users (a renumbering is rare; the scan is fine there), and
        // the count of engaged entries from those kept (a forgotten handle's went with it).
        self.watch.clear();
        self.engaged = 0;
        for (&id, e) in &mut self.entries {
            e.watched = e.owed.is_some() || e.cache.revoke().is_some();
            if e.watched {
                self.watch.push(id);
            }
            self.engaged += usize::from(e.engaged);
        }
    }

    /// The id handle `key`'s lock has now; a forgotten reference is taken again.
    fn id_of(&mut self, key: usize) -> Result<LockId, Error> {
        self.follow_renumbering();
        if self.handles[key].forgotten {
            let name = self.handles[key].name.clone();
            let id = self.reference(&name)?;
            (self.handles[key].id, self.handles[key].forgotten) = (id, false);
        }
        Ok(self.handles[key].id)
    }

    /// The id handle `key`'s lock has now, if the client still holds a reference to it.
    fn current(&mut self, key: usize) -> Option<LockId> {
        self.follow_renumbering();
        let h = &self.handles[key];
        (!h.forgotten).then_some(h.id)
    }

    /// The id handle `key`'s lock has now, if a guard taken at `generation` still stands on
    /// its grant: not after a failover forgot the reference (the lock may be taken afresh
    /// since, its users none of that guard's).
    fn current_of(&mut self, key: usize, generation: u64) -> Option<LockId> {
        let id = self.current(key)?;
        (self.handles[key].generation == generation).then_some(id)
    }

    /// Reads the events the server sent and acts on them (module doc), and sends what is
    /// owed still. Returns whether a lock was given back or downgraded.
    ///
    /// While no entry holds anything on the server or owes a give-back, and nothing is watched,
    /// the look is left for later when [`Client::events_may_wait`] allows it (the row-group
    /// cache's rule, `dlock_engine_glue::rowgroup`): no revoke is for anything held, any unread
    /// one is for a grant given back since (which the look would ignore), and no lost
    /// connection owes its report, so nothing cached is used while the look waits. Over TCP a
    /// guard on an uncached lock then pays no `recv` on top of its request; the first grant
    /// held makes every call look again.
    fn pump(&mut self) -> Result<bool, Error> {
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

    /// Visits `id` at every look from now on (module doc of [`State::watch`]).
    fn watch(&mut self, id: LockId) {
        if let Some(e) = self.entries.get_mut(&id)
            && !e.watched
        {
            e.watched = true;
            self.watch.push(id);
        }
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

    /// A local user of `id` in `mode` is done: kept cached, or given back if a revoke waits
    /// for it.
    fn release(&mut self, id: LockId, mode: Mode) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if let Release::Send(op) = e.cache.release(mode) {
            drop(self.drive(id, op, Duration::ZERO));
        }
    }

    /// Sends `op` for `id` and hands the reply to the record, again while the record says it
    /// is owed ([`drive_op`]: up to [`SENDS_MAX`] times; then at the next look). The record's
    /// answer, and the error of a refused acquisition or of the send that left an op owed.
    fn drive(&mut self, id: LockId, op: ServerOp, wait: Duration) -> (Reply, Option<Error>) {
        let done = self.exchange(id, op, wait);
        self.settle(id);
        done
    }

    /// Counts `id`'s entry in [`State::engaged`] if it [engages](Entry::engaged) now, after an
    /// exchange with the server.
    fn settle(&mut self, id: LockId) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let now = e.engages();
        if now != e.engaged {
            e.engaged = now;
            if now {
                self.engaged += 1;
            } else {
                self.engaged -= 1;
            }
        }
    }

    /// [`State::drive`]'s exchange, before the entry is counted again.
    fn exchange(&mut self, id: LockId, op: ServerOp, wait: Duration) -> (Reply, Option<Error>) {
        // Whether the last send was a grant the server made plain: it goes with the reply.
        let (mut err, mut plain) = (None, false);
        let Ok(done) = drive_op(
            self,
            op,
            |st, op| {
                let (status, p, e) = st.send(id, op, wait);
                (err, plain) = (e, p);
                let token = st.entries.get(&id).expect("a handle's entry").token.0;
                Ok::<_, std::convert::Infallible>((status, token))
            },
            |st| &mut st.entries.get_mut(&id).expect("a handle's entry").cache,
        );
        match done.reply {
            Reply::Lost => {
                tracing::warn!(lock = ?id, "dlock: a cached lock's readers lost its grant");
            }
            // Made plain by the server (a contended lock): the last guard's drop unlocks it.
            Reply::Granted if plain => {
                let e = self.entries.get_mut(&id).expect("checked");
                e.cache.granted_plain();
            }
            Reply::Send(owed) => {
                let e = self.entries.get_mut(&id).expect("checked");
                (e.owed, e.failed) = (Some(owed), done.status);
                self.watch(id);
                let err = err.unwrap_or_else(|| Op::Unlock.err(done.status));
                return (Reply::Send(owed), Some(err));
            }
            _ => {}
        }
        (done.reply, err)
    }

    /// One message for `id`: the status the server answered, whether it granted the lock plain
    /// (`Grant::plain`), and the error when it is not a success.
    fn send(&mut self, id: LockId, op: ServerOp, wait: Duration) -> (Status, bool, Option<Error>) {
        let e = *self.entries.get(&id).expect("a handle's entry");
        let done = match op {
            ServerOp::Acquire(mode) => {
                let lease_ms = duration_ms(self.client.lease());
                let got = if wait.is_zero() {
                    self.client.trylock(id, mode, lease_ms)
                } else {
                    self.client.lock(id, mode, lease_ms, wait)
                };
                got.map(|g| {
                    let e = self.entries.get_mut(&id).expect("checked");
                    (e.token, e.value, e.staged) = (g.token, g.value, None);
                    (Status::Success, g.plain)
                })
            }
            ServerOp::GiveBack(_) | ServerOp::Downgrade => {
                // A local writer's block goes with the end of the exclusive turn (the
                // mutation puts back a downgrade that leaves it behind).
                let dropped =
                    op == ServerOp::Downgrade && dlock_core::mutated!(DowngradeDropsBlock);
                if e.cache.held() == Some(Mode::Exclusive)
                    && !dropped
                    && let Some(block) = e.staged
                    && let Err(err) = self.client.stage_value(id, &block.0)
                {
                    tracing::warn!(error = %err, "dlock: a cached lock's block was not staged");
                }
                let done = match op {
                    ServerOp::Downgrade => self.client.downgrade(id),
                    _ => self.client.unlock(id),
                };
                if done.is_ok() {
                    self.entries.get_mut(&id).expect("checked").staged = None;
                }
                done.map(|_| (Status::Success, false))
            }
        };
        match done {
            Ok((s, plain)) => (s, plain, None),
            Err(err) => (err.status(), false, Some(err)),
        }
    }
}

/// `d` in the protocol's milliseconds, at least 1.
fn duration_ms(d: Duration) -> u32 {
    dlock_core::time::duration_to_ms(d).max(1)
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

/// A cached RW lock of a [`CachedLocks`] (module doc). It names its lock by its place in the
/// handle's table, not by id: a failover may give the lock another id (`follow_renumbering`).
pub struct CachedRwLock<C: Connection = Link> {
    locks: CachedLocks<C>,
    key: usize,
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

    /// A read guard without waiting: local when the lock is cached (module doc), else asked
    /// of the server once. `WouldBlock` when busy.
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

/// The channel of revoke notices of a [`CachedLocks`]: the engine polls it to learn which locks
/// to flush (the handle gives them back itself).
#[derive(Debug)]
pub struct Revokes<C: Connection = Link> {
    locks: CachedLocks<C>,
}

impl<C: Connection> Revokes<C> {
    /// The next notice, without waiting: reads what the server sent meanwhile (and gives back
    /// what is due) first. `Ok(None)` when there is none.
    pub fn try_recv(&self) -> Result<Option<Revoked>, Error> {
        let mut st = self.locks.state();
        if st.pump()? && st.waiters > 0 {
            self.locks.shared.changed.notify_all();
        }
        Ok(st.notices.pop())
    }
}
