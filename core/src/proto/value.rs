//! Value trailers: lock value blocks carried after the commands of a data message, one entry
//! per command, like the proof trailer ([`FLAG_PROOFS`](super::FLAG_PROOFS)).
//!
//! # Layout
//!
//! | message  | with [`FLAG_VALUES`]                                                        |
//! |----------|-----------------------------------------------------------------------------|
//! | request  | header, `count` commands, `count` × [`VALUE_REQUEST_LEN`] (the blocks written) |
//! | response | header, `count` results, `count` × [`VALUE_REPLY_LEN`], then the proof trailer if [`FLAG_PROOFS`](super::FLAG_PROOFS) |
//!
//! Request entry `i` is the block command `i` writes: an exclusive unlock or a downgrade
//! flagged `VALUE_BLOCK` ([`LockFlags::writes_value`](super::LockFlags::writes_value)); every
//! other entry is zero. A client sets the flag on a request exactly when one command writes.
//!
//! Response entry `i` (40 bytes):
//!
//! | off | type    | field                                                          |
//! |-----|---------|----------------------------------------------------------------|
//! | 0   | 32 B    | the block                                                      |
//! | 32  | u32     | its write count (`seq`)                                        |
//! | 36  | u8      | bit 0 present (command `i` was granted and asked for the block), bit 1 valid |
//! | 37  | 3 B     | reserved, zero                                                 |
//!
//! An entry that is not present is all zero. A server sets [`FLAG_VALUES`] on a response
//! exactly when a command of its request is an acquisition flagged `VALUE_BLOCK`, which the
//! server knows before it executes anything: so the value trailer comes before the proof
//! trailer, whose presence is decided only after every command ran (a grant under a session
//! key). The response's length still follows from its header alone
//! ([`data_message_len`]), which is how a stream transport frames it.
//!
//! # Sizes
//!
//! The worst request is 31 commands each writing a block (2,000 bytes), the worst response 31
//! results each with a block and a proof (2,744 bytes): a mailbox lane's request half grows
//! from 1 KiB to 2 KiB and its response half from 1.5 KiB to 2,816 bytes (the response plus
//! its 16 bytes of sequence words, rounded to cache lines), and stream buffers to the same.

use super::{
    COMMAND_LEN, DATA_HEADER_LEN, DATA_MESSAGE_MAX, DATA_RESPONSE_MAX, DecodeError, EncodeError,
    FLAG_PROOFS, PROOF_LEN, get_u32, put_u32,
};
use crate::config::BATCH_MAX;
use crate::manager::value::{VALUE_BLOCK_LEN, ValueBlock, ValueRead};

/// Data-header flag: a value trailer follows the commands (requests) or results (responses).
pub const FLAG_VALUES: u32 = 4;
/// Bytes per command in a request's value trailer: the block.
pub const VALUE_REQUEST_LEN: usize = VALUE_BLOCK_LEN;
/// Bytes per command in a response's value trailer: block, write count, flags.
pub const VALUE_REPLY_LEN: usize = VALUE_BLOCK_LEN + 8;
/// The longest data request: every command writes a block.
pub const DATA_REQUEST_WITH_VALUES_MAX: usize = DATA_MESSAGE_MAX + BATCH_MAX * VALUE_REQUEST_LEN;
/// The longest data response: every result carries a block and a proof.
pub const DATA_RESPONSE_WITH_VALUES_MAX: usize = DATA_RESPONSE_MAX + BATCH_MAX * VALUE_REPLY_LEN;

static_assertions::const_assert_eq!(DATA_REQUEST_WITH_VALUES_MAX, 2_000);
static_assertions::const_assert_eq!(DATA_RESPONSE_WITH_VALUES_MAX, 2_744);

/// Response entry flag: the command asked for the block and was granted.
const PRESENT: u8 = 1;
/// Response entry flag: the block is valid.
const VALID: u8 = 2;

/// The length of a data message of `count` commands with header `flags`; `response` says
/// which side's trailers apply. The integration's `peek_data_header` computes it so.
#[inline]
pub const fn data_message_len(count: usize, flags: u32, response: bool) -> usize {
    let values = match (flags & FLAG_VALUES != 0, response) {
        (false, _) => 0,
        (true, false) => VALUE_REQUEST_LEN,
        (true, true) => VALUE_REPLY_LEN,
    };
    let proofs = if response && flags & FLAG_PROOFS != 0 {
        PROOF_LEN
    } else {
        0
    };
    DATA_HEADER_LEN + count * (COMMAND_LEN + values + proofs)
}

/// Where the value trailer of a message of `n` commands starts: right after them.
#[inline]
const fn trailer_start(n: usize) -> usize {
    DATA_HEADER_LEN + n * COMMAND_LEN
}

/// Sets [`FLAG_VALUES`] in the header at the start of `out`.
#[inline]
fn set_values_flag(out: &mut [u8]) -> Result<(), EncodeError> {
    let flags = get_u32(out, 12).map_err(|_| EncodeError::BufferTooSmall)?;
    put_u32(out, 12, flags | FLAG_VALUES)
}

/// The entry `i` of the trailer of `n` entries of `len` bytes that starts at `start`; zeroes
/// the whole trailer first when `first`. `BufferTooSmall` unless `out` holds it all; `Invalid`
/// for `i` out of range.
#[inline]
fn trailer_entry(
    out: &mut [u8],
    n: usize,
    len: usize,
    i: usize,
    first: bool,
) -> Result<&mut [u8], EncodeError> {
    if n == 0 || n > BATCH_MAX {
        return Err(EncodeError::Invalid);
    }
    let start = trailer_start(n);
    let trailer = out
        .get_mut(start..start + n * len)
        .ok_or(EncodeError::BufferTooSmall)?;
    if first {
        trailer.fill(0);
    }
    trailer
        .get_mut(i * len..(i + 1) * len)
        .ok_or(EncodeError::Invalid)
}

/// Writes the block command `i` of a request of `n` commands writes. `first`: the message's
/// first block, so the trailer is zeroed before it.
#[inline]
pub fn put_value_request(
    out: &mut [u8],
    n: usize,
    i: usize,
    block: &ValueBlock,
    first: bool,
) -> Result<(), EncodeError> {
    trailer_entry(out, n, VALUE_REQUEST_LEN, i, first)?.copy_from_slice(block.as_bytes());
    Ok(())
}

/// Ends a request of `n` commands whose trailer [`put_value_request`] wrote: sets
/// [`FLAG_VALUES`] and returns the request's length with the trailer.
#[inline]
pub fn finish_value_requests(out: &mut [u8], n: usize) -> Result<usize, EncodeError> {
    set_values_flag(out)?;
    Ok(data_message_len(n, FLAG_VALUES, false))
}

/// Writes response entry `i` of `n`: `value` for a granted command that asked for the block,
/// `None` for the others. `first`: the message's first entry (the trailer is zeroed first).
#[inline]
pub fn put_value_reply(
    out: &mut [u8],
    n: usize,
    i: usize,
    value: Option<&ValueRead>,
    first: bool,
) -> Result<(), EncodeError> {
    let entry = trailer_entry(out, n, VALUE_REPLY_LEN, i, first)?;
    put_value_entry(entry, value);
    Ok(())
}

/// Writes one value entry (the response trailer's layout, also a failover claim's) into the
/// first [`VALUE_REPLY_LEN`] bytes of `entry`, which holds at least that many.
#[inline]
pub(super) fn put_value_entry(entry: &mut [u8], value: Option<&ValueRead>) {
    let entry = &mut entry[..VALUE_REPLY_LEN];
    match value {
        None => entry.fill(0),
        Some(v) => {
            entry[..VALUE_BLOCK_LEN].copy_from_slice(v.block.as_bytes());
            entry[VALUE_BLOCK_LEN..VALUE_BLOCK_LEN + 4].copy_from_slice(&v.seq.to_le_bytes());
            entry[VALUE_BLOCK_LEN + 4] = PRESENT | if v.valid { VALID } else { 0 };
            entry[VALUE_BLOCK_LEN + 5..].fill(0);
        }
    }
}

/// Reads one value entry: `None` when not present; `BadField` for unknown flag bits, non-zero
/// reserved bytes, or bytes in an entry that is not present (one encoding per value).
#[inline]
pub(super) fn read_value_entry(
    e: &[u8; VALUE_REPLY_LEN],
) -> Result<Option<ValueRead>, DecodeError> {
    let flags = e[VALUE_BLOCK_LEN + 4];
    let reserved = &e[VALUE_BLOCK_LEN + 5..];
    let well_formed = match flags {
        0 => e.iter().all(|&b| b == 0),
        f if f & !(PRESENT | VALID) == 0 && f & PRESENT != 0 => reserved.iter().all(|&b| b == 0),
        _ => false,
    };
    if !well_formed {
        return Err(DecodeError::BadField);
    }
    if flags & PRESENT == 0 {
        return Ok(None);
    }
    let mut block = [0u8; VALUE_BLOCK_LEN];
    block.copy_from_slice(&e[..VALUE_BLOCK_LEN]);
    let mut seq = [0u8; 4];
    seq.copy_from_slice(&e[VALUE_BLOCK_LEN..VALUE_BLOCK_LEN + 4]);
    Ok(Some(ValueRead {
        block: ValueBlock(block),
        seq: u32::from_le_bytes(seq),
        valid: flags & VALID != 0,
    }))
}

/// Ends a response of `n` results whose value trailer [`put_value_reply`] wrote: sets
/// [`FLAG_VALUES`] and returns the length up to the end of the value trailer (a proof trailer,
/// if any, follows there).
#[inline]
pub fn finish_value_replies(out: &mut [u8], n: usize) -> Result<usize, EncodeError> {
    set_values_flag(out)?;
    Ok(trailer_start(n) + n * VALUE_REPLY_LEN)
}

/// A request's value trailer, borrowing the message: one block per command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRequests<'a> {
    entries: &'a [[u8; VALUE_REQUEST_LEN]],
}

impl<'a> ValueRequests<'a> {
    /// No trailer: a request without [`FLAG_VALUES`].
    pub const NONE: ValueRequests<'static> = ValueRequests { entries: &[] };

    /// The trailer of a request of `n` commands: `trailer` must be exactly `n` entries, and the
    /// entry of every command that writes no block (`writes(i)` false) must be zero, so that a
    /// request re-encodes to its own bytes.
    pub fn decode(
        trailer: &'a [u8],
        n: usize,
        writes: impl Fn(usize) -> bool,
    ) -> Result<Self, DecodeError> {
        let (entries, rest) = trailer.as_chunks::<VALUE_REQUEST_LEN>();
        if entries.len() != n || !rest.is_empty() {
            return Err(DecodeError::BadLength);
        }
        for (i, e) in entries.iter().enumerate() {
            if !writes(i) && e.iter().any(|&b| b != 0) {
                return Err(DecodeError::BadField);
            }
        }
        Ok(Self { entries })
    }

    /// The block command `i` writes (meaningful when it writes one).
    #[inline]
    pub fn block(&self, i: usize) -> Option<ValueBlock> {
        self.entries.get(i).map(|&b| ValueBlock(b))
    }
}

/// A response's value trailer, borrowing the message, every entry validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueReplies<'a> {
    entries: &'a [[u8; VALUE_REPLY_LEN]],
}

impl<'a> ValueReplies<'a> {
    /// No trailer: a response without [`FLAG_VALUES`].
    pub const NONE: ValueReplies<'static> = ValueReplies { entries: &[] };

    /// The trailer of a response of `n` results: exactly `n` entries, each with known flag bits,
    /// zero reserved bytes, and all zero unless present.
    pub fn decode(trailer: &'a [u8], n: usize) -> Result<Self, DecodeError> {
        let (entries, rest) = trailer.as_chunks::<VALUE_REPLY_LEN>();
        if entries.len() != n || !rest.is_empty() {
            return Err(DecodeError::BadLength);
        }
        for e in entries {
            read_value_entry(e)?;
        }
        Ok(Self { entries })
    }

    /// The value block result `i` carries, if it carries one.
    #[inline]
    pub fn get(&self, i: usize) -> Option<ValueRead> {
        // Every entry was validated by `decode`.
        read_value_entry(self.entries.get(i)?).ok().flatten()
    }

    /// Number of entries.
    #[inline]
    pub const fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none (never, for a decoded trailer of a message).
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
