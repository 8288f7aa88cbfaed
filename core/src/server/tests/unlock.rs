//! Who may unlock (security review, issue 9): every lock kind × unlock mode, sent by a client
//! that holds no grant of that mode, is refused with the reference's answer to an unlock that is
//! not the caller's (`Fail`; `Einval` for a mode the kind does not have) and changes nothing —
//! not the word, not anyone's holds, not the holder's ability to unlock.
//!
//! The one unlock a non-holder may send is a fair-lock ticket holder's: it abandons the caller's
//! own ticket (the transport's client sends it so the queue need not stall and `release_lock`
//! is possible again), and these tests pin that it touches nothing but that ticket.

use super::*;
use crate::LockKind;
use crate::ids::{LockId, Ticket};
use crate::manager::GrantState;
use crate::proto::{Command, CommandResult, LockCommand, LockOp};
use crate::table::LockCell;
use crate::word::fair::FairWord;

/// Registers a client: the one place these tests spell out `client_init`'s arguments.
fn register(s: &mut TestServer) -> ClientId {
    s.client(0)
}

/// Two clients with a reference each to the same lock: `a` will hold it, `b` will try to unlock.
struct Pair {
    a: ClientId,
    b: ClientId,
    la: LockId,
    lb: LockId,
}

fn pair(s: &mut TestServer, kind: LockKind) -> Pair {
    let a = register(s);
    let b = register(s);
    let la = s.get_lock(a.get(), kind, b"contested", 0).unwrap();
    let lb = s.get_lock(b.get(), kind, b"contested", 0).unwrap();
    Pair { a, b, la, lb }
}

fn run(s: &mut TestServer, client: ClientId, kind: LockKind, op: LockOp, id: LockId) -> Status {
    run_with(s, client, kind, op, id, ticket_now(s, id)).status
}

fn run_with(
    s: &mut TestServer,
    client: ClientId,
    kind: LockKind,
    op: LockOp,
    id: LockId,
    ticket: Ticket,
) -> CommandResult {
    let cmd = Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms: 60_000,
        ticket,
        wait_ms: 0,
        partition_epoch: 0,
        flags: crate::proto::LockFlags::NONE,
    });
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
        plain: false,
    }];
    s.execute_message(client.get(), 0, &[cmd], &mut r, 1)
        .unwrap();
    r[0]
}

/// The ticket a fair-lock holder at the serving position unlocks with, `(nx, ns)`: what an
/// intruder who read the word would send so that the word's own checks pass. (Atomic and RW
/// commands ignore it.)
fn ticket_now(s: &Server<'_>, id: LockId) -> Ticket {
    let w = FairWord::from_bits(s.t.lock_cells[id.index() as usize].word);
    Ticket {
        exclusive: w.nx(),
        shared: w.ns(),
    }
}

fn hold(s: &Server<'_>, client: ClientId, id: LockId) -> GrantState {
    let slot = s.client_slot(client.get()).unwrap();
    s.recorded_hold(slot, id.index())
}

fn cell(s: &Server<'_>, id: LockId) -> LockCell {
    s.t.lock_cells[id.index() as usize]
}

/// `a` takes the lock with `take`; `b`, holding nothing, sends `unlock` and gets `refused`;
/// the tables are as they were; `a` then unlocks with its own `release`.
fn intruder_unlock_is_refused(
    kind: LockKind,
    take: LockOp,
    unlock: LockOp,
    refused: Status,
    release: LockOp,
) {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let p = pair(&mut s, kind);
    assert_eq!(run(&mut s, p.a, kind, take, p.la), Status::Success);
    let held = hold(&s, p.a, p.la);
    assert_eq!(hold(&s, p.b, p.lb), GrantState::None);
    let before = s.tables().digest();
    assert_eq!(
        run(&mut s, p.b, kind, unlock, p.lb),
        refused,
        "{kind:?}: {unlock:?} from a client holding nothing, lock taken with {take:?}"
    );
    assert_eq!(
        s.tables().digest(),
        before,
        "a refused unlock changed the tables"
    );
    assert_eq!(hold(&s, p.a, p.la), held);
    assert_eq!(run(&mut s, p.a, kind, release, p.la), Status::Success);
    assert_eq!(hold(&s, p.a, p.la), GrantState::None);
}

#[test]
fn atomic_exclusive_unlock_from_non_owner_fails_and_changes_nothing() {
    use LockOp::*;
    intruder_unlock_is_refused(
        LockKind::Atomic,
        TryExclusive,
        UnlockExclusive,
        Status::Fail,
        UnlockExclusive,
    );
}

#[test]
fn atomic_shared_unlock_is_invalid_and_changes_nothing() {
    use LockOp::*;
    // Atomic locks have no shared mode: the op itself is refused, whoever sends it.
    intruder_unlock_is_refused(
        LockKind::Atomic,
        TryExclusive,
        UnlockShared,
        Status::Einval,
        UnlockExclusive,
    );
}

#[test]
fn rw_exclusive_unlock_from_non_owner_fails_and_changes_nothing() {
    use LockOp::*;
    for (take, release) in [(TryExclusive, UnlockExclusive), (TryShared, UnlockShared)] {
        intruder_unlock_is_refused(LockKind::Rw, take, UnlockExclusive, Status::Fail, release);
    }
}

#[test]
fn rw_shared_unlock_from_non_reader_fails_and_changes_nothing() {
    use LockOp::*;
    for (take, release) in [(TryExclusive, UnlockExclusive), (TryShared, UnlockShared)] {
        intruder_unlock_is_refused(LockKind::Rw, take, UnlockShared, Status::Fail, release);
    }
}

#[test]
fn fair_exclusive_unlock_from_non_owner_fails_and_changes_nothing() {
    use LockOp::*;
    for (take, release) in [(TryExclusive, UnlockExclusive), (TryShared, UnlockShared)] {
        intruder_unlock_is_refused(LockKind::Fair, take, UnlockExclusive, Status::Fail, release);
    }
}

#[test]
fn fair_shared_unlock_from_non_reader_fails_and_changes_nothing() {
    use LockOp::*;
    // The case of the review: a fair lock held exclusively by `a`, a shared unlock from `b`.
    for (take, release) in [(TryExclusive, UnlockExclusive), (TryShared, UnlockShared)] {
        intruder_unlock_is_refused(LockKind::Fair, take, UnlockShared, Status::Fail, release);
    }
}

/// A holder unlocking in the mode it does not hold is refused too (no downgrade by unlock).
#[test]
fn unlock_in_the_mode_not_held_fails_and_changes_nothing() {
    use LockOp::*;
    let cases = [
        (LockKind::Rw, TryExclusive, UnlockShared, UnlockExclusive),
        (LockKind::Rw, TryShared, UnlockExclusive, UnlockShared),
        (LockKind::Fair, TryExclusive, UnlockShared, UnlockExclusive),
        (LockKind::Fair, TryShared, UnlockExclusive, UnlockShared),
    ];
    for (kind, take, wrong, release) in cases {
        let cfg = small();
        let mut s = TestServer::new(&cfg);
        let p = pair(&mut s, kind);
        assert_eq!(run(&mut s, p.a, kind, take, p.la), Status::Success);
        let before = s.tables().digest();
        assert_eq!(
            run(&mut s, p.a, kind, wrong, p.la),
            Status::Fail,
            "{kind:?}: {wrong:?} by the holder of {take:?}"
        );
        assert_eq!(s.tables().digest(), before);
        assert_eq!(run(&mut s, p.a, kind, release, p.la), Status::Success);
    }
}

/// The review saw `Success` for `b`'s shared unlock of a fair lock `a` held exclusively. That is
/// `b` abandoning the ticket its own shared attempt queued for: the word, the owner, the fence
/// and `a`'s record stay as they were, `a` still unlocks, and only `b`'s ticket is gone. An
/// unlock in the other mode is the reference's `DLOCK_ETICKET` and changes nothing at all: the
/// holds record says which mode the ticket is for.
#[test]
fn fair_unlock_from_a_queued_client_abandons_only_its_own_ticket() {
    use LockOp::*;
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let p = pair(&mut s, LockKind::Fair);
    let kind = LockKind::Fair;
    assert_eq!(run(&mut s, p.a, kind, TryExclusive, p.la), Status::Success);
    let queued = run_with(&mut s, p.b, kind, TryShared, p.lb, Ticket::default());
    assert_eq!(queued.status, Status::Eagain);
    let ticket = Ticket {
        exclusive: queued.aux as u16,
        shared: (queued.aux >> 16) as u16,
    };
    assert_eq!(hold(&s, p.b, p.lb), GrantState::TicketShared);
    let before = s.tables().digest();
    let wrong = run_with(&mut s, p.b, kind, UnlockExclusive, p.lb, ticket);
    assert_eq!(
        wrong.status,
        Status::Eticket,
        "the ticket is for a shared grant"
    );
    assert_eq!(
        s.tables().digest(),
        before,
        "a refused unlock changed nothing"
    );
    let before = cell(&s, p.la);
    let r = run_with(&mut s, p.b, kind, UnlockShared, p.lb, ticket);
    assert_eq!(
        r.status,
        Status::Success,
        "its own mode abandons the ticket"
    );
    let after = cell(&s, p.la);
    assert_eq!(
        (after.word, after.ext, after.fence),
        (before.word, before.ext, before.fence),
        "abandoning a ticket changed the lock"
    );
    assert_eq!(hold(&s, p.a, p.la), GrantState::Exclusive);
    assert_eq!(hold(&s, p.b, p.lb), GrantState::None);
    // The ticket is gone for good: a second unlock is an unlock by a non-holder.
    assert_eq!(run(&mut s, p.b, kind, UnlockShared, p.lb), Status::Fail);
    assert_eq!(
        run(&mut s, p.a, kind, UnlockExclusive, p.la),
        Status::Success
    );
    s.release_lock(p.b.get(), p.lb.raw(), 1).unwrap();
}

/// A retry of a queued ticket in the other mode is refused with `Eticket` and keeps the ticket
/// (before the holds record knew a ticket's mode, it reached the word and could disorder the
/// queue).
#[test]
fn fair_retry_in_the_other_mode_is_refused_and_keeps_the_ticket() {
    use LockOp::*;
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let p = pair(&mut s, LockKind::Fair);
    let kind = LockKind::Fair;
    assert_eq!(run(&mut s, p.a, kind, TryExclusive, p.la), Status::Success);
    let queued = run_with(&mut s, p.b, kind, TryExclusive, p.lb, Ticket::default());
    assert_eq!(queued.status, Status::Eagain);
    let ticket = Ticket {
        exclusive: queued.aux as u16,
        shared: (queued.aux >> 16) as u16,
    };
    let before = s.tables().digest();
    let wrong = run_with(&mut s, p.b, kind, TicketShared, p.lb, ticket);
    assert_eq!(wrong.status, Status::Eticket);
    assert_eq!(
        s.tables().digest(),
        before,
        "a refused retry changed nothing"
    );
    assert_eq!(hold(&s, p.b, p.lb), GrantState::TicketExclusive);
    assert_eq!(
        run(&mut s, p.a, kind, UnlockExclusive, p.la),
        Status::Success
    );
    let right = run_with(&mut s, p.b, kind, TicketExclusive, p.lb, ticket);
    assert_eq!(right.status, Status::Success, "the ticket is still good");
}

/// The authority to unlock is the server's record of the grant, not the word alone: a word that
/// names a client the holds record does not back (the two disagree only if an invariant broke)
/// does not let that client unlock, in any kind. Here the record is cleared by hand to stand in
/// for such a break.
#[test]
fn exclusive_unlock_needs_the_grant_in_the_holds_record() {
    for kind in [LockKind::Atomic, LockKind::Rw, LockKind::Fair] {
        let cfg = small();
        let mut s = TestServer::new(&cfg);
        let p = pair(&mut s, kind);
        assert_eq!(
            run(&mut s, p.a, kind, LockOp::TryExclusive, p.la),
            Status::Success
        );
        let slot = s.client_slot(p.a.get()).unwrap();
        s.t.lock_holds
            .set(slot, p.la.index(), GrantState::None.bits());
        let before = s.tables().digest();
        assert_eq!(
            run(&mut s, p.a, kind, LockOp::UnlockExclusive, p.la),
            Status::Fail,
            "{kind:?}: unlock without a recorded grant"
        );
        assert_eq!(s.tables().digest(), before);
    }
}
