//! Who a partition's new owner waits for (`cluster.rs`'s module doc): the client ids of each
//! old owner, tracked in a table of [`RECLAIM_CLIENTS_MAX`] entries with one bit per
//! (partition, entry), and the gauges an operator watches a recovery by.

use super::cluster::{ClusterCore, RECLAIM_CLIENTS_MAX};
use crate::cluster::{Map, PARTITIONS_MAX, ServerId};

/// What the recovering partitions await, for the gauges an operator watches a recovery by
/// (`reclaim_awaited`, `reclaim_awaited_max`, `reclaim_untracked`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Awaited {
    pub(super) sum: u64,
    pub(super) max: u64,
    pub(super) untracked: u64,
}

impl Awaited {
    /// Adds a recovering partition that awaits `awaiting` clients ([`super::PartState::awaiting`]).
    pub(super) fn add(&mut self, awaiting: u32) {
        if awaiting == u32::MAX {
            self.untracked += 1;
        } else {
            self.sum += u64::from(awaiting);
            self.max = self.max.max(u64::from(awaiting));
        }
    }
}

impl ClusterCore<'_> {
    pub(super) fn tracked_index(&self, client: u32) -> Option<usize> {
        self.side.expected[..self.expected_len]
            .iter()
            .position(|&c| c == client)
    }

    pub(super) fn grid_bit(p: u16, i: usize) -> (usize, u64) {
        let bit = usize::from(p) * RECLAIM_CLIENTS_MAX + i;
        (bit / 64, 1u64 << (bit % 64))
    }

    /// Tracks `clients` (one old owner's persisted ids) in the expected table, writing each
    /// one's index into `indices`; `None` if they do not fit (its partitions then wait for
    /// their grace end). Once per old owner per map, not per partition: the lookups are linear.
    fn track<'i>(&mut self, clients: &[u32], indices: &'i mut [u16]) -> Option<&'i [u16]> {
        let indices = indices.get_mut(..clients.len())?;
        for (&c, slot) in clients.iter().zip(indices.iter_mut()) {
            let i = match self.tracked_index(c) {
                Some(i) => i,
                None if self.expected_len < RECLAIM_CLIENTS_MAX => {
                    self.side.expected[self.expected_len] = c;
                    self.expected_len += 1;
                    self.expected_len - 1
                }
                None => return None,
            };
            *slot = i as u16;
        }
        Some(indices)
    }

    /// Marks the tracked clients at `indices` as awaited in partition `p`.
    fn await_in(&mut self, p: u16, indices: &[u16]) {
        let mut awaiting = 0;
        for &i in indices {
            let (w, m) = Self::grid_bit(p, usize::from(i));
            if self.side.reclaims[w] & m == 0 {
                self.side.reclaims[w] |= m;
                awaiting += 1;
            }
        }
        self.side.parts[usize::from(p)].awaiting = awaiting;
    }

    /// Forgets partition `p`'s tracked clients: its bits are one run of words.
    pub(super) fn untrack(&mut self, p: u16) {
        const WORDS: usize = RECLAIM_CLIENTS_MAX / 64;
        let start = usize::from(p) * WORDS;
        self.side.reclaims[start..start + WORDS].fill(0);
    }

    /// For every old owner in `old_clients`, tracks its ids and marks them awaited in each
    /// partition of `taken` it owned under the map still applied (the one being replaced).
    pub(super) fn track_takeovers(
        &mut self,
        taken: &[u64; PARTITIONS_MAX as usize / 64],
        old_clients: &[(ServerId, u64, &[u32])],
    ) {
        let mut indices = [0u16; RECLAIM_CLIENTS_MAX];
        for &(server, incarnation, ids) in old_clients {
            let Some(idx) = self.track(ids, &mut indices) else {
                continue;
            };
            let was_theirs = |m: &Map, p: u16| {
                m.owner(p).is_some_and(|o| o.server == Some(server))
                    && m.server(server)
                        .is_some_and(|e| e.incarnation() == incarnation)
            };
            for p in 0..self.side.map.partitions().get() {
                if taken[usize::from(p) / 64] & 1 << (p % 64) != 0 && was_theirs(self.side.map, p) {
                    self.await_in(p, idx);
                }
            }
        }
    }
}
