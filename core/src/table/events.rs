//! The per-client event rings: what the data thread tells a client unasked (revokes of its
//! cached grants), one fixed ring per client slot in the region.
//!
//! Every client slot has a ring whatever its transport, so the data thread has one way to send
//! an event: it writes it into the holder's ring. A shared-memory client reads its ring in
//! place; a stream or RDMA transport drains the ring of each of its clients after the data
//! thread's turn into one event message per client (`proto::event`), which is where revokes of
//! many locks to one client are batched.
//!
//! # One ring (144 64-bit words, 1,152 bytes)
//!
//! | words    | field                                                              | written by  |
//! |----------|--------------------------------------------------------------------|-------------|
//! | 0        | `head`: events ever written                                        | data thread |
//! | 1        | `overflows`: events ever dropped for want of room                  | data thread |
//! | 2..8     | spare (the line is the producer's)                                 |             |
//! | 8        | `tail`: events ever read                                           | the reader  |
//! | 9..16    | spare (the line is the consumer's)                                 |             |
//! | 16..144  | [`EVENT_RING_LEN`] entries of two words: `proto::encode_event`'s 16 bytes |     |
//!
//! Single writer per word, no compare-and-swap (the mailbox protocol's style): the data thread
//! writes entry `head % len`, then stores `head + 1` with `Release`; the reader loads `head`
//! with `Acquire`, reads the entry, and stores `tail + 1` with `Release`; the data thread loads
//! `tail` with `Acquire` before it reuses an entry. With no room it bumps `overflows` instead
//! and drops the event: the reader compares `overflows` with the value it saw last, and a
//! change means "events were lost, re-check everything cached" (`manager::cache`). Dropping is
//! never unsafe, only slower, and it keeps the ring — and the server's memory — bounded.
//!
//! 64 entries hold two full batches of row-group conflicts (31 each) between two polls of a
//! client that polls on every call; at 1,000 clients the rings are 1.15 MB.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::proto::{EVENT_LEN, Event, decode_event, encode_event};

/// Entries in one client's ring (a power of two).
pub const EVENT_RING_LEN: usize = 64;
/// 64-bit words per ring.
pub const EVENT_RING_WORDS: usize = ENTRIES_AT + 2 * EVENT_RING_LEN;

const HEAD: usize = 0;
const OVERFLOWS: usize = 1;
const TAIL: usize = 8;
const ENTRIES_AT: usize = 16;

static_assertions::const_assert!(EVENT_RING_LEN.is_power_of_two());
static_assertions::const_assert_eq!(EVENT_RING_WORDS * 8, 1152);
static_assertions::const_assert_eq!(EVENT_LEN, 16);

/// One client's ring, over its words in the region (module doc: the layout).
#[derive(Clone, Copy, Debug)]
pub struct EventRing<'r> {
    words: &'r [AtomicU64],
}

impl<'r> EventRing<'r> {
    /// The ring in `words` (exactly [`EVENT_RING_WORDS`] of them; `None` otherwise). A reader
    /// in another process builds it over its own mapping of the region.
    pub fn new(words: &'r [AtomicU64]) -> Option<Self> {
        (words.len() == EVENT_RING_WORDS).then_some(Self { words })
    }

    /// The data thread's side: writes `event`, or counts an overflow when the ring is full;
    /// returns whether it was written.
    pub fn push(&self, event: &Event) -> bool {
        // Relaxed: only this thread writes `head`.
        let head = self.words[HEAD].load(Ordering::Relaxed);
        // Acquire: pairs with the reader's Release of `tail`, so its reads of the entry we are
        // about to reuse are done.
        let tail = self.words[TAIL].load(Ordering::Acquire);
        if head.wrapping_sub(tail) >= EVENT_RING_LEN as u64 {
            // Release: a reader that sees the new count also sees every entry written before.
            self.words[OVERFLOWS].fetch_add(1, Ordering::Release);
            return false;
        }
        let at = ENTRIES_AT + 2 * (head as usize % EVENT_RING_LEN);
        let bytes = encode_event(event);
        let (halves, _) = bytes.as_chunks::<8>();
        // Relaxed: published by the Release store of `head` below.
        self.words[at].store(u64::from_le_bytes(halves[0]), Ordering::Relaxed);
        self.words[at + 1].store(u64::from_le_bytes(halves[1]), Ordering::Relaxed);
        // Release: the entry's words are visible to a reader that sees the new `head`.
        self.words[HEAD].store(head.wrapping_add(1), Ordering::Release);
        true
    }

    /// The reader's side: the next event, if any. An entry that does not decode (only a bug or
    /// a scribbled region writes one) is skipped and reported as an overflow, which makes the
    /// reader re-check everything: never a panic, never a lost revoke left unnoticed.
    pub fn pop(&self) -> Option<Event> {
        // Relaxed: only the reader writes `tail`.
        let tail = self.words[TAIL].load(Ordering::Relaxed);
        // Acquire: pairs with the data thread's Release of `head`: the entry is written.
        let head = self.words[HEAD].load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let at = ENTRIES_AT + 2 * (tail as usize % EVENT_RING_LEN);
        let mut bytes = [0u8; EVENT_LEN];
        bytes[..8].copy_from_slice(&self.words[at].load(Ordering::Relaxed).to_le_bytes());
        bytes[8..].copy_from_slice(&self.words[at + 1].load(Ordering::Relaxed).to_le_bytes());
        // Release: the data thread may reuse the entry once it sees the new `tail`.
        self.words[TAIL].store(tail.wrapping_add(1), Ordering::Release);
        Some(decode_event(&bytes).unwrap_or(Event::Overflow))
    }

    /// Events dropped for want of room since the ring was cleared (monotonic).
    pub fn overflows(&self) -> u64 {
        // Acquire: pairs with the Release increment in `push`.
        self.words[OVERFLOWS].load(Ordering::Acquire)
    }

    /// Events written and not yet read.
    pub fn pending(&self) -> u64 {
        // Acquire on both: a count, read by either side; either load may be stale by the time
        // it is used, which only makes the count a moment old.
        let head = self.words[HEAD].load(Ordering::Acquire);
        head.wrapping_sub(self.words[TAIL].load(Ordering::Acquire))
    }

    /// Empties the ring and its overflow count, for a slot's next client. Only while no reader
    /// is attached (the slot is being freed), so the data thread may write the reader's word.
    pub(crate) fn clear(&self) {
        // Relaxed: nobody else reads or writes the ring while its slot changes hands; the
        // slot's next registration is published to its client by the control path's reply.
        for w in [HEAD, OVERFLOWS, TAIL] {
            self.words[w].store(0, Ordering::Relaxed);
        }
    }
}

/// Every client slot's ring.
#[derive(Debug)]
pub struct EventRings<'r> {
    words: &'r [AtomicU64],
}

impl<'r> EventRings<'r> {
    /// The rings over `words` (`clients × EVENT_RING_WORDS`).
    pub fn new(words: &'r [AtomicU64]) -> Self {
        Self { words }
    }

    /// Client slot `slot`'s ring (`None` past the table).
    pub fn ring(&self, slot: u32) -> Option<EventRing<'r>> {
        let start = (slot as usize).checked_mul(EVENT_RING_WORDS)?;
        EventRing::new(self.words.get(start..start + EVENT_RING_WORDS)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LockId, Mode};

    fn revoke(n: u32) -> Event {
        Event::Revoke {
            lock: LockId::new(n, 1),
            wanted: Mode::Exclusive,
            fence: u64::from(n) << 20,
        }
    }

    #[test]
    fn events_come_out_in_order_and_a_full_ring_counts_overflows() {
        let words: [AtomicU64; EVENT_RING_WORDS] = core::array::from_fn(|_| AtomicU64::new(0));
        let ring = EventRing::new(&words).unwrap();
        assert_eq!(ring.pop(), None);
        for round in 0..3u32 {
            for i in 0..EVENT_RING_LEN as u32 {
                assert!(ring.push(&revoke(round * 100 + i + 1)));
            }
            assert!(!ring.push(&revoke(999)), "a full ring refuses");
            assert_eq!(ring.overflows(), u64::from(round) + 1);
            assert_eq!(ring.pending(), EVENT_RING_LEN as u64);
            for i in 0..EVENT_RING_LEN as u32 {
                assert_eq!(ring.pop(), Some(revoke(round * 100 + i + 1)));
            }
            assert_eq!(ring.pop(), None);
        }
        ring.clear();
        assert_eq!((ring.overflows(), ring.pending()), (0, 0));
    }

    #[test]
    fn a_scribbled_entry_reads_as_an_overflow() {
        let words: [AtomicU64; EVENT_RING_WORDS] = core::array::from_fn(|_| AtomicU64::new(0));
        let ring = EventRing::new(&words).unwrap();
        assert!(ring.push(&revoke(1)));
        words[ENTRIES_AT].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(ring.pop(), Some(Event::Overflow));
        assert!(EventRing::new(&words[1..]).is_none());
        let rings = EventRings::new(&words);
        assert!(rings.ring(0).is_some() && rings.ring(1).is_none());
    }
}
