//! The id hasher of the client's maps, public so that a user keyed by ids the server chose
//! (the engine glue's row-group maps) hashes them the same way.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing's multiplier: spreads a small integer over the high bits the table takes
/// its control tags from.
const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// A hasher for maps keyed by ids: lock and object ids are distinct small integers the server
/// chose, so SipHash's protection against chosen keys buys nothing here and costs a fifth of a
/// batch's client-side time. A multiply spreads the id over the high bits the table uses for
/// its tags. Unkeyed, it also iterates a map in the same order on every run, which the
/// real-client simulator's replays rely on (`cached::state::State::entries`).
///
/// Each integer a key writes is folded in with one multiply; a 64-bit one rotates what came
/// before it first, so that a key of two fields (a row group's table and group) does not
/// hash as the same key with its fields swapped.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(MIX);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ u64::from(v)).wrapping_mul(MIX);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(MIX);
    }
}

/// A map keyed by ids ([`IdHasher`]).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
