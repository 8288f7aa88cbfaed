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
                self.state = LocalState::SharedLocked;
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
    }

    #[inline]
    fn grant(&mut self, mode: Mode, reply: &CommandResult, expire_ms: u32, now_ms: u64) {
        self.reset(LocalState::locked(mode));
        self.refs = 1;
        self.word = reply.word;
        self.token = FencingToken(reply.aux);
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
mod tests {
    use super::*;
    use LocalState::*;
    use LockKind::{Atomic, Fair, Rw};
    use LockOp::*;
    use Mode::{Exclusive as EX, Shared as SH};
    use Status::*;

    #[rustfmt::skip]
    const STATES: [LocalState; 6] =
        [Initialized, ExclusiveLocked, SharedLocked, Unlocked, ExclusiveTicketed, SharedTicketed];
    /// A fair ticket, and the same ticket as a fair `Eagain` reply's `aux` carries it.
    const T: Ticket = t(7, 3);
    const T_AUX: u64 = 0x0003_0007;
    const NO_T: Ticket = t(0, 0);
    /// The proof every reply in these tests carries.
    const P: GrantProof = GrantProof {
        epoch: 2,
        mac: [7; GrantProof::LEN],
    };

    const fn t(exclusive: u16, shared: u16) -> Ticket {
        Ticket { exclusive, shared }
    }

    fn lock(kind: LockKind, state: LocalState, refs: u32) -> LocalLock {
        let ticket = if kind == Fair { T } else { NO_T };
        let mut l = LocalLock::new(LockId::new(5, 1), kind);
        (l.state, l.refs, l.ticket) = (state, refs, ticket);
        l
    }

    /// The fields a transition is about: state, count, ticket and token.
    fn shape(l: &LocalLock) -> (LocalState, u32, Ticket, u64) {
        (l.state, l.refs, l.ticket, l.token.0)
    }

    #[track_caller]
    fn req(d: Decision) -> LockCommand {
        match d {
            Decision::Send(r) => r.command(),
            Decision::Answer(s) => panic!("answered {s} locally, expected a request"),
        }
    }

    /// Sends what `d` asks and applies the reply `(status, word, aux)` at `now_ms`.
    #[track_caller]
    fn round(l: &mut LocalLock, d: Decision, r: (Status, u128, u64), now_ms: u64) -> Status {
        let Decision::Send(sent) = d else {
            panic!("{d:?} is not a request")
        };
        let (status, word, aux) = r;
        l.apply(&sent, &CommandResult { status, word, aux }, P, None, now_ms)
    }

    /// What the table expects: send this op, send it as a relock, or answer locally.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum E {
        S(LockOp),
        R(LockOp),
        A(Status),
    }
    use E::{A, R, S};

    #[test]
    fn every_state_kind_and_operation_decides_as_the_table_says() {
        const INV: E = A(Einval);
        const GONE: E = A(AlreadyUnlocked);
        const AGAIN: E = A(AlreadyLocked);
        // Columns: trylock EX, trylock SH, unlock (refs 1), unlock (refs 2), extend EX, extend
        // SH. Rows: `STATES` in order. Unformatted so that each row reads as a table row.
        let idle = [S(TryExclusive), S(TryShared), GONE, GONE, INV, INV];
        let idle_atomic = [S(TryExclusive), INV, GONE, GONE, INV, INV];
        #[rustfmt::skip]
        let tables = [
            (Atomic, [
                idle_atomic,
                [R(ExtendExclusive), INV, S(UnlockExclusive), AGAIN, S(ExtendExclusive), INV],
                [INV; 6],
                idle_atomic,
                [INV; 6],
                [INV; 6],
            ]),
            (Rw, [
                idle,
                [AGAIN, INV, S(UnlockExclusive), AGAIN, INV, INV],
                [INV, AGAIN, S(UnlockShared), AGAIN, INV, INV],
                idle,
                [INV; 6],
                [INV; 6],
            ]),
            (Fair, [
                idle,
                [R(ExtendExclusive), INV, S(UnlockExclusive), AGAIN, S(ExtendExclusive), INV],
                [INV, R(ExtendShared), S(UnlockShared), AGAIN, INV, S(ExtendShared)],
                idle,
                [S(TicketExclusive), A(Eticket), S(UnlockExclusive), S(UnlockExclusive), INV, INV],
                [A(Eticket), S(TicketShared), S(UnlockShared), S(UnlockShared), INV, INV],
            ]),
        ];
        for (kind, table) in tables {
            for (state, row) in STATES.into_iter().zip(table) {
                for (col, want) in row.into_iter().enumerate() {
                    let held = u32::from(state.held_mode().is_some());
                    let refs = if col == 3 { 2 * held } else { held };
                    let before = lock(kind, state, refs);
                    let mut after = before;
                    let got = match col {
                        0 => after.trylock(EX, 100, 0),
                        1 => after.trylock(SH, 100, 0),
                        2 | 3 => after.unlock(),
                        4 => after.extend(EX, 100),
                        _ => after.extend(SH, 100),
                    };
                    let got = match got {
                        Decision::Send(r) if r.is_relock() => R(r.command().op),
                        Decision::Send(r) => S(r.command().op),
                        Decision::Answer(s) => A(s),
                    };
                    let at = format!("{kind:?} {state:?} column {col}");
                    assert_eq!(got, want, "{at}");
                    // Only the two local re-entrancy answers change the record, by one.
                    let refs = match (got, col) {
                        (AGAIN, 0 | 1) => refs + 1,
                        (AGAIN, _) => refs - 1,
                        _ => refs,
                    };
                    assert_eq!(after, LocalLock { refs, ..before }, "{at}");
                }
            }
        }
    }

    #[test]
    fn commands_carry_expiry_wait_and_ticket_where_the_server_reads_them() {
        let fields = |d| {
            let c = req(d);
            (c.lock, c.kind, c.expire_ms, c.wait_ms, c.ticket)
        };
        let id = LockId::new(5, 1).raw();
        let mut l = lock(Fair, Initialized, 0);
        assert_eq!(fields(l.trylock(SH, 25, 4)), (id, Fair, 25, 4, NO_T));
        l.state = SharedTicketed;
        assert_eq!(fields(l.trylock(SH, 25, 4)), (id, Fair, 25, 4, T));
        (l.state, l.refs) = (SharedLocked, 1);
        // A re-entry refreshes the lease but must not ask to wait (the server refuses that).
        assert_eq!(fields(l.trylock(SH, 25, 4)), (id, Fair, 25, 0, T));
        assert_eq!(fields(l.extend(SH, 9)), (id, Fair, 9, 0, T));
        assert_eq!(fields(l.unlock()), (id, Fair, 0, 0, T));
        // Only fair locks put a ticket on the wire, whatever the record says.
        let mut atomic = lock(Atomic, ExclusiveLocked, 1);
        atomic.ticket = T;
        assert_eq!(fields(atomic.unlock()), (id, Atomic, 0, 0, NO_T));
    }

    #[test]
    fn zero_expiry_answers_success_from_the_cache_without_a_round_trip() {
        for kind in [Atomic, Rw, Fair] {
            for (state, refs) in [(Initialized, 0), (ExclusiveLocked, 1), (Unlocked, 0)] {
                let mut l = lock(kind, state, refs);
                assert_eq!(l.trylock(EX, 0, 0), Decision::Answer(Success));
                assert_eq!(l, lock(kind, state, refs), "{kind:?} {state:?}");
            }
        }
        // The atomic shared check comes first, as in the reference.
        let mut l = lock(Atomic, Initialized, 0);
        assert_eq!(l.trylock(SH, 0, 0), Decision::Answer(Einval));
    }

    #[test]
    fn grant_locks_with_one_reference_its_token_and_a_lease_from_now() {
        let mut l = lock(Atomic, Unlocked, 0);
        let d = l.trylock(EX, 300, 0);
        assert_eq!(round(&mut l, d, (Success, 0xAB, 42), 1_000), Success);
        assert_eq!(shape(&l), (ExclusiveLocked, 1, NO_T, 42));
        assert_eq!((l.word, l.granted_at_ms, l.expire_ms), (0xAB, 1_000, 300));
        assert_eq!(l.proof, P, "the grant's proof is kept with it");
        // A fair grant's ticket is the one the server wrote into the word's `mx`/`ms`.
        let mut f = lock(Fair, Initialized, 0);
        let word = FairWord::new().with_nx(9).with_mx(11).with_ms(4);
        let d = f.trylock(SH, 300, 0);
        assert_eq!(round(&mut f, d, (Success, word.into(), 8), 5), Success);
        assert_eq!(shape(&f), (SharedLocked, 1, t(11, 4), 8));
    }

    #[test]
    fn relock_success_counts_a_reentry_and_reports_already_locked() {
        let mut l = lock(Fair, ExclusiveLocked, 1);
        l.token = FencingToken(77);
        let d = l.trylock(EX, 100, 0);
        assert_eq!(l.refs, 1, "nothing is counted before the reply");
        assert_eq!(round(&mut l, d, (Success, 1, 99), 0), AlreadyLocked);
        // An extend reply's aux is the lock's latest fence, not necessarily this grant's; an
        // extend proves nothing new either (the grant's proof stays the grant's).
        assert_eq!(shape(&l), (ExclusiveLocked, 2, T, 77));
        assert_eq!(l.proof, GrantProof::NONE);
    }

    #[test]
    fn extend_keeps_the_count_and_lengthens_the_lease_counted_from_the_grant() {
        let mut l = lock(Atomic, ExclusiveLocked, 1);
        (l.granted_at_ms, l.expire_ms) = (1_000, 500);
        let d = l.extend(EX, 800);
        assert_eq!(round(&mut l, d, (Success, 3, 0), 1_400), Success);
        assert_eq!((l.refs, l.word), (1, 3));
        assert_eq!((l.granted_at_ms, l.expire_ms), (1_000, 1_200));
        // A shorter extend never shortens the lease, and extend(0) only re-validates.
        for (expire, now) in [(100, 1_500), (0, 5_000)] {
            let d = l.extend(EX, expire);
            assert_eq!(round(&mut l, d, (Success, 3, 0), now), Success);
            assert_eq!(l.expire_ms, 1_200, "extend({expire}) at {now}");
        }
    }

    #[test]
    fn fair_queue_retry_grant_and_unlock_carry_the_ticket() {
        let mut l = lock(Fair, Initialized, 0);
        let d = l.trylock(SH, 100, 0);
        assert_eq!(round(&mut l, d, (Eagain, 6, T_AUX), 0), Eagain);
        assert_eq!(
            (shape(&l), l.word, l.proof),
            ((SharedTicketed, 0, T, 0), 6, P)
        );
        assert_eq!(l.trylock(EX, 100, 0), Decision::Answer(Eticket));
        // Still queued after a retry: the retry's Eagain keeps the ticket.
        let d = l.trylock(SH, 100, 0);
        assert_eq!((req(d).op, req(d).ticket), (TicketShared, T));
        assert_eq!(round(&mut l, d, (Eagain, 6, T_AUX), 10), Eagain);
        let word = FairWord::new().with_nx(7).with_ns(3).with_mx(7).with_ms(3);
        let d = l.trylock(SH, 100, 0);
        assert_eq!(round(&mut l, d, (Success, word.into(), 21), 20), Success);
        assert_eq!(shape(&l), (SharedLocked, 1, T, 21));
        assert_eq!(
            (req(l.unlock()).op, req(l.unlock()).ticket),
            (UnlockShared, T)
        );
    }

    #[test]
    fn unlock_leaves_unlocked_and_abandoning_a_ticket_starts_over() {
        let mut l = lock(Rw, SharedLocked, 1);
        l.token = FencingToken(4);
        let d = l.unlock();
        assert_eq!(round(&mut l, d, (Success, 9, 4), 0), Success);
        assert_eq!((shape(&l), l.word), ((Unlocked, 0, NO_T, 0), 9));
        let mut q = lock(Fair, ExclusiveTicketed, 0);
        let d = q.unlock();
        assert_eq!(round(&mut q, d, (Success, 0, 0), 0), Success);
        assert_eq!(q, LocalLock::new(q.id, Fair), "the ticket is forgotten");
    }

    #[test]
    fn only_an_exclusive_rw_grant_downgrades_and_keeps_its_count_token_and_block() {
        for kind in [Atomic, Rw, Fair] {
            for state in STATES {
                let l = lock(kind, state, u32::from(state.held_mode().is_some()));
                let d = l.downgrade();
                if (kind, state) == (Rw, ExclusiveLocked) {
                    assert_eq!(req(d).op, Downgrade);
                } else {
                    assert_eq!(d, Decision::Answer(Einval), "{kind:?} {state:?}");
                }
            }
        }
        let mut l = lock(Rw, ExclusiveLocked, 2);
        l.token = FencingToken(4);
        assert_eq!(l.stage_value(block(7)), Success);
        let Decision::Send(sent) = l.downgrade() else {
            panic!("an exclusive RW grant downgrades on the server")
        };
        // The staged block ends the exclusive turn with the downgrade.
        assert_eq!(sent.value_block(), Some(block(7)));
        assert!(sent.command().flags.contains(LockFlags::VALUE_BLOCK));
        let reply = CommandResult {
            status: Success,
            word: 9,
            aux: 4,
        };
        assert_eq!(l.apply(&sent, &reply, P, None, 5), Success);
        assert_eq!(shape(&l), (SharedLocked, 2, NO_T, 4));
        assert_eq!((l.word, l.write), (9, None));
        // Refused (the server no longer knows the grant): forgotten, as for any request.
        let mut r = lock(Rw, ExclusiveLocked, 1);
        let d = r.downgrade();
        assert_eq!(round(&mut r, d, (Fail, 0, 0), 5), Fail);
        assert_eq!(r.state, Initialized);
    }

    #[test]
    fn fail_resets_to_initialized_for_every_operation() {
        type Call = fn(&mut LocalLock) -> Decision;
        let cases: [(LockKind, LocalState, Call); 6] = [
            (Atomic, Unlocked, |l| l.trylock(EX, 100, 0)),
            (Atomic, ExclusiveLocked, |l| l.trylock(EX, 100, 0)),
            (Fair, SharedTicketed, |l| l.trylock(SH, 100, 0)),
            (Rw, ExclusiveLocked, |l| l.unlock()),
            (Fair, SharedLocked, |l| l.extend(SH, 100)),
            (Fair, ExclusiveLocked, |l| l.unlock()),
        ];
        for (kind, state, call) in cases {
            let mut l = lock(kind, state, u32::from(state.held_mode().is_some()));
            (l.token, l.granted_at_ms, l.expire_ms) = (FencingToken(3), 10, 20);
            let d = call(&mut l);
            assert_eq!(round(&mut l, d, (Fail, 5, 0), 50), Fail);
            let fresh = LocalLock::new(l.id, kind);
            assert_eq!(l, LocalLock { word: 5, ..fresh }, "{kind:?} {state:?}");
        }
    }

    #[test]
    fn fair_wait_timeout_drops_the_ticket() {
        let mut l = lock(Fair, ExclusiveTicketed, 0);
        let d = l.trylock(EX, 100, 2_000);
        assert_eq!(round(&mut l, d, (Etimeout, 0, 0), 0), Etimeout);
        assert_eq!(shape(&l), (Initialized, 0, NO_T, 0));
        assert_eq!(req(l.trylock(EX, 100, 0)).op, TryExclusive);
    }

    #[test]
    fn other_statuses_leave_the_record_unchanged() {
        for status in [
            NotReady,
            BadResponse,
            Einval,
            LockNotGet,
            Eticket,
            AlreadyLocked,
        ] {
            let mut l = lock(Fair, SharedLocked, 2);
            let d = l.trylock(SH, 100, 0);
            assert_eq!(round(&mut l, d, (status, 1, 1), 0), status);
            assert_eq!(l, lock(Fair, SharedLocked, 2), "{status}");
        }
        // Eagain from a non-fair lock (an undone all-or-nothing entry) is not a ticket, and
        // Etimeout from a waiting RW trylock leaves nothing to drop.
        for (status, kind) in [(Eagain, Atomic), (Etimeout, Rw)] {
            let mut l = lock(kind, Unlocked, 0);
            let d = l.trylock(EX, 100, 10);
            assert_eq!(round(&mut l, d, (status, 1, 1), 0), status);
            assert_eq!(l, lock(kind, Unlocked, 0), "{status} {kind:?}");
        }
    }

    #[test]
    fn reentry_sends_only_the_last_unlock_to_the_server() {
        // Atomic and fair locks re-enter with an extend, RW locally; all count the unlocks.
        for (kind, mode) in [(Atomic, EX), (Rw, SH), (Fair, SH)] {
            let mut l = lock(kind, Initialized, 0);
            let d = l.trylock(mode, 100, 0);
            assert_eq!(round(&mut l, d, (Success, 0, 1), 0), Success);
            match l.trylock(mode, 100, 0) {
                Decision::Answer(s) => assert_eq!((kind, s), (Rw, AlreadyLocked)),
                d => assert_eq!(round(&mut l, d, (Success, 0, 1), 0), AlreadyLocked),
            }
            assert_eq!(l.refs, 2, "{kind:?}");
            assert_eq!(l.unlock(), Decision::Answer(AlreadyLocked), "{kind:?}");
            let d = l.unlock();
            assert_eq!(req(d).op.mode(), mode, "{kind:?}");
            assert_eq!(round(&mut l, d, (Success, 0, 1), 0), Success);
            assert_eq!(l.unlock(), Decision::Answer(AlreadyUnlocked), "{kind:?}");
        }
    }

    #[test]
    fn reentry_refuses_rather_than_wrap_the_count() {
        let mut l = lock(Rw, ExclusiveLocked, u32::MAX);
        assert_eq!(l.trylock(EX, 100, 0), Decision::Answer(Einval));
        assert_eq!(l.refs, u32::MAX);
    }

    #[test]
    fn releasable_only_when_nothing_is_held_or_queued() {
        let (held, ticket) = (Err(Fail), Err(TicketToUnlock));
        let want = [Ok(()), held, held, Ok(()), ticket, ticket];
        for (state, want) in STATES.into_iter().zip(want) {
            assert_eq!(lock(Fair, state, 0).releasable(), want, "{state:?}");
        }
    }

    #[test]
    fn claim_reports_what_is_held_with_a_saturating_lease() {
        let mut l = lock(Fair, SharedLocked, 1);
        (l.token, l.granted_at_ms, l.expire_ms) = (FencingToken(9), 1_000, 500);
        let lease = |now: u64| l.claim(now).map(|c| (c.remaining_ms, c.age_ms));
        assert_eq!(
            lease(1_200),
            Some((301, 199)),
            "a tick less: ticks truncate"
        );
        assert_eq!(
            lease(1_001),
            Some((500, 0)),
            "one tick may be no time at all"
        );
        assert_eq!(
            lease(1_501),
            Some((0, 500)),
            "past the lease by more than a tick"
        );
        assert_eq!(lease(9_000), Some((0, 7_999)), "expired: nothing left");
        assert_eq!(lease(10), Some((500, 0)), "a clock behind the grant");
        assert_eq!(lease(1 << 40), Some((0, u32::MAX)), "the age clamps");
        let what = |l: LocalLock| l.claim(5).map(|c| (c.held, c.ticket, c.token));
        assert_eq!(what(l), Some((Held::Shared, T, 9)));
        let proven = LocalLock { proof: P, ..l };
        assert_eq!(
            proven.claim(5).map(|c| c.proof),
            Some(P),
            "the claim shows it"
        );
        let queued = lock(Fair, SharedTicketed, 0);
        assert_eq!(what(queued), Some((Held::Ticketed(SH), T, 0)));
        let mut x = lock(Atomic, ExclusiveLocked, 1);
        (x.token, x.ticket) = (FencingToken(2), T);
        assert_eq!(
            what(x),
            Some((Held::Exclusive, NO_T, 2)),
            "only fair has tickets"
        );
        let idle = LocalLock {
            ticket: T,
            ..lock(Fair, Unlocked, 0)
        };
        assert_eq!(what(idle), Some((Held::Reference, NO_T, 0)));
        assert_eq!(
            what(lock(Rw, SharedTicketed, 0)),
            None,
            "RW locks hold no tickets"
        );
    }

    fn block(b: u8) -> ValueBlock {
        ValueBlock([b; 32])
    }

    #[test]
    fn acquisitions_ask_for_the_value_block_when_the_record_asks_and_nothing_else_does() {
        let flags = |d| req(d).flags;
        for kind in [Atomic, Rw, Fair] {
            let mut l = lock(kind, Initialized, 0);
            assert_eq!(flags(l.trylock(EX, 100, 0)), LockFlags::NONE, "{kind:?}");
            l.ask = LockFlags::VALUE_BLOCK;
            assert_eq!(flags(l.trylock(EX, 100, 5)), LockFlags::VALUE_BLOCK);
            // An extend (or a relock sent as one) returns no block: the op may not carry it.
            (l.state, l.refs) = (ExclusiveLocked, 1);
            if kind != Rw {
                assert_eq!(flags(l.extend(EX, 100)), LockFlags::NONE, "{kind:?}");
                assert_eq!(flags(l.trylock(EX, 100, 0)), LockFlags::NONE, "{kind:?}");
            }
            // Unlocking with nothing staged writes nothing.
            assert_eq!(flags(l.unlock()), LockFlags::NONE, "{kind:?}");
        }
        let mut queued = lock(Fair, SharedTicketed, 0);
        queued.ask = LockFlags::VALUE_BLOCK;
        assert_eq!(flags(queued.trylock(SH, 100, 0)), LockFlags::VALUE_BLOCK);
    }

    #[test]
    fn a_grant_keeps_the_block_its_reply_carried_until_it_ends() {
        let read = ValueRead {
            block: block(4),
            seq: 3,
            valid: false,
        };
        let mut l = lock(Fair, Initialized, 0);
        l.ask = LockFlags::VALUE_BLOCK;
        let Decision::Send(sent) = l.trylock(EX, 100, 0) else {
            panic!("a first attempt is sent")
        };
        let ok = CommandResult {
            status: Success,
            word: 0,
            aux: 9,
        };
        assert_eq!(l.apply(&sent, &ok, P, Some(read), 10), Success);
        assert_eq!(l.value, Some(read));
        assert_eq!(
            l.claim(20).and_then(|c| c.value),
            Some(read),
            "a claim offers it"
        );
        let Decision::Send(relock) = l.trylock(EX, 100, 0) else {
            panic!("a fair re-entry is sent")
        };
        assert_eq!(l.apply(&relock, &ok, P, None, 11), AlreadyLocked);
        assert_eq!(l.value, Some(read), "a relock keeps the grant's block");
        // Two unlocks: the first only counts down, the second releases and forgets.
        assert_eq!(l.unlock(), Decision::Answer(AlreadyLocked));
        let Decision::Send(unlock) = l.unlock() else {
            panic!("the last unlock is sent")
        };
        assert_eq!(l.apply(&unlock, &ok, P, None, 12), Success);
        assert_eq!((l.value, l.write), (None, None));
        assert_eq!(l.claim(13).and_then(|c| c.value), None);
    }

    #[test]
    fn only_an_exclusive_grant_stages_a_block_and_its_releasing_unlock_carries_it() {
        for (kind, state) in [
            (Atomic, Initialized),
            (Rw, SharedLocked),
            (Fair, ExclusiveTicketed),
        ] {
            let mut l = lock(kind, state, u32::from(state == SharedLocked));
            assert_eq!(l.stage_value(block(1)), Einval, "{kind:?} {state:?}");
            assert_eq!(l.write, None);
        }
        let mut l = lock(Rw, ExclusiveLocked, 2);
        assert_eq!(l.stage_value(block(1)), Success);
        assert_eq!(l.stage_value(block(2)), Success, "the last staged wins");
        // A count-down keeps it staged for the unlock that releases.
        assert_eq!(l.unlock(), Decision::Answer(AlreadyLocked));
        assert_eq!(l.write, Some(block(2)));
        let Decision::Send(sent) = l.unlock() else {
            panic!("the releasing unlock is sent")
        };
        assert_eq!(sent.command().flags, LockFlags::VALUE_BLOCK);
        assert_eq!(sent.value_block(), Some(block(2)));
        // Lost instead (`Fail`): the staged block goes with the grant.
        let mut lost = lock(Atomic, ExclusiveLocked, 1);
        assert_eq!(lost.stage_value(block(3)), Success);
        let Decision::Send(sent) = lost.unlock() else {
            panic!("sent")
        };
        let fail = CommandResult {
            status: Fail,
            word: 0,
            aux: 0,
        };
        assert_eq!(lost.apply(&sent, &fail, P, None, 1), Fail);
        assert_eq!(lost.write, None);
    }

    #[test]
    fn abandoning_a_fair_ticket_writes_no_block() {
        let mut l = lock(Fair, ExclusiveTicketed, 0);
        l.write = Some(block(5));
        let Decision::Send(sent) = l.unlock() else {
            panic!("an abandon is sent")
        };
        assert_eq!(
            (sent.command().flags, sent.value_block()),
            (LockFlags::NONE, None)
        );
    }
}
