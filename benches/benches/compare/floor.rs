//! The floor of a thread per client on this machine, measured in the same run as the table: what
//! any design that gives each client a thread of its own must pay per round trip, with no socket
//! and no server.
//!
//! With more client threads than processors, a thread waiting for its reply is off the processor
//! when the reply comes, so every round trip switches its thread back in. However the reply
//! reaches it (a reader thread, the leader/follower hand-off of `client::Mux`, a busy poll), the
//! switch is paid once per round trip at least. Two costs bound it from below:
//!
//! - a bare switch: `threads` threads, all runnable, each calling `sched_yield` in a loop, so
//!   every call hands the processor to another of them: the cheapest way for a thread to give
//!   the processor up and get it back, which a design pays this little only if every switch
//!   lands on a thread whose reply has come (none wasted);
//! - a futex hand-off: the same threads in a ring, each asleep in `FUTEX_WAIT` until the one
//!   before wakes it (`FUTEX_WAKE`), `tokens` of them awake at a time: what a sleeping waiter
//!   costs, its wake-up included.
//!
//! Each is the threads' own CPU time (`RUSAGE_THREAD`) over what they did, so work of other
//! processes on a shared machine does not count. `main.rs` adds the server's measured CPU per
//! operation and sets the sum beside Redis's.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// The ring's word when its thread has no token, has one, or sleeps waiting for one.
const IDLE: u32 = 0;
const TOKEN: u32 = 1;
const ASLEEP: u32 = 2;

/// The floor's two costs, in µs of CPU per round trip.
#[derive(Clone, Copy, Debug)]
pub struct Floor {
    /// A bare switch between runnable threads.
    pub switch_us: f64,
    /// A futex sleep and wake-up (the cheaper of the rings measured).
    pub futex_us: f64,
}

/// Measures both costs with `threads` threads, `cell` each (the futex ring twice: with one
/// token per processor, and with a quarter of the threads awake).
pub fn measure(threads: usize, cpus: usize, cell: Duration) -> Floor {
    let switch_us = yields(threads, cell);
    let futex_us = [cpus.max(1), (threads / 4).max(1)]
        .into_iter()
        .map(|tokens| ring(threads, tokens.min(threads), cell))
        .fold(f64::INFINITY, f64::min);
    Floor {
        switch_us,
        futex_us,
    }
}

/// This thread's CPU time so far, in µs.
fn thread_cpu_us() -> f64 {
    crate::run::cpu_s(libc::RUSAGE_THREAD) * 1e6
}

/// Runs `body(i, stop)` on `threads` threads for `cell`, counting what each returns and the CPU
/// time each spent: µs of CPU per counted event.
fn run_threads(
    threads: usize,
    cell: Duration,
    body: impl Fn(usize, &AtomicBool) -> u64 + Sync,
) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let (events, cpu_us) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (stop, start, body) = (&stop, &start, &body);
                s.spawn(move || {
                    start.wait();
                    let cpu0 = thread_cpu_us();
                    let n = body(i, stop);
                    (n, thread_cpu_us() - cpu0)
                })
            })
            .collect();
        start.wait();
        std::thread::sleep(cell);
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().expect("a floor thread panicked"))
            .fold((0u64, 0.0), |(n, c), (dn, dc)| (n + dn, c + dc))
    });
    cpu_us / events.max(1) as f64
}

/// µs of CPU per `sched_yield` among `threads` runnable threads.
fn yields(threads: usize, cell: Duration) -> f64 {
    run_threads(threads, cell, |_, stop| {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            std::thread::yield_now();
            n += 1;
        }
        n
    })
}

/// µs of CPU per hand-off in a ring of `threads` sleeping threads with `tokens` tokens. A token
/// handed to a thread that has not yet taken the one before merges with it, so the ring may
/// run with fewer tokens than it started with: the cost per hand-off is what counts here, not
/// the rate.
fn ring(threads: usize, tokens: usize, cell: Duration) -> f64 {
    let words: Vec<AtomicU32> = (0..threads).map(|_| AtomicU32::new(IDLE)).collect();
    for k in 0..tokens {
        words[k * threads / tokens].store(TOKEN, Ordering::Relaxed);
    }
    let words = &words;
    run_threads(threads, cell, |i, stop| {
        let mut n = 0;
        while take_token(&words[i], stop) {
            n += 1;
            let next = &words[(i + 1) % threads];
            // AcqRel: the token's hand-over is the only data; the sleeper's ASLEEP and this swap
            // are ordered by the word itself, which the kernel re-checks under its own lock.
            if next.swap(TOKEN, Ordering::AcqRel) == ASLEEP {
                futex_wake(next);
            }
        }
        n
    })
}

/// Sleeps on `word` until it holds a token and takes it; false once `stop` is set.
fn take_token(word: &AtomicU32, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        // Acquire: pairs with the giver's swap.
        match word.compare_exchange(TOKEN, IDLE, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => return true,
            Err(ASLEEP) => futex_wait(word, ASLEEP),
            Err(_) => {
                if word
                    .compare_exchange(IDLE, ASLEEP, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    futex_wait(word, ASLEEP);
                }
            }
        }
    }
}

fn futex_wait(word: &AtomicU32, expected: u32) {
    // A timeout ends a sleep that no token will (the threads still asleep at the stop), so
    // stopping costs no wake-ups to count.
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic for the whole call, which is all
    // FUTEX_WAIT reads; `ts` is alive on this frame.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE only reads its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}
