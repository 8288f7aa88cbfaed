//! `dlock bench`: a workload (trylock, contended, batch or fetch-and-add) driven by client
//! threads against a server, with throughput and latency percentiles.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Error};
use dlock_transport::runtime::{ServerConfig, ServerHandle};

use crate::{ClientTlsArgs, reason};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mix {
    /// Trylock + unlock of a private key per client (no contention).
    Trylock,
    /// Blocking lock + unlock on a few shared keys (contention and hand-offs).
    Contended,
    /// 31-key batch trylock + batch unlock.
    Batch,
    /// Fetch-and-add on one shared object (XID allocation).
    Faa,
}

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// Start a server in this process and use the shared-memory transport.
    #[arg(long, conflicts_with = "connect")]
    embedded: bool,
    /// A server's TCP address.
    #[arg(long)]
    connect: Option<SocketAddr>,
    #[command(flatten)]
    tls: ClientTlsArgs,
    /// The operation mix.
    #[arg(long, value_enum, default_value = "trylock")]
    mix: Mix,
    /// Client threads.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Keys (locks) to spread the load over.
    #[arg(long, default_value_t = 64)]
    keys: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Batch mix: batches each client keeps in flight (1: synchronous; up to 4, see
    /// `Client::submit_trylock`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=4))]
    depth: u8,
}

pub(crate) fn bench(args: BenchArgs) -> Result<(), String> {
    let (server, endpoint) = match (args.embedded, args.connect) {
        (_, Some(addr)) => (None, args.tls.endpoint(addr)?),
        (_, None) => {
            let s = ServerHandle::start(ServerConfig::new(Config::default()))
                .map_err(|e| e.to_string())?;
            let e = Endpoint::embedded(&s);
            (Some(s), e)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    let done = AtomicU64::new(0);
    let bar = indicatif::ProgressBar::new(args.duration);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:30}] {msg}")
            .map_err(|e| e.to_string())?,
    );
    let start = Instant::now();
    let hist = std::thread::scope(|sc| -> Result<hdrhistogram::Histogram<u64>, String> {
        let workers: Vec<_> = (0..args.clients)
            .map(|i| {
                let (endpoint, done) = (endpoint.clone(), &done);
                sc.spawn(move || {
                    worker(
                        i, &endpoint, args.mix, args.depth, args.keys, deadline, done,
                    )
                })
            })
            .collect();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            let ops = done.load(Ordering::Relaxed);
            bar.set_position(start.elapsed().as_secs());
            bar.set_message(format!(
                "{:.2} M ops/s",
                ops as f64 / start.elapsed().as_secs_f64() / 1e6
            ));
        }
        let mut total = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        for w in workers {
            let h = w.join().map_err(|_| "a worker panicked".to_string())??;
            total.add(h).map_err(|e| e.to_string())?;
        }
        Ok(total)
    })?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let ops = done.load(Ordering::Relaxed);
    println!(
        "{:?} over {}: {} clients, {} keys, {:.1} s",
        args.mix,
        if server.is_some() {
            "shared memory (embedded)"
        } else {
            "TCP"
        },
        args.clients,
        args.keys,
        secs
    );
    println!(
        "throughput  {:.3} M lock operations/s ({ops} operations)",
        ops as f64 / secs / 1e6
    );
    println!(
        "latency     p50 {:.2} µs   p99 {:.2} µs   p99.9 {:.2} µs   max {:.2} µs (per request; a batch is one)",
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
        hist.value_at_quantile(0.999) as f64 / 1e3,
        hist.max() as f64 / 1e3
    );
    if let Some(s) = server {
        s.stop();
    }
    Ok(())
}

/// One benchmark client: runs `mix` until `deadline`, recording each request's latency (ns).
fn worker(
    i: usize,
    endpoint: &Endpoint,
    mix: Mix,
    depth: u8,
    keys: usize,
    deadline: Instant,
    done: &AtomicU64,
) -> Result<hdrhistogram::Histogram<u64>, String> {
    let mut h = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let mut c = Client::connect(ClientConfig::new(endpoint.clone()))
        .map_err(|e| format!("connect: {}", reason(&e)))?;
    let err = |e: Error| reason(&e);
    match mix {
        Mix::Trylock => {
            let id = c
                .get_lock(
                    LockKind::Atomic,
                    format!("bench-{i}-{}", i % keys.max(1)).as_bytes(),
                )
                .map_err(err)?;
            while Instant::now() < deadline {
                let t = Instant::now();
                // The benchmark writes nothing the token would fence.
                let _grant = c.trylock(id, Mode::Exclusive, 5_000).map_err(err)?;
                let _unlocked = c.unlock(id).map_err(err)?;
                let _ = h.record(t.elapsed().as_nanos() as u64 / 2);
                done.fetch_add(2, Ordering::Relaxed);
            }
        }
        Mix::Contended => {
            let ids: Vec<_> = (0..keys.clamp(1, 4))
                .map(|k| c.get_lock(LockKind::Rw, format!("hot-{k}").as_bytes()))
                .collect::<Result<_, _>>()
                .map_err(err)?;
            let mut k = i;
            while Instant::now() < deadline {
                let id = ids[k % ids.len()];
                k += 1;
                let t = Instant::now();
                match c.lock(id, Mode::Exclusive, 5_000, Duration::from_millis(500)) {
                    Ok(_) => {
                        let _ = h.record(t.elapsed().as_nanos() as u64);
                        let _unlocked = c.unlock(id).map_err(err)?;
                        done.fetch_add(2, Ordering::Relaxed);
                    }
                    Err(e) if e == Status::Etimeout => {}
                    Err(e) => return Err(reason(&e)),
                }
            }
        }
        Mix::Batch => {
            // One set of 31 locks per batch in flight, each alternating trylock and unlock.
            let depth = usize::from(depth).min(c.pipeline_depth());
            let mut sets = Vec::with_capacity(depth);
            for set in 0..depth {
                let names: Vec<String> = (0..31).map(|k| format!("batch-{i}-{set}-{k}")).collect();
                let req: Vec<(LockKind, &[u8])> = names
                    .iter()
                    .map(|n| (LockKind::Atomic, n.as_bytes()))
                    .collect();
                let ids: Vec<_> = c
                    .batch_get_lock(&req)
                    .map_err(err)?
                    .into_iter()
                    .collect::<Result<_, Status>>()
                    .map_err(|s| s.to_string())?;
                let reqs: Vec<_> = ids.iter().map(|&id| (id, Mode::Exclusive, 5_000)).collect();
                sets.push((ids, reqs));
            }
            let mut out = vec![Err(Status::Einval); 31];
            // In flight, oldest first: (set, whether it is a trylock, when it was submitted).
            let mut flight = std::collections::VecDeque::with_capacity(depth);
            for (set, (_, reqs)) in sets.iter().enumerate() {
                c.submit_trylock(reqs, false).map_err(err)?;
                flight.push_back((set, true, Instant::now()));
            }
            while let Some((set, locked, at)) = flight.pop_front() {
                c.complete(&mut out).map_err(err)?;
                let _ = h.record(at.elapsed().as_nanos() as u64);
                if let Some(r) = out.iter().find(|r| r.is_err()) {
                    return Err(format!("batch entry: {r:?}"));
                }
                done.fetch_add(31, Ordering::Relaxed);
                if Instant::now() >= deadline && !locked {
                    continue;
                }
                let (ids, reqs) = &sets[set];
                if locked {
                    c.submit_unlock(ids).map_err(err)?;
                } else {
                    c.submit_trylock(reqs, false).map_err(err)?;
                }
                flight.push_back((set, !locked, Instant::now()));
            }
        }
        Mix::Faa => {
            let _ = c.atomic64_create(b"bench-xid", 1, 3_600);
            let id = c.atomic64_get(b"bench-xid", 3_600).map_err(err)?;
            while Instant::now() < deadline {
                let t = Instant::now();
                c.atomic64_faa(id, 1).map_err(err)?;
                let _ = h.record(t.elapsed().as_nanos() as u64);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let _ = c.deinit();
    Ok(h)
}
