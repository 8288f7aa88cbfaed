//! Blocking `lock()` without polling: trylocks that wait on the server.
//!
//! The reference's `lock()` is a client loop of trylock and 100 ms sleeps, so a contended lock
//! changes hands at 100 ms granularity. Here a trylock may carry `wait_ms`: if the lock cannot
//! be granted at once, the request is *parked* in the client's waiter slot (one per client, a
//! fixed pool in the region) on its lock's FIFO, and its reply is produced the moment the lock
//! is granted to it — when a holder unlocks, dies, or its grant expires — or `Etimeout` when the
//! deadline passes. Fair-lock waiters hold a ticket and are served strictly in ticket order; for
//! the other kinds the FIFO is kept: a parked request is retried only after those parked before
//! it on the same lock were served.
//!
//! Wake-ups come from three places: the data path after a command released a lock that has
//! waiters, client cleanup (death, deinit), and [`Server::poll_waiters`], which the runtime calls
//! from its loop and which acts only when the earliest time-based event (a deadline, an expiry,
//! the end of a fair lock's hand-off window) is due. Decided waiters wait in their slots until
//! [`Server::take_replies`] collects them.
//!
//! A client with a parked request is alive by definition (its transport has not reported it
//! lost), so its lease does not run out while it waits.

use super::data::Reply;
use super::{Counter, Server};
use crate::ids::{ClientId, GrantProof, LockId, LockKind, Ticket};
use crate::manager::GrantState;
use crate::manager::value::ValueRead;
use crate::proto::{
    Command, CommandResult, DataHeader, EncodeError, LockCommand, LockFlags, LockOp,
    begin_data_response, decode_data_request, encode_data_request, finish_data_proofs,
    finish_value_replies, put_data_proof, put_data_result, put_value_reply,
};
use crate::status::Status;
use crate::table::{SlotState, Waiter, WaiterState};
use crate::word::{atomic, fair};

/// Whether a data message was answered now or parked.
///
/// Only a message holding a waiting trylock (`wait_ms > 0`) can be deferred; callers that send
/// none may ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Every command has its reply.
    Replied,
    /// The (single, waiting) command was parked; its reply will come from `take_replies`.
    Deferred,
}

/// The parts of a data message's header a parked request must echo in its late reply.
#[derive(Clone, Copy, Debug)]
pub(super) struct MessageMeta {
    pub(super) version: u8,
    pub(super) message_id: u16,
    pub(super) flags: u32,
}

/// The late reply to a parked request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitReply {
    /// The client to send it to.
    pub client: u32,
    /// The client's slot (its mailbox on the shared-memory transport).
    pub slot: u32,
    /// The request's header (version, message id, flags echoed; count 1).
    pub header: DataHeader,
    /// The request, as the client sent it.
    pub command: LockCommand,
    /// The outcome.
    pub result: CommandResult,
    /// The grant's proof (none without a session key, or without a grant).
    pub proof: GrantProof,
    /// The lock's value block, when the request asked for it and was granted.
    pub value: Option<ValueRead>,
}

impl WaitReply {
    /// Encodes the reply data message (the same bytes `handle_data` would have written, its
    /// proof trailer included).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let mut req = [0u8; 48];
        encode_data_request(&self.header, &[Command::Lock(self.command)], &mut req)?;
        let req = decode_data_request(&req).map_err(|_| EncodeError::Invalid)?;
        let mut len = begin_data_response(&req, out)?;
        put_data_result(&req, 0, &self.result, out)?;
        if req.wants_values() {
            put_value_reply(out, 1, 0, self.value.as_ref(), true)?;
            len = finish_value_replies(out, 1)?;
        }
        if self.proof.is_none() {
            return Ok(len);
        }
        put_data_proof(out, 1, 0, &self.proof.mac, true)?;
        finish_data_proofs(out, 1)
    }
}

/// Where a parked request's [`LockFlags`] sit in [`Waiter::flags`]: the top byte (the header's
/// flags use the low four bits).
const WAITER_LOCK_FLAGS_SHIFT: u32 = 24;

/// In [`Waiter::flags`], below the lock flags: the parked request's grant was made plain
/// ([`CommandResult::plain`]), which its late reply says. The waiter keeps its size.
const WAITER_PLAIN_GRANT: u32 = 1 << 23;

/// In [`Waiter::flags`], below [`WAITER_PLAIN_GRANT`]: an attempt of the parked request met a
/// cached grant inside its minimum hold and was counted (`Counter::MinHoldConflicts`), so its
/// later retries are not counted again.
const WAITER_MET_HOLD: u32 = 1 << 22;

/// The lock flags a parked request was sent with (a zeroed or corrupted byte reads as none).
#[inline]
pub(super) fn waiter_lock_flags(flags: u32) -> LockFlags {
    LockFlags::from_bits((flags >> WAITER_LOCK_FLAGS_SHIFT) as u8).unwrap_or(LockFlags::NONE)
}

/// Whether `status` for this kind means "busy: worth waiting for".
#[inline]
fn blocked(kind: LockKind, status: Status) -> bool {
    // A retained grant in the way is waited out like a busy lock (`retained.rs`).
    status == Status::LockRetained
        || match kind {
            LockKind::Atomic | LockKind::Rw => status == Status::Fail,
            LockKind::Fair => status == Status::Eagain,
        }
}

impl<'r> Server<'r> {
    /// Runs a waiting trylock: answers at once if it is granted or refused for a reason other
    /// than "busy", else parks it.
    pub(super) fn execute_waiting(
        &mut self,
        slot: u32,
        me: ClientId,
        c: &LockCommand,
        meta: MessageMeta,
        reply: &mut impl Reply,
        now_ms: u64,
    ) -> Disposition {
        let waitable = matches!(
            (c.kind, c.op),
            (_, LockOp::TryExclusive | LockOp::TryShared)
                | (
                    LockKind::Fair,
                    LockOp::TicketExclusive | LockOp::TicketShared
                )
        );
        let status = if !waitable {
            Some(Status::Einval)
        } else if self.t.waiters[slot as usize].state != WaiterState::Free as u8 {
            // One parked request per client instance, as the reference allows one async op.
            Some(Status::Easync)
        } else {
            None
        };
        if let Some(s) = status {
            let refused = CommandResult::status(self.refuse(s));
            reply.reply(0, &refused, &GrantProof::NONE, None);
            return Disposition::Replied;
        }
        // A ticket that a preemption passed starts over rather than being refused: the
        // reference's `lock()` loop starts over too, after its trylock is answered `Fail`.
        let tried = match self.restart_of_void_ticket(slot, c.kind, c.op, c.lock) {
            Some(op) => LockCommand { op, ..*c },
            None => *c,
        };
        let (r, note) = self.lock_command(slot, me, &tried, None, now_ms);
        let met_hold = self.count_min_hold(note, false);
        if note.fair_preempted {
            self.forget_preempted_holders(c.lock, slot);
        }
        if !blocked(c.kind, r.status) {
            reply.reply(
                0,
                &r,
                &self.proof_of(me.get(), c, &r, false),
                self.value_of(c, &r).as_ref(),
            );
            return Disposition::Replied;
        }
        // A fair first attempt queued with a ticket: from now on the waiter retries with it.
        // (One refused for a retained grant holds no ticket: it retries its first attempt.)
        let queued = r.status == Status::Eagain;
        let (op, ticket) = match (tried.kind, tried.op) {
            (LockKind::Fair, LockOp::TryExclusive) if queued => {
                (LockOp::TicketExclusive, ticket_of(r.aux))
            }
            (LockKind::Fair, LockOp::TryShared) if queued => {
                (LockOp::TicketShared, ticket_of(r.aux))
            }
            _ => (c.op, c.ticket),
        };
        self.t.waiters[slot as usize] = Waiter {
            deadline_ms: now_ms.saturating_add(c.wait_ms as u64),
            lock: c.lock,
            expire_ms: c.expire_ms,
            client: me.get(),
            // The header's flags use the low bits; the command's lock flags ride in the top
            // byte, for the late grant and its value trailer.
            flags: meta.flags
                | u32::from(c.flags.bits()) << WAITER_LOCK_FLAGS_SHIFT
                | if met_hold { WAITER_MET_HOLD } else { 0 },
            message_id: meta.message_id,
            tx: ticket.exclusive,
            ts: ticket.shared,
            kind: c.kind as u8,
            // Low nibble: the op retried; high nibble: the op the client sent, echoed in the reply.
            op: (c.op as u8) << 4 | op as u8,
            version: meta.version,
            state: WaiterState::Waiting as u8,
            ..Waiter::default()
        };
        self.append_waiter(slot);
        self.waiting += 1;
        self.stats.bump(Counter::Waits);
        self.next_timer_ms = self.next_timer_ms.min(self.retry_at(slot));
        Disposition::Deferred
    }

    /// Retries the waiters parked on lock `raw_lock`, first come first served.
    pub(super) fn wake_waiters(&mut self, raw_lock: u32, now_ms: u64) {
        let Some(id) = LockId::from_raw(raw_lock) else {
            return;
        };
        let lock = id.index() as usize;
        let fair = SlotState(self.t.lock_meta[lock].state).kind() == LockKind::Fair;
        let mut cur = self.t.lock_waiters[lock];
        while cur != 0 {
            let w = cur - 1;
            cur = self.t.waiters[w as usize].next;
            // Outside the fair lock's own ticket order, a waiter that is still blocked keeps
            // everyone parked behind it waiting: no barging past the head of the queue.
            if !self.retry_waiter(w, now_ms) && !fair {
                break;
            }
        }
    }

    /// Retries one parked request; returns whether it was decided.
    fn retry_waiter(&mut self, w: u32, now_ms: u64) -> bool {
        let waiter = self.t.waiters[w as usize];
        let Some(me) = ClientId::new(waiter.client) else {
            return false;
        };
        let Some(kind) = LockKind::from_u8(waiter.kind) else {
            return false;
        };
        let Some(op) = LockOp::from_u8(waiter.op & 0xF) else {
            return false;
        };
        if let Some((status, aux)) = self.parked_refusal(waiter.lock, now_ms) {
            // Not granted by a server that does not serve the partition now (fenced, moved,
            // recovering): the client refreshes its map and asks again.
            let r = CommandResult {
                aux,
                ..CommandResult::status(status)
            };
            self.finish_waiter(w, r, now_ms);
            return true;
        }
        // A preemption voids every other fair ticket; a parked waiter whose ticket went that way
        // queues again with a first attempt instead of being refused.
        let restart = self.restart_of_void_ticket(w, kind, op, waiter.lock);
        let (voided, op) = (restart.is_some(), restart.unwrap_or(op));
        let c = LockCommand {
            kind,
            op,
            lock: waiter.lock,
            expire_ms: waiter.expire_ms,
            ticket: Ticket {
                exclusive: waiter.tx,
                shared: waiter.ts,
            },
            wait_ms: 0,
            // A standalone server parks only commands that named epoch 0 (`execute_frame`).
            partition_epoch: 0,
            flags: waiter_lock_flags(waiter.flags),
        };
        let (r, note) = self.lock_command(w, me, &c, None, now_ms);
        if self.count_min_hold(note, waiter.flags & WAITER_MET_HOLD != 0) {
            self.t.waiters[w as usize].flags |= WAITER_MET_HOLD;
        }
        if note.fair_preempted {
            self.forget_preempted_holders(c.lock, w);
        }
        if blocked(kind, r.status) && !super::past(now_ms, waiter.deadline_ms) {
            // A first attempt that queued: a voided ticket's restart, or a fair request that
            // was first refused for a retained grant and has now taken its ticket.
            let first_queued = matches!(op, LockOp::TryExclusive | LockOp::TryShared)
                && kind == LockKind::Fair
                && r.status == Status::Eagain;
            if voided || first_queued {
                // Queued afresh: keep waiting, retrying with the new ticket.
                let retry = if op == LockOp::TryExclusive {
                    LockOp::TicketExclusive
                } else {
                    LockOp::TicketShared
                };
                let waiter = &mut self.t.waiters[w as usize];
                waiter.op = (waiter.op & 0xF0) | retry as u8;
                waiter.tx = r.aux as u16;
                waiter.ts = (r.aux >> 16) as u16;
            }
            return false;
        }
        let r = if blocked(kind, r.status) {
            // The deadline passed. A fair waiter gives its ticket up (the queue moves past it
            // after the hand-off window, as for any abandoned ticket).
            if let Ok(id) = self.referenced_lock(w, waiter.lock)
                && kind == LockKind::Fair
            {
                self.t
                    .lock_holds
                    .set(w, id.index(), GrantState::None.bits());
            }
            self.stats.bump(Counter::WaitTimeouts);
            // Still blocked by a dead client's retained grant: say so, not just "timed out".
            let status = if r.status == Status::LockRetained {
                Status::LockRetained
            } else {
                Status::Etimeout
            };
            CommandResult {
                word: r.word,
                ..CommandResult::status(status)
            }
        } else {
            r
        };
        self.finish_waiter(w, r, now_ms);
        true
    }

    /// The first attempt to make instead of `op` when `op` retries a fair ticket that client
    /// `slot` no longer holds (a preemption passed and forgot it); `None` otherwise.
    fn restart_of_void_ticket(
        &self,
        slot: u32,
        kind: LockKind,
        op: LockOp,
        raw_lock: u32,
    ) -> Option<LockOp> {
        let first = match op {
            LockOp::TicketExclusive => LockOp::TryExclusive,
            LockOp::TicketShared => LockOp::TryShared,
            _ => return None,
        };
        let id = self.referenced_lock(slot, raw_lock).ok()?;
        let hold = self.recorded_hold(slot, id.index());
        (kind == LockKind::Fair && hold.is_none()).then_some(first)
    }

    /// Decides waiter `w` with result `r`: off its lock's queue, reply ready. The client's lease
    /// restarts now: it was waiting on us, not silent.
    pub(super) fn finish_waiter(&mut self, w: u32, r: CommandResult, now_ms: u64) {
        self.unlink_waiter(w);
        self.t.clients[w as usize].last_seen_ms = now_ms;
        let waiter = &mut self.t.waiters[w as usize];
        waiter.state = WaiterState::Ready as u8;
        waiter.status = r.status as u16;
        waiter.word = r.word;
        waiter.aux = r.aux;
        if r.plain {
            waiter.flags |= WAITER_PLAIN_GRANT;
        }
        self.waiting -= 1;
        self.ready += 1;
    }

    /// When [`Server::poll_waiters`] next has something to do (`u64::MAX`: nothing parked): a
    /// runtime that sleeps while idle sleeps no later than this, or a parked request's deadline,
    /// a lapse or a revoke due at the end of a minimum hold waits for its wake-up.
    #[inline]
    pub fn next_timer_ms(&self) -> u64 {
        let waiters = match self.waiting {
            0 => u64::MAX,
            _ => self.next_timer_ms,
        };
        waiters.min(self.revokes_due_ms)
    }

    /// Acts on time: parked requests whose deadline passed are answered `Etimeout`, queues
    /// whose lock may have become free by expiry or the end of a hand-off window are retried,
    /// and revokes a trylock left due at the end of a minimum hold go out.
    /// Cheap when nothing is due: call it on every turn of the runtime's loop.
    #[inline]
    pub fn poll_waiters(&mut self, now_ms: u64) {
        if now_ms >= self.revokes_due_ms {
            self.send_deferred_revokes(now_ms);
        }
        if self.waiting > 0 && now_ms >= self.next_timer_ms {
            self.poll_waiters_due(now_ms);
        }
    }

    #[cold]
    fn poll_waiters_due(&mut self, now_ms: u64) {
        let slots = self.t.client_free.high_water();
        // Every queue with a waiter due is retried from its head, which keeps each FIFO fair;
        // retrying also answers waiters whose deadline passed.
        for w in 0..slots {
            let waiter = self.t.waiters[w as usize];
            if waiter.state == WaiterState::Waiting as u8 && now_ms >= self.retry_at(w) {
                if super::past(now_ms, waiter.deadline_ms) {
                    self.retry_waiter(w, now_ms);
                } else {
                    self.wake_waiters(waiter.lock, now_ms);
                }
            }
        }
        self.next_timer_ms = (0..slots)
            .filter(|&w| self.t.waiters[w as usize].state == WaiterState::Waiting as u8)
            .map(|w| self.retry_at(w))
            .min()
            .unwrap_or(u64::MAX);
    }

    /// When waiter `w` next deserves a retry without anyone unlocking: its deadline, or the
    /// tick after which its lock's current grant (or hand-off window) lapses.
    fn retry_at(&self, w: u32) -> u64 {
        let waiter = &self.t.waiters[w as usize];
        let deadline = waiter.deadline_ms.saturating_add(1);
        let Some(id) = LockId::from_raw(waiter.lock) else {
            return deadline;
        };
        let Some(cell) = self.t.lock_cells.get(id.index() as usize) else {
            return deadline;
        };
        let lapse = match LockKind::from_u8(waiter.kind) {
            Some(LockKind::Atomic) => atomic::AtomicWord::from_bits(cell.word).expiry_ms(),
            Some(LockKind::Fair) => fair::FairWord::from_bits(cell.word).timeout_ms(),
            // RW grants never lapse; only an unlock or a death frees them.
            _ => u64::MAX,
        };
        // A cached holder's minimum hold ends (its revoke is due) or its revoke lapses.
        let revoke = match self.t.lock_manager[id.index() as usize].retry_at_ms {
            0 => u64::MAX,
            at => at,
        };
        deadline.min(lapse.saturating_add(1)).min(revoke)
    }

    /// Replies of parked requests that have been decided.
    #[inline]
    pub fn replies_ready(&self) -> u32 {
        self.ready
    }

    /// Hands every decided parked request's reply to `sink` and frees its slot.
    pub fn take_replies(&mut self, mut sink: impl FnMut(WaitReply)) {
        if self.ready == 0 {
            return;
        }
        for w in 0..self.t.client_free.high_water() {
            let waiter = self.t.waiters[w as usize];
            if waiter.state != WaiterState::Ready as u8 {
                continue;
            }
            self.t.waiters[w as usize] = Waiter::default();
            self.ready -= 1;
            let (Some(kind), Some(sent_op), Some(status)) = (
                LockKind::from_u8(waiter.kind),
                LockOp::from_u8(waiter.op >> 4),
                Status::from_code(waiter.status),
            ) else {
                continue;
            };
            let command = LockCommand {
                kind,
                op: sent_op,
                lock: waiter.lock,
                expire_ms: waiter.expire_ms,
                ticket: Ticket {
                    exclusive: waiter.tx,
                    shared: waiter.ts,
                },
                wait_ms: 0,
                // A standalone server parks only commands that named epoch 0.
                partition_epoch: 0,
                flags: waiter_lock_flags(waiter.flags),
            };
            let result = CommandResult {
                status,
                word: waiter.word,
                aux: waiter.aux,
                plain: waiter.flags & WAITER_PLAIN_GRANT != 0,
            };
            // A parked request is alone in its message, never all-or-nothing.
            let proof = self.proof_of(waiter.client, &command, &result, false);
            // Read now, in the turn that granted it: nobody can have written it since (the
            // waiter holds the grant, and only an exclusive holder writes).
            let value = self.value_of(&command, &result);
            sink(WaitReply {
                client: waiter.client,
                slot: w,
                header: DataHeader {
                    version: waiter.version,
                    count: 1,
                    message_id: waiter.message_id,
                    client: waiter.client,
                    flags: waiter.flags
                        & !(0xFF << WAITER_LOCK_FLAGS_SHIFT | WAITER_PLAIN_GRANT | WAITER_MET_HOLD),
                },
                command,
                result,
                proof,
                value,
            });
        }
    }

    /// The transport lost the connection client `raw`'s parked request was to be answered on,
    /// while the client itself lives on (it reconnected its data path, which gives up on what
    /// the old path had in flight): drops the request, so the client may park another (one
    /// per client) and a lock is not granted later to a request nobody reads the reply of.
    ///
    /// A request already decided is dropped too; its reply had nowhere to go either. If it was a
    /// grant, the lock is released again at `now_ms`: the client never learns it holds it, so
    /// it would never unlock it (an RW grant has no lease to run out).
    pub fn cancel_parked(&mut self, raw: u32, now_ms: u64) {
        self.cancel_parked_in(self.client_slot(raw), raw, now_ms);
    }

    /// [`Self::cancel_parked`] for a client its caller found in `slot` (`None`: not
    /// registered).
    pub(super) fn cancel_parked_in(&mut self, slot: Option<u32>, raw: u32, now_ms: u64) {
        let Some(slot) = slot else {
            return;
        };
        let waiter = self.t.waiters[slot as usize];
        if waiter.client != raw {
            // Nothing of this client's is parked (a slot's waiter is its own client's).
            return;
        }
        let granted = waiter.state == WaiterState::Ready as u8
            && matches!(
                Status::from_code(waiter.status),
                Some(Status::Success | Status::Done)
            );
        self.cancel_waiter(slot);
        if granted {
            self.release_undelivered_grant(slot, &waiter, now_ms);
        }
    }

    /// Unlocks, for the client in `slot`, what its parked request `waiter` was granted and
    /// never told of; waiters queued behind it are retried.
    fn release_undelivered_grant(&mut self, slot: u32, waiter: &Waiter, now_ms: u64) {
        let (Some(me), Some(kind), Some(op)) = (
            ClientId::new(waiter.client),
            LockKind::from_u8(waiter.kind),
            LockOp::from_u8(waiter.op & 0xF),
        ) else {
            return;
        };
        let unlock = match op {
            LockOp::TryExclusive | LockOp::TicketExclusive => LockOp::UnlockExclusive,
            LockOp::TryShared | LockOp::TicketShared => LockOp::UnlockShared,
            _ => return,
        };
        // A fair grant is held under the ticket the server wrote into the granting word, as the
        // client would have read it from the reply.
        let ticket = match kind {
            LockKind::Fair => fair::FairWord::from_bits(waiter.word).counters(),
            LockKind::Atomic | LockKind::Rw => Ticket::default(),
        };
        let c = LockCommand {
            kind,
            op: unlock,
            lock: waiter.lock,
            expire_ms: 0,
            ticket,
            wait_ms: 0,
            // A standalone server parks only commands that named epoch 0 (`execute_frame`).
            partition_epoch: 0,
            flags: LockFlags::NONE,
        };
        let _ = self.lock_command(slot, me, &c, None, now_ms);
        self.wake_waiters(waiter.lock, now_ms);
    }

    /// Drops client `slot`'s parked request, answered or not (the client is gone or lost).
    pub(super) fn cancel_waiter(&mut self, slot: u32) {
        match self.t.waiters[slot as usize].state {
            s if s == WaiterState::Waiting as u8 => {
                self.unlink_waiter(slot);
                self.waiting -= 1;
            }
            s if s == WaiterState::Ready as u8 => self.ready -= 1,
            _ => return,
        }
        self.t.waiters[slot as usize] = Waiter::default();
    }

    /// Appends waiter `w` to its lock's FIFO.
    fn append_waiter(&mut self, w: u32) {
        let Some(id) = LockId::from_raw(self.t.waiters[w as usize].lock) else {
            return;
        };
        let lock = id.index() as usize;
        let mut link = self.t.lock_waiters[lock];
        if link == 0 {
            self.t.lock_waiters[lock] = w + 1;
            return;
        }
        while self.t.waiters[link as usize - 1].next != 0 {
            link = self.t.waiters[link as usize - 1].next;
        }
        self.t.waiters[link as usize - 1].next = w + 1;
    }

    /// Takes waiter `w` off its lock's FIFO.
    fn unlink_waiter(&mut self, w: u32) {
        let Some(id) = LockId::from_raw(self.t.waiters[w as usize].lock) else {
            return;
        };
        let lock = id.index() as usize;
        let next = self.t.waiters[w as usize].next;
        self.t.waiters[w as usize].next = 0;
        if self.t.lock_waiters[lock] == w + 1 {
            self.t.lock_waiters[lock] = next;
            return;
        }
        let mut link = self.t.lock_waiters[lock];
        while link != 0 {
            let l = link as usize - 1;
            if self.t.waiters[l].next == w + 1 {
                self.t.waiters[l].next = next;
                return;
            }
            link = self.t.waiters[l].next;
        }
    }
}

/// A ticket from a fair `Eagain` reply's `aux`.
#[inline]
fn ticket_of(aux: u64) -> Ticket {
    Ticket {
        exclusive: aux as u16,
        shared: (aux >> 16) as u16,
    }
}
