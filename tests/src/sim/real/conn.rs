//! [`SimConn`]: a real client's `Connection` through the simulated world.
//!
//! Each connection is a link of the shared network: control frames and data messages travel
//! on it with the seed's delays and faults, and a blocking call steps the world until its
//! reply comes or its deadline passes in simulated time. A control reply is read in order, as
//! from a socket (a late one is read by the next request, which the client must notice); data
//! replies are matched to their requests by message id.
//!
//! The server's event messages (revokes) travel on the data channel with the replies, in one
//! order, as on a TCP data connection: they are filed, in the order they arrived, into a
//! queue of the event ring's size (a full one loses what comes and reports an overflow first,
//! as the transport's own queue does), which [`Connection::poll_events`] hands to the client.
//! On the way the connection notes for the oracle ([`Watch`]) when each data request the
//! server answered was sent, and every revoke with the send time of the last request answered
//! before it on the stream: the data path is in order, so that revoke was sent no earlier.

use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use dlock_core::proto::{
    COMMAND_LEN, DATA_HEADER_LEN, Event, LockOp, OBJECT_KIND, decode_data_response,
    decode_event_message, peek_control_header, peek_data_header,
};
use dlock_core::table::EVENT_RING_LEN;
use dlock_core::{Mode, Session, Status};
use dlock_transport::client::Connection;

use super::world::World;
use crate::sim::net::{Channel, Dir, LinkId};

pub(super) type Shared<'r> = Rc<RefCell<World<'r>>>;

/// What [`SeenRevoke::lock`] says of an overflow: every grant held when it is read is revoked.
pub(super) const EVERY_LOCK: u32 = u32::MAX;

/// A revoke (or an overflow, which revokes everything) as it reached a connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct SeenRevoke {
    /// The lock's id (raw) on the server that sent it, or [`EVERY_LOCK`].
    pub lock: u32,
    /// The lock's fencing token when it was sent: a grant with a larger one is not its object.
    pub fence: u64,
    pub wanted: Mode,
    /// The send time of the last data request answered before it on the stream (0: none): the
    /// revoke was sent no earlier, so its grant lapses no earlier than this and the timeout.
    pub floor: u64,
}

/// What a connection saw of its data stream, for the oracle's rules about cached grants.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// The send time of the last data request the server answered on this connection.
    pub anchor: u64,
    /// Every revoke that arrived, in order.
    pub revokes: Vec<SeenRevoke>,
    /// How many of them the client has read ([`Connection::poll_events`]): one that arrives
    /// while the client acts on what it read (a give-back's round trip) waits for its next look.
    pub read: usize,
}

/// A client's connection through the world.
pub(super) struct SimConn<'r> {
    world: Shared<'r>,
    /// The simulated process it belongs to.
    owner: usize,
    link: LinkId,
    seq: u64,
    /// (ticket, message id, send time) awaiting replies, and replies arrived by ticket.
    awaited: Vec<(u64, u16, u64)>,
    arrived: Vec<(u64, Vec<u8>)>,
    /// The send time of the last request whose reply showed the server renewing the client's
    /// lease (shared with the process, whose beliefs count within the lease from it).
    heard: Rc<Cell<u64>>,
    /// Events filed and not yet handed to the client, and whether some were lost since.
    events: VecDeque<Event>,
    overflowed: bool,
    watch: Rc<RefCell<Watch>>,
}

/// Whether a reply status shows the server renewing the lease of the client that sent the
/// request: it knew the client and was serving (`NotReady` goes to anyone while recovering).
fn renews(s: Option<Status>) -> bool {
    !matches!(
        s,
        None | Some(Status::ClientNotInit | Status::ClientRemovedByServer | Status::NotReady)
    )
}

impl std::fmt::Debug for SimConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimConn").field("link", &self.link).finish()
    }
}

fn lost() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "simulated reset")
}

impl<'r> SimConn<'r> {
    pub fn new(world: Shared<'r>, owner: usize, heard: Rc<Cell<u64>>) -> Self {
        let link = world.borrow_mut().net.open(owner);
        SimConn {
            world,
            owner,
            link,
            seq: 0,
            awaited: Vec::new(),
            arrived: Vec::new(),
            heard,
            events: VecDeque::with_capacity(EVENT_RING_LEN),
            overflowed: false,
            watch: Rc::default(),
        }
    }

    /// What this connection saw of its data stream (shared: the process keeps it).
    pub fn watch(&self) -> Rc<RefCell<Watch>> {
        Rc::clone(&self.watch)
    }

    /// Files the events of event message `bytes` (module doc).
    fn file_events(&mut self, bytes: &[u8]) {
        let Ok(msg) = decode_event_message(bytes) else {
            self.overflowed = true;
            return;
        };
        let mut watch = self.watch.borrow_mut();
        for e in msg.events() {
            let floor = watch.anchor;
            let seen = match e {
                Event::Revoke {
                    lock,
                    wanted,
                    fence,
                } => SeenRevoke {
                    lock: lock.raw(),
                    fence,
                    wanted,
                    floor,
                },
                Event::Overflow => SeenRevoke {
                    lock: EVERY_LOCK,
                    fence: u64::MAX,
                    wanted: Mode::Exclusive,
                    floor,
                },
            };
            watch.revokes.push(seen);
            if e == Event::Overflow || self.events.len() == EVENT_RING_LEN {
                self.overflowed = true;
            } else {
                self.events.push_back(e);
            }
        }
    }

    /// The link it sends on now.
    pub fn link(&self) -> LinkId {
        self.link
    }

    /// The server answered a request sent at `sent`, renewing the lease or not.
    fn heard_back(&self, sent: u64, renewed: bool) {
        if renewed {
            self.heard.set(self.heard.get().max(sent));
        }
    }

    /// The simulated time `deadline` stands for.
    fn until(&self, deadline: Option<Instant>) -> u64 {
        let w = self.world.borrow();
        deadline.map_or(u64::MAX, |d| {
            d.saturating_duration_since(w.base).as_millis() as u64
        })
    }

    /// Files the data replies that reached this link under their tickets.
    fn collect(&mut self) -> io::Result<()> {
        let mut w = self.world.borrow_mut();
        if !w.net.stream_up(self.link) {
            return Err(lost());
        }
        let Some(inbox) = w.inbox.get_mut(&self.link) else {
            return Ok(());
        };
        let arrived: Vec<Vec<u8>> = inbox.data.drain(..).collect();
        drop(w);
        for bytes in arrived {
            if decode_event_message(&bytes).is_ok() {
                self.file_events(&bytes);
                continue;
            }
            let Ok((h, _)) = peek_data_header(&bytes) else {
                continue;
            };
            // A duplicate, or the reply to a request given up on, is dropped.
            if let Some(k) = self
                .awaited
                .iter()
                .position(|&(_, id, _)| id == h.message_id)
            {
                let (ticket, _, sent) = self.awaited.remove(k);
                let mut watch = self.watch.borrow_mut();
                watch.anchor = watch.anchor.max(sent);
                drop(watch);
                let renewed = decode_data_response(&bytes)
                    .is_ok_and(|r| r.results().any(|d| renews(Some(d.result.status))));
                if renewed {
                    self.heard.set(self.heard.get().max(sent));
                }
                self.arrived.push((ticket, bytes));
            }
        }
        Ok(())
    }

    /// Sends `bytes` on this link, with the network's faults.
    fn send(&mut self, channel: Channel, bytes: Vec<u8>) -> io::Result<()> {
        let mut w = self.world.borrow_mut();
        let w = &mut *w;
        let sent = w.net.send(
            self.link,
            channel,
            Dir::ToServer,
            bytes,
            w.now_ms,
            &mut w.rng,
            &w.plan,
            &mut w.faults,
        );
        w.links_broken();
        sent.map(drop).ok_or_else(lost)
    }
}

/// Rewrites every refused exclusive trylock in a data reply into a grant (the sabotage).
fn grant_refused_trylocks(reply: &mut [u8]) {
    // The results only: a proof trailer may follow them.
    let n = usize::from(reply[5]);
    let results = DATA_HEADER_LEN..(DATA_HEADER_LEN + n * COMMAND_LEN).min(reply.len());
    for c in reply[results].chunks_exact_mut(COMMAND_LEN) {
        let status = u16::from_le_bytes([c[2], c[3]]);
        let refused = [Status::Fail as u16, Status::Eagain as u16].contains(&status);
        if c[0] < OBJECT_KIND && c[1] == LockOp::TryExclusive as u8 && refused {
            c[2..4].copy_from_slice(&0u16.to_le_bytes());
        }
    }
}

impl Connection for SimConn<'_> {
    fn reconnect(&mut self) -> io::Result<()> {
        // Revokes in flight on the old link are lost: every grant held now counts as revoked
        // (`manager::trust`, rule 2), as at an overflow standing where they would have been.
        // They were sent after the last request answered was read, so they lapse no earlier
        // than the anchor and the timeout.
        let mut watch = self.watch.borrow_mut();
        let floor = watch.anchor;
        watch.revokes.push(SeenRevoke {
            lock: EVERY_LOCK,
            fence: u64::MAX,
            wanted: Mode::Exclusive,
            floor,
        });
        drop(watch);
        let mut w = self.world.borrow_mut();
        // The client closes what it had; the server sees it close.
        w.net.break_link(self.link);
        w.links_broken();
        self.link = w.net.open(self.owner);
        self.awaited.clear();
        self.arrived.clear();
        Ok(())
    }

    fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let until = self.until(deadline);
        let sent = self.world.borrow().now_ms;
        self.send(Channel::Control, req.to_vec())?;
        loop {
            let mut w = self.world.borrow_mut();
            if !w.net.is_alive(self.link) {
                return Err(lost());
            }
            if let Some(bytes) = w
                .inbox
                .get_mut(&self.link)
                .and_then(|i| i.control.pop_front())
            {
                drop(w);
                // Read in order: a late reply to an earlier request answers this one, which
                // the client must notice by its message id (and this may renew nothing).
                let status = peek_control_header(&bytes)
                    .ok()
                    .and_then(|(h, _)| h.status());
                self.heard_back(sent, renews(status));
                reply[..bytes.len()].copy_from_slice(&bytes);
                return Ok(bytes.len());
            }
            if w.now_ms >= until {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no control reply"));
            }
            w.step(until);
        }
    }

    fn attach(&mut self, client: u32, _slot: u32, session: Session) -> io::Result<()> {
        let mut w = self.world.borrow_mut();
        let w = &mut *w;
        if !w.net.is_alive(self.link) {
            return Err(lost());
        }
        let now = w.now_ms;
        if !w
            .endpoint
            .attach(&mut w.server, self.link, client, &session, now)
        {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused"));
        }
        Ok(())
    }

    fn depth(&self) -> usize {
        4
    }

    fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        let (h, _) = peek_data_header(req)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a data message"))?;
        if !self.world.borrow().net.stream_up(self.link) {
            return Err(lost());
        }
        let sent = self.world.borrow().now_ms;
        self.send(Channel::Data, req.to_vec())?;
        self.seq += 1;
        self.awaited.push((self.seq, h.message_id, sent));
        Ok(self.seq)
    }

    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        self.collect()?;
        Ok(match self.arrived.iter().position(|(t, _)| *t == ticket) {
            Some(k) => {
                let (_, mut bytes) = self.arrived.remove(k);
                if self.world.borrow().sabotage {
                    grant_refused_trylocks(&mut bytes);
                }
                reply[..bytes.len()].copy_from_slice(&bytes);
                Some(bytes.len())
            }
            None => None,
        })
    }

    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        let until = self.until(deadline);
        loop {
            if let Some(n) = self.try_recv_data(ticket, reply)? {
                return Ok(Some(n));
            }
            let mut w = self.world.borrow_mut();
            if w.now_ms >= until {
                return Ok(None);
            }
            w.step(until);
        }
    }

    fn carries_events(&self) -> bool {
        true
    }

    fn poll_events(&mut self, sink: &mut dyn FnMut(Event)) -> io::Result<()> {
        self.collect()?;
        let mut watch = self.watch.borrow_mut();
        watch.read = watch.revokes.len();
        drop(watch);
        if std::mem::take(&mut self.overflowed) {
            sink(Event::Overflow);
        }
        self.events.drain(..).for_each(sink);
        Ok(())
    }

    fn now(&self) -> Instant {
        let w = self.world.borrow();
        w.base + Duration::from_millis(w.now_ms)
    }
}
