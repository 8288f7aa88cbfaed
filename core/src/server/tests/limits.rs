//! Limits: full tables refuse without changing anything, and leases are capped.

use super::*;

#[test]
fn full_client_table_refuses_and_changes_nothing() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    for _ in 0..cfg.clients_max {
        s.client(0);
    }
    let before = s.tables().digest();
    assert_eq!(s.client_init(2, 0, 0), Err(Status::ServerNoResource));
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn lock_table_fills_at_locks_max_and_refuses_without_change() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client(0).get();
    for i in 0..cfg.locks_max {
        s.get_lock(a, LockKind::Atomic, format!("lock-{i}").as_bytes(), 0)
            .unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(
        s.get_lock(a, LockKind::Atomic, b"one-too-many", 0),
        Err(Status::ServerNoResource)
    );
    assert_eq!(s.tables().digest(), before);
    assert_eq!(s.usage().locks, cfg.locks_max);
}

#[test]
fn object_table_fills_at_objects_max() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client(0).get();
    for i in 0..cfg.objects_max {
        s.object_create(a, format!("o{i}").as_bytes(), 0, 1, 0)
            .unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(
        s.object_create(a, b"one more", 0, 1, 0),
        Err(Status::ObjectTooMany)
    );
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn a_lease_above_the_maximum_is_capped_and_a_killed_holder_is_freed_within_it() {
    let cfg = Config {
        client_lease_max_ms: 1_000,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let greedy = s.client_init(2, u32::MAX, 0).unwrap();
    let slot = s.client_session(greedy.get()).unwrap().0;
    assert_eq!(s.tables().clients[slot as usize].lease_ms, 1_000);
    assert_eq!(s.stats().get(Counter::LeasesCapped), 1);
    let id = s.get_lock(greedy.get(), LockKind::Rw, b"x", 0).unwrap();
    let held = s.run(greedy, lock(LockKind::Rw, LockOp::TryShared, id, 0), 0);
    assert_eq!(held.status, Status::Success);
    // The holder is killed: nothing more from it. Within the maximum lease it is dead and its
    // shared hold is gone, so a writer gets in.
    assert_eq!(s.tick(1_001), 1);
    let w = s.client(1_001);
    let lw = s.get_lock(w.get(), LockKind::Rw, b"x", 1_001).unwrap();
    assert_eq!(
        s.run(w, lock(LockKind::Rw, LockOp::TryExclusive, lw, 0), 1_001)
            .status,
        Status::Success
    );
}
