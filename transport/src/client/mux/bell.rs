//! A blocked caller's bell: a futex word that remembers being rung, so ringing a caller that
//! is not asleep costs no system call, and a caller spins briefly before it sleeps.
//!
//! A condition variable (what the bell was) makes every ring a `FUTEX_WAKE`, and every woken
//! caller take the hub's lock again on its way out of the wait, against the reader filing the
//! rest of the burst. On a small machine with a thread per worker those wake-ups were the
//! client's largest cost. Here the state says whether anybody sleeps:
//!
//! | state | meaning | `ring` | `wait` |
//! |---|---|---|---|
//! | `QUIET` | not rung since the last wait | → `RUNG`, no call | spins, then → `ASLEEP` and sleeps |
//! | `RUNG` | rung, not yet seen | stays | → `QUIET`, returns at once |
//! | `ASLEEP` | its caller sleeps in `FUTEX_WAIT` | → `RUNG`, `FUTEX_WAKE` | — |
//!
//! A ring is never lost: it is a state, not an event, so a caller that lets go of the hub's
//! lock before it waits (it must: it sleeps without it) still sees a ring made in between.
//! Every ring follows a change made under the hub's lock, and a waiter looks at the hub's state
//! again under that lock after every wait, so the bell itself orders nothing: a ring only
//! ends a wait early. A stale ring (one that came after its caller stopped waiting, by a
//! timeout) ends the next wait at once, which the caller takes as a spurious wake-up: it looks
//! and waits again.

use std::time::{Duration, Instant};

use crate::futex;
use crate::sync::{AtomicU32, Ordering};

const QUIET: u32 = 0;
const RUNG: u32 = 1;
const ASLEEP: u32 = 2;

/// Looks with a pause instruction before a caller yields or sleeps: a ring already on its way
/// (the reader filing the burst this caller's reply is in) costs no system call at all.
const SPINS_BUSY: u32 = 8;
/// The most yields a caller makes, looking at its bell after each, before it sleeps.
const YIELDS_MAX: u32 = 16;
/// The yields a caller that stopped yielding tries again with, every [`PROBE_EVERY`] sleeps.
const YIELDS_PROBE: u32 = 4;
/// Sleeps between probes while yielding does not pay.
const PROBE_EVERY: u32 = 32;
/// A yield that kept the caller off the processor this long gave it to another process for a
/// time slice (the workers and the reader take far less): yielding costs here.
const YIELD_OVERRUN: Duration = Duration::from_micros(500);

/// A blocked caller's bell (see the module doc).
#[derive(Debug)]
pub struct Bell {
    state: AtomicU32,
    /// How many times its caller yields before it sleeps, learnt from the waits before (see
    /// [`Bell::spin`]); read and written by that caller alone.
    yields: std::sync::atomic::AtomicU32,
    /// Sleeps since yielding stopped paying, to time the next probe.
    unyielding: std::sync::atomic::AtomicU32,
}

impl Default for Bell {
    /// A quiet bell whose caller starts with a probe's budget.
    fn default() -> Self {
        Self {
            state: AtomicU32::new(QUIET),
            yields: YIELDS_PROBE.into(),
            unyielding: 0.into(),
        }
    }
}

impl Bell {
    /// Ends the caller's wait, or its next one: wakes it if it sleeps.
    pub(super) fn ring(&self) {
        // Release/Acquire on the word hand nothing over (the hub's lock does); AcqRel keeps the
        // ring and the sleeper's `ASLEEP` in one order with the sleep itself, which the kernel
        // checks against the word atomically.
        if self.state.swap(RUNG, Ordering::AcqRel) == ASLEEP {
            futex::wake_private(&self.state, 1);
        }
    }

    /// Waits until rung (a ring since the last wait counts) or `deadline`, spinning briefly
    /// first. May return early: the caller looks at the hub's state again either way.
    pub(super) fn wait(&self, deadline: Option<Instant>) {
        if !self.spin() {
            self.sleep(deadline);
        }
        // The ring is seen: the next wait waits for a new one. A ring landing between the look
        // and this store is for a change the caller is about to look at under the hub's lock.
        self.state.store(QUIET, Ordering::Relaxed);
    }

    /// Looks at the word until rung or its yielding budget is spent; whether it was rung.
    ///
    /// Yielding pays when the caller's reply comes while the threads that make it run in its
    /// stead — on a machine whose cores the workers and the reader share, the common case —
    /// and spares the sleep and the wake-up. It costs when other processes take the processor
    /// a yield gives away: the caller then gets it back a time slice later, and the callers
    /// woken with it wait for it to write the burst's requests (`hub.rs`). So the budget, in
    /// yields, is learnt, as an adaptive mutex learns its spin: a wait rung within the first
    /// half of it grows it by one, a wait that had to sleep, or a yield that overran
    /// [`YIELD_OVERRUN`], halves it, down to nothing; a caller that stopped yielding probes
    /// with a small budget now and then.
    ///
    /// Measured with 64 worker threads on one `Mux` (2 cores, load average about 4 from other
    /// work): lock+unlock 3.9 -> 0.1-0.4 futex calls and 19 -> 9-12 µs of client CPU per
    /// operation, 2.5 times the operations. With two busy processes added, yielding mostly
    /// stops and throughput stayed within the noise of sleeping at once (between 0.7 and 2.7
    /// times it over four runs). A 200 µs overrun stopped yielding at 64 workers even at that
    /// moderate load, and a fixed 16 yields lost tenfold under heavy load.
    fn spin(&self) -> bool {
        for _ in 0..SPINS_BUSY {
            // Acquire: pairs with the ring's swap (see `ring`).
            if self.state.load(Ordering::Acquire) == RUNG {
                return true;
            }
            if cfg!(dlock_loom) {
                // The models explore the sleep; spinning would only multiply their states.
                return false;
            }
            std::hint::spin_loop();
        }
        // Relaxed: the budget is this caller's own; nothing is published through it.
        let mut budget = self.yields.load(Ordering::Relaxed);
        if budget == 0 {
            let sleeps = self.unyielding.fetch_add(1, Ordering::Relaxed) + 1;
            if sleeps < PROBE_EVERY {
                return false;
            }
            self.unyielding.store(0, Ordering::Relaxed);
            budget = YIELDS_PROBE;
        }
        for k in 1..=budget {
            let before = Instant::now();
            std::thread::yield_now();
            if before.elapsed() > YIELD_OVERRUN {
                // Rung or not, the processor went elsewhere: stop yielding for a while.
                self.yields.store(budget / 2, Ordering::Relaxed);
                return self.state.load(Ordering::Acquire) == RUNG;
            }
            if self.state.load(Ordering::Acquire) == RUNG {
                // Rung within the budget: allow a little more next time.
                let grown = if k * 2 > budget { budget + 1 } else { budget };
                self.yields.store(grown.min(YIELDS_MAX), Ordering::Relaxed);
                return true;
            }
        }
        self.yields.store(budget / 2, Ordering::Relaxed);
        false
    }

    /// Sleeps until rung or `deadline`.
    fn sleep(&self, deadline: Option<Instant>) {
        loop {
            // Acquire on failure: a ring seen here is seen as in `spin`.
            match self
                .state
                .compare_exchange(QUIET, ASLEEP, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {}
                Err(RUNG) => return,
                Err(_) => {} // asleep already: a spurious wake-up or a timeout, looked at below
            }
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return,
                },
            };
            futex::wait_private(&self.state, ASLEEP, timeout);
        }
    }
}

#[cfg(all(test, not(dlock_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_ring_before_the_wait_ends_it_at_once() {
        let bell = Bell::default();
        bell.ring();
        let start = Instant::now();
        bell.wait(Some(Instant::now() + Duration::from_secs(10)));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the ring was kept"
        );
        assert_eq!(bell.state.load(Ordering::Relaxed), QUIET, "and seen");
    }

    #[test]
    fn a_sleeping_caller_is_woken_by_a_ring() {
        let bell = Arc::new(Bell::default());
        let b = Arc::clone(&bell);
        let sleeper = std::thread::spawn(move || {
            let start = Instant::now();
            b.wait(None);
            start.elapsed()
        });
        while bell.state.load(Ordering::Acquire) != ASLEEP {
            std::thread::yield_now();
        }
        bell.ring();
        let slept = sleeper.join().unwrap();
        assert!(slept < Duration::from_secs(60), "woken: {slept:?}");
    }

    #[test]
    fn a_caller_whose_waits_all_end_asleep_stops_yielding() {
        let bell = Bell::default();
        for _ in 0..3 {
            // Nobody rings: every wait spends its yields and sleeps to its deadline.
            bell.wait(Some(Instant::now() + Duration::from_millis(1)));
        }
        assert_eq!(bell.yields.load(Ordering::Relaxed), 0, "4, 2, 1, then none");
    }

    #[test]
    fn a_wait_with_no_ring_ends_at_its_deadline() {
        let bell = Bell::default();
        bell.wait(Some(Instant::now() + Duration::from_millis(20)));
        assert_eq!(bell.state.load(Ordering::Relaxed), QUIET);
    }
}
