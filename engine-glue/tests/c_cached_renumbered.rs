//! A failover that renumbers locks, in the C ABI's cache: the replacement numbers locks afresh
//! (here a lock of a client that does not come back held a slot on the failed server), so an
//! id the cache kept from before names another lock of the client. The cache must not act on
//! that other lock: before, the overflow the failover brings gave back a parked grant by its
//! old id — unlocking the client's *other* lock, re-claimed plain and still in use. (Its own
//! test binary: the server and client registries are process-wide.)

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;
use failover::rw_desc;

#[test]
fn a_renumbering_failover_leaves_the_clients_other_locks_alone() {
    let (mut gone, mut c1, mut c2) = (0, 0, 0);
    let (mut filler, mut cached_id, mut plain_id, mut theirs) = (0, 0, 0, 0);
    let mut st = lock_state::from_word(0);
    let req = |lock_id| lock_request {
        lock_id,
        lock_op: LOCK_EXCLUSIVE,
        expire_time: 60,
    };
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
        assert_eq!(ops::trylock(c1, &req(cached_id), (&raw mut st).cast()), 0);
        assert_eq!(
            ops::unlock(c1, cached_id, (&raw mut st).cast()),
            0,
            "parked"
        );
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        assert_eq!(ops::trylock(c1, &req(plain_id), (&raw mut st).cast()), 0);
        let old_cached = cached_id;

        let second = failover::fail_over(first, port, c1);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        assert_eq!(
            plain_id, old_cached,
            "the replacement gave the plain lock the cached one's old id"
        );
        // The failover's overflow is read here.
        let mut notices = [dlock_revoke::default(); 4];
        let mut n = 0;
        assert_eq!(
            cached::client_revokes_poll(c1, notices.as_mut_ptr(), 4, &mut n),
            0
        );
        // Told: every cached lock was revoked.
        assert_eq!(
            (n, notices[0].lock_id),
            (1, DLOCK_REVOKE_ALL),
            "one notice for every lock"
        );
        // Caching enabled again under the new id stays enabled: parked at its unlock.
        assert_eq!(locks::get_lock(c1, &rw_desc(b"cached"), &mut cached_id), 0);
        assert_eq!(cached::lock_cache_enable(c1, cached_id, 1), 0);
        assert_eq!(ops::trylock(c1, &req(cached_id), (&raw mut st).cast()), 0);
        assert_eq!(ops::unlock(c1, cached_id, (&raw mut st).cast()), 0);
        assert_eq!(
            cached::lock_cache_release(c1, cached_id),
            0,
            "it was parked"
        );
        // c1 still holds the plain lock: another client is refused it.
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c2, &rw_desc(b"plain"), &mut theirs), 0);
        assert_ne!(
            ops::trylock(c2, &req(theirs), (&raw mut st).cast()),
            0,
            "two holders: the cache gave back c1's plain lock by a stale id"
        );
        assert_eq!(ops::unlock(c1, plain_id, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(c2), 0);
        assert_eq!(client::client_deinit(c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(second), 0);
        server::dserver_lib_deinit();
    }
}
