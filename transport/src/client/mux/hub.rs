//! The leader/follower hand-off on one shared connection: whoever waits reads.
//!
//! Many threads — one per worker of an engine, each with its client — wait on one connection
//! for their replies. A blocked caller reads the connection itself when nobody else does: it is
//! then the *reader* (the leader of the pattern). It files every reply it reads under the
//! client and message the reply echoes, wakes the callers those replies belong to, and reads on
//! until its own reply is in; then it hands reading on and returns. Each reply costs one
//! wake-up, of the thread that asked for it, and none when it is the reader's own. (A reader
//! thread between the socket and the callers, as this module had before, cost two: its own and
//! the caller's.)
//!
//! Futures cannot read: they are polled, and their executor must not block. A standby thread
//! reads for them, only while some future waits and no caller reads; a future whose poll finds
//! nobody reading names it the reader.
//!
//! Writes are grouped. A request goes into one queue, and whoever finds the connection idle
//! writes everything queued (group commit); futures leave theirs to a flusher thread, which
//! writes a burst at once. Blocked callers add one rule: callers woken by one burst of replies
//! queue their next requests, and the last of them to come back for its reply writes the lot.
//! The server then gets, and answers, a burst too, and the next reader reads it in one system
//! call. Without the rule each worker wrote its own request as soon as it ran, the server
//! answered each alone, and every reply cost the reader a read of its own.
//!
//! # The protocol
//!
//! The state is [`Sched`] (its module doc has the table and the invariants), changed only under
//! the one lock here. A blocked caller's wait is a loop of [`Sched::step`]s:
//!
//! | the caller finds | it |
//! |---|---|
//! | its reply | takes it; if it was the reader, hands reading on |
//! | the connection closed | fails (`ConnectionAborted`) |
//! | nobody reading, or itself named reader | reads ([`Hub::lead`]) until its reply is in, then looks again |
//! | somebody else reading | sleeps on its bell (`parked`) until woken or its deadline |
//! | its deadline passed | reads once if nobody else reads, then times out (handing reading on) |
//!
//! A reader reads with the lock free (only the reader touches the connection's read side), then
//! takes the lock to file the burst: each reply's sleeping caller leaves `parked`, is counted
//! `pending` and has its bell rung; each reply's future is woken. It stops when its own reply
//! is in, its deadline has passed, the connection failed, or — the standby thread — no future
//! waits any more, and then names the next reader ([`Sched::resign`]): a sleeping caller, else
//! the thread if futures wait, else nobody. While callers woken with replies are still to come
//! back (`pending > 0`), nobody is named: the first of them to wait again reads (it finds
//! nobody reading), and the last of them to come back names one if nobody did, which saves
//! waking a thread only to make it read.
//!
//! Why it holds:
//!
//! - **No lost wake-up.** Every sleeper parks under the lock, then sleeps on its own bell with
//!   the lock let go, and looks at the state again whenever it wakes; every change that
//!   concerns it (its reply filed, its naming as reader, the connection closed) is made under
//!   the lock before its bell is rung, and a bell keeps a ring made before its caller sleeps
//!   (`bell.rs`). Bells are rung after the lock is let go, so nobody wakes into a lock still
//!   held, and ringing a caller still spinning on its bell costs no system call.
//! - **No reply left unread while anyone waits** (`Sched` invariant 1): whenever a caller
//!   sleeps or a future waits, somebody reads, or a woken caller is still to come back — and the
//!   last of those names a reader if there is none. A reader hands on before it stops.
//! - **No request left unwritten** (invariant 2): a request is queued either by a sender told
//!   to write it (nobody pending), or while a woken caller is still to come back, and the last
//!   of those writes the queue. A writer that finds another writing leaves its bytes to it; the
//!   writer looks at the queue again after it lets go of the connection.
//! - **No starvation.** A sleeping caller is woken when its reply is filed or when it is named
//!   reader; a reader reads only until its own reply is in, and every reader files every
//!   reply it reads, in the order they came. The request of every waiter was written (above),
//!   so every waiter's reply comes, or the connection fails and everyone learns it.
//! - **A reader that times out** hands reading on exactly as one whose reply came.
//!
//! # Control frames
//!
//! The clients on the connection send their control frames over it too (registration,
//! heartbeats, names: [`Hub::control`]), so they need no control connection each. A control
//! reply names no client (its header carries a status where a request carries the client), so
//! one control exchange at a time goes onto the connection, whoever's it is (the slow path:
//! a heartbeat every few seconds per client), and its reply is filed under a place of its own
//! ([`CONTROL`](super::sched::CONTROL)) with the message id it echoes. Its caller waits as any
//! blocked caller does, and reads when nobody else does. The hub numbers the exchanges on the
//! wire itself and gives each caller its own number back: every client numbers its messages
//! from 1, so a reply that comes after its caller gave up could otherwise pass for the answer
//! to the next exchange, another client's with the same number.
//!
//! The loom models in `transport/tests/loom.rs` check these on this code, with an in-memory
//! connection ([`Pipe`]) in place of the socket.

use std::io;
use std::sync::PoisonError;
use std::task::Waker;
use std::time::Instant;

use dlock_core::proto::{
    CONTROL_FRAME_MAX, CONTROL_MAGIC, DecodeError, Event, control_frame_len, is_event_message,
    peek_control_header, peek_data_header, peek_data_response_header, peek_magic,
    set_control_message_id,
};

pub use super::sched::Reader;
use super::sched::{Bell, CONTROL, Duties, Sched, Step, Successor, Wakes};
use crate::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A connection's two directions, as the hand-off uses them: whole writes, and reads that
/// return what has arrived. Implemented by the TCP/TLS connection; the loom models implement it
/// in memory.
pub trait Pipe: Send + Sync {
    /// Reads what has arrived into `out`: `Ok(0)` when the peer closed, `WouldBlock` or
    /// `TimedOut` when nothing came in time. Called by the reader alone.
    fn read(&self, out: &mut [u8], wait: Wait) -> io::Result<usize>;
    /// Writes all of `bytes`. Called by one writer at a time.
    fn write_all(&self, bytes: &[u8]) -> io::Result<()>;
    /// Ends both directions: a blocked read returns.
    fn shutdown(&self);
}

/// How long a read may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Not at all: what has arrived.
    Look,
    /// Until the deadline (`None`: until something arrives).
    Until(Option<Instant>),
}

/// The replies read and not yet filed (a reply cut in two by a read keeps its start here).
#[derive(Debug)]
struct Inbound {
    plain: Vec<u8>,
    filled: usize,
}

/// One shared connection's hand-off (see the module doc).
#[derive(Debug)]
pub struct Hub<P> {
    pipe: P,
    sched: Mutex<Sched>,
    /// The read side, held by the reader while it reads and files.
    inbound: Mutex<Inbound>,
    /// Held by the one thread writing, with the buffer it writes from.
    writing: Mutex<Vec<u8>>,
    /// The standby reader thread sleeps here until it is named reader or the hub is gone.
    standby: Condvar,
    /// The flusher sleeps here until a flush is wanted or the hub is gone.
    flusher: Condvar,
    /// The caller of the control exchange in flight sleeps on this.
    control_bell: Arc<Bell>,
    /// Held through a control exchange, one at a time (the module doc says why), with the last
    /// exchange's ticket.
    control_turn: Mutex<u64>,
}

/// Locks `m`, taking the data over from a thread that panicked holding it (every update under
/// these locks leaves the state consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a waiter on a connection that closed reads.
pub(super) fn lost() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the shared data connection was closed",
    )
}

fn not_a_data_message() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a data message")
}

impl<P: Pipe> Hub<P> {
    /// A hand-off over `pipe`, reading up to `read_max` bytes at once.
    pub fn new(pipe: P, read_max: usize) -> Self {
        let control_bell = Arc::new(Bell::default());
        Self {
            pipe,
            sched: Mutex::new(Sched::new(read_max, Arc::clone(&control_bell))),
            inbound: Mutex::new(Inbound {
                plain: vec![0; read_max],
                filled: 0,
            }),
            writing: Mutex::new(Vec::with_capacity(read_max)),
            standby: Condvar::new(),
            flusher: Condvar::new(),
            control_bell,
            control_turn: Mutex::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sched> {
        lock(&self.sched)
    }

    /// The connection (for tests and models, which answer on its other side).
    #[cfg(any(test, dlock_loom))]
    pub fn pipe(&self) -> &P {
        &self.pipe
    }

    /// Who reads now (for tests and models).
    #[cfg(any(test, dlock_loom))]
    pub fn reader(&self) -> Reader {
        self.lock().reader()
    }

    /// Callers asleep with no reply yet (for tests and models).
    #[cfg(any(test, dlock_loom))]
    pub fn parked(&self) -> usize {
        self.lock().parked_len()
    }

    /// Clients with a place here.
    pub fn clients(&self) -> usize {
        self.lock().clients()
    }

    /// Whether the connection failed or was closed.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Gives `client` a place; returns the bell its caller sleeps on.
    pub fn attach(&self, client: u32) -> Arc<Bell> {
        let bell = Arc::new(Bell::default());
        self.lock().attach(client, Arc::clone(&bell));
        bell
    }

    /// Takes `client`'s place away (if `bell` still rings for it).
    pub fn detach(&self, client: u32, bell: &Arc<Bell>) {
        self.lock().detach(client, bell);
    }

    /// Sends `req` (a data message of `client`) as `ticket`: written now, with the write in
    /// progress, or by the last caller still to come back from a burst (see the module doc).
    pub fn send(&self, client: u32, ticket: u64, req: &[u8]) -> io::Result<()> {
        let (header, _) = peek_data_header(req).map_err(|_| not_a_data_message())?;
        let write = {
            let mut s = self.lock();
            if !s.expect(client, ticket, header.message_id) {
                return Err(lost());
            }
            s.enqueue(req)
        };
        if write { self.flush() } else { Ok(()) }
    }

    /// Sends `req` as `ticket` with the flusher's next write: for a caller that does not wait
    /// for the reply now (a future), so the requests of many leave together. On an idle
    /// connection (nothing in flight) there is no burst to join: written at once.
    pub fn defer(&self, client: u32, ticket: u64, req: &[u8]) -> io::Result<()> {
        let (header, _) = peek_data_header(req).map_err(|_| not_a_data_message())?;
        let mut s = self.lock();
        let idle = s.in_flight == 0;
        if !s.expect(client, ticket, header.message_id) {
            return Err(lost());
        }
        if !s.enqueue(req) {
            return Ok(()); // a caller still to come back writes it
        }
        if idle {
            drop(s);
            return self.flush();
        }
        let raise = !std::mem::replace(&mut s.flush_wanted, true);
        drop(s);
        if raise {
            self.flusher.notify_one();
        }
        Ok(())
    }

    /// Writes everything queued unless another thread is writing (it looks at the queue again
    /// after it lets go, and writes ours too).
    fn flush(&self) -> io::Result<()> {
        loop {
            let mut out = match self.writing.try_lock() {
                Ok(out) => out,
                Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            };
            std::mem::swap(&mut self.lock().queue, &mut *out);
            if out.is_empty() {
                return Ok(());
            }
            let written = self.pipe.write_all(&out);
            out.clear();
            drop(out);
            if let Err(e) = written {
                self.fail();
                return Err(e);
            }
            // Requests queued while we wrote, by senders that found us writing, are ours to
            // write — unless callers woken meanwhile will come back and write them in a burst.
            if !self.lock().owes_write() {
                return Ok(());
            }
        }
    }

    /// Sends control frame `req` and waits until `deadline` (`None`: forever) for its reply
    /// into `reply` (room for the largest: `CONTROL_FRAME_MAX`); the reply's length. One
    /// exchange at a time: a caller waits for the one before to end.
    pub fn control(
        &self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let (header, _) = peek_control_header(req)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a control frame"))?;
        if reply.len() < CONTROL_FRAME_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no room for the largest control reply",
            ));
        }
        let mut turn = lock(&self.control_turn);
        *turn += 1;
        let ticket = *turn;
        // The exchange's number on the wire (module doc): one of 65,536 in turn, so a late
        // reply would have to come 65,535 exchanges late to be taken for another's.
        let wire_id = ticket as u16;
        let write = {
            let mut s = self.lock();
            if !s.expect(CONTROL, ticket, wire_id) {
                return Err(lost());
            }
            s.enqueue_control(req, wire_id)
        };
        if write {
            self.flush()?;
        }
        let n = self
            .recv(CONTROL, &self.control_bell, ticket, reply, deadline)?
            .ok_or(io::ErrorKind::TimedOut)?;
        set_control_message_id(&mut reply[..n], header.message_id)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad control reply"))?;
        Ok(n)
    }

    /// The reply to `ticket` if it has arrived already.
    pub fn take(&self, client: u32, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        self.lock().take(client, ticket, reply)
    }

    /// Waits until `deadline` (`None`: forever; a past one: one look) for the reply to `ticket`
    /// of `client`, whose caller sleeps on `bell`; reads the connection meanwhile when nobody
    /// else does. `Ok(None)` if it has not come.
    pub fn recv(
        &self,
        client: u32,
        bell: &Bell,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        let mut looked = false;
        let mut s = self.lock();
        loop {
            let expired = deadline.is_some_and(|d| d <= Instant::now());
            let (step, duties) = s.step(client, ticket, reply, expired, looked);
            if step == Step::Park && duties.successor.is_none() && !duties.flush {
                // Parked under the lock: every change that concerns it from now on rings the
                // bell, which keeps the ring until it waits (`bell.rs`).
                drop(s);
                bell.wait(deadline);
                s = self.lock();
                continue;
            }
            drop(s);
            self.perform(duties);
            match step {
                Step::Took(n) => return Ok(Some(n)),
                Step::TimedOut => return Ok(None),
                Step::Lost => return Err(lost()),
                Step::NotAwaited => {
                    return Err(io::Error::other(
                        "no data message awaits a reply under this ticket",
                    ));
                }
                Step::Lead => {
                    let wait = if expired {
                        Wait::Look
                    } else {
                        Wait::Until(deadline)
                    };
                    looked |= self.lead(Reader::Caller(client), ticket, wait);
                }
                // Parked with duties to do first: done, look again (the step takes it out of
                // `parked` and decides anew).
                Step::Park => {}
            }
            s = self.lock();
        }
    }

    /// The reply to `ticket` if it has arrived; otherwise `waker` is woken when it does (or
    /// when the connection is lost).
    pub fn poll(
        &self,
        client: u32,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        let (got, successor) = self
            .lock()
            .poll(client, ticket, reply, waker)
            .map_err(|()| lost())?;
        self.tell(successor);
        Ok(got)
    }

    /// Hands the events filed for `client` to `sink`, having first read what has arrived if
    /// nobody else reads (one look, no wait): a client that polls between its calls sees a
    /// revoke the server sent while nobody was waiting on the connection.
    pub fn poll_events(&self, client: u32, sink: &mut dyn FnMut(Event)) {
        if self.lock().lead_look(client) {
            self.lead(Reader::Caller(client), 0, Wait::Look);
        }
        self.lock().drain_events(client, sink);
    }

    /// Reads the connection as reader `who` (a caller awaiting `ticket`, or the thread), filing
    /// every reply, until [`Sched::reader_done`]; then hands reading on. Returns whether it
    /// stopped at a passed deadline (having read since).
    fn lead(&self, who: Reader, ticket: u64, wait: Wait) -> bool {
        let mut guard = lock(&self.inbound);
        let inbound = &mut *guard;
        loop {
            let got = self.pipe.read(&mut inbound.plain[inbound.filled..], wait);
            let mut ended = match got {
                Ok(0) => true,
                Ok(n) => {
                    inbound.filled += n;
                    false
                }
                Err(e) => !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ),
            };
            let expired = match wait {
                Wait::Look => true,
                Wait::Until(d) => d.is_some_and(|d| d <= Instant::now()),
            };
            let mut wakes = Wakes::new();
            let mut s = self.lock();
            let mut at = 0;
            loop {
                match file_replies(&mut s, &inbound.plain[at..inbound.filled], &mut wakes) {
                    Ok((used, full)) => {
                        at += used;
                        if !full {
                            break;
                        }
                    }
                    Err(()) => {
                        // Bytes that are no data reply: the stream cannot be trusted past them.
                        ended = true;
                        break;
                    }
                }
                // Out of room for wake-ups: deliver them with the lock free, then file on.
                drop(s);
                wakes.deliver();
                s = self.lock();
            }
            inbound.plain.copy_within(at..inbound.filled, 0);
            inbound.filled -= at;
            let (bells, tasks) = if ended { s.close() } else { Default::default() };
            let done = ended || s.reader_done(who, ticket, expired);
            let successor = if done { s.resign(who) } else { None };
            drop(s);
            wakes.deliver();
            if ended {
                self.pipe.shutdown();
                bells.iter().for_each(|b| b.ring());
                tasks.into_iter().for_each(Waker::wake);
            }
            self.tell(successor);
            if done {
                return expired;
            }
        }
    }

    /// Does what a thread owes once the lock is free.
    fn perform(&self, duties: Duties) {
        if duties.flush {
            // A failed write fails the connection: every waiter learns it from the state.
            let _ = self.flush();
        }
        self.tell(duties.successor);
    }

    /// Tells a newly named reader that it reads.
    fn tell(&self, successor: Option<Successor>) {
        match successor {
            Some(Successor::Caller(bell)) => bell.ring(),
            Some(Successor::Thread) => self.standby.notify_one(),
            None => {}
        }
    }

    /// The connection is lost: every waiter learns it, and the connection is shut.
    pub fn fail(&self) {
        let (bells, tasks) = self.lock().close();
        self.pipe.shutdown();
        bells.iter().for_each(|b| b.ring());
        tasks.into_iter().for_each(Waker::wake);
    }

    /// Nobody holds the connection any more: it is shut, and its threads end.
    pub fn close_down(&self) {
        self.lock().gone = true;
        self.pipe.shutdown();
        self.standby.notify_all();
        self.flusher.notify_all();
    }

    /// The standby reader thread: reads for futures whenever it is named reader, until the
    /// hub is gone.
    pub fn run_standby(&self) {
        loop {
            {
                let mut s = self.lock();
                while s.reader() != Reader::Thread && !s.gone {
                    s = self.standby.wait(s).unwrap_or_else(PoisonError::into_inner);
                }
                if s.gone {
                    return;
                }
            }
            self.lead(Reader::Thread, 0, Wait::Until(None));
        }
    }

    /// The flusher thread: writes what futures queued, one write per burst, until the hub is
    /// gone.
    pub fn run_flusher(&self) {
        loop {
            {
                let mut s = self.lock();
                while !s.flush_wanted && !s.gone {
                    s = self.flusher.wait(s).unwrap_or_else(PoisonError::into_inner);
                }
                if s.gone {
                    return;
                }
                // Cleared before the queue is taken (in `flush`): a request queued after this
                // asks again.
                s.flush_wanted = false;
            }
            // An error is the waiters' to learn: `flush` failed the connection.
            let _ = self.flush();
        }
    }
}

/// Files the whole replies at the start of `bytes` until `wakes` is full; returns how many bytes
/// they took and whether it stopped for lack of room. `Err` on bytes that are no data reply or
/// control reply.
fn file_replies(s: &mut Sched, bytes: &[u8], wakes: &mut Wakes) -> Result<(usize, bool), ()> {
    let mut at = 0;
    loop {
        if !wakes.room() {
            return Ok((at, true));
        }
        if peek_magic(&bytes[at..]) == Some(CONTROL_MAGIC) {
            let len = match control_frame_len(&bytes[at..]) {
                Ok(len) => len,
                Err(DecodeError::Truncated) => return Ok((at, false)),
                Err(_) => return Err(()),
            };
            let Some(reply) = bytes.get(at..at + len) else {
                return Ok((at, false));
            };
            match peek_control_header(reply) {
                Ok((header, true)) => s.file(CONTROL, header.message_id, reply, wakes),
                _ => return Err(()),
            }
            at += len;
            continue;
        }
        let (header, len) = match peek_data_response_header(&bytes[at..]) {
            Ok(peeked) => peeked,
            Err(DecodeError::Truncated) => return Ok((at, false)),
            Err(_) => return Err(()),
        };
        let Some(reply) = bytes.get(at..at + len) else {
            return Ok((at, false));
        };
        if is_event_message(&header) {
            // Sent unasked (message id 0): no request awaits it, nobody is woken for it.
            s.file_events(header.client, reply);
        } else {
            s.file(header.client, header.message_id, reply, wakes);
        }
        at += len;
    }
}
