//! The revoke notices the engine had not taken when a failover renumbered the locks name ids
//! from before: they are replaced by the one notice for every lock. Before, the cache queued
//! that notice after them, and the engine took a notice naming a lock by its old id (another
//! lock's, or none, on the replacement). (Its own test binary: the server and client
//! registries are process-wide.)

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{client, locks, ops};

#[path = "common/failover.rs"]
mod failover;
use failover::{exclusive, rw_desc};

#[test]
fn a_renumbering_replaces_the_untaken_notices_with_one_for_every_lock() {
    let (mut c1, mut c2) = (0, 0);
    let (mut plain, mut theirs) = (0, 0);
    let mut st = lock_state::from_word(0);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = failover::first_server_and_client(&mut c1);
        failover::park_cached(c1, b"cached");
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain), 0);
        // Another client asks for it: c1's calls read the revoke and give the grant back, and
        // its notice waits for the engine.
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c2, &rw_desc(b"cached"), &mut theirs), 0);
        while ops::trylock(c2, &exclusive(theirs), (&raw mut st).cast()) != 0 {
            assert_eq!(ops::trylock(c1, &exclusive(plain), (&raw mut st).cast()), 0);
            assert_eq!(ops::unlock(c1, plain, (&raw mut st).cast()), 0);
        }
        assert_eq!(ops::unlock(c2, theirs, (&raw mut st).cast()), 0);

        let second = failover::fail_over(first, port, c1);
        let (notices, n) = failover::poll_notices(c1);
        assert_eq!(
            (n, notices[0].lock_id),
            (1, DLOCK_REVOKE_ALL),
            "one notice for every lock, none by an old id"
        );
        failover::close(c1, second);
    }
}
