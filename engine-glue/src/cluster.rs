//! An embedded server that is a member of a dlock cluster on etcd (feature `cluster`), and the
//! engine's clients of that cluster.
//!
//! Each engine node runs one [`EmbeddedServer`] started with
//! [`EmbeddedServer::start_cluster`]: its etcd agent joins the cluster, the coordinator gives it
//! a share of the partitions, and it masters the locks and counters whose names hash there
//! (`docs/cluster.md`). A worker's client is [`EmbeddedServer::cluster_client`]: a
//! [`ClusterLink`] that reaches this node's own server through shared memory (its mailbox in the
//! region, as [`EmbeddedServer::client`] does) and every other server over TCP, or TLS when
//! [`ClusterJoin::peer_tls`] says so, one shared connection per server for all the node's
//! clients (a [`NetDial`]'s `Mux`es).
//! The engine's own pieces take it unchanged: [`TxnIdAllocator::open`](crate::TxnIdAllocator),
//! [`CsnAllocator::open`](crate::CsnAllocator) and
//! [`RowGroupLocks::new`](crate::rowgroup::RowGroupLocks::new) accept a client of one server or
//! of a cluster.
//!
//! ```no_run
//! use dlock_engine_glue::cluster::ClusterJoin;
//! use dlock_engine_glue::dlock_core::{Config, cluster::ServerId};
//! use dlock_engine_glue::dlock_transport::runtime::TcpConfig;
//! use dlock_engine_glue::{EmbeddedServer, IdConfig, TxnIdAllocator, Volatile};
//!
//! let mut cfg = EmbeddedServer::config(Config::default());
//! cfg.tcp = Some(TcpConfig::new("127.0.0.1:21616".parse()?)); // TLS for a real network
//! let etcd = vec!["http://etcd-1:2379".to_owned()];
//! let join = ClusterJoin::new(etcd, "orders", ServerId::new(1).unwrap());
//! let node = EmbeddedServer::start_cluster(cfg, join)?;
//! // One counter for the whole cluster, mastered by the owner of its partition.
//! let xids = TxnIdAllocator::open(node.cluster_client()?, IdConfig::txn_ids(), Volatile)?;
//! # drop(xids);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What differs from one embedded server
//!
//! - Counters in a cluster move only through their owner's data thread (its high-water mark
//!   must see every value handed out), so a fetch-and-add is a data message even to this
//!   node's own server, never a one-sided atomic on the region: tens of nanoseconds become a
//!   mailbox round trip (microseconds) locally and a TCP round trip remotely. The allocators
//!   lease blocks of ids, so few calls pay it.
//! - A partition that changes owner answers `NotReady` while its new owner takes re-claims;
//!   the link retries within the client's timeout. [`RowGroupLocks`](crate::rowgroup) treats a
//!   `NotReady` that outlasts it as the loss of the worker's grants (its `is_fatal`), as after a
//!   standalone server's failover: the transaction aborts and the worker opens new locks.
//! - Stopping the node ([`EmbeddedServer::shutdown`], or dropping it) stops its server first
//!   and only then leaves the cluster, so its partitions move once it grants nothing.
//!
//! [`EmbeddedServer`]: crate::EmbeddedServer
//! [`EmbeddedServer::start_cluster`]: crate::EmbeddedServer::start_cluster
//! [`EmbeddedServer::cluster_client`]: crate::EmbeddedServer::cluster_client
//! [`EmbeddedServer::client`]: crate::EmbeddedServer::client
//! [`EmbeddedServer::shutdown`]: crate::EmbeddedServer::shutdown

use std::io;
use std::time::{Duration, Instant};

pub use dlock_cluster::{AgentConfig, AgentHandle, EtcdTls, StartError};
use dlock_core::cluster::ServerId;
use dlock_transport::client::cluster::{ClusterConfig, Dial, NetDial};
use dlock_transport::client::link::Link;
use dlock_transport::client::{Client, Endpoint, Error as ClientError};
use dlock_transport::runtime::ServerConfig;
use dlock_transport::tls::TlsConfig;

pub use dlock_transport::client::cluster::ClusterLink;

/// A worker's client of the cluster
/// ([`EmbeddedServer::cluster_client`](crate::EmbeddedServer::cluster_client)).
pub type ClusterClient = Client<ClusterLink<EngineDial>>;

/// How an embedded server joins a cluster
/// ([`EmbeddedServer::start_cluster`](crate::EmbeddedServer::start_cluster)).
#[derive(Clone, Debug)]
pub struct ClusterJoin {
    /// The etcd agent's settings: etcd's endpoints (and client certificate, `agent.tls`), the
    /// cluster's name, this node's server id, the partition count and the lease TTL. Its
    /// `address`, where the other nodes reach this one, is the server's TCP listener when left
    /// empty; its `grant_lease_max_ms` is always the server's `client_lease_max_ms`.
    pub agent: AgentConfig,
    /// How far ahead of a counter's value its owner reserves the high-water mark in etcd: a
    /// few seconds' worth of fetch-and-adds (default 100,000), so that none waits on etcd.
    pub counter_step: u64,
    /// How this node's cluster clients reach the other servers: TLS 1.3 with this client
    /// certificate, or plaintext TCP when `None` (the default: loopback, or a network trusted
    /// entirely).
    pub peer_tls: Option<TlsConfig>,
}

impl ClusterJoin {
    /// Server `server_id` of cluster `cluster`, whose etcd answers at `endpoints`, with the
    /// agent's defaults (a 10 s lease, 256 partitions) and plaintext TCP to the other nodes.
    pub fn new(endpoints: Vec<String>, cluster: &str, server_id: ServerId) -> ClusterJoin {
        ClusterJoin {
            agent: AgentConfig::new(endpoints, cluster, server_id, ""),
            counter_step: 100_000,
            peer_tls: None,
        }
    }
}

/// Reaches the servers of the map: this node's own through shared memory, the others over
/// TCP or TLS ([`ClusterJoin::peer_tls`]). Its clones share their connections to the other
/// servers ([`NetDial`]): a node's workers cost each remote server one connection.
#[derive(Clone, Debug)]
pub struct EngineDial {
    /// The address this node's server advertises in the map.
    local_address: Vec<u8>,
    local: Endpoint,
    peers: NetDial,
}

impl EngineDial {
    /// This node's server alone, at a placeholder address (a server that is no member: it
    /// has no map to give, so a client built on it fails to connect).
    pub(crate) fn local_only(local: Endpoint) -> EngineDial {
        EngineDial {
            local_address: b"local".to_vec(),
            local,
            peers: NetDial::tcp(),
        }
    }

    /// A worker's client of the cluster, which reads the map from this node's server.
    pub(crate) fn client(&self, timeout: Duration) -> Result<ClusterClient, ClientError> {
        let seed = [self.local_address.clone()];
        let cfg = ClusterConfig::with_dial(seed, self.clone()).with_timeout(timeout);
        Client::connect_cluster(cfg)
    }
}

impl Dial for EngineDial {
    type Conn = Link;

    fn dial(&mut self, address: &[u8], deadline: Instant) -> io::Result<Link> {
        if address == self.local_address.as_slice() {
            Link::connect_within(
                &self.local,
                deadline.saturating_duration_since(Instant::now()),
            )
        } else {
            self.peers.dial(address, deadline)
        }
    }
}

/// What an embedded server keeps of its cluster: the agent (which must outlive the server) and
/// how its clients reach the servers.
#[derive(Debug)]
pub(crate) struct Member {
    agent: dlock_cluster::Agent,
    dial: EngineDial,
}

impl Member {
    /// Starts the agent for the server `cfg` describes and makes `cfg` a member. Errors are
    /// `InvalidInput` for settings (no fixed TCP address to advertise, a standalone recovery,
    /// settings etcd's cluster refused), `TimedOut` for an etcd that did not answer.
    pub(crate) fn join(cfg: &mut ServerConfig, join: ClusterJoin) -> io::Result<Member> {
        let invalid = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        let ClusterJoin {
            mut agent,
            counter_step,
            peer_tls,
        } = join;
        if agent.address.is_empty() {
            let bind = cfg.tcp.as_ref().map(|t| t.listen).ok_or_else(|| {
                invalid("a cluster member needs a TCP listener the other nodes reach".into())
            })?;
            if bind.ip().is_unspecified() || bind.port() == 0 {
                return Err(invalid(format!(
                    "the server listens at {bind}: give the address the other nodes reach it at \
                     (ClusterJoin::agent.address), or listen at a fixed address and port"
                )));
            }
            agent.address = bind.to_string();
        }
        agent.fit_to(cfg).map_err(invalid)?;
        let local_address = agent.address.clone().into_bytes();
        let agent = dlock_cluster::Agent::start(agent).map_err(|e| match e {
            StartError::Unreachable { .. } => io::Error::new(io::ErrorKind::TimedOut, e),
            StartError::Thread(_) => io::Error::other(e),
            StartError::Config(_) | StartError::Refused(_) => invalid(e.to_string()),
        })?;
        agent
            .make_member(cfg, counter_step)
            .map_err(io::Error::other)?;
        Ok(Member {
            agent,
            dial: EngineDial {
                local_address,
                // Replaced by the server's own endpoint once it runs (`bind_local`).
                local: Endpoint::Tcp(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
                peers: peer_tls.map_or_else(NetDial::tcp, NetDial::tls),
            },
        })
    }

    /// Points the dial's local address at the running server's region.
    pub(crate) fn bind_local(&mut self, local: Endpoint) {
        self.dial.local = local;
    }

    /// Waits until this node's server serves a map that names it, for at most `limit`.
    pub(crate) fn wait_serving(&self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        let me = self.agent.handle().server_id();
        loop {
            let published = self
                .agent
                .handle()
                .map()
                .filter(|m| m.server(me).is_some())
                .map(|m| m.version());
            if let Some(version) = published {
                let seed = [self.dial.local_address.clone()];
                let cfg = ClusterConfig::with_dial(seed, self.dial.clone())
                    .with_timeout(Duration::from_secs(1));
                if ClusterLink::connect(cfg).is_ok_and(|l| l.map_version() >= version) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the server did not serve a cluster map naming it in time",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A worker's client of the cluster, which reads the map from this node's server.
    pub(crate) fn client(&self, timeout: Duration) -> Result<ClusterClient, ClientError> {
        self.dial.client(timeout)
    }

    /// The agent's handle: the map it knows, its status, drain.
    pub(crate) fn agent(&self) -> AgentHandle {
        self.agent.handle()
    }
}
