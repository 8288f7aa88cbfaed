//! Control frames: registration, lock and object naming, recovery, statistics and the
//! cluster's map, joins and re-claims, over TCP.
//!
//! # Header (16 bytes)
//!
//! | off | type | field                                                                  |
//! |-----|------|------------------------------------------------------------------------|
//! | 0   | u32  | magic, [`CONTROL_MAGIC`]                                               |
//! | 4   | u8   | version                                                                |
//! | 5   | u8   | `hdr_len`, must be [`CONTROL_HEADER_LEN`]                              |
//! | 6   | u8   | type: a [`MsgType`] for a request, that value + 1 for its response    |
//! | 7   | u8   | reserved, zero                                                         |
//! | 8   | u16  | `total_len`: header + body, 16..=[`CONTROL_FRAME_MAX`]                 |
//! | 10  | u16  | `message_id`, copied from request to response                          |
//! | 12  | u32  | `word`: the client id in requests, the status code in responses        |
//!
//! The bodies are laid out in `request.rs` and `response.rs`.
//!
//! The decoders check the layout only. Versions are the server's business (a `ClientInit`
//! header carries the client's newest version, which may be beyond ours), as are ids and
//! whether the client in `word` is registered.

use super::{
    CONTROL_FRAME_MAX, CONTROL_HEADER_LEN, CONTROL_MAGIC, DecodeError, EncodeError, check_zero,
    get_u8, get_u16, get_u32, put_u8, put_u16, put_u32,
};
use crate::status::Status;

/// Control message types, with the reference's request values. A response's type byte is the
/// request's + 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    /// Register a client and negotiate the version.
    ClientInit = 12,
    /// Unregister; the server releases everything the client held.
    ClientDeinit = 14,
    /// Renew the client's lease.
    Heartbeat = 16,
    /// Name a lock and get its id.
    GetLock = 18,
    /// Drop a lock id.
    ReleaseLock = 20,
    /// `GetLock` for up to 31 names.
    BatchGetLock = 22,
    /// `ReleaseLock` for up to 31 ids.
    BatchReleaseLock = 24,
    /// Create a named 64-bit object.
    ObjectCreate = 26,
    /// Look up a named object.
    ObjectGet = 28,
    /// Drop an object reference.
    ObjectRelease = 30,
    /// Destroy an object (owner only).
    ObjectDestroy = 32,
    /// Re-register an existing client id with a recovering server.
    ClientReinit = 34,
    /// The client has re-sent everything it held.
    ReinitDone = 36,
    /// Re-create up to 31 locks a client held on the failed server.
    BatchUpdateLocks = 38,
    /// Read the server's counters (not in the reference).
    Stats = 40,
    /// Read a chunk of the cluster's map (dlock's, protocol 5: `cluster.rs`).
    GetMap = 42,
    /// A recoverer releases a dead client's retained locks (dlock's, protocol 5:
    /// `recovery.rs`).
    RecoveryDone = 44,
    /// List the locks dead clients retain, a page at a time (dlock's, protocol 5:
    /// `recovery.rs`).
    ListRetained = 46,
    /// Register with this server a client id another server of the cluster gave (dlock's,
    /// protocol 5: `cluster.rs`).
    ClientJoin = 48,
    /// The client has re-claimed everything it held in a partition (dlock's, protocol 5:
    /// `cluster.rs`).
    ReclaimDone = 50,
    /// An operator asks a cluster server to give every partition away (`dlock drain`;
    /// dlock's, protocol 5: `cluster.rs`). Answered by the transport, not the state machine.
    Drain = 52,
    /// The client has re-claimed everything it held in each of a list of partitions: one
    /// `ReclaimDone` per partition in one message, answered partition by partition (dlock's,
    /// protocol 6: `cluster.rs`).
    ReclaimDones = 54,
}

impl MsgType {
    /// Every message type, in wire order.
    pub const ALL: [MsgType; 22] = [
        MsgType::ClientInit,
        MsgType::ClientDeinit,
        MsgType::Heartbeat,
        MsgType::GetLock,
        MsgType::ReleaseLock,
        MsgType::BatchGetLock,
        MsgType::BatchReleaseLock,
        MsgType::ObjectCreate,
        MsgType::ObjectGet,
        MsgType::ObjectRelease,
        MsgType::ObjectDestroy,
        MsgType::ClientReinit,
        MsgType::ReinitDone,
        MsgType::BatchUpdateLocks,
        MsgType::Stats,
        MsgType::GetMap,
        MsgType::RecoveryDone,
        MsgType::ListRetained,
        MsgType::ClientJoin,
        MsgType::ReclaimDone,
        MsgType::Drain,
        MsgType::ReclaimDones,
    ];

    /// The type byte of a request.
    #[inline]
    pub const fn request_code(self) -> u8 {
        self as u8
    }

    /// The type byte of the response to this request.
    #[inline]
    pub const fn response_code(self) -> u8 {
        self as u8 + 1
    }

    /// The message type a type byte names and whether it is a response; `None` if undefined.
    #[inline]
    pub const fn from_code(code: u8) -> Option<(MsgType, bool)> {
        let is_response = code & 1 == 1;
        let request = code & !1;
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as u8 == request {
                return Some((Self::ALL[i], is_response));
            }
            i += 1;
        }
        None
    }
}

/// The fields of a control header that carry meaning (magic, `hdr_len` and `total_len` are
/// the codec's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlHeader {
    /// Protocol version: in `ClientInit`/`ClientReinit`/`ClientJoin` the client's newest,
    /// elsewhere the negotiated one.
    pub version: u8,
    /// The request type (for a response, the request it answers).
    pub msg: MsgType,
    /// Chosen by the client, copied into the response.
    pub message_id: u16,
    /// Requests: the client id (0 in `ClientInit`, the id being re-registered in
    /// `ClientReinit` or registered in `ClientJoin`). Responses: the status code.
    pub word: u32,
}

impl ControlHeader {
    /// `word` read as a status code (responses); `None` if it is not one.
    #[inline]
    pub const fn status(&self) -> Option<Status> {
        if self.word > u16::MAX as u32 {
            return None;
        }
        Status::from_code(self.word as u16)
    }
}

/// Checks every header field that does not depend on how many bytes follow; returns the
/// header, whether it is a response, and `total_len`.
pub(super) fn parse_header(buf: &[u8]) -> Result<(ControlHeader, bool, usize), DecodeError> {
    if buf.len() < CONTROL_HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    if get_u32(buf, 0)? != CONTROL_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if usize::from(get_u8(buf, 5)?) != CONTROL_HEADER_LEN {
        return Err(DecodeError::BadHeaderLen);
    }
    check_zero(buf, 7, 1)?;
    let total_len = usize::from(get_u16(buf, 8)?);
    if !(CONTROL_HEADER_LEN..=CONTROL_FRAME_MAX).contains(&total_len) {
        return Err(DecodeError::BadLength);
    }
    let code = get_u8(buf, 6)?;
    let (msg, is_response) = MsgType::from_code(code).ok_or(DecodeError::UnknownType(code))?;
    let header = ControlHeader {
        version: get_u8(buf, 4)?,
        msg,
        message_id: get_u16(buf, 10)?,
        word: get_u32(buf, 12)?,
    };
    Ok((header, is_response, total_len))
}

/// The length of the frame that starts with `header_bytes`, for reading frames off a stream.
///
/// `Err(Truncated)` when fewer than 16 bytes are given (read more); any other error means the
/// stream is not carrying dlock frames and should be closed. The body is not looked at.
pub fn control_frame_len(header_bytes: &[u8]) -> Result<usize, DecodeError> {
    parse_header(header_bytes).map(|(_, _, total_len)| total_len)
}

/// Validates only the header of a complete frame, so a server can echo the message id and type
/// in an error reply even when the body is malformed. Returns the header and whether the frame
/// is a response.
pub fn peek_control_header(buf: &[u8]) -> Result<(ControlHeader, bool), DecodeError> {
    let (header, is_response, total_len) = parse_header(buf)?;
    if total_len > buf.len() {
        return Err(DecodeError::Truncated);
    }
    Ok((header, is_response))
}

/// Writes `message_id` into the header of the control frame (request or response) at the start
/// of `frame`, whose header must be valid. A client that lets many registrations share one
/// connection numbers their control exchanges on the wire itself, each of them numbering its
/// own from 1, and gives each caller its own number back (`dlock-transport`'s `client::mux`).
pub fn set_control_message_id(frame: &mut [u8], message_id: u16) -> Result<(), DecodeError> {
    parse_header(frame)?;
    put_u16(frame, 10, message_id).map_err(|_| DecodeError::Truncated)
}

/// The body of a frame whose `total_len` must be exactly `buf.len()`.
pub(super) fn whole_frame_body(buf: &[u8], total_len: usize) -> Result<&[u8], DecodeError> {
    if total_len > buf.len() {
        return Err(DecodeError::Truncated);
    }
    if total_len < buf.len() {
        return Err(DecodeError::BadLength);
    }
    buf.get(CONTROL_HEADER_LEN..).ok_or(DecodeError::Truncated)
}

/// `Ok` when `body` is exactly `len` bytes.
#[inline]
pub(super) fn exact(body: &[u8], len: usize) -> Result<(), DecodeError> {
    if body.len() == len {
        Ok(())
    } else {
        Err(DecodeError::BadLength)
    }
}

/// Writes the header for a frame of `total_len` bytes whose type byte is `code`.
pub(super) fn put_header(
    out: &mut [u8],
    header: &ControlHeader,
    code: u8,
    total_len: usize,
) -> Result<usize, EncodeError> {
    // Bodies are bounded by the count and name limits, so this holds for any frame the encoders
    // accept; checked so a future body that breaks it fails loudly instead of wrapping.
    if total_len > CONTROL_FRAME_MAX {
        return Err(EncodeError::Invalid);
    }
    let total = u16::try_from(total_len).map_err(|_| EncodeError::Invalid)?;
    put_u32(out, 0, CONTROL_MAGIC)?;
    put_u8(out, 4, header.version)?;
    put_u8(out, 5, CONTROL_HEADER_LEN as u8)?;
    put_u8(out, 6, code)?;
    put_u8(out, 7, 0)?;
    put_u16(out, 8, total)?;
    put_u16(out, 10, header.message_id)?;
    put_u32(out, 12, header.word)?;
    Ok(total_len)
}
