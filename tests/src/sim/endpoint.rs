//! The server's end of the network: what the runtime does with what arrives on a link, run
//! through the same rules of `dlock_core::server` (`control`, `route`, `dispatch`, over the
//! core's per-slot [`Routing`]) the runtime uses, and shown to the oracle on the way.
//!
//! A link stands for a client's two connections, control and data, and its id names both (the
//! data connection `link`, the control connection `link + 1`: the core reserves 0).
//!
//! | event                                   | the runtime's rule                                        |
//! |-----------------------------------------|-----------------------------------------------------------|
//! | a control frame on a link               | `ControlConn::admit` (run, answer `ClientNotInit` for a gone client, or close), then `Server::control`; a registration binds the link's control channel to its client and closes the client's other links |
//! | a data message on a link                | `Server::dispatch`: run if the link is bound to its client, answered `ClientNotInit` for an unknown one, the link closed otherwise; a blocking request parks with a route back |
//! | a client attaches its data channel      | `authenticate` with the session, then `bind_stream` |
//! | a link's data channel breaks alone      | `stream_closed`: parked requests routed over it cancelled, its members leave; the control channel, and the client's registration, live on |
//! | a link breaks                           | `stream_closed` (parked requests routed over it cancelled, its members leave), and `control_closed` if it carried its client's registration (the client is marked abnormal) |
//! | a parked request is decided             | `dispatch_replies`: sent on the link it came by, or dropped when nobody waits for it |
//! | after every turn                        | `forget_gone_clients`: the control channels of clients removed since are gone |
//! | a revoke was written into an event ring | the ring of every client bound to a link is drained into event messages on its data channel (an overflow first, when the ring counted one since); a ring whose client is bound nowhere keeps its events until it is |
//! | an event message finds no room on its connection | its events are lost and the client reads an overflow in their place (the seed's `event_loss_ppm`; the runtime sends the overflow with its next turn's events instead, which the clients cannot tell apart but for that turn's replies going first) |
//! | the lease tick                          | `sweep_streams`: a link left with no member closes (its control channel with it: a link is both) |
//!
//! The oracle sees every request and its reply as the server answers it; the server's tables
//! are checked ([`Oracle::tables`]) by [`Endpoint::check`], which a simulator calls after every
//! step in which anything reached the server.

use std::collections::HashMap;

use dlock_core::manager::Timing;
use dlock_core::manager::retain::Role;
use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, DATA_RESPONSE_MAX, EVENTS_MAX, Event, EventHeader, LockOp, MsgType,
    PROTO_VERSION, decode_data_request, decode_data_response, encode_event_message,
    peek_control_header,
};
use dlock_core::server::control::answer_gone;
use dlock_core::server::{
    ControlAdmission, ControlConn, Delivery, Dispatched, Routing, Server, SlotRouting, Source,
    WaitReply,
};
use dlock_core::{Peer, Session, Status};

use super::net::{Channel, LinkId};
use super::oracle::Oracle;
use super::rng::Rng;
use super::swarm::ReplyTo;

/// What reply `reply` to `req` on `channel` answers, for the compound faults that pick on some
/// replies ([`FaultPlan::reply_fate`](super::swarm::FaultPlan::reply_fate)): an unlock the
/// server executed, or a batch of claims.
pub fn reply_to(channel: Channel, req: &[u8], reply: &[u8]) -> ReplyTo {
    match channel {
        Channel::Control => match peek_control_header(req) {
            Ok((h, _)) if h.msg == MsgType::BatchUpdateLocks => ReplyTo::Claims,
            _ => ReplyTo::Other,
        },
        Channel::Data => {
            let (Ok(req), Ok(rep)) = (decode_data_request(req), decode_data_response(reply)) else {
                return ReplyTo::Other;
            };
            let unlocked = req.commands().enumerate().any(|(i, c)| {
                matches!(c, Command::Lock(l) if matches!(l.op, LockOp::UnlockExclusive | LockOp::UnlockShared))
                    && rep.result(i).result.status == Status::Success
            });
            if unlocked {
                ReplyTo::Unlock
            } else {
                ReplyTo::Other
            }
        }
    }
}

/// What became of a data message.
#[derive(Debug)]
pub enum Served {
    /// Answered with these bytes.
    Reply(Vec<u8>),
    /// Parked: its reply comes from [`Endpoint::decided`].
    Parked,
    /// Not run: the link speaks for a client it is not bound to; the link is closed.
    Close,
}

/// A parked request the server decided.
#[derive(Debug)]
pub struct Decided {
    /// The request's client.
    pub client: u32,
    /// The link its reply goes on (`None`: nobody waits for it any more).
    pub link: Option<LinkId>,
    /// The reply message.
    pub bytes: Vec<u8>,
}

/// A control frame's fate ([`Endpoint::control`]).
#[derive(Debug)]
pub enum Controlled {
    /// Answered with these bytes, of this status.
    Reply(Vec<u8>, Option<Status>),
    /// Not admitted on its link: the link is closed.
    Close,
}

/// The runtime's state for one server incarnation: the core's per-slot [`Routing`], and who
/// each link's control channel speaks for.
#[derive(Debug)]
pub struct Endpoint<'s> {
    routing: Routing<'s>,
    control: HashMap<LinkId, ControlConn>,
    out: Vec<u8>,
    /// The server's state changed since the last [`Endpoint::check`].
    dirty: bool,
    /// Per client slot, events drained from its ring and not yet sent, each with the client
    /// it was for.
    outbox: HashMap<u32, Vec<(u32, Event)>>,
    /// Per client slot, the ring's overflow count the client was last told of.
    overflows_told: HashMap<u32, u64>,
    /// Event messages lost for want of room on their connection: drawn from this generator
    /// (its own, so the rest of a run draws as it did) at this rate per message.
    loss: Option<(Rng, u32)>,
    /// Event messages lost so far.
    pub events_lost: u64,
}

/// The control connection a link stands for (never 0, which the core reserves).
fn control_conn(link: LinkId) -> u64 {
    link as u64 + 1
}

impl<'s> Endpoint<'s> {
    /// The state over `slots`, one per client slot of the server (`Config::clients_max`).
    pub fn new(slots: &'s mut [SlotRouting]) -> Self {
        Endpoint {
            routing: Routing::new(slots),
            control: HashMap::new(),
            out: vec![0; CONTROL_FRAME_MAX.max(DATA_RESPONSE_MAX)],
            dirty: false,
            outbox: HashMap::new(),
            overflows_told: HashMap::new(),
            loss: None,
            events_lost: 0,
        }
    }

    /// Loses event messages at `ppm` per message (a run's `event_loss_ppm`), drawn from a
    /// generator of `seed`'s own.
    pub fn lose_events(&mut self, seed: u64, ppm: u32) {
        self.loss = (ppm > 0).then(|| (Rng::new(seed ^ 0xe7e7_0000_10c5), ppm));
    }

    /// Checks the server's tables if anything reached the server since the last check: call
    /// it at the end of every step.
    pub fn check(&mut self, srv: &Server<'_>, oracle: &mut Oracle) -> Result<(), String> {
        if std::mem::take(&mut self.dirty) {
            oracle.tables(srv, &self.routing)?;
        }
        Ok(())
    }

    /// A replacement server starts: no routes, bindings or registrations.
    pub fn restart(&mut self) {
        self.routing.clear();
        self.control.clear();
        self.outbox.clear();
        self.overflows_told.clear();
    }

    /// Drains every event ring the server wrote into since the last call, showing each
    /// revoke to the oracle at `now`, the tick it was written at (call it after every server
    /// turn): a holder that ignores it holds the grant no longer than its revoke timeout
    /// (`Timing::revoke_timeout_for`). The events wait in an outbox per
    /// client slot until the slot's client is bound to a link, as they would wait in its ring.
    pub fn drain_events(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        now: u64,
        timing: Timing,
    ) {
        if !srv.take_events_pending() {
            return;
        }
        for slot in 0..srv.tables().client_free.high_water() {
            let Some(ring) = srv.event_ring(slot) else {
                continue;
            };
            let overflows = ring.overflows();
            let told = self.overflows_told.get(&slot).copied().unwrap_or(0);
            if ring.pending() == 0 && overflows == told {
                continue;
            }
            self.overflows_told.insert(slot, overflows);
            let entry = &srv.tables().clients[slot as usize];
            let timeout = timing.revoke_timeout_for(entry.lease_ms, entry.version);
            let client = entry.id;
            let outbox = self.outbox.entry(slot).or_default();
            if overflows != told {
                outbox.push((client, Event::Overflow));
            }
            while let Some(e) = ring.pop() {
                if let Event::Revoke { lock, .. } = e {
                    oracle.revoked(client, lock.raw(), now + u64::from(timeout) - 1);
                }
                outbox.push((client, e));
            }
        }
    }

    /// The event messages due: each client slot's outbox, once its client is bound to a link
    /// (events for a client the slot no longer has are dropped), with the link it goes on and
    /// how many revokes it carries.
    pub fn events(&mut self) -> Vec<(LinkId, Vec<u8>, usize)> {
        let mut out = Vec::new();
        for (&slot, outbox) in self.outbox.iter_mut() {
            let b = self.routing.binding(slot);
            if outbox.is_empty() || !b.is_bound() {
                continue;
            }
            let events: Vec<Event> = outbox
                .drain(..)
                .filter(|&(client, _)| client == b.client)
                .map(|(_, e)| e)
                .collect();
            let header = EventHeader {
                version: PROTO_VERSION,
                client: b.client,
            };
            for mut chunk in events.chunks(EVENTS_MAX) {
                if let Some((rng, ppm)) = &mut self.loss
                    && rng.chance(*ppm)
                {
                    // No room for it: the client hears of the loss in its place.
                    self.events_lost += 1;
                    chunk = &[Event::Overflow];
                }
                let n = encode_event_message(&header, chunk, &mut self.out)
                    .expect("encode an event message");
                let revokes = chunk
                    .iter()
                    .filter(|e| matches!(e, Event::Revoke { .. }))
                    .count();
                out.push((b.conn as LinkId, self.out[..n].to_vec(), revokes));
            }
        }
        out.sort_by_key(|m| m.0);
        out
    }

    /// A control frame arrived on `link`, from a client the runtime gives `role` (a configured
    /// recoverer, or not): its reply and the reply's status, or the link
    /// closes. Returns also the links a registration replaced (the runtime closes them: one
    /// control connection per client).
    pub fn control(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        link: LinkId,
        req: &[u8],
        now: u64,
        role: Role,
    ) -> Result<(Controlled, Vec<LinkId>), String> {
        let (h, _) = peek_control_header(req).map_err(|e| format!("own request: {e:?}"))?;
        let conn = self.control.get(&link).copied().unwrap_or_default();
        let mut replaced = Vec::new();
        let n = match conn.admit(h.msg, h.word) {
            ControlAdmission::Close => return Ok((Controlled::Close, replaced)),
            ControlAdmission::AnswerGone => answer_gone(&h, &mut self.out)
                .map_err(|e| format!("answer to a gone client: {e:?}"))?,
            ControlAdmission::Run => {
                let at = (control_conn(link), Peer::EXEMPT, role);
                let done = srv
                    .control(&mut self.routing, at, req, &mut self.out, now)
                    .map_err(|e| format!("control frame refused: {e:?}"))?;
                if let Some(r) = done.registered {
                    self.control.insert(link, ControlConn::Bound(r.client));
                    replaced = self
                        .control
                        .iter()
                        .filter(|&(&l, c)| l != link && c.speaks_for(r.client))
                        .map(|(&l, _)| l)
                        .collect();
                    if let Some(before) = r.displaced {
                        self.client_gone(before);
                    }
                }
                done.len
            }
        };
        let reply = self.out[..n].to_vec();
        let status = oracle.control(req, &reply, (now, role), |id| srv.is_registered(id))?;
        self.dirty = true;
        Ok((Controlled::Reply(reply, status), replaced))
    }

    /// `client` is registered nowhere any more: the control channels bound to it are gone
    /// (they answer `ClientNotInit` until their client registers again).
    fn client_gone(&mut self, client: u32) {
        for c in self.control.values_mut() {
            if c.serving() == Some(client) {
                *c = c.client_gone(client);
            }
        }
    }

    /// A data message arrived on `link`.
    pub fn data(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        link: LinkId,
        req: &[u8],
        now: u64,
    ) -> Result<Served, String> {
        let at = Source::Stream {
            conn: link as u32,
            generation: 0,
        };
        let served = match srv.dispatch(&mut self.routing, at, req, &mut self.out, now) {
            // The simulated clients send no joins (a link's data channel is its own).
            Dispatched::Replied(n) | Dispatched::Joined { reply: n, .. } => {
                let reply = self.out[..n].to_vec();
                oracle.data(req, &reply, now)?;
                Served::Reply(reply)
            }
            Dispatched::Parked => Served::Parked,
            Dispatched::Refused => Served::Close,
        };
        self.dirty = true;
        Ok(served)
    }

    /// Client `client` attaches its data channel on `link` with `session`: bound to its slot
    /// if the session is the registration's.
    pub fn attach(
        &mut self,
        srv: &mut Server<'_>,
        link: LinkId,
        client: u32,
        session: &Session,
        now: u64,
    ) -> bool {
        let Some(slot) = srv.authenticate(client, session) else {
            return false;
        };
        self.dirty = true;
        // A link the client left (it reconnected) keeps no member: the client broke it already.
        let _vacated = srv.bind_stream(&mut self.routing, (slot, client), (link as u32, 0), now);
        true
    }

    /// `link` broke: what the runtime does when it sees its connections close.
    pub fn link_lost(&mut self, srv: &mut Server<'_>, link: LinkId, now: u64) {
        srv.stream_closed(&mut self.routing, link as u32, now);
        if let Some(client) = self.control.remove(&link).and_then(ControlConn::serving) {
            srv.control_closed(&mut self.routing, client, control_conn(link), now);
        }
        self.dirty = true;
    }

    /// `link`'s data channel broke while its control channel lives on (`Net::break_stream`):
    /// what the runtime does when a data connection closes alone.
    pub fn stream_lost(&mut self, srv: &mut Server<'_>, link: LinkId, now: u64) {
        srv.stream_closed(&mut self.routing, link as u32, now);
        self.dirty = true;
    }

    /// Parked requests the server has decided: shown to the oracle in grant order, with where
    /// each reply goes.
    pub fn decided(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        now: u64,
    ) -> Result<Vec<Decided>, String> {
        if srv.replies_ready() == 0 {
            return Ok(Vec::new());
        }
        let mut ready: Vec<(WaitReply, Option<LinkId>, Vec<u8>)> = Vec::new();
        srv.dispatch_replies(&mut self.routing, &mut self.out, |d, w, bytes| {
            let link = match d {
                Delivery::Stream { conn, .. } => Some(conn as LinkId),
                _ => None,
            };
            ready.push((*w, link, bytes.to_vec()));
        });
        // `take_replies` hands replies over in waiter-slot order; the grants happened in token
        // order, which is the order the oracle must see them in.
        ready.sort_by_key(|(w, _, _)| match w.result.status {
            Status::Success => w.result.aux,
            _ => 0,
        });
        let mut out = Vec::with_capacity(ready.len());
        for (w, link, bytes) in ready {
            oracle.parked(&w, now)?;
            out.push(Decided {
                client: w.client,
                link,
                bytes,
            });
        }
        self.dirty = true;
        Ok(out)
    }

    /// The runtime's timers: parked requests due a retry, and (at `tick`) silent clients
    /// declared dead and the connections of removed clients dealt with (links left with no
    /// member go into `emptied`: the caller closes them). Returns what was decided.
    pub fn timers(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        now: u64,
        tick: bool,
        emptied: &mut Vec<LinkId>,
    ) -> Result<Vec<Decided>, String> {
        // Most polls find nothing due; a check after one that changed nothing checks nothing.
        let before = parked_state(srv);
        srv.poll_waiters(now);
        self.dirty |= tick || parked_state(srv) != before;
        let mut decided = self.decided(srv, oracle, now)?;
        if tick {
            srv.tick(now);
            // The dead clients' grants end before the waiters their release woke are granted.
            oracle.forget_gone(now, |id| srv.is_registered(id));
            decided.extend(self.decided(srv, oracle, now)?);
            srv.sweep_streams(&mut self.routing, |conn| emptied.push(conn as LinkId));
        }
        // The runtime looks for removed clients after every turn; one comparison when none was.
        let mut gone = Vec::new();
        srv.forget_gone_clients(&mut self.routing, |c| gone.push(c));
        for c in gone {
            self.client_gone(c);
        }
        Ok(decided)
    }
}

/// A fingerprint of what polling the parked requests can change: the words of the locks
/// with a queue, and the queued requests.
fn parked_state(srv: &Server<'_>) -> u64 {
    let t = srv.tables();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |w: u64| h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    for (lock, &head) in t.lock_waiters[..t.lock_free.high_water() as usize]
        .iter()
        .enumerate()
    {
        if head == 0 {
            continue;
        }
        let cell = &t.lock_cells[lock];
        mix(cell.word as u64);
        mix((cell.word >> 64) as u64);
        mix(u64::from(cell.ext));
        let mut link = head;
        while link != 0 {
            let w = &t.waiters[link as usize - 1];
            mix(u64::from(w.state)
                | u64::from(w.op) << 8
                | u64::from(w.tx) << 16
                | u64::from(w.ts) << 32);
            mix(u64::from(link));
            link = w.next;
        }
    }
    mix(u64::from(srv.replies_ready()));
    h
}
