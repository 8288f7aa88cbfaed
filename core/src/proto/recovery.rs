//! Control bodies for retained locks: `RecoveryDone` (a recoverer releases a dead client's
//! retained locks) and `ListRetained` (which locks dead clients retain, a page at a time).
//!
//! [`MsgType::RecoveryDone`](super::MsgType::RecoveryDone) and
//! [`MsgType::ListRetained`](super::MsgType::ListRetained) carry the request codes below and
//! their bodies are read and written here; 42 is the cluster's `GetMap` (`CLUSTER-SPEC` §3).
//!
//! | type           | request body                                             | response body (on `Success`)          |
//! |----------------|----------------------------------------------------------|---------------------------------------|
//! | `RecoveryDone` | `0 u32 dead client id`                                   | `0 u32 retained locks released`       |
//! | `ListRetained` | `0 u32 client (0: every dead client) \| 4 u32 reserved \| 8 u64 cursor (0: from the start)` | `0 u64 next cursor (0: no more) \| 8 a counted list of retained entries` |
//!
//! Retained entry, 12 bytes + name:
//!
//! | off | type | field                                               |
//! |-----|------|-----------------------------------------------------|
//! | 0   | u32  | the dead client's id                                |
//! | 4   | u32  | the lock id                                         |
//! | 8   | u8   | the lock's kind                                     |
//! | 9   | u8   | the mode retained: 1 exclusive, 2 shared            |
//! | 10  | u16  | `name_len`, 1..=512                                 |
//! | 12  | —    | the lock's name                                     |
//!
//! A page holds 0..=31 entries (a control frame holds 31 full names); the cursor is the
//! server's, opaque to the client, which sends back the `next` it was given. A page that is
//! not the last may hold fewer than 31 entries. Neither request needs a registration beyond
//! the recoverer role (`manager::retain`); without it both are answered `Einval`.

use super::batch::{Parsed, sealed::Entry};
use super::{
    Batch, DecodeError, EncodeError, check_zero, get_u8, get_u16, get_u32, get_u64,
    name_len_for_encode, put_bytes, put_u8, put_u16, put_u32, put_u64, put_zero, take_name,
};
use crate::config::{BATCH_MAX, NAME_LEN_MAX};
use crate::ids::{LockKind, Mode};

/// The request type byte of `RecoveryDone` ([`MsgType::RecoveryDone`](super::MsgType::RecoveryDone)).
pub const RECOVERY_DONE_CODE: u8 = 44;
/// The request type byte of `ListRetained` ([`MsgType::ListRetained`](super::MsgType::ListRetained)).
pub const LIST_RETAINED_CODE: u8 = 46;
/// Bytes of a retained entry before its name.
pub const RETAINED_FIXED_LEN: usize = 12;

// The largest page fits a control frame.
static_assertions::const_assert!(
    super::CONTROL_HEADER_LEN
        + 8
        + super::BATCH_HEADER_LEN
        + BATCH_MAX * (RETAINED_FIXED_LEN + NAME_LEN_MAX)
        <= super::CONTROL_FRAME_MAX
);

/// A `ListRetained` request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListRetained {
    /// The dead client to list (0: every one).
    pub client: u32,
    /// Where to continue (0: from the start; else the `next` of the previous page).
    pub cursor: u64,
}

/// One lock a dead client retains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainedEntry<'a> {
    /// The dead client.
    pub client: u32,
    /// The lock id.
    pub lock: u32,
    /// The lock's kind.
    pub kind: LockKind,
    /// The mode of the retained grant.
    pub mode: Mode,
    /// The lock's name (1..=512 bytes).
    pub name: &'a [u8],
}

/// A page of retained locks.
pub type RetainedEntries<'a> = Batch<'a, RetainedEntry<'a>>;

/// A `ListRetained` response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainedPage<'a> {
    /// The cursor of the next page; 0 when this is the last.
    pub next: u64,
    /// This page's entries.
    pub entries: RetainedEntries<'a>,
}

/// Decodes a `RecoveryDone` request body: the dead client's id.
pub fn decode_recovery_done(b: &[u8]) -> Result<u32, DecodeError> {
    exact_len(b, 4)?;
    get_u32(b, 0)
}

/// Encodes a `RecoveryDone` request body; returns its length.
pub fn encode_recovery_done(dead: u32, b: &mut [u8]) -> Result<usize, EncodeError> {
    put_u32(b, 0, dead)?;
    Ok(4)
}

/// Decodes a successful `RecoveryDone` response body: how many locks were released.
pub fn decode_recovery_done_reply(b: &[u8]) -> Result<u32, DecodeError> {
    exact_len(b, 4)?;
    get_u32(b, 0)
}

/// Encodes a successful `RecoveryDone` response body; returns its length.
pub fn encode_recovery_done_reply(released: u32, b: &mut [u8]) -> Result<usize, EncodeError> {
    put_u32(b, 0, released)?;
    Ok(4)
}

impl ListRetained {
    /// Decodes the request body.
    pub fn decode(b: &[u8]) -> Result<ListRetained, DecodeError> {
        exact_len(b, 16)?;
        check_zero(b, 4, 4)?;
        Ok(ListRetained {
            client: get_u32(b, 0)?,
            cursor: get_u64(b, 8)?,
        })
    }

    /// Encodes the request body; returns its length.
    pub fn encode(&self, b: &mut [u8]) -> Result<usize, EncodeError> {
        put_u32(b, 0, self.client)?;
        put_zero(b, 4, 4)?;
        put_u64(b, 8, self.cursor)?;
        Ok(16)
    }
}

impl<'a> RetainedPage<'a> {
    /// Decodes the response body, validating every entry.
    pub fn decode(b: &'a [u8]) -> Result<RetainedPage<'a>, DecodeError> {
        let next = get_u64(b, 0)?;
        let entries = Batch::decode(b.get(8..).ok_or(DecodeError::Truncated)?)?;
        Ok(RetainedPage { next, entries })
    }

    /// Encodes the response body; returns its length.
    pub fn encode(&self, b: &mut [u8]) -> Result<usize, EncodeError> {
        put_u64(b, 0, self.next)?;
        let rest = b.get_mut(8..).ok_or(EncodeError::BufferTooSmall)?;
        Ok(8 + self.entries.encode(rest)?)
    }
}

/// `Ok` when `b` is exactly `len` bytes.
#[inline]
fn exact_len(b: &[u8], len: usize) -> Result<(), DecodeError> {
    match b.len() {
        n if n == len => Ok(()),
        n if n < len => Err(DecodeError::Truncated),
        _ => Err(DecodeError::BadLength),
    }
}

/// The wire code of a retained mode (the holds grid's: 1 exclusive, 2 shared).
#[inline]
const fn mode_code(mode: Mode) -> u8 {
    match mode {
        Mode::Exclusive => 1,
        Mode::Shared => 2,
    }
}

impl<'a> Entry<'a> for RetainedEntry<'a> {
    const COUNT_MIN: usize = 0;
    const COUNT_MAX: usize = BATCH_MAX;
    const FIXED_LEN: Option<usize> = None;

    fn decode(b: &'a [u8]) -> Parsed<'a, Self> {
        let kind = LockKind::from_u8(get_u8(b, 8)?).ok_or(DecodeError::BadKind)?;
        let mode = match get_u8(b, 9)? {
            1 => Mode::Exclusive,
            2 => Mode::Shared,
            _ => return Err(DecodeError::BadField),
        };
        let name_len = get_u16(b, 10)?;
        let rest = b.get(RETAINED_FIXED_LEN..).ok_or(DecodeError::Truncated)?;
        let (name, rest) = take_name(rest, name_len)?;
        let entry = RetainedEntry {
            client: get_u32(b, 0)?,
            lock: get_u32(b, 4)?,
            kind,
            mode,
            name,
        };
        Ok((entry, rest))
    }

    fn encode(&self, out: &mut [u8], off: usize) -> Result<usize, EncodeError> {
        let name_len = name_len_for_encode(self.name)?;
        put_u32(out, off, self.client)?;
        put_u32(out, off + 4, self.lock)?;
        put_u8(out, off + 8, self.kind as u8)?;
        put_u8(out, off + 9, mode_code(self.mode))?;
        put_u16(out, off + 10, name_len)?;
        put_bytes(out, off + RETAINED_FIXED_LEN, self.name)?;
        Ok(off + RETAINED_FIXED_LEN + self.name.len())
    }
}
