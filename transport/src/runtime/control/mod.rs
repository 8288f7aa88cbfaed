//! The control thread: every socket of the server but the attached TCP data connections.
//!
//! It accepts TCP and Unix-socket connections, runs TLS handshakes, reads whole control frames
//! (the header says the length), and hands each to the data thread through the exchange;
//! replies come back through the outbox and are written out. A connection carries one request
//! at a time, so a client can never make the server buffer more than one frame for it. A TCP
//! data connection whose attach is accepted leaves this thread: after the attach status is
//! written it is handed, TLS session and all, to the data thread (`runtime/tcp.rs`), and counts
//! toward `connections_max` through `Exchange::data_conns` until the data thread closes it.
//!
//! A connection's first bytes decide its role: a control frame starts a control connection,
//! which the first successful `ClientInit`/`ClientReinit` binds to that client id. What a control
//! connection may send before and after it is bound — only registration (a reinit must show
//! the session secret) and the counters before; after, only frames naming its client, and
//! once that client is gone an answer `CLIENT_NOT_INIT` from here — is the core's rule, with its
//! table and reasons: `dlock_core::server::control`. An attach header (`ATTACH_MAGIC`, client id, session secret)
//! starts a data connection bound to that client once the data thread has checked the secret;
//! a client has one data connection, so a newer attach closes the older one (the data thread
//! does that when it takes the newer one over). With the `rdma`
//! feature, an RDMA attach record (`rdma::RDMA_ATTACH_MAGIC`, client id, session secret, the
//! client's queue-pair endpoint) is checked the same way, after which this thread connects a
//! queue pair for the client, answers with the server's endpoint and closes the connection
//! (`runtime/rdma.rs`).
//!
//! Setting connections up is rationed per turn of the loop (at most [`ACCEPTS_PER_TURN`]
//! accepts per listener and [`HANDSHAKES_PER_TURN`](super::handshakes::HANDSHAKES_PER_TURN) TLS
//! handshake steps), and every event is
//! taken before that work, so a burst of new connections cannot hold up the requests of
//! established ones (`handshakes.rs` gives the measurements and the reasons).
//!
//! No peer holds a connection it has no use for:
//! - a connection that has not registered or attached within the handshake timeout is closed;
//! - on any connection, a frame must complete, and a reply be taken off the socket, within the
//!   frame timeout;
//! - when a client is no longer registered (deinit, lease expiry, eviction) the data thread says
//!   so and every connection bound to it counts as unregistered from then on: it is closed after
//!   the handshake timeout unless it registers again, and the first to go at the cap. Until then
//!   its requests are answered (`CLIENT_NOT_INIT`), so the client learns why rather than seeing
//!   a reset; a client has one control and one data connection, a newer one replacing the older;
//! - past `connections_max` the oldest unregistered connection makes room for a new one, so
//!   unauthenticated peers can never crowd out registered clients, and `Stats` (which needs no
//!   registration) always gets through.

mod accept;
mod drain;
mod frame;
mod replies;

use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use dlock_core::Peer;
use dlock_core::manager::retain::Role as RecoveryRole;
use dlock_core::server::control::{GONE_ANSWER_LEN, answer_gone};
use dlock_core::server::{ControlConn, Counter};
use mio::{Events, Interest, Poll, Token, Waker};

use super::exchange::{Job, JobKind};
use super::handshakes::{AcceptsPending, HandshakeQueue, RefusalLog, tls_counter};
use super::peer::Peers;
use super::stream::Stream;
use super::{ServerConfig, Shared};
pub(super) use accept::Listeners;
use accept::identify;
use frame::{Next, frame, tell_tls_client};

/// How often connection timeouts are checked.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// How long the control thread waits awake for replies to requests it just handed over.
const REPLY_WAIT_AWAKE: Duration = Duration::from_micros(200);

const WAKER: Token = Token(0);
const TCP: Token = Token(1);
const UNIX: Token = Token(2);
const FIRST_CONN: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Nothing read yet.
    Unknown,
    /// Control frames, speaking for whom the core's rules say.
    Control(ControlConn),
    /// An attach is being checked.
    Attaching(u32),
}

#[derive(Debug)]
struct Conn {
    stream: Stream,
    generation: u32,
    role: Role,
    rbuf: Vec<u8>,
    rlen: usize,
    wbuf: Vec<u8>,
    in_flight: bool,
    opened: Instant,
    /// When the first bytes of the frame now being read arrived (`None`: nothing partial).
    frame_started: Option<Instant>,
    /// When a reply first could not be written whole (`None`: nothing waiting to be written).
    write_blocked: Option<Instant>,
    /// When the client this connection is bound to stopped being registered
    /// (`ControlConn::Gone`), for its timeout.
    gone: Option<Instant>,
    writable_interest: bool,
    /// A step of its TLS handshake waits in `Control::handshakes`.
    handshake_queued: bool,
    /// Who the peer is (`runtime/peer.rs`); `None` under TLS until the first frame, when the
    /// client certificate is known.
    peer: Option<Peer>,
    /// Whether it is a recoverer (`runtime/recoverers.rs`); decided with `peer`.
    recovery: Option<RecoveryRole>,
    /// The TCP peer's address.
    ip: Option<IpAddr>,
}

impl Conn {
    /// The registered client this connection speaks for (not one that has gone since).
    fn bound_client(&self) -> Option<u32> {
        match self.role {
            Role::Control(c) => c.serving(),
            Role::Unknown | Role::Attaching(_) => None,
        }
    }
}

struct Control<'s> {
    shared: &'s Shared,
    cfg: &'s ServerConfig,
    poll: Poll,
    conns: Vec<Option<Conn>>,
    generations: Vec<u32>,
    free: Vec<usize>,
    /// Requests handed to the data thread and not answered yet (connections with `in_flight`).
    in_flight: usize,
    /// The last time timeouts were checked.
    swept: Instant,
    /// Refused TLS handshakes, for the log.
    refusals: RefusalLog,
    /// Job buffers the data thread handed back, reused for the next requests: without them
    /// every request would allocate and zero a frame-sized buffer (17 KiB for a control frame).
    spare: Vec<Vec<u8>>,
    /// TLS handshake steps waiting for a turn (`handshakes.rs`).
    handshakes: HandshakeQueue,
    /// Listeners that may have connections waiting to be accepted.
    accepts: AcceptsPending,
    /// Peers' tags for the per-peer cap, under this server's key.
    peers: Peers,
}

/// Spare job buffers kept at most (a few per size class covers every in-flight request of a
/// busy server; more would only hold memory).
const SPARE_MAX: usize = 64;

/// A job buffer of `len` bytes: a spare one if there is, else a new one.
fn take_buf(spare: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
    match spare.iter().rposition(|b| b.len() == len) {
        Some(k) => spare.swap_remove(k),
        None => vec![0; len],
    }
}

pub(super) fn run(shared: &Shared, cfg: &ServerConfig, mut listeners: Listeners) {
    super::pin(cfg.pin.0);
    if let Err(e) = run_loop(shared, cfg, &mut listeners) {
        tracing::error!(error = %e, "control thread failed");
    }
}

fn run_loop(shared: &Shared, cfg: &ServerConfig, l: &mut Listeners) -> io::Result<()> {
    let poll = Poll::new()?;
    shared
        .exchange
        .set_waker(Waker::new(poll.registry(), WAKER)?);
    if let Some(t) = &mut l.tcp {
        poll.registry().register(t, TCP, Interest::READABLE)?;
    }
    poll.registry()
        .register(&mut l.unix, UNIX, Interest::READABLE)?;
    let mut c = Control {
        shared,
        cfg,
        poll,
        conns: Vec::new(),
        generations: Vec::new(),
        free: Vec::new(),
        in_flight: 0,
        swept: Instant::now(),
        refusals: RefusalLog::default(),
        spare: Vec::new(),
        handshakes: HandshakeQueue::default(),
        accepts: AcceptsPending::default(),
        peers: Peers::default(),
    };
    let mut events = Events::with_capacity(EVENTS_PER_POLL);
    let stop = &shared.stop;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        // Set-up work left over from the last turn: look at the sockets and go on with it.
        let timeout = if c.handshakes.is_empty() && !c.accepts.any() {
            Duration::from_millis(100)
        } else {
            Duration::ZERO
        };
        c.turn(l, &mut events, timeout)?;
        #[cfg(feature = "rdma")]
        super::rdma::drop_retired(shared);
    }
    Ok(())
}

/// Events taken from the poll at once.
const EVENTS_PER_POLL: usize = 256;
/// Extra polls a turn makes while they come back full: the ready list is at most one entry per
/// connection, so this takes all of it at the connection caps the server allows.
const EXTRA_POLLS_MAX: usize = 32;

impl Control<'_> {
    /// One turn of the loop: every event (see `handshakes.rs` for what is rationed and why),
    /// then this turn's accepts and handshake steps, then replies and timeouts.
    fn turn(
        &mut self,
        l: &mut Listeners,
        events: &mut Events,
        timeout: Duration,
    ) -> io::Result<()> {
        let mut timeout = Some(timeout);
        for _ in 0..=EXTRA_POLLS_MAX {
            match self.poll.poll(events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
                Err(e) => return Err(e),
            }
            let mut taken = 0;
            for ev in events.iter() {
                taken += 1;
                self.on_event(ev);
            }
            if taken < EVENTS_PER_POLL {
                break;
            }
            timeout = Some(Duration::ZERO);
        }
        // Replies may have been queued while we handled events; the waker is edge-triggered.
        self.drain_outbox();
        if self.accepts.tcp {
            self.accepts.tcp = self.accept_tcp(l);
        }
        if self.accepts.unix {
            self.accepts.unix = self.accept_unix(l);
        }
        self.run_handshakes();
        self.drain_outbox();
        // A request just handed over is usually answered within microseconds: wait for it
        // awake (yielding) rather than sleep in the poll and pay a wake-up on each side.
        let awake = Instant::now();
        while self.in_flight > 0 && awake.elapsed() < REPLY_WAIT_AWAKE {
            if !self.shared.exchange.outbox.is_empty() {
                self.drain_outbox();
            } else {
                std::thread::yield_now();
            }
        }
        self.expire_idle_connections();
        Ok(())
    }

    fn on_event(&mut self, ev: &mio::event::Event) {
        match ev.token() {
            WAKER => self.drain_outbox(),
            TCP => self.accepts.tcp = true,
            UNIX => self.accepts.unix = true,
            Token(t) => {
                let i = t - FIRST_CONN;
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.readable(i);
                }
                if ev.is_writable() {
                    self.flush(i);
                    // A request may have waited for the previous reply to drain.
                    self.dispatch(i);
                }
            }
        }
    }

    /// Connection `i` has bytes (or news) to read: read them now, unless they are a TLS
    /// handshake's, whose step waits in the queue for its turn.
    fn readable(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if !c.stream.is_handshaking() {
            self.on_readable(i);
            return;
        }
        if std::mem::replace(&mut c.handshake_queued, true) {
            return;
        }
        if self.handshakes.push(i, c.generation) {
            self.shared.counters.bump(Counter::TlsHandshakesDeferred);
        }
    }

    /// This turn's handshake steps (`handshakes.rs`).
    fn run_handshakes(&mut self) {
        let mut turn = std::mem::take(&mut self.handshakes);
        for (i, generation) in turn.turn() {
            let Some(c) = self
                .conns
                .get_mut(i)
                .and_then(Option::as_mut)
                .filter(|c| c.generation == generation)
            else {
                continue; // closed (timed out, evicted) while it waited
            };
            c.handshake_queued = false;
            self.on_readable(i);
        }
        self.handshakes = turn;
    }

    /// Open connections: this thread's (every slot not on the free list, kept exact by `admit`
    /// and `close`, so counting costs nothing however many there are) and the data connections
    /// the data thread holds.
    fn open(&self) -> usize {
        // Relaxed: a count compared against the cap; a stale value errs by a connection.
        let data = self
            .shared
            .exchange
            .data_conns
            .load(std::sync::atomic::Ordering::Relaxed);
        self.conns.len() - self.free.len() + data
    }

    fn close(&mut self, i: usize) {
        let Some(mut c) = self.conns.get_mut(i).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(c.stream.source());
        self.free.push(i);
        if c.in_flight {
            self.in_flight -= 1;
        }
        if let Some(client) = c.bound_client() {
            let _ = self.submit(Job {
                // Which connection went: the data thread acts only if it is the one that matters.
                conn: (c.generation as u64) << 32 | i as u64,
                kind: JobKind::Disconnected { client },
                len: 0,
                buf: Vec::new(),
                peer: Peer::EXEMPT,
                role: RecoveryRole::Client,
            });
        }
    }

    /// Hands a job to the data thread; false if the queue is full (sized for one job per
    /// connection plus per-client notices, so only a misbehaving peer can get there).
    fn submit(&self, job: Job) -> bool {
        let queued = self.shared.exchange.inbox.push(job).is_ok();
        self.shared.wake_data();
        queued
    }

    fn on_readable(&mut self, i: usize) {
        let mut closed = false;
        if let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) {
            loop {
                if c.rlen == c.rbuf.len() {
                    break; // a whole frame is buffered; the rest waits for its reply
                }
                match c.stream.read(&mut c.rbuf[c.rlen..]) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => {
                        if c.rlen == 0 {
                            c.frame_started = Some(Instant::now());
                        }
                        c.rlen += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        if let Some(why) = c.stream.refusal() {
                            self.shared.counters.bump(tls_counter(why));
                            self.refusals.log(why, &e);
                        }
                        closed = true;
                        break;
                    }
                }
            }
        }
        if closed {
            self.close(i);
            return;
        }
        // A TLS handshake answers what it read before any frame is complete.
        if self.conns[i]
            .as_ref()
            .is_some_and(|c| c.stream.wants_write())
        {
            self.flush(i);
        }
        self.dispatch(i);
    }

    /// Hands the next whole frame of connection `i` to the data thread, if it has one and none
    /// is in flight; closes the connection on bytes no frame can start with.
    fn dispatch(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        // One request at a time, and not while the previous reply is still being written: a
        // peer that sends without reading cannot make us buffer replies for it.
        if c.in_flight || !c.wbuf.is_empty() || c.stream.wants_write() {
            return;
        }
        let conn = (c.generation as u64) << 32 | i as u64;
        let (kind, len, cap) = match frame(c) {
            Ok(Some(Next::Job(kind, len, cap))) => (kind, len, cap),
            Ok(Some(next @ (Next::AnswerGone(header, len) | Next::Drain(header, len)))) => {
                let mut reply = [0u8; GONE_ANSWER_LEN];
                let n = match next {
                    // Its client is gone: the state machine must not see a frame in its name
                    // (the core's rule). Say so from here.
                    Next::AnswerGone(..) => answer_gone(&header, &mut reply),
                    // An operator's request, for the membership (`drain.rs`).
                    _ => {
                        let status = drain::answer(self.shared, c);
                        drain::reply(&header, status, &mut reply)
                    }
                };
                if let Ok(n) = n {
                    c.wbuf.extend_from_slice(&reply[..n]);
                }
                c.rbuf.copy_within(len..c.rlen, 0);
                c.rlen -= len;
                c.frame_started = (c.rlen > 0).then(Instant::now);
                self.flush(i);
                return;
            }
            Ok(None) => return,
            Err(()) => {
                tell_tls_client(c);
                self.close(i);
                return;
            }
        };
        let mut buf = take_buf(&mut self.spare, cap);
        buf[..len].copy_from_slice(&c.rbuf[..len]);
        c.rbuf.copy_within(len..c.rlen, 0);
        c.rlen -= len;
        // Bytes already here after this frame start the next one now.
        c.frame_started = (c.rlen > 0).then(Instant::now);
        c.in_flight = true;
        self.in_flight += 1;
        let peer = *c
            .peer
            .get_or_insert_with(|| identify(&c.stream, c.ip, &self.peers));
        let recoverers = &self.cfg.recoverers;
        let role = *c
            .recovery
            .get_or_insert_with(|| recoverers.role_of(&c.stream, c.ip));
        if !self.submit(Job {
            conn,
            kind,
            len,
            buf,
            peer,
            role,
        }) {
            self.close(i);
        }
    }

    fn flush(&mut self, i: usize) {
        let mut failed = false;
        if let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) {
            while !c.wbuf.is_empty() {
                match c.stream.write(&c.wbuf) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => {
                        c.wbuf.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            failed |= c.stream.flush_records().is_err();
            let want = !c.wbuf.is_empty() || c.stream.wants_write();
            c.write_blocked = match (want, c.write_blocked) {
                (false, _) => None,
                (true, None) => Some(Instant::now()),
                (true, since) => since,
            };
            if want != c.writable_interest {
                let interest = if want {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    Interest::READABLE
                };
                let token = Token(i + FIRST_CONN);
                failed |= self
                    .poll
                    .registry()
                    .reregister(c.stream.source(), token, interest)
                    .is_err();
                c.writable_interest = want;
            }
        }
        if failed {
            self.close(i);
        }
    }

    /// Closes connections that hold a place without using it: unregistered past the handshake
    /// timeout, a frame begun and not finished, or a reply not read, past the frame timeout.
    /// Checked every [`SWEEP_INTERVAL`], not on every event.
    fn expire_idle_connections(&mut self) {
        if self.swept.elapsed() < SWEEP_INTERVAL {
            return;
        }
        self.swept = Instant::now();
        let (handshake, frame) = (self.cfg.handshake_timeout, self.cfg.frame_timeout);
        let late =
            |since: Option<Instant>, limit: Duration| since.is_some_and(|t| t.elapsed() > limit);
        for i in 0..self.conns.len() {
            let Some(c) = &self.conns[i] else { continue };
            // A frame waiting behind one in flight is whole as far as we know: only an
            // incomplete one (nothing in flight, nothing to write) can be late.
            let reading = !c.in_flight && c.wbuf.is_empty();
            let stale = (c.bound_client().is_none()
                && c.gone.unwrap_or(c.opened).elapsed() > handshake)
                || (reading && late(c.frame_started, frame))
                || late(c.write_blocked, frame);
            if stale {
                tracing::debug!(role = ?c.role, "connection timed out");
                self.close(i);
                self.shared.counters.bump(Counter::ConnectionsTimedOut);
            }
        }
    }
}
