//! A cluster server's third thread: it polls the [`Membership`] and hands what it learns to the
//! data thread, and carries the data thread's requests (reservations, renewals, registrations
//! to persist) to the membership.
//!
//! The data thread never calls the membership: between the two there are two bounded lock-free
//! queues and one atomic (the authority deadline, read once per turn). A new map reaches the
//! data thread with everything it needs to apply it at a message boundary — the persisted
//! client ids of each old owner and the marks of the counters of every partition it takes over
//! — because this thread read them before handing it over; so the data thread applies a map
//! without waiting on anything.
//!
//! A thread of its own rather than the control thread's loop: a map hand-over waits (bounded)
//! on etcd reads, which must not stall accepting connections and TLS handshakes.
//!
//! The data thread frees what it is handed (a map update's boxes and vectors) but never
//! allocates for the cluster: its requests are fixed-size values ([`ToCluster`]).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use dlock_core::cluster::{Handover, Map, ServerId};
use dlock_core::config::NAME_LEN_MAX;
use dlock_core::server::{ClusterSide, ClusterWork, Counter, PartState, Server};

use super::Shared;
use super::membership::{Membership, Reply};

/// How often the thread polls the membership.
const POLL: Duration = Duration::from_millis(5);
/// How long a map hand-over waits for the etcd reads it needs before trying again later.
const READ_WAIT: Duration = Duration::from_secs(2);
/// Capacity of each queue (the data thread takes at most this many per turn).
const QUEUE_MAX: usize = 1_024;

/// A cluster server's setting ([`super::ServerConfig::cluster`]).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The cluster's membership (etcd: `dlock_cluster::AgentMembership`).
    pub membership: Arc<dyn Membership>,
    /// How far ahead of a counter's value its high-water mark is reserved: a few seconds' worth
    /// of fetch-and-adds, so that none waits on etcd in steady state.
    pub counter_step: u64,
}

/// A map and what applying it needs.
#[derive(Debug)]
pub(crate) struct MapUpdate {
    map: Arc<Map>,
    incarnation: u64,
    old_clients: Vec<(ServerId, u64, Vec<u32>)>,
}

/// Cluster thread → data thread.
#[derive(Debug)]
pub(crate) enum ToData {
    Map(Box<MapUpdate>),
    CounterMark(Vec<u8>, u64),
    Persisted(u32),
    MarkConfirmed { object: u32, mark: u64 },
    MarkFailed { object: u32 },
}

/// Data thread → cluster thread: fixed size, so the data thread allocates nothing to send it
/// (every entry is as large as a reservation with its name: the queue is allocated once).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum ToCluster {
    Registered(u32),
    Gone(u32),
    Reserve {
        partition: u16,
        object: u32,
        name_len: u16,
        name: [u8; NAME_LEN_MAX],
        mark: u64,
        map_version: u64,
    },
    Renew {
        partition: u16,
        epoch: u32,
    },
}

/// The queues and the authority deadline the two threads share.
#[derive(Debug)]
pub(crate) struct ClusterExchange {
    pub(crate) membership: Arc<dyn Membership>,
    pub(crate) counter_step: u64,
    pub(crate) to_data: ArrayQueue<ToData>,
    pub(crate) to_cluster: ArrayQueue<ToCluster>,
    /// Until when (exclusive, in the data thread's ticks) the server may grant; 0: not at all.
    pub(crate) authority_until_ms: AtomicU64,
    /// The map version the data thread has applied, plus one (0: none). Only a confirmation
    /// of that version may extend the authority: one of a newer map the data thread has not
    /// applied yet would let it go on serving a partition the newer map moved away, past the
    /// point its new owner starts (`dlock_core::cluster::timing`, "The new owner's wait").
    pub(crate) applied_version: AtomicU64,
}

impl ClusterExchange {
    pub(crate) fn new(cfg: &ClusterConfig) -> ClusterExchange {
        ClusterExchange {
            membership: cfg.membership.clone(),
            counter_step: cfg.counter_step,
            to_data: ArrayQueue::new(QUEUE_MAX),
            to_cluster: ArrayQueue::new(QUEUE_MAX),
            authority_until_ms: AtomicU64::new(0),
            applied_version: AtomicU64::new(0),
        }
    }

    /// Tells the cluster thread of a registration or departure (a full queue drops it: the
    /// client then waits for the next change to be persisted, which is the safe side).
    pub(crate) fn note(&self, n: ToCluster) {
        let _ = self.to_cluster.push(n);
    }
}

/// The memory of the core's cluster side, allocated once when the data thread starts.
pub(crate) struct ClusterMemory {
    map: Box<Map>,
    encoded: Vec<u8>,
    parts: Vec<PartState>,
    expected: Vec<u32>,
    reclaims: Vec<u64>,
}

impl ClusterMemory {
    /// The memory for a server with `clients_max` client slots (its expected and reclaim tables
    /// are sized by them: `ClusterSide::expected`).
    pub(crate) fn new(clients_max: u32) -> ClusterMemory {
        ClusterMemory {
            map: Box::new(Map::new(dlock_core::cluster::Partitions::DEFAULT)),
            encoded: vec![0; dlock_core::cluster::MAP_ENCODED_MAX],
            parts: vec![PartState::default(); usize::from(dlock_core::cluster::PARTITIONS_MAX)],
            expected: vec![0; clients_max as usize],
            reclaims: vec![0; ClusterSide::reclaims_len(clients_max)],
        }
    }

    pub(crate) fn side(&mut self) -> ClusterSide<'_> {
        ClusterSide {
            map: &mut self.map,
            encoded: &mut self.encoded,
            parts: &mut self.parts,
            expected: &mut self.expected,
            reclaims: &mut self.reclaims,
        }
    }
}

/// The data thread's side, once per turn: the authority, what the cluster thread handed over,
/// and the core's requests. Returns how much work there was.
pub(crate) fn serve(cx: &ClusterExchange, server: &mut Server<'_>, now: u64) -> usize {
    // Acquire: pairs with the cluster thread's Release store of a new deadline.
    let until = cx.authority_until_ms.load(Ordering::Acquire);
    server.set_authority_until((until != 0).then_some(until));
    let mut n = 0;
    while n < QUEUE_MAX {
        let Some(msg) = cx.to_data.pop() else { break };
        n += 1;
        match msg {
            ToData::Map(u) => {
                let lists: Vec<(ServerId, u64, &[u32])> = u
                    .old_clients
                    .iter()
                    .map(|(s, i, ids)| (*s, *i, ids.as_slice()))
                    .collect();
                server.apply_map(&u.map, u.incarnation, &lists, now);
                if let Some(v) = server.map_version() {
                    // Release: the cluster thread that reads it extends the authority for
                    // this version only after the map is applied here.
                    cx.applied_version.store(v + 1, Ordering::Release);
                }
            }
            ToData::CounterMark(name, mark) => {
                if let Err(s) = server.counter_mark(&name, mark, now) {
                    tracing::warn!(status = ?s, "cannot adopt a counter of a partition taken over");
                }
            }
            ToData::Persisted(id) => server.client_persisted(id),
            ToData::MarkConfirmed { object, mark } => server.mark_confirmed(object, mark),
            ToData::MarkFailed { object } => server.mark_failed(object),
        }
    }
    server.cluster_work(|w| {
        let note = match w {
            ClusterWork::Reserve {
                partition,
                object,
                name,
                mark,
                map_version,
            } => {
                let mut buf = [0u8; NAME_LEN_MAX];
                buf[..name.len()].copy_from_slice(name);
                ToCluster::Reserve {
                    partition,
                    object,
                    name_len: name.len() as u16,
                    name: buf,
                    mark,
                    map_version,
                }
            }
            ClusterWork::Renew { partition, epoch } => ToCluster::Renew { partition, epoch },
        };
        if cx.to_cluster.push(note).is_err() {
            // The counter asks again at its next fetch-and-add; a renewal is asked again by
            // the map that does not renew it.
            tracing::debug!("cluster queue full");
        }
    });
    n
}

/// The cluster thread's state.
struct Poller<'s> {
    shared: &'s Shared,
    cx: &'s ClusterExchange,
    applied: Option<(Arc<Map>, u64)>,
    clients: BTreeSet<u32>,
    announced: BTreeSet<u32>,
    dirty: bool,
    persisting: Option<(Reply<()>, Vec<u32>)>,
    reserves: Vec<(u32, Reply<u64>)>,
    backlog: VecDeque<ToData>,
}

pub(crate) fn run(shared: &Shared) {
    let Some(cx) = shared.cluster.as_ref() else {
        return;
    };
    let mut p = Poller {
        shared,
        cx,
        applied: None,
        clients: BTreeSet::new(),
        announced: BTreeSet::new(),
        dirty: false,
        persisting: None,
        reserves: Vec::new(),
        backlog: VecDeque::new(),
    };
    while !shared.stop.load(Ordering::Acquire) {
        p.poll();
        std::thread::sleep(POLL);
    }
}

impl Poller<'_> {
    fn poll(&mut self) {
        let m = &*self.cx.membership;
        while let Some(n) = self.cx.to_cluster.pop() {
            match n {
                ToCluster::Registered(id) => self.dirty |= self.clients.insert(id),
                ToCluster::Gone(id) => {
                    self.dirty |= self.clients.remove(&id);
                    self.announced.remove(&id);
                }
                ToCluster::Reserve {
                    partition,
                    object,
                    name_len,
                    name,
                    mark,
                    map_version,
                } => {
                    let name = &name[..usize::from(name_len)];
                    let reply = m.reserve(partition, name, mark, map_version);
                    self.reserves.push((object, reply));
                }
                ToCluster::Renew { partition, epoch } => m.request_renewal(partition, epoch),
            }
        }
        self.persist();
        let mut i = 0;
        while i < self.reserves.len() {
            let object = self.reserves[i].0;
            match self.reserves[i].1.try_take() {
                None => i += 1,
                Some(r) => {
                    self.reserves.swap_remove(i);
                    self.backlog.push_back(match r {
                        Ok(mark) => ToData::MarkConfirmed { object, mark },
                        Err(e) => {
                            tracing::debug!(error = %e, "a counter reservation failed");
                            ToData::MarkFailed { object }
                        }
                    });
                }
            }
        }
        self.hand_over_map();
        self.publish_authority();
        self.publish_status();
        self.flush();
    }

    /// Sets the counters that show the membership's link to etcd (`dlock stat`,
    /// `dlock cluster status`): cheap reads of what the agent published, each poll.
    fn publish_status(&self) {
        let s = self.cx.membership.status();
        let c = &self.shared.counters;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let unreachable = s
            .unreachable_since
            // At least 1 while unreachable, so that 0 always means "it answers".
            .map_or(0, |t| ms(t.elapsed().unwrap_or_default()).max(1));
        c.set(Counter::EtcdUnreachableMs, unreachable);
        let age = s.confirmed_sent.map_or(u64::MAX, |t| ms(t.elapsed()));
        c.set(Counter::KeepaliveAgeMs, age);
        c.set(Counter::Coordinator, u64::from(s.coordinator));
        c.set(Counter::Draining, u64::from(s.draining));
    }

    /// Persists the registered ids when they changed; announces the persisted ones.
    fn persist(&mut self) {
        if let Some((reply, ids)) = &mut self.persisting {
            match reply.try_take() {
                None => return,
                Some(Ok(())) => {
                    for &id in ids.iter() {
                        if self.clients.contains(&id) && self.announced.insert(id) {
                            self.backlog.push_back(ToData::Persisted(id));
                        }
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "persisting client ids failed");
                    self.dirty = true;
                }
            }
            self.persisting = None;
        }
        // Acquire: pairs with the data thread's Release store after it applied the map.
        let applied = self
            .cx
            .applied_version
            .load(Ordering::Acquire)
            .checked_sub(1);
        if let (true, Some(version)) = (self.dirty, applied) {
            self.dirty = false;
            let ids: Vec<u32> = self.clients.iter().copied().collect();
            // Under the map the data thread applied: refused once etcd has a newer one, and
            // tried again at the next poll (after the data thread applied that one too).
            let reply = self.cx.membership.persist_clients(&ids, version);
            self.persisting = Some((reply, ids));
        }
    }

    /// Hands a newer map (or the same under a new registration) to the data thread, with the
    /// old owners' client lists and the marks of every partition it takes over.
    fn hand_over_map(&mut self) {
        let m = &*self.cx.membership;
        let standing = m.standing();
        let Some(incarnation) = standing.incarnation else {
            return;
        };
        let (Some(version), Some((old, old_inc))) = (m.map_version(), self.applied.as_ref()) else {
            if let Some(map) = m.map() {
                self.send_map(map, incarnation, None);
            }
            return;
        };
        if version <= old.version() && incarnation == *old_inc {
            return;
        }
        if let Some(map) = m.map() {
            let old = Some((old.clone(), *old_inc));
            self.send_map(map, incarnation, old);
        }
    }

    fn send_map(&mut self, map: Arc<Map>, incarnation: u64, old: Option<(Arc<Map>, u64)>) {
        let m = &*self.cx.membership;
        let me = m.server_id();
        let mine = |mp: &Map, inc: u64, p: u16| {
            mp.is_for(me, inc) && mp.owner(p).is_some_and(|o| o.server == Some(me))
        };
        let mut owners: BTreeSet<(ServerId, u64)> = BTreeSet::new();
        let mut taken = Vec::new();
        for p in 0..map.partitions().get() {
            let Some(o) = map.owner(p) else { continue };
            if !mine(&map, incarnation, p) || matches!(o.handover, Handover::First) {
                continue;
            }
            let before = old
                .as_ref()
                .map(|(om, oi)| (mine(om, *oi, p), om.owner(p).map_or(0, |x| x.epoch)));
            if before == Some((true, o.epoch)) || o.handover == Handover::Renewal {
                continue;
            }
            taken.push(p);
            if let Some((om, _)) = &old
                && let Some(prev) = om.owner(p).and_then(|x| x.server)
                && prev != me
                && let Some(e) = om.server(prev)
            {
                owners.insert((prev, e.incarnation()));
            }
        }
        let mut old_clients = Vec::new();
        for (s, inc) in owners {
            match wait(m.persisted_clients(s, inc)) {
                Some(ids) => old_clients.push((s, inc, ids)),
                // Unreadable: its partitions wait for their grace end.
                None => tracing::warn!(server = %s, "cannot read the old owner's clients"),
            }
        }
        let mut marks = Vec::new();
        for p in taken {
            match wait(m.marks(p)) {
                Some(ms) => marks.extend(ms),
                None => {
                    // A counter must not start below its mark: try the whole hand-over again.
                    tracing::warn!(partition = p, "cannot read counter marks; retrying");
                    return;
                }
            }
        }
        for (name, mark) in marks {
            self.backlog.push_back(ToData::CounterMark(name, mark));
        }
        self.backlog.push_back(ToData::Map(Box::new(MapUpdate {
            map: map.clone(),
            incarnation,
            old_clients,
        })));
        self.applied = Some((map, incarnation));
    }

    /// Publishes until when the data thread may grant: only a confirmation of the map it has
    /// applied extends it.
    fn publish_authority(&mut self) {
        let standing = self.cx.membership.standing();
        // Acquire: pairs with the data thread's Release store after it applied the map.
        let Some(applied) = self
            .cx
            .applied_version
            .load(Ordering::Acquire)
            .checked_sub(1)
        else {
            return;
        };
        let until = match standing.authority_until {
            Some(t) if standing.map_version == applied => t,
            Some(_) => return,
            None => {
                // Release: pairs with the data thread's Acquire load.
                self.cx.authority_until_ms.store(0, Ordering::Release);
                return;
            }
        };
        let ms = until
            .saturating_duration_since(self.shared.started)
            .as_millis()
            .min(u128::from(u64::MAX)) as u64;
        // Release: pairs with the data thread's Acquire load.
        self.cx.authority_until_ms.store(ms, Ordering::Release);
    }

    /// Moves the backlog to the data thread's queue, and wakes it if anything went.
    fn flush(&mut self) {
        let mut sent = false;
        while let Some(msg) = self.backlog.pop_front() {
            match self.cx.to_data.push(msg) {
                Ok(()) => sent = true,
                Err(msg) => {
                    self.backlog.push_front(msg);
                    break;
                }
            }
        }
        if sent {
            self.shared.wake_data_now();
        }
    }
}

/// Waits for `reply` up to [`READ_WAIT`]; `None` on failure or timeout.
fn wait<T>(mut reply: Reply<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        match reply.try_take() {
            Some(Ok(v)) => return Some(v),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cluster read failed");
                return None;
            }
            None if start.elapsed() > READ_WAIT => return None,
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}
