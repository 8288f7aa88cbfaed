//! What the transport's test files share: a small server (optionally with a TCP listener) and a
//! client of it.

pub mod certs;
pub mod raw;

use dlock_core::Config;
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

/// Capacities big enough for 64 clients contending on a few hundred locks.
pub fn small() -> Config {
    Config {
        locks_max: 256,
        clients_max: 80,
        objects_max: 16,
        ..Config::default()
    }
}

/// A server with `small()` capacities; with `tcp`, also listening on a free loopback port.
pub fn server(tcp: bool) -> ServerHandle {
    let mut cfg = ServerConfig::new(small());
    if tcp {
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    }
    ServerHandle::start(cfg).expect("server starts")
}

/// A registered client of the server at `e`.
pub fn client(e: &Endpoint) -> Client {
    Client::connect(ClientConfig::new(e.clone())).expect("client registers")
}
