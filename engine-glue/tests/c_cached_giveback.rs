//! A give-back of a cached grant in the C ABI that does not reach the server is owed, not
//! forgotten: the library sends it again at the client's next call, so the server does not go
//! on holding a grant the engine was told it gave back (the rule is `CachedLock`'s: a give-back
//! not answered is sent again). (Its own test binary: the server and client registries are
//! process-wide.)

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::types::*;

const FAIL: i32 = Status::Fail.code();
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;

#[test]
fn a_give_back_that_could_not_be_sent_is_sent_again_at_the_next_call() {
    let (mut c1, mut c2) = (0, 0);
    let desc_of = |name: &'static [u8]| lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_RW,
        lease_time: 0,
    };
    let desc = desc_of(b"orders/rg-9");
    let mut st = lock_state::from_word(0);
    let req = |lock_id| lock_request {
        lock_id,
        lock_op: LOCK_EXCLUSIVE,
        expire_time: 60,
    };
    // c1 and c2 open the lock `desc`; c1 caches it, takes it and parks it, and loses its data
    // connection, so a give-back cannot be sent.
    let parked_then_cut = |c1, c2, desc: &lock_desc| {
        let (mut id1, mut id2) = (0, 0);
        let mut st = lock_state::from_word(0);
        // SAFETY: pointers to live locals of the right types; `desc`'s name outlives the calls.
        unsafe {
            assert_eq!(locks::get_lock(c1, desc, &mut id1), 0);
            assert_eq!(locks::get_lock(c2, desc, &mut id2), 0);
            assert_eq!(cached::lock_cache_enable(c1, id1, 1), 0);
            assert_eq!(ops::trylock(c1, &req(id1), (&raw mut st).cast()), 0);
            assert_eq!(ops::unlock(c1, id1, (&raw mut st).cast()), 0, "parked");
            assert_eq!(client::drop_data_path(c1), 0);
        }
        (id1, id2)
    };
    let (mut out, mut n) = ([dlock_revoke::default(); 8], 0);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (s, _) = failover::first_server();
        assert_eq!(client::client_init(&mut c1, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        let (id1, id2) = parked_then_cut(c1, c2, &desc);

        // The give-back's unlock cannot be sent: the data connection is gone.
        assert_eq!(
            cached::lock_cache_release(c1, id1),
            Status::BadResponse.code(),
            "not given back: owed, and the engine told why"
        );
        assert_eq!(client::client_reinit(c1, std::ptr::null()), 0);
        // The same server, still serving: it holds the grant for c1 yet, and revokes it.
        assert_eq!(ops::trylock(c2, &req(id2), (&raw mut st).cast()), FAIL);
        // c1's next call sends the owed give-back.
        assert_eq!(
            cached::client_revokes_poll(c1, out.as_mut_ptr(), 8, &mut n),
            0
        );
        assert_eq!(
            ops::trylock(c2, &req(id2), (&raw mut st).cast()),
            0,
            "the server still held the grant c1 gave back"
        );
        assert_eq!(
            ops::trylock(c1, &req(id1), (&raw mut st).cast()),
            FAIL,
            "c1 holds nothing: it asks, and c2 has it"
        );
        assert_eq!(ops::unlock(c2, id2, (&raw mut st).cast()), 0);

        // release_lock's give-back of a parked grant: its failure is the answer, and it is
        // sent again at the next call. On a lock nobody fought over yet: the first one is
        // contended now (the server's default contention window), so a grant of it would be
        // plain, and its unlock would give it back at once.
        let desc = desc_of(b"orders/rg-10");
        let (id1, id2) = parked_then_cut(c1, c2, &desc);
        assert_eq!(
            locks::release_lock(c1, id1),
            Status::BadResponse.code(),
            "not given back: the reference stays, and the engine is told why"
        );
        assert_eq!(client::client_reinit(c1, std::ptr::null()), 0);
        assert_eq!(locks::release_lock(c1, id1), 0, "given back, then released");
        assert_eq!(
            ops::trylock(c2, &req(id2), (&raw mut st).cast()),
            0,
            "the server no longer holds it for c1"
        );
        assert_eq!(ops::unlock(c2, id2, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(c2), 0);
        assert_eq!(client::client_deinit(c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(s), 0);
        server::dserver_lib_deinit();
    }
}
