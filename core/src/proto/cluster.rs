//! The cluster's control bodies (protocol 5, `CLUSTER-SPEC` §1, §3, §5): fetching the map, a
//! client joining another server of the cluster, a partition's re-claims done, and the reply of
//! a server that does not own what a request named.
//!
//! | type               | request body                                   | response body (on `Success`)             |
//! |--------------------|------------------------------------------------|------------------------------------------|
//! | `GetMap` (42)      | `0 u32 offset`                                 | `0 u64 version \| 8 u32 total_len \| 12 u32 offset \| 16 chunk` |
//! | `ClientJoin` (48)  | `ClientReinit`'s: `0 u8 min_version \| 1 3 reserved \| 4 u32 lease_ms \| 8 [u8; 16] session` | `ClientInit`'s ([`InitReply`](super::InitReply)) |
//! | `ReclaimDone` (50) | `0 u16 partition \| 2 u16 reserved \| 4 u32 epoch` | empty                                  |
//! | `ReclaimDones` (54, protocol 6) | a list (`batch.rs`) of `ReclaimDone` bodies, 1 to 255 | a list of `u16 partition \| u16 status`, in order |
//! | `Drain` (52)       | empty                                          | empty                                    |
//!
//! (44 and 46 are issue 19's `RecoveryDone` and `ListRetained`, `recovery.rs`.)
//!
//! **`GetMap`** reads the server's map ([`Map::encode`](crate::cluster::Map::encode)'s bytes,
//! `total_len` of them, at most [`MAP_ENCODED_MAX`]) a chunk at a time: the chunk at `offset`
//! is `min(MAP_CHUNK_MAX, total_len - offset)` bytes, exactly ([`map_chunk_len`]), so a map
//! comes in at most four replies and every offset has one answer. A client asks from offset 0,
//! then from each reply's end, and decodes the bytes once it has `total_len` of them; a reply
//! of another `version` than the first means the map changed meanwhile, and the client starts
//! again from 0. An `offset` at or past the end is answered `Einval`, as is any `GetMap` to a
//! standalone server, which has no map. No registration is needed (as for `Stats`).
//!
//! **`ClientJoin`** registers, with this server, a client that registered with another server
//! of the cluster: the header's word is its id, the header's version its newest protocol
//! version (as in `ClientReinit`), and `session` the secret the first server gave it, minted
//! under the cluster's session key so that any server can check it. The reply is the one a
//! registration gets, with the same id and session and this server's own lease.
//!
//! **`ReclaimDone`** tells a partition's new owner that this client has re-claimed everything
//! it held in `partition`, whose owner it knows at `epoch`. The epoch is there so that a
//! message meant for one takeover never ends another: if the partition moved away and came
//! back (a later epoch) while it was in flight, the server does not count it.
//!
//! **`ReclaimDones`** (protocol 6) says it for many partitions in one message, each counted
//! and answered as its own `ReclaimDone` would be; a client sends it only to a server whose
//! registration or join named version 6 or later, and `ReclaimDone` to an older one.
//!
//! **`Drain`** asks a cluster server to give every partition it owns away (`dlock drain`): its
//! membership asks the coordinator to move them, and the reply says only that the request was
//! passed on; the operator watches the server's `partitions_owned` counter fall to 0. It is an
//! operator's request, not a client's: no registration, the header's word 0, and the transport
//! answers it itself (it alone knows who the peer is) — `Success` to a peer it trusts with the
//! server's administration (a Unix-socket peer, a TLS peer with a verified client certificate,
//! a plaintext TCP peer on a loopback address), `Einval` to any other and on a standalone
//! server. The state machine answers it `Einval` should one reach it.
//!
//! **Partition moved.** A control response whose status is
//! [`PartitionMoved`](crate::Status::PartitionMoved) carries `0 u64 map_version`, exactly: the
//! map version the refusing server knows, whatever the request was (`GetLock` and object
//! create/get of a name whose partition it does not own, a `ClientJoin` or `ReclaimDone` it
//! cannot take, …). Every other failure has an empty body, as before. A data command refused
//! the same way carries the version in its result's `aux` (`data.rs`).

use super::control::exact;
use super::{
    CONTROL_FRAME_MAX, CONTROL_HEADER_LEN, DecodeError, EncodeError, check_zero, get_u16, get_u32,
    get_u64, put_bytes, put_u16, put_u32, put_u64, put_zero,
};
use crate::cluster::MAP_ENCODED_MAX;

/// The most map bytes one `GetMap` reply carries: 16 KiB, so the largest map
/// ([`MAP_ENCODED_MAX`], 63,252 bytes) comes in four replies.
pub const MAP_CHUNK_MAX: usize = 16 * 1024;
/// Bytes of a `GetMap` reply before its chunk.
pub const MAP_CHUNK_FIXED_LEN: usize = 16;
/// Bytes of a `ReclaimDone` request body.
pub const RECLAIM_DONE_LEN: usize = 8;
/// Bytes of the body of a control response with status `PartitionMoved`.
pub const MOVED_LEN: usize = 8;

// The largest reply fits a control frame, and a map's length and every offset in it fit u32.
static_assertions::const_assert!(
    CONTROL_HEADER_LEN + MAP_CHUNK_FIXED_LEN + MAP_CHUNK_MAX <= CONTROL_FRAME_MAX
);
static_assertions::const_assert!(MAP_ENCODED_MAX <= u32::MAX as usize);

/// The length of the chunk at `offset` of a map of `total_len` bytes:
/// `min(MAP_CHUNK_MAX, total_len - offset)`; `None` when `total_len` is 0 or over
/// [`MAP_ENCODED_MAX`], or `offset` is not inside the map.
#[inline]
pub const fn map_chunk_len(total_len: u32, offset: u32) -> Option<usize> {
    let (total, offset) = (total_len as usize, offset as usize);
    if total == 0 || total > MAP_ENCODED_MAX || offset >= total {
        return None;
    }
    let left = total - offset;
    Some(if left < MAP_CHUNK_MAX {
        left
    } else {
        MAP_CHUNK_MAX
    })
}

/// A `GetMap` reply: part of the encoded map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapChunk<'a> {
    /// The version of the map the bytes are of.
    pub version: u64,
    /// The length of the whole encoding.
    pub total_len: u32,
    /// Where `chunk` starts in it.
    pub offset: u32,
    /// The bytes, exactly [`map_chunk_len`]`(total_len, offset)` of them.
    pub chunk: &'a [u8],
}

impl<'a> MapChunk<'a> {
    /// The chunk at `offset` of `encoded` (a map's whole encoding, of map `version`): what a
    /// server answers `GetMap { offset }`. `None` (answer `Einval`) when `offset` is not inside
    /// it or it is longer than any map.
    pub fn of(version: u64, encoded: &'a [u8], offset: u32) -> Option<MapChunk<'a>> {
        let total_len = u32::try_from(encoded.len()).ok()?;
        let len = map_chunk_len(total_len, offset)?;
        let start = offset as usize;
        Some(MapChunk {
            version,
            total_len,
            offset,
            chunk: encoded.get(start..start + len)?,
        })
    }

    /// The offset to ask for next; `None` when this chunk is the last.
    #[inline]
    pub fn next_offset(&self) -> Option<u32> {
        let end = self.offset as usize + self.chunk.len();
        if end < self.total_len as usize {
            u32::try_from(end).ok()
        } else {
            None
        }
    }

    /// Decodes a reply body.
    pub(super) fn decode(b: &'a [u8]) -> Result<MapChunk<'a>, DecodeError> {
        let version = get_u64(b, 0)?;
        let total_len = get_u32(b, 8)?;
        let offset = get_u32(b, 12)?;
        let chunk = b.get(MAP_CHUNK_FIXED_LEN..).ok_or(DecodeError::Truncated)?;
        if map_chunk_len(total_len, offset) != Some(chunk.len()) {
            return Err(DecodeError::BadLength);
        }
        Ok(MapChunk {
            version,
            total_len,
            offset,
            chunk,
        })
    }

    /// Encodes a reply body; returns its length. `Invalid` for a chunk the decoder refuses.
    pub(super) fn encode(&self, b: &mut [u8]) -> Result<usize, EncodeError> {
        if map_chunk_len(self.total_len, self.offset) != Some(self.chunk.len()) {
            return Err(EncodeError::Invalid);
        }
        put_u64(b, 0, self.version)?;
        put_u32(b, 8, self.total_len)?;
        put_u32(b, 12, self.offset)?;
        put_bytes(b, MAP_CHUNK_FIXED_LEN, self.chunk)?;
        Ok(MAP_CHUNK_FIXED_LEN + self.chunk.len())
    }
}

/// Decodes a `GetMap` request body: the offset asked for.
pub(super) fn decode_get_map(b: &[u8]) -> Result<u32, DecodeError> {
    exact(b, 4)?;
    get_u32(b, 0)
}

/// Encodes a `GetMap` request body; returns its length.
pub(super) fn encode_get_map(offset: u32, b: &mut [u8]) -> Result<usize, EncodeError> {
    put_u32(b, 0, offset)?;
    Ok(4)
}

/// Decodes a `ReclaimDone` request body: the partition and the epoch its owner has.
pub(super) fn decode_reclaim_done(b: &[u8]) -> Result<(u16, u32), DecodeError> {
    exact(b, RECLAIM_DONE_LEN)?;
    check_zero(b, 2, 2)?;
    Ok((get_u16(b, 0)?, get_u32(b, 4)?))
}

/// Encodes a `ReclaimDone` request body; returns its length.
pub(super) fn encode_reclaim_done(
    partition: u16,
    epoch: u32,
    b: &mut [u8],
) -> Result<usize, EncodeError> {
    put_u16(b, 0, partition)?;
    put_zero(b, 2, 2)?;
    put_u32(b, 4, epoch)?;
    Ok(RECLAIM_DONE_LEN)
}

/// Decodes the body of a `PartitionMoved` response: the refusing server's map version.
pub(super) fn decode_moved(b: &[u8]) -> Result<u64, DecodeError> {
    exact(b, MOVED_LEN)?;
    get_u64(b, 0)
}

/// Encodes the body of a `PartitionMoved` response; returns its length.
pub(super) fn encode_moved(map_version: u64, b: &mut [u8]) -> Result<usize, EncodeError> {
    put_u64(b, 0, map_version)?;
    Ok(MOVED_LEN)
}
