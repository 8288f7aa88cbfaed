//! The server's guards ([`serve`]), one assertion per row of the module doc's tables.

use super::*;

const EX: Mode = Mode::Exclusive;
const SH: Mode = Mode::Shared;

fn t(exclusive: u16, shared: u16) -> Ticket {
    Ticket { exclusive, shared }
}

fn caller(hold: Hold) -> Caller {
    Caller {
        id: ClientId::new(7).unwrap(),
        hold,
    }
}

/// A lock whose counters are `(nx, ns, mx, ms)`, with `owner`, `rcnt` readers and `timeout`.
fn lock(counters: (u16, u16, u16, u16), owner: u32, rcnt: u8, timeout: u64) -> FairLock {
    let (nx, ns, mx, ms) = counters;
    let word = FairWord::new()
        .with_nx(nx)
        .with_ns(ns)
        .with_mx(mx)
        .with_ms(ms)
        .with_rcnt(rcnt)
        .with_timeout_ms(timeout);
    FairLock { word, owner }
}

/// Client 9 holds exclusive ticket (1, 0) until tick 100; ticket (2, 0) is queued behind it.
fn held() -> FairLock {
    lock((1, 0, 3, 0), 9, 0, 100)
}

/// The status and effect of `req` in `mode` from a caller with record `hold`, at tick 50.
fn run(s: FairLock, hold: Hold, mode: Mode, req: Request, expire_ms: u32) -> Served {
    serve(s, caller(hold), mode, req, expire_ms, 50)
}

fn refused(served: Served, s: FairLock, status: Status) {
    assert_eq!(served.outcome, Outcome::refused(s, status), "{served:?}");
    assert_eq!(served.ticket, None);
    assert!(!served.others_void);
}

#[test]
fn a_first_attempt_depends_on_what_the_caller_already_has() {
    let s = held();
    refused(run(s, Hold::None, EX, Request::First, 0), s, Status::Einval);
    refused(
        run(s, Hold::Ticketed, EX, Request::First, 10),
        s,
        Status::Eticket,
    );
    refused(
        run(s, Hold::Shared, SH, Request::First, 10),
        s,
        Status::AlreadyLocked,
    );
    refused(
        run(s, Hold::Shared, EX, Request::First, 10),
        s,
        Status::Einval,
    );
    refused(
        run(s, Hold::Exclusive, SH, Request::First, 10),
        s,
        Status::Einval,
    );
    // With nothing on record it is the word's first attempt, and the reply carries its ticket.
    let queued = run(s, Hold::None, EX, Request::First, 10);
    assert_eq!(
        queued.outcome,
        try_lock(s, caller(Hold::None).id, EX, 10, 50)
    );
    assert_eq!(queued.outcome.effect, Effect::Queued(t(3, 0)));
    assert_eq!(queued.ticket, Some(t(3, 0)));
    let idle = FairLock::default();
    let granted = run(idle, Hold::None, SH, Request::First, 10);
    assert_eq!(granted.outcome.status, Status::Success);
    assert_eq!(granted.ticket, Some(t(0, 0)));
}

#[test]
fn a_retry_needs_a_ticket_on_record_that_the_lock_issued() {
    let s = held();
    refused(
        run(s, Hold::Ticketed, EX, Request::Retry(t(2, 0)), 0),
        s,
        Status::Einval,
    );
    let none = run(s, Hold::None, EX, Request::Retry(t(2, 0)), 10);
    refused(none, s, Status::Fail);
    assert!(none.ticket_void, "a refused retry voids the ticket");
    let granted = run(s, Hold::Exclusive, EX, Request::Retry(t(2, 0)), 10);
    refused(granted, s, Status::Einval);
    assert!(!granted.ticket_void, "an Einval keeps the record");
    // Guard 1: ticket 3 (or a shared half beyond `ms`) was never handed out.
    for forged in [t(3, 0), t(2, 1)] {
        let void = run(s, Hold::Ticketed, EX, Request::Retry(forged), 10);
        refused(void, s, Status::Fail);
        assert!(void.ticket_void);
    }
    // A real ticket reaches the word: not its turn and the holder not late, so it waits.
    let waits = run(s, Hold::Ticketed, EX, Request::Retry(t(2, 0)), 10);
    assert_eq!(waits.outcome.effect, Effect::Queued(t(2, 0)));
    assert_eq!(waits.ticket, Some(t(2, 0)));
    assert!(!waits.ticket_void);
}

#[test]
fn ticket_issue_is_judged_per_mode() {
    let w = lock((1, 1, 3, 4), 0, 0, 0).word;
    assert!(
        issued(w, EX, t(2, 4)),
        "the shared half at the next shared ticket"
    );
    assert!(issued(w, EX, t(1, 0)));
    assert!(!issued(w, EX, t(3, 4)), "the exclusive half not yet issued");
    assert!(!issued(w, EX, t(2, 5)), "the shared half beyond the next");
    assert!(
        issued(w, SH, t(3, 3)),
        "the exclusive half at the next exclusive ticket"
    );
    assert!(!issued(w, SH, t(3, 4)), "the shared half not yet issued");
    assert!(!issued(w, SH, t(4, 3)));
}

#[test]
fn an_unlock_or_extend_needs_the_grant_or_abandons_the_ticket() {
    let s = held();
    let abandoned = run(s, Hold::Ticketed, SH, Request::Unlock(t(2, 0)), 0);
    assert_eq!(abandoned.outcome, Outcome::ok(s, Effect::Released(SH)));
    assert_eq!(abandoned.outcome.state, s, "the word is unchanged");
    let mine = lock((1, 0, 2, 0), 7, 0, 100);
    let me = caller(Hold::Exclusive).id;
    let unlocked = run(mine, Hold::Exclusive, EX, Request::Unlock(t(1, 0)), 0);
    assert_eq!(unlocked.outcome, unlock(mine, me, EX, t(1, 0), 50));
    assert_eq!(unlocked.outcome.effect, Effect::Released(EX));
    let extended = run(mine, Hold::Exclusive, EX, Request::Extend(t(1, 0)), 500);
    assert_eq!(extended.outcome, extend(mine, me, EX, t(1, 0), 500, 50));
    assert_eq!(extended.outcome.effect, Effect::Extended);
    for (hold, mode, req) in [
        (Hold::None, EX, Request::Unlock(t(1, 0))),
        (Hold::Shared, EX, Request::Unlock(t(1, 0))),
        (Hold::None, EX, Request::Extend(t(1, 0))),
        (Hold::Ticketed, EX, Request::Extend(t(1, 0))),
        (Hold::Exclusive, SH, Request::Extend(t(1, 0))),
    ] {
        refused(run(mine, hold, mode, req, 10), mine, Status::Fail);
    }
}

#[test]
fn a_writer_is_queued_rather_than_granted_beside_a_reader() {
    // A reader the counters do not show (a voided ticket revived after `rflag` reset): the word
    // alone would grant a writer.
    let s = lock((1, 2, 1, 2), 0, 1, 100);
    let me = caller(Hold::None).id;
    assert_eq!(try_lock(s, me, EX, 10, 50).status, Status::Success);
    let first = run(s, Hold::None, EX, Request::First, 10);
    assert_eq!(first.outcome.status, Status::Eagain);
    assert_eq!(first.outcome.effect, Effect::Queued(t(1, 2)));
    assert_eq!(
        first.outcome.state.word.mx(),
        2,
        "it still takes its ticket"
    );
    assert_eq!(first.outcome.state.owner, 0);
    let s = lock((1, 2, 2, 2), 0, 1, 100);
    let retry = run(s, Hold::Ticketed, EX, Request::Retry(t(1, 2)), 10);
    assert_eq!(retry.outcome, queued(s, t(1, 2)));
}

#[test]
fn a_preempting_grant_voids_everyone_elses_record() {
    // Holder 9's grant ran out at 100; the next ticket retries at 101 and preempts.
    let s = held();
    let won = serve(
        s,
        caller(Hold::Ticketed),
        EX,
        Request::Retry(t(2, 0)),
        10,
        101,
    );
    assert_eq!(
        won.outcome.effect,
        Effect::Granted {
            mode: EX,
            preempted: true
        }
    );
    assert!(won.others_void && !won.ticket_void);
    let plain = run(FairLock::default(), Hold::None, EX, Request::First, 10);
    assert!(!plain.others_void, "a grant that displaces nobody");
}
