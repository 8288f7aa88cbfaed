//! Messages as a whole: their size, all-or-nothing batches, and joins that reach the state machine.

use super::*;

#[test]
fn oversized_or_empty_message_is_refused_whole() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let cmds = vec![lock(LockKind::Rw, LockOp::TryShared, l, 0); 32];
    let mut r = vec![
        CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0,
            plain: false,
        };
        32
    ];
    let before = s.tables().digest();
    assert_eq!(
        s.execute_message(a.get(), 0, &cmds, &mut r, 0),
        Err(Status::Einval)
    );
    assert_eq!(
        s.execute_message(a.get(), 0, &[], &mut r, 0),
        Err(Status::Einval)
    );
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn a_message_with_a_flag_beyond_the_request_flags_is_refused_whole() {
    // Bits above the request flags are the server's own marks on a parked request (a hold met,
    // a plain grant); an embedder's message must not set them, as a wire message cannot.
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let cmds = [lock(LockKind::Rw, LockOp::TryShared, l, 0)];
    let mut r = [CommandResult::status(Status::Success)];
    let before = s.tables().digest();
    for flags in [crate::proto::FLAG_PROOFS, 1 << 4, 1 << 22, 1 << 23] {
        assert_eq!(
            s.execute_message(a.get(), flags, &cmds, &mut r, 0),
            Err(Status::Einval),
            "{flags:#x}"
        );
    }
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn all_or_nothing_batch_leaves_nothing_held_when_one_key_fails() {
    // The contention rule off: the refusal on k3 would stamp that lock contended (a conflict
    // is not undone with the unit), and the digest below compares every table.
    let mut s = TestServer::new(&Config {
        timing: crate::manager::Timing {
            contention_window_ms: 0,
            ..crate::manager::Timing::DEFAULT
        },
        ..small()
    });
    let a = s.client(0);
    let b = s.client(0);
    let ids: Vec<LockId> = (0..5)
        .map(|i| {
            s.get_lock(a.get(), LockKind::Rw, format!("k{i}").as_bytes(), 0)
                .unwrap()
        })
        .collect();
    let held_by_b = s.get_lock(b.get(), LockKind::Rw, b"k3", 0).unwrap();
    assert_eq!(
        s.run(b, lock(LockKind::Rw, LockOp::TryExclusive, held_by_b, 0), 0)
            .status,
        Status::Success
    );
    let before = s.tables().digest();
    let cmds: Vec<Command> = ids
        .iter()
        .map(|&l| lock(LockKind::Rw, LockOp::TryExclusive, l, 0))
        .collect();
    let r = s.run_all(a, FLAG_ALL_OR_NOTHING, &cmds, 1);
    let statuses: Vec<Status> = r.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            Status::Eagain,
            Status::Eagain,
            Status::Eagain,
            Status::Fail,
            Status::Eagain
        ]
    );
    assert_eq!(s.tables().digest(), before, "nothing stays held");
    // Without the flag the same batch is per item, as in the reference.
    let r = s.run_all(a, 0, &cmds, 2);
    assert_eq!(r.iter().filter(|r| r.status == Status::Success).count(), 4);
}

/// A join is a stream transport's business: the state machine refuses it, alone or in an
/// all-or-nothing batch, and changes nothing.
#[test]
fn a_join_reaching_the_state_machine_is_refused() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let join = Command::Join(crate::proto::JoinCommand {
        session: s.session(a.get()),
    });
    assert_eq!(s.run(a, join, 0).status, Status::Einval);
    let l = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
        plain: false,
    }; 2];
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, l, 1_000);
    s.execute_message(a.get(), FLAG_ALL_OR_NOTHING, &[take, join], &mut r, 0)
        .unwrap();
    assert!(r.iter().all(|r| r.status == Status::Einval), "{r:?}");
    assert_eq!(
        s.run(a, take, 0).status,
        Status::Success,
        "not taken before"
    );
}

/// A trylock of `kind` on `id` asking for what `flags` say.
fn flagged(kind: LockKind, op: LockOp, id: LockId, flags: crate::proto::LockFlags) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms: 60_000,
        flags,
        ..LockCommand::NONE
    })
}

fn cached(kind: LockKind, op: LockOp, id: LockId) -> Command {
    flagged(kind, op, id, crate::proto::LockFlags::CACHEABLE)
}

/// How many revokes wait in client `c`'s event ring.
fn revokes_waiting(s: &TestServer, c: ClientId) -> usize {
    let ring = s.event_ring(s.client_slot_of(c.get()).unwrap()).unwrap();
    core::iter::from_fn(|| ring.pop()).count()
}

#[test]
fn a_unit_key_refused_for_its_kind_sends_no_revoke_and_lapses_no_holder() {
    let cfg = Config {
        timing: crate::manager::Timing {
            min_hold_ms: 0,
            revoke_timeout_ms: 100,
            contention_window_ms: 0,
        },
        ..small()
    };
    let (rw, ex) = (LockKind::Rw, LockOp::TryExclusive);
    let mut s = TestServer::new(&cfg);
    let (a, b) = (s.client(0), s.client(0));
    let la = s.get_lock(a.get(), rw, b"page", 0).unwrap();
    let lb = s.get_lock(b.get(), rw, b"page", 0).unwrap();
    let free = s.get_lock(b.get(), rw, b"free", 0).unwrap();
    assert_eq!(s.run(a, cached(rw, ex, la), 0).status, Status::Success);
    // The second key names the RW lock as an atomic one: refused before anything runs on it.
    let unit = [
        lock(rw, ex, free, 0),
        lock(LockKind::Atomic, ex, lb, 60_000),
    ];
    let r = s.run_all(b, FLAG_ALL_OR_NOTHING, &unit, 1);
    assert_eq!((r[0].status, r[1].status), (Status::Eagain, Status::Einval));
    assert_eq!(revokes_waiting(&s, a), 0, "a refused command asks nobody");
    assert_eq!(s.stats().get(Counter::RevokesSent), 0);
    // Now a is asked for real and ignores it past the revoke timeout: a refused command
    // must not lapse it either.
    assert_eq!(s.run(b, lock(rw, ex, lb, 0), 2).status, Status::Fail);
    assert_eq!(revokes_waiting(&s, a), 1);
    let _ = s.heartbeat(a.get(), 150);
    let r = s.run_all(b, FLAG_ALL_OR_NOTHING, &unit, 200);
    assert_eq!((r[0].status, r[1].status), (Status::Eagain, Status::Einval));
    assert_eq!(s.stats().get(Counter::RevokesLapsed), 0);
    let slot_a = s.client_slot_of(a.get()).unwrap();
    assert_eq!(
        s.recorded_hold(slot_a, la.index()),
        crate::manager::GrantState::ExclusiveRevoking,
        "a still holds it"
    );
    s.check_invariants().unwrap();
}

#[test]
fn a_unit_key_refused_for_a_retained_lock_sends_no_revoke() {
    let (rw, sh) = (LockKind::Rw, LockOp::TryShared);
    let mut s = TestServer::new(&small());
    let (dead, a, b) = (s.client(0), s.client(0), s.client(0));
    let ld = s.get_lock(dead.get(), rw, b"page", 0).unwrap();
    let la = s.get_lock(a.get(), rw, b"page", 0).unwrap();
    let lb = s.get_lock(b.get(), rw, b"page", 0).unwrap();
    let free = s.get_lock(b.get(), rw, b"free", 0).unwrap();
    let retained = flagged(rw, sh, ld, crate::proto::LockFlags::RETAIN);
    assert_eq!(s.run(dead, retained, 0).status, Status::Success);
    assert_eq!(s.run(a, cached(rw, sh, la), 0).status, Status::Success);
    // a and b stay alive; the dead reader's lease (1 s) runs out and its grant is retained.
    let _ = s.heartbeat(a.get(), 1_400);
    let _ = s.heartbeat(b.get(), 1_400);
    assert_eq!(s.tick(1_500), 1);
    let ex = LockOp::TryExclusive;
    let unit = [lock(rw, ex, free, 0), lock(rw, ex, lb, 0)];
    let r = s.run_all(b, FLAG_ALL_OR_NOTHING, &unit, 1_600);
    assert_eq!(
        (r[0].status, r[1].status),
        (Status::Eagain, Status::LockRetained)
    );
    assert_eq!(
        revokes_waiting(&s, a),
        0,
        "refused as retained, as a lone trylock is: nobody is asked"
    );
    assert_eq!(s.stats().get(Counter::RevokesSent), 0);
    s.check_invariants().unwrap();
}
