//! A turn on a handle's client: the client lent to one call, and what a call owes the others.
//!
//! A [`Locks`] keeps its [`Client`] in its bookkeeping while nobody uses it; a call takes it
//! out for its turn (so the network is used with no mutex held, and a future keeps the client
//! across polls) and the turn gives it back when dropped. Between them, work a caller left
//! behind waits in the bookkeeping:
//!
//! | left behind                                  | by                               | done by                                       |
//! |----------------------------------------------|----------------------------------|-----------------------------------------------|
//! | an unlock not sent yet                       | a guard dropped while the client was out, a fair try's ticket | the turn that has the client, before it gives it back |
//! | an unlock sent, its reply not read           | a guard's drop (a pipelined batch) | the next turn, before its own request         |
//! | an asynchronous request, its answer not read | a future dropped while it waited | the next turn, before anything else; a grant or ticket it brings is given back |
//! | a lock reference to release                  | the last handle on a name        | the next turn, before its own request         |
//!
//! So the client a call gets is settled: nothing outstanding, nothing in flight, every unlock
//! sent and answered. The steps are written once, each able to wait by blocking (a thread) or
//! by returning `Pending` with the task's waker registered (a future).

use std::sync::PoisonError;
use std::task::{Context, Poll, Waker, ready};

use dlock_core::config::BATCH_MAX;
use dlock_core::manager::value::ValueBlock;
use dlock_core::{LockId, Mode, Status};

use super::{Client, Connection, Error, Locks, Op, State};
use crate::client::Grant;

/// An asynchronous request outstanding on a client, and what it was for.
#[derive(Clone, Copy, Debug)]
pub(super) struct Orphan {
    lock: LockId,
    /// It asked for a grant (which, once its future is gone, nobody holds: it is given back),
    /// rather than for an unlock.
    acquire: bool,
}

/// How a step waits for a reply.
#[derive(Clone, Copy, Debug)]
enum Wait<'w> {
    /// Blocks the thread.
    Block,
    /// Returns `Pending`, with the waker woken when the reply may have come.
    Wake(&'w Waker),
}

/// How far a turn goes in clearing up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upto {
    /// Sends the queued unlocks (reading replies only to make room for them).
    Flush,
    /// Everything in the table of the module doc: the client is then settled.
    Settle,
}

/// The client lent to one call; given back when dropped.
pub(super) struct Turn<C: Connection> {
    locks: Locks<C>,
    client: Option<Box<Client<C>>>,
    /// The asynchronous request outstanding on the client (sent in this turn, or left by a
    /// future dropped in an earlier one), with what it was for.
    outstanding: Option<Orphan>,
}

impl<C: Connection> Turn<C> {
    /// Takes the client out of `st` if it is there.
    pub(super) fn take(locks: &Locks<C>, st: &mut State<C>) -> Option<Turn<C>> {
        let client = st.client.take()?;
        Some(Turn {
            locks: locks.clone(),
            client: Some(client),
            outstanding: st.orphan.take(),
        })
    }

    pub(super) fn client(&mut self) -> &mut Client<C> {
        // A turn is built with its client and gives it up only in `drop`.
        self.client
            .as_mut()
            .expect("a turn has its client until it ends")
    }

    /// Settles the client before a request (see the module doc), blocking.
    pub(super) fn settle(&mut self) {
        let done = self.drive(Wait::Block, Upto::Settle);
        debug_assert!(done.is_ready(), "a blocking step returned pending");
    }

    /// [`Turn::settle`] for a future.
    pub(super) fn poll_settle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.drive(Wait::Wake(cx.waker()), Upto::Settle)
    }

    /// Sends the unlocks queued meanwhile, for a future about to resolve (so that giving the
    /// client back does not have to wait).
    pub(super) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.drive(Wait::Wake(cx.waker()), Upto::Flush)
    }

    /// An asynchronous request on `lock` goes out now: should its future be dropped before
    /// the answer, the turn leaves it for the next one ([`Turn::answered`] when it came).
    pub(super) fn expect(&mut self, lock: LockId, acquire: bool) {
        self.outstanding = Some(Orphan { lock, acquire });
    }

    /// The asynchronous request's answer came.
    pub(super) fn answered(&mut self) {
        self.outstanding = None;
    }

    /// Whether a guard of the handle holds `id` in a mode that excludes `mode`.
    pub(super) fn conflicts(&self, id: LockId, mode: Mode) -> bool {
        self.locks.state().conflicts(id, mode)
    }

    /// A guard of `id` in `mode` is handed out.
    pub(super) fn hold(&self, id: LockId, mode: Mode) {
        self.locks.state().hold(id, mode);
    }

    /// A guard of `id` is gone (its unlock is the caller's).
    pub(super) fn unhold(&self, id: LockId) {
        self.locks.state().unhold(id);
    }

    /// Whether the client's record says `id` is held while no guard of the handle holds it: an
    /// unlock that never reached the server (its send failed, reported to the drop hook) left
    /// the grant behind. Asked for the lock again, the record would answer a re-entry by
    /// itself, with the old grant's token and without the server; the caller gives the grant
    /// back first instead, so that every guard stands for a grant the server made for it.
    pub(super) fn stale(&mut self, id: LockId) -> bool {
        let recorded = self
            .client()
            .local_lock(id)
            .and_then(|l| l.state.held_mode());
        recorded.is_some() && !self.locks.state().held.contains_key(&id)
    }

    /// `id` is to be unlocked (a grant or a fair ticket nobody will use); sent before the
    /// client is given back.
    pub(super) fn queue_unlock(&self, id: LockId) {
        self.locks.state().unlocks.push((id, None));
    }

    /// Stages `write` (if any) as the value block the next unlock of `id` writes. A guard
    /// stages only for an exclusive grant its handle holds, so the record refuses it only when
    /// the grant was lost meanwhile; the unlock that follows then reports that.
    pub(super) fn stage(&mut self, id: LockId, write: Option<ValueBlock>) {
        if let Some(block) = write {
            let _ = self.client().stage_value(id, block.as_bytes());
        }
    }

    /// The steps of the module doc's table, in order, as far as `upto`.
    fn drive(&mut self, how: Wait<'_>, upto: Upto) -> Poll<()> {
        ready!(self.finish_outstanding(how));
        ready!(self.send_unlocks(how));
        if upto == Upto::Settle {
            while self.client().in_flight() > 0 {
                ready!(self.complete_oldest(how));
            }
            self.release_names();
        }
        Poll::Ready(())
    }

    /// Finishes an asynchronous request a dropped future left (or one [`Locks::with_client`]'s
    /// caller left): until it is answered the client takes no other request. A grant or ticket
    /// it brings is queued to be given back; an error only the hook can hear of is reported.
    fn finish_outstanding(&mut self, how: Wait<'_>) -> Poll<()> {
        if !self.client().has_pending() {
            self.outstanding = None;
            return Poll::Ready(());
        }
        let answer = match how {
            Wait::Block => self.client().finish_async(),
            Wait::Wake(w) => ready!(self.client().poll_async(w)),
        };
        if let Some(o) = self.outstanding.take() {
            self.after_orphan(o, answer);
        }
        Poll::Ready(())
    }

    fn after_orphan(&self, o: Orphan, answer: Result<Grant, Error>) {
        match answer {
            Ok(_) if o.acquire => self.queue_unlock(o.lock),
            // A refusal or a timeout of a request nobody waits for any more is no news (a fair
            // ticket it leaves is the registration's, as after any fair try).
            Err(e) if o.acquire && e.kind() != super::super::ErrorKind::Disconnected => {}
            Err(e) => self.locks.report(e),
            Ok(_) => {}
        }
    }

    /// Sends every queued unlock, 31 per message, as pipelined batches whose replies are read
    /// later. Waits only when the pipeline is full: replies that have arrived are read first,
    /// then the oldest is waited for (an unlock is answered without waiting on the server).
    fn send_unlocks(&mut self, how: Wait<'_>) -> Poll<()> {
        let mut ids = [LockId::new(0, 1); BATCH_MAX];
        let mut writes = [None; BATCH_MAX];
        loop {
            let n = {
                let st = self.locks.state();
                let n = st.unlocks.len().min(BATCH_MAX);
                for ((id, write), &queued) in ids.iter_mut().zip(&mut writes).zip(&st.unlocks[..n])
                {
                    (*id, *write) = queued;
                }
                n
            };
            if n == 0 {
                return Poll::Ready(());
            }
            // Read what has arrived (a look: nothing waits here).
            while self.client().in_flight() > 0
                && self.complete_oldest(Wait::Wake(Waker::noop())).is_ready()
            {}
            if self.client().in_flight() >= self.client().pipeline_depth() {
                ready!(self.complete_oldest(how));
                continue;
            }
            for (&id, &write) in ids[..n].iter().zip(&writes[..n]) {
                self.stage(id, write);
            }
            let sent = self.client().submit_unlock(&ids[..n]);
            self.locks.state().unlocks.drain(..n);
            if let Err(e) = sent {
                // Not sent, and the records say held: the grants stay on the server until the
                // lease ends (or, for RW, the client's does). Only the hook can hear of it.
                self.locks.report(e);
            }
        }
    }

    /// Reads the reply of the oldest batch in flight (an unlock of a dropped guard) and reports
    /// what went wrong with it.
    fn complete_oldest(&mut self, how: Wait<'_>) -> Poll<()> {
        let mut out = [Err(Status::Einval); BATCH_MAX];
        let done = match how {
            Wait::Block => self.client().complete(&mut out),
            Wait::Wake(w) => ready!(self.client().poll_complete(&mut out, w)),
        };
        match done {
            Err(e) => self.locks.report(e),
            Ok(n) => {
                for s in out[..n].iter().filter_map(|r| r.err()) {
                    self.locks.report(Op::Unlock.err(s));
                }
            }
        }
        Poll::Ready(())
    }

    /// Releases the references whose last handle went (unless a new handle took the name up
    /// again meanwhile), giving back a fair ticket first: nobody is left to use it.
    fn release_names(&mut self) {
        loop {
            let id = {
                let mut st = self.locks.state();
                match st.releases.pop() {
                    None => return,
                    Some(id) if st.names.contains_key(&id) => continue,
                    Some(id) => id,
                }
            };
            if let Err(e) = release_reference(self.client(), id) {
                self.locks.report(e);
            }
        }
    }
}

/// Releases the client's reference to `id`, giving back a fair ticket first: the last handle on
/// the name is gone, so nobody is left to use it.
pub(super) fn release_reference<C: Connection>(
    client: &mut Client<C>,
    id: LockId,
) -> Result<(), Error> {
    match client.release_lock(id) {
        Err(e) if e.status() == Status::TicketToUnlock => {
            client.unlock(id).and_then(|_| client.release_lock(id))
        }
        other => other,
    }
}

impl<C: Connection> Drop for Turn<C> {
    fn drop(&mut self) {
        if self.client.is_none() {
            return;
        }
        loop {
            {
                let mut st = self.locks.state();
                if st.unlocks.is_empty() {
                    if let Some(c) = &self.client {
                        // Relaxed: see `Locks::client_id`.
                        let id = c.id().get();
                        self.locks
                            .shared
                            .client_id
                            .store(id, std::sync::atomic::Ordering::Relaxed);
                    }
                    st.client = self.client.take();
                    st.orphan = self.outstanding.take();
                    break;
                }
            }
            // Unlocks were queued while this turn had the client: they go before it is given
            // back, or nobody might send them.
            let _ = self.drive(Wait::Block, Upto::Flush);
        }
        self.locks.notify();
        self.locks.tell_hook();
    }
}

impl<C: Connection> Locks<C> {
    /// Takes the client for one call, waiting (blocking the thread) while another caller has
    /// it. The caller settles what earlier calls left ([`Turn::settle`]) before a request of
    /// its own.
    pub(super) fn turn(&self) -> Turn<C> {
        let mut st = self.state();
        loop {
            if let Some(turn) = Turn::take(self, &mut st) {
                return turn;
            }
            st = self
                .shared
                .changed
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Takes the client, or arranges for the task to be woken when it comes back.
    pub(super) fn poll_turn(&self, cx: &mut Context<'_>) -> Poll<Turn<C>> {
        let mut st = self.state();
        match Turn::take(self, &mut st) {
            Some(turn) => Poll::Ready(turn),
            None => {
                wait_in(&mut st.wakers, cx.waker());
                Poll::Pending
            }
        }
    }

    /// Wakes every thread and task waiting for the client or for a guard to let go.
    pub(super) fn notify(&self) {
        self.shared.changed.notify_all();
        let mut st = self.state();
        if st.wakers.is_empty() {
            return;
        }
        // Woken outside the lock (a waker may run code of the executor's), and the list's
        // capacity kept for the next waiters.
        let mut wakers = std::mem::take(&mut st.wakers);
        drop(st);
        wakers.drain(..).for_each(Waker::wake);
        let mut st = self.state();
        if st.wakers.is_empty() {
            st.wakers = wakers;
        }
    }

    /// A guard of `id` is gone: its unlock (writing the value block paired with it, if any)
    /// is sent now if the client is free, else by whoever has it (see "Dropping a guard" in
    /// the module doc).
    pub(super) fn let_go(&self, ids: impl IntoIterator<Item = (LockId, Option<ValueBlock>)>) {
        let turn = {
            let mut st = self.state();
            for (id, write) in ids {
                st.unhold(id);
                st.unlocks.push((id, write));
            }
            Turn::take(self, &mut st)
        };
        // Giving the turn back sends the unlocks and wakes the waiters; without it, whoever
        // has the client does both.
        match turn {
            Some(turn) => drop(turn),
            None => self.notify(),
        }
    }
}

/// Adds `waker` to `wakers` unless it is there already.
pub(super) fn wait_in(wakers: &mut Vec<Waker>, waker: &Waker) {
    if !wakers.iter().any(|w| w.will_wake(waker)) {
        wakers.push(waker.clone());
    }
}
