//! A cached client's wait on the server, in slices with its revokes read between them: the
//! one loop [`super::CachedLocks`]' slice length, the C ABI's `lock` and the row-group
//! worker's wait for a busy key share.
//!
//! A client that caches grants must not sit in one long wait on the server: another client may
//! be waiting for a lock this one caches, and this one gives it back only when it reads the
//! revoke. Two such clients each waiting for the lock the other caches would otherwise wait
//! until their revokes lapsed. Every cached client asks with `WAKE_ON_REVOKE`
//! ([`super::super::Client::set_wake_on_revoke`]), so a revoke sent while a slice is parked
//! on the server ends it at once; the slice only bounds how long a revoke that came just
//! before the request was parked goes unread, and each slice that runs out costs a message.

use std::time::{Duration, Instant};

/// The longest a cached client waits on the server before it reads its revokes again.
pub const WAIT_SLICE: Duration = Duration::from_millis(20);

/// Waits until `deadline` in slices of at most [`WAIT_SLICE`]: `attempt(cx, slice)` asks the
/// server once; when it reports that its slice ran out (`ran_out`) and time is left,
/// `between(cx)` reads and answers the revokes, and it asks again. Returns the first answer
/// that is not a slice running out, or the last one at the deadline. `cx` is what both need
/// (the client and its cache).
pub fn wait_sliced<X: ?Sized, T, E>(
    cx: &mut X,
    deadline: Instant,
    mut between: impl FnMut(&mut X) -> Result<(), E>,
    mut attempt: impl FnMut(&mut X, Duration) -> Result<T, E>,
    ran_out: impl Fn(&E) -> bool,
) -> Result<T, E> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match attempt(cx, left.min(WAIT_SLICE)) {
            Err(e) if ran_out(&e) && Instant::now() < deadline => between(cx)?,
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_that_run_out_are_asked_again_with_the_revokes_read_between() {
        // (asked, looked)
        let mut n = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(3_600);
        let got = wait_sliced(
            &mut n,
            deadline,
            |n| {
                n.1 += 1;
                Ok::<(), &str>(())
            },
            |n, slice| {
                assert!(slice <= WAIT_SLICE);
                n.0 += 1;
                if n.0 < 3 { Err("ran out") } else { Ok(n.0) }
            },
            |e| *e == "ran out",
        );
        assert_eq!((got, n.1), (Ok(3), 2));
        let busy = |_: &mut (), _| Err::<(), _>("busy");
        let refused = wait_sliced(&mut (), deadline, |_| Ok(()), busy, |e| *e == "ran out");
        assert_eq!(refused, Err("busy"), "anything else ends the wait");
        let past = Instant::now();
        let never = |_: &mut ()| panic!("no time left");
        let last = wait_sliced(&mut (), past, never, |_, s| Err::<(), _>(s), |_| true);
        assert_eq!(last, Err(Duration::ZERO), "the deadline's answer");
    }
}
