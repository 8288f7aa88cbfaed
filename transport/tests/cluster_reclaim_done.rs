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
use dlock_transport::client::cluster::{ClusterConfig as LinkConfig, ClusterLink};
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

/// What every test here starts from: two servers, a first map giving every partition to
/// server 1, a client of server 1 whose calls last `timeout` at most, and the map that gives
/// server 2 half the partitions (not applied yet).
struct Two {
    /// Dropped first (fields drop in order), while its servers still run.
    c: Client<ClusterLink>,
    cluster: StaticCluster,
    /// Servers 2 and 1, stopped when the set-up is dropped (in that order).
    _servers: (ServerHandle, ServerHandle),
    /// Server 2's membership, to fence it.
    member2: StaticMembership,
    a1: std::net::SocketAddr,
    a2: std::net::SocketAddr,
    m2: Map,
}

fn two_servers(timeout: Duration) -> Two {
    two_servers_with(timeout, 256)
}

/// [`two_servers`] with `locks2` lock slots at server 2.
fn two_servers_with(timeout: Duration, locks2: u32) -> Two {
    let cluster = StaticCluster::new();
    let (s1, _member1) = common::cluster::server(&cluster, 1, TIMING);
    let (s2, member2) = common::cluster::server_with_locks(&cluster, 2, TIMING, locks2);
    let (a1, a2) = (s1.tcp_addr().unwrap(), s2.tcp_addr().unwrap());
    let m1 = map_after(&Map::new(Partitions::new(P).unwrap()), &[(1, a1)]);
    cluster.set_map(m1.clone());
    let cfg = || LinkConfig::new([a1.to_string()]).with_timeout(timeout);
    let c = loop {
        match Client::connect_cluster(cfg()) {
            Ok(c) => break c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let m2 = map_after(&m1, &[(1, a1), (2, a2)]);
    Two {
        cluster,
        _servers: (s2, s1),
        member2,
        a1,
        a2,
        m2,
        c,
    }
}

impl Two {
    /// A lock name whose partition the second map gives to server `n`.
    fn name_at(&self, n: u32) -> Vec<u8> {
        self.nth_name_at(n, 0)
    }

    /// The `k`-th of the lock names whose partition the second map gives to server `n`.
    fn nth_name_at(&self, n: u32, k: usize) -> Vec<u8> {
        (0..)
            .map(|i| format!("orders/{i}").into_bytes())
            .filter(|name| {
                let p = partition_of(name, self.m2.partitions());
                self.m2.owner(p).unwrap().server == Some(sid(n))
            })
            .nth(k)
            .unwrap()
    }

    /// Sets `map` and waits until both servers applied it.
    fn apply(&self, map: &Map) {
        self.cluster.set_map(map.clone());
        let (a1, a2, v) = (self.a1, self.a2, map.version());
        wait_until(Duration::from_secs(10), "both servers on the map", || {
            stat(a1, "map_version") == v && stat(a2, "map_version") == v
        });
    }

    /// Gets `name` and is granted it once, retried while the server persists the client
    /// (it grants nothing before) and each call is short, then unlocks it.
    fn granted_once(&mut self, name: &[u8]) {
        let id = self.granted(name);
        assert_eq!(self.c.unlock(id).unwrap(), Status::Success);
    }

    /// Gets `name` and is granted it, retried as [`Self::granted_once`] is; kept held.
    fn granted(&mut self, name: &[u8]) -> dlock_core::LockId {
        let c = &mut self.c;
        let mut id = None;
        wait_until(Duration::from_secs(10), "the lock's reference", || {
            id = c.get_lock(LockKind::Atomic, name).ok();
            id.is_some()
        });
        let id = id.unwrap();
        wait_until(Duration::from_secs(10), "a grant", || {
            c.lock(id, Mode::Exclusive, 1_000, Duration::from_millis(100))
                .is_ok_and(|g| g.status == Status::Success)
        });
        id
    }
}

#[test]
fn a_reclaim_done_refused_until_the_call_ended_is_said_again_at_the_next_heartbeat() {
    // Each call of the client may last 300 ms: a lock call's deadline, not a heartbeat's.
    let mut t = two_servers(Duration::from_millis(300));
    // A grant at server 1 (which it makes only once it persisted the client's id): the
    // client is one server 2 must hear from when it takes partitions of server 1's.
    t.granted_once(&t.name_at(1));

    // Server 2 takes half the partitions while it is fenced: it refuses the client's
    // `ReclaimDone`s for as long as the heartbeat that learns the map lasts.
    t.member2.fence(true);
    t.apply(&t.m2);
    assert!(stat(t.a2, "partitions_recovering") > 0);
    let _ = t.c.heartbeat();
    t.member2.fence(false);

    // Heartbeats, as an engine's client sends them; the partitions recover early.
    let (c, a2) = (&mut t.c, t.a2);
    wait_until(
        Duration::from_secs(20),
        "server 2's recovery to end",
        || {
            let _ = c.heartbeat();
            stat(a2, "partitions_recovering") == 0
        },
    );
    drop(t);
}

/// A partition that left a server and came back (A → B → A, here while the client was idle
/// but for its heartbeat) is a new ownership at A: A freed the slots of the earlier one, the client's reference
/// included. The client's record, still filed under A's id and incarnation from before, must
/// be re-claimed, not taken as current; taken as current, every use of the lock read
/// `LockNotGet` for good (the join-and-drain end-to-end test saw it).
#[test]
fn a_lock_whose_partition_left_and_came_back_is_claimed_again() {
    let mut t = two_servers(Duration::from_secs(5));
    let name = t.name_at(2);
    let id = t.c.get_lock(LockKind::Atomic, &name).unwrap();
    let g =
        t.c.lock(id, Mode::Exclusive, 1_000, Duration::from_secs(5))
            .unwrap();
    assert_eq!(g.status, Status::Success);
    assert_eq!(t.c.unlock(id).unwrap(), Status::Success);
    // Away to server 2 and back, while the client is idle.
    t.apply(&t.m2);
    let m3 = map_after(&t.m2, &[(1, t.a1)]);
    t.cluster.set_map(m3.clone());
    let a1 = t.a1;
    wait_until(Duration::from_secs(10), "server 1 on the third map", || {
        stat(a1, "map_version") == m3.version()
    });
    // The client's heartbeat learns the map (a command on the freed slot is answered
    // `LockNotGet`, which says nothing of the partition: the slot is gone).
    t.c.heartbeat().unwrap();
    let g = t.c.lock(id, Mode::Exclusive, 1_000, Duration::from_secs(5));
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
    let mut t = two_servers(Duration::from_secs(2));
    // Server 1 persists the client once it serves it a grant.
    t.granted_once(&t.name_at(1));

    // Server 2 takes half the partitions, fenced: the heartbeat that learns the map has its
    // `ReclaimDone`s refused, and they are owed.
    t.member2.fence(true);
    t.apply(&t.m2);
    let _ = t.c.heartbeat();
    t.member2.fence(false);
    assert!(stat(t.a2, "partitions_recovering") > 0);

    // A name in one of them: server 2 answers `NotReady` until it hears from this client.
    let moved = t.name_at(2);
    let got = t.c.get_lock(LockKind::Atomic, &moved);
    assert!(got.is_ok(), "the name's reference: {got:?}");
    assert_eq!(stat(t.a2, "partitions_recovering"), 0);
    drop(t);
}

/// A claim the new owner refuses for lack of room (`ServerNoResource`: its lock table is full)
/// loses the grant, as a claim refused `Fail` does: the client then says `ReclaimDone`, and the
/// new owner ends its recovery. Before, the claim was kept, sent again at every heartbeat and
/// every retry, and the `ReclaimDone` never went: the partition recovered until its grace
/// deadline (here ten minutes). The 1,000-client failover bench, whose survivors had lock
/// tables for a third of the locks and not the half each holds after a kill, took 2.3 million
/// control messages in its 30 s of grace this way, and its probe could find the table full.
#[test]
fn a_claim_refused_for_lack_of_room_loses_its_grant_and_the_reclaim_done_is_said() {
    let mut t = two_servers_with(Duration::from_secs(2), 2);
    // Three grants at server 1 in partitions that server 2 takes; it has room for two.
    let names: Vec<Vec<u8>> = (0..3).map(|k| t.nth_name_at(2, k)).collect();
    let ids: Vec<dlock_core::LockId> = names.iter().map(|n| t.granted(n)).collect();
    assert_eq!(ids.len(), 3);
    t.apply(&t.m2);

    let (c, a2) = (&mut t.c, t.a2);
    wait_until(
        Duration::from_secs(20),
        "server 2's recovery to end",
        || {
            let _ = c.heartbeat();
            stat(a2, "partitions_recovering") == 0
        },
    );
    assert!(
        stat(a2, "no_resource") > 0,
        "server 2 refused a claim for lack of room"
    );
    assert_eq!(stat(a2, "recovery_locks_restored"), 2, "two grants fit");
    drop(t);
}
