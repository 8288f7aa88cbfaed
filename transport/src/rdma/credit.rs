//! The bookkeeping of event credit, with no verbs in it: how many event messages the server may
//! still send a client, when the client returns credit, what a channel does with the empty
//! messages that carry credit back and acknowledge it, and which of its send slots are free.
//! Pure records, tested without a device; `channel.rs`, `client.rs` and `server.rs` apply them
//! to a queue pair.
//!
//! # Why a credit return has a receive slot of its own
//!
//! The server keeps a client's events ahead of the reply to every request of it that it reads,
//! as on a stream (`runtime/events.rs`; the client's trust bound counts on it): a request whose
//! client has events waiting is not taken off the queue pair until they have gone
//! (`runtime/rdma.rs`). An event message needs credit — a receive slot the client has freed and
//! said so — so while the client's credit is used up its requests wait for it. The credit comes
//! back in the immediate data of the client's next SEND, and the server reads it when that SEND
//! completes, before it takes the message; so any SEND returns it, a waiting request or an
//! empty credit return.
//!
//! A client waiting for its replies takes the event messages ahead of them, and then returns
//! the credit they used with an empty SEND. That SEND may not wait for a reply slot: with every
//! request in flight waiting behind the events, no reply would ever free one. So a credit return
//! is not a message awaiting a reply. It has a budget of its own, [`CREDIT_RETURNS_INFLIGHT_MAX`]
//! (one): the server posts a receive slot for it besides one per request, reposts it the moment
//! the return completes (never queued behind requests), and acknowledges it with an empty SEND
//! into a receive slot the client keeps for that; the client sends no second return before the
//! first is acknowledged ([`ClientCredit::return_due`]). Counting every message that can be on
//! its way to a side, none finds its receive queue empty (which would stall the sender in RNR
//! retries):
//!
//! | to      | what may be on the way                                   | receive slots posted |
//! |---------|----------------------------------------------------------|----------------------|
//! | server  | a request per reply slot, one credit return              | 4 + 1                |
//! | client  | a reply per request, 2 event messages, one acknowledgement | 4 + 2 + 1          |
//!
//! and nothing waits for anything that waits for it: events wait for a credit return, which
//! waits only for the acknowledgement of the previous one and for a free send slot of the
//! client's; the server sends the acknowledgement whenever a send slot of its own is free.
//! Send slots free themselves as SENDs complete, whatever the peer does: a SEND completes
//! when it lands in a posted receive slot, not when the peer takes the message. Neither side
//! waits for a send slot in a poll: what finds none stays due, and the next poll tries again.

use super::{EVENT_MESSAGES_INFLIGHT_MAX, MESSAGES_INFLIGHT_MAX};

/// Send slots a channel has: one per message in flight.
pub(crate) const SEND_SLOTS: usize = MESSAGES_INFLIGHT_MAX;

/// Credit returns a client may have sent and not yet seen acknowledged (module doc).
pub const CREDIT_RETURNS_INFLIGHT_MAX: usize = 1;

/// Receive slots a server connection posts: one per request a client may have awaiting a reply,
/// and one per credit return on its way.
pub(crate) const SERVER_RECV_SLOTS: usize = MESSAGES_INFLIGHT_MAX + CREDIT_RETURNS_INFLIGHT_MAX;

/// Receive slots a client posts: one per reply it may await, one per event message the server
/// may send beyond what it was told, and one per acknowledgement of a credit return.
pub(crate) const CLIENT_RECV_SLOTS: usize =
    MESSAGES_INFLIGHT_MAX + EVENT_MESSAGES_INFLIGHT_MAX + CREDIT_RETURNS_INFLIGHT_MAX;

/// The server's count of a client's event slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EventCredit {
    /// Event messages sent, wrapping.
    pub(crate) sent: u32,
    /// `event_room` said `NoCredit` since credit last came back.
    pub(crate) blocked: bool,
}

impl EventCredit {
    /// Whether one more event message fits the client's slots, given `told`: the count of event
    /// messages the client last said it took. A count from a broken client that claims more
    /// than was sent wraps to a huge distance and blocks its own events, nobody else's.
    pub(crate) fn has_room(&self, told: u32) -> bool {
        (self.sent.wrapping_sub(told) as usize) < EVENT_MESSAGES_INFLIGHT_MAX
    }
}

/// A client's count of the event messages it has taken and told the server of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClientCredit {
    /// Event messages taken, wrapping: what every SEND tells the server.
    taken: u32,
    /// What the last SEND told the server.
    told: u32,
}

impl ClientCredit {
    /// An event message was taken (and its receive slot reposted).
    pub(crate) fn took_event(&mut self) {
        self.taken = self.taken.wrapping_add(1);
    }

    /// What a SEND tells the server in its immediate value: the event messages taken.
    pub(crate) fn taken(&self) -> u32 {
        self.taken
    }

    /// A SEND went that told the server `told` ([`Self::taken`] when it was filled).
    pub(crate) fn told(&mut self, told: u32) {
        self.told = told;
    }

    /// Whether the client, with `returning` credit returns unacknowledged, sends a credit
    /// return now: when the server may have run out of credit (it has sent every event message
    /// it may beyond what the last SEND told, and the client took them all) and none is on its
    /// way. It does not ask for a free reply slot (module doc: that wait could be for ever).
    #[must_use]
    pub(crate) fn return_due(&self, returning: usize) -> bool {
        self.taken.wrapping_sub(self.told) as usize >= EVENT_MESSAGES_INFLIGHT_MAX
            && returning < CREDIT_RETURNS_INFLIGHT_MAX
    }
}

/// Which of a channel's send slots a posted SEND still names: one is busy from its post until
/// its completion is polled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SendSlots([bool; SEND_SLOTS]);

impl SendSlots {
    /// A send slot no posted SEND names, if there is one.
    pub(crate) fn free(&self) -> Option<usize> {
        self.0.iter().position(|busy| !busy)
    }

    /// A SEND from slot `slot` was posted.
    pub(crate) fn posted(&mut self, slot: usize) {
        self.0[slot] = true;
    }

    /// The SEND from slot `slot` completed.
    pub(crate) fn completed(&mut self, slot: usize) {
        self.0[slot] = false;
    }
}

/// What an empty message (the channel's own: no `dlock-core` message is empty) means to the
/// side that receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EmptyMeans {
    /// A client's credit return, to acknowledge (the server's channels).
    CreditReturn,
    /// The acknowledgement of a credit return of ours (a client's channel).
    Acknowledgement,
}

/// A channel's empty messages: the ones it owes (acknowledgements) and the ones it awaits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Empties {
    means: EmptyMeans,
    /// Credit returns received and not yet acknowledged (a server's).
    owed: usize,
    /// Credit returns sent and not yet acknowledged (a client's).
    returning: usize,
}

impl Empties {
    pub(crate) const fn new(means: EmptyMeans) -> Empties {
        Empties {
            means,
            owed: 0,
            returning: 0,
        }
    }

    /// An empty message came (its receive slot is reposted at once, whatever it means).
    pub(crate) fn received(&mut self) {
        match self.means {
            EmptyMeans::CreditReturn => self.owed += 1,
            // An acknowledgement of nothing (a broken server) frees nothing.
            EmptyMeans::Acknowledgement => self.returning = self.returning.saturating_sub(1),
        }
    }

    /// An acknowledgement to send, if one is owed; it is then counted sent.
    #[must_use]
    pub(crate) fn take_owed(&mut self) -> bool {
        let owed = self.owed > 0;
        self.owed -= usize::from(owed);
        owed
    }

    /// A credit return was sent.
    pub(crate) fn returned(&mut self) {
        self.returning += 1;
    }

    /// Credit returns sent and not yet acknowledged.
    pub(crate) fn returning(&self) -> usize {
        self.returning
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_credit_allows_the_client_s_event_slots_and_no_more() {
        let mut c = EventCredit::default();
        for _ in 0..EVENT_MESSAGES_INFLIGHT_MAX {
            assert!(c.has_room(0));
            c.sent += 1;
        }
        assert!(
            !c.has_room(0),
            "a slot the client has not freed was counted free"
        );
        assert!(c.has_room(1), "one message taken frees one slot");
        // The counts wrap: 2^32 messages later the same rule holds.
        let c = EventCredit {
            sent: 0,
            blocked: false,
        };
        assert!(c.has_room(u32::MAX));
        assert!(!c.has_room(u32::MAX - 1));
        // A client claiming more than it was sent blocks only itself.
        assert!(!c.has_room(5));
    }

    #[test]
    fn a_credit_return_is_due_when_the_server_may_be_out_of_credit_and_none_is_on_its_way() {
        let max = EVENT_MESSAGES_INFLIGHT_MAX as u32;
        let due = |taken, told, returning| ClientCredit { taken, told }.return_due(returning);
        assert!(!due(max - 1, 0, 0), "the server has credit left");
        assert!(due(max, 0, 0));
        assert!(due(max + 3, 0, 0));
        assert!(!due(max, max, 0), "told already");
        assert!(
            !due(max, 0, CREDIT_RETURNS_INFLIGHT_MAX),
            "a second return before the first was acknowledged"
        );
        // The counts wrap.
        assert!(due(max - 1, u32::MAX, 0));
    }

    #[test]
    fn a_server_owes_one_acknowledgement_per_credit_return_and_a_client_awaits_one_per_return() {
        let mut server = Empties::new(EmptyMeans::CreditReturn);
        assert!(!server.take_owed());
        server.received();
        server.received();
        assert!(server.take_owed());
        assert!(server.take_owed());
        assert!(!server.take_owed(), "acknowledged a return twice");
        let mut client = Empties::new(EmptyMeans::Acknowledgement);
        client.returned();
        assert_eq!(client.returning(), 1);
        client.received();
        assert_eq!(client.returning(), 0);
        client.received();
        assert_eq!(client.returning(), 0, "an acknowledgement of nothing");
        assert!(!client.take_owed(), "a client acknowledges nothing");
    }

    /// Posts a SEND from a free slot of `sends`; the slot, busy until [`SendSlots::completed`].
    fn post(sends: &mut SendSlots, what: &str) -> usize {
        let slot = sends
            .free()
            .unwrap_or_else(|| panic!("{what} found no send slot"));
        sends.posted(slot);
        slot
    }

    #[test]
    fn a_send_slot_is_busy_from_its_post_to_its_completion() {
        let mut sends = SendSlots::default();
        let posted: Vec<usize> = (0..SEND_SLOTS)
            .map(|_| post(&mut sends, "a send"))
            .collect();
        assert_eq!(
            posted,
            (0..SEND_SLOTS).collect::<Vec<_>>(),
            "a slot was used twice"
        );
        assert_eq!(sends.free(), None);
        sends.completed(2);
        assert_eq!(sends.free(), Some(2));
    }

    /// The one exchange that could wait for ever (module doc), played on the records the
    /// channels keep — the server's credit, both sides' empty messages and send slots, the
    /// client's count of events taken and told — with each side's posted receive slots
    /// counted: a client with every request in flight, the server holding them behind event
    /// messages it has no credit for. The credit return must go without a reply slot, find a
    /// send slot of the client's and a receive slot of the server's, and let the events and
    /// then the replies go.
    ///
    /// The messages that have landed in a side's receive slots and are not taken yet are
    /// counted by hand (`at_server`, `at_client`): which slots are posted is the device's to
    /// know, and the channel's own record of them (`Channel::ready`) lives with its queue
    /// pair, which needs a device to be made.
    #[test]
    fn a_client_with_every_request_held_behind_its_events_returns_credit_and_is_answered() {
        let mut server_credit = EventCredit::default();
        let mut server_empties = Empties::new(EmptyMeans::CreditReturn);
        let mut server_sends = SendSlots::default();
        let mut client = ClientCredit::default();
        let mut client_empties = Empties::new(EmptyMeans::Acknowledgement);
        let mut client_sends = SendSlots::default();
        // The immediate value of the last SEND the server received (`Channel::peer_imm`).
        let mut peer_imm = 0u32;
        let (mut at_server, mut at_client) = (0usize, 0usize);
        // The server sends the event messages its credit allows; each SEND completes as it
        // lands in a receive slot of the client's.
        while server_credit.has_room(peer_imm) {
            let slot = post(&mut server_sends, "an event message");
            server_credit.sent += 1;
            at_client += 1;
            server_sends.completed(slot);
        }
        // The client sends a request per reply slot, each telling the event messages it took
        // (none yet); every send slot is then busy until the requests land.
        let requests: Vec<usize> = (0..MESSAGES_INFLIGHT_MAX)
            .map(|_| {
                let slot = post(&mut client_sends, "a request");
                client.told(client.taken());
                peer_imm = client.taken();
                at_server += 1;
                slot
            })
            .collect();
        assert_eq!(client_sends.free(), None);
        assert!(at_server <= SERVER_RECV_SLOTS && at_client <= CLIENT_RECV_SLOTS);
        // They land in the server's receive slots, so their SENDs complete although the server
        // holds them: its events wait for credit.
        for slot in requests {
            client_sends.completed(slot);
        }
        assert!(!server_credit.has_room(peer_imm));
        // The client, waiting for its replies, takes the event messages ahead of them.
        for _ in 0..at_client {
            client.took_event();
        }
        at_client = 0;
        assert!(
            client.return_due(client_empties.returning()),
            "no credit return with every reply slot in flight: the requests wait for ever"
        );
        let slot = post(&mut client_sends, "the credit return");
        let told = client.taken();
        client.told(told);
        client_empties.returned();
        at_server += 1;
        assert!(
            at_server <= SERVER_RECV_SLOTS,
            "the credit return found no receive slot"
        );
        assert!(
            !client.return_due(client_empties.returning()),
            "a second return before the first was acknowledged"
        );
        // Its completion carries the count; the server's drain reposts its slot, owes an
        // acknowledgement and sends it from a free send slot.
        client_sends.completed(slot);
        peer_imm = told;
        at_server -= 1;
        server_empties.received();
        assert!(server_credit.has_room(peer_imm), "the events may go now");
        let slot = post(&mut server_sends, "the acknowledgement");
        assert!(server_empties.take_owed());
        at_client += 1;
        server_sends.completed(slot);
        // The events still waiting go, then the held requests are answered.
        while server_credit.has_room(peer_imm) {
            let slot = post(&mut server_sends, "an event message");
            server_credit.sent += 1;
            at_client += 1;
            server_sends.completed(slot);
        }
        for _ in 0..MESSAGES_INFLIGHT_MAX {
            let slot = post(&mut server_sends, "a reply");
            at_server -= 1;
            at_client += 1;
            server_sends.completed(slot);
        }
        assert_eq!(at_server, 0);
        assert!(at_client <= CLIENT_RECV_SLOTS, "a message found no slot");
        // The acknowledgement (the channel's own, taken at a drain) and the event messages let
        // the client return the next credit.
        client_empties.received();
        for _ in 0..EVENT_MESSAGES_INFLIGHT_MAX {
            client.took_event();
        }
        assert!(client.return_due(client_empties.returning()));
    }
}
