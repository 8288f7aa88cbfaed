//! Who a partition's new owner waits for (`cluster.rs`'s module doc): the client ids of each
//! old owner, tracked in a table of one entry per client slot of this server
//! ([`ClusterSide::expected`](super::ClusterSide::expected)) with one bit per
//! (partition, entry), and the gauges an operator watches a recovery by.

use super::cluster::ClusterCore;
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

    /// The word of the reclaim grid and the bit in it for tracked entry `i` in partition `p`.
    pub(super) fn grid_bit(&self, p: u16, i: usize) -> (usize, u64) {
        let (row, bit) = (usize::from(p) * self.row_words, i);
        (row + bit / 64, 1u64 << (bit % 64))
    }

    /// Whether `clients` (one old owner's persisted ids) fit in the expected table beside the
    /// ids tracked already. Once per old owner per map, not per partition: the lookups are
    /// linear.
    fn fits(&self, clients: &[u32]) -> bool {
        let new = clients
            .iter()
            .filter(|&&c| self.tracked_index(c).is_none())
            .count();
        self.expected_len + new <= self.side.expected.len()
    }

    /// `client`'s entry in the expected table, added if it is new (the caller checked that it
    /// [`fits`](Self::fits)).
    fn track(&mut self, client: u32) -> usize {
        self.tracked_index(client).unwrap_or_else(|| {
            self.side.expected[self.expected_len] = client;
            self.expected_len += 1;
            self.expected_len - 1
        })
    }

    /// Forgets partition `p`'s tracked clients: its bits are one run of words.
    pub(super) fn untrack(&mut self, p: u16) {
        let start = usize::from(p) * self.row_words;
        self.side.reclaims[start..start + self.row_words].fill(0);
    }

    /// For every old owner in `old_clients` whose ids fit, tracks them and marks them awaited
    /// in each partition of `taken` it owned under the map still applied (the one being
    /// replaced); an owner's partitions await nobody else. The partitions of an owner whose
    /// ids do not fit keep awaiting their grace end (`PartState::awaiting` stays `u32::MAX`).
    pub(super) fn track_takeovers(
        &mut self,
        taken: &[u64; PARTITIONS_MAX as usize / 64],
        old_clients: &[(ServerId, u64, &[u32])],
    ) {
        for &(server, incarnation, ids) in old_clients {
            if !self.fits(ids) {
                continue;
            }
            let was_theirs = |m: &Map, p: u16| {
                m.owner(p).is_some_and(|o| o.server == Some(server))
                    && m.server(server)
                        .is_some_and(|e| e.incarnation() == incarnation)
            };
            let mut theirs = [0u64; PARTITIONS_MAX as usize / 64];
            for p in 0..self.side.map.partitions().get() {
                if taken[usize::from(p) / 64] & 1 << (p % 64) != 0 && was_theirs(self.side.map, p) {
                    theirs[usize::from(p) / 64] |= 1 << (p % 64);
                    self.side.parts[usize::from(p)].awaiting = 0;
                }
            }
            for &c in ids {
                let i = self.track(c);
                for (w, &word) in theirs.iter().enumerate() {
                    let mut bits = word;
                    while bits != 0 {
                        // Below PARTITIONS_MAX (4,096): the word's index times 64 plus a bit.
                        let p = (w * 64) as u16 + bits.trailing_zeros() as u16;
                        bits &= bits - 1;
                        self.await_in(p, i);
                    }
                }
            }
        }
    }

    /// Marks tracked entry `i` as awaited in partition `p` (once, however often its id is
    /// listed).
    fn await_in(&mut self, p: u16, i: usize) {
        let (w, m) = self.grid_bit(p, i);
        if self.side.reclaims[w] & m == 0 {
            self.side.reclaims[w] |= m;
            self.side.parts[usize::from(p)].awaiting += 1;
        }
    }
}
