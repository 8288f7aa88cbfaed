//! The cluster client's lock handles: what a lock id the [`Client`](crate::client::Client)
//! holds stands for in the cluster.
//!
//! The client above the cluster link numbers its locks with ids this table gives out
//! (*cluster ids*), not the servers' own: a lock keeps its cluster id when its partition moves
//! and the new owner numbers it afresh, so nothing above the link renames a record after a
//! failover. A route is the handle the issue describes, `(name, partition, server, LockId)`,
//! plus the epoch and incarnation of the owner the server's id is valid under, and the link's
//! own record of what the client holds on it ([`LocalLock`], the core's state machine fed the
//! same requests and replies as the client's), which is what it re-claims after a move.

use std::collections::HashMap;

use dlock_core::cluster::ServerId;
use dlock_core::ids::{GENERATION_MAX, SLOT_INDEX_LIMIT};
use dlock_core::{LockId, LockKind};

use crate::client::{IdMap, LocalLock};

/// One lock the client holds a reference to.
#[derive(Clone, Debug)]
pub(super) struct Route {
    pub name: Vec<u8>,
    pub partition: u16,
    /// Where the lock is: the server (and its incarnation) and epoch of the partition when its
    /// id there was obtained or re-claimed.
    pub server: ServerId,
    pub incarnation: u64,
    pub epoch: u32,
    /// The lock's id on `server`; `None` once a re-claim was refused there (the grant is gone,
    /// and the reference is taken again with `GetLock` before the next use).
    pub server_lock: Option<u32>,
    /// What the client holds, as the link saw it; `id` is the cluster id.
    pub record: LocalLock,
}

impl Route {
    /// Forgets what the record holds (a grant, a ticket), keeping the reference; whether it
    /// held something.
    fn lose_grant(&mut self) -> bool {
        let bare = LocalLock::new(self.record.id, self.record.kind);
        let held = self.record != bare;
        self.record = bare;
        held
    }
}

/// The routes by cluster id.
#[derive(Debug, Default)]
pub(super) struct Routes {
    by_id: IdMap<u32, Route>,
    /// The cluster id of each (kind, name) the client referenced, so a second `GetLock` of a
    /// name gets the id it has (as a server answers the same client).
    by_name: HashMap<(LockKind, Vec<u8>), u32>,
    next: u32,
}

impl Routes {
    pub fn get(&self, id: u32) -> Option<&Route> {
        self.by_id.get(&id)
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut Route> {
        self.by_id.get_mut(&id)
    }

    /// A placeholder id for a record not filed yet ([`Routes::insert`] gives the real one).
    pub fn unfiled() -> LockId {
        LockId::new(0, 1)
    }

    pub fn by_name(&self, kind: LockKind, name: &[u8]) -> Option<u32> {
        self.by_name.get(&(kind, name.to_vec())).copied()
    }

    /// Files `route` (its record's id is overwritten) and returns its new cluster id: a valid
    /// [`LockId`] (slot `n` at generation 1, then the next generations once the slots wrap), so
    /// the client above takes it as a server's.
    pub fn insert(&mut self, mut route: Route) -> u32 {
        let lock = loop {
            self.next = self.next.wrapping_add(1);
            let index = self.next % SLOT_INDEX_LIMIT;
            let generation = 1 + (self.next / SLOT_INDEX_LIMIT) % GENERATION_MAX;
            let lock = LockId::new(index, generation);
            if !self.by_id.contains_key(&lock.raw()) {
                break lock;
            }
        };
        let id = lock.raw();
        route.record = LocalLock {
            id: lock,
            ..route.record
        };
        self.by_name
            .insert((route.record.kind, route.name.clone()), id);
        self.by_id.insert(id, route);
        id
    }

    pub fn remove(&mut self, id: u32) -> Option<Route> {
        let route = self.by_id.remove(&id)?;
        self.by_name
            .remove(&(route.record.kind, route.name.clone()));
        Some(route)
    }

    /// Writes into `ids` the cluster ids of the routes in `partition`, in name order (the
    /// order re-claims go in; a name in two kinds by id). Into a list the caller keeps, as the
    /// re-claim pass does (`Owed::pass`, `reclaim.rs`): it allocates only while the list grows
    /// to the most routes a partition had, not twice each pass.
    pub fn in_partition(&self, partition: u16, ids: &mut Vec<u32>) {
        ids.clear();
        ids.extend(
            (self.by_id.iter())
                .filter(|(_, r)| r.partition == partition)
                .map(|(&id, _)| id),
        );
        let name = |id: &u32| self.by_id.get(id).map(|r| r.name.as_slice());
        ids.sort_unstable_by(|a, b| (name(a), a).cmp(&(name(b), b)));
    }

    /// The partitions some route is in.
    pub fn partitions(&self) -> Vec<u16> {
        let mut ps: Vec<u16> = self.by_id.values().map(|r| r.partition).collect();
        ps.sort_unstable();
        ps.dedup();
        ps
    }

    /// Forgets what the records filed under `server` at `incarnation` held (grants, tickets),
    /// keeping their references: a registration there that may have lapsed took its grants
    /// with it. How many records held something.
    pub fn lose_grants_at(&mut self, server: ServerId, incarnation: u64) -> usize {
        let mut lost = 0;
        for r in self.filed_at(server, incarnation) {
            lost += usize::from(r.lose_grant());
        }
        lost
    }

    /// Forgets the records filed under `server` at `incarnation` whole, grants and references:
    /// the server said it does not know the client. Their references are got again by name
    /// at their next use. How many records held something.
    pub fn forget_at(&mut self, server: ServerId, incarnation: u64) -> usize {
        let mut lost = 0;
        for r in self.filed_at(server, incarnation) {
            lost += usize::from(r.lose_grant());
            r.server_lock = None;
        }
        lost
    }

    /// The records filed under `server` at `incarnation`: one pass over the table.
    fn filed_at(&mut self, server: ServerId, incarnation: u64) -> impl Iterator<Item = &mut Route> {
        (self.by_id.values_mut())
            .filter(move |r| (r.server, r.incarnation) == (server, incarnation))
    }

    pub fn clear(&mut self) {
        self.by_id.clear();
        self.by_name.clear();
    }
}
