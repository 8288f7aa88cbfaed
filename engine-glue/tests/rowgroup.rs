//! Row-group locks against an embedded server: large sets, opposite orders, all-or-nothing,
//! lost leases, tokens, re-entrancy. Every check of "held" or "free" is made by another client
//! trying the lock, so it is the server's view, not the transaction's own bookkeeping.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock_engine_glue::EmbeddedServer;
use dlock_engine_glue::dlock_core::{Config, FencingToken, LockKind, Mode, Status};
use dlock_engine_glue::dlock_transport::client::Client;
use dlock_engine_glue::rowgroup::{
    AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks, is_fatal,
};

const WAIT: Duration = Duration::from_secs(10);

fn server(client_lease_ms: u32) -> EmbeddedServer {
    EmbeddedServer::start(EmbeddedServer::config(Config {
        locks_max: 4_096,
        clients_max: 16,
        objects_max: 16,
        client_lease_ms,
        ..Config::default()
    }))
    .expect("server starts")
}

fn locks(s: &EmbeddedServer, client_lease_ms: u32) -> RowGroupLocks {
    let rg = RowGroupLocks::new(s.client().expect("client"), RowGroupConfig::DEFAULT)
        .expect("valid config");
    assert_eq!(
        rg.client_lease(),
        Duration::from_millis(client_lease_ms.into()),
        "the server's lease"
    );
    rg
}

fn keys(table: u32, groups: impl IntoIterator<Item = u64>) -> Vec<RowGroup> {
    groups
        .into_iter()
        .map(|g| RowGroup::new(table, g))
        .collect()
}

fn all(keys: &[RowGroup], mode: Mode) -> Vec<(RowGroup, Mode)> {
    keys.iter().map(|&k| (k, mode)).collect()
}

/// Whether another client can take `key` in `mode` right now (it lets go again at once).
fn free_for(probe: &mut Client, key: RowGroup, mode: Mode) -> bool {
    let id = probe
        .get_lock(LockKind::Rw, &key.lock_name())
        .expect("get_lock");
    match probe.trylock(id, mode, 1_000).map_err(Status::from) {
        Ok(_) => {
            assert_eq!(probe.unlock(id).map_err(Status::from), Ok(Status::Success));
            true
        }
        Err(Status::Fail) => false,
        Err(s) => panic!("probe trylock: {s}"),
    }
}

fn free(probe: &mut Client, keys: &[RowGroup]) -> Vec<bool> {
    keys.iter()
        .map(|&k| free_for(probe, k, Mode::Exclusive))
        .collect()
}

#[test]
fn sets_larger_than_a_batch_are_held_then_released() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let mut probe = s.client().expect("probe");
    let ks = keys(1, 0..100);
    let requests: Vec<_> = ks
        .iter()
        .map(|&k| {
            let mode = if k.group % 2 == 0 {
                Mode::Exclusive
            } else {
                Mode::Shared
            };
            (k, mode)
        })
        .collect();
    let mut txn = rg.begin();
    txn.acquire(&requests, AcquireOptions::NO_WAIT)
        .expect("uncontended set");
    assert_eq!(txn.held().len(), 100);
    assert!(ks.iter().all(|&k| txn.token(k).is_some_and(|t| t.0 > 0)));
    assert_eq!(free(&mut probe, &ks), vec![false; 100], "every key is held");
    for &(k, mode) in &requests {
        assert_eq!(txn.mode(k), Some(mode));
        // A shared grant admits another reader, an exclusive one does not.
        assert_eq!(free_for(&mut probe, k, Mode::Shared), mode == Mode::Shared);
    }
    txn.commit().expect("commit");
    assert_eq!(
        free(&mut probe, &ks),
        vec![true; 100],
        "commit released every key"
    );
}

#[test]
fn opposite_orders_both_finish_and_never_share_an_exclusive_key() {
    const ROUNDS: usize = 50;
    const KEYS: u64 = 60;
    let s = server(5_000);
    let owner: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let start = Arc::new(Barrier::new(2));
    let workers: Vec<_> = [(1u32, 0..40u64, false), (2, 20..KEYS, true)]
        .into_iter()
        .map(|(me, groups, reversed)| {
            let mut rg = locks(&s, 5_000);
            let (owner, start) = (Arc::clone(&owner), Arc::clone(&start));
            thread::spawn(move || {
                let mut ks = keys(7, groups);
                if reversed {
                    ks.reverse();
                }
                let requests = all(&ks, Mode::Exclusive);
                for _ in 0..ROUNDS {
                    start.wait();
                    let mut txn = rg.begin();
                    txn.acquire(&requests, AcquireOptions::wait(WAIT))
                        .expect("no deadlock, no timeout");
                    for k in &ks {
                        let cell = &owner[k.group as usize];
                        assert_eq!(cell.swap(me, Ordering::SeqCst), 0, "{k:?} held twice");
                    }
                    thread::yield_now();
                    for k in &ks {
                        owner[k.group as usize].store(0, Ordering::SeqCst);
                    }
                    txn.commit().expect("commit");
                }
                ROUNDS
            })
        })
        .collect();
    for w in workers {
        assert_eq!(w.join().expect("worker"), ROUNDS);
    }
}

#[test]
fn a_busy_key_is_waited_for_until_its_holder_lets_go() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let ks = keys(2, 0..40);
    let mut holder = s.client().expect("holder");
    let id = holder
        .get_lock(LockKind::Rw, &ks[33].lock_name())
        .expect("get_lock");
    let _ = holder
        .trylock(id, Mode::Exclusive, 1_000)
        .expect("holder locks");
    let releaser = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        assert_eq!(holder.unlock(id).map_err(Status::from), Ok(Status::Success));
        holder
    });
    let t = Instant::now();
    let mut txn = rg.begin();
    txn.acquire(&all(&ks, Mode::Exclusive), AcquireOptions::wait(WAIT))
        .expect("granted once released");
    assert!(t.elapsed() >= Duration::from_millis(90), "it did wait");
    assert_eq!(txn.held().len(), 40);
    drop(releaser.join());
}

#[test]
fn all_or_nothing_failure_leaves_nothing_held() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let mut probe = s.client().expect("probe");
    let mut blocker = s.client().expect("blocker");
    let ks = keys(3, 0..100);
    let busy = ks[57];
    let id = blocker
        .get_lock(LockKind::Rw, &busy.lock_name())
        .expect("get_lock");
    let _ = blocker
        .trylock(id, Mode::Exclusive, 1_000)
        .expect("blocker locks");
    // Below every key of the set, so the set stays in order and may be waited for.
    let earlier = RowGroup::new(2, 0);
    let requests = all(&ks, Mode::Exclusive);
    let mut txn = rg.begin();
    txn.acquire(&[(earlier, Mode::Shared)], AcquireOptions::NO_WAIT)
        .expect("earlier call");

    let no_wait = AcquireOptions::NO_WAIT.all_or_nothing();
    assert_eq!(txn.acquire(&requests, no_wait), Err(Status::Fail));
    let waiting = AcquireOptions::wait(Duration::from_millis(50)).all_or_nothing();
    assert_eq!(txn.acquire(&requests, waiting), Err(Status::Etimeout));
    for (i, free) in free(&mut probe, &ks).into_iter().enumerate() {
        assert_eq!(
            free,
            i != 57,
            "key {i}: nothing of the failed calls stays held"
        );
    }
    let held: Vec<_> = txn.held().map(|(k, ..)| k).collect();
    assert_eq!(held, vec![earlier], "an earlier call's keys stay");
    assert!(!free_for(&mut probe, earlier, Mode::Exclusive));

    // Without the option the keys before the busy one stay held, the others do not.
    assert_eq!(
        txn.acquire(&requests, AcquireOptions::NO_WAIT),
        Err(Status::Fail)
    );
    for (i, free) in free(&mut probe, &ks).into_iter().enumerate() {
        assert_eq!(free, i > 57, "key {i}: only the prefix is held");
    }
    txn.abort().expect("abort");
    assert!(free(&mut probe, &ks[..57]).into_iter().all(|f| f));
}

#[test]
fn a_lost_lease_is_reported_for_every_held_key() {
    const LEASE_MS: u32 = 300;
    let s = server(LEASE_MS);
    let mut rg = locks(&s, LEASE_MS);
    let reported: Arc<Mutex<Vec<(RowGroup, FencingToken)>>> = Arc::default();
    let sink = Arc::clone(&reported);
    rg.set_on_lost(move |k, t| sink.lock().expect("sink").push((k, t)));
    let ks = keys(5, 0..40);
    let mut txn = rg.begin();
    txn.acquire(&all(&ks, Mode::Exclusive), AcquireOptions::NO_WAIT)
        .expect("acquire");
    let tokens: Vec<_> = txn.held().map(|(k, _, t)| (k, t)).collect();
    txn.keep_leases(Instant::now()).expect("alive");
    assert!(reported.lock().expect("sink").is_empty());

    // Silent for three leases: the server declares the client dead and frees its keys.
    thread::sleep(Duration::from_millis(3 * u64::from(LEASE_MS)));
    let status = txn.keep_leases(Instant::now()).expect_err("lease lost");
    assert!(is_fatal(status), "{status}");
    assert_eq!(
        *reported.lock().expect("sink"),
        tokens,
        "callback told at once"
    );
    assert_eq!(txn.lost(), &tokens[..]);
    assert!(
        ks.iter().all(|&k| txn.token(k).is_none()),
        "stale tokens are withheld"
    );
    assert_eq!(
        txn.acquire(
            &[(RowGroup::new(5, 99), Mode::Shared)],
            AcquireOptions::NO_WAIT
        ),
        Err(status)
    );
    assert_eq!(
        txn.commit(),
        Err(status),
        "a transaction that lost keys cannot commit"
    );
    let mut probe = s.client().expect("probe");
    assert_eq!(
        free(&mut probe, &ks),
        vec![true; 40],
        "the server released them"
    );
    assert_eq!(rg.health(), Err(status));
}

#[test]
fn kept_leases_outlive_the_lease() {
    const LEASE_MS: u32 = 300;
    let s = server(LEASE_MS);
    let mut rg = locks(&s, LEASE_MS);
    let ks = keys(6, 0..5);
    let mut txn = rg.begin();
    txn.acquire(&all(&ks, Mode::Exclusive), AcquireOptions::NO_WAIT)
        .expect("acquire");
    let until = Instant::now() + Duration::from_millis(3 * u64::from(LEASE_MS));
    while Instant::now() < until {
        txn.keep_leases(Instant::now()).expect("renewed");
        thread::sleep(Duration::from_millis(u64::from(LEASE_MS) / 10));
    }
    let mut probe = s.client().expect("probe");
    assert_eq!(free(&mut probe, &ks), vec![false; 5], "still held");
    assert!(txn.lost().is_empty());
    txn.commit().expect("commit");
}

#[test]
fn tokens_are_present_and_increase_per_key() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let ks = keys(8, 0..35);
    let mut last = vec![FencingToken(0); ks.len()];
    for round in 0..3 {
        let mode = if round == 1 {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        let mut txn = rg.begin();
        txn.acquire(&all(&ks, mode), AcquireOptions::NO_WAIT)
            .expect("acquire");
        for (k, prev) in ks.iter().zip(&mut last) {
            let t = txn.token(*k).expect("every grant has a token");
            assert!(t > *prev, "{k:?}: {t:?} after {prev:?}");
            *prev = t;
        }
        txn.commit().expect("commit");
    }
}

#[test]
fn reentry_is_a_no_op_and_an_upgrade_is_refused() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let (a, b, c) = (
        RowGroup::new(9, 1),
        RowGroup::new(9, 2),
        RowGroup::new(9, 3),
    );
    let mut txn = rg.begin();
    // Asked twice in one call: once, in the stronger mode.
    txn.acquire(
        &[(a, Mode::Shared), (c, Mode::Shared), (c, Mode::Exclusive)],
        AcquireOptions::NO_WAIT,
    )
    .expect("acquire");
    assert_eq!(
        (txn.mode(a), txn.mode(c)),
        (Some(Mode::Shared), Some(Mode::Exclusive))
    );
    let (ta, tc) = (txn.token(a), txn.token(c));
    txn.acquire(
        &[(a, Mode::Shared), (c, Mode::Shared)],
        AcquireOptions::NO_WAIT,
    )
    .expect("re-entry");
    assert_eq!((txn.token(a), txn.token(c)), (ta, tc), "no new grant");
    assert_eq!(txn.mode(c), Some(Mode::Exclusive));
    assert_eq!(
        txn.acquire(
            &[(b, Mode::Exclusive), (a, Mode::Exclusive)],
            AcquireOptions::NO_WAIT
        ),
        Err(Status::Einval)
    );
    assert_eq!(txn.token(b), None, "a refused upgrade takes nothing");
    assert_eq!(txn.held().len(), 2);
    txn.commit().expect("one unlock per key releases them");
    let mut probe = s.client().expect("probe");
    assert_eq!(free(&mut probe, &[a, b, c]), vec![true; 3]);
}

#[test]
fn a_key_below_one_already_held_is_never_waited_for() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let mut blocker = s.client().expect("blocker");
    let (low, high) = (RowGroup::new(10, 5), RowGroup::new(10, 10));
    let id = blocker
        .get_lock(LockKind::Rw, &low.lock_name())
        .expect("get_lock");
    let _ = blocker
        .trylock(id, Mode::Exclusive, 1_000)
        .expect("blocker locks");
    let mut txn = rg.begin();
    txn.acquire(&[(high, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .expect("high");
    let t = Instant::now();
    assert_eq!(
        txn.acquire(&[(low, Mode::Exclusive)], AcquireOptions::wait(WAIT)),
        Err(Status::Fail)
    );
    assert!(t.elapsed() < WAIT / 2, "refused without waiting");
}

#[test]
fn dropping_a_transaction_releases_its_keys() {
    let s = server(5_000);
    let mut rg = locks(&s, 5_000);
    let mut probe = s.client().expect("probe");
    let ks = keys(11, 0..40);
    {
        let mut txn = rg.begin();
        txn.acquire(&all(&ks, Mode::Exclusive), AcquireOptions::NO_WAIT)
            .expect("acquire");
        assert_eq!(free(&mut probe, &ks), vec![false; 40]);
    }
    assert_eq!(free(&mut probe, &ks), vec![true; 40]);
}

#[test]
fn the_name_cache_stays_within_its_bound() {
    let s = server(5_000);
    let cfg = RowGroupConfig::DEFAULT.with_names_max(31);
    let mut rg = RowGroupLocks::new(s.client().expect("client"), cfg).expect("config");
    for round in 0..6 {
        let ks = keys(12, round * 20..round * 20 + 20);
        let mut txn = rg.begin();
        txn.acquire(&all(&ks, Mode::Exclusive), AcquireOptions::NO_WAIT)
            .expect("acquire");
        txn.commit().expect("commit");
        assert!(
            rg.cached_names() <= 31,
            "{} names cached",
            rg.cached_names()
        );
    }
}
