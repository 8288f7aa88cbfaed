//! `umo_atomic64` objects: create, get, release, destroy (control path).
//!
//! Semantics follow the reference (§3 of `shared/reference/dlock-reference.md`): creating is
//! not a reference (the creator must `get` too); a repeated create by the owner (or of an
//! orphaned object) extends the lease and reports `ObjectAlreadyCreated`; destroy is owner-only
//! and deferred while other clients still reference the object within its lease; re-creating a
//! destroyed-but-lingering object keeps its value — for XID and CSN counters that is the safe
//! choice, since the value never goes backwards. Leases are in seconds, as in the C API.

use core::sync::atomic::Ordering;

use super::locks::valid_name;
use super::{Counter, Server, past};
use crate::ids::{ClientId, ObjectId, next_generation};
use crate::status::Status;
use crate::table::{ObjectMeta, SlotState};

impl<'r> Server<'r> {
    /// Creates object `name` with value `init` and a lease of `lease_s` seconds (must be > 0).
    pub fn object_create(
        &mut self,
        raw: u32,
        name: &[u8],
        init: u64,
        lease_s: u32,
        now_ms: u64,
    ) -> Result<ObjectId, Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(raw, now_ms)
            .map_err(|s| self.refuse(s))?;
        self.create_for(slot, name, init, lease_s, now_ms)
            .map_err(|s| self.refuse(s))
    }

    fn create_for(
        &mut self,
        slot: u32,
        name: &[u8],
        init: u64,
        lease_s: u32,
        now_ms: u64,
    ) -> Result<ObjectId, Status> {
        if !valid_name(name) || lease_s == 0 {
            return Err(Status::Einval);
        }
        let partition = self.partition_for_name(name, now_ms)?;
        let me = self.t.clients[slot as usize].id;
        let lease_until = now_ms.saturating_add(lease_s as u64 * 1_000);
        let hash = crate::table::index::hash_name(self.name_key, name);
        if let Some(index) = self.find_object(hash, name) {
            let meta = &mut self.t.object_meta[index as usize];
            let state = SlotState(meta.state);
            let id = ObjectId::new(index, state.generation());
            if state.is_destroyed() {
                if meta.refs != 0 && !past(now_ms, meta.lease_until_ms) {
                    return Err(Status::ObjectAlreadyDestroyed);
                }
                // Refresh a lingering destroyed object: new owner and lease, every old reference
                // dropped, value kept.
                *meta = ObjectMeta {
                    state: SlotState::live(state.generation(), crate::LockKind::Atomic)
                        .in_partition(partition)
                        .0,
                    owner: me,
                    refs: 0,
                    lease_until_ms: lease_until,
                    ..ObjectMeta::default()
                };
                self.drop_all_object_refs(index);
                return Ok(id);
            }
            if meta.owner == me || meta.owner == 0 {
                meta.owner = me;
                meta.lease_until_ms = meta.lease_until_ms.max(lease_until);
                return Err(Status::ObjectAlreadyCreated);
            }
            return Err(Status::ObjectAlreadyExisted);
        }
        let index = self.t.object_free.pop().ok_or(Status::ObjectTooMany)?;
        let generation =
            next_generation(SlotState(self.t.object_meta[index as usize].state).generation());
        self.t.object_meta[index as usize] = ObjectMeta {
            state: SlotState::live(generation, crate::LockKind::Atomic)
                .in_partition(partition)
                .0,
            owner: me,
            refs: 0,
            lease_until_ms: lease_until,
            ..ObjectMeta::default()
        };
        self.t.object_names[index as usize].set(hash, name);
        self.t.object_index.insert(hash, index);
        // Release pairs with the Acquire of a one-sided reader, but what really orders this store
        // before a client's first access is the control reply that tells it the cell. A stale
        // one-sided access from a client of the slot's previous occupant cannot be fenced off
        // (the reference has the same limit); the generation in the id stops it on the data path.
        self.t.object_cells[index as usize].store(init, Ordering::Release);
        Ok(ObjectId::new(index, generation))
    }

    /// Takes a reference to object `name` for `lease_s` seconds; returns its id and cell index.
    pub fn object_get(
        &mut self,
        raw: u32,
        name: &[u8],
        lease_s: u32,
        now_ms: u64,
    ) -> Result<(ObjectId, u32), Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(raw, now_ms)
            .map_err(|s| self.refuse(s))?;
        if !valid_name(name) {
            return Err(self.refuse(Status::Einval));
        }
        self.partition_for_name(name, now_ms)
            .map_err(|s| self.refuse(s))?;
        let hash = crate::table::index::hash_name(self.name_key, name);
        let index = self
            .find_object(hash, name)
            .ok_or_else(|| self.refuse(Status::ObjectNotCreate))?;
        let meta = &mut self.t.object_meta[index as usize];
        let state = SlotState(meta.state);
        if state.is_destroyed() {
            return Err(self.refuse(Status::ObjectAlreadyDestroyed));
        }
        meta.lease_until_ms = meta
            .lease_until_ms
            .max(now_ms.saturating_add(lease_s as u64 * 1_000));
        if self.t.object_refs.get(slot, index) == 0 {
            self.t.object_refs.set(slot, index, 1);
            meta.refs += 1;
            self.t.clients[slot as usize].object_refs += 1;
        }
        Ok((ObjectId::new(index, state.generation()), index))
    }

    /// Drops the client's reference; frees a destroyed object when it was the last (or its
    /// lease is over).
    pub fn object_release(&mut self, raw: u32, object: u32, now_ms: u64) -> Result<(), Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(raw, now_ms)
            .map_err(|s| self.refuse(s))?;
        let index = self
            .referenced_object(slot, object)
            .ok_or_else(|| self.refuse(Status::ObjectNotGet))?;
        self.drop_object_ref(slot, index, now_ms);
        Ok(())
    }

    /// Destroys the object (owner, or anyone once orphaned). Freed at once if nobody references
    /// it or its lease is over; otherwise when the last reference goes.
    pub fn object_destroy(&mut self, raw: u32, object: u32, now_ms: u64) -> Result<(), Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(raw, now_ms)
            .map_err(|s| self.refuse(s))?;
        let me = self.t.clients[slot as usize].id;
        let index = self
            .live_object(object)
            .ok_or_else(|| self.refuse(Status::ObjectNotCreate))?;
        let meta = &mut self.t.object_meta[index as usize];
        let state = SlotState(meta.state);
        if meta.owner != me && meta.owner != 0 {
            return Err(self.refuse(Status::ObjectInvalidOwner));
        }
        if state.is_destroyed() {
            return Err(self.refuse(Status::ObjectAlreadyDestroyed));
        }
        meta.state = state.destroyed().0;
        if meta.refs == 0 || past(now_ms, meta.lease_until_ms) {
            self.free_object(index);
        }
        Ok(())
    }

    /// The index of object `raw` if it is live at the id's generation.
    fn live_object(&self, raw: u32) -> Option<u32> {
        let id = ObjectId::from_raw(raw)?;
        let state = SlotState(self.t.object_meta.get(id.index() as usize)?.state);
        (state.is_live() && state.generation() == id.generation()).then_some(id.index())
    }

    fn find_object(&self, hash: u32, name: &[u8]) -> Option<u32> {
        let names = &*self.t.object_names;
        self.t
            .object_index
            .find(hash, |i| names[i as usize].name() == name)
    }

    fn drop_object_ref(&mut self, slot: u32, index: u32, now_ms: u64) {
        self.t.object_refs.set(slot, index, 0);
        self.t.clients[slot as usize].object_refs -= 1;
        let meta = &mut self.t.object_meta[index as usize];
        meta.refs -= 1;
        if SlotState(meta.state).is_destroyed()
            && (meta.refs == 0 || past(now_ms, meta.lease_until_ms))
        {
            self.free_object(index);
        }
    }

    /// Frees an object slot: every reference is dropped and the generation moves on at the next
    /// create, so stale ids are refused.
    fn free_object(&mut self, index: u32) {
        self.drop_all_object_refs(index);
        let meta = &mut self.t.object_meta[index as usize];
        let state = SlotState(meta.state);
        *meta = ObjectMeta {
            state: state.freed().0,
            ..ObjectMeta::default()
        };
        let hash = self.t.object_names[index as usize].hash;
        self.t.object_index.remove(hash, index);
        self.t.object_free.push(index);
    }

    /// Drops every client's reference to object `index` (the object is being freed or
    /// refreshed).
    fn drop_all_object_refs(&mut self, index: u32) {
        for slot in 0..self.t.client_free.high_water() {
            if self.t.object_refs.get(slot, index) != 0 {
                self.t.object_refs.set(slot, index, 0);
                self.t.clients[slot as usize].object_refs -= 1;
            }
        }
        self.t.object_meta[index as usize].refs = 0;
    }

    /// A client is going away: drop its object references and give up its ownerships — an
    /// owned object others still use within its lease is orphaned (anyone may destroy it), any
    /// other owned object is destroyed (as the reference does on eviction).
    ///
    /// In a cluster, a counter that moved under a persisted high-water mark is orphaned too,
    /// whoever uses it: destroyed, it would be re-created at the creator's initial value and
    /// hand out values it handed out before, which a cluster promises never to do (a new owner
    /// of its partition starts at the mark; the same owner must not do worse). Its value stays
    /// for the next creator, as across a failover. This differs from the reference, which
    /// destroys it; a standalone server still does.
    pub(super) fn release_all_objects(&mut self, slot: u32, me: ClientId, now_ms: u64) {
        let mut from = 0;
        while let Some((index, _)) = self.t.object_refs.next_in_row(slot, from) {
            from = index + 1;
            self.drop_object_ref(slot, index, now_ms);
        }
        let cluster = self.cluster.is_some();
        for index in 0..self.t.object_free.high_water() {
            let meta = &mut self.t.object_meta[index as usize];
            let state = SlotState(meta.state);
            if !state.is_live() || meta.owner != me.get() {
                continue;
            }
            // `spare` holds a cluster counter's persisted mark (`cluster_counters.rs`).
            let counted = cluster && meta.spare != 0;
            if counted || (meta.refs > 0 && !past(now_ms, meta.lease_until_ms)) {
                meta.owner = 0;
            } else {
                meta.state = state.destroyed().0;
                if meta.refs == 0 || past(now_ms, meta.lease_until_ms) {
                    self.free_object(index);
                }
            }
        }
    }
}
