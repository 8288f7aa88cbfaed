//! Tests of the client's cache: the decision tables case by case, and random event sequences
//! against a one-client server, checking the record's invariants after every step and that a
//! revoke is always answered once the local users are done.

use super::*;
use Mode::{Exclusive as EX, Shared as SH};
use proptest::prelude::*;

/// A record holding `held` (token 5) with `readers` shared users and maybe a writer.
fn cached(kind: LockKind, held: Option<Mode>, readers: u32, writer: bool) -> CachedLock {
    CachedLock {
        held,
        token: if held.is_some() { 5 } else { 0 },
        readers,
        writer,
        ..CachedLock::new(kind)
    }
}

#[test]
fn a_compatible_local_acquisition_and_release_send_nothing() {
    for (held, mode) in [(EX, EX), (EX, SH), (SH, SH)] {
        let mut l = cached(LockKind::Rw, Some(held), 0, false);
        assert_eq!(l.acquire(mode), Acquire::Local, "{held:?} covers {mode:?}");
        assert_eq!(l.release(mode), Release::Keep, "still cached");
        assert_eq!(l.held(), Some(held));
        assert_eq!(l.users(), (0, false));
    }
    let mut readers = cached(LockKind::Fair, Some(SH), 2, false);
    assert_eq!(readers.acquire(SH), Acquire::Local);
    assert_eq!(readers.users(), (3, false));
}

#[test]
fn a_grant_made_plain_goes_back_with_its_last_release_and_is_never_overdue() {
    for (asked, users) in [(EX, 1), (SH, 2)] {
        let mut l = CachedLock::new(LockKind::Rw);
        assert_eq!(l.acquire(asked), Acquire::Send(ServerOp::Acquire(asked)));
        assert_eq!(l.on_reply(Status::Success, 9), Reply::Granted);
        l.granted_plain();
        // No new local user: it asks again once the grant is back.
        assert_eq!(l.acquire(asked), Acquire::Wait, "{asked:?}");
        assert!(
            !l.revoke_overdue(u64::MAX - 1, 1),
            "a plain grant never lapses"
        );
        if users == 2 {
            // A second reader that came before the mark (taken locally, shared covers it).
            l.readers += 1;
            assert_eq!(l.release(SH), Release::Keep, "a reader remains");
        }
        assert_eq!(
            l.release(asked),
            Release::Send(ServerOp::GiveBack(asked)),
            "{asked:?}: the plain unlock"
        );
        assert_eq!(l.on_reply(Status::Success, 0), Reply::Settled);
        assert_eq!(l.held(), None);
        assert_eq!(l.revoke(), None, "the next grant starts clean");
    }
    // Nothing held (the acquisition was refused): nothing to mark.
    let mut l = CachedLock::new(LockKind::Rw);
    let _ = l.acquire(EX);
    let _ = l.on_reply(Status::Fail, 0);
    l.granted_plain();
    assert_eq!(l.revoke(), None);
}

#[test]
fn an_incompatible_acquisition_goes_to_the_server_or_waits() {
    let mut idle = cached(LockKind::Rw, None, 0, false);
    assert_eq!(idle.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
    assert_eq!(
        idle.acquire(SH),
        Acquire::Wait,
        "one request in flight per lock"
    );
    // Held, but a local user is in the way: wait for its release, no message.
    let mut busy = cached(LockKind::Rw, Some(EX), 0, true);
    assert_eq!(busy.acquire(SH), Acquire::Wait);
    let mut reading = cached(LockKind::Rw, Some(EX), 1, false);
    assert_eq!(reading.acquire(EX), Acquire::Wait);
    let mut shared = cached(LockKind::Rw, Some(SH), 1, false);
    assert_eq!(
        shared.acquire(EX),
        Acquire::Wait,
        "readers first, then a conversion"
    );
    assert_eq!(
        cached(LockKind::Atomic, None, 0, false).acquire(SH),
        Acquire::Refuse(Status::Einval)
    );
}

#[test]
fn a_grant_from_the_server_is_cached_for_the_next_users() {
    let mut l = cached(LockKind::Rw, None, 0, false);
    assert_eq!(l.acquire(SH), Acquire::Send(ServerOp::Acquire(SH)));
    assert_eq!(l.on_reply(Status::Success, 9), Reply::Granted);
    assert_eq!((l.held(), l.token(), l.users()), (Some(SH), 9, (1, false)));
    assert_eq!(l.acquire(SH), Acquire::Local);
    assert_eq!(l.release(SH), Release::Keep);
    assert_eq!(l.release(SH), Release::Keep);
    assert_eq!(l.release(SH), Release::Refuse(Status::AlreadyUnlocked));
    // A refused acquisition leaves nothing held.
    let mut r = cached(LockKind::Rw, None, 0, false);
    assert_eq!(r.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
    assert_eq!(r.on_reply(Status::Fail, 0), Reply::Refused(Status::Fail));
    assert_eq!((r.held(), r.users()), (None, (0, false)));
}

#[test]
fn a_conversion_gives_back_shared_then_asks_for_exclusive() {
    let mut l = cached(LockKind::Fair, Some(SH), 0, false);
    assert_eq!(l.acquire(EX), Acquire::Send(ServerOp::GiveBack(SH)));
    assert_eq!(l.on_reply(Status::Success, 0), Reply::AskAgain);
    assert_eq!(l.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
    assert_eq!(l.on_reply(Status::Success, 12), Reply::Granted);
    assert_eq!((l.held(), l.users()), (Some(EX), (0, true)));
}

#[test]
fn the_last_release_after_a_revoke_gives_back() {
    let mut l = cached(LockKind::Rw, Some(SH), 2, false);
    assert_eq!(
        l.on_revoke(EX, 5, 100),
        OnRevoke::Deferred,
        "the engine must finish its users"
    );
    assert_eq!(
        l.acquire(SH),
        Acquire::Wait,
        "no new local user once a revoke arrives"
    );
    assert_eq!(l.release(SH), Release::Keep);
    assert_eq!(l.release(SH), Release::Send(ServerOp::GiveBack(SH)));
    assert_eq!(
        l.on_revoke(EX, 5, 101),
        OnRevoke::Ignore,
        "the give-back is on its way"
    );
    assert_eq!(l.on_reply(Status::Success, 5), Reply::Settled);
    assert_eq!((l.held(), l.revoke()), (None, None));
    // An idle lock answers at once.
    let mut idle = cached(LockKind::Atomic, Some(EX), 0, false);
    assert_eq!(
        idle.on_revoke(SH, 5, 0),
        OnRevoke::Send(ServerOp::GiveBack(EX))
    );
}

#[test]
fn a_shared_revoke_downgrades_an_exclusive_grant_while_readers_stay() {
    let mut l = cached(LockKind::Rw, Some(EX), 2, false);
    assert_eq!(
        l.on_revoke(SH, 5, 0),
        OnRevoke::Send(ServerOp::Downgrade),
        "readers can stay"
    );
    assert_eq!(
        l.on_revoke(SH, 5, 1),
        OnRevoke::Ignore,
        "the downgrade answers it"
    );
    assert_eq!(l.on_reply(Status::Success, 5), Reply::Settled);
    assert_eq!(
        (l.held(), l.revoke(), l.users()),
        (Some(SH), None, (2, false))
    );
    // A writer in the way waits for its release; an atomic lock can only give back.
    let mut w = cached(LockKind::Fair, Some(EX), 0, true);
    assert_eq!(w.on_revoke(SH, 5, 0), OnRevoke::Deferred);
    assert_eq!(w.release(EX), Release::Send(ServerOp::Downgrade));
    let mut a = cached(LockKind::Atomic, Some(EX), 0, true);
    assert_eq!(a.on_revoke(SH, 5, 0), OnRevoke::Deferred);
    assert_eq!(a.release(EX), Release::Send(ServerOp::GiveBack(EX)));
}

#[test]
fn an_exclusive_revoke_during_a_downgrade_gives_back_after_it() {
    let mut l = cached(LockKind::Rw, Some(EX), 1, false);
    assert_eq!(l.on_revoke(SH, 5, 0), OnRevoke::Send(ServerOp::Downgrade));
    assert_eq!(
        l.on_revoke(EX, 5, 1),
        OnRevoke::Deferred,
        "a writer wants it now"
    );
    assert_eq!(
        l.on_reply(Status::Success, 5),
        Reply::Settled,
        "a reader still holds it"
    );
    assert_eq!((l.held(), l.revoke()), (Some(SH), Some(EX)));
    assert_eq!(l.release(SH), Release::Send(ServerOp::GiveBack(SH)));
    // With no reader left, the downgrade's reply itself sends the give-back.
    let mut m = cached(LockKind::Rw, Some(EX), 0, false);
    assert_eq!(m.on_revoke(SH, 5, 0), OnRevoke::Send(ServerOp::Downgrade));
    assert_eq!(m.on_revoke(EX, 5, 0), OnRevoke::Deferred);
    assert_eq!(
        m.on_reply(Status::Success, 5),
        Reply::Send(ServerOp::GiveBack(SH))
    );
}

#[test]
fn a_revoke_for_a_lock_not_held_is_ignored() {
    let mut l = cached(LockKind::Rw, None, 0, false);
    assert_eq!(l.on_revoke(EX, 5, 0), OnRevoke::Ignore);
    assert_eq!(l, cached(LockKind::Rw, None, 0, false));
    let mut shared = cached(LockKind::Rw, Some(SH), 1, false);
    assert_eq!(shared.on_revoke(SH, 5, 0), OnRevoke::Ignore, "no conflict");
    assert_eq!(shared.revoke(), None);
}

#[test]
fn a_stale_revoke_for_an_earlier_grant_is_ignored() {
    let mut l = cached(LockKind::Rw, Some(EX), 0, false);
    assert_eq!(
        l.on_revoke(EX, 4, 0),
        OnRevoke::Ignore,
        "sent before grant 5"
    );
    assert_eq!(
        l.on_revoke(EX, 5, 0),
        OnRevoke::Send(ServerOp::GiveBack(EX))
    );
}

#[test]
fn a_revoke_that_overtakes_its_grant_is_kept_and_an_older_one_dropped() {
    let mut l = cached(LockKind::Rw, None, 0, false);
    assert_eq!(l.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
    assert_eq!(l.on_revoke(SH, 9, 0), OnRevoke::Deferred);
    assert_eq!(l.on_reply(Status::Success, 9), Reply::Granted);
    assert_eq!(l.revoke(), Some(SH), "sent for this grant");
    assert_eq!(l.release(EX), Release::Send(ServerOp::Downgrade));
    let mut old = cached(LockKind::Rw, None, 0, false);
    assert_eq!(old.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
    assert_eq!(old.on_revoke(EX, 8, 0), OnRevoke::Deferred);
    assert_eq!(old.on_reply(Status::Success, 9), Reply::Granted);
    assert_eq!(old.revoke(), None, "sent for grant 8, given back before");
    assert_eq!(old.release(EX), Release::Keep);
    // A refused acquisition drops it too.
    let mut refused = cached(LockKind::Rw, None, 0, false);
    assert_eq!(refused.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
    assert_eq!(refused.on_revoke(EX, 8, 0), OnRevoke::Deferred);
    assert_eq!(
        refused.on_reply(Status::Fail, 0),
        Reply::Refused(Status::Fail)
    );
    assert_eq!(refused.revoke(), None);
    assert_eq!(refused.check_invariants(), Ok(()));
}

#[test]
fn an_unanswered_give_back_is_sent_again_and_a_refused_one_is_gone() {
    let mut l = cached(LockKind::Rw, Some(EX), 0, false);
    assert_eq!(
        l.on_revoke(EX, 5, 0),
        OnRevoke::Send(ServerOp::GiveBack(EX))
    );
    for transient in [Status::NotReady, Status::BadResponse] {
        assert_eq!(
            l.on_reply(transient, 0),
            Reply::Send(ServerOp::GiveBack(EX))
        );
        assert_eq!(l.held(), Some(EX), "still held until the server says so");
    }
    assert_eq!(
        l.on_reply(Status::Fail, 0),
        Reply::Settled,
        "lapsed: nothing held"
    );
    assert_eq!((l.held(), l.revoke()), (None, None));
    assert_eq!(
        l.on_reply(Status::Success, 0),
        Reply::Settled,
        "a reply for nothing"
    );
}

/// After a failover the client's record may hold nothing where the cache still holds a grant
/// (a cached grant is not re-claimed, `manager::trust`): the overflow's give-back is answered
/// `AlreadyUnlocked` by the record, and must settle rather than be sent again for ever, which
/// left the lock waiting on a give-back that could never be answered.
#[test]
fn a_give_back_the_record_answers_already_unlocked_holds_nothing_and_asks_again() {
    let mut l = cached(LockKind::Rw, Some(EX), 0, false);
    let mut sent = Vec::new();
    on_overflow([((), &mut l)], 0, |(), act| sent.push(act));
    assert_eq!(sent, vec![OnRevoke::Send(ServerOp::GiveBack(EX))]);
    assert_eq!(l.on_reply(Status::AlreadyUnlocked, 0), Reply::Settled);
    assert_eq!((l.held(), l.revoke()), (None, None));
    assert_eq!(l.acquire(EX), Acquire::Send(ServerOp::Acquire(EX)));
}

#[test]
fn a_refused_downgrade_reports_the_readers_lost_until_they_go() {
    let mut l = cached(LockKind::Rw, Some(EX), 1, false);
    assert_eq!(l.on_revoke(SH, 5, 0), OnRevoke::Send(ServerOp::Downgrade));
    assert_eq!(l.on_reply(Status::Fail, 0), Reply::Lost);
    assert_eq!(l.check_invariants(), Ok(()));
    assert_eq!(
        l.acquire(SH),
        Acquire::Wait,
        "no new user beside a stranded one"
    );
    assert_eq!(l.release(SH), Release::Keep);
    assert_eq!(l.acquire(SH), Acquire::Send(ServerOp::Acquire(SH)));
}

#[test]
fn an_overflow_gives_back_every_idle_lock_and_marks_the_busy_ones() {
    let mut locks = [
        cached(LockKind::Rw, Some(SH), 0, false),
        cached(LockKind::Rw, Some(EX), 0, true),
        cached(LockKind::Rw, None, 0, false),
        cached(LockKind::Atomic, Some(EX), 0, false),
    ];
    let mut sent = Vec::new();
    on_overflow(locks.iter_mut().enumerate(), 7, |i, act| {
        sent.push((i, act))
    });
    assert_eq!(
        sent,
        [
            (0, OnRevoke::Send(ServerOp::GiveBack(SH))),
            (1, OnRevoke::Deferred),
            (3, OnRevoke::Send(ServerOp::GiveBack(EX)))
        ]
    );
    assert_eq!(
        locks[1].revoke(),
        Some(EX),
        "the busy one gives back after its writer"
    );
    assert_eq!(locks[2].revoke(), None);
    assert_eq!(locks[1].release(EX), Release::Send(ServerOp::GiveBack(EX)));
}

#[test]
fn a_revoke_is_overdue_once_the_users_outlive_the_timeout() {
    let mut l = cached(LockKind::Rw, Some(EX), 0, true);
    assert!(!l.revoke_overdue(1_000, 50));
    assert_eq!(l.on_revoke(EX, 5, 100), OnRevoke::Deferred);
    assert_eq!(
        l.on_revoke(EX, 5, 140),
        OnRevoke::Deferred,
        "the first arrival counts"
    );
    assert!(!l.revoke_overdue(149, 50));
    assert!(l.revoke_overdue(150, 50));
}

/// One step of the random sequences.
#[derive(Clone, Copy, Debug)]
enum Ev {
    Acquire(Mode),
    Release(usize),
    Revoke(Mode),
    Reply(u8),
    Overflow,
    ReaderToWriter,
}

fn any_ev() -> impl Strategy<Value = Ev> {
    let mode = || prop_oneof![Just(EX), Just(SH)];
    prop_oneof![
        mode().prop_map(Ev::Acquire),
        (0usize..4).prop_map(Ev::Release),
        mode().prop_map(Ev::Revoke),
        (0u8..8).prop_map(Ev::Reply),
        Just(Ev::Overflow),
        Just(Ev::ReaderToWriter),
    ]
}

/// A one-client server: what it holds for the client, its fence, and the op in flight.
struct Server {
    held: Option<Mode>,
    fence: u64,
    asked: Option<ServerOp>,
}

impl Server {
    /// Answers the op in flight: `Success` usually, a transient or a `Fail` now and then.
    fn reply(&mut self, roll: u8) -> Option<(Status, u64)> {
        let op = self.asked.take()?;
        let status = match roll {
            0 => return Some((Status::NotReady, 0)),
            1 if op != ServerOp::Acquire(EX) && op != ServerOp::Acquire(SH) => Status::Fail,
            _ => Status::Success,
        };
        match (op, status) {
            (ServerOp::Acquire(m), _) => {
                self.fence += 1;
                self.held = Some(m);
            }
            (_, Status::Fail) | (ServerOp::GiveBack(_), _) => self.held = None,
            (ServerOp::Downgrade, _) => self.held = Some(SH),
        }
        Some((status, self.fence))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_024))]

    /// Random sequences keep the record's invariants, never grant locally what the server does
    /// not hold, and once the users are done every revoke is answered.
    #[test]
    fn random_sequences_keep_the_cache_consistent(
        kind in prop_oneof![Just(LockKind::Atomic), Just(LockKind::Rw), Just(LockKind::Fair)],
        events in proptest::collection::vec(any_ev(), 1..60),
    ) {
        let mut l = CachedLock::new(kind);
        let mut srv = Server { held: None, fence: 0, asked: None };
        let mut users: Vec<Mode> = Vec::new();
        let send = |srv: &mut Server, op: ServerOp| {
            assert!(srv.asked.is_none(), "one op in flight");
            srv.asked = Some(op);
        };
        for ev in events {
            match ev {
                Ev::Acquire(m) => match l.acquire(m) {
                    Acquire::Local => {
                        prop_assert!(srv.held.is_some_and(|h| h == EX || m == SH));
                        users.push(m);
                    }
                    Acquire::Send(op) => send(&mut srv, op),
                    Acquire::Wait | Acquire::Refuse(_) => {}
                },
                Ev::Release(i) if i < users.len() => {
                    if let Release::Send(op) = l.release(users.swap_remove(i)) {
                        send(&mut srv, op);
                    }
                }
                Ev::Release(_) => {}
                Ev::Revoke(w) => {
                    if srv.held.is_some_and(|h| conflicts(h, w))
                        && let OnRevoke::Send(op) = l.on_revoke(w, srv.fence, 0)
                    {
                        send(&mut srv, op);
                    }
                }
                Ev::Reply(roll) => {
                    let asked = srv.asked;
                    if let Some((status, token)) = srv.reply(roll) {
                        match l.on_reply(status, token) {
                            Reply::Granted => match asked {
                                Some(ServerOp::Acquire(m)) => users.push(m),
                                other => prop_assert!(false, "granted {other:?}"),
                            },
                            Reply::Send(op) => send(&mut srv, op),
                            _ => {}
                        }
                    }
                }
                Ev::ReaderToWriter => {
                    if l.reader_to_writer() == Acquire::Local {
                        prop_assert_eq!(srv.held, Some(EX), "a writer under a grant not exclusive");
                        let reader = users.iter().position(|&m| m == SH).expect("the reader");
                        users[reader] = EX;
                    }
                }
                Ev::Overflow => on_overflow([((), &mut l)], 0, |(), act| {
                    if let OnRevoke::Send(op) = act {
                        send(&mut srv, op);
                    }
                }),
            }
            prop_assert_eq!(l.check_invariants(), Ok(()), "{:?}", l);
            if srv.asked.is_none() {
                prop_assert_eq!(l.held(), srv.held, "the record and the server agree");
            }
        }
        // The users finish and every reply comes: nothing is left owed.
        loop {
            while let Some(m) = users.pop() {
                if let Release::Send(op) = l.release(m) {
                    send(&mut srv, op);
                }
            }
            let asked = srv.asked;
            let Some((status, token)) = srv.reply(7) else { break };
            match (l.on_reply(status, token), asked) {
                (Reply::Send(op), _) => send(&mut srv, op),
                (Reply::Granted, Some(ServerOp::Acquire(m))) => users.push(m),
                _ => {}
            }
        }
        prop_assert_eq!(l.revoke(), None, "a revoke left unanswered: {:?}", l);
        prop_assert_eq!(l.held(), srv.held);
        prop_assert_eq!(l.users(), (0, false));
    }
}

#[test]
fn the_holder_gives_an_idle_grant_back_of_its_own_accord_and_only_an_idle_one() {
    let mut busy = cached(LockKind::Rw, Some(EX), 1, false);
    assert_eq!(busy.give_back(), None, "a busy grant is its users' to end");
    assert_eq!(cached(LockKind::Rw, None, 0, false).give_back(), None);
    let mut idle = cached(LockKind::Rw, Some(SH), 0, false);
    assert_eq!(idle.give_back(), Some(ServerOp::GiveBack(SH)));
    assert!(idle.giving_back());
    assert_eq!(idle.give_back(), None, "one message in flight per lock");
    assert_eq!(
        idle.acquire(SH),
        Acquire::Wait,
        "no user while it goes back"
    );
    // Not answered (the connection was lost): still owed, sent again.
    assert_eq!(
        idle.on_reply(Status::BadResponse, 0),
        Reply::Send(ServerOp::GiveBack(SH))
    );
    assert_eq!(idle.on_reply(Status::Success, 0), Reply::Settled);
    assert_eq!((idle.held(), idle.giving_back()), (None, false));
}

#[test]
fn the_engines_downgrade_keeps_its_writer_reading_under_a_shared_grant() {
    let mut w = cached(LockKind::Rw, Some(EX), 0, true);
    assert_eq!(w.downgrade(), Some(ServerOp::Downgrade));
    assert_eq!(w.users(), (1, false), "the writer reads on");
    assert_eq!(w.downgrade(), None, "in flight");
    assert_eq!(w.on_reply(Status::Success, 5), Reply::Settled);
    assert_eq!(w.held(), Some(SH));
    assert_eq!(w.downgrade(), None, "nothing exclusive left");
    assert_eq!(w.release(SH), Release::Keep);
    w.check_invariants().unwrap();
    // A parked exclusive grant goes shared with no user.
    let mut parked = cached(LockKind::Rw, Some(EX), 0, false);
    assert_eq!(parked.downgrade(), Some(ServerOp::Downgrade));
    assert_eq!(parked.users(), (0, false));
}

#[test]
fn a_reader_of_an_exclusive_grant_that_writes_is_the_writer_a_shared_revoke_waits_for() {
    let mut l = cached(LockKind::Rw, Some(EX), 0, false);
    assert_eq!(l.acquire(SH), Acquire::Local, "exclusive covers a read");
    assert_eq!(l.reader_to_writer(), Acquire::Local);
    assert_eq!(l.users(), (0, true));
    l.check_invariants().unwrap();
    // A revoke wanting shared now waits for the writer: no downgrade under its writes.
    assert_eq!(l.on_revoke(SH, 5, 0), OnRevoke::Deferred);
    assert_eq!(l.release(EX), Release::Send(ServerOp::Downgrade));
    assert_eq!(l.on_reply(Status::Success, 5), Reply::Settled);
    assert_eq!(l.held(), Some(SH));

    let mut two = cached(LockKind::Rw, Some(EX), 2, false);
    assert_eq!(
        two.reader_to_writer(),
        Acquire::Wait,
        "the other reader first"
    );
    for mut not in [
        cached(LockKind::Rw, Some(EX), 0, false),
        cached(LockKind::Rw, Some(EX), 0, true),
        cached(LockKind::Rw, Some(SH), 1, false),
        cached(LockKind::Rw, None, 0, false),
    ] {
        assert_eq!(
            not.reader_to_writer(),
            Acquire::Refuse(Status::Einval),
            "{not:?}"
        );
    }
    // A shared revoke already downgrading under the reader: nothing exclusive to write under.
    let mut reading = cached(LockKind::Rw, Some(EX), 1, false);
    assert_eq!(
        reading.on_revoke(SH, 5, 0),
        OnRevoke::Send(ServerOp::Downgrade)
    );
    assert_eq!(reading.reader_to_writer(), Acquire::Refuse(Status::Einval));
    assert_eq!(reading.users(), (1, false));
}

#[test]
fn a_downgrade_the_clients_own_record_refuses_holds_nothing_and_is_not_sent_again() {
    for status in [Status::Einval, Status::AlreadyUnlocked] {
        let mut reading = cached(LockKind::Rw, Some(EX), 1, false);
        assert_eq!(
            reading.on_revoke(SH, 5, 0),
            OnRevoke::Send(ServerOp::Downgrade)
        );
        assert_eq!(
            reading.on_reply(status, 0),
            Reply::Lost,
            "{status:?}: the reader was unprotected"
        );
        assert_eq!((reading.held(), reading.giving_back()), (None, false));
        assert_eq!(
            reading.acquire(SH),
            Acquire::Wait,
            "no user until the lost one goes"
        );
        assert_eq!(reading.release(SH), Release::Keep);
        assert_eq!(reading.acquire(SH), Acquire::Send(ServerOp::Acquire(SH)));
        let mut parked = cached(LockKind::Rw, Some(EX), 0, false);
        assert_eq!(parked.downgrade(), Some(ServerOp::Downgrade));
        assert_eq!(parked.on_reply(status, 0), Reply::Settled);
        assert_eq!(parked.held(), None);
        parked.check_invariants().unwrap();
    }
}
