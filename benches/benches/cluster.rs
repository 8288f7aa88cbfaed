//! A cluster on a real etcd, beside a standalone server in the same run:
//!
//! - **failover time**: clients hold locks across three `dlock serve --cluster` processes; one
//!   is killed with SIGKILL, and a probe measures kill → the first grant of a lock of one of its
//!   partitions on the new owner, beside the etcd lease TTL;
//!   and the control messages the new owners took from the kill to the end of their recovery
//!   (every client's re-claims and `ReclaimDone`s, and its heartbeats meanwhile; the bench's
//!   own stats polls are not counted);
//! - **etcd requests per second in steady state**, while clients lock at full speed: etcd's
//!   `grpc_server_handled_total` counters (its `/metrics`) read before and after;
//! - **the cost of routing**: one client's trylock+unlock round trips per second through the
//!   cluster client (`ClusterLink`, one owner) and straight to a standalone server (goal: the
//!   cluster within 5 %).
//!
//! The servers are the `dlock` binary built with the CLI's `cluster` feature:
//! `cargo build --release -p dlock-cli --features cluster`, then
//! `cargo bench -p dlock-benches --bench cluster` (`-- quick` for 20 clients holding 1,000
//! locks and short runs; `-- failover` for the failover alone, which prints the survivors'
//! recovery counters every 5 s while the probe waits). `DLOCK_BIN` names another binary. Needs Debian's `etcd-server` and
//! `etcd-client`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_core::cluster::{Map, Partitions, ServerId, partition_of};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::cluster::{ClusterConfig, ClusterLink};
use dlock_transport::client::{Client, ClientConfig, Endpoint, read_server_stats};

// The etcd the cluster's tests start: `std` only, so including it adds no dependency here.
#[path = "../../transport/cluster/tests/common/etcd.rs"]
mod etcd;
use etcd::{Etcd, free_port};

/// Partitions of the benchmark's cluster (the default).
const P: u16 = 256;
/// The etcd lease TTL of every server.
const TTL_MS: u32 = 1_000;

/// A process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What this benchmark reads from etcd, beside the process the cluster's tests start too.
impl Etcd {
    /// The map etcd holds for cluster `name`.
    fn map(&self, name: &str) -> Option<Map> {
        let out = self.run_ctl(&["get", "--print-value-only", &format!("/dlock/{name}/map")]);
        if !out.status.success() || out.stdout.len() < 2 {
            return None;
        }
        let mut m = Map::new(Partitions::new(P)?);
        Map::decode(&out.stdout[..out.stdout.len() - 1], &mut m).ok()?;
        Some(m)
    }

    /// The sum of etcd's `grpc_server_handled_total` counters: every gRPC request it answered.
    fn grpc_handled(&self) -> u64 {
        let mut s = TcpStream::connect(("127.0.0.1", self.client_port())).expect("etcd's metrics");
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body.lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

/// The `dlock` binary: `DLOCK_BIN`, else the one built beside this benchmark.
fn dlock_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("DLOCK_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(|d| d.parent()).unwrap().join("dlock");
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p dlock-cli --features cluster",
        bin.display()
    );
    bin
}

fn key_file() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("dlock-bench-key-{}", std::process::id()));
    let hex = "8c41d2e7093fb65a1ce4788d2f0b93c6a57e1d04b2f9c8367ea05d13c94b7f21";
    std::fs::write(&path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `dlock serve` on a fresh port: standalone without `cluster`, else server `id` of it.
fn serve(cluster: Option<(&Etcd, &str, u32)>, clients: usize, locks: usize) -> (Proc, SocketAddr) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut cmd = Command::new(dlock_bin());
    cmd.args(["serve", "--bind", &addr.to_string()])
        .args(["--clients", &(clients + 16).to_string()])
        .args(["--clients-per-peer", &(clients + 16).to_string()])
        .args(["--locks", &locks.to_string(), "--objects", "64"])
        .args(["--lease-ms", "30000"])
        .arg("--session-key-file")
        .arg(key_file());
    if let Some((etcd, name, id)) = cluster {
        cmd.args(["--cluster", &etcd.endpoint(), "--cluster-name", name])
            .args([
                "--server-id",
                &id.to_string(),
                "--partitions",
                &P.to_string(),
            ])
            .args(["--cluster-ttl-ms", &TTL_MS.to_string()]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dlock serve starts");
    wait_listening(addr);
    (Proc(child), addr)
}

fn cluster_client(seeds: &[SocketAddr]) -> Client<ClusterLink> {
    let seeds: Vec<String> = seeds.iter().map(ToString::to_string).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Client::connect_cluster(ClusterConfig::new(&seeds)) {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("cluster client: {e}"),
        }
    }
}

/// Waits until etcd's map spreads the partitions over exactly `ids`.
fn spread(etcd: &Etcd, name: &str, ids: &[u32]) -> Map {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(m) = etcd.map(name) {
            let owners: Vec<u32> = m
                .owners()
                .iter()
                .map(|o| o.server.map_or(0, ServerId::get))
                .collect();
            if owners.iter().all(|o| ids.contains(o)) && ids.iter().all(|i| owners.contains(i)) {
                return m;
            }
        }
        assert!(Instant::now() < deadline, "the map never spread");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The reference to `name`, asked again for a while: a cluster server serves a name only once
/// it applied the map and persisted the client, and a connection it dropped is opened again at
/// the next use.
fn get_lock<C: dlock_transport::client::Connection>(
    c: &mut Client<C>,
    name: &[u8],
) -> dlock_core::LockId {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match c.get_lock(LockKind::Atomic, name) {
            Ok(id) => return id,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("get_lock {}: {e}", String::from_utf8_lossy(name)),
        }
    }
}

/// Trylock+unlock round trips of one client for `run`; pairs per second.
fn pairs_per_s<C: dlock_transport::client::Connection>(c: &mut Client<C>, run: Duration) -> f64 {
    let id = get_lock(c, b"bench/route");
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < run {
        if c.trylock(id, Mode::Exclusive, 10_000).is_ok() {
            let _ = c.unlock(id).unwrap();
        }
        n += 1;
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

/// Failover under `clients` clients holding `locks` locks in all: kill → the first grant of a
/// lock of the killed server's partitions on its new owner.
fn failover(clients: usize, locks: usize) {
    let etcd = Etcd::start();
    let name = "failover";
    // After the kill each of the two survivors holds half the locks, not a third: a server
    // sized for a third refuses the re-claims past its table (`ServerNoResource`), so its
    // clients can never say `ReclaimDone` and the recovery ends only at its grace deadline.
    let per = locks.div_ceil(2) + 1_024;
    let mut servers: Vec<(Proc, SocketAddr)> = (1..=3)
        .map(|id| serve(Some((&etcd, name, id)), clients, per))
        .collect();
    let map = spread(&etcd, name, &[1, 2, 3]);
    let seeds: Vec<SocketAddr> = servers.iter().map(|s| s.1).collect();
    let each = locks / clients;
    let t = Instant::now();
    let mut holders: Vec<Client<ClusterLink>> = Vec::with_capacity(clients);
    for i in 0..clients {
        let mut c = cluster_client(&seeds);
        for k in 0..each {
            let id = get_lock(&mut c, format!("h{i}/{k}").as_bytes());
            let _ = c.trylock(id, Mode::Exclusive, 600_000).unwrap();
        }
        holders.push(c);
        // Taking 51,000 locks one client after another takes longer than a client's lease
        // (30 s): the first holders must heartbeat meanwhile, or their leases lapse before
        // the kill and their grants are freed (the run then measured a recovery waiting for
        // clients that had lost everything, until its grace deadline).
        if i % 50 == 49 {
            for h in &mut holders {
                let _ = h.heartbeat();
            }
        }
    }
    println!(
        "  {clients} clients took {} locks in {:.1} s",
        clients * each,
        t.elapsed().as_secs_f64()
    );
    let probe_name = (0..)
        .map(|i| format!("probe/{i}").into_bytes())
        .find(|n| map.owner(partition_of(n, map.partitions())).unwrap().server == ServerId::new(1))
        .unwrap();
    let mut probe = cluster_client(&seeds);
    let id = get_lock(&mut probe, &probe_name);
    let _ = probe.trylock(id, Mode::Exclusive, 1_000).unwrap();
    let _ = probe.unlock(id).unwrap();
    // The holders heartbeat from their own threads, as engines do, so that they re-claim.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beaters: Vec<_> = holders
        .into_iter()
        .map(|mut c| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = c.heartbeat();
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        })
        .collect();
    let survivors: Vec<SocketAddr> = servers[1..].iter().map(|s| s.1).collect();
    // Each of the bench's own `Stats` polls is a control request the survivor counts, after
    // the counters it answers with (a poll never counts itself). The polls from the first
    // reading of `control_requests` to the last are taken away from what it reports: the
    // clients' messages, not the bench's.
    let polls = std::cell::Cell::new(0u64);
    let survivors_n = survivors.len() as u64;
    let messages = |name: &str| -> u64 {
        polls.set(polls.get() + survivors_n);
        survivors.iter().map(|&a| stat(a, name)).sum()
    };
    let before = messages("control_requests");
    let dones_before = messages("reclaim_done_messages");
    drop(servers.remove(0)); // SIGKILL
    let killed = Instant::now();
    let mut shown = Instant::now();
    loop {
        match probe.trylock(id, Mode::Exclusive, 1_000) {
            Ok(g) if g.status == Status::Success => break,
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
        if shown.elapsed() >= Duration::from_secs(5) {
            shown = Instant::now();
            show_recovery(&survivors, killed);
            polls.set(polls.get() + survivors_n);
        }
        assert!(killed.elapsed() < Duration::from_secs(120), "no failover");
    }
    let took = killed.elapsed();
    while messages("partitions_recovering") > 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(120),
            "no recovery end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let recovered = killed.elapsed();
    let polled = polls.get();
    let taken = messages("control_requests") - before - polled;
    let dones = messages("reclaim_done_messages") - dones_before;
    // One `ReclaimDone` per client and partition moved, as before protocol 6's `ReclaimDones`.
    let moved = map.owned_by(ServerId::new(1).unwrap()).count();
    let per_partition = (clients + 1) * moved;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in beaters {
        b.join().unwrap();
    }
    println!(
        "  kill -9 → first grant on the new owner: {:.0} ms (etcd lease TTL {TTL_MS} ms)",
        took.as_secs_f64() * 1e3
    );
    println!(
        "  kill -9 → recovery over at the new owners: {:.0} ms, {taken} control messages taken \
         there meanwhile (re-claims, ReclaimDones, heartbeats; not the bench's {polled} stats \
         polls)",
        recovered.as_secs_f64() * 1e3
    );
    println!(
        "  ReclaimDone(s) messages taken: {dones} ({per_partition} at one per client and \
         partition: {} clients, {moved} partitions moved)",
        clients + 1
    );
}

/// The survivors' recovery as their counters show it, while the probe waits.
fn show_recovery(survivors: &[SocketAddr], killed: Instant) {
    const SHOWN: [&str; 9] = [
        "partitions_recovering",
        "reclaim_awaited",
        "reclaim_awaited_max",
        "reclaim_untracked",
        "reclaim_done_messages",
        "control_requests",
        "no_resource",
        "locks_in_use",
        "clients_active",
    ];
    for &a in survivors {
        let stats =
            read_server_stats(&Endpoint::Tcp(a), Duration::from_secs(5)).unwrap_or_default();
        let get = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
        let line: Vec<String> = SHOWN.iter().map(|n| format!("{n}={}", get(n))).collect();
        println!(
            "    +{:.0} s {a}: {}",
            killed.elapsed().as_secs_f64(),
            line.join(" ")
        );
    }
}

/// Counter `name` of the server at `addr` (0 when it does not answer or has none).
fn stat(addr: SocketAddr, name: &str) -> u64 {
    read_server_stats(&Endpoint::Tcp(addr), Duration::from_secs(5))
        .ok()
        .and_then(|s| s.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
        .unwrap_or(0)
}

/// etcd's requests per second while `clients` lock at full speed for `run`.
fn etcd_steady(clients: usize, run: Duration) {
    let etcd = Etcd::start();
    let name = "steady";
    let servers: Vec<(Proc, SocketAddr)> = (1..=3)
        .map(|id| serve(Some((&etcd, name, id)), clients, 4_096))
        .collect();
    spread(&etcd, name, &[1, 2, 3]);
    let seeds: Vec<SocketAddr> = servers.iter().map(|s| s.1).collect();
    let mut cs: Vec<_> = (0..clients).map(|_| cluster_client(&seeds)).collect();
    // Warm: every client reaches every server once.
    for c in &mut cs {
        pairs_per_s(c, Duration::from_millis(50));
    }
    let before = (etcd.grpc_handled(), Instant::now());
    let threads: Vec<_> = cs
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            std::thread::spawn(move || {
                let id = get_lock(&mut c, format!("steady/{i}").as_bytes());
                let t0 = Instant::now();
                let mut n = 0u64;
                while t0.elapsed() < run {
                    if c.trylock(id, Mode::Exclusive, 10_000).is_ok() {
                        let _ = c.unlock(id);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let pairs: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let after = (etcd.grpc_handled(), Instant::now());
    let secs = after.1.duration_since(before.1).as_secs_f64();
    println!(
        "  etcd: {:.1} requests/s while {clients} clients ran {:.0} trylock+unlock pairs/s (3 servers, TTL {TTL_MS} ms)",
        (after.0 - before.0) as f64 / secs,
        pairs as f64 / secs
    );
}

/// One client's trylock+unlock through the cluster client and straight to a standalone server.
fn routing(run: Duration) {
    let (_standalone, addr) = serve(None, 4, 1_024);
    let mut direct = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let etcd = Etcd::start();
    let (_member, caddr) = serve(Some((&etcd, "route", 1)), 4, 1_024);
    spread(&etcd, "route", &[1]);
    let mut routed = cluster_client(&[caddr]);
    // Alternate, so that the machine's drift hits both alike.
    let (mut d, mut r) = (0.0, 0.0);
    for _ in 0..3 {
        d += pairs_per_s(&mut direct, run / 6);
        r += pairs_per_s(&mut routed, run / 6);
    }
    println!(
        "  trylock+unlock, one client: standalone {:.0} pairs/s, cluster {:.0} pairs/s: routing costs {:+.1} %",
        d / 3.0,
        r / 3.0,
        (d / r - 1.0) * 100.0
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let (clients, locks, run) = if quick {
        (20, 1_000, Duration::from_secs(2))
    } else {
        (1_000, 51_200, Duration::from_secs(10))
    };
    println!("cluster on etcd (3 servers, {P} partitions):");
    if std::env::args().any(|a| a == "failover") {
        failover(clients, locks);
        return;
    }
    routing(run);
    etcd_steady(if quick { 4 } else { 32 }, run);
    failover(1, 1);
    failover(clients, locks);
}
