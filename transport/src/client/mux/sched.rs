//! Who reads a shared connection, who sleeps, and who owes a write: the state of the
//! leader/follower hand-off ([`super::hub`] argues the protocol). It is changed only under the
//! hub's one lock, and it is pure: no I/O, no clock, no sleeping. Each change returns what its
//! thread must do once it has let go of the lock ([`Duties`], [`Wakes`]), so that nobody is
//! woken into a lock still held.
//!
//! | field | meaning |
//! |---|---|
//! | `reader` | who reads the connection: nobody, one blocked caller, or the standby thread |
//! | `parked` | blocked callers asleep with no reply yet (each port's `parked` says the same) |
//! | `pending` | callers woken with a reply filed that have not come back for it (`woken`) |
//! | `tasks` | ports whose future waits for a reply (a waker registered) |
//! | `queue` | requests not yet written |
//!
//! Invariants, true whenever the lock is free (`check` asserts them in the tests):
//!
//! 1. *Somebody reads for every waiter*: `parked` or `tasks` non-empty (and the connection
//!    open) ⇒ `reader` is not `Vacant`, or `pending > 0` (and the last of those callers to come
//!    back names the next reader: [`Sched::step`]).
//! 2. *Every queued request leaves*: `queue` non-empty ⇒ `pending > 0` (the last caller back
//!    writes it), or a thread left the lock owing the write (`Duties::flush`, a sender told
//!    to write, the flusher raised).
//! 3. A caller is in `parked` iff its port says `parked`; `pending` counts the ports that say
//!    `woken`; `tasks` counts the ports holding a waker.
//!
//! Control replies are filed under a place of their own, [`CONTROL`] (no client has id 0): the
//! hub lets one control exchange at a time onto the connection, whoever's it is, and its caller
//! waits like any blocked caller.

use std::collections::HashMap;
use std::task::Waker;

use dlock_core::proto::{CONTROL_FRAME_MAX, Event, set_control_message_id};

use super::super::awaited::AwaitTable;
use super::super::events::EventQueue;
pub use super::bell::Bell;
use crate::sync::Arc;

/// The place control replies are filed under: no client has id 0.
pub(super) const CONTROL: u32 = 0;

/// Wake-ups one lock hold may collect before it must let go and deliver them.
const WAKES_MAX: usize = 32;

/// Who reads the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reader {
    /// Nobody: the next blocked caller to wait reads.
    Vacant,
    /// The blocked caller of this client (it was told so if it was asleep).
    Caller(u32),
    /// The standby thread, for futures (it was told so).
    Thread,
}

/// Where a place keeps the replies it awaits.
#[derive(Debug)]
enum Inbox {
    /// A client's data replies, by message id (12 KiB: boxed, so a place is small).
    Data(Box<AwaitTable>),
    /// The reply of the control exchange in flight ([`CONTROL`]).
    Control(ControlSlot),
}

/// The one control exchange in flight on the connection, and its reply once read.
#[derive(Debug)]
struct ControlSlot {
    /// The exchange's ticket (0: none awaited).
    ticket: u64,
    message_id: u16,
    /// The reply's length once it has arrived (0: not yet).
    len: usize,
    reply: Vec<u8>,
}

impl Inbox {
    fn expect(&mut self, ticket: u64, message_id: u16) {
        match self {
            Inbox::Data(t) => t.expect(ticket, message_id),
            Inbox::Control(c) => (c.ticket, c.message_id, c.len) = (ticket, message_id, 0),
        }
    }

    /// Files `reply` under the awaited message with `message_id`; false if none awaits it.
    fn file(&mut self, message_id: u16, reply: &[u8]) -> bool {
        match self {
            Inbox::Data(t) => t.file(message_id, reply),
            Inbox::Control(c) => {
                let awaited = c.ticket != 0 && c.len == 0 && c.message_id == message_id;
                if awaited {
                    c.reply[..reply.len()].copy_from_slice(reply);
                    c.len = reply.len();
                }
                awaited
            }
        }
    }

    fn take(&mut self, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        match self {
            Inbox::Data(t) => t.take(ticket, reply),
            Inbox::Control(c) if ticket != 0 && c.ticket == ticket && c.len > 0 => {
                reply[..c.len].copy_from_slice(&c.reply[..c.len]);
                c.ticket = 0;
                Some(c.len)
            }
            Inbox::Control(_) => None,
        }
    }

    fn arrived(&self, ticket: u64) -> bool {
        match self {
            Inbox::Data(t) => t.arrived(ticket),
            Inbox::Control(c) => ticket != 0 && c.ticket == ticket && c.len > 0,
        }
    }

    fn awaits(&self, ticket: u64) -> bool {
        match self {
            Inbox::Data(t) => t.awaits(ticket),
            Inbox::Control(c) => ticket != 0 && c.ticket == ticket,
        }
    }
}

/// One client's place on the connection (or the control replies').
#[derive(Debug)]
struct Entry {
    awaited: Inbox,
    bell: Arc<Bell>,
    /// The task to wake when a reply arrives.
    waker: Option<Waker>,
    /// Its caller sleeps in `Sched::parked`.
    parked: bool,
    /// Its caller was woken with a reply filed and is counted in `pending`.
    woken: bool,
    /// Event messages the server sent this client unasked (`events.rs`), filed by whoever
    /// reads and drained by the client's `poll_events` (boxed, so a place is small).
    events: Box<EventQueue>,
}

/// What a blocked caller does next ([`Sched::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Its reply, copied out (this many bytes).
    Took(usize),
    /// It reads the connection now (it is `reader`).
    Lead,
    /// It sleeps on its bell (it is in `parked`).
    Park,
    /// Its deadline passed with no reply.
    TimedOut,
    /// The connection is gone.
    Lost,
    /// No message of this client awaits a reply under the ticket.
    NotAwaited,
}

/// A reader named by a change, to be told once the lock is free.
#[derive(Debug)]
pub(super) enum Successor {
    Caller(Arc<Bell>),
    Thread,
}

/// What a thread owes once it lets go of the lock.
#[must_use]
#[derive(Debug, Default)]
pub(super) struct Duties {
    /// Write the queue.
    pub(super) flush: bool,
    /// Tell this reader it reads.
    pub(super) successor: Option<Successor>,
}

/// Bells to ring and tasks to wake once the lock is free, collected without allocating.
#[derive(Debug)]
pub(super) struct Wakes {
    bells: [Option<Arc<Bell>>; WAKES_MAX],
    tasks: [Option<Waker>; WAKES_MAX],
    bells_n: usize,
    tasks_n: usize,
}

impl Wakes {
    pub(super) fn new() -> Self {
        Self {
            bells: [const { None }; WAKES_MAX],
            tasks: [const { None }; WAKES_MAX],
            bells_n: 0,
            tasks_n: 0,
        }
    }

    /// Whether one more reply's bell and task fit.
    pub(super) fn room(&self) -> bool {
        self.bells_n < WAKES_MAX && self.tasks_n < WAKES_MAX
    }

    /// Rings and wakes everything collected; to be called with the lock free.
    pub(super) fn deliver(&mut self) {
        for b in self.bells[..self.bells_n].iter_mut() {
            if let Some(b) = b.take() {
                b.ring();
            }
        }
        for t in self.tasks[..self.tasks_n].iter_mut() {
            if let Some(t) = t.take() {
                t.wake();
            }
        }
        (self.bells_n, self.tasks_n) = (0, 0);
    }
}

/// The hand-off's state (see the module doc).
#[derive(Debug)]
pub(super) struct Sched {
    reader: Reader,
    parked: Vec<u32>,
    pending: usize,
    tasks: usize,
    /// Requests not yet written, in the order they were sent.
    pub(super) queue: Vec<u8>,
    /// Requests sent whose replies have not been filed (approximate: a reply that never comes
    /// is never subtracted; it only decides whether a future's request waits for a burst).
    pub(super) in_flight: usize,
    /// The flusher is asked to write the queue.
    pub(super) flush_wanted: bool,
    /// The connection failed or was closed: no reply will come.
    pub(super) closed: bool,
    /// Nobody holds the connection any more: its threads end.
    pub(super) gone: bool,
    ports: HashMap<u32, Entry>,
}

impl Sched {
    /// Nothing attached but the control replies' place, whose caller sleeps on `control`.
    pub(super) fn new(queue_capacity: usize, control: Arc<Bell>) -> Self {
        let mut s = Self {
            reader: Reader::Vacant,
            parked: Vec::new(),
            pending: 0,
            tasks: 0,
            queue: Vec::with_capacity(queue_capacity),
            in_flight: 0,
            flush_wanted: false,
            closed: false,
            gone: false,
            ports: HashMap::new(),
        };
        let slot = ControlSlot {
            ticket: 0,
            message_id: 0,
            len: 0,
            reply: vec![0; CONTROL_FRAME_MAX],
        };
        s.add(CONTROL, control, Inbox::Control(slot));
        s
    }

    /// Clients with a place (the control replies' is not one).
    pub(super) fn clients(&self) -> usize {
        self.ports.len() - 1
    }

    /// Who reads now.
    pub(super) fn reader(&self) -> Reader {
        self.reader
    }

    /// Callers asleep with no reply yet.
    #[cfg(any(test, dlock_loom))]
    pub(super) fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// Adds `client`'s place, ringing `bell` for its caller. `parked` gets room for it now, so
    /// that parking never allocates.
    pub(super) fn attach(&mut self, client: u32, bell: Arc<Bell>) {
        debug_assert_ne!(client, CONTROL, "no client has id 0");
        self.add(client, bell, Inbox::Data(Box::new(AwaitTable::new())));
    }

    fn add(&mut self, client: u32, bell: Arc<Bell>, awaited: Inbox) {
        self.parked
            .reserve(self.ports.len() + 1 - self.parked.len());
        self.ports.insert(
            client,
            Entry {
                awaited,
                bell,
                waker: None,
                parked: false,
                woken: false,
                events: Box::default(),
            },
        );
    }

    /// Removes `client`'s place if it is still the one rung by `bell` (a re-registration may
    /// have replaced it). Its caller is not inside a wait: it is the one letting go.
    pub(super) fn detach(&mut self, client: u32, bell: &Arc<Bell>) {
        if !self
            .ports
            .get(&client)
            .is_some_and(|e| Arc::ptr_eq(&e.bell, bell))
        {
            return;
        }
        if let Some(e) = self.ports.remove(&client) {
            debug_assert!(
                !e.parked && !e.woken,
                "a port let go while its caller waits"
            );
            if e.waker.is_some() {
                self.tasks -= 1;
            }
        }
    }

    /// Files `ticket` as awaiting the reply to `message_id`; false if the connection is gone.
    pub(super) fn expect(&mut self, client: u32, ticket: u64, message_id: u16) -> bool {
        match self.ports.get_mut(&client) {
            Some(e) if !self.closed => {
                e.awaited.expect(ticket, message_id);
                self.in_flight += 1;
                true
            }
            _ => false,
        }
    }

    /// Queues a request; true if the sender must write the queue itself (nobody woken with a
    /// reply is still to come back and write it: invariant 2).
    pub(super) fn enqueue(&mut self, bytes: &[u8]) -> bool {
        self.queue.extend_from_slice(bytes);
        self.pending == 0
    }

    /// Queues control request `bytes` as [`Sched::enqueue`] does, numbered `message_id` on the
    /// wire (the hub's number for the exchange, see `Hub::control`).
    pub(super) fn enqueue_control(&mut self, bytes: &[u8], message_id: u16) -> bool {
        let at = self.queue.len();
        self.queue.extend_from_slice(bytes);
        let renumbered = set_control_message_id(&mut self.queue[at..], message_id);
        debug_assert!(renumbered.is_ok(), "the hub checked the frame's header");
        self.pending == 0
    }

    /// Whether a writer that has just written must look again: requests queued meanwhile and
    /// nobody woken still to come back and write them.
    pub(super) fn owes_write(&self) -> bool {
        !self.queue.is_empty() && self.pending == 0
    }

    /// The reply to `ticket` if it has arrived (the entry is freed).
    pub(super) fn take(&mut self, client: u32, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        self.ports.get_mut(&client)?.awaited.take(ticket, reply)
    }

    /// One turn of a blocked caller's wait for the reply to `ticket`: it comes back from its
    /// bell (or arrives), settles what it was counted as, and learns what to do. `expired`:
    /// its deadline has passed; `looked`: it has read the connection once since then.
    pub(super) fn step(
        &mut self,
        me: u32,
        ticket: u64,
        reply: &mut [u8],
        expired: bool,
        looked: bool,
    ) -> (Step, Duties) {
        let mut duties = self.come_back(me);
        let step = self.decide(me, ticket, reply, expired, looked);
        // The last caller back, or a reader that stopped, names the next (invariant 1).
        duties.successor = self.successor();
        (step, duties)
    }

    /// `me` is back under the lock: out of `parked` (a timeout or a spurious wake-up), and no
    /// longer `pending` if it was woken. The last of the woken writes what they queued.
    fn come_back(&mut self, me: u32) -> Duties {
        let mut duties = Duties::default();
        let Some(e) = self.ports.get_mut(&me) else {
            return duties;
        };
        if e.parked {
            e.parked = false;
            unpark(&mut self.parked, me);
        }
        if e.woken {
            e.woken = false;
            self.pending -= 1;
            duties.flush = self.pending == 0 && !self.queue.is_empty();
        }
        duties
    }

    fn decide(
        &mut self,
        me: u32,
        ticket: u64,
        reply: &mut [u8],
        expired: bool,
        looked: bool,
    ) -> Step {
        let reading = self.reader == Reader::Caller(me);
        let Some(e) = self.ports.get_mut(&me) else {
            return Step::Lost;
        };
        let step = if let Some(n) = e.awaited.take(ticket, reply) {
            Step::Took(n)
        } else if self.closed {
            Step::Lost
        } else if !e.awaited.awaits(ticket) {
            Step::NotAwaited
        } else if expired && looked {
            // Read once since the deadline: the answer is no.
            Step::TimedOut
        } else if reading || self.reader == Reader::Vacant {
            // A deadline already passed still gets one look (`looked` then stops it).
            self.reader = Reader::Caller(me);
            return Step::Lead;
        } else if expired {
            Step::TimedOut
        } else {
            e.parked = true;
            self.parked.push(me);
            return Step::Park;
        };
        if reading {
            self.reader = Reader::Vacant;
        }
        step
    }

    /// Names the next reader if nobody reads, somebody waits, and nobody woken is still to
    /// come back (the last of those will call this): a sleeping caller first, else the thread.
    fn successor(&mut self) -> Option<Successor> {
        if self.reader != Reader::Vacant || self.pending > 0 || self.closed {
            return None;
        }
        if let Some(id) = self.parked.pop() {
            let e = self
                .ports
                .get_mut(&id)
                .expect("a parked caller's port is attached: it detaches only outside a wait");
            e.parked = false;
            self.reader = Reader::Caller(id);
            return Some(Successor::Caller(Arc::clone(&e.bell)));
        }
        if self.tasks > 0 {
            self.reader = Reader::Thread;
            return Some(Successor::Thread);
        }
        None
    }

    /// The reply to `ticket` for a future: taken if it has arrived, else `waker` is filed to be
    /// woken when it does (and a reader named if nobody reads). `Err` when the connection is
    /// gone.
    pub(super) fn poll(
        &mut self,
        client: u32,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> Result<(Option<usize>, Option<Successor>), ()> {
        let Some(e) = self.ports.get_mut(&client) else {
            return Err(());
        };
        if let Some(n) = e.awaited.take(ticket, reply) {
            return Ok((Some(n), None));
        }
        if self.closed {
            return Err(());
        }
        match &mut e.waker {
            Some(w) if w.will_wake(waker) => {}
            slot => {
                if slot.is_none() {
                    self.tasks += 1;
                }
                *slot = Some(waker.clone());
            }
        }
        Ok((None, self.successor()))
    }

    /// Files one reply read off the connection under the client and message it answers,
    /// collecting whom to wake: its caller if asleep (now counted in `pending`), its task.
    /// A reply nobody awaits (a detached client, a message given up on) is dropped. `wakes`
    /// must have room ([`Wakes::room`]).
    pub(super) fn file(&mut self, client: u32, message_id: u16, reply: &[u8], wakes: &mut Wakes) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(e) = self.ports.get_mut(&client) else {
            return;
        };
        if !e.awaited.file(message_id, reply) {
            return;
        }
        if e.parked {
            e.parked = false;
            unpark(&mut self.parked, client);
            e.woken = true;
            self.pending += 1;
            wakes.bells[wakes.bells_n] = Some(Arc::clone(&e.bell));
            wakes.bells_n += 1;
        }
        if let Some(w) = e.waker.take() {
            self.tasks -= 1;
            wakes.tasks[wakes.tasks_n] = Some(w);
            wakes.tasks_n += 1;
        }
    }

    /// Files event message `msg`, sent unasked to `client`, in its event queue: no request
    /// awaits it, so nobody is woken and nothing in flight is settled. An event for a client
    /// that has let go of its place is dropped (its grants went with its registration).
    pub(super) fn file_events(&mut self, client: u32, msg: &[u8]) {
        if let Some(e) = self.ports.get_mut(&client) {
            e.events.file_message(msg);
        }
    }

    /// Hands `client`'s filed events to `sink`.
    pub(super) fn drain_events(&mut self, client: u32, sink: &mut dyn FnMut(Event)) {
        if let Some(e) = self.ports.get_mut(&client) {
            e.events.drain(sink);
        }
    }

    /// Names `me` reader for one look at the connection, if nobody reads and no woken caller
    /// is still to come back (one of those would read): a client polling its events reads
    /// what has come meanwhile. False if someone else reads or will (their reading files our
    /// events too) or the connection is gone.
    pub(super) fn lead_look(&mut self, me: u32) -> bool {
        let free = self.reader == Reader::Vacant && self.pending == 0 && !self.closed;
        if free && self.ports.contains_key(&me) {
            self.reader = Reader::Caller(me);
        }
        self.reader == Reader::Caller(me)
    }

    /// Whether the reader `who` has read enough after a burst: the connection is gone, the
    /// caller's own reply is in (or its deadline passed), or the thread has no task left.
    pub(super) fn reader_done(&self, who: Reader, ticket: u64, expired: bool) -> bool {
        if self.closed || self.gone {
            return true;
        }
        match who {
            Reader::Caller(me) => {
                expired
                    || self
                        .ports
                        .get(&me)
                        .is_none_or(|e| e.awaited.arrived(ticket) || !e.awaited.awaits(ticket))
            }
            Reader::Thread => self.tasks == 0,
            Reader::Vacant => true,
        }
    }

    /// The reader `who` stops reading and names the next if somebody waits.
    pub(super) fn resign(&mut self, who: Reader) -> Option<Successor> {
        debug_assert_eq!(self.reader, who, "only the reader resigns");
        self.reader = Reader::Vacant;
        self.successor()
    }

    /// The connection is lost: no reply will come, every waiter must learn it. Returns the
    /// bells and tasks to wake (allocated: a failure is off the data path).
    pub(super) fn close(&mut self) -> (Vec<Arc<Bell>>, Vec<Waker>) {
        self.closed = true;
        self.parked.clear();
        let mut bells = Vec::new();
        let mut tasks = Vec::new();
        for e in self.ports.values_mut() {
            if std::mem::take(&mut e.parked) {
                bells.push(Arc::clone(&e.bell));
            }
            if let Some(w) = e.waker.take() {
                self.tasks -= 1;
                tasks.push(w);
            }
        }
        // Whoever reads sees `closed` after its read fails; the thread's wait checks it too.
        (bells, tasks)
    }

    /// Invariants 1 and 3 of the module doc (for the tests; invariant 2 depends on duties
    /// in flight outside the lock, which the hub's tests check end to end).
    #[cfg(test)]
    pub(super) fn check(&self) {
        let parked = self.ports.values().filter(|e| e.parked).count();
        assert_eq!(parked, self.parked.len(), "parked list and ports agree");
        assert!(self.parked.iter().all(|id| self.ports[id].parked));
        let woken = self.ports.values().filter(|e| e.woken).count();
        assert_eq!(woken, self.pending, "pending counts the woken");
        let tasks = self.ports.values().filter(|e| e.waker.is_some()).count();
        assert_eq!(tasks, self.tasks, "tasks counts the wakers");
        if !self.closed && (!self.parked.is_empty() || self.tasks > 0) {
            assert!(
                self.reader != Reader::Vacant || self.pending > 0,
                "somebody reads for every waiter"
            );
        }
    }
}

/// Takes `id` out of the parked list (its order does not matter: any sleeper may be named).
fn unpark(parked: &mut Vec<u32>, id: u32) {
    if let Some(k) = parked.iter().position(|&p| p == id) {
        parked.swap_remove(k);
    }
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
