//! The client end of one RDMA connection: data messages by SEND/RECV, object operations by
//! one-sided READ and atomics on the server's object cells.
//!
//! # Replies, events and credits
//!
//! The server SENDs two kinds of message: replies, at most one per message the client sent, and
//! event messages, unasked. Each takes a receive slot, and a SEND that finds none posted stalls
//! the server's queue pair in RNR retries — replies behind it included. So each kind has its
//! own budget: [`MESSAGES_INFLIGHT_MAX`] slots for replies (the client sends no more than that
//! many messages awaiting one) and [`EVENT_MESSAGES_INFLIGHT_MAX`] for events (the server sends
//! no more than that many beyond what the client has told it it took). The client tells it in
//! the immediate data of every SEND: the number of event messages it has taken (wrapping), each
//! one's slot reposted as it was taken. A client that has taken that many without telling
//! SENDs an empty credit return as soon as a send slot is free — not a message awaiting a reply,
//! so it goes with every reply slot in flight — which the server acknowledges with an empty
//! message into a slot of its own (`credit.rs` argues the budgets, and why the return must not
//! wait for a reply slot: the server holds a client's requests while its events wait for
//! credit).
//!
//! Telling the kinds apart is the one thing this module reads in what it carries: an event
//! message has [`FLAG_EVENT`](dlock_core::proto::FLAG_EVENT) in its data header, as on a TCP
//! data connection; anything else is a reply ([`Received::of`]). The empty messages are the
//! channel's own and never come this far.

use dlock_core::proto::{is_event_message, peek_data_response_header};

use std::fmt;
use std::time::{Duration, Instant};

#[cfg(doc)]
use super::EVENT_MESSAGES_INFLIGHT_MAX;
use super::channel::Channel;
use super::credit::{CLIENT_RECV_SLOTS, ClientCredit, EmptyMeans};
use super::endpoint::{Endpoint, ObjectTable};
use super::post::SendOp;
use super::registered::RdmaDevice;
use super::verbs::RemoteAccess;
use super::{CELL_BYTES, MESSAGES_INFLIGHT_MAX, RdmaConfig, RdmaError};

/// What [`RdmaClient::poll`] took: the message's length, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// The reply to the oldest message still awaiting one.
    Reply(usize),
    /// An event message the server sent unasked (`dlock_core::proto::decode_event_message`).
    Event(usize),
}

impl Received {
    /// What message `msg` is, as the queue pair handed it over (never empty: the empty
    /// messages are the channel's own).
    pub fn of(msg: &[u8]) -> Received {
        match peek_data_response_header(msg) {
            Ok((header, _)) if is_event_message(&header) => Received::Event(msg.len()),
            // A reply that does not parse is still the answer to the oldest message: the
            // client's decoder says what is wrong with it.
            _ => Received::Reply(msg.len()),
        }
    }
}

/// An error that came after [`RdmaClient::poll`] took a message off the queue pair: the message
/// is the caller's now, so the error is kept for the next call rather than returned in its
/// place (a reply returned as an error would be lost, and its request never answered).
#[derive(Debug, Default)]
struct Late(Option<RdmaError>);

impl Late {
    /// The error the last poll kept, as this poll's answer.
    fn take(&mut self) -> Result<(), RdmaError> {
        self.0.take().map_or(Ok(()), Err)
    }

    /// What a poll that took `got` answers, when `after` is how the rest of it went.
    fn settle(
        &mut self,
        got: Option<Received>,
        after: Result<(), RdmaError>,
    ) -> Result<Option<Received>, RdmaError> {
        match after {
            Ok(()) => Ok(got),
            Err(e) if got.is_some() => {
                self.0 = Some(e);
                Ok(got)
            }
            Err(e) => Err(e),
        }
    }
}

/// A client queue pair with its own registered buffers.
///
/// Made by [`RdmaClient::connect`] (queue pair in RESET), connected by exchanging
/// [`RdmaClient::endpoint`] with the server's [`super::ServerConnection::endpoint`] out of band
/// and calling [`RdmaClient::handshake`] on both sides.
///
/// Every operation busy-polls its own completion queue, as the reference does, until the
/// configured operation timeout; an abandoned one-sided operation poisons the client
/// ([`RdmaError::Poisoned`]) because the device may still write its buffer.
pub struct RdmaClient {
    channel: Channel,
    device: RdmaDevice,
    op_timeout: Duration,
    /// The server's object cells, from its endpoint.
    objects: Option<ObjectTable>,
    /// Messages sent whose replies have not been taken (credit returns are not among them).
    inflight: usize,
    /// The event messages taken, and what the last SEND told the server of them.
    credit: ClientCredit,
    /// An error that came after a poll took its message: the next poll's answer.
    late: Late,
}

impl fmt::Debug for RdmaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaClient")
            .field("device", &self.device.name())
            .field("endpoint", &self.channel.endpoint(None))
            .field("objects", &self.objects)
            .field("inflight", &self.inflight)
            .field("credit", &self.credit)
            .field("late", &self.late)
            .finish()
    }
}

impl RdmaClient {
    /// Opens the device in `cfg` and prepares a queue pair; the connection is made by
    /// [`Self::handshake`].
    pub fn connect(cfg: &RdmaConfig) -> Result<Self, RdmaError> {
        Self::connect_on(&RdmaDevice::open(cfg)?, cfg.op_timeout)
    }

    /// As [`Self::connect`], on a device that is already open (several clients of one process
    /// can share it).
    pub fn connect_on(device: &RdmaDevice, op_timeout: Duration) -> Result<Self, RdmaError> {
        Ok(Self {
            // Replies, events and credit acknowledgements each have their own receive slots
            // (module doc).
            channel: Channel::new(device, CLIENT_RECV_SLOTS, EmptyMeans::Acknowledgement)?,
            device: device.clone(),
            op_timeout,
            objects: None,
            inflight: 0,
            credit: ClientCredit::default(),
            late: Late::default(),
        })
    }

    /// This side's endpoint record, to send to the server.
    pub fn endpoint(&self) -> Endpoint {
        self.channel.endpoint(None)
    }

    /// Connects to the server's endpoint (posting every receive slot first) and remembers its
    /// object table. The client grants the server no access to its memory.
    pub fn handshake(&mut self, server: &Endpoint) -> Result<(), RdmaError> {
        self.channel.handshake(server, RemoteAccess::None)?;
        self.objects = server.objects;
        Ok(())
    }

    /// Whether the device executes remote atomics; without them object operations must go to
    /// the server as data messages.
    pub fn supports_atomics(&self) -> bool {
        self.channel.atomics()
    }

    /// The server's object table, once connected.
    pub fn object_table(&self) -> Option<ObjectTable> {
        self.objects
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    /// Copies `msg` (1..=[`super::MESSAGE_MAX`] bytes) into a registered send slot and SENDs
    /// it. [`RdmaError::Busy`] when [`MESSAGES_INFLIGHT_MAX`] replies are outstanding.
    pub fn post_send(&mut self, msg: &[u8]) -> Result<(), RdmaError> {
        if self.inflight >= MESSAGES_INFLIGHT_MAX {
            return Err(RdmaError::Busy);
        }
        if msg.is_empty() || msg.len() > super::MESSAGE_MAX {
            return Err(RdmaError::InvalidArgument(
                "message must be 1..=MESSAGE_MAX bytes",
            ));
        }
        self.send(msg)
    }

    /// SENDs `msg` with the event count as its immediate value; it then awaits a reply.
    fn send(&mut self, msg: &[u8]) -> Result<(), RdmaError> {
        let told = self.credit.taken();
        self.channel.send_with(self.deadline(), Some(told), |out| {
            out[..msg.len()].copy_from_slice(msg);
            msg.len()
        })?;
        self.credit.told(told);
        self.inflight += 1;
        Ok(())
    }

    /// Takes the next message if one has arrived — a reply or an event message — copies it into
    /// `out` (at least [`super::MESSAGE_MAX`] bytes), reposts its receive slot and says what it
    /// is and how long. Never blocks: a credit return that is due goes if a send slot is free
    /// now, and otherwise stays due for the next poll (send slots free themselves as SENDs
    /// complete). An error that comes after the message was taken (reposting its slot,
    /// returning credit) is this poll's message and the next poll's error, so no reply is lost.
    pub fn poll(&mut self, out: &mut [u8]) -> Result<Option<Received>, RdmaError> {
        self.late.take()?;
        let mut after = Ok(());
        let got = if self.channel.poll_message()? {
            let (len, reposted) = self.channel.take_message(out)?;
            after = reposted;
            let got = Received::of(&out[..len]);
            match got {
                Received::Event(_) => self.credit.took_event(),
                // A reply to a message given up on still answers it, hence saturating.
                Received::Reply(_) => self.inflight = self.inflight.saturating_sub(1),
            }
            Some(got)
        } else {
            None
        };
        // Also when nothing came: the drain may have taken the acknowledgement that lets the
        // next credit return go, or freed the send slot a due one waited for.
        if after.is_ok() {
            after = self.return_credits();
        }
        self.late.settle(got, after)
    }

    /// Sends a credit return when the server may have run out of credit and none is on its way
    /// ([`ClientCredit::return_due`]), whatever the replies awaited: the server may be holding them
    /// behind the events this credit lets go (`credit.rs`). Only into a send slot free now: one
    /// that finds none stays due, as nothing was told.
    fn return_credits(&mut self) -> Result<(), RdmaError> {
        let taken = self.credit.taken();
        if self
            .credit
            .return_due(self.channel.credit_returns_inflight())
            && self.channel.try_return_credit(taken)?
        {
            self.credit.told(taken);
        }
        Ok(())
    }

    /// Busy-polls for the next reply until the operation timeout; event messages that come
    /// first are dropped (a caller that wants them polls with [`Self::poll`]). Every look is a
    /// [`Self::poll`], which returns credit when it is due (and a send slot is free) even if
    /// nothing came: the server may be holding the reply behind events that wait for it
    /// (`credit.rs`).
    pub fn wait(&mut self, out: &mut [u8]) -> Result<usize, RdmaError> {
        let deadline = self.deadline();
        loop {
            if let Some(Received::Reply(len)) = self.poll(out)? {
                return Ok(len);
            }
            if Instant::now() >= deadline {
                return Err(RdmaError::Timeout { op: "IBV_WC_RECV" });
            }
            std::hint::spin_loop();
        }
    }

    /// Sends `msg` and waits for its reply (the synchronous request the reference makes).
    pub fn call(&mut self, msg: &[u8], out: &mut [u8]) -> Result<usize, RdmaError> {
        self.post_send(msg)?;
        self.wait(out)
    }

    /// The remote address of object cell `cell`, checked against the server's table.
    fn cell(&self, cell: u32) -> Result<(u64, u32), RdmaError> {
        self.channel.check_connected()?;
        let t = self.objects.ok_or(RdmaError::InvalidArgument(
            "the server advertised no object table",
        ))?;
        if cell >= t.cells {
            return Err(RdmaError::InvalidArgument("object cell index out of range"));
        }
        // The endpoint decoder checked that the table does not wrap, so this cannot overflow.
        Ok((t.addr + u64::from(cell) * CELL_BYTES as u64, t.rkey))
    }

    fn atomic(&mut self, op: SendOp) -> Result<u64, RdmaError> {
        if !self.channel.atomics() {
            return Err(RdmaError::NoAtomics);
        }
        self.channel.one_sided(op, self.deadline())
    }

    /// Atomically adds `add` (wrapping) to object cell `cell`; returns the value before.
    pub fn fetch_add(&mut self, cell: u32, add: u64) -> Result<u64, RdmaError> {
        let (remote_addr, rkey) = self.cell(cell)?;
        self.atomic(SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        })
    }

    /// Atomically stores `new` in object cell `cell` if it holds `expected`; returns the value
    /// observed, so the swap happened exactly when the result equals `expected`.
    pub fn compare_swap(&mut self, cell: u32, expected: u64, new: u64) -> Result<u64, RdmaError> {
        let (remote_addr, rkey) = self.cell(cell)?;
        self.atomic(SendOp::CompareSwap {
            remote_addr,
            rkey,
            expected,
            new,
        })
    }

    /// Reads object cell `cell` with an 8-byte RDMA READ (the reference's snapshot). An aligned
    /// 8-byte read is not torn by a concurrent atomic on the devices dlock targets, but the IB
    /// specification does not promise it; `compare_swap(cell, 0, 0)` is the strictly atomic
    /// alternative.
    pub fn read(&mut self, cell: u32) -> Result<u64, RdmaError> {
        let (remote_addr, rkey) = self.cell(cell)?;
        self.channel
            .one_sided(SendOp::Read { remote_addr, rkey }, self.deadline())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::proto::{Event, EventHeader, PROTO_VERSION, encode_event_message};

    #[test]
    fn an_event_message_is_told_from_a_reply() {
        let mut buf = [0u8; super::super::MESSAGE_MAX];
        let header = EventHeader {
            version: PROTO_VERSION,
            client: 7,
        };
        let n = encode_event_message(&header, &[Event::Overflow], &mut buf).unwrap();
        assert_eq!(Received::of(&buf[..n]), Received::Event(n));
        // The same header with the reply flags of a plain data response is a reply.
        buf[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Received::of(&buf[..n]), Received::Reply(n));
        // Bytes no header starts with still answer the oldest message; the decoder says why
        // they are bad.
        assert_eq!(Received::of(b"garbage"), Received::Reply(7));
    }

    /// A poll that took a reply and then failed to return credit (a post error, say) hands
    /// over the reply and keeps the error for the next poll: returned in its place, the reply
    /// was lost and the request it answers never answered.
    #[test]
    fn an_error_after_a_message_was_taken_waits_for_the_next_poll() {
        let mut late = Late::default();
        let failed = RdmaError::Poisoned;
        assert_eq!(
            late.settle(Some(Received::Reply(9)), Err(failed.clone())),
            Ok(Some(Received::Reply(9))),
            "the reply was lost to the error"
        );
        assert_eq!(late.take(), Err(failed.clone()), "the error was lost");
        assert_eq!(late.take(), Ok(()), "the error was told twice");
        // With nothing taken, the error is this poll's answer.
        assert_eq!(late.settle(None, Err(failed.clone())), Err(failed));
        assert_eq!(late.take(), Ok(()));
        assert_eq!(
            late.settle(Some(Received::Event(3)), Ok(())),
            Ok(Some(Received::Event(3)))
        );
        assert_eq!(late.take(), Ok(()));
    }
}
