//! Control response bodies.
//!
//! A response whose status is not `Success` has an empty body, whatever its type, except
//! `PartitionMoved`'s: `0 u64 map_version`, exactly (`cluster.rs`).
//!
//! | type                                   | body                                                   |
//! |----------------------------------------|--------------------------------------------------------|
//! | `ClientInit`, `ClientReinit`, `ClientJoin` | `0 u32 client \| 4 u8 version \| 5 u8 recovering (0/1) \| 6 u16 epoch \| 8 u32 lease_ms \| 12 u32 objects_max \| 16 u32 slot \| 20 u32 revoke_timeout_ms (7; zero before) \| 24 [u8; 16] session` |
//! | `GetLock`, `ObjectCreate`              | `0 u32 id`                                             |
//! | `ObjectGet`                            | `0 u32 object \| 4 u32 cell`                          |
//! | the three batches                      | a counted list of `u32 id \| u16 status \| u16 reserved` |
//! | `Stats`                                | a counted list of `u64`                                |
//! | `GetMap`                               | `0 u64 version \| 8 u32 total_len \| 12 u32 offset \| 16 chunk` (`cluster.rs`) |
//! | `RecoveryDone`, `ListRetained`         | `recovery.rs`                                          |
//! | the others                             | empty                                                  |

use super::cluster::{MapChunk, decode_moved, encode_moved};
use super::control::{ControlHeader, MsgType, exact, parse_header, put_header, whole_frame_body};
use super::recovery::{RetainedPage, decode_recovery_done_reply, encode_recovery_done_reply};
use super::{
    BatchEntries, CONTROL_HEADER_LEN, Counters, DecodeError, EncodeError, PartitionStatuses,
    get_array, get_u8, get_u16, get_u32, put_bytes, put_u8, put_u16, put_u32,
};
use crate::ids::Session;
use crate::status::Status;

/// Bytes in an `InitReply` body.
const INIT_REPLY_LEN: usize = 24 + Session::LEN;

/// The reply to `ClientInit`, `ClientReinit` and `ClientJoin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitReply {
    /// The client id assigned (or confirmed, on reinit).
    pub client: u32,
    /// The negotiated version.
    pub version: u8,
    /// The server is waiting for clients to re-sync; only recovery requests are served.
    pub recovering: bool,
    /// The server's epoch (high bits of every fencing token) on a standalone server; 0 from a
    /// cluster server, whose epochs are per partition (the map's).
    pub epoch: u16,
    /// The lease granted; heartbeat well within it. The server owns leases: this is at most
    /// its `client_lease_max_ms`, whatever the client asked for.
    pub lease_ms: u32,
    /// Object cells in the server's region, for one-sided access.
    pub objects_max: u32,
    /// The client's slot in the server's tables: its mailbox on the shared-memory transport.
    pub slot: u32,
    /// A secret for this registration that a transport demands before it binds a second
    /// channel (a TCP data connection, an RDMA queue pair) to the client id, and that a reinit
    /// of a live registration must show.
    pub session: Session,
    /// The revoke timeout the server holds this client's cached grants to (its
    /// `--revoke-timeout-ms`, else the lease granted): the client trusts a cached grant only
    /// this long past its last answered data request (`manager::trust`). 0: not told — the
    /// word was reserved, and is zero, before version [`PROTO_VERSION_REVOKE_TIMEOUT`]
    /// (an older server, or a client that negotiated an older version).
    ///
    /// [`PROTO_VERSION_REVOKE_TIMEOUT`]: super::PROTO_VERSION_REVOKE_TIMEOUT
    pub revoke_timeout_ms: u32,
}

/// A control response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlResponse<'a> {
    /// No body: any failed request, and the successes that return nothing.
    Empty,
    /// `ClientInit` / `ClientReinit` / `ClientJoin` success.
    Init(InitReply),
    /// `GetLock` success.
    Lock {
        /// The lock id.
        lock: u32,
    },
    /// `ObjectCreate` success.
    Object {
        /// The object id.
        object: u32,
    },
    /// `ObjectGet` success.
    ObjectRef {
        /// The object id.
        object: u32,
        /// Index of the object's 8-byte cell, for one-sided access.
        cell: u32,
    },
    /// Success of the three batch requests: one entry per request entry, in order.
    Entries(BatchEntries<'a>),
    /// `Stats` success.
    Counters(Counters<'a>),
    /// `GetMap` success.
    MapChunk(MapChunk<'a>),
    /// `RecoveryDone` success: how many retained locks were released.
    Released {
        /// Retained grants released.
        locks: u32,
    },
    /// `ListRetained` success: one page.
    Retained(RetainedPage<'a>),
    /// `ReclaimDones` success: one status per partition, in request order.
    PartitionStatuses(PartitionStatuses<'a>),
    /// The body of any response with status `PartitionMoved` (and of no other).
    PartitionMoved {
        /// The map version the refusing server knows.
        map_version: u64,
    },
}

/// A decoded (or to-be-encoded) control response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlResponseFrame<'a> {
    /// The header; `header.word` is the status code.
    pub header: ControlHeader,
    /// The body.
    pub body: ControlResponse<'a>,
}

/// Decodes one complete control response (`buf` is exactly one frame).
pub fn decode_control_response(buf: &[u8]) -> Result<ControlResponseFrame<'_>, DecodeError> {
    let (header, is_response, total_len) = parse_header(buf)?;
    if !is_response {
        return Err(DecodeError::UnknownType(header.msg.request_code()));
    }
    let b = whole_frame_body(buf, total_len)?;
    let status = header.status().ok_or(DecodeError::BadField)?;
    let body = match status {
        Status::Success => decode_response_body(header.msg, b)?,
        Status::PartitionMoved => ControlResponse::PartitionMoved {
            map_version: decode_moved(b)?,
        },
        _ => exact(b, 0).map(|()| ControlResponse::Empty)?,
    };
    Ok(ControlResponseFrame { header, body })
}

fn decode_response_body(msg: MsgType, b: &[u8]) -> Result<ControlResponse<'_>, DecodeError> {
    Ok(match msg {
        MsgType::ClientInit | MsgType::ClientReinit | MsgType::ClientJoin => {
            exact(b, INIT_REPLY_LEN)?;
            let recovering = match get_u8(b, 5)? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::BadField),
            };
            ControlResponse::Init(InitReply {
                client: get_u32(b, 0)?,
                version: get_u8(b, 4)?,
                recovering,
                epoch: get_u16(b, 6)?,
                lease_ms: get_u32(b, 8)?,
                objects_max: get_u32(b, 12)?,
                slot: get_u32(b, 16)?,
                revoke_timeout_ms: get_u32(b, 20)?,
                session: Session(get_array(b, 24)?),
            })
        }
        MsgType::ClientDeinit
        | MsgType::Heartbeat
        | MsgType::ReinitDone
        | MsgType::ReclaimDone
        | MsgType::Drain
        | MsgType::ReleaseLock
        | MsgType::ObjectRelease
        | MsgType::ObjectDestroy => exact(b, 0).map(|()| ControlResponse::Empty)?,
        MsgType::GetLock => {
            exact(b, 4)?;
            ControlResponse::Lock {
                lock: get_u32(b, 0)?,
            }
        }
        MsgType::ObjectCreate => {
            exact(b, 4)?;
            ControlResponse::Object {
                object: get_u32(b, 0)?,
            }
        }
        MsgType::ObjectGet => {
            exact(b, 8)?;
            ControlResponse::ObjectRef {
                object: get_u32(b, 0)?,
                cell: get_u32(b, 4)?,
            }
        }
        MsgType::BatchGetLock | MsgType::BatchReleaseLock | MsgType::BatchUpdateLocks => {
            ControlResponse::Entries(BatchEntries::decode(b)?)
        }
        MsgType::Stats => ControlResponse::Counters(Counters::decode(b)?),
        MsgType::GetMap => ControlResponse::MapChunk(MapChunk::decode(b)?),
        MsgType::RecoveryDone => ControlResponse::Released {
            locks: decode_recovery_done_reply(b)?,
        },
        MsgType::ListRetained => ControlResponse::Retained(RetainedPage::decode(b)?),
        MsgType::ReclaimDones => ControlResponse::PartitionStatuses(PartitionStatuses::decode(b)?),
    })
}

/// Encodes a control response into `out`, returning the frame length. `header.msg` is the
/// request answered and `header.word` the status code. `Invalid` when the word is not a status
/// code, when a failure other than `PartitionMoved` carries a body, when `PartitionMoved` does
/// not carry its own, or when a success carries the wrong body for its type.
pub fn encode_control_response(
    header: &ControlHeader,
    body: &ControlResponse<'_>,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let status = header.status().ok_or(EncodeError::Invalid)?;
    let b = out
        .get_mut(CONTROL_HEADER_LEN..)
        .ok_or(EncodeError::BufferTooSmall)?;
    let body_len = match (status, body) {
        (Status::Success, body) => encode_response_body(header.msg, body, b)?,
        (Status::PartitionMoved, ControlResponse::PartitionMoved { map_version }) => {
            encode_moved(*map_version, b)?
        }
        (Status::PartitionMoved, _) => return Err(EncodeError::Invalid),
        (_, ControlResponse::Empty) => 0,
        (_, _) => return Err(EncodeError::Invalid),
    };
    put_header(
        out,
        header,
        header.msg.response_code(),
        CONTROL_HEADER_LEN + body_len,
    )
}

fn encode_response_body(
    msg: MsgType,
    body: &ControlResponse<'_>,
    b: &mut [u8],
) -> Result<usize, EncodeError> {
    match (msg, *body) {
        (
            MsgType::ClientInit | MsgType::ClientReinit | MsgType::ClientJoin,
            ControlResponse::Init(r),
        ) => {
            put_u32(b, 0, r.client)?;
            put_u8(b, 4, r.version)?;
            put_u8(b, 5, u8::from(r.recovering))?;
            put_u16(b, 6, r.epoch)?;
            put_u32(b, 8, r.lease_ms)?;
            put_u32(b, 12, r.objects_max)?;
            put_u32(b, 16, r.slot)?;
            put_u32(b, 20, r.revoke_timeout_ms)?;
            put_bytes(b, 24, &r.session.0)?;
            Ok(INIT_REPLY_LEN)
        }
        (
            MsgType::ClientDeinit
            | MsgType::Heartbeat
            | MsgType::ReinitDone
            | MsgType::ReclaimDone
            | MsgType::Drain
            | MsgType::ReleaseLock
            | MsgType::ObjectRelease
            | MsgType::ObjectDestroy,
            ControlResponse::Empty,
        ) => Ok(0),
        (MsgType::GetLock, ControlResponse::Lock { lock: id })
        | (MsgType::ObjectCreate, ControlResponse::Object { object: id }) => {
            put_u32(b, 0, id)?;
            Ok(4)
        }
        (MsgType::ObjectGet, ControlResponse::ObjectRef { object, cell }) => {
            put_u32(b, 0, object)?;
            put_u32(b, 4, cell)?;
            Ok(8)
        }
        (
            MsgType::BatchGetLock | MsgType::BatchReleaseLock | MsgType::BatchUpdateLocks,
            ControlResponse::Entries(entries),
        ) => entries.encode(b),
        (MsgType::Stats, ControlResponse::Counters(counters)) => counters.encode(b),
        (MsgType::GetMap, ControlResponse::MapChunk(chunk)) => chunk.encode(b),
        (MsgType::RecoveryDone, ControlResponse::Released { locks }) => {
            encode_recovery_done_reply(locks, b)
        }
        (MsgType::ListRetained, ControlResponse::Retained(page)) => page.encode(b),
        (MsgType::ReclaimDones, ControlResponse::PartitionStatuses(s)) => s.encode(b),
        _ => Err(EncodeError::Invalid),
    }
}
