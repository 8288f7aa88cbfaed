//! A cluster end to end: a real etcd, three `dlock serve --cluster` processes (separate
//! processes, so that one can be killed with SIGKILL) and many routing clients (`ClusterLink`)
//! in this process, locking at full speed while the cluster loses a server, loses etcd, or
//! grows and shrinks. Every grant is recorded with its token and lease window; the checks
//! (`harness::check`) run over the records: no lock ever had two holders whose leases were
//! running, tokens per lock kept increasing, and no XID was handed out twice.
//!
//! | test                                   | what happens to the cluster                        |
//! |----------------------------------------|----------------------------------------------------|
//! | `a_killed_owners_partitions_…`         | one server SIGKILLed                               |
//! | `a_frozen_owners_partitions_…`         | one server SIGSTOPped (open, silent connections)   |
//! | `etcd_stopped_and_restarted_…`         | etcd itself killed for a few TTLs, then restarted  |
//! | `a_server_cut_off_from_etcd_…`         | one server loses etcd (a proxy broken), not its clients |
//! | `a_joining_server_and_a_drained_one_…` | a fourth server joins, then `dlock drain` empties one |
//!
//! Built only with the CLI's `cluster` feature (`cargo test -p dlock-cli --features cluster
//! --test cluster`); needs Debian's `etcd-server` and `etcd-client`.

#[path = "../../../cluster/tests/common/mod.rs"]
mod common;
mod harness;
mod proxy;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Etcd, eventually};
use dlock_core::cluster::{Map, partition_of};
use dlock_transport::client::{Endpoint, read_server_stats};

use harness::{Held, Load, Server, XID, check, map_spread_over, names, owned_by};
use proxy::Proxy;

/// The etcd lease TTL of every server (the 1-2 s).
const TTL_MS: u32 = 1_000;

fn three_servers(etcd: &Etcd, name: &str) -> Vec<Server> {
    (1..=3)
        .map(|id| Server::start(&etcd.endpoint(), name, id, TTL_MS))
        .collect()
}

/// A counter of the server at `addr` (`dlock stat`'s names), if it answers.
fn stat(addr: SocketAddr, name: &str) -> Option<u64> {
    let stats = read_server_stats(&Endpoint::Tcp(addr), Duration::from_secs(2)).ok()?;
    stats.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// The partition epoch a cluster token was issued at (`epoch:32 | counter:32`).
fn epoch_of(token: u64) -> u32 {
    (token >> 32) as u32
}

/// The epoch `map` gives `name`'s partition.
fn epoch_in(map: &Map, name: &[u8]) -> u32 {
    let p = partition_of(name, map.partitions());
    map.owner(p).map_or(0, |o| o.epoch)
}

/// Waits until no server in `servers` has a partition recovering: every client of the old
/// owners said `ReclaimDone` to the new ones. The grace period (which ends recovery without
/// them) is the longest grant lease stretched by the drift bound, 30.6 s with the servers'
/// defaults; the deadline is well inside it, so only the early end passes.
fn recovery_ends_early(servers: &[&Server], what: &str) {
    eventually(Duration::from_secs(20), what, || {
        servers
            .iter()
            .all(|s| stat(s.addr, "partitions_recovering") == Some(0))
            .then_some(())
    });
}

/// Waits until every name in `names` was granted after `t` at an epoch at least the one `map`
/// gives its partition: by the owner `map` names, or a later one.
fn all_granted_by_owners_of(load: &Load, t: Instant, map: &Map, names: &[Vec<u8>], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = load.granted_since(t);
        let missing: Vec<_> = names
            .iter()
            .filter(|n| {
                !got.iter()
                    .any(|h| &h.name == *n && epoch_of(h.token) >= epoch_in(map, n))
            })
            .map(|n| {
                let last = got
                    .iter()
                    .rev()
                    .find(|h| &h.name == n)
                    .map(|h| epoch_of(h.token));
                (
                    String::from_utf8_lossy(n).into_owned(),
                    epoch_in(map, n),
                    last,
                )
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: (name, epoch wanted, epoch of its last grant) \
             {missing:?}; errors {:?}",
            load.record.lock().unwrap().errors
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
    an_owner_lost(Loss::Kill);
}

/// The same with the owner frozen (SIGSTOP) instead of killed: its connections stay open and
/// silent, so the clients learn it is gone from the map, not from their sockets.
#[test]
fn a_frozen_owners_partitions_are_served_elsewhere_and_no_grant_is_doubled() {
    an_owner_lost(Loss::Freeze);
}

/// How the XID counter's owner is lost.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// SIGKILL: its connections are reset at once.
    Kill,
    /// SIGSTOP: nothing answers, nothing is reset.
    Freeze,
}

fn an_owner_lost(how: Loss) {
    let cluster = match how {
        Loss::Kill => "kill",
        Loss::Freeze => "freeze",
    };
    let etcd = Etcd::start();
    let mut servers = three_servers(&etcd, cluster);
    let before = map_spread_over(&etcd, cluster, &[1, 2, 3]);
    let seeds: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let all = names(48);
    let load = Load::start(&seeds, &all, 12, 2, Duration::from_millis(400));
    let warm = Instant::now();
    all_granted_since(&load, warm, &all, "every lock granted once");

    // The XID counter's owner dies, so that its fetch-and-adds wait on the failover.
    let xid_owner = before
        .owner(partition_of(XID, before.partitions()))
        .and_then(|o| o.server)
        .map(|s| s.get())
        .unwrap();
    let victim = servers.iter_mut().find(|s| s.id == xid_owner).unwrap();
    let theirs = owned_by(&before, victim.id, &all);
    assert!(!theirs.is_empty(), "the victim owns some of the names");
    match how {
        Loss::Kill => victim.kill(),
        Loss::Freeze => victim.freeze(),
    }
    let killed = Instant::now();
    let xids_at_kill = load.xids();
    let survivors: Vec<u32> = [1, 2, 3]
        .into_iter()
        .filter(|&id| id != xid_owner)
        .collect();

    // Its partitions go to the survivors (raised epochs) and are served there.
    let after = map_spread_over(&etcd, cluster, &survivors);
    assert!(after.version() > before.version());
    all_granted_by_owners_of(
        &load,
        killed,
        &after,
        &theirs,
        "server 1's locks granted elsewhere",
    );
    let alive: Vec<&Server> = servers.iter().filter(|s| s.id != xid_owner).collect();
    recovery_ends_early(&alive, "the survivors' recovery to end");
    all_granted_since(&load, killed, &all, "every lock granted after the kill");
    eventually(Duration::from_secs(90), "XIDs after the kill", || {
        (load.xids() > xids_at_kill + 100).then_some(())
    });
    // Reported, not asserted (the machine is shared): the XID stall, from the kill to the
    // first XID handed out again, against the TTL (docs/cluster.md).
    let first = load.first_xid_after(killed).unwrap();
    eprintln!(
        "XID stall after the owner was lost ({how:?}): {} ms (etcd lease TTL {TTL_MS} ms)",
        first.duration_since(killed).as_millis()
    );
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

#[test]
fn etcd_stopped_and_restarted_under_load_fences_the_servers_in_time_and_locking_resumes() {
    let mut etcd = Etcd::start();
    let servers = three_servers(&etcd, "outage");
    map_spread_over(&etcd, "outage", &[1, 2, 3]);
    let seeds: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let all = names(48);
    let load = Load::start(&seeds, &all, 12, 2, Duration::from_millis(400));
    let warm = Instant::now();
    all_granted_since(&load, warm, &all, "every lock granted once");
    let fenced_before: u64 = servers.iter().filter_map(|s| stat(s.addr, "fenced")).sum();

    etcd.stop();
    let stopped = Instant::now();
    // Three TTLs without etcd: every server's last confirmation is older than its lease, so
    // each has fenced itself, and the clients keep asking.
    std::thread::sleep(Duration::from_millis(3 * u64::from(TTL_MS)));
    let fenced: u64 = servers.iter().filter_map(|s| stat(s.addr, "fenced")).sum();
    assert!(
        fenced > fenced_before,
        "no server refused a command as fenced while etcd was down"
    );
    etcd.resume();
    let resumed = Instant::now();
    let xids_at_resume = load.xids();

    all_granted_since(
        &load,
        resumed,
        &all,
        "every lock granted after etcd came back",
    );
    eventually(Duration::from_secs(60), "XIDs after etcd came back", || {
        (load.xids() > xids_at_resume + 100).then_some(())
    });
    let record = load.stop();
    // A server fences itself before its lease can have expired: its last confirmation round
    // was sent before etcd died, and it grants only until TTL minus the drift margin after
    // that. So no grant was asked for more than a TTL after etcd died, until it came back.
    let fence = stopped + Duration::from_millis(TTL_MS.into());
    let late: Vec<&Held> = record
        .held
        .iter()
        .filter(|h| h.sent > fence && h.from < resumed)
        .collect();
    assert!(
        late.is_empty(),
        "granted while etcd was down for more than a lease TTL: {late:?}"
    );
    // Granting went on while the leases were valid (counted, not asserted: how many depends
    // on when the last confirmation before the stop was sent, and on the machine's load).
    let riding = record
        .held
        .iter()
        .filter(|h| h.sent > stopped && h.sent < fence)
        .count();
    eprintln!("grants asked for within a TTL after etcd stopped: {riding}");
    check(&record);
}

#[test]
fn a_server_cut_off_from_etcd_stops_granting_in_time_and_its_clients_move_on() {
    let etcd = Etcd::start();
    let upstream: SocketAddr = etcd
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let link = Proxy::start(upstream);
    let mut servers = vec![Server::start(&link.endpoint(), "cut", 1, TTL_MS)];
    servers.extend((2..=3).map(|id| Server::start(&etcd.endpoint(), "cut", id, TTL_MS)));
    map_spread_over(&etcd, "cut", &[1, 2, 3]);
    let seeds: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let all = names(48);
    let load = Load::start(&seeds, &all, 12, 2, Duration::from_millis(400));
    let warm = Instant::now();
    all_granted_since(&load, warm, &all, "every lock granted once");
    // The map now (a token counter's renewal may have raised an epoch since it spread).
    let before = harness::map(&etcd, "cut").expect("the map");
    let theirs = owned_by(&before, 1, &all);
    assert!(!theirs.is_empty(), "server 1 owns some of the names");

    link.cut();
    let cut = Instant::now();
    // Its lease runs out in etcd; its partitions go to the others at raised epochs.
    let after = map_spread_over(&etcd, "cut", &[2, 3]);
    for n in &theirs {
        assert!(
            epoch_in(&after, n) > epoch_in(&before, n),
            "{}: the partition moved without a new epoch",
            String::from_utf8_lossy(n)
        );
    }
    // Its clients (which still reach it) get their locks from the new owners.
    all_granted_by_owners_of(
        &load,
        cut,
        &after,
        &theirs,
        "server 1's locks granted elsewhere",
    );
    recovery_ends_early(
        &[&servers[1], &servers[2]],
        "the new owners' recovery to end",
    );
    all_granted_since(&load, cut, &all, "every lock granted after the cut");
    let record = load.stop();
    // Server 1 stopped granting in time: a grant at one of its epochs was asked for at most a
    // lease TTL after it lost etcd (it fences itself at TTL minus the drift margin after its
    // last confirmation, which it sent before the cut).
    let fence = cut + Duration::from_millis(TTL_MS.into());
    let late: Vec<&Held> = record
        .held
        .iter()
        .filter(|h| theirs.contains(&h.name))
        .filter(|h| epoch_of(h.token) <= epoch_in(&before, &h.name) && h.sent > fence)
        .collect();
    assert!(
        late.is_empty(),
        "server 1 granted after it lost etcd for a lease TTL: {late:?}"
    );
    assert!(
        stat(servers[0].addr, "fenced").is_some_and(|n| n > 0),
        "server 1 refused nothing as fenced"
    );
    check(&record);
    drop(servers);
}

#[test]
fn a_joining_server_and_a_drained_one_move_partitions_without_losing_a_grant() {
    let etcd = Etcd::start();
    let mut servers = three_servers(&etcd, "move");
    map_spread_over(&etcd, "move", &[1, 2, 3]);
    let seeds: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let all = names(48);
    let load = Load::start(&seeds, &all, 12, 2, Duration::from_millis(400));
    let warm = Instant::now();
    all_granted_since(&load, warm, &all, "every lock granted once");

    // A fourth server joins under load and is given partitions.
    servers.push(Server::start(&etcd.endpoint(), "move", 4, TTL_MS));
    let joined = Instant::now();
    let grown = map_spread_over(&etcd, "move", &[1, 2, 3, 4]);
    let fourths = owned_by(&grown, 4, &all);
    assert!(!fourths.is_empty(), "server 4 owns some of the names");
    all_granted_by_owners_of(&load, joined, &grown, &fourths, "server 4's locks granted");
    recovery_ends_early(&[&servers[3]], "server 4's recovery to end");
    all_granted_since(&load, joined, &all, "every lock granted after the join");

    // `dlock drain` moves server 2's partitions away and returns when it owns none.
    let seconds = owned_by(&grown, 2, &all);
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["drain", "--connect", &servers[1].addr.to_string()])
        .args(["--wait-s", "60"])
        .output()
        .expect("dlock drain runs");
    assert!(
        out.status.success(),
        "dlock drain: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let drained = Instant::now();
    let shrunk = map_spread_over(&etcd, "move", &[1, 3, 4]);
    all_granted_by_owners_of(
        &load,
        drained,
        &shrunk,
        &seconds,
        "server 2's locks granted elsewhere",
    );
    recovery_ends_early(
        &[&servers[0], &servers[2], &servers[3]],
        "the recovery after the drain to end",
    );
    all_granted_since(&load, drained, &all, "every lock granted after the drain");
    let record = load.stop();
    // A planned move hands every grant over through its holder's re-claim: none is gone.
    assert!(
        !record
            .unlocks_refused
            .contains_key(&dlock_core::Status::Fail),
        "a grant was lost in a move: unlocks refused {:?}",
        record.unlocks_refused
    );
    check(&record);
}
