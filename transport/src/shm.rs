//! The shared-memory transport: mailboxes (four lanes per client slot), doorbells, and the
//! park/wake handshakes, all over atomics in the region.
//!
//! # Protocol
//!
//! A client owns the lanes of its slot (`InitReply::slot`; `Region::client_mailboxes`), four
//! mailboxes of one request half and one response half each. It numbers its data messages
//! consecutively and sends message `seq` through lane `seq % 4`: it writes the bytes into the
//! lane's request half, stores the length, then publishes with `seq` (Release), rings its
//! doorbell bit (SeqCst `fetch_or`) and, if the server's data thread is parked, wakes it. It may
//! have up to four messages in flight and reuses a lane only after reading the reply of the
//! message it held. The data thread scans the doorbell words, takes each rung bit (`swap(0)`,
//! Acquire), takes the slot's requests whose `seq` is new in the order they were numbered
//! ([`next_lane`]), executes each, writes its reply into the same lane's response half and
//! publishes it with the response `seq` equal to the request's (Release). The client polls, then
//! yields, then sleeps on the response half's `waiting` futex word until it sees its `seq`.
//!
//! Message bytes are copied word by word with relaxed atomic loads and stores: a client in
//! another process could write at any time, and atomics make that a wrong answer for that client
//! rather than undefined behaviour in the server. The `seq` Release/Acquire pairs order the
//! copies.
//!
//! # Torn requests
//!
//! A client that gave up waiting (its timeout passed) may write its next request while the data
//! thread is still copying the previous one out. The request half is therefore a seqlock: the
//! client first marks `seq` with [`WRITING`], then writes, then publishes the new number; the
//! data thread copies, then re-reads `seq` and drops the copy if it changed. (The next request
//! rings its own bell, so nothing is lost.) The response half needs no such check: the data
//! thread writes a lane's reply once, to the request the lane held, and a client reads a reply
//! only after its number is published and rewrites the lane only after reading it (or giving up
//! on it; a reply the data thread then writes is to a number the client no longer waits for).
//!
//! # Parking without lost wake-ups
//!
//! Both sleeps are the same Dekker-style handshake: the sleeper stores its flag (SeqCst), then
//! re-checks the condition (SeqCst) before the futex wait; the waker makes the condition true
//! (SeqCst), then loads the flag (SeqCst) and, if it is set, swaps it off and wakes the sleeper.
//! With these four operations in the single SeqCst order, either the sleeper sees the condition
//! or the waker sees the flag. The waker loads before it swaps because the flag is almost always
//! clear: a plain load costs nothing, where a `swap` is a locked instruction that stalls the
//! waker until its store buffer (a whole message, just written) has drained. Of several wakers
//! that see the flag, the one whose swap takes it wakes the sleeper.
//!
//! The data thread sleeps not on a futex but in its poll (`runtime/tcp.rs`), so that one wait
//! covers its sockets too. A waker in the server's process wakes that poll's eventfd directly;
//! a client in another process bumps [`ShmHeader::bell`] and futex-wakes it, and the server's
//! bridge thread passes the wake on (`runtime/wake.rs` says why).

use std::time::{Duration, Instant};

use dlock_core::proto::{DATA_REQUEST_WITH_VALUES_MAX, DATA_RESPONSE_WITH_VALUES_MAX};

use crate::futex;
use crate::patience::{Next, Patience};
use crate::sync::{AtomicU32, AtomicU64, Ordering, fence};

/// Set in a request's `seq` while the client writes the message (the seqlock's "odd" state).
pub const WRITING: u64 = 1 << 63;

/// Data words in a request half (2,000 bytes: a full data request with its value trailer).
const REQUEST_WORDS: usize = DATA_REQUEST_WITH_VALUES_MAX / 8;
/// Data words in a response half (2,744 bytes: a full data response with its value and proof
/// trailers).
const RESPONSE_WORDS: usize = DATA_RESPONSE_WITH_VALUES_MAX / 8;

/// One direction of a mailbox, `WORDS` words of message: 2 KiB for requests, 2.75 KiB for
/// responses.
///
/// The sequence number, length and futex word come first, so a one-command message (48 bytes)
/// shares their cache line: a single-command round trip moves one line each way instead of two,
/// and a line crossing cores is the dominant cost of a round trip.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Half<const WORDS: usize> {
    /// The sequence number of the message in `data`; published last.
    seq: AtomicU64,
    /// The message length in bytes.
    len: AtomicU32,
    /// Response half: the client sleeps on this futex word (1 = asleep). Unused in the request
    /// half.
    waiting: AtomicU32,
    data: [AtomicU64; WORDS],
}

/// A client's mailbox: its request and the server's response.
#[repr(C)]
#[derive(Debug)]
pub struct Mailbox {
    request: Half<REQUEST_WORDS>,
    response: Half<RESPONSE_WORDS>,
}

#[cfg(not(dlock_loom))]
static_assertions::const_assert_eq!(
    std::mem::size_of::<Half<REQUEST_WORDS>>(),
    dlock_core::table::layout::MAILBOX_HALF
);
#[cfg(not(dlock_loom))]
static_assertions::const_assert_eq!(
    std::mem::size_of::<Half<RESPONSE_WORDS>>(),
    dlock_core::table::layout::MAILBOX_RESPONSE_HALF
);
static_assertions::const_assert_eq!(REQUEST_WORDS * 8, DATA_REQUEST_WITH_VALUES_MAX);
static_assertions::const_assert_eq!(RESPONSE_WORDS * 8, DATA_RESPONSE_WITH_VALUES_MAX);

/// Words the runtime keeps in the region's header page (after the core's header), so a client
/// in another process reaches them too.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ShmHeader {
    /// 1 while the data thread sleeps (or is about to): the flag of the park handshake.
    pub parked: AtomicU32,
    /// 1 once the data thread serves (set after the tables are carved).
    pub serving: AtomicU32,
    /// Counts the wakes clients in other processes issued; the futex word the server's wake
    /// bridge sleeps on (`runtime/wake.rs`), which passes each one on to the data thread's
    /// poll. The data thread itself sleeps in its poll, where no futex can reach it.
    pub bell: AtomicU32,
}

/// Offset of [`ShmHeader`] inside the header page (the core's header takes the first 48 bytes).
pub const SHM_HEADER_OFFSET: usize = 2048;

impl<const WORDS: usize> Half<WORDS> {
    /// Bytes of message the half holds.
    const BYTES: usize = WORDS * 8;

    /// Copies `msg` in (caller guarantees `msg.len() <= Self::BYTES`), without publishing.
    fn write(&self, msg: &[u8]) {
        // Whole words by `chunks_exact`, so each is one load and one store; a variable-length
        // copy per word compiles to a `memcpy` call per word.
        let words = msg.chunks_exact(8);
        let tail = words.remainder();
        let mut n = 0;
        for (cell, chunk) in self.data.iter().zip(words) {
            let w = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
            // Relaxed: the `seq` Release store that follows publishes every word.
            cell.store(w, Ordering::Relaxed);
            n += 1;
        }
        if !tail.is_empty() {
            let mut w = [0u8; 8];
            w[..tail.len()].copy_from_slice(tail);
            self.data[n].store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        self.len.store(msg.len() as u32, Ordering::Relaxed);
    }

    /// Copies the message out into `out` (at least `Self::BYTES` bytes); returns its length,
    /// clamped to the half's size whatever the writer stored.
    fn read(&self, out: &mut [u8]) -> usize {
        // Relaxed: the caller's Acquire load of `seq` ordered these after the writer's stores.
        let len = (self.len.load(Ordering::Relaxed) as usize)
            .min(Self::BYTES)
            .min(out.len());
        let mut words = out[..len].chunks_exact_mut(8);
        let mut n = 0;
        for (chunk, cell) in (&mut words).zip(&self.data) {
            chunk.copy_from_slice(&cell.load(Ordering::Relaxed).to_le_bytes());
            n += 1;
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let w = self.data[n].load(Ordering::Relaxed).to_le_bytes();
            tail.copy_from_slice(&w[..tail.len()]);
        }
        len
    }
}

impl Mailbox {
    /// Client, taking the mailbox over: the highest sequence number either half has seen. A new
    /// owner of the slot (a new registration, a reinit) continues above it, so neither the
    /// server (which skips a request whose number it has already taken) nor the client (which
    /// accepts a reply by its number) mistakes an old message for a new one.
    pub fn current_seq(&self) -> u64 {
        // Acquire: pairs with the Release/SeqCst stores that published these numbers. A previous
        // owner may have died while writing: its mark is not part of the number.
        (self.request.seq.load(Ordering::Acquire) & !WRITING)
            .max(self.response.seq.load(Ordering::Acquire))
    }

    /// Client: writes request `msg` under sequence number `seq` (below [`WRITING`]) and
    /// publishes it. The caller rings the doorbell next.
    pub fn post_request(&self, msg: &[u8], seq: u64) {
        debug_assert!(msg.len() <= Half::<REQUEST_WORDS>::BYTES && seq & WRITING == 0);
        // The seqlock's writer (see the module doc). Relaxed mark, then a Release fence: any
        // data word below that the data thread reads is ordered after the mark, so its re-read
        // of `seq` (after its Acquire fence) sees the mark or the new number, never the old one.
        self.request.seq.store(seq | WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        self.request
            .write(&msg[..msg.len().min(Half::<REQUEST_WORDS>::BYTES)]);
        // Release: publishes the message words and length to the Acquire load in `take_request`.
        self.request.seq.store(seq, Ordering::Release);
    }

    /// Server: the request if its sequence number is above `last` and it was not being
    /// rewritten while it was copied into `out`.
    pub fn take_request(&self, last: u64, out: &mut [u8]) -> Option<(u64, usize)> {
        // Acquire: pairs with `post_request`'s Release, so the copy below sees the message.
        let seq = self.request.seq.load(Ordering::Acquire);
        if seq <= last || seq & WRITING != 0 {
            return None;
        }
        let len = self.request.read(out);
        // The seqlock's reader: the Acquire fence orders the copy before the re-read, and pairs
        // with the writer's Release fence if the copy saw any word of a newer request.
        fence(Ordering::Acquire);
        (self.request.seq.load(Ordering::Relaxed) == seq).then_some((seq, len))
    }

    /// Server: request `seq` (not 0) if this mailbox still holds it intact; copies it into `out`
    /// and returns its length.
    pub fn take_exact(&self, seq: u64, out: &mut [u8]) -> Option<usize> {
        let (taken, len) = self.take_request(seq.checked_sub(1)?, out)?;
        (taken == seq).then_some(len)
    }

    /// Server: publishes the reply to request `seq` and wakes the client if it sleeps.
    pub fn post_response(&self, msg: &[u8], seq: u64) {
        self.response
            .write(&msg[..msg.len().min(Half::<RESPONSE_WORDS>::BYTES)]);
        // SeqCst (not just Release): this store and the load below take part in the sleep
        // handshake with `wait_response` (see the module doc); it also publishes the words.
        self.response.seq.store(seq, Ordering::SeqCst);
        if self.response.waiting.load(Ordering::SeqCst) == 1
            && self.response.waiting.swap(0, Ordering::SeqCst) == 1
        {
            futex::wake(&self.response.waiting, 1);
        }
    }

    /// Client: whether the reply to `seq` has arrived; copies it into `out` if so.
    pub fn try_response(&self, seq: u64, out: &mut [u8]) -> Option<usize> {
        // Acquire: pairs with `post_response`, so the copy sees the reply.
        (self.response.seq.load(Ordering::Acquire) == seq).then(|| self.response.read(out))
    }

    /// Client: waits for the reply to `seq` until `deadline` (poll, back off and yield — for at
    /// least `awake` — then sleep); copies it into `out`. `None` on timeout.
    pub fn wait_response(
        &self,
        seq: u64,
        out: &mut [u8],
        deadline: Option<Instant>,
        awake: Duration,
    ) -> Option<usize> {
        let mut patience = Patience::new(awake, deadline);
        loop {
            if let Some(n) = self.try_response(seq, out) {
                return Some(n);
            }
            // Poll, then back off and yield, for `awake` (at least `patience::POLL`) before
            // sleeping: a sleeping waiter costs a futex wake-up (tens of µs) when its reply
            // comes.
            match patience.next() {
                Next::Again => continue,
                Next::TimedOut => return None,
                Next::Sleep => {}
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return None,
                },
                None => None,
            };
            if self.raise_waiting(seq) {
                // Bounded sleeps: a server in another process that died cannot leave us asleep.
                let nap = left
                    .unwrap_or(Duration::from_millis(100))
                    .min(Duration::from_millis(100));
                futex::wait(&self.response.waiting, 1, Some(nap));
            }
            self.response.waiting.store(0, Ordering::Relaxed);
        }
    }

    /// Client, about to sleep on the reply to `seq`: raises the response half's `waiting` flag,
    /// then re-checks; true if the reply is still missing, so the caller may sleep (the server
    /// will see the flag when it publishes). The sleeper's half of the handshake in the module
    /// doc; split out so the loom model runs exactly this code.
    #[inline]
    fn raise_waiting(&self, seq: u64) -> bool {
        self.response.waiting.store(1, Ordering::SeqCst);
        self.response.seq.load(Ordering::SeqCst) != seq
    }
}

/// Client: the highest sequence number any of a client slot's lanes has seen (see
/// [`Mailbox::current_seq`]); a new owner of the slot continues above it.
pub fn lanes_current_seq(lanes: &[Mailbox]) -> u64 {
    lanes.iter().map(Mailbox::current_seq).max().unwrap_or(0)
}

/// Server: the lane of a client slot holding its next request — the lowest published sequence
/// number above `last` — if any. A client numbers its requests consecutively and reuses a lane
/// only after reading the reply of the request it held, so taking lanes in this order executes
/// its messages in the order it sent them.
///
/// Two passes: a single pass could read lane *a* just before the client published request *n*
/// there and lane *b* just after it published *n + 1*, and run *n + 1* first (after which *n*,
/// below `last`, would never run). The first pass's loads are Acquire, so once it has seen any
/// request, the second pass sees every request the client published before that one.
///
/// Returns the number with the lane: take exactly that request ([`Mailbox::take_exact`]). A
/// client that timed out on it may have reused the lane for a newer request in between, and
/// running that one first would leave the ones before it below `last` for good.
pub fn next_lane(lanes: &[Mailbox], last: u64) -> Option<(u64, &Mailbox)> {
    lowest_above(lanes, last, Ordering::Acquire)?;
    // Relaxed: ordered after the first pass by its Acquire loads; `take_exact` does the load
    // that synchronises with the request it takes.
    lowest_above(lanes, last, Ordering::Relaxed)
}

/// The lane with the lowest published request number above `last`, loading each with `order`.
fn lowest_above(lanes: &[Mailbox], last: u64, order: Ordering) -> Option<(u64, &Mailbox)> {
    lanes
        .iter()
        .filter_map(|mb| {
            let seq = mb.request.seq.load(order);
            (seq > last && seq & WRITING == 0).then_some((seq, mb))
        })
        .min_by_key(|&(seq, _)| seq)
}

/// The doorbells: one bit per client slot.
#[derive(Debug)]
pub struct Doorbells<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Doorbells<'a> {
    /// Wraps the region's doorbell words.
    pub fn new(words: &'a [AtomicU64]) -> Self {
        Self { words }
    }

    /// Client: rings `slot`'s bell. SeqCst: it takes part in the park handshake with the data
    /// thread (see the module doc).
    pub fn ring(&self, slot: u32) {
        if let Some(w) = self.words.get(slot as usize / 64) {
            w.fetch_or(1 << (slot % 64), Ordering::SeqCst);
        }
    }

    /// Server: takes every rung bell and calls `f(slot)` for each; returns how many rang.
    pub fn drain(&self, mut f: impl FnMut(u32)) -> usize {
        let mut n = 0;
        for (i, w) in self.words.iter().enumerate() {
            // Relaxed peek: most words are zero; the swap below is the synchronising access.
            if w.load(Ordering::Relaxed) == 0 {
                continue;
            }
            // Acquire: pairs with the client's `fetch_or` (which follows its Release of `seq`).
            let mut bits = w.swap(0, Ordering::Acquire);
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                f(i as u32 * 64 + b);
                n += 1;
            }
        }
        n
    }

    /// Server: whether any bell is rung (SeqCst: the re-check of the park handshake).
    pub fn any(&self) -> bool {
        self.words.iter().any(|w| w.load(Ordering::SeqCst) != 0)
    }
}

impl ShmHeader {
    /// Waker side (a client after ringing): wakes the data thread if it is parked. A client in
    /// another process cannot reach the data thread's poll, so it bumps [`ShmHeader::bell`] and
    /// wakes the bridge that sleeps on it; in-process wakers take the flag with
    /// [`ShmHeader::take_parked`] and wake the poll directly.
    pub fn wake_server(&self) {
        if self.take_parked() {
            // Release: nothing is published through the count, but it must be a fresh value
            // for the bridge's futex compare; the flag swap before it is the handshake.
            self.bell.fetch_add(1, Ordering::Release);
            futex::wake(&self.bell, 1);
        }
    }

    /// Waker side of the park handshake: true if the data thread was parked and this caller
    /// took the flag, so it must wake it (exactly one waker does).
    #[inline]
    pub fn take_parked(&self) -> bool {
        // See the module doc: load first, swap only if set.
        self.parked.load(Ordering::SeqCst) == 1 && self.parked.swap(0, Ordering::SeqCst) == 1
    }

    /// Data thread: raises the flag, then sleeps with `sleep` unless `has_work()` (re-checked
    /// after the flag is raised) says there is work; lowers the flag after.
    pub fn park_server(&self, has_work: impl Fn() -> bool, sleep: impl FnOnce()) {
        self.parked.store(1, Ordering::SeqCst);
        if !has_work() {
            sleep();
        }
        // Relaxed: only this thread raises the flag; a waker that still takes it issues one
        // spurious wake, which the sleeper tolerates.
        self.parked.store(0, Ordering::Relaxed);
    }

    /// The wake bridge: sleeps until [`ShmHeader::bell`] differs from `seen` (or `timeout`, a
    /// signal or a spurious wake-up); returns its value.
    pub fn wait_bell(&self, seen: u32, timeout: Option<Duration>) -> u32 {
        // Acquire: pairs with nothing published, but keeps the read after the futex return.
        let now = self.bell.load(Ordering::Acquire);
        if now != seen {
            return now;
        }
        futex::wait(&self.bell, seen, timeout);
        self.bell.load(Ordering::Acquire)
    }

    /// Wakes the bridge whatever the flag says (at shutdown).
    pub fn ring_bell(&self) {
        self.bell.fetch_add(1, Ordering::Release);
        futex::wake(&self.bell, 1);
    }
}

/// What the loom models (`transport/tests/loom.rs`) need and nothing else: constructors, since
/// loom's atomics cannot be cast from memory (outside loom these types are only ever views over
/// the region), and handles on the two private halves of the reply-sleep handshake.
#[cfg(dlock_loom)]
mod loom_support {
    use super::{AtomicU32, AtomicU64, Half, Mailbox, Ordering, ShmHeader};

    // Loom records an atomic's initial value as a Release store outside the SeqCst order, so a
    // SeqCst load may return it even after a newer SeqCst store to the same word. C++ forbids
    // that execution (a SeqCst load that reads the initial value is ordered before every later
    // SeqCst store to the word), and in the Dekker handshakes it shows up as a false lost
    // wake-up (loom's README, "Unsupported features"; tokio-rs/loom#180). A zeroed region has no
    // such store, so the constructors re-store each handshake word's zero with SeqCst before any
    // model thread starts.

    impl<const WORDS: usize> Half<WORDS> {
        /// A zeroed half, as a fresh region holds it.
        #[allow(clippy::new_without_default)] // Built by models only; no `Default` to suggest.
        pub fn new() -> Self {
            let half = Self {
                data: std::array::from_fn(|_| AtomicU64::new(0)),
                seq: AtomicU64::new(0),
                len: AtomicU32::new(0),
                waiting: AtomicU32::new(0),
            };
            half.seq.store(0, Ordering::SeqCst);
            half.waiting.store(0, Ordering::SeqCst);
            half
        }
    }

    impl Mailbox {
        /// A zeroed mailbox, as a fresh region holds it.
        #[allow(clippy::new_without_default)] // Built by models only; no `Default` to suggest.
        pub fn new() -> Self {
            Self {
                request: Half::new(),
                response: Half::new(),
            }
        }

        /// The flag-then-re-check `wait_response` runs before it sleeps (the same function):
        /// true if the reply to `seq` is still missing, so the client would sleep.
        pub fn loom_raise_waiting(&self, seq: u64) -> bool {
            self.raise_waiting(seq)
        }

        /// The response half's `waiting` word: 1 while the client sleeps or is about to.
        pub fn loom_waiting(&self) -> &AtomicU32 {
            &self.response.waiting
        }
    }

    impl ShmHeader {
        /// A zeroed header, as a fresh region holds it.
        #[allow(clippy::new_without_default)] // Built by models only; no `Default` to suggest.
        pub fn new() -> Self {
            let header = Self {
                parked: AtomicU32::new(0),
                serving: AtomicU32::new(0),
                bell: AtomicU32::new(0),
            };
            header.parked.store(0, Ordering::SeqCst);
            header
        }
    }
}
