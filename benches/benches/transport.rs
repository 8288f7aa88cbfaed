//! Round trips through a running server, each beside its floor measured in the same run:
//!
//! - `shm`: single-command round trip (p50/p99) beside a raw cache-line ping-pong between two
//!   threads;
//! - `batch`: 31-command batch round trips and throughput beside a raw echo of a message of the
//!   same size through shared memory;
//! - `pipeline`: the same batches with four in flight (`Client::submit_trylock`/`complete`);
//! - `tcp`: trylock+unlock round trip (p50/p99) at 1, 16 and 64 clients beside a raw TCP echo of
//!   the same frame size;
//! - `tls`: the same at 1 and 64 clients with TLS off and on, alternated, so the cost of TLS
//!   (mutual authentication, TLS_AES_256_GCM_SHA384) is a difference measured in one run;
//! - `hand-off`: from a holder's unlock to the parked waiter's grant, beside the same hand-off
//!   through a relay thread with nothing but atomics.
//!
//! Run: `cargo bench -p dlock-benches --bench transport` (add `-- quick` for a short run, and
//! section names to run only those, e.g. `-- quick batch hand-off`).
//! Latencies come from HDR histograms of individual round trips; this is a custom harness
//! because a mean-of-batches harness hides the tail.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlock_core::proto::{Command, DATA_MESSAGE_MAX, LockOp};
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{AsyncOp, Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{IdleStrategy, ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::TlsConfig;
use hdrhistogram::Histogram;

fn hist() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits")
}

fn report(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<44} p50 {:>8.2} µs  p99 {:>8.2} µs  p99.9 {:>8.2} µs  (n = {})",
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.value_at_quantile(0.999) as f64 / 1e3,
        h.len()
    );
}

/// Pins the calling thread to `cpu` (best effort: the figures say whether it took).
fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is the empty set; `cpu` is far below its capacity (1,024);
    // sched_setaffinity reads `size_of` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

fn server(tcp: bool, idle: IdleStrategy) -> ServerHandle {
    server_pinned(tcp, idle, None)
}

/// Capacities for every server these benchmarks start.
fn capacities() -> Config {
    Config {
        locks_max: 4_096,
        clients_max: 128,
        objects_max: 64,
        // Every client of the benchmark comes from 127.0.0.1: one peer, which may fill the table.
        clients_per_peer_max: 128,
        ..Config::default()
    }
}

fn server_pinned(tcp: bool, idle: IdleStrategy, data_cpu: Option<usize>) -> ServerHandle {
    server_with(tcp, idle, data_cpu, None)
}

fn server_with(
    tcp: bool,
    idle: IdleStrategy,
    data_cpu: Option<usize>,
    tls: Option<&Pki>,
) -> ServerHandle {
    let mut cfg = ServerConfig::new(capacities());
    cfg.idle = idle;
    cfg.pin.1 = data_cpu;
    if tcp {
        let mut t = TcpConfig::new("127.0.0.1:0".parse().expect("address"));
        t.tls = tls.map(Pki::server);
        cfg.tcp = Some(t);
    }
    ServerHandle::start(cfg).expect("server starts")
}

#[path = "../../transport/tests/common/certs.rs"]
mod certs;

/// Throwaway certificates: a CA, the server's for 127.0.0.1, one client's.
struct Pki {
    _dir: certs::TempDir,
    ca: certs::Ca,
    server: certs::Leaf,
    client: certs::Leaf,
}

impl Pki {
    fn new() -> Self {
        let dir = certs::TempDir::new("bench");
        let ca = certs::Ca::new(&dir, "ca");
        let server = ca.server(&dir, "server");
        let client = ca.client(&dir, "client", "bench");
        Pki {
            _dir: dir,
            ca,
            server,
            client,
        }
    }
    fn server(&self) -> TlsConfig {
        TlsConfig::new(&self.server.cert, &self.server.key, &self.ca.cert)
    }
    fn endpoint(&self, addr: std::net::SocketAddr) -> Endpoint {
        let cfg = TlsConfig::new(&self.client.cert, &self.client.key, &self.ca.cert);
        Endpoint::tls(addr, &cfg).expect("client TLS")
    }
}

/// Two threads bounce a value through one cache line: the floor of any cross-core round trip.
fn ping_pong(n: usize) -> Histogram<u64> {
    let line = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (line, stop) = (Arc::clone(&line), Arc::clone(&stop));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let v = line.load(Ordering::Acquire);
                if v % 2 == 1 {
                    line.store(v + 1, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        })
    };
    let mut h = hist();
    for i in 0..n as u64 {
        let t = Instant::now();
        line.store(2 * i + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().expect("echo thread");
    h
}

/// One command per round trip over the client's mailbox.
fn shm_round_trip(n: usize, idle: IdleStrategy) -> Histogram<u64> {
    let s = server(false, idle);
    let mut c = Client::connect(ClientConfig::new(Endpoint::embedded(&s))).expect("connect");
    let id = c.get_lock(LockKind::Atomic, b"rtt").expect("get_lock");
    let mut h = hist();
    for _ in 0..n {
        let t = Instant::now();
        let _ = c.trylock(id, Mode::Exclusive, 5_000).expect("trylock");
        let _ = h.record(t.elapsed().as_nanos() as u64);
        let _ = c.unlock(id).expect("unlock");
    }
    h
}

/// The floor of batch round trips: a full data message (1,008 bytes: 31 commands) copied word
/// by word into a shared buffer and published by a sequence number, as a client writes its
/// mailbox; a second thread copies it into a reply buffer of the same size and publishes that,
/// as the data thread does, without executing anything. With `lanes` > 1 the messages go
/// through that many buffers, up to `lanes` in flight, taken in order. Returns each message's
/// round trip (from writing it to having read its reply) and messages per second.
fn batch_echo(secs: f64, lanes: usize) -> (Histogram<u64>, f64) {
    const WORDS: usize = dlock_core::proto::DATA_MESSAGE_MAX / 8;
    struct Half {
        seq: AtomicU64,
        data: [AtomicU64; WORDS],
    }
    let new_lanes = || -> Arc<Vec<Half>> {
        Arc::new(
            (0..lanes)
                .map(|_| Half {
                    seq: AtomicU64::new(0),
                    data: std::array::from_fn(|_| AtomicU64::new(0)),
                })
                .collect(),
        )
    };
    let (req, resp) = (new_lanes(), new_lanes());
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (req, resp, stop) = (Arc::clone(&req), Arc::clone(&resp), Arc::clone(&stop));
        thread::spawn(move || {
            let mut buf = [0u64; WORDS];
            let mut next = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let lane = next as usize % lanes;
                if req[lane].seq.load(Ordering::Acquire) != next {
                    std::hint::spin_loop();
                    continue;
                }
                for (b, w) in buf.iter_mut().zip(&req[lane].data) {
                    *b = w.load(Ordering::Relaxed);
                }
                for (w, b) in resp[lane].data.iter().zip(&buf) {
                    w.store(*b, Ordering::Relaxed);
                }
                resp[lane].seq.store(next, Ordering::Release);
                next += 1;
            }
        })
    };
    let mut h = hist();
    let mut buf = [7u64; WORDS];
    let mut sent_at = vec![Instant::now(); lanes];
    let (mut sent, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        for _ in 0..64 {
            while sent - done < lanes as u64 {
                sent += 1;
                let lane = sent as usize % lanes;
                sent_at[lane] = Instant::now();
                for (w, b) in req[lane].data.iter().zip(&buf) {
                    w.store(*b, Ordering::Relaxed);
                }
                req[lane].seq.store(sent, Ordering::Release);
            }
            done += 1;
            let lane = done as usize % lanes;
            while resp[lane].seq.load(Ordering::Acquire) != done {
                std::hint::spin_loop();
            }
            for (b, w) in buf.iter_mut().zip(&resp[lane].data) {
                *b = w.load(Ordering::Relaxed);
            }
            let _ = h.record(sent_at[lane].elapsed().as_nanos() as u64);
        }
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    echo.join().expect("echo thread");
    (h, rate)
}

/// 31-command batches from one client, trylock then unlock: the round trips, and lock
/// operations per second.
fn shm_batches(secs: f64, idle: IdleStrategy) -> (Histogram<u64>, f64) {
    let s = server(false, idle);
    let mut c = Client::connect(ClientConfig::new(Endpoint::embedded(&s))).expect("connect");
    let ids: Vec<_> = (0..31)
        .map(|k| {
            c.get_lock(LockKind::Atomic, format!("b{k}").as_bytes())
                .expect("get_lock")
        })
        .collect();
    let reqs: Vec<_> = ids.iter().map(|&id| (id, Mode::Exclusive, 5_000)).collect();
    let mut out = vec![Err(Status::Einval); 31];
    let mut h = hist();
    let mut ops = 0u64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        let t = Instant::now();
        c.batch_trylock(&reqs, false, &mut out).expect("batch");
        let _ = h.record(t.elapsed().as_nanos() as u64);
        assert!(out.iter().all(Result::is_ok), "every trylock granted");
        let t = Instant::now();
        c.batch_unlock(&ids, &mut out).expect("batch");
        let _ = h.record(t.elapsed().as_nanos() as u64);
        ops += 62;
    }
    (h, ops as f64 / start.elapsed().as_secs_f64())
}

/// 31-command batches from one client with `Client::pipeline_depth` of them in flight: one set
/// of 31 locks per batch, each set alternating trylock and unlock, the next batch submitted as
/// soon as the oldest completes. Lock operations per second.
fn shm_pipelined(secs: f64, idle: IdleStrategy) -> f64 {
    let s = server(false, idle);
    let mut c = Client::connect(ClientConfig::new(Endpoint::embedded(&s))).expect("connect");
    let depth = c.pipeline_depth();
    let sets: Vec<Vec<_>> = (0..depth)
        .map(|set| {
            (0..31)
                .map(|k| {
                    c.get_lock(LockKind::Atomic, format!("p{set}-{k}").as_bytes())
                        .expect("get_lock")
                })
                .collect()
        })
        .collect();
    let reqs: Vec<Vec<_>> = sets
        .iter()
        .map(|set| set.iter().map(|&id| (id, Mode::Exclusive, 5_000)).collect())
        .collect();
    let mut out = vec![Err(Status::Einval); 31];
    // Which set completes next (submission order), and whether its next batch locks.
    let mut next = std::collections::VecDeque::new();
    for (set, r) in reqs.iter().enumerate() {
        c.submit_trylock(r, false).expect("submit");
        next.push_back((set, false));
    }
    let mut ops = 0u64;
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        for _ in 0..64 {
            let (set, lock) = next.pop_front().expect("a batch in flight");
            c.complete(&mut out).expect("complete");
            assert!(out.iter().all(Result::is_ok), "every operation succeeds");
            if lock {
                c.submit_trylock(&reqs[set], false).expect("submit");
            } else {
                c.submit_unlock(&sets[set]).expect("submit");
            }
            next.push_back((set, !lock));
            ops += 31;
        }
    }
    let rate = ops as f64 / start.elapsed().as_secs_f64();
    while c.complete(&mut out).is_ok() {}
    rate
}

/// The data thread's own work with no transport: the pipelined run's 31-key trylock and unlock
/// messages through `Server::handle_data` (decode, execute, encode the reply) on this thread,
/// back to back, cache-hot. Lock operations per second, in the best 100 ms window.
fn server_alone(secs: f64) -> f64 {
    let mut region = dlock_benches::region(&capacities());
    let mut s = dlock_benches::server(&mut region);
    let c = s.client_init(2, 0, 0).expect("client").get();
    let ids: Vec<_> = (0..31)
        .map(|k| {
            s.get_lock(c, LockKind::Atomic, format!("s{k}").as_bytes(), 0)
                .expect("get_lock")
        })
        .collect();
    let message = |op| {
        let commands: Vec<Command> = ids.iter().map(|&id| dlock_benches::cmd(op, id)).collect();
        dlock_benches::encoded(c, &commands)
    };
    let (lock, unlock) = (
        message(LockOp::TryExclusive),
        message(LockOp::UnlockExclusive),
    );
    let mut out = [0u8; DATA_MESSAGE_MAX];
    // The best of 100 ms windows: on a shared machine a window is only ever slowed down by
    // others, so the best one is this thread's own speed.
    let mut best = 0f64;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        let (start, mut ops) = (Instant::now(), 0u64);
        while start.elapsed() < Duration::from_millis(100) {
            for _ in 0..64 {
                s.handle_data(std::hint::black_box(&lock), &mut out, 1_000)
                    .expect("trylock message");
                s.handle_data(std::hint::black_box(&unlock), &mut out, 1_000)
                    .expect("unlock message");
                std::hint::black_box(&out);
            }
            ops += 64 * 62;
        }
        best = best.max(ops as f64 / start.elapsed().as_secs_f64());
    }
    best
}

/// The same frame size as a data message of one command (48 bytes) echoed over loopback TCP.
fn tcp_echo(n: usize) -> Histogram<u64> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let echo = thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_nodelay(true).expect("nodelay");
        let mut b = [0u8; 48];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let mut h = hist();
    let mut b = [7u8; 48];
    for _ in 0..n {
        let t = Instant::now();
        c.write_all(&b).expect("write");
        c.read_exact(&mut b).expect("read");
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    drop(c);
    echo.join().expect("echo thread");
    h
}

/// Trylock and unlock round trips over TCP from `clients` threads; per-request latency.
fn tcp_round_trips(clients: usize, per_client: usize) -> (Histogram<u64>, f64) {
    tcp_round_trips_over(clients, per_client, None)
}

/// The same, over TLS when `tls` is given.
fn tcp_round_trips_over(
    clients: usize,
    per_client: usize,
    tls: Option<&Pki>,
) -> (Histogram<u64>, f64) {
    let s = server_with(true, IdleStrategy::Adaptive, None, tls);
    let addr = s.tcp_addr().expect("tcp");
    let endpoint = match tls {
        Some(pki) => pki.endpoint(addr),
        None => Endpoint::Tcp(addr),
    };
    let endpoint = &endpoint;
    let start = Instant::now();
    let hists: Vec<Histogram<u64>> = thread::scope(|sc| {
        let hs: Vec<_> = (0..clients)
            .map(|t| {
                sc.spawn(move || {
                    let mut c =
                        Client::connect(ClientConfig::new(endpoint.clone())).expect("connect");
                    let id = c
                        .get_lock(LockKind::Atomic, format!("k{t}").as_bytes())
                        .expect("get_lock");
                    let mut h = hist();
                    for _ in 0..per_client {
                        let t0 = Instant::now();
                        let _ = c.trylock(id, Mode::Exclusive, 5_000).expect("trylock");
                        let _ = h.record(t0.elapsed().as_nanos() as u64);
                        let t1 = Instant::now();
                        let _ = c.unlock(id).expect("unlock");
                        let _ = h.record(t1.elapsed().as_nanos() as u64);
                    }
                    h
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("client")).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut total = hist();
    for h in hists {
        total.add(h).expect("same precision");
    }
    let rate = total.len() as f64 / secs;
    (total, rate)
}

/// Where the hand-off benchmarks put their threads. Two cores cannot give the server (or the
/// floor's relay), the holder and the waiter one each, so `Pinned` puts the server on CPU 0 and
/// the holder and the waiter on CPU 1, and the holder hands the lock over without waiting for
/// its own reply (an asynchronous unlock) before it blocks: the waiter then has CPU 1 to itself.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Where the scheduler puts them; the holder unlocks synchronously.
    Free,
    /// Server on CPU 0; holder and waiter on CPU 1; the holder unlocks asynchronously.
    Pinned,
}

/// The floor of a [`Layout::Pinned`] hand-off: the holder raises a flag, a relay spinning on
/// CPU 0 (standing in for the server) passes it on, and a waiter on CPU 1 that polls, then
/// backs off (crossbeam `Backoff`), sees it. Only atomics: no lock, no message.
fn hand_off_floor(n: usize) -> Histogram<u64> {
    let flags = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let (flags, stop) = (Arc::clone(&flags), Arc::clone(&stop));
        thread::spawn(move || {
            pin_to(0);
            while !stop.load(Ordering::Relaxed) {
                let v = flags[0].load(Ordering::Acquire);
                if v != flags[1].load(Ordering::Relaxed) {
                    flags[1].store(v, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        })
    };
    pin_to(1);
    let start = Instant::now();
    let mut h = hist();
    for i in 1..=n as u64 {
        let unlocked_at = Arc::new(AtomicU64::new(0));
        let waiter = {
            let (flags, unlocked_at) = (Arc::clone(&flags), Arc::clone(&unlocked_at));
            thread::spawn(move || {
                pin_to(1);
                let (mut polls, backoff) = (0u32, crossbeam_utils::Backoff::new());
                while flags[1].load(Ordering::Acquire) != i {
                    polls += 1;
                    if polls < 1_000 {
                        std::hint::spin_loop();
                    } else {
                        backoff.snooze();
                    }
                }
                start.elapsed().as_nanos() as u64 - unlocked_at.load(Ordering::Acquire)
            })
        };
        thread::sleep(Duration::from_millis(5));
        unlocked_at.store(start.elapsed().as_nanos() as u64, Ordering::Release);
        flags[0].store(i, Ordering::Release);
        let _ = h.record(waiter.join().expect("waiter"));
    }
    stop.store(true, Ordering::Relaxed);
    relay.join().expect("relay");
    h
}

/// From the holder's unlock to the waiter's grant, with the waiter parked on the server; the
/// waiting client sleeps, or stays awake for up to `awake`.
fn hand_off(n: usize, idle: IdleStrategy, awake: Duration, layout: Layout) -> Histogram<u64> {
    let pinned = layout == Layout::Pinned;
    let s = server_pinned(false, idle, pinned.then_some(0));
    if pinned {
        pin_to(1);
    }
    let e = Endpoint::embedded(&s);
    let mut holder = Client::connect(ClientConfig::new(e.clone())).expect("connect");
    let lh = holder
        .get_lock(LockKind::Rw, b"hand-off")
        .expect("get_lock");
    let unlocked_at = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut h = hist();
    for _ in 0..n {
        let _ = holder
            .trylock(lh, Mode::Exclusive, 1)
            .expect("holder locks");
        let waiter = {
            let (e, unlocked_at) = (e.clone(), Arc::clone(&unlocked_at));
            thread::spawn(move || {
                if pinned {
                    pin_to(1);
                }
                let mut cfg = ClientConfig::new(e);
                cfg.wait_awake = awake;
                let mut w = Client::connect(cfg).expect("connect");
                let l = w.get_lock(LockKind::Rw, b"hand-off").expect("get_lock");
                let _ = w
                    .lock(l, Mode::Exclusive, 1, Duration::from_secs(10))
                    .expect("granted");
                let granted = start.elapsed().as_nanos() as u64;
                let _ = w.unlock(l);
                let _ = w.deinit();
                granted - unlocked_at.load(Ordering::Acquire)
            })
        };
        // Let the waiter park on the server.
        thread::sleep(Duration::from_millis(5));
        unlocked_at.store(start.elapsed().as_nanos() as u64, Ordering::Release);
        match layout {
            Layout::Free => {
                let _ = holder.unlock(lh).expect("unlock");
                let _ = h.record(waiter.join().expect("waiter"));
            }
            Layout::Pinned => {
                holder
                    .lock_request_async(lh, AsyncOp::Unlock)
                    .expect("unlock");
                let _ = h.record(waiter.join().expect("waiter"));
                while holder
                    .lock_result_check()
                    .is_err_and(|e| e == Status::AsyncAgain)
                {}
            }
        }
    }
    h
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "quick");
    // Any other argument (not a flag cargo passes) names the sections to run: `shm`, `batch`,
    // `tcp`, `hand-off`; none runs them all.
    let only: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "quick" && !a.starts_with('-'))
        .collect();
    let run = |section: &str| only.is_empty() || only.contains(&section);
    let n = if quick { 2_000 } else { 20_000 };
    if run("shm") {
        println!("shared memory (in-process), one command per round trip:");
        report("  raw cache-line ping-pong (floor)", &ping_pong(n));
        report(
            "  trylock round trip, idle = spin",
            &shm_round_trip(n, IdleStrategy::Spin),
        );
        report(
            "  trylock round trip, idle = adaptive",
            &shm_round_trip(n, IdleStrategy::Adaptive),
        );
    }
    if run("batch") {
        let secs = if quick { 1.0 } else { 3.0 };
        println!("shared memory, 31-command batches (1,008-byte messages), 1 client:");
        let (floor, _) = batch_echo(secs, 1);
        report("  raw 1,008-byte echo (floor)", &floor);
        let floor_rate = 31e3 / floor.value_at_quantile(0.5) as f64;
        println!("    = {floor_rate:.1} M commands/s at the floor's median");
        for idle in [IdleStrategy::Spin, IdleStrategy::Adaptive] {
            let (h, rate) = shm_batches(secs, idle);
            report(&format!("  batch round trip, idle = {idle:?}"), &h);
            println!(
                "    = {:.1} M lock operations/s ({:.0}% of the floor)",
                rate / 1e6,
                100.0 * rate / 1e6 / floor_rate
            );
        }
    }
    if run("pipeline") {
        let secs = if quick { 1.0 } else { 3.0 };
        println!("shared memory, 31-command batches, 4 in flight, 1 client:");
        let floor = 31.0 * batch_echo(secs, 4).1;
        println!(
            "  raw 1,008-byte echo through 4 lanes (floor): {:.1} M commands/s",
            floor / 1e6
        );
        // One data thread both copies every message in and out (as the echo does) and executes
        // it, one after the other: their times per operation add up to an estimate of its
        // ceiling (an estimate: the core overlaps some of the copying with the work).
        let alone = server_alone(secs);
        let ceiling = 1.0 / (1.0 / floor + 1.0 / alone);
        println!(
            "  state machine alone (decode, execute, encode; no transport): {:.1} M lock \
             operations/s\n  ceiling for one data thread (echo floor + state machine): {:.1} M \
             lock operations/s",
            alone / 1e6,
            ceiling / 1e6
        );
        for idle in [IdleStrategy::Spin, IdleStrategy::Adaptive] {
            let rate = shm_pipelined(secs, idle);
            println!(
                "  pipelined batches, idle = {idle:?}: {:.1} M lock operations/s ({:.0}% of the \
                 floor, {:.0}% of the ceiling)",
                rate / 1e6,
                100.0 * rate / floor,
                100.0 * rate / ceiling
            );
        }
    }
    if run("tls") {
        println!("TLS cost (trylock/unlock over TCP, TLS off and on alternated, 3 rounds):");
        let pki = Pki::new();
        for clients in [1, 64] {
            let per = (n / clients).max(50);
            let (mut plain, mut tls) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                plain.push(tcp_round_trips_over(clients, per, None));
                tls.push(tcp_round_trips_over(clients, per, Some(&pki)));
            }
            let median = |v: &mut Vec<(Histogram<u64>, f64)>| {
                let mut p50: Vec<u64> = v.iter().map(|(h, _)| h.value_at_quantile(0.5)).collect();
                let mut rate: Vec<f64> = v.iter().map(|(_, r)| *r).collect();
                p50.sort_unstable();
                rate.sort_by(f64::total_cmp);
                (p50[p50.len() / 2], rate[rate.len() / 2])
            };
            let (p_plain, r_plain) = median(&mut plain);
            let (p_tls, r_tls) = median(&mut tls);
            println!(
                "  {clients:>2} clients: p50 {:.1} µs plain, {:.1} µs TLS ({:+.1} µs); \
                 {:.0} k req/s plain, {:.0} k req/s TLS ({:+.1}%)",
                p_plain as f64 / 1e3,
                p_tls as f64 / 1e3,
                (p_tls as f64 - p_plain as f64) / 1e3,
                r_plain / 1e3,
                r_tls / 1e3,
                100.0 * (r_tls / r_plain - 1.0)
            );
        }
    }
    if run("tcp") {
        println!("TCP loopback:");
        report("  raw 48-byte echo (floor)", &tcp_echo(n));
        for clients in [1, 16, 64] {
            let per = (n / clients).max(50);
            let (h, rate) = tcp_round_trips(clients, per);
            report(
                &format!(
                    "  trylock/unlock, {clients} clients ({:.0} k req/s)",
                    rate / 1e3
                ),
                &h,
            );
        }
    }
    if run("hand-off") {
        println!("contended hand-off (unlock -> parked waiter granted):");
        let m = if quick { 50 } else { 300 };
        report(
            "  waiter asleep, idle = adaptive (defaults)",
            &hand_off(m, IdleStrategy::Adaptive, Duration::ZERO, Layout::Free),
        );
        let awake = Duration::from_millis(20);
        report(
            "  waiter awake, idle = spin, unpinned",
            &hand_off(m, IdleStrategy::Spin, awake, Layout::Free),
        );
        report("  floor: relay thread, pinned", &hand_off_floor(m));
        report(
            "  waiter awake, idle = spin, pinned",
            &hand_off(m, IdleStrategy::Spin, awake, Layout::Pinned),
        );
    }
}
