//! Lock operations on referenced locks: `trylock`, `lock` (waiting on the server), `unlock`,
//! `lock_extend`, and their batches of up to 31.
//!
//! Each call asks the client's record of the lock what to do ([`LocalLock`]'s decision table in
//! `dlock-core`): answer locally (a re-entry, a cached refusal) or send one command. A command
//! goes through [`Client::round_trip`] and its reply back into the record; a batch goes through
//! the pipeline's batch engine (`pipeline.rs`), submitted and completed at once.

use std::time::Duration;

use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::proto::{Command, LockFlags};
use dlock_core::{FencingToken, LockId, Mode, Status};

use super::{Client, Connection, Decision, Error, LocalLock, Op};

/// A granted (or re-entered) lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a grant's fencing token must go with every write the lock protects"]
pub struct Grant {
    /// `Success`, or `AlreadyLocked` for a re-entry.
    pub status: Status,
    /// The grant's fencing token: pass it with every write the lock protects.
    pub token: FencingToken,
    /// The lock word the server returned.
    pub word: u128,
    /// The lock's value block as the grant returned it, when the lock asks for it
    /// ([`Client::set_value_blocks`]); a re-entry reports the block of the grant it re-enters.
    /// `valid` is false when an exclusive holder was lost without writing it (its node died,
    /// its lease ran out) or after a server failover no re-claim restored it.
    pub value: Option<ValueRead>,
    /// Asked for as cached ([`Client::set_cacheable`]) but granted plain: the server found the
    /// lock contended (protocol 8, `dlock_core::manager::contention`). A cached client gives it
    /// back with its last local release. A re-entry reports the grant it re-enters.
    pub plain: bool,
}

/// A record's answer as the API reports it: a grant (`Done` is the reference's internal
/// "handled", a success), or the status that refused it.
///
/// `AlreadyLocked` is a grant only when the record holds the lock (a re-entry, or a relock the
/// server extended). The server answers a `Try` with it too when it holds a grant for this
/// client that the record lost (its reply never came: a request given up on after its
/// timeout); the record then holds nothing and knows no token, so the answer is no grant: a
/// guard made of it would carry token 0 and its unlock would be answered locally, leaving the
/// server's grant in place.
pub(super) fn grant(status: Status, local: &LocalLock) -> Result<Grant, Status> {
    match status {
        Status::AlreadyLocked if local.state.held_mode().is_none() => Err(status),
        Status::Success | Status::Done | Status::AlreadyLocked => Ok(Grant {
            status: if status == Status::Done {
                Status::Success
            } else {
                status
            },
            token: local.token,
            word: local.word,
            value: local.value,
            plain: local.plain,
        }),
        s => Err(s),
    }
}

/// The wait a blocking request carries in its command: the core's one rounding rule
/// ([`dlock_core::time::duration_to_ms`]: rounded up, saturating), and at least one
/// millisecond, because zero would make it a `trylock`.
pub(super) fn wait_ms(wait: Duration) -> u32 {
    dlock_core::time::duration_to_ms(wait).max(1)
}

impl<C: Connection> Client<C> {
    /// Non-blocking lock in `mode` with a lease of `expire_ms` (`trylock`). A fair lock that
    /// queues returns `Err(Eagain)` holding a ticket: call again to retry with it.
    pub fn trylock(&mut self, id: LockId, mode: Mode, expire_ms: u32) -> Result<Grant, Error> {
        let op = Op::TryLock;
        let d = self.local(op, id)?.trylock(mode, expire_ms, 0);
        self.run(op, id, d, Duration::ZERO)
    }

    /// Lock, waiting on the server up to `wait` (`lock`): answered the moment it is granted, or
    /// `Err(Etimeout)` when the wait runs out.
    pub fn lock(
        &mut self,
        id: LockId,
        mode: Mode,
        expire_ms: u32,
        wait: Duration,
    ) -> Result<Grant, Error> {
        let op = Op::Lock;
        let d = self.local(op, id)?.trylock(mode, expire_ms, wait_ms(wait));
        self.run(op, id, d, wait)
    }

    /// Unlock: `Ok(Success)` when released on the server, `Ok(AlreadyLocked)` when only a
    /// re-entry was counted down.
    pub fn unlock(&mut self, id: LockId) -> Result<Status, Error> {
        let op = Op::Unlock;
        let d = self.local(op, id)?.unlock();
        self.run(op, id, d, Duration::ZERO).map(|g| g.status)
    }

    /// Turns the exclusive grant held on RW lock `id` into a shared one in place
    /// (`LockOp::Downgrade`, a dlock addition): readers parked behind it may join, a writer
    /// keeps waiting, and the holder keeps reading under the same token. A block staged with
    /// [`Client::stage_value`] is written by the downgrade, which ends the exclusive turn.
    /// `Einval` for another kind or a grant not held exclusively.
    pub fn downgrade(&mut self, id: LockId) -> Result<Status, Error> {
        let op = Op::Downgrade;
        let d = self.local(op, id)?.downgrade();
        self.run(op, id, d, Duration::ZERO).map(|g| g.status)
    }

    /// Extends the grant held in `mode` to at least `expire_ms` from now (0 only validates
    /// the grant). `Einval` when `id` is not held in `mode` (or is an RW lock, which has no
    /// lease), as the reference answers `lock_extend` with the other mode's op.
    pub fn lock_extend(&mut self, id: LockId, mode: Mode, expire_ms: u32) -> Result<Grant, Error> {
        let op = Op::Extend;
        let d = self.local(op, id)?.extend(mode, expire_ms);
        self.run(op, id, d, Duration::ZERO)
    }

    /// Asks for `id`'s value block with every grant of it from now on (`on`), or stops asking:
    /// single calls, batches, pipelined batches and asynchronous calls alike then return it in
    /// [`Grant::value`] (and a failover claim offers it back). A per-lock setting rather than
    /// a per-call flag (the Linux DLM's `LKF_VALBLK` is per request) because an engine keeps a
    /// block with a lock for the lock's whole life, and every call shape then carries it
    /// without a variant of its own. Local only; `LockNotGet` for a lock not got.
    pub fn set_value_blocks(&mut self, id: LockId, on: bool) -> Result<(), Error> {
        self.set_ask(Op::SetValueBlocks, id, LockFlags::VALUE_BLOCK, on)
    }

    /// Asks for every grant of `id` from now on to be *retained* if this client dies holding
    /// it (`on`; the server's `manager::retain`): its lease running out or its connection
    /// lost and not resumed leaves the grant held by the dead client, and others are refused
    /// `LockRetained` (a waiting request waits) until a recoverer calls `recovery_done` for
    /// this client after replaying its work. A graceful `deinit` releases it as any grant.
    /// Local only; `LockNotGet` for a lock not got.
    pub fn set_retain(&mut self, id: LockId, on: bool) -> Result<(), Error> {
        self.set_ask(Op::SetRetain, id, LockFlags::RETAIN, on)
    }

    /// Asks for every grant of `id` from now on to be *cached* (`on`; the server's
    /// `manager::revoke`): the server then asks for it back with a revoke
    /// ([`Client::poll_events`]) when another client wants a conflicting mode, instead of
    /// only waiting for the unlock. The holder promises to give it back (unlock, or downgrade
    /// for a reader) when asked; one that does not loses it after the server's revoke timeout,
    /// as at the end of its lease. Local only; `LockNotGet` for a lock not got, `Einval`
    /// (turning it on) over a connection that carries no revokes
    /// ([`Connection::carries_events`]: a cluster's routing link), where a cached grant would
    /// be kept after the server lapsed it and gave it to another.
    pub fn set_cacheable(&mut self, id: LockId, on: bool) -> Result<(), Error> {
        if on && !self.link.carries_events() {
            return Err(Op::SetCacheable.err(Status::Einval));
        }
        self.set_ask(Op::SetCacheable, id, LockFlags::CACHEABLE, on)
    }

    /// Whether this client's connection carries the server's revokes, so that it may hold
    /// cached grants ([`Client::set_cacheable`]).
    pub fn carries_events(&self) -> bool {
        self.link.carries_events()
    }

    /// Asks for every wait on `id` from now on (a [`Client::lock`] or any waiting acquisition)
    /// to end the moment the server sends this client a revoke (`on`; `LockFlags::WAKE_ON_REVOKE`):
    /// it is answered `Err(Etimeout)` as if its wait ran out, however much of it was left. A
    /// client reads its revokes only between its calls ([`Client::poll_events`]), so one blocked
    /// in a wait holds whatever it caches until the wait ends, while the client asking for it
    /// waits too. For a caller that waits in a loop which reads its revokes, gives back, and
    /// waits again; a plain `lock()` would see its wait cut short. Local only; `LockNotGet`
    /// for a lock not got.
    pub fn set_wake_on_revoke(&mut self, id: LockId, on: bool) -> Result<(), Error> {
        self.set_ask(Op::SetWakeOnRevoke, id, LockFlags::WAKE_ON_REVOKE, on)
    }

    /// Sets (`on`) or clears `flag` in what `id`'s acquisitions ask for.
    fn set_ask(&mut self, op: Op, id: LockId, flag: LockFlags, on: bool) -> Result<(), Error> {
        let local = &mut self
            .locks
            .get_mut(id)
            .ok_or_else(|| op.err(Status::LockNotGet))?
            .local;
        let bits = if on {
            local.ask.bits() | flag.bits()
        } else {
            local.ask.bits() & !flag.bits()
        };
        // Only known flags are ever set here.
        local.ask = LockFlags::from_bits(bits).unwrap_or(local.ask);
        Ok(())
    }

    /// Stages `block` (at most 32 bytes, zero-padded) as `id`'s value block, written by the
    /// unlock that releases the exclusive grant held: [`Client::unlock`], a batch or
    /// pipelined unlock, or an asynchronous one (a re-entrant unlock that only counts down
    /// keeps it staged; staging again replaces it). `Einval` for a block longer than 32 bytes
    /// or when `id` is not held exclusively (readers cannot write the block); `Easync` while an
    /// operation on `id` is in flight.
    pub fn stage_value(&mut self, id: LockId, block: &[u8]) -> Result<(), Error> {
        let op = Op::StageValue;
        let block = ValueBlock::from_slice(block).map_err(|s| op.err(s))?;
        let e = self
            .locks
            .get_mut(id)
            .ok_or_else(|| op.err(Status::LockNotGet))?;
        if e.busy {
            return Err(op.err(Status::Easync));
        }
        match e.local.stage_value(block) {
            Status::Success => Ok(()),
            s => Err(op.err(s)),
        }
    }

    /// [`Client::stage_value`] then [`Client::unlock`]: releases the exclusive grant of `id`
    /// and writes `block` as its value block. Nothing is unlocked when the block is refused
    /// (`Einval`: longer than 32 bytes, or `id` not held exclusively).
    pub fn unlock_with_value(&mut self, id: LockId, block: &[u8]) -> Result<Status, Error> {
        self.stage_value(id, block)
            .map_err(|e| Op::Unlock.err(e.status()))?;
        self.unlock(id)
    }

    /// The record of `id` for a single-lock call: refused (`Easync`) while an asynchronous
    /// operation or pipelined batches are outstanding (their replies come first).
    fn local(&mut self, op: Op, id: LockId) -> Result<&mut LocalLock, Error> {
        if self.pending.is_some() || self.pipeline.len() > 0 {
            return Err(op.err(Status::Easync));
        }
        self.locks
            .get_mut(id)
            .map(|e| &mut e.local)
            .ok_or_else(|| op.err(Status::LockNotGet))
    }

    /// Runs one lock decision to its end: sends it (or not), waiting for the reply up to the
    /// request timeout plus the server-side `wait`, and applies the reply to the record.
    fn run(
        &mut self,
        op: Op,
        id: LockId,
        decision: Decision,
        wait: Duration,
    ) -> Result<Grant, Error> {
        let request = match decision {
            Decision::Answer(s) => return self.answered(op, id, s),
            Decision::Send(r) => r,
        };
        let deadline = self.link.now() + self.cfg.timeout + wait;
        // Grants and leases are counted from the send: the server granted no earlier, so the
        // client never trusts a grant longer than the server keeps it (counted from the reply,
        // a delayed reply would stretch it past the server's expiry; the simulator's belief
        // check finds two holders that way).
        let command = [Command::Lock(request.command())];
        let sent_ms = self.round_trip(op, &command, &[request.value_block()], 0, deadline)?;
        let (reply, proof, value) = (self.inbox.results[0], self.proof(0), self.value(0));
        let local = &mut self
            .locks
            .get_mut(id)
            .ok_or_else(|| op.err(Status::LockNotGet))?
            .local;
        let status = local.apply(&request, &reply, proof, value, sent_ms);
        grant(status, local).map_err(|s| op.err(s))
    }

    /// A decision the record made alone, as the call's result.
    pub(super) fn answered(&self, op: Op, id: LockId, s: Status) -> Result<Grant, Error> {
        let local = &self
            .locks
            .get(id)
            .ok_or_else(|| op.err(Status::LockNotGet))?
            .local;
        grant(s, local).map_err(|s| op.err(s))
    }

    /// Trylocks up to 31 locks in one message. Per item unless `all_or_nothing`, in which case
    /// either every lock is granted or none stays held (entries undone report `Eagain`). A lock
    /// that needs the server for an earlier entry of the same batch is answered `Easync` for the
    /// later one: one operation per lock per message. `Err(Easync)` while pipelined batches are
    /// in flight ([`Client::submit_trylock`]). Each entry's result is a bare status: the call
    /// (`batch_trylock`) and its transport are the batch's, reported by the call's own error.
    pub fn batch_trylock(
        &mut self,
        requests: &[(LockId, Mode, u32)],
        all_or_nothing: bool,
        out: &mut [Result<Grant, Status>],
    ) -> Result<(), Error> {
        self.batch(Op::BatchTryLock, requests.len(), out, |c| {
            c.submit_trylocks(Op::BatchTryLock, requests, all_or_nothing)
        })
    }

    /// Unlocks up to 31 locks in one message (per item).
    pub fn batch_unlock(
        &mut self,
        ids: &[LockId],
        out: &mut [Result<Grant, Status>],
    ) -> Result<(), Error> {
        let op = Op::BatchUnlock;
        self.batch(op, ids.len(), out, |c| {
            c.submit(op, ids.len(), 0, |i| ids[i], |l, _| Ok(l.unlock()))
        })
    }

    /// Extends up to 31 grants, each held in the mode given, by its own lease (ms), in one
    /// message (per item; an entry not held in its mode is `Einval`, as in
    /// [`Client::lock_extend`]).
    pub fn batch_lock_extend(
        &mut self,
        requests: &[(LockId, Mode, u32)],
        out: &mut [Result<Grant, Status>],
    ) -> Result<(), Error> {
        let op = Op::BatchExtend;
        self.batch(op, requests.len(), out, |c| {
            let extend = |l: &mut LocalLock, i: usize| Ok(l.extend(requests[i].1, requests[i].2));
            c.submit(op, requests.len(), 0, |i| requests[i].0, extend)
        })
    }
}
