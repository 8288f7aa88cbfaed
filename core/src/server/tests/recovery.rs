//! Recovery: a replacement server waits for its clients to re-sync and takes back their claims.

use super::*;
use crate::ids::Mode;

#[test]
fn recovering_server_answers_not_ready_until_expected_clients_resync() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    assert_eq!(s.client_init(2, 0, 0), Err(Status::NotReady));
    let (a, b) = (ClientId::new(11).unwrap(), ClientId::new(22).unwrap());
    s.reinit(a.get(), 0).unwrap();
    s.reinit(b.get(), 0).unwrap();
    assert_eq!(
        s.get_lock(a.get(), LockKind::Atomic, b"x", 0),
        Err(Status::NotReady)
    );
    let claim = |held, remaining_ms, token| LockClaim {
        value: None,
        kind: LockKind::Atomic,
        held,
        name: b"x",
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms,
        age_ms: 0,
        token,
        proof: crate::GrantProof::NONE,
    };
    // Old epoch-1 token of a's grant; b's stale claim expires earlier and loses.
    let old_token = (1u64 << 48) + 900;
    let la = s
        .update_lock(a.get(), &claim(Held::Exclusive, 5_000, old_token), 0)
        .unwrap();
    assert_eq!(
        s.update_lock(b.get(), &claim(Held::Exclusive, 1_000, 0), 0),
        Err(Status::Fail)
    );
    s.reinit_done(a.get(), 0).unwrap();
    assert_eq!(s.state(), ServerState::Recovering { remaining: 1 });
    s.reinit_done(b.get(), 0).unwrap();
    assert_eq!(s.state(), ServerState::Ready);
    // a still holds x: its unlock works, b's trylock fails until then.
    let lb = s.get_lock(b.get(), LockKind::Atomic, b"x", 1).unwrap();
    assert_eq!(lb, la);
    assert_eq!(
        s.run(b, lock(LockKind::Atomic, LockOp::TryExclusive, lb, 10), 1)
            .status,
        Status::Fail
    );
    assert_eq!(
        s.run(a, lock(LockKind::Atomic, LockOp::UnlockExclusive, la, 0), 1)
            .status,
        Status::Success
    );
    let r = s.run(b, lock(LockKind::Atomic, LockOp::TryExclusive, lb, 10), 1);
    assert_eq!(r.status, Status::Success);
    assert!(r.aux > old_token && FencingToken(r.aux).standalone_epoch() == 2);
}

#[test]
fn recovering_client_that_never_returns_stops_blocking_recovery_after_its_lease() {
    let cfg = Config {
        recovery_clients: 1,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    s.reinit(77, 0).unwrap();
    assert_eq!(s.tick(cfg.client_lease_ms as u64 + 1), 1);
    assert_eq!(s.state(), ServerState::Ready);
}

fn claim(kind: LockKind, held: Held, name: &[u8], ticket: Ticket, token: u64) -> LockClaim<'_> {
    LockClaim {
        value: None,
        kind,
        held,
        name,
        old_lock: 0,
        word: 0,
        ticket,
        remaining_ms: 5_000,
        age_ms: 0,
        token,
        proof: crate::GrantProof::NONE,
    }
}

#[test]
fn claims_after_the_server_is_ready_are_refused() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 2);
    s.reinit_done(ids[0].get(), 0).unwrap();
    assert_eq!(s.state(), ServerState::Ready);
    let c = s.client(1);
    let l = s.get_lock(c.get(), LockKind::Rw, b"x", 1).unwrap();
    assert_eq!(
        s.run(c, lock(LockKind::Rw, LockOp::TryExclusive, l, 0), 1)
            .status,
        Status::Success
    );
    // ids[1] re-registered in the recovery, which is over: its claim restores nothing.
    let steal = claim(LockKind::Rw, Held::Exclusive, b"x", Ticket::default(), 0);
    assert_eq!(s.update_lock(ids[1].get(), &steal, 2), Err(Status::Fail));
    // c never re-registered here: a claim from it is refused as out of place.
    assert_eq!(s.update_lock(c.get(), &steal, 2), Err(Status::Einval));
    let w = crate::word::rw::RwWord::from_bits(s.t.lock_cells[l.index() as usize].word);
    assert_eq!(w.owner(), c.get(), "the new holder keeps it");
}

#[test]
fn repeated_claims_merge_once() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 1);
    let shared = claim(LockKind::Rw, Held::Shared, b"r", Ticket::default(), 5);
    let l = s.update_lock(ids[0].get(), &shared, 0).unwrap();
    assert_eq!(s.update_lock(ids[0].get(), &shared, 0), Ok(l));
    let w = crate::word::rw::RwWord::from_bits(s.t.lock_cells[l.index() as usize].word);
    assert_eq!(w.readers(), 1);
    let ex = claim(
        LockKind::Fair,
        Held::Exclusive,
        b"f",
        Ticket {
            exclusive: 3,
            shared: 1,
        },
        6,
    );
    let f = s.update_lock(ids[0].get(), &ex, 0).unwrap();
    assert_eq!(
        s.update_lock(ids[0].get(), &ex, 0),
        Ok(f),
        "not refused the second time"
    );
}

#[test]
fn fair_claims_anywhere_in_the_counter_range_restore_a_working_queue() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 1);
    let a = ids[0];
    let t = Ticket {
        exclusive: 0x9001,
        shared: 0x9000,
    };
    let l = s
        .update_lock(a.get(), &claim(LockKind::Fair, Held::Shared, b"f", t, 1), 0)
        .unwrap();
    let e = s
        .update_lock(
            a.get(),
            &claim(LockKind::Fair, Held::Exclusive, b"g", t, 1),
            0,
        )
        .unwrap();
    s.reinit_done(a.get(), 0).unwrap();
    assert_eq!(
        s.run(
            a,
            ticketed(LockKind::Fair, LockOp::UnlockShared, l, 0, t),
            1
        )
        .status,
        Status::Success
    );
    assert_eq!(
        s.run(
            a,
            ticketed(LockKind::Fair, LockOp::UnlockExclusive, e, 0, t),
            1
        )
        .status,
        Status::Success
    );
    for id in [l, e] {
        let r = s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, id, 100), 2);
        assert_eq!(r.status, Status::Success, "the queue is not wedged");
    }
}

#[test]
fn forged_claim_tokens_and_impossible_claims_are_refused_without_a_trace() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 1);
    let before = s.tables().digest();
    let forged = claim(
        LockKind::Atomic,
        Held::Exclusive,
        b"x",
        Ticket::default(),
        u64::MAX,
    );
    assert_eq!(s.update_lock(ids[0].get(), &forged, 0), Err(Status::Einval));
    let nonsense = claim(LockKind::Atomic, Held::Shared, b"x", Ticket::default(), 0);
    assert_eq!(
        s.update_lock(ids[0].get(), &nonsense, 0),
        Err(Status::Einval)
    );
    assert_eq!(s.tables().digest(), before);
    // A merge refusal drops the reference the claim created.
    let b = ClientId::new(555).unwrap();
    s.reinit(b.get(), 0).unwrap();
    let mine = claim(LockKind::Rw, Held::Exclusive, b"w", Ticket::default(), 0);
    s.update_lock(ids[0].get(), &mine, 0).unwrap();
    let theirs = claim(LockKind::Rw, Held::Shared, b"w", Ticket::default(), 0);
    assert_eq!(s.update_lock(b.get(), &theirs, 0), Err(Status::Fail));
    let lock = s.find_lock(b"w").unwrap();
    assert_eq!(s.t.lock_refs.get(s.client_slot(b.get()).unwrap(), lock), 0);
    assert_eq!(s.t.lock_meta[lock as usize].refs, 1);
}

/// The two gates before a claim touches anything, which no client's records pass (a client
/// claims only what an earlier incarnation granted it, in a shape its lock kind has): a token
/// of our epoch or a later one, and a kind that cannot be held that way. Neither may create
/// the lock or move the counter the next grant's token comes from, even when the forged token
/// is far from overflowing it (`u64::MAX`, in the test above, would fail on the overflow alone).
#[test]
fn claims_under_our_epoch_or_in_impossible_shapes_move_nothing() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 1);
    let c = ids[0];
    let before = (s.tables().digest(), s.next_token);
    let old = FencingToken::standalone(1, 1_000).0;
    let ticket = Ticket {
        exclusive: 3,
        shared: 4,
    };
    for (case, kind, held, token) in [
        (
            "our epoch",
            LockKind::Atomic,
            Held::Exclusive,
            FencingToken::standalone(2, 9).0,
        ),
        (
            "a later epoch",
            LockKind::Rw,
            Held::Shared,
            FencingToken::standalone(3, 9).0,
        ),
        ("a shared atomic", LockKind::Atomic, Held::Shared, old),
        (
            "an atomic ticket",
            LockKind::Atomic,
            Held::Ticketed(Mode::Exclusive),
            old,
        ),
        (
            "an RW ticket",
            LockKind::Rw,
            Held::Ticketed(Mode::Shared),
            old,
        ),
    ] {
        let forged = claim(kind, held, b"x", ticket, token);
        assert_eq!(
            s.update_lock(c.get(), &forged, 1),
            Err(Status::Einval),
            "{case}"
        );
        assert_eq!(
            (s.tables().digest(), s.next_token),
            before,
            "{case} left a trace"
        );
    }
    assert_eq!(s.find_lock(b"x"), None);
}

#[test]
fn waiting_for_other_clients_to_resync_does_not_cost_a_client_its_lease() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 2);
    s.reinit_done(ids[0].get(), 0).unwrap();
    for now in (200..2_000).step_by(200) {
        assert_eq!(s.heartbeat(ids[0].get(), now), Err(Status::NotReady));
        s.reinit(ids[1].get(), now).unwrap();
        assert_eq!(s.tick(now), 0, "at {now}");
    }
}

/// Found by the simulator (seed 0xf14da67bc96231dd): B's unlock was executed before the
/// failover and its reply lost, so B re-claimed the lock too, with a later expiry than A's
/// genuine grant. The reference's rule let the later claim displace the earlier one while A,
/// told its claim succeeded, went on believing it held the lock. The first accepted claim keeps
/// an exclusive lock (atomic and RW alike); the second is refused.
#[test]
fn a_second_exclusive_claim_cannot_displace_an_accepted_one() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 2);
    let (a, b) = (ids[0].get(), ids[1].get());
    for kind in [LockKind::Atomic, LockKind::Rw] {
        let name: &[u8] = if kind == LockKind::Atomic { b"a" } else { b"r" };
        let mut first = claim(kind, Held::Exclusive, name, Ticket::default(), 7);
        first.remaining_ms = 500;
        first.age_ms = 10;
        let l = s.update_lock(a, &first, 100).unwrap();
        // Expires later and was acquired later: the reference's rules would let it win.
        let mut second = claim(kind, Held::Exclusive, name, Ticket::default(), 5);
        second.remaining_ms = 5_000;
        second.age_ms = 1;
        assert_eq!(
            s.update_lock(b, &second, 110),
            Err(Status::Fail),
            "{kind:?}"
        );
        let owner = match kind {
            LockKind::Atomic => {
                crate::word::atomic::AtomicWord::from_bits(s.t.lock_cells[l.index() as usize].word)
                    .owner()
            }
            _ => {
                crate::word::rw::RwWord::from_bits(s.t.lock_cells[l.index() as usize].word).owner()
            }
        };
        assert_eq!(owner, a, "{kind:?}: the first claim keeps it");
    }
}

/// An exclusive claim of atomic lock "x" under `token`: the fields the fair claims below keep.
fn exclusive_claim(token: u64) -> LockClaim<'static> {
    claim(
        LockKind::Atomic,
        Held::Exclusive,
        b"x",
        Ticket::default(),
        token,
    )
}

/// Two readers of a fair lock re-claim their grants newest ticket first. The first claim sets
/// the serving counter `ns` at its own ticket, past the older reader's; found by
/// `check_invariants` in the model simulator: once both unlocked, `ns` ran ahead of `ms`, so
/// `ms − ns` wrapped to "queue full" and every first attempt on the lock failed for good.
#[test]
fn fair_readers_reclaimed_newest_first_leave_the_lock_usable() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let reader = |ts: u16, token: u64| LockClaim {
        kind: LockKind::Fair,
        held: Held::Shared,
        name: b"f",
        ticket: Ticket {
            exclusive: 7,
            shared: ts,
        },
        ..exclusive_claim((1 << 48) + token)
    };
    let (a, b) = (11, 12);
    let mut ids = [None; 2];
    for (k, (who, ts)) in [(a, 3), (b, 2)].into_iter().enumerate() {
        s.client_reinit(who, 3, 0, &crate::Session::NONE, 0)
            .unwrap();
        ids[k] = Some(
            s.update_lock(who, &reader(ts, 9 - u64::from(ts)), 1)
                .unwrap(),
        );
    }
    for who in [a, b] {
        s.reinit_done(who, 1).unwrap();
    }
    let id = ids[0].unwrap();
    for (who, ts) in [(a, 3), (b, 2)] {
        let unlock = ticketed(
            LockKind::Fair,
            LockOp::UnlockShared,
            id,
            0,
            Ticket {
                exclusive: 7,
                shared: ts,
            },
        );
        let me = ClientId::new(who).unwrap();
        assert_eq!(s.run(me, unlock, 2).status, Status::Success);
    }
    assert_eq!(s.check_invariants(), Ok(()));
    let me = ClientId::new(a).unwrap();
    let take = lock(LockKind::Fair, LockOp::TryExclusive, id, 100);
    assert_eq!(
        s.run(me, take, 3).status,
        Status::Success,
        "the lock is free, nothing is queued"
    );
}

/// A writer's ticket re-claimed first positions the queue at its own shared count; a reader
/// queued just before it, re-claimed next, is served first and must leave the count where the
/// writer's turn comes (seed 0x1 of the model simulator, found by `check_invariants`).
#[test]
fn a_queued_reader_reclaimed_after_a_writer_ticket_is_served_before_it() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let ticket = |mode, ts| LockClaim {
        kind: LockKind::Fair,
        held: Held::Ticketed(mode),
        name: b"f",
        ticket: Ticket {
            exclusive: 11,
            shared: ts,
        },
        ..exclusive_claim(0)
    };
    let (writer, reader) = (11, 12);
    let mut id = None;
    for (who, mode, ts) in [(writer, Mode::Exclusive, 6), (reader, Mode::Shared, 5)] {
        s.client_reinit(who, 3, 0, &crate::Session::NONE, 0)
            .unwrap();
        id = Some(s.update_lock(who, &ticket(mode, ts), 1).unwrap());
        s.reinit_done(who, 1).unwrap();
    }
    let id = id.unwrap();
    let retry = |op, ts| {
        let t = Ticket {
            exclusive: 11,
            shared: ts,
        };
        ticketed(LockKind::Fair, op, id, 100, t)
    };
    use LockOp::{TicketExclusive, TicketShared, UnlockShared};
    let (w, r) = (
        ClientId::new(writer).unwrap(),
        ClientId::new(reader).unwrap(),
    );
    assert_eq!(s.run(r, retry(TicketShared, 5), 2).status, Status::Success);
    assert_eq!(
        s.run(w, retry(TicketExclusive, 6), 2).status,
        Status::Eagain
    );
    assert_eq!(s.run(r, retry(UnlockShared, 5), 3).status, Status::Success);
    assert_eq!(s.check_invariants(), Ok(()));
    assert_eq!(
        s.run(w, retry(TicketExclusive, 6), 4).status,
        Status::Success,
        "the writer's turn comes after the reader queued before it"
    );
}

/// A fair grant that ran out before the failover is not restored: its queue may have moved on
/// to another holder on the failed server, and once restored, an extend would bring the
/// expired grant back to life under an older token than the other holder's (the model
/// simulator's fencing rule found that). Refused, as an expired atomic grant is.
#[test]
fn an_expired_fair_grant_is_not_restored() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let a = 11;
    s.client_reinit(a, 3, 0, &crate::Session::NONE, 0).unwrap();
    for held in [Held::Exclusive, Held::Shared] {
        let expired = LockClaim {
            kind: LockKind::Fair,
            held,
            name: b"f",
            ticket: Ticket {
                exclusive: 10,
                shared: 8,
            },
            remaining_ms: 0,
            age_ms: 1_700,
            ..exclusive_claim((1 << 48) + 0xb2)
        };
        assert_eq!(s.update_lock(a, &expired, 1), Err(Status::Fail), "{held:?}");
    }
    assert_eq!(s.check_invariants(), Ok(()));
}

/// A reader's queued ticket older than a writer's restored grant cannot be current (the reader
/// would have been served before the writer), so it is a stale claim: it may move the queue's
/// counters, never the serving counter under the writer, or the writer could not unlock.
#[test]
fn a_stale_reader_ticket_claimed_after_a_writer_leaves_the_writers_grant_whole() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let ticket = Ticket {
        exclusive: 7,
        shared: 4,
    };
    let writer = LockClaim {
        kind: LockKind::Fair,
        name: b"f",
        ticket,
        ..exclusive_claim((1 << 48) + 9)
    };
    let stale_reader = LockClaim {
        held: Held::Ticketed(Mode::Shared),
        ticket: Ticket {
            exclusive: 7,
            shared: 3,
        },
        remaining_ms: 0,
        ..writer
    };
    let (w, r) = (11, 12);
    let mut id = None;
    for (who, c) in [(w, &writer), (r, &stale_reader)] {
        s.client_reinit(who, 3, 0, &crate::Session::NONE, 0)
            .unwrap();
        id = Some(s.update_lock(who, c, 1).unwrap());
        s.reinit_done(who, 1).unwrap();
    }
    let unlock = ticketed(
        LockKind::Fair,
        LockOp::UnlockExclusive,
        id.unwrap(),
        0,
        ticket,
    );
    let me = ClientId::new(w).unwrap();
    assert_eq!(s.run(me, unlock, 2).status, Status::Success);
    assert_eq!(s.check_invariants(), Ok(()));
}

/// After a failover every lock's value block is unknown (invalid) until a grant's claim offers
/// a valid copy; the newest offered wins, and neither a reference's nor an invalid copy counts.
#[test]
fn value_blocks_come_back_only_from_the_grants_that_kept_a_valid_copy() {
    use crate::manager::value::{ValueBlock, ValueRead};
    let cfg = Config {
        recovery_clients: 3,
        epoch: 2,
        ..small()
    };
    let (mut s, ids) = TestServer::recovering(&cfg, 3);
    let copy = |b: u8, seq: u32, valid: bool| ValueRead {
        block: ValueBlock([b; 32]),
        seq,
        valid,
    };
    let offer = |kind, held, name, value| LockClaim {
        value,
        ..claim(kind, held, name, Ticket::default(), 0)
    };
    let rw = LockKind::Rw;
    let claims = [
        (0, offer(rw, Held::Shared, b"p", Some(copy(1, 3, true)))),
        (1, offer(rw, Held::Shared, b"p", Some(copy(2, 5, true)))),
        (2, offer(rw, Held::Shared, b"p", Some(copy(9, 4, true)))),
        (0, offer(rw, Held::Exclusive, b"q", None)),
        (1, offer(rw, Held::Exclusive, b"r", Some(copy(3, 7, false)))),
        (2, offer(rw, Held::Reference, b"t", Some(copy(4, 8, true)))),
        (
            2,
            offer(
                LockKind::Atomic,
                Held::Exclusive,
                b"u",
                Some(copy(5, 1, true)),
            ),
        ),
    ];
    for (who, c) in &claims {
        s.update_lock(ids[*who].get(), c, 0).unwrap();
    }
    let value = |s: &TestServer, name: &[u8]| {
        let lock = s.find_lock(name).expect("created by its claim");
        s.t.lock_values[lock as usize].read()
    };
    assert_eq!(value(&s, b"p"), copy(2, 5, true), "the newest valid copy");
    for name in [&b"q"[..], b"r", b"t"] {
        assert!(
            !value(&s, name).valid,
            "{name:?}: nothing valid was offered"
        );
    }
    assert_eq!(
        value(&s, b"u"),
        copy(5, 1, true),
        "an exclusive holder's copy"
    );
}
