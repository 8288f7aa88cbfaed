//! A client slot's events on their way out: what its event ring holds, sent as event messages
//! on its stream connection or queue pair (`dlock_core::server::route::event_path` says which).
//!
//! # The order of events and replies
//!
//! **On a stream, a slot's pending events go out ahead of every reply to a request of that
//! slot read after they were written.** Before the data thread executes a data message on a
//! stream connection, it moves every event of the message's client still in its ring (and an
//! overflow not told yet) into that connection's write buffer (`tcp.rs`); the message waits,
//! as one at a closed window does, until they all fit. The client's trust bound counts on it
//! (`dlock_core::manager::trust`, rule 1: a reply says that no revoke sent before its request
//! was read is still on the way): sending events only at the end of the turn, after the
//! turn's replies, let a reply overtake a revoke written earlier in the same turn, or one
//! waiting in the ring for a full connection to drain.
//!
//! The other order — a revoke behind the grant it revokes — is not kept and need not be: a
//! parked request's grant is answered at the end of the turn that made it, and a revoke of it
//! written in that turn may reach the client first. The client's record keeps such a revoke
//! for the acquisition it is waiting on (`dlock_core::manager::cache`, its fence rule).
//!
//! Events also go at the end of every turn that wrote some (`Data::deliver_events`), so that a
//! client that sends nothing hears of them; a connection whose window is full then takes them
//! at a later turn, and still ahead of the next reply to that client.
//!
//! A queue pair keeps the same order (`runtime/rdma.rs`): a request waits on it until its
//! client's events have gone. There an event message also waits for credit — a receive slot
//! the client has freed (`rdma/credit.rs`) — and the request with it, until the client returns
//! the credit, which it does without waiting for a reply.

use dlock_core::proto::{DATA_MESSAGE_MAX, EVENTS_MAX, Event, EventHeader, encode_event_message};
use dlock_core::server::Server;

/// Whether an event message may go on a client's path now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Room {
    Ready,
    /// Not this turn, soon (a send slot, a window that drains): look again next turn.
    Retry,
    /// Not until the client returns credit (`Peers::take_events_unblocked` says when).
    Wait,
}

/// Where one slot's event messages go.
pub(super) trait Sink {
    /// Whether one more event message may go now; asked before its events leave the ring, so
    /// that events with no room stay there.
    fn room(&mut self) -> Room;
    /// Takes event message `msg`; false if it was lost on the way (its events come to the
    /// client as an overflow).
    fn send(&mut self, msg: &[u8]) -> bool;
}

/// What [`EventsOut::send`] did.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sent {
    /// Event messages that went.
    pub(super) messages: usize,
    /// Nothing is left to send: the ring is empty and its overflows are told.
    pub(super) done: bool,
}

/// Per client slot, what was told of its event ring; and the buffer messages are encoded in.
pub(super) struct EventsOut {
    /// Per client slot, its event ring's overflow count when events were last sent to its
    /// stream connection or queue pair: a change is sent on as an overflow entry.
    overflows_sent: Vec<u64>,
    /// An event message could not go: look at the rings again next turn.
    pub(super) again: bool,
    msg: Box<[u8]>,
}

impl EventsOut {
    /// For `slots` client slots; the one allocation, at start.
    pub(super) fn new(slots: usize) -> EventsOut {
        EventsOut {
            overflows_sent: vec![0; slots],
            again: false,
            msg: vec![0; DATA_MESSAGE_MAX].into_boxed_slice(),
        }
    }

    /// How many client slots there are.
    pub(super) fn slots(&self) -> u32 {
        self.overflows_sent.len() as u32
    }

    /// Whether client slot `slot` has something to send: events in its ring, or an overflow
    /// not told yet. Two loads of the ring's indices on the path of every stream message.
    #[inline]
    pub(super) fn waiting(&self, server: &Server<'_>, slot: u32) -> bool {
        server.event_ring(slot).is_some_and(|ring| {
            ring.pending() > 0 || self.overflows_sent.get(slot as usize) != Some(&ring.overflows())
        })
    }

    /// Sends what client slot `slot`'s ring holds to `sink` as event messages for `client`, up
    /// to [`EVENTS_MAX`] events each (the batching of revokes to one client), a changed
    /// overflow count first as an overflow entry. Nothing is allocated.
    pub(super) fn send(
        &mut self,
        server: &Server<'_>,
        slot: u32,
        header: &EventHeader,
        sink: &mut impl Sink,
    ) -> Sent {
        let Some(ring) = server.event_ring(slot) else {
            return Sent {
                messages: 0,
                done: true,
            };
        };
        let overflows = ring.overflows();
        let mut overflow = overflows != self.overflows_sent[slot as usize];
        let mut batch = [Event::Overflow; EVENTS_MAX];
        let mut messages = 0;
        loop {
            if ring.pending() == 0 && !overflow {
                return Sent {
                    messages,
                    done: true,
                };
            }
            match sink.room() {
                Room::Ready => {}
                Room::Retry => {
                    self.again = true;
                    break;
                }
                Room::Wait => break,
            }
            let mut n = usize::from(core::mem::take(&mut overflow));
            while n < EVENTS_MAX
                && let Some(e) = ring.pop()
            {
                batch[n] = e;
                n += 1;
            }
            self.overflows_sent[slot as usize] = overflows;
            let sent = encode_event_message(header, &batch[..n], &mut self.msg)
                .is_ok_and(|len| sink.send(&self.msg[..len]));
            if !sent {
                // Lost on the way: the client hears of it as an overflow, ahead of its next
                // reply.
                self.overflows_sent[slot as usize] = overflows.wrapping_sub(1);
                self.again = true;
                break;
            }
            messages += 1;
        }
        Sent {
            messages,
            done: false,
        }
    }
}
