//! An engine workload on cached row-group locks (issue 19's "Measure"): N engine clients, three
//! over TCP and one over shared memory, run transactions that each lock five row groups (three
//! read, two written, all or nothing), with row-group caching off and on, once with 90 % of each
//! client's keys in a range of its own (the affinity a partitioned engine has; only that range is
//! cached) and once with no affinity (every key drawn from the whole table, every key cached, so
//! every lock is contended). Each run starts a fresh server, whose keys all start never fought
//! over, so the same clients first run a warm-up (1 s, 0.5 s with `quick`) before the counters
//! and the clock start: the figures are the steady state's, and the cold start is printed
//! beside them rather than mixed in (`warm tx/s`, and `warm holds`, the warm-up's requests that
//! met a minimum hold: with one, every key's first cached grant keeps it, since no conflict
//! on the key has shown it is wanted yet, `manager::contention::hold_ms`). Each run reports
//! transactions per second (per transport too) and the server's data messages per transaction
//! (lock, unlock, give-back and downgrade messages: nothing else is sent), the revokes it sent,
//! the waits it parked (each slice of a sliced wait counts) and the requests that met a
//! conflicting cached grant inside its minimum hold (`holds/tx`, the server's
//! `min_hold_conflicts`) per transaction, and each client thread's own CPU time per
//! transaction it tried (µs, `RUSAGE_THREAD`, per transport: robust to a shared machine where
//! a rate is not; so are the counts). Off and on runs alternate, three of each, and the median
//! is printed: the machine this runs on is shared and noisy.
//!
//! Beside it, in the same run, the revoke round trip — a conflicting request, the cached holder
//! told by an event, its give-back, the grant to the waiter — against a plain hand-off — the
//! holder's unlock, the parked waiter granted — over shared memory and TCP.
//!
//! Run: `cargo bench -p dlock-benches --bench engine` (`-- quick` for a short run,
//! `-- min-hold=N` for a server minimum hold of N ms instead of the default,
//! `-- contention-window=N` for contention-aware grants with a window of N ms instead of the
//! default 1,000, 0 turning them off).
//! `-- profile=on` or `profile=off` runs the no-affinity workload alone, once, for a profiler.
//! Each "on" line gives its ratio to the "off" line above it, and the load average is printed
//! before and after the workloads. A custom harness: the quantities are throughputs of several
//! threads and latencies of a two-client exchange, which a per-iteration harness does not
//! measure.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use dlock_benches::{cpu_s, quantiles};
use dlock_core::manager::Timing;
use dlock_core::proto::Event;
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_engine_glue::EmbeddedServer;
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};
use dlock_transport::client::{Client, ClientConfig, Endpoint, read_server_stats};
use dlock_transport::runtime::TcpConfig;

/// Tables and row groups per table: 256 keys, so transactions collide now and then.
const TABLES: u32 = 4;
const GROUPS: u64 = 64;
/// Engine clients over TCP; one more runs over shared memory.
const TCP_CLIENTS: usize = 3;
/// How long an acquisition waits before the transaction aborts.
const WAIT: Duration = Duration::from_millis(50);
/// Runs of each workload, off and on alternating; the median is reported.
const REPEATS: usize = 3;
/// A grant's lease.
const EXPIRE_MS: u32 = 10_000;

/// A tiny deterministic generator per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    Shm,
}

fn server(timing: Timing) -> EmbeddedServer {
    let core = Config {
        locks_max: 8_192,
        clients_max: 64,
        objects_max: 16,
        timing,
        ..Config::default()
    };
    let mut cfg = EmbeddedServer::config(core);
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    EmbeddedServer::start(cfg).expect("server starts")
}

fn client(s: &EmbeddedServer, t: Transport) -> Client {
    let endpoint = match t {
        Transport::Shm => s.endpoint(),
        Transport::Tcp => Endpoint::Tcp(s.tcp_addr().expect("tcp listener")),
    };
    Client::connect(ClientConfig::new(endpoint)).expect("connect")
}

/// The server's data messages, revokes sent, waits parked, and requests that met a minimum
/// hold (`min_hold_conflicts`) so far.
fn counters(s: &EmbeddedServer) -> [u64; 4] {
    let stats = read_server_stats(&s.endpoint(), Duration::from_secs(5)).expect("stats");
    let get = |name| {
        stats
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |&(_, v)| v)
    };
    [
        get("data_messages"),
        get("revokes_sent"),
        get("waits"),
        get("min_hold_conflicts"),
    ]
}

/// What one engine client did in one phase of a run: committed and aborted transactions, and
/// the CPU seconds its thread spent (user + system, `RUSAGE_THREAD`): unlike a rate, the
/// client's own cost per transaction does not move with what the machine's other users do.
type Phase = (u64, u64, f64);

/// One engine client: its row-group locks and its key generator.
struct EngineClient {
    locks: RowGroupLocks,
    rng: Rng,
    w: usize,
    own: u64,
    affinity: bool,
}

impl EngineClient {
    fn new(
        s: &EmbeddedServer,
        t: Transport,
        w: usize,
        workers: usize,
        cached: bool,
        affinity: bool,
    ) -> Self {
        let cfg = RowGroupConfig::DEFAULT.with_cached(cached);
        let mut locks = RowGroupLocks::new(client(s, t), cfg).expect("row-group locks");
        let own = GROUPS / workers as u64;
        let range = w as u64 * own..(w as u64 + 1) * own;
        if affinity {
            locks.set_cache_filter(move |k| range.contains(&k.group));
        }
        let rng = Rng(0x9E37_79B9 ^ ((w as u64 + 1) * 0x1234_5678_9ABC));
        EngineClient {
            locks,
            rng,
            w,
            own,
            affinity,
        }
    }

    /// Runs transactions until `deadline`.
    fn run(&mut self, deadline: Instant) -> Phase {
        let (w, own, affinity) = (self.w as u64, self.own, self.affinity);
        let (mut committed, mut aborted) = (0, 0);
        let cpu0 = cpu_s(libc::RUSAGE_THREAD);
        while Instant::now() < deadline {
            let mut keys = [(RowGroup::new(0, 0), Mode::Shared); 5];
            for (i, k) in keys.iter_mut().enumerate() {
                let group = if affinity && !self.rng.next().is_multiple_of(10) {
                    w * own + self.rng.next() % own
                } else {
                    self.rng.next() % GROUPS
                };
                let key = RowGroup::new(self.rng.next() as u32 % TABLES, group);
                *k = (key, if i < 3 { Mode::Shared } else { Mode::Exclusive });
            }
            self.locks.keep_leases(Instant::now()).expect("leases");
            let mut txn = self.locks.begin();
            match txn.acquire(&keys, AcquireOptions::wait(WAIT).all_or_nothing()) {
                Ok(()) => {
                    txn.commit().expect("commit");
                    committed += 1;
                }
                Err(Status::Etimeout | Status::Fail | Status::Einval) => {
                    txn.abort().expect("abort");
                    aborted += 1;
                }
                Err(e) => panic!("acquire: {e}"),
            }
        }
        (committed, aborted, cpu_s(libc::RUSAGE_THREAD) - cpu0)
    }
}

/// One workload run's figures, in steady state (after the warm-up) unless named cold.
#[derive(Clone, Copy)]
struct Run {
    /// Committed transactions per second over TCP, over shared memory, and all.
    tcp: f64,
    shm: f64,
    all: f64,
    /// Per transaction tried: data messages, revokes sent, waits parked, and requests that met
    /// a minimum hold.
    msgs: f64,
    revokes: f64,
    waits: f64,
    holds: f64,
    /// Requests that met a minimum hold (a count: one in a whole run is below what `holds`
    /// prints).
    hold_count: u64,
    /// The share of transactions aborted.
    aborted: f64,
    /// Client CPU µs per transaction tried, over TCP and over shared memory.
    cpu_tcp: f64,
    cpu_shm: f64,
    /// The warm-up: committed transactions per second (all), and the requests that met a
    /// minimum hold (a count).
    cold_all: f64,
    cold_holds: u64,
}

/// One workload run on a fresh server: the same clients first run for `warm_secs` (the cold
/// start: every key starts never fought over), then stop together while the counters are
/// read, then run for `secs`, whose figures are the steady state.
fn workload(timing: Timing, cached: bool, affinity: bool, warm_secs: f64, secs: f64) -> Run {
    let s = server(timing);
    let workers = TCP_CLIENTS + 1;
    let at_start = counters(&s);
    // Every client and this thread meet twice between the phases: once when the warm-up is
    // over (no transaction in flight), once when the counters have been read.
    let turn = Barrier::new(workers + 1);
    let warm_until = Instant::now() + Duration::from_secs_f64(warm_secs);
    let warm_start = Instant::now();
    let (results, warmed, start, warm_elapsed) = thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let t = if w < TCP_CLIENTS {
                    Transport::Tcp
                } else {
                    Transport::Shm
                };
                let (s, turn) = (&s, &turn);
                let h = scope.spawn(move || {
                    // A client that panics in the warm-up still meets the others at both turns
                    // (or they would wait there for ever), then passes its panic on to the join.
                    let warmed = panic::catch_unwind(AssertUnwindSafe(|| {
                        let mut c = EngineClient::new(s, t, w, workers, cached, affinity);
                        let cold = c.run(warm_until);
                        (c, cold)
                    }));
                    turn.wait();
                    turn.wait();
                    let (mut c, cold) = warmed.unwrap_or_else(|p| panic::resume_unwind(p));
                    let steady = c.run(Instant::now() + Duration::from_secs_f64(secs));
                    (cold, steady)
                });
                (t, h)
            })
            .collect();
        turn.wait();
        let warm_elapsed = warm_start.elapsed().as_secs_f64();
        let warmed = panic::catch_unwind(AssertUnwindSafe(|| counters(&s)));
        turn.wait();
        let warmed = warmed.unwrap_or_else(|p| panic::resume_unwind(p));
        let start = Instant::now();
        let results: Vec<(Transport, (Phase, Phase))> = handles
            .into_iter()
            .map(|(t, h)| (t, h.join().expect("engine client")))
            .collect();
        (results, warmed, start, warm_elapsed)
    });
    let elapsed = start.elapsed().as_secs_f64();
    let after = counters(&s);
    let [messages, revokes, waits, holds] = [0, 1, 2, 3].map(|i| after[i] - warmed[i]);
    s.shutdown();
    let steady = |t: Transport| {
        results
            .iter()
            .filter(move |(x, _)| *x == t)
            .map(|(_, r)| r.1)
    };
    let committed = |t: Transport| steady(t).map(|(c, _, _)| c).sum::<u64>();
    let (tcp, shm) = (committed(Transport::Tcp), committed(Transport::Shm));
    let aborted: u64 = results.iter().map(|(_, r)| r.1.1).sum();
    let done = (tcp + shm + aborted).max(1) as f64;
    // Client CPU per transaction tried (committed or aborted: an abort costs the client too).
    let cpu_us = |t: Transport| {
        let (cpu, tried) = steady(t).fold((0.0, 0), |(cpu, n), (c, a, s)| (cpu + s, n + c + a));
        cpu * 1e6 / tried.max(1) as f64
    };
    let cold_committed: u64 = results.iter().map(|(_, r)| r.0.0).sum();
    Run {
        tcp: tcp as f64 / elapsed,
        shm: shm as f64 / elapsed,
        all: (tcp + shm) as f64 / elapsed,
        msgs: messages as f64 / done,
        revokes: revokes as f64 / done,
        waits: waits as f64 / done,
        holds: holds as f64 / done,
        hold_count: holds,
        aborted: aborted as f64 / done,
        cpu_tcp: cpu_us(Transport::Tcp),
        cpu_shm: cpu_us(Transport::Shm),
        cold_all: cold_committed as f64 / warm_elapsed,
        cold_holds: warmed[3] - at_start[3],
    }
}

/// Spins on `c`'s events until a revoke arrives.
fn await_revoke(c: &mut Client) {
    loop {
        let mut revoked = false;
        c.poll_events(|e| revoked |= matches!(e, Event::Revoke { .. }))
            .expect("poll");
        if revoked {
            return;
        }
        std::hint::spin_loop();
    }
}

/// Revoke round trips and plain hand-offs over `t`, `rounds` of each, alternated: their
/// medians and p99s in µs, `[revoke p50, revoke p99, hand-off p50, hand-off p99]`. The
/// contention window is off here: every round conflicts on one lock, which would otherwise be
/// granted plain after the first, and this measures the revoke itself.
fn round_trips(t: Transport, timing: Timing, rounds: usize) -> [f64; 4] {
    let s = server(Timing {
        contention_window_ms: 0,
        ..timing
    });
    let hold = Duration::from_millis(u64::from(timing.min_hold_ms));
    let (mut a, mut b) = (client(&s, t), client(&s, t));
    let name = b"engine-bench-hot";
    let ia = a.get_lock(LockKind::Rw, name).expect("get_lock");
    let ib = b.get_lock(LockKind::Rw, name).expect("get_lock");
    // The waiter's thread: told to start, it notes the time, takes the lock (waiting), notes
    // the time it got it, and gives it back.
    let base = Instant::now();
    let (asked_at, granted_at) = (AtomicU64::new(0), AtomicU64::new(0));
    let (go, started) = mpsc::channel::<()>();
    let (done, finished) = mpsc::channel::<()>();
    let (mut revokes, mut handoffs) = (Vec::new(), Vec::new());
    thread::scope(|scope| {
        let (asked_at, granted_at) = (&asked_at, &granted_at);
        scope.spawn(move || {
            while started.recv().is_ok() {
                asked_at.store(base.elapsed().as_nanos() as u64, Ordering::Release);
                let g = b.lock(ib, Mode::Exclusive, EXPIRE_MS, Duration::from_secs(5));
                granted_at.store(base.elapsed().as_nanos() as u64, Ordering::Release);
                assert_eq!(g.expect("waiter").status, Status::Success);
                assert_eq!(b.unlock(ib).expect("waiter unlock"), Status::Success);
                done.send(()).expect("report");
            }
        });
        for _ in 0..rounds {
            // Revoke: the cached holder is past its hold; the request goes out, the holder is
            // told, gives back, the waiter is granted.
            a.set_cacheable(ia, true).expect("cacheable");
            let g = a.lock(ia, Mode::Exclusive, EXPIRE_MS, Duration::from_secs(5));
            // Cached, not made plain: a plain grant would be asked back by no revoke, and the
            // round would measure nothing (the window is off, so this holds every round).
            let g = g.expect("holder");
            assert_eq!((g.status, g.plain), (Status::Success, false), "cached");
            thread::sleep(hold + Duration::from_millis(1));
            go.send(()).expect("start");
            await_revoke(&mut a);
            assert_eq!(a.unlock(ia).expect("give back"), Status::Success);
            finished.recv().expect("waiter");
            // From the waiter's request, not from `go`: its thread's wake-up is not the
            // protocol's.
            revokes.push(granted_at.load(Ordering::Acquire) - asked_at.load(Ordering::Acquire));
            // Hand-off: a plain holder, a parked waiter, the unlock, the grant.
            a.set_cacheable(ia, false).expect("plain");
            let g = a.lock(ia, Mode::Exclusive, EXPIRE_MS, Duration::from_secs(5));
            assert_eq!(g.expect("holder").status, Status::Success);
            go.send(()).expect("start");
            // Long enough for the waiter's request to be parked on the server.
            thread::sleep(Duration::from_millis(2));
            let unlocked = base.elapsed().as_nanos() as u64;
            assert_eq!(a.unlock(ia).expect("unlock"), Status::Success);
            finished.recv().expect("waiter");
            handoffs.push(granted_at.load(Ordering::Acquire) - unlocked);
        }
        drop(go);
    });
    s.shutdown();
    let (r, h) = (quantiles(&mut revokes), quantiles(&mut handoffs));
    [r.0, r.1, h.0, h.1]
}

/// The machine's load averages (`/proc/loadavg`'s first three fields), printed beside the
/// figures: the machine this runs on is shared, and a ratio means little without its load.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

/// `profile=on|off`: the no-affinity workload alone, caching on or off, run once, so that a
/// profiler attached to the whole process (`perf record`) sees one path and not both mixed.
fn profile(timing: Timing, cached: bool, warm_secs: f64, secs: f64) {
    let r = workload(timing, cached, false, warm_secs, secs * 3.0);
    println!(
        "no affinity, caching {}: tx/s {:.0} (TCP {:.0}, shm {:.0}), msgs/tx {:.2}, revokes/tx \
         {:.3}, waits/tx {:.3}, hold-waits/tx {:.4} ({}), client CPU µs/tx TCP {:.1} shm {:.1}; \
         warm-up tx/s {:.0}, hold-waits {}",
        if cached { "on" } else { "off" },
        r.all,
        r.tcp,
        r.shm,
        r.msgs,
        r.revokes,
        r.waits,
        r.holds,
        r.hold_count,
        r.cpu_tcp,
        r.cpu_shm,
        r.cold_all,
        r.cold_holds,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "quick");
    let ms = |key: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(key))
            .map(|v| v.parse::<u32>().expect("a number of ms"))
    };
    let d = Timing::DEFAULT;
    let timing = Timing {
        min_hold_ms: ms("min-hold=").unwrap_or(d.min_hold_ms),
        contention_window_ms: ms("contention-window=").unwrap_or(d.contention_window_ms),
        ..d
    };
    let (warm_secs, secs, rounds) = if quick {
        (0.5, 1.0, 50)
    } else {
        (1.0, 3.0, 300)
    };
    if let Some(caching) = args.iter().find_map(|a| a.strip_prefix("profile=")) {
        return profile(timing, caching == "on", warm_secs, secs);
    }
    println!(
        "engine workload: {TCP_CLIENTS} clients over TCP + 1 over shared memory, 5 row groups \
         per transaction (3 read, 2 written, all or nothing, wait {} ms), {} keys, \
         min hold {} ms, contention window {} ms, median of {REPEATS} runs of {secs} s after a \
         {warm_secs}-s warm-up, off and on alternating; load average {}",
        WAIT.as_millis(),
        u64::from(TABLES) * GROUPS,
        timing.min_hold_ms,
        timing.contention_window_ms,
        load_average(),
    );
    println!(
        "{:<12} {:<9} {:>10} {:>10} {:>10} {:>9} {:>10} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>9} {:>10} {:>10}",
        "affinity",
        "caching",
        "tx/s all",
        "tx/s TCP",
        "tx/s shm",
        "msgs/tx",
        "revokes/tx",
        "waits/tx",
        "aborted",
        "on/off",
        "cpu TCP",
        "cpu shm",
        "holds/tx",
        "holds",
        "warm tx/s",
        "warm holds"
    );
    for affinity in [true, false] {
        // Off and on alternate, `REPEATS` runs each, and each line is the run with the median
        // total: the machine's noise then falls on both alike.
        let mut runs = [Vec::new(), Vec::new()];
        for _ in 0..REPEATS {
            for cached in [false, true] {
                let run = workload(timing, cached, affinity, warm_secs, secs);
                runs[usize::from(cached)].push(run);
            }
        }
        let mut off_all = 0.0;
        for cached in [false, true] {
            let r = &mut runs[usize::from(cached)];
            r.sort_by(|a, b| a.all.total_cmp(&b.all));
            let r = r[r.len() / 2];
            let ratio = match cached {
                false => {
                    off_all = r.all;
                    String::new()
                }
                true => format!("{:.2}", r.all / f64::max(off_all, f64::MIN_POSITIVE)),
            };
            println!(
                "{:<12} {:<9} {:>10.0} {:>10.0} {:>10.0} {:>9.2} {:>10.3} {:>8.3} {:>7.1}% {ratio:>7} {:>8.1} {:>8.1} {:>8.4} {:>9} {:>10.0} {:>10}",
                if affinity { "90 % own" } else { "none" },
                if cached { "on" } else { "off" },
                r.all,
                r.tcp,
                r.shm,
                r.msgs,
                r.revokes,
                r.waits,
                r.aborted * 100.0,
                r.cpu_tcp,
                r.cpu_shm,
                r.holds,
                r.hold_count,
                r.cold_all,
                r.cold_holds,
            );
        }
    }
    println!("load average after the workloads: {}", load_average());
    println!(
        "revoke round trip (request -> holder told -> give-back -> grant) vs plain hand-off (unlock -> grant), µs"
    );
    for (t, label) in [(Transport::Shm, "shared memory"), (Transport::Tcp, "TCP")] {
        let [rp50, rp99, hp50, hp99] = round_trips(t, timing, rounds);
        println!(
            "{label:<14} revoke p50 {rp50:>8.1} p99 {rp99:>8.1}   hand-off p50 {hp50:>8.1} p99 {hp99:>8.1}"
        );
    }
}
