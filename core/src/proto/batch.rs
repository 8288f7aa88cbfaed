//! Counted lists inside control bodies, as views that borrow either the wire bytes or the
//! caller's slice.
//!
//! Every list body has the same shape, `u8 count | 3 reserved (zero) | count × entry`, and the
//! entries must consume the body exactly. A [`Batch`] is what a decoder hands back (backed by the
//! frame's bytes, every entry validated up front so iteration cannot fail) and also what a
//! caller builds from its own slice to encode ([`Batch::from_slice`]); both compare equal when
//! they hold the same entries, so a frame round-trips through encode and decode without an
//! allocation on either side.
//!
//! # Entry layouts
//!
//! Lock request (`BatchGetLock`, and the whole `GetLock` body), 4 bytes + name:
//!
//! | off | type | field                    |
//! |-----|------|--------------------------|
//! | 0   | u8   | kind ([`LockKind`])      |
//! | 1   | u8   | reserved, zero           |
//! | 2   | u16  | `name_len`, 1..=512      |
//! | 4   | —    | name                     |
//!
//! Claim (`BatchUpdateLocks`), [`CLAIM_FIXED_LEN`] bytes + name:
//!
//! | off | type | field          | off | type | field                       |
//! |-----|------|----------------|-----|------|-----------------------------|
//! | 0   | u8   | kind           | 24  | u16  | ticket `tx`                 |
//! | 1   | u8   | held ([`Held`])| 26  | u16  | ticket `ts`                 |
//! | 2   | u16  | `name_len`     | 28  | u32  | `remaining_ms`              |
//! | 4   | u32  | `old_lock`     | 32  | u32  | `age_ms`                    |
//! | 8   | u128 | `word`         | 36  | u64  | `token`                     |
//! |     |      |                | 44  | u32  | proof epoch                 |
//! |     |      |                | 48  | 16 B | proof MAC (zero: no proof)  |
//! |     |      |                | 64  | 40 B | value block, only with [`CLAIM_HAS_VALUE`] |
//! |     |      |                | 64 or 104 | — | name                  |
//!
//! A claim offers the value block its grant came with (issue 19) by setting
//! [`CLAIM_HAS_VALUE`] in the `held` byte: a 40-byte value entry in the response value
//! trailer's layout (`value.rs`: block, write count, flags present/valid, reserved) then sits
//! between the fixed part and the name, and must be present. A claim without the bit is byte
//! for byte what protocol 4 sent, so a version-4 client's re-claim still decodes. A
//! recovering server creates every lock's block invalid and takes the newest valid one a
//! grant's claim offers (`LockValue::reclaim`), so blocks come back valid exactly where a
//! holder kept a copy.
//!
//! The proof epoch was a `u16` followed by two reserved zero bytes up to protocol 4; a cluster
//! partition's epoch is 32 bits (protocol 5), and an old claim's bytes read as the same value.
//! The proof's partition is not carried: the checking server computes it from the name.
//!
//! Lock ids (`BatchReleaseLock`): `u32` each. Results (batch responses): `u32 id | u16 status |
//! u16 reserved`. Counters (`Stats` response): `u64` each, at most [`COUNTERS_MAX`].

use super::cluster::{RECLAIM_DONE_LEN, decode_reclaim_done, encode_reclaim_done};
use super::value::{put_value_entry, read_value_entry};
use super::{
    BATCH_HEADER_LEN, COUNTERS_MAX, DecodeError, EncodeError, check_zero, get_array, get_u8,
    get_u16, get_u32, get_u64, get_u128, name_len_for_encode, put_bytes, put_u8, put_u16, put_u32,
    put_u64, put_u128, put_zero, take_name,
};
use crate::config::BATCH_MAX;
use crate::ids::{GrantProof, LockKind, Mode, Ticket};
use crate::manager::value::ValueRead;
use crate::status::Status;

/// Bytes of a claim before its name (and its value entry, if any).
pub const CLAIM_FIXED_LEN: usize = 64;
/// Bytes of a claim's value entry, between the fixed part and the name.
pub const CLAIM_VALUE_LEN: usize = super::value::VALUE_REPLY_LEN;
/// The bit of a claim's `held` byte that says a value entry follows the fixed part.
pub const CLAIM_HAS_VALUE: u8 = 0x80;

/// An entry read off the front of some bytes, and the bytes after it.
pub(super) type Parsed<'a, T> = Result<(T, &'a [u8]), DecodeError>;

pub(super) mod sealed {
    use super::{EncodeError, Parsed};

    /// One entry of a counted list: its wire form and how many a list may hold. Sealed: the
    /// list kinds are the protocol's, not the caller's.
    pub trait Entry<'a>: Copy {
        /// Fewest entries a list may hold.
        const COUNT_MIN: usize;
        /// Most entries a list may hold.
        const COUNT_MAX: usize;
        /// Bytes per entry when all entries have the same size, for O(1) `get`.
        const FIXED_LEN: Option<usize>;
        /// Reads one entry off the front of `bytes`, returning it and what follows.
        fn decode(bytes: &'a [u8]) -> Parsed<'a, Self>;
        /// Writes the entry at `out[off..]`, returning the offset after it; `Invalid` for an
        /// entry the decoder would refuse.
        fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError>;
    }
}

use sealed::Entry;

/// A counted list of entries, borrowed from a decoded frame or from the caller.
pub struct Batch<'a, T> {
    repr: Repr<'a, T>,
}

enum Repr<'a, T> {
    /// Validated wire entries: `count` of them, exactly filling `entries`.
    Wire { count: usize, entries: &'a [u8] },
    /// The caller's entries, validated when encoded.
    Slice(&'a [T]),
}

/// `BatchGetLock` request: lock kind and name per entry.
pub type BatchGet<'a> = Batch<'a, (LockKind, &'a [u8])>;
/// `BatchReleaseLock` request: lock ids.
pub type BatchIds<'a> = Batch<'a, u32>;
/// `BatchUpdateLocks` request: what a client held on the failed server.
pub type Claims<'a> = Batch<'a, LockClaim<'a>>;
/// Batch responses: one id and status per request entry, in request order.
pub type BatchEntries<'a> = Batch<'a, BatchEntry>;
/// `Stats` response: the server's counters, in the server's documented order.
pub type Counters<'a> = Batch<'a, u64>;
/// `ReclaimDones` request: the partitions the client re-claimed, each with its owner's epoch.
pub type ReclaimDones<'a> = Batch<'a, PartitionEpoch>;
/// `ReclaimDones` response: one status per partition, in request order.
pub type PartitionStatuses<'a> = Batch<'a, PartitionStatus>;

/// Most partitions one `ReclaimDones` message names: every list's count is one byte.
pub const RECLAIM_DONES_MAX: usize = u8::MAX as usize;

impl<'a, T> Batch<'a, T> {
    /// A list over the caller's entries, for encoding. Limits (count, name lengths) are
    /// checked by the encoder, which refuses with `EncodeError::Invalid`.
    #[inline]
    pub const fn from_slice(items: &'a [T]) -> Self {
        Self {
            repr: Repr::Slice(items),
        }
    }

    /// Number of entries.
    #[inline]
    pub const fn len(&self) -> usize {
        match self.repr {
            Repr::Wire { count, .. } => count,
            Repr::Slice(items) => items.len(),
        }
    }

    /// Whether the list has no entries (only an unencoded caller list or `Counters` can).
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a, T: Entry<'a>> Batch<'a, T> {
    /// Entry `i`, or `None` past the end. O(1) for fixed-size entries, O(i) for named ones.
    #[inline]
    pub fn get(&self, i: usize) -> Option<T> {
        match (self.repr, T::FIXED_LEN) {
            (Repr::Slice(items), _) => items.get(i).copied(),
            (Repr::Wire { count, entries }, Some(len)) if i < count => {
                let at = entries.get(i.checked_mul(len)?..)?;
                T::decode(at).ok().map(|(v, _)| v)
            }
            (Repr::Wire { .. }, Some(_)) => None,
            (Repr::Wire { .. }, None) => self.iter().nth(i),
        }
    }

    /// The entries in order.
    #[inline]
    pub fn iter(&self) -> BatchIter<'a, T> {
        BatchIter {
            repr: match self.repr {
                Repr::Wire { count, entries } => IterRepr::Wire {
                    left: count,
                    rest: entries,
                },
                Repr::Slice(items) => IterRepr::Slice(items.iter()),
            },
        }
    }

    /// Decodes a whole list body, validating every entry so iteration cannot fail later.
    pub(super) fn decode(body: &'a [u8]) -> Result<Self, DecodeError> {
        // 0 u8 count | 1 3 reserved | 4 entries
        let count = usize::from(get_u8(body, 0)?);
        if !(T::COUNT_MIN..=T::COUNT_MAX).contains(&count) {
            return Err(DecodeError::BadCount);
        }
        check_zero(body, 1, BATCH_HEADER_LEN - 1)?;
        let entries = body.get(BATCH_HEADER_LEN..).ok_or(DecodeError::Truncated)?;
        let mut rest = entries;
        for _ in 0..count {
            rest = T::decode(rest)?.1;
        }
        if !rest.is_empty() {
            return Err(DecodeError::BadLength);
        }
        Ok(Self {
            repr: Repr::Wire { count, entries },
        })
    }

    /// Encodes the list body at the start of `out`, returning its length.
    pub(super) fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let count = self.len();
        if !(T::COUNT_MIN..=T::COUNT_MAX).contains(&count) {
            return Err(EncodeError::Invalid);
        }
        let count = u8::try_from(count).map_err(|_| EncodeError::Invalid)?;
        put_u8(out, 0, count)?;
        put_zero(out, 1, BATCH_HEADER_LEN - 1)?;
        let mut off = BATCH_HEADER_LEN;
        for entry in self.iter() {
            off = entry.encode(out, off)?;
        }
        Ok(off)
    }
}

impl<T> Clone for Batch<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Batch<'_, T> {}

impl<T> Clone for Repr<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Repr<'_, T> {}

/// Equal when the entries are equal, whichever side the bytes come from.
impl<'a, T: Entry<'a> + PartialEq> PartialEq for Batch<'a, T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<'a, T: Entry<'a> + Eq> Eq for Batch<'a, T> {}

impl<'a, T: Entry<'a> + core::fmt::Debug> core::fmt::Debug for Batch<'a, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'a, T: Entry<'a>> IntoIterator for Batch<'a, T> {
    type Item = T;
    type IntoIter = BatchIter<'a, T>;

    fn into_iter(self) -> BatchIter<'a, T> {
        self.iter()
    }
}

/// Iterator over a [`Batch`].
pub struct BatchIter<'a, T> {
    repr: IterRepr<'a, T>,
}

enum IterRepr<'a, T> {
    Wire { left: usize, rest: &'a [u8] },
    Slice(core::slice::Iter<'a, T>),
}

impl<'a, T: Entry<'a>> Iterator for BatchIter<'a, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        match &mut self.repr {
            IterRepr::Slice(items) => items.next().copied(),
            IterRepr::Wire { left, rest } => {
                if *left == 0 {
                    return None;
                }
                // Wire lists exist only after `decode` checked every entry, so this cannot fail;
                // if it somehow did, iteration ends rather than panicking.
                let parsed = T::decode(rest);
                debug_assert!(parsed.is_ok(), "batch entries are validated at decode");
                let (entry, after) = parsed.ok()?;
                *left -= 1;
                *rest = after;
                Some(entry)
            }
        }
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match &self.repr {
            IterRepr::Wire { left, .. } => *left,
            IterRepr::Slice(items) => items.len(),
        };
        (n, Some(n))
    }
}

impl<'a, T: Entry<'a>> ExactSizeIterator for BatchIter<'a, T> {}

impl<'a, T: Entry<'a>> core::fmt::Debug for BatchIter<'a, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BatchIter")
            .field("left", &self.len())
            .finish()
    }
}

/// Decodes a lock request entry: the body of `GetLock` and each entry of `BatchGetLock`.
pub(super) fn decode_lock_request(b: &[u8]) -> Parsed<'_, (LockKind, &[u8])> {
    let kind = LockKind::from_u8(get_u8(b, 0)?).ok_or(DecodeError::BadKind)?;
    check_zero(b, 1, 1)?;
    let name_len = get_u16(b, 2)?;
    let rest = b.get(4..).ok_or(DecodeError::Truncated)?;
    let (name, rest) = take_name(rest, name_len)?;
    Ok(((kind, name), rest))
}

/// Encodes a lock request entry at `out[off..]`, returning the offset after it.
pub(super) fn encode_lock_request(
    kind: LockKind,
    name: &[u8],
    out: &mut [u8],
    off: usize,
) -> Result<usize, EncodeError> {
    let name_len = name_len_for_encode(name)?;
    put_u8(out, off, kind as u8)?;
    put_u8(out, off + 1, 0)?;
    put_u16(out, off + 2, name_len)?;
    put_bytes(out, off + 4, name)?;
    Ok(off + 4 + name.len())
}

impl<'a> Entry<'a> for (LockKind, &'a [u8]) {
    const COUNT_MIN: usize = 1;
    const COUNT_MAX: usize = BATCH_MAX;
    const FIXED_LEN: Option<usize> = None;

    fn decode(bytes: &'a [u8]) -> Parsed<'a, Self> {
        decode_lock_request(bytes)
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        encode_lock_request(self.0, self.1, out, off)
    }
}

impl<'a> Entry<'a> for u32 {
    const COUNT_MIN: usize = 1;
    const COUNT_MAX: usize = BATCH_MAX;
    const FIXED_LEN: Option<usize> = Some(4);

    fn decode(bytes: &'a [u8]) -> Parsed<'a, Self> {
        let rest = bytes.get(4..).ok_or(DecodeError::Truncated)?;
        Ok((get_u32(bytes, 0)?, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        put_u32(out, off, *self)?;
        Ok(off + 4)
    }
}

impl<'a> Entry<'a> for u64 {
    const COUNT_MIN: usize = 0;
    const COUNT_MAX: usize = COUNTERS_MAX;
    const FIXED_LEN: Option<usize> = Some(8);

    fn decode(bytes: &'a [u8]) -> Parsed<'a, Self> {
        let rest = bytes.get(8..).ok_or(DecodeError::Truncated)?;
        Ok((get_u64(bytes, 0)?, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        put_u64(out, off, *self)?;
        Ok(off + 8)
    }
}

/// One result of a batch request: the id obtained (or echoed, for a release) and its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchEntry {
    /// The lock id; meaningful only when `status` is a success.
    pub id: u32,
    /// The outcome of this entry alone.
    pub status: Status,
}

impl<'a> Entry<'a> for BatchEntry {
    const COUNT_MIN: usize = 1;
    const COUNT_MAX: usize = BATCH_MAX;
    const FIXED_LEN: Option<usize> = Some(8);

    fn decode(bytes: &'a [u8]) -> Parsed<'a, Self> {
        // 0 u32 id | 4 u16 status | 6 u16 reserved
        let id = get_u32(bytes, 0)?;
        let status = Status::from_code(get_u16(bytes, 4)?).ok_or(DecodeError::BadField)?;
        check_zero(bytes, 6, 2)?;
        let rest = bytes.get(8..).ok_or(DecodeError::Truncated)?;
        Ok((BatchEntry { id, status }, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        put_u32(out, off, self.id)?;
        put_u16(out, off + 4, self.status as u16)?;
        put_zero(out, off + 6, 2)?;
        Ok(off + 8)
    }
}

/// One partition of a `ReclaimDones` request: what a `ReclaimDone` says, in its body's 8 bytes
/// (`0 u16 partition | 2 u16 reserved | 4 u32 epoch`), encoded and decoded by the same two
/// functions as that body (`cluster.rs`), so the two cannot drift apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionEpoch {
    /// The partition.
    pub partition: u16,
    /// The partition's epoch in the client's map: the takeover the re-claims were for.
    pub epoch: u32,
}

impl<'a> Entry<'a> for PartitionEpoch {
    const COUNT_MIN: usize = 1;
    const COUNT_MAX: usize = RECLAIM_DONES_MAX;
    const FIXED_LEN: Option<usize> = Some(RECLAIM_DONE_LEN);

    fn decode(bytes: &'a [u8]) -> Parsed<'a, Self> {
        if bytes.len() < RECLAIM_DONE_LEN {
            return Err(DecodeError::Truncated);
        }
        let (body, rest) = bytes.split_at(RECLAIM_DONE_LEN);
        let (partition, epoch) = decode_reclaim_done(body)?;
        Ok((PartitionEpoch { partition, epoch }, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        let body = out.get_mut(off..).ok_or(EncodeError::BufferTooSmall)?;
        Ok(off + encode_reclaim_done(self.partition, self.epoch, body)?)
    }
}

/// One answer of a `ReclaimDones` response, 4 bytes (`0 u16 partition | 2 u16 status`): the
/// status a `ReclaimDone` of that partition alone would have been answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionStatus {
    /// The partition, echoed.
    pub partition: u16,
    /// Its outcome.
    pub status: Status,
}

impl<'a> Entry<'a> for PartitionStatus {
    const COUNT_MIN: usize = 1;
    const COUNT_MAX: usize = RECLAIM_DONES_MAX;
    const FIXED_LEN: Option<usize> = Some(4);

    fn decode(bytes: &'a [u8]) -> Parsed<'a, Self> {
        let partition = get_u16(bytes, 0)?;
        let status = Status::from_code(get_u16(bytes, 2)?).ok_or(DecodeError::BadField)?;
        let rest = bytes.get(4..).ok_or(DecodeError::Truncated)?;
        Ok((PartitionStatus { partition, status }, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        put_u16(out, off, self.partition)?;
        put_u16(out, off + 2, self.status as u16)?;
        Ok(off + 4)
    }
}

/// What a client held on a lock, as it reports it to a recovering server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Obtained by `get_lock` but not locked: only the id must be re-created.
    Reference,
    /// Held exclusively.
    Exclusive,
    /// Held shared.
    Shared,
    /// Queued on a fair lock with a ticket, in this mode.
    Ticketed(Mode),
}

impl Held {
    /// The wire value (0..=4).
    #[inline]
    pub const fn code(self) -> u8 {
        match self {
            Held::Reference => 0,
            Held::Exclusive => 1,
            Held::Shared => 2,
            Held::Ticketed(Mode::Exclusive) => 3,
            Held::Ticketed(Mode::Shared) => 4,
        }
    }

    /// The value with this wire code.
    #[inline]
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Held::Reference),
            1 => Some(Held::Exclusive),
            2 => Some(Held::Shared),
            3 => Some(Held::Ticketed(Mode::Exclusive)),
            4 => Some(Held::Ticketed(Mode::Shared)),
            _ => None,
        }
    }
}

/// One lock a client re-registers with a recovering server (`BatchUpdateLocks`): everything
/// it knew about the lock on the server that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockClaim<'a> {
    /// The lock's kind.
    pub kind: LockKind,
    /// What the client held.
    pub held: Held,
    /// The lock's name (1..=512 bytes).
    pub name: &'a [u8],
    /// The id the lock had on the failed server; the reply gives the id it has now.
    pub old_lock: u32,
    /// The last lock word the client received for this lock.
    pub word: u128,
    /// The fair-lock ticket held (zero unless `held` is `Ticketed` or a fair grant).
    pub ticket: Ticket,
    /// Lease left on the grant when the client sent the claim.
    pub remaining_ms: u32,
    /// How long the client has held the grant.
    pub age_ms: u32,
    /// The fencing token of the grant (0 when none).
    pub token: u64,
    /// The proof the failed server gave with the grant or ticket ([`GrantProof::NONE`]
    /// without one); a server with a session key takes no grant or ticket without it.
    pub proof: GrantProof,
    /// The value block the grant came with, when the client asked for blocks (`None`
    /// otherwise, and for a ticket or a reference).
    pub value: Option<ValueRead>,
}

impl<'a> Entry<'a> for LockClaim<'a> {
    const COUNT_MIN: usize = 1;
    const COUNT_MAX: usize = BATCH_MAX;
    const FIXED_LEN: Option<usize> = None;

    fn decode(b: &'a [u8]) -> Parsed<'a, Self> {
        let kind = LockKind::from_u8(get_u8(b, 0)?).ok_or(DecodeError::BadKind)?;
        let held_byte = get_u8(b, 1)?;
        let held = Held::from_code(held_byte & !CLAIM_HAS_VALUE).ok_or(DecodeError::BadField)?;
        let name_len = get_u16(b, 2)?;
        let claim = LockClaim {
            kind,
            held,
            name: &[],
            old_lock: get_u32(b, 4)?,
            word: get_u128(b, 8)?,
            ticket: Ticket {
                exclusive: get_u16(b, 24)?,
                shared: get_u16(b, 26)?,
            },
            remaining_ms: get_u32(b, 28)?,
            age_ms: get_u32(b, 32)?,
            token: get_u64(b, 36)?,
            proof: GrantProof {
                epoch: get_u32(b, 44)?,
                mac: get_array(b, 48)?,
            },
            value: None,
        };
        let (value, name_at) = if held_byte & CLAIM_HAS_VALUE == 0 {
            (None, CLAIM_FIXED_LEN)
        } else {
            // Offered means present: an absent value is sent as no entry (one encoding).
            let value = read_value_entry(&get_array(b, CLAIM_FIXED_LEN)?)?;
            (
                Some(value.ok_or(DecodeError::BadField)?),
                CLAIM_FIXED_LEN + CLAIM_VALUE_LEN,
            )
        };
        let claim = LockClaim { value, ..claim };
        let rest = b.get(name_at..).ok_or(DecodeError::Truncated)?;
        let (name, rest) = take_name(rest, name_len)?;
        Ok((LockClaim { name, ..claim }, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        let name_len = name_len_for_encode(self.name)?;
        put_u8(out, off, self.kind as u8)?;
        let flag = if self.value.is_some() {
            CLAIM_HAS_VALUE
        } else {
            0
        };
        put_u8(out, off + 1, self.held.code() | flag)?;
        put_u16(out, off + 2, name_len)?;
        put_u32(out, off + 4, self.old_lock)?;
        put_u128(out, off + 8, self.word)?;
        put_u16(out, off + 24, self.ticket.exclusive)?;
        put_u16(out, off + 26, self.ticket.shared)?;
        put_u32(out, off + 28, self.remaining_ms)?;
        put_u32(out, off + 32, self.age_ms)?;
        put_u64(out, off + 36, self.token)?;
        put_u32(out, off + 44, self.proof.epoch)?;
        put_bytes(out, off + 48, &self.proof.mac)?;
        let mut name_at = off + CLAIM_FIXED_LEN;
        if let Some(value) = &self.value {
            let entry = out
                .get_mut(name_at..name_at + CLAIM_VALUE_LEN)
                .ok_or(EncodeError::BufferTooSmall)?;
            put_value_entry(entry, Some(value));
            name_at += CLAIM_VALUE_LEN;
        }
        put_bytes(out, name_at, self.name)?;
        Ok(name_at + self.name.len())
    }
}
