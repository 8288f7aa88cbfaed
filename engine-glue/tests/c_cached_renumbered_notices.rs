//! The revoke notices the engine had not taken when a failover renumbered the locks name ids
//! from before: they are replaced by the one notice for every lock. Before, the cache queued
//! that notice after them, and the engine took a notice naming a lock by its old id (another
//! lock's, or none, on the replacement). (Its own test binary: the server and client
//! registries are process-wide.)

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;
use failover::rw_desc;

#[test]
fn a_renumbering_replaces_the_untaken_notices_with_one_for_every_lock() {
    let (mut c1, mut c2) = (0, 0);
    let (mut id, mut plain, mut theirs) = (0, 0, 0);
    let mut st = lock_state::from_word(0);
    let req = |lock_id| lock_request {
        lock_id,
        lock_op: LOCK_EXCLUSIVE,
        expire_time: 60,
    };
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = failover::first_server();
        assert_eq!(client::client_init(&mut c1, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"cached"), &mut id), 0);
        assert_eq!(locks::get_lock(c1, &rw_desc(b"plain"), &mut plain), 0);
        assert_eq!(cached::lock_cache_enable(c1, id, 1), 0);
        assert_eq!(ops::trylock(c1, &req(id), (&raw mut st).cast()), 0);
        assert_eq!(ops::unlock(c1, id, (&raw mut st).cast()), 0, "parked");
        // Another client asks for it: c1's calls read the revoke and give the grant back, and
        // its notice waits for the engine.
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c2, &rw_desc(b"cached"), &mut theirs), 0);
        while ops::trylock(c2, &req(theirs), (&raw mut st).cast()) != 0 {
            assert_eq!(ops::trylock(c1, &req(plain), (&raw mut st).cast()), 0);
            assert_eq!(ops::unlock(c1, plain, (&raw mut st).cast()), 0);
        }
        assert_eq!(ops::unlock(c2, theirs, (&raw mut st).cast()), 0);

        let second = failover::fail_over(first, port, c1);
        let mut notices = [dlock_revoke::default(); 4];
        let mut n = 0;
        assert_eq!(
            cached::client_revokes_poll(c1, notices.as_mut_ptr(), 4, &mut n),
            0
        );
        assert_eq!(
            (n, notices[0].lock_id),
            (1, DLOCK_REVOKE_ALL),
            "one notice for every lock, none by an old id"
        );
        assert_eq!(client::client_deinit(c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(second), 0);
        server::dserver_lib_deinit();
    }
}
