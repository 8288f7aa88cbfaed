//! Whether caching pays for a holder as a whole: a holder whose recent cached grants were
//! mostly asked back before they paid for themselves stops caching fresh grants, and takes and
//! lets go of its locks plain, as an uncached client would, until caching pays again.
//!
//! [`super::Demotion`] learns per lock, from that lock's own revokes: on a workload where every
//! lock is contended (no affinity: each lock is taken by whichever node comes next) a holder
//! caching hundreds of locks pays a wasted revoke for each of them — and the requester's wait
//! for the holder to notice it — before each is demoted, and again whenever a demotion runs
//! out. Lustre makes the same decision for a whole resource from how many conflicting locks it
//! saw recently (its "contended" state, which turns locking off for a while); here the holder
//! makes it for itself, from what its own cache did, counting grants rather than time:
//!
//! - a cached grant *paid* when it was taken again from the cache for the
//!   [`Demotion::REUSES_THAT_PAY`](super::Demotion::REUSES_THAT_PAY)th time (`paid`);
//! - it was *wasted* when it was revoked before that (`wasted`);
//! - the two counts cover the recent past only: once they add up to [`Payback::WINDOW`] both
//!   are halved.
//!
//! While more grants were wasted than paid, caching is *suspended*: a fresh grant (one not
//! taken from the cache during the use that ends) is let go at the end of its use, except one
//! in [`Payback::PROBE_EVERY`], which is cached as a probe, so that the holder keeps learning
//! whether caching pays again. A grant that was reused is kept either way: it is paying.
//!
//! | state                    | event                 | after                                           |
//! |--------------------------|-----------------------|-------------------------------------------------|
//! | (`p`, `w`, probe)        | `paid()`              | (`p + 1`, `w`), both halved if they reach 64    |
//! | (`p`, `w`, probe)        | `wasted()`            | (`p`, `w + 1`), both halved if they reach 64    |
//! | `w ≤ p`                  | `keep(reused)`        | cache it; unchanged                             |
//! | `w > p`                  | `keep(true)`          | cache it; unchanged                             |
//! | `w > p`                  | `keep(false)`         | cache it when `probe + 1 = 64` (probe back to 0), else let it go (probe + 1) |
//!
//! On a node's own locks (affinity) grants are reused many times between stray accesses of
//! other nodes, so `paid` stays ahead and nothing changes; with no affinity a grant is reused
//! twice before another node takes its lock about one time in sixteen with four nodes, so
//! caching is suspended after a few wasted revokes and 63 fresh grants in 64 go plain. The
//! probes are rare because each costs what caching costs there — a revoke, and a requester
//! that waits for the holder to notice it (with one in eight, a worker taking five locks per
//! transaction still sent a revoke every other transaction); a holder whose locks start to
//! pay again still resumes within a few thousand fresh grants, well under a second at the
//! rates where caching matters.

/// A holder's record of what its cached grants did lately (3 bytes; the all-zero value is
/// [`Payback::NEW`], caching on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Payback {
    /// Cached grants that paid for themselves, lately.
    paid: u8,
    /// Cached grants revoked before they paid, lately.
    wasted: u8,
    /// Fresh grants let go since the last probe, while suspended.
    probe: u8,
}

impl Payback {
    /// Nothing seen yet: caching on.
    pub const NEW: Payback = Payback {
        paid: 0,
        wasted: 0,
        probe: 0,
    };

    /// How many grants the two counts cover at most before both are halved.
    pub const WINDOW: u8 = 64;

    /// While suspended, one fresh grant in this many is cached as a probe (module doc).
    pub const PROBE_EVERY: u8 = 64;

    /// A cached grant was taken again from the cache for the second time: it paid.
    #[inline]
    #[must_use]
    pub const fn paid(self) -> Payback {
        Payback {
            paid: self.paid + 1,
            ..self
        }
        .windowed()
    }

    /// A cached grant was revoked before it paid.
    #[inline]
    #[must_use]
    pub const fn wasted(self) -> Payback {
        Payback {
            wasted: self.wasted + 1,
            ..self
        }
        .windowed()
    }

    /// Halves both counts once they cover [`Payback::WINDOW`] grants.
    #[inline]
    const fn windowed(self) -> Payback {
        if self.paid as u16 + self.wasted as u16 >= Self::WINDOW as u16 {
            return Payback {
                paid: self.paid / 2,
                wasted: self.wasted / 2,
                ..self
            };
        }
        self
    }

    /// Whether caching is suspended: more grants wasted than paid lately.
    #[inline]
    #[must_use]
    pub const fn suspended(self) -> bool {
        self.wasted > self.paid
    }

    /// A use of a lock the holder would cache ended; `reused`: its grant came from the cache
    /// during that use. Whether to keep it cached, and the record after (table).
    #[inline]
    #[must_use]
    pub const fn keep(self, reused: bool) -> (bool, Payback) {
        if reused || !self.suspended() {
            return (true, self);
        }
        let probe = self.probe + 1;
        if probe >= Self::PROBE_EVERY {
            return (true, Payback { probe: 0, ..self });
        }
        (false, Payback { probe, ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wasted(n: usize) -> Payback {
        (0..n).fold(Payback::NEW, |p, _| p.wasted())
    }

    #[test]
    fn a_new_holder_caches() {
        assert_eq!(Payback::NEW.keep(false), (true, Payback::NEW));
        assert!(!Payback::NEW.suspended());
    }

    #[test]
    fn more_wasted_than_paid_suspends_caching_of_fresh_grants_but_one_in_64() {
        let mut p = wasted(1);
        assert!(p.suspended());
        let mut cached = 0;
        for _ in 0..256 {
            let (keep, next) = p.keep(false);
            cached += usize::from(keep);
            p = next;
        }
        assert_eq!(cached, 256 / usize::from(Payback::PROBE_EVERY));
    }

    #[test]
    fn a_reused_grant_is_kept_while_suspended() {
        let p = wasted(5);
        assert_eq!(p.keep(true), (true, p));
    }

    #[test]
    fn grants_that_pay_resume_caching() {
        let mut p = wasted(3);
        for _ in 0..3 {
            assert!(p.suspended());
            p = p.paid();
        }
        assert!(!p.suspended(), "as many paid as wasted");
        assert!(p.keep(false).0);
    }

    #[test]
    fn the_counts_follow_the_recent_past() {
        // Long ago, every grant paid; lately, every grant is wasted.
        let mut p = (0..1_000).fold(Payback::NEW, |p, _| p.paid());
        assert!(p.paid < Payback::WINDOW);
        let mut turned = None;
        for i in 0..100 {
            p = p.wasted();
            if p.suspended() {
                turned = Some(i + 1);
                break;
            }
        }
        let turned = turned.expect("suspended within the window");
        assert!(turned <= usize::from(Payback::WINDOW), "after {turned}");
    }

    #[test]
    fn the_counts_never_overflow() {
        let p = (0..10_000).fold(
            Payback::NEW,
            |p, i| {
                if i % 3 == 0 { p.paid() } else { p.wasted() }
            },
        );
        assert!(u16::from(p.paid) + u16::from(p.wasted) < u16::from(Payback::WINDOW));
        assert!(p.suspended());
    }
}
