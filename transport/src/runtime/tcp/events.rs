//! Events ahead of replies on a data connection (`runtime/events.rs` says why): the write
//! buffer as an event sink, and the look at a message's client before the message runs.

use dlock_core::proto::{DATA_MESSAGE_MAX, EventHeader, PROTO_VERSION};
use dlock_core::server::{EventPath, Routing, Server, event_path};

use super::DataConn;
use crate::runtime::events::{EventsOut, Room, Sink};

/// Event messages into a connection's write buffer (`events.rs`), while its window is open:
/// they count in it as replies do, so they never take the room kept for parked replies.
pub(in crate::runtime) struct ConnEvents<'c> {
    pub(super) c: &'c mut DataConn,
    /// What a closed window means to the caller.
    pub(super) closed: Room,
}

impl Sink for ConnEvents<'_> {
    fn room(&mut self) -> Room {
        // An open window leaves room for a reply of every member and one more message
        // ([`write_buf`]); an event message is no longer than a request.
        match self.c.window_open() && self.c.make_room(DATA_MESSAGE_MAX) {
            true => Room::Ready,
            false => self.closed,
        }
    }

    fn send(&mut self, msg: &[u8]) -> bool {
        let c = &mut *self.c;
        c.wbuf[c.wend..c.wend + msg.len()].copy_from_slice(msg);
        c.reply_written(msg.len());
        true
    }
}

/// What a turn of the connections needs to send events ahead of replies: what was told of
/// each ring, and the client (if any) whose current registration attached a queue pair to a
/// slot, whose events go there instead (`dlock_core::server::route::event_path`).
pub(in crate::runtime) struct EventsAhead<'e> {
    pub(in crate::runtime) out: &'e mut EventsOut,
    pub(in crate::runtime) queue_pair: &'e dyn Fn(&Server<'_>, u32) -> Option<u32>,
}

/// Puts the events client `client` has waiting into `c` (connection `i`) when they go to this
/// connection, ahead of a reply to it (`events.rs`); false while they do not all fit.
#[inline]
pub(super) fn events_ahead(
    c: &mut DataConn,
    i: u32,
    client: u32,
    (server, routing): (&Server<'_>, &Routing<'_>),
    events: &mut EventsAhead<'_>,
) -> bool {
    let Some(slot) = server.client_slot_of(client) else {
        return true;
    };
    if !events.out.waiting(server, slot) {
        return true;
    }
    let EventPath::Stream(b) = event_path((events.queue_pair)(server, slot), routing.binding(slot))
    else {
        return true;
    };
    if (b.conn, b.generation) != (i, c.generation) {
        return true;
    }
    let header = EventHeader {
        version: PROTO_VERSION,
        client: b.client,
    };
    let mut sink = ConnEvents {
        c,
        closed: Room::Wait,
    };
    events.out.send(server, slot, &header, &mut sink).done
}
