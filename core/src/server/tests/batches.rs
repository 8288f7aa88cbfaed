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
            aux: 0
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
fn all_or_nothing_batch_leaves_nothing_held_when_one_key_fails() {
    let mut s = TestServer::new(&small());
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
