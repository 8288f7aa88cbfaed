//! A client slot's events on their way to its queue pair (the module doc's "Events";
//! `runtime/events.rs` encodes and sends them): whether one may go now, sending it, and sending
//! those waiting ahead of a request's reply.

use dlock_core::proto::{EventHeader, PROTO_VERSION};
use dlock_core::server::Server;

use super::Peers;
use crate::rdma::EventRoom;
use crate::runtime::events::{EventsOut, Room, Sink};

/// Client slot `slot`'s event messages on its way to its queue pair (`events.rs`): they go
/// while the client has a receive slot free for them, and not while a parked request's reply
/// waits for a send slot.
pub(in crate::runtime) struct QueuePairEvents<'p, 's> {
    pub(in crate::runtime) peers: &'p mut Peers<'s>,
    pub(in crate::runtime) slot: u32,
}

impl Sink for QueuePairEvents<'_, '_> {
    fn room(&mut self) -> Room {
        match self.peers.event_room(self.slot) {
            EventRoom::Ready => Room::Ready,
            EventRoom::Busy => Room::Retry,
            EventRoom::NoCredit => Room::Wait,
        }
    }

    fn send(&mut self, msg: &[u8]) -> bool {
        self.peers.send_event(self.slot, msg)
    }
}

impl Peers<'_> {
    /// Whether an event message may go to the queue pair in `slot` now (`runtime/rdma.rs`):
    /// `Busy` while a parked request's reply waits for a send slot, so the reply goes first. A
    /// pair that fails is let go, and its events stay in the ring.
    fn event_room(&mut self, slot: u32) -> EventRoom {
        let Some(peer) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            return EventRoom::NoCredit;
        };
        if peer.deferred_len > 0 {
            return EventRoom::Busy;
        }
        match peer.conn.event_room() {
            Ok(room) => room,
            Err(e) => {
                self.fail(slot, e);
                EventRoom::NoCredit
            }
        }
    }

    /// SENDs event message `msg` to the queue pair in `slot` after [`Self::event_room`] said
    /// `Ready`; false if it did not go (the caller counts the events lost, as for a stream).
    fn send_event(&mut self, slot: u32, msg: &[u8]) -> bool {
        let Some(peer) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            return false;
        };
        match peer.conn.send_event(msg) {
            Ok(sent) => sent,
            Err(e) => {
                self.fail(slot, e);
                false
            }
        }
    }

    /// Sends the events the client in `slot` has waiting to its queue pair, ahead of the reply
    /// to the request about to be served (as `tcp/events.rs` does on a stream); false while
    /// they have not all gone (for want of credit or a send slot: the request waits).
    pub(super) fn events_ahead(
        &mut self,
        server: &Server<'_>,
        events: &mut EventsOut,
        slot: u32,
    ) -> bool {
        if !events.waiting(server, slot) {
            return true;
        }
        // A pair its client's current registration did not attach gets none of its events.
        let Some(client) = self.current_client(server, slot) else {
            return true;
        };
        let header = EventHeader {
            version: PROTO_VERSION,
            client,
        };
        let mut sink = QueuePairEvents { peers: self, slot };
        events.send(server, slot, &header, &mut sink).done
    }
}
