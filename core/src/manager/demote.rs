//! Demoting a contended lock: a holder whose cached grant of a lock keeps being asked back
//! before it reused it stops caching that lock for its next few uses, and takes and lets go of
//! it plain, as an uncached client would.
//!
//! A cached grant pays off when the next local user comes before anyone else wants the lock.
//! On a lock that several nodes use in turn it is a loss: each turn costs a revoke, a
//! give-back and a re-request in place of a plain unlock and lock, and the next user waits for
//! the holder to notice the revoke rather than only for its unlock. The VMS and Linux DLMs
//! leave this to the application; GFS2 stretches its glocks' hold times by how contended they
//! are; Lock Fusion and Db2 pureScale hand a hot page's lock over rather than cache it. Here
//! the holder decides, per lock, from what its cache did: a revoke of a grant the holder
//! *reused* (took again from its cache) at least [`Demotion::REUSES_THAT_PAY`] times says
//! caching it paid, and starts the lock over; a revoke of a grant reused less *demotes* the lock for its next `4^level`
//! uses (the level grows by one per such revoke, up to [`Demotion::LEVEL_MAX`]): each of them
//! lets the lock go at its end instead of caching it. Two reuses is the break-even: a reuse
//! saves a lock and an unlock message, and a revoke costs a give-back, a re-request and a
//! waiter that waits for the holder to notice (a revoke round trip is two to three plain
//! hand-offs, `benches/engine.rs`). The rule counts uses, not time, so it is the same
//! at any transaction rate, and reads no clock.
//!
//! | state (`level`, `plain`) | event                              | after                            |
//! |--------------------------|------------------------------------|----------------------------------|
//! | any                      | `revoked(reuses ≥ 2)`              | [`Demotion::NONE`] (0, 0)        |
//! | (`l`, any)               | `revoked(reuses < 2)`              | (`l + 1` ≤ `LEVEL_MAX`, `4^(l+1)`) |
//! | (`l`, 0)                 | `keep()` → cache it                | unchanged                        |
//! | (`l`, `p > 0`)           | `keep()` → let it go               | (`l`, `p − 1`)                   |
//!
//! So a lock two nodes take in turn is cached once every `4^LEVEL_MAX` uses at most after three
//! wasted revokes, each try costing one revoke (quadrupling rather than doubling gets there in
//! few revokes, which are what costs), while a node's own lock, revoked now and then by a stray
//! access after the node reused it a few times, stays in its cache.

/// One lock's demotion record, kept by a holder that caches it (2 bytes; the all-zero value is
/// [`Demotion::NONE`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demotion {
    /// How many wasted revokes in a row: the last demotion lasted `4^level` uses.
    level: u8,
    /// Uses left before the lock is cached again.
    plain: u8,
}

impl Demotion {
    /// Never demoted: cached.
    pub const NONE: Demotion = Demotion { level: 0, plain: 0 };

    /// The highest level: a lock contended for good is let go plain for 64 uses between two
    /// cached tries.
    pub const LEVEL_MAX: u8 = 3;

    /// How many reuses of a cached grant pay for its revoke (module doc).
    pub const REUSES_THAT_PAY: u32 = 2;

    /// A revoke of the lock's cached grant arrived; `reuses` is how many times the holder took
    /// that grant again from its cache (table).
    #[inline]
    #[must_use]
    pub const fn revoked(self, reuses: u32) -> Demotion {
        if reuses >= Self::REUSES_THAT_PAY {
            return Demotion::NONE;
        }
        let level = if self.level < Self::LEVEL_MAX {
            self.level + 1
        } else {
            Self::LEVEL_MAX
        };
        Demotion {
            level,
            plain: 1 << (2 * level),
        }
    }

    /// A use of the lock ended: whether to keep it cached, and the record after (table).
    #[inline]
    #[must_use]
    pub const fn keep(self) -> (bool, Demotion) {
        match self.plain {
            0 => (true, self),
            p => (
                false,
                Demotion {
                    plain: p - 1,
                    ..self
                },
            ),
        }
    }

    /// Whether the lock is let go at the end of its next use.
    #[inline]
    #[must_use]
    pub const fn demoted(self) -> bool {
        self.plain > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_never_demoted_is_kept() {
        assert_eq!(Demotion::NONE.keep(), (true, Demotion::NONE));
        assert!(!Demotion::NONE.demoted());
    }

    #[test]
    fn a_revoke_of_a_grant_not_reused_lets_the_next_four_uses_go() {
        let mut d = Demotion::NONE.revoked(0);
        assert!(d.demoted());
        for _ in 0..4 {
            let (kept, next) = d.keep();
            assert!(!kept);
            d = next;
        }
        let (kept, _) = d.keep();
        assert!(kept, "cached again after four plain uses");
    }

    #[test]
    fn each_wasted_revoke_in_a_row_quadruples_the_demotion() {
        let mut d = Demotion::NONE;
        for level in 1..=3u32 {
            d = d.revoked(0);
            let mut plain = 0;
            loop {
                let (kept, next) = d.keep();
                d = next;
                if kept {
                    break;
                }
                plain += 1;
            }
            assert_eq!(plain, 1 << (2 * level));
        }
    }

    #[test]
    fn a_grant_reused_once_does_not_pay_for_its_revoke() {
        assert_eq!(Demotion::NONE.revoked(1), Demotion::NONE.revoked(0));
    }

    #[test]
    fn a_reused_grant_starts_the_lock_over() {
        let d = Demotion::NONE.revoked(0).revoked(0);
        assert_eq!(d.revoked(2), Demotion::NONE);
        // And the next wasted revoke is a first one again.
        assert_eq!(d.revoked(2).revoked(0), Demotion::NONE.revoked(0));
    }

    #[test]
    fn the_demotion_stops_growing_at_its_maximum() {
        let mut d = Demotion::NONE;
        for _ in 0..20 {
            d = d.revoked(0);
        }
        assert_eq!(d.level, Demotion::LEVEL_MAX);
        assert_eq!(d.plain, 1 << (2 * Demotion::LEVEL_MAX));
    }
}
