//! The map's wire encoding: what the coordinator stores in etcd and what a server sends a
//! client that asks for the map. All integers little-endian.
//!
//! | offset | type  | field                                                            |
//! |--------|-------|------------------------------------------------------------------|
//! | 0      | u32   | magic [`MAP_MAGIC`]                                              |
//! | 4      | u8    | format version, [`MAP_FORMAT`]                                   |
//! | 5      | u8    | reserved, 0                                                      |
//! | 6      | u16   | `P`, in `1..=PARTITIONS_MAX`                                     |
//! | 8      | u64   | map version                                                      |
//! | 16     | u16   | servers `S`, at most `SERVERS_MAX`                               |
//! | 18     | u16   | reserved, 0                                                      |
//! | 20     | S × … | `u32 id` (non-zero, strictly increasing) `\| u64 incarnation \| u8 len` (1..=`ADDRESS_LEN_MAX`) `\| len bytes address` |
//! | …      | P × 7 | `u16 server` (index into the table, `0xFFFF` = none) `\| u32 epoch \| u8 handover` |
//!
//! Owners name servers by table index, not id, which keeps the largest map under 64 KiB
//! ([`MAP_ENCODED_MAX`]). The input must end exactly after the last owner. The decoder refuses
//! anything [`Map::check_invariants`] would, so a decoded map is one the coordinator could have
//! written; a hostile or corrupted input is an error, never a panic, and leaves the caller's
//! map as it was. A later format raises [`MAP_FORMAT`]; a reader refuses formats it does not
//! know rather than guess.

use super::map::{Handover, Map, Owner, ServerEntry};
use super::{ADDRESS_LEN_MAX, PARTITIONS_MAX, Partitions, SERVERS_MAX, ServerId};
use crate::proto::{DecodeError, EncodeError};

/// First word of an encoded map.
pub const MAP_MAGIC: u32 = 0xedf7_c94c;
/// The format this build writes and the only one it reads.
pub const MAP_FORMAT: u8 = 1;
const HEADER_LEN: usize = 20;
const SERVER_FIXED_LEN: usize = 13;
const OWNER_LEN: usize = 7;
const NO_SERVER: u16 = u16::MAX;
/// The longest encoded map: a full table with every address at its limit, and every partition.
pub const MAP_ENCODED_MAX: usize = HEADER_LEN
    + SERVERS_MAX * (SERVER_FIXED_LEN + ADDRESS_LEN_MAX)
    + PARTITIONS_MAX as usize * OWNER_LEN;

static_assertions::const_assert!(MAP_ENCODED_MAX <= u16::MAX as usize);
static_assertions::const_assert!(SERVERS_MAX < NO_SERVER as usize);
static_assertions::const_assert!(ADDRESS_LEN_MAX <= u8::MAX as usize);

impl Map {
    /// Bytes [`Map::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + self
                .servers()
                .iter()
                .map(|e| SERVER_FIXED_LEN + e.address().len())
                .sum::<usize>()
            + self.owners().len() * OWNER_LEN
    }

    /// Writes the map into `out`; returns the bytes written. `BufferTooSmall` if `out` is
    /// shorter than [`Map::encoded_len`]; `Invalid` if the map breaks an invariant (a bug in
    /// whoever built it: an encoded map always decodes).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        self.check_invariants().map_err(|_| EncodeError::Invalid)?;
        let len = self.encoded_len();
        let out = out.get_mut(..len).ok_or(EncodeError::BufferTooSmall)?;
        let mut w = Writer { out, at: 0 };
        w.put(&MAP_MAGIC.to_le_bytes());
        w.put(&[MAP_FORMAT, 0]);
        w.put(&self.partitions.get().to_le_bytes());
        w.put(&self.version.to_le_bytes());
        w.put(&self.servers.to_le_bytes());
        w.put(&[0, 0]);
        for e in self.servers() {
            w.put(&e.id().get().to_le_bytes());
            w.put(&e.incarnation().to_le_bytes());
            w.put(&[e.address().len() as u8]);
            w.put(e.address());
        }
        for o in self.owners() {
            let index = match o.server {
                None => NO_SERVER,
                Some(id) => self
                    .servers()
                    .binary_search_by_key(&id, ServerEntry::id)
                    .expect("check_invariants: owners are in the table")
                    as u16,
            };
            w.put(&index.to_le_bytes());
            w.put(&o.epoch.to_le_bytes());
            w.put(&[o.handover as u8]);
        }
        debug_assert_eq!(w.at, len);
        Ok(len)
    }

    /// Reads an encoded map into `out`. On error `out` is left as it was, so a server can decode
    /// straight over the map it serves with.
    pub fn decode(bytes: &[u8], out: &mut Map) -> Result<(), DecodeError> {
        // The first pass only checks; the second writes. A half-written map is never seen.
        walk(bytes, None)?;
        walk(bytes, Some(out))
    }
}

/// Parses `bytes`, writing into `out` when given. Every check runs on both passes.
fn walk(bytes: &[u8], mut out: Option<&mut Map>) -> Result<(), DecodeError> {
    let mut r = Reader { bytes, at: 0 };
    if r.u32()? != MAP_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if r.u8()? != MAP_FORMAT || r.u8()? != 0 {
        return Err(DecodeError::BadField);
    }
    let partitions = Partitions::new(r.u16()?).ok_or(DecodeError::BadField)?;
    let version = r.u64()?;
    let servers = r.u16()?;
    if usize::from(servers) > SERVERS_MAX {
        return Err(DecodeError::BadCount);
    }
    if r.u16()? != 0 {
        return Err(DecodeError::BadField);
    }
    if let Some(m) = out.as_deref_mut() {
        m.version = version;
        m.partitions = partitions;
        m.servers = servers;
    }
    let mut previous = 0u32;
    for i in 0..usize::from(servers) {
        let id = r.u32()?;
        if id <= previous {
            return Err(DecodeError::BadField);
        }
        previous = id;
        let incarnation = r.u64()?;
        let len = usize::from(r.u8()?);
        let address = r.take(len)?;
        let id = ServerId::new(id).ok_or(DecodeError::BadField)?;
        let entry = ServerEntry::new(id, incarnation, address).ok_or(DecodeError::BadName)?;
        if let Some(m) = out.as_deref_mut() {
            m.table[i] = entry;
        }
    }
    for p in 0..usize::from(partitions.get()) {
        let index = r.u16()?;
        let epoch = r.u32()?;
        let handover = Handover::from_u8(r.u8()?).ok_or(DecodeError::BadField)?;
        let server = match index {
            NO_SERVER => None,
            i if i < servers => {
                if epoch == 0 || (handover == Handover::First && epoch != 1) {
                    return Err(DecodeError::BadField);
                }
                // The table entry was read (and, on the writing pass, stored) above.
                Some(ServerId::new(server_id_at(bytes, i)).ok_or(DecodeError::BadField)?)
            }
            _ => return Err(DecodeError::BadField),
        };
        if let Some(m) = out.as_deref_mut() {
            m.owners[p] = Owner {
                server,
                epoch,
                handover,
            };
        }
    }
    if r.at != bytes.len() {
        return Err(DecodeError::BadLength);
    }
    Ok(())
}

/// The id of table entry `index` of an encoded map whose table was already validated.
fn server_id_at(bytes: &[u8], index: u16) -> u32 {
    let mut at = HEADER_LEN;
    for _ in 0..index {
        at += SERVER_FIXED_LEN + usize::from(bytes[at + SERVER_FIXED_LEN - 1]);
    }
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.bytes.get(self.at..end).ok_or(DecodeError::Truncated)?;
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.array::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }
}

/// Writes into a buffer already checked to be long enough.
struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}
