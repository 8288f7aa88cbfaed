//! Where the reply of a parked request goes: the rules every transport follows, kept beside
//! the state machine that parks and decides the requests.
//!
//! A blocking `lock()` is answered when it is decided, which may be long after it arrived, and
//! by then its client may have given up on it. There is one [`Route`] per client slot (in
//! [`Routing`](super::Routing), set when [`Server::dispatch`](super::Server::dispatch) parks a
//! request), asked when [`Server::take_replies`](super::Server::take_replies) hands the decision
//! over where the reply goes:
//!
//! | route        | event                                               | then                                   |
//! |--------------|-----------------------------------------------------|----------------------------------------|
//! | any          | the request parks                                   | the route of the path it came by       |
//! | `Mailbox(s)` | a newer mailbox request of the slot is taken        | none; cancel the parked request        |
//! | `QueuePair`  | a newer message comes over the slot's queue pair    | none; cancel the parked request        |
//! | `Mailbox(s)` | reply decided, `s` the slot's latest request        | post it in the lane of `s`             |
//! | `Mailbox(s)` | reply decided, a newer request taken since          | dropped (it would overwrite that one)  |
//! | `Stream(c)`  | reply decided, echoing the parked message's id      | write it to connection `c`             |
//! | `Stream(c)`  | reply decided for another message id                | dropped                                |
//! | `Stream(c)`  | connection `c` closes, or the client leaves it      | none; cancel the parked request        |
//! | `QueuePair`  | reply decided                                       | send it on the client's queue pair     |
//! | `QueuePair`  | the queue pair goes away                            | none; cancel the parked request        |
//! | any          | the slot is registered again                        | none; cancel the parked request        |
//!
//! "Cancel" is [`Server::cancel_parked`](super::Server::cancel_parked): a request whose reply
//! has nowhere to go must not be granted a lock nobody learns of. A mailbox and a queue pair
//! carry a client's requests one after another, and a client sends nothing while its request is
//! parked unless it gave up on it, so a newer message over the same path supersedes the parked
//! one ([`Route::superseded_by`]); a stream carries many requests in flight, matched by message
//! id, so nothing sent over one supersedes anything. Connections are named by the
//! transport (`conn`, `generation`): an index reused for a new connection has a new generation,
//! so a route never reaches a connection it did not come from.
//!
//! # Who a stream connection speaks for
//!
//! A stream connection speaks for the clients bound to it (its attach, and each join since):
//! one [`Binding`] per client slot names the connection and the registration. [`admit`] says
//! what becomes of a data message naming `client`:
//!
//! | the message's client                                   | then                       |
//! |--------------------------------------------------------|----------------------------|
//! | registered, bound to this connection for this registration | executed               |
//! | registered, not bound here                             | the connection is closed   |
//! | not registered                                         | answered `ClientNotInit`   |
//!
//! The same id registered in another slot is a new registration (a recovering server takes old
//! ids back), which the connection never proved it belongs to.
//!
//! A join (`proto::JoinCommand`) binds its client to the connection it arrives on, so it must
//! come alone. [`joining`] says what a stream message is before any of it runs:
//!
//! | the message                                   | then                                        |
//! |-----------------------------------------------|---------------------------------------------|
//! | no join                                       | [`admit`] decides                           |
//! | one join and nothing else                     | the transport checks the session and binds  |
//! | a join among other commands, at any position  | the connection is closed, nothing executed  |
//!
//! No client sends the third kind (a multiplexing client joins with a message of its own), so
//! it is a broken or hostile peer, which the connection's other rules close on too; executing
//! the other commands and answering the join `Einval`, as a mailbox does (nothing joins over
//! shared memory), would make where the join stands decide what happens.
//!
//! A mailbox belongs to a client slot: a message in it is executed only if its client is the
//! one registered in that slot ([`owns_mailbox`]); otherwise it is answered empty (the sender
//! learns its request could not be read, and nothing runs). Closing on a foreign client stops
//! a peer from speaking for someone else; answering an unknown one lets a multiplexing client's
//! member that just left learn why, and tells nobody anything.
//!
//! A queue pair speaks for the client whose session attached it: a message naming anyone else
//! closes it; one naming its client is executed, and answered `ClientNotInit` by the state
//! machine once that client is gone (the pair is let go on the next lease tick).
//!
//! # Where a client's events go
//!
//! The server keeps each client slot's events (revokes of cached grants) in the slot's event
//! ring in the region. [`event_path`] says who reads them:
//!
//! | the slot has                                                  | its events                        |
//! |---------------------------------------------------------------|-----------------------------------|
//! | a queue pair attached with the registration's session         | SENT on it as event messages      |
//! | no such queue pair, a stream connection bound                 | written to it as event messages   |
//! | neither                                                       | stay in the ring                  |
//!
//! A client's data path is one of the three, so the first two do not meet for one
//! registration; the queue pair is asked first because the transport checks it against the
//! session at every delivery, while a stream binding is the core's own and current by
//! construction. Staying in the ring is right for a shared-memory client (it reads the ring in
//! place) and for a client whose path is not attached yet (it gets what is there when it is,
//! or an overflow if the ring filled meanwhile).

use crate::proto::{COMMAND_LEN, DATA_HEADER_LEN, JOIN_KIND};

/// Where the reply of a client slot's parked request goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Route {
    /// Nothing parked (or its reply has nowhere to go).
    #[default]
    None,
    /// Into the client's mailbox, answering request `seq`.
    Mailbox {
        /// The request's sequence number.
        seq: u64,
    },
    /// Back over stream connection (`conn`, `generation`), answering message `message_id`.
    Stream {
        /// The transport's index of the connection.
        conn: u32,
        /// The index's generation when the request came.
        generation: u32,
        /// The id the reply must echo.
        message_id: u16,
    },
    /// Back over the client's RDMA queue pair.
    QueuePair,
}

/// Where a decided reply goes now ([`Route::deliver`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Delivery {
    /// Post it in the mailbox lane of request `seq`.
    Mailbox {
        /// The request's sequence number.
        seq: u64,
    },
    /// Write it to stream connection (`conn`, `generation`).
    Stream {
        /// The connection.
        conn: u32,
        /// Its generation.
        generation: u32,
    },
    /// Send it on the client's queue pair.
    QueuePair,
    /// Drop it: the request it answers is no longer awaited.
    Nowhere,
}

impl Route {
    /// The reply to message `message_id` was decided; `latest_seq` is the slot's last mailbox
    /// request taken. Says where it goes, and clears the route.
    #[inline]
    pub fn deliver(&mut self, message_id: u16, latest_seq: u64) -> Delivery {
        match core::mem::take(self) {
            Route::Mailbox { seq } if seq == latest_seq => Delivery::Mailbox { seq },
            Route::Stream {
                conn,
                generation,
                message_id: id,
            } if id == message_id => Delivery::Stream { conn, generation },
            Route::QueuePair => Delivery::QueuePair,
            Route::None | Route::Mailbox { .. } | Route::Stream { .. } => Delivery::Nowhere,
        }
    }

    /// A newer message of the slot's client came by the path `by` (the route a request parked
    /// over it would have): a request parked over the same mailbox or queue pair is one the
    /// client gave up on (module doc). True if there was one (the route is cleared; the caller
    /// cancels it).
    #[inline]
    #[must_use]
    pub fn superseded_by(&mut self, by: Route) -> bool {
        let parked = matches!(
            (*self, by),
            (Route::Mailbox { .. }, Route::Mailbox { .. }) | (Route::QueuePair, Route::QueuePair)
        );
        if parked {
            *self = Route::None;
        }
        parked
    }

    /// The slot's queue pair went away. True if the slot's parked request came over it (the
    /// route is cleared; the caller cancels it).
    #[inline]
    #[must_use]
    pub fn leave_queue_pair(&mut self) -> bool {
        let parked = matches!(self, Route::QueuePair);
        if parked {
            *self = Route::None;
        }
        parked
    }

    /// Stream connection (`conn`, `generation`) closed, or the client left it. True if the
    /// slot's parked request came over it (the route is cleared; the caller cancels it).
    #[inline]
    #[must_use]
    pub fn leave_stream(&mut self, conn: u32, generation: u32) -> bool {
        let parked = matches!(*self, Route::Stream { conn: c, generation: g, .. }
            if c == conn && g == generation)
            && !crate::mutated!(StreamKeepsParked);
        if parked {
            *self = Route::None;
        }
        parked
    }
}

/// Which stream connection speaks for a client slot (`conn` at `generation`;
/// [`Binding::NONE`]: none), and for which registration (`client`, the id in the slot when it
/// was bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The transport's index of the connection.
    pub conn: u32,
    /// The index's generation when the connection was bound.
    pub generation: u32,
    /// The client registered in the slot when the connection proved its session.
    pub client: u32,
}

impl Default for Binding {
    fn default() -> Self {
        Self::NONE
    }
}

impl Binding {
    /// No connection.
    pub const NONE: Binding = Binding {
        conn: u32::MAX,
        generation: 0,
        client: 0,
    };

    /// Whether a connection is bound.
    #[inline]
    pub const fn is_bound(&self) -> bool {
        self.conn != u32::MAX
    }
}

/// What a stream transport does with a data message ([`admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Admission {
    /// Execute it for the client in `slot`.
    Execute {
        /// The client's slot.
        slot: u32,
    },
    /// Answer every command `ClientNotInit` without executing it.
    Refuse,
    /// Close the connection: it spoke for a client it is not bound to.
    Close,
}

/// The ownership rule (module doc) for a message on a connection naming a client: `from` is
/// the binding the message claims (its connection and client), `found` the slot that client is
/// registered in with that slot's binding (`None`: not registered).
#[inline]
pub fn admit(from: Binding, found: Option<(u32, Binding)>) -> Admission {
    match found {
        None => Admission::Refuse,
        Some((slot, bound)) if bound == from => Admission::Execute { slot },
        Some(_) => Admission::Close,
    }
}

/// What a stream data message is, as far as joins go ([`joining`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Joining {
    /// No join: an ordinary message.
    None,
    /// One join, alone: the transport's to answer.
    Join,
    /// A join among other commands: close the connection.
    Mixed,
}

/// The join rule (module doc) for the data message `msg`, whose header says it holds `count`
/// commands (`peek_data_header` checked the count and the caller that `msg` is whole). Reads
/// only each command's kind byte.
#[inline]
pub fn joining(msg: &[u8], count: usize) -> Joining {
    let joins = (0..count)
        .filter(|i| msg.get(DATA_HEADER_LEN + i * COMMAND_LEN) == Some(&JOIN_KIND))
        .count();
    match (joins, count) {
        (0, _) => Joining::None,
        (1, 1) => Joining::Join,
        _ => Joining::Mixed,
    }
}

/// Where a client slot's events go ([`event_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum EventPath {
    /// SENT on the slot's queue pair as event messages for `client`.
    QueuePair {
        /// The client the queue pair was attached for.
        client: u32,
    },
    /// Written to the bound stream connection as event messages for its client.
    Stream(Binding),
    /// Left in the slot's event ring.
    InPlace,
}

/// The event rule (module doc): `queue_pair` is the client whose current registration attached
/// a queue pair to the slot (`None`: none, or one of an older registration), `stream` the slot's
/// stream binding.
#[inline]
pub fn event_path(queue_pair: Option<u32>, stream: Binding) -> EventPath {
    match queue_pair {
        Some(client) => EventPath::QueuePair { client },
        None if stream.is_bound() => EventPath::Stream(stream),
        None => EventPath::InPlace,
    }
}

/// The mailbox rule (module doc): whether a message in the mailbox of slot `mailbox`, naming
/// a client registered in `client_slot` (`None`: not registered), may run.
#[inline]
pub fn owns_mailbox(client_slot: Option<u32>, mailbox: u32) -> bool {
    client_slot == Some(mailbox)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LockKind, Session, Ticket};
    use crate::proto::{
        Command, DataHeader, JoinCommand, LockCommand, LockOp, encode_data_request,
        peek_data_header,
    };

    #[test]
    fn events_go_to_the_queue_pair_then_the_stream_then_stay_in_the_ring() {
        let stream = Binding {
            conn: 4,
            generation: 2,
            client: 9,
        };
        assert_eq!(
            event_path(Some(9), Binding::NONE),
            EventPath::QueuePair { client: 9 }
        );
        assert_eq!(
            event_path(Some(9), stream),
            EventPath::QueuePair { client: 9 }
        );
        assert_eq!(event_path(None, stream), EventPath::Stream(stream));
        assert_eq!(event_path(None, Binding::NONE), EventPath::InPlace);
    }

    #[test]
    fn a_join_must_come_alone_wherever_it_stands() {
        let join = Command::Join(JoinCommand {
            session: Session::NONE,
        });
        let lock = Command::Lock(LockCommand {
            kind: LockKind::Atomic,
            op: LockOp::TryExclusive,
            lock: 1,
            expire_ms: 1,
            ticket: Ticket::default(),
            wait_ms: 0,
            partition_epoch: 0,
            flags: crate::proto::LockFlags::NONE,
        });
        let header = DataHeader {
            version: 2,
            count: 0,
            message_id: 1,
            client: 9,
            flags: 0,
        };
        let shape = |commands: &[Command]| {
            let mut buf = [0u8; crate::proto::DATA_MESSAGE_MAX];
            let n = encode_data_request(&header, commands, &mut buf).unwrap();
            let (h, len) = peek_data_header(&buf[..n]).unwrap();
            assert_eq!(len, n);
            joining(&buf[..n], usize::from(h.count))
        };
        assert_eq!(shape(&[lock, lock]), Joining::None);
        assert_eq!(shape(&[join]), Joining::Join);
        assert_eq!(shape(&[join, lock]), Joining::Mixed);
        assert_eq!(shape(&[lock, join]), Joining::Mixed, "a join after a lock");
        assert_eq!(shape(&[lock, join, lock]), Joining::Mixed);
        assert_eq!(shape(&[join, join]), Joining::Mixed, "two joins");
    }

    #[test]
    fn a_mailbox_runs_only_its_own_slots_client() {
        assert!(owns_mailbox(Some(3), 3));
        assert!(
            !owns_mailbox(Some(2), 3),
            "another client's id in this mailbox"
        );
        assert!(!owns_mailbox(None, 3), "nobody's id");
    }

    #[test]
    fn a_connection_speaks_only_for_the_registrations_bound_to_it() {
        let bound = Binding {
            conn: 7,
            generation: 3,
            client: 40,
        };
        let from = |conn, generation, client| Binding {
            conn,
            generation,
            client,
        };
        assert_eq!(
            admit(from(7, 3, 40), Some((2, bound))),
            Admission::Execute { slot: 2 }
        );
        assert_eq!(
            admit(from(8, 3, 40), Some((2, bound))),
            Admission::Close,
            "another connection"
        );
        assert_eq!(
            admit(from(7, 4, 40), Some((2, bound))),
            Admission::Close,
            "a later connection at the same index"
        );
        assert_eq!(
            admit(from(7, 3, 41), Some((3, Binding::NONE))),
            Admission::Close,
            "another client"
        );
        assert_eq!(
            admit(from(7, 3, 40), Some((1, Binding::NONE))),
            Admission::Close,
            "the same id registered again elsewhere"
        );
        assert_eq!(admit(from(7, 3, 99), None), Admission::Refuse);
        assert!(bound.is_bound() && !Binding::default().is_bound());
    }

    #[test]
    fn a_mailbox_reply_goes_only_to_the_latest_request() {
        let mut r = Route::Mailbox { seq: 7 };
        assert_eq!(r.deliver(0, 7), Delivery::Mailbox { seq: 7 });
        assert_eq!(r, Route::None);
        let mut r = Route::Mailbox { seq: 7 };
        assert_eq!(
            r.deliver(0, 8),
            Delivery::Nowhere,
            "the client sent another since"
        );
        assert_eq!(r, Route::None);
    }

    #[test]
    fn a_stream_reply_needs_the_parked_message_id_and_connection() {
        let parked = Route::Stream {
            conn: 3,
            generation: 9,
            message_id: 41,
        };
        let mut r = parked;
        assert_eq!(
            r.deliver(41, 0),
            Delivery::Stream {
                conn: 3,
                generation: 9
            }
        );
        let mut r = parked;
        assert_eq!(r.deliver(42, 0), Delivery::Nowhere);
        let mut r = parked;
        assert!(!r.leave_stream(3, 8), "another generation of the index");
        assert!(!r.leave_stream(4, 9));
        assert_eq!(r, parked);
        assert!(r.leave_stream(3, 9));
        assert_eq!(r, Route::None);
        assert_eq!(r.deliver(41, 0), Delivery::Nowhere);
    }

    #[test]
    fn a_newer_message_supersedes_only_a_park_over_the_same_mailbox_or_queue_pair() {
        let mailbox = Route::Mailbox { seq: 2 };
        let stream = Route::Stream {
            conn: 1,
            generation: 1,
            message_id: 1,
        };
        let mut r = Route::Mailbox { seq: 1 };
        assert!(r.superseded_by(mailbox));
        assert_eq!(r, Route::None);
        let mut r = Route::QueuePair;
        assert!(r.superseded_by(Route::QueuePair));
        assert_eq!(r, Route::None);
        for (parked, by) in [
            (Route::QueuePair, mailbox),
            (Route::Mailbox { seq: 1 }, Route::QueuePair),
            (stream, stream),
            (stream, mailbox),
            (Route::Mailbox { seq: 1 }, stream),
            (Route::None, mailbox),
        ] {
            let mut r = parked;
            assert!(!r.superseded_by(by), "{parked:?} by {by:?}");
            assert_eq!(r, parked);
        }
        let mut r = Route::QueuePair;
        assert_eq!(r.deliver(0, 0), Delivery::QueuePair);
    }

    #[test]
    fn a_queue_pair_park_is_given_up_only_when_its_queue_pair_goes() {
        let mut r = Route::QueuePair;
        assert!(r.leave_queue_pair());
        assert_eq!(r, Route::None);
        assert!(!r.leave_queue_pair(), "nothing parked any more");
        for mut other in [
            Route::Mailbox { seq: 1 },
            Route::Stream {
                conn: 1,
                generation: 1,
                message_id: 1,
            },
        ] {
            let before = other;
            assert!(!other.leave_queue_pair());
            assert_eq!(other, before);
        }
    }
}
