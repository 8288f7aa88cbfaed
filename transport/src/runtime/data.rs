//! The data thread: the only thread that runs the server state machine.
//!
//! Each turn it serves the shared-memory mailboxes, the TCP data connections it owns
//! (`tcp.rs`), the control thread's jobs and the decided parked requests, and ticks leases.
//! With nothing to do it follows the idle strategy, whose sleep is one `epoll_wait` on its own
//! poll: the sockets and the eventfd every other waker rings (`wake.rs`).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use dlock_core::proto::{CONTROL_FRAME_MAX, DATA_REQUEST_WITH_VALUES_MAX};
use dlock_core::proto::{EventHeader, MsgType, PROTO_VERSION, peek_control_header};
use dlock_core::server::{
    Delivery, Dispatched, EventPath, Registration, Routing, Server, SlotRouting, Source, event_path,
};

use super::events::EventsOut;
use super::exchange::{Job, JobKind};
use super::idle::Idler;
use super::tcp::DataConns;
use super::{INBOX_BATCH, ServerConfig, Shared};
use crate::region::Region;
use crate::shm::{Doorbells, lanes_current_seq, next_lane};

/// How often client leases are checked.
const TICK_MS: u64 = 50;
/// The longest the data thread sleeps: it must still tick leases and time out waiters.
const PARK_MAX: Duration = Duration::from_millis(TICK_MS);

/// The data thread's state besides the server.
struct Data<'s> {
    shared: &'s Shared,
    region: &'s Region,
    bells: Doorbells<'s>,
    /// Per client slot: its mailboxes, routes and bindings (`dlock_core::server::Routing`, whose
    /// methods apply the rules).
    routing: Routing<'s>,
    req: [u8; DATA_REQUEST_WITH_VALUES_MAX],
    resp: Vec<u8>,
    start: Instant,
    /// The TCP data connections, and the poll the thread waits in.
    tcp: DataConns<'s>,
    /// What was told of each client slot's event ring (`events.rs`).
    events: EventsOut,
    /// The clients' RDMA queue pairs.
    #[cfg(feature = "rdma")]
    rdma: super::rdma::Peers<'s>,
}

pub(super) fn run(
    shared: &Shared,
    cfg: &ServerConfig,
    poll: mio::Poll,
    ready: SyncSender<io::Result<()>>,
) {
    super::pin(cfg.pin.1);
    // SAFETY: the region is fresh (the runtime just created it) and these are its only tables.
    let tables = match unsafe { shared.region.tables_shared() } {
        Ok(t) => t,
        Err(s) => {
            let _ = ready.send(Err(io::Error::other(format!(
                "cannot carve the tables: {s}"
            ))));
            return;
        }
    };
    // Declared before the server, which borrows it for its whole life.
    let mut cluster_memory = shared
        .cluster
        .as_ref()
        .map(|_| super::cluster::ClusterMemory::new(cfg.core.clients_max));
    let mut server = Server::new(tables, &cfg.core, super::os_entropy);
    if let Some(key) = &cfg.session_key {
        server.set_session_key(key.clone(), super::hmac_sha256);
    }
    if let (Some(mem), Some(cx)) = (cluster_memory.as_mut(), shared.cluster.as_ref()) {
        let settings = dlock_core::server::ClusterSettings {
            me: cx.membership.server_id(),
            timing: cx.membership.timing(),
            counter_step: cx.counter_step,
        };
        server.enable_cluster(mem.side(), settings);
    }
    let slots = cfg.core.clients_max as usize;
    // Allocated once, here: the core keeps the routing state in it and allocates nothing.
    let mut routing = vec![SlotRouting::default(); slots];
    let mut d = Data {
        shared,
        region: &shared.region,
        bells: Doorbells::new(shared.region.doorbell_words()),
        routing: Routing::new(&mut routing),
        req: [0; DATA_REQUEST_WITH_VALUES_MAX],
        resp: vec![0; CONTROL_FRAME_MAX],
        start: shared.started,
        tcp: DataConns::new(shared, cfg, poll),
        events: EventsOut::new(slots),
        #[cfg(feature = "rdma")]
        rdma: super::rdma::Peers::new(shared, slots),
    };
    let header = shared.region.shm_header();
    header.serving.store(1, Ordering::Release);
    let _ = ready.send(Ok(()));
    let mut idler = Idler::new(cfg.idle);
    let mut next_tick = 0;
    while !shared.stop.load(Ordering::Acquire) {
        let now = d.now_ms();
        let work = d.turn(&mut server, now, &mut next_tick);
        // Asleep no longer than the server's next timer (a parked request's deadline, a
        // revoke due at the end of a minimum hold): it would otherwise wait for the tick.
        let timer = Duration::from_millis(server.next_timer_ms().saturating_sub(now));
        d.rest(work, &mut idler, timer.min(PARK_MAX));
    }
    header.serving.store(0, Ordering::Release);
}

/// The server's clock read again for one request, never behind the turn's `turn_now`.
///
/// A turn reads the clock once at its start, but a request can arrive during the turn: while
/// the thread was preempted after that read, say. Run at the turn's time, such a request would
/// be stamped before it was sent — and a revoke it causes would lapse early by as much, while
/// its holder trusts its cached grants until `anchor + timeout` counted from the send of its
/// last answered request (`dlock_core::manager::trust`, rule 1). So every request is run at a
/// clock read after it was taken (a vDSO read, ~25 ns against a message's few µs).
fn fresh(start: &Instant, turn_now: u64) -> u64 {
    (start.elapsed().as_millis() as u64).max(turn_now)
}

impl Data<'_> {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// One turn of the loop: every source of work once, the decided parked requests, and the
    /// lease tick when `next_tick` has come; returns how much work there was.
    fn turn(&mut self, server: &mut Server<'_>, now: u64, next_tick: &mut u64) -> usize {
        let mut work = self.serve_mailboxes(server, now);
        if let Some(cx) = &self.shared.cluster {
            work += super::cluster::serve(cx, server, now);
        }
        work += self.serve_inbox(server, now);
        work += self.tcp.take_handovers(server, &mut self.routing, now);
        {
            #[cfg(feature = "rdma")]
            let rdma = &self.rdma;
            #[cfg(feature = "rdma")]
            let queue_pair = |server: &Server<'_>, slot| rdma.current_client(server, slot);
            #[cfg(not(feature = "rdma"))]
            let queue_pair = |_: &Server<'_>, _| None;
            let mut events = super::tcp::EventsAhead {
                out: &mut self.events,
                queue_pair: &queue_pair,
            };
            let start = &self.start;
            let clock = || fresh(start, now);
            work += self
                .tcp
                .serve(server, &mut self.routing, &mut events, clock);
        }
        #[cfg(feature = "rdma")]
        {
            work += self.serve_rdma(server, now);
            self.events.again |= self.rdma.take_events_unblocked();
        }
        server.poll_waiters(now);
        work += self.events_before_replies(server, now);
        if server.replies_ready() > 0 {
            self.deliver_replies(server);
            work += 1;
        }
        if now >= *next_tick {
            server.tick(now);
            self.tcp.sweep(server, &mut self.routing, now);
            #[cfg(feature = "rdma")]
            self.rdma.sweep(server);
            *next_tick = now + TICK_MS;
        }
        self.close_gone_clients(server);
        work
    }

    /// Sends the waiting events before the parked requests' replies go, as before every reply
    /// (`events.rs`): a revoke that ended a parked wait (`WAKE_ON_REVOKE`) is then read by the
    /// client that wakes with the reply, not left for after its next wait. Returns how many
    /// event messages went.
    ///
    /// A queue pair that fails while its events are sent is forgotten by the core here, before
    /// the replies are taken (`Peers::forget_lost`): its client's parked request may have been
    /// granted this turn, and only while its waiter still holds the grant can the core release
    /// it (`Server::queue_pair_lost`). Were the replies taken first, its reply would find the
    /// pair gone and be dropped, and the lock stay granted to a client that never heard of it
    /// until the grant expired or the client's registration ended. A release may decide other
    /// parked requests and write events (revokes for the waiters it retried), which go before
    /// those replies too; each round retires a failed pair, so the rounds end.
    fn events_before_replies(&mut self, server: &mut Server<'_>, now: u64) -> usize {
        let mut work = 0;
        loop {
            if server.take_events_pending() || self.events.again {
                work += self.deliver_events(server);
            }
            if !self.forget_lost_queue_pairs(server, now) {
                return work;
            }
        }
    }

    /// Tells the core of the queue pairs that failed while their events went
    /// (`Peers::forget_lost`); true if there were any.
    #[cfg(feature = "rdma")]
    fn forget_lost_queue_pairs(&mut self, server: &mut Server<'_>, now: u64) -> bool {
        self.rdma.forget_lost(server, &mut self.routing, now)
    }

    /// Without the `rdma` feature no queue pair fails.
    #[cfg(not(feature = "rdma"))]
    fn forget_lost_queue_pairs(&mut self, _: &mut Server<'_>, _: u64) -> bool {
        false
    }

    /// After a turn that found `work`: on, or the idle strategy's next step, parked for at most
    /// `park_max`.
    fn rest(&mut self, work: usize, idler: &mut Idler, park_max: Duration) {
        #[cfg(feature = "rdma")]
        if work == 0 && self.rdma.attached() {
            // A SEND cannot ring the futex: with RDMA clients attached, parking would leave
            // their requests waiting for the park timeout.
            idler.idle_awake();
            return;
        }
        let park = if work > 0 {
            idler.busy();
            false
        } else {
            idler.idle()
        };
        if park {
            let ex = &self.shared.exchange;
            let ready = self.tcp.has_ready();
            #[cfg(feature = "rdma")]
            let rdma = &self.rdma;
            let bells = &self.bells;
            let tcp = &mut self.tcp;
            // The one idle wait: sockets and the eventfd every waker rings. The re-check after
            // raising the flag is the park handshake of `shm`'s module doc.
            self.region.shm_header().park_server(
                || {
                    #[cfg(feature = "rdma")]
                    if rdma.has_work() {
                        return true;
                    }
                    ready || bells.any() || !ex.inbox.is_empty() || !ex.handover.is_empty()
                },
                || tcp.wait(Some(park_max)),
            );
        } else if self.tcp.open() > 0 {
            // Awake: a look at the sockets that costs one syscall and never blocks.
            self.tcp.wait(Some(Duration::ZERO));
        }
    }

    /// Executes the requests of every client whose doorbell rang, up to one per lane, in the
    /// order the client numbered them; returns how many clients rang.
    fn serve_mailboxes(&mut self, server: &mut Server<'_>, now: u64) -> usize {
        let Data {
            region,
            bells,
            routing,
            req,
            resp,
            start,
            ..
        } = self;
        let bells = &*bells;
        bells.drain(|slot| {
            let Some(lanes) = region.client_mailboxes(slot) else {
                return;
            };
            // Each lane once, and as many retries: a lane can change under us (rewritten by a
            // client that gave up on its request, or being written).
            let mut tries = 2 * lanes.len();
            while let Some(last) = routing.mailbox_seq(slot)
                && let Some((seq, mb)) = next_lane(lanes, last)
            {
                if tries == 0 {
                    // More than a client can have in flight: leave the rest to the next turn,
                    // which the bell rung again guarantees.
                    bells.ring(slot);
                    return;
                }
                tries -= 1;
                let Some(len) = mb.take_exact(seq, req) else {
                    continue;
                };
                // Ownership, a parked request given up on, the route of a new one, and `seq` as
                // the slot's latest: the core's rules (`dlock_core::server::dispatch`).
                let from = Source::Mailbox { slot, seq };
                let now = fresh(start, now);
                match server.dispatch(routing, from, &req[..len], resp, now) {
                    Dispatched::Replied(n) => mb.post_response(&resp[..n], seq),
                    // Nothing joins over shared memory.
                    Dispatched::Parked | Dispatched::Joined { .. } => {}
                    // An empty reply tells the client its request could not be read (or was
                    // not its own to send).
                    Dispatched::Refused => mb.post_response(&[], seq),
                }
            }
        })
    }

    /// After any client was removed (deinit, expiry, eviction): tells the control thread to
    /// close the connections of every socket-registered client that is no longer registered,
    /// so a departed client holds no connection (and no descriptor) of ours.
    fn close_gone_clients(&mut self, server: &Server<'_>) {
        let Data {
            shared, routing, ..
        } = self;
        if server.forget_gone_clients(routing, |client| client_gone(shared, client)) {
            shared.exchange.wake_control();
        }
    }

    /// A client (new, or the same one re-registering) has just been given a slot: the core
    /// routed it (`Server::control`); whatever the slot's lanes still hold was sent before — by
    /// a previous owner, or by this client before it gave up on it and reinitialised — and must
    /// not run now. The client numbers its next request above every number in the lanes, which
    /// it reads only after this registration's reply.
    fn registered(&mut self, r: Registration) {
        registered(self.shared, &mut self.routing, r);
    }

    /// Takes up to `INBOX_BATCH` jobs from the control thread; returns how many.
    fn serve_inbox(&mut self, server: &mut Server<'_>, now: u64) -> usize {
        let ex = &self.shared.exchange;
        let mut n = 0;
        while n < INBOX_BATCH {
            let Some(mut job) = ex.inbox.pop() else { break };
            n += 1;
            match job.kind {
                JobKind::Control => {
                    if is_stats_request(&job.buf[..job.len]) {
                        self.shared.counters.copy_into(server);
                    }
                    let req = &job.buf[..job.len];
                    let at = (job.conn, job.peer, job.role);
                    match server.control(&mut self.routing, at, req, &mut self.resp, now) {
                        Ok(done) => {
                            job.buf[..done.len].copy_from_slice(&self.resp[..done.len]);
                            job.len = done.len;
                            if let Some(r) = done.registered {
                                self.registered(r);
                                job.kind = JobKind::Registered { client: r.client };
                            }
                        }
                        Err(_) => job.kind = JobKind::Close,
                    }
                }
                JobKind::Attach { client, session } => {
                    let ok = server.authenticate(client, &session).is_some();
                    job.kind = JobKind::Attached { ok };
                }
                JobKind::Disconnected { client } => {
                    // Only the connection that carried the client's registration matters (the
                    // core's rule). Data connections are the data thread's own; their loss is
                    // handled in `tcp.rs`.
                    server.control_closed(&mut self.routing, client, job.conn, now);
                    job.kind = JobKind::Nothing;
                }
                JobKind::Attached { .. }
                | JobKind::Registered { .. }
                | JobKind::ClientGone { .. }
                | JobKind::MovedToStream { .. }
                | JobKind::Close
                | JobKind::Nothing => job.kind = JobKind::Nothing,
            }
            // The outbox is sized so it cannot be full; if it were, the reply would be lost and
            // the client would time out, which is the honest failure.
            let _ = ex.outbox.push(job);
        }
        if n > 0 {
            ex.wake_control();
        }
        n
    }

    /// Serves the clients' RDMA queue pairs; a parked request's reply is routed back to its
    /// queue pair.
    #[cfg(feature = "rdma")]
    fn serve_rdma(&mut self, server: &mut Server<'_>, now: u64) -> usize {
        // Read after the mailboxes and streams were served (`fresh`); the queue pairs' own
        // requests share it.
        let now = fresh(&self.start, now);
        self.rdma
            .serve(server, &mut self.routing, &mut self.events, now)
    }

    /// Sends the replies of decided parked requests where their requests came from.
    fn deliver_replies(&mut self, server: &mut Server<'_>) {
        let Data {
            region,
            routing,
            resp,
            tcp,
            #[cfg(feature = "rdma")]
            rdma,
            ..
        } = self;
        server.dispatch_replies(routing, resp, |delivery, r, reply| match delivery {
            Delivery::Mailbox { seq } => {
                if let Some(lanes) = region.client_mailboxes(r.slot) {
                    lanes[seq as usize % lanes.len()].post_response(reply, seq);
                }
            }
            Delivery::Stream { conn, generation } => {
                tcp.deliver(conn, generation, reply);
            }
            #[cfg(feature = "rdma")]
            Delivery::QueuePair => rdma.deliver(r.slot, r.client, reply),
            #[cfg(not(feature = "rdma"))]
            Delivery::QueuePair => {}
            // A newer request, another message, or the client went away meanwhile.
            Delivery::Nowhere => {}
        });
    }
}

impl Data<'_> {
    /// Sends what the event rings of clients with a stream connection or a queue pair hold as
    /// event messages on it (`events.rs`); returns how many messages went. Where a client's
    /// events go is the core's rule (`event_path`): a shared-memory client reads its ring in
    /// place, and a client with no path attached yet finds its events when one is (or reads
    /// them as an overflow if they were dropped). A stream client's events also go ahead of
    /// its next reply (`tcp.rs`), whatever becomes of them here.
    fn deliver_events(&mut self, server: &mut Server<'_>) -> usize {
        self.events.again = false;
        (0..self.events.slots())
            .map(|slot| self.deliver_slot_events(server, slot))
            .sum()
    }

    /// [`Self::deliver_events`] for client slot `slot`.
    fn deliver_slot_events(&mut self, server: &Server<'_>, slot: u32) -> usize {
        if !self.events.waiting(server, slot) {
            return 0;
        }
        #[cfg(feature = "rdma")]
        let queue_pair = self.rdma.current_client(server, slot);
        #[cfg(not(feature = "rdma"))]
        let queue_pair = None;
        let header = |client| EventHeader {
            version: PROTO_VERSION,
            client,
        };
        let path = event_path(queue_pair, self.routing.binding(slot));
        let Data {
            events,
            tcp,
            #[cfg(feature = "rdma")]
            rdma,
            ..
        } = self;
        match path {
            // A full window is waited out: the events go at a later turn, or ahead of the
            // client's next reply.
            EventPath::Stream(b) => tcp
                .with_events(b.conn, b.generation, |sink| {
                    events.send(server, slot, &header(b.client), sink)
                })
                .map_or(0, |sent| sent.messages),
            #[cfg(feature = "rdma")]
            EventPath::QueuePair { client } => {
                let mut sink = super::rdma::QueuePairEvents { peers: rdma, slot };
                events
                    .send(server, slot, &header(client), &mut sink)
                    .messages
            }
            // Without the `rdma` feature no slot has a queue pair.
            #[cfg(not(feature = "rdma"))]
            EventPath::QueuePair { .. } => 0,
            EventPath::InPlace => 0,
        }
    }
}

/// A client (new, or the same one re-registering) has just been given a slot, over a control
/// connection or a stream (`Data::registered` says why): its mailboxes are fenced, a client it
/// displaced is reported gone, and a cluster server has its id persisted.
pub(super) fn registered(shared: &Shared, routing: &mut Routing<'_>, r: Registration) {
    // A cluster server grants a client nothing until its id is persisted (`docs/cluster.md`),
    // so every registration is noted, over a stream too: noted only over a control connection,
    // the second and later cluster clients of a process sharing one connection per server
    // (`NetDial`) registered over it and were answered `NotReady` for ever.
    if let Some(cx) = &shared.cluster {
        cx.note(super::cluster::ToCluster::Registered(r.client));
    }
    if let Some(lanes) = shared.region.client_mailboxes(r.slot) {
        routing.fence_mailbox(r.slot, lanes_current_seq(lanes));
    }
    if let Some(before) = r.displaced {
        client_gone(shared, before);
    }
}

/// Tells the control thread that `client`'s control path is now a stream connection: it closes
/// any control connection bound to it.
pub(super) fn moved_to_stream(shared: &Shared, client: u32) {
    // The outbox has room for one such notice per client beside every reply (see `Exchange`).
    let _ = shared.exchange.outbox.push(Job {
        conn: 0,
        kind: JobKind::MovedToStream { client },
        len: 0,
        buf: Vec::new(),
        peer: dlock_core::Peer::EXEMPT,
        role: dlock_core::manager::retain::Role::Client,
    });
    shared.exchange.wake_control();
}

/// Tells the control thread that `client` is no longer registered: it closes its connections.
fn client_gone(shared: &Shared, client: u32) {
    if let Some(cx) = &shared.cluster {
        cx.note(super::cluster::ToCluster::Gone(client));
    }
    // The outbox has room for one notice per client beside every reply (see `Exchange`).
    let _ = shared.exchange.outbox.push(Job {
        conn: 0,
        kind: JobKind::ClientGone { client },
        len: 0,
        buf: Vec::new(),
        peer: dlock_core::Peer::EXEMPT,
        role: dlock_core::manager::retain::Role::Client,
    });
}

/// Whether `frame` is a `Stats` request (whose reply must carry the transport's counters too).
pub(super) fn is_stats_request(frame: &[u8]) -> bool {
    peek_control_header(frame).is_ok_and(|(h, _)| h.msg == MsgType::Stats)
}
