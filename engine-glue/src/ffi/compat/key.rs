//! The reference's key password callbacks behind dlock's.
//!
//! dlock asks for a key password with `int cb(char *buf, int size)` and copies it out of its
//! own buffer (`crate::ffi::tls`). The reference's callback instead hands out a pointer to the
//! application's buffer and the password's length, and a second callback wipes that buffer once
//! the password has been used. The adapter here is a dlock-shaped C function that calls the
//! reference's pair: it copies the password into dlock's buffer and at once hands the
//! application's buffer to the erase callback, since dlock keeps no pointer into it.
//!
//! dlock's callback type has no user-data pointer, so the adapter finds the reference's pair
//! where `dlock_compat_server_start` and `dlock_compat_dclient_lib_init` left it:
//! - a server reads its key once, on the thread that calls `server_start`, before it returns:
//!   a thread-local holds the pair for the duration of that call;
//! - the client library reads a key at the first `client_init` to each server address, on
//!   whichever thread calls it, until `dclient_lib_deinit`: one process-wide slot holds the pair
//!   of the library's (single) initialisation.
//!
//! Differences from the reference, both on the lenient side: the password is the `len` bytes
//! handed out (the reference also requires a NUL at `len` and at most 64 bytes; here up to
//! `KEY_PASSWORD_LEN_MAX`), and the callbacks may be NULL for an unencrypted key (the
//! reference calls them unconditionally).

use std::cell::Cell;
use std::ffi::{c_char, c_int};
use std::sync::{Mutex, PoisonError};

use super::types::{ssl_cfg, tls_erase_prkey_callback_func_t};

/// The reference's password callback and its erase callback.
#[derive(Clone, Copy, Debug)]
pub(super) struct KeyCallbacks {
    pwd: unsafe extern "C" fn(prkey_pwd: *mut *mut c_char, prkey_pwd_len: *mut c_int),
    erase: tls_erase_prkey_callback_func_t,
}

/// The pair `ssl` carries: `None` without TLS or without a password callback.
pub(super) fn callbacks(ssl: &ssl_cfg) -> Option<KeyCallbacks> {
    if ssl.ssl_enable == 0 {
        return None;
    }
    ssl.prkey_pwd_cb.map(|pwd| KeyCallbacks {
        pwd,
        erase: ssl.erase_prkey_cb,
    })
}

thread_local! {
    /// The pair of the `server_start` running on this thread.
    static SERVER_KEY: Cell<Option<KeyCallbacks>> = const { Cell::new(None) };
}

/// Runs `start` (a `server_start`) with `cbs` where [`server_key_password`] finds them.
pub(super) fn with_server_key<R>(cbs: Option<KeyCallbacks>, start: impl FnOnce() -> R) -> R {
    /// Clears the slot however `start` ends.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            SERVER_KEY.set(None);
        }
    }
    SERVER_KEY.set(cbs);
    let _clear = Clear;
    start()
}

/// dlock's `prkey_pwd_cb` for a server started with the reference's callbacks.
///
/// # Safety
///
/// - `buf` is valid for writing `size` bytes (dlock's contract with its callback).
/// - The reference's callbacks this thread's `server_start` was given meet their contract (see
///   [`hand_over`]).
pub(super) unsafe extern "C" fn server_key_password(buf: *mut c_char, size: c_int) -> c_int {
    match SERVER_KEY.get() {
        // SAFETY: forwarded from the caller.
        Some(cbs) => unsafe { hand_over(cbs, buf, size) },
        None => -1,
    }
}

/// The pair of the client library's initialisation.
static CLIENT_KEY: Mutex<Option<KeyCallbacks>> = Mutex::new(None);

/// Runs `init` (a `dclient_lib_init`) and, when it succeeds, keeps `cbs` for
/// [`client_key_password`]. A failed initialisation (the library already initialised) leaves
/// the pair of the one that holds. The slot's lock is held throughout, so a `client_init`
/// racing the initialisation waits for the pair rather than finding none.
pub(super) fn init_client(cbs: Option<KeyCallbacks>, init: impl FnOnce() -> c_int) -> c_int {
    // A panic cannot leave the slot half-written (it is one `Copy` value): ignore poisoning.
    let mut slot = CLIENT_KEY.lock().unwrap_or_else(PoisonError::into_inner);
    let rc = init();
    if rc == 0 {
        *slot = cbs;
    }
    rc
}

/// dlock's `prkey_pwd_cb` for a client library initialised with the reference's callbacks.
///
/// # Safety
///
/// - `buf` is valid for writing `size` bytes (dlock's contract with its callback).
/// - The reference's callbacks of the library's initialisation meet their contract (see
///   [`hand_over`]) and are still callable.
pub(super) unsafe extern "C" fn client_key_password(buf: *mut c_char, size: c_int) -> c_int {
    let cbs = *CLIENT_KEY.lock().unwrap_or_else(PoisonError::into_inner);
    match cbs {
        // SAFETY: forwarded from the caller.
        Some(cbs) => unsafe { hand_over(cbs, buf, size) },
        None => -1,
    }
}

/// Asks the reference's callback for the password, copies it into `buf` and hands the
/// application's buffer to the erase callback. Returns the length, or -1 when the callback
/// gave no password or one longer than `size` (the buffer is handed back to be wiped then too).
///
/// # Safety
///
/// - `buf` is valid for writing `size` bytes.
/// - `cbs.pwd` stores either NULL or a pointer to at least the length it stores of readable
///   bytes, which stay valid until `cbs.erase` is called on them (or for good, without one).
unsafe fn hand_over(cbs: KeyCallbacks, buf: *mut c_char, size: c_int) -> c_int {
    let mut pwd: *mut c_char = std::ptr::null_mut();
    let mut len: c_int = -1;
    // SAFETY: both out-pointers are to live locals of the types the callback writes.
    unsafe { (cbs.pwd)(&raw mut pwd, &raw mut len) };
    if pwd.is_null() || len < 0 {
        return -1;
    }
    let fits = len <= size;
    if fits {
        // SAFETY: `pwd` has `len` readable bytes (the callback's contract) and `buf` room for
        // `size >= len` (the caller's); one is the application's buffer, the other dlock's.
        unsafe { std::ptr::copy_nonoverlapping(pwd, buf, len as usize) };
    }
    if let Some(erase) = cbs.erase {
        // SAFETY: the buffer and length the password callback handed out, as the reference
        // passes them.
        unsafe { erase(pwd.cast(), len) };
    }
    if fits { len } else { -1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // The callbacks below are `unsafe extern "C"` without `no_mangle`: not exports, so
    // tests/reference_headers.rs does not look for them in the headers.
    static SECRET: [u8; 6] = *b"s3cret";
    static ERASED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn give(pwd: *mut *mut c_char, len: *mut c_int) {
        // SAFETY: out-pointers from `hand_over`; the buffer is static and never written
        // (the erase callback below only counts).
        unsafe {
            *pwd = SECRET.as_ptr().cast_mut().cast();
            *len = SECRET.len() as c_int;
        }
    }

    unsafe extern "C" fn erase(pwd: *mut std::ffi::c_void, len: c_int) {
        assert_eq!(pwd.cast_const(), SECRET.as_ptr().cast());
        assert_eq!(len, 6);
        // Relaxed: a test counter read on the same thread.
        ERASED.fetch_add(1, Ordering::Relaxed);
    }

    unsafe extern "C" fn give_nothing(pwd: *mut *mut c_char, _len: *mut c_int) {
        // SAFETY: out-pointer from `hand_over`.
        unsafe { *pwd = std::ptr::null_mut() };
    }

    #[test]
    fn the_password_is_copied_and_the_application_buffer_handed_back() {
        let cbs = KeyCallbacks {
            pwd: give,
            erase: Some(erase),
        };
        let mut buf = [0u8; 16];
        let before = ERASED.load(Ordering::Relaxed);
        // SAFETY: `buf` has 16 writable bytes; `give` meets the contract.
        let n = unsafe { hand_over(cbs, buf.as_mut_ptr().cast(), 16) };
        assert_eq!(n, 6);
        assert_eq!(&buf[..6], b"s3cret");
        assert_eq!(ERASED.load(Ordering::Relaxed), before + 1);
        // Too long for the buffer: refused, and still handed back to be wiped.
        // SAFETY: as above, with a smaller size.
        assert_eq!(unsafe { hand_over(cbs, buf.as_mut_ptr().cast(), 5) }, -1);
        assert_eq!(ERASED.load(Ordering::Relaxed), before + 2);
    }

    #[test]
    fn no_password_is_a_refusal() {
        let cbs = KeyCallbacks {
            pwd: give_nothing,
            erase: None,
        };
        let mut buf = [0u8; 4];
        // SAFETY: `buf` has 4 writable bytes; `give_nothing` meets the contract.
        assert_eq!(unsafe { hand_over(cbs, buf.as_mut_ptr().cast(), 4) }, -1);
    }

    #[test]
    fn a_server_start_sees_its_callbacks_only_while_it_runs() {
        let cbs = KeyCallbacks {
            pwd: give,
            erase: None,
        };
        let mut buf = [0u8; 8];
        let p = buf.as_mut_ptr().cast();
        // SAFETY: `buf` has 8 writable bytes; `give` meets the contract.
        let inside = with_server_key(Some(cbs), || unsafe { server_key_password(p, 8) });
        assert_eq!(inside, 6);
        // SAFETY: as above.
        assert_eq!(unsafe { server_key_password(p, 8) }, -1);
        // Another thread never sees this thread's server start.
        let p = p as usize;
        let elsewhere = with_server_key(Some(cbs), || {
            std::thread::spawn(move || {
                // SAFETY: `buf` outlives the join; nothing else writes it meanwhile.
                unsafe { server_key_password(p as *mut c_char, 8) }
            })
            .join()
            .unwrap()
        });
        assert_eq!(elsewhere, -1);
    }
}
