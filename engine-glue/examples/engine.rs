//! An engine simulation: worker threads run transactions against an embedded dlock server —
//! take a transaction id, lock a few row groups (shared reads, exclusive writes), "write" with the
//! fencing tokens, commit with a CSN, release — and print transactions/s, XIDs/s, lock
//! latency percentiles and lock messages per transaction.
//!
//! Each worker draws 90 % of its row groups from a range of its own (the affinity a
//! partitioned engine has) and the rest from anywhere. Row-group grants are cached between
//! transactions (`RowGroupConfig::with_cached`) unless the third argument is `uncached`:
//! cached, a worker's next transaction takes the row groups it kept with no message, and a
//! worker that wants one another keeps gets it by a revoke.
//!
//! Run: `cargo run --release -p dlock-engine-glue --example engine -- [workers] [seconds]
//! [cached|uncached]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::{Config, Mode, Status};
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};
use dlock_engine_glue::{CsnAllocator, EmbeddedServer, IdConfig, TxnIdAllocator, Volatile};

/// Tables and row groups per table: small enough that transactions collide now and then.
const TABLES: u32 = 4;
const GROUPS: u64 = 64;

/// A tiny deterministic generator per worker (no shared state, no allocation).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let workers: usize = args.next().map_or(Ok(4), |a| a.parse())?;
    let seconds: u64 = args.next().map_or(Ok(5), |a| a.parse())?;
    let cached = match args.next().as_deref() {
        None | Some("cached") => true,
        Some("uncached") => false,
        Some(other) => return Err(format!("cached or uncached, not {other}").into()),
    };
    let core = Config {
        locks_max: 8_192,
        clients_max: 64,
        objects_max: 16,
        ..Config::default()
    };
    let server = EmbeddedServer::start(EmbeddedServer::config(core))?;
    let status = |s: Status| -> Box<dyn std::error::Error> { s.to_string().into() };
    let xids =
        TxnIdAllocator::open(server.client()?, IdConfig::txn_ids(), Volatile).map_err(status)?;
    let csns =
        Arc::new(CsnAllocator::open(server.client()?, IdConfig::csns(), Volatile).map_err(status)?);
    let (committed, aborted, ids_taken) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let messages = |server: &EmbeddedServer| -> Result<u64, Box<dyn std::error::Error>> {
        let stats = dlock_engine_glue::dlock_transport::client::read_server_stats(
            &server.endpoint(),
            Duration::from_secs(5),
        )?;
        Ok(stats
            .iter()
            .find(|(n, _)| *n == "data_messages")
            .map_or(0, |&(_, v)| v))
    };
    let messages_before = messages(&server)?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let mut lock_latency = std::thread::scope(
        |s| -> Result<Vec<u64>, Box<dyn std::error::Error + Send + Sync>> {
            let threads: Vec<_> = (0..workers)
                .map(|w| {
                    let (server, csns, mut xid) = (&server, Arc::clone(&csns), xids.handle());
                    let (committed, aborted, ids_taken) = (&committed, &aborted, &ids_taken);
                    s.spawn(move || -> Result<Vec<u64>, String> {
                        let client = server.client().map_err(|s| s.to_string())?;
                        let cfg = RowGroupConfig::DEFAULT.with_cached(cached);
                        let mut locks =
                            RowGroupLocks::new(client, cfg).map_err(|s| s.to_string())?;
                        // This worker's own range of row groups, the one it caches.
                        let own = GROUPS / workers.max(1) as u64;
                        let range = w as u64 * own..(w as u64 + 1) * own;
                        locks.set_cache_filter(move |k| range.contains(&k.group));
                        let mut rng = Rng(0x9E37_79B9 ^ ((w as u64 + 1) * 0x1234_5678_9ABC));
                        let mut latency = Vec::with_capacity(1 << 16);
                        while Instant::now() < deadline {
                            let _txn_id = xid.next().map_err(|s| s.to_string())?;
                            ids_taken.fetch_add(1, Ordering::Relaxed);
                            let _read_csn = csns.snapshot().map_err(|s| s.to_string())?;
                            // Read three row groups, write two.
                            let mut keys = [(RowGroup::new(0, 0), Mode::Shared); 5];
                            for (i, k) in keys.iter_mut().enumerate() {
                                let group = if !rng.next().is_multiple_of(10) && own > 0 {
                                    w as u64 * own + rng.next() % own
                                } else {
                                    rng.next() % GROUPS
                                };
                                let key = RowGroup::new(rng.next() as u32 % TABLES, group);
                                *k = (key, if i < 3 { Mode::Shared } else { Mode::Exclusive });
                            }
                            locks
                                .keep_leases(Instant::now())
                                .map_err(|s| s.to_string())?;
                            let mut txn = locks.begin();
                            let t = Instant::now();
                            let got = txn.acquire(
                                &keys,
                                AcquireOptions::wait(Duration::from_millis(50)).all_or_nothing(),
                            );
                            latency.push(t.elapsed().as_nanos() as u64);
                            match got {
                                Ok(()) => {
                                    // Storage writes would carry these tokens.
                                    let tokens: u64 = keys
                                        .iter()
                                        .filter_map(|(k, _)| txn.token(*k))
                                        .map(|t| t.0 & 1)
                                        .sum();
                                    std::hint::black_box(tokens);
                                    let _commit_csn = csns.next().map_err(|s| s.to_string())?;
                                    txn.commit().map_err(|s| s.to_string())?;
                                    committed.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(Status::Etimeout | Status::Fail | Status::Einval) => {
                                    txn.abort().map_err(|s| s.to_string())?;
                                    aborted.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(s) => return Err(s.to_string()),
                            }
                        }
                        Ok(latency)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in threads {
                all.extend(t.join().map_err(|_| "a worker panicked")??);
            }
            Ok(all)
        },
    )
    .map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    let lock_messages = messages(&server)?.saturating_sub(messages_before);
    lock_latency.sort_unstable();
    let pct = |q: f64| {
        lock_latency
            .get(((lock_latency.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1e3
    };
    let (c, a) = (
        committed.load(Ordering::Relaxed),
        aborted.load(Ordering::Relaxed),
    );
    println!(
        "{workers} workers, {secs:.1} s, embedded server over shared memory, row groups {}",
        if cached { "cached" } else { "uncached" }
    );
    println!(
        "transactions  {:.0}/s committed ({c} committed, {a} aborted on conflict)",
        c as f64 / secs
    );
    println!(
        "XIDs          {:.0}/s handed out (leased blocks: {} round trips)",
        ids_taken.load(Ordering::Relaxed) as f64 / secs,
        xids.stats().round_trips
    );
    println!(
        "row-group locks (5 keys per transaction): p50 {:.1} µs  p99 {:.1} µs  p99.9 {:.1} µs",
        pct(0.5),
        pct(0.99),
        pct(0.999)
    );
    // Every data message of the run: lock, unlock and give-back messages, and the XID and CSN
    // allocators' (a snapshot and a commit CSN per transaction).
    println!(
        "data messages {:.1} per transaction",
        lock_messages as f64 / (c + a).max(1) as f64
    );
    server.shutdown();
    Ok(())
}
