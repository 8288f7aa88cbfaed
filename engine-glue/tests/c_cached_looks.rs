//! A C client with nothing parked or owed leaves its look at the events for later while its
//! trust bound holds (over TCP a look is a `recv`), and looks at every call again once a grant
//! is cached, so a revoke of it still comes and is acted on. (Its own test binary: the server
//! and client registries are process-wide.)

use std::ffi::c_int;
use std::time::{Duration, Instant};

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{cached, client, locks, ops};

#[path = "common/failover.rs"]
mod failover;

const FAIL: i32 = Status::Fail.code();

/// c2 asks for the lock c1 parks (refused: the server revokes c1's grant), c1 polls until the
/// revoke came and the grant went back, and c2 then takes the lock and lets it go.
///
/// # Safety
///
/// `c1` and `c2` are live clients, `id1` and `id2` their references to one lock.
unsafe fn revoked(c1: c_int, id1: c_int, c2: c_int, id2: c_int) {
    let mut st = lock_state::from_word(0);
    // SAFETY: the caller's contract; pointers to live locals of the right types.
    unsafe {
        assert_eq!(
            ops::trylock(c2, &failover::exclusive(id2), (&raw mut st).cast()),
            FAIL
        );
        let until = Instant::now() + Duration::from_secs(10);
        let (out, _) = loop {
            let (out, n) = failover::poll_notices(c1);
            if n > 0 {
                break (out, n);
            }
            assert!(Instant::now() < until, "no revoke came");
        };
        assert_eq!((out[0].lock_id, out[0].wanted_op), (id1, LOCK_EXCLUSIVE));
        assert_eq!(
            ops::trylock(c2, &failover::exclusive(id2), (&raw mut st).cast()),
            0,
            "given back"
        );
        assert_eq!(ops::unlock(c2, id2, (&raw mut st).cast()), 0);
    }
}

#[test]
fn a_client_with_nothing_parked_does_not_look_at_its_events_until_it_parks() {
    let (mut c1, mut c2) = (0, 0);
    let (page, row) = (b"orders/rg-1", b"orders/rg-2");
    let mut st = lock_state::from_word(0);
    let (mut page2, [mut row1, mut row2]) = (0, [0; 2]);
    // SAFETY: pointers to live locals of the right types; the strings outlive the calls.
    unsafe {
        let (s, _) = failover::first_server();
        assert_eq!(client::client_init(&mut c1, failover::LOOPBACK.as_ptr()), 0);
        assert_eq!(client::client_init(&mut c2, failover::LOOPBACK.as_ptr()), 0);
        // The page is parked, then revoked and given back: c1 holds nothing.
        let page1 = failover::park_cached(c1, page);
        assert_eq!(locks::get_lock(c2, &failover::rw_desc(page), &mut page2), 0);
        assert_eq!(locks::get_lock(c1, &failover::rw_desc(row), &mut row1), 0);
        assert_eq!(locks::get_lock(c2, &failover::rw_desc(row), &mut row2), 0);
        assert_eq!(cached::lock_cache_enable(c1, row1, 1), 0);
        revoked(c1, page1, c2, page2);

        let looks = cached::event_looks(c1).expect("a client");
        assert_eq!(
            ops::trylock(c1, &failover::exclusive(row1), (&raw mut st).cast()),
            0
        );
        assert_eq!(
            cached::event_looks(c1),
            Some(looks),
            "nothing parked: no look"
        );
        // The row is in use: its unlock looks, and parks it.
        assert_eq!(ops::unlock(c1, row1, (&raw mut st).cast()), 0);
        assert_eq!(cached::event_looks(c1), Some(looks + 1), "a look");
        // The row's revoke still comes, and the row goes back.
        revoked(c1, row1, c2, row2);

        assert_eq!(client::client_deinit(c2), 0);
        failover::close(c1, s);
    }
}
