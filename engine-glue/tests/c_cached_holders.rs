//! A C client's cached grant never covers a holder the server does not: a use reading under a
//! parked exclusive grant that goes on to write keeps the grant exclusive until it is done, and
//! a trylock with no lease (answered with nothing sent) is no grant.
//! (Its own test binary: the server and client registries are process-wide.)

use std::ffi::c_int;

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;

const FAIL: i32 = Status::Fail.code();
const ALREADY_LOCKED: i32 = Status::AlreadyLocked.code();

fn req(lock_id: c_int, lock_op: c_int, expire_time: u32) -> lock_request {
    lock_request {
        lock_id,
        lock_op,
        expire_time,
    }
}

/// Two clients of one server, each with a reference to lock `name`.
struct Pair {
    c1: c_int,
    c2: c_int,
    id1: c_int,
    id2: c_int,
}

/// A reader under c1's parked exclusive grant goes on to write (`ALREADY_LOCKED`: it holds it
/// exclusive); c2's read is refused until that use ends, and then the grant goes shared.
///
/// # Safety
///
/// The clients and locks of `p` are live.
unsafe fn a_reader_that_writes_under_a_parked_exclusive_grant_keeps_it_exclusive(p: &Pair) {
    let mut st = lock_state::from_word(0);
    let st = (&raw mut st).cast();
    let (mut out, mut n) = ([dlock_revoke::default(); 8], 0);
    // SAFETY: live clients, pointers to live locals (caller's contract).
    unsafe {
        assert_eq!(cached::lock_cache_enable(p.c1, p.id1, 1), 0);
        assert_eq!(ops::trylock(p.c1, &req(p.id1, LOCK_EXCLUSIVE, 60), st), 0);
        assert_eq!(ops::unlock(p.c1, p.id1, st), 0, "parked exclusive");
        assert_eq!(
            ops::trylock(p.c1, &req(p.id1, LOCK_SHARED, 60), st),
            0,
            "read from it"
        );
        assert_eq!(
            ops::trylock(p.c1, &req(p.id1, LOCK_EXCLUSIVE, 60), st),
            ALREADY_LOCKED,
            "the reader writes: it holds the lock exclusive"
        );
        // c2's read is refused (the server revokes c1's grant for shared) ...
        assert_eq!(ops::trylock(p.c2, &req(p.id2, LOCK_SHARED, 60), st), FAIL);
        assert_eq!(
            cached::client_revokes_poll(p.c1, out.as_mut_ptr(), 8, &mut n),
            0
        );
        assert_eq!(n, 1, "c1 is told");
        // ... and stays refused while c1 writes: no downgrade under the writer.
        assert_eq!(
            ops::trylock(p.c2, &req(p.id2, LOCK_SHARED, 60), st),
            FAIL,
            "a reader beside c1's writer"
        );
        assert_eq!(
            ops::unlock(p.c1, p.id1, st),
            ALREADY_LOCKED,
            "the write ends"
        );
        assert_eq!(ops::unlock(p.c1, p.id1, st), 0, "the use ends: downgraded");
        assert_eq!(ops::trylock(p.c2, &req(p.id2, LOCK_SHARED, 60), st), 0);
        assert_eq!(ops::unlock(p.c2, p.id2, st), 0);
        assert_eq!(cached::lock_cache_enable(p.c1, p.id1, 0), 0);
    }
}

/// A trylock with no lease (the reference's "read the cache", answered with nothing sent) on
/// a cache-enabled lock is no grant: c1's later exclusive request goes to the server, which
/// refuses it while c2 reads.
///
/// # Safety
///
/// The clients and locks of `p` are live.
unsafe fn a_trylock_with_no_lease_caches_no_grant(p: &Pair) {
    let mut st = lock_state::from_word(0);
    let st = (&raw mut st).cast();
    // SAFETY: live clients, pointers to live locals (caller's contract).
    unsafe {
        assert_eq!(cached::lock_cache_enable(p.c1, p.id1, 1), 0);
        assert_eq!(
            ops::trylock(p.c1, &req(p.id1, LOCK_EXCLUSIVE, 0), st),
            0,
            "a read"
        );
        assert_eq!(ops::unlock(p.c1, p.id1, st), Status::AlreadyUnlocked.code());
        assert_eq!(ops::trylock(p.c1, &req(p.id1, LOCK_SHARED, 60), st), 0);
        assert_eq!(ops::unlock(p.c1, p.id1, st), 0, "parked shared");
        assert_eq!(ops::trylock(p.c2, &req(p.id2, LOCK_SHARED, 60), st), 0);
        assert_eq!(
            ops::trylock(p.c1, &req(p.id1, LOCK_EXCLUSIVE, 60), st),
            FAIL,
            "c2 reads: c1's exclusive request is the server's to refuse"
        );
        assert_eq!(ops::unlock(p.c2, p.id2, st), 0);
        assert_eq!(cached::lock_cache_enable(p.c1, p.id1, 0), 0);
    }
}

#[test]
fn a_cached_grant_covers_no_holder_the_server_does_not() {
    let mut p = Pair {
        c1: 0,
        c2: 0,
        id1: 0,
        id2: 0,
    };
    let name = b"orders/rg-12";
    let desc = lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_RW,
        lease_time: 0,
    };
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (s, _) = failover::first_server();
        assert_eq!(
            client::client_init(&mut p.c1, failover::LOOPBACK.as_ptr()),
            0
        );
        assert_eq!(
            client::client_init(&mut p.c2, failover::LOOPBACK.as_ptr()),
            0
        );
        assert_eq!(locks::get_lock(p.c1, &desc, &mut p.id1), 0);
        assert_eq!(locks::get_lock(p.c2, &desc, &mut p.id2), 0);

        a_reader_that_writes_under_a_parked_exclusive_grant_keeps_it_exclusive(&p);
        a_trylock_with_no_lease_caches_no_grant(&p);

        assert_eq!(client::client_deinit(p.c2), 0);
        assert_eq!(client::client_deinit(p.c1), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(s), 0);
        server::dserver_lib_deinit();
    }
}
