//! The opening of the tests of the C ABI's calls after a renumbering failover
//! (`c_cached_renumbered_batch.rs`, `c_cached_renumbered_async.rs`: each its own binary, since
//! the server and client registries are process-wide): client `c1` cached a lock, and a
//! replacement gave its plain lock that cached lock's old id.

use std::ffi::c_int;

use dlock_engine_glue::ffi::{cached, client, locks, server};

#[path = "failover.rs"]
mod failover;
use failover::rw_desc;

/// Runs `first_call(c1, plain_id)` as the client's first call after the renumbering, then
/// closes everything.
///
/// # Safety
///
/// Once per test binary, before any other C-ABI call (the registries are process-wide).
pub unsafe fn after_a_renumbering(first_call: impl FnOnce(c_int, c_int)) {
    let (mut gone, mut c1) = (0, 0);
    let (mut filler, mut cached_id, mut plain_id) = (0, 0, 0);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = failover::first_server();
        // A client that will not come back takes the first lock slot.
        assert_eq!(
            client::client_init(&mut gone, failover::LOOPBACK.as_ptr()),
            0
        );
        assert_eq!(locks::get_lock(gone, &rw_desc(b"gone"), &mut filler), 0);
        assert_eq!(client::client_init(&mut c1, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"cached"), &mut cached_id), 0);
        assert_eq!(cached::lock_cache_enable(c1, cached_id, 1), 0);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        let old_cached = cached_id;

        let second = failover::fail_over(first, port, c1);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        assert_eq!(
            plain_id, old_cached,
            "the replacement gave the plain lock the cached one's old id"
        );
        first_call(c1, plain_id);
        assert_eq!(client::client_deinit(c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(second), 0);
        server::dserver_lib_deinit();
    }
}
