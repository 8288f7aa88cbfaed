//! `struct ssl_cfg` → [`TlsConfig`]: the TLS settings of `server_start` and `dclient_lib_init`.
//!
//! It owns the translation only: paths are copied (and made absolute, as the reference does
//! with `realpath`) while the C strings are known to be alive, and the C password callbacks are
//! wrapped into the Rust [`KeyPasswordFn`](dlock_transport::tls::KeyPasswordFn). Reading the files and building the rustls
//! configurations stays with `dlock_transport::tls`.
//!
//! # The password callback
//!
//! dlock hands `prkey_pwd_cb` a zeroed buffer of [`KEY_PASSWORD_LEN_MAX`] bytes, copies the
//! password out into a buffer wiped on drop, hands the same buffer to `erase_prkey_cb` (so the
//! application can wipe it its own way, as in the reference) and zeroes it once more itself.

use std::ffi::{CStr, OsStr, c_char, c_int};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use dlock_core::Status;
use dlock_transport::tls::TlsConfig;
use zeroize::Zeroizing;

use super::types::{dlock_erase_prkey_cb_t, ssl_cfg};

/// Bytes of the buffer `prkey_pwd_cb` writes the password into (OpenSSL's `PEM_BUFSIZE` is
/// 1,024 as well, so a callback written for OpenSSL fits).
pub const KEY_PASSWORD_LEN_MAX: usize = 1024;

/// Longest path accepted (Linux's `PATH_MAX`, terminating NUL included).
const PATH_LEN_MAX: usize = 4096;

/// The C path at `p` made absolute: `Ok(None)` for NULL or "", `Einval` for a path that is too
/// long or names nothing that exists.
///
/// # Safety
///
/// - `p` is NULL or points to a NUL-terminated string that stays unchanged during the call.
unsafe fn opt_path(p: *const c_char) -> Result<Option<PathBuf>, Status> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    match bytes.len() {
        0 => Ok(None),
        n if n >= PATH_LEN_MAX => Err(Status::Einval),
        // Resolved now: the process's working directory may change before a later
        // `client_init` reads the files.
        _ => std::fs::canonicalize(OsStr::from_bytes(bytes))
            .map(Some)
            .map_err(|_| Status::Einval),
    }
}

/// The TLS settings `ssl` asks for: `None` when `ssl_enable` is false (the other fields are
/// then ignored). `Einval` when enabled with a CA, certificate or key path that is NULL, "" or
/// names no file, a CRL path that names no file, or a `cert_verify_cb` (dlock verifies with
/// the CA and CRL files itself).
///
/// # Safety
///
/// - The path fields of `ssl` are NULL or NUL-terminated strings.
/// - `ssl.prkey_pwd_cb` and `ssl.erase_prkey_cb` are NULL or functions of their C types that
///   stay callable, from any thread, as long as the returned configuration is used; the
///   password callback writes at most `size` bytes to `buf` and the erase callback writes
///   only within `buf[..size]`.
pub(super) unsafe fn tls_config(ssl: &ssl_cfg) -> Result<Option<TlsConfig>, Status> {
    if ssl.ssl_enable == 0 {
        return Ok(None);
    }
    if ssl.cert_verify_cb.is_some() {
        return Err(Status::Einval);
    }
    // SAFETY: every path is NULL or NUL-terminated (caller's contract).
    let (ca, crl, cert, key) = unsafe {
        (
            opt_path(ssl.ca_path)?,
            opt_path(ssl.crl_path)?,
            opt_path(ssl.cert_path)?,
            opt_path(ssl.prkey_path)?,
        )
    };
    let (Some(ca), Some(cert), Some(key)) = (ca, cert, key) else {
        return Err(Status::Einval);
    };
    let mut tls = TlsConfig::new(cert, key, ca);
    if let Some(crl) = crl {
        tls = tls.with_crl(crl);
    }
    if let Some(ask) = ssl.prkey_pwd_cb {
        let erase = ssl.erase_prkey_cb;
        tls = tls.with_key_password(move || {
            // SAFETY: `ask` and `erase` are valid, callable and write within the buffer they
            // are given, by `tls_config`'s contract, which covers every use of this closure.
            unsafe { key_password(ask, erase) }
        });
    }
    Ok(Some(tls))
}

/// Asks `ask` for the key password, copies it out and lets `erase` wipe the buffer.
///
/// # Safety
///
/// - `ask` writes at most `size` bytes to `buf`; `erase`, when given, writes only within
///   `buf[..size]`. Both may be called from this thread.
unsafe fn key_password(
    ask: unsafe extern "C" fn(buf: *mut c_char, size: c_int) -> c_int,
    erase: dlock_erase_prkey_cb_t,
) -> io::Result<Zeroizing<String>> {
    let mut buf = Zeroizing::new([0u8; KEY_PASSWORD_LEN_MAX]);
    let size = KEY_PASSWORD_LEN_MAX as c_int;
    // SAFETY: `buf` is writable for `size` bytes and `ask` writes no more (caller's contract).
    let len = unsafe { ask(buf.as_mut_ptr().cast(), size) };
    // Copied before `erase` runs; `to_owned` allocates exactly `len` bytes, so the password
    // is never moved by a reallocation that would leave an unwiped copy behind.
    let password = match usize::try_from(len) {
        Ok(n) if n <= KEY_PASSWORD_LEN_MAX => std::str::from_utf8(&buf[..n])
            .map(|s| Zeroizing::new(s.to_owned()))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "password is not UTF-8")),
        _ => Err(io::Error::other(format!(
            "prkey_pwd_cb returned {len} (a length in 0..={KEY_PASSWORD_LEN_MAX} expected)"
        ))),
    };
    if let Some(erase) = erase {
        // SAFETY: `buf` is writable for `size` bytes, within which `erase` writes (caller's
        // contract).
        unsafe { erase(buf.as_mut_ptr().cast(), size) };
    }
    // `buf` is zeroed here on drop, whatever `erase` did.
    password
}

// Callbacks are tested from tests/tls.rs: an `extern "C" fn` under src/ffi/ is taken for an
// export by the header check in tests/c_abi.rs.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_needs_ca_cert_and_key_that_exist() {
        let dir = std::env::temp_dir();
        let dir = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mut ssl = ssl_cfg::DISABLED;
        // SAFETY: every path is NULL or a live NUL-terminated string; no callbacks.
        unsafe {
            assert!(matches!(tls_config(&ssl), Ok(None)));
            ssl.ssl_enable = 1;
            assert_eq!(tls_config(&ssl).err(), Some(Status::Einval));
            ssl.ca_path = dir.as_ptr();
            ssl.cert_path = dir.as_ptr();
            assert_eq!(tls_config(&ssl).err(), Some(Status::Einval));
            ssl.prkey_path = c"".as_ptr();
            assert_eq!(tls_config(&ssl).err(), Some(Status::Einval));
            ssl.prkey_path = c"/nonexistent/dlock/key.pem".as_ptr();
            assert_eq!(tls_config(&ssl).err(), Some(Status::Einval));
            // Paths that exist are accepted here; whether they hold PEM is checked on use.
            ssl.prkey_path = dir.as_ptr();
            let tls = tls_config(&ssl).unwrap().unwrap();
            assert!(tls.crls.is_empty() && tls.key_password.is_none());
        }
    }
}
