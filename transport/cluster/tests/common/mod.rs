//! A real etcd for the agent's tests (`etcd.rs`: started per test on free loopback ports with
//! its data in a fresh directory under /dev/shm, stopped and removed when dropped), the agent's
//! settings for it, and a poll with a deadline.

#![allow(dead_code)] // Each test binary uses a different part of the helper.

use std::time::{Duration, Instant};

use dlock_cluster::{Agent, AgentConfig};
use dlock_core::cluster::{Partitions, ServerId};

pub mod etcd;
pub use etcd::Etcd;

/// The agent's settings for the tests, on top of the etcd process (`etcd.rs`).
impl Etcd {
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
