//! Cluster servers (the runtime, no CLI) joined through the agent to a real etcd: they split
//! the partitions between them, each refuses the other's with `PartitionMoved`, and when one
//! dies the other serves its partitions after the takeover.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Etcd, eventually};
use dlock_cluster::AgentMembership;
use dlock_core::cluster::{Map, ServerId, partition_of};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    InitReply, PROTO_VERSION, decode_control_response, encode_control_request,
};
use dlock_core::{Config, LockKind, SessionKey, Status};
use dlock_transport::client::link::{Endpoint, Link};
use dlock_transport::runtime::{ClusterConfig, ServerConfig, ServerHandle, TcpConfig};

const P: u16 = 16;

fn key() -> SessionKey {
    SessionKey::new(std::array::from_fn(|i| {
        (i as u8).wrapping_mul(i as u8).wrapping_mul(37) ^ 0x5a
    }))
    .unwrap()
}

fn server(agent: &dlock_cluster::Agent) -> ServerHandle {
    let mut cfg = ServerConfig::new(Config {
        locks_max: 256,
        clients_max: 16,
        objects_max: 64,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    cfg.session_key = Some(key());
    cfg.cluster = Some(ClusterConfig {
        membership: Arc::new(AgentMembership::new(agent.handle())),
        counter_step: 100,
    });
    ServerHandle::start(cfg).unwrap()
}

fn control(link: &mut Link, client: u32, body: ControlRequest<'_>) -> (Status, Vec<u8>) {
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: body.msg_type(),
        message_id: 1,
        word: client,
    };
    let mut req = vec![0; CONTROL_FRAME_MAX];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req).unwrap();
    let mut reply = vec![0; CONTROL_FRAME_MAX];
    let deadline = Some(Instant::now() + Duration::from_secs(5));
    let m = link.control(&req[..n], &mut reply, deadline).unwrap();
    reply.truncate(m);
    let status = decode_control_response(&reply)
        .unwrap()
        .header
        .status()
        .unwrap();
    (status, reply)
}

/// Registers (or, with `join`, joins with that registration) at `s`.
fn register(s: &ServerHandle, join: Option<&InitReply>) -> (Link, InitReply) {
    let mut link = Link::connect(&Endpoint::Tcp(s.tcp_addr().unwrap())).unwrap();
    let (word, body) = match join {
        None => (
            0,
            ControlRequest::ClientInit {
                min_version: PROTO_VERSION,
                lease_ms: 0,
            },
        ),
        Some(i) => (
            i.client,
            ControlRequest::ClientJoin {
                min_version: PROTO_VERSION,
                lease_ms: 0,
                session: i.session,
            },
        ),
    };
    let (_, reply) = control(&mut link, word, body);
    let ControlResponse::Init(init) = decode_control_response(&reply).unwrap().body else {
        panic!(
            "registration refused: {:?}",
            decode_control_response(&reply)
        )
    };
    (link, init)
}

fn get_lock(link: &mut Link, client: u32, name: &[u8]) -> Status {
    control(
        link,
        client,
        ControlRequest::GetLock {
            kind: LockKind::Atomic,
            name,
        },
    )
    .0
}

fn name_of(map: &Map, owner: u32) -> Vec<u8> {
    (0..)
        .map(|i| format!("orders/{i}").into_bytes())
        .find(|n| {
            map.owner(partition_of(n, map.partitions())).unwrap().server == ServerId::new(owner)
        })
        .unwrap()
}

#[test]
fn two_servers_split_the_partitions_and_one_takes_over_when_the_other_dies() {
    let etcd = Etcd::start();
    let a1 = etcd.agent("split", 1, P);
    let a2 = etcd.agent("split", 2, P);
    let map = eventually(Duration::from_secs(20), "a map naming both", || {
        let m = a1.handle().map()?;
        let owners: std::collections::BTreeSet<_> =
            m.owners().iter().filter_map(|o| o.server).collect();
        (owners.len() == 2).then_some(m)
    });
    let (s1, s2) = (server(&a1), server(&a2));
    let (mut l1, c) = register(&s1, None);
    let (ours, theirs) = (name_of(&map, 1), name_of(&map, 2));
    // Served once the map is applied and the client's id persisted in etcd.
    eventually(Duration::from_secs(20), "server 1 serves its name", || {
        (get_lock(&mut l1, c.client, &ours) == Status::Success).then_some(())
    });
    assert_eq!(get_lock(&mut l1, c.client, &theirs), Status::PartitionMoved);
    let (mut l2, joined) = register(&s2, Some(&c));
    assert_eq!(joined.client, c.client, "one id on every server");
    eventually(Duration::from_secs(20), "server 2 serves its name", || {
        (get_lock(&mut l2, c.client, &theirs) == Status::Success).then_some(())
    });
    assert_eq!(get_lock(&mut l2, c.client, &ours), Status::PartitionMoved);
    // Server 1 dies: its lease expires and server 2 takes its partitions over; it serves them
    // after the takeover's wait and grace.
    s1.stop();
    a1.abandon();
    let started = Instant::now();
    eventually(
        Duration::from_secs(30),
        "server 2 serves server 1's name",
        || (get_lock(&mut l2, c.client, &ours) == Status::Success).then_some(()),
    );
    let m = a2.handle().map().unwrap();
    assert!(m.owners().iter().all(|o| o.server == ServerId::new(2)));
    assert!(
        started.elapsed() >= Duration::from_millis(1_000),
        "not before the lease expired"
    );
}

#[test]
fn servers_without_a_key_file_share_the_key_etcd_keeps() {
    let etcd = Etcd::start();
    let a1 = etcd.agent("keyed", 1, P);
    let a2 = etcd.agent("keyed", 2, P);
    let wait = Duration::from_secs(10);
    let k1 = a1.handle().session_key().wait(wait).unwrap().unwrap();
    let k2 = a2.handle().session_key().wait(wait).unwrap().unwrap();
    assert_eq!(k1, k2, "created once, read by every server");
    assert!(SessionKey::new(k1).is_ok(), "a key of full entropy");
    let again = a1.handle().session_key().wait(wait).unwrap().unwrap();
    assert_eq!(again, k1);
}
