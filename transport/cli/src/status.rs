//! `dlock cluster status --connect ADDR`: a cluster's map as any of its servers serves it
//! (`GetMap`), and each member's own view (`Stats`: partitions owned and recovering, answers
//! `PartitionMoved` and fenced, clients and locks in use). Needs no etcd and no registration.
//!
//! Each member's line also says whether its agent reaches etcd and since when it does not, how
//! long ago its last keepalive was confirmed, whether it is the coordinator or draining, and
//! its load (clients registered, lock slots in use); `--partitions` adds a line per partition
//! (owner, epoch, handover). Which of a member's partitions still recover is counted, not
//! listed: the phase lives on the member's data thread.

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

/// A member's view of itself: its applied map, partitions, answers and load.
fn member_line(get: &dyn Fn(&str) -> u64) -> String {
    let mut roles = String::new();
    if get("coordinator") == 1 {
        roles.push_str(", coordinator");
    }
    if get("draining") == 1 {
        roles.push_str(", draining");
    }
    let recovering = match get("partitions_recovering") {
        0 => "0 recovering".to_owned(),
        n => format!(
            "{n} recovering (awaiting {} ReclaimDone, at most {} in one partition; {} wait for \
             their grace end)",
            get("reclaim_awaited"),
            get("reclaim_awaited_max"),
            get("reclaim_untracked"),
        ),
    };
    format!(
        "applied map v{}{roles}: {} owned, {recovering}; answered partition_moved {} \
         (fenced {}); load: {} clients, {} locks",
        get("map_version"),
        get("partitions_owned"),
        get("partition_moved"),
        get("fenced"),
        get("clients_active"),
        get("locks_in_use"),
    )
}

/// A member's link to etcd, as its agent last saw it.
fn etcd_line(get: &dyn Fn(&str) -> u64) -> String {
    let age = match get("keepalive_age_ms") {
        u64::MAX => "no keepalive confirmed yet".to_owned(),
        ms => format!("last keepalive confirmed {ms} ms ago"),
    };
    match get("etcd_unreachable_ms") {
        0 => format!("etcd: reachable, {age}"),
        ms => format!(
            "etcd: UNREACHABLE for {ms} ms, {age} (failover and moves wait; it stops granting \
             once its lease may have run out)"
        ),
    }
}

/// The partitions, one line each: owner, epoch, and how the owner got it.
fn print_partitions(map: &Map) {
    println!("partition  owner  epoch  handover");
    for (p, o) in map.owners().iter().enumerate() {
        let owner = o.server.map_or("-".to_owned(), |s| s.get().to_string());
        println!("{p:>9}  {owner:>5}  {:>5}  {:?}", o.epoch, o.handover);
    }
}

/// The report: the map, then each member's counters (reached at its advertised address with
/// `endpoint_of`).
pub(crate) fn status(
    addr: SocketAddr,
    endpoint_of: &dyn Fn(SocketAddr) -> Result<Endpoint, String>,
    partitions: bool,
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
                println!("    {}", member_line(&get));
                println!("    {}", etcd_line(&get));
            }
            Err(e) => println!("    unreachable: {e}"),
        }
    }
    if partitions {
        print_partitions(&map);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dlock_core::cluster::{Member, ServerId, Timing, assign};
    use dlock_core::{Config, SessionKey};
    use dlock_transport::runtime::membership::{Membership, StaticCluster, StaticMembership};
    use dlock_transport::runtime::{ClusterConfig, ServerConfig, ServerHandle, TcpConfig};
    use std::sync::Arc;

    /// A server, a member of `cluster` (as server 1, registration 7) or standalone.
    pub(crate) fn start(cluster: Option<&StaticCluster>) -> ServerHandle {
        start_as(cluster.map(|c| c.member(ServerId::new(1).unwrap(), 7, TIMING)))
    }

    const TIMING: Timing = Timing {
        ttl_ms: 1_000,
        drift_ppm: 10_000,
        grant_lease_max_ms: 2_000,
    };

    /// A server with `member` as its membership, or standalone.
    fn start_as(member: Option<StaticMembership>) -> ServerHandle {
        let mut cfg = ServerConfig::new(Config {
            locks_max: 64,
            clients_max: 8,
            objects_max: 8,
            ..Config::default()
        });
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
        if let Some(member) = member {
            cfg.session_key = Some(
                SessionKey::new(std::array::from_fn(|i| (i as u8).wrapping_mul(151) ^ 0x3c))
                    .unwrap(),
            );
            cfg.cluster = Some(ClusterConfig {
                membership: Arc::new(member),
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

    /// Reads the server's counters until `done` holds of them (the cluster thread publishes
    /// its membership's status every few milliseconds).
    fn counters_until(
        endpoint: &Endpoint,
        done: impl Fn(&dyn Fn(&str) -> u64) -> bool,
    ) -> Vec<(&'static str, u64)> {
        let start = Instant::now();
        loop {
            let stats = read_server_stats(endpoint, TIMEOUT).unwrap();
            let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
            if done(&get) {
                return stats;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{stats:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_member_says_whether_it_reaches_etcd_since_when_and_its_load() {
        let cluster = StaticCluster::new();
        let me = Member {
            id: ServerId::new(1).unwrap(),
            incarnation: 7,
            address: b"127.0.0.1:1",
            draining: false,
        };
        let mut map = Map::new(Partitions::new(32).unwrap());
        assign(&Map::new(map.partitions()), &[me], &[], &mut map).unwrap();
        cluster.set_map(map.clone());
        let member = cluster.member(me.id, 7, TIMING);
        let server = start_as(Some(member.clone()));
        let endpoint = Endpoint::Tcp(server.tcp_addr().unwrap());
        let v = map.version();
        let stats = counters_until(&endpoint, |get: &dyn Fn(&str) -> u64| {
            get("map_version") == v && get("keepalive_age_ms") < 60_000
        });
        let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
        assert_eq!(get("etcd_unreachable_ms"), 0);
        assert!(
            etcd_line(&get).starts_with("etcd: reachable"),
            "{}",
            etcd_line(&get)
        );
        assert!(
            member_line(&get).contains("32 owned"),
            "{}",
            member_line(&get)
        );
        // Cut off from etcd: the member says so, and for how long.
        member.fence(true);
        let stats = counters_until(&endpoint, |get: &dyn Fn(&str) -> u64| {
            get("etcd_unreachable_ms") > 0
        });
        let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
        assert!(
            etcd_line(&get).contains("UNREACHABLE"),
            "{}",
            etcd_line(&get)
        );
        // Asked to drain, it says so.
        member.drain();
        let stats = counters_until(&endpoint, |get: &dyn Fn(&str) -> u64| get("draining") == 1);
        let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
        assert!(
            member_line(&get).contains(", draining"),
            "{}",
            member_line(&get)
        );
        assert_eq!(get("coordinator"), 0);
    }

    #[test]
    fn the_load_counts_the_clients_and_locks_a_server_holds_now() {
        let server = start(None);
        let endpoint = Endpoint::Tcp(server.tcp_addr().unwrap());
        let cfg = dlock_transport::client::ClientConfig::new(endpoint.clone());
        let mut client = dlock_transport::client::Client::connect(cfg).unwrap();
        client.get_lock(dlock_core::LockKind::Atomic, b"a").unwrap();
        client.get_lock(dlock_core::LockKind::Atomic, b"b").unwrap();
        let stats = counters_until(&endpoint, |get: &dyn Fn(&str) -> u64| {
            get("clients_active") == 1 && get("locks_in_use") == 2
        });
        let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
        assert!(
            member_line(&get).ends_with("load: 1 clients, 2 locks"),
            "{}",
            member_line(&get)
        );
    }
}
