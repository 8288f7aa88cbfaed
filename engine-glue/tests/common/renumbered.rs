//! The opening of the tests of the C ABI after a renumbering failover
//! (`c_cached_renumbered.rs`, `c_cached_renumbered_batch.rs`, `c_cached_renumbered_async.rs`:
//! each its own binary, since the server and client registries are process-wide): a client
//! that will not come back holds the first lock slot, so that the replacement numbers the
//! locks afresh and gives client `c1`'s plain lock its cached lock's old id. A test that opens
//! on its own leaves [`after_a_renumbering`] unused in its binary.
#![allow(dead_code)]

use std::ffi::c_int;

use dlock_engine_glue::ffi::{cached, client, locks};

#[path = "failover.rs"]
pub mod failover;
use failover::rw_desc;

/// A first server on which a client that will not come back takes the first lock slot, and
/// client `c1` registered with it: the server's handle and port, and `c1`.
///
/// # Safety
///
/// Once per test binary, before any other C-ABI call (the registries are process-wide).
pub unsafe fn opening() -> (c_int, c_int, c_int) {
    let (mut gone, mut c1, mut filler) = (0, 0, 0);
    // SAFETY: the caller's contract; pointers to live locals, the strings outlive the calls.
    unsafe {
        let (first, port) = failover::first_server();
        // A client that will not come back takes the first lock slot.
        assert_eq!(
            client::client_init(&mut gone, failover::LOOPBACK.as_ptr()),
            0
        );
        assert_eq!(locks::get_lock(gone, &rw_desc(b"gone"), &mut filler), 0);
        assert_eq!(client::client_init(&mut c1, failover::LOOPBACK.as_ptr()), 0);
        (first, port, c1)
    }
}

/// The failover that renumbers, after [`opening`] and `c1`'s locks "cached" (id `old_cached`)
/// and "plain": the replacement gives the plain lock the cached one's old id. The
/// replacement's handle and the plain lock's id.
///
/// # Safety
///
/// After [`opening`], with `c1` its client.
pub unsafe fn renumber(first: c_int, port: c_int, c1: c_int, old_cached: c_int) -> (c_int, c_int) {
    let mut plain_id = 0;
    // SAFETY: the caller's contract; a pointer to a live local, the string outlives the call.
    unsafe {
        let second = failover::fail_over(first, port, c1);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        assert_eq!(
            plain_id, old_cached,
            "the replacement gave the plain lock the cached one's old id"
        );
        (second, plain_id)
    }
}

/// Runs `first_call(c1, plain_id)` as the client's first call after the renumbering, then
/// closes everything.
///
/// # Safety
///
/// Once per test binary, before any other C-ABI call (the registries are process-wide).
pub unsafe fn after_a_renumbering(first_call: impl FnOnce(c_int, c_int)) {
    let (mut cached_id, mut plain_id) = (0, 0);
    // SAFETY: the caller's contract; pointers to live locals, the strings outlive the calls.
    unsafe {
        let (first, port, c1) = opening();
        assert_eq!(locks::get_lock(c1, &rw_desc(b"cached"), &mut cached_id), 0);
        assert_eq!(cached::lock_cache_enable(c1, cached_id, 1), 0);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        let (second, plain_id) = renumber(first, port, c1, cached_id);
        first_call(c1, plain_id);
        failover::close(c1, second);
    }
}
