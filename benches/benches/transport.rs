//! Round trips through a running server, each beside its floor measured in the same run:
//!
//! - shared memory: single-command round trip (p50/p99) beside a raw cache-line ping-pong
//!   between two threads, and 31-command batch throughput;
//! - TCP: trylock+unlock round trip (p50/p99) at 1, 16 and 64 clients beside a raw TCP echo of
//!   the same frame size;
//! - contended hand-off: from a holder's unlock to the parked waiter's grant.
//!
//! Run: `cargo bench -p dlock-benches --bench transport` (add `-- quick` for a short run).
//! Latencies come from HDR histograms of individual round trips; this is a custom harness
//! because a mean-of-batches harness hides the tail.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlock_core::{Config, LockKind, Mode};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{IdleStrategy, ServerConfig, ServerHandle, TcpConfig};
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

fn server(tcp: bool, idle: IdleStrategy) -> ServerHandle {
    let core = Config {
        locks_max: 4_096,
        clients_max: 128,
        objects_max: 64,
        ..Config::default()
    };
    let mut cfg = ServerConfig::new(core);
    cfg.idle = idle;
    if tcp {
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    }
    ServerHandle::start(cfg).expect("server starts")
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
        c.trylock(id, Mode::Exclusive, 5_000).expect("trylock");
        let _ = h.record(t.elapsed().as_nanos() as u64);
        let _ = c.unlock(id).expect("unlock");
    }
    h
}

/// 31-command batches, trylock then unlock, from `clients` threads: lock operations per second.
fn shm_batch_throughput(clients: usize, secs: f64) -> f64 {
    let s = server(false, IdleStrategy::Spin);
    let ops = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    thread::scope(|sc| {
        for t in 0..clients {
            let (ops, e) = (&ops, Endpoint::embedded(&s));
            sc.spawn(move || {
                let mut c = Client::connect(ClientConfig::new(e)).expect("connect");
                let names: Vec<String> = (0..31).map(|k| format!("b{t}-{k}")).collect();
                let ids: Vec<_> = names
                    .iter()
                    .map(|n| {
                        c.get_lock(LockKind::Atomic, n.as_bytes())
                            .expect("get_lock")
                    })
                    .collect();
                let reqs: Vec<_> = ids.iter().map(|&id| (id, Mode::Exclusive, 5_000)).collect();
                let mut out = vec![Err(dlock_core::Status::Einval); 31];
                while Instant::now() < deadline {
                    c.batch_trylock(&reqs, false, &mut out).expect("batch");
                    c.batch_unlock(&ids, &mut out).expect("batch");
                    ops.fetch_add(62, Ordering::Relaxed);
                }
            });
        }
    });
    ops.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
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
    let s = server(true, IdleStrategy::Adaptive);
    let addr = s.tcp_addr().expect("tcp");
    let start = Instant::now();
    let hists: Vec<Histogram<u64>> = thread::scope(|sc| {
        let hs: Vec<_> = (0..clients)
            .map(|t| {
                sc.spawn(move || {
                    let mut c =
                        Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).expect("connect");
                    let id = c
                        .get_lock(LockKind::Atomic, format!("k{t}").as_bytes())
                        .expect("get_lock");
                    let mut h = hist();
                    for _ in 0..per_client {
                        let t0 = Instant::now();
                        c.trylock(id, Mode::Exclusive, 5_000).expect("trylock");
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

/// From the holder's unlock to the waiter's grant, with the waiter parked on the server; the
/// waiting client sleeps, or stays awake for up to `awake`.
fn hand_off(n: usize, idle: IdleStrategy, awake: Duration) -> Histogram<u64> {
    let s = server(false, idle);
    let e = Endpoint::embedded(&s);
    let mut holder = Client::connect(ClientConfig::new(e.clone())).expect("connect");
    let lh = holder
        .get_lock(LockKind::Rw, b"hand-off")
        .expect("get_lock");
    let unlocked_at = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut h = hist();
    for _ in 0..n {
        holder
            .trylock(lh, Mode::Exclusive, 1)
            .expect("holder locks");
        let waiter = {
            let (e, unlocked_at) = (e.clone(), Arc::clone(&unlocked_at));
            thread::spawn(move || {
                let mut cfg = ClientConfig::new(e);
                cfg.wait_awake = awake;
                let mut w = Client::connect(cfg).expect("connect");
                let l = w.get_lock(LockKind::Rw, b"hand-off").expect("get_lock");
                w.lock(l, Mode::Exclusive, 1, Duration::from_secs(10))
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
        let _ = holder.unlock(lh).expect("unlock");
        let _ = h.record(waiter.join().expect("waiter"));
    }
    h
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let n = if quick { 2_000 } else { 20_000 };
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
    let secs = if quick { 1.0 } else { 3.0 };
    println!(
        "  31-command batches, 1 client: {:.1} M lock operations/s",
        shm_batch_throughput(1, secs) / 1e6
    );
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
    println!("contended hand-off (unlock -> parked waiter granted):");
    let m = if quick { 50 } else { 300 };
    report(
        "  waiter asleep, idle = adaptive",
        &hand_off(m, IdleStrategy::Adaptive, Duration::ZERO),
    );
    let awake = Duration::from_millis(20);
    report(
        "  waiter awake (wait_awake 20 ms), idle = spin",
        &hand_off(m, IdleStrategy::Spin, awake),
    );
}
