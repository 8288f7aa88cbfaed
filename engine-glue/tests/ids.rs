//! Transaction ids and CSNs against an embedded server over shared memory: uniqueness and order
//! under threads, linearizability of CSNs and snapshots, coalescing, adaptive leases, and a
//! server restart restored from the high-water mark.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use dlock_engine_glue::dlock_core::{Config, Status};
use dlock_engine_glue::{
    BlockPolicy, CsnAllocator, EmbeddedServer, HighWaterMark, IdConfig, TxnIdAllocator, Volatile,
};

fn server_with(core: Config) -> EmbeddedServer {
    EmbeddedServer::start(EmbeddedServer::config(core)).expect("server starts")
}

fn server() -> EmbeddedServer {
    server_with(Config {
        locks_max: 64,
        clients_max: 32,
        objects_max: 16,
        ..Config::default()
    })
}

/// A mark kept in memory, standing in for the engine's WAL; remembers every mark persisted.
#[derive(Debug, Default)]
struct StoredMark {
    mark: AtomicU64,
    history: Mutex<Vec<u64>>,
}

impl HighWaterMark for StoredMark {
    fn restore(&self) -> Result<u64, Status> {
        Ok(self.mark.load(Ordering::Acquire))
    }

    fn persist(&self, mark: u64) -> Result<(), Status> {
        self.history.lock().unwrap().push(mark);
        self.mark.store(mark, Ordering::Release);
        Ok(())
    }
}

fn xids(server: &EmbeddedServer, hwm: impl HighWaterMark + 'static) -> TxnIdAllocator {
    TxnIdAllocator::open(server.client().unwrap(), IdConfig::txn_ids(), hwm).unwrap()
}

fn csns(server: &EmbeddedServer, hwm: impl HighWaterMark + 'static) -> CsnAllocator {
    CsnAllocator::open(server.client().unwrap(), IdConfig::csns(), hwm).unwrap()
}

fn assert_all_distinct(mut values: Vec<u64>) {
    let n = values.len();
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len(), n, "a value was handed out twice");
}

#[test]
fn txn_ids_unique_across_clients_and_increasing_per_handle_8_threads_x_100k() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 100_000;
    let s = server();
    // Two allocators (two clients) on one counter, four worker threads each.
    let allocators = [xids(&s, Volatile), xids(&s, Volatile)];
    let all: Vec<u64> = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let mut h = allocators[t % 2].handle();
                scope.spawn(move || {
                    let mut ids = Vec::with_capacity(PER_THREAD);
                    for _ in 0..PER_THREAD {
                        let id = h.next().unwrap().0;
                        assert!(ids.last().is_none_or(|&last| id > last), "handle went back");
                        ids.push(id);
                    }
                    ids
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(all.len(), THREADS * PER_THREAD);
    assert_all_distinct(all);
    for a in &allocators {
        let st = a.stats();
        assert!(st.values_reserved >= (THREADS / 2 * PER_THREAD) as u64);
        assert!(st.round_trips * BlockPolicy::DEFAULT.len_min <= st.values_reserved);
    }
}

/// One call as the clock saw it: it started after tick `start` and returned before tick `end`.
#[derive(Clone, Copy, Debug)]
struct Call {
    start: u64,
    end: u64,
    snapshot: bool,
    value: u64,
}

/// 2 allocators (clients) × 2 threads, each making `per_thread` calls, every 4th a snapshot.
fn record_csn_calls(per_thread: usize) -> Vec<Call> {
    let s = server();
    let allocators = [csns(&s, Volatile), csns(&s, Volatile)];
    // A call whose `end` tick precedes another's `start` tick returned before that one began:
    // both ticks are read-modify-writes of one atomic (AcqRel, so the earlier call's effects
    // happen-before the later call's start).
    let clock = AtomicU64::new(0);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (csn, clock) = (&allocators[t % 2], &clock);
                scope.spawn(move || {
                    let mut calls = Vec::with_capacity(per_thread);
                    for i in 0..per_thread {
                        let snapshot = i % 4 == 3;
                        let start = clock.fetch_add(1, Ordering::AcqRel);
                        let value = if snapshot { csn.snapshot() } else { csn.next() };
                        let end = clock.fetch_add(1, Ordering::AcqRel);
                        let value = value.unwrap().0;
                        calls.push(Call {
                            start,
                            end,
                            snapshot,
                            value,
                        });
                    }
                    calls
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

/// For each call in `later`, the largest value among `earlier` calls that ended before it began.
fn max_ended_before(earlier: &[Call], later: &[Call]) -> Vec<(Call, Option<u64>)> {
    let mut by_end: Vec<Call> = earlier.to_vec();
    by_end.sort_unstable_by_key(|c| c.end);
    let mut prefix_max = Vec::with_capacity(by_end.len());
    let mut max = 0;
    for c in &by_end {
        max = max.max(c.value);
        prefix_max.push(max);
    }
    later
        .iter()
        .map(|&c| {
            let n = by_end.partition_point(|e| e.end < c.start);
            (c, n.checked_sub(1).map(|i| prefix_max[i]))
        })
        .collect()
}

#[test]
fn csn_next_increases_in_happens_before_order_across_threads() {
    let calls = record_csn_calls(20_000);
    let nexts: Vec<Call> = calls.iter().copied().filter(|c| !c.snapshot).collect();
    assert_all_distinct(nexts.iter().map(|c| c.value).collect());
    let mut checked = 0;
    for (call, earlier) in max_ended_before(&nexts, &nexts) {
        if let Some(earlier) = earlier {
            assert!(
                call.value > earlier,
                "{call:?} not above an earlier CSN {earlier}"
            );
            checked += 1;
        }
    }
    assert!(
        checked > nexts.len() / 2,
        "too few ordered pairs to prove anything"
    );
}

#[test]
fn snapshot_is_at_least_every_earlier_csn_and_below_every_later_one() {
    let calls = record_csn_calls(20_000);
    let (snaps, nexts): (Vec<Call>, Vec<Call>) = calls.iter().partition(|c| c.snapshot);
    for (snap, earlier) in max_ended_before(&nexts, &snaps) {
        assert!(
            earlier.is_none_or(|e| snap.value >= e),
            "{snap:?} misses CSN {earlier:?}"
        );
    }
    for (next, earlier) in max_ended_before(&snaps, &nexts) {
        assert!(
            earlier.is_none_or(|s| next.value > s),
            "{next:?} not above snapshot {earlier:?}"
        );
    }
}

#[test]
fn snapshot_of_a_fresh_counter_is_below_the_first_csn() {
    let s = server();
    let csn = csns(&s, Volatile);
    assert_eq!(csn.snapshot().unwrap().0, 0);
    assert_eq!(csn.next().unwrap().0, 1);
    assert_eq!(csn.snapshot().unwrap().0, 1);
    assert_eq!(csn.next().unwrap().0, 2);
    assert_eq!(csn.next().unwrap().0, 3);
    assert_eq!(csn.snapshot().unwrap().0, 3);
}

/// A mark store whose first persist blocks until `open` is called: it holds the first round trip
/// in flight for as long as a test needs.
#[derive(Debug, Default)]
struct Gate {
    calls: AtomicU64,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl HighWaterMark for Gate {
    fn restore(&self) -> Result<u64, Status> {
        Ok(0)
    }

    fn persist(&self, _mark: u64) -> Result<(), Status> {
        self.calls.fetch_add(1, Ordering::AcqRel);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        Ok(())
    }
}

fn wait_until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
    panic!("condition not reached within 10 s");
}

#[test]
fn csn_requests_during_a_round_trip_share_the_next_one() {
    const FOLLOWERS: u64 = 7;
    let s = server();
    let gate = Arc::new(Gate::default());
    let csn = csns(&s, Arc::clone(&gate));
    let (first, mut rest) = thread::scope(|scope| {
        let leader = scope.spawn(|| csn.next().unwrap().0);
        wait_until(|| gate.calls.load(Ordering::Acquire) == 1);
        let followers: Vec<_> = (0..FOLLOWERS)
            .map(|_| scope.spawn(|| csn.next().unwrap().0))
            .collect();
        wait_until(|| csn.stats().requests == 1 + FOLLOWERS);
        gate.open();
        let rest: Vec<u64> = followers.into_iter().map(|f| f.join().unwrap()).collect();
        (leader.join().unwrap(), rest)
    });
    let st = csn.stats();
    assert_eq!((st.requests, st.round_trips), (1 + FOLLOWERS, 2));
    assert_eq!(st.batch_max, FOLLOWERS);
    assert_eq!(first, 1);
    rest.sort_unstable();
    assert_eq!(
        rest,
        (2..2 + FOLLOWERS).collect::<Vec<_>>(),
        "one fetch-and-add of 7"
    );
}

#[test]
fn txn_id_refills_during_a_round_trip_share_the_next_one() {
    let s = server();
    let gate = Arc::new(Gate::default());
    let alloc = xids(&s, Arc::clone(&gate));
    let len = BlockPolicy::DEFAULT.len_min;
    let mut lead_handle = alloc.handle();
    let follower_handles: Vec<_> = (0..3).map(|_| alloc.handle()).collect();
    let firsts = thread::scope(|scope| {
        let leader = scope.spawn(move || lead_handle.next().unwrap().0);
        wait_until(|| gate.calls.load(Ordering::Acquire) == 1);
        let followers: Vec<_> = follower_handles
            .into_iter()
            .map(|mut h| scope.spawn(move || h.next().unwrap().0))
            .collect();
        wait_until(|| alloc.stats().requests == 4);
        gate.open();
        let mut firsts = vec![leader.join().unwrap()];
        firsts.extend(followers.into_iter().map(|f| f.join().unwrap()));
        firsts
    });
    let st = alloc.stats();
    assert_eq!((st.requests, st.round_trips, st.batch_max), (4, 2, 3));
    assert_eq!(st.values_reserved, 4 * len);
    let mut follower_blocks = firsts[1..].to_vec();
    follower_blocks.sort_unstable();
    assert_eq!(follower_blocks, [1 + len, 1 + 2 * len, 1 + 3 * len]);
}

#[test]
fn restart_with_high_water_mark_never_repeats_a_value() {
    let step = 1_000;
    let xid_cfg = IdConfig {
        hwm_step: step,
        ..IdConfig::txn_ids()
    };
    let csn_cfg = IdConfig {
        hwm_step: step,
        ..IdConfig::csns()
    };
    let (xid_mark, csn_mark) = (
        Arc::new(StoredMark::default()),
        Arc::new(StoredMark::default()),
    );
    let run = |s: &EmbeddedServer| {
        let x = TxnIdAllocator::open(s.client().unwrap(), xid_cfg.clone(), Arc::clone(&xid_mark));
        let c = CsnAllocator::open(s.client().unwrap(), csn_cfg.clone(), Arc::clone(&csn_mark));
        let (x, c) = (x.unwrap(), c.unwrap());
        let mut handles = [x.handle(), x.handle()];
        let ids: Vec<u64> = (0..10_000)
            .map(|i| handles[i % 2].next().unwrap().0)
            .collect();
        let cs: Vec<u64> = (0..3_000).map(|_| c.next().unwrap().0).collect();
        // Returned with the allocators: a crashed engine's allocators are never told either.
        (ids, cs, x, c, handles)
    };

    let first = server();
    let (old_ids, old_csns, old_x, old_c, old_handles) = run(&first);
    for (mark, old) in [(&xid_mark, &old_ids), (&csn_mark, &old_csns)] {
        let history = mark.history.lock().unwrap().clone();
        assert!(
            history.iter().all(|m| m % step == 0),
            "marks not in steps: {history:?}"
        );
        assert!(
            history.windows(2).all(|w| w[0] < w[1]),
            "marks went back: {history:?}"
        );
        assert!(mark.restore().unwrap() > *old.iter().max().unwrap());
    }
    // The server fails; its state (the counters) is gone. A new one starts empty.
    first.shutdown();
    let second = server();
    let (new_ids, new_csns, ..) = run(&second);

    for (mark_before, old, new) in [
        (old_x.stats().mark, &old_ids, &new_ids),
        (old_c.stats().mark, &old_csns, &new_csns),
    ] {
        assert!(
            *new.iter().min().unwrap() >= mark_before,
            "restored below the mark"
        );
        assert!(
            new.iter().min() > old.iter().max(),
            "a new value is not above the old"
        );
        assert_all_distinct(old.iter().chain(new).copied().collect());
    }
    // Without the hook a restarted counter starts over and repeats values, which is the failure
    // the mark prevents.
    let third = server();
    assert_eq!(xids(&third, Volatile).handle().next().unwrap().0, 1);
    drop((old_x, old_c, old_handles));
}

#[test]
fn block_policy_doubles_when_fast_halves_when_slow_within_bounds() {
    let p = BlockPolicy::DEFAULT;
    assert_eq!(p.next_len(64, 10), 128);
    assert_eq!(p.next_len(1 << 20, 10), 1 << 20, "capped at len_max");
    assert_eq!(
        p.next_len(4_096, 5_000),
        4_096,
        "kept between the thresholds"
    );
    assert_eq!(p.next_len(4_096, 200_000), 2_048);
    assert_eq!(p.next_len(64, 200_000), 64, "floored at len_min");
}

#[test]
fn block_len_grows_under_demand_up_to_the_max() {
    let s = server();
    let cfg = IdConfig {
        block: BlockPolicy {
            len_max: 4_096,
            ..BlockPolicy::DEFAULT
        },
        ..IdConfig::txn_ids()
    };
    let alloc = TxnIdAllocator::open(s.client().unwrap(), cfg, Volatile).unwrap();
    let mut h = alloc.handle();
    assert_eq!(h.block_len(), 64);
    let mut largest = 0;
    for _ in 0..100_000 {
        h.next().unwrap();
        largest = largest.max(h.block_len());
    }
    assert_eq!(largest, 4_096);
    // 100,000 ids in blocks of 64 would take 1,563 round trips.
    assert!(alloc.stats().round_trips < 200, "{:?}", alloc.stats());
}

#[test]
fn open_moves_an_existing_counter_forward_only() {
    let s = server();
    let a = xids(&s, Volatile);
    let mut ha = a.handle();
    assert_eq!(ha.next().unwrap().0, 1);
    // The counter is at 65 (one block of 64 leased). A mark below it does not move it back...
    let low = StoredMark::default();
    low.mark.store(5, Ordering::Release);
    assert_eq!(xids(&s, low).handle().next().unwrap().0, 65);
    // ...a mark above it moves it forward, for every client of the counter.
    let high = StoredMark::default();
    high.mark.store(1_000_000, Ordering::Release);
    assert_eq!(xids(&s, high).handle().next().unwrap().0, 1_000_000);
    assert_eq!(ha.leased(), 63, "the first handle keeps its lease");
    for _ in 0..63 {
        ha.next().unwrap();
    }
    assert!(ha.next().unwrap().0 > 1_000_000);
}

#[test]
fn invalid_config_is_refused() {
    let bad = [
        IdConfig::named(b""),
        IdConfig {
            first: 0,
            ..IdConfig::csns()
        },
        IdConfig {
            hwm_step: 0,
            ..IdConfig::csns()
        },
        IdConfig {
            renew_every: Duration::from_secs(30),
            ..IdConfig::csns()
        },
        IdConfig {
            block: BlockPolicy {
                len_min: 128,
                len_max: 64,
                ..BlockPolicy::DEFAULT
            },
            ..IdConfig::txn_ids()
        },
    ];
    for cfg in bad {
        assert_eq!(cfg.validate(), Err(Status::Einval), "{cfg:?}");
    }
    assert_eq!(IdConfig::txn_ids().validate(), Ok(()));
    let s = server();
    let refused = CsnAllocator::open(s.client().unwrap(), IdConfig::named(b""), Volatile);
    assert_eq!(refused.err(), Some(Status::Einval));
}

#[test]
fn keep_alive_holds_an_idle_allocator_past_the_client_lease() {
    let s = server_with(Config {
        locks_max: 64,
        clients_max: 32,
        objects_max: 16,
        client_lease_ms: 400,
        ..Config::default()
    });
    let cfg = IdConfig {
        renew_every: Duration::from_millis(20),
        ..IdConfig::csns()
    };
    let kept = CsnAllocator::open(s.client().unwrap(), cfg.clone(), Volatile).unwrap();
    let idle = CsnAllocator::open(s.client().unwrap(), cfg, Volatile).unwrap();
    kept.next().unwrap();
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(40));
        kept.keep_alive().unwrap();
    }
    // 800 ms without a word from `idle`, twice its lease: the server declared its client dead,
    // while `kept` renewed every 40 ms.
    assert_eq!(idle.keep_alive(), Err(Status::ClientNotInit));
    assert!(kept.next().unwrap().0 > 1);
}
