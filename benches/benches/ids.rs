//! Transaction ids and CSNs, each beside an in-process `AtomicU64::fetch_add` measured in the
//! same run with the same number of threads:
//!
//! - leased transaction ids (`TxnIdHandle::next`, one handle per thread, one shared allocator);
//! - per-request fetch-and-add over shared memory without leasing (`Client::atomic64_faa`, one
//!   client per thread, one counter);
//! - CSNs through the coalescing front (`CsnAllocator::next`, threads sharing one client);
//! - over TCP: a fetch-and-add per round trip from one client, beside CSNs from 8 threads that
//!   share one client (and so share round trips).
//!
//! Run: `cargo bench -p dlock-benches --bench ids` (add `-- quick` for a short run). Figures are
//! medians of per-sample rates; a sample's rate is the operations of all its threads over the
//! slowest thread's time. Targets: ≥ 100 M leased ids/s, ≥ 10 M fetch-and-adds/s over shared
//! memory.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlock_core::Config;
use dlock_engine_glue::{CsnAllocator, EmbeddedServer, IdConfig, TxnIdAllocator, Volatile};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::TcpConfig;

/// The baseline's counter on a cache line of its own, as the region's object cells are.
#[repr(align(128))]
struct Padded(AtomicU64);

fn server(tcp: bool) -> EmbeddedServer {
    let mut cfg = EmbeddedServer::config(Config {
        locks_max: 64,
        clients_max: 64,
        objects_max: 16,
        ..Config::default()
    });
    if tcp {
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    }
    EmbeddedServer::start(cfg).expect("server starts")
}

/// Runs `op` `ops` times on each of `threads` threads (each with its own state from `setup`),
/// `samples` times; returns the median rate in operations per second.
fn rate<S: Send>(
    samples: usize,
    threads: usize,
    ops: u64,
    mut setup: impl FnMut() -> S,
    op: impl Fn(&mut S) + Sync,
) -> f64 {
    let mut rates: Vec<f64> = (0..samples)
        .map(|_| {
            let states: Vec<S> = (0..threads).map(|_| setup()).collect();
            let start = Barrier::new(threads);
            let slowest = thread::scope(|scope| {
                let workers: Vec<_> = states
                    .into_iter()
                    .map(|mut state| {
                        let (start, op) = (&start, &op);
                        scope.spawn(move || {
                            start.wait();
                            let t = Instant::now();
                            for _ in 0..ops {
                                op(&mut state);
                            }
                            t.elapsed()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|w| w.join().expect("worker"))
                    .max()
                    .unwrap_or(Duration::ZERO)
            });
            (threads as u64 * ops) as f64 / slowest.as_secs_f64()
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Runs `work` while a thread calls `keep` every 200 ms, as an engine's timer would: one-sided
/// fetch-and-adds never reach the server, and an allocator idle while other figures are measured
/// would outlive its client lease.
fn keep_alive_while(keep: impl Fn() + Sync, work: impl FnOnce()) {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                keep();
                thread::sleep(Duration::from_millis(200));
            }
        });
        work();
        stop.store(true, Ordering::Release);
    });
}

fn report(name: &str, rate: f64, baseline: f64) {
    println!(
        "{name:<52} {:>10.3} M/s   {:>7.3} × baseline",
        rate / 1e6,
        rate / baseline
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let samples = if quick { 3 } else { 11 };
    // Operations per thread per sample, sized for samples of roughly 10 to 100 ms.
    let scale = if quick { 10 } else { 1 };
    let (local_ops, shm_ops, tcp_ops) = (20_000_000 / scale, 500_000 / scale, 2_000 / scale);

    let s = server(false);
    let xids = TxnIdAllocator::open(s.client().expect("client"), IdConfig::txn_ids(), Volatile)
        .expect("xid allocator");
    let csns = CsnAllocator::open(s.client().expect("client"), IdConfig::csns(), Volatile)
        .expect("csn allocator");
    let faa_client = || {
        let mut c = s.client().expect("client");
        let id = c.atomic64_get(b"csn", 30).expect("object");
        (c, id)
    };

    println!("median of {samples} samples; baseline: AtomicU64::fetch_add in-process");
    let keep = || {
        xids.keep_alive().expect("xid keep-alive");
        csns.keep_alive().expect("csn keep-alive");
    };
    keep_alive_while(keep, || {
        for threads in [1, 2] {
            let counter = Padded(AtomicU64::new(0));
            let baseline = rate(
                samples,
                threads,
                local_ops,
                || (),
                |()| {
                    // Relaxed: only the count matters; this is the cheapest correct id source.
                    black_box(counter.0.fetch_add(1, Ordering::Relaxed));
                },
            );
            report(
                &format!("baseline fetch_add, {threads} thread(s)"),
                baseline,
                baseline,
            );
            let leased = rate(
                samples,
                threads,
                local_ops,
                || xids.handle(),
                |h| {
                    black_box(h.next().expect("id"));
                },
            );
            report(
                &format!("leased txn ids, {threads} thread(s)"),
                leased,
                baseline,
            );
            let faa = rate(samples, threads, shm_ops, faa_client, |(c, id)| {
                black_box(c.atomic64_faa(*id, 1).expect("faa"));
            });
            report(
                &format!("shm fetch-and-add per request, {threads} client(s)"),
                faa,
                baseline,
            );
            let csn = rate(
                samples,
                threads,
                shm_ops,
                || (),
                |()| {
                    black_box(csns.next().expect("csn"));
                },
            );
            report(
                &format!("shm CSN next, {threads} thread(s), one client"),
                csn,
                baseline,
            );
        }
    });
    let st = xids.stats();
    println!(
        "  txn ids: {} round trips for {} ids reserved; CSNs: {} round trips for {} requests",
        st.round_trips,
        st.values_reserved,
        csns.stats().round_trips,
        csns.stats().requests
    );
    s.shutdown();

    let s = server(true);
    let addr = s.tcp_addr().expect("tcp listener");
    let tcp_client = || Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).expect("client");
    let csns = CsnAllocator::open(tcp_client(), IdConfig::csns(), Volatile).expect("csn");
    let per_request = rate(
        samples,
        1,
        tcp_ops,
        || {
            let mut c = tcp_client();
            let id = c.atomic64_get(b"csn", 30).expect("object");
            (c, id)
        },
        |(c, id)| {
            black_box(c.atomic64_faa(*id, 1).expect("faa"));
        },
    );
    report(
        "tcp fetch-and-add per request, 1 client",
        per_request,
        per_request,
    );
    let coalesced = rate(
        samples,
        8,
        tcp_ops,
        || (),
        |()| {
            black_box(csns.next().expect("csn"));
        },
    );
    report(
        "tcp CSN next, 8 threads, one client",
        coalesced,
        per_request,
    );
    let st = csns.stats();
    println!(
        "  tcp CSNs: {} round trips for {} requests (largest batch {})",
        st.round_trips, st.requests, st.batch_max
    );
    s.shutdown();
}
