//! The native API's error: what failed, the reference's [`Status`], and the I/O error behind it.
//!
//! This module owns [`Error`], [`ErrorKind`] and the per-thread slot in which the client leaves
//! the last transport failure. The reference-shaped [`Client`](super::Client) calls keep
//! returning a bare `Status` (the C ABI and ported code switch on it); the named-lock API
//! ([`super::named`]) returns an `Error` built from that status plus the slot's content.
//!
//! # Why a per-thread slot
//!
//! The client turns every transport failure into the reference's `BAD_RESPONSE` in one place
//! (`io_status` in `client/mod.rs`), and its signatures, which the C ABI mirrors, have no room
//! for an `io::Error`. Threading one through would mean touching every call site, the connection
//! code included. Instead `io_status` also parks the error in a thread-local slot. A client call
//! is synchronous and runs on the calling thread, so the native API empties the slot before a
//! call (`IoSlot::arm`) and takes what is there after it: whatever it finds came from that call.
//! Only an error that ended in `BAD_RESPONSE` is attached, so a transport failure the client
//! recovered from is never blamed for a status it did not cause.

use std::cell::RefCell;
use std::fmt;
use std::io;

use dlock_core::Status;

thread_local! {
    /// The last transport failure on this thread, if any was parked since the slot was armed.
    static LAST_IO_ERROR: RefCell<Option<io::Error>> = const { RefCell::new(None) };
}

/// Parks a transport failure for the native API to attach as an [`Error`]'s source.
pub(crate) fn park_io_error(e: io::Error) {
    LAST_IO_ERROR.with(|slot| *slot.borrow_mut() = Some(e));
}

/// The slot's state across one client call: armed before, read after.
#[derive(Debug)]
pub(crate) struct IoSlot(());

impl IoSlot {
    /// Empties this thread's slot, so that what is found after the call came from it.
    #[inline]
    pub(crate) fn arm() -> IoSlot {
        LAST_IO_ERROR.with(|slot| slot.borrow_mut().take());
        IoSlot(())
    }

    /// The error for a call `op` that ended in `status`, with the parked I/O error as its source
    /// when the status is the one a transport failure becomes: `BAD_RESPONSE`, or `NOT_READY`
    /// from a connect (the reference's `client_init` answers a server it cannot reach so).
    pub(crate) fn error(self, op: Op, status: Status) -> Error {
        let source = LAST_IO_ERROR.with(|slot| slot.borrow_mut().take());
        let transport =
            status == Status::BadResponse || (op == Op::Connect && status == Status::NotReady);
        Error {
            op,
            status,
            source: source.filter(|_| transport),
        }
    }
}

/// What the caller can do about an [`Error`], independent of which operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held by someone else (or, on a fair lock, others are queued before us):
    /// `try_` asked once and was refused. Retry later or wait.
    WouldBlock,
    /// A wait for the lock ran out.
    TimedOut,
    /// The grant this guard stood for is gone: its lease ran out and the server gave the lock
    /// to someone else, or it was already released. Writes made under its token may be fenced.
    NotHeld,
    /// The server no longer knows this client (lease expired, evicted) or the transport failed:
    /// every grant of the handle is in doubt. Reconnect.
    Disconnected,
    /// A server table is full (locks, clients, waiters).
    NoResource,
    /// A bad argument or a call that is not valid in the current state (a zero lease, a shared
    /// lock of an atomic lock, a name over 512 bytes, a guard of another handle).
    Invalid,
    /// Any other status; see [`Error::status`].
    Other,
}

/// Which native operation failed (for [`Error`]'s message and [`ErrorKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Connect,
    GetLock,
    ReleaseLock,
    TryLock,
    Lock,
    Extend,
    Unlock,
    Heartbeat,
    /// Reading a server's counters (`read_server_stats`).
    Stats,
    /// A status converted with `From`, outside any native call.
    Unknown,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Connect => "connect",
            Op::GetLock => "get_lock",
            Op::ReleaseLock => "release_lock",
            Op::TryLock => "try_lock",
            Op::Lock => "lock",
            Op::Extend => "extend",
            Op::Unlock => "unlock",
            Op::Heartbeat => "heartbeat",
            Op::Stats => "read_server_stats",
            Op::Unknown => "dlock call",
        }
    }

    /// Whether the operation asks for a grant (a refusal means "busy", not "lost").
    fn acquires(self) -> bool {
        matches!(self, Op::TryLock | Op::Lock)
    }
}

/// The error of the native lock API.
///
/// Carries the reference's [`Status`] ([`Error::status`], numeric code via
/// [`Status::code`]), what the caller can do about it ([`Error::kind`]) and, when a transport
/// failure caused it, the [`io::Error`] as [`std::error::Error::source`].
#[derive(Debug)]
pub struct Error {
    op: Op,
    status: Status,
    source: Option<io::Error>,
}

impl Error {
    pub(crate) fn new(op: Op, status: Status) -> Error {
        Error {
            op,
            status,
            source: None,
        }
    }

    /// The reference's status for this failure (never `Success`).
    #[inline]
    pub fn status(&self) -> Status {
        self.status
    }

    /// What the caller can do about it.
    pub fn kind(&self) -> ErrorKind {
        match self.status {
            Status::Fail | Status::Eagain if self.op.acquires() => ErrorKind::WouldBlock,
            Status::Fail | Status::AlreadyUnlocked => ErrorKind::NotHeld,
            Status::Etimeout => ErrorKind::TimedOut,
            Status::BadResponse
            | Status::NotReady
            | Status::ClientNotInit
            | Status::ClientRemovedByServer
            | Status::ClientMgrNotInit
            | Status::ProtoVersionNegotiationFail => ErrorKind::Disconnected,
            Status::ServerNoResource | Status::Enomem => ErrorKind::NoResource,
            Status::Einval | Status::Eticket | Status::LockNotGet | Status::Easync => {
                ErrorKind::Invalid
            }
            _ => ErrorKind::Other,
        }
    }

    /// Whether a `try_` was refused because the lock is busy.
    #[inline]
    pub fn is_would_block(&self) -> bool {
        self.kind() == ErrorKind::WouldBlock
    }

    /// The name of the operation that failed (`"try_lock"`, `"unlock"`, …).
    #[inline]
    pub fn operation(&self) -> &'static str {
        self.op.as_str()
    }

    /// The I/O error behind a transport failure, if it was kept.
    pub fn io_error(&self) -> Option<&io::Error> {
        self.source.as_ref()
    }

    /// Why TLS failed, when that is what the transport failure was: the server refused this
    /// client's certificate (and its alert says why), the server's certificate is not trusted
    /// or not for this name, or one side speaks TLS and the other plaintext. The same failure
    /// is the inner error of [`Error::io_error`], and its text is the source's.
    pub fn tls_failure(&self) -> Option<&crate::tls::TlsFailure> {
        self.source.as_ref()?.get_ref()?.downcast_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The source is not repeated here: reporters that walk `source()` print it themselves.
        write!(f, "dlock {} failed: {}", self.op.as_str(), self.status)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

impl From<Status> for Error {
    /// An error for `status` with no operation or source attached (for code that mixes the
    /// reference-shaped calls with the native ones and uses `?` on both).
    fn from(status: Status) -> Error {
        Error::new(Op::Unknown, status)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn bad_response_keeps_the_parked_io_error_as_source() {
        let slot = IoSlot::arm();
        park_io_error(io::Error::new(io::ErrorKind::ConnectionReset, "peer gone"));
        let e = slot.error(Op::Unlock, Status::BadResponse);
        assert_eq!(e.kind(), ErrorKind::Disconnected);
        let source = e.source().expect("the I/O error is the source");
        assert_eq!(source.to_string(), "peer gone");
        assert_eq!(
            e.to_string(),
            "dlock unlock failed: DLOCK_BAD_RESPONSE (0x2005)"
        );
    }

    #[test]
    fn a_connect_that_could_not_reach_the_server_keeps_the_reason() {
        let slot = IoSlot::arm();
        park_io_error(crate::tls::TlsFailure::ServerNotTrusted.into_io());
        let e = slot.error(Op::Connect, Status::NotReady);
        assert_eq!(
            e.tls_failure(),
            Some(&crate::tls::TlsFailure::ServerNotTrusted)
        );
        let source = e.source().expect("the reason is the source");
        assert!(
            source
                .to_string()
                .starts_with("server certificate not trusted")
        );
        // Only a connect's NOT_READY is a transport failure.
        let slot = IoSlot::arm();
        park_io_error(io::Error::other("unrelated"));
        assert!(slot.error(Op::Lock, Status::NotReady).source().is_none());
    }

    #[test]
    fn a_stale_io_error_is_not_blamed_for_a_later_call() {
        park_io_error(io::Error::other("earlier call"));
        let slot = IoSlot::arm();
        let e = slot.error(Op::Lock, Status::BadResponse);
        assert!(e.source().is_none());
    }

    #[test]
    fn an_io_error_is_not_attached_to_an_unrelated_status() {
        let slot = IoSlot::arm();
        park_io_error(io::Error::other("recovered from"));
        let e = slot.error(Op::TryLock, Status::Fail);
        assert!(e.source().is_none());
        assert!(e.is_would_block());
    }

    #[test]
    fn fail_means_busy_on_acquire_and_lost_on_unlock() {
        assert_eq!(
            Error::new(Op::TryLock, Status::Fail).kind(),
            ErrorKind::WouldBlock
        );
        assert_eq!(
            Error::new(Op::Unlock, Status::Fail).kind(),
            ErrorKind::NotHeld
        );
        assert_eq!(
            Error::new(Op::Extend, Status::Fail).kind(),
            ErrorKind::NotHeld
        );
        let from: Error = Status::Etimeout.into();
        assert_eq!(from.kind(), ErrorKind::TimedOut);
        assert_eq!(from.status().code(), 0x1002);
    }
}
