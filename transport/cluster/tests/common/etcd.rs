//! A real etcd on free loopback ports, its data in a fresh directory under /dev/shm, stopped
//! (and the directory removed) when dropped: what the cluster agent's tests
//! (`common/mod.rs`, which adds the agent's settings), the engine's cluster tests (through that
//! module) and the cluster benchmark (`benches/benches/cluster.rs`) start.
//!
//! Only `std`: the benchmark includes this file by path, so it adds no dependency to any
//! package — not `dlock-cluster` (etcd's client, tonic and tokio) to the benchmarks, nor a
//! test-support feature to a library. Needs Debian's `etcd-server` and `etcd-client`.

#![allow(dead_code)] // Each includer uses a different part.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary (Debian's `etcd-server`).
const ETCD: &str = "/usr/bin/etcd";

/// One etcd server.
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

impl Etcd {
    /// Starts etcd and waits until it serves.
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

    /// The client port (which also serves `/metrics`).
    pub fn client_port(&self) -> u16 {
        self.client_port
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
        self.run_ctl(&["endpoint", "health", "--command-timeout=2s"])
            .status
            .success()
    }

    /// `etcdctl` against this etcd, whether or not it succeeds.
    pub fn run_ctl(&self, args: &[&str]) -> Output {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("etcdctl runs (apt-get install etcd-client)")
    }

    /// `etcdctl` against this etcd, which must succeed; its standard output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = self.run_ctl(args);
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
