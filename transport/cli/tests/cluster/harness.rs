//! The pieces every scenario uses: an etcd, `dlock serve --cluster` processes, the map as etcd
//! holds it, and client threads that lock at full speed and record every grant with its
//! token and lease window, so that the checks can be made afterwards from the records alone.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dlock_core::cluster::{Map, Partitions, ServerId, partition_of};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::Client;
use dlock_transport::client::cluster::{ClusterConfig, ClusterLink};

use crate::common::Etcd;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");
/// The partition count of every test cluster: small, so that three servers each own several.
pub const P: u16 = 16;
/// The name of the counter the XID workers take values from.
pub const XID: &[u8] = b"xid/{orders}";
/// The lease of every grant the workers take, in milliseconds.
pub const EXPIRE_MS: u32 = 4_000;

/// A process killed (SIGKILL) when dropped, however the test ends.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback address (a port another process may take before us, which the server
/// then fails to bind: rare, and a clear failure).
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The session key file every server of a test cluster shares, mode 0600.
fn key_file() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("dlock-cluster-key-{}", std::process::id()));
    if !path.exists() {
        let hex = "5d0e4c2b9a81f7364e2d1c0b9a8f7e6d5c4b3a29180716253443526170819fae";
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

/// One `dlock serve --cluster` process.
pub struct Server {
    pub id: u32,
    pub addr: SocketAddr,
    pub proc: Option<Proc>,
}

impl Server {
    /// Starts server `id` of cluster `name` on a fresh port, with a lease TTL of `ttl_ms`,
    /// reaching etcd at `etcd`, and waits until it listens.
    pub fn start(etcd: &str, name: &str, id: u32, ttl_ms: u32) -> Server {
        let addr = free_addr();
        let child = Command::new(DLOCK)
            .args(["serve", "--bind", &addr.to_string()])
            .args(["--clients", "256", "--locks", "4096", "--objects", "64"])
            .args(["--lease-ms", "5000"])
            .arg("--session-key-file")
            .arg(key_file())
            .args(["--cluster", etcd, "--cluster-name", name])
            .args(["--server-id", &id.to_string()])
            .args(["--partitions", &P.to_string()])
            .args(["--cluster-ttl-ms", &ttl_ms.to_string()])
            .args(["--counter-step", "50"])
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("DLOCK_TEST_SERVER_LOGS").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("dlock serve starts");
        let server = Server {
            id,
            addr,
            proc: Some(Proc(child)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "server {id} never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// SIGKILL: no goodbye, no lease revoked, no flush.
    pub fn kill(&mut self) {
        drop(self.proc.take());
    }

    /// SIGSTOP: the process stays, its sockets open, and nothing answers — a host that froze
    /// or fell off the network without resetting its connections, which a client can tell
    /// from a slow one only by a timeout. Killed when dropped.
    pub fn freeze(&mut self) {
        let pid = self.proc.as_ref().expect("running").0.id();
        let status = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .expect("kill -STOP runs");
        assert!(status.success(), "the server was stopped");
    }
}

/// The map as etcd holds it (`/dlock/<name>/map`), if there is one yet.
pub fn map(etcd: &Etcd, name: &str) -> Option<Map> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd.endpoint()))
        .args(["get", "--print-value-only", &format!("/dlock/{name}/map")])
        .output()
        .ok()?;
    if !out.status.success() || out.stdout.len() < 2 {
        return None;
    }
    // etcdctl ends the value with a newline of its own.
    let bytes = &out.stdout[..out.stdout.len() - 1];
    let mut m = Map::new(Partitions::new(P).unwrap());
    Map::decode(bytes, &mut m).ok()?;
    Some(m)
}

/// Waits until etcd's map gives every partition to one of `ids`, and each of them some.
pub fn map_spread_over(etcd: &Etcd, name: &str, ids: &[u32]) -> Map {
    crate::common::eventually(Duration::from_secs(40), "the map spread", || {
        let m = map(etcd, name)?;
        let owners: Vec<u32> = m
            .owners()
            .iter()
            .map(|o| o.server.map_or(0, ServerId::get))
            .collect();
        let all_ours = owners.iter().all(|o| ids.contains(o));
        let each_some = ids.iter().all(|id| owners.contains(id));
        (all_ours && each_some).then_some(m)
    })
}

/// The lock names the workers use, `lk/0` … `lk/{n-1}`.
pub fn names(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("lk/{i}").into_bytes()).collect()
}

/// The names among `names` whose partition `map` gives to server `id`.
pub fn owned_by(map: &Map, id: u32, names: &[Vec<u8>]) -> Vec<Vec<u8>> {
    names
        .iter()
        .filter(|n| {
            let p = partition_of(n, map.partitions());
            map.owner(p).and_then(|o| o.server).map(ServerId::get) == Some(id)
        })
        .cloned()
        .collect()
}

/// One grant as its holder saw it: held from when the reply arrived until it sent its unlock
/// (or, when the unlock was not confirmed, until its lease ran out, counted from when it sent
/// the request, as a holder must count it).
#[derive(Clone, Debug)]
pub struct Held {
    pub name: Vec<u8>,
    pub worker: usize,
    pub token: u64,
    /// When the lock request was sent: the server granted it after this.
    pub sent: Instant,
    pub from: Instant,
    pub until: Instant,
}

/// What the workers saw, shared with the test.
#[derive(Default)]
pub struct Record {
    pub held: Vec<Held>,
    /// Values the counter workers got from fetch-and-add (each the value before the add).
    pub xids: Vec<u64>,
    /// When each of `xids` came back, in the same order.
    pub xid_at: Vec<Instant>,
    /// Calls that failed, by status (for the failure message; failures are allowed while a
    /// partition moves).
    pub errors: HashMap<Status, u64>,
    /// Unlocks of recorded grants that a server answered with another status than `Success`
    /// (`Fail`: the grant was gone, lost in a move).
    pub unlocks_refused: HashMap<Status, u64>,
}

/// Client threads locking at full speed until stopped.
pub struct Load {
    pub record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Connects a cluster client with `seeds`.
pub fn connect(seeds: &[SocketAddr]) -> Client<ClusterLink> {
    let seeds: Vec<String> = seeds.iter().map(SocketAddr::to_string).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cfg = ClusterConfig::new(&seeds).with_timeout(Duration::from_secs(5));
        match Client::connect_cluster(cfg) {
            Ok(c) => return c,
            // A client is granted nothing until the servers persisted it and serve; a seed
            // may not have applied a map yet.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the cluster client never connected: {e}"),
        }
    }
}

impl Load {
    /// `lockers` threads lock random names of `names` (one client each; every `hold_every`th
    /// grant is held for `long_hold`, so that grants are held across a failover, the others for
    /// a moment), and `counters` threads take XIDs from counter `xid`.
    pub fn start(
        seeds: &[SocketAddr],
        names: &[Vec<u8>],
        lockers: usize,
        counters: usize,
        long_hold: Duration,
    ) -> Load {
        let record = Arc::new(Mutex::new(Record::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for w in 0..lockers {
            let (seeds, names) = (seeds.to_vec(), names.to_vec());
            let (record, stop) = (Arc::clone(&record), Arc::clone(&stop));
            threads.push(std::thread::spawn(move || {
                locker(w, &seeds, &names, long_hold, &record, &stop);
            }));
        }
        for w in 0..counters {
            let seeds = seeds.to_vec();
            let (record, stop) = (Arc::clone(&record), Arc::clone(&stop));
            threads.push(std::thread::spawn(move || {
                counter(w, &seeds, &record, &stop)
            }));
        }
        Load {
            record,
            stop,
            threads,
        }
    }

    /// Grants recorded so far whose reply arrived after `t`.
    pub fn granted_since(&self, t: Instant) -> Vec<Held> {
        let r = self.record.lock().unwrap();
        r.held.iter().filter(|h| h.from > t).cloned().collect()
    }

    /// XIDs taken so far.
    pub fn xids(&self) -> usize {
        self.record.lock().unwrap().xids.len()
    }

    /// When the first XID taken after `t` came back, if one did.
    pub fn first_xid_after(&self, t: Instant) -> Option<Instant> {
        let r = self.record.lock().unwrap();
        r.xid_at.iter().copied().filter(|&at| at > t).min()
    }

    /// Stops the workers and returns what they saw.
    pub fn stop(self) -> Record {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a worker panicked");
        }
        Arc::try_unwrap(self.record)
            .ok()
            .expect("workers are gone")
            .into_inner()
            .unwrap()
    }
}

fn note_error(record: &Mutex<Record>, s: Status) {
    *record.lock().unwrap().errors.entry(s).or_default() += 1;
}

/// Heartbeats every 200 ms, as an engine's client does well within its lease: a heartbeat
/// is how a client learns of a failover in partitions it is not using, and re-claims (or says
/// it has nothing to re-claim) there, which the new owner waits for before it serves.
struct Heartbeat(Instant);

impl Heartbeat {
    fn new() -> Heartbeat {
        Heartbeat(Instant::now())
    }

    fn maybe(&mut self, c: &mut Client<ClusterLink>, record: &Mutex<Record>) {
        if self.0.elapsed() >= Duration::from_millis(200) {
            self.0 = Instant::now();
            if let Err(e) = c.heartbeat() {
                note_error(record, e.status());
            }
        }
    }
}

/// A tiny xorshift: which name next, without a rand dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn locker(
    w: usize,
    seeds: &[SocketAddr],
    names: &[Vec<u8>],
    long_hold: Duration,
    record: &Mutex<Record>,
    stop: &AtomicBool,
) {
    let mut c = connect(seeds);
    let mut ids = HashMap::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (w as u64 + 1).wrapping_mul(0x2545_f491);
    let mut grants = 0u64;
    let mut beat = Heartbeat::new();
    while !stop.load(Ordering::Relaxed) {
        beat.maybe(&mut c, record);
        let name = &names[(next(&mut rng) % names.len() as u64) as usize];
        let id = match ids.get(name) {
            Some(&id) => id,
            None => match c.get_lock(LockKind::Atomic, name) {
                Ok(id) => *ids.entry(name.clone()).or_insert(id),
                Err(e) => {
                    note_error(record, e.status());
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            },
        };
        let sent = Instant::now();
        let g = match c.lock(id, Mode::Exclusive, EXPIRE_MS, Duration::from_millis(300)) {
            Ok(g) if g.status == Status::Success => g,
            // Still held from a grant whose unlock was not confirmed (its window was recorded
            // to its lease's end): release it and go on.
            Ok(_) => {
                let _ = c.unlock(id);
                continue;
            }
            Err(e) => {
                note_error(record, e.status());
                continue;
            }
        };
        let from = Instant::now();
        grants += 1;
        let hold = if grants.is_multiple_of(16) {
            long_hold
        } else {
            Duration::from_millis(1)
        };
        std::thread::sleep(hold);
        let unlocking = Instant::now();
        let until = match c.unlock(id) {
            Ok(Status::Success) => unlocking,
            other => {
                match &other {
                    Err(e) => note_error(record, e.status()),
                    Ok(s) => {
                        *record
                            .lock()
                            .unwrap()
                            .unlocks_refused
                            .entry(*s)
                            .or_default() += 1
                    }
                }
                // Not confirmed: the lease may still run on a server.
                sent + Duration::from_millis(EXPIRE_MS.into())
            }
        };
        record.lock().unwrap().held.push(Held {
            name: name.clone(),
            worker: w,
            token: g.token.0,
            sent,
            from,
            until,
        });
    }
}

fn counter(w: usize, seeds: &[SocketAddr], record: &Mutex<Record>, stop: &AtomicBool) {
    let mut c = connect(seeds);
    let name = XID;
    let mut id = None;
    let mut beat = Heartbeat::new();
    while !stop.load(Ordering::Relaxed) {
        beat.maybe(&mut c, record);
        let Some(object) = id else {
            // Whoever comes first creates it; the others get it. After a failover the new
            // owner may answer that it does not have it: taken again by name, as an engine's
            // XID allocator would (a restart at a low value would show as a repeat).
            let got = c
                .atomic64_create(name, 1, 600)
                .or_else(|_| c.atomic64_get(name, 600));
            match got {
                Ok(o) => id = Some(o),
                Err(e) => {
                    note_error(record, e.status());
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            continue;
        };
        match c.atomic64_faa(object, 1) {
            Ok(v) => {
                let mut r = record.lock().unwrap();
                r.xids.push(v);
                r.xid_at.push(Instant::now());
            }
            Err(e) => {
                note_error(record, e.status());
                if matches!(e.status(), Status::ObjectNotGet | Status::ObjectNotCreate) {
                    id = None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    let _ = w;
}

/// The safety checks over everything recorded: per lock, no two grants' windows overlap and
/// tokens grow with time; no XID was handed out twice.
pub fn check(record: &Record) {
    let mut by_name: HashMap<&[u8], Vec<&Held>> = HashMap::new();
    for h in &record.held {
        by_name.entry(&h.name).or_default().push(h);
    }
    for (name, mut hs) in by_name {
        hs.sort_by_key(|h| h.from);
        let name = String::from_utf8_lossy(name);
        for pair in hs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                b.token > a.token,
                "{name}: token {:#x} (worker {}) after {:#x} (worker {})",
                b.token,
                b.worker,
                a.token,
                a.worker
            );
        }
        let mut latest: Option<&Held> = None;
        for h in hs {
            if let Some(l) = latest {
                assert!(
                    h.from >= l.until,
                    "{name}: two holders at once: {h:?} while {l:?} held it"
                );
            }
            if latest.is_none_or(|l| h.until > l.until) {
                latest = Some(h);
            }
        }
    }
    let mut xids = record.xids.clone();
    xids.sort_unstable();
    let before = xids.len();
    xids.dedup();
    assert_eq!(xids.len(), before, "an XID was handed out twice");
}
