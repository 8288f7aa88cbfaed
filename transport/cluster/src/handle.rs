//! What the agent publishes to the server runtime, and the requests the runtime makes of it.
//!
//! Everything here is plain data or a non-blocking call: the control thread polls it, the data
//! thread never waits on it. Blocking variants ([`Pending::wait`]) are for tests and tools.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use dlock_core::cluster::{Map, ServerId, Timing};
use tokio::sync::mpsc::UnboundedSender;

/// Why a request to the agent failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentError {
    /// etcd did not answer (or answered an error); the text says what happened.
    Etcd(String),
    /// The map changed since the version the request was made under: apply the new map and
    /// ask again if the partition is still yours.
    MapChanged,
    /// The agent has stopped.
    Stopped,
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentError::Etcd(e) => write!(f, "etcd: {e}"),
            AgentError::MapChanged => f.write_str("the map changed under the request"),
            AgentError::Stopped => f.write_str("the cluster agent has stopped"),
        }
    }
}

impl std::error::Error for AgentError {}

/// The answer to a request, arriving later. Poll it with [`Pending::try_take`] (never blocks)
/// or wait for it with [`Pending::wait`].
#[derive(Debug)]
pub struct Pending<T>(pub(crate) Receiver<Result<T, AgentError>>);

impl<T> Pending<T> {
    /// The answer if it has come.
    pub fn try_take(&self) -> Option<Result<T, AgentError>> {
        match self.0.try_recv() {
            Ok(r) => Some(r),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(AgentError::Stopped)),
        }
    }

    /// Waits up to `timeout` for the answer.
    pub fn wait(self, timeout: Duration) -> Option<Result<T, AgentError>> {
        match self.0.recv_timeout(timeout) {
            Ok(r) => Some(r),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(AgentError::Stopped)),
        }
    }
}

/// This server's standing in etcd, for self-fencing (`dlock_core::cluster::timing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// The registration (etcd lease id); `None` between a lost lease and the next registration.
    pub incarnation: Option<u64>,
    /// When the last counting confirmation round (keepalive answered with a positive TTL, and
    /// the map read at `map_version`) was sent.
    pub confirmed_sent: Option<Instant>,
    /// The map version that round confirmed. The confirmation extends the authority only of a
    /// runtime that has applied this version: one still serving an older map keeps the
    /// authority its last matching confirmation gave it.
    pub map_version: u64,
    /// The timing rules for the TTL etcd granted.
    pub timing: Timing,
}

impl Standing {
    /// Until when (exclusive) a runtime that applied `map_version` may grant.
    pub fn authority_until(&self) -> Option<Instant> {
        let sent = self.confirmed_sent?;
        let ms = self.timing.authority_until_ms(0);
        Some(sent + Duration::from_millis(ms))
    }

    /// Whether a runtime that applied `map_version` may grant at `now`.
    pub fn may_grant(&self, now: Instant) -> bool {
        self.authority_until().is_some_and(|until| now < until)
    }
}

/// What the agent is doing, for `dlock cluster status` and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStatus {
    /// This server.
    pub server_id: ServerId,
    /// Its registration, if it has one now.
    pub incarnation: Option<u64>,
    /// Whether it is the elected coordinator.
    pub coordinator: bool,
    /// Whether it asked to be drained.
    pub draining: bool,
    /// The newest map version it has published.
    pub map_version: Option<u64>,
    /// Since when etcd has not answered (`None`: it answers). While it does not, failover and
    /// partition moves stop; serving goes on until the lease may have expired.
    pub etcd_unreachable_since: Option<SystemTime>,
    /// The last etcd error.
    pub last_error: Option<String>,
}

impl std::fmt::Display for AgentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.server_id)?;
        match self.incarnation {
            Some(i) => write!(f, ", lease {i:x}")?,
            None => f.write_str(", not registered")?,
        }
        if self.coordinator {
            f.write_str(", coordinator")?;
        }
        if self.draining {
            f.write_str(", draining")?;
        }
        if let Some(v) = self.map_version {
            write!(f, ", map v{v}")?;
        }
        if let Some(since) = self.etcd_unreachable_since {
            let ago = SystemTime::now().duration_since(since).unwrap_or_default();
            write!(
                f,
                ", etcd unreachable since {:.1} s ago (failover and moves stopped)",
                ago.as_secs_f64()
            )?;
            if let Some(e) = &self.last_error {
                write!(f, ": {e}")?;
            }
        }
        Ok(())
    }
}

/// A partition's high-water marks: (counter name, mark).
pub type Marks = Vec<(Vec<u8>, u64)>;

/// A request the handle sends the agent's thread.
#[derive(Debug)]
pub(crate) enum Command {
    Reserve {
        partition: u16,
        name: Vec<u8>,
        mark: u64,
        map_version: u64,
        reply: std::sync::mpsc::SyncSender<Result<u64, AgentError>>,
    },
    Marks {
        partition: u16,
        reply: std::sync::mpsc::SyncSender<Result<Marks, AgentError>>,
    },
    SessionKey {
        reply: std::sync::mpsc::SyncSender<Result<[u8; 32], AgentError>>,
    },
    PersistClients {
        ids: Vec<u32>,
        reply: std::sync::mpsc::SyncSender<Result<(), AgentError>>,
    },
    Clients {
        server: ServerId,
        incarnation: u64,
        reply: std::sync::mpsc::SyncSender<Result<Vec<u32>, AgentError>>,
    },
    Republish,
    Stop {
        leave: bool,
    },
}

/// State the agent's thread writes and the handle reads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) server_id: ServerId,
    pub(crate) timing: Mutex<Timing>,
    /// Published maps: the newest, with its etcd mod revision.
    pub(crate) map: Mutex<Option<(Arc<Map>, i64)>>,
    /// The newest published map version plus one (0: none). Lets a poller skip the lock.
    pub(crate) map_version: AtomicU64,
    pub(crate) standing: Mutex<Standing>,
    pub(crate) status: Mutex<AgentStatus>,
    pub(crate) draining: AtomicBool,
    pub(crate) renewals: Mutex<Vec<(u16, u32)>>,
}

/// Locks `m`, taking the data even if a panicking holder poisoned it (every value here is
/// replaced whole, never left half-written).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(crate) fn new(server_id: ServerId, timing: Timing) -> Shared {
        Shared {
            server_id,
            timing: Mutex::new(timing),
            map: Mutex::new(None),
            map_version: AtomicU64::new(0),
            standing: Mutex::new(Standing {
                incarnation: None,
                confirmed_sent: None,
                map_version: 0,
                timing,
            }),
            status: Mutex::new(AgentStatus {
                server_id,
                incarnation: None,
                coordinator: false,
                draining: false,
                map_version: None,
                etcd_unreachable_since: None,
                last_error: None,
            }),
            draining: AtomicBool::new(false),
            renewals: Mutex::new(Vec::new()),
        }
    }

    /// Publishes `map` (etcd mod revision `rev`) if it is newer than the one published.
    pub(crate) fn publish_map(&self, map: Arc<Map>, rev: i64) -> bool {
        let mut slot = lock(&self.map);
        if slot
            .as_ref()
            .is_some_and(|(m, _)| m.version() >= map.version())
        {
            return false;
        }
        let version = map.version();
        *slot = Some((map, rev));
        // Release: a poller that sees the new version and then takes the lock finds the map.
        self.map_version.store(version + 1, Ordering::Release);
        lock(&self.status).map_version = Some(version);
        // Renewal requests for epochs the new map has moved past are done (or moot).
        if let Some((m, _)) = slot.as_ref() {
            lock(&self.renewals).retain(|&(p, e)| m.owner(p).is_some_and(|o| o.epoch == e));
        }
        true
    }

    /// The newest map's etcd mod revision and version.
    pub(crate) fn map_revision(&self) -> Option<(i64, u64)> {
        lock(&self.map).as_ref().map(|(m, rev)| (*rev, m.version()))
    }

    pub(crate) fn reachable(&self) {
        let mut s = lock(&self.status);
        s.etcd_unreachable_since = None;
    }

    pub(crate) fn unreachable(&self, error: String) {
        let mut s = lock(&self.status);
        if s.etcd_unreachable_since.is_none() {
            tracing::warn!(error = %error, "etcd unreachable");
            s.etcd_unreachable_since = Some(SystemTime::now());
        }
        s.last_error = Some(error);
    }
}

/// The runtime's view of a running agent: cheap to clone, every call non-blocking.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) commands: UnboundedSender<Command>,
}

impl AgentHandle {
    /// This server.
    pub fn server_id(&self) -> ServerId {
        self.shared.server_id
    }

    /// The newest map's version, without taking a lock (`None`: no map yet).
    pub fn map_version(&self) -> Option<u64> {
        // Acquire: pairs with the Release in `publish_map`.
        self.shared
            .map_version
            .load(Ordering::Acquire)
            .checked_sub(1)
    }

    /// The newest map the agent has seen.
    pub fn map(&self) -> Option<Arc<Map>> {
        lock(&self.shared.map).as_ref().map(|(m, _)| m.clone())
    }

    /// This server's standing in etcd (self-fencing).
    pub fn standing(&self) -> Standing {
        *lock(&self.shared.standing)
    }

    /// What the agent is doing.
    pub fn status(&self) -> AgentStatus {
        lock(&self.shared.status).clone()
    }

    /// Persists high-water mark `mark` for counter `name` of `partition`, under map version
    /// `map_version` (the one the runtime serves the partition with): the write succeeds only
    /// if the map has not changed since, so an owner that lost the partition can never raise a
    /// mark after its successor read it. The answer is the mark now persisted (at least
    /// `mark`, more if one was already higher).
    pub fn reserve(
        &self,
        partition: u16,
        name: &[u8],
        mark: u64,
        map_version: u64,
    ) -> Pending<u64> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let cmd = Command::Reserve {
            partition,
            name: name.to_vec(),
            mark,
            map_version,
            reply,
        };
        // A stopped agent drops the sender; the pending answer then reports `Stopped`.
        let _ = self.commands.send(cmd);
        Pending(rx)
    }

    /// Reads every high-water mark of `partition` (a new owner does, after it learned of the
    /// partition from the map, and starts each counter at its mark).
    pub fn marks(&self, partition: u16) -> Pending<Marks> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let _ = self.commands.send(Command::Marks { partition, reply });
        Pending(rx)
    }

    /// The cluster's session key kept in etcd under `/dlock/<cluster>/key`: read, or created
    /// once (from the OS CSPRNG, by compare-and-swap, so every server reads the same) if no
    /// server created it yet. For a cluster whose servers are not given a key file: etcd must
    /// then run with TLS and client certificates, since whoever reads the key can mint any
    /// client's session.
    pub fn session_key(&self) -> Pending<[u8; 32]> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let _ = self.commands.send(Command::SessionKey { reply });
        Pending(rx)
    }

    /// Persists the ids of the clients registered with this server now (the whole set, under
    /// its current registration), so that a successor of any of its partitions knows whose
    /// re-claims to wait for. Not bound to the lease: the successor reads it after the lease
    /// is gone.
    pub fn persist_clients(&self, ids: &[u32]) -> Pending<()> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let ids = ids.to_vec();
        let _ = self.commands.send(Command::PersistClients { ids, reply });
        Pending(rx)
    }

    /// The client ids `server` persisted in registration `incarnation` (empty if none).
    pub fn persisted_clients(&self, server: ServerId, incarnation: u64) -> Pending<Vec<u32>> {
        let (reply, rx) = std::sync::mpsc::sync_channel(1);
        let cmd = Command::Clients {
            server,
            incarnation,
            reply,
        };
        let _ = self.commands.send(cmd);
        Pending(rx)
    }

    /// Marks this server draining: the coordinator moves its partitions away.
    pub fn drain(&self) {
        // Relaxed: the agent reads the flag after receiving `Republish`; the channel orders it.
        self.shared.draining.store(true, Ordering::Relaxed);
        lock(&self.shared.status).draining = true;
        let _ = self.commands.send(Command::Republish);
    }

    /// Asks for a new epoch of `partition`, whose token counter at `epoch` is running out.
    pub fn request_renewal(&self, partition: u16, epoch: u32) {
        let mut r = lock(&self.shared.renewals);
        if !r.contains(&(partition, epoch)) {
            r.push((partition, epoch));
        }
        drop(r);
        let _ = self.commands.send(Command::Republish);
    }
}
