//! Retained locks (ours; the reference has none): `lock_retain_enable`, `recovery_done`.
//!
//! A grant asked with retention outlives its client's death, held by the dead client until a
//! recoverer's `recovery_done` (`dlock_core::manager::retain`). Who is a recoverer is the
//! server's configuration (`server_cfg::recoverer_local` here), never the caller's claim.

use std::ffi::{c_int, c_uint};

use dlock_core::Status;

use super::client::{Refusals, with_client};
use super::locks::lock_id;
use super::{guard, write_at};

/// Every grant of `lock_id` from now on is retained if this client dies (`enable` 1), or not
/// (0). Returns 0; `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL` for another `enable`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_retain_enable(client_id: c_int, lock_id: c_int, enable: c_int) -> c_int {
    guard(|| {
        let on = match enable {
            0 => false,
            1 => true,
            _ => return Status::Einval.code(),
        };
        with_client(client_id, Refusals::DATA, |slot| {
            let set = self::lock_id(lock_id)
                .and_then(|id| slot.client.set_retain(id, on).map_err(Status::from));
            super::code(set)
        })
    })
}

/// Releases the locks dead client `dead_client_id` retains, and writes how many to
/// `*released` (unless NULL). Returns 0; `DLOCK_EINVAL` when this client's connection is no
/// recoverer (counted as `recovery_done_refused`) or the target is alive;
/// `DLOCK_CLIENT_NOT_INIT` for an id no client has; `DLOCK_BAD_RESPONSE`.
///
/// # Safety
///
/// - `released` is NULL or valid for writing an `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recovery_done(
    client_id: c_int,
    dead_client_id: c_int,
    released: *mut c_uint,
) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::CONTROL, |slot| {
            match slot.client.recovery_done(dead_client_id as u32) {
                Ok(n) => {
                    if !released.is_null() {
                        // SAFETY: not NULL, writable by the caller's contract.
                        unsafe { write_at(released, 0, n) };
                    }
                    Status::Success.code()
                }
                Err(e) => e.status().code(),
            }
        })
    })
}
