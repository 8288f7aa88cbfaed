//! The fixed-size records the tables are made of, with their sizes asserted.
//!
//! Every record is plain data (integers only), so any byte pattern is a valid value and a zeroed
//! region is a valid empty table; `Pod` marks exactly these types for the one place that turns
//! region bytes into typed slices.

use core::mem::{align_of, size_of};

use static_assertions::const_assert_eq;

use crate::config::NAME_LEN_MAX;
use crate::ids::{GENERATION_MAX, LockKind, Session};
use crate::proto::PROTO_VERSION_PLAIN_GRANTS;

/// Types for which every byte pattern is a valid value and that have no padding bytes whose
/// reads would matter: integers, arrays of them, and `repr(C)` structs of those.
///
/// # Safety
///
/// - Every bit pattern of `size_of::<Self>()` bytes must be a valid `Self`.
/// - `Self` must not contain references, pointers or `UnsafeCell`s.
pub(crate) unsafe trait Pod: Sized {}

// SAFETY: integers accept every bit pattern and hold no pointers.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: repr(C) structs of integers only (checked field by field below).
unsafe impl Pod for LockCell {}
// SAFETY: as above.
unsafe impl Pod for LockMeta {}
// SAFETY: as above.
unsafe impl Pod for NameCell {}
// SAFETY: as above.
unsafe impl Pod for ObjectMeta {}
// SAFETY: as above.
unsafe impl Pod for ClientEntry {}
// SAFETY: as above.
unsafe impl Pod for crate::table::index::Bucket {}
// SAFETY: as above.
unsafe impl Pod for Waiter {}
// SAFETY: as above (`repr(C)`: a byte array and two `u32`s, no padding, 40 bytes).
unsafe impl Pod for crate::manager::LockValue {}
// SAFETY: repr(C) struct of integers only (checked below).
unsafe impl Pod for LockManagerCell {}

/// First bytes of every region: `b"DLOCKRGN"` little-endian.
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"DLOCKRGN");
/// Bumped whenever any record or the order of parts changes (2: four mailbox lanes per client;
/// 3: 128-bit session secrets in the client entries; 4: client flags, and response halves that
/// hold a data response with its grant proofs; 5: four-bit holds entries, a
/// [`crate::manager::GrantState`] each, and a value block per lock; 6: a [`LockManagerCell`]
/// per lock and an event ring per client; 7: the [`LockManagerCell`]'s `contended_ms`).
pub const LAYOUT_VERSION: u32 = 7;

/// The region header: enough for another process to recompute the [`super::Layout`].
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// Server epoch (high bits of fencing tokens).
    pub epoch: u32,
    /// Capacities the layout was computed from.
    pub locks_max: u32,
    /// See `Config::clients_max`.
    pub clients_max: u32,
    /// See `Config::objects_max`.
    pub objects_max: u32,
    /// Reserved for future fields; zero.
    pub reserved: u32,
    /// Total region bytes.
    pub region_size: u64,
}

/// A lock slot's data-thread half: the word and what the data thread keeps beside it.
///
/// 32 bytes, two per cache line; only the data thread reads or writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(32))]
pub struct LockCell {
    /// The kind-specific lock word (`AtomicWord`, `RwWord` or `FairWord`).
    pub word: u128,
    /// The fencing token of the most recent grant on this lock.
    pub fence: u64,
    /// Fair lock: the exclusive holder (the reference's server-only extension). 0 otherwise.
    pub ext: u32,
    /// Spare, zero: room for a future lock kind without changing the layout.
    pub spare: u32,
}

const_assert_eq!(size_of::<LockCell>(), 32);
const_assert_eq!(align_of::<LockCell>(), 32);

/// A lock slot's control half: identity and reference count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct LockMeta {
    /// Bits 0..11 generation, 11..13 kind, bit 13 live (see [`SlotState`]).
    pub state: u32,
    /// Clients holding a reference (`get_lock` without `release_lock`).
    pub refs: u32,
}

const_assert_eq!(size_of::<LockMeta>(), 8);

/// A name, stored whole (names are never truncated), with its hash so the index and a rehash
/// never need to read the bytes twice.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct NameCell {
    /// The keyed hash of the name (the index tag).
    pub hash: u32,
    /// Length in bytes, 1..=512.
    pub len: u16,
    /// Zero.
    pub pad: u16,
    /// The name; bytes past `len` are zero.
    pub bytes: [u8; NAME_LEN_MAX],
}

const_assert_eq!(size_of::<NameCell>(), 8 + NAME_LEN_MAX);

impl NameCell {
    /// The stored name.
    #[inline]
    pub fn name(&self) -> &[u8] {
        &self.bytes[..(self.len as usize).min(NAME_LEN_MAX)]
    }

    /// Stores `name` (1..=512 bytes, checked by the caller) under `hash`.
    pub fn set(&mut self, hash: u32, name: &[u8]) {
        self.hash = hash;
        self.len = name.len() as u16;
        self.bytes[..name.len()].copy_from_slice(name);
        self.bytes[name.len()..].fill(0);
    }
}

/// An object slot's control data (the value itself is an `AtomicU64` cell of its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ObjectMeta {
    /// Bits 0..11 generation, bit 13 live, bit 14 destroyed (see [`SlotState`]).
    pub state: u32,
    /// Creator; 0 once orphaned (the creator went away while others still used it).
    pub owner: u32,
    /// Clients holding a reference (object `get` without `release`).
    pub refs: u32,
    /// Zero on a standalone server; on a cluster server 1 while a reservation of the counter's
    /// high-water mark is in flight (`server::cluster_counters`).
    pub reserved: u32,
    /// The latest lease deadline any client asked for (create or get), in ticks.
    pub lease_until_ms: u64,
    /// Zero on a standalone server; on a cluster server the counter's high-water mark the
    /// membership confirmed persisted (`server::cluster_counters`).
    pub spare: u64,
}

const_assert_eq!(size_of::<ObjectMeta>(), 32);

/// Life stage of a client entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientState {
    /// Unused entry.
    Free = 0,
    /// Registered and heard from within its lease.
    Active = 1,
    /// Its transport reported the connection lost; its locks stay held until its lease ends or
    /// it re-registers (`client_reinit`), and it is the first evicted when the table is full.
    Abnormal = 2,
    /// Re-registered during server recovery and still re-syncing its locks.
    Recovering = 3,
    /// Dead, keeping the grants it asked to be retained (`manager::retain`) until a recoverer's
    /// `recovery_done`: out of the client index (nothing speaks for it), its slot not reused,
    /// counted against its peer's cap, no lease.
    Retaining = 4,
}

/// A registered client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct ClientEntry {
    /// The client id (0 when the entry is free).
    pub id: u32,
    /// A [`ClientState`] as `u8`.
    pub state: u8,
    /// Negotiated protocol version.
    pub version: u8,
    /// [`ClientEntry::REINITING`] and [`ClientEntry::RECOVERED`].
    pub flags: u8,
    /// Zero.
    pub pad: u8,
    /// The client's lease: silence longer than this declares it dead.
    pub lease_ms: u32,
    /// Lock references held (so cleanup can skip a client with none).
    pub lock_refs: u32,
    /// Tick of the last request (any traffic counts as a heartbeat).
    pub last_seen_ms: u64,
    /// Object references held.
    pub object_refs: u32,
    /// The tag of the peer it registered from ([`crate::Peer`]; 0: a local client, exempt from
    /// the per-peer cap). It takes what was spare room: the entry keeps its size and layout.
    pub peer: u32,
    /// The registration's secret (see `InitReply::session`).
    pub session: Session,
}

const_assert_eq!(size_of::<ClientEntry>(), 48);

impl ClientEntry {
    /// Flag: the client re-registered (`client_reinit`) and has not said `reinit_done` since.
    pub const REINITING: u8 = 1;
    /// Flag: the entry was created by a re-registration while the server recovered, so the
    /// client may re-send the claims it made then (see `Server::update_lock`).
    pub const RECOVERED: u8 = 2;
    /// Flag (cluster servers): the membership persisted the client's id, so a successor that
    /// takes over a partition waits for this client's re-claims; only then may it be granted
    /// (`server::cluster`).
    pub const PERSISTED: u8 = 4;

    /// Whether flag `f` is set.
    #[inline]
    pub const fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// The entry's state (an unknown byte reads as `Free`; the server only writes valid ones).
    #[inline]
    pub fn client_state(&self) -> ClientState {
        match self.state {
            1 => ClientState::Active,
            2 => ClientState::Abnormal,
            3 => ClientState::Recovering,
            4 => ClientState::Retaining,
            _ => ClientState::Free,
        }
    }

    /// Whether the client's lease ran out before `now_ms` (seen last at `last_seen_ms`;
    /// strictly past, as the reference compares).
    #[inline]
    pub const fn lease_over(&self, now_ms: u64) -> bool {
        now_ms > self.last_seen_ms.saturating_add(self.lease_ms as u64)
    }

    /// Whether the client reads a plain grant's mark in the grant's own result
    /// (`CommandResult::plain`, protocol 8 on): an older one is told by a revoke notice in its
    /// event ring instead (`manager::contention`).
    #[inline]
    pub const fn reads_plain_grants(&self) -> bool {
        self.version >= PROTO_VERSION_PLAIN_GRANTS
    }

    /// Resumes this live registration for its client, back at protocol `version` (a
    /// `client_reinit`, or a cluster join of a session registered here): seen now, and no
    /// longer abnormal, since it is talking to us again.
    #[inline]
    pub fn resume(&mut self, version: u8, now_ms: u64) {
        self.last_seen_ms = now_ms;
        self.version = version;
        if self.client_state() == ClientState::Abnormal {
            self.state = ClientState::Active as u8;
        }
    }
}

/// The packed identity of a lock or object slot: generation (bits 0..11), kind (11..13), live
/// (13), destroyed (14), and on a cluster server the name's partition (16..28; 0 standalone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotState(pub u32);

impl SlotState {
    const KIND_SHIFT: u32 = 11;
    const LIVE: u32 = 1 << 13;
    const DESTROYED: u32 = 1 << 14;
    const PARTITION_SHIFT: u32 = 16;
    const PARTITION_MASK: u32 = 0xFFF;

    /// The same slot in `partition` (below `cluster::PARTITIONS_MAX`, which fits the 12 bits).
    #[inline]
    pub const fn in_partition(self, partition: u16) -> Self {
        let cleared = self.0 & !(Self::PARTITION_MASK << Self::PARTITION_SHIFT);
        Self(cleared | (partition as u32 & Self::PARTITION_MASK) << Self::PARTITION_SHIFT)
    }

    /// The partition of the slot's name (0 on a standalone server).
    #[inline]
    pub const fn partition(self) -> u16 {
        ((self.0 >> Self::PARTITION_SHIFT) & Self::PARTITION_MASK) as u16
    }

    /// A live slot of `kind` (objects pass `LockKind::Atomic`; the bits are unused) at `generation`.
    #[inline]
    pub const fn live(generation: u32, kind: LockKind) -> Self {
        Self(generation & GENERATION_MAX | (kind as u32) << Self::KIND_SHIFT | Self::LIVE)
    }

    /// The slot's current (or last) generation; 0 if never used.
    #[inline]
    pub const fn generation(self) -> u32 {
        self.0 & GENERATION_MAX
    }

    /// Whether the slot holds a lock or object now.
    #[inline]
    pub const fn is_live(self) -> bool {
        self.0 & Self::LIVE != 0
    }

    /// The lock kind of a live lock slot.
    #[inline]
    pub const fn kind(self) -> LockKind {
        match (self.0 >> Self::KIND_SHIFT) & 3 {
            1 => LockKind::Rw,
            2 => LockKind::Fair,
            _ => LockKind::Atomic,
        }
    }

    /// Object slots: marked destroyed but still referenced.
    #[inline]
    pub const fn is_destroyed(self) -> bool {
        self.0 & Self::DESTROYED != 0
    }

    /// The same slot, marked destroyed.
    #[inline]
    pub const fn destroyed(self) -> Self {
        Self(self.0 | Self::DESTROYED)
    }

    /// The same generation, no longer live (the next allocation moves the generation on).
    #[inline]
    pub const fn freed(self) -> Self {
        Self(self.generation())
    }
}

/// Life stage of a waiter entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WaiterState {
    /// Unused.
    Free = 0,
    /// Parked on its lock's FIFO until granted or its deadline.
    Waiting = 1,
    /// Decided (granted, refused or timed out); the reply is waiting to be collected.
    Ready = 2,
}

/// What the revoke decision (`manager::revoke`) needs of a lock beyond its word, per lock
/// rather than per (client, lock): eight bytes per (client, lock) would be 410 MB at the default
/// capacities, and a later time is always safe to pass for every holder (it only delays a
/// revoke or a lapse). Data thread only; zero is "no cached grant, no revoke, no conflict".
/// 40 bytes: 2 MB at the default 51,200 locks (`contended_ms` added 400 KB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct LockManagerCell {
    /// When the lock's latest cached grant was made (the minimum hold runs from it).
    pub cached_since_ms: u64,
    /// When the lock's latest revoke went out (the revoke timeout runs from it).
    pub revoke_sent_ms: u64,
    /// When a request last found the lock held in a conflicting mode (a revoke sent, or an
    /// acquisition refused or left waiting): the contention window runs from it
    /// (`manager::contention`). Apart from `revoke_sent_ms` so that conflicts that go on do not
    /// push back an outstanding revoke's lapse. Left 0 while the rule is off (a window of 0).
    pub contended_ms: u64,
    /// When the holders' situation next changes by itself (a hold ends, a revoke lapses): a
    /// parked request's retry time. 0: nothing due.
    pub retry_at_ms: u64,
    /// Non-zero while the lock may have cached holders: set by every cached grant, cleared by
    /// a scan of the lock's holders that finds none, so an acquisition on a lock that was never
    /// cached pays one load, not a scan of the client table.
    pub cached: u32,
    /// A revoke a request that did not wait left due at `retry_at_ms` (a minimum hold was not
    /// over): its client slot + 1 in bits 0..31, bit 31 set when it wanted shared. The server's
    /// timer sends it then, with nobody parked to retry (the Linux DLM's `NOQUEUEBAST`). 0: none.
    pub deferred_revoke: u32,
}

const_assert_eq!(size_of::<LockManagerCell>(), 40);

/// A blocking lock request parked on the server (one per client at most): the request to
/// answer, and once decided, the answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Waiter {
    /// The reply's lock word, once decided.
    pub word: u128,
    /// When to give up with `Etimeout`, in ticks.
    pub deadline_ms: u64,
    /// The reply's `aux` (fencing token or ticket), once decided.
    pub aux: u64,
    /// The lock id of the request.
    pub lock: u32,
    /// The next waiter on the same lock (waiter slot + 1, 0 = last).
    pub next: u32,
    /// The requested lease.
    pub expire_ms: u32,
    /// The requesting client's id.
    pub client: u32,
    /// The request's header flags.
    pub flags: u32,
    /// The request's message id.
    pub message_id: u16,
    /// The reply's status code, once decided.
    pub status: u16,
    /// Fair lock: the ticket the waiter holds.
    pub tx: u16,
    /// Fair lock: the ticket the waiter holds.
    pub ts: u16,
    /// The request's lock kind.
    pub kind: u8,
    /// The request's op (a ticket retry once a fair lock queued it).
    pub op: u8,
    /// The request's protocol version.
    pub version: u8,
    /// A [`WaiterState`] as `u8`.
    pub state: u8,
}

const_assert_eq!(size_of::<Waiter>(), 64);
