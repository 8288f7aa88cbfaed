//! Cached grants (ours; the reference has none): `lock_cache_enable`, `lock_cache_release`,
//! `lock_downgrade`, `client_revoke_callback_register`, `client_revokes_poll`, and the rules
//! `trylock`, `lock` and `unlock` follow for a lock whose grants are cached.
//!
//! # What caching means for a C client
//!
//! The C API is one client per worker thread, and a worker's `lock`/`unlock` pairs are its
//! local users. So for an RW lock with caching enabled:
//!
//! - the `unlock` that ends the last local use *parks* the grant: it stays held on the server,
//!   and nothing is sent (a value block staged with `lock_value_set` stays staged for the
//!   give-back, which writes it);
//! - a `trylock`/`lock` in a mode the parked grant covers (anything under an exclusive grant,
//!   shared under a shared one) is answered from it, with nothing sent; an exclusive request
//!   over a parked shared grant gives that back first and then asks the server;
//! - when another client wants a conflicting mode, the server sends a revoke. The library reads
//!   revokes at every `trylock`, `lock`, `unlock`, `lock_downgrade`, `lock_cache_release` and
//!   `client_revokes_poll` of the client: a parked grant is given back at once (or downgraded,
//!   when only shared is wanted); a grant in use is given back (or downgraded) by the `unlock`
//!   that ends its use. Either way the engine is told ([`dlock_revoke`]), through its callback
//!   or its poll.
//!
//! Every one of these decisions is `dlock_core::manager::CachedLock`'s, one record per lock,
//! as for the Rust API's `CachedLocks`: this module only sends what the record asks for and
//! hands it the reply. So a give-back that does not reach the server (a lost connection) is
//! not forgotten: the record keeps it in flight, and the library sends it again at the
//! client's next call (the call that failed reports the failure), so the server does not go on
//! holding a grant the engine was told it gave back. A use that outlives a revoke by the
//! client's lease is warned about (`tracing`), as `CachedLocks` warns: the server has let the
//! grant go.
//!
//! Only RW locks cache: their grants have no lease, so a parked grant stays valid for as long
//! as the client lives. An atomic or fair grant parked past its lease would be answered
//! locally after the server had freed it.
//!
//! # Where the callback runs
//!
//! On the thread that calls `client_revokes_poll` for the client, inside that call, after the
//! library has let go of the client (no lock of the library is held): the callback may call any
//! function of this library, for this client too (`unlock`, `lock_cache_release`,
//! `lock_downgrade`). It should only note what to flush and return: the worker is inside its
//! poll. The library never starts a thread of its own for it: a worker that does not poll (or
//! call the client at all) does not see its revokes, and loses a grant it does not give back at
//! the server's revoke timeout (the client's lease by default), as at the end of a lease.
//!
//! A worker blocked in `lock` on an RW lock still gives its parked grants back: with caching
//! enabled on any lock, `lock` waits on the server in slices of [`WAIT_SLICE`] and reads its
//! revokes between them (two workers each waiting for the lock the other parks would otherwise
//! wait until their revokes lapsed), and asks with `WAKE_ON_REVOKE`, so a revoke that comes
//! while a slice is parked on the server ends it at once. Waits on atomic and fair locks are
//! not sliced.

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::{Acquire, OnRevoke, Release, Reply, ServerOp};
use dlock_core::proto::Event;
use dlock_core::table::EVENT_RING_LEN;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::cached::{NOTICES_MAX, Notices, wait_sliced, warn_overdue};
use dlock_transport::client::{Client, Grant};

use super::client::{Refusals, with_client};
use super::locks::lock_id;
use super::types::{
    DLOCK_REVOKE_ALL, LOCK_EXCLUSIVE, LOCK_SHARED, dlock_revoke, dlock_revoke_cb_t,
};
use super::{guard, write_at};

/// The longest `lock` waits on the server before it reads its revokes again (module doc).
pub use dlock_transport::client::cached::WAIT_SLICE;

/// One cache-enabled lock: the core's record of its cached grant
/// ([`dlock_core::manager::CachedLock`], whose tables decide every case: what covers a
/// request, when a revoke is stale, downgrade or give-back, what an unanswered give-back
/// does), and what the C calls add to it. The record's local users are the worker's uses:
/// a `trylock`/`lock` that reaches the server or the parked grant starts one, the `unlock`
/// that ends it releases it; re-entries within a use are counted by the client's own record.
#[derive(Clone, Copy, Debug)]
struct Cached {
    rec: CachedLock,
    /// A give-back or downgrade that did not reach the server (the record keeps it in flight):
    /// sent again at the client's next call, never dropped, so the server does not go on
    /// holding a grant the engine was told it gave back.
    owed: Option<ServerOp>,
    /// The status its last attempt failed with: what a call that must wait for it reports.
    failed: Status,
    /// `lock_cache_release` asked while the grant was in use: the `unlock` that ends the use
    /// gives it back.
    let_go: bool,
    /// Its users outlived a revoke by the lease: warned once.
    warned: bool,
}

impl Cached {
    const fn new() -> Cached {
        Cached {
            rec: CachedLock::new(LockKind::Rw),
            owed: None,
            failed: Status::Success,
            let_go: false,
            warned: false,
        }
    }

    /// Parked: held on the server with no use.
    fn parked(&self) -> bool {
        self.rec.held().is_some() && self.rec.users() == (0, false)
    }
}

/// The revoke callback and its `user_data` (kept as an address: the library never reads it).
#[derive(Clone, Copy, Debug)]
struct Callback {
    f: unsafe extern "C" fn(c_int, *const dlock_revoke, *mut c_void),
    user_data: usize,
}

/// A client's cached locks, the notices the engine has not taken, and its callback.
#[derive(Debug)]
pub(super) struct Caching {
    locks: HashMap<LockId, Cached>,
    /// The locks each look must visit: a give-back owed, or a revoke waiting for the use to
    /// end (warned about once overdue). The other locks are not looked at.
    watch: Vec<LockId>,
    notices: Notices<dlock_revoke>,
    callback: Option<Callback>,
    /// Events read off the connection before they are acted on (kept for its capacity).
    events: Vec<Event>,
}

impl Caching {
    /// Sized at `client_init`, so that reading revokes allocates nothing afterwards.
    pub(super) fn new() -> Caching {
        Caching {
            locks: HashMap::new(),
            watch: Vec::new(),
            notices: Notices::new(revoke_all()),
            callback: None,
            events: Vec::with_capacity(EVENT_RING_LEN + 1),
        }
    }

    /// Whether any lock of the client caches (then `lock` waits in slices).
    pub(super) fn any(&self) -> bool {
        !self.locks.is_empty()
    }

    /// Whether `id`'s grants are cached (batches and asynchronous calls refuse it).
    pub(super) fn caches(&self, id: LockId) -> bool {
        self.locks.contains_key(&id)
    }

    /// Gives `id`'s parked grant back, if it has one (`release_lock`). One that does not reach
    /// the server stays owed, and the reference's release is refused while it is held.
    pub(super) fn unpark(&mut self, client: &mut Client, id: LockId) {
        if let Some(op) = self.locks.get_mut(&id).and_then(|c| c.rec.give_back()) {
            // A failure stays owed (`drive`).
            let _ = self.drive(client, id, op);
        }
    }

    /// Forgets `id` (its reference was released).
    pub(super) fn forget(&mut self, id: LockId) {
        self.locks.remove(&id);
        self.watch.retain(|&w| w != id);
    }

    /// Visits `id` at every look from now on.
    fn watch(&mut self, id: LockId) {
        if !self.watch.contains(&id) {
            self.watch.push(id);
        }
    }

    /// Reads the revokes the server sent and acts on them (module doc), then sends again what
    /// is owed.
    pub(super) fn pump(&mut self, client: &mut Client) {
        if self.locks.is_empty() {
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        if let Err(e) = client.poll_events(|e| events.push(e)) {
            tracing::debug!(error = %e, "dlock: reading a C client's revokes");
        }
        let now = client.now_ms();
        for e in events.drain(..) {
            match e {
                Event::Revoke {
                    lock,
                    wanted,
                    fence,
                } => {
                    let acted = self.revoke(client, lock, wanted, fence, now);
                    if acted {
                        self.notices.push(dlock_revoke {
                            lock_id: lock.raw() as c_int,
                            wanted_op: op_of(wanted),
                        });
                    }
                }
                Event::Overflow => {
                    let ids: Vec<LockId> = self.locks.keys().copied().collect();
                    for id in ids {
                        self.revoke(client, id, Mode::Exclusive, u64::MAX, now);
                    }
                    self.notices.push(revoke_all());
                }
            }
        }
        self.events = events;
        self.visit_watched(client, now);
    }

    /// Sends again what is owed, and warns of revokes the use outlived (as `CachedLocks`).
    fn visit_watched(&mut self, client: &mut Client, now: u64) {
        let lease_ms = dlock_core::time::duration_to_ms(client.lease()).max(1);
        let mut watch = std::mem::take(&mut self.watch);
        let mut owed = Vec::new();
        watch.retain(|id| {
            let Some(c) = self.locks.get_mut(id) else {
                return false;
            };
            warn_overdue(*id, &c.rec, &mut c.warned, now, lease_ms);
            if let Some(op) = c.owed.take() {
                owed.push((*id, op));
            }
            c.rec.revoke().is_some()
        });
        self.watch = watch;
        for (id, op) in owed {
            // A failure stays owed (`drive`), for the next look.
            let _ = self.drive(client, id, op);
        }
    }

    /// Acts on a revoke of `id` wanting `wanted`, sent when the lock's token was `fence`
    /// (`u64::MAX`: an overflow, every grant). Whether it concerned a grant held (the record
    /// ignores a revoke of a lock not held, a stale one, and one its answer is on its way for).
    fn revoke(
        &mut self,
        client: &mut Client,
        id: LockId,
        wanted: Mode,
        fence: u64,
        now: u64,
    ) -> bool {
        let Some(c) = self.locks.get_mut(&id) else {
            return false;
        };
        match c.rec.on_revoke(wanted, fence, now) {
            OnRevoke::Ignore => return false,
            OnRevoke::Deferred => self.watch(id),
            // A failure stays owed (`drive`).
            OnRevoke::Send(op) => {
                let _ = self.drive(client, id, op);
            }
        }
        true
    }

    /// Sends `op` (a give-back or downgrade the record put in flight) for `id` and hands the
    /// reply to the record, again while a stronger revoke is owed after a success. A send
    /// that fails stays owed (`Err` with its status), sent again at the next look.
    fn drive(&mut self, client: &mut Client, id: LockId, mut op: ServerOp) -> Result<(), Status> {
        let Some(c) = self.locks.get_mut(&id) else {
            return Ok(());
        };
        loop {
            let sent = match op {
                ServerOp::Downgrade => client.downgrade(id),
                ServerOp::GiveBack(_) | ServerOp::Acquire(_) => client.unlock(id),
            };
            let status = sent.map_or_else(Status::from, |_| Status::Success);
            let token = client.local_lock(id).map_or(0, |l| l.token.0);
            match c.rec.on_reply(status, token) {
                Reply::Send(next) if status.is_success() => op = next,
                Reply::Send(next) => {
                    tracing::warn!(lock = ?id, status = %status, "dlock: a cached lock's give-back is owed");
                    (c.owed, c.failed) = (Some(next), status);
                    self.watch(id);
                    return Err(status);
                }
                Reply::Lost => {
                    tracing::warn!(lock = ?id, "dlock: a cached lock's readers lost its grant");
                    return Err(status);
                }
                _ => return Ok(()),
            }
        }
    }

    /// `trylock`/`lock` of `id` in `mode`: answered here (from the parked grant, or asked of the
    /// server through `ask`, which may read revokes meanwhile) when `id` caches and is not in
    /// use; `None` when the client answers as without caching (not cached, or a re-entry
    /// within a use, which the client's record counts).
    pub(super) fn acquire(
        &mut self,
        client: &mut Client,
        id: LockId,
        mode: Mode,
        mut ask: impl FnMut(&mut Client, &mut Caching) -> Result<Grant, Status>,
    ) -> Option<Result<Grant, Status>> {
        self.pump(client);
        loop {
            let c = self.locks.get_mut(&id)?;
            if c.rec.users() != (0, false) {
                return None;
            }
            match c.rec.acquire(mode) {
                Acquire::Local => return Some(held_grant(client, id).ok_or(Status::LockNotGet)),
                Acquire::Send(ServerOp::Acquire(_)) => {
                    let got = ask(client, self);
                    let (status, token) = match got {
                        Ok(g) => (g.status, g.token.0),
                        Err(s) => (s, 0),
                    };
                    let c = self.locks.get_mut(&id)?;
                    if let Reply::Granted = c.rec.on_reply(status, token) {
                        c.let_go = false;
                    }
                    return Some(got);
                }
                // No upgrade in place: the parked shared grant goes back, then the request is
                // a new one.
                Acquire::Send(op) => {
                    if let Err(s) = self.drive(client, id, op) {
                        return Some(Err(s));
                    }
                }
                // A give-back that has not reached the server yet (the look above sent it
                // again): the connection's failure is the answer.
                Acquire::Wait => return Some(Err(c.failed)),
                Acquire::Refuse(s) => return Some(Err(s)),
            }
        }
    }

    /// `unlock` of `id`: `Some` when answered here (the use ends: the grant parked, or given
    /// back when asked for; or nothing in use); `None` when the unlock goes to the client as
    /// without caching (a re-entry counted down, or nothing cached).
    pub(super) fn release(
        &mut self,
        client: &mut Client,
        id: LockId,
    ) -> Option<Result<Grant, Status>> {
        self.pump(client);
        let c = self.locks.get_mut(&id)?;
        let (readers, writer) = c.rec.users();
        if !writer && readers == 0 {
            return c.rec.held().map(|_| Err(Status::AlreadyUnlocked));
        }
        if client.local_lock(id)?.refs != 1 {
            return None;
        }
        let mode = if writer {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        let op = match c.rec.release(mode) {
            Release::Keep if c.let_go => c.rec.give_back(),
            Release::Keep => None,
            Release::Send(op) => Some(op),
            Release::Refuse(s) => return Some(Err(s)),
        };
        match op {
            Some(op) => {
                c.let_go = false;
                Some(self.drive(client, id, op).map(|()| recorded(client, id)))
            }
            None if c.rec.held().is_some() => held_grant(client, id).map(Ok),
            // The server no longer held it (a refused downgrade): the client answers.
            None => None,
        }
    }

    /// `lock_downgrade` of `id`: `Some` when the record holds it exclusive (the grant goes
    /// shared, a use reads on); `None` when the client answers as without caching.
    pub(super) fn downgrade(
        &mut self,
        client: &mut Client,
        id: LockId,
    ) -> Option<Result<(), Status>> {
        self.pump(client);
        let c = self.locks.get_mut(&id)?;
        if c.rec.held() != Some(Mode::Exclusive) {
            return None;
        }
        match c.rec.downgrade() {
            Some(op) => Some(self.drive(client, id, op)),
            None => Some(Err(c.failed)),
        }
    }
}

/// The revoke notice of every lock.
const fn revoke_all() -> dlock_revoke {
    dlock_revoke {
        lock_id: DLOCK_REVOKE_ALL,
        wanted_op: LOCK_EXCLUSIVE,
    }
}

/// The C op that asks for `m`.
const fn op_of(m: Mode) -> c_int {
    match m {
        Mode::Exclusive => LOCK_EXCLUSIVE,
        Mode::Shared => LOCK_SHARED,
    }
}

/// The grant the record of `id` holds, as the lock calls report it.
fn held_grant(client: &Client, id: LockId) -> Option<Grant> {
    let l = client.local_lock(id)?;
    Some(Grant {
        status: Status::Success,
        token: l.token,
        word: l.word,
        value: l.value,
    })
}

/// A successful unlock of `id`, with the word the record keeps.
fn recorded(client: &Client, id: LockId) -> Grant {
    let l = client.local_lock(id);
    Grant {
        status: Status::Success,
        token: l.map_or(dlock_core::FencingToken(0), |l| l.token),
        word: l.map_or(0, |l| l.word),
        value: None,
    }
}

/// Waits for `id` in `mode` on the server up to `wait` in slices, reading revokes between them
/// (module doc; the loop is the transport's [`wait_sliced`]). `send(client, slice)` asks once.
pub(super) fn lock_sliced(
    client: &mut Client,
    cache: &mut Caching,
    wait: Duration,
    mut send: impl FnMut(&mut Client, Duration) -> Result<Grant, Status>,
) -> Result<Grant, Status> {
    wait_sliced(
        &mut (client, cache),
        Instant::now() + wait,
        |(client, cache)| {
            cache.pump(client);
            Ok(())
        },
        |(client, _), slice| send(client, slice),
        |s| *s == Status::Etimeout,
    )
}

/// Asks for every grant of RW lock `lock_id` from now on to be cached (`enable` 1), or stops
/// (0; a parked grant is given back). Returns 0; `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL` for
/// another `enable`, a lock that is not RW, or a lock held in use (enable it before taking it:
/// a grant taken without asking is not cacheable on the server); the failure of a give-back
/// that did not reach the server (`DLOCK_BAD_RESPONSE`, say: caching stays on, and the
/// give-back is owed and sent again at the client's next call).
#[unsafe(no_mangle)]
pub extern "C" fn lock_cache_enable(client_id: c_int, lock_id: c_int, enable: c_int) -> c_int {
    guard(|| {
        let on = match enable {
            0 => false,
            1 => true,
            _ => return Status::Einval.code(),
        };
        with_client(client_id, Refusals::DATA, |slot| {
            let set = self::lock_id(lock_id).and_then(|id| {
                let (client, cache) = (&mut slot.client, &mut slot.cache);
                let l = client.local_lock(id).ok_or(Status::LockNotGet)?;
                let c = cache.locks.get(&id).copied();
                if let Some(c) = c
                    && c.owed.is_some()
                {
                    // A give-back still owed: the connection's failure first.
                    return Err(c.failed);
                }
                // A grant taken before caching was asked for is not cacheable on the server
                // (it would never be revoked), and one in use is its users' to end.
                let parked = c.is_some_and(|c| c.parked());
                if l.kind != LockKind::Rw || (l.state.held_mode().is_some() && !parked) {
                    return Err(Status::Einval);
                }
                if on {
                    client.set_cacheable(id, true).map_err(Status::from)?;
                    cache.locks.entry(id).or_insert(Cached::new());
                    return Ok(());
                }
                // The parked grant goes back first; one that does not reach the server keeps
                // caching on, owed, and the call reports why.
                if let Some(op) = cache.locks.get_mut(&id).and_then(|c| c.rec.give_back()) {
                    cache.drive(client, id, op)?;
                }
                client.set_cacheable(id, false).map_err(Status::from)?;
                cache.forget(id);
                Ok(())
            });
            super::code(set)
        })
    })
}

/// Gives the parked grant of `lock_id` back to the server now (one unlock). Returns 0;
/// `DLOCK_ALREADY_LOCKED` when it is in use (the `unlock` that ends the use gives it back);
/// `DLOCK_ALREADY_UNLOCKED` when nothing is held; `DLOCK_EINVAL` when caching is not enabled
/// on it; `DLOCK_LOCK_NOT_GET`; the failure of a give-back that did not reach the server
/// (`DLOCK_BAD_RESPONSE`, say), which is owed and sent again at the client's next call.
#[unsafe(no_mangle)]
pub extern "C" fn lock_cache_release(client_id: c_int, lock_id: c_int) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::DATA, |slot| {
            let (client, cache) = (&mut slot.client, &mut slot.cache);
            let done = self::lock_id(lock_id).and_then(|id| {
                client.local_lock(id).ok_or(Status::LockNotGet)?;
                cache.pump(client);
                let c = cache.locks.get_mut(&id).ok_or(Status::Einval)?;
                if c.owed.is_some() {
                    return Ok(c.failed);
                }
                if c.rec.users() != (0, false) {
                    c.let_go = true;
                    return Ok(Status::AlreadyLocked);
                }
                match c.rec.give_back() {
                    Some(op) => Ok(cache.drive(client, id, op).err().unwrap_or(Status::Success)),
                    None => Ok(Status::AlreadyUnlocked),
                }
            });
            match done {
                Ok(s) | Err(s) => s.code(),
            }
        })
    })
}

/// Registers `cb`, called with `user_data` for each revoke of a cached grant of `client_id`
/// from `client_revokes_poll` (module doc); NULL unregisters (revokes are then polled).
/// Returns 0; `DLOCK_CLIENT_NOT_INIT` for an unknown client; `DLOCK_CLIENTMGR_NOT_INIT`.
///
/// # Safety
///
/// - `cb` is NULL or a function of its C type, callable from the threads that poll this client
///   until it is unregistered or the client deinitialised, with `user_data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn client_revoke_callback_register(
    client_id: c_int,
    cb: dlock_revoke_cb_t,
    user_data: *mut c_void,
) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::DATA, |slot| {
            slot.cache.callback = cb.map(|f| Callback {
                f,
                user_data: user_data as usize,
            });
            Status::Success.code()
        })
    })
}

/// Reads the revokes the server sent `client_id` and acts on them (module doc). With a
/// callback registered, calls it for each (on this thread, after letting go of the client) and
/// writes how many to `*count`; without one, copies up to `max` into `out` and writes how many
/// to `*count` (the rest stay for the next poll). Returns 0; `DLOCK_EINVAL` for NULL `count`,
/// or NULL `out` with `max` > 0 and no callback; `DLOCK_CLIENT_NOT_INIT`.
///
/// # Safety
///
/// - `out` is NULL or valid for writing `max` `struct dlock_revoke`.
/// - `count` is NULL or valid for writing an `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn client_revokes_poll(
    client_id: c_int,
    out: *mut dlock_revoke,
    max: c_uint,
    count: *mut c_uint,
) -> c_int {
    guard(|| {
        if count.is_null() {
            return Status::Einval.code();
        }
        let mut taken = [dlock_revoke::default(); NOTICES_MAX];
        let (mut n, mut cb) = (0, None);
        let c = with_client(client_id, Refusals::DATA, |slot| {
            let cache = &mut slot.cache;
            cache.pump(&mut slot.client);
            cb = cache.callback;
            let room = match cb {
                Some(_) => NOTICES_MAX,
                None if out.is_null() && max > 0 => return Status::Einval.code(),
                None => max as usize,
            };
            while n < room
                && let Some(r) = cache.notices.pop()
            {
                taken[n] = r;
                n += 1;
            }
            Status::Success.code()
        });
        if c != Status::Success.code() {
            return c;
        }
        for (i, r) in taken[..n].iter().enumerate() {
            match cb {
                // SAFETY: a function of its type, callable with its `user_data` from this
                // thread (the registration's contract); `r` lives across the call.
                Some(cb) => unsafe { (cb.f)(client_id, r, cb.user_data as *mut c_void) },
                // SAFETY: `i < n <= max` without a callback, so `out` is not NULL and has room
                // for it (caller's contract).
                None => unsafe { write_at(out, i, *r) },
            }
        }
        // SAFETY: not NULL (checked above), writable by the caller's contract.
        unsafe { write_at(count, 0, n as c_uint) };
        Status::Success.code()
    })
}
