//! A global allocator that counts, for the tests that prove a path allocates nothing
//! (`tests/tests/zero_alloc*.rs`).
//!
//! A library cannot be the global allocator of the binaries that link it without being that of
//! every one of them (and only one may exist in a program), so this module gives the type and
//! its counts, and each zero-allocation test binary names it itself:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: dlock_tests::counting::Counting = dlock_tests::counting::Counting;
//! ```
//!
//! It keeps two counts, because the tests need two: [`allocations`] over the whole process,
//! for a window in which the server's threads and the clients' run (the test then keeps
//! anything else from running meanwhile), and [`thread_allocations`] on the calling thread
//! only, for a window on the test's own thread while the harness's threads allocate freely.
//! A binary that does not install [`Counting`] reads zeros from both.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Forwards to the system allocator and counts every allocation and reallocation.
#[derive(Debug)]
pub struct Counting;

/// Allocations (and reallocations) in the whole process since start.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Allocations (and reallocations) on this thread since it started. Const-initialised and
    /// without a destructor, so counting in it never allocates and works until the thread ends.
    static THREAD_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // Relaxed: a tally read after the threads that bump it have quiesced (or joined).
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    THREAD_ALLOCATIONS.with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator; the only additions are a
// relaxed atomic increment and a const-initialised thread-local counter, neither of which
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations in the whole process so far (with [`Counting`] installed).
pub fn allocations() -> u64 {
    // Relaxed: as in `count`.
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Allocations on the calling thread so far (with [`Counting`] installed).
pub fn thread_allocations() -> u64 {
    THREAD_ALLOCATIONS.with(Cell::get)
}

/// A waker that unparks the thread it was made on: made once, before a counted window, so that
/// polling a future inside it allocates nothing of its own.
#[derive(Debug)]
pub struct Unpark(pub std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `f` on this thread with `waker` (made once, outside the counted window), parking
/// between wake-ups: an asynchronous path's allocations are then the path's own.
pub fn block_on<F: std::future::Future>(waker: &std::task::Waker, f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => return v,
            std::task::Poll::Pending => std::thread::park(),
        }
    }
}
