//! What the transport's test files share: a small server (optionally with a TCP listener) and a
//! client of it.

pub mod certs;
pub mod cluster;
pub mod gated;
pub mod raw;

use dlock_core::Config;
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

/// Capacities big enough for 64 clients contending on a few hundred locks. Every TCP client
/// of a test comes from 127.0.0.1, one peer, so the per-peer cap is the whole table.
pub fn small() -> Config {
    Config {
        locks_max: 256,
        clients_max: 80,
        objects_max: 16,
        clients_per_peer_max: 80,
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

/// [`server`] with contention-aware grants off (`Timing::contention_window_ms` 0): for tests
/// of the revoke itself, which fight over one lock again and again and need every conflict to
/// find a cached grant there, where the default window would grant the lock plain after the
/// first. (Not every test binary that includes this module uses it.)
#[allow(dead_code)]
pub fn revoke_server(tcp: bool) -> ServerHandle {
    timed_server(tcp, window(0))
}

/// [`server`], listening on TCP too, with a contention window long against any test (ten
/// minutes): a lock a conflict made contended stays so throughout, and every cacheable request
/// on it is granted plain. (Not every test binary that includes this module uses it.)
#[allow(dead_code)]
pub fn contended_server() -> ServerHandle {
    timed_server(true, window(600_000))
}

/// The default timing with contention window `window_ms` (`Timing::contention_window_ms`).
#[allow(dead_code)]
pub fn window(window_ms: u32) -> dlock_core::manager::Timing {
    dlock_core::manager::Timing {
        contention_window_ms: window_ms,
        ..dlock_core::manager::Timing::DEFAULT
    }
}

/// [`server`] with the lock manager's `timing`.
#[allow(dead_code)]
pub fn timed_server(tcp: bool, timing: dlock_core::manager::Timing) -> ServerHandle {
    let mut cfg = ServerConfig::new(Config { timing, ..small() });
    if tcp {
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    }
    ServerHandle::start(cfg).expect("server starts")
}

/// A failover's replacement server: listening on `addr` (the failed server's, or a fresh
/// port), with `small()` tables, epoch 2, in recovery until `recovery_clients` clients have
/// re-claimed, and without a session key (`insecure_recovery`: a test's clients re-claim
/// unproved). (Not every test binary that includes this module uses it.)
#[allow(dead_code)]
pub fn replacement(addr: std::net::SocketAddr, recovery_clients: u32) -> ServerHandle {
    replacement_of(
        addr,
        Config {
            recovery_clients,
            ..small()
        },
    )
}

/// [`replacement`] with other tables than `small()` (`core`'s; its epoch is set to 2).
#[allow(dead_code)]
pub fn replacement_of(addr: std::net::SocketAddr, core: Config) -> ServerHandle {
    let mut cfg = ServerConfig::new(Config { epoch: 2, ..core });
    cfg.tcp = Some(TcpConfig::new(addr));
    cfg.insecure_recovery = true;
    ServerHandle::start(cfg).expect("replacement starts")
}

/// A registered client of the server at `e`. (Not every test binary that includes this module
/// uses it.)
#[allow(dead_code)]
pub fn client(e: &Endpoint) -> Client {
    Client::connect(ClientConfig::new(e.clone())).expect("client registers")
}

/// A server with mutual TLS on a free loopback port and `core`'s capacities, and the endpoint
/// of a client holding a good certificate. The PEM files live as long as the returned
/// directory. (Not every test binary that includes this module uses it.)
#[allow(dead_code)]
pub fn tls_server(tag: &str, core: Config) -> (ServerHandle, Endpoint, certs::TempDir) {
    use dlock_transport::tls::TlsConfig;
    let dir = certs::TempDir::new(tag);
    let ca = certs::Ca::new(&dir, "ca");
    let srv = ca.server(&dir, "server");
    let engine = ca.client(&dir, "engine", "engine-1");
    let mut tcp = TcpConfig::new("127.0.0.1:0".parse().expect("address"));
    tcp.tls = Some(TlsConfig::new(&srv.cert, &srv.key, &ca.cert));
    let mut cfg = ServerConfig::new(core);
    cfg.tcp = Some(tcp);
    let s = ServerHandle::start(cfg).expect("server starts");
    let e = Endpoint::tls(
        s.tcp_addr().expect("tcp"),
        &TlsConfig::new(&engine.cert, &engine.key, &ca.cert),
    )
    .expect("client TLS settings");
    (s, e, dir)
}
