//! The per-client-slot state the rules of [`route`](super::route) and
//! [`control`](super::control) read, owned here so a transport keeps none of it: the last
//! mailbox request taken, where a parked request's reply goes, which stream connection speaks
//! for the slot, which control connection carried its registration, and which client
//! registered over a socket.
//!
//! The transport allocates one [`SlotRouting`] per client slot once, at start (`clients_max`
//! of them), and hands them in as a [`Routing`]; nothing here allocates. Every change goes
//! through the server's methods below and in `dispatch.rs`, which apply the rules:
//!
//! | event                                                    | method                          | then                                                        |
//! |----------------------------------------------------------|---------------------------------|-------------------------------------------------------------|
//! | a registration over control connection `c`               | [`Server::control`]             | `c` carries the slot; the slot's parked request is cancelled and its route cleared; a different client that had the slot and is gone is reported |
//! | a registration over stream connection `s`                | [`Server::control_on_stream`]   | as over a control connection, `s` carrying it; and `s` speaks for the slot, as after a join |
//! | `c` closes                                               | [`Server::control_closed`]      | if `c` carried the client's registration: the client is disconnected (abnormal) |
//! | a client is removed (deinit, expiry, eviction)            | [`Server::forget_gone_clients`] | its slot forgets it; if it is registered nowhere, it is reported |
//! | a stream attach or join of the slot's client             | [`Server::bind_stream`]         | the connection speaks for the slot; the older one leaves (its parked request cancelled), reported if left with no member |
//! | a stream connection closes                               | [`Server::stream_closed`]       | its members' parked requests are cancelled, and they leave; a client whose registration it carried is disconnected (abnormal) |
//! | the lease tick                                           | [`Server::sweep_streams`]       | members whose client is gone leave; connections left with no member are reported |
//! | a queue pair goes away                                   | [`Server::queue_pair_lost`]     | a request parked over it is cancelled                       |
//!
//! "Reported" is a callback or a returned value: closing sockets, and telling the control
//! thread, is the transport's.

use super::Server;
use super::control::{ControlAdmission, admit_on_stream, answer_gone};
use super::route::{Binding, Route, admit};
use super::stats::Counter;
use crate::ids::Peer;
use crate::manager::retain::Role;
use crate::proto::peek_control_header;
use crate::server::FrameError;

/// The connection a slot's registration came over: its loss is the client's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Carrier {
    /// None (not registered over a socket, or the connection went away).
    #[default]
    None,
    /// Control connection `conn` (the transport's name for it).
    Control(u64),
    /// Stream connection `conn` (a multiplexing client's member registered over it).
    Stream(u32),
}

/// One client slot's routing state (see the module doc). Allocated by the transport, one per
/// client slot; its contents are the server's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotRouting {
    /// The last mailbox request sequence number taken.
    mailbox_seq: u64,
    /// Where the slot's parked request's reply goes.
    pub(super) route: Route,
    /// The stream connection that speaks for the slot, and for which registration.
    pub(super) stream: Binding,
    /// The connection the slot's registration came over.
    carrier: Carrier,
    /// The client registered over a control connection (0: none): when it is no longer
    /// registered, its connections are closed.
    registered: u32,
}

/// The routing state of every client slot, over entries the transport allocated.
#[derive(Debug)]
pub struct Routing<'a> {
    slots: &'a mut [SlotRouting],
    /// Clients removed so far (deinit, expiry, eviction) when last looked, to notice a removal
    /// with one comparison.
    removed: u64,
}

impl SlotRouting {
    /// The last mailbox request taken.
    #[inline]
    pub(super) fn mailbox_seq(&self) -> u64 {
        self.mailbox_seq
    }
}

impl<'a> Routing<'a> {
    /// Routing over `slots`, one per client slot (`Config::clients_max`), reset to nothing
    /// routed.
    pub fn new(slots: &'a mut [SlotRouting]) -> Self {
        slots.fill(SlotRouting::default());
        Self { slots, removed: 0 }
    }

    /// Forgets everything, for a server that starts over (a simulated replacement).
    pub fn clear(&mut self) {
        self.slots.fill(SlotRouting::default());
        self.removed = 0;
    }

    /// The last mailbox request of `slot` taken (`None`: no such slot). The next is the lowest
    /// number above it.
    #[inline]
    pub fn mailbox_seq(&self, slot: u32) -> Option<u64> {
        self.slots.get(slot as usize).map(|e| e.mailbox_seq)
    }

    /// A client was just given `slot`, whose mailboxes hold requests up to number `seq`:
    /// whatever they hold was sent before (by a previous owner, or by this client before it
    /// reinitialised) and must not run. The client numbers its next request above `seq`.
    pub fn fence_mailbox(&mut self, slot: u32, seq: u64) {
        if let Some(e) = self.entry(slot) {
            e.mailbox_seq = seq;
        }
    }

    /// Which stream connection speaks for `slot` ([`Binding::NONE`]: none).
    #[inline]
    pub fn binding(&self, slot: u32) -> Binding {
        self.slots
            .get(slot as usize)
            .map_or(Binding::NONE, |e| e.stream)
    }

    /// Where `slot`'s parked request's reply goes.
    pub fn route(&self, slot: u32) -> Route {
        self.slots
            .get(slot as usize)
            .map_or(Route::None, |e| e.route)
    }

    /// Clients stream connection `conn` speaks for (a scan of the slots: joins and closes only).
    pub fn members(&self, conn: u32) -> usize {
        self.slots.iter().filter(|e| e.stream.conn == conn).count()
    }

    #[inline]
    pub(super) fn entry(&mut self, slot: u32) -> Option<&mut SlotRouting> {
        self.slots.get_mut(slot as usize)
    }

    /// Mailbox request `seq` of `slot` was taken: the next is above it.
    #[inline]
    pub(super) fn took_mailbox(&mut self, slot: u32, seq: u64) {
        if let Some(e) = self.entry(slot) {
            e.mailbox_seq = seq;
        }
    }
}

/// What a control frame came to ([`Server::control`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Controlled {
    /// The reply is the first `len` bytes of the output buffer.
    pub len: usize,
    /// The client the frame registered, if it was a successful `ClientInit`/`ClientReinit`.
    pub registered: Option<Registration>,
}

/// What a control frame over a stream connection came to ([`Server::control_on_stream`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum StreamControlled {
    /// Answered: the reply is the first `len` bytes of the output buffer.
    Replied {
        /// The reply's length.
        len: usize,
        /// The client the frame registered, as [`Controlled::registered`].
        registered: Option<Registration>,
        /// The stream connection the registered client left, with no member now (the
        /// transport closes it).
        vacated: Option<u32>,
    },
    /// Not run: the frame speaks for a client bound elsewhere, or the bytes are no control
    /// request. The transport closes the connection.
    Refused,
}

/// A registration over a control or stream connection ([`Controlled::registered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The client registered.
    pub client: u32,
    /// Its slot: the transport fences the slot's mailboxes ([`Routing::fence_mailbox`]).
    pub slot: u32,
    /// A different client that had registered in the slot over a socket and is registered
    /// nowhere now: the transport closes its connections.
    pub displaced: Option<u32>,
}

impl Server<'_> {
    /// Handles control frame `req` from `peer`, which came over control connection `conn` (the
    /// transport's name for it, never 0) and whose sender the transport gave `role`, as
    /// [`Server::handle_control_as`] does; if it
    /// registered a client, the slot is routed for the new registration (module doc). `out`
    /// holds the reply.
    pub fn control(
        &mut self,
        routing: &mut Routing<'_>,
        (conn, peer, role): (u64, Peer, crate::manager::retain::Role),
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<Controlled, FrameError> {
        let (len, registered) = self.control_frame((peer, role), req, out, now_ms)?;
        let carrier = Carrier::Control(conn);
        let registered =
            registered.and_then(|id| self.route_registration(routing, carrier, id.get(), now_ms));
        Ok(Controlled { len, registered })
    }

    /// Handles control frame `req` from `peer`, which came over stream connection (`conn`,
    /// `generation`) as a multiplexing client's member's (`control`'s module doc): runs it if
    /// the connection may speak for the client it names, answers `ClientNotInit` for a client
    /// not registered, and refuses (the transport closes the connection) a frame for a client
    /// bound elsewhere or bytes that are no control request. A registration binds its client to
    /// the connection, which then carries it. `out` holds the largest reply
    /// (`CONTROL_FRAME_MAX`).
    pub fn control_on_stream(
        &mut self,
        routing: &mut Routing<'_>,
        (conn, generation): (u32, u32),
        peer: Peer,
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> StreamControlled {
        let header = match peek_control_header(req) {
            Ok((header, false)) => header,
            _ => return StreamControlled::Refused,
        };
        let from = Binding {
            conn,
            generation,
            client: header.word,
        };
        let found = self.client_slot(header.word);
        let named = admit(from, found.map(|slot| (slot, routing.binding(slot))));
        let replied = |len| StreamControlled::Replied {
            len,
            registered: None,
            vacated: None,
        };
        match admit_on_stream(header.msg, named) {
            ControlAdmission::Run => {}
            ControlAdmission::AnswerGone => {
                return answer_gone(&header, out).map_or(StreamControlled::Refused, replied);
            }
            ControlAdmission::Close => return StreamControlled::Refused,
        }
        // A stream carries no recoverer role: `recovery_done` and `ListRetained` come over a
        // control connection of their own, whose peer the transport vouches for.
        let Ok((len, registered)) = self.control_frame((peer, Role::Client), req, out, now_ms)
        else {
            return StreamControlled::Refused;
        };
        let Some(id) = registered else {
            return replied(len);
        };
        let carrier = Carrier::Stream(conn);
        let registered = self.route_registration(routing, carrier, id.get(), now_ms);
        let vacated = registered.and_then(|r| {
            self.bind_stream(routing, (r.slot, r.client), (conn, generation), now_ms)
        });
        StreamControlled::Replied {
            len,
            registered,
            vacated,
        }
    }

    /// Client `client` just registered over `carrier`: whatever it had parked, over any path,
    /// it gave up on (a path it no longer reads, whose loss may not have been noticed yet), so
    /// it is cancelled.
    fn route_registration(
        &mut self,
        routing: &mut Routing<'_>,
        carrier: Carrier,
        client: u32,
        now_ms: u64,
    ) -> Option<Registration> {
        let slot = self.client_slot(client)?;
        let e = routing.entry(slot)?;
        e.carrier = carrier;
        e.route = Route::None;
        let before = core::mem::replace(&mut e.registered, client);
        self.cancel_parked_in(Some(slot), client, now_ms);
        let displaced = before != 0 && before != client && !self.is_registered(before);
        Some(Registration {
            client,
            slot,
            displaced: displaced.then_some(before),
        })
    }

    /// Control connection `conn`, bound to `client`, went away. Only the connection that
    /// carried the client's registration matters: a stale connection of a client that has since
    /// registered again going away cancels nothing. If it is that one, the client is lost
    /// ([`Server::client_disconnected`]).
    pub fn control_closed(
        &mut self,
        routing: &mut Routing<'_>,
        client: u32,
        conn: u64,
        now_ms: u64,
    ) {
        let Some(slot) = self.client_slot(client) else {
            return;
        };
        if let Some(e) = routing.entry(slot)
            && e.carrier == Carrier::Control(conn)
        {
            e.carrier = Carrier::None;
            self.client_disconnected(client, now_ms);
        }
    }

    /// After any client was removed (deinit, expiry, eviction): every client registered over a
    /// socket that is no longer registered in its slot is forgotten there, and `gone(client)`
    /// is called for each one registered nowhere (the transport closes its connections, so a
    /// departed client holds none of ours). A client registered again in another slot (a
    /// recovering server takes old ids back) keeps its connections: that slot speaks for them.
    /// Returns whether any client was removed since the last call; one comparison when none
    /// was.
    pub fn forget_gone_clients(
        &self,
        routing: &mut Routing<'_>,
        mut gone: impl FnMut(u32),
    ) -> bool {
        let s = &self.stats;
        let removed = s.get(Counter::ClientsDeinit)
            + s.get(Counter::ClientsExpired)
            + s.get(Counter::ClientsEvicted);
        if removed == routing.removed {
            return false;
        }
        routing.removed = removed;
        for (slot, e) in routing.slots.iter_mut().enumerate() {
            let client = e.registered;
            if client != 0 && self.client_slot(client) != Some(slot as u32) {
                e.registered = 0;
                e.carrier = Carrier::None;
                if !self.is_registered(client) {
                    gone(client);
                }
            }
        }
        true
    }

    /// Makes stream connection (`conn`, `generation`) speak for `slot`, where `client` is
    /// registered: its attach or join proved the session. One data connection per client: if
    /// another spoke for the slot, the client gave up on that one (it reconnected, or joined
    /// here), so its request parked there is cancelled. Returns that other connection if it is
    /// left with no member: the transport closes it.
    pub fn bind_stream(
        &mut self,
        routing: &mut Routing<'_>,
        (slot, client): (u32, u32),
        (conn, generation): (u32, u32),
        now_ms: u64,
    ) -> Option<u32> {
        let e = routing.entry(slot)?;
        let bound = Binding {
            conn,
            generation,
            client,
        };
        let before = core::mem::replace(&mut e.stream, bound);
        if !before.is_bound() || before.conn == conn {
            return None;
        }
        if e.route.leave_stream(before.conn, before.generation) {
            self.cancel_parked(before.client, now_ms);
        }
        (routing.members(before.conn) == 0).then_some(before.conn)
    }

    /// Stream connection `conn` closed: its members' parked requests are cancelled (their
    /// replies would have nowhere to go) and they leave it; a client whose registration it
    /// carried is disconnected, as when its control connection closes.
    pub fn stream_closed(&mut self, routing: &mut Routing<'_>, conn: u32, now_ms: u64) {
        for e in routing.slots.iter_mut() {
            if e.stream.conn == conn {
                let b = core::mem::take(&mut e.stream);
                if e.route.leave_stream(b.conn, b.generation) {
                    self.cancel_parked(b.client, now_ms);
                }
            }
            if e.carrier == Carrier::Stream(conn) {
                e.carrier = Carrier::None;
                self.client_disconnected(e.registered, now_ms);
            }
        }
    }

    /// The lease tick: members whose client is no longer registered in their slot leave their
    /// connection — gone, their parked requests with them: the connection proved nothing about
    /// whoever registers the id or the slot next — and `emptied(conn)` is called for each
    /// connection left with no member (the transport closes it).
    pub fn sweep_streams(&self, routing: &mut Routing<'_>, mut emptied: impl FnMut(u32)) {
        for slot in 0..routing.slots.len() {
            let b = routing.slots[slot].stream;
            if !b.is_bound() || self.client_slot(b.client) == Some(slot as u32) {
                continue;
            }
            routing.slots[slot].stream = Binding::NONE;
            if routing.members(b.conn) == 0 {
                emptied(b.conn);
            }
        }
    }

    /// The queue pair of client slot `slot`, attached by `client`, went away while the client
    /// lives on (it failed, was replaced, or sent what no message starts with): a request parked
    /// over it is cancelled, as one whose stream connection closed, so its lock is not granted
    /// to a reply nobody reads and the client can park another.
    pub fn queue_pair_lost(
        &mut self,
        routing: &mut Routing<'_>,
        slot: u32,
        client: u32,
        now_ms: u64,
    ) {
        if routing
            .entry(slot)
            .is_some_and(|e| e.route.leave_queue_pair())
        {
            self.cancel_parked(client, now_ms);
        }
    }
}
