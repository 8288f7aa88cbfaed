//! The client's one error: which call failed, the reference's [`Status`], and the I/O error
//! behind it when a transport failure caused it.
//!
//! This module owns [`Error`] and [`ErrorKind`]. Every call of the reference-shaped
//! [`Client`](super::Client) and of the native API ([`super::named`]) returns it, so one `?`
//! carries the whole story from a socket to the caller: the operation is named where the call
//! starts (each call passes its `Op` down to the plumbing that builds the error), and the
//! [`io::Error`] is kept where the transport reported it. The C ABI and code ported from the
//! reference switch on [`Error::status`] (or convert with `Status::from`), which is the status
//! the reference's function of the same name returns.
//!
//! # Why the operation is explicit
//!
//! A status alone does not say what to do: `DLOCK_FAIL` from a `trylock` means "busy", from an
//! `unlock` "not held". An error built from a bare status would have to guess, so there is no
//! `From<Status> for Error`: every error is made by a call that knows what it was doing.
//!
//! # Cost
//!
//! An `Error` is an operation and a status (three bytes) and an `Option<io::Error>` (one
//! pointer; an OS error or a bare kind is stored inline, so building one allocates nothing). A
//! call that fails on the data path without a transport failure — a busy lock, a fair lock's
//! `EAGAIN` — allocates nothing.

use std::fmt;
use std::io;

use dlock_core::Status;

/// What the caller can do about an [`Error`], independent of which operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held by someone else (or, on a fair lock, others are queued before us):
    /// `try_` asked once and was refused. Retry later or wait.
    WouldBlock,
    /// A wait for the lock ran out.
    TimedOut,
    /// The lock is held for a client that died, retained until a recoverer replays its work
    /// and calls `recovery_done` (`DLOCK_LOCK_RETAINED`): retry after the recovery.
    Retained,
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

/// Which client call failed: named after the reference-shaped [`Client`](super::Client) call
/// (the native API's calls are made of those), for [`Error`]'s message and [`ErrorKind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Connect,
    Reinit,
    ReinitDone,
    Deinit,
    Heartbeat,
    ServerStats,
    /// Reading a server's counters without registering (`read_server_stats`).
    ReadServerStats,
    GetLock,
    BatchGetLock,
    ReleaseLock,
    BatchReleaseLock,
    TryLock,
    Lock,
    Unlock,
    Extend,
    /// Turning an exclusive RW grant shared in place.
    Downgrade,
    BatchTryLock,
    BatchUnlock,
    BatchExtend,
    SubmitTryLock,
    SubmitUnlock,
    /// Asking (or no longer asking) for a lock's value block with its grants.
    SetValueBlocks,
    /// Staging the value block an exclusive unlock writes.
    StageValue,
    /// Asking (or no longer asking) for a lock's grants to be retained if the client dies.
    SetRetain,
    /// Asking (or no longer asking) for a lock's grants to be cached.
    SetCacheable,
    /// Asking (or no longer asking) for a lock's waits to end at a revoke.
    SetWakeOnRevoke,
    /// Reading what the server sent unasked (revokes).
    PollEvents,
    /// Releasing a dead client's retained locks.
    RecoveryDone,
    /// Listing retained locks.
    ListRetained,
    /// Completing a pipelined batch with nothing in flight (a batch's own failure carries the
    /// batch's operation).
    Complete,
    /// Polling with no asynchronous operation outstanding (an outstanding one's failure
    /// carries its own operation).
    LockResultCheck,
    UpdateAllLocks,
    ObjectCreate,
    ObjectGet,
    ObjectRelease,
    ObjectDestroy,
    Faa,
    Cas,
    Snapshot,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Connect => "connect",
            Op::Reinit => "reinit",
            Op::ReinitDone => "reinit_done",
            Op::Deinit => "deinit",
            Op::Heartbeat => "heartbeat",
            Op::ServerStats => "server_stats",
            Op::ReadServerStats => "read_server_stats",
            Op::GetLock => "get_lock",
            Op::BatchGetLock => "batch_get_lock",
            Op::ReleaseLock => "release_lock",
            Op::BatchReleaseLock => "batch_release_lock",
            Op::TryLock => "trylock",
            Op::Lock => "lock",
            Op::Unlock => "unlock",
            Op::Extend => "lock_extend",
            Op::Downgrade => "downgrade",
            Op::BatchTryLock => "batch_trylock",
            Op::BatchUnlock => "batch_unlock",
            Op::BatchExtend => "batch_lock_extend",
            Op::SubmitTryLock => "submit_trylock",
            Op::SubmitUnlock => "submit_unlock",
            Op::SetValueBlocks => "set_value_blocks",
            Op::StageValue => "stage_value",
            Op::SetRetain => "set_retain",
            Op::SetCacheable => "set_cacheable",
            Op::SetWakeOnRevoke => "set_wake_on_revoke",
            Op::PollEvents => "poll_events",
            Op::RecoveryDone => "recovery_done",
            Op::ListRetained => "list_retained",
            Op::Complete => "complete",
            Op::LockResultCheck => "lock_result_check",
            Op::UpdateAllLocks => "update_all_locks",
            Op::ObjectCreate => "atomic64_create",
            Op::ObjectGet => "atomic64_get",
            Op::ObjectRelease => "atomic64_release",
            Op::ObjectDestroy => "atomic64_destroy",
            Op::Faa => "atomic64_faa",
            Op::Cas => "atomic64_cas",
            Op::Snapshot => "atomic64_snapshot",
        }
    }

    /// Whether the operation asks for a grant (a refusal means "busy", not "lost").
    fn acquires(self) -> bool {
        matches!(
            self,
            Op::TryLock | Op::Lock | Op::BatchTryLock | Op::SubmitTryLock
        )
    }

    /// This operation failed with `status`, no transport failure behind it.
    #[inline]
    pub(crate) fn err(self, status: Status) -> Error {
        Error {
            op: self,
            status,
            source: None,
        }
    }

    /// This operation failed because the transport did: the reference's `BAD_RESPONSE` (the
    /// caller reinits), with `e` as the source.
    #[cold]
    pub(crate) fn io(self, e: io::Error) -> Error {
        self.io_as(Status::BadResponse, e)
    }

    /// This operation failed with `status` because of the transport failure `e` (a connect
    /// that could not reach the server is the reference's `NOT_READY`).
    #[cold]
    pub(crate) fn io_as(self, status: Status, e: io::Error) -> Error {
        tracing::debug!(op = self.as_str(), error = %e, "transport failure");
        Error {
            op: self,
            status,
            source: Some(e),
        }
    }
}

/// The error of every client call, reference-shaped and native.
///
/// Carries the reference's [`Status`] ([`Error::status`], numeric code via
/// [`Status::code`]), the call that failed ([`Error::operation`]), what the caller can do about
/// it ([`Error::kind`]) and, when a transport failure caused it, the [`io::Error`] as
/// [`std::error::Error::source`] — for TLS, why ([`Error::tls_failure`]). It compares equal to
/// the [`Status`] it carries (`assert_eq!(err, Status::Fail)`).
#[derive(Debug)]
pub struct Error {
    op: Op,
    status: Status,
    source: Option<io::Error>,
}

impl Error {
    /// The reference's status for this failure (never `Success`): what the reference's
    /// function of the same name returns, and what the C ABI returns.
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
            Status::LockRetained => ErrorKind::Retained,
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

    /// The name of the [`Client`](super::Client) call that failed (`"trylock"`, `"unlock"`,
    /// `"connect"`, …); a native call reports the client call it was made of.
    #[inline]
    pub fn operation(&self) -> &'static str {
        self.op.as_str()
    }

    /// The I/O error behind a transport failure, if there was one.
    pub fn io_error(&self) -> Option<&io::Error> {
        self.source.as_ref()
    }

    /// Why TLS failed, when that is what the transport failure was: the server refused this
    /// client's certificate (and its alert says why), the server's certificate is not trusted
    /// or not for this name, or one side speaks TLS and the other plaintext. The same failure
    /// is the inner error of [`Error::io_error`], and its text is the source's.
    #[cfg(feature = "tls")]
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

impl PartialEq<Status> for Error {
    fn eq(&self, status: &Status) -> bool {
        self.status == *status
    }
}

impl From<Error> for Status {
    /// The status alone, for code that answers in statuses (the C ABI, ported code): the
    /// operation and the I/O source are dropped.
    #[inline]
    fn from(e: Error) -> Status {
        e.status
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_transport_failure_is_bad_response_with_the_io_error_as_source() {
        let e = Op::Unlock.io(io::Error::new(io::ErrorKind::ConnectionReset, "peer gone"));
        assert_eq!(e.kind(), ErrorKind::Disconnected);
        assert_eq!(e, Status::BadResponse);
        let source = e.source().expect("the I/O error is the source");
        assert_eq!(source.to_string(), "peer gone");
        assert_eq!(
            e.to_string(),
            "dlock unlock failed: DLOCK_BAD_RESPONSE (0x2005)"
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_connect_that_could_not_reach_the_server_keeps_the_reason() {
        let reason = crate::tls::TlsFailure::ServerNotTrusted.into_io();
        let e = Op::Connect.io_as(Status::NotReady, reason);
        assert_eq!(e.kind(), ErrorKind::Disconnected);
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
    }

    #[test]
    fn fail_means_busy_on_acquire_and_lost_on_unlock() {
        for op in [Op::TryLock, Op::Lock, Op::BatchTryLock, Op::SubmitTryLock] {
            assert_eq!(op.err(Status::Fail).kind(), ErrorKind::WouldBlock, "{op:?}");
            assert_eq!(op.err(Status::Eagain).kind(), ErrorKind::WouldBlock);
        }
        for op in [Op::Unlock, Op::Extend, Op::BatchUnlock, Op::BatchExtend] {
            assert_eq!(op.err(Status::Fail).kind(), ErrorKind::NotHeld, "{op:?}");
        }
        let timed_out = Op::Lock.err(Status::Etimeout);
        assert_eq!(timed_out.kind(), ErrorKind::TimedOut);
        assert_eq!(Status::from(timed_out).code(), 0x1002);
    }

    #[test]
    fn an_error_without_a_transport_failure_has_no_source_and_stays_small() {
        let e = Op::TryLock.err(Status::Fail);
        assert!(e.source().is_none() && e.io_error().is_none());
        // An operation and a status beside one pointer: no box, no string.
        assert_eq!(size_of::<Error>(), 2 * size_of::<usize>());
    }
}
