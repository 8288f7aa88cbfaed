//! A routing client (`ClusterLink`) whose lease lapsed at a cluster server: the server declared
//! it dead, freed its grants and references and closed its connection, so the client's records
//! there are stale. The client must join the server again (before, a control request answered
//! `ClientNotInit` left it marked joined, and every later one read the same), get a lock's
//! reference again by name, and report the grant it held as lost — not read `LockNotGet` for
//! good with the forgotten reference (the cut-off-server end-to-end test saw it: 11,831
//! `LockNotGet` and one lock never granted again).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::cluster::{Map, Member, Partitions, ServerId, Timing, assign};
use dlock_core::{Config, LockKind, Mode, SessionKey, Status};
use dlock_transport::client::cluster::ClusterConfig as LinkConfig;
use dlock_transport::client::{Client, Endpoint, read_server_stats};
use dlock_transport::runtime::membership::StaticCluster;
use dlock_transport::runtime::{ClusterConfig, ServerConfig, ServerHandle, TcpConfig};

const P: u16 = 16;
const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 30_000,
};

fn sid(n: u32) -> ServerId {
    ServerId::new(n).unwrap()
}

fn server(cluster: &StaticCluster, n: u32) -> ServerHandle {
    let membership = cluster.member(sid(n), u64::from(n) * 10, TIMING);
    let mut cfg = ServerConfig::new(Config {
        locks_max: 256,
        clients_max: 16,
        objects_max: 64,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    cfg.session_key = Some(
        SessionKey::new(std::array::from_fn(|i| {
            (i as u8).wrapping_mul(i as u8).wrapping_mul(41) ^ 0xa5
        }))
        .unwrap(),
    );
    cfg.cluster = Some(ClusterConfig {
        membership: Arc::new(membership),
        counter_step: 50,
    });
    ServerHandle::start(cfg).unwrap()
}

/// The first map, every partition at server `n` (at `addr`).
fn map_of(n: u32, addr: SocketAddr) -> Map {
    let address = addr.to_string().into_bytes();
    let members = [Member {
        id: sid(n),
        incarnation: u64::from(n) * 10,
        address: &address,
        draining: false,
    }];
    let mut out = Map::new(Partitions::new(P).unwrap());
    assign(
        &Map::new(Partitions::new(P).unwrap()),
        &members,
        &[],
        &mut out,
    )
    .unwrap();
    out
}

fn stat(addr: SocketAddr, name: &str) -> u64 {
    let stats = read_server_stats(&Endpoint::Tcp(addr), Duration::from_secs(5)).unwrap();
    stats
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| *v)
}

/// Polls `f` every 20 ms until it holds, for at most `limit`.
fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_whose_lease_lapsed_gets_its_locks_again_and_loses_its_grants() {
    let cluster = StaticCluster::new();
    let s1 = server(&cluster, 1);
    let a1 = s1.tcp_addr().unwrap();
    cluster.set_map(map_of(1, a1));
    // A short lease, and no heartbeat below: the server declares the client dead.
    let cfg = || {
        LinkConfig::new([a1.to_string()])
            .with_timeout(Duration::from_secs(2))
            .with_lease(Duration::from_millis(300))
    };
    let mut c = loop {
        match Client::connect_cluster(cfg()) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let name = b"orders/lapsed".to_vec();
    let mut id = None;
    wait_until(Duration::from_secs(10), "the lock's reference", || {
        id = c.get_lock(LockKind::Atomic, &name).ok();
        id.is_some()
    });
    let id = id.unwrap();
    let released = c.get_lock(LockKind::Atomic, b"orders/released").unwrap();
    wait_until(Duration::from_secs(10), "a grant", || {
        c.lock(id, Mode::Exclusive, 10_000, Duration::from_millis(100))
            .is_ok_and(|g| g.status == Status::Success)
    });

    // Silent past its lease, holding the grant: the server frees both.
    let expired = stat(a1, "clients_expired");
    wait_until(Duration::from_secs(10), "the client declared dead", || {
        stat(a1, "clients_expired") > expired
    });
    // Another client takes the lock the first one held: its grant is gone.
    let mut other = Client::connect_cluster(cfg()).unwrap();
    let other_id = other.get_lock(LockKind::Atomic, &name).unwrap();
    let g = other
        .lock(other_id, Mode::Exclusive, 10_000, Duration::from_secs(2))
        .unwrap();
    assert_eq!(g.status, Status::Success);
    assert_eq!(other.unlock(other_id).unwrap(), Status::Success);

    // A reference the server freed is released (nothing is left to give back), after at most
    // a failed call or two while the client finds the server closed its connection and forgot
    // it; then its name is got again afresh.
    let mut tries = 0;
    while let Err(e) = c.release_lock(released) {
        tries += 1;
        assert!(tries < 3, "the release never went through: {e:?}");
    }
    let again = c.get_lock(LockKind::Atomic, b"orders/released").unwrap();
    let g = c
        .lock(again, Mode::Exclusive, 1_000, Duration::from_secs(2))
        .unwrap();
    assert_eq!(g.status, Status::Success);
    assert_eq!(c.unlock(again).unwrap(), Status::Success);

    // The lapsed client's grant is reported lost, not released as if still held.
    let unlocked = c.unlock(id);
    assert!(
        !matches!(unlocked, Ok(Status::Success)),
        "a grant the server freed was unlocked: {unlocked:?}"
    );
    // Its lock works again (the reference got again by name), after at most a few refusals
    // while the client finds it was dropped.
    let mut seen = Vec::new();
    wait_until(Duration::from_secs(10), "a grant after the lapse", || {
        let g = c.lock(id, Mode::Exclusive, 1_000, Duration::from_millis(100));
        let ok = g.as_ref().is_ok_and(|g| g.status == Status::Success);
        seen.push(format!("{g:?}"));
        ok || seen.len() > 20 && panic!("never granted again: {seen:?}")
    });
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
    drop(s1);
}
