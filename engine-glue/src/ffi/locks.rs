//! Lock management: `get_lock`, `release_lock`, `batch_get_lock`, `batch_release_lock`,
//! `update_all_locks`.
//!
//! These are control-plane calls (one round trip on the control connection each), so they may
//! allocate; the lock operations in [`super::ops`] do not.

use std::ffi::{c_int, c_uint};

use dlock_core::{LockId, LockKind, Status};

use super::client::{Refusals, with_client};
use super::types::lock_desc;
use super::{FAILURE, batch_len, code, guard, name, non_null, read, read_at, write_at};

/// A lock id as C passes it: `LockNotGet` for a value no server issues (0, negative, or a
/// zero generation), as for an id this client never got.
#[inline]
pub(super) fn lock_id(raw: c_int) -> Result<LockId, Status> {
    LockId::from_raw(raw as u32).ok_or(Status::LockNotGet)
}

/// The kind and name a `lock_desc` describes; `Einval` for a bad name or type.
///
/// # Safety
///
/// - `d.p_desc` is NULL or valid for reading `d.len` bytes.
unsafe fn described<'a>(d: &lock_desc) -> Result<(LockKind, &'a [u8]), Status> {
    let kind = u8::try_from(d.lock_type)
        .ok()
        .and_then(LockKind::from_u8)
        .ok_or(Status::Einval)?;
    // SAFETY: forwarded from the caller.
    let name = unsafe { name(d.p_desc, d.len) }?;
    Ok((kind, name))
}

/// Creates or opens the lock `desc` names, of `desc->lock_type`, and writes its id.
///
/// Returns 0; `DLOCK_EINVAL` (NULL pointers, a name outside 1..=512 bytes, an unknown type);
/// -1 before `dclient_lib_init`, for an unknown client and when the name exists with another
/// type (as the reference); `DLOCK_NOT_READY`; `DLOCK_SERVER_NO_RESOURCE` (lock table full);
/// `DLOCK_BAD_RESPONSE`.
///
/// # Safety
///
/// - `desc` is NULL or points to a `lock_desc` whose `p_desc` is NULL or has `len` bytes.
/// - `lock_id` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn get_lock(
    client_id: c_int,
    desc: *const lock_desc,
    lock_id: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (caller's contract); the name is checked the same way.
        let (kind, name) = match unsafe { read(desc).and_then(|d| described(&d)) } {
            Ok(v) => v,
            Err(s) => return s.code(),
        };
        if lock_id.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::CONTROL, |slot| {
            match slot.client.get_lock(kind, name).map_err(Status::from) {
                Ok(id) => {
                    // SAFETY: not NULL (checked above), writable by the caller's contract.
                    unsafe { write_at(lock_id, 0, id.raw() as c_int) };
                    Status::Success.code()
                }
                // The name and type were checked above, so the server refused the type: the
                // name exists with another.
                Err(Status::Einval) => FAILURE,
                Err(s) => s.code(),
            }
        })
    })
}

/// Drops the client's reference to `lock_id`. Returns 0; -1 (as the reference) before
/// `dclient_lib_init`, for an unknown client, a lock it never got and a lock it holds (a
/// parked cached grant is not in use: it is given back first, and caching ends with the
/// reference); `DLOCK_TICKET_TO_UNLOCK` while a fair ticket is held; `DLOCK_EASYNC` while an
/// async operation on it is outstanding; the failure of a parked grant's give-back that did
/// not reach the server (`DLOCK_BAD_RESPONSE`, say: owed, sent again at the client's next
/// call, and the reference is kept).
#[unsafe(no_mangle)]
pub extern "C" fn release_lock(client_id: c_int, lock_id: c_int) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::CONTROL, |slot| {
            let released = super::locks::lock_id(lock_id).and_then(|id| {
                // A parked cached grant has no user: it goes back with the reference.
                slot.cache.unpark(&mut slot.client, id)?;
                slot.client.release_lock(id).map_err(Status::from)?;
                slot.cache.forget(id);
                Ok(())
            });
            match released {
                Ok(()) => Status::Success.code(),
                // The Rust client's answers for "never got" and "still held".
                Err(Status::LockNotGet | Status::Fail) => FAILURE,
                Err(s) => s.code(),
            }
        })
    })
}

/// `get_lock` for `lock_num` (1..=31) descriptions in one round trip. Each entry succeeds or
/// fails on its own: `lock_ids[i]` is the id, or minus the entry's status code (so <= 0, as in
/// the reference). Returns 0, or an error for the whole call (`DLOCK_EINVAL` when any
/// description is invalid — nothing is sent then; -1 before `dclient_lib_init` and for an
/// unknown client).
///
/// # Safety
///
/// - `descs` is NULL or valid for reading `lock_num` `lock_desc`s whose names are readable.
/// - `lock_ids` is NULL or valid for writing `lock_num` `int`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn batch_get_lock(
    client_id: c_int,
    lock_num: c_uint,
    descs: *const lock_desc,
    lock_ids: *mut c_int,
) -> c_int {
    guard(|| {
        let n = match batch_len(lock_num)
            .and(non_null(descs))
            .and(non_null(lock_ids))
        {
            Ok(()) => lock_num as usize,
            Err(s) => return s.code(),
        };
        let mut names = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `descs` is not NULL and has `n` entries (caller's contract).
            let d = unsafe { read_at(descs, i) };
            // SAFETY: each entry's name is readable (caller's contract).
            match unsafe { described(&d) } {
                Ok(v) => names.push(v),
                Err(s) => return s.code(),
            }
        }
        with_client(client_id, Refusals::CONTROL, |slot| {
            let got = match slot.client.batch_get_lock(&names) {
                Ok(g) => g,
                Err(e) => return e.status().code(),
            };
            for i in 0..n {
                let v = match got.get(i) {
                    Some(Ok(id)) => id.raw() as c_int,
                    Some(Err(s)) => -s.code(),
                    None => -Status::BadResponse.code(),
                };
                // SAFETY: `lock_ids` is not NULL and has `n` entries (caller's contract).
                unsafe { write_at(lock_ids, i, v) };
            }
            Status::Success.code()
        })
    })
}

/// `release_lock` for `lock_num` (1..=31) ids in one round trip. Each entry on its own: an id
/// that could not be released (unknown, still held, ticketed) is set to 0, as in the
/// reference; released ones are left as they were. Returns 0 when at least one was released;
/// -1 when none was (the reference: when none may be released, so nothing is sent), before
/// `dclient_lib_init` and for an unknown client; or another error for the whole call.
///
/// # Safety
///
/// - `lock_ids` is NULL or valid for reading and writing `lock_num` `int`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn batch_release_lock(
    client_id: c_int,
    lock_num: c_uint,
    lock_ids: *mut c_int,
) -> c_int {
    guard(|| {
        let n = match batch_len(lock_num).and(non_null(lock_ids)) {
            Ok(()) => lock_num as usize,
            Err(s) => return s.code(),
        };
        // SAFETY: `lock_ids` is not NULL and has `n` entries (caller's contract).
        let raw: Vec<c_int> = (0..n).map(|i| unsafe { read_at(lock_ids, i) }).collect();
        let ids: Vec<LockId> = raw.iter().filter_map(|&r| lock_id(r).ok()).collect();
        with_client(client_id, Refusals::CONTROL, |slot| {
            let released = if ids.is_empty() {
                Vec::new()
            } else {
                match slot.client.batch_release_lock(&ids) {
                    Ok(r) => r,
                    Err(e) => return e.status().code(),
                }
            };
            let mut results = ids.iter().zip(released);
            let mut any = false;
            for (i, &r) in raw.iter().enumerate() {
                let ok = lock_id(r).is_ok() && results.next().is_some_and(|(_, res)| res.is_ok());
                any |= ok;
                if !ok {
                    // SAFETY: `lock_ids` is not NULL and has `n` entries (caller's contract).
                    unsafe { write_at(lock_ids, i, 0) };
                }
            }
            if any { Status::Success.code() } else { FAILURE }
        })
    })
}

/// After `client_reinit` found the server recovering: re-claims every lock the client knows.
/// Returns 0, -1 before `dclient_lib_init`, `DLOCK_CLIENT_NOT_INIT`, `DLOCK_BAD_RESPONSE`, or
/// -1 (as the reference) when the server is not recovering for this client: then every record
/// is kept as it was, since the server still holds those locks for it. The server may give the
/// locks
/// new ids; the C API has no way to report them yet (see the header's note), so call
/// `get_lock` again by name afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn update_all_locks(client_id: c_int) -> c_int {
    guard(|| {
        with_client(
            client_id,
            Refusals::control_unknown(Status::ClientNotInit),
            |slot| match slot.client.update_all_locks().map_err(Status::from) {
                // The server's refusal of a client it is not recovering.
                Err(Status::Einval) => FAILURE,
                r => code(r),
            },
        )
    })
}
