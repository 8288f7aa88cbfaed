//! Single lock operations: `trylock`, `lock`, `unlock`, `lock_extend`,
//! `lock_request_async` / `lock_result_check`, and `lock_fence` (ours). The batches are in
//! [`super::batch`].
//!
//! # What `result` receives
//!
//! `void *result` must point to at least 16 writable bytes (`lock_state`): it receives the
//! lock word the server last reported, in *our* layouts (the header's `atomic_state`,
//! `rw_state`, `fairlock_state`, which differ from the reference's 8/16-byte ones; expiries are
//! server ticks in ms, not epoch seconds). It is written when the call returns `DLOCK_SUCCESS`,
//! `DLOCK_ALREADY_LOCKED`, `DLOCK_EAGAIN` (fair lock queued: the word shows the queue),
//! `DLOCK_FAIL` (the word that refused) or `DLOCK_ETIMEOUT`; otherwise it is left alone.
//!
//! # Fencing tokens
//!
//! A grant's fencing token does not fit the 16-byte `result`. Batches return it in the
//! trailing `fence` of each `lock_op_res` (a batch of one is a single trylock that returns
//! it); after any single operation `lock_fence` reads the token of the grant held.
//!
//! Expiry times arrive in seconds (the reference's unit) and are converted to ms.
//!
//! These calls allocate nothing.

use std::ffi::{c_int, c_void};

use dlock_core::{FencingToken, LockId, LockKind, Mode, Status};
use dlock_transport::client::{AsyncOp, Client, Grant, LocalLock, REQUEST_TIMEOUT};

use super::cached::lock_sliced;
use super::caching::Caching;

use super::client::{Refusals, Slot, with_client};
use super::locks::lock_id;
use super::types::{
    EXTEND_LOCK_EXCLUSIVE, EXTEND_LOCK_SHARED, LOCK_EXCLUSIVE, LOCK_SHARED, UNLOCK, lock_request,
    lock_state,
};
use super::{guard, non_null, read, seconds_to_ms, write_at};

/// The mode a trylock op asks for.
#[inline]
pub(super) fn lock_mode(op: c_int) -> Result<Mode, Status> {
    match op {
        LOCK_EXCLUSIVE => Ok(Mode::Exclusive),
        LOCK_SHARED => Ok(Mode::Shared),
        _ => Err(Status::Einval),
    }
}

/// The mode an extend op names. The client checks it against the grant held: extending the
/// other mode is `DLOCK_EINVAL`, as in the reference.
#[inline]
pub(super) fn extend_mode(op: c_int) -> Result<Mode, Status> {
    match op {
        EXTEND_LOCK_EXCLUSIVE => Ok(Mode::Exclusive),
        EXTEND_LOCK_SHARED => Ok(Mode::Shared),
        _ => Err(Status::Einval),
    }
}

/// The client's record of lock `id`. The client exposes its records only as an iterator, so
/// this is a scan over the locks it holds references to; it runs on failures, unlocks and
/// `lock_fence` only.
fn record(client: &Client, id: LockId) -> Option<LocalLock> {
    client.locks().find(|(k, _)| **k == id).map(|(_, l)| *l)
}

/// Whether a failure still comes with a word worth reporting.
#[inline]
pub(super) const fn reports_word(s: Status) -> bool {
    matches!(s, Status::Fail | Status::Eagain | Status::Etimeout)
}

/// Writes the outcome of a single operation on `id` to `result` and returns its code.
///
/// # Safety
///
/// - `result` is not NULL and valid for writing 16 bytes (any alignment).
unsafe fn finish(
    client: &Client,
    id: LockId,
    r: Result<Grant, Status>,
    result: *mut c_void,
) -> c_int {
    let (status, word) = match r {
        Ok(g) => (g.status, Some(g.word)),
        Err(s) if reports_word(s) => (s, record(client, id).map(|l| l.word)),
        Err(s) => (s, None),
    };
    if let Some(w) = word {
        // SAFETY: not NULL, 16 writable bytes (caller's contract).
        unsafe { write_at(result.cast::<lock_state>(), 0, lock_state::from_word(w)) };
    }
    status.code()
}

/// The request, with the result pointer checked.
///
/// # Safety
///
/// - `req` is NULL or points to a readable `lock_request`.
unsafe fn single(req: *const lock_request, result: *mut c_void) -> Result<lock_request, Status> {
    // SAFETY: forwarded from the caller.
    let r = unsafe { read(req) }?;
    non_null(result)?;
    Ok(r)
}

/// Runs `op` on lock `raw` of client `client_id` and reports it through `result`. The lock id
/// is checked after the client, so an unknown client reads `DLOCK_CLIENT_NOT_INIT` whatever
/// the id.
///
/// # Safety
///
/// - `result` is not NULL and valid for writing 16 bytes (any alignment).
unsafe fn on_lock(
    client_id: c_int,
    raw: c_int,
    result: *mut c_void,
    op: impl FnOnce(&mut Slot, LockId) -> Result<Grant, Status>,
) -> c_int {
    with_client(client_id, Refusals::DATA, |slot| {
        let id = match lock_id(raw) {
            Ok(id) => id,
            Err(s) => return s.code(),
        };
        let g = op(slot, id);
        // SAFETY: forwarded from the caller.
        unsafe { finish(&slot.client, id, g, result) }
    })
}

/// Tries to take `req->lock_id` in `req->lock_op` (`LOCK_EXCLUSIVE`/`LOCK_SHARED`) for
/// `req->expire_time` seconds, without waiting. `expire_time == 0` reads the cached state.
///
/// Returns `DLOCK_SUCCESS`; `DLOCK_ALREADY_LOCKED` (re-entry); `DLOCK_EAGAIN` (fair lock:
/// queued with a ticket, call again); `DLOCK_FAIL`; `DLOCK_ETICKET`; `DLOCK_EASYNC`;
/// `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL`; `DLOCK_CLIENT_NOT_INIT`; `DLOCK_NOT_READY`;
/// `DLOCK_BAD_RESPONSE`.
///
/// # Safety
///
/// - `req` is NULL or points to a readable `lock_request`.
/// - `result` is NULL or valid for writing 16 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trylock(
    client_id: c_int,
    req: *const lock_request,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (r, mode) =
            match unsafe { single(req, result) }.and_then(|r| Ok((r, lock_mode(r.lock_op)?))) {
                Ok(v) => v,
                Err(s) => return s.code(),
            };
        let ms = seconds_to_ms(r.expire_time);
        // SAFETY: `single` checked `result` is not NULL; 16 writable bytes (caller's contract).
        unsafe {
            on_lock(client_id, r.lock_id, result, |s, id| {
                let ask =
                    |c: &mut Client, _: &mut Caching| c.trylock(id, mode, ms).map_err(Status::from);
                match s.cache.acquire(&mut s.client, id, mode, ask) {
                    Some(g) => g,
                    None => s.client.trylock(id, mode, ms).map_err(Status::from),
                }
            })
        }
    })
}

/// `trylock` that waits on the server up to 5 s (the reference's limit) for the grant; no
/// polling. After 5 s: `DLOCK_ETIMEOUT` (the reference returns its last trylock code).
///
/// # Safety
///
/// As for `trylock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock(
    client_id: c_int,
    req: *const lock_request,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (r, mode) =
            match unsafe { single(req, result) }.and_then(|r| Ok((r, lock_mode(r.lock_op)?))) {
                Ok(v) => v,
                Err(s) => return s.code(),
            };
        let ms = seconds_to_ms(r.expire_time);
        // SAFETY: `single` checked `result` is not NULL; 16 writable bytes (caller's contract).
        unsafe {
            on_lock(client_id, r.lock_id, result, |s, id| {
                // The wait on the server in slices (`cached.rs`), reading revokes between them:
                // this client's own parked grants must be given back meanwhile. A revoke ends
                // the slice at once (`WAKE_ON_REVOKE`): the loop reads it and asks again.
                // Local, and left set: it only matters while this client caches a lock, since
                // revokes only ever go to cached grants.
                let sliced = |c: &mut Client, cache: &mut Caching| {
                    c.set_wake_on_revoke(id, true).map_err(Status::from)?;
                    lock_sliced(c, cache, REQUEST_TIMEOUT, |c, slice| {
                        c.lock(id, mode, ms, slice).map_err(Status::from)
                    })
                };
                // A cached lock first: a hit is answered from its parked grant, with nothing
                // else looked at or set; a miss asks the server in slices.
                if let Some(g) = s.cache.acquire(&mut s.client, id, mode, sliced) {
                    return g;
                }
                // With caching enabled on any lock, a wait on an RW lock goes in slices too,
                // cached or not.
                let rw = s
                    .client
                    .local_lock(id)
                    .is_some_and(|l| l.kind == LockKind::Rw);
                if rw && s.cache.any() {
                    return sliced(&mut s.client, &mut s.cache);
                }
                s.client
                    .lock(id, mode, ms, REQUEST_TIMEOUT)
                    .map_err(Status::from)
            })
        }
    })
}

/// Unlocks `lock_id`. Returns `DLOCK_SUCCESS`; `DLOCK_ALREADY_LOCKED` (a re-entry was counted
/// down, still held); `DLOCK_ALREADY_UNLOCKED`; `DLOCK_FAIL`; `DLOCK_LOCK_NOT_GET`; ….
///
/// # Safety
///
/// - `result` is NULL or valid for writing 16 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlock(client_id: c_int, lock_id: c_int, result: *mut c_void) -> c_int {
    guard(|| {
        if result.is_null() {
            return Status::Einval.code();
        }
        let op = |s: &mut Slot, id| {
            if let Some(parked) = s.cache.release(&mut s.client, id) {
                return parked;
            }
            let status = s.client.unlock(id).map_err(Status::from)?;
            // The client reports only a status; the word the server answered is in the record.
            let (token, word) =
                record(&s.client, id).map_or((FencingToken(0), 0), |l| (l.token, l.word));
            Ok(Grant {
                status,
                token,
                word,
                value: None,
                plain: false,
            })
        };
        // SAFETY: `result` is not NULL (checked above); 16 writable bytes (caller's contract).
        unsafe { on_lock(client_id, lock_id, result, op) }
    })
}

/// Turns the exclusive grant held on RW lock `lock_id` into a shared one in place (ours; the
/// reference has no downgrade): readers waiting behind it may join, the holder keeps reading
/// under the same fencing token, and a block staged with `lock_value_set` is written. The
/// answer to a revoke that wants only shared. Returns `DLOCK_SUCCESS`; `DLOCK_EINVAL` for
/// another kind or a grant not held exclusively; `DLOCK_LOCK_NOT_GET`; ….
///
/// # Safety
///
/// - `result` is NULL or valid for writing 16 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_downgrade(
    client_id: c_int,
    lock_id: c_int,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        if result.is_null() {
            return Status::Einval.code();
        }
        let op = |s: &mut Slot, id| {
            let status = match s.cache.downgrade(&mut s.client, id) {
                Some(done) => done.map(|()| Status::Success)?,
                None => s.client.downgrade(id).map_err(Status::from)?,
            };
            let l = record(&s.client, id).ok_or(Status::LockNotGet)?;
            Ok(Grant {
                status,
                token: l.token,
                word: l.word,
                value: l.value,
                plain: l.plain,
            })
        };
        // SAFETY: `result` is not NULL (checked above); 16 writable bytes (caller's contract).
        unsafe { on_lock(client_id, lock_id, result, op) }
    })
}

/// Extends the grant on `req->lock_id` held in the op's mode (`EXTEND_LOCK_EXCLUSIVE`,
/// `EXTEND_LOCK_SHARED`) to at least `req->expire_time` seconds from now (0 only
/// re-validates). `DLOCK_EINVAL` when it is not held in that mode, as in the reference, or
/// for an RW lock (no expiry); `DLOCK_FAIL` when the grant was lost.
///
/// # Safety
///
/// As for `trylock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_extend(
    client_id: c_int,
    req: *const lock_request,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (r, mode) =
            match unsafe { single(req, result) }.and_then(|r| Ok((r, extend_mode(r.lock_op)?))) {
                Ok(v) => v,
                Err(s) => return s.code(),
            };
        let ms = seconds_to_ms(r.expire_time);
        // SAFETY: `single` checked `result` is not NULL; 16 writable bytes (caller's contract).
        unsafe {
            on_lock(client_id, r.lock_id, result, |s, id| {
                s.client.lock_extend(id, mode, ms).map_err(Status::from)
            })
        }
    })
}

/// Starts one operation on `req->lock_id` without waiting (`LOCK_EXCLUSIVE`/`LOCK_SHARED`
/// with `expire_time != 0`, `UNLOCK`, or an extend); poll with `lock_result_check`. One may
/// be outstanding per client (`DLOCK_EASYNC`). An operation the client answers locally (a
/// re-entry) returns 0 and leaves nothing to check (`DLOCK_NO_ASYNC`).
///
/// # Safety
///
/// - `req` is NULL or points to a readable `lock_request`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_request_async(client_id: c_int, req: *const lock_request) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (caller's contract).
        let r = match unsafe { read(req) } {
            Ok(r) => r,
            Err(s) => return s.code(),
        };
        let ms = seconds_to_ms(r.expire_time);
        let op = match r.lock_op {
            LOCK_EXCLUSIVE | LOCK_SHARED if r.expire_time == 0 => Err(Status::Einval),
            LOCK_EXCLUSIVE => Ok(AsyncOp::Lock(Mode::Exclusive, ms)),
            LOCK_SHARED => Ok(AsyncOp::Lock(Mode::Shared, ms)),
            UNLOCK => Ok(AsyncOp::Unlock),
            EXTEND_LOCK_EXCLUSIVE => Ok(AsyncOp::Extend(Mode::Exclusive, ms)),
            EXTEND_LOCK_SHARED => Ok(AsyncOp::Extend(Mode::Shared, ms)),
            _ => Err(Status::Einval),
        };
        let op = match op {
            Ok(op) => op,
            Err(s) => return s.code(),
        };
        with_client(client_id, Refusals::DATA, |slot| {
            let started = lock_id(r.lock_id).and_then(|id| {
                if slot.cache.caches(id) {
                    // A cached grant's local users are counted by the single calls only.
                    return Err(Status::Einval);
                }
                slot.client.lock_request_async(id, op)?;
                slot.async_lock = Some(id);
                Ok(())
            });
            match started {
                Ok(()) => Status::Success.code(),
                Err(s) => s.code(),
            }
        })
    })
}

/// Polls the outstanding `lock_request_async`: `DLOCK_ASYNC_AGAIN` until its reply arrives,
/// then the operation's status (and `*result` as for `trylock`); `DLOCK_ETIMEOUT` after 5 s;
/// `DLOCK_NO_ASYNC` when nothing is outstanding; `DLOCK_EINVAL` for NULL `result`.
///
/// # Safety
///
/// - `result` is NULL or valid for writing 16 bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_result_check(client_id: c_int, result: *mut c_void) -> c_int {
    guard(|| {
        if result.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::DATA, |slot| {
            let r = slot.client.lock_result_check().map_err(Status::from);
            if r == Err(Status::AsyncAgain) {
                return Status::AsyncAgain.code();
            }
            let Some(id) = slot.async_lock.take() else {
                return match r {
                    Ok(g) => g.status.code(),
                    Err(s) => s.code(),
                };
            };
            // SAFETY: `result` checked non-NULL, 16 writable bytes (caller's contract).
            unsafe { finish(&slot.client, id, r, result) }
        })
    })
}

/// Writes the fencing token of the grant this client holds on `lock_id` (ours; the reference
/// has no tokens). Stamp the writes the lock protects with it: it is larger than every token
/// issued before for the lock, also across a server restart with a larger epoch.
/// Returns 0; `DLOCK_ALREADY_UNLOCKED` when no grant is held (also while queued);
/// `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL` for NULL.
///
/// # Safety
///
/// - `fence` is NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_fence(client_id: c_int, lock_id: c_int, fence: *mut u64) -> c_int {
    guard(|| {
        if fence.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::DATA, |slot| {
            let held = super::locks::lock_id(lock_id).and_then(|id| {
                let l = record(&slot.client, id).ok_or(Status::LockNotGet)?;
                l.state.held_mode().ok_or(Status::AlreadyUnlocked)?;
                Ok(l.token.0)
            });
            match held {
                Ok(token) => {
                    // SAFETY: not NULL (checked above), writable by the caller's contract.
                    unsafe { write_at(fence, 0, token) };
                    Status::Success.code()
                }
                Err(s) => s.code(),
            }
        })
    })
}
