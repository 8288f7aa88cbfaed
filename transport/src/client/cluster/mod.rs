//! The thin cluster client: a [`Connection`] that routes a client's requests over the servers
//! of a dlock cluster, without etcd (`docs/cluster.md`, "Client").
//!
//! [`ClusterLink`] stands where a [`Link`](crate::client::Link) stands under a
//! [`Client`], so the reference-shaped client and the native API
//! ([`Locks`], typed handles, guards, async) run over a cluster with
//! their code unchanged: `Client::over(ClusterLink::connect(cfg)?, client_cfg)` or
//! [`Locks::connect_cluster`](crate::client::Locks::connect_cluster). The seam is the one the
//! simulators already use; the alternative, a second client generic over a routing layer,
//! would have doubled every call of the native API.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_transport::client::Locks;
//! use dlock_transport::client::cluster::ClusterConfig;
//!
//! let locks = Locks::connect_cluster(ClusterConfig::new(["10.0.0.1:21616", "10.0.0.2:21616"]))?;
//! let table = locks.rw("orders/{t1}")?; // `{t1}`: the table and its row groups share a partition
//! let guard = table.write(Duration::from_secs(1))?;
//! # drop(guard);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What the link does, each in one file:
//!
//! | file         | job                                                                    |
//! |--------------|------------------------------------------------------------------------|
//! | `dial.rs`    | reaching a server by its map address ([`Dial`], [`NetDial`]: one `Mux` per server) |
//! | `fetch.rs`   | `GetMap` chunk by chunk, reassembled, decoded or refused              |
//! | `routes.rs`  | lock handles: cluster id → (name, partition, server, server's `LockId`) |
//! | `objects.rs` | `umo_atomic64` objects at their partition's owner, got again after a move |
//! | `members.rs` | registering once, joining each other server lazily, heartbeats, refreshing the map |
//! | `control.rs` | the client's control requests, routed by name or by handle            |
//! | `data.rs`    | data messages split per server, epochs stamped, batches ordered        |
//! | `replies.rs` | their replies gathered, refused commands retried, failed runs undone   |
//! | `reclaim.rs` | after a partition moved: re-claims with proofs, then `ReclaimDone`     |
//! | `reclaim/dones.rs` | the `ReclaimDone`s owed, said in one message per server          |
//!
//! # Identity and leases
//!
//! The client registers once (`ClientInit`, with the first server of the map that answers) and
//! joins every other server it needs with the same `(id, session)` (`ClientJoin`), lazily, over
//! a connection of its own per server. Leases are per server; a heartbeat goes to every server
//! the client joined, and each server's lease is counted from the last request it answered.
//!
//! # Retries
//!
//! Every data command carries its partition's epoch from the cached map. A command answered
//! `PartitionMoved` was not executed: the link refreshes the map (from that server, then any
//! other), re-claims what moved, and sends the command again to the owner; `NotReady` (a
//! partition still taking re-claims) is sent again after a short pause. Both only while the
//! call's deadline lasts; after it the client sees the last status.
//!
//! # Batches
//!
//! A batch is split per server. All-or-nothing holds within one message, hence within one
//! partition. An all-or-nothing batch over several servers is taken in the global order
//! (partition, then name), one server's run at a time, and what earlier runs took is released
//! when a later one fails: deadlock-free (no client holds a later lock while it waits for an
//! earlier one), **not atomic** (another client may see part of the batch held for a moment).
//!
//! # Not routed
//!
//! The reference's recovery calls (`reinit`, `update_all_locks`: in a cluster, re-claims
//! happen per partition inside the link) are answered `Einval`. Batches of names and of
//! releases are routed entry by entry (each entry may live on another server).

mod control;
mod data;
mod dial;
mod fetch;
mod members;
mod objects;
mod reclaim;
mod replies;
mod routes;

use std::collections::HashMap;
use std::io;
use std::task::Waker;
use std::time::{Duration, Instant};

use dlock_core::Session;
use dlock_core::cluster::{Map, ServerId};

pub use dial::{Dial, NetDial};

use super::error::Op;
use super::{Client, ClientConfig, Connection, Endpoint, Error, IdMap, Locks, REQUEST_TIMEOUT};
use data::Flight;
use objects::ObjectRoutes;
use replies::Wait;
use routes::Routes;

/// The link's patience with one server is its timeout divided by this ([`ClusterLink`]).
const PATIENCE_DIVISOR: u32 = 10;

/// How the cluster client starts: the servers to ask for the map first, how to reach a
/// server, and how long one control exchange (and each retry loop of one) may take.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClusterConfig<D: Dial = NetDial> {
    /// Addresses (`host:port`) of one or more servers of the cluster; the map names the rest.
    pub seeds: Vec<Vec<u8>>,
    /// How to open a connection to a server.
    pub dial: D,
    /// How long a control exchange, with its retries, may take, and a synchronous request
    /// (the reference's 5 s).
    pub timeout: Duration,
    /// The lease to ask every server for (zero: each server's default).
    pub lease: Duration,
}

impl ClusterConfig<NetDial> {
    /// Plaintext TCP to `seeds` (see [`NetDial::tls`] for TLS).
    pub fn new<A: AsRef<[u8]>>(seeds: impl IntoIterator<Item = A>) -> Self {
        ClusterConfig::with_dial(seeds, NetDial::tcp())
    }
}

impl<D: Dial> ClusterConfig<D> {
    /// `seeds`, reached with `dial`.
    pub fn with_dial<A: AsRef<[u8]>>(seeds: impl IntoIterator<Item = A>, dial: D) -> Self {
        ClusterConfig {
            seeds: seeds.into_iter().map(|a| a.as_ref().to_vec()).collect(),
            dial,
            timeout: REQUEST_TIMEOUT,
            lease: Duration::ZERO,
        }
    }

    /// Asks every server for `lease` (see [`ClientConfig::lease`]).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The client settings the client above the link runs with (its endpoint is not used:
    /// the link reaches the servers).
    fn client_config(&self) -> ClientConfig {
        let unused = Endpoint::Tcp(std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        ClientConfig::new(unused)
            .with_lease(self.lease)
            .with_timeout(self.timeout)
    }

    /// Gives up a control exchange, with its retries, after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl<D: Dial> Client<ClusterLink<D>> {
    /// Registers a reference-shaped client with a cluster: reads the map from a seed,
    /// registers with a server of the map, and joins the others as it needs them.
    pub fn connect_cluster(cfg: ClusterConfig<D>) -> Result<Client<ClusterLink<D>>, Error> {
        let client_cfg = cfg.client_config();
        Client::over(ClusterLink::connect(cfg)?, client_cfg)
    }
}

impl<D: Dial> Locks<ClusterLink<D>> {
    /// The native API over a cluster ([`Client::connect_cluster`], wrapped): typed handles,
    /// guards and async calls as over one server.
    pub fn connect_cluster(cfg: ClusterConfig<D>) -> Result<Locks<ClusterLink<D>>, Error> {
        Client::connect_cluster(cfg).map(Locks::new)
    }
}

/// One server the client talks to.
#[derive(Debug)]
struct Member<C> {
    conn: C,
    incarnation: u64,
    /// Registered (or joined) on this connection, with `lease_ms` granted.
    registered: bool,
    /// The protocol version the registration or join agreed on: what the link's control
    /// frames to this server carry, and whether it takes `ReclaimDones` (6).
    version: u8,
    lease_ms: u32,
    /// When the last request this server answered was sent: its lease for the client runs at
    /// least until then plus the lease.
    heard: Option<Instant>,
    /// When this registration (or join) was asked for: a reply to a message sent before it
    /// speaks of an earlier one.
    since: Instant,
    /// The connection failed: open a new one (and join again) before its next use.
    broken: bool,
}

/// The registration every server of the cluster knows the client by.
#[derive(Clone, Copy, Debug)]
struct Identity {
    id: u32,
    session: Session,
    lease_ms: u32,
}

/// A [`Connection`] over a whole cluster (module doc).
#[derive(Debug)]
pub struct ClusterLink<D: Dial = NetDial> {
    cfg: ClusterConfig<D>,
    map: Box<Map>,
    members: HashMap<ServerId, Member<D::Conn>>,
    identity: Option<Identity>,
    routes: Routes,
    objects: ObjectRoutes,
    flights: IdMap<u64, Flight>,
    /// Flights answered, kept for their lists (`data.rs`): the next message takes one.
    spare: Vec<Flight>,
    next_ticket: u64,
    message_id: u16,
    start: Instant,
    /// Re-claims and `ReclaimDone`s the client still owes new owners (`reclaim.rs`), paid at
    /// each heartbeat and before each retry of a refused request, until they are taken.
    owed: reclaim::Owed,
}

impl<D: Dial> ClusterLink<D> {
    /// Reads the map from the first seed that gives one. A seed that cannot be reached is
    /// passed over; when none gives a map, the error is the reference's `NOT_READY` with the
    /// last I/O error as its source (a map that does not decode is one: `InvalidData`).
    pub fn connect(mut cfg: ClusterConfig<D>) -> Result<ClusterLink<D>, Error> {
        let op = Op::Connect;
        let deadline = Instant::now() + cfg.timeout;
        let mut message_id = 0u16;
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no cluster address given");
        for seed in cfg.seeds.clone() {
            let fetched = cfg
                .dial
                .dial(&seed, deadline)
                .and_then(|mut conn| fetch::fetch_map(&mut conn, 0, deadline, &mut message_id));
            match fetched {
                Ok(map) => {
                    return Ok(ClusterLink {
                        cfg,
                        map,
                        members: HashMap::new(),
                        identity: None,
                        routes: Routes::default(),
                        objects: ObjectRoutes::default(),
                        flights: IdMap::default(),
                        spare: Vec::new(),
                        next_ticket: 0,
                        message_id,
                        start: Instant::now(),
                        owed: reclaim::Owed::default(),
                    });
                }
                Err(e) => {
                    tracing::debug!(seed = ?String::from_utf8_lossy(&seed), error = %e, "no map from this seed");
                    last = e;
                }
            }
        }
        Err(op.io_as(dlock_core::Status::NotReady, last))
    }

    /// The version of the map the link routes by.
    pub fn map_version(&self) -> u64 {
        self.map.version()
    }

    /// How many times the link looked through the routes of a partition for locks to re-claim
    /// there: for the tests that check a lock or unlock makes no such pass while nothing moved
    /// (the pass reads every route the client holds).
    #[doc(hidden)]
    pub fn rehome_passes(&self) -> u64 {
        self.owed.passes()
    }

    /// The servers the client is registered with (its first registration and its joins).
    pub fn joined(&self) -> Vec<ServerId> {
        let mut ids: Vec<ServerId> = self
            .members
            .iter()
            .filter(|(_, m)| m.registered && !m.broken)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// How long the link waits on one server before it looks elsewhere: a map read, a join
    /// or a heartbeat gives up on a server silent this long (and asks the next), and a data
    /// reply overdue this long makes the link ask another server for the map — a server the
    /// map no longer names is given up, its commands sent to the new owners. A tenth of the
    /// link's timeout, so that a frozen server (open connections, nothing answered: a host
    /// that stopped or fell off the network) costs a call the failover plus one patience,
    /// not its whole deadline per exchange (`docs/cluster.md`, "A silent server").
    fn patience(&self) -> Duration {
        self.cfg.timeout / PATIENCE_DIVISOR
    }

    /// `deadline`, or one patience from now if that is sooner.
    fn patient(&self, deadline: Instant) -> Instant {
        deadline.min(Instant::now() + self.patience())
    }

    fn next_message_id(&mut self) -> u16 {
        self.message_id = self.message_id.wrapping_add(1);
        self.message_id
    }

    /// Now as whole milliseconds since the link started (the records' clock).
    fn now_ms(&self) -> u64 {
        dlock_core::time::elapsed_ms(self.start.elapsed())
    }
}

impl<D: Dial> Connection for ClusterLink<D> {
    /// Drops every server connection and every message in flight; the next use of a server
    /// opens a new connection and joins it again with the same registration.
    fn reconnect(&mut self) -> io::Result<()> {
        for m in self.members.values_mut() {
            m.broken = true;
        }
        self.flights.clear();
        Ok(())
    }

    fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.cfg.timeout);
        self.route_control(req, reply, deadline)
    }

    /// The registration's first server was bound when it answered (`members.rs`); every other
    /// server is bound when it is joined.
    fn attach(&mut self, _client: u32, _slot: u32, _session: Session) -> io::Result<()> {
        Ok(())
    }

    fn depth(&self) -> usize {
        data::DEPTH
    }

    fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        self.start_flight(req)
    }

    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        self.drive(ticket, reply, Wait::Look)
    }

    /// Each server's connection wakes `waker` when its reply may have come (a `Mux`'s reader
    /// does), so a future over the cluster is polled again when there is news, not in a loop.
    fn poll_recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        self.drive(ticket, reply, Wait::Poll(waker))
    }

    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        // "Forever" is bounded by the link's own timeout for its retries, not for the wait:
        // a parked request's reply may take as long as its wait.
        let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
        self.drive(ticket, reply, Wait::Until(deadline))
    }
}

/// An error for a server that answered something no server of this protocol sends.
fn garbage(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}
