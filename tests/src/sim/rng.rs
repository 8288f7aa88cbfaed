//! The simulation's only source of randomness: SplitMix64, written out so that a seed means the
//! same run on every platform and every version of every dependency (a crate's generator may
//! change its stream between releases, which would silently invalidate the regression seeds).

/// A SplitMix64 generator (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): one `u64` of state, passes BigCrush, and cheap in debug builds.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`). The modulo bias is below 2^-40 for the small `n` used here.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// An index into a collection of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        self.below(1_000_000) < u64::from(per_million)
    }
}

thread_local! {
    /// The state behind [`sim_entropy`]: a server's entropy is a plain `fn`, so a seeded
    /// simulation keeps its stream per thread (tests run seeds on several threads at once).
    static ENTROPY: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
}

/// Seeds [`sim_entropy`] on this thread.
pub fn seed_entropy(seed: u64) {
    ENTROPY.with(|e| e.set(seed));
}

/// A server [`Entropy`](dlock_core::server::Entropy) that replays with the seed: client ids,
/// sessions and the name-hash key come from this thread's SplitMix64 stream.
pub fn sim_entropy(out: &mut [u8]) {
    ENTROPY.with(|e| {
        let mut r = Rng(e.get());
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&r.next_u64().to_le_bytes()[..chunk.len()]);
        }
        e.set(r.0);
    });
}
