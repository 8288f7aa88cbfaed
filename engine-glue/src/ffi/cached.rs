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
//!   when only shared is wanted); a grant in use is given back by the `unlock` that ends its
//!   use. Either way the engine is told ([`dlock_revoke`]), through its callback or its poll.
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

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use dlock_core::proto::Event;
use dlock_core::table::EVENT_RING_LEN;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::{Client, Grant};

use super::client::{Refusals, with_client};
use super::locks::lock_id;
use super::types::{
    DLOCK_REVOKE_ALL, LOCK_EXCLUSIVE, LOCK_SHARED, dlock_revoke, dlock_revoke_cb_t,
};
use super::{guard, write_at};

/// Revoke notices kept for the engine before they are folded into one "every lock" notice.
const NOTICES_MAX: usize = 4 * EVENT_RING_LEN;

/// The longest `lock` waits on the server before it reads its revokes again (module doc).
pub const WAIT_SLICE: Duration = Duration::from_millis(20);

/// One cache-enabled lock's local state.
#[derive(Clone, Copy, Debug, Default)]
struct Cached {
    /// Held on the server with no local user, in this mode.
    parked: Option<Mode>,
    /// A revoke (or `lock_cache_release`) wants it back while in use: the mode wanted. The
    /// `unlock` that ends the use gives it back instead of parking it.
    revoked: Option<Mode>,
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
    notices: VecDeque<dlock_revoke>,
    callback: Option<Callback>,
    /// Events read off the connection before they are acted on (kept for its capacity).
    events: Vec<Event>,
    /// The client's `renumberings` when `locks` was last known to name the client's ids.
    renumberings: u64,
}

impl Caching {
    /// Sized at `client_init`, so that reading revokes allocates nothing afterwards.
    pub(super) fn new() -> Caching {
        Caching {
            locks: HashMap::new(),
            notices: VecDeque::with_capacity(NOTICES_MAX),
            callback: None,
            events: Vec::with_capacity(EVENT_RING_LEN + 1),
            renumberings: 0,
        }
    }

    /// After a failover's re-claim filed the client's records under a replacement's ids
    /// (`Client::renumberings`): the cache's ids name other locks now, or none, and giving back
    /// a parked grant by one would unlock another lock of the client. So the cache forgets
    /// every lock, and tells the engine every lock was revoked; the engine takes its ids again
    /// with `get_lock` by name (as every id after `update_all_locks`) and enables caching on
    /// them again. Nothing parked is lost: a failover re-claims no cached grant
    /// (`dlock_core::manager::trust`, rule 3). One comparison when nothing changed.
    fn follow_renumbering(&mut self, client: &Client) {
        let now = client.renumberings();
        if now == self.renumberings {
            return;
        }
        self.renumberings = now;
        if !self.locks.is_empty() {
            self.locks.clear();
            self.notify(revoke_all());
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

    /// Gives `id`'s parked grant back, if it has one (`release_lock`).
    pub(super) fn unpark(&mut self, client: &mut Client, id: LockId) {
        self.follow_renumbering(client);
        if let Some(c) = self.locks.get_mut(&id)
            && c.parked.is_some()
        {
            give_back(client, c, id);
        }
    }

    /// Forgets `id` (its reference was released).
    pub(super) fn forget(&mut self, id: LockId) {
        self.locks.remove(&id);
    }

    fn notify(&mut self, n: dlock_revoke) {
        let all = n.lock_id == DLOCK_REVOKE_ALL;
        if all
            && self
                .notices
                .back()
                .is_some_and(|b| b.lock_id == DLOCK_REVOKE_ALL)
        {
            return;
        }
        if self.notices.len() == NOTICES_MAX {
            // The engine fell behind: one notice that says every lock stands for them all.
            self.notices.clear();
            self.notices.push_back(revoke_all());
            return;
        }
        self.notices.push_back(n);
    }

    /// Reads the revokes the server sent and acts on them (module doc).
    pub(super) fn pump(&mut self, client: &mut Client) {
        self.follow_renumbering(client);
        if self.locks.is_empty() {
            return;
        }
        let mut events = std::mem::take(&mut self.events);
        if let Err(e) = client.poll_events(|e| events.push(e)) {
            tracing::debug!(error = %e, "dlock: reading a C client's revokes");
        }
        for e in events.drain(..) {
            match e {
                Event::Revoke {
                    lock,
                    wanted,
                    fence,
                } => {
                    let acted = self
                        .locks
                        .get_mut(&lock)
                        .is_some_and(|c| revoke(client, c, lock, wanted, Some(fence)));
                    if acted {
                        self.notify(dlock_revoke {
                            lock_id: lock.raw() as c_int,
                            wanted_op: op_of(wanted),
                        });
                    }
                }
                Event::Overflow => {
                    for (&id, c) in self.locks.iter_mut() {
                        revoke(client, c, id, Mode::Exclusive, None);
                    }
                    self.notify(revoke_all());
                }
            }
        }
        self.events = events;
    }

    /// `trylock`/`lock` of `id` in `mode`: the grant, when the parked one covers it (module
    /// doc); `None` when the server must be asked.
    pub(super) fn acquire(&mut self, client: &mut Client, id: LockId, mode: Mode) -> Option<Grant> {
        self.pump(client);
        let c = self.locks.get_mut(&id)?;
        let parked = c.parked?;
        if parked == Mode::Shared && mode == Mode::Exclusive {
            // No upgrade in place: the shared grant goes back, and the request is a new one.
            give_back(client, c, id);
            return None;
        }
        c.parked = None;
        held_grant(client, id)
    }

    /// `unlock` of `id`: `Some` when answered here (the grant parked, or nothing in use);
    /// `None` when the unlock goes to the client as without caching.
    pub(super) fn release(
        &mut self,
        client: &mut Client,
        id: LockId,
    ) -> Option<Result<Grant, Status>> {
        self.pump(client);
        let c = self.locks.get_mut(&id)?;
        if c.parked.is_some() {
            return Some(Err(Status::AlreadyUnlocked));
        }
        let l = client.local_lock(id)?;
        let held = l.state.held_mode()?;
        if l.refs != 1 || c.revoked.is_some() {
            return None;
        }
        c.parked = Some(held);
        held_grant(client, id).map(Ok)
    }

    /// After a downgrade of `id`: a parked grant is parked shared, and a revoke that wanted
    /// only shared is answered.
    pub(super) fn downgraded(&mut self, id: LockId) {
        if let Some(c) = self.locks.get_mut(&id) {
            c.parked = c.parked.map(|_| Mode::Shared);
            if c.revoked == Some(Mode::Shared) {
                c.revoked = None;
            }
        }
    }

    /// After an unlock went to the server: a released grant owes nothing any more.
    pub(super) fn released(&mut self, client: &Client, id: LockId) {
        self.follow_renumbering(client);
        if let Some(c) = self.locks.get_mut(&id)
            && client
                .local_lock(id)
                .is_none_or(|l| l.state.held_mode().is_none())
        {
            *c = Cached::default();
        }
    }
}

/// Acts on a revoke of `id` wanting `wanted`, sent for the grant with token `fence`
/// (`None`: every grant). Whether it concerned a grant held: a revoke of a lock not held, or
/// held under a newer grant than the one it was sent for, is ignored. A revoke that reached the
/// client before the reply granting what it revokes (the server sends a client's events ahead
/// of its replies) is not such a one: events are read only between the client's calls, so the
/// grant is recorded by the time it is acted on.
fn revoke(
    client: &mut Client,
    c: &mut Cached,
    id: LockId,
    wanted: Mode,
    fence: Option<u64>,
) -> bool {
    let Some(l) = client.local_lock(id) else {
        return false;
    };
    let Some(held) = l.state.held_mode() else {
        // The record holds nothing: a failover's recovery forgot the cached grant rather than
        // re-claim it (`dlock_core::manager::trust`), and the overflow that says so finds it
        // still parked here. Answering a later `trylock` from it would hand out a grant the
        // server does not hold.
        *c = Cached::default();
        return false;
    };
    if fence.is_some_and(|f| f < l.token.0) || (held == Mode::Shared && wanted == Mode::Shared) {
        return false;
    }
    match c.parked {
        // Readers are wanted and nobody here uses it: keep it, shared.
        Some(Mode::Exclusive) if wanted == Mode::Shared => match client.downgrade(id) {
            Ok(_) => c.parked = Some(Mode::Shared),
            Err(e) => {
                tracing::warn!(error = %e, "dlock: downgrading a parked cached lock");
                give_back(client, c, id);
            }
        },
        Some(_) => give_back(client, c, id),
        // Exclusive wanted once stays wanted: the use's end gives the grant back.
        None if c.revoked != Some(Mode::Exclusive) => c.revoked = Some(wanted),
        None => {}
    }
    true
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

/// Unlocks the parked (or revoked) grant of `id` on the server. An unlock that fails leaves
/// nothing to retry here: the server's revoke timeout takes the grant.
fn give_back(client: &mut Client, c: &mut Cached, id: LockId) {
    if let Err(e) = client.unlock(id) {
        tracing::warn!(error = %e, "dlock: giving a cached lock back");
    }
    *c = Cached::default();
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

/// Waits for `id` in `mode` on the server up to `wait` in slices, reading revokes between them
/// (module doc). `send(client, slice)` asks once.
pub(super) fn lock_sliced(
    client: &mut Client,
    cache: &mut Caching,
    wait: Duration,
    mut send: impl FnMut(&mut Client, Duration) -> Result<Grant, Status>,
) -> Result<Grant, Status> {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match send(client, left.min(WAIT_SLICE)) {
            // The slice ran out, not the wait: look at the revokes, ask again.
            Err(Status::Etimeout) if !left.is_zero() => cache.pump(client),
            r => return r,
        }
    }
}

/// Asks for every grant of RW lock `lock_id` from now on to be cached (`enable` 1), or stops
/// (0; a parked grant is given back). Returns 0; `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL` for
/// another `enable`, a lock that is not RW, or a lock held in use (enable it before taking it:
/// a grant taken without asking is not cacheable on the server).
#[unsafe(no_mangle)]
pub extern "C" fn lock_cache_enable(client_id: c_int, lock_id: c_int, enable: c_int) -> c_int {
    guard(|| {
        let on = match enable {
            0 => false,
            1 => true,
            _ => return Status::Einval.code(),
        };
        with_client(client_id, Refusals::DATA, |slot| {
            // Ids from before a renumbering go first, so this one's entry stays.
            slot.cache.follow_renumbering(&slot.client);
            let set = self::lock_id(lock_id).and_then(|id| {
                let l = slot.client.local_lock(id).ok_or(Status::LockNotGet)?;
                let parked = slot.cache.locks.get(&id).and_then(|c| c.parked);
                // A grant taken before caching was asked for is not cacheable on the server
                // (it would never be revoked), and one in use is its users' to end.
                if l.kind != LockKind::Rw || (l.state.held_mode().is_some() && parked.is_none()) {
                    return Err(Status::Einval);
                }
                slot.client.set_cacheable(id, on).map_err(Status::from)?;
                if on {
                    slot.cache.locks.entry(id).or_default();
                } else if let Some(mut c) = slot.cache.locks.remove(&id)
                    && c.parked.is_some()
                {
                    give_back(&mut slot.client, &mut c, id);
                }
                Ok(())
            });
            super::code(set)
        })
    })
}

/// Gives the parked grant of `lock_id` back to the server now (one unlock). Returns 0;
/// `DLOCK_ALREADY_LOCKED` when it is in use (the `unlock` that ends the use gives it back);
/// `DLOCK_ALREADY_UNLOCKED` when nothing is held; `DLOCK_EINVAL` when caching is not enabled
/// on it; `DLOCK_LOCK_NOT_GET`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_cache_release(client_id: c_int, lock_id: c_int) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::DATA, |slot| {
            let (client, cache) = (&mut slot.client, &mut slot.cache);
            let done = self::lock_id(lock_id).and_then(|id| {
                client.local_lock(id).ok_or(Status::LockNotGet)?;
                cache.pump(client);
                let c = cache.locks.get_mut(&id).ok_or(Status::Einval)?;
                let held = client.local_lock(id).and_then(|l| l.state.held_mode());
                match (c.parked, held) {
                    (Some(_), _) => {
                        give_back(client, c, id);
                        Ok(Status::Success)
                    }
                    (None, Some(_)) => {
                        c.revoked = Some(Mode::Exclusive);
                        Ok(Status::AlreadyLocked)
                    }
                    (None, None) => Ok(Status::AlreadyUnlocked),
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
                && let Some(r) = cache.notices.pop_front()
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
