//! Lock words: one module per lock kind, each a set of pure transitions.
//!
//! Every transition is a function `(old state, request, now_ms) -> Outcome` that neither reads a
//! clock nor touches memory: the data thread loads the slot, calls the transition and stores the
//! state it gets back. That is what makes every (state, operation) pair testable on its own and
//! every run replayable. An [`Outcome`] carries the state after the operation even when the
//! operation fails (the reference returns the lock word on failure too), the status to report,
//! and an [`Effect`] that tells the server what changed hands, so it can keep per-client
//! bookkeeping and issue fencing tokens without re-deriving it from the word.
//!
//! Times are a monotonic server tick in milliseconds; expiries are absolute ticks.

pub mod atomic;
pub mod fair;
pub mod rw;

use crate::ids::{Mode, Ticket};
use crate::status::Status;

/// What a transition did to the set of holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Nothing changed hands (failures, re-validation, extend).
    None,
    /// The caller was granted the lock in this mode. `preempted` is true when the grant
    /// displaced earlier holders or queued tickets (an expired atomic owner, a fair-lock timeout
    /// preemption): the server must forget what it knew about them.
    Granted {
        /// The mode granted.
        mode: Mode,
        /// Whether earlier holders were evicted by this grant.
        preempted: bool,
    },
    /// The caller was queued (fair lock) and holds this ticket.
    Queued(Ticket),
    /// The caller gave up a grant in this mode.
    Released(Mode),
    /// The caller's grant was extended (or re-validated, for an extension by 0).
    Extended,
    /// The caller's exclusive grant became a shared one (`LockOp::Downgrade`).
    Downgraded,
}

/// The result of one transition: the state after it, the status, and the effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Outcome<S> {
    /// The lock state after the operation (unchanged on failure).
    pub state: S,
    /// What to report to the client.
    pub status: Status,
    /// What changed hands.
    pub effect: Effect,
}

impl<S> Outcome<S> {
    /// A refusal that leaves the state as it was.
    #[inline]
    pub const fn refused(state: S, status: Status) -> Self {
        Self {
            state,
            status,
            effect: Effect::None,
        }
    }

    /// A success with the given effect.
    #[inline]
    pub const fn ok(state: S, effect: Effect) -> Self {
        Self {
            state,
            status: Status::Success,
            effect,
        }
    }
}

/// `now + expire`, saturating: an absurd expiry becomes "never", not a wrapped past tick.
#[inline]
pub const fn deadline(now_ms: u64, expire_ms: u32) -> u64 {
    now_ms.saturating_add(expire_ms as u64)
}
