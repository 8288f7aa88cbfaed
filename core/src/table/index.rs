//! A fixed open-addressing index: linear probing, backward-shift deletion, no tombstones.
//!
//! The index maps a 32-bit tag (a hash of the key) to a slot number; the caller owns the keys
//! (names live in the slot's name cell, client ids are their own tag) and supplies the equality
//! test, so one index type serves lock names, object names and client ids. The bucket array is
//! sized at start to at least twice the entries it will ever hold, so a probe always finds an
//! empty bucket and the expected probe length stays short. Deletion shifts later entries of the
//! same run back instead of leaving tombstones, so a long-running server with churning names never
//! degrades (hashbrown and the classic Knuth algorithm R do the same).

/// One bucket: `slot` is the stored value plus one; 0 marks an empty bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct Bucket {
    tag: u32,
    slot: u32,
}

static_assertions::assert_eq_size!(Bucket, u64);

/// The index over a caller-supplied bucket array (part of the region).
#[derive(Debug)]
pub struct Index<'r> {
    buckets: &'r mut [Bucket],
    mask: usize,
}

impl<'r> Index<'r> {
    /// Buckets needed for `entries_max` entries at a load factor of at most one half.
    pub const fn buckets_for(entries_max: u32) -> usize {
        let want = entries_max as usize * 2;
        if want < 2 {
            2
        } else {
            want.next_power_of_two()
        }
    }

    /// Wraps a zeroed (empty) bucket array whose length is a power of two.
    pub fn new(buckets: &'r mut [Bucket]) -> Self {
        assert!(
            buckets.len().is_power_of_two(),
            "index size is computed by Layout"
        );
        let mask = buckets.len() - 1;
        Self { buckets, mask }
    }

    #[inline]
    fn home(&self, tag: u32) -> usize {
        // Tags are already mixed (see `mix32`), so the low bits are as good as any.
        tag as usize & self.mask
    }

    /// The buckets as words (for digests).
    pub fn words(&self) -> impl Iterator<Item = u64> + '_ {
        self.buckets
            .iter()
            .map(|b| b.tag as u64 | (b.slot as u64) << 32)
    }

    /// Every stored `(tag, slot)`, in bucket order (for `Server::check_invariants`).
    pub fn entries(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.buckets
            .iter()
            .filter(|b| b.slot != 0)
            .map(|b| (b.tag, b.slot - 1))
    }

    /// The slot stored under `tag` for which `is_key(slot)` holds.
    #[inline]
    pub fn find(&self, tag: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let mut i = self.home(tag);
        loop {
            let b = self.buckets[i];
            if b.slot == 0 {
                return None;
            }
            if b.tag == tag && is_key(b.slot - 1) {
                return Some(b.slot - 1);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Stores `slot` under `tag`. The caller has checked that the key is absent and that the
    /// table holds fewer entries than it was sized for (so an empty bucket exists).
    pub fn insert(&mut self, tag: u32, slot: u32) {
        let mut i = self.home(tag);
        while self.buckets[i].slot != 0 {
            i = (i + 1) & self.mask;
        }
        self.buckets[i] = Bucket {
            tag,
            slot: slot + 1,
        };
    }

    /// Removes the entry `(tag, slot)`; returns whether it was there.
    pub fn remove(&mut self, tag: u32, slot: u32) -> bool {
        let mut i = self.home(tag);
        loop {
            let b = self.buckets[i];
            if b.slot == 0 {
                return false;
            }
            if b.tag == tag && b.slot == slot + 1 {
                break;
            }
            i = (i + 1) & self.mask;
        }
        // Backward shift: walk the rest of the run and pull back every entry whose home lies
        // cyclically at or before the hole, so lookups never stop early at the hole.
        let mut hole = i;
        let mut j = (hole + 1) & self.mask;
        while self.buckets[j].slot != 0 {
            let home = self.home(self.buckets[j].tag);
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.buckets[hole] = self.buckets[j];
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.buckets[hole] = Bucket::default();
        true
    }
}

/// A 32-bit finaliser (MurmurHash3's `fmix32`): spreads every input bit over the output.
#[inline]
pub const fn mix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Hashes a name with a per-server key (FNV-1a over 64 bits, then folded and mixed). The key
/// comes from the server's seed, so a client cannot precompute names that all collide.
#[inline]
pub fn hash_name(key: u64, name: &[u8]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ key;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix32((h ^ (h >> 32)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Random inserts and removes with deliberately colliding tags agree with a HashMap: the
        /// backward shift never loses an entry or leaves one unreachable.
        #[test]
        fn agrees_with_a_hash_map_under_churn(ops in proptest::collection::vec((any::<bool>(), 0u32..40), 1..400)) {
            let mut buckets = vec![Bucket::default(); Index::buckets_for(40)];
            let mut idx = Index::new(&mut buckets);
            let mut model: HashMap<u32, u32> = HashMap::new(); // slot -> tag
            for (insert, slot) in ops {
                let tag = slot % 5; // few tags: long runs, many wraps
                if insert && !model.contains_key(&slot) {
                    idx.insert(tag, slot);
                    model.insert(slot, tag);
                } else if !insert {
                    prop_assert_eq!(idx.remove(tag, slot), model.remove(&slot).is_some());
                }
                for (&s, &t) in &model {
                    prop_assert_eq!(idx.find(t, |x| x == s), Some(s));
                }
            }
        }
    }

    #[test]
    fn full_run_wrapping_past_the_end_is_found() {
        let mut buckets = vec![Bucket::default(); 8];
        let mut idx = Index::new(&mut buckets);
        for s in 0..4 {
            idx.insert(7, s); // all start at the last bucket and wrap
        }
        assert!(idx.remove(7, 1));
        for s in [0, 2, 3] {
            assert_eq!(idx.find(7, |x| x == s), Some(s));
        }
        assert_eq!(idx.find(7, |x| x == 1), None);
    }

    #[test]
    fn keyed_hash_depends_on_the_key() {
        assert_ne!(hash_name(1, b"row-group-7"), hash_name(2, b"row-group-7"));
        assert_eq!(hash_name(1, b"a"), hash_name(1, b"a"));
    }
}
