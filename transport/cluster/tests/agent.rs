//! The agent against a real etcd: membership, election, the map, failover, marks, bad days.
//! Every test starts its own etcd (`common::Etcd`) with 1-second leases.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Etcd, eventually};
use dlock_cluster::{Agent, AgentError, AgentHandle, StartError};
use dlock_core::cluster::{Handover, Map, ServerId};

const LONG: Duration = Duration::from_secs(20);

fn id(n: u32) -> ServerId {
    ServerId::new(n).unwrap()
}

/// Partitions per owner.
fn counts(map: &Map) -> BTreeMap<u32, usize> {
    let mut c = BTreeMap::new();
    for o in map.owners() {
        if let Some(s) = o.server {
            *c.entry(s.get()).or_default() += 1;
        }
    }
    c
}

/// Waits until `h` publishes a map whose owners are exactly `servers`, every partition owned.
fn map_owned_by(h: &AgentHandle, servers: &[u32]) -> Arc<Map> {
    eventually(LONG, &format!("a map owned by {servers:?}"), || {
        let m = h.map()?;
        let c = counts(&m);
        let all = m.owners().iter().all(|o| o.server.is_some());
        (all && c.keys().copied().eq(servers.iter().copied())).then_some(m)
    })
}

#[test]
fn membership_appears_and_disappears_with_the_lease() {
    let etcd = Etcd::start();
    let a = etcd.agent("m", 1, 16);
    assert_eq!(etcd.keys("/dlock/m/servers/"), ["/dlock/m/servers/1"]);
    let standing = a.handle().standing();
    assert!(standing.incarnation.is_some());
    assert!(
        standing.may_grant(Instant::now()),
        "a fresh registration has authority"
    );
    // Stopping without leaving: nobody keeps the lease alive, so etcd expires it.
    a.abandon();
    eventually(LONG, "the member key to expire", || {
        etcd.keys("/dlock/m/servers/").is_empty().then_some(())
    });
}

#[test]
fn agents_elect_one_coordinator_and_spread_the_map_evenly() {
    let etcd = Etcd::start();
    let agents: Vec<Agent> = (1..=3).map(|n| etcd.agent("e", n, 64)).collect();
    let handles: Vec<AgentHandle> = agents.iter().map(Agent::handle).collect();
    for h in &handles {
        let m = map_owned_by(h, &[1, 2, 3]);
        assert_eq!(counts(&m).into_values().collect::<Vec<_>>(), [22, 21, 21]);
        assert!(m.owners().iter().all(|o| o.epoch >= 1));
        assert_eq!(m.server(id(2)).unwrap().address(), b"127.0.0.1:20002");
    }
    let coordinators = handles.iter().filter(|h| h.status().coordinator).count();
    assert_eq!(coordinators, 1, "exactly one coordinator");
}

#[test]
fn a_member_leaving_moves_only_its_partitions_at_raised_epochs() {
    let etcd = Etcd::start();
    let mut agents: Vec<Agent> = (1..=3).map(|n| etcd.agent("l", n, 48)).collect();
    let watcher = agents[0].handle();
    let before = map_owned_by(&watcher, &[1, 2, 3]);
    // Server 3 dies: its lease expires.
    agents.pop().unwrap().abandon();
    let after = map_owned_by(&watcher, &[1, 2]);
    assert_eq!(counts(&after).into_values().collect::<Vec<_>>(), [24, 24]);
    for (b, a) in before.owners().iter().zip(after.owners()) {
        if b.server == Some(id(3)) {
            assert_eq!((a.epoch, a.handover), (b.epoch + 1, Handover::Expired));
        } else {
            assert_eq!(a, b, "a survivor keeps its partitions and epochs");
        }
    }
    // Server 2 leaves cleanly: the same, without waiting for an expiry.
    agents.pop().unwrap().leave();
    let last = map_owned_by(&watcher, &[1]);
    for (b, a) in after.owners().iter().zip(last.owners()) {
        assert_eq!(a.epoch, b.epoch + u32::from(b.server == Some(id(2))));
    }
}

#[test]
fn the_coordinator_dying_hands_the_job_to_another() {
    let etcd = Etcd::start();
    let mut agents: Vec<Agent> = (1..=3).map(|n| etcd.agent("c", n, 30)).collect();
    let handles: Vec<AgentHandle> = agents.iter().map(Agent::handle).collect();
    map_owned_by(&handles[0], &[1, 2, 3]);
    let boss = eventually(LONG, "a coordinator", || {
        handles.iter().position(|h| h.status().coordinator)
    });
    agents.remove(boss).abandon();
    let survivors: Vec<u32> = (1..=3).filter(|&n| n as usize != boss + 1).collect();
    let other = &handles[if boss == 0 { 1 } else { 0 }];
    map_owned_by(other, &survivors);
    eventually(LONG, "a new coordinator", || {
        agents
            .iter()
            .any(|a| a.handle().status().coordinator)
            .then_some(())
    });
}

#[test]
fn many_joins_at_once_lose_no_update() {
    let etcd = Etcd::start();
    let first = etcd.agent("j", 1, 100);
    map_owned_by(&first.handle(), &[1]);
    // Four servers join together: every membership change must reach the map, whatever
    // order the coordinator's writes and their registrations interleave in.
    let joiners: Vec<Agent> = std::thread::scope(|s| {
        let spawned: Vec<_> = (2..=5)
            .map(|n| {
                let etcd = &etcd;
                s.spawn(move || etcd.agent("j", n, 100))
            })
            .collect();
        spawned.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let m = map_owned_by(&first.handle(), &[1, 2, 3, 4, 5]);
    assert!(counts(&m).values().all(|&c| c == 20));
    for j in &joiners {
        map_owned_by(&j.handle(), &[1, 2, 3, 4, 5]);
    }
}

#[test]
fn a_mismatched_partition_count_is_refused_with_a_clear_message() {
    let etcd = Etcd::start();
    let _a = etcd.agent("p", 1, 64);
    let err = Agent::start(etcd.config("p", 2, 128)).unwrap_err();
    let StartError::Refused(msg) = &err else {
        panic!("{err:?}");
    };
    assert!(msg.contains("64") && msg.contains("128"), "{msg}");
    assert_eq!(etcd.keys("/dlock/p/servers/"), ["/dlock/p/servers/1"]);
}

#[test]
fn a_server_id_in_use_is_refused() {
    let etcd = Etcd::start();
    let _a = etcd.agent("d", 1, 8);
    let mut cfg = etcd.config("d", 1, 8);
    cfg.start_timeout = Duration::from_millis(500);
    let err = Agent::start(cfg).unwrap_err();
    assert!(
        matches!(&err, StartError::Refused(m) if m.contains("server id 1")),
        "{err:?}"
    );
}

#[test]
fn marks_never_go_backwards_across_agent_restarts() {
    let etcd = Etcd::start();
    let a = etcd.agent("h", 1, 4);
    let m = map_owned_by(&a.handle(), &[1]);
    let wait = |p: dlock_cluster::Pending<u64>| p.wait(LONG).expect("an answer");
    let h = a.handle();
    assert_eq!(wait(h.reserve(2, b"xid", 1_000, m.version())), Ok(1_000));
    assert_eq!(
        wait(h.reserve(2, b"xid", 500, m.version())),
        Ok(1_000),
        "never lowered"
    );
    assert_eq!(wait(h.reserve(2, b"csn", 7, m.version())), Ok(7));
    assert_eq!(
        wait(h.reserve(2, b"xid", 2_000, m.version() + 1)),
        Err(AgentError::MapChanged),
        "a reservation under a map the agent does not hold"
    );
    a.leave();
    let b = etcd.agent("h", 1, 4);
    map_owned_by(&b.handle(), &[1]);
    let mut marks = b.handle().marks(2).wait(LONG).unwrap().unwrap();
    marks.sort();
    assert_eq!(marks, [(b"csn".to_vec(), 7), (b"xid".to_vec(), 1_000)]);
    assert_eq!(b.handle().marks(3).wait(LONG).unwrap(), Ok(vec![]));
}

#[test]
fn a_reservation_under_a_superseded_map_is_refused() {
    let etcd = Etcd::start();
    let a = etcd.agent("s", 1, 4);
    let old = map_owned_by(&a.handle(), &[1]);
    let b = etcd.agent("s", 2, 4);
    map_owned_by(&a.handle(), &[1, 2]);
    let r = a.handle().reserve(0, b"xid", 10, old.version()).wait(LONG);
    assert_eq!(r, Some(Err(AgentError::MapChanged)));
    drop(b);
}

#[test]
fn client_ids_persisted_under_a_superseded_map_are_refused() {
    let etcd = Etcd::start();
    let a = etcd.agent("s", 1, 4);
    let old = map_owned_by(&a.handle(), &[1]);
    let r = a
        .handle()
        .persist_clients(&[7, 8], old.version())
        .wait(LONG);
    assert_eq!(r, Some(Ok(())), "persisted under the map it has");
    let b = etcd.agent("s", 2, 4);
    map_owned_by(&a.handle(), &[1, 2]);
    // Server 1 has not applied the new map yet: what it persists now may come after server 2
    // read its list for the partitions it took, so it is refused, and the list stays.
    let r = a
        .handle()
        .persist_clients(&[7, 8, 9], old.version())
        .wait(LONG);
    assert_eq!(r, Some(Err(AgentError::MapChanged)));
    let inc = a.handle().standing().incarnation.unwrap();
    let listed = b.handle().persisted_clients(id(1), inc).wait(LONG);
    assert_eq!(listed, Some(Ok(vec![7, 8])));
    drop(b);
}

#[test]
fn etcd_unreachable_at_start_errors_after_the_bounded_retry() {
    let etcd = Etcd::start();
    let mut cfg = etcd.config("u", 1, 8);
    drop(etcd);
    cfg.start_timeout = Duration::from_secs(1);
    let began = Instant::now();
    let err = Agent::start(cfg).unwrap_err();
    assert!(
        matches!(err, StartError::Unreachable { attempts, .. } if attempts >= 1),
        "{err:?}"
    );
    assert!(err.to_string().contains("unreachable"), "{err}");
    assert!(began.elapsed() < Duration::from_secs(10), "bounded");
}

#[test]
fn an_agent_rides_out_etcd_stopping_and_restarting() {
    let mut etcd = Etcd::start();
    let a = etcd.agent("r", 1, 8);
    let h = a.handle();
    map_owned_by(&h, &[1]);
    etcd.stop();
    let since = eventually(LONG, "the outage to show", || {
        h.status().etcd_unreachable_since
    });
    assert!(h.status().to_string().contains("etcd unreachable since"));
    // The standing stops advancing, so the authority runs out within a TTL.
    eventually(LONG, "self-fencing", || {
        (!h.standing().may_grant(Instant::now())).then_some(())
    });
    etcd.resume();
    eventually(LONG, "the agent to recover", || {
        let s = h.status();
        let st = h.standing();
        (s.etcd_unreachable_since.is_none()
            && st.incarnation.is_some()
            && st.may_grant(Instant::now()))
        .then_some(())
    });
    // Registered (again, if the lease lapsed) and owning the partitions in the current map.
    let inc = h.standing().incarnation.unwrap();
    eventually(LONG, "a map for this registration", || {
        h.map()
            .filter(|m| m.is_for(id(1), inc) && counts(m).get(&1) == Some(&8))
    });
    assert!(since.elapsed().unwrap() > Duration::ZERO);
}

#[test]
fn a_drained_server_ends_with_nothing_and_a_renewal_keeps_the_owner() {
    let etcd = Etcd::start();
    let a = etcd.agent("n", 1, 20);
    let b = etcd.agent("n", 2, 20);
    let before = map_owned_by(&a.handle(), &[1, 2]);
    let p = before.owned_by(id(1)).next().unwrap();
    let epoch = before.owner(p).unwrap().epoch;
    a.handle().request_renewal(p, epoch);
    let renewed = eventually(LONG, "the renewal", || {
        a.handle()
            .map()
            .filter(|m| m.owner(p).unwrap().epoch == epoch + 1)
    });
    assert_eq!(renewed.owner(p).unwrap().handover, Handover::Renewal);
    assert_eq!(renewed.owner(p).unwrap().server, Some(id(1)));
    b.handle().drain();
    let after = map_owned_by(&a.handle(), &[1]);
    for q in before.owned_by(id(2)) {
        assert_eq!(
            after.owner(q).unwrap().handover,
            Handover::Moved,
            "the drainer is alive"
        );
    }
    assert!(b.handle().status().draining);
    assert!(after.server(id(2)).is_some(), "a drainer stays reachable");
}
