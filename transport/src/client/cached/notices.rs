//! The queue of revoke notices a cached client keeps until its engine takes them: one for
//! [`super::CachedLocks`] ([`super::Revoked`]) and one per client of the C ABI
//! (`engine-glue`'s `dlock_revoke`), so that both fold an engine that fell behind the same way.
//!
//! The queue is bounded ([`NOTICES_MAX`], allocated once): when it is full, what it holds is
//! replaced by the one notice that says "every lock", which the engine answers by flushing
//! everything it caches — the handle gives every lock back anyway when it acts on an overflow,
//! and an engine that did not read its notices for that long has little to gain from the list.
//! Two "every lock" notices in a row say no more than one, so the second is not queued.

use std::collections::VecDeque;

use dlock_core::table::EVENT_RING_LEN;

/// Notices kept before they are folded into one "every lock" notice.
pub const NOTICES_MAX: usize = 4 * EVENT_RING_LEN;

/// A bounded queue of notices of type `T`, `all` being the one that stands for every lock.
#[derive(Debug)]
pub struct Notices<T> {
    queue: VecDeque<T>,
    all: T,
}

impl<T: Copy + PartialEq> Notices<T> {
    /// An empty queue with room for [`NOTICES_MAX`] notices (nothing allocated after this).
    pub fn new(all: T) -> Notices<T> {
        Notices {
            queue: VecDeque::with_capacity(NOTICES_MAX),
            all,
        }
    }

    /// Queues `n` (module doc: a full queue becomes one "every lock" notice).
    pub fn push(&mut self, n: T) {
        if n == self.all && self.queue.back() == Some(&self.all) {
            return;
        }
        if self.queue.len() == NOTICES_MAX {
            self.queue.clear();
            self.queue.push_back(self.all);
            return;
        }
        self.queue.push_back(n);
    }

    /// Replaces what is queued with the one "every lock" notice: after a failover renumbered
    /// the locks, the queued notices name ids from before (another lock's now, or none).
    pub fn renumbered(&mut self) {
        self.queue.clear();
        self.queue.push_back(self.all);
    }

    /// The oldest notice.
    pub fn pop(&mut self) -> Option<T> {
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_folds_into_one_notice_for_every_lock() {
        let mut q = Notices::new(0u32);
        for n in 1..=NOTICES_MAX as u32 {
            q.push(n);
        }
        assert_eq!(q.pop(), Some(1), "full, not over");
        q.push(7);
        q.push(8);
        assert_eq!((q.pop(), q.pop()), (Some(0), None), "folded");
        q.push(0);
        q.push(0);
        assert_eq!(
            (q.pop(), q.pop()),
            (Some(0), None),
            "one 'every lock' in a row"
        );
    }
}
