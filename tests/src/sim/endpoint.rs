//! The server's end of the network: what the runtime does with what arrives on a link, run
//! through the same rules of `dlock_core::server` (`route`, `dispatch`) the runtime uses, and
//! shown to the oracle on the way.
//!
//! | event                                   | the runtime's rule                                        |
//! |-----------------------------------------|-----------------------------------------------------------|
//! | a control frame on a link               | `handle_control`; a registration answered over a link makes it the client's control link |
//! | a data message on a link                | `dispatch_stream`: run if the link is bound to its client, answered `ClientNotInit` for an unknown one, the link closed otherwise; a blocking request parks with a route back |
//! | a client attaches its data channel      | `authenticate` with the session, then the link is bound to its slot |
//! | a link breaks                           | parked requests routed over it are cancelled, its bindings dropped, and a client whose control link it was is marked abnormal (`client_disconnected`) |
//! | a parked request is decided             | `dispatch_replies`: sent on the link it came by, or dropped when nobody waits for it |
//!
//! The oracle sees every request and its reply as the server answers it; the server's tables
//! are checked ([`Oracle::tables`]) by [`Endpoint::check`], which a simulator calls after every
//! step in which anything reached the server.

use std::collections::HashMap;

use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, ControlResponse, DATA_RESPONSE_MAX, LockOp, MsgType,
    decode_control_response, decode_data_request, decode_data_response, peek_control_header,
};
use dlock_core::server::{Binding, Delivery, Dispatched, Route, Server, WaitReply};
use dlock_core::{Session, Status};

use super::net::{Channel, LinkId};
use super::oracle::Oracle;
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

/// The runtime's per-slot state for one server incarnation.
#[derive(Debug)]
pub struct Endpoint {
    routes: Vec<Route>,
    bindings: Vec<Binding>,
    /// The link each client's registration was last answered over.
    control_link: HashMap<u32, LinkId>,
    out: Vec<u8>,
    /// The server's state changed since the last [`Endpoint::check`].
    dirty: bool,
}

impl Endpoint {
    /// The state for a server of `clients_max` slots.
    pub fn new(clients_max: u32) -> Self {
        Endpoint {
            routes: vec![Route::None; clients_max as usize],
            bindings: vec![Binding::NONE; clients_max as usize],
            control_link: HashMap::new(),
            out: vec![0; CONTROL_FRAME_MAX.max(DATA_RESPONSE_MAX)],
            dirty: false,
        }
    }

    /// Checks the server's tables if anything reached the server since the last check: call
    /// it at the end of every step.
    pub fn check(&mut self, srv: &Server<'_>, oracle: &mut Oracle) -> Result<(), String> {
        if std::mem::take(&mut self.dirty) {
            oracle.tables(srv)?;
        }
        Ok(())
    }

    /// A replacement server starts: no routes, bindings or registrations.
    pub fn restart(&mut self) {
        self.routes.fill(Route::None);
        self.bindings.fill(Binding::NONE);
        self.control_link.clear();
    }

    /// A control frame arrived on `link`: its reply and the reply's status.
    pub fn control(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        link: LinkId,
        req: &[u8],
        now: u64,
    ) -> Result<(Vec<u8>, Option<Status>), String> {
        let n = srv
            .handle_control(req, &mut self.out, now)
            .map_err(|e| format!("control frame refused: {e:?}"))?;
        let reply = self.out[..n].to_vec();
        if let Ok(ControlResponse::Init(r)) = decode_control_response(&reply).map(|r| r.body) {
            self.control_link.insert(r.client, link);
        }
        let status = oracle.control(req, &reply, now, |id| srv.is_registered(id))?;
        self.dirty = true;
        Ok((reply, status))
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
        let at = (link as u32, 0);
        let served = match srv.dispatch_stream(
            &mut self.routes,
            &self.bindings,
            at,
            req,
            &mut self.out,
            now,
        ) {
            Dispatched::Replied(n) => {
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
    ) -> bool {
        let Some(slot) = srv.authenticate(client, session) else {
            return false;
        };
        self.dirty = true;
        self.bindings[slot as usize] = Binding {
            conn: link as u32,
            client,
        };
        true
    }

    /// `link` broke: what the runtime does when it sees a connection close.
    pub fn link_lost(&mut self, srv: &mut Server<'_>, link: LinkId, now: u64) {
        for (route, binding) in self.routes.iter_mut().zip(&mut self.bindings) {
            // A request parked over the lost link is cancelled, as the runtime does.
            if route.leave_stream(link as u32, 0) {
                srv.cancel_parked(binding.client, now);
            }
            if binding.conn == link as u32 {
                *binding = Binding::NONE;
            }
        }
        let gone: Vec<u32> = self
            .control_link
            .iter()
            .filter(|&(_, &l)| l == link)
            .map(|(&c, _)| c)
            .collect();
        for client in gone {
            self.control_link.remove(&client);
            srv.client_disconnected(client, now);
        }
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
        srv.dispatch_replies(
            &mut self.routes,
            |_| 0,
            &mut self.out,
            |d, w, bytes| {
                let link = match d {
                    Delivery::Stream { conn, .. } => Some(conn as LinkId),
                    _ => None,
                };
                ready.push((*w, link, bytes.to_vec()));
            },
        );
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
    /// declared dead. Returns what was decided.
    pub fn timers(
        &mut self,
        srv: &mut Server<'_>,
        oracle: &mut Oracle,
        now: u64,
        tick: bool,
    ) -> Result<Vec<Decided>, String> {
        // Most polls find nothing due; a check after one that changed nothing checks nothing.
        let before = parked_state(srv);
        srv.poll_waiters(now);
        self.dirty |= tick || parked_state(srv) != before;
        let mut decided = self.decided(srv, oracle, now)?;
        if tick {
            srv.tick(now);
            // The dead clients' grants end before the waiters their release woke are granted.
            oracle.forget_gone(|id| srv.is_registered(id));
            decided.extend(self.decided(srv, oracle, now)?);
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
