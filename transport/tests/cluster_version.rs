//! A routing client (`ClusterLink`) given a version cap (`ClientConfig::version_max`) against
//! a cluster server: it registers at its own versions, as its joins of the other servers do,
//! so that every server of the cluster tells it the same. Before, the registration's server
//! negotiated the capped version and every server joined later the newest: at a cap of 6 one
//! server lapsed the client's revokes at its lease and marked no plain grants, the others
//! lapsed them at their revoke timeout and marked them. And since the link reads no member's
//! revokes, it is refused cached grants.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_core::cluster::{Map, Partitions, Timing};
use dlock_core::manager::Timing as ManagerTiming;
use dlock_core::proto::PROTO_VERSION;
use dlock_core::{Config, LockKind, Status};
use dlock_transport::client::cluster::{ClusterConfig as LinkConfig, ClusterLink};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::ServerHandle;
use dlock_transport::runtime::membership::{StaticCluster, StaticMembership};

#[allow(dead_code)]
mod common;
use common::cluster::map_after;

const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 30_000,
};

/// A cluster client of the server at `addr`, registered with `cfg` over its link (retried
/// while the server has not applied its first map).
fn client(addr: SocketAddr, cfg: &ClientConfig) -> Client<ClusterLink> {
    let mut client = None;
    common::cluster::wait_until(Duration::from_secs(30), "the map served", || {
        let link = LinkConfig::new([addr.to_string()]).with_timeout(Duration::from_secs(2));
        client = ClusterLink::connect(link)
            .and_then(|l| Client::over(l, cfg.clone()))
            .ok();
        client.is_some()
    });
    client.expect("registered")
}

#[test]
fn a_cluster_client_registers_at_its_own_versions_whatever_its_cap() {
    let cluster = StaticCluster::new();
    let (s, _member) = common::cluster::server(&cluster, 1, TIMING);
    let addr = s.tcp_addr().unwrap();
    cluster.set_map(map_after(
        &Map::new(Partitions::new(16).unwrap()),
        &[(1, addr)],
    ));
    let capped = ClientConfig::new(Endpoint::Tcp(addr)).with_version_max(6);
    let c = client(addr, &capped);
    assert_eq!(c.version(), PROTO_VERSION, "the cap is not the link's");
    // A standalone client of the same server keeps to its cap.
    let standalone = Client::connect(capped).unwrap();
    assert_eq!(standalone.version(), 6);
}

/// A server of the cluster whose revoke timeout is `revoke_timeout_ms` (0: the lease).
fn server_lapsing_at(
    cluster: &StaticCluster,
    n: u32,
    revoke_timeout_ms: u32,
) -> (ServerHandle, StaticMembership, SocketAddr) {
    let core = Config {
        locks_max: 256,
        clients_max: 16,
        objects_max: 64,
        timing: ManagerTiming {
            revoke_timeout_ms,
            ..ManagerTiming::DEFAULT
        },
        ..Config::default()
    };
    let (s, member) = common::cluster::server_with_config(cluster, n, TIMING, core);
    let addr = s.tcp_addr().unwrap();
    (s, member, addr)
}

#[test]
fn a_cluster_client_is_refused_cached_grants_it_could_not_be_asked_back() {
    // The routing link reads no revokes: a cached grant would be kept after its server lapsed
    // it and granted another.
    let cluster = StaticCluster::new();
    let (_s, _m, a) = server_lapsing_at(&cluster, 1, 0);
    cluster.set_map(map_after(
        &Map::new(Partitions::new(16).unwrap()),
        &[(1, a)],
    ));
    let mut c = client(a, &ClientConfig::new(Endpoint::Tcp(a)));
    assert!(!c.carries_events());
    let id = c.get_lock(LockKind::Rw, b"row-group").unwrap();
    assert_eq!(
        c.set_cacheable(id, true).map_err(|e| e.status()),
        Err(Status::Einval)
    );
    c.set_cacheable(id, false).unwrap();
    // A standalone client of the same server carries them.
    assert!(
        Client::connect(ClientConfig::new(Endpoint::Tcp(a)))
            .unwrap()
            .carries_events()
    );
}
