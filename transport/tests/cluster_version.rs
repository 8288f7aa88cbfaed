//! A routing client (`ClusterLink`) given a version cap (`ClientConfig::version_max`) against
//! a cluster server: it registers at its own versions, as its joins of the other servers do,
//! so that every server of the cluster tells it the same. Before, the registration's server
//! negotiated the capped version and every server joined later the newest: at a cap of 6 one
//! server lapsed the client's revokes at its lease and marked no plain grants, the others
//! lapsed them at their revoke timeout and marked them.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_core::cluster::{Map, Partitions, Timing};
use dlock_core::proto::PROTO_VERSION;
use dlock_transport::client::cluster::{ClusterConfig as LinkConfig, ClusterLink};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::membership::StaticCluster;

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
    loop {
        let link = LinkConfig::new([addr.to_string()]).with_timeout(Duration::from_secs(2));
        match ClusterLink::connect(link).and_then(|l| Client::over(l, cfg.clone())) {
            Ok(c) => return c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
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
