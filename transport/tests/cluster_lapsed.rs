//! A routing client (`ClusterLink`) whose lease lapsed at a cluster server: the server declared
//! it dead, freed its grants and references and closed its connection, so the client's records
//! there are stale. The client must join the server again (before, a control request answered
//! `ClientNotInit` left it marked joined, and every later one read the same), get a lock's
//! reference again by name, and report the grant it held as lost — not read `LockNotGet` for
//! good with the forgotten reference (the cut-off-server end-to-end test saw it: 11,831
//! `LockNotGet` and one lock never granted again).

use std::net::SocketAddr;
use std::time::Duration;

use dlock_core::cluster::{Map, Partitions, Timing, partition_of};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::Client;
use dlock_transport::client::cluster::{ClusterConfig as LinkConfig, ClusterLink, NetDial};
use dlock_transport::runtime::ServerHandle;
use dlock_transport::runtime::membership::StaticCluster;

#[allow(dead_code)]
mod common;
use common::cluster::{map_after, sid, stat, wait_until};

const P: u16 = 16;
const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 30_000,
};

fn server(cluster: &StaticCluster, n: u32) -> ServerHandle {
    common::cluster::server(cluster, n, TIMING).0
}

/// The first map, every partition at server `n` (at `addr`).
fn map_of(n: u32, addr: SocketAddr) -> Map {
    map_after(&Map::new(Partitions::new(P).unwrap()), &[(n, addr)])
}

/// A cluster client of the servers at `seeds` with a 300-ms lease: without heartbeats below,
/// the servers declare it dead.
fn client(seeds: &[SocketAddr]) -> Client<ClusterLink> {
    client_over(seeds, NetDial::tcp(), Duration::from_millis(300))
}

/// A cluster client of the servers at `seeds`, dialled through `dial` (whose clones share one
/// data connection per server), asking for `lease`.
fn client_over(seeds: &[SocketAddr], dial: NetDial, lease: Duration) -> Client<ClusterLink> {
    let seeds: Vec<String> = seeds.iter().map(SocketAddr::to_string).collect();
    loop {
        let cfg = LinkConfig::with_dial(&seeds, dial.clone())
            .with_timeout(Duration::from_secs(2))
            .with_lease(lease);
        match Client::connect_cluster(cfg) {
            Ok(c) => return c,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[test]
fn a_client_whose_lease_lapsed_gets_its_locks_again_and_loses_its_grants() {
    let cluster = StaticCluster::new();
    let s1 = server(&cluster, 1);
    let a1 = s1.tcp_addr().unwrap();
    cluster.set_map(map_of(1, a1));
    let mut c = client(&[a1]);
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
    let mut other = client(&[a1]);
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

/// A client that lapsed at a server and joined it again (here by the heartbeat the server
/// answered `ClientNotInit`) is heard from again there, but the grants it held before are gone
/// all the same: when the partition then moves, the new owner is offered its reference alone,
/// never the grant the old owner freed (which the old owner may have given to another client
/// meanwhile). Before, the join refreshed the lease-lapse rule's record and the link claimed
/// the freed grant with its old proof.
#[test]
fn a_grant_freed_at_a_lapse_is_not_claimed_at_the_next_owner() {
    let cluster = StaticCluster::new();
    let s1 = server(&cluster, 1);
    let s2 = server(&cluster, 2);
    let (a1, a2) = (s1.tcp_addr().unwrap(), s2.tcp_addr().unwrap());
    let m1 = map_of(1, a1);
    cluster.set_map(m1.clone());
    let m2 = map_after(&m1, &[(1, a1), (2, a2)]);
    let name = (0..)
        .map(|i| format!("orders/{i}").into_bytes())
        .find(|n| m2.owner(partition_of(n, m2.partitions())).unwrap().server == Some(sid(2)))
        .unwrap();
    let mut c = client(&[a1]);
    let mut id = None;
    wait_until(Duration::from_secs(10), "the lock's reference", || {
        id = c.get_lock(LockKind::Atomic, &name).ok();
        id.is_some()
    });
    let id = id.unwrap();
    wait_until(Duration::from_secs(10), "a grant", || {
        c.lock(id, Mode::Exclusive, 20_000, Duration::from_millis(100))
            .is_ok_and(|g| g.status == Status::Success)
    });
    let expired = stat(a1, "clients_expired");
    wait_until(Duration::from_secs(10), "the client declared dead", || {
        stat(a1, "clients_expired") > expired
    });
    // Joined again (within a try or two: the server closed the client's connection).
    wait_until(Duration::from_secs(10), "the client joined again", || {
        c.heartbeat().is_ok()
    });

    cluster.set_map(m2.clone());
    wait_until(
        Duration::from_secs(10),
        "both servers on the new map",
        || stat(a1, "map_version") == m2.version() && stat(a2, "map_version") == m2.version(),
    );
    // The heartbeats learn the map and re-claim the partition at server 2, which serves once
    // the client said it re-claimed everything.
    wait_until(
        Duration::from_secs(20),
        "server 2's recovery to end",
        || {
            let _ = c.heartbeat();
            stat(a2, "partitions_recovering") == 0
        },
    );
    let unlocked = c.unlock(id);
    assert!(
        !matches!(unlocked, Ok(Status::Success)),
        "a grant freed at the lapse was claimed at the new owner: {unlocked:?}"
    );
    drop(s2);
    drop(s1);
}

/// A client whose lease lapsed at a server over a data connection it shares with another
/// client (the clones of one `NetDial`, as an engine node's workers): the server left the
/// connection open for the other member and answers the lapsed client's data commands
/// `ClientNotInit` without running them. The link joins the server again, gets the lock's
/// reference again by name and sends the command once more within the call, and reports the
/// grant the server freed as lost. Before, only a closed connection marked the server for a
/// join: the member stayed joined and every data command read `ClientNotInit` for good.
#[test]
fn a_data_reply_of_client_not_init_joins_the_server_again() {
    let cluster = StaticCluster::new();
    let s1 = server(&cluster, 1);
    let a1 = s1.tcp_addr().unwrap();
    cluster.set_map(map_of(1, a1));
    let dial = NetDial::tcp();
    // Keeps the shared data connection open while the other client lapses.
    let mut keeper = client_over(&[a1], dial.clone(), Duration::from_secs(25));
    keeper.heartbeat().unwrap();
    let mut c = client_over(&[a1], dial, Duration::from_millis(300));
    let mut ids = None;
    wait_until(Duration::from_secs(10), "the locks' references", || {
        ids = c
            .get_lock(LockKind::Atomic, b"orders/held")
            .and_then(|held| Ok((held, c.get_lock(LockKind::Atomic, b"orders/next")?)))
            .ok();
        ids.is_some()
    });
    let (held, next) = ids.unwrap();
    wait_until(Duration::from_secs(10), "a grant", || {
        c.lock(held, Mode::Exclusive, 10_000, Duration::from_millis(100))
            .is_ok_and(|g| g.status == Status::Success)
    });

    let expired = stat(a1, "clients_expired");
    wait_until(Duration::from_secs(10), "the client declared dead", || {
        stat(a1, "clients_expired") > expired
    });
    // The first data command after the lapse is granted within its call.
    let g = c
        .lock(next, Mode::Exclusive, 1_000, Duration::from_millis(500))
        .unwrap();
    assert_eq!(g.status, Status::Success, "the lock after the lapse: {g:?}");
    assert_eq!(c.unlock(next).unwrap(), Status::Success);
    // The grant the server freed is lost, and another client can take its lock.
    let unlocked = c.unlock(held);
    assert!(
        !matches!(unlocked, Ok(Status::Success)),
        "a grant the server freed was unlocked: {unlocked:?}"
    );
    let other_id = keeper.get_lock(LockKind::Atomic, b"orders/held").unwrap();
    let g = keeper
        .lock(other_id, Mode::Exclusive, 1_000, Duration::from_secs(2))
        .unwrap();
    assert_eq!(g.status, Status::Success);
    assert_eq!(keeper.unlock(other_id).unwrap(), Status::Success);
    drop(s1);
}
