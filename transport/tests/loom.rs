//! Loom models of the places where a client and the data thread meet in shared memory (the
//! protocol in `transport/src/shm.rs`): the mailbox handshake, the request seqlock, the doorbell
//! scan, and the two park/wake handshakes; and of where the control and data threads meet: a job
//! handed over through the inbox with the park handshake, and a slot handed to a new owner
//! through the registration reply. Each model runs the production functions on loom's atomics
//! (the `sync` facade swaps them in) and asserts an outcome that a weakened ordering (or, for
//! the doorbells, a non-atomic step) breaks. The runtime's queues are crossbeam `ArrayQueue`s,
//! which loom cannot see into; the last two models use a stand-in with their orderings
//! (`QueueStandIn`).
//!
//! The models of a shared connection's leader/follower hand-off are in `loom_models/mux.rs`.
//!
//! Run with `RUSTFLAGS="--cfg dlock_loom" cargo test -p dlock-transport --test loom --release`.
//! Each model explores at most `PREEMPTIONS` preemptions per execution (`LOOM_MAX_PREEMPTIONS`
//! overrides it). To print every step of a failing interleaving, add
//! `LOOM_LOG=trace LOOM_MAX_PREEMPTIONS=2`.
//!
//! Under loom `futex::wait` yields instead of sleeping, so a lost wake-up never hangs a model.
//! The park models therefore check the handshake itself: when a sleeper decides to sleep, they
//! hold it there until the waker has finished, then assert that the waker saw its flag.
//!
//! What loom cannot check here: its read-modify-writes always read the newest store, so it never
//! lets the wakers' `swap`s miss a flag that was already stored. Weakening the sleepers' flag
//! stores (`parked.store(1)`, `waiting.store(1)`) or the wakers' swaps below SeqCst therefore
//! passes these models although the C++ model (and x86's store buffer, for the stores) allows
//! the lost wake-up; those four orderings rest on the argument in `shm`'s module doc alone.
#![cfg(dlock_loom)]

use dlock_transport::shm::{Doorbells, Mailbox, ShmHeader, next_lane};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::thread;

#[path = "loom_models/mux.rs"]
mod mux;

/// Preemptions explored per execution. Each weakening these models catch was caught within 2
/// (most within 1); 3 leaves a margin and still finishes all six in about 2.5 s (the doorbell
/// model dominates: ~26,000 executions).
const PREEMPTIONS: usize = 3;

/// The client slot the models use (not slot 0, so an off-by-one in the bit index shows).
const SLOT: u32 = 5;

/// Two round trips: the second meets a stale request `seq` on the server's side and a stale
/// reply on the client's. Lengths differ (16 then 8 bytes, and the reverse for replies) so a
/// stale `len` shows too; every word is non-zero so a stale (still zero) word shows.
const REQUESTS: [&[u8]; 2] = [b"LOCK obj-7 excl!", b"UNLOCK 7"];
const REPLIES: [&[u8]; 2] = [b"GRANTED!", b"RELEASED obj-7 !"];

/// Explores `f` under loom with at most `PREEMPTIONS` preemptions. With `LOOM_LOG` set it runs
/// under `loom::model` instead, which installs the subscriber that prints each step (the bound
/// then comes from `LOOM_MAX_PREEMPTIONS` alone).
fn model(f: impl Fn() + Sync + Send + 'static) {
    if std::env::var_os("LOOM_LOG").is_some() {
        loom::model(f);
        return;
    }
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(PREEMPTIONS);
    builder.check(f);
}

/// `n` zeroed doorbell words, as a fresh region holds them.
fn zeroed_words(n: usize) -> Vec<AtomicU64> {
    let words: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    // Loom records an initial value as a non-SeqCst store, which would let the SeqCst re-check
    // in `Doorbells::any` read it after a newer SeqCst `ring`: an execution C++ forbids (see
    // `shm::loom_support`). A zeroed region has no such store; re-store the zeros SeqCst.
    for w in &words {
        w.store(0, Ordering::SeqCst);
    }
    words
}

/// The client posts two requests in turn, ringing after each and polling for each reply; the
/// data thread drains the doorbells, takes each request and replies. Proves that the `seq`
/// Release/Acquire pairs (and the ring/drain pair) deliver every request and reply word for
/// word, that a rung bell always finds a fresh request, that a request is never taken twice,
/// and that the client never accepts the previous round's reply.
#[test]
fn mailbox_handshake_delivers_the_request_and_the_reply_intact() {
    model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let words = Arc::new(zeroed_words(1));

        let client = {
            let (mailbox, words) = (Arc::clone(&mailbox), Arc::clone(&words));
            thread::spawn(move || {
                let bells = Doorbells::new(&words);
                for (round, (request, reply)) in REQUESTS.iter().zip(REPLIES).enumerate() {
                    let seq = round as u64 + 1;
                    mailbox.post_request(request, seq);
                    bells.ring(SLOT);
                    let mut out = [0u8; 16];
                    let n = loop {
                        if let Some(n) = mailbox.try_response(seq, &mut out) {
                            break n;
                        }
                        thread::yield_now();
                    };
                    assert_eq!(&out[..n], reply, "round {seq}: the reply arrived torn");
                }
            })
        };

        let bells = Doorbells::new(&words);
        let mut last = 0;
        let mut out = [0u8; 16];
        while last < REQUESTS.len() as u64 {
            let rang = bells.drain(|slot| {
                assert_eq!(slot, SLOT, "a bell rang that nobody rang");
                let (seq, n) = mailbox
                    .take_request(last, &mut out)
                    .expect("a rung bell finds a fresh request");
                assert_eq!(seq, last + 1, "a request was skipped");
                assert_eq!(
                    &out[..n],
                    REQUESTS[seq as usize - 1],
                    "request {seq} arrived torn"
                );
                last = seq;
                assert_eq!(
                    mailbox.take_request(last, &mut out),
                    None,
                    "request {seq} would be taken twice"
                );
                mailbox.post_response(REPLIES[seq as usize - 1], seq);
            });
            if rang == 0 {
                thread::yield_now();
            }
        }

        client.join().unwrap();
        assert_eq!(
            bells.drain(|_| {}),
            0,
            "one ring per request, each drained once"
        );
    });
}

/// A client that gave up on request 1 writes request 2 while the data thread may still be
/// copying request 1 out. Proves the request seqlock: whatever the data thread takes is one of
/// the two requests intact under its own number — never words of both — and request 2 is taken
/// once its writer is done. Fails if the writer's mark is not fenced before its data (the Release
/// fence in `post_request`) or the reader's re-read is not fenced after its copy.
#[test]
fn a_request_rewritten_while_taken_is_never_taken_torn() {
    const SECOND: &[u8] = b"UNLOCK obj-7 now";
    model(|| {
        let mailbox = Arc::new(Mailbox::new());
        mailbox.post_request(REQUESTS[0], 1);

        let client = {
            let mailbox = Arc::clone(&mailbox);
            thread::spawn(move || mailbox.post_request(SECOND, 2))
        };

        let mut out = [0u8; 16];
        if let Some((seq, n)) = mailbox.take_request(0, &mut out) {
            let expected = if seq == 1 { REQUESTS[0] } else { SECOND };
            assert_eq!(&out[..n], expected, "request {seq} was taken torn");
        }
        client.join().unwrap();
        let (seq, n) = mailbox
            .take_request(1, &mut out)
            .expect("the finished request 2 is taken");
        assert_eq!((seq, &out[..n]), (2, SECOND));
    });
}

/// A client posts requests 1 and 2 into their lanes (1 and 2) back to back while the data
/// thread looks for its next request. Proves that `next_lane` hands them over in the order the
/// client numbered them: a single pass over the lanes can read lane 1 before request 1 lands and
/// lane 2 after request 2 does, run 2 first, and then never run 1 (it is below `last`). Fails
/// with one pass, and with two whose first loads only Relaxed.
#[test]
fn lanes_are_taken_in_the_order_the_client_numbered_them() {
    model(|| {
        // Built one at a time into the heap: four lanes sized for value blocks, every word a
        // loom atomic, outgrow a model thread's stack built as one array.
        let lanes: Arc<Vec<Mailbox>> = Arc::new((0..4).map(|_| Mailbox::new()).collect());
        let client = {
            let lanes = Arc::clone(&lanes);
            thread::spawn(move || {
                for (seq, request) in (1..).zip(REQUESTS) {
                    lanes[seq as usize % 4].post_request(request, seq);
                }
            })
        };
        let mut last = 0;
        let mut out = [0u8; 16];
        while last < REQUESTS.len() as u64 {
            let taken = next_lane(&lanes[..], last)
                .and_then(|(seq, mb)| Some((seq, mb.take_exact(seq, &mut out)?)));
            match taken {
                Some((seq, n)) => {
                    assert_eq!(
                        seq,
                        last + 1,
                        "request {seq} ran before request {}",
                        last + 1
                    );
                    assert_eq!(&out[..n], REQUESTS[seq as usize - 1]);
                    last = seq;
                }
                None => thread::yield_now(),
            }
        }
        client.join().unwrap();
    });
}

/// Two clients ring three slots, two in the same word and one in the next, while the data
/// thread drains twice, then once more after both finished. Proves that `fetch_or` and
/// `swap(0)` neither lose a bit nor invent one, and that a drain which happens after a ring
/// (here: after seeing the ringer's flag) reports it even though it first peeks with a relaxed
/// load.
#[test]
fn doorbell_scan_never_loses_a_ring() {
    /// What each client rings: slots 1 and 2 share word 0, slot 65 is in word 1.
    const RINGS: [&[u32]; 2] = [&[1, 65], &[2]];

    model(|| {
        let words = Arc::new(zeroed_words(2));
        let done: Arc<[AtomicBool; 2]> = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);

        let clients: Vec<_> = RINGS
            .iter()
            .enumerate()
            .map(|(c, slots)| {
                let (words, done) = (Arc::clone(&words), Arc::clone(&done));
                thread::spawn(move || {
                    let bells = Doorbells::new(&words);
                    for &slot in *slots {
                        bells.ring(slot);
                    }
                    // Release: a drain that sees this flag happens after the rings.
                    done[c].store(true, Ordering::Release);
                })
            })
            .collect();

        let bells = Doorbells::new(&words);
        let mut seen = [0u32; 128];
        for _ in 0..2 {
            let rang_before: Vec<bool> = done.iter().map(|d| d.load(Ordering::Acquire)).collect();
            bells.drain(|slot| seen[slot as usize] += 1);
            for (slots, _) in RINGS.iter().zip(rang_before).filter(|(_, rang)| *rang) {
                for &slot in *slots {
                    assert_eq!(seen[slot as usize], 1, "a ring before the drain was missed");
                }
            }
        }

        for client in clients {
            client.join().unwrap();
        }
        bells.drain(|slot| seen[slot as usize] += 1);
        for (slot, &times) in seen.iter().enumerate() {
            let rung = RINGS.iter().any(|slots| slots.contains(&(slot as u32)));
            assert_eq!(times, u32::from(rung), "slot {slot} seen {times} times");
        }
    });
}

/// A client rings and calls `wake_server` while the data thread runs `park_server` with the
/// doorbells as its work check. Proves the Dekker handshake of the module doc: if the data
/// thread's re-check (after raising `parked`) finds no work, the client's swap finds `parked`
/// raised and issues the wake; and after parking the ring is there to serve.
#[test]
fn park_and_wake_never_lose_a_wake_up() {
    model(|| {
        let header = Arc::new(ShmHeader::new());
        let words = Arc::new(zeroed_words(1));
        let client_done = Arc::new(AtomicBool::new(false));

        let client = {
            let (header, words, client_done) = (
                Arc::clone(&header),
                Arc::clone(&words),
                Arc::clone(&client_done),
            );
            thread::spawn(move || {
                Doorbells::new(&words).ring(SLOT);
                header.wake_server();
                client_done.store(true, Ordering::Release);
            })
        };

        let bells = Doorbells::new(&words);
        header.park_server(
            || {
                if bells.any() {
                    return true;
                }
                // The data thread decided to sleep. Sleep until the client has finished (a sleep
                // at least that long is always possible), then see whether it issued a wake: its
                // swap either followed our flag (read 1, left 0) or preceded it (read the old 0,
                // so our 1 is still there and nobody will wake us).
                while !client_done.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                assert_eq!(
                    header.parked.load(Ordering::Relaxed),
                    0,
                    "lost wake-up: the data thread sleeps with a rung bell and no wake issued"
                );
                false
            },
            || {},
        );
        assert_eq!(bells.drain(|_| {}), 1, "after parking, the ring is there");

        client.join().unwrap();
    });
}

/// The data thread posts a reply while the client is about to sleep on the response half's
/// `waiting` word, running `wait_response`'s own flag-then-re-check. Proves the same Dekker
/// handshake for replies: if the client's re-check misses the reply, `post_response` finds the
/// flag raised and issues the wake; and `wait_response` then returns the reply intact.
#[test]
fn response_sleep_handshake_never_loses_a_wake_up() {
    const REPLY: &[u8] = b"GRANTED!";

    model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let server_done = Arc::new(AtomicBool::new(false));

        let server = {
            let (mailbox, server_done) = (Arc::clone(&mailbox), Arc::clone(&server_done));
            thread::spawn(move || {
                mailbox.post_response(REPLY, 1);
                server_done.store(true, Ordering::Release);
            })
        };

        if mailbox.loom_raise_waiting(1) {
            // The client decided to sleep: hold it until the data thread is done, then see
            // whether a wake was issued (the swap read our 1 and left 0).
            while !server_done.load(Ordering::Acquire) {
                thread::yield_now();
            }
            assert_eq!(
                mailbox.loom_waiting().load(Ordering::Relaxed),
                0,
                "lost wake-up: the client sleeps with its reply posted and no wake issued"
            );
        }
        let mut out = [0u8; 16];
        let n = mailbox
            .wait_response(1, &mut out, None, std::time::Duration::ZERO)
            .expect("no deadline, so it waits for the reply");
        assert_eq!(&out[..n], REPLY, "the reply arrived torn");

        server.join().unwrap();
    });
}

/// A loom-visible stand-in for the runtime's job queues (`runtime/exchange.rs`): crossbeam's
/// `ArrayQueue` is not loom-instrumented, so this is one slot of it, used once, with crossbeam
/// 0.3.14's orderings on the steps the hand-offs rely on (`array_queue.rs`):
///
/// - `push` claims the slot with a SeqCst read-modify-write of `tail` (a CAS there), writes the
///   value, then publishes it with a Release store of the slot's `stamp`;
/// - `is_empty` compares SeqCst loads of `head` and `tail`;
/// - `pop` takes the value once an Acquire load of `stamp` shows it published; while a push has
///   claimed the slot but not yet published it (`tail` moved on), it spins, as crossbeam does.
///
/// The value is an atomic with relaxed accesses, so a missing Release/Acquire shows as a wrong
/// value rather than as loom's data-race report.
struct QueueStandIn {
    head: AtomicU64,
    tail: AtomicU64,
    stamp: AtomicU64,
    value: AtomicU64,
}

impl QueueStandIn {
    fn new() -> Self {
        let q = Self {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            stamp: AtomicU64::new(0),
            value: AtomicU64::new(0),
        };
        // The SeqCst loads in `is_empty` must not read loom's non-SeqCst initial stores after a
        // newer SeqCst write (see `zeroed_words`).
        q.head.store(0, Ordering::SeqCst);
        q.tail.store(0, Ordering::SeqCst);
        q
    }

    fn push(&self, value: u64) {
        self.tail.fetch_add(1, Ordering::SeqCst);
        self.value.store(value, Ordering::Relaxed);
        self.stamp.store(1, Ordering::Release);
    }

    fn is_empty(&self) -> bool {
        self.head.load(Ordering::SeqCst) == self.tail.load(Ordering::SeqCst)
    }

    fn pop(&self) -> Option<u64> {
        loop {
            if self.stamp.load(Ordering::Acquire) == 1 {
                let value = self.value.load(Ordering::Relaxed);
                self.head.fetch_add(1, Ordering::SeqCst);
                return Some(value);
            }
            if self.is_empty() {
                return None;
            }
            thread::yield_now(); // claimed, not yet published
        }
    }
}

/// The control thread hands a job to the data thread: it pushes onto the inbox, then calls
/// `wake_server` (`Control::submit`); the data thread, finding no work, runs `park_server` with
/// the runtime's re-check (`bells.any() || !inbox.is_empty()`, `runtime/data.rs`) and then takes
/// the job. Proves that the inbox push joins the Dekker handshake of `shm`'s module doc like a
/// doorbell ring: if the re-check misses the job, `wake_server` finds `parked` raised and wakes;
/// and the job the data thread takes is the one handed over, intact.
///
/// What it covers: the production `wake_server` and `park_server` around a queue whose push,
/// emptiness check and pop carry `ArrayQueue`'s orderings (`QueueStandIn`), in the order the
/// runtime calls them. What it cannot: `ArrayQueue` itself (its multi-slot laps and contention
/// between producers are not modelled), the closure in `data.rs` and `Control::submit` (private;
/// the model repeats their steps), mio's waker for the way back (an eventfd counter, which
/// cannot lose a wake-up, and the control thread polls with a timeout besides), and the flag
/// store and swap inside park/wake (see the module doc).
///
/// Checked locally: making the stand-in's loads in `is_empty` Acquire, or its `tail`
/// read-modify-write AcqRel (a queue that is not SeqCst where `ArrayQueue` is), fails it with a
/// lost wake-up, as do waking before pushing and leaving `!inbox.is_empty()` out of the
/// re-check; making the `stamp` store Relaxed fails it with a torn job. Each such lost wake-up would delay the job by
/// up to the data thread's park timeout (`PARK_MAX`, 50 ms); none would hang it.
#[test]
fn inbox_hand_off_and_park_never_lose_a_job() {
    const JOB: u64 = 0x0b5e_55ed_c0de_f00d;

    model(|| {
        let header = Arc::new(ShmHeader::new());
        let inbox = Arc::new(QueueStandIn::new());
        let words = Arc::new(zeroed_words(1));
        let control_done = Arc::new(AtomicBool::new(false));

        let control = {
            let (header, inbox, control_done) = (
                Arc::clone(&header),
                Arc::clone(&inbox),
                Arc::clone(&control_done),
            );
            thread::spawn(move || {
                inbox.push(JOB);
                header.wake_server();
                control_done.store(true, Ordering::Release);
            })
        };

        let bells = Doorbells::new(&words);
        header.park_server(
            || {
                if bells.any() || !inbox.is_empty() {
                    return true;
                }
                // The data thread decided to sleep: hold it until the control thread has finished,
                // then see whether a wake was issued (as in `park_and_wake_never_lose_a_wake_up`).
                while !control_done.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                assert_eq!(
                    header.parked.load(Ordering::Relaxed),
                    0,
                    "lost wake-up: the data thread sleeps with a job queued and no wake issued"
                );
                false
            },
            || {},
        );
        assert_eq!(
            inbox.pop(),
            Some(JOB),
            "after parking, the job is there, intact"
        );

        control.join().unwrap();
    });
}

/// A slot changes owner: the data thread serves the previous owner's last request, then
/// registers a new client in the same slot and hands it the slot through the outbox (the
/// registration reply); the new owner takes the mailbox over with `current_seq` and sends its
/// first request. Proves that the takeover never reuses a sequence number: the data thread
/// (whose last request taken in the slot, `Routing::mailbox_seq`, is the previous owner's) finds the new request fresh and intact, and the
/// new owner never accepts the previous owner's reply as its own (the race of the regression
/// test `a_client_in_a_reused_slot_never_takes_the_previous_owners_reply`).
///
/// What it covers: the production mailbox functions on both sides, with the registration reply
/// carried by `QueueStandIn` (the outbox's `ArrayQueue` orderings). The previous owner's round
/// trip runs on the data thread's side here, before the registration, so only the
/// registration reply orders it before the new owner. What it cannot: the socket the reply
/// crosses after the outbox (the kernel orders it), and a previous owner in another process
/// that still writes after it was deregistered (no ordering can help there).
///
/// Checked locally: making the stand-in's `stamp` store Relaxed (a registration reply that does
/// not publish what came before it) fails it, the new owner acting on a stale view (in the run
/// checked, it rang a slot number from before the push); having the new owner start at 1 instead
/// of above `current_seq` fails it by taking the previous owner's reply. Making `current_seq`'s
/// loads Relaxed still passes: the numbers it must see were written or read by the data thread
/// before the registration, so coherence gives them; its Acquire orders nothing the takeover
/// needs.
#[test]
fn a_new_slot_owner_takes_the_mailbox_over_above_the_previous_owner() {
    const OLD: [&[u8]; 2] = [b"LOCK obj-7 excl!", b"GRANTED!"];
    const NEW: [&[u8]; 2] = [b"UNLOCK 9", b"RELEASED obj-9 !"];

    model(|| {
        let mailbox = Arc::new(Mailbox::new());
        let words = Arc::new(zeroed_words(1));
        let outbox = Arc::new(QueueStandIn::new());

        // Spawned first, so nothing the data thread does below is ordered before the new
        // owner by the spawn itself.
        let new_owner = {
            let (mailbox, words, outbox) = (
                Arc::clone(&mailbox),
                Arc::clone(&words),
                Arc::clone(&outbox),
            );
            thread::spawn(move || {
                let slot = loop {
                    match outbox.pop() {
                        Some(slot) => break slot as u32,
                        None => thread::yield_now(),
                    }
                };
                let seq = mailbox.current_seq() + 1;
                mailbox.post_request(NEW[0], seq);
                Doorbells::new(&words).ring(slot);
                let mut out = [0u8; 16];
                let n = loop {
                    match mailbox.try_response(seq, &mut out) {
                        Some(n) => break n,
                        None => thread::yield_now(),
                    }
                };
                assert_eq!(
                    &out[..n],
                    NEW[1],
                    "the new owner took another reply as its own"
                );
            })
        };

        let bells = Doorbells::new(&words);
        let mut out = [0u8; 16];
        // The previous owner's last round trip (request 1), then its registration ends.
        mailbox.post_request(OLD[0], 1);
        bells.ring(SLOT);
        let mut last = 0;
        bells.drain(|_| {
            let (seq, _) = mailbox.take_request(last, &mut out).expect("request 1");
            last = seq;
            mailbox.post_response(OLD[1], seq);
        });
        // The new client registers in the same slot; the reply carries the slot.
        outbox.push(SLOT as u64);
        let mut served = false;
        while !served {
            let rang = bells.drain(|slot| {
                assert_eq!(slot, SLOT);
                let (seq, n) = mailbox
                    .take_request(last, &mut out)
                    .expect("the new owner's request is fresh: its number is not the last taken");
                assert_eq!(&out[..n], NEW[0], "the new owner's request arrived torn");
                last = seq;
                mailbox.post_response(NEW[1], seq);
                served = true;
            });
            if rang == 0 {
                thread::yield_now();
            }
        }

        new_owner.join().unwrap();
    });
}
