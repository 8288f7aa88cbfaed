//! Encoding data messages: requests, responses built result by result, and their trailers
//! (value entries and grant proofs). The decoding half and the layouts are in the parent module.

use super::*;

/// The bits a result adds to its echoed op byte: [`RESULT_PLAIN_GRANT`] for a grant made plain
/// (whose server decided the client reads it: protocol 8).
#[inline(always)]
fn plain_bit(result: &CommandResult) -> u8 {
    match result.plain {
        true => RESULT_PLAIN_GRANT,
        false => 0,
    }
}

/// Writes the header for `count` commands and returns the message length.
#[inline]
fn put_message_header(
    out: &mut [u8],
    header: &DataHeader,
    count: usize,
) -> Result<usize, EncodeError> {
    if !(1..=BATCH_MAX).contains(&count) || header.flags & !FLAGS_KNOWN != 0 {
        return Err(EncodeError::Invalid);
    }
    let total_len = DATA_HEADER_LEN + count * COMMAND_LEN;
    if out.len() < total_len {
        return Err(EncodeError::BufferTooSmall);
    }
    put_u32(out, 0, DATA_MAGIC)?;
    put_u8(out, 4, header.version)?;
    put_u8(
        out,
        5,
        u8::try_from(count).map_err(|_| EncodeError::Invalid)?,
    )?;
    put_u16(out, 6, header.message_id)?;
    put_u32(out, 8, header.client)?;
    put_u32(out, 12, header.flags)?;
    Ok(total_len)
}

/// The `i`-th command slot of a message being written.
#[inline]
fn command_slot(out: &mut [u8], i: usize) -> Result<&mut [u8], EncodeError> {
    let off = DATA_HEADER_LEN + i * COMMAND_LEN;
    out.get_mut(off..off + COMMAND_LEN)
        .ok_or(EncodeError::BufferTooSmall)
}

/// Encodes a data request; the count is `commands.len()` (1..=31, else `Invalid`) and
/// `header.count` is ignored.
pub fn encode_data_request(
    header: &DataHeader,
    commands: &[Command],
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if header.flags & !REQUEST_FLAGS_KNOWN != 0 {
        return Err(EncodeError::Invalid);
    }
    let total_len = put_message_header(out, header, commands.len())?;
    for (i, command) in commands.iter().enumerate() {
        let c = command_slot(out, i)?;
        put_u8(c, 0, command.kind_code())?;
        put_u8(c, 1, command.op_code())?;
        put_u16(c, 2, 0)?;
        put_u32(c, 4, command.id())?;
        match *command {
            Command::Lock(l) => {
                put_u32(c, 8, l.expire_ms)?;
                put_u16(c, 12, l.ticket.exclusive)?;
                put_u16(c, 14, l.ticket.shared)?;
                put_u32(c, 16, l.wait_ms)?;
                put_u32(c, 20, l.partition_epoch)?;
                if !LockFlags::allowed_for(l.op as u8).contains(l.flags) {
                    return Err(EncodeError::Invalid);
                }
                put_u8(c, 24, l.flags.bits())?;
                put_zero(c, 25, 7)?;
            }
            Command::Object(o) => {
                put_u64(c, 8, o.a)?;
                put_u64(c, 16, o.b)?;
                put_u32(c, 24, o.partition_epoch)?;
                put_zero(c, 28, 4)?;
            }
            Command::Join(j) => {
                put_bytes(c, 8, &j.session.0)?;
                put_zero(c, 24, 8)?;
            }
        }
    }
    Ok(total_len)
}

/// Encodes the response to `req`: its header and each command's kind, op and id echoed, with
/// `results[i]` as the outcome of command `i`. `Invalid` unless there is one result per
/// command.
pub fn encode_data_response(
    req: &DataRequest<'_>,
    results: &[CommandResult],
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if results.len() != req.len() {
        return Err(EncodeError::Invalid);
    }
    let total_len = begin_data_response(req, out)?;
    for (i, result) in results.iter().enumerate() {
        put_data_result(req, i, result, out)?;
    }
    Ok(total_len)
}

/// Starts the response to `req` in `out`: writes the header and checks that `out` holds the
/// whole response, so the [`put_data_result`] calls that follow cannot run out of room. Returns
/// the response length. This is the streaming form of [`encode_data_response`] for a server that
/// writes each result as it is computed, without an array of them.
///
/// The request's [`FLAG_VALUES`] is not echoed: on a response it announces the response's own
/// value trailer, which [`crate::proto::finish_value_replies`] writes and flags.
pub fn begin_data_response(req: &DataRequest<'_>, out: &mut [u8]) -> Result<usize, EncodeError> {
    let header = DataHeader {
        flags: req.header.flags & !FLAG_VALUES,
        ..req.header
    };
    put_message_header(out, &header, req.len())
}

/// Writes the outcome of `command` — command `i` of the request, as
/// [`decode_data_request_into`] read it — into a response started with [`begin_data_response`]:
/// what [`put_data_result`] writes, from the decoded command rather than its bytes.
#[inline]
pub fn put_command_result(
    out: &mut [u8],
    i: usize,
    command: &Command,
    result: &CommandResult,
) -> Result<(), EncodeError> {
    let c: &mut RawCommand = command_slot(out, i)?
        .try_into()
        .map_err(|_| EncodeError::BufferTooSmall)?;
    // Field by field into the slot (a fixed-size array, so no further bounds checks). Building
    // the 32 bytes first and copying them whole reloads freshly stored halves as one vector, a
    // store-forwarding stall.
    c[0] = command.kind_code();
    c[1] = command.op_code() | plain_bit(result);
    c[2..4].copy_from_slice(&(result.status as u16).to_le_bytes());
    c[4..8].copy_from_slice(&command.id().to_le_bytes());
    c[8..24].copy_from_slice(&result.word.to_le_bytes());
    c[24..32].copy_from_slice(&result.aux.to_le_bytes());
    Ok(())
}

/// Writes the outcome of command `i` of `req` (its kind, op and id echoed) into a response
/// started with [`begin_data_response`].
#[inline]
pub fn put_data_result(
    req: &DataRequest<'_>,
    i: usize,
    result: &CommandResult,
    out: &mut [u8],
) -> Result<(), EncodeError> {
    let raw = req.commands.get(i).ok_or(EncodeError::Invalid)?;
    let (kind, op, id) = kind_op_id(raw);
    let c = command_slot(out, i)?;
    put_u8(c, 0, kind)?;
    put_u8(c, 1, op | plain_bit(result))?;
    put_u16(c, 2, result.status as u16)?;
    put_u32(c, 4, id)?;
    put_u128(c, 8, result.word)?;
    put_u64(c, 24, result.aux)?;
    Ok(())
}

/// Writes the MAC of command `i`'s proof into the trailer of a response to `n` commands that
/// was started with [`begin_data_response`] (after its value trailer, if
/// [`crate::proto::finish_value_replies`] already wrote one). `first`: this is the message's first proof, so
/// the trailer is zeroed before it (commands without a proof read as zero). `BufferTooSmall`
/// unless `out` holds the whole trailer.
#[inline]
pub fn put_data_proof(
    out: &mut [u8],
    n: usize,
    i: usize,
    mac: &[u8; PROOF_LEN],
    first: bool,
) -> Result<(), EncodeError> {
    let flags = get_u32(out, 12).map_err(|_| EncodeError::BufferTooSmall)?;
    // The proofs follow the value trailer, when there is one.
    let start = data_message_len(n, flags & FLAG_VALUES, true);
    let trailer = out
        .get_mut(start..start + n * PROOF_LEN)
        .ok_or(EncodeError::BufferTooSmall)?;
    if first {
        trailer.fill(0);
    }
    let at = trailer
        .get_mut(i * PROOF_LEN..(i + 1) * PROOF_LEN)
        .ok_or(EncodeError::Invalid)?;
    at.copy_from_slice(mac);
    Ok(())
}

/// Ends a response to `n` commands whose trailer [`put_data_proof`] wrote: sets
/// [`FLAG_PROOFS`] in its header and returns the response's length with the trailer.
#[inline]
pub fn finish_data_proofs(out: &mut [u8], n: usize) -> Result<usize, EncodeError> {
    let flags = get_u32(out, 12).map_err(|_| EncodeError::BufferTooSmall)?;
    put_u32(out, 12, flags | FLAG_PROOFS)?;
    Ok(data_message_len(n, flags | FLAG_PROOFS, true))
}
