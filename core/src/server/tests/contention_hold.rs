//! The minimum hold of a cached grant on a lock fought over (`manager::contention::hold_ms`):
//! the one cached grant a contention window's end gives a lock still fought over is revoked by
//! the next conflict at once, while a grant on a lock quiet for longer keeps its hold.

use super::contention::{WINDOW_MS, cmd, config, events, hold, waiting};
use super::*;
use crate::Mode;
use crate::manager::GrantState;
use crate::proto::{Event, LockFlags, PROTO_VERSION_PLAIN_GRANTS};

const EX: LockOp = LockOp::TryExclusive;
const SH: LockOp = LockOp::TryShared;
const UNLOCK: LockOp = LockOp::UnlockExclusive;
const CACHE: LockFlags = LockFlags::CACHEABLE;
const PLAIN: LockFlags = LockFlags::NONE;
/// The minimum hold these tests run with (the default is none).
const HOLD_MS: u64 = 5;

/// Three clients, each with its handle of one RW lock.
type Clients = [(ClientId, LockId); 3];

/// A server with a 5-ms minimum hold and the tests' contention window, and three clients of it
/// at protocol 8 with their handles of one RW lock.
fn three_clients() -> (TestServer, Clients) {
    let mut cfg = config(WINDOW_MS as u32);
    cfg.timing.min_hold_ms = HOLD_MS as u32;
    let mut s = TestServer::new(&cfg);
    let clients = [0; 3].map(|_| {
        let c = s.client_init(PROTO_VERSION_PLAIN_GRANTS, 0, 0).unwrap();
        (
            c,
            s.get_lock(c.get(), LockKind::Rw, b"row-group", 0).unwrap(),
        )
    });
    (s, clients)
}

/// [`three_clients`], and their lock fought over at 10: a caches it at 1, b's trylock at 10
/// (the hold over) revokes it, which makes the lock contended until 30, and a gives it back
/// at 11.
fn fought_over_at_10() -> (TestServer, Clients) {
    let (mut s, clients) = three_clients();
    let [(a, la), (b, lb), _] = clients;
    assert_eq!(s.run(a, cmd(EX, la, CACHE), 1).status, Status::Success);
    assert_eq!(s.run(b, cmd(EX, lb, CACHE), 10).status, Status::Fail);
    assert_eq!(events(&s, a).len(), 1, "the conflict's revoke");
    assert_eq!(s.run(a, cmd(UNLOCK, la, PLAIN), 11).status, Status::Success);
    (s, clients)
}

#[test]
fn a_cached_grant_within_two_windows_of_a_conflict_is_revoked_inside_the_hold() {
    // Granted at the window's end and up to two windows after the conflict at 10.
    for granted in [10 + WINDOW_MS, 10 + 2 * WINDOW_MS - 1] {
        let (mut s, [(a, la), (b, lb), _]) = fought_over_at_10();
        let got = s.run(b, cmd(EX, lb, CACHE), granted);
        assert_eq!(hold(&s, b, lb), GrantState::ExclusiveCached, "{granted}");
        // The next conflict, one tick later, revokes it now instead of failing until the hold ends.
        assert_eq!(
            s.run(a, cmd(EX, la, CACHE), granted + 1).status,
            Status::Fail
        );
        let revoke = Event::Revoke {
            lock: lb,
            wanted: Mode::Exclusive,
            fence: got.aux,
        };
        assert_eq!(events(&s, b), vec![revoke], "{granted}");
        assert_eq!(s.stats().get(Counter::RevokesSent), 2, "{granted}");
        assert_eq!(
            s.stats().get(Counter::MinHoldConflicts),
            0,
            "no hold was met"
        );
    }
}

#[test]
fn a_cached_grant_on_a_lock_quiet_for_two_windows_keeps_its_hold() {
    let (mut s, [(a, la), (b, lb), _]) = fought_over_at_10();
    let granted = 10 + 2 * WINDOW_MS;
    assert_eq!(
        s.run(b, cmd(EX, lb, CACHE), granted).status,
        Status::Success
    );
    assert_eq!(hold(&s, b, lb), GrantState::ExclusiveCached);
    // A conflict inside the hold fails and sends nothing; its retry after the hold revokes.
    assert_eq!(
        s.run(a, cmd(EX, la, CACHE), granted + 1).status,
        Status::Fail
    );
    assert_eq!(events(&s, b), vec![]);
    // Its own stamp (at granted + 1, after the grant) does not waive the hold it met.
    let retry = granted + HOLD_MS - 1;
    assert_eq!(s.run(a, cmd(EX, la, CACHE), retry).status, Status::Fail);
    assert_eq!(events(&s, b), vec![]);
    assert_eq!(
        s.run(a, cmd(EX, la, CACHE), granted + HOLD_MS).status,
        Status::Fail
    );
    assert_eq!(events(&s, b).len(), 1, "revoked when the hold ends");
}

#[test]
fn a_waiter_is_retried_at_once_for_a_cached_grant_without_a_hold() {
    // a caches shared at 1; b's exclusive wait at 10 revokes it and parks (stamping 10).
    let (mut s, [(a, la), (b, lb), (c, lc)]) = three_clients();
    assert_eq!(s.run(a, cmd(SH, la, CACHE), 1).status, Status::Success);
    assert_eq!(s.wait_for(b, waiting(cmd(EX, lb, PLAIN), 50_000), 10), None);
    assert_eq!(events(&s, a).len(), 1, "the conflict's revoke");
    // After the window c is granted shared, cached, beside a's revoked grant, with b parked:
    // the lock is wanted, and b's retry revokes c's grant at once, not when a hold ends.
    let granted = 10 + WINDOW_MS;
    let got = s.run(c, cmd(SH, lc, CACHE), granted);
    assert_eq!(got.status, Status::Success);
    assert_eq!(hold(&s, c, lc), GrantState::SharedCached);
    s.poll_waiters(granted);
    let revoke = Event::Revoke {
        lock: lc,
        wanted: Mode::Exclusive,
        fence: got.aux,
    };
    assert_eq!(events(&s, c), vec![revoke]);
    assert_eq!(s.replies(), vec![], "b waits for both give-backs");
}

#[test]
fn each_request_that_meets_a_minimum_hold_is_counted_once() {
    // A lock never fought over: a's cached grant at 1 keeps its hold until 6.
    let (mut s, [(a, la), (b, lb), _]) = three_clients();
    assert_eq!(s.run(a, cmd(EX, la, CACHE), 1).status, Status::Success);
    let met = |s: &TestServer| s.stats().get(Counter::MinHoldConflicts);
    // Two trylocks inside the hold, refused: two requests that met it (a client's own retry
    // is a request of its own).
    assert_eq!(s.run(b, cmd(EX, lb, CACHE), 2).status, Status::Fail);
    assert_eq!(met(&s), 1);
    assert_eq!(s.run(b, cmd(EX, lb, CACHE), 3).status, Status::Fail);
    assert_eq!(met(&s), 2);
    // The timer sends the revoke the trylocks left due, and counts nothing.
    s.poll_waiters(1 + HOLD_MS);
    assert_eq!(events(&s, a).len(), 1, "the deferred revoke");
    assert_eq!(met(&s), 2);
    // A request after the hold waits for the give-back, not for a hold.
    assert_eq!(
        s.run(b, cmd(EX, lb, CACHE), 2 + HOLD_MS).status,
        Status::Fail
    );
    assert_eq!(met(&s), 2);
}

#[test]
fn a_parked_request_that_meets_a_minimum_hold_again_at_its_retries_is_counted_once() {
    // a and c cache shared at 1 and 2: both holds run until 7 (the lock's latest grant).
    let (mut s, [(a, la), (b, lb), (c, lc)]) = three_clients();
    assert_eq!(s.run(a, cmd(SH, la, CACHE), 1).status, Status::Success);
    assert_eq!(s.run(c, cmd(SH, lc, CACHE), 2).status, Status::Success);
    assert_eq!(hold(&s, c, lc), GrantState::SharedCached);
    let met = |s: &TestServer| s.stats().get(Counter::MinHoldConflicts);
    // b's exclusive wait meets both holds: one request, counted once.
    assert_eq!(s.wait_for(b, waiting(cmd(EX, lb, PLAIN), 50_000), 3), None);
    assert_eq!(met(&s), 1);
    // c's unlock retries b, which meets a's hold again: not counted again.
    let unlock = cmd(LockOp::UnlockShared, lc, PLAIN);
    assert_eq!(s.run(c, unlock, 4).status, Status::Success);
    assert_eq!(s.replies(), vec![], "b still waits");
    assert_eq!(met(&s), 1);
    // The hold's end retries b, which revokes a's grant: no hold met.
    s.poll_waiters(2 + HOLD_MS);
    assert_eq!(events(&s, a).len(), 1, "revoked when the hold ends");
    assert_eq!(met(&s), 1);
}

#[test]
fn a_request_granted_over_an_expired_grant_inside_its_hold_is_not_counted() {
    // a caches an atomic lock at 1 with a 2-ms lease, so its hold (until 6) outlives it: b's
    // exclusive trylock at 4 is judged inside the hold, but the word takes the expired grant
    // over and grants b — a request granted, not one that met the hold.
    let mut cfg = config(WINDOW_MS as u32);
    cfg.timing.min_hold_ms = HOLD_MS as u32;
    let mut s = TestServer::new(&cfg);
    let [(a, la), (b, lb)] = [0; 2].map(|_| {
        let c = s.client_init(PROTO_VERSION_PLAIN_GRANTS, 0, 0).unwrap();
        (c, s.get_lock(c.get(), LockKind::Atomic, b"xid", 0).unwrap())
    });
    let atomic = |lock: LockId, flags| {
        Command::Lock(LockCommand {
            kind: LockKind::Atomic,
            op: EX,
            lock: lock.raw(),
            expire_ms: 2,
            flags,
            ..LockCommand::NONE
        })
    };
    assert_eq!(s.run(a, atomic(la, CACHE), 1).status, Status::Success);
    assert_eq!(hold(&s, a, la), GrantState::ExclusiveCached);
    assert_eq!(s.run(b, atomic(lb, PLAIN), 4).status, Status::Success);
    assert_eq!(s.stats().get(Counter::MinHoldConflicts), 0);
}
