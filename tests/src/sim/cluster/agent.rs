//! Each server's etcd agent, as `transport/cluster` runs it, over a faultable link to the etcd
//! model: confirmation rounds (a keepalive and a read of the map; a round counts when the
//! keepalive reached a live lease, and its instant is when it was *sent*), registration of a
//! new incarnation when the lease is gone, the coordinator's step while elected, the
//! persisted client ids, counter reservations and the marks a new owner reads — and the
//! runtime's hand-over (`transport/src/runtime/cluster.rs`): a newer map, or the same under a
//! new incarnation, reaches the server with the old owners' client lists and the counter marks
//! of every partition it takes over, and the authority is published only for the map applied.

use std::collections::BTreeSet;
use std::sync::Arc;

use dlock_core::cluster::{Handover, MAP_ENCODED_MAX, Map, Member, Partitions, ServerId, assign};

use super::etcd::Etcd;
use super::host::Host;

const ROOT: &str = "/dlock/sim";

fn member_key(id: ServerId) -> String {
    format!("{ROOT}/servers/{}", id.get())
}

fn clients_key(id: ServerId, incarnation: u64) -> String {
    format!("{ROOT}/clients/{}/{incarnation:x}", id.get())
}

fn marks_prefix(p: u16) -> String {
    format!("{ROOT}/hwm/{p}/")
}

fn mark_key(p: u16, name: &[u8]) -> String {
    let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{hex}", marks_prefix(p))
}

const ELECTION: &str = "/dlock/sim/election";
const MAP_KEY: &str = "/dlock/sim/map";

/// A counter reservation the data path asked for: (object, partition, name, mark, map version).
pub type Reserve = (u32, u16, Vec<u8>, u64, u64);

/// The agent's state (one per server process).
#[derive(Debug, Default)]
pub struct Agent {
    /// Its registration: the etcd lease its member key is bound to.
    pub lease: Option<u64>,
    /// The map (and incarnation) handed to the server.
    pub applied: Option<(Arc<Map>, u64)>,
    /// Rounds sent so far; only the newest one's answer is taken.
    pub round: u64,
    /// A round is in flight until this model instant (then it is given up).
    pub in_flight_until: u64,
    /// The next round is due at this model instant.
    pub next_round: u64,
    /// Reservations waiting for the next round.
    pub reserves: Vec<Reserve>,
    /// It asked to be drained.
    pub draining: bool,
    /// The draining flag its member record carries.
    pub draining_written: bool,
    /// Its link to etcd is cut until this model instant (clients still reach the server).
    pub cut_until: u64,
}

/// What a round brings back to the server.
#[derive(Debug)]
pub struct RoundBack {
    pub round: u64,
    /// The server's clock when the round was sent.
    pub sent_ms: u64,
    /// The keepalive reached a live lease (or a new one was registered after the send).
    pub alive: bool,
    pub incarnation: u64,
    /// The map read (`None`: none written yet).
    pub map: Option<Arc<Map>>,
    /// A hand-over: the old owners' persisted client ids and the taken partitions' marks.
    pub old_clients: Vec<(ServerId, u64, Vec<u32>)>,
    pub marks: Vec<(Vec<u8>, u64)>,
    /// Client ids now persisted.
    pub persisted: Vec<u32>,
    /// Reservations answered: (object, persisted mark or refused).
    pub reserves: Vec<(u32, Option<u64>)>,
}

/// The agent's visit to etcd for a round sent at `sent_ms` (server clock): `None` if etcd did
/// not answer. Runs the coordinator's step when this agent leads the election.
pub fn visit(
    etcd: &mut Etcd,
    host: &mut Host,
    ttl: u64,
    partitions: Partitions,
    (round, sent_ms): (u64, u64),
    now: u64,
) -> Option<RoundBack> {
    if !etcd.available(now) {
        return None;
    }
    let id = host.id;
    let mut alive = host.agent.lease.is_some_and(|l| etcd.keepalive(l, now));
    if !alive {
        // The lease is gone (or there was none): register a new incarnation. Its TTL runs from
        // after the send, so the round counts for it (`run.rs`'s `begin`).
        let lease = etcd.grant(ttl, now);
        host.agent.lease = Some(lease);
        host.agent.draining_written = !host.agent.draining;
        etcd.campaign(ELECTION, lease, &id.get().to_le_bytes());
        alive = true;
    }
    let lease = host.agent.lease.expect("registered above");
    if host.agent.draining_written != host.agent.draining {
        let record = vec![u8::from(host.agent.draining)];
        etcd.put(&member_key(id), record, Some(lease));
        host.agent.draining_written = host.agent.draining;
    }
    let persisted: Vec<u32> = host.registered.iter().copied().collect();
    let ids = persisted.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    etcd.put(&clients_key(id, lease), ids.join(",").into_bytes(), None);
    if etcd.leader(ELECTION) == Some(lease) {
        coordinate(etcd, partitions);
    }
    let map = read_map(etcd, partitions).map(|(m, _)| Arc::new(*m));
    let version = map.as_ref().map_or(0, |m| m.version());
    let reserves = std::mem::take(&mut host.agent.reserves)
        .into_iter()
        .map(|(object, p, name, mark, at)| {
            if at != version {
                return (object, None);
            }
            let key = mark_key(p, &name);
            let (old, rev) = etcd
                .get(&key)
                .map_or((0, 0), |e| (parse(&e.value), e.mod_rev));
            let m = old.max(mark);
            (
                object,
                etcd.cas(&key, rev, m.to_string().into_bytes()).then_some(m),
            )
        })
        .collect();
    let mut back = RoundBack {
        round,
        sent_ms,
        alive,
        incarnation: lease,
        map: map.clone(),
        old_clients: Vec::new(),
        marks: Vec::new(),
        persisted,
        reserves,
    };
    if let Some(map) = map {
        let stale = host
            .agent
            .applied
            .as_ref()
            .is_none_or(|(old, inc)| map.version() > old.version() || *inc != lease);
        if stale {
            hand_over(etcd, host, &map, lease, &mut back);
        }
    }
    Some(back)
}

fn parse(v: &[u8]) -> u64 {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What the runtime reads before it hands `map` over (`runtime/cluster.rs`'s `send_map`): the
/// client lists of the old owners of every partition taken and the marks of those partitions.
fn hand_over(etcd: &mut Etcd, host: &Host, map: &Map, incarnation: u64, back: &mut RoundBack) {
    let me = host.id;
    let old = host.agent.applied.as_ref();
    let mine = |mp: &Map, inc: u64, p: u16| {
        mp.is_for(me, inc) && mp.owner(p).is_some_and(|o| o.server == Some(me))
    };
    let mut owners: BTreeSet<(ServerId, u64)> = BTreeSet::new();
    for p in 0..map.partitions().get() {
        let Some(o) = map.owner(p) else { continue };
        if !mine(map, incarnation, p) || matches!(o.handover, Handover::First) {
            continue;
        }
        let before = old.map(|(om, oi)| (mine(om, *oi, p), om.owner(p).map_or(0, |x| x.epoch)));
        if before == Some((true, o.epoch)) || o.handover == Handover::Renewal {
            continue;
        }
        for (k, e) in etcd.prefix(&marks_prefix(p)) {
            let hex = &k[marks_prefix(p).len()..];
            let name: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            back.marks.push((name, parse(&e.value)));
        }
        if let Some((om, _)) = old
            && let Some(prev) = om.owner(p).and_then(|x| x.server)
            && prev != me
            && let Some(e) = om.server(prev)
        {
            owners.insert((prev, e.incarnation()));
        }
    }
    for (s, inc) in owners {
        let ids = etcd.get(&clients_key(s, inc)).map_or(Vec::new(), |e| {
            String::from_utf8_lossy(&e.value)
                .split(',')
                .filter_map(|x| x.parse().ok())
                .collect()
        });
        back.old_clients.push((s, inc, ids));
    }
}

/// The stored map and its mod revision.
fn read_map(etcd: &mut Etcd, partitions: Partitions) -> Option<(Box<Map>, u64)> {
    let e = etcd.get(MAP_KEY)?;
    let mut m = Box::new(Map::new(partitions));
    Map::decode(&e.value, &mut m).expect("the coordinator writes maps that decode");
    Some((m, e.mod_rev))
}

/// The coordinator's step (`transport/cluster/src/coordinator.rs`): read members and map,
/// `assign`, write by compare-and-swap on the map's revision if anything changed.
fn coordinate(etcd: &mut Etcd, partitions: Partitions) {
    let members = etcd.prefix(&format!("{ROOT}/servers/"));
    let addresses: Vec<Vec<u8>> = members
        .iter()
        .map(|(k, _)| format!("sim:{}", &k[ROOT.len() + 9..]).into_bytes())
        .collect();
    let list: Vec<Member<'_>> = members
        .iter()
        .zip(&addresses)
        .filter_map(|((k, e), a)| {
            Some(Member {
                id: ServerId::new(k[ROOT.len() + 9..].parse().ok()?)?,
                incarnation: e.lease?,
                address: a,
                draining: e.value.first() == Some(&1),
            })
        })
        .collect();
    let (current, rev) =
        read_map(etcd, partitions).unwrap_or_else(|| (Box::new(Map::new(partitions)), 0));
    let mut next = Box::new(Map::new(partitions));
    let change = assign(&current, &list, &[], &mut next).expect("assign");
    if change.changed {
        next.check_invariants()
            .expect("assign keeps the map's invariants");
        let mut buf = vec![0u8; MAP_ENCODED_MAX];
        let n = next.encode(&mut buf).expect("encode the map");
        buf.truncate(n);
        // The leader check of the real transaction holds: this agent was just seen leading.
        let _ = etcd.cas(MAP_KEY, rev, buf);
    }
}
