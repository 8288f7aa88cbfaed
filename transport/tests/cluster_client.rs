//! The thin cluster client (`client::cluster`) against deterministic fake servers
//! (`cluster_fake`): routing to a partition's owner, map refreshes and retries within the
//! deadline, batches split per server and taken in the global order, re-claims after an owner
//! change with the old owner's proofs, and the bad days (garbage maps, a server that vanishes).

// The fake's knobs are shared with `cluster_refusals.rs`; each uses some.
#[allow(dead_code)]
mod cluster_fake;
// Only the server half of the shared helpers is used here.
#[allow(dead_code)]
mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use cluster_fake::{Fake, FakeDial, Seen, SeenClaim, address, mac};
use dlock_core::proto::Held;
use dlock_core::{GrantProof, LockKind, Mode, Status};
use dlock_transport::client::cluster::{ClusterConfig, ClusterLink};
use dlock_transport::client::{Client, LockOptions, Locks};

type Cluster = Client<ClusterLink<FakeDial>>;

fn config(fake: &Fake, seeds: &[u32]) -> ClusterConfig<FakeDial> {
    let seeds: Vec<Vec<u8>> = seeds.iter().map(|&s| address(s)).collect();
    ClusterConfig::with_dial(seeds, FakeDial(fake.clone())).with_timeout(Duration::from_secs(5))
}

fn connect(fake: &Fake) -> Cluster {
    Client::connect_cluster(config(fake, &[1])).unwrap()
}

const LEASE_MS: u32 = 30_000;

#[test]
fn a_map_of_many_chunks_is_read_and_locks_go_to_their_owner() {
    // 4,096 partitions: the map's encoding is larger than one 16 KiB chunk.
    let fake = Fake::with_partitions(4_096, &[1, 2, 3]);
    let mut c = connect(&fake);
    assert_eq!(c.connection().map_version(), fake.map_version());
    for server in [1, 2, 3] {
        let name = fake.name_on(server, "t/rg-");
        let id = c.get_lock(LockKind::Atomic, &name).unwrap();
        let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(grant.status, Status::Success);
        assert_eq!(
            fake.holder(&name),
            Some(c.id().get()),
            "{server} holds it for the client"
        );
    }
    // Registered with one server, joined the two others with the same id.
    let joins: Vec<u32> = fake
        .seen()
        .iter()
        .filter_map(|s| match s {
            Seen::Join { server, client } if *client == c.id().get() => Some(*server),
            _ => None,
        })
        .collect();
    assert_eq!(joins.len(), 2);
}

#[test]
fn a_moved_partition_is_followed_within_the_deadline() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "x");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    fake.members(&[1]); // server 2's lease ran out: its partitions go to 1 at raised epochs
    let (owner, epoch) = fake.owner_of(&name);
    assert_eq!(owner, 1);
    let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(grant.status, Status::Success);
    assert_eq!(fake.holder(&name), Some(c.id().get()));
    let seen = fake.seen();
    let p = fake.partition(&name);
    assert!(seen.iter().any(|s| matches!(
        s,
        Seen::Claim(SeenClaim {
            server: 1,
            held: Held::Reference,
            ..
        })
    )));
    assert!(seen.contains(&Seen::ReclaimDone {
        server: 1,
        partition: p,
        epoch
    }));
}

#[test]
fn a_partition_that_stays_moved_is_an_error_after_the_deadline() {
    let fake = Fake::new(&[1]);
    let mut c =
        Client::connect_cluster(config(&fake, &[1]).with_timeout(Duration::from_millis(300)))
            .unwrap();
    let id = c.get_lock(LockKind::Atomic, b"y").unwrap();
    fake.with_server(1, |s| s.always_moved(true));
    let e = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap_err();
    assert_eq!(e.status(), Status::PartitionMoved, "{e}");
}

#[test]
fn not_ready_during_recovery_is_retried() {
    let fake = Fake::new(&[1]);
    let mut c = connect(&fake);
    let id = c.get_lock(LockKind::Atomic, b"z").unwrap();
    fake.with_server(1, |s| s.not_ready(3));
    let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(grant.status, Status::Success);
}

/// Two names, the first on server 1 in a lower partition than the second, on server 2.
fn ordered_pair(fake: &Fake) -> (Vec<u8>, Vec<u8>) {
    for i in 0.. {
        let a = fake.name_on(1, &format!("a{i}-"));
        let b = fake.name_on(2, &format!("b{i}-"));
        if fake.partition(&a) < fake.partition(&b) {
            return (a, b);
        }
    }
    unreachable!()
}

#[test]
fn an_all_or_nothing_batch_over_two_servers_gives_back_what_it_took() {
    let fake = Fake::new(&[1, 2]);
    let (a, b) = ordered_pair(&fake);
    let mut mine = connect(&fake);
    let mut theirs = connect(&fake);
    let tb = theirs.get_lock(LockKind::Atomic, &b).unwrap();
    let _held = theirs.trylock(tb, Mode::Exclusive, LEASE_MS).unwrap();
    let ia = mine.get_lock(LockKind::Atomic, &a).unwrap();
    let ib = mine.get_lock(LockKind::Atomic, &b).unwrap();
    let reqs = [
        (ib, Mode::Exclusive, LEASE_MS),
        (ia, Mode::Exclusive, LEASE_MS),
    ];
    let mut out = [Err(Status::Einval), Err(Status::Einval)];
    mine.batch_trylock(&reqs, true, &mut out).unwrap();
    assert!(out.iter().all(|r| r.is_err()), "{out:?}");
    // `a` (lower partition) was taken first, then given back when `b` failed.
    assert_eq!(fake.holder(&a), None);
    assert!(fake.seen().contains(&Seen::Unlock {
        server: 1,
        name: a.clone()
    }));
    // Per item, the same batch takes what it can.
    mine.batch_trylock(&reqs, false, &mut out).unwrap();
    assert!(out[0].is_err() && out[1].is_ok(), "{out:?}");
    assert_eq!(fake.holder(&a), Some(mine.id().get()));
}

#[test]
fn an_owner_change_is_reclaimed_with_the_old_owners_proof() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "held");
    let (_, old_epoch) = fake.owner_of(&name);
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let token = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap().token;
    fake.members(&[1]);
    let (_, new_epoch) = fake.owner_of(&name);
    assert!(new_epoch > old_epoch);
    // The next use meets PartitionMoved, refreshes, re-claims, and is served by the new owner.
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
    let seen = fake.seen();
    let claim = SeenClaim {
        server: 1,
        name: name.clone(),
        held: Held::Exclusive,
        token: token.0,
        proof: GrantProof {
            epoch: old_epoch,
            mac: mac(2, token.0),
        },
    };
    let at = seen
        .iter()
        .position(|s| *s == Seen::Claim(claim.clone()))
        .expect("claimed with the proof");
    let p = fake.partition(&name);
    let done = seen
        .iter()
        .position(|s| {
            *s == Seen::ReclaimDone {
                server: 1,
                partition: p,
                epoch: new_epoch,
            }
        })
        .expect("said done");
    let unlock = seen
        .iter()
        .position(|s| {
            *s == Seen::Unlock {
                server: 1,
                name: name.clone(),
            }
        })
        .unwrap();
    assert!(at < done && done < unlock);
}

#[test]
fn a_refused_claim_is_forgotten() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "refused");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let _held = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    fake.with_server(1, |s| s.refuse_claim(&name));
    fake.members(&[1]);
    // The grant is gone: the unlock says so, and the lock can be taken afresh.
    let e = c.unlock(id).unwrap_err();
    assert_eq!(e.status(), Status::Fail, "{e}");
    assert_eq!(
        c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap().status,
        Status::Success
    );
    assert_eq!(fake.holder(&name), Some(c.id().get()));
}

#[test]
fn a_claim_whose_reply_was_lost_is_kept_and_claimed_again() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "lost");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let _held = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    fake.with_server(1, |s| s.lose_claim_reply());
    fake.members(&[1]);
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
    let claims = fake
        .seen()
        .iter()
        .filter(|s| {
            matches!(
                s,
                Seen::Claim(SeenClaim {
                    held: Held::Exclusive,
                    ..
                })
            )
        })
        .count();
    assert_eq!(claims, 2, "claimed once (reply lost), then again");
}

#[test]
fn a_map_that_does_not_decode_is_refused() {
    let fake = Fake::new(&[1]);
    fake.with_server(1, |s| s.garbage_map());
    let e = ClusterLink::connect(config(&fake, &[1])).unwrap_err();
    assert_eq!(e.status(), Status::NotReady);
    let source = std::error::Error::source(&e).expect("the I/O error");
    assert!(source.to_string().contains("decode"), "{source}");
}

#[test]
fn a_server_that_vanishes_mid_call_is_a_clear_error() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "gone");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    fake.with_server(2, |s| s.dead(true));
    let e = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap_err();
    assert_eq!(e.status(), Status::BadResponse, "{e}");
}

#[test]
fn heartbeats_reach_every_server_joined() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    for server in [1, 2] {
        c.get_lock(LockKind::Atomic, &fake.name_on(server, "hb"))
            .unwrap();
    }
    c.heartbeat().unwrap();
    let seen = fake.seen();
    assert!(seen.contains(&Seen::Heartbeat { server: 1 }));
    assert!(seen.contains(&Seen::Heartbeat { server: 2 }));
}

/// The map was read over the connections the client had joined with a header naming no
/// client, and a server closes a control connection bound to a client when a frame names anyone
/// else: every heartbeat's map check cost the client its connections, and the first request
/// after a refresh failed on the dead one (seen with an embedded server's own control socket).
#[test]
fn reading_the_map_over_a_joined_connection_keeps_it() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let names = [1, 2].map(|server| fake.name_on(server, "keep"));
    let ids = names
        .each_ref()
        .map(|n| c.get_lock(LockKind::Atomic, n).unwrap());
    for _ in 0..3 {
        c.heartbeat().unwrap();
        assert_eq!(
            c.connection().joined(),
            [1, 2].map(|n| dlock_core::cluster::ServerId::new(n).unwrap()),
            "a map check closed a joined connection"
        );
    }
    for id in ids {
        let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(grant.status, Status::Success);
    }
    let joins = fake
        .seen()
        .iter()
        .filter(|s| matches!(s, Seen::Join { .. }))
        .count();
    assert_eq!(joins, 1, "joined server 2 once, never again");
}

#[test]
fn the_native_api_runs_over_the_cluster() {
    let fake = Fake::new(&[1, 2]);
    let a = Locks::connect_cluster(config(&fake, &[2])).unwrap();
    let b = Locks::connect_cluster(config(&fake, &[1])).unwrap();
    let name = fake.name_on(2, "native");
    let lease = Duration::from_secs(5);
    let guard = a.atomic(&name).unwrap().try_lock(lease).unwrap();
    let token = guard.token();
    assert!(token.0 != 0);
    let theirs = b.atomic(&name).unwrap();
    assert!(theirs.try_lock(lease).unwrap_err().is_would_block());
    guard.unlock().unwrap();
    let again = theirs.try_lock(lease).unwrap();
    assert!(again.token() > token);
}

#[test]
fn a_name_whose_partition_moved_is_looked_up_at_its_new_owner() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let before = c.connection().map_version();
    let name = fake.name_on(2, "late");
    fake.members(&[1]);
    // The cached map still names server 2, which answers PartitionMoved; the client refreshes.
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    assert!(c.connection().map_version() > before);
    assert_eq!(
        c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap().status,
        Status::Success
    );
    assert_eq!(fake.holder(&name), Some(c.id().get()));
}

#[test]
fn a_client_silent_past_the_old_owners_lease_claims_nothing() {
    let fake = Fake::new(&[1, 2]);
    fake.set_lease_ms(20);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "silent");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let _held = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    // Silent for longer than server 2's lease: it may have freed the grant before it died.
    thread::sleep(Duration::from_millis(100));
    fake.members(&[1]);
    let _ = c.unlock(id);
    let claims: Vec<SeenClaim> = fake
        .seen()
        .into_iter()
        .filter_map(|s| match s {
            Seen::Claim(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].held, Held::Reference, "{claims:?}");
    assert!(claims[0].proof.is_none());
}

#[test]
fn a_standalone_server_has_no_map_for_a_cluster_client() {
    let s = common::server(true);
    let addr = s.tcp_addr().unwrap().to_string();
    let e = ClusterLink::connect(ClusterConfig::new([addr])).unwrap_err();
    // Refused, with the I/O error that says why (the server answers `Einval`, or closes a
    // connection that asks what it does not serve), never a panic.
    assert_eq!(e.status(), Status::NotReady);
    assert!(std::error::Error::source(&e).is_some(), "{e}");
}

/// Wakes a parked thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The smallest executor: polls `f` on this thread, parking between wake-ups.
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => thread::park(),
        }
    }
}

#[test]
fn async_guards_work_over_the_cluster() {
    let fake = Fake::new(&[1, 2]);
    let locks = Locks::connect_cluster(config(&fake, &[1])).unwrap();
    let name = fake.name_on(2, "async");
    let lock = locks.atomic(&name).unwrap();
    let opts = LockOptions {
        lease: Duration::from_secs(5),
        wait: Duration::from_secs(1),
    };
    let guard = block_on(lock.lock_async(opts)).unwrap();
    assert_eq!(fake.holder(&name), Some(locks.client_id().get()));
    block_on(guard.unlock_async()).unwrap();
    assert_eq!(fake.holder(&name), None);
}

#[test]
fn a_heartbeat_learns_of_a_move_and_reclaims_without_other_traffic() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "idle");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let _held = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    // Server 2 dies; the coordinator gives its partitions to 1.
    fake.with_server(2, |s| s.dead(true));
    fake.members(&[1]);
    let (_, epoch) = fake.owner_of(&name);
    c.heartbeat().unwrap();
    let seen = fake.seen();
    assert!(seen.iter().any(|s| matches!(
        s,
        Seen::Claim(SeenClaim {
            server: 1,
            held: Held::Exclusive,
            ..
        })
    )));
    let p = fake.partition(&name);
    assert!(seen.contains(&Seen::ReclaimDone {
        server: 1,
        partition: p,
        epoch
    }));
    assert_eq!(
        c.connection().joined().len(),
        1,
        "server 2 is no longer counted on"
    );
}

#[test]
fn a_client_whose_only_server_died_learns_the_new_map_from_another() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake); // registers with server 1, the map's first
    let name = fake.name_on(1, "home");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let _held = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(c.connection().joined().len(), 1);
    fake.with_server(1, |s| s.dead(true));
    fake.members(&[2]);
    c.heartbeat().unwrap();
    let (owner, epoch) = fake.owner_of(&name);
    assert_eq!(owner, 2);
    let p = fake.partition(&name);
    assert!(fake.seen().contains(&Seen::ReclaimDone {
        server: 2,
        partition: p,
        epoch
    }));
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
}

#[test]
fn a_counter_is_reached_at_its_owner_and_got_again_after_a_move() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "xid-");
    c.atomic64_create(&name, 100, 60).unwrap();
    let xid = c.atomic64_get(&name, 60).unwrap();
    assert_eq!(c.atomic64_faa(xid, 1).unwrap(), 100);
    assert_eq!(c.atomic64_faa(xid, 1).unwrap(), 101);
    fake.members(&[1]);
    // The new owner starts the counter above what was handed out; the same handle reaches it.
    assert_eq!(c.atomic64_faa(xid, 1).unwrap(), 102);
    assert_eq!(c.atomic64_snapshot(xid).unwrap(), 103);
    assert_eq!(fake.owner_of(&name).0, 1);
}

#[test]
fn a_batch_of_names_is_looked_up_at_each_owner() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let (a, b) = (fake.name_on(1, "bg-"), fake.name_on(2, "bg-"));
    let names = [
        (LockKind::Atomic, a.as_slice()),
        (LockKind::Atomic, b.as_slice()),
    ];
    let ids: Vec<_> = c
        .batch_get_lock(&names)
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (id, name) in ids.iter().zip([&a, &b]) {
        assert_eq!(
            c.trylock(*id, Mode::Exclusive, LEASE_MS).unwrap().status,
            Status::Success
        );
        assert_eq!(c.unlock(*id).unwrap(), Status::Success);
        assert_eq!(fake.holder(name), None);
    }
    let released = c.batch_release_lock(&ids).unwrap();
    assert!(released.iter().all(Result::is_ok), "{released:?}");
}

/// After server 2 leaves, `client` owes server 1 a `ReclaimDone` for every partition that
/// moved from 2: the messages server 1 saw, as (`ReclaimDones` sizes, `ReclaimDone`s).
fn dones_after_a_move(fake: &Fake) -> (Vec<usize>, usize) {
    let mut c = connect(fake);
    let name = fake.name_on(2, "held");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(grant.status, Status::Success);
    fake.members(&[1]);
    assert_eq!(c.unlock(id).unwrap(), Status::Success);
    let seen = fake.seen();
    let batches = seen
        .iter()
        .filter_map(|s| match s {
            Seen::ReclaimDones {
                server: 1,
                partitions,
            } => Some(*partitions),
            _ => None,
        })
        .collect();
    let each = seen
        .iter()
        .filter(|s| matches!(s, Seen::ReclaimDone { server: 1, .. }))
        .count();
    (batches, each)
}

#[test]
fn a_server_of_protocol_6_is_told_every_partition_reclaimed_in_one_message() {
    let fake = Fake::new(&[1, 2]);
    fake.speak(1, 6);
    let (batches, each) = dones_after_a_move(&fake);
    assert!(each > 1, "several partitions moved to server 1");
    assert_eq!(batches, [each], "one ReclaimDones for them all");
}

/// A `ReclaimDone` taken is forgotten at once: when a later one's exchange fails (here its
/// reply is lost), the next heartbeat says that one again and not the ones before it. Before,
/// what one server had taken was returned only when every word to it went through, and an
/// error on the way dropped it: every word taken was said again.
#[test]
fn a_reclaim_done_taken_before_an_exchange_failed_is_not_said_again() {
    let fake = Fake::new(&[1, 2]);
    let mut c = connect(&fake);
    let name = fake.name_on(2, "held");
    let id = c.get_lock(LockKind::Atomic, &name).unwrap();
    let grant = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(grant.status, Status::Success);
    // Server 1 (protocol 5: one `ReclaimDone` per message) loses the second one's reply.
    fake.with_server(1, |s| s.lose_done_reply_after(1));
    fake.with_server(2, |s| s.dead(true));
    fake.members(&[1]);
    for _ in 0..3 {
        let _ = c.heartbeat();
    }
    let said: Vec<u16> = fake
        .seen()
        .iter()
        .filter_map(|s| match s {
            Seen::ReclaimDone {
                server: 1,
                partition,
                ..
            } => Some(*partition),
            _ => None,
        })
        .collect();
    let mut partitions = said.clone();
    partitions.sort_unstable();
    partitions.dedup();
    assert!(partitions.len() > 1, "several partitions moved to server 1");
    assert_eq!(
        said.len(),
        partitions.len() + 1,
        "only the word whose reply was lost is said twice: {said:?}"
    );
}

#[test]
fn a_server_of_protocol_5_is_told_each_partition_reclaimed_alone() {
    let fake = Fake::new(&[1, 2]);
    let (batches, each) = dones_after_a_move(&fake);
    assert!(each > 1, "several partitions moved to server 1");
    assert!(batches.is_empty(), "no ReclaimDones to a version-5 server");
}
