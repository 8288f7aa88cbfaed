//! The coordinator: campaign with etcd's election API; while elected, recompute the map from
//! the membership whenever it changes and write it by compare-and-swap.
//!
//! Each write is one transaction: *if* the map's mod revision is the one the map was read at
//! *and* this agent's election key is still the leader's (its create revision is the one the
//! campaign returned) *then* put the new map. Losing either comparison writes nothing: a lost
//! map race re-reads and recomputes (`assign` is deterministic, so the winner's map is what
//! this agent would have written for the same membership), and a lost leadership goes back to
//! campaigning. No update is lost: the map is recomputed from what etcd holds after every
//! lost race, and the membership watch wakes the coordinator for every change after the
//! revision it read.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::cluster::{Map, Member, ServerId, assign};
use etcd_client::{Client, Compare, CompareOp, GetOptions, LeaderKey, Txn, TxnOp, WatchOptions};

use crate::config::AgentConfig;
use crate::etcd::{EtcdResult, decode_map, timed};
use crate::handle::{Shared, lock};
use crate::keys::{self, Keys, MemberRecord, MemberState};

/// Campaigns, then coordinates while elected; returns only if the task is cancelled. Errors
/// (etcd lost, leadership lost) go back to campaigning after a pause.
pub(crate) async fn run(client: Client, cfg: Arc<AgentConfig>, shared: Arc<Shared>, lease: i64) {
    let keys = Keys::new(&cfg.cluster);
    loop {
        let mut election = client.election_client();
        // No timeout: a campaign waits until this agent leads (etcd ends it if the lease dies).
        let leader = match election
            .campaign(keys.election(), cfg.server_id.get().to_string(), lease)
            .await
        {
            Ok(mut r) => r.take_leader(),
            Err(e) => {
                tracing::debug!(error = %e, "campaign failed");
                None
            }
        };
        if let Some(leader) = leader {
            tracing::info!(server = cfg.server_id.get(), "elected coordinator");
            lock(&shared.status).coordinator = true;
            let why = coordinate(&client, &cfg, &leader).await;
            lock(&shared.status).coordinator = false;
            tracing::info!(server = cfg.server_id.get(), why = %why, "no longer coordinating");
            let _ = timed(
                cfg.request_timeout,
                election.resign(Some(etcd_client::ResignOptions::new().with_leader(leader))),
            )
            .await;
        }
        tokio::time::sleep(pause(&cfg)).await;
    }
}

fn pause(cfg: &AgentConfig) -> Duration {
    Duration::from_millis(u64::from(cfg.lease_ttl_s) * 1_000 / 4)
}

/// Recomputes and writes the map after every membership change until something fails.
async fn coordinate(client: &Client, cfg: &AgentConfig, leader: &LeaderKey) -> String {
    loop {
        let watch_from = match step(client, cfg, leader).await {
            Ok(Step::Written { members_rev }) | Ok(Step::Unchanged { members_rev }) => {
                members_rev + 1
            }
            Ok(Step::LostRace) => continue,
            Ok(Step::NotLeader) => return "lost the election".into(),
            Err(e) => return e,
        };
        if let Err(e) = wait_for_change(client, cfg, watch_from).await {
            return e;
        }
    }
}

enum Step {
    Written { members_rev: i64 },
    Unchanged { members_rev: i64 },
    LostRace,
    NotLeader,
}

/// Reads members and map, assigns, and writes the map if it changed.
async fn step(client: &Client, cfg: &AgentConfig, leader: &LeaderKey) -> EtcdResult<Step> {
    let snap = read(client, cfg).await?;
    let Some(next) = next_map(&snap, cfg)? else {
        return Ok(Step::Unchanged {
            members_rev: snap.members_rev,
        });
    };
    Ok(
        match write(client, cfg, leader, &next, snap.map_rev).await? {
            Write::Written => Step::Written {
                members_rev: snap.members_rev,
            },
            Write::LostRace => Step::LostRace,
            Write::NotLeader => Step::NotLeader,
        },
    )
}

/// What the coordinator reads before it assigns.
pub(crate) struct Snapshot {
    /// The stored map (a new one if none is stored).
    pub(crate) current: Arc<Map>,
    /// Its mod revision (0: none stored).
    pub(crate) map_rev: i64,
    /// The store's revision when the members were read.
    pub(crate) members_rev: i64,
    /// Every member: id, incarnation (lease), record.
    pub(crate) members: Vec<(ServerId, u64, MemberRecord)>,
}

/// Reads the members and the map.
pub(crate) async fn read(client: &Client, cfg: &AgentConfig) -> EtcdResult<Snapshot> {
    let keys = Keys::new(&cfg.cluster);
    let mut kv = client.kv_client();
    let members = timed(
        cfg.request_timeout,
        kv.get(keys.servers(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let members_rev = members.header().map_or(0, |h| h.revision());
    let stored = timed(cfg.request_timeout, kv.get(keys.map(), None)).await?;
    let (current, map_rev) = match stored.kvs().first() {
        Some(item) => (
            decode_map(item.value(), cfg.partitions)?,
            item.mod_revision(),
        ),
        None => (Arc::new(Map::new(cfg.partitions)), 0),
    };
    let prefix = keys.servers();
    let mut list = Vec::new();
    for item in members.kvs() {
        let (Some(id), Some(rec)) = (
            keys::member_id(item.key(), &prefix),
            MemberRecord::decode(item.value()),
        ) else {
            tracing::warn!(key = %String::from_utf8_lossy(item.key()), "ignoring a member key that is not ours");
            continue;
        };
        // The incarnation is the lease: a member key without one was not written by an agent.
        if item.lease() == 0 {
            continue;
        }
        list.push((id, item.lease() as u64, rec));
    }
    Ok(Snapshot {
        current,
        map_rev,
        members_rev,
        members: list,
    })
}

/// The map `assign` makes of a snapshot; `None` if nothing changes.
pub(crate) fn next_map(snap: &Snapshot, cfg: &AgentConfig) -> EtcdResult<Option<Box<Map>>> {
    let list: Vec<Member<'_>> = snap
        .members
        .iter()
        .map(|(id, incarnation, rec)| Member {
            id: *id,
            incarnation: *incarnation,
            address: rec.address.as_bytes(),
            draining: rec.state == MemberState::Draining,
        })
        .collect();
    // A renewal stands only while the map still has the partition at the epoch it was asked
    // for; older requests are done.
    let current = &snap.current;
    let renewals: Vec<(ServerId, u16)> = snap
        .members
        .iter()
        .flat_map(|(id, _, rec)| rec.renewals.iter().map(move |&(p, e)| (*id, p, e)))
        .filter(|&(id, p, e)| {
            current
                .owner(p)
                .is_some_and(|o| o.server == Some(id) && o.epoch == e)
        })
        .map(|(id, p, _)| (id, p))
        .collect();
    let mut next = Box::new(Map::new(cfg.partitions));
    let change = assign(current, &list, &renewals, &mut next).map_err(|e| {
        tracing::error!(error = %e, "cannot compute a map");
        e.to_string()
    })?;
    if change.changed {
        tracing::info!(
            version = next.version(),
            moved = change.moved,
            renewed = change.renewed,
            orphaned = change.orphaned,
            members = list.len(),
            "computed a new map"
        );
    }
    Ok(change.changed.then_some(next))
}

/// How a map write ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Write {
    Written,
    /// The map changed since it was read: read again.
    LostRace,
    /// `leader` no longer leads.
    NotLeader,
}

/// Writes `next` if the stored map is still at `map_rev` and `leader` still leads.
pub(crate) async fn write(
    client: &Client,
    cfg: &AgentConfig,
    leader: &LeaderKey,
    next: &Map,
    map_rev: i64,
) -> EtcdResult<Write> {
    let keys = Keys::new(&cfg.cluster);
    let mut bytes = vec![0u8; next.encoded_len()];
    next.encode(&mut bytes)
        .map_err(|e| format!("encoding the map: {e}"))?;
    let txn = Txn::new()
        .when([
            Compare::mod_revision(keys.map(), CompareOp::Equal, map_rev),
            Compare::create_revision(leader.key().to_vec(), CompareOp::Equal, leader.rev()),
        ])
        .and_then([TxnOp::put(keys.map(), bytes, None)])
        .or_else([TxnOp::get(leader.key().to_vec(), None)]);
    let resp = timed(cfg.request_timeout, client.kv_client().txn(txn)).await?;
    if resp.succeeded() {
        tracing::info!(version = next.version(), "wrote the map");
        return Ok(Write::Written);
    }
    let still_leader = resp.op_responses().into_iter().any(|op| match op {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == leader.rev()),
        _ => false,
    });
    Ok(if still_leader {
        Write::LostRace
    } else {
        Write::NotLeader
    })
}

/// Waits for a membership change after revision `from`, or a lease TTL at most (a periodic
/// re-read guards against a missed event).
async fn wait_for_change(client: &Client, cfg: &AgentConfig, from: i64) -> EtcdResult<()> {
    let keys = Keys::new(&cfg.cluster);
    let mut watch = client.watch_client();
    let opts = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = timed(cfg.request_timeout, watch.watch(keys.servers(), Some(opts))).await?;
    let period = Duration::from_millis(u64::from(cfg.lease_ttl_s) * 1_000);
    let deadline = tokio::time::Instant::now() + period;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Err(_) => return Ok(()),
            Ok(Ok(Some(r))) if !r.events().is_empty() || r.canceled() => return Ok(()),
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => return Err("the membership watch closed".into()),
            Ok(Err(e)) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;
