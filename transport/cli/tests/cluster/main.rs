//! A cluster end to end: a real etcd, three `dlock serve --cluster` processes (separate
//! processes, so that one can be killed with SIGKILL) and many routing clients (`ClusterLink`)
//! in this process, locking at full speed while the cluster loses a server, loses etcd, or
//! grows and shrinks. Every grant is recorded with its token and lease window; the checks
//! (`harness::check`) run over the records: no lock ever had two holders whose leases were
//! running, tokens per lock kept increasing, and no XID was handed out twice.
//!
//! Built only with the CLI's `cluster` feature (`cargo test -p dlock-cli --features cluster
//! --test cluster`); needs Debian's `etcd-server` and `etcd-client`.

#[path = "../../../cluster/tests/common/mod.rs"]
mod common;
mod harness;

use std::time::{Duration, Instant};

use common::{Etcd, eventually};

use harness::{Load, Server, check, map_spread_over, names, owned_by};

/// The etcd lease TTL of every server (the 1-2 s).
const TTL_MS: u32 = 1_000;

fn three_servers(etcd: &Etcd, name: &str) -> Vec<Server> {
    (1..=3)
        .map(|id| Server::start(&etcd.endpoint(), name, id, TTL_MS))
        .collect()
}

/// Waits until every name in `names` was granted to someone after `t`. Generous: a taken-over
/// partition may wait for its grace deadline (30 s by default) when a re-claim is missing.
fn all_granted_since(load: &Load, t: Instant, names: &[Vec<u8>], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = load.granted_since(t);
        let missing: Vec<_> = names
            .iter()
            .filter(|n| !got.iter().any(|h| &h.name == *n))
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {missing:?} not granted; errors {:?}",
            load.record.lock().unwrap().errors
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_owners_partitions_are_served_elsewhere_and_no_grant_is_doubled() {
    let etcd = Etcd::start();
    let mut servers = three_servers(&etcd, "kill");
    let before = map_spread_over(&etcd, "kill", &[1, 2, 3]);
    let seeds: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let all = names(48);
    let load = Load::start(&seeds, &all, 12, 2, Duration::from_millis(400));
    let warm = Instant::now();
    all_granted_since(&load, warm, &all, "every lock granted once");

    let victim = &mut servers[0];
    let theirs = owned_by(&before, victim.id, &all);
    assert!(!theirs.is_empty(), "server 1 owns some of the names");
    victim.kill();
    let killed = Instant::now();
    let xids_at_kill = load.xids();

    // Its partitions go to the survivors (raised epochs) and are served there.
    let after = map_spread_over(&etcd, "kill", &[2, 3]);
    assert!(after.version() > before.version());
    all_granted_since(&load, killed, &theirs, "server 1's locks granted elsewhere");
    all_granted_since(&load, killed, &all, "every lock granted after the kill");
    eventually(Duration::from_secs(90), "XIDs after the kill", || {
        (load.xids() > xids_at_kill + 100).then_some(())
    });
    let record = load.stop();
    // Every locker carried on over the same client (no reconnect in the harness).
    for w in 0..12 {
        assert!(
            record.held.iter().any(|h| h.worker == w && h.from > killed),
            "worker {w} granted nothing after the kill; errors: {:?}",
            record.errors
        );
    }
    check(&record);
}
