//! The lock manager's rules: cached grants revoked on demand, lock value blocks and locks
//! retained for recovery, as pure transitions with no I/O, no clock and no allocation.
//!
//! A lock *service* answers every lock and unlock with a message. The global lock managers
//! that engines run on — the VMS distributed lock manager and the Linux DLM after it, GFS2's
//! glocks on top of the Linux DLM, Db2 pureScale, PolarDB-MP's Lock Fusion — win their
//! throughput by not asking: a node keeps a lock after its transaction is done, reuses it
//! locally, and gives it back only when the manager tells it another node wants it (the DLM's
//! *blocking AST*, "BAST"). They carry a few bytes with each lock (the DLM's *lock value
//! block*, LVB) and keep a dead writer's locks until its work is replayed. This module holds
//! those rules, so that the server, the client library and the simulators run the same ones.
//!
//! | file        | owns                                                                          |
//! |-------------|-------------------------------------------------------------------------------|
//! | `grant.rs`  | [`GrantState`]: what a client holds on a lock, 4 bits in the holds grid        |
//! | `revoke.rs` | who is revoked when a request conflicts, the minimum hold and the revoke timeout |
//! | `contention.rs` | [`GrantAs`]: a lock asked back recently is granted plain, and its holder told at once; a grant on a lock fought over just before has no minimum hold |
//! | `retain.rs` | what a death keeps, what a retaining client's slot is, `recovery_done`         |
//! | `value.rs`  | [`ValueBlock`] and the per-lock [`LockValue`] with its write/invalidate rules  |
//! | `cache.rs`  | [`CachedLock`]: the client's side of one cached grant                         |
//! | `demote.rs` | [`Demotion`]: a holder stops caching a lock it keeps being asked for, for a while |
//! | `payback.rs` | [`Payback`]: a holder whose cached grants are mostly asked back before they pay stops caching fresh grants |
//! | `trust.rs`  | [`Trust`]: how long a client may use its cached grants without an answer on its revokes' channel |
//!
//! The wire forms (the request flags byte, the `Downgrade` op, event messages carrying revokes,
//! value trailers, `RecoveryDone` and `ListRetained`) are in [`crate::proto`].
//!
//! # How the parts fit (one conflict, end to end)
//!
//! 1. Client B asks for a lock in a mode that conflicts with client A's *cached* grant. The
//!    server lists the lock's holders with their [`GrantState`]s and calls [`decide`]: A is to
//!    be revoked now (or at the end of its minimum hold), and B's request waits (`wait_ms > 0`)
//!    or fails at once — the revoke goes out either way, as the Linux DLM's `NOQUEUEBAST` does
//!    for a request that may not queue.
//! 2. The server marks A's grant as revoking ([`GrantState::with_revoke_sent`]: at most one
//!    outstanding revoke per holder and lock) and queues an event for A: the lock, the mode B
//!    wants and the lock's fencing token at that moment.
//! 3. A's library ([`CachedLock::on_revoke`]) stops new local users, and when the last local
//!    user is done gives the lock back (unlock) or, if B only wants to read, downgrades it.
//!    An exclusive holder may write the lock's [`ValueBlock`] as it does ([`LockValue::release`]).
//! 4. The give-back frees the lock; B's parked request is retried by the existing wake-up path
//!    and granted, with the value block if it asked for it.
//! 5. If A ignores the revoke for `revoke_timeout_ms`, [`decide`] says its grant lapses: the
//!    server releases it as if A's lease had run out, and A's next operation on it fails.
//!
//! If A dies instead, its grants marked retain-on-death stay held as *retained*
//! ([`retain::at_departure`]), B is told [`Status::LockRetained`](crate::Status::LockRetained),
//! and the locks go only when a recoverer says `recovery_done` for A
//! ([`retain::recovery_done`]).

pub mod cache;
pub mod contention;
pub mod demote;
pub mod grant;
pub mod payback;
pub mod retain;
pub mod revoke;
pub mod trust;
pub mod value;

pub use cache::CachedLock;
pub use contention::GrantAs;
pub use demote::Demotion;
pub use grant::{CorruptGrant, GrantState};
pub use payback::Payback;
pub use revoke::{Answer, Holder, HolderAction, Request, Timing, Verdict, decide};
pub use trust::{Lost, Trust};
pub use value::{LockValue, VALUE_BLOCK_LEN, ValueBlock};

use crate::ids::Mode;

/// Whether a grant in mode `held` keeps a request for `wanted` from being granted beside it:
/// only two shared grants coexist (the compatibility matrix of the DLM's PR and EX modes).
#[inline]
#[must_use]
pub const fn conflicts(held: Mode, wanted: Mode) -> bool {
    matches!(held, Mode::Exclusive) || matches!(wanted, Mode::Exclusive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_two_shared_grants_are_compatible() {
        use Mode::{Exclusive as EX, Shared as SH};
        assert!(!conflicts(SH, SH));
        assert!(conflicts(SH, EX));
        assert!(conflicts(EX, SH));
        assert!(conflicts(EX, EX));
    }
}
