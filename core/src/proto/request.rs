//! Control request bodies.
//!
//! | type                                   | body                                                   |
//! |----------------------------------------|--------------------------------------------------------|
//! | `ClientInit`                           | `0 u8 min_version \| 1 3 reserved \| 4 u32 lease_ms`  |
//! | `ClientReinit`                         | the same, then `8 u64 session` (the secret of the registration it resumes; 0 when the server may have failed over) |
//! | `ClientDeinit`, `Heartbeat`, `ReinitDone`, `Stats`, `Drain` | empty                             |
//! | `GetLock`                              | one lock request entry (see `batch.rs`)                |
//! | `ReleaseLock`, `ObjectRelease`, `ObjectDestroy` | `0 u32 id`                                    |
//! | `BatchGetLock`, `BatchReleaseLock`, `BatchUpdateLocks` | a counted list (see `batch.rs`)        |
//! | `ObjectCreate` | `0 u64 init \| 8 u32 lease_s \| 12 u16 name_len \| 14 u16 reserved \| 16 name` |
//! | `ObjectGet`    | `0 u32 lease_s \| 4 u16 name_len \| 6 u16 reserved \| 8 name`                |
//! | `GetMap`       | `0 u32 offset`                                                              |
//! | `ClientJoin`   | `ClientReinit`'s                                                            |
//! | `ReclaimDone`  | `0 u16 partition \| 2 u16 reserved \| 4 u32 epoch`                          |
//! | `RecoveryDone`, `ListRetained` | `recovery.rs`                                               |
//!
//! Lock request entries and counted lists are laid out in `batch.rs`, the cluster's bodies in
//! `cluster.rs`.

use super::batch::{decode_lock_request, encode_lock_request};
use super::cluster::{decode_get_map, decode_reclaim_done, encode_get_map, encode_reclaim_done};
use super::control::{ControlHeader, MsgType, exact, parse_header, put_header, whole_frame_body};
use super::recovery::{ListRetained, decode_recovery_done, encode_recovery_done};
use super::{
    BatchGet, BatchIds, CONTROL_HEADER_LEN, Claims, DecodeError, EncodeError, ReclaimDones,
    check_zero, get_array, get_u8, get_u16, get_u32, get_u64, name_len_for_encode, put_bytes,
    put_u8, put_u16, put_u32, put_u64, put_zero, take_name,
};
use crate::ids::{LockKind, Session};

/// A control request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlRequest<'a> {
    /// Register. The header version is the client's newest version.
    ClientInit {
        /// The client's oldest version.
        min_version: u8,
        /// The lease the client asks for (the server may clamp it).
        lease_ms: u32,
    },
    /// Unregister.
    ClientDeinit,
    /// Renew the lease.
    Heartbeat,
    /// Name a lock.
    GetLock {
        /// The kind the lock must have.
        kind: LockKind,
        /// 1..=512 bytes.
        name: &'a [u8],
    },
    /// Drop a lock id.
    ReleaseLock {
        /// The lock id.
        lock: u32,
    },
    /// Name up to 31 locks.
    BatchGetLock(BatchGet<'a>),
    /// Drop up to 31 lock ids.
    BatchReleaseLock(BatchIds<'a>),
    /// Create an object.
    ObjectCreate {
        /// 1..=512 bytes.
        name: &'a [u8],
        /// Initial value.
        init: u64,
        /// Lease in seconds (the reference's unit).
        lease_s: u32,
    },
    /// Look up an object.
    ObjectGet {
        /// 1..=512 bytes.
        name: &'a [u8],
        /// Lease in seconds.
        lease_s: u32,
    },
    /// Drop an object reference.
    ObjectRelease {
        /// The object id.
        object: u32,
    },
    /// Destroy an object.
    ObjectDestroy {
        /// The object id.
        object: u32,
    },
    /// Re-register the id in the header word with a recovering server.
    ClientReinit {
        /// The client's oldest version.
        min_version: u8,
        /// The lease the client asks for.
        lease_ms: u32,
        /// The secret of the registration being resumed (`InitReply::session`): a live server
        /// refuses a reinit that cannot show it, so nobody resumes a client by guessing its id.
        session: Session,
    },
    /// Recovery of this client is complete.
    ReinitDone,
    /// Re-create locks held on the failed server.
    BatchUpdateLocks(Claims<'a>),
    /// Read the server counters.
    Stats,
    /// Read the chunk of the cluster's map at `offset` (`cluster.rs`).
    GetMap {
        /// Where in the map's encoding to read.
        offset: u32,
    },
    /// Register the id in the header word, which another server of the cluster gave, with
    /// this one (`cluster.rs`).
    ClientJoin {
        /// The client's oldest version.
        min_version: u8,
        /// The lease the client asks for.
        lease_ms: u32,
        /// The secret the other server gave with the id, minted under the cluster's key.
        session: Session,
    },
    /// The client has re-claimed everything it held in `partition` (`cluster.rs`).
    ReclaimDone {
        /// The partition.
        partition: u16,
        /// The partition's epoch in the client's map: the takeover the re-claims were for.
        epoch: u32,
    },
    /// A recoverer replayed dead client `dead`'s work: release its retained locks
    /// (`recovery.rs`).
    RecoveryDone {
        /// The dead client's id.
        dead: u32,
    },
    /// List retained locks, a page at a time (`recovery.rs`).
    ListRetained(ListRetained),
    /// An operator asks this cluster server to give every partition away (`cluster.rs`).
    Drain,
    /// The client has re-claimed everything it held in each listed partition (`cluster.rs`,
    /// protocol 6).
    ReclaimDones(ReclaimDones<'a>),
}

impl ControlRequest<'_> {
    /// The message type this body belongs to.
    pub const fn msg_type(&self) -> MsgType {
        match self {
            ControlRequest::ClientInit { .. } => MsgType::ClientInit,
            ControlRequest::ClientDeinit => MsgType::ClientDeinit,
            ControlRequest::Heartbeat => MsgType::Heartbeat,
            ControlRequest::GetLock { .. } => MsgType::GetLock,
            ControlRequest::ReleaseLock { .. } => MsgType::ReleaseLock,
            ControlRequest::BatchGetLock(_) => MsgType::BatchGetLock,
            ControlRequest::BatchReleaseLock(_) => MsgType::BatchReleaseLock,
            ControlRequest::ObjectCreate { .. } => MsgType::ObjectCreate,
            ControlRequest::ObjectGet { .. } => MsgType::ObjectGet,
            ControlRequest::ObjectRelease { .. } => MsgType::ObjectRelease,
            ControlRequest::ObjectDestroy { .. } => MsgType::ObjectDestroy,
            ControlRequest::ClientReinit { .. } => MsgType::ClientReinit,
            ControlRequest::ReinitDone => MsgType::ReinitDone,
            ControlRequest::BatchUpdateLocks(_) => MsgType::BatchUpdateLocks,
            ControlRequest::Stats => MsgType::Stats,
            ControlRequest::GetMap { .. } => MsgType::GetMap,
            ControlRequest::ClientJoin { .. } => MsgType::ClientJoin,
            ControlRequest::ReclaimDone { .. } => MsgType::ReclaimDone,
            ControlRequest::RecoveryDone { .. } => MsgType::RecoveryDone,
            ControlRequest::ListRetained(_) => MsgType::ListRetained,
            ControlRequest::Drain => MsgType::Drain,
            ControlRequest::ReclaimDones(_) => MsgType::ReclaimDones,
        }
    }
}

/// A decoded (or to-be-encoded) control request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlRequestFrame<'a> {
    /// The header; `header.msg` must match the body.
    pub header: ControlHeader,
    /// The body.
    pub body: ControlRequest<'a>,
}

/// Decodes one complete control request (`buf` is exactly one frame).
pub fn decode_control_request(buf: &[u8]) -> Result<ControlRequestFrame<'_>, DecodeError> {
    let (header, is_response, total_len) = parse_header(buf)?;
    if is_response {
        return Err(DecodeError::UnknownType(header.msg.response_code()));
    }
    let body = whole_frame_body(buf, total_len)?;
    let body = decode_request_body(header.msg, body)?;
    Ok(ControlRequestFrame { header, body })
}

fn decode_request_body(msg: MsgType, b: &[u8]) -> Result<ControlRequest<'_>, DecodeError> {
    Ok(match msg {
        MsgType::ClientInit | MsgType::ClientReinit | MsgType::ClientJoin => {
            let with_session = msg != MsgType::ClientInit;
            exact(b, if with_session { 8 + Session::LEN } else { 8 })?;
            let min_version = get_u8(b, 0)?;
            check_zero(b, 1, 3)?;
            let lease_ms = get_u32(b, 4)?;
            match msg {
                MsgType::ClientReinit => ControlRequest::ClientReinit {
                    min_version,
                    lease_ms,
                    session: Session(get_array(b, 8)?),
                },
                MsgType::ClientJoin => ControlRequest::ClientJoin {
                    min_version,
                    lease_ms,
                    session: Session(get_array(b, 8)?),
                },
                _ => ControlRequest::ClientInit {
                    min_version,
                    lease_ms,
                },
            }
        }
        MsgType::ClientDeinit => exact(b, 0).map(|()| ControlRequest::ClientDeinit)?,
        MsgType::Heartbeat => exact(b, 0).map(|()| ControlRequest::Heartbeat)?,
        MsgType::ReinitDone => exact(b, 0).map(|()| ControlRequest::ReinitDone)?,
        MsgType::Stats => exact(b, 0).map(|()| ControlRequest::Stats)?,
        MsgType::Drain => exact(b, 0).map(|()| ControlRequest::Drain)?,
        MsgType::GetMap => ControlRequest::GetMap {
            offset: decode_get_map(b)?,
        },
        MsgType::ReclaimDone => {
            let (partition, epoch) = decode_reclaim_done(b)?;
            ControlRequest::ReclaimDone { partition, epoch }
        }
        MsgType::RecoveryDone => ControlRequest::RecoveryDone {
            dead: decode_recovery_done(b)?,
        },
        MsgType::ListRetained => ControlRequest::ListRetained(ListRetained::decode(b)?),
        MsgType::ReclaimDones => ControlRequest::ReclaimDones(ReclaimDones::decode(b)?),
        MsgType::GetLock => {
            let ((kind, name), rest) = decode_lock_request(b)?;
            exact(rest, 0)?;
            ControlRequest::GetLock { kind, name }
        }
        MsgType::ReleaseLock => {
            exact(b, 4)?;
            ControlRequest::ReleaseLock {
                lock: get_u32(b, 0)?,
            }
        }
        MsgType::ObjectRelease => {
            exact(b, 4)?;
            ControlRequest::ObjectRelease {
                object: get_u32(b, 0)?,
            }
        }
        MsgType::ObjectDestroy => {
            exact(b, 4)?;
            ControlRequest::ObjectDestroy {
                object: get_u32(b, 0)?,
            }
        }
        MsgType::BatchGetLock => ControlRequest::BatchGetLock(BatchGet::decode(b)?),
        MsgType::BatchReleaseLock => ControlRequest::BatchReleaseLock(BatchIds::decode(b)?),
        MsgType::BatchUpdateLocks => ControlRequest::BatchUpdateLocks(Claims::decode(b)?),
        MsgType::ObjectCreate => {
            let init = get_u64(b, 0)?;
            let lease_s = get_u32(b, 8)?;
            let name_len = get_u16(b, 12)?;
            check_zero(b, 14, 2)?;
            let (name, rest) = take_name(b.get(16..).ok_or(DecodeError::Truncated)?, name_len)?;
            exact(rest, 0)?;
            ControlRequest::ObjectCreate {
                name,
                init,
                lease_s,
            }
        }
        MsgType::ObjectGet => {
            let lease_s = get_u32(b, 0)?;
            let name_len = get_u16(b, 4)?;
            check_zero(b, 6, 2)?;
            let (name, rest) = take_name(b.get(8..).ok_or(DecodeError::Truncated)?, name_len)?;
            exact(rest, 0)?;
            ControlRequest::ObjectGet { name, lease_s }
        }
    })
}

/// Encodes a control request into `out`, returning the frame length. `Invalid` when
/// `frame.header.msg` does not match the body or a limit is broken.
pub fn encode_control_request(
    frame: &ControlRequestFrame<'_>,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if frame.header.msg != frame.body.msg_type() {
        return Err(EncodeError::Invalid);
    }
    let body = out
        .get_mut(CONTROL_HEADER_LEN..)
        .ok_or(EncodeError::BufferTooSmall)?;
    let body_len = encode_request_body(&frame.body, body)?;
    put_header(
        out,
        &frame.header,
        frame.header.msg.request_code(),
        CONTROL_HEADER_LEN + body_len,
    )
}

fn encode_request_body(body: &ControlRequest<'_>, b: &mut [u8]) -> Result<usize, EncodeError> {
    match *body {
        ControlRequest::ClientInit {
            min_version,
            lease_ms,
        } => {
            put_u8(b, 0, min_version)?;
            put_zero(b, 1, 3)?;
            put_u32(b, 4, lease_ms)?;
            Ok(8)
        }
        ControlRequest::ClientReinit {
            min_version,
            lease_ms,
            session,
        }
        | ControlRequest::ClientJoin {
            min_version,
            lease_ms,
            session,
        } => {
            put_u8(b, 0, min_version)?;
            put_zero(b, 1, 3)?;
            put_u32(b, 4, lease_ms)?;
            put_bytes(b, 8, &session.0)?;
            Ok(8 + Session::LEN)
        }
        ControlRequest::ClientDeinit
        | ControlRequest::Heartbeat
        | ControlRequest::ReinitDone
        | ControlRequest::Stats
        | ControlRequest::Drain => Ok(0),
        ControlRequest::GetLock { kind, name } => encode_lock_request(kind, name, b, 0),
        ControlRequest::ReleaseLock { lock: id }
        | ControlRequest::ObjectRelease { object: id }
        | ControlRequest::ObjectDestroy { object: id } => {
            put_u32(b, 0, id)?;
            Ok(4)
        }
        ControlRequest::GetMap { offset } => encode_get_map(offset, b),
        ControlRequest::ReclaimDone { partition, epoch } => {
            encode_reclaim_done(partition, epoch, b)
        }
        ControlRequest::RecoveryDone { dead } => encode_recovery_done(dead, b),
        ControlRequest::ListRetained(q) => q.encode(b),
        ControlRequest::ReclaimDones(batch) => batch.encode(b),
        ControlRequest::BatchGetLock(batch) => batch.encode(b),
        ControlRequest::BatchReleaseLock(batch) => batch.encode(b),
        ControlRequest::BatchUpdateLocks(batch) => batch.encode(b),
        ControlRequest::ObjectCreate {
            name,
            init,
            lease_s,
        } => {
            let name_len = name_len_for_encode(name)?;
            put_u64(b, 0, init)?;
            put_u32(b, 8, lease_s)?;
            put_u16(b, 12, name_len)?;
            put_zero(b, 14, 2)?;
            put_bytes(b, 16, name)?;
            Ok(16 + name.len())
        }
        ControlRequest::ObjectGet { name, lease_s } => {
            let name_len = name_len_for_encode(name)?;
            put_u32(b, 0, lease_s)?;
            put_u16(b, 4, name_len)?;
            put_zero(b, 6, 2)?;
            put_bytes(b, 8, name)?;
            Ok(8 + name.len())
        }
    }
}
