//! Cluster servers in one test process: each a `ServerHandle` in cluster mode over an in-process
//! membership (`StaticCluster`), with the test setting the map the coordinator would.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::cluster::{Map, Member, ServerId, Timing, assign};
use dlock_core::{Config, SessionKey};
use dlock_transport::client::{Endpoint, read_server_stats};
use dlock_transport::runtime::membership::{StaticCluster, StaticMembership};
use dlock_transport::runtime::{ClusterConfig, ServerConfig, ServerHandle, TcpConfig};

/// Server `n`'s id.
pub fn sid(n: u32) -> ServerId {
    ServerId::new(n).unwrap()
}

/// Server `n` of `cluster` (incarnation `10 n`), on a free loopback port, with a session key
/// every server of the test shares (a cluster's servers verify each other's grant proofs).
pub fn server(cluster: &StaticCluster, n: u32, timing: Timing) -> (ServerHandle, StaticMembership) {
    server_with_locks(cluster, n, timing, 256)
}

/// [`server`] with a lock table of `locks_max` slots.
pub fn server_with_locks(
    cluster: &StaticCluster,
    n: u32,
    timing: Timing,
    locks_max: u32,
) -> (ServerHandle, StaticMembership) {
    server_with_config(
        cluster,
        n,
        timing,
        Config {
            locks_max,
            clients_max: 16,
            objects_max: 64,
            ..Config::default()
        },
    )
}

/// [`server`] with the core configuration `core`.
pub fn server_with_config(
    cluster: &StaticCluster,
    n: u32,
    timing: Timing,
    core: Config,
) -> (ServerHandle, StaticMembership) {
    let membership = cluster.member(sid(n), u64::from(n) * 10, timing);
    let mut cfg = ServerConfig::new(core);
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    cfg.session_key = Some(
        SessionKey::new(std::array::from_fn(|i| {
            (i as u8).wrapping_mul(i as u8).wrapping_mul(37) ^ 0x5a
        }))
        .unwrap(),
    );
    cfg.cluster = Some(ClusterConfig {
        membership: Arc::new(membership.clone()),
        counter_step: 50,
    });
    (ServerHandle::start(cfg).unwrap(), membership)
}

/// The map after `current` for `members` (id, address), as the coordinator would assign it.
pub fn map_after(current: &Map, members: &[(u32, SocketAddr)]) -> Map {
    let addrs: Vec<Vec<u8>> = members
        .iter()
        .map(|(_, a)| a.to_string().into_bytes())
        .collect();
    let ms: Vec<Member<'_>> = members
        .iter()
        .zip(&addrs)
        .map(|(&(n, _), a)| Member {
            id: sid(n),
            incarnation: u64::from(n) * 10,
            address: a,
            draining: false,
        })
        .collect();
    let mut out = Map::new(current.partitions());
    assign(current, &ms, &[], &mut out).unwrap();
    out
}

/// Counter `name` of the server at `addr` (0 when it has none by that name).
pub fn stat(addr: SocketAddr, name: &str) -> u64 {
    let stats = read_server_stats(&Endpoint::Tcp(addr), Duration::from_secs(5)).unwrap();
    stats
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| *v)
}

/// Polls `f` every 20 ms until it holds, for at most `limit`.
pub fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
