//! The client's record of one lock and its (state × operation) decisions.
//!
//! This module owns [`LocalLock`]: what the client believes about one lock it obtained with
//! `get_lock` (state, re-entrancy count, last word, fair ticket, fencing token, lease), which
//! request each API call turns into, and how a reply changes the record. It does no I/O, reads
//! no clock (`now_ms` is passed in), allocates nothing and touches no other lock: the client
//! module looks the record up, sends what it is told to, and hands the reply back. A batch is
//! the same calls made once per entry.
//!
//! The state machine is the reference client's (`lock_entry_c.cpp`, §2.4 of
//! `shared/reference/dlock-reference.md`, with the API rules of §1.5 and the fair tickets of
//! §2.3). Two differences, both because our server keeps per-client records: a fair unlock while
//! ticketed is *sent* (the server abandons the ticket at once instead of stalling the queue until
//! the hand-off window passes), and a relock's reply is recognised by the [`Request`] it answers
//! instead of by bumping the count before the send and undoing it on failure.
//!
//! # Decisions
//!
//! Checked first, in order: an atomic lock has no shared mode (trylock shared → `Einval`); a
//! record in a state its kind cannot reach (atomic shared or ticketed, RW ticketed) answers
//! `Einval` to everything; a trylock with `expire_ms == 0` is the reference's "read the cache":
//! `Success` without a round trip, the caller reads [`LocalLock::word`]. Then, with `m` the mode
//! asked for (trylock, extend) and `¬m` the other one:
//!
//! | state                 | operation   | atomic                   | RW                      | fair                        |
//! |-----------------------|-------------|--------------------------|-------------------------|-----------------------------|
//! | Initialized, Unlocked | trylock(m)  | send `Try(m)`            | send `Try(m)`           | send `Try(m)`               |
//! | Initialized, Unlocked | unlock      | AlreadyUnlocked          | AlreadyUnlocked         | AlreadyUnlocked             |
//! | Initialized, Unlocked | extend(m)   | Einval                   | Einval                  | Einval                      |
//! | Locked(m)             | trylock(m)  | send `Extend(m)` relock  | refs + 1, AlreadyLocked | send `Extend(m)` relock     |
//! | Locked(m)             | trylock(¬m) | Einval                   | Einval                  | Einval                      |
//! | Locked(m), refs > 1   | unlock      | refs − 1, AlreadyLocked  | refs − 1, AlreadyLocked | refs − 1, AlreadyLocked     |
//! | Locked(m), refs ≤ 1   | unlock      | send `Unlock(m)`         | send `Unlock(m)`        | send `Unlock(m)` + ticket   |
//! | Locked(m)             | extend(m)   | send `Extend(m)`         | Einval                  | send `Extend(m)` + ticket   |
//! | Locked(m)             | extend(¬m)  | Einval                   | Einval                  | Einval                      |
//! | Ticketed(m)           | trylock(m)  | —                        | —                       | send `Ticket(m)` + ticket   |
//! | Ticketed(m)           | trylock(¬m) | —                        | —                       | Eticket                     |
//! | Ticketed(m)           | unlock      | —                        | —                       | send `Unlock(m)` (abandons) |
//! | Ticketed(m)           | extend      | —                        | —                       | Einval                      |
//! | Locked(exclusive)     | downgrade   | Einval                   | send `Downgrade`        | Einval                      |
//! | anything else         | downgrade   | Einval                   | Einval                  | Einval                      |
//!
//! A local answer changes the record at once (the only such changes are the two re-entrancy
//! counts, which is why `trylock` and `unlock` take `&mut self`); a sent request changes nothing
//! until [`LocalLock::apply`] sees its reply. So the count moves exactly once per call, however
//! the call is answered, and there is no separate "note the local answer" step to forget.
//!
//! # Replies
//!
//! | request            | reply status  | record after                                       | caller gets   |
//! |--------------------|---------------|----------------------------------------------------|---------------|
//! | Try, Ticket        | Success       | Locked(m), refs 1, token = aux, proof, lease from now | Success    |
//! | Extend (relock)    | Success       | refs + 1, lease lengthened                         | AlreadyLocked |
//! | Extend             | Success       | lease lengthened                                   | Success       |
//! | Unlock             | Success       | Unlocked (Initialized if it abandoned a ticket)    | Success       |
//! | Downgrade          | Success       | Locked(shared), refs, token and block kept         | Success       |
//! | Try, Ticket (fair) | Eagain        | Ticketed(m), ticket = aux, proof                   | Eagain        |
//! | any                | Fail          | Initialized, refs 0 (the grant or ticket is lost)  | Fail          |
//! | Try, Ticket (fair) | Etimeout      | Initialized (the server dropped the ticket)        | Etimeout      |
//! | any                | anything else | unchanged                                          | that status   |
//!
//! A fair grant's ticket is the `mx`/`ms` of its reply word (the server writes the caller's
//! ticket there); unlock and extend must present it.
//!
//! # Lock value blocks
//!
//! A record asks for its lock's value block (`crate::manager::value`) with every acquisition
//! while [`LocalLock::ask`] has [`LockFlags::VALUE_BLOCK`] (the Linux DLM's `LKF_VALBLK`, which
//! it passes per request; an engine keeps a page's LSN with the page's lock and asks for it on
//! every grant, so here it is a property of the record and reaches single calls, batches,
//! pipelined batches and asynchronous calls alike). A grant's reply then carries the block,
//! kept in [`LocalLock::value`] until the grant ends (a claim after a failover offers it). An
//! exclusive holder writes the block by staging it ([`LocalLock::stage_value`]): the unlock
//! that releases the grant on the server carries it (a re-entrant unlock only counted down
//! keeps it staged). Only an exclusive grant can stage one; readers cannot write, and the wire
//! has no place for a shared unlock's block.
//!
//! | event                                   | `value`              | `write` (staged)       |
//! |-----------------------------------------|----------------------|------------------------|
//! | Try, Ticket granted                     | the reply's block (`None` unless asked) | none |
//! | Extend, Relock, local re-entry          | unchanged            | unchanged              |
//! | `stage_value` while exclusively locked  | unchanged            | the block              |
//! | `stage_value` otherwise                 | unchanged (`Einval`) | unchanged              |
//! | the grant forgotten (any reset)         | none                 | none                   |
//!
//! # Forgetting
//!
//! The record forgets a grant or ticket only when the server said it is gone: `Fail`, a fair
//! `Etimeout`, a successful unlock, or (in the client module) a deinit, a refused claim, or a
//! lease the client knows lapsed. Any other answer, and no answer at all (a lost reply, a
//! timeout), leaves it as it was, because the server may still hold it for this client; the
//! next operation on the lock then learns the truth from the server. A grant's proof (from a
//! server with a session key) is kept with it, for the claim that re-establishes it on a
//! replacement server.

use crate::manager::value::{ValueBlock, ValueRead};
use crate::proto::{CommandResult, Held, LockCommand, LockFlags, LockOp};
use crate::word::fair::FairWord;
use crate::{FencingToken, GrantProof, LockId, LockKind, Mode, Status, Ticket};

/// What the client believes it holds on one lock (the reference's `lock_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LocalState {
    /// Obtained with `get_lock`, never locked, or reset after the server refused.
    Initialized,
    /// Holds an exclusive grant.
    ExclusiveLocked,
    /// Holds a shared grant.
    SharedLocked,
    /// Released its grant.
    Unlocked,
    /// Fair lock: queued for an exclusive grant, holding a ticket.
    ExclusiveTicketed,
    /// Fair lock: queued for a shared grant, holding a ticket.
    SharedTicketed,
}

impl LocalState {
    /// The state of holding a grant in `mode`.
    #[inline]
    pub const fn locked(mode: Mode) -> Self {
        match mode {
            Mode::Exclusive => LocalState::ExclusiveLocked,
            Mode::Shared => LocalState::SharedLocked,
        }
    }

    /// The state of waiting with a ticket for `mode`.
    #[inline]
    pub const fn ticketed(mode: Mode) -> Self {
        match mode {
            Mode::Exclusive => LocalState::ExclusiveTicketed,
            Mode::Shared => LocalState::SharedTicketed,
        }
    }

    /// The mode of the grant held, if any.
    #[inline]
    pub const fn held_mode(self) -> Option<Mode> {
        match self {
            LocalState::ExclusiveLocked => Some(Mode::Exclusive),
            LocalState::SharedLocked => Some(Mode::Shared),
            _ => None,
        }
    }

    /// The mode of the ticket held, if any.
    #[inline]
    pub const fn ticket_mode(self) -> Option<Mode> {
        match self {
            LocalState::ExclusiveTicketed => Some(Mode::Exclusive),
            LocalState::SharedTicketed => Some(Mode::Shared),
            _ => None,
        }
    }
}

/// A lock command to send, with what [`LocalLock::apply`] must know to read its reply. The
/// fields are private so a request can only come from a decision: the caller encodes
/// [`Request::command`] and hands the request back with the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Request {
    command: LockCommand,
    /// What the command is for; a relock's success adds a reference and reads `AlreadyLocked`.
    verb: Verb,
    /// The value block an exclusive unlock writes (its command is flagged `VALUE_BLOCK`).
    value: Option<ValueBlock>,
}

impl Request {
    /// A placeholder that is never sent: fills the unused slots of fixed-size arrays.
    pub const fn none() -> Self {
        Request {
            command: LockCommand::NONE,
            verb: Verb::Try,
            value: None,
        }
    }

    /// The block this request writes, for the request's value trailer: `Some` exactly for an
    /// exclusive unlock whose command is flagged [`LockFlags::VALUE_BLOCK`].
    #[inline]
    pub const fn value_block(&self) -> Option<ValueBlock> {
        self.value
    }

    /// The command to put on the wire.
    #[inline]
    pub const fn command(&self) -> LockCommand {
        self.command
    }

    /// Whether this is a re-entrant trylock sent as an extend.
    #[inline]
    pub const fn is_relock(&self) -> bool {
        matches!(self.verb, Verb::Relock)
    }
}

/// What to do for one API call on one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Decision {
    /// Go to the server with this request, then [`LocalLock::apply`] the reply.
    Send(Request),
    /// Answered locally, no round trip; the record already reflects it.
    Answer(Status),
}

/// What a client re-claims for one lock after a server failover (a `LockClaim` without the
/// name and the word, which the caller adds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// What is held: a grant, a ticket, or only the reference.
    pub held: Held,
    /// The fair ticket held or granted under (zero otherwise).
    pub ticket: Ticket,
    /// Lease left on the grant, 0 when expired or not a grant (RW grants have no lease and
    /// the server ignores it for them).
    pub remaining_ms: u32,
    /// How long the grant has been held, 0 when not a grant.
    pub age_ms: u32,
    /// The grant's fencing token, 0 when not a grant.
    pub token: u64,
    /// The proof of the grant or ticket ([`GrantProof::NONE`] for a reference, or from a
    /// server without a session key).
    pub proof: GrantProof,
    /// The value block the grant came with, when the record asked for it: the replacement
    /// server restores a block only from a claim that offers a valid one
    /// (`LockValue::reclaim`); `None` for a ticket or a reference.
    pub value: Option<ValueRead>,
}

/// The client's record of one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalLock {
    /// The lock's id on the current server.
    pub id: LockId,
    /// The lock's kind, fixed at `get_lock`.
    pub kind: LockKind,
    /// What the client believes it holds.
    pub state: LocalState,
    /// Re-entrancy count: 1 per successful trylock not yet unlocked, 0 when not locked.
    pub refs: u32,
    /// The last lock word the server sent for this lock.
    pub word: u128,
    /// Fair lock: the ticket held (ticketed) or granted under (locked); zero otherwise.
    pub ticket: Ticket,
    /// The fencing token of the current grant; 0 when none.
    pub token: FencingToken,
    /// When the current grant was received (the caller's monotonic clock).
    pub granted_at_ms: u64,
    /// Lease of the current grant, counted from `granted_at_ms` (extends lengthen it).
    pub expire_ms: u32,
    /// The proof the server gave with the current grant or ticket ([`GrantProof::NONE`] when
    /// none, or when the server has no session key).
    pub proof: GrantProof,
    /// The lock-manager flags every acquisition of this lock carries:
    /// [`LockFlags::VALUE_BLOCK`] (see "Lock value blocks") and [`LockFlags::RETAIN`] (the
    /// server keeps the grant for recovery if this client dies).
    pub ask: LockFlags,
    /// The value block the current grant returned (`None` unless `ask` asked for it).
    pub value: Option<ValueRead>,
    /// The value block staged for the unlock that releases the current exclusive grant.
    pub write: Option<ValueBlock>,
    /// The current grant was asked for as cached (`ask` has `CACHEABLE`) and made plain by the
    /// server (protocol 8, [`CommandResult::plain`]: a contended lock): a cached client gives it
    /// back with its last local release, the plain unlock.
    pub plain: bool,
}

impl LocalLock {
    /// A fresh record, as `get_lock` leaves it.
    #[inline]
    pub const fn new(id: LockId, kind: LockKind) -> Self {
        LocalLock {
            id,
            kind,
            state: LocalState::Initialized,
            refs: 0,
            word: 0,
            ticket: Ticket {
                exclusive: 0,
                shared: 0,
            },
            token: FencingToken(0),
            granted_at_ms: 0,
            expire_ms: 0,
            proof: GrantProof::NONE,
            ask: LockFlags::NONE,
            value: None,
            write: None,
            plain: false,
        }
    }

    /// Stages `block` for the unlock that releases the exclusive grant held (see "Lock value
    /// blocks"): `Success`, or `Einval` when no exclusive grant is held (a reader cannot write
    /// the block, and without a grant there is nothing to release).
    #[inline]
    pub fn stage_value(&mut self, block: ValueBlock) -> Status {
        if self.state != LocalState::ExclusiveLocked || !self.is_consistent() {
            return Status::Einval;
        }
        self.write = Some(block);
        Status::Success
    }

    /// Trylock in `mode` for `expire_ms`; a first attempt or ticket retry may wait `wait_ms` on
    /// the server. A re-entry either sends an extend (atomic, fair: it also refreshes the lease)
    /// or is counted here (RW, whose locks have no lease).
    #[inline]
    pub fn trylock(&mut self, mode: Mode, expire_ms: u32, wait_ms: u32) -> Decision {
        if (self.kind == LockKind::Atomic && mode == Mode::Shared) || !self.is_consistent() {
            return Decision::Answer(Status::Einval);
        }
        if expire_ms == 0 {
            // The reference's trylock with no lease reads the cached state without asking.
            return Decision::Answer(Status::Success);
        }
        match (self.state.held_mode(), self.state.ticket_mode()) {
            (None, None) => self.send(Verb::Try, mode, expire_ms, wait_ms),
            (Some(held), _) if held != mode => Decision::Answer(Status::Einval),
            // One more reference could not be counted; refusing beats wrapping to 0.
            (Some(_), _) if self.refs == u32::MAX => Decision::Answer(Status::Einval),
            (Some(_), _) if self.kind == LockKind::Rw => {
                self.refs += 1;
                Decision::Answer(Status::AlreadyLocked)
            }
            // A waiting extend is refused by the server; an extend never has to wait.
            (Some(_), _) => self.send(Verb::Relock, mode, expire_ms, 0),
            (None, Some(queued)) if queued == mode => {
                self.send(Verb::Ticket, mode, expire_ms, wait_ms)
            }
            (None, Some(_)) => Decision::Answer(Status::Eticket),
        }
    }

    /// Unlock: drops one reference locally while others remain, otherwise releases the grant
    /// (fair: under its ticket) or abandons the fair ticket held.
    #[inline]
    pub fn unlock(&mut self) -> Decision {
        if !self.is_consistent() {
            return Decision::Answer(Status::Einval);
        }
        match (self.state.held_mode(), self.state.ticket_mode()) {
            (None, None) => Decision::Answer(Status::AlreadyUnlocked),
            (Some(_), _) if self.refs > 1 => {
                self.refs -= 1;
                Decision::Answer(Status::AlreadyLocked)
            }
            (Some(mode), _) | (None, Some(mode)) => self.send(Verb::Unlock, mode, 0, 0),
        }
    }

    /// Extend the grant held in `mode` by `expire_ms` (0 only re-validates it). RW locks have no
    /// lease, so there is nothing to extend; extending the mode not held is `Einval`, as in the
    /// reference.
    #[inline]
    pub fn extend(&self, mode: Mode, expire_ms: u32) -> Decision {
        if self.kind == LockKind::Rw || !self.is_consistent() {
            return Decision::Answer(Status::Einval);
        }
        match self.state.held_mode() {
            Some(held) if held == mode => self.send(Verb::Extend, mode, expire_ms, 0),
            _ => Decision::Answer(Status::Einval),
        }
    }

    /// Downgrade the exclusive grant held to a shared one in place (`LockOp::Downgrade`, a
    /// dlock addition): what a cached holder asked to make room for readers does while it
    /// still reads. RW locks only (the server refuses it on the others: an atomic lock has no
    /// shared mode, a fair word no step to a reader's turn that keeps queued writers out).
    /// The re-entrancy count is kept (the same holders now read), and a block staged for the
    /// unlock is written by the downgrade instead, which ends the exclusive turn.
    #[inline]
    pub fn downgrade(&self) -> Decision {
        if self.kind != LockKind::Rw || self.state != LocalState::ExclusiveLocked {
            return Decision::Answer(Status::Einval);
        }
        self.send(Verb::Downgrade, Mode::Exclusive, 0, 0)
    }

    /// Updates the record from the server's reply to `sent` (a request this record decided) and
    /// returns the status for the caller; see the replies table in the module doc. `proof` is
    /// the proof the reply carried for this command (its MAC from the response's trailer, the
    /// epoch the client's server has), kept with a grant or ticket; `value` the value block the
    /// reply carried for it (kept with a grant).
    ///
    /// An all-or-nothing batch that did not fully succeed was undone on the server, which then
    /// reports `Eagain` for the commands that had worked: the caller must apply none of that
    /// batch's replies, because nothing took effect. Replies the record cannot explain, such as
    /// `AlreadyLocked` or `Eticket` to a first attempt (our server's answers when an earlier
    /// reply was lost and it still holds a grant or ticket for us), leave the record unchanged.
    #[inline]
    pub fn apply(
        &mut self,
        sent: &Request,
        reply: &CommandResult,
        proof: GrantProof,
        value: Option<ValueRead>,
        now_ms: u64,
    ) -> Status {
        let c = sent.command;
        debug_assert!(
            c.lock == self.id.raw() && c.kind == self.kind,
            "another lock's reply"
        );
        let (mode, status) = (c.op.mode(), reply.status);
        let acquire = matches!(sent.verb, Verb::Try | Verb::Ticket);
        let fair = self.kind == LockKind::Fair;
        // `Fail`: the grant or ticket this record describes is gone (lost to expiry or a
        // preemption), so the record starts over, as the reference's does. `Etimeout` on a
        // waiting fair request: the server gave its ticket up.
        if status == Status::Fail || (fair && acquire && status == Status::Etimeout) {
            self.reset(LocalState::Initialized);
            self.word = reply.word;
            return status;
        }
        match (sent.verb, status) {
            (Verb::Try | Verb::Ticket, Status::Success | Status::Done) => {
                self.grant(mode, reply, c.expire_ms, now_ms);
                self.proof = proof;
                self.value = value;
                Status::Success
            }
            (Verb::Extend | Verb::Relock, Status::Success | Status::Done) => {
                self.word = reply.word;
                self.lengthen_lease(c.expire_ms, now_ms);
                if sent.verb == Verb::Relock {
                    self.refs = self.refs.saturating_add(1);
                    return Status::AlreadyLocked;
                }
                Status::Success
            }
            (Verb::Downgrade, Status::Success | Status::Done) => {
                self.state = if crate::mutated!(DowngradeStaysExclusive) {
                    LocalState::ExclusiveLocked
                } else {
                    LocalState::SharedLocked
                };
                self.word = reply.word;
                self.write = None;
                Status::Success
            }
            (Verb::Unlock, Status::Success | Status::Done) => {
                // The reference resets an abandoned ticket to Initialized; a released grant
                // leaves Unlocked. Both decide the same way afterwards.
                let abandoned = self.state.ticket_mode().is_some();
                self.reset(if abandoned {
                    LocalState::Initialized
                } else {
                    LocalState::Unlocked
                });
                self.word = reply.word;
                Status::Success
            }
            (Verb::Try | Verb::Ticket, Status::Eagain) if fair => {
                self.reset(LocalState::ticketed(mode));
                let (exclusive, shared) = (reply.aux as u16, (reply.aux >> 16) as u16);
                self.ticket = Ticket { exclusive, shared };
                self.word = reply.word;
                self.proof = proof;
                Status::Eagain
            }
            (_, other) => other,
        }
    }

    /// Whether `release_lock` may drop this lock: only when nothing is held or queued. The
    /// reference answers -1 for a held lock, which is `Fail` here.
    #[inline]
    pub fn releasable(&self) -> Result<(), Status> {
        match self.state {
            LocalState::Initialized | LocalState::Unlocked => Ok(()),
            LocalState::ExclusiveTicketed | LocalState::SharedTicketed => {
                Err(Status::TicketToUnlock)
            }
            LocalState::ExclusiveLocked | LocalState::SharedLocked => Err(Status::Fail),
        }
    }

    /// What to re-claim on a replacement server at `now_ms`; `None` for a record in a state its
    /// kind cannot reach (the server would refuse its claim as invalid).
    #[inline]
    pub fn claim(&self, now_ms: u64) -> Option<Claim> {
        if !self.is_consistent() {
            return None;
        }
        let nothing = Claim {
            held: Held::Reference,
            ticket: Ticket::default(),
            remaining_ms: 0,
            age_ms: 0,
            token: 0,
            proof: GrantProof::NONE,
            value: None,
        };
        Some(match (self.state.held_mode(), self.state.ticket_mode()) {
            (None, None) => nothing,
            (None, Some(mode)) => Claim {
                held: Held::Ticketed(mode),
                ticket: self.ticket,
                proof: self.proof,
                ..nothing
            },
            (Some(mode), _) => {
                // A clock that went backwards reads as "just granted", not as a huge age. Both
                // readings are whole ticks, so their difference may exceed the real age by up to
                // a tick: count one tick less, so that the lease the claim restores never ends
                // before the one the holder was granted (a shorter claim let a new owner grant
                // the lock while the holder, counting from its request, still held it).
                let age_ms = now_ms.saturating_sub(self.granted_at_ms).saturating_sub(1);
                Claim {
                    held: match mode {
                        Mode::Exclusive => Held::Exclusive,
                        Mode::Shared => Held::Shared,
                    },
                    ticket: self.wire_ticket(),
                    remaining_ms: u64::from(self.expire_ms).saturating_sub(age_ms) as u32,
                    age_ms: age_ms.min(u64::from(u32::MAX)) as u32,
                    token: self.token.0,
                    proof: self.proof,
                    value: self.value,
                }
            }
        })
    }

    /// Whether the state is one this kind can reach: atomic locks are never shared and only fair
    /// locks hold tickets. The fields are public, so this is checked rather than assumed.
    #[inline]
    const fn is_consistent(&self) -> bool {
        match self.state {
            LocalState::SharedLocked => !matches!(self.kind, LockKind::Atomic),
            LocalState::ExclusiveTicketed | LocalState::SharedTicketed => {
                matches!(self.kind, LockKind::Fair)
            }
            _ => true,
        }
    }

    /// The request for `verb` in `mode`. A first attempt has no ticket yet; everything else on a
    /// fair lock presents the one held.
    #[inline]
    fn send(&self, verb: Verb, mode: Mode, expire_ms: u32, wait_ms: u32) -> Decision {
        use LockOp::*;
        let pair = match verb {
            Verb::Try => [TryExclusive, TryShared],
            Verb::Ticket => [TicketExclusive, TicketShared],
            Verb::Unlock => [UnlockExclusive, UnlockShared],
            Verb::Extend | Verb::Relock => [ExtendExclusive, ExtendShared],
            Verb::Downgrade => [Downgrade, Downgrade],
        };
        let op = pair[usize::from(mode == Mode::Shared)];
        let ticket = match verb {
            Verb::Try => Ticket::default(),
            _ => self.wire_ticket(),
        };
        let (kind, lock) = (self.kind, self.id.raw());
        // An acquisition asks for what the record asks; an exclusive unlock of a grant writes
        // the block staged for it. Nothing else carries a flag.
        let value = match (verb, self.state) {
            (Verb::Unlock | Verb::Downgrade, LocalState::ExclusiveLocked) => self.write,
            _ => None,
        };
        let flags = match verb {
            Verb::Try | Verb::Ticket => self.ask.intersection(LockFlags::allowed_for(op as u8)),
            _ if value.is_some() => LockFlags::VALUE_BLOCK,
            _ => LockFlags::NONE,
        };
        let command = LockCommand {
            kind,
            op,
            lock,
            expire_ms,
            ticket,
            wait_ms,
            // A standalone server's: the cluster client names its partition's epoch.
            partition_epoch: 0,
            flags,
        };
        Decision::Send(Request {
            command,
            verb,
            value,
        })
    }

    /// The ticket a request or claim presents: only fair locks have one.
    #[inline]
    fn wire_ticket(&self) -> Ticket {
        match self.kind {
            LockKind::Fair => self.ticket,
            LockKind::Atomic | LockKind::Rw => Ticket::default(),
        }
    }

    /// Forgets the grant or ticket and enters `state`.
    #[inline]
    fn reset(&mut self, state: LocalState) {
        self.state = state;
        self.refs = 0;
        self.ticket = Ticket::default();
        self.token = FencingToken(0);
        self.granted_at_ms = 0;
        self.expire_ms = 0;
        self.proof = GrantProof::NONE;
        self.value = None;
        self.write = None;
        self.plain = false;
    }

    #[inline]
    fn grant(&mut self, mode: Mode, reply: &CommandResult, expire_ms: u32, now_ms: u64) {
        self.reset(LocalState::locked(mode));
        self.refs = 1;
        self.word = reply.word;
        self.token = FencingToken(reply.aux);
        self.plain = reply.plain;
        self.granted_at_ms = now_ms;
        self.expire_ms = expire_ms;
        if self.kind == LockKind::Fair {
            self.ticket = FairWord::from_bits(reply.word).counters();
        }
    }

    /// The server moved the lease to `max(old, now + expire_ms)`; keep `granted_at_ms` (the
    /// claim's age is measured from it) and lengthen `expire_ms` to match. An extend by 0 only
    /// re-validates, so it must not stretch an expired lease up to now.
    #[inline]
    fn lengthen_lease(&mut self, expire_ms: u32, now_ms: u64) {
        if expire_ms == 0 {
            return;
        }
        let until = now_ms
            .saturating_sub(self.granted_at_ms)
            .saturating_add(u64::from(expire_ms));
        self.expire_ms = until.clamp(u64::from(self.expire_ms), u64::from(u32::MAX)) as u32;
    }
}

/// What a request asks the server to do, before the mode picks the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    /// A first attempt.
    Try,
    /// A fair retry with the ticket held.
    Ticket,
    Unlock,
    Extend,
    /// An extend standing in for a re-entrant trylock.
    Relock,
    /// An exclusive grant turned shared in place.
    Downgrade,
}

#[cfg(test)]
mod tests;
