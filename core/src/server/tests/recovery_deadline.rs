//! The recovery deadline and the progress a recovering server reports.

use super::*;
use crate::LockKind;
use crate::ids::Ticket;
use crate::proto::{Held, LockClaim};

fn claim(token: u64) -> LockClaim<'static> {
    LockClaim {
        value: None,
        kind: LockKind::Atomic,
        held: Held::Exclusive,
        name: b"x",
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 60_000,
        age_ms: 0,
        token,
        proof: crate::GrantProof::NONE,
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
    let mut s = TestServer::new(&cfg);
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
    let r = s.run(b, try_x, 1_102);
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
    let mut s = TestServer::new(&cfg);
    s.tick(0);
    s.tick(10_000_000);
    assert_eq!(s.state(), ServerState::Recovering { remaining: 1 });
    assert_eq!(s.recovery_progress().deadline_ms, None);
    assert!(!s.recovery_progress().deadline_passed);
}

#[test]
fn a_server_that_starts_ready_reports_no_recovery() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    s.tick(50_000);
    assert_eq!(s.recovery_progress(), RecoveryProgress::default());
    assert_eq!(s.stats().get(Counter::RecoveryExpected), 0);
}

/// One `BatchUpdateLocks` frame from client `raw` through the bytes path: the reply's status
/// and entries.
fn claim_frame(
    s: &mut TestServer,
    raw: u32,
    claims: &[LockClaim<'_>],
) -> (Status, Vec<(u32, Status)>) {
    use crate::proto::{
        Batch, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
        decode_control_response, encode_control_request,
    };
    let body = ControlRequest::BatchUpdateLocks(Batch::from_slice(claims));
    let header = ControlHeader {
        version: crate::proto::PROTO_VERSION,
        msg: body.msg_type(),
        message_id: 9,
        word: raw,
    };
    let mut req = vec![0u8; crate::proto::CONTROL_FRAME_MAX];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req).unwrap();
    let mut out = vec![0u8; crate::proto::CONTROL_FRAME_MAX];
    let m = s.handle_control(&req[..n], &mut out, 5).unwrap();
    let reply = decode_control_response(&out[..m]).unwrap();
    let entries = match reply.body {
        ControlResponse::Entries(e) => e.iter().map(|e| (e.id, e.status)).collect(),
        _ => Vec::new(),
    };
    (reply.header.status().unwrap(), entries)
}

/// The issue's first hole: on a server that is not recovering, every claim was refused one by
/// one (`Einval` per entry), which the client reads as "grant gone" and forgets locks the server
/// still keeps for it. The reference refuses the call; so does this server, changing nothing.
#[test]
fn claims_from_a_client_without_a_recovery_session_are_refused_whole() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client_init(3, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let take = lock(
        LockKind::Atomic,
        crate::proto::LockOp::TryExclusive,
        l,
        60_000,
    );
    assert_eq!(s.run(a, take, 0).status, Status::Success);
    let before = s.tables().lock_cells[l.index() as usize];
    let (status, entries) = claim_frame(&mut s, a.get(), &[claim(1 << 48)]);
    assert_eq!((status, entries), (Status::Einval, Vec::new()));
    assert_eq!(s.tables().lock_cells[l.index() as usize], before);
    let unlock = lock(
        LockKind::Atomic,
        crate::proto::LockOp::UnlockExclusive,
        l,
        0,
    );
    assert_eq!(s.run(a, unlock, 1).status, Status::Success, "still a's");
    // An unknown client is told so, whole.
    assert_eq!(
        claim_frame(&mut s, 4242, &[claim(1)]).0,
        Status::ClientNotInit
    );
}

/// A client whose batch of claims was taken but whose reply was lost sends it again after the
/// recovery ended: it learns the ids of what was restored for it, and nothing else is merged.
#[test]
fn a_late_claim_learns_the_id_of_what_was_restored_and_nothing_else() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let a = 11;
    s.client_reinit(a, 3, 0, &crate::Session::NONE, 0).unwrap();
    let held = claim((1 << 48) + 5);
    let reference = LockClaim {
        value: None,
        held: Held::Reference,
        name: b"r",
        ..claim(0)
    };
    let (status, first) = claim_frame(&mut s, a, &[held, reference]);
    assert_eq!(status, Status::Success);
    // The reply is lost; the deadline passes (here: the client says it is done) and another
    // client takes the lock the late claim never made.
    s.reinit_done(a, 10).unwrap();
    assert_eq!(s.state(), ServerState::Ready);
    let b = s.client_init(3, 0, 20).unwrap();
    let y = s.get_lock(b.get(), LockKind::Atomic, b"y", 20).unwrap();
    let take = lock(
        LockKind::Atomic,
        crate::proto::LockOp::TryExclusive,
        y,
        60_000,
    );
    assert_eq!(s.run(b, take, 20).status, Status::Success);
    let never = LockClaim {
        value: None,
        name: b"y",
        ..claim((1 << 48) + 6)
    };
    let (status, again) = claim_frame(&mut s, a, &[held, reference, never]);
    assert_eq!(status, Status::Success);
    assert_eq!(&again[..2], &first[..], "the same ids as the lost reply");
    assert_eq!(again[2], (0, Status::Fail), "not restored: gone");
    let w =
        crate::word::atomic::AtomicWord::from_bits(s.tables().lock_cells[y.index() as usize].word);
    assert_eq!(w.owner(), b.get(), "the late claim took nothing");
}

/// `client_reinit_done` finishes a `client_reinit`; without one it is refused (the reference
/// answers -1) and, on a recovering server, does not count towards the clients it waits for.
#[test]
fn reinit_done_without_a_reinit_is_refused() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client_init(3, 0, 0).unwrap();
    assert_eq!(s.reinit_done(a.get(), 1), Err(Status::Einval));
    let session = s.client_session(a.get()).unwrap().1;
    s.client_reinit(a.get(), 3, 0, &session, 2).unwrap();
    assert_eq!(s.reinit_done(a.get(), 3), Ok(()));
    assert_eq!(s.reinit_done(a.get(), 4), Err(Status::Einval), "done once");

    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    s.client_reinit(11, 3, 0, &crate::Session::NONE, 0).unwrap();
    assert_eq!(s.reinit_done(11, 1), Ok(()));
    assert_eq!(s.reinit_done(11, 2), Err(Status::Einval));
    assert_eq!(s.state(), ServerState::Recovering { remaining: 1 });
}

/// The reference answers `NOT_READY` to a deinit while the server recovers, as to everything
/// but re-registration; the client stays registered (and alive) until the server serves.
#[test]
fn deinit_while_recovering_is_not_ready_and_keeps_the_client() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    s.client_reinit(11, 3, 0, &crate::Session::NONE, 0).unwrap();
    s.update_lock(11, &claim((1 << 48) + 5), 0).unwrap();
    assert_eq!(s.client_deinit(11, 900), Err(Status::NotReady));
    assert!(s.is_registered(11));
    assert_eq!(s.usage().locks, 1, "its lock is kept");
    // The refusal renewed its lease: a tick just past the original one keeps it.
    s.tick(cfg.client_lease_ms as u64 + 1);
    assert!(s.is_registered(11));
    s.client_reinit(22, 3, 0, &crate::Session::NONE, 1_000)
        .unwrap();
    s.reinit_done(11, 1_000).unwrap();
    s.reinit_done(22, 1_000).unwrap();
    assert_eq!(s.client_deinit(11, 1_001), Ok(()));
    assert_eq!(s.usage().locks, 0);
}
