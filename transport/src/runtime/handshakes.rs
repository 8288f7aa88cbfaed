//! How much connection set-up work the control thread does in one turn of its loop.
//!
//! A TLS handshake step costs the control thread ~125 µs (answering a ClientHello takes a key
//! exchange and a signature; the client's second flight, a chain and a signature to verify),
//! and accepting a connection ~50 µs; serving a heartbeat takes a few. Done as the events came,
//! a burst of 3,500 ClientHellos delayed an established client's heartbeats by up to 339 ms
//! (`tests/tls_flood.rs`), for three reasons measured in that run: one turn accepted 1,861
//! connections in 95 ms; every later turn ran the 256 handshake steps its poll returned (32 ms
//! a turn); and epoll reports readiness in arrival order, so the heartbeat's event came only
//! after every handshake that had become ready before it — fourteen turns later.
//!
//! So in a turn the control thread:
//! 1. takes every event the poll holds (polling again while a batch comes back full), serving
//!    established connections at once and queueing a handshaking connection's readiness here;
//! 2. accepts at most [`ACCEPTS_PER_TURN`] connections per listener (a listener with more
//!    waiting stays marked, and the next turn's poll does not sleep);
//! 3. runs at most [`HANDSHAKES_PER_TURN`] queued handshake steps, oldest first; the rest wait
//!    for the next turn (counted in `tls_handshakes_deferred`), whose poll does not sleep.
//!
//! An established connection's request thus waits for at most one turn's rationed set-up work
//! (about 2 ms) however many connections are being set up, and the handshakes still go at the
//! speed the thread can do them. A handshake left waiting keeps its place under the connection
//! cap and its handshake timeout, counted from when it was accepted, so a flood larger than the
//! thread can serve ends in timeouts and evictions, as before, not in a growing queue.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use dlock_core::server::Counter;

use crate::tls::HandshakeRefusal;

/// Handshake steps one turn runs at most: ~1 ms of work at ~125 µs a step.
pub(super) const HANDSHAKES_PER_TURN: usize = 8;

/// Connections one turn accepts per listener at most: ~1.6 ms of work at ~50 µs each.
pub(super) const ACCEPTS_PER_TURN: usize = 32;

/// Connections (by index and generation) whose TLS handshake has a step to run, oldest first.
#[derive(Debug, Default)]
pub(super) struct HandshakeQueue {
    waiting: VecDeque<(usize, u32)>,
}

impl HandshakeQueue {
    /// Queues a step of connection `i` (generation `generation`). The caller queues a
    /// connection once until its step is taken (`Conn::handshake_queued`). Returns whether the
    /// step waits beyond the coming turn (for the `tls_handshakes_deferred` counter).
    pub(super) fn push(&mut self, i: usize, generation: u32) -> bool {
        self.waiting.push_back((i, generation));
        self.waiting.len() > HANDSHAKES_PER_TURN
    }

    /// Whether nothing waits (the next poll may sleep).
    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// This turn's steps: at most [`HANDSHAKES_PER_TURN`], oldest first. The caller skips a
    /// connection closed (or its index reused: another generation) since it was queued.
    pub(super) fn turn(&mut self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let n = self.waiting.len().min(HANDSHAKES_PER_TURN);
        self.waiting.drain(..n)
    }
}

/// Listeners with connections that may still wait to be accepted (edge-triggered: one event
/// per burst, so a turn that stopped at [`ACCEPTS_PER_TURN`] must come back without one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct AcceptsPending {
    pub(super) tcp: bool,
    pub(super) unix: bool,
}

impl AcceptsPending {
    /// Whether any listener may have connections waiting.
    pub(super) fn any(self) -> bool {
        self.tcp || self.unix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_runs_at_most_the_budget_however_many_wait() {
        let mut q = HandshakeQueue::default();
        let deferred = (0..100).filter(|&i| q.push(i, 1)).count();
        assert_eq!(deferred, 100 - HANDSHAKES_PER_TURN);
        let mut turns = 0;
        let mut served = Vec::new();
        while !q.is_empty() {
            let this: Vec<_> = q.turn().collect();
            assert!(!this.is_empty() && this.len() <= HANDSHAKES_PER_TURN);
            served.extend(this);
            turns += 1;
        }
        assert_eq!(turns, 100usize.div_ceil(HANDSHAKES_PER_TURN));
        assert_eq!(served.len(), 100, "every queued step runs once");
    }

    #[test]
    fn queued_steps_run_oldest_first_across_turns() {
        let mut q = HandshakeQueue::default();
        for i in 0..HANDSHAKES_PER_TURN + 3 {
            let _ = q.push(i, 7);
        }
        let first: Vec<_> = q.turn().map(|(i, _)| i).collect();
        assert_eq!(first, (0..HANDSHAKES_PER_TURN).collect::<Vec<_>>());
        // A newcomer queues behind the steps that waited.
        assert!(!q.push(99, 1), "four waiting: it runs in the coming turn");
        let second: Vec<_> = q.turn().collect();
        let mut expect: Vec<_> = (HANDSHAKES_PER_TURN..HANDSHAKES_PER_TURN + 3)
            .map(|i| (i, 7))
            .collect();
        expect.push((99, 1));
        assert_eq!(second, expect);
        assert!(q.is_empty());
    }

    #[test]
    fn a_step_within_the_budget_is_not_counted_as_deferred() {
        let mut q = HandshakeQueue::default();
        for i in 0..HANDSHAKES_PER_TURN {
            assert!(!q.push(i, 0));
        }
        assert!(q.push(HANDSHAKES_PER_TURN, 0));
    }
}

/// The server counter of each reason a TLS handshake is refused for.
pub(super) fn tls_counter(why: HandshakeRefusal) -> Counter {
    match why {
        HandshakeRefusal::NoClientCert => Counter::TlsNoClientCert,
        HandshakeRefusal::UnknownCa => Counter::TlsUnknownCa,
        HandshakeRefusal::Expired => Counter::TlsExpired,
        HandshakeRefusal::NotYetValid => Counter::TlsNotYetValid,
        HandshakeRefusal::Revoked => Counter::TlsRevoked,
        HandshakeRefusal::BadCertificate => Counter::TlsBadCertificate,
        HandshakeRefusal::ProtocolVersion => Counter::TlsProtocolVersion,
        HandshakeRefusal::NoCommonCipher => Counter::TlsNoCommonCipher,
        HandshakeRefusal::NotTls => Counter::TlsNotTls,
        HandshakeRefusal::Other => Counter::TlsOther,
    }
}

/// Logs refused TLS handshakes, at most one line per [`REFUSAL_LOG_INTERVAL`] with the number
/// left unlogged since the last: a peer that retries in a loop must not fill the log.
#[derive(Debug, Default)]
pub(super) struct RefusalLog {
    last: Option<Instant>,
    quiet: u64,
}

/// The least time between two log lines about refused handshakes.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

impl RefusalLog {
    pub(super) fn log(&mut self, why: HandshakeRefusal, error: &io::Error) {
        if self
            .last
            .is_some_and(|t| t.elapsed() < REFUSAL_LOG_INTERVAL)
        {
            self.quiet += 1;
            return;
        }
        tracing::warn!(reason = why.name(), %error, also_refused = self.quiet, "TLS handshake refused");
        self.last = Some(Instant::now());
        self.quiet = 0;
    }
}
