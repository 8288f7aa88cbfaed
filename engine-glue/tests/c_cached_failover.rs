//! A cached grant through a failover in the C ABI: the client's recovery does not re-claim a
//! grant its cache parked (its revokes may have been lost with the connection, and it may
//! have lapsed and been granted to another on the old server), and the cache stops answering
//! from it: the next `trylock` asks the replacement. (Its own test binary: the server and
//! client registries are process-wide.)

use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;
use failover::{LOOPBACK, first_server_and_client};

#[test]
fn a_parked_grant_is_not_re_claimed_nor_answered_from_after_a_failover() {
    let (mut c1, mut c2, mut id1, mut id2) = (0, 0, 0, 0);
    let name = b"orders/rg-7";
    let desc = lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_RW,
        lease_time: 0,
    };
    let mut st = lock_state::from_word(0);
    // SAFETY: `first_server_and_client` makes the binary's first C-ABI call; pointers to live
    // locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = first_server_and_client(&mut c1);
        assert_eq!(locks::get_lock(c1, &desc, &mut id1), 0);
        assert_eq!(cached::lock_cache_enable(c1, id1, 1), 0);
        let req = |lock_id| lock_request {
            lock_id,
            lock_op: LOCK_EXCLUSIVE,
            expire_time: 60,
        };
        assert_eq!(ops::trylock(c1, &req(id1), (&raw mut st).cast()), 0);
        assert_eq!(ops::unlock(c1, id1, (&raw mut st).cast()), 0, "parked");

        let second = failover::fail_over(first, port, c1);
        // The lock id is the replacement's now.
        assert_eq!(locks::get_lock(c1, &desc, &mut id1), 0);
        // Asked of the replacement, not answered from the parked grant: it holds it for c1
        // then, so another client is refused.
        assert_eq!(ops::trylock(c1, &req(id1), (&raw mut st).cast()), 0);
        assert_eq!(client::client_init(&mut c2, LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c2, &desc, &mut id2), 0);
        assert_ne!(
            ops::trylock(c2, &req(id2), (&raw mut st).cast()),
            0,
            "two holders: c1's trylock was answered from a grant nobody held"
        );
        assert_eq!(ops::unlock(c1, id1, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(c2), 0);
        assert_eq!(client::client_deinit(c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(second), 0);
        server::dserver_lib_deinit();
    }
}
