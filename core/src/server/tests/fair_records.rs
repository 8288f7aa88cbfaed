//! Fair tickets the server no longer records (issue 16): a retry with a ticket a timeout
//! preemption passed is answered as the reference answers a passed ticket, `Fail`, so the
//! client's record (`crate::client::LocalLock`) starts over instead of retrying a dead ticket
//! forever; a waiting retry starts over on the server, as the reference's `lock()` loop does.

use super::*;
use crate::LockKind;
use crate::client::{Decision, LocalLock, LocalState};
use crate::ids::Mode;
use crate::manager::GrantState;
use crate::proto::{Command, CommandResult, LockOp};

const LEASE_MS: u32 = 100;

/// Sends what the record decided and applies the reply, as the transport's client does.
#[track_caller]
fn call(s: &mut TestServer, me: ClientId, l: &mut LocalLock, d: Decision, now: u64) -> Status {
    let Decision::Send(req) = d else {
        panic!("{d:?} was answered locally")
    };
    let r = run(s, me, Command::Lock(req.command()), now);
    // A server without a session key proves nothing.
    l.apply(&req, &r, crate::GrantProof::NONE, None, now)
}

/// `a` holds the fair lock with a 100 ms lease; `b` and then `c` queue exclusive behind it, so
/// `c`'s retry after the lease preempts past `b`'s ticket. Returns each client with its record:
/// `b` ticketed (its ticket passed), `c` holding the lock.
fn b_passed_by_c(s: &mut TestServer) -> [(ClientId, LocalLock); 3] {
    let mut all = [0; 3].map(|_| {
        let c = s.client(0);
        let id = s.get_lock(c.get(), LockKind::Fair, b"f", 0).unwrap();
        (c, LocalLock::new(id, LockKind::Fair))
    });
    for (i, (who, rec)) in all.iter_mut().enumerate() {
        let d = rec.trylock(Mode::Exclusive, LEASE_MS, 0);
        let want = if i == 0 {
            Status::Success
        } else {
            Status::Eagain
        };
        assert_eq!(call(s, *who, rec, d, 0), want, "client {i}");
    }
    let (c, rec) = &mut all[2];
    let d = rec.trylock(Mode::Exclusive, LEASE_MS, 0);
    assert_eq!(
        call(s, *c, rec, d, u64::from(LEASE_MS) + 1),
        Status::Success,
        "c preempts the overdue holder, past b"
    );
    let (b, rec) = all[1];
    assert_eq!(rec.state, LocalState::ExclusiveTicketed);
    let slot = s.client_slot_of(b.get()).unwrap();
    assert_eq!(
        s.recorded_hold(slot, rec.id.index()),
        GrantState::None,
        "the preemption forgot b's ticket"
    );
    all
}

/// `c` unlocks what it holds.
fn c_unlocks(s: &mut TestServer, (c, rec): &mut (ClientId, LocalLock), now: u64) {
    let d = rec.unlock();
    assert_eq!(call(s, *c, rec, d, now), Status::Success);
}

#[test]
fn a_retry_with_a_ticket_a_preemption_passed_fails_and_the_record_starts_over() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let [_, (b, mut b_rec), mut c] = b_passed_by_c(&mut s);
    let now = u64::from(LEASE_MS) + 2;
    let d = b_rec.trylock(Mode::Exclusive, LEASE_MS, 0);
    assert_eq!(call(&mut s, b, &mut b_rec, d, now), Status::Fail);
    assert_eq!(
        b_rec.state,
        LocalState::Initialized,
        "the record starts over"
    );
    // The next call is a first attempt again, which queues behind c with a fresh ticket.
    let d = b_rec.trylock(Mode::Exclusive, LEASE_MS, 0);
    assert!(matches!(d, Decision::Send(r) if r.command().op == LockOp::TryExclusive));
    assert_eq!(call(&mut s, b, &mut b_rec, d, now), Status::Eagain);
    assert_eq!(b_rec.state, LocalState::ExclusiveTicketed);
    // And it is b's turn once c unlocks.
    c_unlocks(&mut s, &mut c, now);
    let d = b_rec.trylock(Mode::Exclusive, LEASE_MS, 0);
    assert_eq!(call(&mut s, b, &mut b_rec, d, now), Status::Success);
}

#[test]
fn a_waiting_retry_with_a_passed_ticket_queues_again_instead_of_failing() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let [_, (b, mut b_rec), mut c] = b_passed_by_c(&mut s);
    let now = u64::from(LEASE_MS) + 2;
    let Decision::Send(req) = b_rec.trylock(Mode::Exclusive, LEASE_MS, 5_000) else {
        panic!("a ticketed record retries with its ticket")
    };
    assert_eq!(req.command().op, LockOp::TicketExclusive);
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
        plain: false,
    }];
    let parked = s
        .execute_message(b.get(), 0, &[Command::Lock(req.command())], &mut r, now)
        .unwrap();
    assert_eq!(
        parked,
        Disposition::Deferred,
        "queued afresh behind c, waiting"
    );
    c_unlocks(&mut s, &mut c, now);
    let mut got = Vec::new();
    s.take_replies(|w| got.push(w));
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].command.op,
        LockOp::TicketExclusive,
        "the op b sent, echoed"
    );
    assert_eq!(
        b_rec.apply(&req, &got[0].result, got[0].proof, None, now),
        Status::Success
    );
    assert_eq!(b_rec.state, LocalState::ExclusiveLocked);
}
