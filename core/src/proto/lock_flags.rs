//! What a lock command asks of its grant: the flags byte at offset 24 of a lock request, and
//! the op code of a downgrade.
//!
//! A lock request's bytes 20..32 are reserved (zero) today. The cluster takes 20..24 for the
//! partition epoch (`CLUSTER-SPEC` §2); the lock manager takes byte 24:
//!
//! | off | type | field                                                       |
//! |-----|------|-------------------------------------------------------------|
//! | 20  | u32  | partition epoch (the cluster's; zero on a standalone server) |
//! | 24  | u8   | [`LockFlags`]                                               |
//! | 25  | 7 B  | reserved, zero                                              |
//!
//! | flag          | on                                   | means                                                          |
//! |---------------|--------------------------------------|----------------------------------------------------------------|
//! | `CACHEABLE`   | trylock, ticket retry                | the holder keeps the grant until asked and gives it back when revoked |
//! | `RETAIN`      | trylock, ticket retry                | if the holder dies, the grant stays held as retained until `recovery_done` |
//! | `VALUE_BLOCK` | trylock, ticket retry                | return the lock's value block with the grant (response value trailer) |
//! | `WAKE_ON_REVOKE` | trylock, ticket retry             | a parked wait of this request ends at once, answered `Etimeout`, when the server sends its client a revoke |
//! | `VALUE_BLOCK` | exclusive unlock, downgrade          | this command writes the value block in the request's value trailer |
//!
//! Any other flag on any other op, and any unknown bit, is refused at decode: a peer that sets
//! one is broken or probing, and accepting it would make the byte mean two things later.
//!
//! `Downgrade` is op code [`DOWNGRADE_OP`] (8, after the reference's 0..=7): exclusive to shared
//! in place, for RW locks; the server answers `Einval` on an atomic lock, which has no
//! shared mode (its holder gives back with an unlock), and on a fair lock, whose word has no
//! step from an exclusive turn to a reader's that keeps a queued writer out. It is
//! [`LockOp::Downgrade`](super::LockOp::Downgrade), whose [`LockOp::mode`](super::LockOp::mode)
//! says exclusive (the mode it acts on) rather than follow the code's range.

use super::{COMMAND_LEN, DecodeError, EncodeError};

/// Where the flags byte sits in a lock request command.
pub const LOCK_FLAGS_OFFSET: usize = 24;
/// The op code of a downgrade, [`LockOp::Downgrade`](super::LockOp::Downgrade).
pub const DOWNGRADE_OP: u8 = 8;

/// The op codes the flags depend on (the reference's, and the downgrade).
const TRY_EXCLUSIVE: u8 = 0;
const UNLOCK_EXCLUSIVE: u8 = 1;
const TICKET_EXCLUSIVE: u8 = 3;
const TRY_SHARED: u8 = 4;
const TICKET_SHARED: u8 = 7;

/// The flags byte of a lock request (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LockFlags(u8);

impl LockFlags {
    /// No flag.
    pub const NONE: LockFlags = LockFlags(0);
    /// A cached grant.
    pub const CACHEABLE: LockFlags = LockFlags(1);
    /// Retain the grant if its holder dies.
    pub const RETAIN: LockFlags = LockFlags(2);
    /// Return the value block (acquisitions) or write it (exclusive unlock, downgrade).
    pub const VALUE_BLOCK: LockFlags = LockFlags(4);
    /// End this request's wait on the server, answered `Etimeout` as if it ran out, the moment
    /// the server revokes a grant its client caches (`server/revokes.rs`): a client blocked in
    /// a wait cannot read its revokes, and a waiter for a lock it caches would otherwise wait
    /// for it until one of the two waits ran out. For callers that wait in a loop which reads
    /// its revokes between waits; meaningless without `wait_ms`.
    pub const WAKE_ON_REVOKE: LockFlags = LockFlags(8);
    /// Every flag this version defines.
    pub const KNOWN: LockFlags = LockFlags(15);

    /// The flags in `bits`; `BadField` for an unknown bit.
    #[inline]
    pub const fn from_bits(bits: u8) -> Result<LockFlags, DecodeError> {
        if bits & !Self::KNOWN.0 != 0 {
            return Err(DecodeError::BadField);
        }
        Ok(LockFlags(bits))
    }

    /// The byte.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every flag of `other` is set.
    #[inline]
    pub const fn contains(self, other: LockFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets.
    #[inline]
    pub const fn union(self, other: LockFlags) -> LockFlags {
        LockFlags(self.0 | other.0)
    }

    /// The flags set in both.
    #[inline]
    pub const fn intersection(self, other: LockFlags) -> LockFlags {
        LockFlags(self.0 & other.0)
    }

    /// The flags a command with op code `op` may carry (module doc: the table); `NONE` for
    /// the others, unknown codes included.
    #[inline]
    pub const fn allowed_for(op: u8) -> LockFlags {
        match op {
            TRY_EXCLUSIVE | TICKET_EXCLUSIVE | TRY_SHARED | TICKET_SHARED => Self::KNOWN,
            UNLOCK_EXCLUSIVE | DOWNGRADE_OP => Self::VALUE_BLOCK,
            _ => Self::NONE,
        }
    }

    /// Whether a command with op code `op` and these flags carries a block in the request's
    /// value trailer.
    #[inline]
    pub const fn writes_value(self, op: u8) -> bool {
        matches!(op, UNLOCK_EXCLUSIVE | DOWNGRADE_OP) && self.contains(Self::VALUE_BLOCK)
    }
}

/// Reads and checks the flags of lock request `command` (kind, op and the rest are the
/// command decoder's): unknown bits, a flag its op may not carry, or a non-zero byte in
/// 25..32 is `BadField`.
#[inline]
pub fn read_lock_flags(command: &[u8; COMMAND_LEN]) -> Result<LockFlags, DecodeError> {
    let [_, op, ..] = *command;
    let flags = LockFlags::from_bits(command[LOCK_FLAGS_OFFSET])?;
    if !LockFlags::allowed_for(op).contains(flags)
        || command[LOCK_FLAGS_OFFSET + 1..].iter().any(|&b| b != 0)
    {
        return Err(DecodeError::BadField);
    }
    Ok(flags)
}

/// Writes `flags` into lock request `command`, whose op byte is already written, and zeroes
/// the reserved bytes after it; `Invalid` for flags its op may not carry (a peer would refuse
/// them).
#[inline]
pub fn put_lock_flags(
    command: &mut [u8; COMMAND_LEN],
    flags: LockFlags,
) -> Result<(), EncodeError> {
    if !LockFlags::allowed_for(command[1]).contains(flags) {
        return Err(EncodeError::Invalid);
    }
    command[LOCK_FLAGS_OFFSET] = flags.bits();
    command[LOCK_FLAGS_OFFSET + 1..].fill(0);
    Ok(())
}
