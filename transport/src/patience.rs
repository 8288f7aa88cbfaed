//! How a thread waits for something that normally happens within microseconds — a reply in its
//! mailbox, a request at the data thread: poll, then back off and yield, then sleep.
//!
//! # Why not `crossbeam_utils::Backoff` alone
//!
//! `Backoff::snooze` spins 1, 2, 4, … 64 `pause`s between checks before it starts yielding. A
//! `pause` takes ~140 cycles on recent Xeons, so by its sixth step a waiter checks only every
//! ~3 µs and sees an event that arrived just after a check that much late — more than a whole
//! shared-memory round trip (~1 µs). So a waiter first *polls*: one `pause` between checks for
//! [`POLL`], reading the clock only every [`CLOCK_EVERY`] checks. Only then does `Backoff` take
//! over (spin, then yield) until the caller's `awake` budget is spent, and then the caller sleeps
//! on its futex.

use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

/// How long a waiter polls before it backs off: a 31-command round trip takes ~5 µs here, a
/// one-command one ~1 µs; polling a few times that catches both at their arrival.
pub const POLL: Duration = Duration::from_micros(20);

/// Checks between two clock reads while polling (a clock read costs ~20 ns, a `pause` ~50 ns).
const CLOCK_EVERY: u32 = 16;

/// What a waiter does after a check found nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Check again (the pause or yield has been taken).
    Again,
    /// The awake budget is spent: sleep (on a futex), then check again.
    Sleep,
    /// The deadline passed.
    TimedOut,
}

/// One wait's state: create it when the wait starts, call [`Patience::next`] after each check
/// that found nothing.
#[derive(Debug)]
pub struct Patience {
    /// When the wait started: read at the first clock read (after [`CLOCK_EVERY`] checks), so a
    /// wait that ends within them never reads the clock.
    started: Option<Instant>,
    /// Stay awake (poll, then back off) for this long before sleeping; at least [`POLL`].
    awake: Duration,
    deadline: Option<Instant>,
    checks: u32,
    polling: bool,
    backoff: Backoff,
}

impl Patience {
    /// A wait that stays awake for `awake` (at least [`POLL`]) and gives up at `deadline`.
    pub fn new(awake: Duration, deadline: Option<Instant>) -> Self {
        Self {
            started: None,
            awake: awake.max(POLL),
            deadline,
            checks: 0,
            polling: true,
            backoff: Backoff::new(),
        }
    }

    /// After a check found nothing: pauses (or yields) and says whether to check again, sleep
    /// or give up.
    #[inline]
    pub fn next(&mut self) -> Next {
        self.checks = self.checks.wrapping_add(1);
        if self.polling {
            std::hint::spin_loop();
            if !self.checks.is_multiple_of(CLOCK_EVERY) {
                return Next::Again;
            }
        }
        let now = Instant::now();
        if self.deadline.is_some_and(|d| now >= d) {
            return Next::TimedOut;
        }
        let waited = now.duration_since(*self.started.get_or_insert(now));
        if self.polling {
            self.polling = waited < POLL;
            return Next::Again;
        }
        if waited < self.awake {
            self.backoff.snooze();
            Next::Again
        } else {
            Next::Sleep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_then_backs_off_then_sleeps() {
        let started = Instant::now();
        let mut p = Patience::new(Duration::from_millis(2), None);
        let mut polls = 0u32;
        loop {
            match p.next() {
                Next::Again if p.polling => polls += 1,
                Next::Again => {}
                Next::Sleep => break,
                Next::TimedOut => panic!("no deadline was set"),
            }
        }
        let waited = started.elapsed();
        // Polling checks without reading the clock in between (however slowly this thread
        // runs), and the whole wait lasted the budget.
        assert!(polls >= CLOCK_EVERY - 1, "polled only {polls} times");
        assert!(waited >= Duration::from_millis(2), "slept after {waited:?}");
    }

    #[test]
    fn a_passed_deadline_ends_the_wait() {
        let deadline = Instant::now() + Duration::from_micros(200);
        let mut p = Patience::new(Duration::from_secs(10), Some(deadline));
        let outcome = loop {
            match p.next() {
                Next::Again => continue,
                other => break other,
            }
        };
        assert_eq!(outcome, Next::TimedOut);
        assert!(Instant::now() >= deadline);
    }
}
