//! The replies a client awaits on a stream connection, matched by message id: a stream server
//! answers in any order (a parked `lock()` when it is decided, the messages behind it
//! meanwhile), so each reply is filed under the message that echoes its id until its caller
//! takes it. Shared by a connection of the client's own (`link.rs`) and a shared one (`mux.rs`).

use dlock_core::proto::DATA_RESPONSE_WITH_VALUES_MAX;

/// Replies awaited at once: the pipeline's depth, plus room for messages the caller gave up on
/// (their late replies are dropped when they come).
const AWAITED_MAX: usize = 8;

/// A message whose reply is awaited, and the reply once read.
#[derive(Debug)]
struct Awaited {
    /// The link's ticket (0: the entry is free).
    ticket: u64,
    message_id: u16,
    /// The reply's length once it has arrived (0: not yet).
    len: usize,
    reply: [u8; DATA_RESPONSE_WITH_VALUES_MAX],
}

/// A fixed table of awaited replies (allocated once, with its connection).
#[derive(Debug)]
pub(crate) struct AwaitTable {
    entries: [Awaited; AWAITED_MAX],
}

impl AwaitTable {
    pub(crate) fn new() -> Self {
        Self {
            entries: std::array::from_fn(|_| Awaited {
                ticket: 0,
                message_id: 0,
                len: 0,
                reply: [0; DATA_RESPONSE_WITH_VALUES_MAX],
            }),
        }
    }

    /// Awaits the reply to `message_id` under `ticket`. When every entry is taken, the oldest
    /// is given up: it belongs to a message its caller stopped waiting for (a caller has at
    /// most the pipeline's depth in flight, fewer than the entries).
    pub(crate) fn expect(&mut self, ticket: u64, message_id: u16) {
        let k = match self.entries.iter().position(|a| a.ticket == 0) {
            Some(k) => k,
            None => (0..AWAITED_MAX)
                .min_by_key(|&k| self.entries[k].ticket)
                .unwrap_or(0),
        };
        let a = &mut self.entries[k];
        (a.ticket, a.message_id, a.len) = (ticket, message_id, 0);
    }

    /// Files `reply` under the awaited message with `message_id`; false if none awaits it (a
    /// late reply to a message given up on: dropped).
    pub(crate) fn file(&mut self, message_id: u16, reply: &[u8]) -> bool {
        let Some(a) = self
            .entries
            .iter_mut()
            .find(|a| a.ticket != 0 && a.len == 0 && a.message_id == message_id)
        else {
            return false;
        };
        a.reply[..reply.len()].copy_from_slice(reply);
        a.len = reply.len();
        true
    }

    /// The reply to `ticket` if it has arrived (the entry is freed).
    pub(crate) fn take(&mut self, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        let a = self
            .entries
            .iter_mut()
            .find(|a| a.ticket == ticket && ticket != 0 && a.len > 0)?;
        reply[..a.len].copy_from_slice(&a.reply[..a.len]);
        a.ticket = 0;
        Some(a.len)
    }

    /// Whether the reply to `ticket` has arrived and waits to be taken.
    pub(crate) fn arrived(&self, ticket: u64) -> bool {
        ticket != 0 && self.entries.iter().any(|a| a.ticket == ticket && a.len > 0)
    }

    /// Whether a reply to `ticket` is awaited (arrived or not).
    pub(crate) fn awaits(&self, ticket: u64) -> bool {
        ticket != 0 && self.entries.iter().any(|a| a.ticket == ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_go_to_the_message_that_echoes_their_id_in_any_order() {
        let mut t = AwaitTable::new();
        t.expect(1, 10);
        t.expect(2, 11);
        assert!(t.file(11, b"second"));
        assert!(!t.file(12, b"nobody"), "not awaited: dropped");
        let mut buf = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
        assert_eq!(t.take(1, &mut buf), None, "not arrived yet");
        assert!(t.arrived(2) && !t.arrived(1));
        assert_eq!(t.take(2, &mut buf), Some(6));
        assert_eq!(&buf[..6], b"second");
        assert!(!t.awaits(2) && t.awaits(1) && !t.arrived(2));
    }

    #[test]
    fn a_full_table_gives_up_the_oldest_message() {
        let mut t = AwaitTable::new();
        for k in 1..=AWAITED_MAX as u64 + 1 {
            t.expect(k, k as u16);
        }
        assert!(!t.awaits(1), "the oldest was given up");
        assert!((2..=AWAITED_MAX as u64 + 1).all(|k| t.awaits(k)));
    }
}
