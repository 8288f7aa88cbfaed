//! Liveness: silent, deinitialised and evicted clients, and everything they held released.

use super::*;

/// A full table with client 3 holding a shared grant on `t1:rg0` and its connection gone at 0
/// (seen at 0, so its 1,000-ms lease runs to 1,000).
fn full_with_an_abnormal_reader() -> (TestServer, Vec<ClientId>) {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let ids: Vec<ClientId> = (0..cfg.clients_max).map(|_| s.client(0)).collect();
    let l = s
        .get_lock(ids[3].get(), LockKind::Rw, b"t1:rg0", 0)
        .unwrap();
    assert_eq!(
        s.run(ids[3], lock(LockKind::Rw, LockOp::TryShared, l, 0), 0)
            .status,
        Status::Success
    );
    s.client_disconnected(ids[3].get(), 0);
    (s, ids)
}

#[test]
fn abnormal_client_past_its_lease_is_evicted_to_make_room_and_its_locks_freed() {
    let (mut s, ids) = full_with_an_abnormal_reader();
    let newcomer = s.client(1_001);
    assert!(!s.is_registered(ids[3].get()));
    assert_eq!(
        s.reinit(ids[3].get(), 1_002),
        Err(Status::ClientRemovedByServer)
    );
    // The evicted reader's grant is gone, so a writer gets in.
    let l2 = s
        .get_lock(newcomer.get(), LockKind::Rw, b"t1:rg0", 1_002)
        .unwrap();
    assert_eq!(
        s.run(
            newcomer,
            lock(LockKind::Rw, LockOp::TryExclusive, l2, 0),
            1_002
        )
        .status,
        Status::Success
    );
}

/// The reference evicts the first abnormal client whatever it holds; a holder whose connection
/// broke may not know it yet and believes its grant until its lease ends, so dlock evicts it
/// only then, and one that holds nothing first (`Server::evictable`).
#[test]
fn an_abnormal_holder_within_its_lease_is_not_evicted_but_one_holding_nothing_is() {
    let (mut s, ids) = full_with_an_abnormal_reader();
    assert_eq!(s.client_init(2, 0, 500), Err(Status::ServerNoResource));
    assert!(
        s.is_registered(ids[3].get()),
        "the reader's lease runs to 1,000"
    );
    s.client_disconnected(ids[5].get(), 500);
    s.client(600);
    assert!(!s.is_registered(ids[5].get()));
    assert!(s.is_registered(ids[3].get()));
    assert_eq!(s.stats().get(Counter::ClientsEvicted), 1);
}

#[test]
fn silent_client_is_declared_dead_and_every_lock_it_held_is_released() {
    let mut s = TestServer::new(&small());
    let dead = s.client(0);
    let live = s.client(0);
    let names: [(&[u8], LockKind, LockOp); 3] = [
        (b"a", LockKind::Atomic, LockOp::TryExclusive),
        (b"r", LockKind::Rw, LockOp::TryShared),
        (b"w", LockKind::Rw, LockOp::TryExclusive),
    ];
    for (name, kind, op) in names {
        let l = s.get_lock(dead.get(), kind, name, 0).unwrap();
        assert_eq!(
            s.run(dead, lock(kind, op, l, 60_000), 0).status,
            Status::Success
        );
    }
    s.heartbeat(live.get(), 900).unwrap();
    assert_eq!(s.tick(1_000), 0, "lease not over yet");
    assert_eq!(s.tick(1_001), 1);
    assert!(!s.is_registered(dead.get()));
    assert_eq!(
        s.usage().locks,
        0,
        "the dead client's references were the only ones"
    );
    for (name, kind, _) in names {
        let l = s.get_lock(live.get(), kind, name, 1_001).unwrap();
        assert_eq!(
            s.run(live, lock(kind, LockOp::TryExclusive, l, 100), 1_001)
                .status,
            Status::Success
        );
    }
}

#[test]
fn deinit_releases_everything_the_client_held() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    s.run(a, lock(LockKind::Rw, LockOp::TryExclusive, la, 0), 0);
    s.object_create(a.get(), b"xid", 100, 10, 0).unwrap();
    s.client_deinit(a.get(), 1).unwrap();
    assert_eq!(
        s.run(b, lock(LockKind::Rw, LockOp::TryExclusive, lb, 0), 1)
            .status,
        Status::Success
    );
    assert_eq!(
        s.usage().objects,
        0,
        "an owned, unreferenced object goes with its owner"
    );
    assert_eq!(s.client_deinit(a.get(), 1), Err(Status::ClientNotInit));
}
