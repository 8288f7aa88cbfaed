//! Blocking `lock()` without polling: parked requests, their wake-ups, deadlines and
//! cancellations.

use super::*;

#[test]
fn blocked_lock_is_granted_the_moment_the_holder_unlocks() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    let held = s.run(a, lock(LockKind::Rw, LockOp::TryExclusive, la, 0), 0);
    assert_eq!(held.status, Status::Success);
    assert_eq!(
        s.wait_for(
            b,
            waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 5_000),
            1
        ),
        None
    );
    assert_eq!(s.replies_ready(), 0);
    assert_eq!(
        s.run(a, lock(LockKind::Rw, LockOp::UnlockExclusive, la, 0), 2)
            .status,
        Status::Success
    );
    let got = s.replies();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].client, got[0].result.status),
        (b.get(), Status::Success)
    );
    assert!(
        got[0].result.aux > held.aux,
        "a fresh, larger fencing token"
    );
    assert_eq!(
        got[0].command.op,
        LockOp::TryExclusive,
        "the reply echoes the request"
    );
    // b really holds it now.
    assert_eq!(
        s.run(a, lock(LockKind::Rw, LockOp::TryShared, la, 0), 3)
            .status,
        Status::Fail
    );
}

#[test]
fn waiter_gets_etimeout_when_its_deadline_passes_and_not_before() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    s.run(a, lock(LockKind::Rw, LockOp::TryShared, la, 0), 0);
    assert_eq!(
        s.wait_for(
            b,
            waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 300),
            0
        ),
        None
    );
    s.poll_waiters(300);
    assert_eq!(
        s.replies_ready(),
        0,
        "the deadline tick itself is still in time"
    );
    s.poll_waiters(301);
    let got = s.replies();
    assert_eq!(got[0].result.status, Status::Etimeout);
    assert_eq!(s.stats().get(Counter::WaitTimeouts), 1);
}

#[test]
fn atomic_waiter_is_granted_when_the_holders_lease_runs_out() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Atomic, b"x", 0).unwrap();
    s.run(a, lock(LockKind::Atomic, LockOp::TryExclusive, la, 100), 0);
    assert_eq!(
        s.wait_for(
            b,
            waiting(LockKind::Atomic, LockOp::TryExclusive, lb, 100, 5_000),
            10
        ),
        None
    );
    s.poll_waiters(100);
    assert_eq!(s.replies_ready(), 0);
    s.poll_waiters(101);
    assert_eq!(s.replies()[0].result.status, Status::Success);
}

#[test]
fn fair_waiters_are_served_in_ticket_order() {
    let mut s = TestServer::new(&small());
    let ids: Vec<ClientId> = (0..3).map(|_| s.client(0)).collect();
    let locks: Vec<LockId> = ids
        .iter()
        .map(|c| s.get_lock(c.get(), LockKind::Fair, b"f", 0).unwrap())
        .collect();
    let first = s.run(
        ids[0],
        lock(LockKind::Fair, LockOp::TryExclusive, locks[0], 10_000),
        0,
    );
    assert_eq!(first.status, Status::Success);
    for i in 1..3 {
        let cmd = waiting(
            LockKind::Fair,
            LockOp::TryExclusive,
            locks[i],
            10_000,
            60_000,
        );
        assert_eq!(s.wait_for(ids[i], cmd, i as u64), None);
    }
    let mut holder_ticket = crate::word::fair::FairWord::from_bits(first.word);
    for next in 1..3 {
        let t = Ticket {
            exclusive: holder_ticket.mx(),
            shared: holder_ticket.ms(),
        };
        let unlock = ticketed(
            LockKind::Fair,
            LockOp::UnlockExclusive,
            locks[next - 1],
            0,
            t,
        );
        assert_eq!(
            s.run(ids[next - 1], unlock, 10 + next as u64).status,
            Status::Success
        );
        let got = s.replies();
        assert_eq!(got.len(), 1, "exactly the next ticket is served");
        assert_eq!(
            (got[0].client, got[0].result.status),
            (ids[next].get(), Status::Success)
        );
        assert_eq!(got[0].command.op, LockOp::TryExclusive);
        holder_ticket = crate::word::fair::FairWord::from_bits(got[0].result.word);
    }
}

#[test]
fn a_dying_holder_wakes_the_waiter_and_the_waiter_itself_is_not_declared_dead() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    s.run(a, lock(LockKind::Rw, LockOp::TryExclusive, la, 0), 0);
    assert_eq!(
        s.wait_for(
            b,
            waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 60_000),
            0
        ),
        None
    );
    assert_eq!(
        s.tick(cfg.client_lease_ms as u64 + 1),
        1,
        "only the silent holder dies"
    );
    assert!(s.is_registered(b.get()));
    assert_eq!(s.replies()[0].result.status, Status::Success);
}

#[test]
fn one_parked_request_per_client_and_waiting_requests_travel_alone() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb2 = s.get_lock(b.get(), LockKind::Rw, b"y", 0).unwrap();
    s.run(a, lock(LockKind::Rw, LockOp::TryExclusive, la, 0), 0);
    let cmd = waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 1_000);
    assert_eq!(s.wait_for(b, cmd, 0), None);
    assert_eq!(
        s.wait_for(b, cmd, 0).map(|r| r.status),
        Some(Status::Easync)
    );
    let two = [cmd, lock(LockKind::Rw, LockOp::TryExclusive, lb2, 0)];
    let r = s.run_all(b, 0, &two, 0);
    assert_eq!(
        (r[0].status, r[1].status),
        (Status::Einval, Status::Success)
    );
}

#[test]
fn a_cancelled_parked_request_is_never_granted_and_frees_the_clients_waiter() {
    let mut s = TestServer::new(&small());
    let on_x = a_holds_b_waits(&mut s, LockKind::Rw, 0, LockOp::TryExclusive, 2);
    let [(a, la), (b, lb)] = on_x[..] else {
        unreachable!("two clients")
    };
    let cmd = waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 60_000);
    s.cancel_parked(b.get(), 1);
    // b may park again at once (no `Easync`), and a's unlock grants only the new request.
    assert_eq!(s.wait_for(b, cmd, 1), None);
    s.run(a, lock(LockKind::Rw, LockOp::UnlockExclusive, la, 0), 2);
    let got = s.replies();
    assert_eq!(got.len(), 1, "one reply: the cancelled request has none");
    assert_eq!(got[0].result.status, Status::Success);
    // Cancelling with nothing parked, or for an unknown client, changes nothing.
    s.cancel_parked(b.get(), 2);
    s.cancel_parked(0x7fff_fff0, 2);
    assert_eq!(s.replies_ready(), 0);
}

/// `n` clients (at least 2) with a reference each to lock "x" of `kind`: the first holds it
/// exclusively for `a_expire_ms` (tick 0) and the second waits for it with `b_op` (tick 1).
fn a_holds_b_waits(
    s: &mut TestServer,
    kind: LockKind,
    a_expire_ms: u32,
    b_op: LockOp,
    n: usize,
) -> Vec<(ClientId, LockId)> {
    let on_x: Vec<_> = (0..n)
        .map(|_| {
            let c = s.client(0);
            (c, s.get_lock(c.get(), kind, b"x", 0).unwrap())
        })
        .collect();
    let ((a, la), (b, lb)) = (on_x[0], on_x[1]);
    let held = run(s, a, lock(kind, LockOp::TryExclusive, la, a_expire_ms), 0);
    assert_eq!(held.status, Status::Success, "{kind:?}");
    assert_eq!(
        s.wait_for(b, waiting(kind, b_op, lb, 60_000, 60_000), 1),
        None,
        "{kind:?}: b parks"
    );
    on_x
}

/// A parked request granted but cancelled before its reply went out (the client's data path was
/// replaced): the client never learns it holds the lock, so the server releases it again —
/// for every kind, also RW, whose grants never lapse — and the next waiter gets it.
#[test]
fn a_grant_whose_reply_is_cancelled_is_released_again() {
    for (kind, op) in [
        (LockKind::Atomic, LockOp::TryExclusive),
        (LockKind::Rw, LockOp::TryExclusive),
        (LockKind::Rw, LockOp::TryShared),
        (LockKind::Fair, LockOp::TryExclusive),
    ] {
        let mut s = TestServer::new(&small());
        let on_x = a_holds_b_waits(&mut s, kind, 60_000, op, 3);
        let [(a, la), (b, _), (c, lc)] = on_x[..] else {
            unreachable!("three clients")
        };
        // c parks behind b.
        let c_wants = waiting(kind, LockOp::TryExclusive, lc, 60_000, 60_000);
        assert_eq!(s.wait_for(c, c_wants, 2), None);
        // a unlocks: b is granted, its reply is ready but not yet taken.
        s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), 3);
        assert_eq!(s.replies_ready(), 1, "{kind:?}: b granted");
        s.cancel_parked(b.get(), 4);
        // b's grant is released, so c (queued behind b) is granted now.
        let got = s.replies();
        assert_eq!(got.len(), 1, "{kind:?}: only c's reply: {got:?}");
        assert_eq!(got[0].result.status, Status::Success, "{kind:?}");
        assert_eq!(got[0].client, c.get(), "{kind:?}");
    }
}

#[test]
fn parked_request_replies_through_the_bytes_path_with_its_message_id() {
    use crate::proto::{DATA_MESSAGE_MAX, DataHeader, decode_data_response, encode_data_request};
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Atomic, b"x", 0).unwrap();
    s.run(
        a,
        lock(LockKind::Atomic, LockOp::TryExclusive, la, 1_000),
        0,
    );
    let header = DataHeader {
        version: crate::proto::PROTO_VERSION,
        count: 0,
        message_id: 777,
        client: b.get(),
        flags: 0,
    };
    let mut req = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(
        &header,
        &[waiting(
            LockKind::Atomic,
            LockOp::TryExclusive,
            lb,
            50,
            9_000,
        )],
        &mut req,
    )
    .unwrap();
    let mut out = [0u8; DATA_MESSAGE_MAX];
    assert_eq!(
        s.handle_data(&req[..n], &mut out, 1),
        Ok(0),
        "parked: no reply yet"
    );
    s.run(a, lock(LockKind::Atomic, LockOp::UnlockExclusive, la, 0), 2);
    let got = s.replies();
    let m = got[0].encode(&mut out).unwrap();
    let reply = decode_data_response(&out[..m]).unwrap();
    assert_eq!(reply.header().message_id, 777);
    assert_eq!(reply.result(0).id, lb.raw());
    assert_eq!(reply.result(0).result.status, Status::Success);
}

/// A grant decided but not yet delivered when the client's control connection is lost
/// (`client_disconnected`, which the transport calls when the parked request did not come over
/// that very socket) is released: the client re-registers never knowing it held the lock.
#[test]
fn a_grant_dropped_by_a_lost_connection_is_released() {
    let mut s = TestServer::new(&small());
    let kind = LockKind::Rw;
    let on_x = a_holds_b_waits(&mut s, kind, 0, LockOp::TryExclusive, 3);
    let [(a, la), (b, _), (c, lc)] = on_x[..] else {
        unreachable!("three clients")
    };
    // a unlocks: b is granted, its reply is ready but not yet taken.
    s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), 2);
    assert_eq!(s.replies_ready(), 1);
    // Same turn: b's control connection goes away; then b re-registers (same session).
    s.client_disconnected(b.get(), 3);
    assert_eq!(s.replies_ready(), 0, "b's reply was dropped");
    let sess = &s.session(b.get());
    s.client_reinit(b.get(), 2, 0, sess, 3).unwrap();
    // b never got the grant; c must be able to take the lock.
    assert_eq!(
        s.run(c, lock(kind, LockOp::TryExclusive, lc, 0), 4).status,
        Status::Success,
        "b's undelivered grant still holds the lock"
    );
}

/// A client that deinits with a request parked takes it along: the next client given its slot
/// does not inherit it, and the lock is never granted under the departed client's id.
#[test]
fn a_deinit_takes_the_parked_request_along() {
    let mut s = TestServer::new(&small());
    let kind = LockKind::Rw;
    let on_x = a_holds_b_waits(&mut s, kind, 0, LockOp::TryExclusive, 2);
    let [(a, la), (b, _)] = on_x[..] else {
        unreachable!("two clients")
    };
    let b_slot = s.client_session(b.get()).unwrap().0;
    s.client_deinit(b.get(), 2).unwrap();
    let c = s.client(3);
    assert_eq!(
        s.client_session(c.get()).unwrap().0,
        b_slot,
        "c reuses b's slot"
    );
    let lc = s.get_lock(c.get(), kind, b"x", 3).unwrap();
    s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), 4);
    let got = s.replies();
    assert!(
        got.is_empty(),
        "stale request of departed b answered: {got:?}"
    );
    assert_eq!(
        s.run(c, lock(kind, LockOp::TryExclusive, lc, 0), 5).status,
        Status::Success,
        "lock granted to departed client b"
    );
}

/// Fair shared grants and grants by timeout preemption whose reply is cancelled are released
/// too (under the ticket the granting word names).
#[test]
fn fair_shared_and_preempted_grants_whose_reply_is_cancelled_are_released() {
    for (op, preempt) in [
        (LockOp::TryShared, false),
        (LockOp::TryExclusive, true),
        (LockOp::TryShared, true),
    ] {
        let mut s = TestServer::new(&small());
        let kind = LockKind::Fair;
        let on_x = a_holds_b_waits(&mut s, kind, 10, op, 3);
        let [(a, la), (b, _), (c, lc)] = on_x[..] else {
            unreachable!("three clients")
        };
        assert_eq!(
            s.wait_for(
                c,
                waiting(kind, LockOp::TryExclusive, lc, 60_000, 600_000),
                2
            ),
            None
        );
        let t = if preempt {
            // a overruns its lease; b preempts past it (c is behind b).
            s.poll_waiters(11);
            11
        } else {
            s.run(a, lock(kind, LockOp::UnlockExclusive, la, 0), 3);
            3
        };
        assert_eq!(s.replies_ready(), 1, "{op:?} {preempt}: b granted");
        s.cancel_parked(b.get(), t + 1);
        let got = s.replies();
        if !preempt {
            assert_eq!(got.len(), 1, "{op:?}: {got:?}");
            assert_eq!(
                (got[0].client, got[0].result.status),
                (c.get(), Status::Success)
            );
        } else {
            // Preemption voided c's ticket (requeued); check b's grant itself is gone.
            let idx = la.index() as usize;
            let cell = s.t.lock_cells[idx];
            let w = crate::word::fair::FairWord::from_bits(cell.word);
            assert_eq!(
                (cell.ext, w.rcnt(), w.nx()),
                (0, 0, if op == LockOp::TryExclusive { 2 } else { 1 }),
                "{op:?}: {w:?}"
            );
            if op == LockOp::TryShared {
                assert_eq!(w.ns(), w.rms().wrapping_add(1));
            }
        }
    }
}
