//! Event messages: what the server sends a client unasked — revokes of cached grants, batched,
//! and the overflow notice that makes the client re-check what it caches.
//!
//! One format for every path: a stream transport writes an event message on the client's data
//! connection (a multiplexing client's reader routes it by the header's client, as it routes
//! replies), RDMA SENDs it, and the shared-memory event ring holds the same 16-byte entries
//! ([`encode_event`], [`decode_event`]) one by one.
//!
//! # Header (16 bytes: a data header)
//!
//! | off | type | field                                                             |
//! |-----|------|-------------------------------------------------------------------|
//! | 0   | u32  | magic, [`DATA_MAGIC`](super::DATA_MAGIC)                          |
//! | 4   | u8   | version                                                           |
//! | 5   | u8   | `count`, 1..=[`EVENTS_MAX`]; exactly `count` entries follow        |
//! | 6   | u16  | message id: zero (no request is answered)                          |
//! | 8   | u32  | the client the events are for                                      |
//! | 12  | u32  | flags: exactly [`FLAG_EVENT`]                                      |
//!
//! # Entry (16 bytes)
//!
//! | off | type | revoke                                          | overflow |
//! |-----|------|-------------------------------------------------|----------|
//! | 0   | u32  | the lock id                                     | zero     |
//! | 4   | u8   | kind: 1                                          | kind: 2  |
//! | 5   | u8   | the mode wanted: 1 exclusive, 2 shared (the holds grid's codes) | zero |
//! | 6   | u16  | reserved, zero                                  | zero     |
//! | 8   | u64  | `fence`: the lock's fencing token when the revoke was sent | zero |
//!
//! `fence` lets the client tell a revoke meant for its current grant from one sent for a grant
//! it has since given back (`manager::CachedLock::on_revoke`): a grant the client received after
//! the revoke was sent has a larger token. An overflow entry says events were lost (the ring
//! was full, or a stream connection's buffer was): the client treats every cached lock as
//! revoked. [`EVENTS_MAX`] fills the same buffer a data request does, so an event message needs
//! no buffer of its own size.

use super::data::DataHeader;
use super::{
    DATA_HEADER_LEN, DATA_MAGIC, DATA_MESSAGE_MAX, DecodeError, EncodeError, get_u8, get_u16,
    get_u32, put_u8, put_u16, put_u32,
};
use crate::ids::{LockId, Mode};

/// Data-header flag: this is an event message (server to client, unasked).
pub const FLAG_EVENT: u32 = 8;

/// Whether the message `header` heads, on the server-to-client stream, is an event message
/// ([`decode_event_message`]) rather than a reply: the one test every reader of that stream
/// (a client's connection, a `Mux`'s reader, an RDMA client) makes. [`FLAG_EVENT`] is a
/// message's only flag when set.
#[inline]
pub const fn is_event_message(header: &DataHeader) -> bool {
    header.flags == FLAG_EVENT
}
/// Bytes per event entry (and per event-ring slot).
pub const EVENT_LEN: usize = 16;
/// Entries in one event message: as many as fit a data request's buffer.
pub const EVENTS_MAX: usize = (DATA_MESSAGE_MAX - DATA_HEADER_LEN) / EVENT_LEN;

static_assertions::const_assert_eq!(EVENTS_MAX, 62);
static_assertions::const_assert!(EVENTS_MAX <= u8::MAX as usize);

const KIND_REVOKE: u8 = 1;
const KIND_OVERFLOW: u8 = 2;

/// Something the server tells a client unasked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Give back (or downgrade) a cached grant: another client wants `wanted`.
    Revoke {
        /// The lock.
        lock: LockId,
        /// The mode the other client wants (shared: an exclusive holder may downgrade).
        wanted: Mode,
        /// The lock's fencing token when the revoke was sent.
        fence: u64,
    },
    /// Events were lost: re-check every cached lock.
    Overflow,
}

/// The header fields of an event message that carry meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHeader {
    /// The negotiated version.
    pub version: u8,
    /// The client the events are for.
    pub client: u32,
}

/// A validated event message, borrowing its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventMessage<'a> {
    header: EventHeader,
    entries: &'a [[u8; EVENT_LEN]],
}

impl<'a> EventMessage<'a> {
    /// The header.
    #[inline]
    pub const fn header(&self) -> EventHeader {
        self.header
    }

    /// Number of events (1..=[`EVENTS_MAX`]).
    #[inline]
    pub const fn len(&self) -> usize {
        self.entries.len()
    }

    /// Always false: a decoded message holds at least one event.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The events in order.
    #[inline]
    pub fn events(&self) -> impl ExactSizeIterator<Item = Event> + 'a {
        self.entries.iter().map(|e| match decode_event(e) {
            Ok(event) => event,
            // Entries are validated when the message is decoded: this is a bug, not input.
            Err(err) => unreachable!("event validated at decode failed to parse: {err}"),
        })
    }
}

/// The 16 bytes of one event (a message entry or an event-ring slot).
#[inline]
pub const fn encode_event(event: &Event) -> [u8; EVENT_LEN] {
    let mut e = [0u8; EVENT_LEN];
    if let Event::Revoke {
        lock,
        wanted,
        fence,
    } = *event
    {
        let id = lock.raw().to_le_bytes();
        let fence = fence.to_le_bytes();
        let mut i = 0;
        while i < 4 {
            e[i] = id[i];
            i += 1;
        }
        e[4] = KIND_REVOKE;
        e[5] = match wanted {
            Mode::Exclusive => 1,
            Mode::Shared => 2,
        };
        let mut i = 0;
        while i < 8 {
            e[8 + i] = fence[i];
            i += 1;
        }
    } else {
        e[4] = KIND_OVERFLOW;
    }
    e
}

/// Reads one event; `BadKind` for an unknown kind, `BadField` for a bad lock id, mode or a
/// non-zero reserved byte.
#[inline]
pub fn decode_event(e: &[u8; EVENT_LEN]) -> Result<Event, DecodeError> {
    let [i0, i1, i2, i3, kind, mode, r0, r1, fence @ ..] = *e;
    let raw = u32::from_le_bytes([i0, i1, i2, i3]);
    let fence = u64::from_le_bytes(fence);
    if r0 != 0 || r1 != 0 {
        return Err(DecodeError::BadField);
    }
    match kind {
        KIND_REVOKE => Ok(Event::Revoke {
            lock: LockId::from_raw(raw).ok_or(DecodeError::BadField)?,
            wanted: match mode {
                1 => Mode::Exclusive,
                2 => Mode::Shared,
                _ => return Err(DecodeError::BadField),
            },
            fence,
        }),
        KIND_OVERFLOW if raw == 0 && mode == 0 && fence == 0 => Ok(Event::Overflow),
        KIND_OVERFLOW => Err(DecodeError::BadField),
        _ => Err(DecodeError::BadKind),
    }
}

/// The length of an event message of `count` entries.
#[inline]
pub const fn event_message_len(count: usize) -> usize {
    DATA_HEADER_LEN + count * EVENT_LEN
}

/// Encodes an event message of `events` (1..=[`EVENTS_MAX`], else `Invalid`); returns its
/// length.
pub fn encode_event_message(
    header: &EventHeader,
    events: &[Event],
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if events.is_empty() || events.len() > EVENTS_MAX {
        return Err(EncodeError::Invalid);
    }
    let len = event_message_len(events.len());
    let out = out.get_mut(..len).ok_or(EncodeError::BufferTooSmall)?;
    put_u32(out, 0, DATA_MAGIC)?;
    put_u8(out, 4, header.version)?;
    // At most EVENTS_MAX (asserted to fit a u8) by the check above.
    put_u8(out, 5, events.len() as u8)?;
    put_u16(out, 6, 0)?;
    put_u32(out, 8, header.client)?;
    put_u32(out, 12, FLAG_EVENT)?;
    let body = out
        .get_mut(DATA_HEADER_LEN..)
        .ok_or(EncodeError::BufferTooSmall)?;
    let (slots, _) = body.as_chunks_mut::<EVENT_LEN>();
    for (slot, event) in slots.iter_mut().zip(events) {
        *slot = encode_event(event);
    }
    Ok(len)
}

/// Decodes an event message (`buf` is exactly one), validating every entry.
pub fn decode_event_message(buf: &[u8]) -> Result<EventMessage<'_>, DecodeError> {
    if get_u32(buf, 0)? != DATA_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let count = usize::from(get_u8(buf, 5)?);
    if get_u32(buf, 12)? != FLAG_EVENT {
        return Err(DecodeError::BadFlags);
    }
    if !(1..=EVENTS_MAX).contains(&count) {
        return Err(DecodeError::BadCount);
    }
    if get_u16(buf, 6)? != 0 {
        return Err(DecodeError::BadField);
    }
    if buf.len() != event_message_len(count) {
        return Err(DecodeError::BadLength);
    }
    let body = buf.get(DATA_HEADER_LEN..).ok_or(DecodeError::Truncated)?;
    let (entries, _) = body.as_chunks::<EVENT_LEN>();
    for e in entries {
        decode_event(e)?;
    }
    Ok(EventMessage {
        header: EventHeader {
            version: get_u8(buf, 4)?,
            client: get_u32(buf, 8)?,
        },
        entries,
    })
}
