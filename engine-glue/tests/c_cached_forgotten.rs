//! A C client's grant in use when its server failed over, forgotten by the client's recovery
//! (a revoked grant is never re-claimed, `manager::trust`), ends with its use: the record
//! holds nothing afterwards rather than a use nobody can end. (Its own test binary: the server
//! and client registries are process-wide.)

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;

#[test]
fn a_use_whose_grant_a_failover_forgot_ends_at_its_unlock() {
    let (mut c1, mut id1) = (0, 0);
    let name = b"orders/rg-8";
    let desc = lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_RW,
        lease_time: 0,
    };
    let mut st = lock_state::from_word(0);
    let st = (&raw mut st).cast();
    let req = |lock_id| lock_request {
        lock_id,
        lock_op: LOCK_EXCLUSIVE,
        expire_time: 60,
    };
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = failover::first_server();
        assert_eq!(client::client_init(&mut c1, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c1, &desc, &mut id1), 0);
        assert_eq!(cached::lock_cache_enable(c1, id1, 1), 0);
        assert_eq!(ops::trylock(c1, &req(id1), st), 0, "in use");

        let second = failover::fail_over(first, port, c1);
        let mut again = 0;
        assert_eq!(locks::get_lock(c1, &desc, &mut again), 0);
        assert_eq!(again, id1, "the same lock");
        assert_eq!(
            ops::unlock(c1, id1, st),
            Status::AlreadyUnlocked.code(),
            "the use ends; the grant was forgotten"
        );
        // A failover's re-claim forgets what the cache knew (ids may have changed): the engine
        // enables caching again on the id `get_lock` gave it (`dlock.h`).
        assert_eq!(cached::lock_cache_enable(c1, id1, 1), 0);
        assert_eq!(
            cached::lock_cache_release(c1, id1),
            Status::AlreadyUnlocked.code(),
            "nothing held, and no use left that nobody could end"
        );
        assert_eq!(
            ops::trylock(c1, &req(id1), st),
            0,
            "asked of the new server"
        );
        assert_eq!(ops::unlock(c1, id1, st), 0, "parked");
        assert_eq!(cached::lock_cache_release(c1, id1), 0, "given back");
        assert_eq!(client::client_deinit(c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(second), 0);
        server::dserver_lib_deinit();
    }
}
