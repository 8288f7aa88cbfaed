//! Wire frames: the control frames carried over TCP and the data messages carried in one
//! mailbox slot, encoded into and decoded from caller buffers.
//!
//! This module owns the byte layout and nothing else. Decoders check that a frame is
//! well-formed (magic, lengths, reserved bytes zero, every enum value known, every count and
//! name length in range) and hand back zero-copy views that borrow the input; whether an id
//! exists, a client is registered or a version is acceptable is the server's call. Encoders
//! write into a caller `&mut [u8]` and never allocate.
//!
//! Every integer is little-endian at an explicit byte offset, documented beside each layout.
//! Decoders never panic and never index out of bounds on any input: all reads go through the
//! checked helpers below. Every reserved byte must be zero and every field is decoded, so a
//! frame that decodes re-encodes to exactly the same bytes; nothing is silently ignored.
//!
//! | file         | owns                                                             |
//! |--------------|------------------------------------------------------------------|
//! | `mod.rs`     | constants, errors, byte helpers, version negotiation             |
//! | `control.rs` | the control header and message types, frame length and peeking   |
//! | `request.rs` | control request bodies                                           |
//! | `response.rs`| control response bodies                                          |
//! | `batch.rs`   | the counted lists inside control bodies, as borrowing views      |
//! | `data.rs`    | data messages: a header and up to [`BATCH_MAX`] 32-byte commands |
//! | `lock_flags.rs` | a lock command's flags byte (cached, retained, value block) and the downgrade op |
//! | `value.rs`   | value trailers: lock value blocks written by requests and returned by responses |
//! | `event.rs`   | event messages: revokes and overflow notices the server sends unasked |
//! | `recovery.rs`| `RecoveryDone` and `ListRetained` bodies (retained locks)        |
//! | `cluster.rs` | the cluster's bodies: `GetMap`, `ClientJoin`, `ReclaimDone`, the `PartitionMoved` reply |
//!
//! `lock_flags.rs`, `value.rs`, `event.rs` and `recovery.rs` are issue 19's wire forms, not yet wired into the decoders above: the
//! integration reads the flags byte in the command decoder, adds `LockOp::Downgrade`, the
//! trailers to the data-message length and the two bodies to the control messages.
//!
//! The layout follows the reference's (§5 of `shared/reference/dlock-reference.md`) in its
//! magics, version numbers, message types and the 16-byte control header; bodies are our own,
//! sized for what the server here needs (names are never truncated, a claim carries the whole
//! lock state a client re-syncs after a failover).

mod attach;
mod batch;
mod cluster;
mod control;
mod data;
mod event;
mod lock_flags;
mod recovery;
mod request;
mod response;
#[cfg(test)]
mod tests;
mod value;

pub use attach::{ATTACH_LEN, ATTACH_MAGIC, Attach};
pub use batch::{
    Batch, BatchEntries, BatchEntry, BatchGet, BatchIds, BatchIter, CLAIM_FIXED_LEN,
    CLAIM_HAS_VALUE, CLAIM_VALUE_LEN, Claims, Counters, Held, LockClaim, PartitionEpoch,
    PartitionStatus, PartitionStatuses, RECLAIM_DONES_MAX, ReclaimDones,
};
pub use cluster::{
    MAP_CHUNK_FIXED_LEN, MAP_CHUNK_MAX, MOVED_LEN, MapChunk, RECLAIM_DONE_LEN, map_chunk_len,
};
pub use control::{
    ControlHeader, MsgType, control_frame_len, peek_control_header, set_control_message_id,
};
pub use data::{
    Command, CommandResult, DataFrame, DataHeader, DataRequest, DataResponse, DataResult,
    JOIN_KIND, JoinCommand, LockCommand, LockOp, OBJECT_KIND, ObjectCommand, ObjectOp,
    RESULT_PLAIN_GRANT, begin_data_response, decode_data_request, decode_data_request_into,
    decode_data_response, encode_data_request, encode_data_response, finish_data_proofs,
    peek_data_frame, peek_data_header, peek_data_response_header, put_command_result,
    put_data_proof, put_data_result,
};
pub use event::{
    EVENT_LEN, EVENTS_MAX, Event, EventHeader, EventMessage, FLAG_EVENT, decode_event,
    decode_event_message, encode_event, encode_event_message, event_message_len, is_event_message,
};
pub use lock_flags::{DOWNGRADE_OP, LOCK_FLAGS_OFFSET, LockFlags, put_lock_flags, read_lock_flags};
pub use recovery::{
    LIST_RETAINED_CODE, ListRetained, RECOVERY_DONE_CODE, RETAINED_FIXED_LEN, RetainedEntries,
    RetainedEntry, RetainedPage, decode_recovery_done, decode_recovery_done_reply,
    encode_recovery_done, encode_recovery_done_reply,
};
pub use request::{
    ControlRequest, ControlRequestFrame, decode_control_request, encode_control_request,
};
pub use response::{
    ControlResponse, ControlResponseFrame, InitReply, decode_control_response,
    encode_control_response,
};
pub use value::{
    DATA_REQUEST_WITH_VALUES_MAX, DATA_RESPONSE_WITH_VALUES_MAX, FLAG_VALUES, VALUE_REPLY_LEN,
    VALUE_REQUEST_LEN, ValueReplies, ValueRequests, data_message_len, finish_value_replies,
    finish_value_requests, put_value_reply, put_value_request,
};

use crate::config::{BATCH_MAX, NAME_LEN_MAX};
use crate::status::Status;

/// First word of every control frame (the reference's value).
pub const CONTROL_MAGIC: u32 = 0xedf7_c94a;
/// First word of every data message (the reference's value).
pub const DATA_MAGIC: u32 = 0xedf7_c94b;
/// The protocol version this build speaks best (`DLOCK_PROTO_VERSION`). 3: 128-bit session
/// secrets in the registration's reply, the reinit request and the attach record. 4: grant
/// proofs, in a data response's trailer ([`FLAG_PROOFS`]) and in every claim. 5: the cluster
/// (`docs/cluster.md`, "Wire"): a partition epoch in every lock and object command, the status
/// `PartitionMoved`, the messages `GetMap`, `ClientJoin` and `ReclaimDone`, and a claim's proof
/// epoch widened to 32 bits over the reserved bytes beside it. 6: `ReclaimDones`, every
/// partition a client re-claimed at a server in one message (`cluster.rs`); nothing else
/// changed, so a client sends it only to a server whose registration or join named 6, and
/// the per-partition `ReclaimDone` to an older one. 7: the registration's reply carries the
/// server's revoke timeout ([`InitReply::revoke_timeout_ms`], in what was a reserved word that
/// older clients require zero, so a server sends it only to a client that negotiated 7). 8: a
/// grant made plain to a request that asked for a cached one says so in its own result (the top
/// bit of the echoed op byte, [`RESULT_PLAIN_GRANT`]) instead of the revoke notice an older
/// client is still sent (`manager::contention`).
pub const PROTO_VERSION: u8 = 8;
/// The first version whose results mark a grant made plain to a `CACHEABLE` request
/// ([`RESULT_PLAIN_GRANT`]): a server marks them only for a client registered at this version or
/// newer, and sends an older one the revoke notice it has always read.
pub const PROTO_VERSION_PLAIN_GRANTS: u8 = 8;
/// The first version whose registration reply carries the server's revoke timeout.
pub const PROTO_VERSION_REVOKE_TIMEOUT: u8 = 7;
/// The oldest protocol version this build still speaks (`DLOCK_MIN_PROTO_VERSION`): a version
/// 3 claim carries no proof, which a server with a session key could not take.
///
/// Version 4 stays: everything 5 adds is zero or absent between a standalone server and a
/// version 4 client, byte for byte. Such a client writes zeros where 5 has the partition
/// epoch, which is what a standalone server requires there; it writes a claim's proof epoch as
/// a `u16` followed by two zero bytes, which is the same `u32`; it never sends the new
/// messages, and a standalone server never answers `PartitionMoved`. A grant proof's MAC
/// changed (`server::proof`), but a client only stores and returns its bytes. A cluster
/// server speaks [`CLUSTER_VERSIONS`] only.
pub const PROTO_VERSION_MIN: u8 = 4;
/// The oldest version a cluster server speaks: a client of version 4 cannot name a
/// partition's epoch and cannot read `PartitionMoved`, so a cluster cannot route it. Also
/// the oldest a cluster client joins at: version 6 adds only a message the client sends to
/// a server that negotiated it, so a new client still joins a version-5 server.
pub const PROTO_VERSION_CLUSTER_MIN: u8 = 5;
/// The version that brought `ReclaimDones`: a client sends it only to a server that
/// negotiated this one or newer, and a server refuses a frame of it in an older version
/// (`ProtoVersionNegotiationFail`), as it refuses any frame in a version it does not speak.
pub const PROTO_VERSION_RECLAIM_DONES: u8 = 6;
/// Bytes in a control header.
pub const CONTROL_HEADER_LEN: usize = 16;
/// Bytes in a data-message header.
pub const DATA_HEADER_LEN: usize = 16;
/// Bytes in one data command (request or response).
pub const COMMAND_LEN: usize = 32;
/// The longest data request: a header and [`BATCH_MAX`] commands (1,008 bytes, inside the
/// reference's 1 KiB mailbox slot). Responses without proofs have the same size.
pub const DATA_MESSAGE_MAX: usize = DATA_HEADER_LEN + BATCH_MAX * COMMAND_LEN;
/// Bytes of grant proof per command in a response's proof trailer ([`FLAG_PROOFS`]).
pub const PROOF_LEN: usize = crate::ids::GrantProof::LEN;
/// The longest data response: [`DATA_MESSAGE_MAX`] and a proof trailer (1,504 bytes). Every
/// buffer a response may land in is this long.
pub const DATA_RESPONSE_MAX: usize = DATA_MESSAGE_MAX + BATCH_MAX * PROOF_LEN;
/// Bytes before the entries of every counted body: `u8 count | 3 reserved`.
pub const BATCH_HEADER_LEN: usize = 4;
/// Counters a `Stats` response may carry: room for the server's counters to grow (they filled
/// the 64 of protocol 6; the count is a `u8`).
pub const COUNTERS_MAX: usize = 128;
/// The longest control frame either side may send, which sizes the transport's buffers. The
/// largest body is a `BatchUpdateLocks` request with every name at its limit:
pub const CONTROL_FRAME_MAX: usize = CONTROL_HEADER_LEN // the header
    + BATCH_HEADER_LEN // the count and its padding
    + BATCH_MAX // entries, each
        * (CLAIM_FIXED_LEN // the fixed part of a claim
            + CLAIM_VALUE_LEN // the value block it offers
            + NAME_LEN_MAX); // and the longest name

// `total_len` is a u16, so the largest frame must fit it.
static_assertions::const_assert!(CONTROL_FRAME_MAX <= u16::MAX as usize);
// A batch-get entry (4 bytes + name) is smaller than a claim, so the claim batch is the largest
// request; the largest responses (Stats, batch results) are far below it.
static_assertions::const_assert!(
    CONTROL_HEADER_LEN + BATCH_HEADER_LEN + COUNTERS_MAX * 8 < CONTROL_FRAME_MAX
);
static_assertions::const_assert!(DATA_MESSAGE_MAX <= 1024);
static_assertions::const_assert!(DATA_RESPONSE_MAX <= 1536);
// Counts travel in a u8.
static_assertions::const_assert!(BATCH_MAX <= u8::MAX as usize);
static_assertions::const_assert!(COUNTERS_MAX <= u8::MAX as usize);

/// Data-header flag: apply the commands of the message all together or not at all.
pub const FLAG_ALL_OR_NOTHING: u32 = 1;
/// Data-header flag, responses only: a proof trailer follows the results, [`PROOF_LEN`] bytes
/// per command, the proof of command `i`'s grant or ticket at `i` (zero where there is none).
/// A server with a session key sets it on a response that grants or queues anything.
pub const FLAG_PROOFS: u32 = 2;
/// Every flag a request may carry; any other bit set is refused.
pub const REQUEST_FLAGS_KNOWN: u32 = FLAG_ALL_OR_NOTHING | FLAG_VALUES;
/// Every flag this version defines (requests and responses); any other bit set is refused.
pub const FLAGS_KNOWN: u32 = REQUEST_FLAGS_KNOWN | FLAG_PROOFS;

/// Why a frame failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The input ends before a field it must contain, or before the length its header announces.
    Truncated,
    /// The first word is not the magic of this frame kind.
    BadMagic,
    /// A control header whose `hdr_len` is not [`CONTROL_HEADER_LEN`].
    BadHeaderLen,
    /// A length field disagrees with the bytes present (trailing bytes, a short body, a frame
    /// length outside the limits).
    BadLength,
    /// A message type that is not defined, or a response where a request is expected (or the
    /// other way round).
    UnknownType(u8),
    /// A batch count outside its range.
    BadCount,
    /// A name that is empty or longer than [`NAME_LEN_MAX`].
    BadName,
    /// An unknown lock or command kind.
    BadKind,
    /// An unknown operation code.
    BadOp,
    /// A data-header flag bit this version does not define.
    BadFlags,
    /// Any other field out of range: a reserved byte that is not zero, an unknown status code,
    /// a boolean that is neither 0 nor 1, a status in a request.
    BadField,
}

impl DecodeError {
    /// The status to report for a frame that failed to decode. Always [`Status::Einval`]: a
    /// malformed frame is a bad argument from the peer, and the reference answers malformed
    /// requests the same way. The variant is for logs; the peer learns only that the frame was
    /// refused. (A *client* that cannot decode a response reports `BadResponse` instead; that
    /// mapping belongs to the client.)
    pub const fn status(self) -> Status {
        Status::Einval
    }
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("frame truncated"),
            DecodeError::BadMagic => f.write_str("bad magic"),
            DecodeError::BadHeaderLen => f.write_str("bad header length"),
            DecodeError::BadLength => f.write_str("length field disagrees with the bytes"),
            DecodeError::UnknownType(t) => write!(f, "unknown or unexpected message type {t}"),
            DecodeError::BadCount => f.write_str("batch count out of range"),
            DecodeError::BadName => f.write_str("name empty or too long"),
            DecodeError::BadKind => f.write_str("unknown kind"),
            DecodeError::BadOp => f.write_str("unknown operation"),
            DecodeError::BadFlags => f.write_str("unknown flag bits"),
            DecodeError::BadField => f.write_str("field out of range"),
        }
    }
}

/// Why a frame could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The output buffer cannot hold the frame.
    BufferTooSmall,
    /// The frame breaks a limit the decoder enforces (a name empty or over [`NAME_LEN_MAX`], a
    /// batch count out of range, a body that does not match the header's type or status, an
    /// unknown flag). Refusing here means a peer never receives a frame it would refuse.
    Invalid,
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EncodeError::BufferTooSmall => f.write_str("output buffer too small"),
            EncodeError::Invalid => f.write_str("frame breaks a protocol limit"),
        }
    }
}

/// A range of protocol versions one side speaks, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionRange {
    /// Oldest version spoken.
    pub min: u8,
    /// Newest version spoken.
    pub max: u8,
}

/// The versions a standalone server speaks.
pub const SERVER_VERSIONS: VersionRange = VersionRange {
    min: PROTO_VERSION_MIN,
    max: PROTO_VERSION,
};

/// The versions a cluster server speaks ([`PROTO_VERSION_CLUSTER_MIN`]).
pub const CLUSTER_VERSIONS: VersionRange = VersionRange {
    min: PROTO_VERSION_CLUSTER_MIN,
    max: PROTO_VERSION,
};

/// The version a client and a server will talk: the newest both speak. The client sends its
/// range in `ClientInit` (header version = its max, body = its min).
///
/// `Err(ProtoVersionNegotiationFail)` when the ranges do not overlap or either is empty.
pub const fn negotiate(client: VersionRange, server: VersionRange) -> Result<u8, Status> {
    if client.min > client.max
        || server.min > server.max
        || client.max < server.min
        || client.min > server.max
    {
        return Err(Status::ProtoVersionNegotiationFail);
    }
    // Both ranges are non-empty and overlap, so the smaller max lies in both.
    Ok(if client.max < server.max {
        client.max
    } else {
        server.max
    })
}

/// The first word of a stream's first message, which says what the stream carries: control
/// frames ([`CONTROL_MAGIC`]), a data channel's attach record ([`ATTACH_MAGIC`]), or another
/// transport's record; `None` until four bytes have arrived.
#[inline]
pub fn peek_magic(buf: &[u8]) -> Option<u32> {
    get_u32(buf, 0).ok()
}

// Byte helpers. Each read is bounds-checked and reports `Truncated` instead of panicking; each
// write reports `BufferTooSmall`. Offsets are explicit so the code reads like the layout tables.

#[inline]
fn get_array<const N: usize>(buf: &[u8], off: usize) -> Result<[u8; N], DecodeError> {
    let end = off.checked_add(N).ok_or(DecodeError::Truncated)?;
    match buf.get(off..end) {
        Some(s) => s.try_into().map_err(|_| DecodeError::Truncated),
        None => Err(DecodeError::Truncated),
    }
}

#[inline]
fn get_u8(buf: &[u8], off: usize) -> Result<u8, DecodeError> {
    buf.get(off).copied().ok_or(DecodeError::Truncated)
}

#[inline]
fn get_u16(buf: &[u8], off: usize) -> Result<u16, DecodeError> {
    get_array(buf, off).map(u16::from_le_bytes)
}

#[inline]
fn get_u32(buf: &[u8], off: usize) -> Result<u32, DecodeError> {
    get_array(buf, off).map(u32::from_le_bytes)
}

#[inline]
fn get_u64(buf: &[u8], off: usize) -> Result<u64, DecodeError> {
    get_array(buf, off).map(u64::from_le_bytes)
}

#[inline]
fn get_u128(buf: &[u8], off: usize) -> Result<u128, DecodeError> {
    get_array(buf, off).map(u128::from_le_bytes)
}

/// `Ok` when `buf[off..off + len]` exists and is all zero (a reserved field).
#[inline]
fn check_zero(buf: &[u8], off: usize, len: usize) -> Result<(), DecodeError> {
    let end = off.checked_add(len).ok_or(DecodeError::Truncated)?;
    let bytes = buf.get(off..end).ok_or(DecodeError::Truncated)?;
    if bytes.iter().all(|&b| b == 0) {
        Ok(())
    } else {
        Err(DecodeError::BadField)
    }
}

#[inline]
fn put_bytes(out: &mut [u8], off: usize, bytes: &[u8]) -> Result<(), EncodeError> {
    let end = off
        .checked_add(bytes.len())
        .ok_or(EncodeError::BufferTooSmall)?;
    out.get_mut(off..end)
        .ok_or(EncodeError::BufferTooSmall)?
        .copy_from_slice(bytes);
    Ok(())
}

#[inline]
fn put_u8(out: &mut [u8], off: usize, v: u8) -> Result<(), EncodeError> {
    put_bytes(out, off, &[v])
}

#[inline]
fn put_u16(out: &mut [u8], off: usize, v: u16) -> Result<(), EncodeError> {
    put_bytes(out, off, &v.to_le_bytes())
}

#[inline]
fn put_u32(out: &mut [u8], off: usize, v: u32) -> Result<(), EncodeError> {
    put_bytes(out, off, &v.to_le_bytes())
}

#[inline]
fn put_u64(out: &mut [u8], off: usize, v: u64) -> Result<(), EncodeError> {
    put_bytes(out, off, &v.to_le_bytes())
}

#[inline]
fn put_u128(out: &mut [u8], off: usize, v: u128) -> Result<(), EncodeError> {
    put_bytes(out, off, &v.to_le_bytes())
}

/// Zeroes `out[off..off + len]` (a reserved field).
#[inline]
fn put_zero(out: &mut [u8], off: usize, len: usize) -> Result<(), EncodeError> {
    let end = off.checked_add(len).ok_or(EncodeError::BufferTooSmall)?;
    out.get_mut(off..end)
        .ok_or(EncodeError::BufferTooSmall)?
        .fill(0);
    Ok(())
}

/// A name's length as the wire carries it, or `BadName` when it is outside `1..=NAME_LEN_MAX`.
#[inline]
fn check_name_len(len: usize) -> Result<u16, DecodeError> {
    if (1..=NAME_LEN_MAX).contains(&len) {
        // NAME_LEN_MAX < 2^16, so the conversion cannot fail; keep it checked anyway.
        u16::try_from(len).map_err(|_| DecodeError::BadName)
    } else {
        Err(DecodeError::BadName)
    }
}

/// The wire length of a name the encoder was given, or `Invalid`.
#[inline]
fn name_len_for_encode(name: &[u8]) -> Result<u16, EncodeError> {
    check_name_len(name.len()).map_err(|_| EncodeError::Invalid)
}

/// Splits a name of `name_len` bytes off the front of `rest`; `BadName` for a length out of
/// range, `BadLength` when fewer bytes remain.
#[inline]
fn take_name(rest: &[u8], name_len: u16) -> Result<(&[u8], &[u8]), DecodeError> {
    let n = usize::from(check_name_len(usize::from(name_len))?);
    rest.split_at_checked(n).ok_or(DecodeError::BadLength)
}
