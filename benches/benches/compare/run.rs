//! The workloads, the ways Redis's clients are driven, and the harness that drives a workload
//! against one server with a thread per client: `clients` threads,
//! each with its own connection, start together behind a barrier, run operations until a shared
//! deadline, and stop together behind a second barrier, so the elapsed time and the server's CPU
//! time cover the measured operations and neither connecting nor disconnecting.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::servers::Server;

/// The Redis side's pause between `SET NX` attempts on a held lock (a retry loop).
pub const RETRY_SLEEP: Duration = Duration::from_millis(1);
/// Lease of every lock taken, on both sides (`PX 5000`).
pub const EXPIRE_MS: u32 = 5_000;
/// Keys in a batch: the reference's batch limit.
pub const BATCH_KEYS: usize = 31;

/// The same work, done on both servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Lock and unlock a key of the client's own (no contention): two round trips each.
    Cycle,
    /// Fetch-and-add on one shared counter (`atomic64_faa` vs `INCR`).
    Faa,
    /// Lock 31 keys of the client's own, then unlock them: one batch each way vs a pipeline of 31
    /// `SET NX PX`, then a pipeline of 31 compare-and-delete `EVALSHA`s.
    Batch,
    /// The same 31 keys all-or-nothing: an all-or-nothing batch vs a Lua script that sets all 31
    /// or none, then a batch unlock vs a Lua script that deletes those still holding the token.
    BatchAon,
    /// Every client on one key, blocking: the server's wait queue vs `SET NX PX` retried every
    /// [`RETRY_SLEEP`]. One operation is one acquisition and its release.
    Handoff,
    /// [`Workload::Cycle`] with dlock's clients as futures driven by one thread
    /// (`Client::lock_async`), against the same Redis clients (a thread each).
    CycleAsync,
    /// [`Workload::Faa`] with dlock's clients as futures on one thread
    /// (`Client::atomic64_faa_async`).
    FaaAsync,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::Cycle,
        Workload::CycleAsync,
        Workload::Faa,
        Workload::FaaAsync,
        Workload::Batch,
        Workload::BatchAon,
        Workload::Handoff,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Cycle => "lock+unlock",
            Workload::Faa => "faa/incr",
            Workload::Batch => "batch31",
            Workload::BatchAon => "batch31-aon",
            Workload::Handoff => "hand-off",
            Workload::CycleAsync => "lock+unlock/async",
            Workload::FaaAsync => "faa/async",
        }
    }

    /// The workload itself, whatever drives dlock's clients (Redis runs this one: its drivings
    /// are chosen apart, with `--redis`).
    pub fn base(self) -> Workload {
        match self {
            Workload::CycleAsync => Workload::Cycle,
            Workload::FaaAsync => Workload::Faa,
            w => w,
        }
    }

    /// The round trips one operation of a dlock client thread makes, each ending in a wait for
    /// its reply (`floor.rs`); `None` for futures, which wait on no thread, and for the
    /// hand-off, whose waits are the lock's queue.
    pub fn round_trips(self) -> Option<u32> {
        match self {
            Workload::Cycle | Workload::Batch | Workload::BatchAon => Some(2),
            Workload::Faa => Some(1),
            Workload::Handoff | Workload::CycleAsync | Workload::FaaAsync => None,
        }
    }

    /// Whether dlock's clients are futures on one thread rather than a thread each.
    pub fn is_async(self) -> bool {
        self != self.base()
    }
}

/// How the Redis side's clients are driven: each driving runs every workload, and every row of
/// the comparison holds the Redis figures of each driving asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driving {
    /// A thread per client, each with its own blocking connection (`redis_side`).
    Threads,
    /// Every client a task of one current-thread tokio runtime, all sharing one redis-rs
    /// `MultiplexedConnection` (`redis_async`): how Rust services commonly use Redis.
    AsyncMux,
    /// Every client a task of one current-thread tokio runtime with a redis-rs connection of its
    /// own (`redis_async`).
    AsyncOwn,
}

impl Driving {
    pub const ALL: [Driving; 3] = [Driving::Threads, Driving::AsyncMux, Driving::AsyncOwn];

    /// The name `--redis` takes and the table and plot show.
    pub fn name(self) -> &'static str {
        match self {
            Driving::Threads => "threads",
            Driving::AsyncMux => "async-mux",
            Driving::AsyncOwn => "async-own",
        }
    }

    /// What the name means, for the run's header.
    pub fn describe(self) -> &'static str {
        match self {
            Driving::Threads => "a thread and a blocking connection per client",
            Driving::AsyncMux => "redis-rs tasks on one tokio thread, one shared connection",
            Driving::AsyncOwn => "redis-rs tasks on one tokio thread, a connection each",
        }
    }
}

/// One client's operations: [`Worker::op`] does one and says whether it completed (a blocking
/// acquisition that ran out of time did not); the harness times it.
pub trait Worker {
    fn op(&mut self, deadline: Instant) -> Result<bool, String>;
    /// Disconnects, after the measurement.
    fn finish(self: Box<Self>);
}

/// What the clients of one run share.
#[derive(Debug)]
pub struct Shared {
    /// The client that last acquired the hot key (`usize::MAX`: none yet).
    last_owner: AtomicUsize,
    /// Acquisitions of the hot key by a client other than the previous holder.
    handoffs: AtomicU64,
}

impl Shared {
    /// Client `me` has acquired the hot key: counts a hand-off if someone else held it last.
    pub fn acquired(&self, me: usize) {
        // Relaxed: a statistic; the lock itself orders the holders.
        if self.last_owner.swap(me, Ordering::Relaxed) != me {
            self.handoffs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Acquisitions of the hot key by a client other than the previous holder, so far.
    pub fn handoffs(&self) -> u64 {
        // Relaxed: read after the clients have stopped (joined), which orders their counts.
        self.handoffs.load(Ordering::Relaxed)
    }
}

/// One workload at one client count against one server.
#[derive(Debug)]
pub struct Cell {
    pub ops: u64,
    pub secs: f64,
    /// Per-operation latency, ns.
    pub hist: Histogram<u64>,
    /// The server's CPU seconds (user + system) over the measurement.
    pub server_cpu_s: f64,
    /// The clients' CPU seconds over the measurement: this process's, which runs nothing else
    /// meanwhile (every thread of the client library included: a `Mux`'s, a runtime's).
    pub client_cpu_s: f64,
    pub handoffs: u64,
}

impl Cell {
    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    pub fn p_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }

    pub fn cpu_us_per_op(&self) -> f64 {
        self.server_cpu_s * 1e6 / self.ops.max(1) as f64
    }

    pub fn client_cpu_us_per_op(&self) -> f64 {
        self.client_cpu_s * 1e6 / self.ops.max(1) as f64
    }
}

/// This process's CPU seconds so far (user + system, every thread): the clients' side of a
/// cell, the servers being processes of their own.
pub fn process_cpu_s() -> f64 {
    cpu_s(libc::RUSAGE_SELF)
}

pub use dlock_benches::cpu_s;

/// Runs `clients` workers made by `make(client, shared)` for `duration` against `server`.
pub fn measure<'s, F>(
    server: &Server,
    clients: usize,
    duration: Duration,
    shared: &'s Shared,
    make: F,
) -> Result<Cell, String>
where
    F: Fn(usize, &'s Shared) -> Result<Box<dyn Worker + 's>, String> + Sync,
{
    let start = Barrier::new(clients + 1);
    let stop = Barrier::new(clients + 1);
    let (results, secs, server_cpu_s, client_cpu_s) = thread::scope(|sc| {
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let (start, stop, make) = (&start, &stop, &make);
                sc.spawn(move || {
                    // Every thread reaches both barriers, failed or not, so none waits forever.
                    let worker = make(i, shared);
                    start.wait();
                    let deadline = Instant::now() + duration;
                    let mut hist = Histogram::<u64>::new(3).expect("3 significant digits");
                    let mut ops = 0;
                    let r = worker.and_then(|mut w| {
                        // Bounded by the deadline: each operation is bounded by the reply
                        // timeouts and by `deadline` itself.
                        while Instant::now() < deadline {
                            let t = Instant::now();
                            if w.op(deadline)? {
                                let _ = hist.record(t.elapsed().as_nanos() as u64);
                                ops += 1;
                            }
                        }
                        Ok(w)
                    });
                    stop.wait();
                    r.map(|w| {
                        w.finish();
                        (hist, ops)
                    })
                })
            })
            .collect();
        start.wait();
        let (t0, cpu0, mine0) = (Instant::now(), server.cpu_s(), process_cpu_s());
        stop.wait();
        let mine = process_cpu_s() - mine0;
        let (secs, cpu) = (t0.elapsed().as_secs_f64(), server.cpu_s() - cpu0);
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a client panicked".into())))
            .collect();
        (results, secs, cpu, mine)
    });
    let mut hist = Histogram::<u64>::new(3).expect("3 significant digits");
    let mut ops = 0;
    for r in results {
        let (h, n) = r?;
        hist.add(h).map_err(|e| e.to_string())?;
        ops += n;
    }
    Ok(Cell {
        ops,
        secs,
        hist,
        server_cpu_s,
        client_cpu_s,
        handoffs: shared.handoffs(),
    })
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            last_owner: AtomicUsize::new(usize::MAX),
            handoffs: AtomicU64::new(0),
        }
    }
}
