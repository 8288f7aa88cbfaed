//! The server's RDMA data path (feature `rdma`): who creates, runs and tears down the queue
//! pairs, and how the data thread serves them.
//!
//! # Threads
//!
//! - The **control thread** does every verbs call that may enter the kernel or allocate: it
//!   creates a client's queue pair, connects it (INIT → RTR → RTS) after the data thread has
//!   checked the client's session, and later destroys it. A connected [`Peer`] goes to the data
//!   thread through a bounded queue, and comes back through another one when the data thread
//!   lets go of it.
//! - The **data thread** only polls completion queues and posts to queue pairs that already
//!   exist. With the usual user-space providers (mlx5, rxe) neither enters the kernel, and
//!   neither allocates: the buffers were registered when the queue pair was made.
//!
//! Moving verbs objects between the two threads is sound because libibverbs is thread-safe
//! (`Qp`, `Cq` and the registrations are `Send`; see `rdma/verbs.rs`), and here each object is
//! only ever used by one thread at a time: the queues hand over ownership.
//!
//! # Per client
//!
//! One queue pair per client slot; a new attach of the same client replaces the old pair. A
//! peer is let go (and its pair destroyed) when a completion fails (the queue pair is in error:
//! the client's pair is gone or unreachable), when it sends a message that does not parse or
//! that speaks for another client, or when its client is no longer registered with that session
//! (deinit, or declared dead after its lease). Losing a queue pair is what losing a TCP data
//! connection is: the request parked over it is cancelled (a grant decided for it and not yet
//! handed to the pair is released), a reply already handed to the pair is lost with it as one
//! in a closed connection's write buffer is, and the client itself lives on until its control
//! connection closes or its lease runs out. Who a pair speaks for and where a parked reply goes
//! are the core's rules (`Server::dispatch` with `Source::QueuePair`,
//! `dlock_core::server::route`); this file moves the bytes.
//!
//! # Events
//!
//! A client whose registration attached a queue pair gets its events (revokes of its cached
//! grants) on it, as event messages (`dlock_core::server::route::event_path` decides;
//! `events.rs` encodes and sends). A message goes only while the client has a receive slot for
//! it — the credit rule of `rdma/client.rs` — and never ahead of a parked request's reply that
//! is still deferred for want of a send slot (decided first, it goes first). Events with no
//! room stay in the client's event ring, and go when the client returns credit (with the next
//! message it sends, or an empty credit return) or a send slot frees. A revoke may reach the
//! client before the reply granting what it revokes (`manager::cache` keeps it for that grant).
//!
//! As on a stream (`events.rs`), a client's waiting events go ahead of the reply to each
//! request of it served: before a request is taken off the queue pair, the events go
//! (`Peers::events_ahead`), and while they cannot — no credit, no send slot — the request and
//! those behind it wait on the queue pair, in their receive slots. That wait ends: the credit
//! comes back in the immediate data of the client's next SEND, read when it completes (before
//! it is taken), and a client waiting for the replies takes the events and returns their
//! credit in an empty SEND that needs no reply slot (`rdma/credit.rs` argues the budgets). The
//! events also go at the end of every turn that wrote some (`Data::deliver_events`), for a
//! client that sends nothing.
//!
//! # Cost
//!
//! Each connection has its own completion queue, so a turn polls one CQ per attached client:
//! O(attached clients) user-space reads, a few tens of nanoseconds each. A shared completion
//! queue (or an SRQ) would make it O(1); see the README's RDMA section.

use std::fmt;

use crossbeam_queue::ArrayQueue;
use dlock_core::Status;
use dlock_core::server::{Dispatched, Routing, Server, Source};
use dlock_core::table::Part;

use super::events::EventsOut;
use super::{ServerConfig, Shared};

mod events;

pub(super) use self::events::QueuePairEvents;
use crate::rdma::{
    AttachRecord, ENDPOINT_LEN, MESSAGE_MAX, MESSAGES_INFLIGHT_MAX, RDMA_ATTACH_LEN,
    RDMA_ATTACH_MAGIC, RdmaError, RdmaServer, ServerConnection,
};
use crate::region::Region;

/// Connected queue pairs the data thread installs per turn (attaches are rare; this only bounds
/// a turn).
const INSTALL_BATCH: usize = 16;

/// The RDMA half of what both threads share: the registered object cells and the two queues.
#[derive(Debug)]
pub(crate) struct RdmaSide {
    server: RdmaServer,
    /// Control thread → data thread: connected queue pairs to install.
    attached: ArrayQueue<Peer>,
    /// Data thread → control thread: queue pairs to destroy (and log).
    retired: ArrayQueue<Peer>,
}

/// Why the data thread let go of a queue pair (logged by the control thread).
#[derive(Debug)]
enum Why {
    /// A completion or a post failed: the queue pair is in error.
    Failed(RdmaError),
    /// A data message that does not parse, or that names another client.
    Refused,
    /// The same client attached a new queue pair.
    Replaced,
    /// The client deregistered, was declared dead, or re-registered with a new session.
    SessionGone,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::Failed(e) => write!(f, "queue pair failed: {e}"),
            Why::Refused => f.write_str("malformed data message, or one for another client"),
            Why::Replaced => f.write_str("replaced by a newer queue pair of the same client"),
            Why::SessionGone => f.write_str("the client's session ended"),
        }
    }
}

/// One client's connected queue pair and what the data thread keeps with it.
#[derive(Debug)]
pub(crate) struct Peer {
    client: u32,
    session: dlock_core::Session,
    conn: ServerConnection,
    /// A parked request's reply that found every send slot busy; sent on a later turn. At most
    /// one: a client has at most one parked request.
    deferred: Box<[u8; MESSAGE_MAX]>,
    deferred_len: usize,
    retired: Option<Why>,
}

/// Opens the configured device and registers the region's object cells, or says (in the log)
/// why the server runs without RDMA. Never fails the start: TCP and shared memory serve anyway.
pub(super) fn start(cfg: &ServerConfig, region: &Region) -> Option<RdmaSide> {
    let rdma = cfg.rdma.as_ref()?;
    let cells = region.object_cells();
    let len = std::mem::size_of_val(cells);
    // The registration covers exactly the object cells (see `RdmaServer`): the cell slice is
    // passed as the "region", so the device can never be told to touch anything else.
    let base = cells.as_ptr().cast_mut().cast::<u8>();
    // SAFETY: `base..base + len` is the object-cell part of the region's mapping. The mapping
    // lives in `Shared::region`, which is declared after `Shared::rdma` and so is unmapped only
    // after this registration is dropped; a `Region` never moves or remaps its mapping. The
    // server touches the cells only as `AtomicU64`s (the region hands them out only as
    // atomics, and the tables never hold a plain reference to them), which tolerates the
    // device changing them at any time. A pointer derived from `&[AtomicU64]` may be written
    // through: the atomics are interior-mutable.
    let server = unsafe { RdmaServer::new(rdma, base, len, Part { offset: 0, len }) };
    match server {
        Ok(server) => {
            let table = server.object_table();
            tracing::info!(
                device = %rdma.device,
                port = rdma.port_num,
                cells = table.cells,
                atomics = server.device().supports_atomics(),
                "RDMA data path enabled"
            );
            let clients = cfg.core.clients_max as usize;
            Some(RdmaSide {
                server,
                // Every attach in flight is on its own connection.
                attached: ArrayQueue::new(cfg.connections_max.max(1)),
                // At most every installed peer plus every one still queued for installing.
                retired: ArrayQueue::new(clients + cfg.connections_max.max(1)),
            })
        }
        Err(RdmaError::NoDevice) => {
            tracing::warn!(
                device = %rdma.device,
                "RDMA unavailable (no RDMA device or no kernel support); serving TCP and shared \
                 memory only"
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                device = %rdma.device,
                error = %e,
                "RDMA unavailable; serving TCP and shared memory only"
            );
            None
        }
    }
}

// ---- control thread -------------------------------------------------------------------------

/// Whether the attach job `record` came from an RDMA attach (rather than a TCP data attach).
pub(super) fn is_attach(record: &[u8]) -> bool {
    record.len() == RDMA_ATTACH_LEN
        && dlock_core::proto::Attach::decode(record).is_ok_and(|a| a.magic == RDMA_ATTACH_MAGIC)
}

/// Control thread: finishes an RDMA attach whose session the data thread checked (`ok`), and
/// appends the reply to `out` (status; on success the server's endpoint). The caller closes the
/// connection after writing it, whatever the outcome.
pub(super) fn complete_attach(shared: &Shared, record: &[u8], ok: bool, out: &mut Vec<u8>) {
    let status = match attach(shared, record, ok) {
        Ok(endpoint) => {
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&endpoint);
            return;
        }
        Err(status) => status,
    };
    out.extend_from_slice(&(status as u32).to_le_bytes());
}

/// Creates and connects the queue pair of an attach and queues it for the data thread; the
/// server's endpoint record, or the status to refuse with.
fn attach(shared: &Shared, record: &[u8], ok: bool) -> Result<[u8; ENDPOINT_LEN], Status> {
    // The control thread decoded the same bytes before handing them over; a failure here would
    // be a bug, answered as a refusal rather than a panic.
    let record = AttachRecord::from_bytes(record).map_err(|_| Status::Einval)?;
    if !ok {
        return Err(Status::ClientNotInit);
    }
    let Some(side) = &shared.rdma else {
        return Err(Status::ServerNotInit);
    };
    let client = record.client;
    let connect = || {
        let mut conn = side.server.accept()?;
        conn.handshake(&record.endpoint)?;
        Ok::<_, RdmaError>(conn)
    };
    let conn = connect().map_err(|e| {
        tracing::warn!(client, error = %e, "cannot connect an RDMA queue pair; the client uses TCP");
        Status::ServerNoResource
    })?;
    let endpoint = conn.endpoint().to_bytes();
    let peer = Peer {
        client,
        session: record.session,
        conn,
        deferred: Box::new([0; MESSAGE_MAX]),
        deferred_len: 0,
        retired: None,
    };
    // The queue holds one peer per connection, so it is full only if connections pile up
    // faster than the data thread turns; refusing then is the honest answer.
    side.attached
        .push(peer)
        .map_err(|_| Status::ServerNoResource)?;
    // The data thread may be parked (it parks when no RDMA peer is attached yet).
    shared.wake_data();
    tracing::info!(client, "RDMA queue pair connected");
    Ok(endpoint)
}

/// Control thread: destroys the queue pairs the data thread let go of.
pub(super) fn drop_retired(shared: &Shared) {
    let Some(side) = &shared.rdma else { return };
    while let Some(peer) = side.retired.pop() {
        match &peer.retired {
            Some(why @ (Why::Failed(_) | Why::Refused)) => {
                tracing::warn!(client = peer.client, reason = %why, "RDMA queue pair closed")
            }
            Some(why) => {
                tracing::info!(client = peer.client, reason = %why, "RDMA queue pair closed")
            }
            None => tracing::info!(client = peer.client, "RDMA queue pair closed"),
        }
        drop(peer);
    }
}

// ---- data thread ----------------------------------------------------------------------------

/// The data thread's queue pairs, one per client slot; allocated at start.
#[derive(Debug)]
pub(super) struct Peers<'s> {
    side: Option<&'s RdmaSide>,
    slots: Vec<Option<Peer>>,
    /// The slots that hold a peer, so a turn visits only those.
    active: Vec<u32>,
    /// Per slot: its index in `active` while it holds a peer.
    position: Vec<u32>,
    /// A peer was installed, or one kept from its events by want of credit returned some: the
    /// event rings must be looked at again.
    events_unblocked: bool,
    /// `(slot, client)` of pairs that failed where the core could not be told (sending events
    /// or a parked reply): their parked requests are forgotten at the next [`Self::serve`],
    /// before a new pair of the slot is installed. At most one per slot between two serves (a
    /// slot gets a pair again only there): allocated for every slot.
    lost: Vec<(u32, u32)>,
}

impl<'s> Peers<'s> {
    pub(super) fn new(shared: &'s Shared, slots: usize) -> Self {
        Self {
            side: shared.rdma.as_ref(),
            slots: (0..slots).map(|_| None).collect(),
            active: Vec::with_capacity(slots),
            position: vec![0; slots],
            events_unblocked: false,
            lost: Vec::with_capacity(slots),
        }
    }

    /// True once after events that waited for a queue pair may go now (see the field).
    pub(super) fn take_events_unblocked(&mut self) -> bool {
        core::mem::take(&mut self.events_unblocked)
    }

    /// The client whose current registration attached the queue pair in `slot` (`None`: no
    /// pair, or one attached with an older session that the lease tick has not let go yet).
    pub(super) fn current_client(&self, server: &Server<'_>, slot: u32) -> Option<u32> {
        let peer = self.slots.get(slot as usize)?.as_ref()?;
        (server.client_session(peer.client) == Some((slot, peer.session))).then_some(peer.client)
    }

    /// Whether any queue pair is attached: then the data thread must not park, because a
    /// client's SEND cannot wake it.
    pub(super) fn attached(&self) -> bool {
        !self.active.is_empty()
    }

    /// Whether a connected queue pair waits to be installed.
    pub(super) fn has_work(&self) -> bool {
        self.side.is_some_and(|s| !s.attached.is_empty())
    }

    /// Installs new queue pairs and serves each attached one: up to [`MESSAGES_INFLIGHT_MAX`]
    /// requests each (all a client may have outstanding), each after its client's waiting
    /// events (`events`), through the core's dispatch (which routes a parked request's reply
    /// back here). Returns how much work was done.
    pub(super) fn serve(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        events: &mut EventsOut,
        now: u64,
    ) -> usize {
        let Some(side) = self.side else { return 0 };
        self.forget_lost(server, routing, now);
        let mut work = 0;
        while work < INSTALL_BATCH {
            let Some(peer) = side.attached.pop() else {
                break;
            };
            self.install(server, routing, peer, now);
            work += 1;
        }
        let mut k = 0;
        while k < self.active.len() {
            let slot = self.active[k];
            match self.serve_peer(server, routing, events, slot, now) {
                // Unless sending its events failed it: then `retire` moved another slot to
                // position `k`.
                Ok(n) if self.active.get(k) != Some(&slot) => {
                    work += n;
                    self.forget_lost(server, routing, now);
                }
                Ok(n) => {
                    work += n;
                    k += 1;
                    if let Some(peer) = self.slots[slot as usize].as_mut() {
                        self.events_unblocked |= peer.conn.take_unblocked();
                    }
                }
                // `retire` moved the last active slot into position `k`: visit it next.
                Err(why) => {
                    self.forget_parked(server, routing, slot, now);
                    self.retire(slot, why);
                    work += 1;
                }
            }
        }
        work
    }

    fn serve_peer(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        events: &mut EventsOut,
        slot: u32,
        now: u64,
    ) -> Result<usize, Why> {
        let Some(peer) = self.slots[slot as usize].as_mut() else {
            return Ok(0);
        };
        // A deferred reply goes out before new requests are taken, in the order decided.
        if peer.deferred_len > 0 {
            let sent = peer
                .conn
                .try_send(&peer.deferred[..peer.deferred_len])
                .map_err(Why::Failed)?;
            if !sent {
                return Ok(0);
            }
            peer.deferred_len = 0;
        }
        // A queue pair speaks only for the client whose session attached it; a request it
        // parks is answered over it (`deliver`) unless the client sends another first.
        let from = Source::QueuePair {
            slot,
            client: peer.client,
        };
        let mut served = 0;
        while served < MESSAGES_INFLIGHT_MAX {
            let waiting = match self.slots[slot as usize].as_mut() {
                Some(peer) => peer.conn.has_request().map_err(Why::Failed)?,
                None => false,
            };
            // Its client's events first (module doc); the request waits on the queue pair
            // until they have gone.
            if !waiting || !self.events_ahead(server, events, slot) {
                break;
            }
            let Some(peer) = self.slots[slot as usize].as_mut() else {
                break;
            };
            let mut refused = false;
            let took = peer
                .conn
                .try_serve(
                    |req, out| match server.dispatch(routing, from, req, out, now) {
                        Dispatched::Replied(n) => n,
                        // Nothing joins over a queue pair.
                        Dispatched::Parked | Dispatched::Joined { .. } => 0,
                        Dispatched::Refused => {
                            refused = true;
                            0
                        }
                    },
                )
                .map_err(Why::Failed)?;
            if !took {
                break;
            }
            served += 1;
            // As a TCP data connection that sends bytes no message can start with.
            if refused {
                return Err(Why::Refused);
            }
        }
        Ok(served)
    }

    /// Sends a parked request's reply to the client in `slot`, if that client still has a
    /// queue pair here (a parked reply whose pair was lost or replaced is dropped, as one whose
    /// TCP data connection closed; the core cancelled its request when the pair went, so no
    /// grant is in it). A send that fails loses the reply with the pair ([`Self::fail`]).
    pub(super) fn deliver(&mut self, slot: u32, client: u32, reply: &[u8]) {
        let Some(peer) = self
            .slots
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
            .filter(|p| p.client == client)
        else {
            return;
        };
        if reply.is_empty() || reply.len() > MESSAGE_MAX {
            return;
        }
        // A reply still deferred answers a request its client has given up on (it has one
        // parked request at a time and sent this one after that one timed out): replace it.
        let sent = if peer.deferred_len > 0 {
            Ok(false)
        } else {
            peer.conn.try_send(reply)
        };
        match sent {
            Ok(true) => {}
            Ok(false) => {
                peer.deferred[..reply.len()].copy_from_slice(reply);
                peer.deferred_len = reply.len();
            }
            Err(e) => self.fail(slot, e),
        }
    }

    /// On the lease tick: lets go of queue pairs whose client is no longer registered with the
    /// session that attached them.
    pub(super) fn sweep(&mut self, server: &Server<'_>) {
        let mut k = 0;
        while k < self.active.len() {
            let slot = self.active[k];
            let live = self.slots[slot as usize]
                .as_ref()
                .is_some_and(|p| server.client_session(p.client) == Some((slot, p.session)));
            if live {
                k += 1;
            } else {
                self.retire(slot, Why::SessionGone);
            }
        }
    }

    /// Puts a connected queue pair in its client's slot, replacing the slot's previous one, if
    /// the client is still registered with the session it attached with.
    fn install(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        peer: Peer,
        now: u64,
    ) {
        let slot = server
            .client_session(peer.client)
            .filter(|&(slot, session)| {
                session == peer.session && (slot as usize) < self.slots.len()
            })
            .map(|(slot, _)| slot);
        let Some(slot) = slot else {
            self.hand_back(peer, Why::SessionGone);
            return;
        };
        if self.slots[slot as usize].is_some() {
            // The client reconnected: it gave up on what the old pair had in flight.
            self.forget_parked(server, routing, slot, now);
            self.retire(slot, Why::Replaced);
        }
        // `active` was allocated for every slot and holds each at most once: no reallocation.
        self.position[slot as usize] = self.active.len() as u32;
        self.active.push(slot);
        self.slots[slot as usize] = Some(peer);
        // Events may have waited in the ring for a path.
        self.events_unblocked = true;
    }

    /// The pair in `slot` is going away while its client lives on (it failed, sent what no
    /// message starts with, or was replaced): a request parked over it is dropped (the core's
    /// `Server::queue_pair_lost`).
    fn forget_parked(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        slot: u32,
        now: u64,
    ) {
        if let Some(peer) = self.slots[slot as usize].as_ref() {
            server.queue_pair_lost(routing, slot, peer.client, now);
        }
    }

    /// The pair in `slot` failed where the core cannot be told at once: it is let go now, and
    /// its parked request forgotten at the next [`Self::forget_lost`] — after the turn's
    /// events, before its replies (`Data::turn`), so a grant decided this turn is released.
    /// Retired without that, a failed pair left its parked request waiting for a grant nobody
    /// would read, and the reply routed to the client's next pair, which takes replies in the
    /// order of its own requests.
    ///
    /// A reply the core has already handed over — failing in [`Self::deliver`], or deferred
    /// and failing in [`Self::serve`] — is lost with the pair, and a grant in it with it, as a
    /// reply in the write buffer of a TCP data connection that breaks is: its waiter is gone,
    /// so there is nothing left to cancel. The client, which never learns of the grant, holds
    /// the lock until the grant expires or its registration ends (a `Try` of it is answered
    /// `AlreadyLocked` meanwhile, `client/locks.rs`).
    fn fail(&mut self, slot: u32, e: RdmaError) {
        if let Some(peer) = self.slots[slot as usize].as_ref() {
            self.lost.push((slot, peer.client));
        }
        self.retire(slot, Why::Failed(e));
    }

    /// Tells the core of the pairs [`Self::fail`] let go (`Server::queue_pair_lost`); true if
    /// there were any. Called where a pair may have failed outside [`Self::serve`]'s own
    /// handling: at its start, after a pair its events retired, and after the turn's events
    /// went (`Data::turn`), before the parked requests' replies are taken, so that a grant
    /// decided for a pair that has just failed is still the waiter's and is released.
    pub(super) fn forget_lost(
        &mut self,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        now: u64,
    ) -> bool {
        let any = !self.lost.is_empty();
        for (slot, client) in self.lost.drain(..) {
            server.queue_pair_lost(routing, slot, client, now);
        }
        any
    }

    /// Takes the peer out of `slot` and hands it to the control thread to destroy.
    fn retire(&mut self, slot: u32, why: Why) {
        let Some(peer) = self.slots[slot as usize].take() else {
            return;
        };
        let k = self.position[slot as usize] as usize;
        self.active.swap_remove(k);
        if let Some(&moved) = self.active.get(k) {
            self.position[moved as usize] = k as u32;
        }
        self.hand_back(peer, why);
    }

    fn hand_back(&mut self, mut peer: Peer, why: Why) {
        peer.retired = Some(why);
        if let Some(side) = self.side {
            // The queue has room for every peer there can be; if it had none, the peer would be
            // destroyed here instead, which costs this turn a few system calls but loses nothing.
            if let Err(peer) = side.retired.push(peer) {
                drop(peer);
            }
        }
    }
}
