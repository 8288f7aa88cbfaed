//! `dlock-cluster`: the etcd agent of a dlock cluster server.
//!
//! The agent runs on its own thread with its own current-thread tokio runtime and is the only
//! part of a server that talks to etcd. It keeps the server registered, elects the
//! coordinator, has the coordinator write the partition map, confirms the server's standing for
//! self-fencing, and keeps counters' high-water marks. What it learns it publishes as plain
//! data on an [`AgentHandle`] — the newest [`Map`](dlock_core::cluster::Map), the
//! [`Standing`] (when the last confirmation round was sent, for `may_grant`), the
//! [`AgentStatus`] — which the server's control thread polls; the data thread never waits on
//! it, and no lock operation ever waits on etcd. The rules it applies (hashing, the map and its
//! encoding, rebalancing, epochs, timing) are `dlock_core::cluster`'s, so the simulators run
//! the same ones.
//!
//! # Keys
//!
//! See [`keys`]: `/dlock/<cluster>/meta` (the creation record: the partition count, created
//! once by compare-and-swap; a server configured otherwise is refused at join with a message
//! that says both counts), `/dlock/<cluster>/servers/<id>` (a member record — address, serving
//! or draining, renewal requests — bound to the server's lease: it disappears when the lease
//! expires or is revoked), `/dlock/<cluster>/election` (etcd's election API),
//! `/dlock/<cluster>/map` (the map's wire encoding), `/dlock/<cluster>/hwm/<p>/<name>` (marks).
//!
//! # Registration, confirmation and self-fencing
//!
//! At start the agent connects (retrying up to [`AgentConfig::start_timeout`], then failing
//! with [`StartError::Unreachable`]), checks or creates the creation record, grants a lease of
//! [`AgentConfig::lease_ttl_s`] and puts its member key under it — refused while another live
//! server holds the id. The lease id is the server's **incarnation**: the map names owners by
//! id and incarnation, so a server that registers again is a new member.
//!
//! Every third of the TTL it runs a **confirmation round**: a keepalive, then a linearizable
//! read of the map (publishing it if newer). A round counts only if the keepalive came back
//! with a positive TTL and the read succeeded; its *send* instant becomes
//! [`Standing::confirmed_sent`], with the map version it saw. The runtime may grant until
//! `confirmed_sent + TTL − margin` ([`Standing::may_grant`]), the rule and its proof in
//! `dlock_core::cluster::timing`.
//!
//! # The coordinator
//!
//! Every agent campaigns on `/dlock/<cluster>/election` with its lease. The elected one reads
//! the members and the map, computes the next map with `dlock_core::cluster::assign` and writes
//! it in one transaction: if the map's mod revision is the one it read *and* its election key
//! is still the leader's, put the map. A lost race re-reads and recomputes; lost leadership
//! campaigns again. It then watches the members' prefix from the revision it read (and re-reads
//! at least every TTL), so every join, leave, drain, re-registration and renewal request leads
//! to a new map. Details in `coordinator`.
//!
//! # High-water marks
//!
//! [`AgentHandle::reserve`] persists a counter's mark ahead of the values the owner hands out
//! (`dlock_core::cluster::counter` says when to ask); the write is a transaction conditioned on
//! the map's mod revision being the one the runtime serves under, so an owner that lost the
//! partition cannot raise a mark after its successor read it. [`AgentHandle::marks`] reads a
//! partition's marks for a new owner, which starts each counter at its mark.
//!
//! # When etcd is lost
//!
//! Requests fail, the status says "etcd unreachable since …", and the standing stops advancing:
//! the server goes on serving until its authority runs out (`TTL − margin` after the last
//! counting round), then fences itself. Failover and moves stop (no coordinator can write a
//! map). When etcd answers again the rounds resume; if the lease expired meanwhile, etcd says
//! so, and the agent registers again under a new lease — a new incarnation, whose partitions the
//! coordinator moves at raised epochs.

// The shared test helper (`tests/common`) names this crate as its users do.
#[cfg(test)]
extern crate self as dlock_cluster;

mod config;
mod coordinator;
mod etcd;
mod handle;
pub mod keys;
mod membership;
mod run;

use std::sync::Arc;
use std::thread::JoinHandle;

pub use config::{AgentConfig, EtcdTls};
pub use handle::{AgentError, AgentHandle, AgentStatus, Marks, Pending, Standing};
pub use membership::AgentMembership;

/// Why an agent did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// A setting is out of range.
    Config(String),
    /// etcd did not answer within the start timeout.
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// How many times.
        attempts: u32,
        /// The last error.
        last_error: String,
    },
    /// The cluster refused this server (partition count, a server id in use).
    Refused(String),
    /// The agent's thread or runtime could not be created.
    Thread(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(m) => write!(f, "cluster configuration: {m}"),
            StartError::Unreachable {
                endpoints,
                attempts,
                last_error,
            } => write!(
                f,
                "etcd at {endpoints} unreachable after {attempts} attempts: {last_error}"
            ),
            StartError::Refused(m) => write!(f, "refused by the cluster: {m}"),
            StartError::Thread(m) => write!(f, "cannot start the cluster agent: {m}"),
        }
    }
}

impl std::error::Error for StartError {}

/// A running agent. Dropping it leaves the cluster ([`Agent::leave`]).
#[derive(Debug)]
pub struct Agent {
    handle: AgentHandle,
    thread: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts the agent's thread, joins the cluster and returns once registered (with the map,
    /// if one exists, published), or with why not after the start timeout.
    pub fn start(cfg: AgentConfig) -> Result<Agent, StartError> {
        if let Some(why) = cfg.invalid_field() {
            return Err(StartError::Config(why));
        }
        let timing = cfg.timing(cfg.lease_ttl_s * 1_000);
        let shared = Arc::new(handle::Shared::new(cfg.server_id, timing));
        let (commands, rx) = tokio::sync::mpsc::unbounded_channel();
        let (started, outcome) = std::sync::mpsc::sync_channel(1);
        let cfg = Arc::new(cfg);
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("dlock-etcd-{}", cfg.server_id.get()))
                // Maps are built in boxes, but decoding and assigning keep a few arrays of
                // partition indices on the stack.
                .stack_size(8 << 20)
                .spawn(move || run::thread_main(cfg, shared, rx, started))
                .map_err(|e| StartError::Thread(e.to_string()))?
        };
        match outcome.recv() {
            Ok(Ok(())) => Ok(Agent {
                handle: AgentHandle { shared, commands },
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(StartError::Thread(
                    "the agent's thread ended during start".into(),
                ))
            }
        }
    }

    /// The runtime's view of the agent.
    pub fn handle(&self) -> AgentHandle {
        self.handle.clone()
    }

    /// Leaves the cluster: revokes the lease, which deletes the member key and ends any
    /// campaign, so the coordinator moves this server's partitions at once. **The server must
    /// have stopped granting first** (its partitions' new owners only wait out the drift
    /// margin, as after an expiry).
    pub fn leave(mut self) {
        self.stop(true);
    }

    /// Stops the agent without leaving: the lease is neither kept alive nor revoked, so it
    /// expires a TTL later, as if the server had died (for tests and for a server that stops
    /// hard).
    pub fn abandon(mut self) {
        self.stop(false);
    }

    fn stop(&mut self, leave: bool) {
        let _ = self.handle.commands.send(handle::Command::Stop { leave });
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop(true);
        }
    }
}
