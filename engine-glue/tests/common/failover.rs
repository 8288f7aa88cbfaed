//! The configurations the C-ABI failover tests share (`c_recovery.rs`, `c_cached_failover.rs`:
//! each its own binary, since the server and client registries are process-wide): a small
//! plaintext server on the loopback that can stand in for a failed one, and a client of it.
//! Tests that open differently (`c_cached_giveback.rs`, `c_cached_renumbered_plain.rs`) take
//! only what they need, so the rest goes unused in their binaries. The steps the renumbering
//! tests repeat are here too: an exclusive request, a cached grant parked, the notices read,
//! the closing.
#![allow(dead_code)]

use std::ffi::{CStr, c_int, c_uint};

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

/// The loopback address every server here listens on, for `client_init`.
pub const LOOPBACK: &CStr = c"127.0.0.1";

/// The opening of a failover test: both C libraries initialised, a first server on a free
/// loopback port (epoch 1, waiting for no one), and client `c` registered with it. The
/// server's handle and port.
///
/// # Safety
///
/// Once per test binary, before any other C-ABI call (the registries are process-wide).
pub unsafe fn first_server_and_client(c: &mut c_int) -> (c_int, c_int) {
    // SAFETY: the caller's contract; a pointer to a live local and a static string.
    unsafe {
        let (first, port) = first_server();
        assert_eq!(client::client_init(c, LOOPBACK.as_ptr()), 0);
        (first, port)
    }
}

/// Both C libraries initialised and a first server on a free loopback port (epoch 1, waiting
/// for no one), the client library pointed at it: the server's handle and port.
///
/// # Safety
///
/// Once per test binary, before any other C-ABI call (the registries are process-wide).
pub unsafe fn first_server() -> (c_int, c_int) {
    let (mut first, mut port) = (0, 0);
    // SAFETY: pointers to live locals of the right types.
    unsafe {
        assert_eq!(server::dserver_lib_init(2), 0);
        assert_eq!(server::server_start(&server_cfg(-1, 0, 1), &mut first), 0);
        assert_eq!(server::server_tcp_port(first, &mut port), 0);
        assert_eq!(client::dclient_lib_init(&client_cfg(port)), 0);
    }
    (first, port)
}

/// The failover these tests make: `first` stops, a replacement starts on `port` at epoch 2
/// waiting for one client, and client `c` re-syncs with it (`client_reinit`,
/// `update_all_locks`, `client_reinit_done`). The replacement's handle.
///
/// # Safety
///
/// After [`first_server`], with `c` registered with it.
pub unsafe fn fail_over(first: c_int, port: c_int, c: c_int) -> c_int {
    let mut second = 0;
    // SAFETY: a pointer to a live local; a null address means "the same server".
    unsafe {
        assert_eq!(server::server_stop(first), 0);
        assert_eq!(
            server::server_start(&server_cfg(port, 1, 2), &mut second),
            0
        );
        assert_eq!(client::client_reinit(c, std::ptr::null()), 0);
        assert_eq!(dlock_engine_glue::ffi::locks::update_all_locks(c), 0);
        assert_eq!(client::client_reinit_done(c), 0);
    }
    second
}

/// The closing of a failover test: client `c` deregistered, the client library shut down,
/// server `second` stopped and the server library shut down: once, at the end of the test.
pub fn close(c: c_int, second: c_int) {
    assert_eq!(client::client_deinit(c), 0);
    client::dclient_lib_deinit();
    assert_eq!(server::server_stop(second), 0);
    server::dserver_lib_deinit();
}

/// An exclusive request for lock `lock_id`, for 60 s.
pub fn exclusive(lock_id: c_int) -> lock_request {
    lock_request {
        lock_id,
        lock_op: LOCK_EXCLUSIVE,
        expire_time: 60,
    }
}

/// Client `c` takes RW lock `name` with caching on and ends its use, so that the grant stays
/// parked in the cache: the lock's id.
///
/// # Safety
///
/// With `c` registered with a running server.
pub unsafe fn park_cached(c: c_int, name: &'static [u8]) -> c_int {
    let (mut id, mut st) = (0, lock_state::from_word(0));
    // SAFETY: the caller's contract; pointers to live locals of the right types.
    unsafe {
        assert_eq!(locks::get_lock(c, &rw_desc(name), &mut id), 0);
        assert_eq!(cached::lock_cache_enable(c, id, 1), 0);
        assert_eq!(ops::trylock(c, &exclusive(id), (&raw mut st).cast()), 0);
        assert_eq!(ops::unlock(c, id, (&raw mut st).cast()), 0, "parked");
    }
    id
}

/// The revoke notices waiting for client `c` (room for 4), and how many were written.
///
/// # Safety
///
/// With `c` registered.
pub unsafe fn poll_notices(c: c_int) -> ([dlock_revoke; 4], c_uint) {
    let mut notices = [dlock_revoke::default(); 4];
    let mut n = 0;
    // SAFETY: the caller's contract; the array and the count are live locals.
    unsafe {
        assert_eq!(
            cached::client_revokes_poll(c, notices.as_mut_ptr(), 4, &mut n),
            0
        );
    }
    (notices, n)
}

/// An RW lock named `name`, with the server's lease.
pub fn rw_desc(name: &'static [u8]) -> lock_desc {
    lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_RW,
        lease_time: 0,
    }
}

/// A primary on the loopback at `port` (`-1`: any free one) with room for a few locks and
/// clients, waiting for `recovery_client_num` clients to re-sync (0: a first server), at
/// `epoch`; recovery without a session key is allowed when it waits for anyone.
pub fn server_cfg(port: c_int, recovery_client_num: u32, epoch: u32) -> server_cfg {
    server_cfg {
        r#type: SERVER_PRIMARY,
        log_level: 0,
        sleep_mode_enable: 1,
        primary: primary_cfg {
            num_of_replica: 0,
            recovery_client_num,
            ctrl_cpuset: std::ptr::null(),
            cmd_cpuset: std::ptr::null(),
            server_ip_str: c"127.0.0.1".as_ptr(),
            server_port: port,
            replica_port: 0,
            replica_enable: 0,
        },
        locks_max: 64,
        clients_max: 8,
        objects_max: 4,
        client_lease_ms: 0,
        client_lease_max_ms: 0,
        epoch,
        shm_name: std::ptr::null(),
        ssl: ssl_cfg::DISABLED,
        insecure_plaintext: 0,
        session_key_file: std::ptr::null(),
        insecure_recovery: u8::from(recovery_client_num > 0),
        recoverer_local: 0,
        cluster: cluster_cfg::STANDALONE,
    }
}

/// A plaintext client of the server at `port` on the loopback, with a 2-s timeout.
pub fn client_cfg(port: c_int) -> client_cfg {
    client_cfg {
        log_level: 0,
        primary_port: port,
        lease_ms: 0,
        timeout_ms: 2_000,
        ssl: ssl_cfg::DISABLED,
    }
}
