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
//!   or its poll. While none of the client's cache-enabled locks is held or owes a give-back,
//!   the look waits as long as the client's trust bound allows (nothing a revoke could be for
//!   is held, and nothing parked is used meanwhile): a call then pays no `recv` over TCP.
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

use std::ffi::{c_int, c_uint, c_void};
use std::time::{Duration, Instant};

use dlock_core::{LockKind, Status};
use dlock_transport::client::cached::{NOTICES_MAX, wait_sliced};
use dlock_transport::client::{Client, Grant};

use super::caching::{Caching, Callback};
use super::client::{Refusals, with_client};
use super::locks::lock_id;
use super::types::{dlock_revoke, dlock_revoke_cb_t};
use super::{guard, write_at};

/// The longest `lock` waits on the server before it reads its revokes again (module doc).
pub use dlock_transport::client::cached::WAIT_SLICE;

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
                    cache.enable(id);
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

/// How many times the library has looked at the events of client `client_id` (read its event
/// ring, or over TCP `recv`ed): a call on a lock with nothing parked or owed leaves the look
/// for later while the client's trust bound holds (`Caching::pump`). For tests (a Rust
/// function, not part of the C API). `None` for an unknown client.
#[doc(hidden)]
pub fn event_looks(client_id: c_int) -> Option<u64> {
    let mut looks = None;
    with_client(client_id, Refusals::DATA, |slot| {
        looks = Some(slot.cache.looks);
        Status::Success.code()
    });
    looks
}
