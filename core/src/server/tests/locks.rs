//! Named locks and what a lock command needs: byte-exact names, references, kinds, release,
//! stale ids after reuse, and fencing tokens.

use super::*;

#[test]
fn get_lock_by_name_is_byte_exact_and_idempotent() {
    let mut s = TestServer::new(&small());
    let a = s.client(0).get();
    let b = s.client(0).get();
    let x = s
        .get_lock(a, LockKind::Atomic, b"name\0with nul", 0)
        .unwrap();
    assert_eq!(s.get_lock(a, LockKind::Atomic, b"name\0with nul", 0), Ok(x));
    assert_eq!(s.get_lock(b, LockKind::Atomic, b"name\0with nul", 0), Ok(x));
    assert_ne!(s.get_lock(a, LockKind::Atomic, b"name\0with nuL", 0), Ok(x));
    assert_eq!(
        s.get_lock(a, LockKind::Fair, b"name\0with nul", 0),
        Err(Status::Einval)
    );
    let long = [7u8; 512];
    assert!(s.get_lock(a, LockKind::Atomic, &long, 0).is_ok());
    let before = s.tables().digest();
    assert_eq!(
        s.get_lock(a, LockKind::Atomic, &[7u8; 513], 0),
        Err(Status::Einval)
    );
    assert_eq!(s.get_lock(a, LockKind::Atomic, b"", 0), Err(Status::Einval));
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn release_is_refused_while_locked_and_stale_ids_are_rejected_after_reuse() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    assert_eq!(
        s.run(a, lock(LockKind::Atomic, LockOp::TryExclusive, l, 100), 0)
            .status,
        Status::Success
    );
    assert_eq!(s.release_lock(a.get(), l.raw(), 1), Err(Status::Fail));
    assert_eq!(
        s.run(a, lock(LockKind::Atomic, LockOp::UnlockExclusive, l, 0), 1)
            .status,
        Status::Success
    );
    assert_eq!(s.release_lock(a.get(), l.raw(), 1), Ok(()));
    assert_eq!(s.release_lock(a.get(), l.raw(), 1), Err(Status::LockNotGet));
    // The slot is reused by another name with a new generation: the old id is stale.
    let m = s.get_lock(a.get(), LockKind::Atomic, b"y", 2).unwrap();
    assert_eq!(m.index(), l.index());
    assert_ne!(m.generation(), l.generation());
    assert_eq!(
        s.run(a, lock(LockKind::Atomic, LockOp::TryExclusive, l, 100), 2)
            .status,
        Status::LockNotGet
    );
}

#[test]
fn commands_need_a_reference_and_the_right_kind() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client(0);
    let b = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    assert_eq!(
        s.run(b, lock(LockKind::Rw, LockOp::TryExclusive, l, 0), 0)
            .status,
        Status::LockNotGet
    );
    assert_eq!(
        s.run(a, lock(LockKind::Atomic, LockOp::TryExclusive, l, 10), 0)
            .status,
        Status::Einval
    );
    let bogus = LockId::new(cfg.locks_max + 5, 1);
    assert_eq!(
        s.run(a, lock(LockKind::Rw, LockOp::TryExclusive, bogus, 0), 0)
            .status,
        Status::LockNotGet
    );
    let unknown = ClientId::new(12345).unwrap();
    assert_eq!(
        s.run(unknown, lock(LockKind::Rw, LockOp::TryExclusive, l, 0), 0)
            .status,
        Status::ClientNotInit
    );
}

#[test]
fn fencing_tokens_grow_per_lock_across_slot_reuse_and_carry_the_epoch() {
    let cfg = Config {
        epoch: 7,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let a = s.client(0);
    let mut last = 0;
    for round in 0..5u64 {
        let l = s
            .get_lock(a.get(), LockKind::Atomic, b"same-name", round)
            .unwrap();
        let r = s.run(
            a,
            lock(LockKind::Atomic, LockOp::TryExclusive, l, 10),
            round,
        );
        assert_eq!(r.status, Status::Success);
        assert!(r.aux > last, "token {} after {}", r.aux, last);
        assert_eq!(FencingToken(r.aux).standalone_epoch(), 7);
        last = r.aux;
        assert_eq!(
            s.run(
                a,
                lock(LockKind::Atomic, LockOp::ExtendExclusive, l, 10),
                round
            )
            .aux,
            last
        );
        s.run(
            a,
            lock(LockKind::Atomic, LockOp::UnlockExclusive, l, 0),
            round,
        );
        s.release_lock(a.get(), l.raw(), round).unwrap();
    }
}

#[test]
fn the_load_gauges_count_clients_and_lock_slots_in_use_now() {
    let mut s = TestServer::new(&small());
    let level = |s: &TestServer| {
        let st = s.stats();
        (
            st.get(Counter::ClientsActive),
            st.get(Counter::LocksInUse),
            st.get(Counter::MapVersion),
        )
    };
    assert_eq!(level(&s), (0, 0, 0));
    let a = s.client(0).get();
    let b = s.client(0).get();
    let x = s.get_lock(a, LockKind::Atomic, b"x", 0).unwrap();
    s.get_lock(b, LockKind::Atomic, b"x", 0).unwrap();
    s.get_lock(b, LockKind::Atomic, b"y", 0).unwrap();
    assert_eq!(level(&s), (2, 2, 0), "a standalone server has no map");
    s.release_lock(a, x.raw(), 0).unwrap();
    s.client_deinit(b, 0).unwrap();
    // b's references went with it, and x's last reference with a's release.
    assert_eq!(level(&s), (1, 0, 0));
}
