//! The simulated network: every message between a client and the server is a value with a
//! delivery time, kept in one queue ordered by (time, sequence number).
//!
//! Faults are decided by the sender (see `World::send`): a delay drawn per message (most short,
//! some long, which reorders a client's messages against everyone else's and its replies
//! against its later requests), a duplicated reply, and a lost message. Within one connection
//! both real transports (TCP, the shared-memory mailbox) deliver exactly once and in order, so a
//! loss is modelled as what TCP makes of it: the connection breaks, both ends notice, and every
//! message still in flight on it is gone (`conn` generations). Requests are never duplicated:
//! no dlock transport can, and the server does not deduplicate (a repeated unlock or FAA is a
//! second operation), so that fault would test a transport dlock does not have.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Which way a message goes and on which channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dir {
    /// Client to server, control channel.
    ControlRequest,
    /// Client to server, data channel.
    DataRequest,
    /// Server to client, control channel.
    ControlReply,
    /// Server to client, data channel.
    DataReply,
}

/// One message in flight.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Message {
    /// Simulated time of delivery (ms).
    pub at: u64,
    /// Send order, so equal times deliver deterministically.
    pub seq: u64,
    /// The sim client's index.
    pub client: usize,
    /// The client's connection generation when sent; a message of an older one is dropped.
    pub conn: u32,
    /// The server incarnation the message belongs to; messages of a crashed server are gone.
    pub incarnation: u32,
    pub dir: Dir,
    pub bytes: Vec<u8>,
}

/// Messages in flight, earliest first.
#[derive(Debug, Default)]
pub struct Net {
    queue: BinaryHeap<Reverse<Message>>,
    seq: u64,
}

impl Net {
    /// Queues a message for delivery at `m.at` (its `seq` is assigned here).
    pub fn push(&mut self, mut m: Message) {
        self.seq += 1;
        m.seq = self.seq;
        self.queue.push(Reverse(m));
    }

    /// The next message due at or before `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<Message> {
        if self.queue.peek().is_some_and(|Reverse(m)| m.at <= now) {
            return self.queue.pop().map(|Reverse(m)| m);
        }
        None
    }

    /// Messages in flight.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drops everything (the server crashed: its sockets and mailboxes are gone).
    pub fn clear(&mut self) {
        self.queue.clear();
    }
}
