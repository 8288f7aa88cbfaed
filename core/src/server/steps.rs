//! One lock command's transition in the terms of its slot: the word of each kind, and the
//! fair lock's owner beside it (`data.rs` loads the slot and stores what these return).

use crate::ids::{ClientId, Mode, Ticket};
use crate::manager::GrantState;
use crate::proto::{LockCommand, LockOp};
use crate::status::Status;
use crate::table::LockCell;
use crate::word::{Effect, Outcome, atomic, fair, rw};

/// A transition's result in the slot's own terms (word and fair-lock owner).
pub(super) struct Step {
    pub(super) word: u128,
    pub(super) ext: u32,
    pub(super) status: Status,
    pub(super) effect: Effect,
    /// The fair-lock ticket this request was served under, reported back in the word.
    pub(super) ticket: Option<Ticket>,
    /// The caller's fair-lock ticket is void (`fair::Served::ticket_void`).
    pub(super) ticket_void: bool,
    /// Every other client's fair-lock grant and ticket is void (`fair::Served::others_void`).
    pub(super) others_void: bool,
}

impl Step {
    /// The step of an atomic or RW transition (no fair-lock owner, no ticket).
    pub(super) fn from_word<W: Into<u128>>(o: Outcome<W>) -> Step {
        Step {
            word: o.state.into(),
            ext: 0,
            status: o.status,
            effect: o.effect,
            ticket: None,
            ticket_void: false,
            others_void: false,
        }
    }

    pub(super) fn refused(cell: &LockCell, status: Status) -> Step {
        Step {
            word: cell.word,
            ext: cell.ext,
            status,
            effect: Effect::None,
            ticket: None,
            ticket_void: false,
            others_void: false,
        }
    }
}

#[inline]
pub(super) fn atomic_step(
    cell: &LockCell,
    me: ClientId,
    c: &LockCommand,
    hold: GrantState,
    now_ms: u64,
) -> Step {
    let w = atomic::AtomicWord::from_bits(cell.word);
    let o = match c.op {
        // A lock that expires the moment it is taken is a client bug, not a request.
        LockOp::TryExclusive if c.expire_ms == 0 => return Step::refused(cell, Status::Einval),
        LockOp::TryExclusive => atomic::try_lock(w, me, c.expire_ms, now_ms),
        LockOp::UnlockExclusive if hold.grant_mode() != Some(Mode::Exclusive) => {
            return Step::refused(cell, Status::Fail);
        }
        LockOp::UnlockExclusive => atomic::unlock(w, me),
        LockOp::ExtendExclusive => atomic::extend(w, me, c.expire_ms, now_ms),
        _ => return Step::refused(cell, Status::Einval),
    };
    Step::from_word(o)
}

#[inline]
pub(super) fn rw_step(
    cell: &LockCell,
    me: ClientId,
    c: &LockCommand,
    hold: GrantState,
    now_ms: u64,
) -> Step {
    let w = rw::RwWord::from_bits(cell.word);
    let reader = hold.grant_mode() == Some(Mode::Shared);
    let o = match c.op {
        LockOp::TryExclusive => rw::try_exclusive(w, me, now_ms),
        LockOp::UnlockExclusive if hold.grant_mode() != Some(Mode::Exclusive) => {
            return Step::refused(cell, Status::Fail);
        }
        LockOp::UnlockExclusive => rw::unlock_exclusive(w, me),
        LockOp::TryShared => rw::try_shared(w, reader, now_ms),
        LockOp::UnlockShared => rw::unlock_shared(w, reader),
        LockOp::ExtendExclusive | LockOp::ExtendShared => rw::extend(w),
        LockOp::Downgrade if hold.grant_mode() != Some(Mode::Exclusive) => {
            return Step::refused(cell, Status::Fail);
        }
        LockOp::Downgrade => rw::downgrade(w, me),
        LockOp::TicketExclusive | LockOp::TicketShared => {
            return Step::refused(cell, Status::Einval);
        }
    };
    Step::from_word(o)
}

#[inline]
pub(super) fn fair_step(
    cell: &LockCell,
    me: ClientId,
    c: &LockCommand,
    hold: GrantState,
    now_ms: u64,
) -> Step {
    let s = fair::FairLock {
        word: fair::FairWord::from_bits(cell.word),
        owner: cell.ext,
    };
    let req = match c.op {
        LockOp::TryExclusive | LockOp::TryShared => fair::Request::First,
        LockOp::TicketExclusive | LockOp::TicketShared => fair::Request::Retry(c.ticket),
        LockOp::UnlockExclusive | LockOp::UnlockShared => fair::Request::Unlock(c.ticket),
        LockOp::ExtendExclusive | LockOp::ExtendShared => fair::Request::Extend(c.ticket),
        // The fair word's ticket counters have no step from an exclusive turn to a reader's
        // that keeps a queued writer out: a cached fair holder gives back with an unlock.
        LockOp::Downgrade => return Step::refused(cell, Status::Einval),
    };
    let caller = fair::Caller { id: me, hold };
    let served = fair::serve(s, caller, c.op.mode(), req, c.expire_ms, now_ms);
    let o = served.outcome;
    Step {
        word: o.state.word.into_bits(),
        ext: o.state.owner,
        status: o.status,
        effect: o.effect,
        ticket: served.ticket,
        ticket_void: served.ticket_void,
        others_void: served.others_void,
    }
}
