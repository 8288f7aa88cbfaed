//! The TCP data connections, served by the data thread itself.
//!
//! Once the data thread has accepted a data connection's attach (the session checked) and the
//! control thread has written the attach status, the control thread hands the connection over
//! — socket and TLS session — through `Exchange::handover`, and it lives here until it closes.
//! The data thread owns a mio `Poll` (edge-triggered) with every such socket and the eventfd
//! that wakes it (`wake.rs`); blocking in that poll is its one idle wait.
//!
//! Each turn, for every connection with something to do: read every byte available (into a
//! buffer sized at attach), execute every complete data message found in it, append each reply
//! to the connection's write buffer, and write that buffer with one write. Replies may leave in
//! any order: a blocking request that parks is answered when it is decided (`deliver`), and the
//! messages behind it are served meanwhile; the client matches replies by message id. Events
//! may not fall behind: before a data message runs, every event its client has waiting for
//! this connection goes into the write buffer ahead of its reply (`events.rs` says why), and
//! the message waits, as at a closed window, until they fit. Event messages count in the
//! window as replies do.
//!
//! A connection speaks for its *members*: the client its attach proved, and every client that
//! joined it since with a join command (`proto::JoinCommand`, the session checked as for an
//! attach). A multiplexing client thus serves many registrations of one process over one
//! connection. Membership, and every rule about who may send what here, is the core's
//! (`dlock_core::server::Routing`, `route` and `Server::dispatch_stream`): a slot names at most
//! one connection, and a message is executed only if its header's client is the member bound in
//! its slot on the connection it came on. This file moves the bytes.
//!
//! The members' control frames come this way too (a control frame's magic tells it from a data
//! message): registration, heartbeats, names, statistics, each run here on the data thread as
//! the control thread's jobs are, under the core's rules for a stream
//! (`dlock_core::server::control`, `Server::control_on_stream`), and answered in the write
//! buffer like a data message. A registration made here binds its client to the connection and
//! makes the connection its control path. The first control frame a connection brings grows its
//! read buffer to hold the largest one (once, as a join grows the write buffer); a control
//! frame waits, as a message at a closed window does, until the write buffer has room for the
//! largest control reply.
//!
//! The window bounds what one connection can make us hold: at most [`WINDOW_MAX`] requests
//! executed whose replies have not left the write buffer. Parked requests stand outside it —
//! each member has at most one, and a window full of waiters would shut out the unlocks that
//! could grant them — and the write buffer keeps room for one reply per member besides the
//! window's (it grows when a client joins, never per message). At the window the connection is
//! not read until its replies drain — the peer's bytes wait in the kernel and TCP's flow control
//! pushes back. No allocation per message.
//!
//! The rules the control thread kept for these connections hold here: one data connection per
//! client (a newer attach or join moves the client there, and its request parked on the older
//! is cancelled), a lost connection cancels its members' parked requests, a gone client leaves
//! its connection at once (before its id can be registered again: the connection proved nothing
//! about a new registration) and a connection left with no member is closed, a message begun
//! must complete within the frame timeout, a reply not taken within it closes the connection,
//! a join with a wrong session closes it (counted, as a refused attach), and so do a join among
//! other commands (`dlock_core::server::route`), bytes that are no data message and a message
//! speaking for a registered client that is not a member. A
//! message for a client not registered at all is answered `ClientNotInit` (a member that just
//! left learns why; nobody else is concerned).

mod control_frames;
mod events;

use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::Peer;
use dlock_core::proto::{
    CONTROL_MAGIC, DATA_MESSAGE_MAX, DATA_RESPONSE_WITH_VALUES_MAX, control_frame_len,
    peek_data_header, peek_magic,
};
use dlock_core::server::{Counter, Dispatched, Routing, Server, Streamed};
use mio::{Events, Interest, Poll, Token};

use self::control_frames::Framed;
use self::events::events_ahead;
pub(super) use self::events::{ConnEvents, EventsAhead};
use super::events::{Room, Sent};
use super::exchange::Handover;
use super::stream::Stream;
use super::{ServerConfig, Shared};

/// The data thread's eventfd in its poll.
pub(super) const WAKER: Token = Token(0);
/// Connection `i` is `Token(i + FIRST_CONN)`.
const FIRST_CONN: usize = 1;

/// Requests one connection may have executed and not answered on the wire (replies in the
/// write buffer; parked requests are not counted, see the module doc). A pipelined client
/// keeps 4 batches in flight; 32 leaves room for clients that multiplex many threads over one
/// connection while bounding each connection's write buffer at 32 largest replies (86 KiB,
/// value and proof trailers included) plus one per member.
pub const WINDOW_MAX: usize = 32;

/// The read buffer: enough for the window's worth of small messages (one command: 48 bytes)
/// or a few largest ones per read, so a turn drains a busy socket in a few reads.
const READ_BUF: usize = 8 * DATA_MESSAGE_MAX;
/// The write buffer of a connection with `members` members: every reply the window allows, and
/// the reply of a parked request of each member.
const fn write_buf(members: usize) -> usize {
    (WINDOW_MAX + members) * DATA_RESPONSE_WITH_VALUES_MAX
}

/// Handed-over connections taken per turn (each allocates its buffers).
const HANDOVERS_PER_TURN: usize = 16;

#[derive(Debug)]
struct DataConn {
    stream: Stream,
    generation: u32,
    /// The client whose attach opened the connection (for the logs).
    client: u32,
    /// Who the peer is: the per-peer cap counts registrations made over the connection.
    peer: Peer,
    rbuf: Box<[u8]>,
    rlen: usize,
    wbuf: Box<[u8]>,
    /// `wbuf[wstart..wend]` waits to be written.
    wstart: usize,
    wend: usize,
    /// Replies put in the write buffer since it was last empty (a conservative count of those
    /// not yet written: it drops to zero only when the buffer empties).
    unwritten: usize,
    /// The socket may have bytes to read (no `WouldBlock` since its last readable edge).
    readable: bool,
    /// The socket may take bytes (no short write since its last writable edge).
    writable: bool,
    /// In `ready`.
    queued: bool,
    /// When the first bytes of the incomplete message in `rbuf` arrived (ms).
    frame_started: Option<u64>,
    /// When a reply first could not be written whole (ms).
    write_blocked: Option<u64>,
}

impl DataConn {
    fn window_open(&self) -> bool {
        self.unwritten < WINDOW_MAX
    }

    /// Bytes wait to go out (replies, or TLS records).
    fn pending_write(&self) -> bool {
        self.wend > self.wstart || self.stream.wants_write()
    }

    /// Whether a whole message (or control frame) waits in the read buffer.
    fn message_waiting(&self) -> bool {
        let buf = &self.rbuf[..self.rlen];
        match peek_data_header(buf) {
            Ok((_, len)) => len <= self.rlen,
            Err(_) => control_frame_len(buf).is_ok_and(|len| len <= self.rlen),
        }
    }

    /// Whether serving again next turn would make progress.
    fn has_work(&self) -> bool {
        (self.window_open() && (self.readable || self.message_waiting()))
            || (self.writable && self.pending_write())
    }

    /// Makes room for one more reply at the end of the write buffer, moving what waits to the
    /// front if need be. The window and the buffer's size guarantee the room ([`write_buf`]);
    /// false if they did not (a bug: the caller closes the connection rather than overrun).
    #[must_use]
    fn make_reply_room(&mut self) -> bool {
        let room = self.make_room(DATA_RESPONSE_WITH_VALUES_MAX);
        debug_assert!(room, "a reply with no room in the write buffer");
        room
    }

    /// Makes `n` bytes of room at the end of the write buffer if what waits allows it, moving
    /// what waits to the front if need be; whether it did.
    fn make_room(&mut self, n: usize) -> bool {
        if self.wend + n > self.wbuf.len() {
            self.wbuf.copy_within(self.wstart..self.wend, 0);
            self.wend -= self.wstart;
            self.wstart = 0;
        }
        self.wend + n <= self.wbuf.len()
    }

    /// A reply of `n` bytes was written at the end of the write buffer (in the room
    /// [`Self::make_reply_room`] made).
    fn reply_written(&mut self, n: usize) {
        self.wend += n;
        self.unwritten += 1;
    }

    /// Puts `reply` (a parked request's, decided outside the connection's turn) at the end of
    /// the write buffer, in the room kept for it ([`write_buf`]); false if there was none (a
    /// bug, logged: the reply is dropped rather than the buffer overrun).
    fn put_reply(&mut self, reply: &[u8]) -> bool {
        if !self.make_reply_room() {
            tracing::error!(client = self.client, "no room for a parked request's reply");
            return false;
        }
        self.wbuf[self.wend..self.wend + reply.len()].copy_from_slice(reply);
        self.reply_written(reply.len());
        true
    }

    /// Grows the write buffer to hold what `members` members may have answered at once.
    fn fit_members(&mut self, members: usize) {
        let want = write_buf(members);
        if self.wbuf.len() < want {
            let mut bigger = vec![0u8; want].into_boxed_slice();
            bigger[..self.wend - self.wstart].copy_from_slice(&self.wbuf[self.wstart..self.wend]);
            self.wend -= self.wstart;
            self.wstart = 0;
            self.wbuf = bigger;
        }
    }
}

/// What serving a connection came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
enum Outcome {
    /// Still open.
    Open,
    /// Lost or misbehaving: close it.
    Close,
}

/// The data connections and the poll they are registered in.
pub(super) struct DataConns<'s> {
    shared: &'s Shared,
    poll: Poll,
    events: Events,
    conns: Vec<Option<DataConn>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    /// Connections to serve this turn (each once: `DataConn::queued`).
    ready: Vec<u32>,
    frame_timeout_ms: u64,
}

impl<'s> DataConns<'s> {
    pub(super) fn new(shared: &'s Shared, cfg: &ServerConfig, poll: Poll) -> Self {
        let max = cfg.connections_max;
        Self {
            shared,
            poll,
            events: Events::with_capacity(256),
            conns: Vec::with_capacity(max),
            generations: Vec::with_capacity(max),
            free: Vec::with_capacity(max),
            ready: Vec::with_capacity(max),
            frame_timeout_ms: millis(cfg.frame_timeout),
        }
    }

    /// Connections open.
    pub(super) fn open(&self) -> usize {
        self.conns.len() - self.free.len()
    }

    /// Whether a connection has work queued for the next turn (the idle re-check).
    pub(super) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Waits for socket events or a wake, at most `timeout` (`Some(ZERO)`: just look), and
    /// queues the connections that have something to do.
    pub(super) fn wait(&mut self, timeout: Option<Duration>) {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => {
                tracing::error!(error = %e, "data thread poll failed");
                return;
            }
        }
        for ev in self.events.iter() {
            let Some(i) = ev.token().0.checked_sub(FIRST_CONN) else {
                continue; // the waker: its work is in the queues and doorbells
            };
            let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.readable = true;
            }
            if ev.is_writable() || ev.is_error() {
                c.writable = true;
            }
            if !c.queued {
                c.queued = true;
                self.ready.push(i as u32);
            }
        }
    }

    /// Takes connections the control thread handed over; returns how many.
    pub(super) fn take_handovers(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        now: u64,
    ) -> usize {
        let mut n = 0;
        while n < HANDOVERS_PER_TURN {
            let Some(h) = self.shared.exchange.handover.pop() else {
                break;
            };
            n += 1;
            self.adopt(h, server, routing, now);
        }
        n
    }

    fn adopt(&mut self, h: Handover, server: &mut Server<'_>, routing: &mut Routing<'_>, now: u64) {
        let Handover {
            mut stream,
            client,
            early,
            unsent,
            peer,
        } = h;
        let Some(slot) = server.client_slot_of(client) else {
            // Gone between its attach and now: nothing to serve.
            self.dropped();
            return;
        };
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.conns.push(None);
                self.generations.push(0);
                self.conns.len() - 1
            }
        };
        self.generations[i] = self.generations[i].wrapping_add(1);
        if let Err(e) = self.poll.registry().register(
            stream.source(),
            Token(i + FIRST_CONN),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(error = %e, "cannot register a data connection");
            self.free.push(i as u32);
            self.dropped();
            return;
        }
        let mut rbuf = vec![0u8; READ_BUF].into_boxed_slice();
        let mut wbuf = vec![0u8; write_buf(1)].into_boxed_slice();
        // The control thread reads at most a control frame ahead, and writes a 4-byte status.
        let rlen = early.len().min(READ_BUF);
        rbuf[..rlen].copy_from_slice(&early[..rlen]);
        let wend = unsent.len().min(wbuf.len());
        wbuf[..wend].copy_from_slice(&unsent[..wend]);
        self.conns[i] = Some(DataConn {
            stream,
            generation: self.generations[i],
            client,
            peer,
            rbuf,
            rlen,
            wbuf,
            wstart: 0,
            wend,
            unwritten: 0,
            // Bytes may have arrived before registration (edge-triggered: no event for them).
            readable: true,
            writable: true,
            queued: true,
            frame_started: (rlen > 0).then_some(now),
            write_blocked: None,
        });
        self.ready.push(i as u32);
        // One data connection per client: an older one the client left, now with no member,
        // closes.
        let at = (i as u32, self.generations[i]);
        if let Some(vacated) = server.bind_stream(routing, (slot, client), at, now) {
            self.close(vacated as usize, server, routing, now);
        }
    }

    /// A handed-over connection was dropped before it was served: it no longer counts.
    fn dropped(&self) {
        // Relaxed: a count the control thread compares against the cap; nothing is published.
        self.shared
            .exchange
            .data_conns
            .fetch_sub(1, Ordering::Relaxed);
    }

    /// Serves every queued connection once, each at a time `clock` reads after its turn comes
    /// (so a request is never run at a time before it arrived: `data::fresh`); returns how
    /// many were served.
    pub(super) fn serve(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        events: &mut EventsAhead<'_>,
        clock: impl Fn() -> u64,
    ) -> usize {
        // Those with more to do after their turn (the read buffer filled, the window reopened)
        // go to the back, for the next turn.
        let n = self.ready.len();
        for k in 0..n {
            let i = self.ready[k] as usize;
            // Out of the table for its turn, so a join can rebind (and close) other connections.
            let Some(mut c) = self.conns.get_mut(i).and_then(Option::take) else {
                continue;
            };
            c.queued = false;
            let now = clock();
            let outcome = self.serve_one(&mut c, i as u32, (server, routing), events, now);
            let again = outcome == Outcome::Open && c.has_work();
            c.queued = again;
            self.conns[i] = Some(c);
            if outcome == Outcome::Close {
                self.close(i, server, routing, now);
            } else if again {
                self.ready.push(i as u32);
            }
        }
        self.ready.drain(..n);
        n
    }

    /// Puts the reply of a parked request of connection (`conn`, `generation`) in its write
    /// buffer, to go out this turn; false if that connection is gone.
    pub(super) fn deliver(&mut self, conn: u32, generation: u32, reply: &[u8]) -> bool {
        self.write_to(conn, generation, |c| c.put_reply(reply))
            .unwrap_or(false)
    }

    /// Hands `send` the write buffer of connection (`conn`, `generation`) to put event messages
    /// in (a closed window is waited out: `Room::Retry`), to go out this turn; `None` if that
    /// connection is gone.
    pub(super) fn with_events(
        &mut self,
        conn: u32,
        generation: u32,
        send: impl FnOnce(&mut ConnEvents<'_>) -> Sent,
    ) -> Option<Sent> {
        self.write_to(conn, generation, |c| {
            send(&mut ConnEvents {
                c,
                closed: Room::Retry,
            })
        })
    }

    /// The one way into a connection's write buffer from outside its turn (a parked request's
    /// reply, events at the end of a turn): lets `write` put messages in the write buffer of
    /// connection (`conn`, `generation`), and queues the connection to write them this turn if
    /// it put any; `None` if that connection is gone.
    fn write_to<R>(
        &mut self,
        conn: u32,
        generation: u32,
        write: impl FnOnce(&mut DataConn) -> R,
    ) -> Option<R> {
        let c = self
            .conns
            .get_mut(conn as usize)
            .and_then(Option::as_mut)
            .filter(|c| c.generation == generation)?;
        // Every message put in the buffer counts there (`DataConn::reply_written`).
        let unwritten = c.unwritten;
        let written = write(c);
        if c.unwritten != unwritten && !c.queued {
            c.queued = true;
            self.ready.push(conn);
        }
        Some(written)
    }

    /// Every tick: members whose client is no longer registered (in its slot) leave their
    /// connection, and connections left with no member or past their timeouts are closed.
    pub(super) fn sweep(&mut self, server: &mut Server<'_>, routing: &mut Routing<'_>, now: u64) {
        server.sweep_streams(routing, |conn| {
            // Its clients are gone: their control connections tell them why. It has no member
            // whose parked request closing it would cancel.
            self.shared.counters.bump(Counter::ConnectionsOfGoneClients);
            self.drop_conn(conn as usize);
        });
        let late = |since: Option<u64>, limit: u64| since.is_some_and(|t| now > t + limit);
        for i in 0..self.conns.len() {
            let Some(c) = &self.conns[i] else {
                continue;
            };
            let stale = late(c.frame_started, self.frame_timeout_ms)
                || late(c.write_blocked, self.frame_timeout_ms);
            if stale {
                tracing::debug!(client = c.client, "data connection timed out");
                self.shared.counters.bump(Counter::ConnectionsTimedOut);
                self.close(i, server, routing, now);
            }
        }
    }

    /// Closes connection `i`: its members' parked requests are cancelled, they leave it, and it
    /// stops counting.
    fn close(&mut self, i: usize, server: &mut Server<'_>, routing: &mut Routing<'_>, now: u64) {
        if self.conns.get(i).is_some_and(Option::is_some) {
            server.stream_closed(routing, i as u32, now);
            self.drop_conn(i);
        }
    }

    /// Takes connection `i` out of the poll and the table: its socket closes.
    fn drop_conn(&mut self, i: usize) {
        let Some(mut c) = self.conns.get_mut(i).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(c.stream.source());
        self.free.push(i as u32);
        self.dropped();
    }

    /// One turn of connection `c` (index `i`): read, execute, write.
    fn serve_one(
        &mut self,
        c: &mut DataConn,
        i: u32,
        (server, routing): (&mut Server<'_>, &mut Routing<'_>),
        events: &mut EventsAhead<'_>,
        now: u64,
    ) -> Outcome {
        if c.window_open() && c.readable && read(c) == Outcome::Close {
            return Outcome::Close;
        }
        if self.execute(c, i, (server, routing), events, now) == Outcome::Close {
            return Outcome::Close;
        }
        if c.writable && c.pending_write() {
            return write(c, now);
        }
        Outcome::Open
    }

    /// Executes every complete message in the read buffer while the window is open, each data
    /// message after its client's waiting events.
    fn execute(
        &mut self,
        c: &mut DataConn,
        i: u32,
        (server, routing): (&mut Server<'_>, &mut Routing<'_>),
        events: &mut EventsAhead<'_>,
        now: u64,
    ) -> Outcome {
        let mut at = 0;
        let mut blocked = false;
        while at < c.rlen {
            if !c.window_open() {
                blocked = true;
                break;
            }
            if peek_magic(&c.rbuf[at..c.rlen]) == Some(CONTROL_MAGIC) {
                match self.control(c, i, at, server, routing, now) {
                    Framed::Done(len) => at += len,
                    Framed::Incomplete => break,
                    Framed::NoRoom => {
                        blocked = true;
                        break;
                    }
                    Framed::Close => return Outcome::Close,
                }
                continue;
            }
            // Its client's events first (`events.rs`); a message not whole yet has a header.
            if let Ok((header, _)) = peek_data_header(&c.rbuf[at..c.rlen])
                && !events_ahead(c, i, header.client, (server, routing), events)
            {
                blocked = true;
                break;
            }
            if !c.window_open() {
                blocked = true;
                break;
            }
            if !c.make_reply_room() {
                return Outcome::Close;
            }
            // Framing, joins, who the connection speaks for, execution and the route of a
            // parked request: the core's (`Server::dispatch_stream`).
            let msg = &c.rbuf[at..c.rlen];
            let room = &mut c.wbuf[c.wend..c.wend + DATA_RESPONSE_WITH_VALUES_MAX];
            let (len, dispatched) =
                match server.dispatch_stream(routing, (i, c.generation), msg, room, now) {
                    Streamed::Incomplete => break,
                    Streamed::Malformed => return Outcome::Close,
                    Streamed::Message { len, dispatched } => (len, dispatched),
                };
            match dispatched {
                Dispatched::Replied(n) => c.reply_written(n),
                Dispatched::Parked => {}
                Dispatched::Joined { reply, vacated } => {
                    c.reply_written(reply);
                    // A parked request's reply of each member must fit besides the window's.
                    c.fit_members(routing.members(i));
                    if let Some(old) = vacated {
                        self.close(old as usize, server, routing, now);
                    }
                }
                Dispatched::Refused => return Outcome::Close,
            }
            at += len;
        }
        if at > 0 {
            c.rbuf.copy_within(at..c.rlen, 0);
            c.rlen -= at;
        }
        // Only an incomplete message the peer still owes us can be late; one that waits for the
        // window is whole, and a message begun after those just served started now.
        c.frame_started = match (c.rlen, blocked) {
            (0, _) | (_, true) => None,
            _ if at > 0 => Some(now),
            _ => c.frame_started.or(Some(now)),
        };
        Outcome::Open
    }
}

/// Reads what the socket has, until it would block or the read buffer is full.
fn read(c: &mut DataConn) -> Outcome {
    while c.rlen < c.rbuf.len() {
        let room = c.rbuf.len() - c.rlen;
        match c.stream.read(&mut c.rbuf[c.rlen..]) {
            Ok(0) => return Outcome::Close,
            Ok(n) => {
                c.rlen += n;
                if n < room && c.stream.short_read_drains() {
                    c.readable = false;
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.readable = false;
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Outcome::Close,
        }
    }
    // A TLS read may owe the peer records (a key update's answer, an alert).
    if c.stream.wants_write() {
        c.writable = true;
    }
    Outcome::Open
}

/// Writes what waits, with one write (plus sending the TLS records it sealed).
fn write(c: &mut DataConn, now: u64) -> Outcome {
    if c.wend > c.wstart {
        match c.stream.write(&c.wbuf[c.wstart..c.wend]) {
            Ok(0) => return Outcome::Close,
            Ok(n) => {
                // A short write means the socket's buffer is full: wait for its next edge.
                if c.wstart + n < c.wend {
                    c.writable = false;
                }
                c.wstart += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => c.writable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Outcome::Close,
        }
    }
    if c.stream.flush_records().is_err() {
        return Outcome::Close;
    }
    if c.stream.wants_write() {
        c.writable = false;
    }
    if c.wstart == c.wend {
        c.wstart = 0;
        c.wend = 0;
        c.unwritten = 0;
    }
    c.write_blocked = match (c.pending_write(), c.write_blocked) {
        (false, _) => None,
        (true, None) => Some(now),
        (true, since) => since,
    };
    Outcome::Open
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}
