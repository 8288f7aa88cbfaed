//! A failover that renumbers locks, in the C ABI's cache: the replacement numbers locks afresh
//! (here a lock of a client that does not come back held a slot on the failed server), so an
//! id the cache kept from before names another lock of the client. The cache must not act on
//! that other lock: before, the overflow the failover brings gave back a parked grant by its
//! old id — unlocking the client's *other* lock, re-claimed plain and still in use. (Its own
//! test binary: the server and client registries are process-wide.)

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops};

#[path = "common/renumbered.rs"]
mod renumbered;
use renumbered::failover::{self, exclusive, rw_desc};

#[test]
fn a_renumbering_failover_leaves_the_clients_other_locks_alone() {
    let mut c2 = 0;
    let (mut plain_id, mut theirs) = (0, 0);
    let mut st = lock_state::from_word(0);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port, c1) = renumbered::opening();
        let cached_id = failover::park_cached(c1, b"cached");
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain_id), 0);
        assert_eq!(
            ops::trylock(c1, &exclusive(plain_id), (&raw mut st).cast()),
            0
        );

        let (second, plain_id) = renumbered::renumber(first, port, c1, cached_id);
        // The failover's overflow is read here.
        let (notices, n) = failover::poll_notices(c1);
        // Told: every cached lock was revoked.
        assert_eq!(
            (n, notices[0].lock_id),
            (1, DLOCK_REVOKE_ALL),
            "one notice for every lock"
        );
        // Caching enabled again under the new id stays enabled: parked at its unlock.
        let cached_id = failover::park_cached(c1, b"cached");
        assert_eq!(
            cached::lock_cache_release(c1, cached_id),
            0,
            "it was parked"
        );
        // c1 still holds the plain lock: another client is refused it.
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c2, &rw_desc(b"plain"), &mut theirs), 0);
        assert_ne!(
            ops::trylock(c2, &exclusive(theirs), (&raw mut st).cast()),
            0,
            "two holders: the cache gave back c1's plain lock by a stale id"
        );
        assert_eq!(ops::unlock(c1, plain_id, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(c2), 0);
        failover::close(c1, second);
    }
}
