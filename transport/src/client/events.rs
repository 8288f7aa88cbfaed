//! What the server told a client unasked (revokes of its cached grants), on the client's side:
//! one bounded queue per client, filled by whoever reads the client's data path and drained by
//! [`super::Client::poll_events`].
//!
//! Over shared memory the queue is the server's event ring in the region itself
//! ([`RingReader`]); over a stream the reader (the client's own, or the shared connection's
//! reader thread) files each event message ([`EventQueue::file_message`]). Either way the
//! client sees the same [`Event`]s, and an overflow — of the ring, the stream's buffer or this
//! queue — as one [`Event::Overflow`] before the events that still came: the client then
//! treats every lock it caches as revoked. The queue has the ring's size, so a stream client
//! can hold what a shared-memory one can; nothing is allocated after it is made.

use std::time::Duration;

use dlock_core::manager::Lost;
use dlock_core::proto::{Event, LockFlags, decode_event_message};
use dlock_core::table::{EVENT_RING_LEN, EventRing};
use dlock_core::time::duration_to_ms;

use super::error::{Error, Op};
use super::table::Entry;
use super::{Client, Connection};

impl<C: Connection> Client<C> {
    /// Hands every event the server sent this client unasked, and it has not seen yet, to
    /// `sink`, without waiting: [`Event::Revoke`] asks for a cached grant back (unlock it, or
    /// downgrade it when the mode wanted is shared) — its `fence` names the grant it was sent
    /// for, so a revoke whose fence is below the grant held now is stale — and
    /// [`Event::Overflow`] says events were lost, so every cached grant must be treated as
    /// revoked. Over shared memory this reads the client's event ring in the region; over a
    /// stream, what the connection's reader filed (and a quick look at its own connection).
    ///
    /// An [`Event::Overflow`] also comes, once, when revokes may have been lost on the way
    /// (`dlock_core::manager::trust`): after the data connection was opened again
    /// ([`Client::reinit`]) while a lock was asked for as cacheable, and, over a stream or RDMA,
    /// when a cacheable grant is held and no data request was answered within the revoke
    /// timeout ([`ClientConfig::revoke_timeout`](super::ClientConfig::revoke_timeout), the
    /// lease by default): a revoke still on its way may lapse, and the server hand the grant
    /// on, before it arrives. A shared-memory client reads its revokes where the server writes
    /// them, before the server starts counting their timeout, so it needs no such bound.
    pub fn poll_events(&mut self, mut sink: impl FnMut(Event)) -> Result<(), Error> {
        let (now, in_place) = (self.now_ms(), self.link.events_in_place());
        let lost = self
            .trust
            .take_overflow(now, self.revoke_timeout_ms(), in_place);
        let cacheable = |e: &Entry| e.local.ask.contains(LockFlags::CACHEABLE);
        let report = match lost {
            Some(Lost::Broken) => self.locks.iter().any(cacheable),
            Some(Lost::Stale) => self
                .locks
                .iter()
                .any(|e| cacheable(e) && e.local.state.held_mode().is_some()),
            None => false,
        };
        if report {
            sink(Event::Overflow);
        }
        let mut sink = |e: Event| {
            // The mutation puts back a client deaf to the overflows its connection reports.
            if !(e == Event::Overflow && dlock_core::mutated!(OverflowDropped)) {
                sink(e);
            }
        };
        self.link
            .poll_events(&mut sink)
            .map_err(|e| Op::PollEvents.io(e))
    }

    /// Whether a caller that holds no cached grant may leave its look at the events
    /// ([`Client::poll_events`]) for later: the data channel did not break since the last look
    /// and the trust bound has not passed (`dlock_core::manager::trust`), so the look owes no
    /// [`Event::Overflow`] report, and any revoke still unread is for a grant given back since,
    /// which the look would ignore. A stream's unread events wait in its queue (a full one
    /// is reported as an overflow when they are read, which is only coarser); a shared-memory
    /// client's, in its ring. Reads the clock only over a stream (a ring is always trusted).
    pub fn events_may_wait(&self) -> bool {
        let in_place = self.link.events_in_place();
        let now = if in_place { 0 } else { self.now_ms() };
        self.trust.trusted(now, self.revoke_timeout_ms(), in_place)
    }

    /// How long a cached grant is trusted past the last answered data request
    /// (`dlock_core::manager::trust`): what the server said at registration (protocol 7), or
    /// [`ClientConfig::revoke_timeout`](super::ClientConfig::revoke_timeout) when that is set —
    /// the shorter of the two when both are — else the lease, which is the server's default.
    /// (A routing link holds no cached grants: [`Connection::carries_events`].)
    pub fn revoke_timeout(&self) -> Duration {
        Duration::from_millis(self.revoke_timeout_ms().into())
    }

    fn revoke_timeout_ms(&self) -> u32 {
        let configured = duration_to_ms(self.cfg.revoke_timeout);
        match (configured, self.revoke_timeout_told_ms) {
            (0, 0) => duration_to_ms(self.lease),
            (0, told) => told,
            (mine, 0) => mine,
            (mine, told) => mine.min(told),
        }
    }
}

/// A bounded queue of events (module doc).
#[derive(Debug)]
pub(crate) struct EventQueue {
    entries: [Event; EVENT_RING_LEN],
    head: usize,
    len: usize,
    /// Events were lost since the queue was last drained.
    overflowed: bool,
}

impl Default for EventQueue {
    fn default() -> Self {
        Self {
            entries: [Event::Overflow; EVENT_RING_LEN],
            head: 0,
            len: 0,
            overflowed: false,
        }
    }
}

impl EventQueue {
    /// Queues `event`; a full queue drops it and remembers the loss.
    pub(crate) fn push(&mut self, event: Event) {
        if event == Event::Overflow || self.len == EVENT_RING_LEN {
            self.overflowed = true;
            return;
        }
        self.entries[(self.head + self.len) % EVENT_RING_LEN] = event;
        self.len += 1;
    }

    /// Queues every event of event message `msg`; one that does not decode counts as a loss
    /// (the server never sends one: only a broken peer could).
    pub(crate) fn file_message(&mut self, msg: &[u8]) {
        match decode_event_message(msg) {
            Ok(m) => m.events().for_each(|e| self.push(e)),
            Err(_) => self.overflowed = true,
        }
    }

    /// Hands every queued event to `sink`, a loss first as [`Event::Overflow`].
    pub(crate) fn drain(&mut self, sink: &mut dyn FnMut(Event)) {
        if core::mem::take(&mut self.overflowed) {
            sink(Event::Overflow);
        }
        while self.len > 0 {
            let e = self.entries[self.head];
            self.head = (self.head + 1) % EVENT_RING_LEN;
            self.len -= 1;
            sink(e);
        }
    }
}

/// A shared-memory client's reading of its ring in the region: the overflow count it saw last.
#[derive(Debug, Default)]
pub(crate) struct RingReader {
    overflows_seen: u64,
}

impl RingReader {
    /// Hands what `ring` holds to `sink`, a changed overflow count first as
    /// [`Event::Overflow`].
    pub(crate) fn drain(&mut self, ring: &EventRing<'_>, sink: &mut dyn FnMut(Event)) {
        let overflows = ring.overflows();
        if overflows != self.overflows_seen {
            self.overflows_seen = overflows;
            sink(Event::Overflow);
        }
        while let Some(e) = ring.pop() {
            sink(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::LockId;
    use dlock_core::Mode;

    fn revoke(n: u32) -> Event {
        Event::Revoke {
            lock: LockId::new(n, 1),
            wanted: Mode::Shared,
            fence: u64::from(n),
        }
    }

    #[test]
    fn a_full_queue_reports_its_loss_first_and_keeps_what_came() {
        let mut q = EventQueue::default();
        for n in 1..=EVENT_RING_LEN as u32 + 3 {
            q.push(revoke(n));
        }
        let mut got = Vec::new();
        q.drain(&mut |e| got.push(e));
        assert_eq!(got.len(), EVENT_RING_LEN + 1);
        assert_eq!((got[0], got[1]), (Event::Overflow, revoke(1)));
        q.file_message(b"not an event message");
        got.clear();
        q.drain(&mut |e| got.push(e));
        assert_eq!(got, vec![Event::Overflow], "a bad message is a loss");
    }
}
