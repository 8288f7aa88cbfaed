//! Cached grants and revocation in the data path (`server/revokes.rs`): a conflicting request
//! revokes each cached holder once through its event ring, waits or fails at once, honours the
//! minimum hold, and takes the lock when the last holder gives it back or its revoke lapses.

use super::*;
use crate::Mode;
use crate::manager::GrantState;
use crate::proto::{Event, LockFlags, PROTO_VERSION, PROTO_VERSION_REVOKE_TIMEOUT};

/// Long enough that no atomic grant expires during a test.
const LEASE: u32 = 60_000;

fn cmd(kind: LockKind, op: LockOp, id: LockId, wait_ms: u32, flags: LockFlags) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms: LEASE,
        wait_ms,
        flags,
        ..LockCommand::NONE
    })
}

fn cached(kind: LockKind, op: LockOp, id: LockId) -> Command {
    cmd(kind, op, id, 0, LockFlags::CACHEABLE)
}

/// Two clients with ids of one lock `name` of `kind`.
fn pair(s: &mut TestServer, kind: LockKind) -> (ClientId, ClientId, LockId, LockId) {
    let (a, b) = (s.client(0), s.client(0));
    let la = s.get_lock(a.get(), kind, b"row-group", 0).unwrap();
    let lb = s.get_lock(b.get(), kind, b"row-group", 0).unwrap();
    (a, b, la, lb)
}

/// What client `c` holds on `id`.
fn hold(s: &TestServer, c: ClientId, id: LockId) -> GrantState {
    s.recorded_hold(s.client_slot_of(c.get()).unwrap(), id.index())
}

/// Every event waiting in client `c`'s ring, and its overflow count.
fn events(s: &TestServer, c: ClientId) -> (Vec<Event>, u64) {
    s.check_invariants().unwrap();
    let ring = s.event_ring(s.client_slot_of(c.get()).unwrap()).unwrap();
    (
        core::iter::from_fn(|| ring.pop()).collect(),
        ring.overflows(),
    )
}

const KINDS: [LockKind; 3] = [LockKind::Atomic, LockKind::Rw, LockKind::Fair];

#[test]
fn a_conflicting_waiter_revokes_the_cached_holder_and_gets_the_lock_when_it_gives_back() {
    for kind in KINDS {
        let at = format!("{kind:?}");
        let mut s = TestServer::new(&small());
        let (a, b, la, lb) = pair(&mut s, kind);
        let (ex, unlock) = (LockOp::TryExclusive, LockOp::UnlockExclusive);
        let held = s.run(a, cached(kind, ex, la), 0);
        assert_eq!(held.status, Status::Success, "{at}");
        assert_eq!(hold(&s, a, la), GrantState::ExclusiveCached, "{at}");
        assert!(!s.take_events_pending());
        // Past the minimum hold (5 ms): b's waiting request parks and a is asked.
        assert_eq!(
            s.wait_for(b, cmd(kind, ex, lb, 5_000, LockFlags::NONE), 10),
            None
        );
        assert!(s.take_events_pending(), "{at}");
        let revoke = Event::Revoke {
            lock: la,
            wanted: Mode::Exclusive,
            fence: held.aux,
        };
        assert_eq!(events(&s, a), (vec![revoke], 0), "{at}");
        assert_eq!(hold(&s, a, la), GrantState::ExclusiveRevoking, "{at}");
        assert_eq!(s.replies_ready(), 0, "{at}");
        // a gives it back: b is granted, a plain grant (it did not ask for a cached one).
        assert_eq!(
            s.run(a, cmd(kind, unlock, la, 0, LockFlags::NONE), 11)
                .status,
            Status::Success
        );
        let got = s.replies();
        assert_eq!(
            (got.len(), got[0].result.status),
            (1, Status::Success),
            "{at}"
        );
        assert_eq!(hold(&s, b, lb), GrantState::Exclusive, "{at}");
        assert_eq!(events(&s, a).0, vec![], "nothing more for a: {at}");
        let counted = |c| s.stats().get(c);
        assert_eq!(counted(Counter::RevokesSent), 1, "{at}");
        assert_eq!(counted(Counter::RevokesGivenBack), 1, "{at}");
        assert_eq!(counted(Counter::RevokesLapsed), 0, "{at}");
    }
}

#[test]
fn a_trylock_without_wait_fails_at_once_and_its_revoke_goes_out_once() {
    for kind in [LockKind::Atomic, LockKind::Rw] {
        let mut s = TestServer::new(&small());
        let (a, b, la, lb) = pair(&mut s, kind);
        let ex = LockOp::TryExclusive;
        assert_eq!(s.run(a, cached(kind, ex, la), 0).status, Status::Success);
        for now in [10, 11, 12] {
            assert_eq!(
                s.run(b, lock(kind, ex, lb, LEASE), now).status,
                Status::Fail
            );
        }
        assert_eq!(events(&s, a).0.len(), 1, "one revoke per holder and lock");
        assert_eq!(
            s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), 13)
                .status,
            Status::Success
        );
        assert_eq!(
            s.run(b, lock(kind, ex, lb, LEASE), 14).status,
            Status::Success
        );
    }
}

/// A server with a 5 ms minimum hold (the default is none).
fn with_hold() -> Config {
    Config {
        timing: crate::manager::Timing {
            min_hold_ms: 5,
            revoke_timeout_ms: 0,
            contention_window_ms: 0,
        },
        ..small()
    }
}

#[test]
fn by_default_a_conflict_revokes_a_grant_made_the_same_millisecond() {
    // The holder gives a revoked grant back only after its local users, so the server need not
    // hold it: a waiter is not made to wait out a minimum hold (`Timing::DEFAULT`).
    for kind in KINDS {
        let at = format!("{kind:?}");
        let mut s = TestServer::new(&small());
        let (a, b, la, lb) = pair(&mut s, kind);
        let ex = LockOp::TryExclusive;
        let held = s.run(a, cached(kind, ex, la), 7);
        assert_eq!(held.status, Status::Success, "{at}");
        assert_eq!(
            s.wait_for(b, cmd(kind, ex, lb, 5_000, LockFlags::NONE), 7),
            None
        );
        let revoke = Event::Revoke {
            lock: la,
            wanted: Mode::Exclusive,
            fence: held.aux,
        };
        assert_eq!(events(&s, a), (vec![revoke], 0), "{at}");
    }
}

#[test]
fn the_minimum_hold_defers_the_revoke_to_its_end() {
    let (kind, ex) = (LockKind::Rw, LockOp::TryExclusive);
    let mut s = TestServer::new(&with_hold());
    let (a, b, la, lb) = pair(&mut s, kind);
    let c = s.client(0);
    let lc = s.get_lock(c.get(), kind, b"row-group", 0).unwrap();
    assert_eq!(s.run(a, cached(kind, ex, la), 100).status, Status::Success);
    // A trylock inside the hold fails and sends nothing yet (its revoke is due at the end).
    assert_eq!(s.run(c, lock(kind, ex, lc, 0), 101).status, Status::Fail);
    assert_eq!(events(&s, a).0, vec![]);
    // A waiting one parks; the revoke goes out when the hold ends (tick 105), not before.
    assert_eq!(
        s.wait_for(b, cmd(kind, ex, lb, 5_000, LockFlags::NONE), 102),
        None
    );
    assert_eq!(events(&s, a).0, vec![]);
    s.poll_waiters(104);
    assert_eq!(events(&s, a).0, vec![]);
    s.poll_waiters(105);
    assert_eq!(events(&s, a).0.len(), 1, "revoked when the hold ended");
    assert_eq!(
        s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), 106)
            .status,
        Status::Success
    );
    assert_eq!(s.replies()[0].result.status, Status::Success);
}

#[test]
fn a_trylock_inside_the_minimum_hold_fails_and_its_revoke_goes_out_when_the_hold_ends() {
    // Nobody is parked to retry at the end of the hold: the server's timer sends the revoke
    // the trylock left due (the Linux DLM's `NOQUEUEBAST`), so that the trylock's retry can
    // succeed. It once was dropped, and a trylock-only client never got a cached lock back.
    for (kind, op, wanted) in [
        (LockKind::Rw, LockOp::TryExclusive, Mode::Exclusive),
        (LockKind::Rw, LockOp::TryShared, Mode::Shared),
        (LockKind::Atomic, LockOp::TryExclusive, Mode::Exclusive),
    ] {
        let at = format!("{kind:?} {op:?}");
        let mut s = TestServer::new(&with_hold());
        let (a, b, la, lb) = pair(&mut s, kind);
        let held = s.run(a, cached(kind, LockOp::TryExclusive, la), 100);
        assert_eq!(held.status, Status::Success, "{at}");
        assert_eq!(
            s.run(b, lock(kind, op, lb, LEASE), 101).status,
            Status::Fail
        );
        assert_eq!(events(&s, a).0, vec![], "{at}: not inside the hold");
        assert_eq!(
            s.next_timer_ms(),
            105,
            "{at}: the timer wakes when the hold ends"
        );
        s.poll_waiters(104);
        assert_eq!(events(&s, a).0, vec![], "{at}");
        s.poll_waiters(105);
        let revoke = Event::Revoke {
            lock: la,
            wanted,
            fence: held.aux,
        };
        assert_eq!(
            events(&s, a).0,
            vec![revoke],
            "{at}: revoked when the hold ended"
        );
        assert_eq!(s.next_timer_ms(), u64::MAX, "{at}: nothing left due");
        s.poll_waiters(106);
        assert_eq!(events(&s, a).0, vec![], "{at}: once");
        // The holder gives the lock back and the trylock's retry gets it.
        let unlock = lock(kind, LockOp::UnlockExclusive, la, 0);
        assert_eq!(s.run(a, unlock, 107).status, Status::Success, "{at}");
        assert_eq!(
            s.run(b, lock(kind, op, lb, LEASE), 108).status,
            Status::Success
        );
    }
}

/// A holder's ignored revoke lapses at the server's revoke timeout, or at its lease (1,000 ms,
/// `small`) when none is configured or the holder registered below protocol 7: such a client
/// was told no revoke timeout, trusts its cached grant for its lease, and would still use it
/// past a shorter timeout while the server gave it to another.
#[test]
fn an_ignored_revoke_lapses_at_the_revoke_timeout_like_an_expired_lease() {
    let told = PROTO_VERSION_REVOKE_TIMEOUT;
    let cases = [
        (PROTO_VERSION, 0, 1_010),
        (PROTO_VERSION, 300, 310),
        (told, 300, 310),
        (told - 1, 300, 1_010),
        (told - 1, 0, 1_010),
    ];
    for (version, timeout, lapse_at) in cases {
        let cfg = Config {
            timing: crate::manager::Timing {
                min_hold_ms: 5,
                revoke_timeout_ms: timeout,
                contention_window_ms: 0,
            },
            ..small()
        };
        let (kind, ex) = (LockKind::Rw, LockOp::TryExclusive);
        let mut s = TestServer::new(&cfg);
        let (a, b) = (s.client_init(version, 0, 0).unwrap(), s.client(0));
        let la = s.get_lock(a.get(), kind, b"row-group", 0).unwrap();
        let lb = s.get_lock(b.get(), kind, b"row-group", 0).unwrap();
        assert_eq!(s.run(a, cached(kind, ex, la), 0).status, Status::Success);
        assert_eq!(
            s.wait_for(b, cmd(kind, ex, lb, 5_000, LockFlags::NONE), 10),
            None
        );
        // a stays alive (heartbeats) but never gives the lock back.
        let _ = s.heartbeat(a.get(), lapse_at - 5);
        s.poll_waiters(lapse_at - 1);
        let case = format!("protocol {version}, timeout {timeout}");
        assert_eq!(s.replies_ready(), 0, "{case}: not before it lapses");
        s.poll_waiters(lapse_at);
        let got = s.replies();
        assert_eq!(got[0].result.status, Status::Success, "{case}");
        // a lost it: its unlock fails, and the value block it might have changed is invalid.
        assert_eq!(hold(&s, a, la), GrantState::None);
        assert_eq!(
            s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), lapse_at + 1)
                .status,
            Status::Fail
        );
        assert!(!s.t.lock_values[la.index() as usize].read().valid);
        assert_eq!(s.stats().get(Counter::RevokesLapsed), 1);
        assert_eq!(s.stats().get(Counter::RevokesGivenBack), 0);
    }
}

#[test]
fn a_waiter_retried_into_a_lapse_is_answered_once_and_the_waiter_counts_stay_right() {
    // The lapse releases the ignored grant in the middle of the waiter's own retry: waking the
    // lock's waiters there retried the same waiter inside its retry, granted it, and the outer
    // retry then answered it a second time (`AlreadyLocked`; the model simulator's seed
    // 0xd10c00000004 with cached grants on).
    for op in [LockOp::TryShared, LockOp::TryExclusive] {
        let kind = LockKind::Rw;
        let mut s = TestServer::new(&small());
        let (a, b, la, lb) = pair(&mut s, kind);
        let held = s.run(a, cached(kind, LockOp::TryExclusive, la), 0);
        assert_eq!(held.status, Status::Success);
        assert_eq!(
            s.wait_for(b, cmd(kind, op, lb, 5_000, LockFlags::NONE), 10),
            None
        );
        assert_eq!(events(&s, a).0.len(), 1, "{op:?}: revoked");
        // a stays alive (heartbeats) but never gives the lock back: it lapses at 1_010.
        let _ = s.heartbeat(a.get(), 1_000);
        s.poll_waiters(1_010);
        s.check_invariants().unwrap();
        let got = s.replies();
        assert_eq!(got.len(), 1, "{op:?}");
        assert_eq!(got[0].result.status, Status::Success, "{op:?}");
        assert_eq!(hold(&s, a, la), GrantState::None, "{op:?}");
        assert_eq!(hold(&s, b, lb).grant_mode(), Some(op.mode()), "{op:?}");
    }
}

#[test]
fn only_cached_grants_are_revoked_and_a_grant_made_while_the_lock_is_wanted_is_revoked_after_its_hold()
 {
    let kind = LockKind::Rw;
    let (sh, ex) = (LockOp::TryShared, LockOp::TryExclusive);
    let mut s = TestServer::new(&with_hold());
    let (a, b, la, lb) = pair(&mut s, kind);
    let (c, d) = (s.client(0), s.client(0));
    let lc = s.get_lock(c.get(), kind, b"row-group", 0).unwrap();
    let ld = s.get_lock(d.get(), kind, b"row-group", 0).unwrap();
    // Readers share: a cached, b plain, both granted.
    assert_eq!(s.run(a, cached(kind, sh, la), 0).status, Status::Success);
    assert_eq!(s.run(b, lock(kind, sh, lb, 0), 0).status, Status::Success);
    assert_eq!(hold(&s, a, la), GrantState::SharedCached);
    assert_eq!(hold(&s, b, lb), GrantState::Shared);
    // A writer waits: only a, the cached reader, is asked, wanting exclusive.
    assert_eq!(
        s.wait_for(c, cmd(kind, ex, lc, 5_000, LockFlags::NONE), 10),
        None
    );
    assert!(matches!(
        events(&s, a).0[..],
        [Event::Revoke {
            wanted: Mode::Exclusive,
            ..
        }]
    ));
    assert_eq!(events(&s, b).0, vec![]);
    // A reader asking for a cached grant gets one although the lock is wanted: its reply
    // cannot say otherwise, so its holder counts on it. Its minimum hold (5 ms) ends in a
    // retry of the parked writer, which revokes it then and not before.
    assert_eq!(s.run(d, cached(kind, sh, ld), 11).status, Status::Success);
    assert_eq!(hold(&s, d, ld), GrantState::SharedCached);
    s.poll_waiters(15);
    assert_eq!(events(&s, d).0, vec![], "not within its hold");
    s.poll_waiters(16);
    assert!(matches!(
        events(&s, d).0[..],
        [Event::Revoke {
            wanted: Mode::Exclusive,
            ..
        }]
    ));
    for (who, id) in [(a, la), (b, lb), (d, ld)] {
        assert_eq!(
            s.run(who, lock(kind, LockOp::UnlockShared, id, 0), 12)
                .status,
            Status::Success
        );
    }
    assert_eq!(s.replies()[0].result.status, Status::Success);
    assert_eq!(hold(&s, c, lc), GrantState::Exclusive);
}

#[test]
fn revokes_to_one_client_fill_its_ring_and_then_count_as_overflows() {
    let cfg = Config {
        locks_max: 80,
        ..small()
    };
    let (kind, ex) = (LockKind::Rw, LockOp::TryExclusive);
    let mut s = TestServer::new(&cfg);
    let (a, b) = (s.client(0), s.client(0));
    let n = crate::table::EVENT_RING_LEN + 2;
    for i in 0..n {
        let name = format!("rg{i}");
        let la = s.get_lock(a.get(), kind, name.as_bytes(), 0).unwrap();
        let lb = s.get_lock(b.get(), kind, name.as_bytes(), 0).unwrap();
        assert_eq!(s.run(a, cached(kind, ex, la), 0).status, Status::Success);
        assert_eq!(s.run(b, lock(kind, ex, lb, 0), 10).status, Status::Fail);
        assert_eq!(hold(&s, a, la), GrantState::ExclusiveRevoking);
    }
    let (got, overflows) = events(&s, a);
    assert_eq!((got.len(), overflows), (crate::table::EVENT_RING_LEN, 2));
    // A freed slot's next client starts with an empty ring.
    s.client_deinit(a.get(), 20).unwrap();
    let slot = s.client_slot_of(b.get()).unwrap() ^ 1;
    let ring = s.event_ring(slot).unwrap();
    assert_eq!((ring.pending(), ring.overflows()), (0, 0));
}

#[test]
fn a_revoked_writer_downgrades_for_a_reader_and_writes_its_value_block_on_the_way() {
    let kind = LockKind::Rw;
    let mut s = TestServer::new(&small());
    let (a, b, la, lb) = pair(&mut s, kind);
    assert_eq!(
        s.run(a, cached(kind, LockOp::TryExclusive, la), 0).status,
        Status::Success
    );
    assert_eq!(
        s.wait_for(
            b,
            cmd(kind, LockOp::TryShared, lb, 5_000, LockFlags::NONE),
            10
        ),
        None
    );
    assert!(matches!(
        events(&s, a).0[..],
        [Event::Revoke {
            wanted: Mode::Shared,
            ..
        }]
    ));
    // The downgrade writes the block like an exclusive unlock, and answers the revoke.
    let block = crate::manager::ValueBlock([7; 32]);
    let down = LockCommand {
        kind,
        op: LockOp::Downgrade,
        lock: la.raw(),
        flags: LockFlags::VALUE_BLOCK,
        ..LockCommand::NONE
    };
    let mut r = [run(&mut s, a, lock(kind, LockOp::TryShared, la, 0), 11)];
    assert_eq!(r[0].status, Status::Fail, "a still writes");
    let values = crate::server::MessageValues {
        blocks: &[Some(block)],
        read: &mut [None],
    };
    let disposition = s
        .execute_message_with_values(a.get(), 0, &[Command::Lock(down)], &mut r, values, 11)
        .unwrap();
    assert_eq!(
        (disposition, r[0].status),
        (Disposition::Replied, Status::Success)
    );
    assert_eq!(hold(&s, a, la), GrantState::SharedCached);
    assert_eq!(
        s.replies()[0].result.status,
        Status::Success,
        "the reader joins"
    );
    assert_eq!(hold(&s, b, lb), GrantState::Shared);
    let value = s.t.lock_values[la.index() as usize].read();
    assert_eq!((value.block, value.valid), (block, true));
    assert_eq!(s.stats().get(Counter::Downgrades), 1);
    assert_eq!(
        s.stats().get(Counter::RevokesGivenBack),
        0,
        "a downgrade is no unlock"
    );
    // A second downgrade, or one from a reader, is not the caller's to make.
    assert_eq!(s.run(a, Command::Lock(down), 12).status, Status::Fail);
    assert_eq!(
        s.run(
            b,
            Command::Lock(LockCommand {
                flags: LockFlags::NONE,
                lock: lb.raw(),
                ..down
            }),
            12
        )
        .status,
        Status::Fail
    );
}

#[test]
fn fair_and_atomic_locks_refuse_a_downgrade() {
    for kind in [LockKind::Atomic, LockKind::Fair] {
        let mut s = TestServer::new(&small());
        let (a, _, la, _) = pair(&mut s, kind);
        assert_eq!(
            s.run(a, cached(kind, LockOp::TryExclusive, la), 0).status,
            Status::Success
        );
        let down = lock(kind, LockOp::Downgrade, la, 0);
        assert_eq!(s.run(a, down, 1).status, Status::Einval, "{kind:?}");
        assert_eq!(hold(&s, a, la), GrantState::ExclusiveCached, "{kind:?}");
    }
}

#[test]
fn a_grant_lapsed_inside_an_undone_all_or_nothing_message_stays_released() {
    let cfg = Config {
        timing: crate::manager::Timing {
            min_hold_ms: 0,
            revoke_timeout_ms: 100,
            contention_window_ms: 0,
        },
        ..small()
    };
    let (kind, ex) = (LockKind::Rw, LockOp::TryExclusive);
    let mut s = TestServer::new(&cfg);
    let (a, b) = (s.client_init(PROTO_VERSION, 0, 0).unwrap(), s.client(0));
    let la = s.get_lock(a.get(), kind, b"row-group", 0).unwrap();
    let lb = s.get_lock(b.get(), kind, b"row-group", 0).unwrap();
    let c = s.client(0);
    let other_b = s.get_lock(b.get(), kind, b"other", 0).unwrap();
    let other_c = s.get_lock(c.get(), kind, b"other", 0).unwrap();
    assert_eq!(s.run(a, cached(kind, ex, la), 0).status, Status::Success);
    assert_eq!(
        s.run(c, lock(kind, ex, other_c, 0), 0).status,
        Status::Success
    );
    // b's trylock revokes a; a ignores it past the timeout.
    assert_eq!(s.run(b, lock(kind, ex, lb, 0), 1).status, Status::Fail);
    let _ = s.heartbeat(a.get(), 150);
    // b's unit: the first lock lapses a's grant, the second is c's: the unit is undone.
    let unit = [lock(kind, ex, lb, 0), lock(kind, ex, other_b, 0)];
    let r = s.run_all(b, crate::proto::FLAG_ALL_OR_NOTHING, &unit, 200);
    assert_eq!((r[0].status, r[1].status), (Status::Eagain, Status::Fail));
    // a's grant lapsed for good: the lock is free, not held by a word nobody can unlock.
    assert_eq!(hold(&s, a, la), GrantState::None);
    assert_eq!(s.run(b, lock(kind, ex, lb, 0), 201).status, Status::Success);
    s.check_invariants().unwrap();
}

#[test]
fn a_revoke_ends_the_holders_wait_when_it_asked_and_only_then() {
    for flagged in [true, false] {
        let at = format!("flagged {flagged}");
        let mut s = TestServer::new(&small());
        let kind = LockKind::Rw;
        let (a, b, xa, xb) = pair(&mut s, kind);
        let c = s.client(0);
        let ya = s.get_lock(a.get(), kind, b"other-group", 0).unwrap();
        let yc = s.get_lock(c.get(), kind, b"other-group", 0).unwrap();
        let ex = LockOp::TryExclusive;
        // a caches x; c holds y plain; a waits for y, parked.
        assert_eq!(s.run(a, cached(kind, ex, xa), 0).status, Status::Success);
        assert_eq!(
            s.run(c, lock(kind, ex, yc, LEASE), 0).status,
            Status::Success
        );
        let wake = if flagged {
            LockFlags::WAKE_ON_REVOKE
        } else {
            LockFlags::NONE
        };
        assert_eq!(s.wait_for(a, cmd(kind, ex, ya, 50_000, wake), 1), None);
        // b wants x: a is revoked, and b parks.
        assert_eq!(
            s.wait_for(b, cmd(kind, ex, xb, 50_000, LockFlags::NONE), 2),
            None
        );
        assert_eq!(events(&s, a).0.len(), 1, "{at}");
        s.poll_waiters(2);
        let got = s.replies();
        if !flagged {
            assert_eq!(got, vec![], "a plain wait is not cut short: {at}");
            s.poll_waiters(500);
            assert_eq!(s.replies(), vec![], "nor later: {at}");
            continue;
        }
        // a's wait ended, answered as an expired one; y is still c's, and a still caches x.
        assert_eq!(got.len(), 1, "{at}");
        assert_eq!(
            (got[0].client, got[0].result.status),
            (a.get(), Status::Etimeout)
        );
        assert_eq!(hold(&s, a, ya), GrantState::None);
        assert_eq!(hold(&s, c, yc), GrantState::Exclusive);
        assert_eq!(hold(&s, a, xa), GrantState::ExclusiveRevoking);
        assert_eq!(s.stats().get(Counter::WaitTimeouts), 1);
        // Back from its wait, a gives x back and b is granted.
        assert_eq!(
            s.run(a, lock(kind, LockOp::UnlockExclusive, xa, 0), 3)
                .status,
            Status::Success
        );
        let got = s.replies();
        assert_eq!(
            (got.len(), got[0].client, got[0].result.status),
            (1, b.get(), Status::Success)
        );
        s.check_invariants().unwrap();
    }
}
