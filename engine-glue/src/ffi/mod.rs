//! The C ABI: the reference's `dlock_server_api.h` and `dlock_client_api.h` as `extern "C"`
//! functions, declared for C in `include/dlock.h`.
//!
//! # What it owns
//!
//! Two process-wide registries, like the reference's singletons: servers by `server_id`
//! (`server`: started with `server_start`, at most `dserver_lib_init(n)` at once) and client
//! instances by `client_id` (`client`: the id the server assigned). Every other function
//! looks its client up, locks it, and calls the Rust [`Client`](dlock_transport::client::Client).
//! It touches no server or client internals.
//!
//! # Rules every function here follows
//!
//! - No panic crosses into C: each body runs inside `guard`, which turns a panic into
//!   `DLOCK_EINVAL` (a `void` function just returns).
//! - Every pointer is checked for NULL and read or written with `read_unaligned` /
//!   `write_unaligned`, so a misaligned pointer is not undefined behaviour either; no Rust
//!   reference to C memory is made except byte slices of names (alignment 1).
//! - Arguments are checked before anything is sent, so a bad out-pointer never leaves a lock
//!   taken that the caller cannot learn about. Names are 1..=512 bytes, batches 1..=31 entries.
//! - Functions return `int`: 0, a `dlock_status` code, or -1 exactly where the reference's
//!   function of the same name does (`client::Refusals` says which answer to an uninitialised
//!   library or an unknown client). Every deliberate difference from the reference is a row of
//!   the README's table "Differences from the reference".
//!
//! # Threads
//!
//! Unlike the reference, every function is thread-safe: each client instance sits behind its
//! own mutex, so two threads using one `client_id` take turns (a client is still meant for one
//! thread; the mutex only makes misuse safe). A client whose call panicked is not trusted again:
//! every call on it but `client_deinit` returns `DLOCK_EINVAL`.

pub mod batch;
pub mod cached;
mod caching;
pub mod client;
mod cluster;
pub mod compat;
pub mod locks;
pub mod object;
pub mod ops;
pub mod retained;
pub mod server;
pub mod tls;
pub mod types;
pub mod values;

use std::ffi::{CStr, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use dlock_core::Status;

/// The reference's generic failure return.
pub const FAILURE: c_int = -1;

/// Runs `f`, turning a panic into `DLOCK_EINVAL`.
#[inline]
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Status::Einval.code())
}

/// `Ok(())` as 0, an error as its status's code (a client's [`Error`] carries the status the
/// reference's function returns; its operation and I/O source have no place in C).
///
/// [`Error`]: dlock_transport::client::Error
#[inline]
fn code<E: Into<Status>>(r: Result<(), E>) -> c_int {
    match r {
        Ok(()) => Status::Success.code(),
        Err(e) => e.into().code(),
    }
}

/// Reads `*p`, or `Einval` for NULL.
///
/// # Safety
///
/// - `p` is NULL or valid for reading one `T` (any alignment).
/// - The bytes at `p` are a valid `T` (the C structs here have no invalid bit patterns).
#[inline]
unsafe fn read<T: Copy>(p: *const T) -> Result<T, Status> {
    if p.is_null() {
        return Err(Status::Einval);
    }
    // SAFETY: not NULL; valid for one unaligned read by the caller's contract.
    Ok(unsafe { p.read_unaligned() })
}

/// Reads element `i` of the C array at `p`.
///
/// # Safety
///
/// - `p` is not NULL and valid for reading `i + 1` values of `T` (any alignment).
#[inline]
unsafe fn read_at<T: Copy>(p: *const T, i: usize) -> T {
    // SAFETY: in bounds of the caller's array by the contract.
    unsafe { p.add(i).read_unaligned() }
}

/// Writes `v` to element `i` of the C array at `p`.
///
/// # Safety
///
/// - `p` is not NULL and valid for writing `i + 1` values of `T` (any alignment).
#[inline]
unsafe fn write_at<T>(p: *mut T, i: usize, v: T) {
    // SAFETY: in bounds of the caller's array by the contract.
    unsafe { p.add(i).write_unaligned(v) }
}

/// `Einval` when `p` is NULL.
#[inline]
fn non_null<T>(p: *const T) -> Result<(), Status> {
    if p.is_null() {
        Err(Status::Einval)
    } else {
        Ok(())
    }
}

/// A batch length the reference accepts: 1..=31.
#[inline]
fn batch_len(n: std::ffi::c_uint) -> Result<usize, Status> {
    match n as usize {
        len @ 1..=types::MAX_LOCK_BATCH_SIZE => Ok(len),
        _ => Err(Status::Einval),
    }
}

/// The name `p[..len]`: `Einval` for NULL or a length outside 1..=512.
///
/// # Safety
///
/// - `p` is NULL or valid for reading `len` bytes that stay unchanged during the call.
#[inline]
unsafe fn name<'a>(p: *const c_char, len: u32) -> Result<&'a [u8], Status> {
    if p.is_null() || len == 0 || len as usize > types::MAX_LOCK_DESC_LEN {
        return Err(Status::Einval);
    }
    // SAFETY: not NULL, `len` readable bytes by the caller's contract; u8 needs no alignment.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len as usize) })
}

/// The C string at `p` as UTF-8: `Ok(None)` for NULL or "", `Einval` for bad UTF-8 or a
/// string longer than `max` bytes.
///
/// # Safety
///
/// - `p` is NULL or points to a NUL-terminated string that stays unchanged during the call.
unsafe fn opt_str<'a>(p: *const c_char, max: usize) -> Result<Option<&'a str>, Status> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    let s = s.to_str().map_err(|_| Status::Einval)?;
    match s.len() {
        0 => Ok(None),
        n if n > max => Err(Status::Einval),
        _ => Ok(Some(s)),
    }
}

/// Seconds (the reference's unit for leases) to milliseconds, by the core's one rounding rule
/// (exact here, saturating at `u32::MAX` ms).
#[inline]
fn seconds_to_ms(s: std::ffi::c_uint) -> u32 {
    dlock_core::time::duration_to_ms(std::time::Duration::from_secs(s.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_einval() {
        // The panic message is printed; the point is that the call returns.
        assert_eq!(guard(|| panic!("boom")), Status::Einval.code());
    }

    #[test]
    fn names_outside_1_to_512_bytes_are_refused() {
        let buf = [b'x'; 513];
        let p = buf.as_ptr().cast::<c_char>();
        // SAFETY: `buf` has 513 readable bytes.
        unsafe {
            assert_eq!(name(p, 0), Err(Status::Einval));
            assert_eq!(name(p, 513), Err(Status::Einval));
            assert_eq!(name(std::ptr::null(), 4), Err(Status::Einval));
            assert_eq!(name(p, 512).map(<[u8]>::len), Ok(512));
        }
    }

    #[test]
    fn batch_lengths_outside_1_to_31_are_refused() {
        assert_eq!(batch_len(0), Err(Status::Einval));
        assert_eq!(batch_len(32), Err(Status::Einval));
        assert_eq!(batch_len(u32::MAX), Err(Status::Einval));
        assert_eq!(batch_len(31), Ok(31));
    }

    #[test]
    fn lease_seconds_saturate_instead_of_wrapping() {
        assert_eq!(seconds_to_ms(5), 5_000);
        assert_eq!(seconds_to_ms(u32::MAX), u32::MAX);
    }
}
