//! The per-peer cap on registrations, through the runtime: who a peer is on each path
//! (`runtime/peer.rs`), and that a peer at its cap is refused while others still register.

#[allow(dead_code)]
mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::certs::{Ca, TempDir};
use common::raw;
use dlock_core::{Config, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, read_server_stats};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::TlsConfig;

/// 16 clients, at most 4 per peer.
fn capped() -> Config {
    Config {
        locks_max: 64,
        clients_max: 16,
        objects_max: 4,
        clients_per_peer_max: 4,
        ..Config::default()
    }
}

/// A TCP connection to `server` from the loopback address `from`.
fn connect_from(from: [u8; 4], server: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&server.into()).unwrap();
    let s = TcpStream::from(s);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn refused_peer_cap(endpoint: &Endpoint) -> u64 {
    read_server_stats(endpoint, Duration::from_secs(5))
        .expect("stats")
        .into_iter()
        .find(|(name, _)| *name == "clients_refused_peer_cap")
        .map(|(_, v)| v)
        .expect("the counter is listed")
}

#[test]
fn a_peer_at_its_cap_is_refused_while_another_address_still_registers() {
    let mut cfg = ServerConfig::new(capped());
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let server = ServerHandle::start(cfg).expect("server starts");
    let addr = server.tcp_addr().unwrap();
    // Each registration keeps its connection (and so stays active), as a heartbeating one does.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from([127, 0, 0, 1], addr);
        raw::register(&mut s, 0).expect("within the cap");
        held.push(s);
    }
    let mut fifth = connect_from([127, 0, 0, 1], addr);
    assert_eq!(raw::register(&mut fifth, 0), Err(Status::ServerNoResource));
    let mut other = connect_from([127, 0, 0, 2], addr);
    raw::register(&mut other, 0).expect("another address still registers");
    assert_eq!(refused_peer_cap(&Endpoint::Tcp(addr)), 1);
    // Local clients are not counted: the table's remaining places are theirs.
    let local = Endpoint::embedded(&server);
    let locals: Vec<Client> = (0..11)
        .map(|_| Client::connect(ClientConfig::new(local.clone())).expect("a local client"))
        .collect();
    assert_eq!(locals.len(), 11);
    server.stop();
}

#[test]
fn under_tls_the_peer_is_the_client_certificate() {
    let dir = TempDir::new("peer-cap");
    let ca = Ca::new(&dir, "ca");
    let srv = ca.server(&dir, "server");
    let one = ca.client(&dir, "one", "engine-1");
    let two = ca.client(&dir, "two", "engine-2");
    let mut tcp = TcpConfig::new("127.0.0.1:0".parse().unwrap());
    tcp.tls = Some(TlsConfig::new(&srv.cert, &srv.key, &ca.cert));
    let mut cfg = ServerConfig::new(capped());
    cfg.tcp = Some(tcp);
    let server = ServerHandle::start(cfg).expect("server starts");
    let addr = server.tcp_addr().unwrap();
    let endpoint = |leaf: &common::certs::Leaf| {
        Endpoint::tls(addr, &TlsConfig::new(&leaf.cert, &leaf.key, &ca.cert)).unwrap()
    };
    let (first, second) = (endpoint(&one), endpoint(&two));
    let held: Vec<Client> = (0..4)
        .map(|_| Client::connect(ClientConfig::new(first.clone())).expect("within the cap"))
        .collect();
    assert_eq!(
        Client::connect(ClientConfig::new(first.clone()))
            .err()
            .map(Status::from),
        Some(Status::ServerNoResource)
    );
    // The same address, another certificate: another peer.
    let other = Client::connect(ClientConfig::new(second.clone()));
    assert!(other.is_ok(), "{:?}", other.err());
    assert_eq!(refused_peer_cap(&second), 1);
    drop(held);
    server.stop();
}

#[test]
fn a_deinitialised_registration_gives_its_place_back() {
    let mut cfg = ServerConfig::new(capped());
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let server = ServerHandle::start(cfg).expect("server starts");
    let endpoint = Endpoint::Tcp(server.tcp_addr().unwrap());
    let mut held: Vec<Client> = (0..4)
        .map(|_| Client::connect(ClientConfig::new(endpoint.clone())).expect("within the cap"))
        .collect();
    assert_eq!(
        Client::connect(ClientConfig::new(endpoint.clone()))
            .err()
            .map(Status::from),
        Some(Status::ServerNoResource)
    );
    held.pop().unwrap().deinit().expect("deinit");
    held.push(Client::connect(ClientConfig::new(endpoint.clone())).expect("its place is free"));
    server.stop();
}
