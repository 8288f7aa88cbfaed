//! The recovery deadline and the progress a recovering server reports.

use super::tests::{TestRegion, lock, run, server, small};
use super::*;
use crate::LockKind;
use crate::ids::Ticket;
use crate::proto::{Held, LockClaim};

fn claim(token: u64) -> LockClaim<'static> {
    LockClaim {
        kind: LockKind::Atomic,
        held: Held::Exclusive,
        name: b"x",
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 60_000,
        age_ms: 0,
        token,
    }
}

#[test]
fn recovery_deadline_serves_without_the_clients_that_never_came_back() {
    let cfg = Config {
        recovery_clients: 2,
        recovery_deadline_ms: 1_000,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    s.tick(100); // the recovery clock starts
    let a = 11;
    let session = s.client_session(a).map_or(crate::Session::NONE, |(_, x)| x);
    s.client_reinit(a, 3, 0, &session, 200).unwrap();
    s.update_lock(a, &claim((1 << 48) + 5), 300).unwrap();
    s.reinit_done(a, 400).unwrap();
    // The second expected client crashed with the old server: it never comes back.
    s.tick(1_099);
    assert_eq!(s.state(), ServerState::Recovering { remaining: 1 });
    assert_eq!(s.recovery_progress().deadline_ms, Some(1_100));
    assert_eq!(s.client_init(3, 0, 1_099), Err(Status::NotReady));
    s.tick(1_100);
    assert_eq!(s.state(), ServerState::Ready);
    let p = s.recovery_progress();
    assert_eq!(
        (
            p.expected,
            p.reregistered,
            p.done,
            p.locks_restored,
            p.given_up
        ),
        (2, 1, 1, 1, 1)
    );
    assert!(p.deadline_passed && p.deadline_ms.is_none());
    let st = s.stats();
    assert_eq!(
        [
            Counter::RecoveryExpected,
            Counter::RecoveryReregistered,
            Counter::RecoveryDone,
            Counter::RecoveryLocksRestored,
            Counter::RecoveryClientsGivenUp,
        ]
        .map(|c| st.get(c)),
        [2, 1, 1, 1, 1]
    );
    // Serving: a newcomer registers, and the lock re-claimed by a is still a's.
    let b = s.client_init(3, 0, 1_101).unwrap();
    let id = s.get_lock(b.get(), LockKind::Atomic, b"x", 1_101).unwrap();
    let try_x = lock(LockKind::Atomic, crate::proto::LockOp::TryExclusive, id, 10);
    let r = run(&mut s, b, try_x, 1_102);
    assert_eq!(r.status, Status::Fail);
    // A client that comes back after the deadline finds its registration gone.
    assert_eq!(
        s.client_reinit(22, 3, 0, &crate::Session::NONE, 1_200),
        Err(Status::ClientRemovedByServer)
    );
}

#[test]
fn zero_recovery_deadline_waits_for_every_expected_client_as_the_reference() {
    let cfg = Config {
        recovery_clients: 1,
        recovery_deadline_ms: 0,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    s.tick(0);
    s.tick(10_000_000);
    assert_eq!(s.state(), ServerState::Recovering { remaining: 1 });
    assert_eq!(s.recovery_progress().deadline_ms, None);
    assert!(!s.recovery_progress().deadline_passed);
}

#[test]
fn a_server_that_starts_ready_reports_no_recovery() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    s.tick(50_000);
    assert_eq!(s.recovery_progress(), RecoveryProgress::default());
    assert_eq!(s.stats().get(Counter::RecoveryExpected), 0);
}
