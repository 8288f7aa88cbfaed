//! A lock taken after a renumbering failover and before caching is enabled on it again is a
//! plain grant. The cache forgets every lock at a renumbering (its ids name other locks now),
//! but the client's records kept asking for cacheable grants: the engine's first trylock under
//! the new id was granted cacheable on the server, with no cache entry to hear its revoke, so
//! the server gave the lock to another client at the revoke timeout while the use went on.
//! (Its own test binary: the server and client registries are process-wide.)

use std::time::{Duration, Instant};

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;
use failover::{exclusive as req, rw_desc, server_cfg};

/// The replacement's client lease, and so the revoke timeout of a grant it revokes: short, so
/// that the test outlives it, and long beside c1's heartbeats every few milliseconds.
const LEASE_MS: u32 = 1_000;

#[test]
fn a_lock_taken_before_caching_is_enabled_again_is_not_revoked() {
    let mut second = 0;
    let (mut c1, mut c2) = (0, 0);
    let mut theirs = 0;
    let mut st = lock_state::from_word(0);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = failover::first_server_and_client(&mut c1);
        let mut id = failover::park_cached(c1, b"cached");

        assert_eq!(server::server_stop(first), 0);
        let cfg = server_cfg {
            client_lease_ms: LEASE_MS,
            ..server_cfg(port, 1, 2)
        };
        assert_eq!(server::server_start(&cfg, &mut second), 0);
        assert_eq!(client::client_reinit(c1, std::ptr::null()), 0);
        assert_eq!(locks::update_all_locks(c1), 0);
        assert_eq!(client::client_reinit_done(c1), 0);
        // The engine takes the lock by name and uses it before enabling caching again.
        assert_eq!(locks::get_lock(c1, &rw_desc(b"cached"), &mut id), 0);
        assert_eq!(ops::trylock(c1, &req(id), (&raw mut st).cast()), 0);
        assert_eq!(
            cached::lock_cache_enable(c1, id, 1),
            Status::Einval.code(),
            "in use"
        );

        // Another client asks for it for over two revoke timeouts while c1 keeps its lease
        // (a heartbeat every few milliseconds) and goes on using it.
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c2, &rw_desc(b"cached"), &mut theirs), 0);
        let until = Instant::now() + Duration::from_millis(u64::from(LEASE_MS) * 5 / 2);
        while Instant::now() < until {
            assert_ne!(
                ops::trylock(c2, &req(theirs), (&raw mut st).cast()),
                0,
                "two holders: the server took back a grant it was never told was plain"
            );
            assert_eq!(client::client_heartbeat(c1, 1), 0);
            failover::poll_notices(c1);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(ops::unlock(c1, id, (&raw mut st).cast()), 0);
        assert_eq!(ops::trylock(c2, &req(theirs), (&raw mut st).cast()), 0);
        assert_eq!(ops::unlock(c2, theirs, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(c2), 0);
        failover::close(c1, second);
    }
}
