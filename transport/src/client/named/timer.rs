//! Wakes tasks at their deadlines, for the one wait of the native API that no server reply
//! ends: a future waiting for a guard of its own handle to let a lock go. Without it such a
//! future could only notice its deadline when something else woke it; with it the wait ends on
//! time on any executor, and no runtime's timer is assumed.
//!
//! One thread per process, started by the first such wait, sleeps until the earliest deadline.
//! Entries are not cancelled: a future that was woken early (the guard let go) and then wakes
//! again at its deadline only polls once more, which it tolerates like any spurious wake.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, Once, OnceLock, PoisonError};
use std::task::Waker;
use std::time::Instant;

/// One deadline: when, an order among equal deadlines, and whom to wake.
struct Entry {
    at: Instant,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Timer {
    due: Mutex<(BinaryHeap<Reverse<Entry>>, u64)>,
    /// Signalled when an entry earlier than every other one is added.
    earlier: Condvar,
}

static TIMER: OnceLock<Timer> = OnceLock::new();
static STARTED: Once = Once::new();

/// Wakes `waker` at `at` (at once if that has passed).
pub(super) fn wake_at(at: Instant, waker: &Waker) {
    if at <= Instant::now() {
        waker.wake_by_ref();
        return;
    }
    let timer = TIMER.get_or_init(Timer::default);
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("dlock-timer".into())
            .spawn(|| run(timer));
        if let Err(e) = spawned {
            // Without the thread a wait still ends when its guard lets go, or when the future
            // is polled after its deadline; it cannot be woken on time.
            tracing::warn!(error = %e, "dlock: no timer thread");
        }
    });
    let mut due = timer.due.lock().unwrap_or_else(PoisonError::into_inner);
    let (heap, seq) = &mut *due;
    *seq += 1;
    let first = heap.peek().is_none_or(|Reverse(e)| at < e.at);
    heap.push(Reverse(Entry {
        at,
        seq: *seq,
        waker: waker.clone(),
    }));
    drop(due);
    if first {
        timer.earlier.notify_one();
    }
}

/// The timer thread: wakes what is due, then sleeps until the next deadline or a new earlier one.
fn run(timer: &Timer) {
    let mut due = timer.due.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let now = Instant::now();
        while due.0.peek().is_some_and(|Reverse(e)| e.at <= now) {
            if let Some(Reverse(e)) = due.0.pop() {
                e.waker.wake();
            }
        }
        let next = due.0.peek().map(|Reverse(e)| e.at);
        due = match next {
            Some(at) => {
                let left = at.saturating_duration_since(now);
                let waited = timer.earlier.wait_timeout(due, left);
                waited.unwrap_or_else(PoisonError::into_inner).0
            }
            None => timer
                .earlier
                .wait(due)
                .unwrap_or_else(PoisonError::into_inner),
        };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_task_is_woken_at_its_deadline_and_not_before() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let later = Instant::now() + Duration::from_secs(3_600);
        wake_at(later, &waker);
        wake_at(Instant::now() + Duration::from_millis(20), &waker);
        let start = Instant::now();
        while count.0.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(30), "never woken");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(start.elapsed() >= Duration::from_millis(15), "woken early");
        // The hour-long entry is still waiting: one wake, not two.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // A deadline that has passed wakes at once, on the caller's thread.
        wake_at(Instant::now() - Duration::from_millis(1), &waker);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
    }
}
