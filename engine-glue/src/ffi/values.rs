//! Lock value blocks (ours; the reference has none): `lock_value_enable`, `lock_value_get`,
//! `lock_value_set`.
//!
//! A lock keeps 32 bytes for the engine (the Linux DLM's lock value block: a page's LSN, the
//! node with its newest copy), returned with every grant of a lock whose client asks for it
//! and written by the unlock that releases an exclusive grant (the Rust client's
//! `set_value_blocks`, `stage_value`; `dlock_core::manager::value` has the rules). The C calls
//! take a pointer and a length so that an engine with fewer bytes to keep passes fewer; more
//! than [`VALUE_BLOCK_LEN`] is `DLOCK_EINVAL`, never a truncation.
//!
//! These calls allocate nothing and send nothing: they set or read the client's record, and
//! the lock operations carry the blocks.

use std::ffi::{c_int, c_uint, c_void};

use dlock_core::Status;
use dlock_core::manager::value::VALUE_BLOCK_LEN;

use super::client::{Refusals, with_client};
use super::locks::lock_id;
use super::{guard, write_at};

/// Every grant of `lock_id` from now on returns the lock's value block (`enable` 1), or none
/// (0). Returns 0; `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL` for another `enable`.
#[unsafe(no_mangle)]
pub extern "C" fn lock_value_enable(client_id: c_int, lock_id: c_int, enable: c_int) -> c_int {
    guard(|| {
        let on = match enable {
            0 => false,
            1 => true,
            _ => return Status::Einval.code(),
        };
        with_client(client_id, Refusals::DATA, |slot| {
            let set = self::lock_id(lock_id)
                .and_then(|id| slot.client.set_value_blocks(id, on).map_err(Status::from));
            super::code(set)
        })
    })
}

/// Copies the first `len` (0..=32) bytes of the value block the grant held on `lock_id` came
/// with into `value`, and writes to `*valid` 1, or 0 when the block is not valid (an exclusive
/// holder was lost without writing it, or a server failover left it unknown; the bytes are
/// the last ones written). Returns 0; `DLOCK_ALREADY_UNLOCKED` when no grant is held;
/// `DLOCK_LOCK_NOT_GET`; `DLOCK_EINVAL` for NULL (`value` may be NULL when `len` is 0),
/// `len` > 32, or a grant that came without a block (`lock_value_enable` was off).
///
/// # Safety
///
/// - `value` is NULL or valid for writing `len` bytes.
/// - `valid` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_value_get(
    client_id: c_int,
    lock_id: c_int,
    value: *mut c_void,
    len: c_uint,
    valid: *mut c_int,
) -> c_int {
    guard(|| {
        let len = len as usize;
        if len > VALUE_BLOCK_LEN || (value.is_null() && len > 0) || valid.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::DATA, |slot| {
            let read = self::lock_id(lock_id).and_then(|id| {
                let l = slot.client.local_lock(id).ok_or(Status::LockNotGet)?;
                l.state.held_mode().ok_or(Status::AlreadyUnlocked)?;
                l.value.ok_or(Status::Einval)
            });
            let read = match read {
                Ok(r) => r,
                Err(s) => return s.code(),
            };
            if len > 0 {
                // SAFETY: not NULL when `len > 0` (checked above), `len` writable bytes by the
                // caller's contract, `len <= 32` so the source has them; u8 needs no alignment.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        read.block.as_bytes().as_ptr(),
                        value.cast::<u8>(),
                        len,
                    )
                };
            }
            // SAFETY: not NULL (checked above), writable by the caller's contract.
            unsafe { write_at(valid, 0, c_int::from(read.valid)) };
            Status::Success.code()
        })
    })
}

/// Stages `value[..len]` (0..=32 bytes, zero-padded to 32) as the value block that the unlock
/// releasing the exclusive grant held on `lock_id` writes (`unlock`, `batch_unlock`, an
/// asynchronous `UNLOCK`; an unlock that only counts a re-entry down keeps it staged). Returns
/// 0; `DLOCK_EINVAL` for `len` > 32, NULL with `len` > 0, or no exclusive grant held (a
/// shared holder cannot write the block); `DLOCK_LOCK_NOT_GET`; `DLOCK_EASYNC` while an
/// operation on the lock is outstanding.
///
/// # Safety
///
/// - `value` is NULL or valid for reading `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lock_value_set(
    client_id: c_int,
    lock_id: c_int,
    value: *const c_void,
    len: c_uint,
) -> c_int {
    guard(|| {
        let len = len as usize;
        if len > VALUE_BLOCK_LEN || (value.is_null() && len > 0) {
            return Status::Einval.code();
        }
        let bytes: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: not NULL (checked above) and `len` readable bytes by the caller's
            // contract; u8 needs no alignment.
            unsafe { std::slice::from_raw_parts(value.cast::<u8>(), len) }
        };
        with_client(client_id, Refusals::DATA, |slot| {
            let staged = self::lock_id(lock_id)
                .and_then(|id| slot.client.stage_value(id, bytes).map_err(Status::from));
            super::code(staged)
        })
    })
}
