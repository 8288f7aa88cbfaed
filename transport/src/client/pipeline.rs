//! Batches in flight: the batch engine behind every batch call, and the pipelined calls that
//! keep several batch messages on the way at once.
//!
//! A synchronous round trip leaves each side idle while the other works: the client waits while
//! the server executes, the server waits while the client decodes and writes the next batch. With
//! [`Client::submit_trylock`] / [`Client::submit_unlock`] a client sends up to
//! [`Client::pipeline_depth`] batches before it [`Client::complete`]s the oldest, so that it
//! writes batch *n + 1* while the server executes batch *n* (over shared memory each batch has
//! its own mailbox lane; over TCP the replies come back in order).
//!
//! The local state machine stays exact: a batch's local decisions are made when it is submitted
//! and its replies applied when it is completed, in submission order; a lock with an operation
//! in flight is refused (`Easync`) by a later submission until that operation completes (in an
//! all-or-nothing batch, every lock it names: until it completes it may be taken back as a
//! whole), and no single-lock call or synchronous batch runs while batches are in flight. A
//! synchronous batch is a submission completed at once.

use std::time::Instant;

use dlock_core::proto::{Command, FLAG_ALL_OR_NOTHING, ObjectCommand, ObjectOp};
use dlock_core::{LockId, Mode, Status};

use super::local::{Decision, LocalLock, Request};
use super::table::LockTable;
use super::{Client, Grant, Sent, grant, receive};

const BATCH: usize = dlock_core::config::BATCH_MAX;

/// The most batches a client can have in flight on any transport (the link may allow fewer).
pub(super) const DEPTH_MAX: usize = dlock_core::table::layout::MAILBOX_LANES;

/// A filler for unused command slots.
const NO_COMMAND: Command = Command::Object(ObjectCommand {
    op: ObjectOp::Snapshot,
    object: 0,
    a: 0,
    b: 0,
});

/// One submitted batch, until it is completed. Fixed-size, so submitting allocates nothing.
#[derive(Clone, Copy, Debug)]
pub(super) struct InFlight {
    /// The link's ticket for the message (unused when `k == 0`: nothing was sent).
    ticket: u64,
    /// The message id its reply must echo.
    message_id: u16,
    flags: u32,
    /// Entries in the caller's batch.
    n: usize,
    /// Commands sent.
    k: usize,
    /// Per command sent: the caller's entry index, the lock, the request.
    sent: [Option<(usize, LockId, Request)>; BATCH],
    /// Per entry: the result when it was answered without the server (final at submission).
    answered: [Option<Result<Grant, Status>>; BATCH],
    /// Per entry: the record before the local decision, kept where the batch may have to be
    /// taken back (every entry of an all-or-nothing batch; an entry answered locally, until the
    /// message is sent).
    saved: [Option<LocalLock>; BATCH],
}

impl InFlight {
    fn all_or_nothing(&self) -> bool {
        self.flags & FLAG_ALL_OR_NOTHING != 0
    }

    pub(super) fn new() -> Self {
        InFlight {
            ticket: 0,
            message_id: 0,
            flags: 0,
            n: 0,
            k: 0,
            sent: [None; BATCH],
            answered: [None; BATCH],
            saved: [None; BATCH],
        }
    }
}

/// The batches in flight, oldest first: a ring over fixed slots.
#[derive(Debug)]
pub(super) struct Pipeline {
    slots: Box<[InFlight; DEPTH_MAX]>,
    head: usize,
    len: usize,
}

impl Pipeline {
    pub(super) fn new() -> Self {
        Pipeline {
            slots: Box::new([InFlight::new(); DEPTH_MAX]),
            head: 0,
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Forgets every batch in flight (their replies will never be read: a reinit).
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }
}

/// Takes a batch back: puts every record its local decisions touched back as it was, the
/// latest entry first (so a lock named twice ends as it was before its first entry), and frees
/// the locks it marked busy.
fn unwind(f: &InFlight, locks: &mut LockTable) {
    for before in f.saved[..f.n].iter().rev().flatten() {
        if let Some(e) = locks.get_mut(before.id) {
            e.local = *before;
        }
    }
    release(f, locks);
}

/// Frees the locks a batch marked busy: those it sent, and in an all-or-nothing batch every
/// lock it decided on (until it completes, its local answers may still be taken back, so no
/// later batch may change those records either).
fn release(f: &InFlight, locks: &mut LockTable) {
    let sent = f.sent[..f.k].iter().flatten().map(|(_, id, _)| id);
    let decided = f.saved[..f.n].iter().flatten().map(|before| &before.id);
    let all_or_nothing = f.all_or_nothing();
    for id in sent.chain(decided.filter(|_| all_or_nothing)) {
        if let Some(e) = locks.get_mut(*id) {
            e.busy = false;
        }
    }
}

impl Client {
    /// How many batches may be in flight at once on this client's data path: 4 over shared
    /// memory and TCP, 1 over RDMA.
    pub fn pipeline_depth(&self) -> usize {
        self.link.depth().min(DEPTH_MAX)
    }

    /// Batches submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.pipeline.len()
    }

    /// Sends up to 31 trylocks as one message without waiting for the reply; complete it with
    /// [`Client::complete`]. Per item unless `all_or_nothing` (see [`Client::batch_trylock`]).
    /// `Err(Easync)` when [`Client::pipeline_depth`] batches are already in flight; an entry whose
    /// lock has an operation in flight is answered `Err(Easync)` at completion.
    pub fn submit_trylock(
        &mut self,
        requests: &[(LockId, Mode, u32)],
        all_or_nothing: bool,
    ) -> Result<(), Status> {
        let flags = if all_or_nothing {
            FLAG_ALL_OR_NOTHING
        } else {
            0
        };
        self.submit(
            requests.len(),
            flags,
            |i| requests[i].0,
            |l, i| {
                let (_, mode, expire) = requests[i];
                Ok(l.trylock(mode, expire, 0))
            },
        )
    }

    /// Sends up to 31 unlocks as one message without waiting for the reply; complete it with
    /// [`Client::complete`].
    pub fn submit_unlock(&mut self, ids: &[LockId]) -> Result<(), Status> {
        self.submit(ids.len(), 0, |i| ids[i], |l, _| Ok(l.unlock()))
    }

    /// Waits for the reply of the oldest batch in flight, applies it and writes its per-entry
    /// results into `out` (at least as long as that batch); returns the batch's length.
    /// `Err(NoAsync)` when nothing is in flight. A transport failure (`BadResponse`, `Etimeout`)
    /// ends this batch only; later ones may still complete.
    pub fn complete(&mut self, out: &mut [Result<Grant, Status>]) -> Result<usize, Status> {
        if self.pipeline.len == 0 {
            return Err(Status::NoAsync);
        }
        let p = &self.pipeline;
        let f = &p.slots[p.head];
        if out.len() < f.n {
            return Err(Status::Einval);
        }
        let (n, k, all_or_nothing) = (f.n, f.k, f.all_or_nothing());
        for (slot, answered) in out.iter_mut().zip(&f.answered[..n]) {
            if let Some(r) = answered {
                *slot = *r;
            }
        }
        let head = self.pipeline.head;
        self.pipeline.head = (head + 1) % DEPTH_MAX;
        self.pipeline.len -= 1;
        if k == 0 {
            release(&self.pipeline.slots[head], &mut self.locks);
            return Ok(n);
        }
        let timeout = self.cfg.timeout;
        // The wait is bounded by the request timeout from when it starts (the clock is read only
        // if the reply is not there yet).
        let deadline = || Some(Instant::now() + timeout);
        let Client {
            pipeline,
            link,
            data_reply,
            replies,
            ..
        } = self;
        let f = &pipeline.slots[head];
        let sent = Sent {
            ticket: f.ticket,
            message_id: f.message_id,
            count: k,
        };
        // The commands are described from the batch's own records, not copied out first.
        let command =
            |i: usize| f.sent[i].map_or(NO_COMMAND, |(_, _, r)| Command::Lock(r.command()));
        if let Err(s) = receive(link, data_reply, replies, sent, command, deadline) {
            // The batch is over either way: its locks are free for the next operation. What the
            // server did is unknown (the caller reinits and re-claims); an all-or-nothing batch
            // is taken back locally as a whole, so its records stay consistent with each other.
            let Client {
                pipeline, locks, ..
            } = self;
            let f = &pipeline.slots[head];
            if all_or_nothing {
                unwind(f, locks);
                out[..n].fill(Err(s));
            } else {
                release(f, locks);
            }
            return Err(s);
        }
        let now = self.now_ms();
        let Client {
            pipeline,
            locks,
            replies,
            ..
        } = self;
        let f = &pipeline.slots[head];
        let undone = all_or_nothing
            && replies[..k]
                .iter()
                .any(|r| !matches!(r.status, Status::Success | Status::AlreadyLocked));
        if undone {
            // Nothing stayed held on the server: restore every record, report each entry.
            unwind(f, locks);
            for (slot, saved) in out.iter_mut().zip(&f.saved[..n]) {
                if saved.is_some() {
                    *slot = Err(Status::Eagain);
                }
            }
            for (s, r) in f.sent[..k].iter().zip(replies.iter()) {
                if let Some((i, ..)) = *s {
                    out[i] = Err(if r.status == Status::AlreadyLocked {
                        Status::Eagain
                    } else {
                        r.status
                    });
                }
            }
            return Ok(n);
        }
        for (s, reply) in f.sent[..k].iter().zip(replies.iter()) {
            let Some((i, id, request)) = s else { continue };
            out[*i] = match locks.get_mut(*id) {
                Some(e) => {
                    // Applied: free for the next operation (what `release` does, in this pass).
                    e.busy = false;
                    let status = e.local.apply(request, reply, now);
                    grant(status, &e.local)
                }
                None => Err(Status::LockNotGet),
            };
        }
        if all_or_nothing {
            // Locks it decided on without sending are busy too until now.
            release(f, locks);
        }
        Ok(n)
    }

    /// The batch engine: decides each entry locally and sends those that need the server as
    /// one message, recording the batch as in flight. No allocation: decisions live in the
    /// pipeline's fixed slots.
    pub(super) fn submit(
        &mut self,
        n: usize,
        flags: u32,
        id_of: impl Fn(usize) -> LockId,
        mut decide: impl FnMut(&mut LocalLock, usize) -> Result<Decision, Status>,
    ) -> Result<(), Status> {
        if n == 0 || n > BATCH {
            return Err(Status::Einval);
        }
        if self.pending.is_some() || self.pipeline.len >= self.pipeline_depth() {
            return Err(Status::Easync);
        }
        let all_or_nothing = flags & FLAG_ALL_OR_NOTHING != 0;
        let at = (self.pipeline.head + self.pipeline.len) % DEPTH_MAX;
        let mut commands = [NO_COMMAND; BATCH];
        let Client {
            pipeline, locks, ..
        } = self;
        let f = &mut pipeline.slots[at];
        let mut k = 0;
        for i in 0..n {
            f.answered[i] = None;
            f.saved[i] = None;
            let id = id_of(i);
            let Some(e) = locks.get_mut(id) else {
                f.answered[i] = Some(Err(Status::LockNotGet));
                continue;
            };
            if e.busy {
                f.answered[i] = Some(Err(Status::Easync));
                continue;
            }
            let before = e.local;
            let decision = decide(&mut e.local, i);
            // Keep the record as it was before the decision wherever the batch may have to be
            // taken back: an all-or-nothing batch that fails changes nothing on the server, so
            // it must change nothing here either; and an entry answered locally (a re-entry
            // counted) is undone if the message cannot be sent.
            f.saved[i] =
                (all_or_nothing || matches!(decision, Ok(Decision::Answer(_)))).then_some(before);
            // Busy until the batch completes: a lock it sends, and in an all-or-nothing batch
            // any lock it decided on (see `release`).
            e.busy = all_or_nothing || matches!(decision, Ok(Decision::Send(_)));
            match decision {
                Ok(Decision::Send(r)) => {
                    f.sent[k] = Some((i, id, r));
                    commands[k] = Command::Lock(r.command());
                    k += 1;
                }
                Ok(Decision::Answer(s)) => f.answered[i] = Some(grant(s, &e.local)),
                Err(s) => f.answered[i] = Some(Err(s)),
            }
        }
        f.n = n;
        f.k = k;
        f.flags = flags;
        if all_or_nothing && f.answered[..n].iter().any(|a| matches!(a, Some(Err(_)))) {
            // An entry failed before reaching the server: the batch cannot be all, so it is
            // nothing, and nothing is sent. Failed entries keep their status, the rest `Eagain`.
            unwind(f, locks);
            for a in &mut f.answered[..n] {
                if !matches!(a, Some(Err(_))) {
                    *a = Some(Err(Status::Eagain));
                }
            }
            // Taken back and freed already: completing it must not free these locks again
            // (a later batch may have marked them busy by then).
            f.saved[..n].fill(None);
            f.k = 0;
            k = 0;
        }
        if k > 0 {
            match self.send(&commands[..k], flags) {
                Ok((ticket, message_id)) => {
                    let f = &mut self.pipeline.slots[at];
                    (f.ticket, f.message_id) = (ticket, message_id);
                }
                Err(s) => {
                    // Not sent: nothing of it is in flight, and nothing of it happened.
                    unwind(&self.pipeline.slots[at], &mut self.locks);
                    return Err(s);
                }
            }
        }
        self.pipeline.len += 1;
        Ok(())
    }

    /// A synchronous batch of `n` entries: submitted by `submit` and completed at once, refused
    /// while batches are in flight (their replies come first).
    pub(super) fn batch(
        &mut self,
        n: usize,
        out: &mut [Result<Grant, Status>],
        submit: impl FnOnce(&mut Self) -> Result<(), Status>,
    ) -> Result<(), Status> {
        if n == 0 || n > BATCH || out.len() < n {
            return Err(Status::Einval);
        }
        if self.pipeline.len > 0 {
            return Err(Status::Easync);
        }
        submit(self)?;
        self.complete(out).map(|_| ())
    }
}
