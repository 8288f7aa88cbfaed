//! The fixed tables, laid over one caller-supplied region.
//!
//! [`Tables`] carves the region (see [`Layout`]) into typed slices once, at start. The region is
//! either a `&mut [u8]` the caller owns ([`Tables::format`], which zeroes it) or raw memory that
//! is already zero, such as a fresh anonymous or `/dev/shm` mapping ([`Tables::from_zeroed_raw`],
//! which never touches a page it does not need, so the resident size grows with use).
//!
//! Ownership inside the region: the lock cells and the holds grid belong to the data path; the
//! names, indexes, metadata, free lists, client table and reference grids belong to the control
//! path; the object cells are atomics shared with clients (one-sided operations); the mailboxes
//! and doorbells belong to the shared-memory transport and are never carved here.

pub mod bits;
pub mod cells;
pub mod events;
pub mod index;
pub mod layout;

use core::ptr::NonNull;
use core::sync::atomic::AtomicU64;

pub use bits::BitGrid;
pub use cells::{
    ClientEntry, ClientState, LockCell, LockManagerCell, LockMeta, NameCell, ObjectMeta, SlotState,
    Waiter, WaiterState,
};
pub use events::{EVENT_RING_LEN, EVENT_RING_WORDS, EventRing, EventRings};
pub use index::Index;
pub use layout::{Layout, Part};

use crate::config::Config;
#[cfg(doc)]
use crate::manager::GrantState;
use crate::manager::LockValue;
use crate::status::Status;
use cells::{LAYOUT_VERSION, Pod, REGION_MAGIC, RegionHeader};

/// A stack of free slot indexes, plus a high-water mark of never-used ones, so a zeroed region
/// needs no initialisation pass: slots are handed out fresh until the first one is freed.
#[derive(Debug)]
pub struct FreeList<'r> {
    stack: &'r mut [u32],
    len: u32,
    fresh: u32,
}

impl<'r> FreeList<'r> {
    fn new(stack: &'r mut [u32]) -> Self {
        Self {
            stack,
            len: 0,
            fresh: 0,
        }
    }

    /// A free slot index, or `None` when every slot is in use.
    #[inline]
    pub fn pop(&mut self) -> Option<u32> {
        if self.len > 0 {
            self.len -= 1;
            return Some(self.stack[self.len as usize]);
        }
        if (self.fresh as usize) < self.stack.len() {
            self.fresh += 1;
            return Some(self.fresh - 1);
        }
        None
    }

    /// Returns `index` (which `pop` handed out and is no longer used).
    #[inline]
    pub fn push(&mut self, index: u32) {
        // At most `fresh` slots were handed out, so the stack never overflows.
        debug_assert!(self.len < self.fresh);
        self.stack[self.len as usize] = index;
        self.len += 1;
    }

    /// Slots in use.
    #[inline]
    pub fn used(&self) -> u32 {
        self.fresh - self.len
    }

    /// One past the highest slot ever handed out: scans of live slots stop here.
    #[inline]
    pub fn high_water(&self) -> u32 {
        self.fresh
    }

    /// Total slots.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.stack.len() as u32
    }

    /// The slots handed back and not handed out again, most recent last (for
    /// `Server::check_invariants`).
    #[inline]
    pub fn free_slots(&self) -> &[u32] {
        &self.stack[..self.len as usize]
    }
}

/// Every table of one server, carved from its region.
#[derive(Debug)]
pub struct Tables<'r> {
    /// Where everything is.
    pub layout: Layout,
    /// Lock words (data path).
    pub lock_cells: &'r mut [LockCell],
    /// Lock identity and reference counts (control path).
    pub lock_meta: &'r mut [LockMeta],
    /// Lock names.
    pub lock_names: &'r mut [NameCell],
    /// Lock-name index.
    pub lock_index: Index<'r>,
    /// Free lock slots.
    pub lock_free: FreeList<'r>,
    /// Object values, shared with clients that change them one-sided.
    pub object_cells: &'r [AtomicU64],
    /// Object metadata.
    pub object_meta: &'r mut [ObjectMeta],
    /// Object names.
    pub object_names: &'r mut [NameCell],
    /// Object-name index.
    pub object_index: Index<'r>,
    /// Free object slots.
    pub object_free: FreeList<'r>,
    /// Client table.
    pub clients: &'r mut [ClientEntry],
    /// Client-id index.
    pub client_index: Index<'r>,
    /// Free client slots.
    pub client_free: FreeList<'r>,
    /// (client, lock): has a reference.
    pub lock_refs: BitGrid<'r, 1>,
    /// (client, lock): what it holds, a [`GrantState`]'s code.
    pub lock_holds: BitGrid<'r, { crate::manager::GrantState::BITS }>,
    /// (client, object): has a reference.
    pub object_refs: BitGrid<'r, 1>,
    /// Parked blocking-lock requests, one slot per client slot.
    pub waiters: &'r mut [Waiter],
    /// Per lock, the first waiter of its FIFO (waiter slot + 1, 0 = none).
    pub lock_waiters: &'r mut [u32],
    /// Per lock, its value block (data path; all zero is a fresh, valid block).
    pub lock_values: &'r mut [LockValue],
    /// Per lock, what the revoke decision needs beyond the word (data path).
    pub lock_manager: &'r mut [LockManagerCell],
    /// Per client slot, its event ring, shared with the client that reads it.
    pub event_rings: EventRings<'r>,
}

/// Typed view of one part.
///
/// # Safety
///
/// - `base` points to a region of at least `part.end()` bytes, valid for reads and writes for
///   `'r`.
/// - `base + part.offset` is aligned for `T` and `part.len` is a multiple of `size_of::<T>()`
///   (both follow from [`Layout`], whose parts are 64-byte aligned, given a 64-byte aligned base).
/// - Nothing else reads or writes those bytes during `'r` (parts are disjoint, and each part is
///   carved once).
unsafe fn carve<'r, T: Pod>(base: NonNull<u8>, part: Part) -> &'r mut [T] {
    let n = part.len / core::mem::size_of::<T>();
    // SAFETY: in bounds, aligned and exclusive by this function's contract; `T: Pod` makes any
    // byte pattern (zeroes in particular) a valid `T`.
    unsafe { core::slice::from_raw_parts_mut(base.as_ptr().add(part.offset).cast::<T>(), n) }
}

impl<'r> Tables<'r> {
    /// Zeroes `region`, writes the header and carves the tables. The region must be at least
    /// [`Config::region_size`] bytes and 64-byte aligned (a page-aligned mapping is).
    pub fn format(region: &'r mut [u8], cfg: &Config) -> Result<Self, Status> {
        cfg.validate()?;
        let layout = Layout::new(cfg);
        if region.len() < layout.total || region.as_ptr().align_offset(layout::PART_ALIGN) != 0 {
            return Err(Status::Einval);
        }
        region[..layout.total].fill(0);
        // From the slice's own pointer, so the carve may use every byte of it (a pointer made
        // from `&mut region[0]` would only have leave to touch the first).
        let base = NonNull::new(region.as_mut_ptr()).ok_or(Status::Einval)?;
        // SAFETY: `region` is borrowed mutably for 'r, is long enough and aligned (checked), and
        // is now all zeroes.
        unsafe { Self::from_zeroed_raw(base, region.len(), cfg) }
    }

    /// Carves the tables from memory that is already zero (a fresh mapping), touching only the
    /// header page.
    ///
    /// # Safety
    ///
    /// - `base` is 64-byte aligned and valid for reads and writes of `len` bytes for `'r`.
    /// - The first [`Config::region_size`] bytes are all zero.
    /// - During `'r`, nothing else accesses the region except the object cells and the event
    ///   rings (only through atomic operations), and the mailboxes and doorbells (which these
    ///   tables never touch).
    pub unsafe fn from_zeroed_raw(
        base: NonNull<u8>,
        len: usize,
        cfg: &Config,
    ) -> Result<Self, Status> {
        cfg.validate()?;
        let l = Layout::new(cfg);
        if len < l.total || base.as_ptr().align_offset(layout::PART_ALIGN) != 0 {
            return Err(Status::Einval);
        }
        // SAFETY: the parts of `l` are disjoint, 64-byte aligned and inside `l.total <= len`
        // bytes, and each is carved exactly once below; the caller guarantees the memory is valid,
        // zeroed and not otherwise accessed for 'r (the object cells only atomically).
        // `AtomicU64` has the size, alignment and bit validity of `u64`, so the unique `u64` view
        // of the object cells can become a shared atomic view (`AtomicU64::from_mut_slice`, not
        // yet stable); the `&mut` is consumed, so no non-atomic access to the cells remains.
        unsafe {
            write_header(carve::<u64>(base, l.header), cfg, &l);
            let cells = carve::<u64>(base, l.object_cells);
            let object_cells =
                core::slice::from_raw_parts(cells.as_mut_ptr().cast::<AtomicU64>(), cells.len());
            // The event rings are shared with their readers the same way.
            let rings = carve::<u64>(base, l.event_rings);
            let rings =
                core::slice::from_raw_parts(rings.as_mut_ptr().cast::<AtomicU64>(), rings.len());
            Ok(Self {
                layout: l,
                lock_cells: carve(base, l.lock_cells),
                lock_meta: carve(base, l.lock_meta),
                lock_names: carve(base, l.lock_names),
                lock_index: Index::new(carve(base, l.lock_index)),
                lock_free: FreeList::new(carve(base, l.lock_free)),
                object_cells,
                object_meta: carve(base, l.object_meta),
                object_names: carve(base, l.object_names),
                object_index: Index::new(carve(base, l.object_index)),
                object_free: FreeList::new(carve(base, l.object_free)),
                clients: carve(base, l.clients),
                client_index: Index::new(carve(base, l.client_index)),
                client_free: FreeList::new(carve(base, l.client_free)),
                lock_refs: BitGrid::new(carve(base, l.lock_refs), cfg.locks_max),
                lock_holds: BitGrid::new(carve(base, l.lock_holds), cfg.locks_max),
                object_refs: BitGrid::new(carve(base, l.object_refs), cfg.objects_max),
                waiters: carve(base, l.waiters),
                lock_waiters: carve(base, l.lock_waiters),
                lock_values: carve(base, l.lock_values),
                lock_manager: carve(base, l.lock_manager),
                event_rings: EventRings::new(rings),
            })
        }
    }
}

/// FNV-1a over 64-bit words: enough to tell whether two table states differ.
#[derive(Debug)]
struct Digest(u64);

impl Digest {
    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
}

impl Tables<'_> {
    /// A digest of every table except the clients' last-seen ticks (which any request renews).
    /// Two equal digests mean, with overwhelming probability, equal tables; tests use it to show
    /// that a refused request changed nothing.
    pub fn digest(&self) -> u64 {
        let mut d = Digest(0xcbf2_9ce4_8422_2325);
        for c in self.lock_cells.iter() {
            d.word(c.word as u64);
            d.word((c.word >> 64) as u64);
            d.word(c.fence);
            d.word(c.ext as u64 | (c.spare as u64) << 32);
        }
        for m in self.lock_meta.iter() {
            d.word(m.state as u64 | (m.refs as u64) << 32);
        }
        for n in self.lock_names.iter().chain(self.object_names.iter()) {
            d.word(n.hash as u64 | (n.len as u64) << 32);
            n.name().iter().for_each(|&b| d.word(b as u64));
        }
        for m in self.object_meta.iter() {
            d.word(m.state as u64 | (m.owner as u64) << 32);
            d.word(m.refs as u64);
            d.word(m.lease_until_ms);
        }
        for c in self.object_cells {
            d.word(c.load(core::sync::atomic::Ordering::Relaxed));
        }
        for c in self.clients.iter() {
            d.word(c.id as u64 | (c.state as u64) << 32 | (c.version as u64) << 40);
            d.word(c.lease_ms as u64 | (c.lock_refs as u64) << 32);
            d.word(c.object_refs as u64);
        }
        for idx in [&self.lock_index, &self.object_index, &self.client_index] {
            idx.words().for_each(|w| d.word(w));
        }
        for f in [&self.lock_free, &self.object_free, &self.client_free] {
            d.word(f.len as u64 | (f.fresh as u64) << 32);
            f.stack[..f.len as usize]
                .iter()
                .for_each(|&i| d.word(i as u64));
        }
        self.lock_refs
            .words()
            .chain(self.object_refs.words())
            .for_each(|w| d.word(w));
        self.lock_holds.words().for_each(|w| d.word(w));
        for w in self.waiters.iter() {
            d.word(w.state as u64 | (w.client as u64) << 8 | (w.lock as u64) << 40);
            d.word(w.next as u64 | (w.status as u64) << 32);
        }
        self.lock_waiters.iter().for_each(|&h| d.word(h as u64));
        for v in self.lock_values.iter() {
            let r = v.read();
            let (words, _) = r.block.0.as_chunks::<8>();
            words.iter().for_each(|&w| d.word(u64::from_le_bytes(w)));
            d.word(r.seq as u64 | (r.valid as u64) << 32);
        }
        for m in self.lock_manager.iter() {
            d.word(m.cached_since_ms);
            d.word(m.revoke_sent_ms);
            d.word(m.contended_ms);
            d.word(m.retry_at_ms);
            d.word(m.cached as u64 | (m.deferred_revoke as u64) << 32);
        }
        d.0
    }
}

/// Writes the header through its `u64` view (the header part is a page of zeroes).
fn write_header(words: &mut [u64], cfg: &Config, l: &Layout) {
    let h = RegionHeader {
        magic: REGION_MAGIC,
        layout_version: LAYOUT_VERSION,
        epoch: cfg.epoch as u32,
        locks_max: cfg.locks_max,
        clients_max: cfg.clients_max,
        objects_max: cfg.objects_max,
        reserved: 0,
        region_size: l.total as u64,
    };
    words[0] = h.magic;
    words[1] = h.layout_version as u64 | (h.epoch as u64) << 32;
    words[2] = h.locks_max as u64 | (h.clients_max as u64) << 32;
    words[3] = h.objects_max as u64 | (h.reserved as u64) << 32;
    words[4] = h.region_size;
}

/// Reads a region header back (for a process attaching to a shared region, and for tests):
/// `None` unless the magic matches and the layout is this build's ([`LAYOUT_VERSION`]), so a
/// client never maps a region another build laid out differently.
pub fn read_header(region: &[u8]) -> Option<RegionHeader> {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(
            region.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    let h = RegionHeader {
        magic: word(0)?,
        layout_version: word(1)? as u32,
        epoch: (word(1)? >> 32) as u32,
        locks_max: word(2)? as u32,
        clients_max: (word(2)? >> 32) as u32,
        objects_max: word(3)? as u32,
        reserved: (word(3)? >> 32) as u32,
        region_size: word(4)?,
    };
    (h.magic == REGION_MAGIC && h.layout_version == LAYOUT_VERSION).then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_only_under_this_layout_version() {
        let cfg = Config {
            locks_max: 64,
            clients_max: 8,
            objects_max: 8,
            ..Config::default()
        };
        let l = Layout::new(&cfg);
        let mut words = [0u64; 5];
        write_header(&mut words, &cfg, &l);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let h = read_header(&bytes).expect("this build's header");
        assert_eq!((h.locks_max, h.clients_max), (64, 8));
        assert_eq!(h.region_size as usize, l.total);
        // Another build's layout (an older one had a single mailbox per client) is refused.
        let mut older = words;
        older[1] = (older[1] & !0xFFFF_FFFF) | u64::from(LAYOUT_VERSION - 1);
        let bytes: Vec<u8> = older.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert!(read_header(&bytes).is_none());
    }
}
