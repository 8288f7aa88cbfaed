//! What a cluster server asks of its cluster's membership, without naming etcd: the map and
//! this server's standing in it, the persisted client ids of the server that owned a
//! partition before, counters' high-water marks, epoch renewals and drain.
//!
//! `dlock-transport` links no etcd client (a standalone server or a thin client compiles none
//! of tonic, prost or tokio; CI checks `cargo tree`). The etcd implementation is
//! `dlock-cluster`'s `AgentMembership`, over its agent's handle; [`StaticMembership`] is an
//! in-process one for tests: a map the test sets, authority for ever unless the test takes it
//! away, marks and client lists in memory.
//!
//! Every call returns at once; an answer that needs etcd comes later as a [`Reply`], which the
//! runtime's cluster thread polls. The data thread never calls any of it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use dlock_core::cluster::{Map, ServerId, Timing};

/// A counter's high-water marks of one partition: (name, mark).
pub type Marks = Vec<(Vec<u8>, u64)>;

/// An answer that may come later: poll it with [`Reply::try_take`].
pub struct Reply<T>(Box<dyn FnMut() -> Option<Result<T, String>> + Send>);

impl<T> Reply<T> {
    /// An answer taken by polling `poll` (`None`: not yet).
    pub fn new(poll: impl FnMut() -> Option<Result<T, String>> + Send + 'static) -> Reply<T> {
        Reply(Box::new(poll))
    }

    /// An answer already known.
    pub fn ready(value: Result<T, String>) -> Reply<T>
    where
        T: Send + 'static,
    {
        let mut v = Some(value);
        Reply::new(move || v.take())
    }

    /// The answer, if it has come (once).
    pub fn try_take(&mut self) -> Option<Result<T, String>> {
        (self.0)()
    }
}

impl<T> fmt::Debug for Reply<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reply")
    }
}

/// This server's standing: its registration and until when it may grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// The registration the newest map names this server under (`None`: not registered now).
    pub incarnation: Option<u64>,
    /// Until when (exclusive) a runtime that applied map `map_version` may grant.
    pub authority_until: Option<Instant>,
    /// The map version the authority was confirmed with: a runtime serving an older map keeps
    /// only the authority its own last confirmation gave it.
    pub map_version: u64,
}

/// What the membership says of itself for operators (`dlock stat`, `dlock cluster status`,
/// `/metrics`): whether it reaches its coordination service and since when.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipStatus {
    /// Whether this server's agent is the cluster's elected coordinator.
    pub coordinator: bool,
    /// Whether this server asked to be drained.
    pub draining: bool,
    /// Since when etcd has not answered (`None`: it answers). While it does not, failover and
    /// moves wait; serving goes on until the lease may have expired.
    pub unreachable_since: Option<SystemTime>,
    /// When the last confirmed keepalive round was sent (`None`: none yet): the authority
    /// counts from it.
    pub confirmed_sent: Option<Instant>,
}

/// A cluster's membership as a server runtime sees it (module doc).
pub trait Membership: Send + Sync + fmt::Debug + 'static {
    /// This server.
    fn server_id(&self) -> ServerId;
    /// The timing rules of the lease the membership holds.
    fn timing(&self) -> Timing;
    /// The newest map's version (cheap: polled often).
    fn map_version(&self) -> Option<u64>;
    /// The newest map.
    fn map(&self) -> Option<Arc<Map>>;
    /// This server's standing now.
    fn standing(&self) -> Standing;
    /// The client ids server `server`, registered as `incarnation`, had persisted (a new
    /// owner of its partitions waits for their re-claims). An empty list: it had none.
    fn persisted_clients(&self, server: ServerId, incarnation: u64) -> Reply<Vec<u32>>;
    /// Persists this server's registered client ids (the whole set, replacing the last).
    fn persist_clients(&self, ids: &[u32]) -> Reply<()>;
    /// The high-water marks of `partition`'s counters.
    fn marks(&self, partition: u16) -> Reply<Marks>;
    /// Persists `mark` for counter `name` of `partition` while the map is `map_version`;
    /// answers the mark persisted.
    fn reserve(&self, partition: u16, name: &[u8], mark: u64, map_version: u64) -> Reply<u64>;
    /// Asks for a new epoch of `partition`, whose token counter at `epoch` runs low.
    fn request_renewal(&self, partition: u16, epoch: u32);
    /// Asks the coordinator to move every partition away from this server.
    fn drain(&self);
    /// Its link to the coordination service, for operators.
    fn status(&self) -> MembershipStatus;
}

/// The shared state of a [`StaticMembership`] cluster: its map, marks and client lists.
#[derive(Debug, Default)]
struct Registry {
    map: Option<Arc<Map>>,
    marks: HashMap<(u16, Vec<u8>), u64>,
    clients: HashMap<(u32, u64), Vec<u32>>,
    renewals: Vec<(u16, u32)>,
    drained: Vec<ServerId>,
}

/// An in-process cluster for tests: every member shares one registry; the test sets the
/// map ([`StaticCluster::set_map`]) and may take a member's authority away.
#[derive(Clone, Debug, Default)]
pub struct StaticCluster(Arc<Mutex<Registry>>);

impl StaticCluster {
    /// An empty cluster.
    pub fn new() -> StaticCluster {
        StaticCluster::default()
    }

    /// Publishes `map` to every member.
    pub fn set_map(&self, map: Map) {
        self.lock().map = Some(Arc::new(map));
    }

    /// The mark persisted for counter `name` of `partition`, if any.
    pub fn mark(&self, partition: u16, name: &[u8]) -> Option<u64> {
        self.lock().marks.get(&(partition, name.to_vec())).copied()
    }

    /// Renewals asked for so far.
    pub fn renewals(&self) -> Vec<(u16, u32)> {
        self.lock().renewals.clone()
    }

    /// Servers that asked to be drained.
    pub fn drained(&self) -> Vec<ServerId> {
        self.lock().drained.clone()
    }

    /// A member of this cluster: server `id`, registered as `incarnation`, with `timing`.
    pub fn member(&self, id: ServerId, incarnation: u64, timing: Timing) -> StaticMembership {
        StaticMembership {
            cluster: self.clone(),
            id,
            incarnation,
            timing,
            fenced: Arc::new(AtomicBool::new(false)),
            cut_off: Arc::new(Mutex::new(None)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One member of a [`StaticCluster`]: authority for ever unless [`StaticMembership::fence`]d.
#[derive(Clone, Debug)]
pub struct StaticMembership {
    cluster: StaticCluster,
    id: ServerId,
    incarnation: u64,
    timing: Timing,
    fenced: Arc<AtomicBool>,
    /// When it was fenced (wall clock and monotonic), for [`Membership::status`]: a fenced
    /// member models one cut off from etcd since then.
    cut_off: Arc<Mutex<Option<(SystemTime, Instant)>>>,
}

impl StaticMembership {
    /// Takes this member's authority away (`true`) or gives it back (`false`), as a lost or
    /// regained etcd lease would.
    pub fn fence(&self, fenced: bool) {
        let mut cut_off = self.cut_off.lock().unwrap_or_else(|e| e.into_inner());
        *cut_off = fenced.then(|| (SystemTime::now(), Instant::now()));
        // Relaxed: a flag read on its own; the runtime's poll sees it within a poll interval.
        self.fenced.store(fenced, Ordering::Relaxed);
    }
}

impl Membership for StaticMembership {
    fn server_id(&self) -> ServerId {
        self.id
    }

    fn timing(&self) -> Timing {
        self.timing
    }

    fn map_version(&self) -> Option<u64> {
        self.cluster.lock().map.as_ref().map(|m| m.version())
    }

    fn map(&self) -> Option<Arc<Map>> {
        self.cluster.lock().map.clone()
    }

    fn standing(&self) -> Standing {
        let map_version = self.map_version().unwrap_or(0);
        // Relaxed: see `fence`.
        let authority_until = if self.fenced.load(Ordering::Relaxed) {
            None
        } else {
            // "For ever": far enough that the runtime never sees it lapse.
            Some(Instant::now() + std::time::Duration::from_secs(3_600 * 24 * 365))
        };
        Standing {
            incarnation: Some(self.incarnation),
            authority_until,
            map_version,
        }
    }

    fn persisted_clients(&self, server: ServerId, incarnation: u64) -> Reply<Vec<u32>> {
        let ids = self
            .cluster
            .lock()
            .clients
            .get(&(server.get(), incarnation))
            .cloned();
        Reply::ready(Ok(ids.unwrap_or_default()))
    }

    fn persist_clients(&self, ids: &[u32]) -> Reply<()> {
        let key = (self.id.get(), self.incarnation);
        self.cluster.lock().clients.insert(key, ids.to_vec());
        Reply::ready(Ok(()))
    }

    fn marks(&self, partition: u16) -> Reply<Marks> {
        let marks = self
            .cluster
            .lock()
            .marks
            .iter()
            .filter(|((p, _), _)| *p == partition)
            .map(|((_, name), m)| (name.clone(), *m))
            .collect();
        Reply::ready(Ok(marks))
    }

    fn reserve(&self, partition: u16, name: &[u8], mark: u64, map_version: u64) -> Reply<u64> {
        let mut r = self.cluster.lock();
        if r.map.as_ref().map(|m| m.version()) != Some(map_version) {
            return Reply::ready(Err("the map changed under the request".into()));
        }
        let m = r.marks.entry((partition, name.to_vec())).or_insert(0);
        *m = (*m).max(mark);
        Reply::ready(Ok(*m))
    }

    fn request_renewal(&self, partition: u16, epoch: u32) {
        self.cluster.lock().renewals.push((partition, epoch));
    }

    fn drain(&self) {
        self.cluster.lock().drained.push(self.id);
    }

    fn status(&self) -> MembershipStatus {
        let cut_off = *self.cut_off.lock().unwrap_or_else(|e| e.into_inner());
        MembershipStatus {
            coordinator: false,
            draining: self.cluster.lock().drained.contains(&self.id),
            unreachable_since: cut_off.map(|(wall, _)| wall),
            // Authority for ever: confirmed just now, unless cut off (then last at the cut).
            confirmed_sent: Some(cut_off.map_or_else(Instant::now, |(_, at)| at)),
        }
    }
}
