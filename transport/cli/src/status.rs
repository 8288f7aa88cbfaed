//! `dlock cluster status --connect ADDR`: a cluster's map as any of its servers serves it
//! (`GetMap`), and each member's own view (`Stats`: partitions owned and recovering, answers
//! `PartitionMoved` and fenced, clients and locks in use). Needs no etcd and no registration.
//!
//! What it cannot show: whether a member reaches etcd now (only its agent knows; a member that
//! lost etcd for most of its lease TTL fences itself, which shows as a growing `fenced`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_core::Status;
use dlock_core::cluster::{Handover, Map, Partitions};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    MsgType, PROTO_VERSION, decode_control_response, encode_control_request,
};
use dlock_transport::client::link::Link;
use dlock_transport::client::{Endpoint, read_server_stats};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Fetches the map from the server at `endpoint`, chunk by chunk, starting over if it changes
/// meanwhile.
pub(crate) fn read_map(endpoint: &Endpoint) -> Result<Box<Map>, String> {
    let mut link = Link::connect(endpoint).map_err(|e| e.to_string())?;
    'again: for _ in 0..5 {
        let mut bytes = Vec::new();
        let mut version = None;
        let mut offset = 0;
        loop {
            let header = ControlHeader {
                version: PROTO_VERSION,
                msg: MsgType::GetMap,
                message_id: 1,
                word: 0,
            };
            let frame = ControlRequestFrame {
                header,
                body: ControlRequest::GetMap { offset },
            };
            let mut req = [0u8; 64];
            let n = encode_control_request(&frame, &mut req).map_err(|e| format!("{e:?}"))?;
            let mut reply = vec![0u8; CONTROL_FRAME_MAX];
            let m = link
                .control(&req[..n], &mut reply, Some(Instant::now() + TIMEOUT))
                .map_err(|e| e.to_string())?;
            let f = decode_control_response(&reply[..m]).map_err(|e| format!("{e:?}"))?;
            let chunk = match (f.header.status(), f.body) {
                (Some(Status::Success), ControlResponse::MapChunk(c)) => c,
                (Some(Status::Einval), _) => {
                    return Err(
                        "the server has no map: a standalone server, or one that has \
                                not joined its cluster yet"
                            .into(),
                    );
                }
                (s, _) => return Err(format!("the server answered {s:?}")),
            };
            if *version.get_or_insert(chunk.version) != chunk.version {
                continue 'again;
            }
            bytes.extend_from_slice(chunk.chunk);
            match chunk.next_offset() {
                Some(next) => offset = next,
                None => break,
            }
        }
        let mut map = Box::new(Map::new(Partitions::DEFAULT));
        Map::decode(&bytes, &mut map).map_err(|e| format!("the map does not decode: {e}"))?;
        return Ok(map);
    }
    Err("the map kept changing while it was read".into())
}

/// The report: the map, then each member's counters (reached at its advertised address with
/// `endpoint_of`).
pub(crate) fn status(
    addr: SocketAddr,
    endpoint_of: &dyn Fn(SocketAddr) -> Result<Endpoint, String>,
) -> Result<(), String> {
    let map = read_map(&endpoint_of(addr)?)?;
    println!(
        "map version {}, {} partitions, {} servers",
        map.version(),
        map.partitions().get(),
        map.servers().len()
    );
    let unowned = map.owners().iter().filter(|o| o.server.is_none()).count();
    if unowned > 0 {
        println!("{unowned} partitions have no owner (no live server could take them)");
    }
    for e in map.servers() {
        let owned: Vec<_> = map
            .owners()
            .iter()
            .filter(|o| o.server == Some(e.id()))
            .collect();
        let epochs = owned.iter().map(|o| o.epoch);
        let (lo, hi) = (epochs.clone().min().unwrap_or(0), epochs.max().unwrap_or(0));
        let taken = owned
            .iter()
            .filter(|o| matches!(o.handover, Handover::Expired | Handover::Moved))
            .count();
        let address = String::from_utf8_lossy(e.address()).into_owned();
        println!(
            "server {} (lease {:x}) at {address}: {} partitions, epochs {lo}..={hi}, {taken} taken over",
            e.id().get(),
            e.incarnation(),
            owned.len(),
        );
        let stats = address
            .parse::<SocketAddr>()
            .map_err(|e| e.to_string())
            .and_then(endpoint_of)
            .and_then(|ep| read_server_stats(&ep, TIMEOUT).map_err(|e| e.to_string()));
        match stats {
            Ok(stats) => {
                let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
                println!(
                    "    applied: {} owned, {} recovering; answered partition_moved {} (fenced {}); \
                     clients registered {}",
                    get("partitions_owned"),
                    get("partitions_recovering"),
                    get("partition_moved"),
                    get("fenced"),
                    get("clients_registered"),
                );
            }
            Err(e) => println!("    unreachable: {e}"),
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dlock_core::cluster::{Member, ServerId, Timing, assign};
    use dlock_core::{Config, SessionKey};
    use dlock_transport::runtime::membership::StaticCluster;
    use dlock_transport::runtime::{ClusterConfig, ServerConfig, ServerHandle, TcpConfig};
    use std::sync::Arc;

    pub(crate) fn start(cluster: Option<&StaticCluster>) -> ServerHandle {
        let mut cfg = ServerConfig::new(Config {
            locks_max: 64,
            clients_max: 8,
            objects_max: 8,
            ..Config::default()
        });
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
        if let Some(c) = cluster {
            let timing = Timing {
                ttl_ms: 1_000,
                drift_ppm: 10_000,
                grant_lease_max_ms: 2_000,
            };
            cfg.session_key = Some(
                SessionKey::new(std::array::from_fn(|i| (i as u8).wrapping_mul(151) ^ 0x3c))
                    .unwrap(),
            );
            cfg.cluster = Some(ClusterConfig {
                membership: Arc::new(c.member(ServerId::new(1).unwrap(), 7, timing)),
                counter_step: 10,
            });
        }
        ServerHandle::start(cfg).unwrap()
    }

    #[test]
    fn the_map_is_read_from_any_server_and_a_standalone_one_says_it_has_none() {
        let cluster = StaticCluster::new();
        let member = Member {
            id: ServerId::new(1).unwrap(),
            incarnation: 7,
            address: b"127.0.0.1:1",
            draining: false,
        };
        let mut map = Map::new(Partitions::new(32).unwrap());
        assign(
            &Map::new(Partitions::new(32).unwrap()),
            &[member],
            &[],
            &mut map,
        )
        .unwrap();
        cluster.set_map(map.clone());
        let server = start(Some(&cluster));
        let endpoint = Endpoint::Tcp(server.tcp_addr().unwrap());
        let start = Instant::now();
        let got = loop {
            match read_map(&endpoint) {
                Ok(m) => break m,
                Err(e) if start.elapsed() > Duration::from_secs(10) => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        assert_eq!(*got, map);
        let standalone = start_standalone();
        let err = read_map(&Endpoint::Tcp(standalone.tcp_addr().unwrap())).unwrap_err();
        assert!(err.contains("no map"), "{err}");
    }

    fn start_standalone() -> ServerHandle {
        start(None)
    }
}
