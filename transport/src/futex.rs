//! futex(2) on a 32-bit word in shared memory: sleep until the word changes, wake sleepers.
//!
//! The words live in the region, which another process may map, so the calls use the shared
//! (non-`PRIVATE`) futex operations; `*_private` serve words of this process alone (a shared
//! connection's bells, `client/mux/bell.rs`). Under loom there is no kernel: waiting yields instead, which
//! keeps the protocols' correctness (they never rely on the sleep) checkable.

use std::time::Duration;

use crate::sync::AtomicU32;

/// Sleeps while `*word == expected`, at most `timeout` (forever when `None`). Returns on a wake,
/// a timeout, a signal or a spurious wake-up alike: callers re-check their condition.
#[cfg(not(dlock_loom))]
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    sys_wait(word, libc::FUTEX_WAIT, expected, timeout);
}

/// Wakes up to `n` sleepers on `word`.
#[cfg(not(dlock_loom))]
pub fn wake(word: &AtomicU32, n: i32) {
    sys_wake(word, libc::FUTEX_WAKE, n);
}

/// [`wait`] on a word only this process uses (`FUTEX_PRIVATE_FLAG`: the kernel keys it by
/// address alone, skipping the shared mapping's lookup).
#[cfg(not(dlock_loom))]
pub(crate) fn wait_private(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    sys_wait(
        word,
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
        expected,
        timeout,
    );
}

/// [`wake`] for a word only this process uses (see [`wait_private`]).
#[cfg(not(dlock_loom))]
pub(crate) fn wake_private(word: &AtomicU32, n: i32) {
    sys_wake(word, libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, n);
}

#[cfg(not(dlock_loom))]
fn sys_wait(word: &AtomicU32, op: libc::c_int, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, 4-byte aligned atomic for the whole call (it is borrowed), which
    // is all FUTEX_WAIT reads; the timeout pointer is null or points to `ts`, alive on this frame.
    // The kernel compares the word atomically, so no Rust-level data race is possible.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, expected, ts_ptr);
    }
}

#[cfg(not(dlock_loom))]
fn sys_wake(word: &AtomicU32, op: libc::c_int, n: i32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key; `word` is alive for the call.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, n);
    }
}

/// Loom stand-in: yield instead of sleeping.
#[cfg(dlock_loom)]
pub(crate) fn wait_private(_word: &AtomicU32, _expected: u32, _timeout: Option<Duration>) {
    loom::thread::yield_now();
}

/// Loom stand-in: nothing to wake.
#[cfg(dlock_loom)]
pub(crate) fn wake_private(_word: &AtomicU32, _n: i32) {}

/// Loom stand-in: yield instead of sleeping.
#[cfg(dlock_loom)]
pub fn wait(_word: &AtomicU32, _expected: u32, _timeout: Option<Duration>) {
    loom::thread::yield_now();
}

/// Loom stand-in: nothing to wake.
#[cfg(dlock_loom)]
pub fn wake(_word: &AtomicU32, _n: i32) {}

#[cfg(all(test, not(dlock_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn a_sleeper_wakes_when_the_word_changes_and_is_woken() {
        let word = Arc::new(AtomicU32::new(0));
        let w = Arc::clone(&word);
        let sleeper = std::thread::spawn(move || {
            let start = Instant::now();
            while w.load(Ordering::Acquire) == 0 {
                wait(&w, 0, Some(Duration::from_secs(10)));
            }
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        word.store(1, Ordering::Release);
        wake(&word, 1);
        let slept = sleeper.join().unwrap();
        assert!(
            slept < Duration::from_secs(5),
            "woken, not timed out: {slept:?}"
        );
    }

    #[test]
    fn wait_on_a_changed_word_returns_at_once_and_timeouts_end_waits() {
        let word = AtomicU32::new(7);
        let start = Instant::now();
        wait(&word, 6, Some(Duration::from_secs(10)));
        wait(&word, 7, Some(Duration::from_millis(20)));
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
