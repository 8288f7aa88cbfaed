//! A transaction's row-group lock set of 31 keys: acquire + release through `RowGroupLocks`
//! (one `batch_trylock`, one `batch_unlock`), beside the same 31 exclusive locks taken and let go
//! one round trip at a time (31 `trylock` + 31 `unlock`, the baseline), and beside the two raw
//! batch messages alone (the floor the glue adds to). All three run interleaved in the same run,
//! over the embedded server's shared memory, once with `IdleStrategy::Spin` and once with
//! `Adaptive`.
//!
//! Run: `cargo bench -p dlock-benches --bench rowgroup` (add `-- quick` for a short run).
//! Latencies are per transaction (all 31 keys taken and released), median and p99 of individual
//! samples; this is a custom harness because a mean-of-batches harness hides the tail.

use std::time::Instant;

use dlock_benches::quantiles;
use dlock_core::config::BATCH_MAX;
use dlock_core::{Config, LockId, LockKind, Mode, Status};
use dlock_engine_glue::EmbeddedServer;
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};
use dlock_transport::client::{Client, Grant};
use dlock_transport::runtime::IdleStrategy;

/// Keys per transaction: one batch.
const KEYS: usize = BATCH_MAX;

fn server(idle: IdleStrategy) -> EmbeddedServer {
    let mut cfg = EmbeddedServer::config(Config {
        locks_max: 4_096,
        clients_max: 16,
        objects_max: 16,
        ..Config::default()
    });
    cfg.idle = idle;
    EmbeddedServer::start(cfg).expect("server starts")
}

/// Median and p99 of `samples` (ns), in µs.
fn ids(c: &mut Client, table: u32) -> Vec<LockId> {
    (0..KEYS as u64)
        .map(|g| {
            let name = RowGroup::new(table, g).lock_name();
            c.get_lock(LockKind::Rw, &name).expect("get_lock")
        })
        .collect()
}

/// One transaction through the glue.
fn set(rg: &mut RowGroupLocks, requests: &[(RowGroup, Mode)]) -> u64 {
    let t = Instant::now();
    let mut txn = rg.begin();
    txn.acquire(requests, AcquireOptions::NO_WAIT)
        .expect("uncontended");
    txn.commit().expect("commit");
    t.elapsed().as_nanos() as u64
}

/// The baseline: 31 single trylocks, then 31 single unlocks.
fn singles(c: &mut Client, ids: &[LockId]) -> u64 {
    let t = Instant::now();
    for &id in ids {
        let _ = c.trylock(id, Mode::Exclusive, 5_000).expect("trylock");
    }
    for &id in ids {
        assert_eq!(c.unlock(id).map_err(Status::from), Ok(Status::Success));
    }
    t.elapsed().as_nanos() as u64
}

/// The floor: the two batch messages the glue sends, without the glue.
fn raw_batches(c: &mut Client, ids: &[LockId], out: &mut [Result<Grant, Status>]) -> u64 {
    let requests: [(LockId, Mode, u32); KEYS] =
        std::array::from_fn(|i| (ids[i], Mode::Exclusive, 5_000));
    let t = Instant::now();
    c.batch_trylock(&requests, false, out).expect("batch");
    c.batch_unlock(ids, out).expect("batch");
    let ns = t.elapsed().as_nanos() as u64;
    assert!(out.iter().all(Result::is_ok));
    ns
}

fn run(idle: IdleStrategy, n: usize) {
    let s = server(idle);
    let mut rg =
        RowGroupLocks::new(s.client().expect("client"), RowGroupConfig::DEFAULT).expect("config");
    let requests: Vec<_> = (0..KEYS as u64)
        .map(|g| (RowGroup::new(1, g), Mode::Exclusive))
        .collect();
    let mut single = s.client().expect("client");
    let single_ids = ids(&mut single, 2);
    let mut raw = s.client().expect("client");
    let raw_ids = ids(&mut raw, 3);
    let mut out = vec![Err(Status::Einval); KEYS];
    let (mut a, mut b, mut c) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    // Warm up (names resolved, caches hot), then interleave so noise hits all three alike.
    for i in 0..n / 10 + n {
        let (x, y, z) = (
            set(&mut rg, &requests),
            singles(&mut single, &single_ids),
            raw_batches(&mut raw, &raw_ids, &mut out),
        );
        if i >= n / 10 {
            a.push(x);
            b.push(y);
            c.push(z);
        }
    }
    let (set_p50, set_p99) = quantiles(&mut a);
    let (one_p50, one_p99) = quantiles(&mut b);
    let (raw_p50, raw_p99) = quantiles(&mut c);
    println!("idle = {idle:?}, {KEYS} exclusive keys per transaction, n = {n}:");
    println!("  RowGroupLocks acquire+commit        p50 {set_p50:>8.2} µs  p99 {set_p99:>8.2} µs");
    println!("  31 trylock + 31 unlock (baseline)   p50 {one_p50:>8.2} µs  p99 {one_p99:>8.2} µs");
    println!("  raw batch_trylock + batch_unlock    p50 {raw_p50:>8.2} µs  p99 {raw_p99:>8.2} µs");
    println!(
        "  baseline / RowGroupLocks: {:.1}x at p50; RowGroupLocks / raw batches: {:.2}x at p50",
        one_p50 / set_p50,
        set_p50 / raw_p50
    );
    s.shutdown();
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let n = if quick { 1_000 } else { 10_000 };
    run(IdleStrategy::Spin, n);
    run(IdleStrategy::Adaptive, n);
}
