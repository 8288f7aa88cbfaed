//! Cluster servers in one process over an in-process membership (`StaticCluster`): the wrong
//! server answers `PartitionMoved` with its map version, a fenced server grants nothing, and a
//! counter's values never repeat when its partition moves to another server.

use std::time::{Duration, Instant};

use dlock_core::GrantProof;
use dlock_core::cluster::{Map, Member, Partitions, Timing, assign, partition_of};
use dlock_core::proto::{Batch, Held, LockClaim};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, CommandResult, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, DATA_MESSAGE_MAX, DataHeader, InitReply, LockCommand, LockOp, ObjectCommand,
    ObjectOp, PROTO_VERSION, decode_control_response, decode_data_response, encode_control_request,
    encode_data_request,
};
use dlock_core::{LockKind, Status, Ticket};
use dlock_transport::client::link::{Endpoint, Link};
use dlock_transport::runtime::ServerHandle;
use dlock_transport::runtime::membership::{StaticCluster, StaticMembership};

#[allow(dead_code)]
mod common;
use common::cluster::sid;

const P: u16 = 16;
const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 2_000,
};

fn map_after(current: &Map, members: &[(u32, bool)]) -> Map {
    let addrs: Vec<Vec<u8>> = members
        .iter()
        .map(|(n, _)| format!("server-{n}").into_bytes())
        .collect();
    let ms: Vec<Member<'_>> = members
        .iter()
        .zip(&addrs)
        .map(|(&(n, draining), a)| Member {
            id: sid(n),
            incarnation: u64::from(n) * 10,
            address: a,
            draining,
        })
        .collect();
    let mut out = Map::new(current.partitions());
    assign(current, &ms, &[], &mut out).unwrap();
    out
}

fn server(cluster: &StaticCluster, n: u32) -> (ServerHandle, StaticMembership) {
    common::cluster::server(cluster, n, TIMING)
}

/// A registered client of one server at the frame level.
struct Raw {
    link: Link,
    init: InitReply,
    next_id: u16,
}

impl Raw {
    fn control(&mut self, body: ControlRequest<'_>) -> Vec<u8> {
        control(&mut self.link, self.init.client, body)
    }

    fn data(&mut self, cmds: &[Command]) -> Vec<CommandResult> {
        self.data_proved(cmds).into_iter().map(|(r, _)| r).collect()
    }

    /// The results with each one's proof MAC (zero without a proof).
    fn data_proved(&mut self, cmds: &[Command]) -> Vec<(CommandResult, [u8; 16])> {
        self.next_id += 1;
        let header = DataHeader {
            version: PROTO_VERSION,
            count: 0,
            message_id: self.next_id,
            client: self.init.client,
            flags: 0,
        };
        let mut req = vec![0; DATA_MESSAGE_MAX];
        let n = encode_data_request(&header, cmds, &mut req).unwrap();
        let mut reply = vec![0; 4096];
        let deadline = Some(Instant::now() + Duration::from_secs(5));
        let m = self.link.data(&req[..n], &mut reply, deadline).unwrap();
        let r = decode_data_response(&reply[..m]).unwrap();
        (0..r.len())
            .map(|i| (r.result(i).result, r.proof_mac(i)))
            .collect()
    }
}

fn control(link: &mut Link, client: u32, body: ControlRequest<'_>) -> Vec<u8> {
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
    reply
}

fn register(s: &ServerHandle, join: Option<&InitReply>) -> Raw {
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
    let reply = control(&mut link, word, body);
    let ControlResponse::Init(init) = decode_control_response(&reply).unwrap().body else {
        panic!("registration: {:?}", decode_control_response(&reply))
    };
    link.attach(init.client, init.slot, init.session).unwrap();
    Raw {
        link,
        init,
        next_id: 0,
    }
}

/// Retries `f` until it answers something other than `NotReady` or `PartitionMoved` (the map,
/// the authority or the client's persisted mark are still on their way), within 10 s.
fn settled<T>(mut f: impl FnMut() -> (Status, T)) -> (Status, T) {
    let start = Instant::now();
    loop {
        let (s, v) = f();
        if !matches!(s, Status::NotReady | Status::PartitionMoved)
            || start.elapsed() > Duration::from_secs(10)
        {
            return (s, v);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn name_of(map: &Map, owner: u32) -> Vec<u8> {
    (0..)
        .map(|i| format!("orders/{i}").into_bytes())
        .find(|n| map.owner(partition_of(n, map.partitions())).unwrap().server == Some(sid(owner)))
        .unwrap()
}

fn get_lock(c: &mut Raw, name: &[u8]) -> (Status, Vec<u8>) {
    let reply = c.control(ControlRequest::GetLock {
        kind: LockKind::Atomic,
        name,
    });
    let f = decode_control_response(&reply).unwrap();
    (f.header.status().unwrap(), reply)
}

fn trylock(lock: u32, epoch: u32) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op: LockOp::TryExclusive,
        lock,
        expire_ms: 60_000,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: epoch,
        flags: dlock_core::proto::LockFlags::NONE,
    })
}

fn lock_id(reply: &[u8]) -> u32 {
    match decode_control_response(reply).unwrap().body {
        ControlResponse::Lock { lock } => lock,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_wrong_server_answers_partition_moved_and_a_fenced_one_grants_nothing() {
    let cluster = StaticCluster::new();
    let m1 = map_after(
        &Map::new(Partitions::new(P).unwrap()),
        &[(1, false), (2, false)],
    );
    cluster.set_map(m1.clone());
    let (s1, member1) = server(&cluster, 1);
    let (_s2, _member2) = server(&cluster, 2);
    let mut c = register(&s1, None);
    let ours = name_of(&m1, 1);
    let epoch = m1
        .owner(partition_of(&ours, m1.partitions()))
        .unwrap()
        .epoch;
    // Settled once the map is applied and the client persisted.
    let (status, reply) = settled(|| get_lock(&mut c, &ours));
    assert_eq!(status, Status::Success);
    let lock = lock_id(&reply);
    let (status, reply) = get_lock(&mut c, &name_of(&m1, 2));
    assert_eq!(status, Status::PartitionMoved);
    let ControlResponse::PartitionMoved { map_version } =
        decode_control_response(&reply).unwrap().body
    else {
        panic!()
    };
    assert_eq!(map_version, m1.version());
    let r = c.data(&[trylock(lock, epoch + 1)]);
    assert_eq!(
        (r[0].status, r[0].aux),
        (Status::PartitionMoved, m1.version())
    );
    // Fenced: once the server has seen it (an unlock, which grants nothing, is answered
    // `PartitionMoved`), nothing is granted until the authority comes back.
    member1.fence(true);
    let unlock = match trylock(lock, epoch) {
        Command::Lock(l) => Command::Lock(LockCommand {
            op: LockOp::UnlockExclusive,
            ..l
        }),
        other => other,
    };
    let start = Instant::now();
    while c.data(&[unlock])[0].status != Status::PartitionMoved {
        assert!(start.elapsed() < Duration::from_secs(10), "never fenced");
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..20 {
        let r = c.data(&[trylock(lock, epoch)]);
        assert_eq!(
            (r[0].status, r[0].aux),
            (Status::PartitionMoved, m1.version())
        );
    }
    member1.fence(false);
    let (status, _) = settled(|| {
        let r = c.data(&[trylock(lock, epoch)]);
        (r[0].status, r[0].aux)
    });
    assert_eq!(status, Status::Success);
}

fn faa(object: u32, epoch: u32) -> Command {
    Command::Object(ObjectCommand {
        op: ObjectOp::Faa,
        object,
        a: 1,
        b: 0,
        partition_epoch: epoch,
    })
}

fn object_get(c: &mut Raw, name: &[u8]) -> u32 {
    let (s, _) = settled(|| {
        let create = c.control(ControlRequest::ObjectCreate {
            name,
            init: 0,
            lease_s: 60,
        });
        (
            decode_control_response(&create)
                .unwrap()
                .header
                .status()
                .unwrap(),
            (),
        )
    });
    assert!(
        matches!(s, Status::Success | Status::ObjectAlreadyCreated),
        "{s:?}"
    );
    let got = c.control(ControlRequest::ObjectGet { name, lease_s: 60 });
    match decode_control_response(&got).unwrap().body {
        ControlResponse::ObjectRef { object, .. } => object,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_counters_values_never_repeat_when_its_partition_moves() {
    let cluster = StaticCluster::new();
    let m1 = map_after(
        &Map::new(Partitions::new(P).unwrap()),
        &[(1, false), (2, false)],
    );
    cluster.set_map(m1.clone());
    let (s1, _member1) = server(&cluster, 1);
    let (s2, _member2) = server(&cluster, 2);
    let name = name_of(&m1, 1);
    let p = partition_of(&name, m1.partitions());
    let mut c = register(&s1, None);
    let object = object_get(&mut c, &name);
    let epoch1 = m1.owner(p).unwrap().epoch;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 120 {
        let (s, v) = settled(|| {
            let r = c.data(&[faa(object, epoch1)]);
            (r[0].status, r[0].aux)
        });
        assert_eq!(s, Status::Success);
        assert!(seen.insert(v), "{v} twice");
    }
    // Server 1 drains: its partitions move to server 2, which reads the counter's mark.
    let m2 = map_after(&m1, &[(1, true), (2, false)]);
    cluster.set_map(m2.clone());
    let epoch2 = m2.owner(p).unwrap().epoch;
    assert!(epoch2 > epoch1);
    let mut d = register(&s2, Some(&c.init));
    let (status, _) = settled(|| {
        let reply = d.control(ControlRequest::ObjectGet {
            name: &name,
            lease_s: 60,
        });
        (
            decode_control_response(&reply)
                .unwrap()
                .header
                .status()
                .unwrap(),
            (),
        )
    });
    assert_eq!(status, Status::Success, "adopted at the mark");
    let object2 = object_get(&mut d, &name);
    for _ in 0..60 {
        let (s, v) = settled(|| {
            let r = d.data(&[faa(object2, epoch2)]);
            (r[0].status, r[0].aux)
        });
        assert_eq!(s, Status::Success);
        assert!(seen.insert(v), "{v} handed out again after the move");
    }
    assert!(cluster.mark(p, &name).unwrap() > *seen.iter().max().unwrap());
}

#[test]
fn a_moved_partition_is_served_again_after_its_old_clients_reclaimed() {
    let cluster = StaticCluster::new();
    let m1 = map_after(
        &Map::new(Partitions::new(P).unwrap()),
        &[(1, false), (2, false)],
    );
    cluster.set_map(m1.clone());
    let (s1, _member1) = server(&cluster, 1);
    let (s2, _member2) = server(&cluster, 2);
    let name = name_of(&m1, 1);
    let p = partition_of(&name, m1.partitions());
    let e1 = m1.owner(p).unwrap().epoch;
    let mut c = register(&s1, None);
    let (_, reply) = settled(|| get_lock(&mut c, &name));
    let lock = lock_id(&reply);
    let granted = settled(|| {
        let r = c.data_proved(&[trylock(lock, e1)]);
        (r[0].0.status, r[0])
    })
    .1;
    assert_eq!(granted.0.status, Status::Success);
    let (token, mac) = (granted.0.aux, granted.1);
    // Server 1 drains: the partition moves to server 2 (a `Moved` handover).
    let m2 = map_after(&m1, &[(1, true), (2, false)]);
    cluster.set_map(m2.clone());
    let e2 = m2.owner(p).unwrap().epoch;
    let start = Instant::now();
    while c.data(&[trylock(lock, e1)])[0].status != Status::PartitionMoved {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server 1 kept the partition"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut cj = register(&s2, Some(&c.init));
    let mut d = register(&s2, None);
    // Recovering: names of the partition are not served to anyone yet.
    let start = Instant::now();
    let status = loop {
        let (s, _) = get_lock(&mut d, &name);
        if s != Status::PartitionMoved || start.elapsed() > Duration::from_secs(10) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status, Status::NotReady);
    let claim = LockClaim {
        kind: LockKind::Atomic,
        held: Held::Exclusive,
        name: &name,
        old_lock: lock,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 50_000,
        age_ms: 10,
        token,
        proof: GrantProof { epoch: e1, mac },
        value: None,
    };
    let claims = [claim];
    let (status, entries) = settled(|| {
        let reply = cj.control(ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)));
        let f = decode_control_response(&reply).unwrap();
        let ControlResponse::Entries(e) = f.body else {
            return (f.header.status().unwrap(), Vec::new());
        };
        let e: Vec<_> = e.iter().collect();
        (e[0].status, e)
    });
    assert_eq!(status, Status::Success, "the proved grant is re-claimed");
    let reclaimed = entries[0].id;
    let done = cj.control(ControlRequest::ReclaimDone {
        partition: p,
        epoch: e2,
    });
    assert_eq!(
        decode_control_response(&done).unwrap().header.status(),
        Some(Status::Success)
    );
    let (status, reply) = settled(|| get_lock(&mut d, &name));
    assert_eq!(
        status,
        Status::Success,
        "served once its old clients re-claimed"
    );
    let theirs = lock_id(&reply);
    assert_eq!(
        d.data(&[trylock(theirs, e2)])[0].status,
        Status::Fail,
        "still held"
    );
    let unlock = match trylock(reclaimed, e2) {
        Command::Lock(l) => Command::Lock(LockCommand {
            op: LockOp::UnlockExclusive,
            ..l
        }),
        other => other,
    };
    assert_eq!(cj.data(&[unlock])[0].status, Status::Success);
    let r = d.data(&[trylock(theirs, e2)]);
    assert_eq!(r[0].status, Status::Success);
    assert!(r[0].aux > token, "tokens grow across the move");
}
