//! What a routing client owes after a move, against two cluster servers in one process over
//! an in-process membership (`StaticCluster`) and the thin client (`ClusterLink`): a
//! `ReclaimDone` that a partition's new owner refused until the client's call ended is said
//! again at the client's next heartbeat, so the new owner ends its recovery early instead of
//! at its grace deadline; and a lock whose partition left a server and came back is claimed
//! again there.
//!
//! The new owner refuses the word (`PartitionMoved`) while it has not applied the map the
//! client learned from another server, or while it is fenced; the test fences it, which it can
//! do deterministically. Before the fix the client said it once, within the call that learned
//! the map, and the partition recovered until its grace deadline (here ten minutes).

use std::time::Duration;

use dlock_core::cluster::{Map, Partitions, Timing, partition_of};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::Client;
use dlock_transport::client::cluster::ClusterConfig as LinkConfig;
use dlock_transport::runtime::ServerHandle;
use dlock_transport::runtime::membership::{StaticCluster, StaticMembership};

#[allow(dead_code)]
mod common;
use common::cluster::{map_after, sid, stat, wait_until};

const P: u16 = 16;
/// A grace period of ten minutes (the longest grant lease, stretched): only an early end of
/// recovery, on every old client's `ReclaimDone`, serves a moved partition within the test.
const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 600_000,
};

fn server(cluster: &StaticCluster, n: u32) -> (ServerHandle, StaticMembership) {
    common::cluster::server(cluster, n, TIMING)
}

#[test]
fn a_reclaim_done_refused_until_the_call_ended_is_said_again_at_the_next_heartbeat() {
    let cluster = StaticCluster::new();
    let (s1, _member1) = server(&cluster, 1);
    let (s2, member2) = server(&cluster, 2);
    let (a1, a2) = (s1.tcp_addr().unwrap(), s2.tcp_addr().unwrap());
    let m1 = map_after(&Map::new(Partitions::new(P).unwrap()), &[(1, a1)]);
    cluster.set_map(m1.clone());
    // Each call of the client may last 300 ms: a lock call's deadline, not a heartbeat's.
    let cfg = || LinkConfig::new([a1.to_string()]).with_timeout(Duration::from_millis(300));
    let mut c = loop {
        match Client::connect_cluster(cfg()) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // A grant at server 1 (which it makes only once it persisted the client's id): the
    // client is one server 2 must hear from when it takes partitions of server 1's.
    let m2 = map_after(&m1, &[(1, a1), (2, a2)]);
    let kept = (0..)
        .map(|i| format!("orders/{i}").into_bytes())
        .find(|n| m2.owner(partition_of(n, m2.partitions())).unwrap().server == Some(sid(1)))
        .unwrap();
    // Retried: the server serves the client once it persisted its id, and each call of the
    // client lasts 300 ms at most.
    let mut id = None;
    wait_until(Duration::from_secs(10), "the lock's reference", || {
        id = c.get_lock(LockKind::Atomic, &kept).ok();
        id.is_some()
    });
    let id = id.unwrap();
    wait_until(Duration::from_secs(10), "a grant at server 1", || {
        c.lock(id, Mode::Exclusive, 1_000, Duration::from_millis(100))
            .is_ok_and(|g| g.status == Status::Success)
    });
    assert_eq!(c.unlock(id).unwrap(), Status::Success);

    // Server 2 takes half the partitions while it is fenced: it refuses the client's
    // `ReclaimDone`s for as long as the heartbeat that learns the map lasts.
    member2.fence(true);
    cluster.set_map(m2.clone());
    let v2 = m2.version();
    wait_until(
        Duration::from_secs(10),
        "both servers on the new map",
        || stat(a1, "map_version") == v2 && stat(a2, "map_version") == v2,
    );
    assert!(stat(a2, "partitions_recovering") > 0);
    let _ = c.heartbeat();
    member2.fence(false);

    // Heartbeats, as an engine's client sends them; the partitions recover early.
    wait_until(
        Duration::from_secs(20),
        "server 2's recovery to end",
        || {
            let _ = c.heartbeat();
            stat(a2, "partitions_recovering") == 0
        },
    );
    drop(s2);
    drop(s1);
}

/// A partition that left a server and came back (A → B → A, here while the client was idle
/// but for its heartbeat) is a new ownership at A: A freed the slots of the earlier one, the client's reference
/// included. The client's record, still filed under A's id and incarnation from before, must
/// be re-claimed, not taken as current; taken as current, every use of the lock read
/// `LockNotGet` for good (the join-and-drain end-to-end test saw it).
#[test]
fn a_lock_whose_partition_left_and_came_back_is_claimed_again() {
    let cluster = StaticCluster::new();
    let (s1, _member1) = server(&cluster, 1);
    let (s2, _member2) = server(&cluster, 2);
    let (a1, a2) = (s1.tcp_addr().unwrap(), s2.tcp_addr().unwrap());
    let m1 = map_after(&Map::new(Partitions::new(P).unwrap()), &[(1, a1)]);
    cluster.set_map(m1.clone());
    let cfg = || LinkConfig::new([a1.to_string()]).with_timeout(Duration::from_secs(5));
    let mut c = loop {
        match Client::connect_cluster(cfg()) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let m2 = map_after(&m1, &[(1, a1), (2, a2)]);
    let name = (0..)
        .map(|i| format!("orders/{i}").into_bytes())
        .find(|n| m2.owner(partition_of(n, m2.partitions())).unwrap().server == Some(sid(2)))
        .unwrap();
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let g = c
        .lock(id, Mode::Exclusive, 1_000, Duration::from_secs(5))
        .unwrap();
    assert_eq!(g.status, Status::Success);
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
    // Away to server 2 and back, while the client is idle.
    cluster.set_map(m2.clone());
    wait_until(
        Duration::from_secs(10),
        "both servers on the second map",
        || stat(a1, "map_version") == m2.version() && stat(a2, "map_version") == m2.version(),
    );
    let m3 = map_after(&m2, &[(1, a1)]);
    cluster.set_map(m3.clone());
    wait_until(Duration::from_secs(10), "server 1 on the third map", || {
        stat(a1, "map_version") == m3.version()
    });
    // The client's heartbeat learns the map (a command on the freed slot is answered
    // `LockNotGet`, which says nothing of the partition: the slot is gone).
    c.heartbeat().unwrap();
    let g = c.lock(id, Mode::Exclusive, 1_000, Duration::from_secs(5));
    assert!(
        g.as_ref().is_ok_and(|g| g.status == Status::Success),
        "the lock after its partition came back: {g:?}"
    );
}

/// A call that waits on a partition's recovery pays what the client owes while it retries: the
/// new owner may be waiting for this very client's `ReclaimDone` (owed since the owner refused
/// it, here while fenced), and a call that only paused and retried held the partition in
/// `NotReady` — and itself — until the call's deadline (the end-to-end test saw every XID
/// worker's fetch-and-add come back seconds late after a kill). Without heartbeats between.
#[test]
fn a_call_refused_not_ready_pays_the_reclaim_done_its_new_owner_waits_for() {
    let cluster = StaticCluster::new();
    let (s1, _member1) = server(&cluster, 1);
    let (s2, member2) = server(&cluster, 2);
    let (a1, a2) = (s1.tcp_addr().unwrap(), s2.tcp_addr().unwrap());
    let m1 = map_after(&Map::new(Partitions::new(P).unwrap()), &[(1, a1)]);
    cluster.set_map(m1.clone());
    let cfg = || LinkConfig::new([a1.to_string()]).with_timeout(Duration::from_secs(2));
    let mut c = loop {
        match Client::connect_cluster(cfg()) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let m2 = map_after(&m1, &[(1, a1), (2, a2)]);
    let at = |n: u32| {
        (0..)
            .map(|i| format!("orders/{i}").into_bytes())
            .find(|name| {
                m2.owner(partition_of(name, m2.partitions()))
                    .unwrap()
                    .server
                    == Some(sid(n))
            })
            .unwrap()
    };
    // Server 1 persists the client once it serves it a grant.
    let kept = at(1);
    let mut id = None;
    wait_until(Duration::from_secs(10), "the lock's reference", || {
        id = c.get_lock(LockKind::Atomic, &kept).ok();
        id.is_some()
    });
    let id = id.unwrap();
    wait_until(Duration::from_secs(10), "a grant at server 1", || {
        c.lock(id, Mode::Exclusive, 1_000, Duration::from_millis(100))
            .is_ok_and(|g| g.status == Status::Success)
    });
    assert_eq!(c.unlock(id).unwrap(), Status::Success);

    // Server 2 takes half the partitions, fenced: the heartbeat that learns the map has its
    // `ReclaimDone`s refused, and they are owed.
    member2.fence(true);
    cluster.set_map(m2.clone());
    wait_until(
        Duration::from_secs(10),
        "both servers on the new map",
        || stat(a1, "map_version") == m2.version() && stat(a2, "map_version") == m2.version(),
    );
    let _ = c.heartbeat();
    member2.fence(false);
    assert!(stat(a2, "partitions_recovering") > 0);

    // A name in one of them: server 2 answers `NotReady` until it hears from this client.
    let moved = at(2);
    let got = c.get_lock(LockKind::Atomic, &moved);
    assert!(got.is_ok(), "the name's reference: {got:?}");
    assert_eq!(stat(a2, "partitions_recovering"), 0);
    drop(s2);
    drop(s1);
}
