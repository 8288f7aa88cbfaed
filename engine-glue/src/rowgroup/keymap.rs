//! The worker's maps by row-group key and by lock id, hashed with the transport client's id
//! hasher ([`dlock_transport::client::IdHasher`]).
//!
//! Every acquisition looks its keys up in the names it resolved, and a caching worker also in
//! its cache and its demotions: a handful of lookups per key, on the worker's thread, per
//! transaction. The keys are row groups the engine names and lock ids the server chose, both
//! small integers that nobody picks to collide against this table, so SipHash's protection
//! against chosen keys buys nothing, and over shared memory, where a round trip costs a few
//! microseconds, its cost per lookup shows. A row group writes its table (`u32`) and its
//! group (`u64`), each folded in with one multiply. Unkeyed, the hasher also iterates a map in
//! the same order on every run, so the names evicted and the keys given back at an overflow
//! do not change from run to run.

/// A map keyed by row group or lock id.
pub(super) type KeyMap<K, V> = dlock_transport::client::IdMap<K, V>;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use dlock_transport::client::IdHasher;

    use crate::rowgroup::RowGroup;

    #[test]
    fn neighbouring_keys_differ_in_the_high_bits_the_table_uses() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let top = |k: RowGroup| build.hash_one(k) >> 57;
        // The 7-bit control tags of consecutive groups, and of one group in consecutive
        // tables, are not all alike (a plain sum of the fields would make them so).
        let groups: std::collections::HashSet<u64> =
            (0..64).map(|g| top(RowGroup::new(0, g))).collect();
        let tables: std::collections::HashSet<u64> =
            (0..64).map(|t| top(RowGroup::new(t, 7))).collect();
        assert!(groups.len() > 32, "{groups:?}");
        assert!(tables.len() > 32, "{tables:?}");
        // Table and group are not interchangeable.
        assert_ne!(
            build.hash_one(RowGroup::new(1, 2)),
            build.hash_one(RowGroup::new(2, 1))
        );
    }
}
