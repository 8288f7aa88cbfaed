//! Transaction ids and commit sequence numbers (CSNs) from `umo_atomic64` counters.
//!
//! This module owns two allocators, each over one named counter object ([`TxnIdAllocator`] on
//! `txn-id`, [`CsnAllocator`] on `csn` by default), and the hook that carries them across a
//! server failover ([`HighWaterMark`]). It reaches the server only through the one [`Client`]
//! each allocator is opened with; it never touches the region or the server's tables.
//!
//! # What is guaranteed
//!
//! - **Unique.** No value is handed out twice by any allocator on the same counter, whatever the
//!   client or process, for as long as the counter object lives — and across a server restart
//!   when the engine persists and restores the high-water mark.
//! - **Transaction ids increase per handle, not globally.** A [`TxnIdHandle`] leases a block of
//!   ids with one fetch-and-add and hands them out in order with a plain add, so each handle's
//!   ids strictly increase, and one allocator hands its blocks out in increasing order. Two
//!   handles interleave, though: a later `next()` on one handle may return less than an earlier
//!   one on another. No global order is possible with leasing; that is what CSNs are for.
//! - **CSNs are linearizable.** [`CsnAllocator::next`] takes its value from the counter in a
//!   fetch-and-add that happens during the call (no leasing), so when one call returns before
//!   another starts — in any thread, client or process — the later call gets the larger CSN.
//!   [`CsnAllocator::snapshot`] returns a CSN `s` ≥ every CSN handed out before the call and
//!   < every CSN handed out by a call that starts after it returns: a reader with snapshot `s`
//!   sees exactly the commits with CSN ≤ `s` (that have finished writing, which is the engine's
//!   business).
//! - Values are not dense: a dropped handle's lease, a failed persist, a restart leave gaps.
//!
//! # One request in flight per client
//!
//! A [`Client`] is single-threaded, so worker threads share an allocator's client through a
//! front that works like Percolator's timestamp oracle (Peng and Dabek, OSDI 2010, §2.4):
//! requests that arrive while a round trip is in flight join the next batch; when the round trip
//! returns, one member leads that batch with a single fetch-and-add of the batch's total, and
//! every member takes its slice in arrival order. Only requests that joined a batch before it
//! was sent receive its values. That is what keeps CSNs linearizable: a pool of leftovers would
//! hand a late caller a CSN below a snapshot taken before its call began. (Over shared memory a
//! fetch-and-add takes tens of nanoseconds and batches are mostly of one; over TCP every thread
//! that asks during a round trip of tens of microseconds shares the next one.)
//!
//! # Block size
//!
//! Each handle sizes its next lease from how fast it used the last one
//! ([`BlockPolicy::next_len`]):
//!
//! | the refill comes, after the previous one, | next block |
//! |---|---|
//! | within `grow_within_us` (1 ms) | doubled, up to `len_max` (2^20) |
//! | after more than `shrink_after_us` (100 ms) | halved, down to `len_min` (64) |
//! | otherwise | the same |
//!
//! A block used up within a millisecond means round trips are a visible share of the work; a
//! block that lasts longer than 100 ms buys nothing and costs gaps on a crash and skew between
//! workers' ids.
//!
//! # Surviving a failover: the high-water mark
//!
//! Before handing out any value ≥ the last persisted mark, the leader of a batch calls
//! [`HighWaterMark::persist`] with a new mark: the end of the fetched range rounded up to a
//! multiple of `hwm_step` (default 1,000,000, so one record per million values). The persisted
//! mark therefore always exceeds every value that may have been handed out. At open the
//! allocator reads [`HighWaterMark::restore`] and moves the counter forward to at least that
//! mark (creating the object with it, or compare-and-swap forward, never back), so the first
//! value after a restart is above every value issued before it. Each allocator persists what it
//! fetched; an engine with allocators in several processes restores from the largest mark.
//!
//! # Keeping the counter alive
//!
//! A one-sided fetch-and-add never reaches the server, which evicts a client silent for its lease
//! (5 s by default) and drops an object with its last reference. So a round trip renews both
//! (`atomic64_get`) every `renew_every`, and an allocator that may sit idle longer than the
//! client lease needs `keep_alive()` from the engine's timer.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::Status;
use dlock_core::config::NAME_LEN_MAX;
use dlock_transport::client::{Client, Connection};

mod counter;

use counter::Counter;

/// A transaction id: unique, and increasing along each [`TxnIdHandle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TxnId(pub u64);

/// A commit sequence number: unique and linearizable (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Csn(pub u64);

/// Where the engine keeps an allocator's high-water mark (its WAL or control file).
pub trait HighWaterMark: Send + Sync + fmt::Debug {
    /// The mark persisted last, or 0 when there is none (a new database).
    fn restore(&self) -> Result<u64, Status>;

    /// Durably records `mark`: no value ≥ `mark` has been handed out. Called by one thread at a
    /// time with increasing marks, before any value that needs it is handed out. An error fails
    /// the requests that needed the new mark; their values are skipped, never handed out.
    fn persist(&self, mark: u64) -> Result<(), Status>;
}

/// A shared mark store (the engine keeps one handle, the allocator another).
impl<T: HighWaterMark + ?Sized> HighWaterMark for Arc<T> {
    fn restore(&self) -> Result<u64, Status> {
        (**self).restore()
    }

    fn persist(&self, mark: u64) -> Result<(), Status> {
        (**self).persist(mark)
    }
}

/// No persistence: values are unique only while the counter object lives, which is enough for
/// tests and for ids that never outlive the server.
#[derive(Clone, Copy, Debug, Default)]
pub struct Volatile;

impl HighWaterMark for Volatile {
    fn restore(&self) -> Result<u64, Status> {
        Ok(0)
    }

    fn persist(&self, _mark: u64) -> Result<(), Status> {
        Ok(())
    }
}

/// How a [`TxnIdHandle`] sizes its leases (see the table in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPolicy {
    /// The first and the smallest block.
    pub len_min: u64,
    /// The largest block; at most [`BlockPolicy::LEN_LIMIT`].
    pub len_max: u64,
    /// A refill this soon after the previous one doubles the block.
    pub grow_within_us: u64,
    /// A refill later than this after the previous one halves the block.
    pub shrink_after_us: u64,
}

impl BlockPolicy {
    /// 64 to 2^20 ids; doubled within 1 ms, halved after 100 ms.
    pub const DEFAULT: BlockPolicy = BlockPolicy {
        len_min: 64,
        len_max: 1 << 20,
        grow_within_us: 1_000,
        shrink_after_us: 100_000,
    };

    /// The largest `len_max` accepted: a batch's total (blocks of at most this, one per waiting
    /// thread) then cannot overflow a `u64`.
    pub const LEN_LIMIT: u64 = 1 << 32;

    /// The block to lease next, after one of `len` was used up `since_last_refill_us` after the
    /// refill before it. Time is passed in so the policy can be tested without a clock.
    #[must_use]
    pub fn next_len(&self, len: u64, since_last_refill_us: u64) -> u64 {
        let len = if since_last_refill_us < self.grow_within_us {
            len.saturating_mul(2)
        } else if since_last_refill_us > self.shrink_after_us {
            len / 2
        } else {
            len
        };
        len.clamp(self.len_min, self.len_max)
    }
}

/// Settings of one allocator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdConfig {
    /// The counter object's name (1 to 512 bytes).
    pub name: Vec<u8>,
    /// The smallest value ever handed out (at least 1, so `snapshot()` of an unused CSN counter
    /// is `first - 1` and never wraps).
    pub first: u64,
    /// Marks are persisted in multiples of this.
    pub hwm_step: u64,
    /// The lease of the allocator's reference to the counter object (whole seconds on the wire,
    /// rounded up, as the reference's `umo_atomic64` leases are).
    pub object_lease: Duration,
    /// A round trip renews the client and the object reference when this much has passed since
    /// the last renewal; must be well within the client lease and `object_lease`.
    pub renew_every: Duration,
    /// Block sizes (transaction ids only; CSNs are never leased).
    pub block: BlockPolicy,
}

impl IdConfig {
    /// Defaults for a counter named `name`: values from 1, marks every 1,000,000, a 30 s object
    /// lease renewed every second.
    pub fn named(name: &[u8]) -> Self {
        Self {
            name: name.to_vec(),
            first: 1,
            hwm_step: 1_000_000,
            object_lease: Duration::from_secs(30),
            renew_every: Duration::from_secs(1),
            block: BlockPolicy::DEFAULT,
        }
    }

    /// Defaults for transaction ids (object `txn-id`).
    pub fn txn_ids() -> Self {
        Self::named(b"txn-id")
    }

    /// Defaults for CSNs (object `csn`).
    pub fn csns() -> Self {
        Self::named(b"csn")
    }

    /// The object lease in the whole seconds the wire carries (the core's one rounding rule:
    /// up, saturating).
    fn object_lease_s(&self) -> u32 {
        dlock_core::time::duration_to_s(self.object_lease)
    }

    /// Checks every field; `Err(Status::Einval)` when one is out of range.
    pub fn validate(&self) -> Result<(), Status> {
        let b = &self.block;
        let ok = (1..=NAME_LEN_MAX).contains(&self.name.len())
            && self.first >= 1
            && self.hwm_step >= 1
            && !self.renew_every.is_zero()
            && self.renew_every < self.object_lease
            && self.object_lease <= Duration::from_secs(u32::MAX.into())
            && 1 <= b.len_min
            && b.len_min <= b.len_max
            && b.len_max <= BlockPolicy::LEN_LIMIT;
        if ok { Ok(()) } else { Err(Status::Einval) }
    }
}

/// An allocator's counters, for tests and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdStats {
    /// Requests that reached the front: block refills, CSN `next`, `snapshot`, `keep_alive`.
    pub requests: u64,
    /// Round trips to the counter; `requests - round_trips` requests were coalesced.
    pub round_trips: u64,
    /// Most requests one round trip served.
    pub batch_max: u64,
    /// Values reserved on the counter.
    pub values_reserved: u64,
    /// Calls to [`HighWaterMark::persist`] that succeeded.
    pub persists: u64,
    /// The mark persisted last (or restored at open): every value handed out is below it.
    pub mark: u64,
}

/// A batch that has been answered, with members yet to take their slice.
#[derive(Debug)]
struct Answer {
    seq: u64,
    base: Result<u64, Status>,
    uncollected: u64,
}

/// Everything the front's mutex guards.
#[derive(Debug, Default)]
struct State {
    /// The counter; `None` while a round trip is in flight (one per client). Its client is
    /// boxed ([`Counter`]): a `Client` carries its message buffers inline, and moving it in and
    /// out for every round trip cost more than the round trip itself over shared memory.
    counter: Option<Counter>,
    /// A leader panicked with the client: from then on every request fails.
    broken: bool,
    /// The batch being gathered: its sequence number, values asked, members.
    open_seq: u64,
    open_sum: u64,
    open_members: u64,
    /// Answered batches whose other members have not yet woken to collect.
    answered: VecDeque<Answer>,
    /// Threads blocked in `request` (so an uncontended round trip skips the wake-up call).
    waiting: u32,
    stats: IdStats,
}

/// The shared part of an allocator: the client, the batching, the mark.
#[derive(Debug)]
struct Front {
    cfg: IdConfig,
    hwm: Box<dyn HighWaterMark>,
    state: Mutex<State>,
    answered: Condvar,
}

impl Front {
    fn open(
        client: Box<dyn counter::CounterClient>,
        cfg: IdConfig,
        hwm: Box<dyn HighWaterMark>,
    ) -> Result<Front, Status> {
        cfg.validate()?;
        let floor = hwm.restore()?.max(cfg.first);
        let counter = Counter::open(client, &cfg, floor)?;
        Ok(Front {
            state: Mutex::new(State {
                counter: Some(counter),
                stats: IdStats {
                    mark: floor,
                    ..IdStats::default()
                },
                ..State::default()
            }),
            cfg,
            hwm,
            answered: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Only a leader's guard could panic while holding the lock, and it marks the state
        // broken first; the data stays consistent, so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stats(&self) -> IdStats {
        self.lock().stats
    }

    /// Reserves `want` consecutive values (0: only reads the counter) and returns the first, in
    /// a batch with every request that joins before the batch is sent.
    fn request(&self, want: u64) -> Result<u64, Status> {
        let mut st = self.lock();
        st.stats.requests += 1;
        let (seq, offset) = (st.open_seq, st.open_sum);
        st.open_sum += want;
        st.open_members += 1;
        loop {
            if let Some(at) = st.answered.iter().position(|a| a.seq == seq) {
                let answer = &mut st.answered[at];
                let base = answer.base;
                answer.uncollected -= 1;
                if answer.uncollected == 0 {
                    st.answered.remove(at);
                }
                return base.map(|b| b + offset);
            }
            if st.broken {
                return Err(Status::BadResponse);
            }
            if st.counter.is_some() {
                // Batches are sent one at a time and answered before the counter comes back,
                // so ours is still the open one.
                debug_assert_eq!(st.open_seq, seq);
                return self.lead(st, offset);
            }
            st.waiting += 1;
            st = self
                .answered
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
            st.waiting -= 1;
        }
    }

    /// Sends the open batch (the caller is a member) and answers it.
    fn lead(&self, mut st: MutexGuard<'_, State>, offset: u64) -> Result<u64, Status> {
        let mut lead = Lead {
            front: self,
            counter: st.counter.take(),
            seq: st.open_seq,
            members: st.open_members,
            want: st.open_sum,
            mark: st.stats.mark,
            base: None,
        };
        st.open_seq += 1;
        st.open_sum = 0;
        st.open_members = 0;
        drop(st);
        let base = lead.round_trip();
        lead.base = Some(base);
        drop(lead);
        base.map(|b| b + offset)
    }
}

/// A batch's leader while its round trip is in flight. Dropping it answers the batch, also when
/// unwinding from a panic in the client or the hook.
struct Lead<'a> {
    front: &'a Front,
    counter: Option<Counter>,
    seq: u64,
    members: u64,
    want: u64,
    /// The mark, persisted anew by this round trip if above the one in the stats.
    mark: u64,
    base: Option<Result<u64, Status>>,
}

impl Lead<'_> {
    /// One fetch-and-add of the batch's total (or a read, when it asks for nothing), and the new
    /// mark persisted before any of the values is handed out.
    fn round_trip(&mut self) -> Result<u64, Status> {
        let cfg = &self.front.cfg;
        let counter = self.counter.as_mut().expect("the leader holds the counter");
        counter.renew_if_due(cfg, self.mark, Instant::now())?;
        if self.want == 0 {
            return counter.client.snapshot(counter.object);
        }
        let base = counter.client.faa(counter.object, self.want)?;
        // The counter wrapped: 2^64 values are spent, so refuse rather than repeat one.
        let end = base.checked_add(self.want).ok_or(Status::Einval)?;
        if end > self.mark {
            let mark = end
                .div_ceil(cfg.hwm_step)
                .checked_mul(cfg.hwm_step)
                .ok_or(Status::Einval)?;
            self.front.hwm.persist(mark)?;
            self.mark = mark;
        }
        Ok(base)
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut st = self.front.lock();
        let base = match self.base.take() {
            Some(base) => {
                st.counter = self.counter.take();
                base
            }
            // Unwinding: the client's state is unknown, so stop serving rather than risk
            // handing a value out twice; the engine opens a new allocator.
            None => {
                st.broken = true;
                Err(Status::BadResponse)
            }
        };
        let stats = &mut st.stats;
        stats.round_trips += 1;
        stats.batch_max = stats.batch_max.max(self.members);
        if base.is_ok() {
            stats.values_reserved += self.want;
        }
        if self.mark > stats.mark {
            stats.persists += 1;
            stats.mark = self.mark;
        }
        if self.members > 1 {
            st.answered.push_back(Answer {
                seq: self.seq,
                base,
                uncollected: self.members - 1,
            });
        }
        if st.waiting > 0 {
            self.front.answered.notify_all();
        }
    }
}

/// What both allocators do the same way: open, stats, keep-alive.
macro_rules! allocator_common {
    ($allocator:ident) => {
        impl $allocator {
            /// Opens the counter `cfg.name` through `client` (creating it if needed) and moves
            /// it past the mark `hwm` restores. The client serves this allocator only from now on.
            /// It may be a client of one server or, with feature `cluster`, of a cluster
            /// (`EmbeddedServer::cluster_client`), whose counters' owners never hand a value
            /// out twice across failovers.
            pub fn open<C: Connection + Send + 'static>(
                client: Client<C>,
                cfg: IdConfig,
                hwm: impl HighWaterMark + 'static,
            ) -> Result<$allocator, Status> {
                let front = Front::open(Box::new(client), cfg, Box::new(hwm))?;
                Ok($allocator {
                    front: Arc::new(front),
                })
            }

            /// The allocator's counters.
            pub fn stats(&self) -> IdStats {
                self.front.stats()
            }

            /// Renews the client and the counter object if due: call it from a timer when the
            /// allocator may sit idle longer than the client lease. Costs a read of the counter.
            pub fn keep_alive(&self) -> Result<(), Status> {
                self.front.request(0).map(drop)
            }
        }
    };
}

allocator_common!(TxnIdAllocator);
allocator_common!(CsnAllocator);

/// Transaction ids leased in blocks: share it (it is cheap to clone) and give each worker thread
/// its own [`TxnIdHandle`].
///
/// ```
/// # use dlock_engine_glue::EmbeddedServer;
/// # use dlock_engine_glue::dlock_core::Config;
/// # let server = EmbeddedServer::start(EmbeddedServer::config(Config {
/// #     locks_max: 256, clients_max: 8, objects_max: 8, ..Config::default()
/// # }))?;
/// use dlock_engine_glue::{IdConfig, TxnIdAllocator, Volatile};
///
/// let xids = TxnIdAllocator::open(server.client()?, IdConfig::txn_ids(), Volatile)?;
/// let mut worker = xids.handle(); // one per worker thread
/// let a = worker.next()?;
/// let b = worker.next()?; // from the leased block: no round trip
/// assert!(b > a);
/// # server.shutdown();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct TxnIdAllocator {
    front: Arc<Front>,
}

impl TxnIdAllocator {
    /// A handle for one worker thread; it leases its first block at its first `next()`.
    pub fn handle(&self) -> TxnIdHandle {
        TxnIdHandle {
            next: 0,
            end: 0,
            block_len: self.front.cfg.block.len_min,
            refilled: None,
            front: Arc::clone(&self.front),
        }
    }
}

/// One worker's source of transaction ids: hands out its leased block with a plain add and
/// refills it through the shared allocator. Its ids strictly increase.
#[derive(Debug)]
pub struct TxnIdHandle {
    /// The leased block still to hand out: `next..end`.
    next: u64,
    end: u64,
    /// The length of the next lease.
    block_len: u64,
    /// When the current block arrived.
    refilled: Option<Instant>,
    front: Arc<Front>,
}

impl TxnIdHandle {
    /// The next transaction id: from the leased block when one is left, else after a refill.
    // Not `Iterator::next`: a refill can fail, and an iterator would have to hide the status.
    #[allow(clippy::should_implement_trait)]
    #[inline]
    pub fn next(&mut self) -> Result<TxnId, Status> {
        if self.next < self.end {
            let id = self.next;
            self.next += 1;
            return Ok(TxnId(id));
        }
        self.next_slow()
    }

    #[cold]
    fn next_slow(&mut self) -> Result<TxnId, Status> {
        if let Some(refilled) = self.refilled {
            let since_us = u64::try_from(refilled.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.block_len = self.front.cfg.block.next_len(self.block_len, since_us);
        }
        let base = self.front.request(self.block_len)?;
        self.refilled = Some(Instant::now());
        self.next = base + 1;
        self.end = base + self.block_len;
        Ok(TxnId(base))
    }

    /// The length of the next lease (it grows under demand, see [`BlockPolicy`]).
    pub fn block_len(&self) -> u64 {
        self.block_len
    }

    /// Ids left in the current lease.
    pub fn leased(&self) -> u64 {
        self.end - self.next
    }
}

/// Commit sequence numbers: one fetch-and-add per `next()` (batched with concurrent callers),
/// never leased. Share it between threads (it is cheap to clone).
#[derive(Clone, Debug)]
pub struct CsnAllocator {
    front: Arc<Front>,
}

impl CsnAllocator {
    /// A commit CSN, larger than every CSN handed out before this call started.
    pub fn next(&self) -> Result<Csn, Status> {
        self.front.request(1).map(Csn)
    }

    /// A read CSN: ≥ every CSN handed out before this call started, < every CSN handed out by
    /// a call that starts after it returns.
    pub fn snapshot(&self) -> Result<Csn, Status> {
        // The front answers a read with the next value a commit would get; the counter starts
        // at `first` ≥ 1, so the subtraction cannot wrap unless the object was tampered with.
        self.front
            .request(0)
            .map(|next| Csn(next.saturating_sub(1)))
    }
}
