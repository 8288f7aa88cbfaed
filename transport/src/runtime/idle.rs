//! What the data thread does when a turn found no work.

use std::str::FromStr;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::shm::ShmHeader;

/// The data thread's idle strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdleStrategy {
    /// Busy-poll: lowest latency, a core burned (the reference's behaviour).
    Spin,
    /// Spin with backoff, then yield, then park on the region's futex word (default).
    #[default]
    Adaptive,
    /// Park as soon as a turn finds nothing: least CPU, a wake-up (~50 µs) per idle period.
    Park,
}

impl FromStr for IdleStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "spin" => Ok(IdleStrategy::Spin),
            "adaptive" => Ok(IdleStrategy::Adaptive),
            "park" => Ok(IdleStrategy::Park),
            other => Err(format!(
                "unknown idle strategy {other:?} (spin, adaptive, park)"
            )),
        }
    }
}

/// Per-thread idle state.
#[derive(Debug)]
pub(super) struct Idler {
    strategy: IdleStrategy,
    backoff: Backoff,
}

impl Idler {
    pub(super) fn new(strategy: IdleStrategy) -> Self {
        Self {
            strategy,
            backoff: Backoff::new(),
        }
    }

    /// A turn did work: start the backoff over.
    pub(super) fn busy(&mut self) {
        self.backoff.reset();
    }

    /// A turn found nothing: wait a little, or park until woken or `timeout`.
    pub(super) fn idle(
        &mut self,
        header: &ShmHeader,
        timeout: Duration,
        has_work: impl Fn() -> bool,
    ) {
        match self.strategy {
            IdleStrategy::Spin => std::hint::spin_loop(),
            IdleStrategy::Adaptive if !self.backoff.is_completed() => self.backoff.snooze(),
            IdleStrategy::Adaptive | IdleStrategy::Park => header.park_server(timeout, has_work),
        }
    }
}
