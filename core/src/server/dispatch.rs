//! One way through for a data message: what a transport does with its bytes, and with a
//! decided parked request. The runtime's mailboxes, stream connections and queue pairs and the
//! simulator's network all hand their messages here, so they run the same decisions; what
//! stays in a transport is moving bytes and waking threads.
//!
//! [`Server::dispatch`] (a mailbox or queue pair delivers one message) and
//! [`Server::dispatch_stream`] (a stream's first message) read the header once, find the
//! client once, apply the rule of the path the message came by ([`route`](super::route)) and
//! execute the commands — each parsed once — for the slot found:
//!
//! ```text
//! dispatch / dispatch_stream   peek_data_frame: the header, read once
//!   dispatch_frame             client_slot: the client, found once; the path's rule; a
//!                              request parked over the same path given up on
//!     execute_frame            decode_into: each command, parsed once
//!       execute_with           serving_slot: the client's state, from the slot found
//!         lock_command         the word's transition
//! ```

use super::Server;
use super::frames::answer;
use super::route::{Admission, Binding, Delivery, Joining, Route, admit, joining, owns_mailbox};
use super::routing::Routing;
use super::waiters::WaitReply;
use crate::proto::{Command, DataFrame, DecodeError, peek_data_frame};
use crate::status::Status;

/// The path a data message came by, which decides whom it may speak for and where the reply
/// of a request it parks goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The mailbox of client slot `slot`, as request `seq` (the slot's latest).
    Mailbox {
        /// The slot whose mailbox it is.
        slot: u32,
        /// The request's sequence number.
        seq: u64,
    },
    /// Stream connection `conn` at `generation` (the transport's names for it).
    Stream {
        /// The transport's index of the connection.
        conn: u32,
        /// The index's generation.
        generation: u32,
    },
    /// The queue pair of client slot `slot`, attached with `client`'s session.
    QueuePair {
        /// The slot the queue pair was attached for.
        slot: u32,
        /// The client whose session attached it.
        client: u32,
    },
}

/// What became of one data message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Dispatched {
    /// Answered: the reply is the first `n` bytes of the output buffer.
    Replied(usize),
    /// A blocking request was parked; its reply comes from [`Server::dispatch_replies`].
    Parked,
    /// A join bound its client to this stream connection; the reply is the first `reply`
    /// bytes of the output buffer. `vacated`: the connection the client left, which has no
    /// member now (the transport closes it).
    Joined {
        /// The reply's length.
        reply: usize,
        /// The connection left with no member, if any.
        vacated: Option<u32>,
    },
    /// Not run: the sender may not speak for the client it names, or the bytes are no data
    /// message. A stream or queue pair closes; a mailbox answers with an empty reply.
    Refused,
}

/// What became of the bytes at the start of a stream ([`Server::dispatch_stream`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Streamed {
    /// No whole message yet: read more.
    Incomplete,
    /// The bytes cannot start a data message: close the connection.
    Malformed,
    /// The first `len` bytes were a message, and this became of it.
    Message {
        /// The message's length.
        len: usize,
        /// What became of it.
        dispatched: Dispatched,
    },
}

impl Server<'_> {
    /// Data message `msg` (all of it, and nothing else) came by `from`: runs it if that path
    /// may speak for its client, and routes the reply of a request it parks (`route`'s
    /// tables). For a mailbox, `seq` becomes the slot's latest request taken whatever the
    /// message holds. `out` holds the largest reply (`DATA_RESPONSE_MAX`).
    pub fn dispatch(
        &mut self,
        routing: &mut Routing<'_>,
        from: Source,
        msg: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Dispatched {
        if let Source::Mailbox { slot, seq } = from {
            routing.took_mailbox(slot, seq);
        }
        match peek_data_frame(msg) {
            Ok(msg) => self.dispatch_frame(routing, from, msg, out, now_ms),
            Err(_) => Dispatched::Refused,
        }
    }

    /// The first data message in `buf`, the unread bytes of stream connection (`conn`,
    /// `generation`), framed by its header and dispatched as [`Server::dispatch`] does.
    pub fn dispatch_stream(
        &mut self,
        routing: &mut Routing<'_>,
        (conn, generation): (u32, u32),
        buf: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Streamed {
        let frame = match peek_data_frame(buf) {
            Ok(frame) => frame,
            Err(DecodeError::Truncated) => return Streamed::Incomplete,
            Err(_) => return Streamed::Malformed,
        };
        let Some(msg) = frame.first_message() else {
            return Streamed::Incomplete;
        };
        let from = Source::Stream { conn, generation };
        Streamed::Message {
            len: msg.message_len(),
            dispatched: self.dispatch_frame(routing, from, msg, out, now_ms),
        }
    }

    /// The one way through: the client found once, the rule of the path `from`, and the
    /// message run for the slot found, a request it parks routed back the same way.
    #[inline]
    fn dispatch_frame(
        &mut self,
        routing: &mut Routing<'_>,
        from: Source,
        msg: DataFrame<'_>,
        out: &mut [u8],
        now_ms: u64,
    ) -> Dispatched {
        let header = msg.header();
        let client = header.client;
        // Who the path may speak for: the slot whose route a parked request takes, the slot
        // the client was found in, and that route.
        let (slot, found, parked) = match from {
            Source::Mailbox { slot, seq } => {
                let found = self.client_slot(client);
                if !owns_mailbox(found, slot) {
                    return Dispatched::Refused;
                }
                (slot, found, Route::Mailbox { seq })
            }
            Source::Stream { conn, generation } => {
                match self.admit_on_stream(routing, (conn, generation), msg, out, now_ms) {
                    Ok(slot) => {
                        let parked = Route::Stream {
                            conn,
                            generation,
                            message_id: header.message_id,
                        };
                        (slot, Some(slot), parked)
                    }
                    Err(done) => return done,
                }
            }
            Source::QueuePair {
                slot,
                client: attached,
            } => {
                if client != attached {
                    return Dispatched::Refused;
                }
                (slot, self.client_slot(client), Route::QueuePair)
            }
        };
        let Some(e) = routing.entry(slot) else {
            return Dispatched::Refused;
        };
        if e.route.superseded_by(parked) {
            self.cancel_parked_in(found, client, now_ms);
        }
        match self.execute_frame(found, msg, out, now_ms) {
            Ok(0) => {
                e.route = parked;
                Dispatched::Parked
            }
            Ok(n) => Dispatched::Replied(n),
            Err(_) => Dispatched::Refused,
        }
    }

    /// Whom a stream message may speak for: the slot of its client if the connection is bound
    /// to it; otherwise what becomes of the message instead (a join bound and answered, a
    /// stranger answered `ClientNotInit`, or the connection closed).
    fn admit_on_stream(
        &mut self,
        routing: &mut Routing<'_>,
        (conn, generation): (u32, u32),
        msg: DataFrame<'_>,
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<u32, Dispatched> {
        let header = msg.header();
        match joining(msg.bytes(), usize::from(header.count)) {
            Joining::None => {}
            Joining::Join => return Err(self.join(routing, (conn, generation), msg, out, now_ms)),
            Joining::Mixed => return Err(Dispatched::Refused),
        }
        let found = self.client_slot(header.client);
        let from = Binding {
            conn,
            generation,
            client: header.client,
        };
        match admit(from, found.map(|slot| (slot, routing.binding(slot)))) {
            Admission::Execute { slot } => Ok(slot),
            Admission::Close => Err(Dispatched::Refused),
            Admission::Refuse => {
                let status = self.refuse(Status::ClientNotInit);
                Err(match self.answer_frame(msg, out, status) {
                    Ok(n) => Dispatched::Replied(n),
                    Err(_) => Dispatched::Refused,
                })
            }
        }
    }

    /// A join, alone in `msg` (`route::joining`): binds its client to the connection if the
    /// session is the registration's, and answers it; a wrong session (counted by
    /// `authenticate`) closes the connection.
    fn join(
        &mut self,
        routing: &mut Routing<'_>,
        at: (u32, u32),
        msg: DataFrame<'_>,
        out: &mut [u8],
        now_ms: u64,
    ) -> Dispatched {
        let Ok(req) = msg.decode() else {
            return Dispatched::Refused;
        };
        let Command::Join(join) = req.command(0) else {
            return Dispatched::Refused;
        };
        let client = req.header().client;
        let Some(slot) = self.authenticate(client, &join.session) else {
            return Dispatched::Refused;
        };
        let vacated = self.bind_stream(routing, (slot, client), at, now_ms);
        match answer(&req, out, Status::Success) {
            Ok(reply) => Dispatched::Joined { reply, vacated },
            Err(_) => Dispatched::Refused,
        }
    }

    /// Hands each decided parked request's reply (encoded into `out`) to `sink` with where it
    /// goes. Replies whose request is no longer awaited come as [`Delivery::Nowhere`].
    pub fn dispatch_replies(
        &mut self,
        routing: &mut Routing<'_>,
        out: &mut [u8],
        mut sink: impl FnMut(Delivery, &WaitReply, &[u8]),
    ) {
        self.take_replies(|r: WaitReply| {
            let (Ok(n), Some(e)) = (r.encode(out), routing.entry(r.slot)) else {
                return;
            };
            let delivery = e.route.deliver(r.header.message_id, e.mailbox_seq());
            sink(delivery, &r, &out[..n]);
        });
    }
}
