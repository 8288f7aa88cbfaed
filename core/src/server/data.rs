//! Lock and object commands (the data path): the hot loop of the server.
//!
//! A data message carries 1–31 commands from one client. The client is resolved once per
//! message; each command is then checked against the slot it names — live, same generation,
//! referenced by this client, of the kind the command says — before its lock word is loaded, the
//! pure transition of `crate::word` applied, and the word stored back. Nothing here allocates,
//! loops over more than the message, or trusts an offset from the client.
//!
//! An unlock is accepted, in every kind, only from a client whose holds record shows a grant in
//! the unlock's mode, or (fair lock) a ticket, which the unlock abandons. The word's own checks
//! (owner, reader count, ticket counters) still apply, but it is the record that makes a grant
//! the caller's: the word has no reader identities, and a fair word accepts an exclusive unlock
//! with no owner. The record is loaded for every command anyway, so the check is one compare.
//! Anything else is `Fail`, the reference's answer to an unlock that is not the caller's.
//!
//! The fair lock keeps the reference's word exactly, and the server's guards of its weaknesses
//! — which need what the server knows of each client — sit beside it in `crate::word::fair`
//! ([`fair::serve`] and its table): this file loads the word and the caller's holds record,
//! calls it, and stores what it returns, forgetting the tickets and grants it says are void.
//!
//! A message flagged `FLAG_ALL_OR_NOTHING` is a unit, executed by `all_or_nothing.rs` through
//! this file's `lock_command_with`; this file owns the command-by-command path, the
//! lock command itself and object commands.

use core::sync::atomic::Ordering;

use super::locks::exclusive_owner;
use super::steps::{atomic_step, fair_step, rw_step};
use super::waiters::{Disposition, MessageMeta};
use super::{Counter, Server};
use crate::config::BATCH_MAX;
use crate::ids::{ClientId, FencingToken, GrantProof, LockKind, Mode, ObjectId};
use crate::manager::value::ValueRead;
use crate::manager::{GrantState, LockValue, ValueBlock};
use crate::proto::{
    Command, CommandResult, FLAG_ALL_OR_NOTHING, LockCommand, LockFlags, LockOp, ObjectCommand,
    ObjectOp, PROTO_VERSION, REQUEST_FLAGS_KNOWN,
};
use crate::status::Status;
use crate::table::SlotState;
use crate::word::{Effect, fair};

/// What a lock command did beyond its reply, for the caller's follow-up work.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Note {
    /// A fair-lock grant preempted other holders, whose records must be forgotten.
    pub(super) fair_preempted: bool,
    /// The lock was given up, so parked waiters on it may now get it.
    pub(super) released: bool,
    /// A holder's grant lapsed before the word step: released for good, even if an
    /// all-or-nothing message undoes the command itself.
    pub(super) lapsed: bool,
    /// The acquisition met a conflicting cached grant inside its minimum hold (`revokes.rs`):
    /// the caller counts it in `Counter::MinHoldConflicts`, once per request (a parked
    /// request's retries only if its earlier attempts did not meet one, `waiters.rs`).
    pub(super) met_hold: bool,
}

/// Whether any of `commands` names a partition epoch other than 0, which a standalone server
/// refuses: it owns no partition at any other epoch, and a client that names one believes it is
/// talking to a cluster server. Refusing (rather than ignoring the field) keeps a cluster
/// client whose map points at a standalone server from being served by a server that owns
/// nothing of the cluster, and answers such a message as a protocol-4 server answered the
/// same bytes (then reserved): as malformed. A protocol-4 client writes 0 there, so it sees
/// no change.
#[inline]
pub(super) fn names_partition_epoch(commands: &[Command]) -> bool {
    commands.iter().any(|c| c.partition_epoch() != 0)
}

/// Where the data path hands each command's outcome, as soon as it is known (see
/// [`Server::execute_with`]): command `i`'s result, its grant's or ticket's proof, and the value
/// block it returns. Every closure of that shape is one; the bytes path has a sink of its own
/// (`frames::FrameReply`) whose method is always inlined: as a closure it was called out of
/// line from the command loop's several sites, and its 16-byte load of the result the loop
/// had just stored as two 8-byte halves was a store-forwarding stall on every command.
pub(super) trait Reply {
    /// Takes command `i`'s outcome: its result `r`, proof `p` and value block `v`.
    fn reply(&mut self, i: usize, r: &CommandResult, p: &GrantProof, v: Option<&ValueRead>);
}

impl<F: FnMut(usize, &CommandResult, &GrantProof, Option<&ValueRead>)> Reply for F {
    #[inline]
    fn reply(&mut self, i: usize, r: &CommandResult, p: &GrantProof, v: Option<&ValueRead>) {
        self(i, r, p, v)
    }
}

impl<'r> Server<'r> {
    /// Executes one data message from client `raw_client`: `commands` in order, results into
    /// `results[..commands.len()]`. A message from an unknown client or during recovery gets the
    /// same status for every command. `Err(Einval)` (and nothing executed) for an empty message,
    /// more than 31 commands, a command naming a partition epoch other than 0 (a standalone
    /// server owns nothing at any other: `proto::LockCommand::partition_epoch`), `flags` with a
    /// bit beyond the request flags (`proto::REQUEST_FLAGS_KNOWN`, as the wire decoder refuses
    /// them: the server keeps its own marks in a parked request's other bits), or a `results`
    /// slice too short. A waiting trylock that could not be granted at once is parked:
    /// `Deferred`, and its reply comes from [`Self::take_replies`].
    pub fn execute_message(
        &mut self,
        raw_client: u32,
        flags: u32,
        commands: &[Command],
        results: &mut [CommandResult],
        now_ms: u64,
    ) -> Result<Disposition, Status> {
        if results.len() < commands.len()
            || flags & !REQUEST_FLAGS_KNOWN != 0
            || (!self.is_cluster() && names_partition_epoch(commands))
        {
            return Err(self.refuse(Status::Einval));
        }
        let meta = MessageMeta {
            version: PROTO_VERSION,
            message_id: 0,
            flags,
        };
        let found = self.client_slot(raw_client);
        self.execute_with(
            (raw_client, found),
            meta,
            commands.len(),
            // This entry carries no value blocks: `execute_message_with_values` does.
            (|i| commands[i], |_| None),
            &mut |i: usize, r: &CommandResult, _proof: &GrantProof, _value: Option<&ValueRead>| {
                // Field by field: a whole-struct copy reloads the 16-byte word with one vector
                // load right after it was stored as two 8-byte halves, a store-forwarding stall
                // that cost a third of the batch path.
                let dst = &mut results[i];
                dst.status = r.status;
                dst.aux = r.aux;
                dst.word = r.word;
                dst.plain = r.plain;
            },
            now_ms,
        )
    }

    /// The data path proper: `n` commands from client `raw_client`, registered in slot `found`
    /// (the caller looked it up; `None`: not registered), read through `command(i)`, each
    /// outcome handed to `reply(i, result, proof, value)` as soon as it is known — so the bytes path
    /// decodes and encodes in place, with no array of commands or results to fill per message.
    /// `proof` is the grant's or ticket's proof when the server has a session key (see
    /// [`Self::proof_of`]); `value` the lock's value block when the command asked for it and
    /// was granted ([`Self::value_of`]). `block(i)` is the value block command `i` writes, from
    /// the request's value trailer.
    #[inline]
    pub(super) fn execute_with(
        &mut self,
        (raw_client, found): (u32, Option<u32>),
        meta: MessageMeta,
        n: usize,
        (command, block): (
            impl Fn(usize) -> Command,
            impl Fn(usize) -> Option<ValueBlock>,
        ),
        reply: &mut impl Reply,
        now_ms: u64,
    ) -> Result<Disposition, Status> {
        if n == 0 || n > BATCH_MAX {
            return Err(self.refuse(Status::Einval));
        }
        self.stats.bump(Counter::DataMessages);
        self.stats.add(Counter::DataCommands, n as u64);
        let all_or_nothing = meta.flags & FLAG_ALL_OR_NOTHING != 0;
        let slot = match self.serving_slot(found, now_ms) {
            // Object commands cannot be undone (clients change cells one-sided), so they have
            // no place in an all-or-nothing message.
            Ok(_)
                if all_or_nothing
                    && (0..n)
                        .any(|i| matches!(command(i), Command::Object(_) | Command::Join(_))) =>
            {
                Err(Status::Einval)
            }
            other => other,
        };
        let slot = match slot {
            Ok(slot) => slot,
            Err(s) => {
                for i in 0..n {
                    reply.reply(
                        i,
                        &CommandResult::status(self.refuse(s)),
                        &GrantProof::NONE,
                        None,
                    );
                }
                return Ok(Disposition::Replied);
            }
        };
        // `serving_slot` found the id registered, so it is a valid id.
        let Some(me) = ClientId::new(raw_client) else {
            return Err(Status::ClientNotInit);
        };
        if n == 1
            && let Command::Lock(c) = command(0)
            && c.wait_ms != 0
        {
            if let Some(r) = self.cluster_refusal(slot, &command(0), now_ms) {
                reply.reply(0, &r, &GrantProof::NONE, None);
                return Ok(Disposition::Replied);
            }
            return Ok(self.execute_waiting(slot, me, &c, meta, reply, now_ms));
        }
        if all_or_nothing {
            let mut results = [CommandResult::status(Status::Success); BATCH_MAX];
            let commands = (&command, &block);
            self.execute_all_or_nothing(slot, me, n, commands, &mut results[..n], now_ms);
            for (i, r) in results[..n].iter().enumerate() {
                // The message is a unit, so the values it returns are those after all of it.
                let (proof, value) = match command(i) {
                    Command::Lock(c) => {
                        (self.proof_of(raw_client, &c, r, true), self.value_of(&c, r))
                    }
                    _ => (GrantProof::NONE, None),
                };
                reply.reply(i, r, &proof, value.as_ref());
            }
            return Ok(Disposition::Replied);
        }
        // Each arm replies itself: a `(result, proof, value)` tuple built by the match and
        // handed on was stored in 8-byte halves and reloaded with 16-byte loads, a
        // store-forwarding stall per command (a fifth of a 31-command message).
        for i in 0..n {
            let cmd = command(i);
            if let Some(r) = self.cluster_refusal(slot, &cmd, now_ms) {
                reply.reply(i, &r, &GrantProof::NONE, None);
                continue;
            }
            match cmd {
                // A waiting request must be alone in its message: its reply may come later. A
                // stream transport answers a lone join, and closes on one among other
                // commands, before either gets here (`route::joining`); there is nothing to
                // join over shared memory or RDMA.
                Command::Lock(LockCommand { wait_ms: 1.., .. }) | Command::Join(_) => {
                    reply.reply(
                        i,
                        &CommandResult::status(self.refuse(Status::Einval)),
                        &GrantProof::NONE,
                        None,
                    );
                }
                Command::Lock(c) => {
                    let (r, note) = self.lock_command(slot, me, &c, block(i).as_ref(), now_ms);
                    self.count_min_hold(note, false);
                    if note.fair_preempted {
                        self.forget_preempted_holders(c.lock, slot);
                    }
                    // Read before waking waiters: a waiter granted now cannot change it (only
                    // an exclusive holder writes, at its unlock), but the order keeps that
                    // obvious.
                    let value = self.value_of(&c, &r);
                    if note.released && self.waiting > 0 {
                        self.wake_waiters(c.lock, now_ms);
                    }
                    reply.reply(
                        i,
                        &r,
                        &self.proof_of(raw_client, &c, &r, false),
                        value.as_ref(),
                    );
                }
                Command::Object(o) => {
                    reply.reply(i, &self.object_command(slot, &o), &GrantProof::NONE, None);
                }
            }
        }
        Ok(Disposition::Replied)
    }

    /// One lock command; the flag says a fair-lock grant preempted other holders, whose
    /// records the caller must forget (see `forget_preempted_holders`).
    ///
    /// Inlined into [`Self::execute_message`]'s loop, which is not generic so that both are
    /// compiled in this crate: here the lock-word accessors that `bitfield-struct` generates
    /// (without `#[inline]`) inline too, which they could not into a caller in another crate.
    #[inline(always)]
    pub(super) fn lock_command(
        &mut self,
        slot: u32,
        me: ClientId,
        c: &LockCommand,
        written: Option<&ValueBlock>,
        now_ms: u64,
    ) -> (CommandResult, Note) {
        self.lock_command_with(slot, me, c, written, now_ms, |_, _| {})
    }

    /// [`Self::lock_command`], calling `before_step(self, lock)` once the command has passed
    /// its checks (the lock referenced, its kind, no retained grant in the way) and its revoke
    /// decision has run, just before the word step changes lock slot `lock`: where an
    /// all-or-nothing message copies the slot for its undo. The decision runs here and only
    /// here, after the checks, so a refused command sends no revoke and lapses no holder.
    #[inline(always)]
    pub(super) fn lock_command_with(
        &mut self,
        slot: u32,
        me: ClientId,
        c: &LockCommand,
        written: Option<&ValueBlock>,
        now_ms: u64,
        before_step: impl FnOnce(&Self, u32),
    ) -> (CommandResult, Note) {
        let (id, state) = match self.referenced_lock_state(slot, c.lock) {
            Ok(found) => found,
            Err(s) => return (CommandResult::status(self.refuse(s)), Note::default()),
        };
        let lock = id.index();
        if state.kind() != c.kind {
            return (
                CommandResult::status(self.refuse(Status::Einval)),
                Note::default(),
            );
        }
        let cell = self.t.lock_cells[lock as usize];
        if c.op.acquires() && self.retained_blocks(lock, c.kind, c.op.mode()) {
            // Before the word, which would let an expired retained grant be taken over
            // (`retained.rs`).
            let refused = CommandResult {
                word: cell.word,
                ..CommandResult::status(self.refuse(Status::LockRetained))
            };
            return (refused, Note::default());
        }
        // Cached holders in the way are asked for the lock back, and lapsed ones released,
        // before the word decides (`revokes.rs`).
        let revoked = match c.op.acquires() {
            true => self.revoke_decision(slot, lock, c, now_ms),
            false => super::revokes::Revoked::default(),
        };
        let cell = match revoked.lapsed {
            true => self.t.lock_cells[lock as usize],
            false => cell,
        };
        before_step(self, lock);
        let hold = self.current_hold(slot, me, lock);
        let before = cell;
        let step = match c.kind {
            LockKind::Atomic => atomic_step(&cell, me, c, hold, now_ms),
            LockKind::Rw => rw_step(&cell, me, c, hold, now_ms),
            LockKind::Fair => fair_step(&cell, me, c, hold, now_ms),
        };
        let cell = &mut self.t.lock_cells[lock as usize];
        cell.word = step.word;
        cell.ext = step.ext;
        let mut word = step.word;
        if let Some(t) = step.ticket {
            // The caller learns its ticket from the reply word, as the reference patches it.
            word = fair::FairWord::from_bits(word)
                .with_mx(t.exclusive)
                .with_ms(t.shared)
                .into_bits();
        }
        let mut plain = false;
        let mut note = Note {
            released: revoked.lapsed,
            lapsed: revoked.lapsed,
            // The word may grant all the same, taking over an expired grant or preempting a
            // timed-out fair one the decision judged inside its hold: not a request that met it.
            met_hold: revoked.held && !matches!(step.effect, Effect::Granted { .. }),
            ..Note::default()
        };
        let aux = match step.effect {
            Effect::Granted { mode, preempted } => {
                let owner_before = exclusive_owner(c.kind, &before);
                if owner_before != 0 && owner_before != me.get() {
                    // An expired exclusive grant taken over, or preempted: its holder may have
                    // changed what the value block describes without writing it.
                    self.t.lock_values[lock as usize].grant_lost(Mode::Exclusive);
                }
                // A cluster partition's counter has room: `cluster_refusal` checked it before.
                let token = FencingToken(self.issue_token_in(state.partition()));
                self.t.lock_cells[lock as usize].fence = token.0;
                let retain = c.flags.contains(LockFlags::RETAIN);
                let granted = GrantState::granted(mode, revoked.cached, retain);
                self.t.lock_holds.set(slot, lock, granted.bits());
                if revoked.cached {
                    self.note_cached_grant(lock, revoked.wanted, now_ms);
                } else if c.flags.contains(LockFlags::CACHEABLE) {
                    // Asked cached, granted plain: on a contended lock, or over a holder the
                    // revoke decision saw in the way whose grant the word then took over
                    // (expired) or preempted (a fair timeout). The client counts an unmarked
                    // grant as cached, and nothing would ever revoke it: protocol 8 reads the
                    // mark in the result; an older client is sent the revoke notice it has
                    // always answered (`manager::contention`).
                    if revoked.contended {
                        self.stats.bump(Counter::ContendedGrants);
                    }
                    plain = self.tell_plain_grant(slot, lock);
                }
                self.stats.bump(Counter::Grants);
                if preempted {
                    self.stats.bump(Counter::Preemptions);
                }
                note.fair_preempted = step.others_void;
                token.0
            }
            Effect::Queued(t) => {
                // A fair request queued behind holders in its way: a conflict.
                self.note_conflict(lock, now_ms);
                let ticket = GrantState::ticketed(c.op.mode());
                self.t.lock_holds.set(slot, lock, ticket.bits());
                t.exclusive as u64 | (t.shared as u64) << 16
            }
            Effect::Released(mode) => {
                if hold.revoke_outstanding() {
                    self.stats.bump(Counter::RevokesGivenBack);
                }
                self.t.lock_holds.set(slot, lock, GrantState::None.bits());
                if c.flags.writes_value(c.op as u8) {
                    // The decoder gives a block to exactly the commands that write one, and
                    // `writes_value` holds only for exclusive unlocks, so this is `Written`.
                    let _ = self.t.lock_values[lock as usize].release(mode, written);
                }
                note.released = true;
                cell.fence
            }
            Effect::Extended => cell.fence,
            Effect::Downgraded => {
                // Still held, shared now, and still cached if it was: the revoke, if any, is
                // answered (`GrantState::downgraded`). The exclusive turn ends here, so the
                // block is written (or kept) as at an exclusive unlock.
                self.t.lock_holds.set(slot, lock, hold.downgraded().bits());
                self.stats.bump(Counter::Downgrades);
                if c.flags.writes_value(c.op as u8) {
                    let _ = self.t.lock_values[lock as usize].release(Mode::Exclusive, written);
                }
                // Readers parked behind the writer may join now.
                note.released = true;
                cell.fence
            }
            Effect::None => {
                if step.ticket_void {
                    self.t.lock_holds.set(slot, lock, GrantState::None.bits());
                } else if c.op.acquires() && step.status == Status::Fail {
                    // Refused for a holder in a conflicting mode, plain or cached: whether it
                    // now waits or gives up, the lock is fought over. (A fair request still
                    // queued is `Effect::Queued`, stamped there.)
                    self.note_conflict(lock, now_ms);
                }
                0
            }
        };
        let status = self.refuse(step.status);
        let r = CommandResult {
            status,
            word,
            aux,
            plain,
        };
        (r, note)
    }

    /// After a fair-lock timeout preemption by client `slot`, no other client holds a grant on
    /// `raw_lock` any more, and every other outstanding ticket is void: forget them all, so
    /// cleanup and `release_lock` see the truth and no voided ticket can be retried (guard 3 of
    /// `crate::word::fair`, which says why every ticket goes).
    pub(super) fn forget_preempted_holders(&mut self, raw_lock: u32, slot: u32) {
        let Some(id) = crate::ids::LockId::from_raw(raw_lock) else {
            return;
        };
        let lock = id.index();
        for other in 0..self.t.client_free.high_water() {
            if other != slot && self.t.lock_holds.get(other, lock) != GrantState::None.bits() {
                self.t.lock_holds.set(other, lock, GrantState::None.bits());
            }
        }
    }

    /// The value block result `r` of lock command `c` returns: the lock's, when `c` is an
    /// acquisition flagged [`LockFlags::VALUE_BLOCK`] that was granted; `None` otherwise (one
    /// branch when the flag is not set).
    #[inline]
    pub(super) fn value_of(&self, c: &LockCommand, r: &CommandResult) -> Option<ValueRead> {
        let acquires = matches!(
            c.op,
            LockOp::TryExclusive
                | LockOp::TryShared
                | LockOp::TicketExclusive
                | LockOp::TicketShared
        );
        if !c.flags.contains(LockFlags::VALUE_BLOCK) || !acquires || r.status != Status::Success {
            return None;
        }
        let id = crate::ids::LockId::from_raw(c.lock)?;
        self.t
            .lock_values
            .get(id.index() as usize)
            .map(LockValue::read)
    }

    /// One object command: FAA, CAS or snapshot on a cell the client has a reference to.
    fn object_command(&mut self, slot: u32, o: &ObjectCommand) -> CommandResult {
        let Some(index) = self.referenced_object(slot, o.object) else {
            return CommandResult::status(self.refuse(Status::ObjectNotGet));
        };
        let cell = &self.t.object_cells[index as usize];
        // Orderings: a cell is a self-contained counter, and single-location read-modify-writes
        // are totally ordered whatever the ordering, which is all XID/CSN uniqueness needs.
        // AcqRel/Acquire (free on x86) additionally let a shared-memory client use a cell to
        // publish other memory of its own, as it could with a local atomic.
        if self.is_cluster() {
            return self.cluster_object_command(slot, index, o);
        }
        let (status, aux) = match o.op {
            ObjectOp::Faa => (Status::Success, cell.fetch_add(o.a, Ordering::AcqRel)),
            ObjectOp::Cas => {
                match cell.compare_exchange(o.a, o.b, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(old) => (Status::Success, old),
                    Err(seen) => (self.refuse(Status::ObjectCasFailed), seen),
                }
            }
            ObjectOp::Snapshot => (Status::Success, cell.load(Ordering::Acquire)),
        };
        CommandResult {
            aux,
            ..CommandResult::status(status)
        }
    }

    /// [`Self::object_command`] on a cluster server: a counter moves only up to its persisted
    /// high-water mark (`cluster::counter`), else `NotReady` while the mark is reserved ahead.
    /// The data thread is the only writer of a cluster object's cell (no one-sided atomics in
    /// a cluster), so reading the value and then writing it is not raced.
    #[cold]
    fn cluster_object_command(
        &mut self,
        _slot: u32,
        index: u32,
        o: &ObjectCommand,
    ) -> CommandResult {
        let cell = &self.t.object_cells[index as usize];
        // Acquire/Release: as the standalone path's read-modify-writes.
        let value = cell.load(Ordering::Acquire);
        let to = match o.op {
            ObjectOp::Faa => value.checked_add(o.a),
            ObjectOp::Cas if value == o.a => Some(o.b),
            ObjectOp::Cas => {
                let status = self.refuse(Status::ObjectCasFailed);
                return CommandResult {
                    aux: value,
                    ..CommandResult::status(status)
                };
            }
            ObjectOp::Snapshot => Some(value),
        };
        let Some(to) = to else {
            return CommandResult::status(self.refuse(Status::Einval));
        };
        if to != value && !self.counter_gate(index, o.object, value, to) {
            return CommandResult::status(self.refuse(Status::NotReady));
        }
        self.t.object_cells[index as usize].store(to, Ordering::Release);
        CommandResult {
            aux: value,
            ..CommandResult::status(Status::Success)
        }
    }

    /// The cell index of object `raw` if it is live at the id's generation and client `slot`
    /// holds a reference to it.
    #[inline]
    pub(super) fn referenced_object(&self, slot: u32, raw: u32) -> Option<u32> {
        let id = ObjectId::from_raw(raw)?;
        let index = id.index();
        if index >= self.cfg.objects_max {
            return None;
        }
        let state = SlotState(self.t.object_meta[index as usize].state);
        (state.is_live()
            && state.generation() == id.generation()
            && self.t.object_refs.get(slot, index) != 0)
            .then_some(index)
    }
}
