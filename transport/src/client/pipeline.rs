//! Batches in flight: the batch engine behind every batch call, and the pipelined calls that
//! keep several batch messages on the way at once.
//!
//! A synchronous round trip leaves each side idle while the other works: the client waits while
//! the server executes, the server waits while the client decodes and writes the next batch. With
//! [`Client::submit_trylock`] / [`Client::submit_unlock`] a client sends up to
//! [`Client::pipeline_depth`] batches before it [`Client::complete`]s the oldest, so that it
//! writes batch *n + 1* while the server executes batch *n* (over shared memory each batch has
//! its own mailbox lane; over TCP the link matches each reply to its batch by message id).
//!
//! The local state machine stays exact: a batch's local decisions are made when it is submitted
//! and its replies applied when it is completed, in submission order; a lock with an operation
//! in flight is refused (`Easync`) by a later submission until that operation completes (in an
//! all-or-nothing batch, every lock it names: until it completes it may be taken back as a
//! whole), and no single-lock call or synchronous batch runs while batches are in flight. A
//! synchronous batch is a submission completed at once.

use std::task::{Poll, Waker};
use std::time::Instant;

use dlock_core::proto::{Command, FLAG_ALL_OR_NOTHING};
use dlock_core::time::duration_to_ms;
use dlock_core::{GrantProof, LockId, Mode, Status};

use super::local::{Decision, LocalLock, Request};
use super::locks::grant;
use super::table::LockTable;
use super::{BATCH, Client, Connection, Dispatch, Error, Grant, Op, Sent, batch_count, receive};

/// The most batches a client can have in flight on any transport (the link may allow fewer).
pub(super) const DEPTH_MAX: usize = dlock_core::table::layout::MAILBOX_LANES;

/// A filler for unused slots of a batch's fixed arrays (never read: the lengths bound them).
const NO_LOCK: LockId = LockId::new(0, 1);

/// A command a batch sent: the caller's entry index, the lock, the request.
#[derive(Clone, Copy, Debug)]
struct SentCommand {
    entry: u8,
    lock: LockId,
    request: Request,
}

/// One submitted batch, until it is completed. Fixed-size, so submitting allocates nothing; the
/// arrays are filled from the front (their lengths say how far), so a batch whose entries all go
/// to the server writes one record per entry and nothing else.
#[derive(Clone, Copy, Debug)]
pub(super) struct InFlight {
    /// The call that submitted it: a failure to complete it is that call's.
    op: Op,
    /// The link's ticket for the message (unused when `k == 0`: nothing was sent).
    ticket: u64,
    /// The message id its reply must echo.
    message_id: u16,
    /// The client's clock just before the send: grants in the reply are counted from here.
    sent_ms: u64,
    flags: u32,
    /// Entries in the caller's batch.
    n: usize,
    /// Commands sent.
    k: usize,
    sent: [SentCommand; BATCH],
    /// Entries answered without the server (final at submission), in entry order.
    answered: [(u8, Result<Grant, Status>); BATCH],
    answered_len: usize,
    /// Records as they were before the local decision, in entry order, kept where the batch
    /// may have to be taken back: every entry of an all-or-nothing batch, and an entry answered
    /// locally (until the message is sent).
    saved: [(u8, LocalLock); BATCH],
    saved_len: usize,
}

impl InFlight {
    fn all_or_nothing(&self) -> bool {
        self.flags & FLAG_ALL_OR_NOTHING != 0
    }

    pub(super) fn new() -> Self {
        let blank = LocalLock::new(NO_LOCK, dlock_core::LockKind::Atomic);
        InFlight {
            op: Op::SubmitTryLock,
            ticket: 0,
            message_id: 0,
            sent_ms: 0,
            flags: 0,
            n: 0,
            k: 0,
            sent: [SentCommand {
                entry: 0,
                lock: NO_LOCK,
                request: Request::none(),
            }; BATCH],
            answered: [(0, Err(Status::Einval)); BATCH],
            answered_len: 0,
            saved: [(0, blank); BATCH],
            saved_len: 0,
        }
    }

    fn sent(&self) -> &[SentCommand] {
        &self.sent[..self.k]
    }

    fn answered(&self) -> &[(u8, Result<Grant, Status>)] {
        &self.answered[..self.answered_len]
    }

    fn saved(&self) -> &[(u8, LocalLock)] {
        &self.saved[..self.saved_len]
    }

    fn answer(&mut self, entry: usize, r: Result<Grant, Status>) {
        self.answered[self.answered_len] = (entry as u8, r);
        self.answered_len += 1;
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
    for (_, before) in f.saved().iter().rev() {
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
    let sent = f.sent().iter().map(|s| s.lock);
    let decided = f.saved().iter().map(|(_, before)| before.id);
    let all_or_nothing = f.all_or_nothing();
    for id in sent.chain(decided.filter(|_| all_or_nothing)) {
        if let Some(e) = locks.get_mut(id) {
            e.busy = false;
        }
    }
}

impl<C: Connection> Client<C> {
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
    ) -> Result<(), Error> {
        self.submit_trylocks(Op::SubmitTryLock, requests, all_or_nothing)
    }

    /// Sends up to 31 unlocks as one message without waiting for the reply; complete it with
    /// [`Client::complete`].
    pub fn submit_unlock(&mut self, ids: &[LockId]) -> Result<(), Error> {
        let op = Op::SubmitUnlock;
        self.submit(op, ids.len(), 0, |i| ids[i], |l, _| Ok(l.unlock()))
    }

    /// The trylocks of `submit_trylock` and `batch_trylock` (`op`).
    pub(super) fn submit_trylocks(
        &mut self,
        op: Op,
        requests: &[(LockId, Mode, u32)],
        all_or_nothing: bool,
    ) -> Result<(), Error> {
        let flags = if all_or_nothing {
            FLAG_ALL_OR_NOTHING
        } else {
            0
        };
        let decide = |l: &mut LocalLock, i: usize| {
            let (_, mode, expire) = requests[i];
            Ok(l.trylock(mode, expire, 0))
        };
        self.submit(op, requests.len(), flags, |i| requests[i].0, decide)
    }

    /// Waits for the reply of the oldest batch in flight, applies it and writes its per-entry
    /// results into `out` (at least as long as that batch); returns the batch's length.
    /// `Err(NoAsync)` when nothing is in flight. A transport failure (`BadResponse`, `Etimeout`)
    /// ends this batch only; later ones may still complete. A failure is reported as the
    /// failure of the call that submitted the batch.
    pub fn complete(&mut self, out: &mut [Result<Grant, Status>]) -> Result<usize, Error> {
        let deadline = self.link.now() + self.cfg.timeout;
        self.complete_with(out, None, deadline)
    }

    /// [`Client::complete`] for a caller that must not wait (a future, or a drop that only
    /// completes what has arrived): ready once the oldest batch's reply is here or its request
    /// timeout has passed since its send; pending until then, with `waker` woken when the reply
    /// may have come.
    pub(crate) fn poll_complete(
        &mut self,
        out: &mut [Result<Grant, Status>],
        waker: &Waker,
    ) -> Poll<Result<usize, Error>> {
        if self.pipeline.len == 0 {
            return Poll::Ready(Err(Op::Complete.err(Status::NoAsync)));
        }
        let f = &self.pipeline.slots[self.pipeline.head];
        let (ticket, sent_ms, k) = (f.ticket, f.sent_ms, f.k);
        let now = self.link.now();
        if k == 0 {
            // Answered without the server: nothing to wait for.
            return Poll::Ready(self.complete_with(out, None, now));
        }
        match self.link.poll_recv_data(ticket, &mut self.inbox.buf, waker) {
            Ok(Some(len)) => {
                Poll::Ready(self.complete_with(out, Some(len), now + self.cfg.timeout))
            }
            Ok(None) if self.tick(now) < sent_ms + duration_to_ms(self.cfg.timeout) as u64 => {
                Poll::Pending
            }
            // Out of time, or the connection failed: completing with a deadline of now looks
            // once more and fails the batch as a blocking completion would.
            _ => Poll::Ready(self.complete_with(out, None, now)),
        }
    }

    /// Completes the oldest batch with its reply, given when a caller already read it
    /// (`arrived`), otherwise waited for until `deadline`.
    fn complete_with(
        &mut self,
        out: &mut [Result<Grant, Status>],
        arrived: Option<usize>,
        deadline: Instant,
    ) -> Result<usize, Error> {
        if self.pipeline.len == 0 {
            return Err(Op::Complete.err(Status::NoAsync));
        }
        let head = self.pipeline.head;
        let f = &self.pipeline.slots[head];
        if out.len() < f.n {
            return Err(f.op.err(Status::Einval));
        }
        let (n, k) = (f.n, f.k);
        for &(i, r) in f.answered() {
            out[usize::from(i)] = r;
        }
        self.pipeline.head = (head + 1) % DEPTH_MAX;
        self.pipeline.len -= 1;
        if k == 0 {
            release(&self.pipeline.slots[head], &mut self.locks);
            return Ok(n);
        }
        self.receive_batch(head, out, arrived, deadline)?;
        // The server granted after the send, so a lease counted from the send never outlives
        // the server's; counted from the reply it would, by the reply's delay.
        self.heard(self.pipeline.slots[head].sent_ms);
        self.apply_batch(head, out);
        Ok(n)
    }

    /// Waits until `deadline` for the reply to the batch in slot `at` (or takes the one a caller
    /// read already, `arrived`). On a failure the batch is over either way, its locks free for
    /// the next operation: what the server did is unknown (the caller reinits and re-claims),
    /// and an all-or-nothing batch is taken back locally as a whole, so its records stay
    /// consistent with each other.
    fn receive_batch(
        &mut self,
        at: usize,
        out: &mut [Result<Grant, Status>],
        arrived: Option<usize>,
        deadline: Instant,
    ) -> Result<(), Error> {
        let Client {
            pipeline,
            link,
            inbox,
            locks,
            ..
        } = self;
        let f = &pipeline.slots[at];
        let sent = Sent {
            ticket: f.ticket,
            message_id: f.message_id,
            count: f.k,
        };
        // The commands are described from the batch's own records, not copied out first.
        let command = |i: usize| Command::Lock(f.sent[i].request.command());
        let Err(e) = receive(link, inbox, f.op, sent, command, arrived, || Some(deadline)) else {
            return Ok(());
        };
        if f.all_or_nothing() {
            unwind(f, locks);
            out[..f.n].fill(Err(e.status()));
        } else {
            release(f, locks);
        }
        Err(e)
    }

    /// Applies the reply in the inbox to the batch in slot `at`, writing each sent entry's
    /// result into `out`.
    fn apply_batch(&mut self, at: usize, out: &mut [Result<Grant, Status>]) {
        let epoch = u32::from(self.epoch);
        let Client {
            pipeline,
            locks,
            inbox,
            ..
        } = self;
        let f = &pipeline.slots[at];
        let replies = &inbox.results[..f.k];
        let undone = f.all_or_nothing()
            && replies
                .iter()
                .any(|r| !matches!(r.status, Status::Success | Status::AlreadyLocked));
        if undone {
            // Nothing stayed held on the server: restore every record, report each entry.
            unwind(f, locks);
            for &(i, _) in f.saved() {
                out[usize::from(i)] = Err(Status::Eagain);
            }
            for (s, r) in f.sent().iter().zip(replies) {
                out[usize::from(s.entry)] = Err(if r.status == Status::AlreadyLocked {
                    Status::Eagain
                } else {
                    r.status
                });
            }
            return;
        }
        let values = &inbox.values;
        for (((s, reply), mac), value) in
            f.sent().iter().zip(replies).zip(&inbox.proofs).zip(values)
        {
            out[usize::from(s.entry)] = match locks.get_mut(s.lock) {
                Some(e) => {
                    // Applied: free for the next operation (what `release` does, in this pass).
                    e.busy = false;
                    let proof = GrantProof { epoch, mac: *mac };
                    let status = e.local.apply(&s.request, reply, proof, *value, f.sent_ms);
                    grant(status, &e.local)
                }
                None => Err(Status::LockNotGet),
            };
        }
        if f.all_or_nothing() {
            // Locks it decided on without sending are busy too until now.
            release(f, locks);
        }
    }

    /// The batch engine: decides each entry locally and sends those that need the server as
    /// one message, recording the batch (submitted by `op`) as in flight. No allocation:
    /// decisions live in the pipeline's fixed slots.
    pub(super) fn submit(
        &mut self,
        op: Op,
        n: usize,
        flags: u32,
        id_of: impl Fn(usize) -> LockId,
        decide: impl FnMut(&mut LocalLock, usize) -> Result<Decision, Status>,
    ) -> Result<(), Error> {
        batch_count(op, n)?;
        if self.pending.is_some() || self.pipeline.len >= self.pipeline_depth() {
            return Err(op.err(Status::Easync));
        }
        let at = (self.pipeline.head + self.pipeline.len) % DEPTH_MAX;
        let f = &mut self.pipeline.slots[at];
        (f.op, f.n, f.flags) = (op, n, flags);
        let mut commands = [Command::NONE; BATCH];
        let k = decide_batch(f, &mut self.locks, id_of, decide, &mut commands);
        if k > 0 {
            let sent_ms = self.now_ms();
            let f = &self.pipeline.slots[at];
            let mut blocks = [None; BATCH];
            for (b, s) in blocks.iter_mut().zip(f.sent()) {
                *b = s.request.value_block();
            }
            match self.send(op, &commands[..k], &blocks[..k], flags, Dispatch::Now) {
                Ok(sent) => {
                    let f = &mut self.pipeline.slots[at];
                    (f.ticket, f.message_id, f.sent_ms) = (sent.ticket, sent.message_id, sent_ms);
                }
                Err(e) => {
                    // Not sent: nothing of it is in flight, and nothing of it happened.
                    unwind(&self.pipeline.slots[at], &mut self.locks);
                    return Err(e);
                }
            }
        }
        self.pipeline.len += 1;
        Ok(())
    }

    /// A synchronous batch of `n` entries (the call `op`): submitted by `submit` and completed
    /// at once, refused while batches are in flight (their replies come first).
    pub(super) fn batch(
        &mut self,
        op: Op,
        n: usize,
        out: &mut [Result<Grant, Status>],
        submit: impl FnOnce(&mut Self) -> Result<(), Error>,
    ) -> Result<(), Error> {
        batch_count(op, n)?;
        if out.len() < n {
            return Err(op.err(Status::Einval));
        }
        if self.pipeline.len > 0 {
            return Err(op.err(Status::Easync));
        }
        submit(self)?;
        self.complete(out).map(|_| ())
    }
}

/// Decides each of the `f.n` entries of the batch in `f` on its record, filling `f` and the
/// `commands` to send; returns how many there are. An all-or-nothing batch with an entry that
/// failed before reaching the server sends nothing: it cannot be all, so it is nothing.
fn decide_batch(
    f: &mut InFlight,
    locks: &mut LockTable,
    id_of: impl Fn(usize) -> LockId,
    mut decide: impl FnMut(&mut LocalLock, usize) -> Result<Decision, Status>,
    commands: &mut [Command; BATCH],
) -> usize {
    let all_or_nothing = f.all_or_nothing();
    (f.answered_len, f.saved_len) = (0, 0);
    let mut k = 0;
    for i in 0..f.n {
        let id = id_of(i);
        let Some(e) = locks.get_mut(id) else {
            f.answer(i, Err(Status::LockNotGet));
            continue;
        };
        if e.busy {
            f.answer(i, Err(Status::Easync));
            continue;
        }
        let before = e.local;
        let decision = decide(&mut e.local, i);
        // Keep the record as it was before the decision wherever the batch may have to be
        // taken back: an all-or-nothing batch that fails changes nothing on the server, so
        // it must change nothing here either; and an entry answered locally (a re-entry
        // counted) is undone if the message cannot be sent.
        if all_or_nothing || matches!(decision, Ok(Decision::Answer(_))) {
            f.saved[f.saved_len] = (i as u8, before);
            f.saved_len += 1;
        }
        // Busy until the batch completes: a lock it sends, and in an all-or-nothing batch
        // any lock it decided on (see `release`).
        e.busy = all_or_nothing || matches!(decision, Ok(Decision::Send(_)));
        match decision {
            Ok(Decision::Send(r)) => {
                f.sent[k] = SentCommand {
                    entry: i as u8,
                    lock: id,
                    request: r,
                };
                commands[k] = Command::Lock(r.command());
                k += 1;
            }
            Ok(Decision::Answer(s)) => f.answer(i, grant(s, &e.local)),
            Err(s) => f.answer(i, Err(s)),
        }
    }
    f.k = k;
    if all_or_nothing && f.answered().iter().any(|(_, a)| a.is_err()) {
        refuse_whole(f, locks);
    }
    f.k
}

/// Takes back an all-or-nothing batch refused before it was sent. Failed entries keep their
/// status, the rest `Eagain`.
fn refuse_whole(f: &mut InFlight, locks: &mut LockTable) {
    unwind(f, locks);
    let mut all: [(u8, Result<Grant, Status>); BATCH] =
        std::array::from_fn(|i| (i as u8, Err(Status::Eagain)));
    for &(i, r) in f.answered() {
        if r.is_err() {
            all[usize::from(i)].1 = r;
        }
    }
    (f.answered, f.answered_len) = (all, f.n);
    // Taken back and freed already: completing it must not free these locks again (a later
    // batch may have marked them busy by then).
    f.saved_len = 0;
    f.k = 0;
}
