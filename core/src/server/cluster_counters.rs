//! Counters in a cluster: fetch-and-add and compare-and-swap move a cluster object only up to
//! its persisted high-water mark (`cluster::counter`), reservations ahead travel to the
//! membership and back, and a new owner adopts each counter at its mark.

use super::Server;
use super::cluster::RESERVE_QUEUE_MAX;
use crate::cluster::counter::Reserve;
use crate::status::Status;
use crate::table::SlotState;

impl<'r> Server<'r> {
    /// A `Reserve` the membership persisted: the counter may now go up to `mark`.
    pub fn mark_confirmed(&mut self, object: u32, mark: u64) {
        if let Some(index) = self.live_object_slot(object) {
            let meta = &mut self.t.object_meta[index as usize];
            let mut r = meta.reserve();
            r.confirmed(mark);
            meta.set_reserve(r);
        }
    }

    /// A `Reserve` that failed: asked again at the next fetch-and-add that needs it.
    pub fn mark_failed(&mut self, object: u32) {
        if let Some(index) = self.live_object_slot(object) {
            let meta = &mut self.t.object_meta[index as usize];
            let mut r = meta.reserve();
            r.failed();
            meta.set_reserve(r);
        }
    }

    /// The slot of object `raw` if it is live at the id's generation.
    fn live_object_slot(&self, raw: u32) -> Option<u32> {
        let id = crate::ids::ObjectId::from_raw(raw)?;
        let meta = self.t.object_meta.get(id.index() as usize)?;
        let state = SlotState(meta.state);
        (state.is_live() && state.generation() == id.generation()).then_some(id.index())
    }

    /// Whether a counter in a cluster may move from its value to `to`; when it runs low, queues
    /// a reservation ahead. Standalone: always.
    pub(super) fn counter_gate(&mut self, index: u32, object: u32, value: u64, to: u64) -> bool {
        let Some(c) = self.cluster.as_mut() else {
            return true;
        };
        let meta = &mut self.t.object_meta[index as usize];
        let mut r = meta.reserve();
        let ask = r.wants(to.max(value), c.counter_step);
        if ask.is_some() {
            if c.reserve_len < RESERVE_QUEUE_MAX {
                c.reserve_queue[c.reserve_len] = object;
                c.reserve_len += 1;
            } else {
                // No room to ask now: forget the ask, the next fetch-and-add asks again.
                r.failed();
            }
        }
        meta.set_reserve(r);
        crate::cluster::counter::may_advance(to, r.persisted)
    }

    /// A counter's state for a new owner: the object `name` of `partition` starts at
    /// `start_value(mark)`, with `mark` persisted. Creates the object (ownerless, so the first
    /// client to create it takes it, as an orphan is taken) if it does not exist.
    pub fn counter_mark(&mut self, name: &[u8], mark: u64, now_ms: u64) -> Result<(), Status> {
        let Some(c) = self.cluster.as_ref() else {
            return Err(Status::Einval);
        };
        let p = crate::cluster::partition_of(name, c.side.map.partitions());
        let start = crate::cluster::counter::start_value(mark);
        let index = self.adopt_object(name, p, start, now_ms)?;
        let meta = &mut self.t.object_meta[index as usize];
        let mut r = meta.reserve();
        r.confirmed(mark);
        meta.set_reserve(r);
        Ok(())
    }
}

/// Reservation state in an object's metadata: the confirmed mark in `spare`, a reservation in
/// flight as `reserved = 1`. The mark asked for is not kept: the request is built from the
/// counter's value when the runtime takes it ([`Server::cluster_work`]), which is at least the
/// value it was asked at, so the mark persisted is at least the one `Reserve::wants` chose.
trait ReserveMeta {
    fn reserve(&self) -> Reserve;
    fn set_reserve(&mut self, r: Reserve);
}

impl ReserveMeta for crate::table::ObjectMeta {
    #[inline]
    fn reserve(&self) -> Reserve {
        Reserve {
            persisted: self.spare,
            // Any confirmation ends the one reservation in flight (`Reserve::confirmed` clears
            // an ask at or below the mark).
            asked: (self.reserved != 0).then_some(0),
        }
    }

    #[inline]
    fn set_reserve(&mut self, r: Reserve) {
        self.spare = r.persisted;
        self.reserved = u32::from(r.asked.is_some());
    }
}
