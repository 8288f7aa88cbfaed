//! A real etcd for the agent's tests: started per test on free loopback ports with its data in
//! a fresh directory under /dev/shm, stopped (and the directory removed) when dropped.

#![allow(dead_code)] // Each test binary uses a different part of the helper.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_cluster::{Agent, AgentConfig};
use dlock_core::cluster::{Partitions, ServerId};

/// The etcd binary (Debian's `etcd-server`).
const ETCD: &str = "/usr/bin/etcd";

/// One etcd server.
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Etcd {
    /// Starts etcd and waits until it accepts connections.
    pub fn start() -> Etcd {
        let dir = shm_dir().join(format!("dlock-etcd-{}-{}", std::process::id(), free_port()));
        let mut e = Etcd {
            child: None,
            dir,
            client_port: 0,
            peer_port: 0,
        };
        // A port found free may be taken by another test's etcd before ours binds it: then
        // etcd exits, and we try other ports.
        for _ in 0..5 {
            (e.client_port, e.peer_port) = (free_port(), free_port());
            if e.try_resume() {
                return e;
            }
            let _ = std::fs::remove_dir_all(&e.dir);
        }
        panic!("etcd did not come up on five pairs of ports");
    }

    /// The client endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd (its data stays for [`Etcd::resume`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data, and waits until it serves.
    pub fn resume(&mut self) {
        assert!(self.try_resume(), "etcd did not come back on its ports");
    }

    /// Starts etcd and waits until it serves; false if it exits first or never does.
    fn try_resume(&mut self) -> bool {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(ETCD)
            .args(["--name", "t", "--data-dir"])
            .arg(&self.dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("t={peer}")])
            // Short election ticks let etcd grant 1-second leases (its minimum TTL is 1.5
            // election timeouts) and expire them promptly.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts (apt-get install etcd-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.client_port)).is_err() {
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| !matches!(c.try_wait(), Ok(None)));
            if exited || Instant::now() >= deadline {
                self.stop();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // An open port is not a serving etcd: until it has elected itself leader, requests
        // wait, and a loaded machine can make that outlast a test's short request timeout.
        while !self.healthy() {
            if Instant::now() >= deadline {
                self.stop();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Whether etcd answers a linearizable read (`etcdctl endpoint health`).
    fn healthy(&self) -> bool {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["endpoint", "health", "--command-timeout=2s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `etcdctl` against this etcd; its standard output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(args)
            .output()
            .expect("etcdctl runs (apt-get install etcd-client)");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The keys under `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.ctl(&["get", "--prefix", "--keys-only", prefix])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// A config for server `id` of cluster `name`, with a 1-second lease and short timeouts.
    pub fn config(&self, name: &str, id: u32, partitions: u16) -> AgentConfig {
        let mut cfg = AgentConfig::new(
            vec![self.endpoint()],
            name,
            ServerId::new(id).unwrap(),
            &format!("127.0.0.1:{}", 20_000 + id),
        );
        cfg.partitions = Partitions::new(partitions).unwrap();
        cfg.lease_ttl_s = 1;
        cfg.drift_ppm = 10_000;
        cfg.grant_lease_max_ms = 2_000;
        cfg.start_timeout = Duration::from_secs(15);
        cfg.request_timeout = Duration::from_millis(500);
        cfg
    }

    /// Starts an agent for server `id`.
    pub fn agent(&self, name: &str, id: u32, partitions: u16) -> Agent {
        Agent::start(self.config(name, id, partitions)).expect("the agent starts")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where etcd keeps its data: /dev/shm when it exists (no disk syncs), else the temp dir.
fn shm_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// Polls `f` every 50 ms until it returns `Some`, for at most `limit`.
pub fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
