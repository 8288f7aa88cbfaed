//! How the thin cluster client treats a re-claim its partition's new owner refused
//! (`client/cluster/reclaim.rs`), against deterministic fake servers (`cluster_fake`): a
//! refusal for good (`Einval` here) loses the grant at once and the `ReclaimDone` is said, as
//! `Fail` and `ServerNoResource` do; a passing one (`NotReady`) keeps the grant and sends the
//! claim again after a backoff that doubles, not at every heartbeat.
//!
//! Before, every refusal but `Fail` and `ServerNoResource` kept the claim and sent it again at
//! every heartbeat and every retry, forever, and the partition's `ReclaimDone` was never said:
//! the new owner held the partition in `NotReady` for every client until its grace deadline.

// The fake's knobs are shared with `cluster_client.rs`; each uses some.
#[allow(dead_code)]
mod cluster_fake;
// Only `wait_until` of the shared helpers is used here.
#[allow(dead_code)]
mod common;

use std::time::{Duration, Instant};

use cluster_fake::{Fake, FakeDial, Seen, SeenClaim, address};
use dlock_core::proto::Held;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::Client;
use dlock_transport::client::cluster::{ClusterConfig, ClusterLink};

type Cluster = Client<ClusterLink<FakeDial>>;

const LEASE_MS: u32 = 30_000;
/// Heartbeats sent in a row while a claim is refused.
const HEARTBEATS: usize = 20;

/// A client of servers 1 and 2 holding a lock whose partition is at server 2, and the lock.
fn holding(fake: &Fake, prefix: &str) -> (Cluster, Vec<u8>, LockId) {
    let seeds = vec![address(1)];
    let cfg = ClusterConfig::with_dial(seeds, FakeDial(fake.clone()))
        .with_timeout(Duration::from_secs(5));
    let mut c = Client::connect_cluster(cfg).unwrap();
    let name = fake.name_on(2, prefix);
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(grant.status, Status::Success);
    (c, name, id)
}

/// Server 2 dies and its partitions go to server 1, which answers claims of `name` `status`.
fn move_to_one_refusing(fake: &Fake, name: &[u8], status: Status) {
    fake.with_server(2, |s| s.dead(true));
    fake.with_server(1, |s| s.refuse_claim_with(name, status));
    fake.members(&[1]);
}

/// Claims of a grant (not a bare reference) of `name` the servers were sent.
fn grant_claims(fake: &Fake, name: &[u8]) -> usize {
    fake.seen()
        .iter()
        .filter(|s| {
            matches!(s, Seen::Claim(SeenClaim { name: n, held: Held::Exclusive, .. }) if n == name)
        })
        .count()
}

/// Whether server 1 was told `ReclaimDone` for `name`'s partition at its current epoch.
fn reclaim_done_said(fake: &Fake, name: &[u8]) -> bool {
    let (server, epoch) = fake.owner_of(name);
    let partition = fake.partition(name);
    fake.seen().contains(&Seen::ReclaimDone {
        server,
        partition,
        epoch,
    })
}

#[test]
fn a_claim_refused_for_good_loses_its_grant_and_the_reclaim_done_is_said() {
    let fake = Fake::new(&[1, 2]);
    let (mut c, name, id) = holding(&fake, "einval-");
    move_to_one_refusing(&fake, &name, Status::Einval);
    for _ in 0..HEARTBEATS {
        c.heartbeat().unwrap();
    }
    assert_eq!(
        grant_claims(&fake, &name),
        1,
        "claimed once, not at every heartbeat"
    );
    assert!(
        reclaim_done_said(&fake, &name),
        "the new owner hears the client is done"
    );
    // The grant is gone: the unlock says so, and the lock can be taken afresh.
    let e = c.unlock(id).unwrap_err();
    assert_eq!(e.status(), Status::Fail, "{e}");
    let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(grant.status, Status::Success);
}

#[test]
fn a_claim_refused_for_a_passing_reason_is_sent_again_after_a_growing_backoff() {
    let fake = Fake::new(&[1, 2]);
    let (mut c, name, id) = holding(&fake, "unready-");
    move_to_one_refusing(&fake, &name, Status::NotReady);
    let start = Instant::now();
    for _ in 0..HEARTBEATS {
        c.heartbeat().unwrap();
    }
    // The claim goes out when the move is learned, then after 20 ms, 40 ms more, 80 ms
    // more...: `n` claims take at least 20 ms × (2^(n-1) - 1). Whatever the heartbeats took,
    // no more went out than that allows (one spare), and fewer than one per heartbeat.
    let waits = start.elapsed().as_millis() as u64 / 20 + 1;
    let allowed = 2 + waits.ilog2() as usize;
    let sent = grant_claims(&fake, &name);
    assert!(
        sent <= allowed.min(HEARTBEATS - 1),
        "{sent} claims, {allowed} allowed"
    );
    assert!(
        !reclaim_done_said(&fake, &name),
        "not done while a claim waits"
    );

    // The owner takes claims again: the next heartbeat past the backoff claims and is done,
    // and the grant was kept all along.
    fake.with_server(1, |s| s.take_claims());
    common::cluster::wait_until(Duration::from_secs(10), "the claim to be taken", || {
        c.heartbeat().unwrap();
        reclaim_done_said(&fake, &name)
    });
    assert_eq!(fake.holder(&name), Some(c.id().get()));
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
}
