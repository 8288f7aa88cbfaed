//! How long a client may believe in its cached grants without hearing from the server over the
//! channel its revokes travel on: the client's side of the revoke timeout.
//!
//! The server takes back a cached grant whose holder ignores a revoke for the revoke timeout
//! ([`super::Timing::revoke_timeout_ms`], the holder's lease by default) and may grant it to
//! another client at once. A revoke can be late — a slow connection, a holder that does not
//! read its events — while heartbeats (on the control connection) keep the lease alive, and
//! then the holder would go on handing the grant to local users after the server handed it on:
//! two holders. Three rules close it, each checked by the model simulator's oracle
//! (`tests/src/sim/model`) before it was built here:
//!
//! 1. **The trust bound.** A data channel is in order, and the server puts a client's waiting
//!    events ahead of the reply to each request it reads (the transport's `runtime/events.rs`),
//!    so a revoke the server sent before it read a request arrives before that request's reply. If the last data request answered
//!    was sent at `anchor`, every revoke not yet seen was sent after `anchor` and lapses no
//!    earlier than `anchor + timeout`: until then a cached grant is safe to use locally. Past
//!    it the client treats every cached grant as revoked, as at an event-ring overflow — idle
//!    ones go back at once, busy ones when their users are done — so the next acquisition asks
//!    the server, whose reply renews the anchor. (A client busy on the wire renews it with
//!    every reply; only one that lived on its cache alone for a whole revoke timeout pays.)
//! 2. **A broken channel loses revokes:** every cached grant held when it broke counts as
//!    revoked, like an overflow, and the anchor is gone until the new channel answers.
//! 3. **No revoked grant is re-claimed after a failover** (it may have lapsed on the old
//!    server and been granted to another): the client's recovery forgets it instead. A
//!    failover breaks the channel, so by rule 2 this is every cached grant.
//!
//! Rules 1 and 2 are this record, which reports an overflow ([`Trust::take_overflow`]) for
//! the client to hand to whatever drives its cached locks, once per broken channel and once
//! per lapse of the bound. It reads no clock: the caller passes its own milliseconds, the same
//! clock `anchor` was read on. Where revokes do not travel on a channel — a shared-memory
//! client's event ring is in the region, written before the server starts counting the revoke
//! timeout, and read by the client before every local acquisition — the caller passes
//! `in_place`, and only a broken channel (a new registration) is reported.
//!
//! | state                          | event                        | after                           |
//! |--------------------------------|------------------------------|---------------------------------|
//! | any                            | `answered(sent)`             | anchor `max(anchor, sent)`, stale report re-armed |
//! | any                            | `broken()`                   | anchor gone, a broken report owed |
//! | a broken report owed           | `take_overflow`              | `Some(Broken)`, report cleared  |
//! | `now < anchor + timeout`       | `take_overflow`              | `None`                          |
//! | past the bound, not yet told   | `take_overflow` (not `in_place`) | `Some(Stale)`, told          |
//! | past the bound, told           | `take_overflow`              | `None` (until a new answer)     |

/// Why the client must treat every cached grant as revoked ([`Trust::take_overflow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The channel broke: every grant held cached when it broke (rule 2), whatever the client
    /// did with its records since (its recovery may have forgotten them: rule 3).
    Broken,
    /// The trust bound passed (rule 1): the cached grants held now.
    Stale,
}

/// The client's trust in the cached grants it holds over one data channel (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    /// When (the caller's ms) the last data request answered on this channel was sent; `None`
    /// before the first answer, and after the channel broke.
    anchor_ms: Option<u64>,
    /// The channel broke since the last report: revokes on it may have been lost.
    broken: bool,
    /// The bound's lapse was reported, and no answer came since.
    told: bool,
}

impl Trust {
    /// A channel nothing was answered on yet.
    #[inline]
    pub const fn new() -> Trust {
        Trust {
            anchor_ms: None,
            broken: false,
            told: false,
        }
    }

    /// A data request sent at `sent_ms` was answered on this channel: every revoke the server
    /// sent before it read that request has arrived.
    #[inline]
    pub fn answered(&mut self, sent_ms: u64) {
        self.anchor_ms = Some(self.anchor_ms.map_or(sent_ms, |a| a.max(sent_ms)));
        self.told = false;
    }

    /// The channel broke (the client opened a new one): revokes on the old one may be lost.
    #[inline]
    pub fn broken(&mut self) {
        (self.anchor_ms, self.broken, self.told) = (None, true, false);
    }

    /// Whether the cached grants held now may be used locally at `now_ms`, revokes lapsing
    /// `timeout_ms` after they are sent (rule 1; a revoke that travels `in_place` is always
    /// seen in time).
    #[inline]
    pub const fn trusted(&self, now_ms: u64, timeout_ms: u32, in_place: bool) -> bool {
        if self.broken {
            return false;
        }
        if in_place {
            return true;
        }
        match self.anchor_ms {
            Some(a) => now_ms < a.saturating_add(timeout_ms as u64),
            None => false,
        }
    }

    /// Whether (and why) the client must treat every cached grant as revoked now (an
    /// overflow): the channel broke, or the bound passed (module doc's table). Reports each
    /// once.
    #[inline]
    pub fn take_overflow(&mut self, now_ms: u64, timeout_ms: u32, in_place: bool) -> Option<Lost> {
        if core::mem::take(&mut self.broken) {
            // The broken report stands for the stale one too, until the new channel answers.
            self.told = true;
            return Some(Lost::Broken);
        }
        if self.told || self.trusted(now_ms, timeout_ms, in_place) || crate::mutated!(TrustNoBound)
        {
            return None;
        }
        self.told = true;
        Some(Lost::Stale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: u32 = 100;

    #[test]
    fn a_grant_is_trusted_for_the_timeout_after_the_last_answered_send_and_reported_once_past_it() {
        let mut t = Trust::new();
        t.answered(1_000);
        // An answer to an older request does not move the anchor back.
        t.answered(900);
        assert!(t.trusted(1_099, TIMEOUT, false));
        assert_eq!(t.take_overflow(1_099, TIMEOUT, false), None);
        assert!(
            !t.trusted(1_100, TIMEOUT, false),
            "a revoke sent at 1000 lapses at 1100"
        );
        assert_eq!(t.take_overflow(1_100, TIMEOUT, false), Some(Lost::Stale));
        assert_eq!(
            t.take_overflow(5_000, TIMEOUT, false),
            None,
            "reported once"
        );
        t.answered(5_000);
        assert!(t.trusted(5_050, TIMEOUT, false));
        assert_eq!(
            t.take_overflow(5_100, TIMEOUT, false),
            Some(Lost::Stale),
            "re-armed by the answer"
        );
    }

    #[test]
    fn nothing_answered_is_not_trusted_over_a_channel() {
        let mut t = Trust::new();
        assert!(!t.trusted(0, TIMEOUT, false));
        assert_eq!(t.take_overflow(0, TIMEOUT, false), Some(Lost::Stale));
        assert!(
            Trust::new().trusted(0, TIMEOUT, true),
            "a ring in place is read in time"
        );
    }

    #[test]
    fn a_broken_channel_is_reported_once_whatever_the_transport_and_drops_the_anchor() {
        for in_place in [false, true] {
            let mut t = Trust::new();
            t.answered(1_000);
            t.broken();
            assert!(!t.trusted(1_001, TIMEOUT, in_place));
            assert_eq!(
                t.take_overflow(1_001, TIMEOUT, in_place),
                Some(Lost::Broken)
            );
            assert_eq!(
                t.take_overflow(1_002, TIMEOUT, in_place),
                None,
                "{in_place}: once"
            );
            assert_eq!(t.trusted(1_002, TIMEOUT, in_place), in_place);
            t.answered(1_010);
            assert!(t.trusted(1_109, TIMEOUT, in_place));
        }
    }

    #[test]
    fn a_shared_memory_ring_needs_no_bound() {
        let mut t = Trust::new();
        t.answered(0);
        assert!(t.trusted(u64::MAX, TIMEOUT, true));
        assert_eq!(t.take_overflow(u64::MAX, TIMEOUT, true), None);
    }
}
