//! Where each table sits in the region, computed once from the capacities.
//!
//! The region is one block (one `memmap2` mapping, one RDMA memory region). Every part starts on
//! a cache-line boundary so no two parts share a line, and the header has a page to itself. The
//! sum below is the whole footprint: nothing outside it is allocated for the tables, and nothing
//! in it grows.

use core::mem::size_of;

use crate::config::{BATCH_MAX, Config};
use crate::manager::{GrantState, LockValue};
use crate::table::cells::{
    ClientEntry, LockCell, LockManagerCell, LockMeta, NameCell, ObjectMeta, RegionHeader, Waiter,
};
use crate::table::events::EVENT_RING_WORDS;
use crate::table::index::{Bucket, Index};

/// Alignment of every part: a cache line (64 B) is enough for the atomics and keeps parts apart.
pub const PART_ALIGN: usize = 64;
/// The header's page.
pub const PAGE: usize = 4096;
/// One mailbox's request area: a full data request with a value block per command (2,000
/// bytes) and its sequence words, rounded to cache lines.
pub const MAILBOX_HALF: usize = 2048;
/// One mailbox's response area: a full data response with its value and proof trailers (2,744
/// bytes) and its sequence words, rounded to cache lines. Paid by every client slot whether or
/// not the server has a session key or a client asks for value blocks: the region's layout
/// depends on neither.
pub const MAILBOX_RESPONSE_HALF: usize = 2816;
/// Mailboxes per client ("lanes"): a client may have this many messages in flight over shared
/// memory, request `seq` in lane `seq % MAILBOX_LANES`, so that it writes its next batch while
/// the server executes the one before.
pub const MAILBOX_LANES: usize = 4;

static_assertions::const_assert!(16 + crate::proto::DATA_REQUEST_WITH_VALUES_MAX <= MAILBOX_HALF);
static_assertions::const_assert!(
    16 + crate::proto::DATA_RESPONSE_WITH_VALUES_MAX <= MAILBOX_RESPONSE_HALF
);
static_assertions::const_assert!(BATCH_MAX <= 31);

/// A byte range of the region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Part {
    /// Offset from the start of the region.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Part {
    /// One past the last byte.
    pub const fn end(self) -> usize {
        self.offset + self.len
    }
}

/// The offsets of every table for one set of capacities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Magic, layout version, capacities, epoch.
    pub header: Part,
    /// `locks_max` × [`LockCell`]: the lock words (data thread).
    pub lock_cells: Part,
    /// `locks_max` × [`LockMeta`]: generation, kind, liveness, reference count (control thread).
    pub lock_meta: Part,
    /// `locks_max` × [`NameCell`]: each live lock's name.
    pub lock_names: Part,
    /// The lock-name index.
    pub lock_index: Part,
    /// Free-slot stack for locks.
    pub lock_free: Part,
    /// `objects_max` × `AtomicU64`: the object values, changed one-sided by clients.
    pub object_cells: Part,
    /// `objects_max` × [`ObjectMeta`].
    pub object_meta: Part,
    /// `objects_max` × [`NameCell`].
    pub object_names: Part,
    /// The object-name index.
    pub object_index: Part,
    /// Free-slot stack for objects.
    pub object_free: Part,
    /// `clients_max` × [`ClientEntry`].
    pub clients: Part,
    /// Client-id index.
    pub client_index: Part,
    /// Free-slot stack for clients.
    pub client_free: Part,
    /// One bit per (client, lock): the client did `get_lock`.
    pub lock_refs: Part,
    /// Four bits per (client, lock): what the client holds, a [`GrantState`].
    pub lock_holds: Part,
    /// One bit per (client, object): the client did object `get`.
    pub object_refs: Part,
    /// `clients_max` × [`Waiter`]: one parked blocking-lock request per client.
    pub waiters: Part,
    /// `locks_max` × [`LockValue`]: each lock's value block, its write count and validity.
    pub lock_values: Part,
    /// `locks_max` × [`LockManagerCell`]: grant and revoke times for the revoke decision.
    pub lock_manager: Part,
    /// `clients_max` × 1,152 B: each client's event ring (`table::events`), written by the
    /// data thread and read by the client.
    pub event_rings: Part,
    /// `locks_max` × `u32`: the first waiter of each lock's FIFO (waiter slot + 1, 0 = none).
    pub lock_waiters: Part,
    /// `clients_max` × (request 1 KiB + response 1 KiB), interpreted by the shared-memory
    /// transport; the core never reads them.
    pub mailboxes: Part,
    /// One bit per client, rung after a request is written.
    pub doorbells: Part,
    /// Total bytes.
    pub total: usize,
}

/// 64-bit words needed for `n` entries of `bits` bits.
pub const fn words_for(n: u32, bits: usize) -> usize {
    (n as usize * bits).div_ceil(64)
}

struct Cursor(usize);

impl Cursor {
    fn take(&mut self, len: usize, align: usize) -> Part {
        let offset = self.0.next_multiple_of(align);
        self.0 = offset + len;
        Part { offset, len }
    }

    fn array<T>(&mut self, n: usize) -> Part {
        self.take(n * size_of::<T>(), PART_ALIGN)
    }
}

impl Layout {
    /// The layout for `cfg` (which the caller has validated).
    pub fn new(cfg: &Config) -> Self {
        let (locks, objects, clients) = (cfg.locks_max, cfg.objects_max, cfg.clients_max);
        let mut c = Cursor(0);
        let header = c.take(size_of::<RegionHeader>().next_multiple_of(PAGE), PAGE);
        let lock_cells = c.array::<LockCell>(locks as usize);
        let lock_meta = c.array::<LockMeta>(locks as usize);
        let lock_names = c.array::<NameCell>(locks as usize);
        let lock_index = c.array::<Bucket>(Index::buckets_for(locks));
        let lock_free = c.array::<u32>(locks as usize);
        let object_cells = c.array::<u64>(objects as usize);
        let object_meta = c.array::<ObjectMeta>(objects as usize);
        let object_names = c.array::<NameCell>(objects as usize);
        let object_index = c.array::<Bucket>(Index::buckets_for(objects));
        let object_free = c.array::<u32>(objects as usize);
        let clients_part = c.array::<ClientEntry>(clients as usize);
        let client_index = c.array::<Bucket>(Index::buckets_for(clients));
        let client_free = c.array::<u32>(clients as usize);
        let lock_refs = c.array::<u64>(clients as usize * words_for(locks, 1));
        let lock_holds =
            c.array::<u64>(clients as usize * words_for(locks, GrantState::BITS as usize));
        let object_refs = c.array::<u64>(clients as usize * words_for(objects, 1));
        let waiters = c.array::<Waiter>(clients as usize);
        let lock_waiters = c.array::<u32>(locks as usize);
        let lock_values = c.array::<LockValue>(locks as usize);
        let lock_manager = c.array::<LockManagerCell>(locks as usize);
        let event_rings = c.array::<u64>(clients as usize * EVENT_RING_WORDS);
        let mailbox = MAILBOX_HALF + MAILBOX_RESPONSE_HALF;
        let mailboxes = c.take(clients as usize * MAILBOX_LANES * mailbox, PAGE);
        let doorbells = c.array::<u64>(words_for(clients, 1));
        let total = c.0.next_multiple_of(PAGE);
        Self {
            header,
            lock_cells,
            lock_meta,
            lock_names,
            lock_index,
            lock_free,
            object_cells,
            object_meta,
            object_names,
            object_index,
            object_free,
            clients: clients_part,
            client_index,
            client_free,
            lock_refs,
            lock_holds,
            object_refs,
            waiters,
            lock_waiters,
            lock_values,
            lock_manager,
            event_rings,
            mailboxes,
            doorbells,
            total,
        }
    }

    /// Every part, in address order (for the disjointness check and the README footprint).
    pub fn parts(&self) -> [(&'static str, Part); 24] {
        [
            ("header", self.header),
            ("lock cells", self.lock_cells),
            ("lock meta", self.lock_meta),
            ("lock names", self.lock_names),
            ("lock index", self.lock_index),
            ("lock free list", self.lock_free),
            ("object cells", self.object_cells),
            ("object meta", self.object_meta),
            ("object names", self.object_names),
            ("object index", self.object_index),
            ("object free list", self.object_free),
            ("clients", self.clients),
            ("client index", self.client_index),
            ("client free list", self.client_free),
            ("lock references", self.lock_refs),
            ("lock holds", self.lock_holds),
            ("object references", self.object_refs),
            ("waiters", self.waiters),
            ("lock waiter queues", self.lock_waiters),
            ("lock value blocks", self.lock_values),
            ("lock manager cells", self.lock_manager),
            ("event rings", self.event_rings),
            ("mailboxes", self.mailboxes),
            ("doorbells", self.doorbells),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_aligned_disjoint_and_inside_the_total() {
        for cfg in [
            Config::default(),
            Config {
                locks_max: 1,
                clients_max: 1,
                objects_max: 1,
                ..Config::default()
            },
        ] {
            let l = Layout::new(&cfg);
            let parts = l.parts();
            for w in parts.windows(2) {
                assert!(
                    w[0].1.end() <= w[1].1.offset,
                    "{} overlaps {}",
                    w[0].0,
                    w[1].0
                );
            }
            for (name, p) in parts {
                assert_eq!(p.offset % PART_ALIGN, 0, "{name}");
                assert!(p.end() <= l.total, "{name}");
            }
            assert_eq!(l.total % PAGE, 0);
        }
    }

    #[test]
    fn default_footprint_is_what_the_readme_says() {
        // The README quotes this figure; if the layout changes, update both.
        let total = Layout::new(&Config::default()).total;
        assert_eq!(total, 159_629_312, "{total} bytes");
    }
}
