//! The worker's maps by row-group key and by lock id, hashed with a fixed multiply.
//!
//! Every acquisition looks its keys up in the names it resolved, and a caching worker also in
//! its cache and its demotions: a handful of lookups per key, on the worker's thread, per
//! transaction. The keys are row groups the engine names and lock ids the server chose, both
//! small integers that nobody picks to collide against this table, so SipHash's protection
//! against chosen keys buys nothing, and over shared memory, where a round trip costs a few
//! microseconds, its cost per lookup shows. This is the transport client's own id hasher's
//! multiply (`dlock_transport::client`'s `IdHasher`), with the row group's 64-bit group mixed
//! in one step. Unkeyed, it also iterates a map in the same order on every run, so the names
//! evicted and the keys given back at an overflow do not change from run to run.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing's multiplier: spreads a small integer over the high bits the table takes
/// its control tags from.
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hasher of [`KeyMap`]: a `RowGroup` writes its table (`u32`) and its group (`u64`), a
/// `LockId` its raw `u32`; each is folded in with one multiply.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(MIX);
    }
}

/// A map keyed by row group or lock id ([`KeyHasher`]).
pub(super) type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;
    use crate::rowgroup::RowGroup;

    #[test]
    fn neighbouring_keys_differ_in_the_high_bits_the_table_uses() {
        let build = BuildHasherDefault::<KeyHasher>::default();
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
