//! The coordinator's rebalancing: from the current map and the live members, the next map.
//!
//! `assign(current, members, renewals, out)` writes into `out` a map in which
//!
//! - **every partition has an owner** if any member is not draining, and every non-draining
//!   member owns `⌊P/N⌋` or `⌈P/N⌉` partitions (N: the non-draining members) — **even**;
//! - a partition keeps its owner unless that owner left (its membership key is gone), changed
//!   incarnation (restarted or re-registered), drains, or holds more than its share; of the
//!   owners with more than `⌊P/N⌋`, those holding the most keep the `P mod N` larger shares —
//!   **as few moves as possible** (below);
//! - every moved partition's epoch is one above its old one, with the [`Handover`] that tells the
//!   new owner how long to wait: `Expired` from an owner no longer a member in the same
//!   incarnation, `Moved` from one that still is, `First` at epoch 1 — **epochs only grow**;
//! - a draining member **ends with nothing** when anyone else can take its partitions; when
//!   every member drains, partitions stay where they are (better served by a leaver than not at
//!   all), and those of departed owners become unowned;
//! - each renewal `(server, p)` that still stands (the server keeps `p` and this call did not
//!   move it) raises `p`'s epoch with the owner unchanged ([`Handover::Renewal`]).
//!
//! The same inputs give the same output, whatever the order of `members` (they are sorted by
//! id): two coordinators racing compute the same map, and a lost compare-and-swap recomputes.
//! The version rises by one if anything changed and stays otherwise, so an unchanged
//! membership writes nothing.
//!
//! # Why the moves are minimal
//!
//! A partition must move if its owner cannot keep it (gone, re-registered, draining); those
//! moves are forced. Every other partition stays unless its owner is over its quota. With N
//! quotas of `⌊P/N⌋` or `⌈P/N⌉` summing to P, the partitions that stay are
//! `Σ min(held_i, quota_i)`, which is largest when the `P mod N` larger quotas go to the
//! members holding the most: any other choice gives a larger quota to a member that cannot fill
//! it, and takes one from a member that could. So one member leaving an even map moves exactly
//! its partitions, and one joining moves exactly its new share.

use super::map::{Handover, Map, Owner, ServerEntry};
use super::{PARTITIONS_MAX, SERVERS_MAX, ServerId};

/// A live member as the coordinator sees it in etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    /// Its id.
    pub id: ServerId,
    /// Its registration (the etcd lease id its key is bound to).
    pub incarnation: u64,
    /// Where clients reach it.
    pub address: &'a [u8],
    /// It asked to be drained: move everything away from it.
    pub draining: bool,
}

/// What [`assign`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Change {
    /// Partitions given to a new owner (including formerly unowned ones).
    pub moved: u16,
    /// Partitions renewed (new epoch, same owner).
    pub renewed: u16,
    /// Partitions left without an owner (no live member to take them).
    pub orphaned: u16,
    /// Whether the map differs from the current one (and its version was raised).
    pub changed: bool,
}

/// Why [`assign`] wrote no map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignError {
    /// More members than [`SERVERS_MAX`].
    TooManyServers,
    /// Two members with one id.
    DuplicateServer(ServerId),
    /// A member's address is empty or too long.
    BadAddress(ServerId),
    /// A partition that must move is at the largest epoch: it cannot be raised (it never is
    /// reached, see `token`; refusing is better than wrapping).
    EpochExhausted(u16),
}

impl core::fmt::Display for AssignError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AssignError::TooManyServers => write!(f, "more than {SERVERS_MAX} members"),
            AssignError::DuplicateServer(id) => write!(f, "{id} is registered twice"),
            AssignError::BadAddress(id) => {
                write!(f, "{id} advertises an empty or too long address")
            }
            AssignError::EpochExhausted(p) => write!(f, "partition {p} is at the largest epoch"),
        }
    }
}

/// The next map (module doc). On error `out` holds nothing meaningful; keep `current`.
pub fn assign(
    current: &Map,
    members: &[Member<'_>],
    renewals: &[(ServerId, u16)],
    out: &mut Map,
) -> Result<Change, AssignError> {
    let eligible = fill_table(current, members, out)?;
    let n = usize::from(out.servers);
    // Partitions each member (by table index) holds now in its current incarnation.
    let mut held = [0u16; SERVERS_MAX];
    for o in current.owners() {
        if let Some(k) = keeper(current, out, o) {
            held[k] += 1;
        }
    }
    let quota = quotas(out.partitions.get(), &eligible[..n], &held[..n]);
    let any_eligible = eligible[..n].iter().any(|&e| e);
    let mut kept = [0u16; SERVERS_MAX];
    let mut orphans = [0u16; PARTITIONS_MAX as usize];
    let mut orphan_count = 0;
    for (p, o) in current.owners().iter().enumerate() {
        out.owners[p] = *o;
        match keeper(current, out, o) {
            Some(k) if eligible[k] && kept[k] < quota[k] => kept[k] += 1,
            // Nobody can take it: a draining owner keeps serving it.
            Some(_) if !any_eligible => {}
            _ => {
                orphans[orphan_count] = p as u16;
                orphan_count += 1;
            }
        }
    }
    let mut change = Change::default();
    let mut k = 0;
    for &p in &orphans[..orphan_count] {
        let old = current.owners[usize::from(p)];
        if !any_eligible {
            if old.server.is_some() {
                out.owners[usize::from(p)].server = None;
                change.orphaned += 1;
            }
            continue;
        }
        while !(eligible[k] && kept[k] < quota[k]) {
            k += 1;
        }
        kept[k] += 1;
        let epoch = old
            .epoch
            .checked_add(1)
            .ok_or(AssignError::EpochExhausted(p))?;
        let handover = if old.epoch == 0 {
            Handover::First
        } else if keeper(current, out, &old).is_some() {
            Handover::Moved
        } else {
            Handover::Expired
        };
        out.owners[usize::from(p)] = Owner {
            server: Some(out.table[k].id()),
            epoch,
            handover,
        };
        change.moved += 1;
    }
    renew(current, renewals, out, &mut change);
    change.changed = out.servers() != current.servers() || out.owners() != current.owners();
    out.version = current.version + u64::from(change.changed);
    debug_assert_eq!(out.check_invariants(), Ok(()));
    Ok(change)
}

/// Writes the sorted member table into `out` (and its version and `P`); returns which table
/// entries may take partitions (not draining).
fn fill_table(
    current: &Map,
    members: &[Member<'_>],
    out: &mut Map,
) -> Result<[bool; SERVERS_MAX], AssignError> {
    if members.len() > SERVERS_MAX {
        return Err(AssignError::TooManyServers);
    }
    let mut order = [0u16; SERVERS_MAX];
    let order = &mut order[..members.len()];
    for (i, slot) in order.iter_mut().enumerate() {
        *slot = i as u16;
    }
    order.sort_unstable_by_key(|&i| members[usize::from(i)].id);
    if let Some(w) = order
        .windows(2)
        .find(|w| members[usize::from(w[0])].id == members[usize::from(w[1])].id)
    {
        return Err(AssignError::DuplicateServer(members[usize::from(w[0])].id));
    }
    let mut eligible = [false; SERVERS_MAX];
    out.version = current.version;
    out.partitions = current.partitions;
    out.servers = members.len() as u16;
    for (k, &i) in order.iter().enumerate() {
        let m = &members[usize::from(i)];
        out.table[k] = ServerEntry::new(m.id, m.incarnation, m.address)
            .ok_or(AssignError::BadAddress(m.id))?;
        eligible[k] = !m.draining;
    }
    Ok(eligible)
}

/// The table index in `out` of the member that may keep `o`: its owner, in the same
/// incarnation as in `current`, the map `o` came from. `None` if the owner left or
/// re-registered.
fn keeper(current: &Map, out: &Map, o: &Owner) -> Option<usize> {
    let id = o.server?;
    let was = current.server(id)?.incarnation();
    let servers = out.servers();
    let k = servers.binary_search_by_key(&id, ServerEntry::id).ok()?;
    (servers[k].incarnation() == was).then_some(k)
}

/// Quotas per table index: 0 for draining members; `⌊P/N⌋`, plus one for the `P mod N`
/// eligible members holding the most (ties: lower id first).
fn quotas(partitions: u16, eligible: &[bool], held: &[u16]) -> [u16; SERVERS_MAX] {
    let mut quota = [0u16; SERVERS_MAX];
    let mut rank = [0u16; SERVERS_MAX];
    let mut n = 0;
    for (k, _) in eligible.iter().enumerate().filter(|(_, e)| **e) {
        rank[n] = k as u16;
        n += 1;
    }
    if n == 0 {
        return quota;
    }
    let rank = &mut rank[..n];
    rank.sort_unstable_by_key(|&k| (core::cmp::Reverse(held[usize::from(k)]), k));
    let (base, extra) = (partitions / n as u16, usize::from(partitions) % n);
    for (r, &k) in rank.iter().enumerate() {
        quota[usize::from(k)] = base + u16::from(r < extra);
    }
    quota
}

/// Raises the epoch of every standing renewal: the asker still owns the partition and this
/// round did not move it (a move raised it already; a second request in the list finds the
/// epoch raised and is skipped).
fn renew(current: &Map, renewals: &[(ServerId, u16)], out: &mut Map, change: &mut Change) {
    for &(id, p) in renewals {
        let (Some(before), Some(after)) = (current.owner(p), out.owner(p)) else {
            continue;
        };
        if after.server != Some(id) || after != before {
            continue;
        }
        let Some(epoch) = before.epoch.checked_add(1) else {
            continue;
        };
        out.owners[usize::from(p)] = Owner {
            epoch,
            handover: Handover::Renewal,
            ..*before
        };
        change.renewed += 1;
    }
}
