//! What a transport does with a data message once it has its bytes, and with a decided parked
//! request: the rules of [`route`](super::route) applied around
//! [`Server::handle_data`]. The runtime's mailboxes and TCP connections and the simulator's
//! network all hand their messages here, so they run the same decisions; what stays in a
//! transport is moving bytes.

use super::Server;
use super::route::{Admission, Binding, Delivery, Route, admit, owns_mailbox};
use super::waiters::WaitReply;
use crate::proto::peek_data_header;
use crate::status::Status;

/// What became of one data message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Dispatched {
    /// Answered: the reply is the first `n` bytes of the output buffer.
    Replied(usize),
    /// A blocking request was parked; its reply comes from [`Server::dispatch_replies`].
    Parked,
    /// Not run: the sender may not speak for the client it names, or the bytes are no data
    /// message. A stream closes its connection; a mailbox answers with an empty reply.
    Refused,
}

impl Server<'_> {
    /// A data message `req` that came over stream connection (`conn`, `generation`), whose
    /// members are `bindings` (one per client slot): runs it if the connection speaks for its
    /// client, records where a parked request's reply goes, and answers `ClientNotInit` for an
    /// id nobody holds. `out` holds the largest reply.
    pub fn dispatch_stream(
        &mut self,
        routes: &mut [Route],
        bindings: &[Binding],
        (conn, generation): (u32, u32),
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Dispatched {
        let Ok((header, _)) = peek_data_header(req) else {
            return Dispatched::Refused;
        };
        let slot = self.client_slot_of(header.client);
        match admit(bindings, conn, header.client, slot) {
            Admission::Close => Dispatched::Refused,
            Admission::Refuse => match self.refuse_data(req, out, Status::ClientNotInit) {
                Ok(n) => Dispatched::Replied(n),
                Err(_) => Dispatched::Refused,
            },
            Admission::Execute { slot } => match self.handle_data(req, out, now_ms) {
                Ok(0) => {
                    if let Some(route) = routes.get_mut(slot as usize) {
                        *route = Route::Stream {
                            conn,
                            generation,
                            message_id: header.message_id,
                        };
                    }
                    Dispatched::Parked
                }
                Ok(n) => Dispatched::Replied(n),
                Err(_) => Dispatched::Refused,
            },
        }
    }

    /// A data message `req` taken from the mailbox of client slot `slot` as request `seq`
    /// (the slot's latest): runs it if it names the slot's client, after cancelling a request
    /// the client parked through its mailbox and gave up on by sending this one.
    pub fn dispatch_mailbox(
        &mut self,
        routes: &mut [Route],
        slot: u32,
        seq: u64,
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Dispatched {
        let Ok((header, _)) = peek_data_header(req) else {
            return Dispatched::Refused;
        };
        if !owns_mailbox(self.client_slot_of(header.client), slot) {
            return Dispatched::Refused;
        }
        let Some(route) = routes.get_mut(slot as usize) else {
            return Dispatched::Refused;
        };
        if route.superseded_in_mailbox() {
            self.cancel_parked(header.client, now_ms);
        }
        match self.handle_data(req, out, now_ms) {
            Ok(0) => {
                *route = Route::Mailbox { seq };
                Dispatched::Parked
            }
            Ok(n) => Dispatched::Replied(n),
            Err(_) => Dispatched::Refused,
        }
    }

    /// Hands each decided parked request's reply (encoded into `out`) to `sink` with where it
    /// goes; `latest_seq(slot)` is the slot's last mailbox request taken. Replies whose request
    /// is no longer awaited come as [`Delivery::Nowhere`].
    pub fn dispatch_replies(
        &mut self,
        routes: &mut [Route],
        latest_seq: impl Fn(u32) -> u64,
        out: &mut [u8],
        mut sink: impl FnMut(Delivery, &WaitReply, &[u8]),
    ) {
        self.take_replies(|r: WaitReply| {
            let (Ok(n), Some(route)) = (r.encode(out), routes.get_mut(r.slot as usize)) else {
                return;
            };
            let delivery = route.deliver(r.header.message_id, latest_seq(r.slot));
            sink(delivery, &r, &out[..n]);
        });
    }
}
