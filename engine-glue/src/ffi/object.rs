//! `umo_atomic64` objects: create, destroy, get, release, fetch-and-add, compare-and-swap,
//! snapshot.
//!
//! An engine allocates transaction ids with `umo_atomic64_faa` (each caller gets a distinct
//! previous value) and publishes commit sequence numbers with `umo_atomic64_cas`. Over shared
//! memory the three value operations are one-sided atomics on the server's object cell, as
//! the reference's NIC atomics are.

use std::ffi::c_int;

use dlock_core::{ObjectId, Status};

use super::client::{Refusals, with_client};
use super::types::umo_atomic64_desc;
use super::{code, guard, name, non_null, read, write_at};

/// The name and lease (seconds, > 0) a descriptor gives.
///
/// # Safety
///
/// - `desc` is NULL or points to a `umo_atomic64_desc` whose `p_desc` is NULL or has `len`
///   readable bytes.
unsafe fn described<'a>(desc: *const umo_atomic64_desc) -> Result<(&'a [u8], u32), Status> {
    // SAFETY: forwarded from the caller.
    let d = unsafe { read(desc) }?;
    if d.lease_time == 0 {
        return Err(Status::Einval);
    }
    // SAFETY: forwarded from the caller.
    let name = unsafe { name(d.p_desc, d.len) }?;
    Ok((name, d.lease_time))
}

/// An object id as C passes it; `unknown` for a value no server issues.
#[inline]
/// Create and get: checks `desc` and `obj_id`, runs `op` with the name and lease on the
/// client, and writes the object id it returns.
///
/// # Safety
///
/// - `desc` is NULL or points to a readable `umo_atomic64_desc` whose `p_desc` is NULL or
///   readable for `len` bytes.
/// - `obj_id` is NULL or valid for writing an `int`.
unsafe fn by_name(
    client_id: c_int,
    desc: *const umo_atomic64_desc,
    obj_id: *mut c_int,
    op: impl FnOnce(&mut dlock_transport::client::Client, &[u8], u32) -> Result<ObjectId, Status>,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (name, lease_s) =
            match unsafe { described(desc) }.and_then(|d| non_null(obj_id).map(|()| d)) {
                Ok(v) => v,
                Err(s) => return s.code(),
            };
        with_client(client_id, Refusals::DATA, |slot| {
            match op(&mut slot.client, name, lease_s) {
                Ok(id) => {
                    // SAFETY: not NULL (checked above), writable by the caller's contract.
                    unsafe { write_at(obj_id, 0, id.raw() as c_int) };
                    Status::Success.code()
                }
                Err(s) => s.code(),
            }
        })
    })
}

fn object_id(raw: c_int, unknown: Status) -> Result<ObjectId, Status> {
    ObjectId::from_raw(raw as u32).ok_or(unknown)
}

/// Creates object `desc` with `init_val` and writes its id. Creating is not a reference: get
/// it to operate on it. Returns 0; `DLOCK_EINVAL` (NULL, name outside 1..=512 bytes, lease 0);
/// `DLOCK_OBJECT_ALREADY_CREATED`; `DLOCK_OBJECT_ALREADY_EXISTED`; `DLOCK_OBJECT_TOO_MANY`;
/// `DLOCK_CLIENT_NOT_INIT`; `DLOCK_BAD_RESPONSE`.
///
/// # Safety
///
/// - `desc` is NULL or points to a readable descriptor whose name has `len` readable bytes.
/// - `obj_id` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umo_atomic64_create(
    client_id: c_int,
    desc: *const umo_atomic64_desc,
    init_val: u64,
    obj_id: *mut c_int,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe {
        by_name(client_id, desc, obj_id, |c, name, lease_s| {
            c.atomic64_create(name, init_val, lease_s)
                .map_err(Status::from)
        })
    }
}

/// Destroys object `obj_id` (owner only; freed once no client references it).
/// Returns 0; `DLOCK_OBJECT_NOT_CREATE`; `DLOCK_OBJECT_INVALID_OWNER`;
/// `DLOCK_OBJECT_ALREADY_DESTROYED`; ….
#[unsafe(no_mangle)]
pub extern "C" fn umo_atomic64_destroy(client_id: c_int, obj_id: c_int) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::DATA, |slot| {
            code(
                object_id(obj_id, Status::ObjectNotCreate)
                    .and_then(|id| slot.client.atomic64_destroy(id).map_err(Status::from)),
            )
        })
    })
}

/// Takes a reference to object `desc` and writes its id. Returns 0; `DLOCK_EINVAL`;
/// `DLOCK_OBJECT_NOT_CREATE`; `DLOCK_OBJECT_ALREADY_DESTROYED`; `DLOCK_SERVER_NO_RESOURCE`; ….
///
/// # Safety
///
/// As for `umo_atomic64_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umo_atomic64_get(
    client_id: c_int,
    desc: *const umo_atomic64_desc,
    obj_id: *mut c_int,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe {
        by_name(client_id, desc, obj_id, |c, name, lease_s| {
            c.atomic64_get(name, lease_s).map_err(Status::from)
        })
    }
}

/// Drops the reference to `obj_id`. Returns 0; `DLOCK_OBJECT_NOT_GET`; ….
#[unsafe(no_mangle)]
pub extern "C" fn umo_atomic64_release(client_id: c_int, obj_id: c_int) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::DATA, |slot| {
            code(
                object_id(obj_id, Status::ObjectNotGet)
                    .and_then(|id| slot.client.atomic64_release(id).map_err(Status::from)),
            )
        })
    })
}

/// Adds `add_val` (wrapping) and writes the value before the add to `*res_val`.
/// Returns 0; `DLOCK_EINVAL` for NULL; `DLOCK_OBJECT_NOT_GET`; `DLOCK_BAD_RESPONSE`.
///
/// # Safety
///
/// - `res_val` is NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umo_atomic64_faa(
    client_id: c_int,
    obj_id: c_int,
    add_val: u64,
    res_val: *mut u64,
) -> c_int {
    guard(|| {
        if res_val.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::DATA, |slot| {
            let r = object_id(obj_id, Status::ObjectNotGet)
                .and_then(|id| slot.client.atomic64_faa(id, add_val).map_err(Status::from));
            match r {
                Ok(old) => {
                    // SAFETY: not NULL (checked above), writable by the caller's contract.
                    unsafe { write_at(res_val, 0, old) };
                    Status::Success.code()
                }
                Err(s) => s.code(),
            }
        })
    })
}

/// Compare-and-swap, and the value found (ours: the reference reports only the status).
///
/// # Safety
///
/// - `observed` is NULL (not wanted) or valid for writing a `uint64_t`.
unsafe fn cas(
    client_id: c_int,
    obj_id: c_int,
    cmp_val: u64,
    swap_val: u64,
    observed: *mut u64,
) -> c_int {
    with_client(client_id, Refusals::DATA, |slot| {
        let r = object_id(obj_id, Status::ObjectNotGet).and_then(|id| {
            slot.client
                .atomic64_cas(id, cmp_val, swap_val)
                .map_err(Status::from)
        });
        match r {
            Ok(c) => {
                if !observed.is_null() {
                    // SAFETY: not NULL, writable by the caller's contract.
                    unsafe { write_at(observed, 0, c.observed) };
                }
                if c.swapped {
                    Status::Success.code()
                } else {
                    Status::ObjectCasFailed.code()
                }
            }
            Err(s) => s.code(),
        }
    })
}

/// Sets the object to `swap_val` if it equals `cmp_val`. Returns 0 when swapped,
/// `DLOCK_OBJECT_CAS_FAILED` when the value differed; `DLOCK_OBJECT_NOT_GET`; ….
#[unsafe(no_mangle)]
pub extern "C" fn umo_atomic64_cas(
    client_id: c_int,
    obj_id: c_int,
    cmp_val: u64,
    swap_val: u64,
) -> c_int {
    // SAFETY: NULL `observed` is never written.
    guard(|| unsafe { cas(client_id, obj_id, cmp_val, swap_val, std::ptr::null_mut()) })
}

/// `umo_atomic64_cas` that also writes the value it found to `*observed` (`cmp_val` when it
/// swapped): a failed CAS needs no extra snapshot to retry. `DLOCK_EINVAL` for NULL.
///
/// # Safety
///
/// - `observed` is NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umo_atomic64_cas_value(
    client_id: c_int,
    obj_id: c_int,
    cmp_val: u64,
    swap_val: u64,
    observed: *mut u64,
) -> c_int {
    guard(|| {
        if observed.is_null() {
            return Status::Einval.code();
        }
        // SAFETY: not NULL, writable by the caller's contract.
        unsafe { cas(client_id, obj_id, cmp_val, swap_val, observed) }
    })
}

/// Reads the object's current value into `*res_val`. Returns 0; `DLOCK_EINVAL` for NULL;
/// `DLOCK_OBJECT_NOT_GET`; `DLOCK_BAD_RESPONSE`.
///
/// # Safety
///
/// - `res_val` is NULL or valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umo_atomic64_get_snapshot(
    client_id: c_int,
    obj_id: c_int,
    res_val: *mut u64,
) -> c_int {
    guard(|| {
        if res_val.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::DATA, |slot| {
            match object_id(obj_id, Status::ObjectNotGet)
                .and_then(|id| slot.client.atomic64_snapshot(id).map_err(Status::from))
            {
                Ok(v) => {
                    // SAFETY: not NULL (checked above), writable by the caller's contract.
                    unsafe { write_at(res_val, 0, v) };
                    Status::Success.code()
                }
                Err(s) => s.code(),
            }
        })
    })
}
