//! The per-peer cap on registrations (`peers.rs`).

use super::*;
use crate::ids::Peer;

const A: Peer = Peer::remote(0xA);
const B: Peer = Peer::remote(0xB);

/// `small()` (8 clients) with a cap of 3 per peer.
fn capped() -> Config {
    Config {
        clients_per_peer_max: 3,
        ..small()
    }
}

#[test]
fn a_peer_at_its_cap_is_refused_while_another_still_registers() {
    let cfg = capped();
    let mut s = TestServer::new(&cfg);
    for _ in 0..3 {
        s.client_init_from(A, 3, 0, 0).unwrap();
    }
    assert_eq!(
        s.client_init_from(A, 3, 0, 1),
        Err(Status::ServerNoResource)
    );
    assert_eq!(s.stats().get(Counter::ClientsRefusedPeerCap), 1);
    assert_eq!(s.stats().get(Counter::NoResource), 1);
    // The table has room, and another peer gets it.
    let b = s.client_init_from(B, 3, 0, 2).unwrap();
    assert_eq!(s.client_peer(b.get()), Some(B));
}

#[test]
fn heartbeating_registrations_of_one_peer_cannot_fill_the_table() {
    // The case: every registration of one peer keeps heartbeating, so none expires.
    let cfg = small(); // the default cap: half of 8
    let mut s = TestServer::new(&cfg);
    let mut held = 0;
    for now in 0..cfg.clients_max as u64 {
        if s.client_init_from(A, 3, 0, now).is_ok() {
            held += 1;
        }
    }
    assert_eq!(held, cfg.clients_per_peer());
    for _ in 0..cfg.clients_max - held {
        s.client_init_from(B, 3, 0, 100).unwrap();
    }
}

#[test]
fn every_way_out_gives_the_place_back() {
    let cfg = capped();
    let mut s = TestServer::new(&cfg);
    let ids: Vec<u32> = (0..3)
        .map(|_| s.client_init_from(A, 3, 0, 0).unwrap().get())
        .collect();
    // Deinit.
    s.client_deinit(ids[0], 10).unwrap();
    let again = s.client_init_from(A, 3, 0, 20).unwrap().get();
    assert_eq!(
        s.client_init_from(A, 3, 0, 20),
        Err(Status::ServerNoResource)
    );
    // Lease expiry: the others stay alive, `ids[1]` goes silent.
    for c in [ids[2], again] {
        s.heartbeat(c, 900).unwrap();
    }
    s.tick(1_001);
    assert!(!s.is_registered(ids[1]));
    s.client_init_from(A, 3, 0, 1_002).unwrap();
    assert_eq!(
        s.client_init_from(A, 3, 0, 1_002),
        Err(Status::ServerNoResource)
    );
}

#[test]
fn at_its_cap_a_peer_evicts_its_own_abnormal_client_and_no_one_else_s() {
    let cfg = capped();
    let mut s = TestServer::new(&cfg);
    let b = s.client_init_from(B, 3, 0, 0).unwrap().get();
    s.client_disconnected(b, 1);
    let a: Vec<u32> = (0..3)
        .map(|_| s.client_init_from(A, 3, 0, 0).unwrap().get())
        .collect();
    s.client_disconnected(a[1], 1);
    // A's engine restarted: its new registration replaces its own lost one.
    s.client_init_from(A, 3, 0, 2).unwrap();
    assert!(!s.is_registered(a[1]));
    assert!(s.is_registered(b), "another peer's abnormal client stays");
    assert_eq!(s.stats().get(Counter::ClientsEvicted), 1);
    assert_eq!(
        s.client_init_from(A, 3, 0, 3),
        Err(Status::ServerNoResource)
    );
}

#[test]
fn local_clients_are_not_counted() {
    let cfg = capped();
    let mut s = TestServer::new(&cfg);
    for _ in 0..cfg.clients_max {
        let c = s.client_init(3, 0, 0).unwrap();
        assert_eq!(s.client_peer(c.get()), Some(Peer::EXEMPT));
    }
    assert_eq!(s.stats().get(Counter::ClientsRefusedPeerCap), 0);
}

#[test]
fn a_resumed_registration_keeps_its_peer_and_adds_nothing() {
    let cfg = capped();
    let mut s = TestServer::new(&cfg);
    let a: Vec<u32> = (0..3)
        .map(|_| s.client_init_from(A, 3, 0, 0).unwrap().get())
        .collect();
    let (_, session) = s.client_session(a[0]).unwrap();
    // A reinit of a live registration (a reconnect) from its own peer at the cap, or another.
    s.client_reinit_from(A, back(a[0], 3, &session), 1).unwrap();
    s.client_reinit_from(B, back(a[0], 3, &session), 2).unwrap();
    assert_eq!(s.client_peer(a[0]), Some(A));
}

#[test]
fn re_registrations_on_a_recovering_server_count_toward_the_cap() {
    let cfg = Config {
        recovery_clients: 4,
        epoch: 2,
        ..capped()
    };
    let mut s = TestServer::new(&cfg);
    let none = crate::Session::NONE;
    for id in 1..=3 {
        s.client_reinit_from(A, back(id, 3, &none), 0).unwrap();
    }
    assert_eq!(
        s.client_reinit_from(A, back(4, 3, &none), 0),
        Err(Status::ServerNoResource)
    );
    s.client_reinit_from(B, back(4, 3, &none), 0).unwrap();
}
