//! Retained locks end to end: a client that dies holding a grant it asked to be retained
//! leaves it held; others are refused `LockRetained` (a waiting request waits); only a
//! connection the server's configuration makes a recoverer lists and releases it.

mod common;

use std::time::{Duration, Instant};

use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{
    Endpoint, ErrorKind, RetainedLock, list_retained, read_server_stats, recovery_done,
};
use dlock_transport::runtime::{Recoverers, ServerConfig, ServerHandle, TcpConfig};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A server whose local (Unix-socket) clients are recoverers and whose TCP clients are not,
/// with a short client lease.
fn server() -> ServerHandle {
    let mut cfg = ServerConfig::new(Config {
        client_lease_ms: 200,
        ..common::small()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    cfg.recoverers = Recoverers {
        local: true,
        ..Recoverers::default()
    };
    ServerHandle::start(cfg).expect("server starts")
}

/// Waits until the server lists `n` retained locks (the holder's lease must run out first).
fn retained_soon(local: &Endpoint, n: usize) -> Vec<RetainedLock> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got = list_retained(local, 0, TIMEOUT).expect("a local client is a recoverer");
        if got.len() == n || Instant::now() > until {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn counter(e: &Endpoint, name: &str) -> u64 {
    let stats = read_server_stats(e, TIMEOUT).unwrap();
    stats
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(0, |(_, v)| *v)
}

#[test]
fn a_dead_holders_retained_lock_is_released_only_by_a_recoverer() {
    let s = server();
    let (tcp, local) = (Endpoint::Tcp(s.tcp_addr().unwrap()), Endpoint::embedded(&s));
    let mut dead = common::client(&tcp);
    let kept = dead.get_lock(LockKind::Rw, b"page").unwrap();
    let plain = dead.get_lock(LockKind::Rw, b"plain").unwrap();
    dead.set_retain(kept, true).unwrap();
    let _ = dead.trylock(kept, Mode::Exclusive, 60_000).unwrap();
    let _ = dead.trylock(plain, Mode::Exclusive, 60_000).unwrap();
    let dead_id = dead.id().get();
    drop(dead); // its connections close: it dies at its lease

    let listed = retained_soon(&local, 1);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].client, listed[0].mode, &listed[0].name[..]),
        (dead_id, Mode::Exclusive, &b"page"[..])
    );
    // Registered after the death, so as not to go silent past its own lease meanwhile.
    let mut other = common::client(&tcp);
    let page = other.get_lock(LockKind::Rw, b"page").unwrap();
    let plain = other.get_lock(LockKind::Rw, b"plain").unwrap();
    let _ = other.trylock(plain, Mode::Exclusive, 60_000).unwrap();
    let refused = other.trylock(page, Mode::Shared, 60_000).unwrap_err();
    assert_eq!(
        (refused.status(), refused.kind()),
        (Status::LockRetained, ErrorKind::Retained)
    );
    let waited = other
        .lock(page, Mode::Exclusive, 60_000, Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(
        waited.status(),
        Status::LockRetained,
        "waited, then told why"
    );

    // A TCP client is no recoverer here, registered or not.
    assert_eq!(
        recovery_done(&tcp, dead_id, TIMEOUT).unwrap_err(),
        Status::Einval
    );
    assert_eq!(other.list_retained(0).unwrap_err(), Status::Einval);
    assert_eq!(counter(&tcp, "recovery_done_refused"), 2);
    assert_eq!(retained_soon(&local, 1).len(), 1, "nothing released");

    // A local one is.
    assert_eq!(recovery_done(&local, dead_id, TIMEOUT).unwrap(), 1);
    assert!(list_retained(&local, 0, TIMEOUT).unwrap().is_empty());
    let granted = other.trylock(page, Mode::Exclusive, 60_000).unwrap();
    assert_eq!(granted.status, Status::Success);
    assert_eq!(counter(&tcp, "locks_retained"), 1);
    assert_eq!(counter(&tcp, "retained_released"), 1);
}

/// A waiting request blocked by a retained grant is granted the moment a recoverer releases it.
#[test]
fn a_waiting_request_is_granted_when_the_recoverer_is_done() {
    let s = server();
    let (tcp, local) = (Endpoint::Tcp(s.tcp_addr().unwrap()), Endpoint::embedded(&s));
    let mut dead = common::client(&tcp);
    let kept = dead.get_lock(LockKind::Atomic, b"page").unwrap();
    dead.set_retain(kept, true).unwrap();
    let _ = dead.trylock(kept, Mode::Exclusive, 100).unwrap();
    let dead_id = dead.id().get();
    drop(dead);
    assert_eq!(retained_soon(&local, 1).len(), 1);
    let waiter = std::thread::spawn(move || {
        let mut c = common::client(&tcp);
        let id = c.get_lock(LockKind::Atomic, b"page").unwrap();
        c.lock(id, Mode::Exclusive, 60_000, Duration::from_secs(20))
            .map(|g| g.status)
            .map_err(Status::from)
    });
    // However long the waiter takes to park, the release comes after the grant's own lease
    // ran out: only the recoverer frees it.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(recovery_done(&local, dead_id, TIMEOUT).unwrap(), 1);
    assert_eq!(waiter.join().unwrap(), Ok(Status::Success));
}

/// A graceful deinit releases a grant that a death would have retained.
#[test]
fn a_deinit_leaves_nothing_retained() {
    let s = server();
    let (tcp, local) = (Endpoint::Tcp(s.tcp_addr().unwrap()), Endpoint::embedded(&s));
    let mut c = common::client(&tcp);
    let id = c.get_lock(LockKind::Fair, b"page").unwrap();
    c.set_retain(id, true).unwrap();
    let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
    c.deinit().unwrap();
    assert!(list_retained(&local, 0, TIMEOUT).unwrap().is_empty());
    let mut other = common::client(&tcp);
    let id = other.get_lock(LockKind::Fair, b"page").unwrap();
    assert_eq!(
        other.trylock(id, Mode::Exclusive, 60_000).unwrap().status,
        Status::Success
    );
}

/// Without a configured role nobody is a recoverer, local clients included.
#[test]
fn by_default_nobody_is_a_recoverer() {
    let s = common::server(true);
    let local = Endpoint::embedded(&s);
    assert_eq!(
        list_retained(&local, 0, TIMEOUT).unwrap_err(),
        Status::Einval
    );
    assert_eq!(
        recovery_done(&local, 7, TIMEOUT).unwrap_err(),
        Status::Einval
    );
}

/// The native API waits out a retained grant across its 20 ms slices and is granted once a
/// recoverer releases it; a `try_` is told why it cannot have the lock.
#[test]
fn a_native_wait_outlasts_its_slices_until_the_recoverer_is_done() {
    use dlock_transport::client::Locks;
    let s = server();
    let (tcp, local) = (Endpoint::Tcp(s.tcp_addr().unwrap()), Endpoint::embedded(&s));
    let dead = Locks::from(common::client(&tcp));
    let page = dead.rw("page").unwrap();
    page.set_retain(true).unwrap();
    let guard = page.try_write().unwrap();
    let dead_id = dead.client_id().get();
    std::mem::forget(guard); // never unlocked: its client dies holding it
    drop(page);
    drop(dead);
    assert_eq!(retained_soon(&local, 1).len(), 1);
    let other = Locks::from(common::client(&tcp));
    let page = other.rw("page").unwrap();
    assert_eq!(page.try_read().unwrap_err().kind(), ErrorKind::Retained);
    let waiter = std::thread::spawn(move || page.write(Duration::from_secs(20)).map(drop));
    std::thread::sleep(Duration::from_millis(100)); // several slices
    assert_eq!(recovery_done(&local, dead_id, TIMEOUT).unwrap(), 1);
    waiter.join().unwrap().expect("granted after the recovery");
}

/// Under TLS the role follows the client certificate's name, as the server's CA vouched for
/// it: a certificate named in `recoverers.names` lists and releases, another is refused.
#[test]
fn under_tls_the_recoverer_is_the_certificate_the_server_names() {
    use common::certs::{Ca, TempDir};
    use dlock_transport::tls::TlsConfig;
    let dir = TempDir::new("recoverer");
    let ca = Ca::new(&dir, "ca");
    let srv = ca.server(&dir, "server");
    let engine = ca.client(&dir, "engine", "engine-1");
    let ops = ca.client(&dir, "ops", "recovery-node");
    let mut tcp = TcpConfig::new("127.0.0.1:0".parse().expect("address"));
    tcp.tls = Some(TlsConfig::new(&srv.cert, &srv.key, &ca.cert));
    let mut cfg = ServerConfig::new(Config {
        client_lease_ms: 200,
        ..common::small()
    });
    cfg.tcp = Some(tcp);
    cfg.recoverers.names = vec!["recovery-node".to_string()];
    let s = ServerHandle::start(cfg).expect("server starts");
    let addr = s.tcp_addr().unwrap();
    let endpoint = |leaf: &common::certs::Leaf| {
        Endpoint::tls(addr, &TlsConfig::new(&leaf.cert, &leaf.key, &ca.cert)).expect("settings")
    };
    let (as_engine, as_ops) = (endpoint(&engine), endpoint(&ops));
    let mut dead = common::client(&as_engine);
    let id = dead.get_lock(LockKind::Rw, b"page").unwrap();
    dead.set_retain(id, true).unwrap();
    let _ = dead.trylock(id, Mode::Exclusive, 60_000).unwrap();
    let dead_id = dead.id().get();
    drop(dead);
    assert_eq!(retained_soon(&as_ops, 1).len(), 1);
    assert_eq!(
        list_retained(&as_engine, 0, TIMEOUT).unwrap_err(),
        Status::Einval
    );
    assert_eq!(
        recovery_done(&as_engine, dead_id, TIMEOUT).unwrap_err(),
        Status::Einval
    );
    assert_eq!(recovery_done(&as_ops, dead_id, TIMEOUT).unwrap(), 1);
}
