//! The fair lock: FIFO tickets, exclusive or shared, with expiry and timeout preemption.
//!
//! Algorithm: the reference's fair lock (§2.3 of `shared/reference/dlock-reference.md`), with
//! time on the server's monotonic millisecond tick instead of wall-clock seconds, so the
//! hand-off window is [`HANDOFF_MS`] instead of 2 s. This module owns the word and its
//! transitions only; which client holds which ticket is the server's bookkeeping, fed by the
//! [`Effect`] of each outcome.
//!
//! # Layout (16-byte public word, plus the server-only `owner`)
//!
//! | bits    | field        | meaning                                                       |
//! |---------|--------------|---------------------------------------------------------------|
//! | 0..16   | `nx`         | completed exclusive grants ("now serving")                    |
//! | 16..32  | `ns`         | completed shared grants                                       |
//! | 32..48  | `mx`         | next exclusive ticket                                         |
//! | 48..64  | `ms`         | next shared ticket                                            |
//! | 64..80  | `rms`        | while `rflag`, shared tickets before this one are void        |
//! | 80      | `rflag`      | a timeout preemption happened                                 |
//! | 81..87  | `rcnt`       | current readers, at most [`FAIR_READERS_MAX`]                 |
//! | 87      | reserved     | zero                                                          |
//! | 88..128 | `timeout_ms` | expiry of the current grant(s), or end of the hand-off window |
//!
//! [`FairLock::owner`] is the exclusive holder's client id (0 when none); the reference keeps it
//! in an 8-byte server-only extension of the slot and never sends it to clients.
//!
//! A ticket `(tx, ts)` is `(mx, ms)` as the caller's first attempt found them, before its own
//! increment. It is the caller's turn when `tx == nx` (and, exclusive, `ts == ns`): every
//! exclusive ticket before it was served, and for a writer every shared one too. All counters
//! run modulo 2^16 and compare with [`ticket_before`]. `timeout_ms` has 40 bits, so ticks must
//! stay below 2^40 ms (about 34 years of server uptime); deadlines clamp to [`TIMEOUT_MS_MAX`].
//!
//! # Transitions
//!
//! `c` is the caller, `t` its expiry and `(tx, ts)` its ticket. "Passed" is `tx` before `nx`,
//! or for a writer `ts` before `ns`, or for a reader `rflag` and `ts` before `rms`. "Late" is
//! `now > timeout`; `dl` is `now + t`. A preemption sets `nx = tx, ns = rms = ts, rflag = 1,
//! timeout = dl` and reports `Granted { preempted: true }`. "Hand-off" sets
//! `timeout = now + HANDOFF_MS`; "reset" clears `rflag` once `ns − rms ≥ RFLAG_RESET`. A first
//! attempt that queues returns the ticket `(mx, ms)` from before its increment.
//!
//! | state                                        | operation            | new state                                    | status    |
//! |----------------------------------------------|----------------------|----------------------------------------------|-----------|
//! | `mx−nx` or `ms−ns` ≥ `QUEUE_MAX`             | try_lock(any)        | unchanged                                    | Fail      |
//! | `owner = 0, nx = mx, ns = ms`                | try_lock(c, Ex, t)   | `mx+1`, owner `c`, timeout `dl`              | Success   |
//! | otherwise                                    | try_lock(c, Ex, t)   | `mx+1`                                       | Eagain    |
//! | `owner = 0, nx = mx, rcnt < 63`              | try_lock(c, Sh, t)   | `ms+1, rcnt+1`, timeout `max(timeout, dl)`   | Success   |
//! | otherwise                                    | try_lock(c, Sh, t)   | `ms+1`                                       | Eagain    |
//! | passed                                       | try_ticket(any)      | unchanged                                    | Fail      |
//! | `owner = 0, tx = nx, ts = ns`                | try_ticket(c, Ex, t) | owner `c`, timeout `dl`                      | Success   |
//! | `owner = 0, tx = nx, rcnt < 63`              | try_ticket(c, Sh, t) | `rcnt+1`, timeout `max(timeout, dl)`         | Success   |
//! | not the caller's turn, late                  | try_ticket(c, Ex, t) | preemption, `rcnt = 0`, owner `c`            | Preempted |
//! | not the caller's turn, late                  | try_ticket(c, Sh, t) | preemption, `rcnt = 1`, owner 0              | Preempted |
//! | not the caller's turn, not late              | try_ticket(any)      | unchanged                                    | Eagain    |
//! | `owner ∈ {c, 0}, nx = tx, ns = ts`           | unlock(c, Ex)        | `nx+1`, owner 0, `rflag = 0`, hand-off       | Success   |
//! | `owner = 0`, not passed, `nx = tx, rcnt > 0` | unlock(c, Sh)        | `ns+1, rcnt−1`, hand-off if 0 readers, reset | Success   |
//! | otherwise                                    | unlock(any)          | unchanged                                    | Fail      |
//! | `owner ∈ {c, 0}, tx = nx`, not passed        | extend(c, Sh, t)     | timeout `max(timeout, dl)` unless `t = 0`    | Success   |
//! | the same and `ts = ns`                       | extend(c, Ex, t)     | timeout `max(timeout, dl)` unless `t = 0`    | Success   |
//! | otherwise                                    | extend(any)          | unchanged                                    | Fail      |
//!
//! Only a ticket retry can preempt; a first attempt always just queues. A preempted holder is
//! never told: its unlock or extend fails on the counters and it starts over. An abandoned
//! ticket stalls the queue until the hand-off window (or the holder's expiry) has passed and a
//! later ticket preempts past it.
//!
//! # Weaknesses kept from the reference
//!
//! The word behaves exactly as the reference's, including these; the server, which knows which
//! client holds which ticket, guards them ([`serve`], below).
//! - A ticket that was never issued (`tx` after `mx`) is not refused. A late retry with one
//!   moves `nx` past `mx`, after which every first attempt fails as "queue full". The server
//!   should accept only tickets it handed to that client.
//! - Once [`RFLAG_RESET`] shared unlocks have cleared `rflag`, a shared ticket the preemption
//!   voided is valid again. Its grant and unlock count in `ns` a second time, so a queued
//!   writer's `ts == ns` can match while a reader still holds: an exclusive grant checks
//!   `ns`, not `rcnt`. A client that polls slower than 50 reader cycles can hit this
//!   (`rflag_reset_revives_a_voided_ticket_as_in_the_reference` shows it). The server should
//!   drop the tickets a preemption passes.
//! - A shared preemption on the current `nx` (which needs 63 readers) voids only tickets before
//!   its own; a reader granted with a later ticket keeps its grant, uncounted in `rcnt`, and its
//!   unlock counts down the preemptor's instead.
//!
//! # The server's guards
//!
//! The server runs every request through [`serve`], which applies what it knows of the caller
//! — its holds record on this lock ([`Hold`]: nothing, a grant in a mode, or a ticket) — before
//! and after the transitions above. `x` is the request's mode, `t` its expiry.
//!
//! | caller's record          | request                                  | then                                             |
//! |--------------------------|------------------------------------------|--------------------------------------------------|
//! | nothing                  | first attempt, `t = 0`                   | `Einval`: a grant that expires as it is made     |
//! | nothing                  | first attempt                            | `try_lock`; the reply carries its ticket         |
//! | a ticket                 | first attempt                            | `Eticket`: retry with the ticket                 |
//! | a grant in `x`           | first attempt                            | `AlreadyLocked` (the client counts re-entry)     |
//! | a grant in the other mode| first attempt                            | `Einval`: no upgrade or downgrade                |
//! | any                      | retry, `t = 0`                           | `Einval`                                         |
//! | nothing                  | retry                                    | `Fail`: passed, abandoned, or never the caller's |
//! | a grant                  | retry                                    | `Einval`                                         |
//! | a ticket                 | retry with a ticket the lock never issued| `Fail` (guard 1)                                 |
//! | a ticket                 | retry                                    | `try_ticket`                                     |
//! | a ticket                 | unlock                                   | the ticket is abandoned; the word is unchanged   |
//! | a grant in `x`           | unlock, extend                           | `unlock`, `extend`                               |
//! | otherwise                | unlock, extend                           | `Fail`                                           |
//! | any                      | a writer granted without preemption while `rcnt > 0` | `Eagain`, queued under its ticket (guard 2) |
//!
//! | outcome                           | then the server's records                                       |
//! |-----------------------------------|-----------------------------------------------------------------|
//! | a retry refused with `Fail`       | the caller's ticket is void: its record forgets it              |
//! | a grant that preempted            | every other client's grant and ticket here is void (guard 3)    |
//!
//! - **Guard 1**: a ticket retry needs a ticket this client was given (its record) that the
//!   lock really issued: a ticket beyond `mx`/`ms` would move `nx` past `mx` on a late retry and
//!   wedge the queue. The half in the caller's own mode must have been taken; the other half can
//!   be at most the next ticket of that mode (nothing issued yet) but never beyond it.
//! - **Guard 2**: a writer is never granted while `rcnt` counts readers. The reference's
//!   exclusive grant checks the shared counters, not `rcnt`, and a voided shared ticket revived
//!   after `rflag` resets can make them agree while a reader still holds; the writer waits its
//!   turn instead (a first attempt still takes its ticket, as a queued one would).
//! - **Guard 3**: after a timeout preemption every other client's grant and ticket on the lock
//!   is forgotten, so a displaced reader cannot unlock (and count down) the preemptor's grant
//!   and a voided ticket cannot come back to life. Voiding *every* ticket, not only those the
//!   preemption passed, is deliberate: the server does not store which ticket each client
//!   holds, and a shared ticket the reference voids comes back to life once `rflag` resets
//!   ([`RFLAG_RESET`] shared unlocks later), after which its unlock pushes `ns` past `ms` and
//!   wedges the lock for good. Waiters whose ticket is voided queue again (parked ones
//!   automatically); a preemption only happens when a holder overran its lease, so this trades
//!   some order in a failure case for a lock that cannot wedge.
//!
//! A retry with a ticket the record no longer has is answered `Fail`, the word's and the
//! reference's answer to a passed ticket, so the client's record starts over.
//!
//! What the server cannot check is the mode a ticket was issued in: the holds record has two
//! bits per client and lock, all four values taken (none, exclusive, shared, ticketed), and a
//! third bit would cost 6.4 MB of region at the default capacities. The client's record sends
//! every retry and every unlock of a ticket in the ticket's own mode (`LocalLock::unlock`
//! takes no mode), so the reference's `Eticket` for a mismatch is answered there. A peer that
//! sends the other mode anyway gains little: an unlock while ticketed abandons the caller's
//! own ticket and changes nothing in the word, so either mode abandons the same thing, and a
//! retry of an exclusive ticket as a shared one only hurts the queue's order on a lock it has a
//! reference to, until the next hand-off window.

use bitfield_struct::bitfield;

use super::{Effect, Outcome, deadline};
use crate::config::FAIR_READERS_MAX;
use crate::ids::{ClientId, Mode, Ticket};
use crate::status::Status;
use crate::table::Hold;

/// Tickets outstanding per mode before first attempts fail (`mx − nx`, `ms − ns`). It keeps the
/// distance between any live ticket and `nx`/`ns` inside the half range [`ticket_before`] needs.
pub const QUEUE_MAX: u16 = 0x7FFF;
/// How long after an unlock the next ticket has to claim its turn before a later ticket may
/// preempt past it (the reference's `FAIR_WAIT_TIME`, 2 s).
pub const HANDOFF_MS: u32 = 2_000;
/// Shared unlocks after a preemption (`ns − rms`) after which `rflag` is cleared
/// (the reference's `FAIR_RST_TH`).
pub const RFLAG_RESET: u16 = 50;
/// The largest tick `timeout_ms` can hold.
pub const TIMEOUT_MS_MAX: u64 = (1 << 40) - 1;

/// `a` is strictly before `b` modulo 2^16: `b` is 1 to 0x7FFF steps ahead of `a`. Counters wrap,
/// so plain `<` would call the first ticket after a wrap (0) older than 0xFFFF; the half-range
/// test is correct as long as live tickets stay within [`QUEUE_MAX`] of each other.
#[inline]
pub const fn ticket_before(a: u16, b: u16) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000
}

/// The fair lock's public word.
#[bitfield(u128)]
#[derive(PartialEq, Eq)]
pub struct FairWord {
    /// Completed exclusive grants ("now serving").
    pub nx: u16,
    /// Completed shared grants.
    pub ns: u16,
    /// Next exclusive ticket.
    pub mx: u16,
    /// Next shared ticket.
    pub ms: u16,
    /// While `rflag` is set, shared tickets before this one are void.
    pub rms: u16,
    /// A timeout preemption happened.
    pub rflag: bool,
    /// Current readers.
    #[bits(6)]
    pub rcnt: u8,
    #[bits(1)]
    __: u8,
    /// Absolute tick (ms): expiry of the current grant(s) or end of the hand-off window.
    #[bits(40)]
    pub timeout_ms: u64,
}

static_assertions::assert_eq_size!(FairWord, u128);
static_assertions::const_assert_eq!(FAIR_READERS_MAX as usize, (1 << FairWord::RCNT_BITS) - 1);
static_assertions::const_assert_eq!(TIMEOUT_MS_MAX, (1 << FairWord::TIMEOUT_MS_BITS) - 1);

/// The whole fair-lock state: the public word and the server-only exclusive owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FairLock {
    /// The 16 bytes the reference returns to clients.
    pub word: FairWord,
    /// Client id of the exclusive holder; 0 when none (shared, free or preempted).
    pub owner: u32,
}

impl FairWord {
    /// The ticket counters (`mx`, `ms`) as a ticket: what a first attempt on this word is
    /// given; in the word a grant returns, the ticket the grant is held under.
    #[inline]
    pub const fn counters(self) -> Ticket {
        Ticket {
            exclusive: self.mx(),
            shared: self.ms(),
        }
    }
}

impl FairLock {
    /// Nothing held and nothing queued.
    #[inline]
    pub const fn is_idle(self) -> bool {
        let w = self.word;
        self.owner == 0 && w.rcnt() == 0 && w.nx() == w.mx() && w.ns() == w.ms()
    }

    /// The ticket a first attempt on this state gets, granted or queued.
    #[inline]
    pub const fn next_ticket(self) -> Ticket {
        self.word.counters()
    }
}

/// `now + expire_ms`, clamped to what the word can hold.
#[inline]
const fn timeout_at(now_ms: u64, expire_ms: u32) -> u64 {
    let t = deadline(now_ms, expire_ms);
    if t > TIMEOUT_MS_MAX {
        TIMEOUT_MS_MAX
    } else {
        t
    }
}

/// Whether shared ticket `ts` was voided by a timeout preemption.
#[inline]
const fn shared_voided(w: FairWord, ts: u16) -> bool {
    w.rflag() && ticket_before(ts, w.rms())
}

#[inline]
const fn granted(mode: Mode, preempted: bool) -> Effect {
    Effect::Granted { mode, preempted }
}

/// Not granted yet: the state (changed, for a first attempt) and the caller's ticket.
#[inline]
const fn queued(state: FairLock, ticket: Ticket) -> Outcome<FairLock> {
    Outcome {
        state,
        status: Status::Eagain,
        effect: Effect::Queued(ticket),
    }
}

/// First attempt: a grant if nothing stands in the way, otherwise a ticket to retry with.
/// Either way the caller's ticket is [`FairLock::next_ticket`] of `s`.
#[inline]
pub fn try_lock(
    s: FairLock,
    me: ClientId,
    mode: Mode,
    expire_ms: u32,
    now_ms: u64,
) -> Outcome<FairLock> {
    let w = s.word;
    if w.mx().wrapping_sub(w.nx()) >= QUEUE_MAX || w.ms().wrapping_sub(w.ns()) >= QUEUE_MAX {
        return Outcome::refused(s, Status::Fail);
    }
    let ticket = s.next_ticket();
    let no_writer = s.owner == 0 && w.nx() == w.mx();
    match mode {
        Mode::Exclusive => {
            let w = w.with_mx(w.mx().wrapping_add(1));
            if no_writer && w.ns() == w.ms() {
                let word = w.with_timeout_ms(timeout_at(now_ms, expire_ms));
                return Outcome::ok(
                    FairLock {
                        word,
                        owner: me.get(),
                    },
                    granted(mode, false),
                );
            }
            queued(FairLock { word: w, ..s }, ticket)
        }
        Mode::Shared => {
            let w = w.with_ms(w.ms().wrapping_add(1));
            if no_writer && w.rcnt() < FAIR_READERS_MAX {
                let timeout = w.timeout_ms().max(timeout_at(now_ms, expire_ms));
                let word = w.with_rcnt(w.rcnt() + 1).with_timeout_ms(timeout);
                return Outcome::ok(FairLock { word, ..s }, granted(mode, false));
            }
            queued(FairLock { word: w, ..s }, ticket)
        }
    }
}

/// Retry with a ticket: a grant on the caller's turn, a preemption past whoever stalls the
/// queue once their time is up, `Eagain` while it is not, `Fail` if the ticket was passed.
#[inline]
pub fn try_ticket(
    s: FairLock,
    me: ClientId,
    mode: Mode,
    ticket: Ticket,
    expire_ms: u32,
    now_ms: u64,
) -> Outcome<FairLock> {
    let w = s.word;
    let (tx, ts) = (ticket.exclusive, ticket.shared);
    let deadline = timeout_at(now_ms, expire_ms);
    match mode {
        Mode::Exclusive => {
            if ticket_before(tx, w.nx()) || ticket_before(ts, w.ns()) {
                return Outcome::refused(s, Status::Fail);
            }
            if s.owner == 0 && tx == w.nx() && ts == w.ns() {
                let word = w.with_timeout_ms(deadline);
                return Outcome::ok(
                    FairLock {
                        word,
                        owner: me.get(),
                    },
                    granted(mode, false),
                );
            }
        }
        Mode::Shared => {
            if ticket_before(tx, w.nx()) || shared_voided(w, ts) {
                return Outcome::refused(s, Status::Fail);
            }
            if s.owner == 0 && tx == w.nx() && w.rcnt() < FAIR_READERS_MAX {
                let timeout = w.timeout_ms().max(deadline);
                let word = w.with_rcnt(w.rcnt() + 1).with_timeout_ms(timeout);
                return Outcome::ok(FairLock { word, ..s }, granted(mode, false));
            }
        }
    }
    // At the expiry tick itself the holders' grants still stand (as for the atomic lock).
    if now_ms <= w.timeout_ms() {
        return queued(s, ticket);
    }
    // Timeout preemption: the caller becomes the only holder; every ticket before it is passed
    // and, while `rflag` is set, every shared ticket before `ts` is void.
    let (rcnt, owner) = match mode {
        Mode::Exclusive => (0, me.get()),
        Mode::Shared => (1, 0),
    };
    let word = w
        .with_nx(tx)
        .with_ns(ts)
        .with_rms(ts)
        .with_rflag(true)
        .with_rcnt(rcnt)
        .with_timeout_ms(deadline);
    Outcome::ok(FairLock { word, owner }, granted(mode, true))
}

/// Release the grant held under `ticket` and open the hand-off window for the next ticket.
#[inline]
pub fn unlock(
    s: FairLock,
    me: ClientId,
    mode: Mode,
    ticket: Ticket,
    now_ms: u64,
) -> Outcome<FairLock> {
    let w = s.word;
    let (tx, ts) = (ticket.exclusive, ticket.shared);
    let handoff = timeout_at(now_ms, HANDOFF_MS);
    match mode {
        Mode::Exclusive => {
            if !((s.owner == me.get() || s.owner == 0) && w.nx() == tx && w.ns() == ts) {
                return Outcome::refused(s, Status::Fail);
            }
            // Clearing `rflag` is safe here: `nx` moves past `tx`, so the shared tickets it
            // voided are now passed on `tx` instead.
            let word = w
                .with_nx(w.nx().wrapping_add(1))
                .with_rflag(false)
                .with_timeout_ms(handoff);
            Outcome::ok(FairLock { word, owner: 0 }, Effect::Released(mode))
        }
        Mode::Shared => {
            // `rcnt == 0` is refused rather than wrapped: readers are anonymous, so a stale
            // unlock must never drive the count below zero.
            if s.owner != 0 || shared_voided(w, ts) || w.nx() != tx || w.rcnt() == 0 {
                return Outcome::refused(s, Status::Fail);
            }
            let ns = w.ns().wrapping_add(1);
            let rcnt = w.rcnt() - 1;
            let mut word = w.with_ns(ns).with_rcnt(rcnt);
            if rcnt == 0 {
                word = word.with_timeout_ms(handoff);
            }
            if word.rflag() && ns.wrapping_sub(word.rms()) >= RFLAG_RESET {
                word = word.with_rflag(false);
            }
            Outcome::ok(FairLock { word, ..s }, Effect::Released(mode))
        }
    }
}

/// Push the timeout to at least `now + expire_ms` for the holder of `ticket`; `expire_ms == 0`
/// only checks that the grant still stands.
#[inline]
pub fn extend(
    s: FairLock,
    me: ClientId,
    mode: Mode,
    ticket: Ticket,
    expire_ms: u32,
    now_ms: u64,
) -> Outcome<FairLock> {
    let w = s.word;
    let mine = s.owner == me.get() || s.owner == 0;
    let current = ticket.exclusive == w.nx()
        && !shared_voided(w, ticket.shared)
        && (matches!(mode, Mode::Shared) || ticket.shared == w.ns());
    if !(mine && current) {
        return Outcome::refused(s, Status::Fail);
    }
    if expire_ms == 0 {
        return Outcome::ok(s, Effect::Extended);
    }
    let word = w.with_timeout_ms(w.timeout_ms().max(timeout_at(now_ms, expire_ms)));
    Outcome::ok(FairLock { word, ..s }, Effect::Extended)
}

/// A fair-lock request as the server receives it, its mode aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// A first attempt: a grant, or a ticket to retry with.
    First,
    /// A retry with the ticket a first attempt was given.
    Retry(Ticket),
    /// Give up the grant held under the ticket, or the ticket itself while still queued.
    Unlock(Ticket),
    /// Extend the grant held under the ticket.
    Extend(Ticket),
}

/// What the server knows of the caller on this lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Who asks.
    pub id: ClientId,
    /// Its holds record on this lock.
    pub hold: Hold,
}

/// A request's outcome under the server's guards, with what the server's records must forget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Served {
    /// The transition's outcome.
    pub outcome: Outcome<FairLock>,
    /// The ticket the request was served under (first attempts and retries), which the reply's
    /// word carries in `mx`/`ms` as the reference patches it.
    pub ticket: Option<Ticket>,
    /// A retry was refused as passed: the caller's ticket is void and its record forgets it.
    pub ticket_void: bool,
    /// A grant preempted (guard 3): every other client's record on this lock forgets its grant
    /// or ticket.
    pub others_void: bool,
}

/// Guard 1: whether ticket `t`, retried in `mode`, is one `w` has issued. The half in `mode`
/// must be before the next ticket of that mode; the other half at most that mode's next ticket.
#[inline]
pub const fn issued(w: FairWord, mode: Mode, t: Ticket) -> bool {
    let (tx, ts, mx, ms) = (t.exclusive, t.shared, w.mx(), w.ms());
    match mode {
        Mode::Exclusive => ticket_before(tx, mx) && (ts == ms || ticket_before(ts, ms)),
        Mode::Shared => ticket_before(ts, ms) && (tx == mx || ticket_before(tx, mx)),
    }
}

/// Runs `req` in `mode` from `caller` on `s` under the server's guards (the module doc's
/// second table): the transition it comes to, the ticket it was served under, and what the
/// server's records must forget.
#[inline]
pub fn serve(
    s: FairLock,
    caller: Caller,
    mode: Mode,
    req: Request,
    expire_ms: u32,
    now_ms: u64,
) -> Served {
    let (outcome, ticket) = guarded(s, caller, mode, req, expire_ms, now_ms);
    // Guard 2: never a writer beside readers.
    let outcome = match (outcome.effect, ticket) {
        (
            Effect::Granted {
                mode: Mode::Exclusive,
                preempted: false,
            },
            Some(ticket),
        ) if s.word.rcnt() != 0 => {
            let state = match req {
                // A first attempt still takes its ticket, as a queued one would.
                Request::First => FairLock {
                    word: s.word.with_mx(s.word.mx().wrapping_add(1)),
                    ..s
                },
                Request::Retry(_) | Request::Unlock(_) | Request::Extend(_) => s,
            };
            queued(state, ticket)
        }
        _ => outcome,
    };
    Served {
        ticket_void: matches!(req, Request::Retry(_)) && outcome.status == Status::Fail,
        others_void: matches!(
            outcome.effect,
            Effect::Granted {
                preempted: true,
                ..
            }
        ),
        outcome,
        ticket,
    }
}

/// The first table's rows of the module doc's guards: which transition a request may reach.
#[inline]
fn guarded(
    s: FairLock,
    caller: Caller,
    mode: Mode,
    req: Request,
    expire_ms: u32,
    now_ms: u64,
) -> (Outcome<FairLock>, Option<Ticket>) {
    let (me, hold) = (caller.id, caller.hold);
    let holds_mode = matches!(
        (hold, mode),
        (Hold::Exclusive, Mode::Exclusive) | (Hold::Shared, Mode::Shared)
    );
    let refused = |status| (Outcome::refused(s, status), None);
    match req {
        Request::First => match hold {
            Hold::None if expire_ms == 0 => refused(Status::Einval),
            Hold::None => (
                try_lock(s, me, mode, expire_ms, now_ms),
                Some(s.next_ticket()),
            ),
            Hold::Ticketed => refused(Status::Eticket),
            Hold::Exclusive | Hold::Shared if holds_mode => refused(Status::AlreadyLocked),
            Hold::Exclusive | Hold::Shared => refused(Status::Einval),
        },
        Request::Retry(_) if expire_ms == 0 => refused(Status::Einval),
        Request::Retry(_) if hold == Hold::None => refused(Status::Fail),
        Request::Retry(_) if hold != Hold::Ticketed => refused(Status::Einval),
        Request::Retry(t) if !issued(s.word, mode, t) => refused(Status::Fail),
        Request::Retry(t) => (try_ticket(s, me, mode, t, expire_ms, now_ms), Some(t)),
        // The reference only forgets an abandoned ticket in its client.
        Request::Unlock(_) if hold == Hold::Ticketed => {
            (Outcome::ok(s, Effect::Released(mode)), None)
        }
        Request::Unlock(t) if holds_mode => (unlock(s, me, mode, t, now_ms), None),
        Request::Extend(t) if holds_mode => (extend(s, me, mode, t, expire_ms, now_ms), None),
        Request::Unlock(_) | Request::Extend(_) => refused(Status::Fail),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_guards;
