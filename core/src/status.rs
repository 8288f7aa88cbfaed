//! Status codes, with the reference's numeric values.
//!
//! The values are those of `dlock_status_t` in the reference's `dlock_types.h`, so a C engine
//! that switches on them keeps working. `Status::Success` exists because the wire carries it; in
//! Rust APIs an `Err(Status)` never holds it.

/// Every status the server or a client can report. `#[repr(u16)]` because the wire carries the
/// code in a 16-bit field; [`Status::code`] gives the C ABI's `int`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[must_use]
#[non_exhaustive]
pub enum Status {
    /// The operation succeeded.
    Success = 0,
    /// Handled internally, nothing more to do (mapped to `Success` at the API).
    Done = 1,
    /// Fair lock: queued with a ticket, retry with it. Recovery: call again.
    Eagain = 0x1000,
    /// Out of memory or buffers.
    Enomem = 0x1001,
    /// A wait ran past its deadline.
    Etimeout = 0x1002,
    /// A bad argument, or an operation not valid in the current state.
    Einval = 0x1003,
    /// Fair lock: the requested mode differs from the mode of the ticket held.
    Eticket = 0x1004,
    /// An asynchronous operation is outstanding on this client instance.
    Easync = 0x1005,
    /// The client id is not registered.
    ClientNotInit = 0x2000,
    /// The lock id was not obtained through `get_lock` by this client (or is stale).
    LockNotGet = 0x2001,
    /// Re-entrant lock succeeded, or unlock only dropped a local re-entrancy count.
    AlreadyLocked = 0x2002,
    /// Unlock of a lock not held.
    AlreadyUnlocked = 0x2003,
    /// `release_lock` while holding a fair-lock ticket: unlock first.
    TicketToUnlock = 0x2004,
    /// Network error, timeout or a response that failed validation.
    BadResponse = 0x2005,
    /// The server refused: lock held, owner mismatch, ticket passed or queue full.
    Fail = 0x2006,
    /// The client library was not initialised.
    ClientMgrNotInit = 0x2007,
    /// The server is recovering (waiting for clients to re-sync) or refused the connection.
    NotReady = 0x2008,
    /// `lock_result_check` with nothing outstanding.
    NoAsync = 0x2009,
    /// The asynchronous response has not arrived yet.
    AsyncAgain = 0x200A,
    /// Replica initialisation failed (kept for numeric compatibility; never returned).
    ReplicaInitFail = 0x200B,
    /// The server was not initialised.
    ServerNotInit = 0x200C,
    /// The server evicted this client; register again with `client_init`.
    ClientRemovedByServer = 0x200D,
    /// Client and server protocol versions do not overlap.
    ProtoVersionNegotiationFail = 0x200E,
    /// A server table (clients, locks, waiters) is full.
    ServerNoResource = 0x200F,
    /// The server does not own the partition at the epoch the request named (or has fenced
    /// itself); `aux` of the result (a control reply's body) carries the map version the server
    /// knows; refresh the map and retry. Not in the reference, which has no partitions (a dlock
    /// cluster's; a standalone server never answers it).
    PartitionMoved = 0x2010,
    /// The lock is held as retained by a dead client until a recoverer calls `recovery_done`
    /// (not in the reference).
    LockRetained = 0x2011,
    /// An object of that name was created by another client.
    ObjectAlreadyExisted = 0x3000,
    /// This client (or an orphaned owner) created the object before.
    ObjectAlreadyCreated = 0x3001,
    /// No object of that name or id.
    ObjectNotCreate = 0x3002,
    /// Destroy by a client that does not own the object.
    ObjectInvalidOwner = 0x3003,
    /// The object was not obtained through `get` by this client.
    ObjectNotGet = 0x3004,
    /// The object is marked destroyed but still referenced.
    ObjectAlreadyDestroyed = 0x3005,
    /// The object table is full.
    ObjectTooMany = 0x3006,
    /// Compare-and-swap found a different value.
    ObjectCasFailed = 0x3007,
}

/// Statuses by code: `BY_CODE[code >> 12][code & 0xFFF]`.
const BY_CODE: [[Option<Status>; 32]; 4] = {
    let mut table = [[None; 32]; 4];
    let mut i = 0;
    while i < Status::ALL.len() {
        let code = Status::ALL[i] as u16;
        // Fails the build if a code ever falls outside the table's shape.
        table[(code >> 12) as usize][(code & 0x0FFF) as usize] = Some(Status::ALL[i]);
        i += 1;
    }
    table
};

impl Status {
    /// Every status, in numeric order (for exhaustive tests and code tables).
    pub const ALL: [Status; 34] = [
        Status::Success,
        Status::Done,
        Status::Eagain,
        Status::Enomem,
        Status::Etimeout,
        Status::Einval,
        Status::Eticket,
        Status::Easync,
        Status::ClientNotInit,
        Status::LockNotGet,
        Status::AlreadyLocked,
        Status::AlreadyUnlocked,
        Status::TicketToUnlock,
        Status::BadResponse,
        Status::Fail,
        Status::ClientMgrNotInit,
        Status::NotReady,
        Status::NoAsync,
        Status::AsyncAgain,
        Status::ReplicaInitFail,
        Status::ServerNotInit,
        Status::ClientRemovedByServer,
        Status::ProtoVersionNegotiationFail,
        Status::ServerNoResource,
        Status::PartitionMoved,
        Status::LockRetained,
        Status::ObjectAlreadyExisted,
        Status::ObjectAlreadyCreated,
        Status::ObjectNotCreate,
        Status::ObjectInvalidOwner,
        Status::ObjectNotGet,
        Status::ObjectAlreadyDestroyed,
        Status::ObjectTooMany,
        Status::ObjectCasFailed,
    ];

    /// The numeric code, as the C ABI returns it.
    #[inline]
    pub const fn code(self) -> i32 {
        self as u16 as i32
    }

    /// The status with this wire code, or `None` for a code the reference does not define.
    #[inline]
    pub const fn from_code(code: u16) -> Option<Status> {
        // Codes are a group in the top nibble (0..=3) and an index below 32 in the low 12 bits;
        // anything else is unknown. Every reply a client reads goes through here.
        let (group, index) = ((code >> 12) as usize, (code & 0x0FFF) as usize);
        if group >= BY_CODE.len() || index >= BY_CODE[0].len() {
            return None;
        }
        BY_CODE[group][index]
    }

    /// `true` for the two codes that mean the operation took effect.
    #[inline]
    pub const fn is_success(self) -> bool {
        matches!(self, Status::Success | Status::Done)
    }

    /// `Ok(())` for success, `Err(self)` otherwise: the bridge to `?`.
    #[inline]
    pub const fn ok(self) -> Result<(), Status> {
        if self.is_success() { Ok(()) } else { Err(self) }
    }

    /// The reference's C name (`DLOCK_SUCCESS`, …), for logs and the C header.
    pub const fn name(self) -> &'static str {
        match self {
            Status::Success => "DLOCK_SUCCESS",
            Status::Done => "DLOCK_DONE",
            Status::Eagain => "DLOCK_EAGAIN",
            Status::Enomem => "DLOCK_ENOMEM",
            Status::Etimeout => "DLOCK_ETIMEOUT",
            Status::Einval => "DLOCK_EINVAL",
            Status::Eticket => "DLOCK_ETICKET",
            Status::Easync => "DLOCK_EASYNC",
            Status::ClientNotInit => "DLOCK_CLIENT_NOT_INIT",
            Status::LockNotGet => "DLOCK_LOCK_NOT_GET",
            Status::AlreadyLocked => "DLOCK_ALREADY_LOCKED",
            Status::AlreadyUnlocked => "DLOCK_ALREADY_UNLOCKED",
            Status::TicketToUnlock => "DLOCK_TICKET_TO_UNLOCK",
            Status::BadResponse => "DLOCK_BAD_RESPONSE",
            Status::Fail => "DLOCK_FAIL",
            Status::ClientMgrNotInit => "DLOCK_CLIENTMGR_NOT_INIT",
            Status::NotReady => "DLOCK_NOT_READY",
            Status::NoAsync => "DLOCK_NO_ASYNC",
            Status::AsyncAgain => "DLOCK_ASYNC_AGAIN",
            Status::ReplicaInitFail => "DLOCK_REPLICA_INIT_FAIL",
            Status::ServerNotInit => "DLOCK_SERVER_NOT_INIT",
            Status::ClientRemovedByServer => "DLOCK_CLIENT_REMOVED_BY_SERVER",
            Status::ProtoVersionNegotiationFail => "DLOCK_PROTO_VERSION_NEGOTIATION_FAIL",
            Status::ServerNoResource => "DLOCK_SERVER_NO_RESOURCE",
            Status::PartitionMoved => "DLOCK_PARTITION_MOVED",
            Status::LockRetained => "DLOCK_LOCK_RETAINED",
            Status::ObjectAlreadyExisted => "DLOCK_OBJECT_ALREADY_EXISTED",
            Status::ObjectAlreadyCreated => "DLOCK_OBJECT_ALREADY_CREATED",
            Status::ObjectNotCreate => "DLOCK_OBJECT_NOT_CREATE",
            Status::ObjectInvalidOwner => "DLOCK_OBJECT_INVALID_OWNER",
            Status::ObjectNotGet => "DLOCK_OBJECT_NOT_GET",
            Status::ObjectAlreadyDestroyed => "DLOCK_OBJECT_ALREADY_DESTROYED",
            Status::ObjectTooMany => "DLOCK_OBJECT_TOO_MANY",
            Status::ObjectCasFailed => "DLOCK_OBJECT_CAS_FAILED",
        }
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({:#x})", self.name(), *self as u16)
    }
}

/// A status is an error value in its own right (`core::error::Error`, so no `std` is needed):
/// `?` turns it into a `Box<dyn Error>` or an application's error type.
impl core::error::Error for Status {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_reference() {
        assert_eq!(Status::Success.code(), 0);
        assert_eq!(Status::Eagain.code(), 0x1000);
        assert_eq!(Status::Easync.code(), 0x1005);
        assert_eq!(Status::ClientNotInit.code(), 0x2000);
        assert_eq!(Status::ServerNoResource.code(), 0x200F);
        assert_eq!(Status::PartitionMoved.code(), 0x2010);
        assert_eq!(Status::LockRetained.code(), 0x2011);
        assert_eq!(Status::ObjectAlreadyExisted.code(), 0x3000);
        assert_eq!(Status::ObjectCasFailed.code(), 0x3007);
    }

    #[test]
    fn every_code_round_trips_and_unknown_codes_do_not() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s as u16), Some(s));
        }
        for bad in [2u16, 0x0FFF, 0x1006, 0x2012, 0x3008, 0x4000, 0xFFFF] {
            assert_eq!(Status::from_code(bad), None);
        }
        // Every code: known exactly when some status has it.
        for code in 0..=u16::MAX {
            let known = Status::ALL.iter().copied().find(|s| *s as u16 == code);
            assert_eq!(Status::from_code(code), known, "code {code:#x}");
        }
    }
}
