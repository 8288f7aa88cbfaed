//! What the data thread does when a turn found no work.

use std::str::FromStr;
use std::time::Duration;

use crate::patience::{Next, Patience};

/// The data thread's idle strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdleStrategy {
    /// Busy-poll (sockets with a zero-timeout poll): lowest latency, a core burned (the
    /// reference's behaviour).
    Spin,
    /// Poll, then spin with backoff and yield, then park in the data thread's poll (default).
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

/// How long an adaptive data thread stays awake (polling, then backing off and yielding) after
/// its last work before it parks. Requests arriving within it skip the ~50 µs wake-up of a
/// sleeping thread; yielding keeps the cost to other threads small on a small machine.
pub const ADAPTIVE_AWAKE: Duration = Duration::from_micros(500);

/// Per-thread idle state.
#[derive(Debug)]
pub(super) struct Idler {
    strategy: IdleStrategy,
    /// The current idle period, if the last turn found nothing.
    waiting: Option<Patience>,
}

impl Idler {
    pub(super) fn new(strategy: IdleStrategy) -> Self {
        Self {
            strategy,
            waiting: None,
        }
    }

    /// A turn did work: the next idle period starts over.
    pub(super) fn busy(&mut self) {
        self.waiting = None;
    }

    /// A turn found nothing, but work may arrive that cannot wake a parked thread (an RDMA
    /// SEND): poll, then back off and yield, but never park.
    #[cfg(feature = "rdma")]
    pub(super) fn idle_awake(&mut self) {
        match self.strategy {
            IdleStrategy::Spin => std::hint::spin_loop(),
            IdleStrategy::Adaptive | IdleStrategy::Park => {
                let waiting = self
                    .waiting
                    .get_or_insert_with(|| Patience::new(ADAPTIVE_AWAKE, None));
                if waiting.next() == Next::Sleep {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// A turn found nothing: waits a little (a pause, a backoff, a yield) and says whether to
    /// park now, in the data thread's one blocking wait (`runtime/data.rs`).
    #[must_use]
    pub(super) fn idle(&mut self) -> bool {
        match self.strategy {
            IdleStrategy::Spin => {
                std::hint::spin_loop();
                false
            }
            // Poll first (lowest latency), then back off and yield each turn, then park. Once
            // spent, the budget stays spent: a park that ends with nothing to do (a timeout)
            // parks again at once, until a turn finds work.
            IdleStrategy::Adaptive => {
                self.waiting
                    .get_or_insert_with(|| Patience::new(ADAPTIVE_AWAKE, None))
                    .next()
                    == Next::Sleep
            }
            IdleStrategy::Park => true,
        }
    }
}
