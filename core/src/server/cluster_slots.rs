//! The cluster's hooks into the data path and the tables: the check before each command, parked
//! requests of a partition that moved, the slots of a lost partition, counters a new owner
//! adopts. The rules are in `cluster.rs`'s module doc.

use super::Server;
use super::cluster::verdict_status;
use crate::cluster::Class;
use crate::cluster::PARTITIONS_MAX;
use crate::ids::{LockId, next_generation};
use crate::manager::GrantState;
use crate::proto::{Command, CommandResult, LockOp};
use crate::status::Status;
use crate::table::{ObjectMeta, SlotState, WaiterState};

/// Whether partition `p` is set in a mask of [`PARTITIONS_MAX`] bits.
#[inline]
fn in_mask(mask: &[u64; PARTITIONS_MAX as usize / 64], p: u16) -> bool {
    mask[usize::from(p) / 64] & 1 << (p % 64) != 0
}

impl<'r> Server<'r> {
    /// On a cluster server, the answer to command `cmd` of client `slot` when its partition is
    /// not served at the epoch it names (`cluster::check`): `PartitionMoved` with the map
    /// version in `aux`, `NotReady`, or `Fail`; `None` to execute it. A command naming a slot
    /// the client does not reference is left to the command itself to refuse. Also `NotReady`
    /// for a grant while the client's id is not persisted, or the partition's token counter is
    /// exhausted until its renewal. Standalone: one branch, `None`.
    #[inline]
    pub(super) fn cluster_refusal(
        &mut self,
        slot: u32,
        cmd: &Command,
        now_ms: u64,
    ) -> Option<CommandResult> {
        self.cluster.as_ref()?;
        self.cluster_refusal_slow(slot, cmd, now_ms)
    }

    #[cold]
    fn cluster_refusal_slow(
        &mut self,
        slot: u32,
        cmd: &Command,
        now_ms: u64,
    ) -> Option<CommandResult> {
        let (partition, epoch, grants) = match cmd {
            Command::Lock(c) => {
                let id = self.referenced_lock(slot, c.lock).ok()?;
                let grants = matches!(
                    c.op,
                    LockOp::TryExclusive
                        | LockOp::TryShared
                        | LockOp::TicketExclusive
                        | LockOp::TicketShared
                );
                (self.lock_partition(id.index()), c.partition_epoch, grants)
            }
            Command::Object(o) => {
                let index = self.referenced_object(slot, o.object)?;
                let state = SlotState(self.t.object_meta[index as usize].state);
                (state.partition(), o.partition_epoch, false)
            }
            Command::Join(_) => return None,
        };
        let refused = |status, aux| CommandResult {
            aux,
            ..CommandResult::status(status)
        };
        if let Some((status, aux)) = self.command_verdict(partition, epoch, Class::Ordinary, now_ms)
        {
            return Some(refused(self.refuse(status), aux));
        }
        if grants && (!self.grantable_client(slot) || !self.tokens_left(partition)) {
            return Some(refused(self.refuse(Status::NotReady), 0));
        }
        None
    }

    /// Whether `partition`'s token counter can issue another token.
    fn tokens_left(&self, partition: u16) -> bool {
        self.cluster.as_ref().is_none_or(|c| {
            let mut t = c.side.parts[usize::from(partition)].tokens;
            t.issue().is_ok()
        })
    }

    /// The answer to a parked request on `raw_lock` that must not be granted now: its
    /// partition is not served here at its current epoch (moved, fenced, recovering).
    pub(super) fn parked_refusal(&self, raw_lock: u32, now_ms: u64) -> Option<(Status, u64)> {
        let c = self.cluster.as_ref()?;
        let id = LockId::from_raw(raw_lock)?;
        let p = self.lock_partition(id.index());
        verdict_status(c.verdict(p, c.epoch_of(p), Class::Ordinary, now_ms))
    }

    /// Answers `PartitionMoved` to every parked request on a lock of a partition in `moved`
    /// (its owner or epoch changed): a grant made later would be proved at an epoch the
    /// client did not send, or by a server that no longer owns the lock.
    pub(super) fn answer_moved_waiters(
        &mut self,
        moved: &[u64; PARTITIONS_MAX as usize / 64],
        now_ms: u64,
    ) {
        if self.waiting == 0 {
            return;
        }
        let version = self.map_version().unwrap_or(0);
        for w in 0..self.t.client_free.high_water() {
            let waiter = self.t.waiters[w as usize];
            if waiter.state != WaiterState::Waiting as u8 {
                continue;
            }
            let Some(id) = LockId::from_raw(waiter.lock) else {
                continue;
            };
            if in_mask(moved, self.lock_partition(id.index())) {
                let r = CommandResult {
                    aux: version,
                    ..CommandResult::status(Status::PartitionMoved)
                };
                self.finish_waiter(w, r, now_ms);
            }
        }
    }

    /// Frees every lock slot of the partitions in `lost`: their grants can no longer be
    /// believed in (the grace of `cluster_tick`), and the new owner has what was re-claimed.
    /// Clients that still reference them find their ids stale.
    pub(super) fn free_lost_slots(
        &mut self,
        lost: &[u64; PARTITIONS_MAX as usize / 64],
        now_ms: u64,
    ) {
        let clients = self.t.client_free.high_water();
        for lock in 0..self.t.lock_free.high_water() {
            let state = SlotState(self.t.lock_meta[lock as usize].state);
            if !state.is_live() || !in_mask(lost, state.partition()) {
                continue;
            }
            let id = LockId::new(lock, state.generation());
            for slot in 0..clients {
                if self.t.waiters[slot as usize].lock == id.raw() {
                    self.cancel_parked_in(Some(slot), self.t.waiters[slot as usize].client, now_ms);
                }
                if self.t.lock_refs.get(slot, lock) != 0 {
                    self.t.lock_holds.set(slot, lock, GrantState::None.bits());
                    // The last reference frees the slot (`drop_lock_ref`).
                    self.drop_lock_ref(slot, id);
                }
            }
        }
    }

    /// The object `name` of `partition` for a counter a new owner starts at `start`: found (its
    /// value raised to `start` if below: a value the old owner may have handed out must never
    /// come again) or created ownerless.
    pub(super) fn adopt_object(
        &mut self,
        name: &[u8],
        partition: u16,
        start: u64,
        now_ms: u64,
    ) -> Result<u32, Status> {
        use core::sync::atomic::Ordering;
        if !super::locks::valid_name(name) {
            return Err(Status::Einval);
        }
        let hash = crate::table::index::hash_name(self.name_key, name);
        let names = &*self.t.object_names;
        if let Some(index) = self
            .t
            .object_index
            .find(hash, |i| names[i as usize].name() == name)
        {
            // AcqRel: as the data path's read-modify-writes (`data.rs`).
            self.t.object_cells[index as usize].fetch_max(start, Ordering::AcqRel);
            return Ok(index);
        }
        let index = self.t.object_free.pop().ok_or(Status::ObjectTooMany)?;
        let generation =
            next_generation(SlotState(self.t.object_meta[index as usize].state).generation());
        self.t.object_meta[index as usize] = ObjectMeta {
            state: SlotState::live(generation, crate::LockKind::Atomic)
                .in_partition(partition)
                .0,
            // Ownerless: the first client to create it takes it, as an orphan is taken.
            owner: 0,
            refs: 0,
            lease_until_ms: now_ms,
            ..ObjectMeta::default()
        };
        self.t.object_names[index as usize].set(hash, name);
        self.t.object_index.insert(hash, index);
        // Release: as `create_for`'s store.
        self.t.object_cells[index as usize].store(start, Ordering::Release);
        Ok(index)
    }
}
