//! The client's RDMA data path (feature `rdma`): attaching a queue pair after registration, data
//! messages over it, and the `umo_atomic64` operations as one-sided verbs on the server's object
//! cells.
//!
//! Falling back is the rule, not the exception: when the device does not open (no device, no
//! kernel support, port down), when the server has no RDMA, or when the queue pair does not
//! connect, the client logs why (`tracing` warning) and uses a TCP data connection instead;
//! [`super::Client::transport`] tells which one it got. Only a refused session fails the
//! attach, exactly as a refused TCP attach does.
//!
//! The server sends a client's events (revokes of its cached grants) as event messages on the
//! queue pair, between the replies. Whoever takes a message off the queue pair — a wait for a
//! reply, or [`super::Client::poll_events`] — files an event message in the client's event
//! queue at once, as the TCP data path does, so its receive slot goes back to the device and
//! its credit back to the server (`rdma/client.rs`); a reply `poll_events` comes across is kept
//! for the wait that wants it ([`Inbox`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use crossbeam_utils::Backoff;
use dlock_core::proto::{CommandResult, Event, ObjectOp};
use dlock_core::{Session, Status};

use super::events::EventQueue;
use super::wire::time_left;
use crate::rdma::{
    AttachRecord, ENDPOINT_LEN, Endpoint as QpEndpoint, MESSAGE_MAX, RdmaClient, RdmaConfig,
    RdmaError, Received,
};

/// Opens `cfg`'s device, trades endpoints with the server at `addr` (the TCP side by
/// `deadline`, as for a TCP data attach) and connects the queue pair.
/// `Ok(None)`: RDMA is not to be had (logged); use TCP. `Err`: the server refused the session.
pub(super) fn attach(
    addr: SocketAddr,
    cfg: &RdmaConfig,
    client: u32,
    session: Session,
    deadline: Instant,
) -> io::Result<Option<RdmaClient>> {
    let mut qp = match RdmaClient::connect(cfg) {
        Ok(qp) => qp,
        Err(e) => {
            tracing::warn!(
                device = %cfg.device,
                error = %e,
                "RDMA unavailable; using TCP for data messages"
            );
            return Ok(None);
        }
    };
    let server = match exchange(addr, client, session, qp.endpoint(), deadline) {
        Ok(Some(server)) => server,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
        Err(e) => {
            tracing::warn!(%addr, error = %e, "RDMA attach failed; using TCP for data messages");
            return Ok(None);
        }
    };
    if let Err(e) = qp.handshake(&server) {
        tracing::warn!(
            device = %cfg.device,
            error = %e,
            "RDMA queue pair did not connect; using TCP for data messages"
        );
        return Ok(None);
    }
    tracing::info!(device = %cfg.device, client, "RDMA data path connected");
    Ok(Some(qp))
}

/// The attach exchange over TCP (`rdma/attach.rs` has the format): the server's endpoint,
/// `Ok(None)` if the server has no RDMA for us, `PermissionDenied` if it refused the session.
fn exchange(
    addr: SocketAddr,
    client: u32,
    session: Session,
    endpoint: QpEndpoint,
    deadline: Instant,
) -> io::Result<Option<QpEndpoint>> {
    let mut s = TcpStream::connect_timeout(&addr, time_left(deadline)?)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(time_left(deadline)?))?;
    let record = AttachRecord {
        client,
        session,
        endpoint,
    };
    s.write_all(&record.to_bytes())?;
    let mut status = [0u8; 4];
    if let Err(e) = s.read_exact(&mut status) {
        // A server built without RDMA closes on the unknown magic, and one of another RDMA
        // endpoint version on a record it cannot read (`rdma/endpoint.rs`).
        tracing::warn!(
            %addr,
            error = %e,
            "server does not speak RDMA, or speaks another RDMA endpoint version; using TCP for \
             data messages"
        );
        return Ok(None);
    }
    let code = u32::from_le_bytes(status);
    if code == Status::ClientNotInit as u32 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "RDMA data channel refused: unknown client or wrong session",
        ));
    }
    if code != Status::Success as u32 {
        let why = u16::try_from(code)
            .ok()
            .and_then(Status::from_code)
            .map_or("an unknown status", Status::name);
        tracing::warn!(%addr, status = why, "server offers no RDMA; using TCP for data messages");
        return Ok(None);
    }
    let mut record = [0u8; ENDPOINT_LEN];
    s.read_exact(&mut record)?;
    let server = QpEndpoint::from_bytes(&record).map_err(invalid)?;
    if server.objects.is_none() {
        return Err(invalid(RdmaError::BadEndpoint(
            "the server advertised no object table",
        )));
    }
    Ok(Some(server))
}

fn invalid(e: RdmaError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// An RDMA data path: the queue pair, and what was taken off it before anyone asked.
#[derive(Debug)]
pub(super) struct RdmaData {
    pub(super) qp: RdmaClient,
    inbox: Inbox,
}

impl RdmaData {
    /// Allocates the inbox (once, at attach: nothing on the data path allocates).
    pub(super) fn new(qp: RdmaClient) -> Box<Self> {
        Box::new(Self {
            qp,
            inbox: Inbox::new(),
        })
    }
}

/// What a client took off its queue pair and has not handed on: its events, and at most one
/// reply that came while only events were asked for. Replies come in the order their messages
/// went, so a kept reply is older than anything still on the queue pair and is handed on first.
pub(super) struct Inbox {
    events: EventQueue,
    /// A message as it was taken; `held` bytes of it are a reply nobody has asked for yet.
    buf: Box<[u8; MESSAGE_MAX]>,
    held: usize,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the buffer: a message's bytes say nothing a reader of a `Link` needs.
        f.debug_struct("Inbox")
            .field("events", &self.events)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    fn new() -> Self {
        Self {
            events: EventQueue::default(),
            buf: Box::new([0; MESSAGE_MAX]),
            held: 0,
        }
    }

    /// The kept reply, copied into `reply`, if there is one.
    fn take_held(&mut self, reply: &mut [u8]) -> Option<usize> {
        let len = core::mem::take(&mut self.held);
        (len > 0).then(|| {
            reply[..len].copy_from_slice(&self.buf[..len]);
            len
        })
    }
}

/// Sends a data message (1..=[`MESSAGE_MAX`] bytes) on the queue pair.
pub(super) fn send(qp: &mut RdmaClient, req: &[u8]) -> io::Result<()> {
    qp.post_send(req).map_err(io::Error::other)
}

/// Takes the next reply, waiting until `deadline` (`None`: forever; passed: one look), and files
/// the event messages that come before it. Busy-polls the completion queue with backoff (spin,
/// then yield): a reply lands in memory without any interrupt that could wake a sleeping thread.
pub(super) fn recv(
    data: &mut RdmaData,
    reply: &mut [u8],
    deadline: Option<Instant>,
) -> io::Result<Option<usize>> {
    if let Some(n) = data.inbox.take_held(reply) {
        return Ok(Some(n));
    }
    let backoff = Backoff::new();
    loop {
        match data.qp.poll(reply).map_err(io::Error::other)? {
            Some(got) => match file(&mut data.inbox.events, got, reply) {
                Some(n) => return Ok(Some(n)),
                // An event: look again at once, the reply may be right behind it.
                None => continue,
            },
            None if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
            None => backoff.snooze(),
        }
    }
}

/// Takes what has arrived on the queue pair without waiting, files its events and hands every
/// queued event to `sink`. A reply on the way is kept for [`recv`]; a second one stays on the
/// queue pair (with what is behind it) until that reply is taken.
pub(super) fn poll_events(data: &mut RdmaData, sink: &mut dyn FnMut(Event)) -> io::Result<()> {
    let RdmaData { qp, inbox } = data;
    let Inbox { events, buf, held } = inbox;
    while *held == 0 {
        // Taken into the inbox's buffer: where a reply is kept if one comes.
        let Some(got) = qp.poll(&mut buf[..]).map_err(io::Error::other)? else {
            break;
        };
        if let Some(len) = file(events, got, &buf[..]) {
            *held = len;
        }
    }
    events.drain(sink);
    Ok(())
}

/// Files what was just taken into `msg`: an event message in `events` (`None`), a reply handed
/// back (`Some(len)`).
fn file(events: &mut EventQueue, got: Received, msg: &[u8]) -> Option<usize> {
    match got {
        Received::Event(len) => {
            events.file_message(&msg[..len]);
            None
        }
        Received::Reply(len) => Some(len),
    }
}

/// One object operation as a one-sided verb on cell `cell` of the server's object table: FAA,
/// CAS (which returns the value it found, so success is `found == expected`) or an 8-byte READ.
/// A failed verb is the caller's transport failure.
pub(super) fn object_op(
    qp: &mut RdmaClient,
    cell: u32,
    op: ObjectOp,
    a: u64,
    b: u64,
) -> io::Result<CommandResult> {
    let done = match op {
        ObjectOp::Faa => qp.fetch_add(cell, a).map(super::objects::ok),
        ObjectOp::Cas => qp.compare_swap(cell, a, b).map(|found| {
            if found == a {
                super::objects::ok(found)
            } else {
                CommandResult {
                    status: Status::ObjectCasFailed,
                    word: 0,
                    aux: found,
                    plain: false,
                }
            }
        }),
        ObjectOp::Snapshot => qp.read(cell).map(super::objects::ok),
    };
    done.map_err(|e| {
        tracing::debug!(error = %e, cell, "one-sided object operation failed");
        io::Error::other(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::proto::{EventHeader, PROTO_VERSION, encode_event_message};
    use dlock_core::{LockId, Mode};

    fn revoke(n: u32) -> Event {
        Event::Revoke {
            lock: LockId::new(n, 1),
            wanted: Mode::Exclusive,
            fence: u64::from(n),
        }
    }

    /// An event message of `events`, as the server SENDs it.
    fn event_message(events: &[Event]) -> Vec<u8> {
        let mut buf = vec![0u8; MESSAGE_MAX];
        let header = EventHeader {
            version: PROTO_VERSION,
            client: 3,
        };
        let n = encode_event_message(&header, events, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// Every message as the queue pair hands it over: told apart by `Received::of`, filed.
    fn take(inbox: &mut Inbox, msg: &[u8]) -> Option<usize> {
        file(&mut inbox.events, Received::of(msg), msg)
    }

    #[test]
    fn events_between_replies_go_to_the_event_queue_and_replies_are_handed_back() {
        let mut inbox = Inbox::new();
        let reply = [7u8; 40];
        assert_eq!(take(&mut inbox, &event_message(&[revoke(1)])), None);
        assert_eq!(take(&mut inbox, &reply), Some(reply.len()));
        assert_eq!(
            take(&mut inbox, &event_message(&[revoke(2), revoke(3)])),
            None
        );
        let mut got = Vec::new();
        inbox.events.drain(&mut |e| got.push(e));
        assert_eq!(got, [revoke(1), revoke(2), revoke(3)]);
    }

    #[test]
    fn a_kept_reply_is_handed_on_once() {
        let mut inbox = Inbox::new();
        inbox.buf[..3].copy_from_slice(b"abc");
        inbox.held = 3;
        let mut out = [0u8; MESSAGE_MAX];
        assert_eq!(inbox.take_held(&mut out), Some(3));
        assert_eq!(&out[..3], b"abc");
        assert_eq!(inbox.take_held(&mut out), None, "handed on twice");
    }
}
