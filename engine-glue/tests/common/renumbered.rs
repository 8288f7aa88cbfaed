//! The opening of the tests of the C ABI's calls after a renumbering failover
//! (`c_cached_renumbered_batch.rs`, `c_cached_renumbered_async.rs`: each its own binary, since
//! the server and client registries are process-wide): client `c1` cached a lock, and a
//! replacement gave its plain lock that cached lock's old id.

use std::ffi::{CString, c_int};

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, server};

#[path = "failover.rs"]
mod failover;
use failover::{client_cfg, server_cfg};

fn desc(name: &'static [u8]) -> lock_desc {
    lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_RW,
        lease_time: 0,
    }
}

/// Runs `first_call(c1, plain_id)` as the client's first call after the renumbering, then
/// closes everything.
///
/// # Safety
///
/// Once per test binary, before any other C-ABI call (the registries are process-wide).
pub unsafe fn after_a_renumbering(first_call: impl FnOnce(c_int, c_int)) {
    let (mut first, mut second, mut port) = (0, 0, 0);
    let (mut gone, mut c1) = (0, 0);
    let (mut filler, mut cached_id, mut plain_id) = (0, 0, 0);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        assert_eq!(server::dserver_lib_init(2), 0);
        assert_eq!(server::server_start(&server_cfg(-1, 0, 1), &mut first), 0);
        assert_eq!(server::server_tcp_port(first, &mut port), 0);
        assert_eq!(client::dclient_lib_init(&client_cfg(port)), 0);
        let ip = CString::new("127.0.0.1").unwrap();
        // A client that will not come back takes the first lock slot.
        assert_eq!(client::client_init(&mut gone, ip.as_ptr()), 0);
        assert_eq!(locks::get_lock(gone, &desc(b"gone"), &mut filler), 0);
        assert_eq!(client::client_init(&mut c1, ip.as_ptr()), 0);
        assert_eq!(locks::get_lock(c1, &desc(b"cached"), &mut cached_id), 0);
        assert_eq!(cached::lock_cache_enable(c1, cached_id, 1), 0);
        assert_eq!(locks::get_lock(c1, &desc(b"plain"), &mut plain_id), 0);
        let old_cached = cached_id;

        assert_eq!(server::server_stop(first), 0);
        assert_eq!(
            server::server_start(&server_cfg(port, 1, 2), &mut second),
            0
        );
        assert_eq!(client::client_reinit(c1, std::ptr::null()), 0);
        assert_eq!(locks::update_all_locks(c1), 0);
        assert_eq!(client::client_reinit_done(c1), 0);
        assert_eq!(locks::get_lock(c1, &desc(b"plain"), &mut plain_id), 0);
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
