//! Data messages: lock and object commands, up to [`BATCH_MAX`] per message, one message per
//! mailbox slot. This is the hot path: decoding validates the whole message once, after which
//! reading a command is a few loads and cannot fail.
//!
//! # Header (16 bytes, same for requests and responses)
//!
//! | off | type | field                                                     |
//! |-----|------|-----------------------------------------------------------|
//! | 0   | u32  | magic, [`DATA_MAGIC`]                                     |
//! | 4   | u8   | version                                                   |
//! | 5   | u8   | `count`, 1..=31; exactly `count` commands follow          |
//! | 6   | u16  | `message_id`, copied from request to response             |
//! | 8   | u32  | client id                                                 |
//! | 12  | u32  | flags: [`FLAG_ALL_OR_NOTHING`](super::FLAG_ALL_OR_NOTHING), [`FLAG_VALUES`], responses also [`FLAG_PROOFS`](super::FLAG_PROOFS); other bits must be zero |
//!
//! # Command (32 bytes)
//!
//! | off | type | field                                                          |
//! |-----|------|----------------------------------------------------------------|
//! | 0   | u8   | kind: 0/1/2 = [`LockKind`], 3 = object ([`OBJECT_KIND`]), 4 = join ([`JOIN_KIND`]) |
//! | 1   | u8   | op: a [`LockOp`] (0..=7 the reference's, 8 `Downgrade`) or an [`ObjectOp`] |
//! | 2   | u16  | status: zero in requests, the outcome in responses             |
//! | 4   | u32  | lock or object id                                              |
//! | 8   | 24 B | payload                                                        |
//!
//! Payloads:
//!
//! | message  | kind   | payload                                                       |
//! |----------|--------|---------------------------------------------------------------|
//! | request  | lock   | `8 u32 expire_ms \| 12 u16 tx \| 14 u16 ts \| 16 u32 wait_ms \| 20 u32 partition_epoch \| 24 u8 flags \| 25 7 reserved` |
//! | request  | object | `8 u64 a \| 16 u64 b \| 24 u32 partition_epoch \| 28 4 reserved` |
//! | request  | join   | `8 [u8; 16] session \| 24 8 reserved` (op and id zero)         |
//! | response | any    | `8 u128 word \| 24 u64 aux`                                   |
//!
//! Reserved bytes must be zero. A response echoes the request's header and each command's
//! kind, op and id, so the client can match every result to what it asked. At protocol 8 the
//! echoed op byte of a response may carry [`RESULT_PLAIN_GRANT`] (its top bit; every op code is
//! below 16): the command asked for a cached grant (`CACHEABLE`) and was granted, but the
//! server recorded the grant plain because the lock is contended (`manager::contention`), so
//! the holder's last local release must be the plain unlock. The decoder masks the bit off the
//! op and reports it as [`CommandResult::plain`]. The 32-byte result has no other spare bit
//! (status, word and aux are all meaning), and the op byte is the one the client matches
//! against what it sent anyway; a server sets it only for a client registered at
//! [`PROTO_VERSION_PLAIN_GRANTS`](super::PROTO_VERSION_PLAIN_GRANTS) or newer, which is the
//! client that masks it off. Byte 24 of a lock
//! request is its [`LockFlags`] (`lock_flags.rs`: which flags each op may carry); zero is what
//! every earlier client wrote there, and means what it always meant.
//!
//! # Value trailer ([`FLAG_VALUES`], `value.rs`)
//!
//! Lock value blocks travel after the commands (requests: the block an exclusive unlock
//! writes) or the results (responses: the block each flagged grant returns), before the proof
//! trailer. Whether a message has one is in its header, so its length still follows from the
//! header alone — but the two directions' entries differ in size, so a reader frames a request
//! with [`peek_data_header`] and a response with [`peek_data_response_header`].
//!
//! `partition_epoch` (protocol 5) is the epoch the client's map gives the partition of the
//! lock's or object's name, in a cluster (`crate::cluster`; `docs/cluster.md`, "Wire"); 0 on a
//! standalone server, which is what a protocol-4 client wrote in those (then reserved) bytes.
//! The codec carries any value; what a server does with it is the server's: a cluster server
//! checks it with `cluster::check` and answers a mismatch `PartitionMoved` with its map version
//! in `aux`, and a standalone server refuses a message that names any other epoch than 0 as
//! malformed, exactly as it refused those bytes when they were reserved.
//!
//! # Proof trailer (responses with [`FLAG_PROOFS`](super::FLAG_PROOFS))
//!
//! `count` × [`PROOF_LEN`](super::PROOF_LEN) bytes after the last result: the MAC of the grant
//! or fair-lock ticket result `i` gave (`crate::server::proof`), all zero where it gave none. A
//! server with a session key sends it when a message grants or queues anything, so a response
//! is at most [`DATA_RESPONSE_MAX`](super::DATA_RESPONSE_MAX) long; without a key, or without a
//! grant, the response is exactly as long as the request. The trailer is per command rather
//! than per grant so that finding a result's proof needs no counting and the length follows
//! from the header alone (a stream transport frames a response from its first 16 bytes).

use super::lock_flags::{LockFlags, read_lock_flags};
use super::value::{
    FLAG_VALUES, VALUE_REPLY_LEN, VALUE_REQUEST_LEN, ValueReplies, ValueRequests, data_message_len,
};
use super::{
    COMMAND_LEN, DATA_HEADER_LEN, DATA_MAGIC, DecodeError, EncodeError, FLAG_PROOFS, FLAGS_KNOWN,
    PROOF_LEN, REQUEST_FLAGS_KNOWN, get_array, get_u8, get_u16, get_u32, get_u64, get_u128,
    put_bytes, put_u8, put_u16, put_u32, put_u64, put_u128, put_zero,
};
use crate::config::BATCH_MAX;
use crate::ids::{LockKind, Mode, Session, Ticket};
use crate::manager::value::{ValueBlock, ValueRead};
use crate::status::Status;

mod encode;
pub use encode::*;

/// The top bit of a response's echoed op byte (protocol 8): the grant was asked for as cached
/// and made plain (module doc; [`CommandResult::plain`]).
pub const RESULT_PLAIN_GRANT: u8 = 0x80;

/// The command kind byte of an object command (lock kinds are 0..=2).
pub const OBJECT_KIND: u8 = 3;
/// The command kind byte of a join command ([`JoinCommand`]).
pub const JOIN_KIND: u8 = 4;

/// One command's bytes, as a fixed-size array so field reads need no length checks.
type RawCommand = [u8; COMMAND_LEN];
/// One command's proof in a response's trailer.
type RawProof = [u8; PROOF_LEN];

/// Lock operations, with the reference's op codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LockOp {
    /// Take exclusively (fair lock: first attempt, may queue).
    TryExclusive = 0,
    /// Release an exclusive grant.
    UnlockExclusive = 1,
    /// Extend an exclusive grant.
    ExtendExclusive = 2,
    /// Fair lock: retry an exclusive request with the ticket held.
    TicketExclusive = 3,
    /// Take shared (fair lock: first attempt, may queue).
    TryShared = 4,
    /// Release a shared grant.
    UnlockShared = 5,
    /// Extend a shared grant.
    ExtendShared = 6,
    /// Fair lock: retry a shared request with the ticket held.
    TicketShared = 7,
    /// A dlock addition (`proto::lock_flags`, wire code 8): turn an exclusive grant into a
    /// shared one in place, for a cached holder asked to make room for readers. RW locks only:
    /// a fair or atomic lock answers `Einval` (the holder unlocks instead).
    Downgrade = 8,
}

impl LockOp {
    /// The op with this code.
    #[inline]
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => LockOp::TryExclusive,
            1 => LockOp::UnlockExclusive,
            2 => LockOp::ExtendExclusive,
            3 => LockOp::TicketExclusive,
            4 => LockOp::TryShared,
            5 => LockOp::UnlockShared,
            6 => LockOp::ExtendShared,
            7 => LockOp::TicketShared,
            super::lock_flags::DOWNGRADE_OP => LockOp::Downgrade,
            _ => return None,
        })
    }

    /// Whether the op asks for a grant: a first attempt or a fair ticket retry.
    #[inline]
    pub const fn acquires(self) -> bool {
        matches!(
            self,
            LockOp::TryExclusive
                | LockOp::TicketExclusive
                | LockOp::TryShared
                | LockOp::TicketShared
        )
    }

    /// The mode the op acts in: codes 0..=3 are exclusive, 4..=7 shared, and a downgrade acts
    /// on an exclusive grant.
    #[inline]
    pub const fn mode(self) -> Mode {
        if (self as u8) < 4 || matches!(self, LockOp::Downgrade) {
            Mode::Exclusive
        } else {
            Mode::Shared
        }
    }
}

/// Object operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ObjectOp {
    /// Fetch-and-add `a`.
    Faa = 0,
    /// Compare-and-swap: if the value is `a`, make it `b`.
    Cas = 1,
    /// Read the value.
    Snapshot = 2,
}

impl ObjectOp {
    /// The op with this code.
    #[inline]
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => ObjectOp::Faa,
            1 => ObjectOp::Cas,
            2 => ObjectOp::Snapshot,
            _ => return None,
        })
    }
}

/// A lock command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockCommand {
    /// The kind the client believes the lock has (the server checks it).
    pub kind: LockKind,
    /// The operation.
    pub op: LockOp,
    /// The lock id.
    pub lock: u32,
    /// Lease asked for, relative (trylock and extend).
    pub expire_ms: u32,
    /// Fair lock: the ticket held (ticket retries) or the counters cached (unlock, extend).
    pub ticket: Ticket,
    /// Trylocks only: how long the server may hold the request waiting for the lock (0 = do
    /// not wait). A waiting request must be alone in its message.
    pub wait_ms: u32,
    /// The epoch the client's map gives the lock's partition (a cluster's); 0 on a standalone
    /// server (module doc).
    pub partition_epoch: u32,
    /// What the lock manager is asked for beyond the plain operation (byte 24):
    /// [`LockFlags::VALUE_BLOCK`] on an acquisition returns the lock's value block, on an
    /// exclusive unlock writes the one in the request's value trailer.
    pub flags: LockFlags,
}

impl LockCommand {
    /// A placeholder (lock 0, which no id names): fills the unused slots of fixed-size command
    /// arrays, which their lengths keep anyone from reading.
    pub const NONE: LockCommand = LockCommand {
        kind: LockKind::Atomic,
        op: LockOp::TryExclusive,
        lock: 0,
        expire_ms: 0,
        ticket: Ticket {
            exclusive: 0,
            shared: 0,
        },
        wait_ms: 0,
        partition_epoch: 0,
        flags: LockFlags::NONE,
    };
}

/// An object command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectCommand {
    /// The operation.
    pub op: ObjectOp,
    /// The object id.
    pub object: u32,
    /// FAA: the addend. CAS: the expected value. Snapshot: unused.
    pub a: u64,
    /// CAS: the new value. Otherwise unused.
    pub b: u64,
    /// The epoch the client's map gives the object's partition (a cluster's); 0 on a
    /// standalone server (module doc).
    pub partition_epoch: u32,
}

/// A join command: binds the client in the message header to the stream connection the
/// message came on, beside the clients already bound to it, so many clients of one process share
/// one connection (a multiplexing client). It must be alone in its message; the transport
/// answers it (the lock tables have no part in it), with `Success` if `session` is the client's
/// registration secret. Shared memory has nothing to join and refuses it (`Einval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JoinCommand {
    /// The proof that the sender registered as the header's client.
    pub session: Session,
}

/// One command of a data request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// On a lock.
    Lock(LockCommand),
    /// On an object.
    Object(ObjectCommand),
    /// Joining a shared connection (answered by the transport).
    Join(JoinCommand),
}

impl Command {
    /// A placeholder for the unused slots of fixed-size command arrays ([`LockCommand::NONE`]).
    pub const NONE: Command = Command::Lock(LockCommand::NONE);

    /// The kind byte on the wire (what a response echoes).
    #[inline]
    pub const fn kind_code(self) -> u8 {
        match self {
            Command::Lock(c) => c.kind as u8,
            Command::Object(_) => OBJECT_KIND,
            Command::Join(_) => JOIN_KIND,
        }
    }

    /// The op byte on the wire.
    #[inline]
    pub const fn op_code(self) -> u8 {
        match self {
            Command::Lock(c) => c.op as u8,
            Command::Object(c) => c.op as u8,
            Command::Join(_) => 0,
        }
    }

    /// The lock or object id.
    #[inline]
    pub const fn id(self) -> u32 {
        match self {
            Command::Lock(c) => c.lock,
            Command::Object(c) => c.object,
            Command::Join(_) => 0,
        }
    }

    /// The partition epoch the command names (0 for a join, which names no partition).
    #[inline]
    pub const fn partition_epoch(self) -> u32 {
        match self {
            Command::Lock(c) => c.partition_epoch,
            Command::Object(c) => c.partition_epoch,
            Command::Join(_) => 0,
        }
    }
}

/// The header of a data request or response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// The negotiated version (checked by the server, not the codec).
    pub version: u8,
    /// Commands in the message. Encoders take it from the commands they are given.
    pub count: u8,
    /// Chosen by the client, copied into the response.
    pub message_id: u16,
    /// The sending client's id.
    pub client: u32,
    /// Flag bits, see [`FLAG_ALL_OR_NOTHING`](super::FLAG_ALL_OR_NOTHING).
    pub flags: u32,
}

/// The outcome of one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandResult {
    /// The outcome.
    pub status: Status,
    /// Locks: the lock word after the operation (also on failure, as in the reference).
    /// Objects: zero.
    pub word: u128,
    /// Locks: the fencing token on a grant, the ticket `tx | ts << 16` on a fair-lock `Eagain`,
    /// otherwise zero. Objects: the value before the operation (FAA, CAS) or the value read
    /// (Snapshot); a failed CAS reports the value it found.
    pub aux: u64,
    /// Locks, protocol 8: a `CACHEABLE` acquisition was granted, but recorded plain on the
    /// server (a contended lock, `manager::contention`): the holder gives it back with its
    /// last local release, as a plain unlock. On the wire, [`RESULT_PLAIN_GRANT`] in the
    /// echoed op byte. Always false otherwise.
    pub plain: bool,
}

impl CommandResult {
    /// A result with `status` and nothing else (no word, no aux, not a plain grant).
    #[inline]
    pub const fn status(status: Status) -> Self {
        CommandResult {
            status,
            word: 0,
            aux: 0,
            plain: false,
        }
    }
}

/// One entry of a data response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataResult {
    /// The kind byte echoed from the request (validated: 0..=4).
    pub kind: u8,
    /// The op byte echoed from the request (validated for the kind), without
    /// [`RESULT_PLAIN_GRANT`], which is in `result.plain`.
    pub op: u8,
    /// The lock or object id echoed from the request.
    pub id: u32,
    /// The outcome.
    pub result: CommandResult,
}

/// A validated data request, borrowing the message bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataRequest<'a> {
    header: DataHeader,
    /// Every command validated by [`decode_data_request`].
    commands: &'a [RawCommand],
    /// The value trailer ([`FLAG_VALUES`]): one block per command, or none at all.
    values: ValueRequests<'a>,
}

impl<'a> DataRequest<'a> {
    /// The header.
    #[inline]
    pub const fn header(&self) -> DataHeader {
        self.header
    }

    /// Number of commands (1..=31).
    #[inline]
    pub const fn len(&self) -> usize {
        self.commands.len()
    }

    /// Always false: a decoded request holds at least one command.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Command `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()` (a caller bug, like slice indexing).
    #[inline]
    pub fn command(&self, i: usize) -> Command {
        read_command(&self.commands[i])
    }

    /// The commands in order.
    #[inline]
    pub fn commands(&self) -> impl ExactSizeIterator<Item = Command> + 'a {
        self.commands.iter().map(read_command)
    }

    /// Command `i`'s entry in the value trailer: the block an exclusive unlock flagged
    /// [`LockFlags::VALUE_BLOCK`] writes (the decoder refused a writer without a trailer, and a
    /// non-zero entry for any other command); `None` when the message has no trailer.
    #[inline]
    pub fn value_block(&self, i: usize) -> Option<ValueBlock> {
        self.values.block(i)
    }

    /// Whether the response must carry a value trailer: some command is an acquisition
    /// flagged [`LockFlags::VALUE_BLOCK`] (known before anything runs).
    #[inline]
    pub fn wants_values(&self) -> bool {
        any_value_flag(self.commands)
            && self.commands.iter().any(|c| {
                let [_, op, ..] = *c;
                c[super::LOCK_FLAGS_OFFSET] & LockFlags::VALUE_BLOCK.bits() != 0
                    && !LockFlags::VALUE_BLOCK.writes_value(op)
                    && usize::from(c[0]) < 3
            })
    }
}

/// Whether any of `commands` has [`LockFlags::VALUE_BLOCK`] in its flags byte, whatever its
/// kind and op: one OR per command, so that a message without value blocks (the common case)
/// skips the scans that look for writers and readers of blocks command by command.
#[inline]
fn any_value_flag(commands: &[RawCommand]) -> bool {
    let flags = commands
        .iter()
        .fold(0, |any, c| any | c[super::LOCK_FLAGS_OFFSET]);
    flags & LockFlags::VALUE_BLOCK.bits() != 0
}

/// A validated data response, borrowing the message bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataResponse<'a> {
    header: DataHeader,
    /// Every result validated by [`decode_data_response`].
    results: &'a [RawCommand],
    /// The value trailer: one entry per result, or none at all.
    values: ValueReplies<'a>,
    /// The proof trailer: one per result, or none at all.
    proofs: &'a [RawProof],
}

impl<'a> DataResponse<'a> {
    /// The header (echoed from the request).
    #[inline]
    pub const fn header(&self) -> DataHeader {
        self.header
    }

    /// Number of results (1..=31).
    #[inline]
    pub const fn len(&self) -> usize {
        self.results.len()
    }

    /// Always false: a decoded response holds at least one result.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.results.is_empty()
    }

    /// Result `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    #[inline]
    pub fn result(&self, i: usize) -> DataResult {
        read_result(&self.results[i])
    }

    /// The results in order.
    #[inline]
    pub fn results(&self) -> impl ExactSizeIterator<Item = DataResult> + 'a {
        self.results.iter().map(read_result)
    }

    /// The MAC of the proof of result `i`'s grant or ticket; all zero when the response has no
    /// proof for it (no trailer, or nothing granted by that command).
    #[inline]
    pub fn proof_mac(&self, i: usize) -> [u8; PROOF_LEN] {
        self.proofs.get(i).copied().unwrap_or([0; PROOF_LEN])
    }

    /// The value block result `i`'s grant returned: `None` unless the command asked for it and
    /// was granted.
    #[inline]
    pub fn value(&self, i: usize) -> Option<ValueRead> {
        self.values.get(i)
    }
}

/// Reads and checks the header at the start of `buf` (magic, count, flags) and returns it with
/// the length of the whole *request* it announces; `Truncated` while the header is incomplete.
/// A server's stream transport frames requests with it, and anyone reads the sender's id from
/// the header without decoding the commands. (A response's trailers are longer: frame one with
/// [`peek_data_response_header`].)
#[inline]
pub fn peek_data_header(buf: &[u8]) -> Result<(DataHeader, usize), DecodeError> {
    peek(buf, false)
}

/// [`peek_data_header`] for a response: the length counts a response's value and proof
/// trailers, and an event message ([`FLAG_EVENT`](super::FLAG_EVENT), which a server sends
/// unasked on the same stream) is framed too. A client's stream transport frames responses
/// with it and tells an event by its flags.
#[inline]
pub fn peek_data_response_header(buf: &[u8]) -> Result<(DataHeader, usize), DecodeError> {
    peek(buf, true)
}

#[inline]
fn peek(buf: &[u8], response: bool) -> Result<(DataHeader, usize), DecodeError> {
    if buf.len() < DATA_HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    if get_u32(buf, 0)? != DATA_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let header = DataHeader {
        version: get_u8(buf, 4)?,
        count: get_u8(buf, 5)?,
        message_id: get_u16(buf, 6)?,
        client: get_u32(buf, 8)?,
        flags: get_u32(buf, 12)?,
    };
    let count = usize::from(header.count);
    if response && super::is_event_message(&header) {
        // An event message (`event.rs`) shares the stream of responses: framed here, decoded
        // by `decode_event_message`, never by the response decoder.
        if !(1..=super::EVENTS_MAX).contains(&count) {
            return Err(DecodeError::BadCount);
        }
        return Ok((header, super::event::event_message_len(count)));
    }
    if !(1..=BATCH_MAX).contains(&count) {
        return Err(DecodeError::BadCount);
    }
    if header.flags & !FLAGS_KNOWN != 0 {
        return Err(DecodeError::BadFlags);
    }
    Ok((header, data_message_len(count, header.flags, response)))
}

/// A data message's bytes with its header read and checked ([`peek_data_frame`]): what a
/// server frames a stream with and decodes the commands from, so that the header of a message
/// is read once on its way from the wire to the state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataFrame<'a> {
    header: DataHeader,
    /// The length the header announces.
    len: usize,
    /// The bytes the header was read from: the message, or (a stream's) more or less than it.
    buf: &'a [u8],
}

/// Reads and checks the header at the start of `buf`, as [`peek_data_header`] does, and keeps
/// the bytes with it.
#[inline]
pub fn peek_data_frame(buf: &[u8]) -> Result<DataFrame<'_>, DecodeError> {
    let (header, len) = peek_data_header(buf)?;
    Ok(DataFrame { header, len, buf })
}

/// The parts of a data message after its header.
struct Parts<'a> {
    commands: &'a [RawCommand],
    values: &'a [u8],
    proofs: &'a [RawProof],
}

impl<'a> DataFrame<'a> {
    /// The header.
    #[inline]
    pub const fn header(&self) -> DataHeader {
        self.header
    }

    /// The length of the whole message the header announces.
    #[inline]
    pub const fn message_len(&self) -> usize {
        self.len
    }

    /// The bytes the header was read from.
    #[inline]
    pub const fn bytes(&self) -> &'a [u8] {
        self.buf
    }

    /// The message alone, if all of it is here: a stream's first message, cut from the bytes
    /// behind it. `None` while the stream owes some of it.
    #[inline]
    pub fn first_message(self) -> Option<DataFrame<'a>> {
        let buf = self.buf.get(..self.len)?;
        Some(DataFrame { buf, ..self })
    }

    /// Checks the total length and splits the commands from the value trailer (empty without
    /// [`FLAG_VALUES`]) and the proof trailer (empty without [`FLAG_PROOFS`]); `response` says
    /// whose value entries these are.
    #[inline]
    fn split(&self, response: bool) -> Result<Parts<'a>, DecodeError> {
        if self.buf.len() != self.len {
            return Err(DecodeError::BadLength);
        }
        let count = usize::from(self.header.count);
        let body = self
            .buf
            .get(DATA_HEADER_LEN..)
            .ok_or(DecodeError::Truncated)?;
        let value_len = match (self.header.flags & FLAG_VALUES != 0, response) {
            (false, _) => 0,
            (true, false) => VALUE_REQUEST_LEN,
            (true, true) => VALUE_REPLY_LEN,
        };
        let (body, trailer) = body
            .split_at_checked(count * COMMAND_LEN)
            .ok_or(DecodeError::BadLength)?;
        let (values, trailer) = trailer
            .split_at_checked(count * value_len)
            .ok_or(DecodeError::BadLength)?;
        let (commands, rest) = body.as_chunks::<COMMAND_LEN>();
        let (proofs, rest_proofs) = trailer.as_chunks::<PROOF_LEN>();
        if commands.len() != count || !rest.is_empty() || !rest_proofs.is_empty() {
            return Err(DecodeError::BadLength);
        }
        Ok(Parts {
            commands,
            values,
            proofs,
        })
    }

    /// The commands of a request (a proof trailer is the server's to send) and its value
    /// trailer, checked against the commands: a block exactly for each command that writes one.
    #[inline]
    fn request_parts(&self) -> Result<(&'a [RawCommand], ValueRequests<'a>), DecodeError> {
        if self.header.flags & !REQUEST_FLAGS_KNOWN != 0 {
            return Err(DecodeError::BadFlags);
        }
        let parts = self.split(false)?;
        let commands = parts.commands;
        let writes = |i: usize| {
            let c = &commands[i];
            usize::from(c[0]) < 3
                && LockFlags::VALUE_BLOCK.writes_value(c[1])
                && c[super::LOCK_FLAGS_OFFSET] & LockFlags::VALUE_BLOCK.bits() != 0
        };
        let writers = match any_value_flag(commands) {
            true => (0..commands.len()).filter(|&i| writes(i)).count(),
            false => 0,
        };
        if self.header.flags & FLAG_VALUES == 0 {
            // A command that writes a block needs the trailer that carries it.
            return match writers {
                0 => Ok((commands, ValueRequests::NONE)),
                _ => Err(DecodeError::BadFlags),
            };
        }
        // A trailer is sent exactly when some command writes (one encoding per message).
        if writers == 0 {
            return Err(DecodeError::BadFlags);
        }
        Ok((
            commands,
            ValueRequests::decode(parts.values, commands.len(), writes)?,
        ))
    }

    /// Decodes the message as a request, validating every command so
    /// [`DataRequest::command`] cannot fail; the header is not read again.
    pub fn decode(&self) -> Result<DataRequest<'a>, DecodeError> {
        let (commands, values) = self.request_parts()?;
        for c in commands {
            parse_command(c)?;
        }
        Ok(DataRequest {
            header: self.header,
            commands,
            values,
        })
    }

    /// [`Self::decode`], reading the commands into `commands` in the same pass
    /// (`commands[..len()]`) so that each is parsed once: the server's hot path.
    pub fn decode_into(
        &self,
        commands: &mut [Command; BATCH_MAX],
    ) -> Result<DataRequest<'a>, DecodeError> {
        let (raw, values) = self.request_parts()?;
        for (c, slot) in raw.iter().zip(commands.iter_mut()) {
            *slot = parse_command(c)?;
        }
        Ok(DataRequest {
            header: self.header,
            commands: raw,
            values,
        })
    }
}

/// Decodes a data request, validating every command so [`DataRequest::command`] cannot fail.
pub fn decode_data_request(buf: &[u8]) -> Result<DataRequest<'_>, DecodeError> {
    peek_data_frame(buf)?.decode()
}

/// Decodes a data request as [`decode_data_request`] does and reads its commands into
/// `commands` in the same pass (`commands[..len()]`), so that each is parsed once.
pub fn decode_data_request_into<'a>(
    buf: &'a [u8],
    commands: &mut [Command; BATCH_MAX],
) -> Result<DataRequest<'a>, DecodeError> {
    peek_data_frame(buf)?.decode_into(commands)
}

/// Decodes a data response, validating every result so [`DataResponse::result`] cannot fail.
pub fn decode_data_response(buf: &[u8]) -> Result<DataResponse<'_>, DecodeError> {
    let (header, len) = peek_data_response_header(buf)?;
    if super::is_event_message(&header) {
        // Framed beside the responses, but no response: `decode_event_message` reads it.
        return Err(DecodeError::BadFlags);
    }
    let parts = DataFrame { header, len, buf }.split(true)?;
    for c in parts.commands {
        parse_result(c)?;
    }
    let values = match header.flags & FLAG_VALUES {
        0 => ValueReplies::NONE,
        _ => ValueReplies::decode(parts.values, parts.commands.len())?,
    };
    Ok(DataResponse {
        header,
        results: parts.commands,
        values,
        proofs: parts.proofs,
    })
}

// Always inlined: called out of line, it returns its `Result` through memory written field by
// field, which the server's decode loop (`DataFrame::decode_into`) then read back in wider,
// overlapping loads — store-forwarding stalls that cost a third of a 31-command message.
#[inline(always)]
fn parse_command(c: &RawCommand) -> Result<Command, DecodeError> {
    let (kind, op, id) = kind_op_id(c);
    if get_u16(c, 2)? != 0 {
        // The status field belongs to the response; a request carrying one is malformed.
        return Err(DecodeError::BadField);
    }
    if kind == JOIN_KIND {
        if op != 0 {
            return Err(DecodeError::BadOp);
        }
        if id != 0 || get_u64(c, 24)? != 0 {
            return Err(DecodeError::BadField);
        }
        return Ok(Command::Join(JoinCommand {
            session: Session(get_array(c, 8)?),
        }));
    }
    if kind == OBJECT_KIND {
        let op = ObjectOp::from_u8(op).ok_or(DecodeError::BadOp)?;
        if get_u32(c, 28)? != 0 {
            return Err(DecodeError::BadField);
        }
        return Ok(Command::Object(ObjectCommand {
            op,
            object: id,
            a: get_u64(c, 8)?,
            b: get_u64(c, 16)?,
            partition_epoch: get_u32(c, 24)?,
        }));
    }
    let kind = LockKind::from_u8(kind).ok_or(DecodeError::BadKind)?;
    let op = LockOp::from_u8(op).ok_or(DecodeError::BadOp)?;
    let flags = read_lock_flags(c)?;
    Ok(Command::Lock(LockCommand {
        kind,
        op,
        lock: id,
        expire_ms: get_u32(c, 8)?,
        ticket: Ticket {
            exclusive: get_u16(c, 12)?,
            shared: get_u16(c, 14)?,
        },
        wait_ms: get_u32(c, 16)?,
        partition_epoch: get_u32(c, 20)?,
        flags,
    }))
}

/// Re-reads a command [`decode_data_request`] has validated.
#[inline]
fn read_command(c: &RawCommand) -> Command {
    match parse_command(c) {
        Ok(command) => command,
        // A `DataRequest` is only built from validated commands, so this is a bug, not input.
        Err(e) => unreachable!("data command validated at decode failed to parse: {e}"),
    }
}

#[inline]
fn parse_result(c: &RawCommand) -> Result<DataResult, DecodeError> {
    let (kind, raw_op, id) = kind_op_id(c);
    // Only a lock's grant may be marked plain; on anything else the bit is a bad op.
    let plain = kind < OBJECT_KIND && raw_op & RESULT_PLAIN_GRANT != 0;
    let op = match plain {
        true => raw_op & !RESULT_PLAIN_GRANT,
        false => raw_op,
    };
    if kind == JOIN_KIND {
        // A join result echoes a join, whose op and id are zero.
        if op != 0 {
            return Err(DecodeError::BadOp);
        }
        if id != 0 {
            return Err(DecodeError::BadField);
        }
    } else if kind == OBJECT_KIND {
        ObjectOp::from_u8(op).ok_or(DecodeError::BadOp)?;
    } else {
        LockKind::from_u8(kind).ok_or(DecodeError::BadKind)?;
        LockOp::from_u8(op).ok_or(DecodeError::BadOp)?;
    }
    let status = Status::from_code(get_u16(c, 2)?).ok_or(DecodeError::BadField)?;
    Ok(DataResult {
        kind,
        op,
        id,
        result: CommandResult {
            status,
            word: get_u128(c, 8)?,
            aux: get_u64(c, 24)?,
            plain,
        },
    })
}

/// Re-reads a result [`decode_data_response`] has validated.
#[inline]
fn read_result(c: &RawCommand) -> DataResult {
    match parse_result(c) {
        Ok(result) => result,
        Err(e) => unreachable!("data result validated at decode failed to parse: {e}"),
    }
}

/// The kind, op and id of a command (bytes 0, 1 and 4..8), read by pattern so no index can
/// be out of range.
#[inline]
fn kind_op_id(c: &RawCommand) -> (u8, u8, u32) {
    let [kind, op, _, _, i0, i1, i2, i3, ..] = *c;
    (kind, op, u32::from_le_bytes([i0, i1, i2, i3]))
}
