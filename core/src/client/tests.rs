//! Tests of the client-side lock records: states, claims, leases, replies.

use super::*;
use LocalState::*;
use LockKind::{Atomic, Fair, Rw};
use LockOp::*;
use Mode::{Exclusive as EX, Shared as SH};
use Status::*;

#[rustfmt::skip]
const STATES: [LocalState; 6] =
    [Initialized, ExclusiveLocked, SharedLocked, Unlocked, ExclusiveTicketed, SharedTicketed];
/// A fair ticket, and the same ticket as a fair `Eagain` reply's `aux` carries it.
const T: Ticket = t(7, 3);
const T_AUX: u64 = 0x0003_0007;
const NO_T: Ticket = t(0, 0);
/// The proof every reply in these tests carries.
const P: GrantProof = GrantProof {
    epoch: 2,
    mac: [7; GrantProof::LEN],
};

const fn t(exclusive: u16, shared: u16) -> Ticket {
    Ticket { exclusive, shared }
}

fn lock(kind: LockKind, state: LocalState, refs: u32) -> LocalLock {
    let ticket = if kind == Fair { T } else { NO_T };
    let mut l = LocalLock::new(LockId::new(5, 1), kind);
    (l.state, l.refs, l.ticket) = (state, refs, ticket);
    l
}

/// The fields a transition is about: state, count, ticket and token.
fn shape(l: &LocalLock) -> (LocalState, u32, Ticket, u64) {
    (l.state, l.refs, l.ticket, l.token.0)
}

#[track_caller]
fn req(d: Decision) -> LockCommand {
    match d {
        Decision::Send(r) => r.command(),
        Decision::Answer(s) => panic!("answered {s} locally, expected a request"),
    }
}

/// Sends what `d` asks and applies the reply `(status, word, aux)` at `now_ms`.
#[track_caller]
fn round(l: &mut LocalLock, d: Decision, r: (Status, u128, u64), now_ms: u64) -> Status {
    let Decision::Send(sent) = d else {
        panic!("{d:?} is not a request")
    };
    let (status, word, aux) = r;
    l.apply(
        &sent,
        &CommandResult {
            status,
            word,
            aux,
            plain: false,
        },
        P,
        None,
        now_ms,
    )
}

/// What the table expects: send this op, send it as a relock, or answer locally.
#[derive(Clone, Copy, Debug, PartialEq)]
enum E {
    S(LockOp),
    R(LockOp),
    A(Status),
}
use E::{A, R, S};

#[test]
fn every_state_kind_and_operation_decides_as_the_table_says() {
    const INV: E = A(Einval);
    const GONE: E = A(AlreadyUnlocked);
    const AGAIN: E = A(AlreadyLocked);
    // Columns: trylock EX, trylock SH, unlock (refs 1), unlock (refs 2), extend EX, extend
    // SH. Rows: `STATES` in order. Unformatted so that each row reads as a table row.
    let idle = [S(TryExclusive), S(TryShared), GONE, GONE, INV, INV];
    let idle_atomic = [S(TryExclusive), INV, GONE, GONE, INV, INV];
    #[rustfmt::skip]
    let tables = [
        (Atomic, [
            idle_atomic,
            [R(ExtendExclusive), INV, S(UnlockExclusive), AGAIN, S(ExtendExclusive), INV],
            [INV; 6],
            idle_atomic,
            [INV; 6],
            [INV; 6],
        ]),
        (Rw, [
            idle,
            [AGAIN, INV, S(UnlockExclusive), AGAIN, INV, INV],
            [INV, AGAIN, S(UnlockShared), AGAIN, INV, INV],
            idle,
            [INV; 6],
            [INV; 6],
        ]),
        (Fair, [
            idle,
            [R(ExtendExclusive), INV, S(UnlockExclusive), AGAIN, S(ExtendExclusive), INV],
            [INV, R(ExtendShared), S(UnlockShared), AGAIN, INV, S(ExtendShared)],
            idle,
            [S(TicketExclusive), A(Eticket), S(UnlockExclusive), S(UnlockExclusive), INV, INV],
            [A(Eticket), S(TicketShared), S(UnlockShared), S(UnlockShared), INV, INV],
        ]),
    ];
    for (kind, table) in tables {
        for (state, row) in STATES.into_iter().zip(table) {
            for (col, want) in row.into_iter().enumerate() {
                let held = u32::from(state.held_mode().is_some());
                let refs = if col == 3 { 2 * held } else { held };
                let before = lock(kind, state, refs);
                let mut after = before;
                let got = match col {
                    0 => after.trylock(EX, 100, 0),
                    1 => after.trylock(SH, 100, 0),
                    2 | 3 => after.unlock(),
                    4 => after.extend(EX, 100),
                    _ => after.extend(SH, 100),
                };
                let got = match got {
                    Decision::Send(r) if r.is_relock() => R(r.command().op),
                    Decision::Send(r) => S(r.command().op),
                    Decision::Answer(s) => A(s),
                };
                let at = format!("{kind:?} {state:?} column {col}");
                assert_eq!(got, want, "{at}");
                // Only the two local re-entrancy answers change the record, by one.
                let refs = match (got, col) {
                    (AGAIN, 0 | 1) => refs + 1,
                    (AGAIN, _) => refs - 1,
                    _ => refs,
                };
                assert_eq!(after, LocalLock { refs, ..before }, "{at}");
            }
        }
    }
}

#[test]
fn commands_carry_expiry_wait_and_ticket_where_the_server_reads_them() {
    let fields = |d| {
        let c = req(d);
        (c.lock, c.kind, c.expire_ms, c.wait_ms, c.ticket)
    };
    let id = LockId::new(5, 1).raw();
    let mut l = lock(Fair, Initialized, 0);
    assert_eq!(fields(l.trylock(SH, 25, 4)), (id, Fair, 25, 4, NO_T));
    l.state = SharedTicketed;
    assert_eq!(fields(l.trylock(SH, 25, 4)), (id, Fair, 25, 4, T));
    (l.state, l.refs) = (SharedLocked, 1);
    // A re-entry refreshes the lease but must not ask to wait (the server refuses that).
    assert_eq!(fields(l.trylock(SH, 25, 4)), (id, Fair, 25, 0, T));
    assert_eq!(fields(l.extend(SH, 9)), (id, Fair, 9, 0, T));
    assert_eq!(fields(l.unlock()), (id, Fair, 0, 0, T));
    // Only fair locks put a ticket on the wire, whatever the record says.
    let mut atomic = lock(Atomic, ExclusiveLocked, 1);
    atomic.ticket = T;
    assert_eq!(fields(atomic.unlock()), (id, Atomic, 0, 0, NO_T));
}

#[test]
fn zero_expiry_answers_success_from_the_cache_without_a_round_trip() {
    for kind in [Atomic, Rw, Fair] {
        for (state, refs) in [(Initialized, 0), (ExclusiveLocked, 1), (Unlocked, 0)] {
            let mut l = lock(kind, state, refs);
            assert_eq!(l.trylock(EX, 0, 0), Decision::Answer(Success));
            assert_eq!(l, lock(kind, state, refs), "{kind:?} {state:?}");
        }
    }
    // The atomic shared check comes first, as in the reference.
    let mut l = lock(Atomic, Initialized, 0);
    assert_eq!(l.trylock(SH, 0, 0), Decision::Answer(Einval));
}

#[test]
fn grant_locks_with_one_reference_its_token_and_a_lease_from_now() {
    let mut l = lock(Atomic, Unlocked, 0);
    let d = l.trylock(EX, 300, 0);
    assert_eq!(round(&mut l, d, (Success, 0xAB, 42), 1_000), Success);
    assert_eq!(shape(&l), (ExclusiveLocked, 1, NO_T, 42));
    assert_eq!((l.word, l.granted_at_ms, l.expire_ms), (0xAB, 1_000, 300));
    assert_eq!(l.proof, P, "the grant's proof is kept with it");
    // A fair grant's ticket is the one the server wrote into the word's `mx`/`ms`.
    let mut f = lock(Fair, Initialized, 0);
    let word = FairWord::new().with_nx(9).with_mx(11).with_ms(4);
    let d = f.trylock(SH, 300, 0);
    assert_eq!(round(&mut f, d, (Success, word.into(), 8), 5), Success);
    assert_eq!(shape(&f), (SharedLocked, 1, t(11, 4), 8));
}

#[test]
fn relock_success_counts_a_reentry_and_reports_already_locked() {
    let mut l = lock(Fair, ExclusiveLocked, 1);
    l.token = FencingToken(77);
    let d = l.trylock(EX, 100, 0);
    assert_eq!(l.refs, 1, "nothing is counted before the reply");
    assert_eq!(round(&mut l, d, (Success, 1, 99), 0), AlreadyLocked);
    // An extend reply's aux is the lock's latest fence, not necessarily this grant's; an
    // extend proves nothing new either (the grant's proof stays the grant's).
    assert_eq!(shape(&l), (ExclusiveLocked, 2, T, 77));
    assert_eq!(l.proof, GrantProof::NONE);
}

#[test]
fn extend_keeps_the_count_and_lengthens_the_lease_counted_from_the_grant() {
    let mut l = lock(Atomic, ExclusiveLocked, 1);
    (l.granted_at_ms, l.expire_ms) = (1_000, 500);
    let d = l.extend(EX, 800);
    assert_eq!(round(&mut l, d, (Success, 3, 0), 1_400), Success);
    assert_eq!((l.refs, l.word), (1, 3));
    assert_eq!((l.granted_at_ms, l.expire_ms), (1_000, 1_200));
    // A shorter extend never shortens the lease, and extend(0) only re-validates.
    for (expire, now) in [(100, 1_500), (0, 5_000)] {
        let d = l.extend(EX, expire);
        assert_eq!(round(&mut l, d, (Success, 3, 0), now), Success);
        assert_eq!(l.expire_ms, 1_200, "extend({expire}) at {now}");
    }
}

#[test]
fn fair_queue_retry_grant_and_unlock_carry_the_ticket() {
    let mut l = lock(Fair, Initialized, 0);
    let d = l.trylock(SH, 100, 0);
    assert_eq!(round(&mut l, d, (Eagain, 6, T_AUX), 0), Eagain);
    assert_eq!(
        (shape(&l), l.word, l.proof),
        ((SharedTicketed, 0, T, 0), 6, P)
    );
    assert_eq!(l.trylock(EX, 100, 0), Decision::Answer(Eticket));
    // Still queued after a retry: the retry's Eagain keeps the ticket.
    let d = l.trylock(SH, 100, 0);
    assert_eq!((req(d).op, req(d).ticket), (TicketShared, T));
    assert_eq!(round(&mut l, d, (Eagain, 6, T_AUX), 10), Eagain);
    let word = FairWord::new().with_nx(7).with_ns(3).with_mx(7).with_ms(3);
    let d = l.trylock(SH, 100, 0);
    assert_eq!(round(&mut l, d, (Success, word.into(), 21), 20), Success);
    assert_eq!(shape(&l), (SharedLocked, 1, T, 21));
    assert_eq!(
        (req(l.unlock()).op, req(l.unlock()).ticket),
        (UnlockShared, T)
    );
}

#[test]
fn unlock_leaves_unlocked_and_abandoning_a_ticket_starts_over() {
    let mut l = lock(Rw, SharedLocked, 1);
    l.token = FencingToken(4);
    let d = l.unlock();
    assert_eq!(round(&mut l, d, (Success, 9, 4), 0), Success);
    assert_eq!((shape(&l), l.word), ((Unlocked, 0, NO_T, 0), 9));
    let mut q = lock(Fair, ExclusiveTicketed, 0);
    let d = q.unlock();
    assert_eq!(round(&mut q, d, (Success, 0, 0), 0), Success);
    assert_eq!(q, LocalLock::new(q.id, Fair), "the ticket is forgotten");
}

#[test]
fn only_an_exclusive_rw_grant_downgrades_and_keeps_its_count_token_and_block() {
    for kind in [Atomic, Rw, Fair] {
        for state in STATES {
            let l = lock(kind, state, u32::from(state.held_mode().is_some()));
            let d = l.downgrade();
            if (kind, state) == (Rw, ExclusiveLocked) {
                assert_eq!(req(d).op, Downgrade);
            } else {
                assert_eq!(d, Decision::Answer(Einval), "{kind:?} {state:?}");
            }
        }
    }
    let mut l = lock(Rw, ExclusiveLocked, 2);
    l.token = FencingToken(4);
    assert_eq!(l.stage_value(block(7)), Success);
    let Decision::Send(sent) = l.downgrade() else {
        panic!("an exclusive RW grant downgrades on the server")
    };
    // The staged block ends the exclusive turn with the downgrade.
    assert_eq!(sent.value_block(), Some(block(7)));
    assert!(sent.command().flags.contains(LockFlags::VALUE_BLOCK));
    let reply = CommandResult {
        status: Success,
        word: 9,
        aux: 4,
        plain: false,
    };
    assert_eq!(l.apply(&sent, &reply, P, None, 5), Success);
    assert_eq!(shape(&l), (SharedLocked, 2, NO_T, 4));
    assert_eq!((l.word, l.write), (9, None));
    // Refused (the server no longer knows the grant): forgotten, as for any request.
    let mut r = lock(Rw, ExclusiveLocked, 1);
    let d = r.downgrade();
    assert_eq!(round(&mut r, d, (Fail, 0, 0), 5), Fail);
    assert_eq!(r.state, Initialized);
}

#[test]
fn fail_resets_to_initialized_for_every_operation() {
    type Call = fn(&mut LocalLock) -> Decision;
    let cases: [(LockKind, LocalState, Call); 6] = [
        (Atomic, Unlocked, |l| l.trylock(EX, 100, 0)),
        (Atomic, ExclusiveLocked, |l| l.trylock(EX, 100, 0)),
        (Fair, SharedTicketed, |l| l.trylock(SH, 100, 0)),
        (Rw, ExclusiveLocked, |l| l.unlock()),
        (Fair, SharedLocked, |l| l.extend(SH, 100)),
        (Fair, ExclusiveLocked, |l| l.unlock()),
    ];
    for (kind, state, call) in cases {
        let mut l = lock(kind, state, u32::from(state.held_mode().is_some()));
        (l.token, l.granted_at_ms, l.expire_ms) = (FencingToken(3), 10, 20);
        let d = call(&mut l);
        assert_eq!(round(&mut l, d, (Fail, 5, 0), 50), Fail);
        let fresh = LocalLock::new(l.id, kind);
        assert_eq!(l, LocalLock { word: 5, ..fresh }, "{kind:?} {state:?}");
    }
}

#[test]
fn fair_wait_timeout_drops_the_ticket() {
    let mut l = lock(Fair, ExclusiveTicketed, 0);
    let d = l.trylock(EX, 100, 2_000);
    assert_eq!(round(&mut l, d, (Etimeout, 0, 0), 0), Etimeout);
    assert_eq!(shape(&l), (Initialized, 0, NO_T, 0));
    assert_eq!(req(l.trylock(EX, 100, 0)).op, TryExclusive);
}

#[test]
fn other_statuses_leave_the_record_unchanged() {
    for status in [
        NotReady,
        BadResponse,
        Einval,
        LockNotGet,
        Eticket,
        AlreadyLocked,
    ] {
        let mut l = lock(Fair, SharedLocked, 2);
        let d = l.trylock(SH, 100, 0);
        assert_eq!(round(&mut l, d, (status, 1, 1), 0), status);
        assert_eq!(l, lock(Fair, SharedLocked, 2), "{status}");
    }
    // Eagain from a non-fair lock (an undone all-or-nothing entry) is not a ticket, and
    // Etimeout from a waiting RW trylock leaves nothing to drop.
    for (status, kind) in [(Eagain, Atomic), (Etimeout, Rw)] {
        let mut l = lock(kind, Unlocked, 0);
        let d = l.trylock(EX, 100, 10);
        assert_eq!(round(&mut l, d, (status, 1, 1), 0), status);
        assert_eq!(l, lock(kind, Unlocked, 0), "{status} {kind:?}");
    }
}

#[test]
fn reentry_sends_only_the_last_unlock_to_the_server() {
    // Atomic and fair locks re-enter with an extend, RW locally; all count the unlocks.
    for (kind, mode) in [(Atomic, EX), (Rw, SH), (Fair, SH)] {
        let mut l = lock(kind, Initialized, 0);
        let d = l.trylock(mode, 100, 0);
        assert_eq!(round(&mut l, d, (Success, 0, 1), 0), Success);
        match l.trylock(mode, 100, 0) {
            Decision::Answer(s) => assert_eq!((kind, s), (Rw, AlreadyLocked)),
            d => assert_eq!(round(&mut l, d, (Success, 0, 1), 0), AlreadyLocked),
        }
        assert_eq!(l.refs, 2, "{kind:?}");
        assert_eq!(l.unlock(), Decision::Answer(AlreadyLocked), "{kind:?}");
        let d = l.unlock();
        assert_eq!(req(d).op.mode(), mode, "{kind:?}");
        assert_eq!(round(&mut l, d, (Success, 0, 1), 0), Success);
        assert_eq!(l.unlock(), Decision::Answer(AlreadyUnlocked), "{kind:?}");
    }
}

#[test]
fn reentry_refuses_rather_than_wrap_the_count() {
    let mut l = lock(Rw, ExclusiveLocked, u32::MAX);
    assert_eq!(l.trylock(EX, 100, 0), Decision::Answer(Einval));
    assert_eq!(l.refs, u32::MAX);
}

#[test]
fn releasable_only_when_nothing_is_held_or_queued() {
    let (held, ticket) = (Err(Fail), Err(TicketToUnlock));
    let want = [Ok(()), held, held, Ok(()), ticket, ticket];
    for (state, want) in STATES.into_iter().zip(want) {
        assert_eq!(lock(Fair, state, 0).releasable(), want, "{state:?}");
    }
}

#[test]
fn claim_reports_what_is_held_with_a_saturating_lease() {
    let mut l = lock(Fair, SharedLocked, 1);
    (l.token, l.granted_at_ms, l.expire_ms) = (FencingToken(9), 1_000, 500);
    let lease = |now: u64| l.claim(now).map(|c| (c.remaining_ms, c.age_ms));
    assert_eq!(
        lease(1_200),
        Some((301, 199)),
        "a tick less: ticks truncate"
    );
    assert_eq!(
        lease(1_001),
        Some((500, 0)),
        "one tick may be no time at all"
    );
    assert_eq!(
        lease(1_501),
        Some((0, 500)),
        "past the lease by more than a tick"
    );
    assert_eq!(lease(9_000), Some((0, 7_999)), "expired: nothing left");
    assert_eq!(lease(10), Some((500, 0)), "a clock behind the grant");
    assert_eq!(lease(1 << 40), Some((0, u32::MAX)), "the age clamps");
    let what = |l: LocalLock| l.claim(5).map(|c| (c.held, c.ticket, c.token));
    assert_eq!(what(l), Some((Held::Shared, T, 9)));
    let proven = LocalLock { proof: P, ..l };
    assert_eq!(
        proven.claim(5).map(|c| c.proof),
        Some(P),
        "the claim shows it"
    );
    let queued = lock(Fair, SharedTicketed, 0);
    assert_eq!(what(queued), Some((Held::Ticketed(SH), T, 0)));
    let mut x = lock(Atomic, ExclusiveLocked, 1);
    (x.token, x.ticket) = (FencingToken(2), T);
    assert_eq!(
        what(x),
        Some((Held::Exclusive, NO_T, 2)),
        "only fair has tickets"
    );
    let idle = LocalLock {
        ticket: T,
        ..lock(Fair, Unlocked, 0)
    };
    assert_eq!(what(idle), Some((Held::Reference, NO_T, 0)));
    assert_eq!(
        what(lock(Rw, SharedTicketed, 0)),
        None,
        "RW locks hold no tickets"
    );
}

fn block(b: u8) -> ValueBlock {
    ValueBlock([b; 32])
}

#[test]
fn acquisitions_ask_for_the_value_block_when_the_record_asks_and_nothing_else_does() {
    let flags = |d| req(d).flags;
    for kind in [Atomic, Rw, Fair] {
        let mut l = lock(kind, Initialized, 0);
        assert_eq!(flags(l.trylock(EX, 100, 0)), LockFlags::NONE, "{kind:?}");
        l.ask = LockFlags::VALUE_BLOCK;
        assert_eq!(flags(l.trylock(EX, 100, 5)), LockFlags::VALUE_BLOCK);
        // An extend (or a relock sent as one) returns no block: the op may not carry it.
        (l.state, l.refs) = (ExclusiveLocked, 1);
        if kind != Rw {
            assert_eq!(flags(l.extend(EX, 100)), LockFlags::NONE, "{kind:?}");
            assert_eq!(flags(l.trylock(EX, 100, 0)), LockFlags::NONE, "{kind:?}");
        }
        // Unlocking with nothing staged writes nothing.
        assert_eq!(flags(l.unlock()), LockFlags::NONE, "{kind:?}");
    }
    let mut queued = lock(Fair, SharedTicketed, 0);
    queued.ask = LockFlags::VALUE_BLOCK;
    assert_eq!(flags(queued.trylock(SH, 100, 0)), LockFlags::VALUE_BLOCK);
}

#[test]
fn a_grant_keeps_the_block_its_reply_carried_until_it_ends() {
    let read = ValueRead {
        block: block(4),
        seq: 3,
        valid: false,
    };
    let mut l = lock(Fair, Initialized, 0);
    l.ask = LockFlags::VALUE_BLOCK;
    let Decision::Send(sent) = l.trylock(EX, 100, 0) else {
        panic!("a first attempt is sent")
    };
    let ok = CommandResult {
        status: Success,
        word: 0,
        aux: 9,
        plain: false,
    };
    assert_eq!(l.apply(&sent, &ok, P, Some(read), 10), Success);
    assert_eq!(l.value, Some(read));
    assert_eq!(
        l.claim(20).and_then(|c| c.value),
        Some(read),
        "a claim offers it"
    );
    let Decision::Send(relock) = l.trylock(EX, 100, 0) else {
        panic!("a fair re-entry is sent")
    };
    assert_eq!(l.apply(&relock, &ok, P, None, 11), AlreadyLocked);
    assert_eq!(l.value, Some(read), "a relock keeps the grant's block");
    // Two unlocks: the first only counts down, the second releases and forgets.
    assert_eq!(l.unlock(), Decision::Answer(AlreadyLocked));
    let Decision::Send(unlock) = l.unlock() else {
        panic!("the last unlock is sent")
    };
    assert_eq!(l.apply(&unlock, &ok, P, None, 12), Success);
    assert_eq!((l.value, l.write), (None, None));
    assert_eq!(l.claim(13).and_then(|c| c.value), None);
}

#[test]
fn only_an_exclusive_grant_stages_a_block_and_its_releasing_unlock_carries_it() {
    for (kind, state) in [
        (Atomic, Initialized),
        (Rw, SharedLocked),
        (Fair, ExclusiveTicketed),
    ] {
        let mut l = lock(kind, state, u32::from(state == SharedLocked));
        assert_eq!(l.stage_value(block(1)), Einval, "{kind:?} {state:?}");
        assert_eq!(l.write, None);
    }
    let mut l = lock(Rw, ExclusiveLocked, 2);
    assert_eq!(l.stage_value(block(1)), Success);
    assert_eq!(l.stage_value(block(2)), Success, "the last staged wins");
    // A count-down keeps it staged for the unlock that releases.
    assert_eq!(l.unlock(), Decision::Answer(AlreadyLocked));
    assert_eq!(l.write, Some(block(2)));
    let Decision::Send(sent) = l.unlock() else {
        panic!("the releasing unlock is sent")
    };
    assert_eq!(sent.command().flags, LockFlags::VALUE_BLOCK);
    assert_eq!(sent.value_block(), Some(block(2)));
    // Lost instead (`Fail`): the staged block goes with the grant.
    let mut lost = lock(Atomic, ExclusiveLocked, 1);
    assert_eq!(lost.stage_value(block(3)), Success);
    let Decision::Send(sent) = lost.unlock() else {
        panic!("sent")
    };
    let fail = CommandResult {
        status: Fail,
        word: 0,
        aux: 0,
        plain: false,
    };
    assert_eq!(lost.apply(&sent, &fail, P, None, 1), Fail);
    assert_eq!(lost.write, None);
}

#[test]
fn abandoning_a_fair_ticket_writes_no_block() {
    let mut l = lock(Fair, ExclusiveTicketed, 0);
    l.write = Some(block(5));
    let Decision::Send(sent) = l.unlock() else {
        panic!("an abandon is sent")
    };
    assert_eq!(
        (sent.command().flags, sent.value_block()),
        (LockFlags::NONE, None)
    );
}
