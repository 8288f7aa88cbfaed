//! The cluster client's route to a lock costs one look while nothing moved: every data command
//! first brings its partition to the map's owner (a re-claim if it moved), and that pass reads
//! every route the client holds. Before, it ran at each lock and unlock — a client holding N
//! locks sorted N routes and allocated two lists per command, whether or not anything moved.
//! Now a partition whose routes were all found at the owner of the map at hand, and that owes
//! no re-claim, is passed over; a new map, or a re-claim still owed, brings the pass back.
//! Against the deterministic fake servers (`cluster_fake`), counting the link's passes.

// The fake's knobs are shared with the other cluster tests; each uses some.
#[allow(dead_code)]
mod cluster_fake;

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_fake::{Fake, FakeDial, Seen, SeenClaim, address};
use dlock_core::proto::Held;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::Client;
use dlock_transport::client::cluster::{ClusterConfig, ClusterLink};

type Cluster = Client<ClusterLink<FakeDial>>;

const LEASE_MS: u32 = 30_000;
/// Locks the client holds beside the one it takes and lets go.
const HELD: usize = 300;

fn connect(fake: &Fake) -> Cluster {
    let cfg = ClusterConfig::with_dial([address(1)], FakeDial(fake.clone()))
        .with_timeout(Duration::from_secs(5));
    Client::connect_cluster(cfg).unwrap()
}

fn passes(c: &Cluster) -> u64 {
    c.connection().rehome_passes()
}

/// The client holds `HELD` locks over the fake's servers; their names and ids.
fn hold_many(c: &mut Cluster) -> Vec<(Vec<u8>, LockId)> {
    (0..HELD)
        .map(|i| {
            let name = format!("orders/row-{i}").into_bytes();
            let id = c.get_lock(LockKind::Rw, &name).unwrap();
            let g = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
            assert_eq!(g.status, Status::Success);
            (name, id)
        })
        .collect()
}

/// `rounds` trylocks and unlocks of `id`; each must succeed.
fn take_and_give_back(c: &mut Cluster, id: LockId, rounds: usize) {
    for _ in 0..rounds {
        let g = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(g.status, Status::Success);
        assert_eq!(c.unlock(id).unwrap(), Status::Success);
    }
}

#[test]
fn locks_and_unlocks_make_no_reclaim_pass_while_nothing_moved() {
    let fake = Fake::new(&[1, 2, 3]);
    let mut c = connect(&fake);
    let held = hold_many(&mut c);
    // One pass per partition at its first use, not one per command.
    let partitions: BTreeSet<u16> = held.iter().map(|(n, _)| fake.partition(n)).collect();
    assert!(
        passes(&c) <= partitions.len() as u64,
        "{} passes for {} commands over {} partitions",
        passes(&c),
        HELD,
        partitions.len()
    );
    let before = passes(&c);
    let page = c.get_lock(LockKind::Rw, b"orders/page").unwrap();
    take_and_give_back(&mut c, page, 200);
    // The held locks, again: an unlock and a trylock each.
    for (_, id) in &held {
        assert_eq!(c.unlock(*id).unwrap(), Status::Success);
        let g = c.trylock(*id, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(g.status, Status::Success);
    }
    // A pass only at the page's first use, if no held lock is in its partition.
    let first_use = !partitions.contains(&fake.partition(b"orders/page"));
    assert_eq!(passes(&c) - before, u64::from(first_use));
}

#[test]
fn a_move_is_followed_by_one_pass_per_partition_and_then_none() {
    let fake = Fake::new(&[1, 2, 3]);
    let mut c = connect(&fake);
    let held = hold_many(&mut c);
    let on_3: Vec<&(Vec<u8>, LockId)> = held
        .iter()
        .filter(|(n, _)| fake.owner_of(n).0 == 3)
        .collect();
    assert!(!on_3.is_empty());
    // Server 3 leaves; its partitions go to the others. The next use of one of its locks meets
    // `PartitionMoved`, follows the map and re-claims every partition that moved.
    fake.members(&[1, 2]);
    let (moved_name, moved) = on_3[0];
    assert_eq!(c.unlock(*moved).unwrap(), Status::Success);
    let claimed: BTreeSet<Vec<u8>> = (fake.seen().into_iter())
        .filter_map(|s| match s {
            Seen::Claim(SeenClaim {
                server,
                name,
                held: Held::Exclusive,
                ..
            }) if server != 3 => Some(name),
            _ => None,
        })
        .collect();
    for (name, _) in &on_3 {
        assert!(claimed.contains(name), "{name:?} was not re-claimed");
    }
    let g = c.trylock(*moved, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(g.status, Status::Success, "{moved_name:?}");
    // Settled: the moved locks and the others are used without a pass.
    let before = passes(&c);
    for (_, id) in &held {
        assert_eq!(c.unlock(*id).unwrap(), Status::Success);
        let g = c.trylock(*id, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(g.status, Status::Success);
    }
    assert_eq!(passes(&c), before);
}

#[test]
fn a_reclaim_still_owed_is_passed_again_at_each_use_until_taken() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    // Two locks in one partition of server 2: one held, whose claim server 1 refuses for a
    // passing reason at first, and one free, used meanwhile.
    let name = fake.name_on(2, "orders/held-");
    let p = fake.partition(&name);
    let free_name = (0..)
        .map(|i| format!("orders/free-{i}").into_bytes())
        .find(|n| fake.partition(n) == p)
        .unwrap();
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let free = c.get_lock(LockKind::Atomic, &free_name).unwrap();
    assert_eq!(
        c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap().status,
        Status::Success
    );
    fake.with_server(1, |s| s.refuse_claim_with(&name, Status::NotReady));
    fake.members(&[1]);
    take_and_give_back(&mut c, free, 1);
    // The held lock's re-claim is owed: each use of the partition passes over it again.
    let before = passes(&c);
    take_and_give_back(&mut c, free, 3);
    assert!(passes(&c) >= before + 6, "the owed re-claim was skipped");
    // Taken at last; then no pass.
    fake.with_server(1, |s| s.take_claims());
    take_and_give_back(&mut c, free, 1);
    assert_eq!(fake.holder(&name), Some(c.id().get()));
    let before = passes(&c);
    take_and_give_back(&mut c, free, 3);
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
    assert_eq!(passes(&c), before);
}
