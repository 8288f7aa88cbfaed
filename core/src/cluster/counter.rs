//! High-water marks of `umo_atomic64` counters (the XID and CSN allocators) in a cluster:
//! values never repeat across owners, and a fetch-and-add never waits on etcd in steady state.
//!
//! A counter lives in its name's partition. Its owner keeps, in etcd, a **high-water mark**
//! `h`: no value the counter ever held is above `h`. Its invariant is `value ≤ persisted`, where
//! `persisted` is the largest mark etcd has confirmed. A fetch-and-add of `d` that returns `v`
//! hands out `v .. v + d` and leaves `v + d`; it is allowed when `v + d ≤ persisted`
//! ([`may_advance`]), so every handed-out value is below `persisted`. A new owner starts the
//! counter at the mark it reads ([`start_value`]) — above every value handed out before, so
//! values never repeat; values between the old owner's last and the mark are skipped (gaps are
//! allowed, repeats never).
//!
//! To keep etcd off the path the owner reserves ahead: when the headroom `persisted − value`
//! falls below half a reservation step, it asks the agent to persist `value + step`
//! ([`Reserve::wants`]); the agent writes it in the background and reports it back
//! ([`Reserve::confirmed`]). With a step of a few seconds' worth of values, fetch-and-add
//! never waits unless etcd has been unreachable for that long — and then it is refused
//! (`NotReady`), never allowed past the mark.
//!
//! | state                                    | event                        | then                                  |
//! |------------------------------------------|------------------------------|---------------------------------------|
//! | `value + d ≤ persisted`                  | fetch-and-add `d`            | served                                |
//! | `value + d > persisted`                  | fetch-and-add `d`            | refused until a reservation lands     |
//! | `persisted − value < step/2`, none asked | the owner's poll             | ask for `value + step` (ahead of `persisted`) |
//! | a reservation asked                      | the agent confirms mark `m`  | `persisted = max(persisted, m)`       |
//! | a reservation asked                      | the agent reports failure    | forget it; ask again at the next poll |
//!
//! Compare-and-swap may set any value; the same rule applies to its new value. Reads do not
//! hand out values.

/// Whether the counter may move from `value` to `to`, with `persisted` the largest mark etcd
/// confirmed. A fetch-and-add that overflows (`to` wrapped) is the caller's to refuse first.
#[inline]
#[must_use]
pub const fn may_advance(to: u64, persisted: u64) -> bool {
    to <= persisted
}

/// The value a new owner starts a counter at: the mark it read (every value handed out before
/// was below it).
#[inline]
#[must_use]
pub const fn start_value(mark: u64) -> u64 {
    mark
}

/// One counter's reservation state on its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Reserve {
    /// The largest mark etcd confirmed.
    pub persisted: u64,
    /// The mark asked for and not yet confirmed or failed (`None`: nothing in flight).
    pub asked: Option<u64>,
}

impl Reserve {
    /// A counter whose mark etcd confirmed at `persisted` (a new owner: what it read).
    #[inline]
    #[must_use]
    pub const fn new(persisted: u64) -> Self {
        Reserve {
            persisted,
            asked: None,
        }
    }

    /// The mark to ask for, if the headroom above `value` is below half of `step` and nothing is
    /// in flight; records it as asked. A saturating add: a counter near `u64::MAX` asks for the
    /// maximum and then stops, it never wraps.
    #[inline]
    #[must_use]
    pub fn wants(&mut self, value: u64, step: u64) -> Option<u64> {
        if self.asked.is_some() || self.persisted.saturating_sub(value) >= step / 2 {
            return None;
        }
        let mark = value.saturating_add(step);
        if mark <= self.persisted {
            return None;
        }
        self.asked = Some(mark);
        Some(mark)
    }

    /// The agent persisted `mark` (never lowers `persisted`).
    #[inline]
    pub fn confirmed(&mut self, mark: u64) {
        self.persisted = self.persisted.max(mark);
        if self.asked.is_some_and(|a| a <= mark) {
            self.asked = None;
        }
    }

    /// The agent could not persist the mark asked for: ask again at the next poll.
    #[inline]
    pub fn failed(&mut self) {
        self.asked = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_owner_reserves_ahead_before_headroom_runs_out() {
        let mut r = Reserve::new(1_000);
        assert_eq!(r.wants(0, 1_000), None, "a full step of headroom");
        assert_eq!(r.wants(600, 1_000), Some(1_600));
        assert_eq!(
            r.wants(700, 1_000),
            None,
            "one reservation in flight at a time"
        );
        r.confirmed(1_600);
        assert_eq!(r, Reserve::new(1_600));
        assert!(may_advance(1_600, r.persisted));
        assert!(!may_advance(1_601, r.persisted));
    }

    #[test]
    fn a_failed_reservation_is_asked_again_and_marks_never_go_down() {
        let mut r = Reserve::new(10);
        assert_eq!(r.wants(9, 10), Some(19));
        r.failed();
        assert_eq!(r.wants(9, 10), Some(19));
        r.confirmed(5);
        assert_eq!(r.persisted, 10, "an old confirmation never lowers the mark");
        assert_eq!(r.asked, Some(19));
    }

    #[test]
    fn a_counter_at_the_top_stops_instead_of_wrapping() {
        let mut r = Reserve::new(u64::MAX - 1);
        assert_eq!(r.wants(u64::MAX - 2, 100), Some(u64::MAX));
        r.confirmed(u64::MAX);
        assert_eq!(r.wants(u64::MAX, 100), None);
    }

    proptest! {
        /// Owners come and go; each fetch-and-add is allowed only under the confirmed mark and a
        /// new owner starts at the mark it reads: no value is ever handed out twice.
        #[test]
        fn values_never_repeat_across_owners(
            ops in proptest::collection::vec((1u64..50, any::<bool>(), 0u8..10), 1..300),
            step in 1u64..500,
        ) {
            let mut etcd_mark = 0u64;
            let mut value = start_value(etcd_mark);
            let mut r = Reserve::new(etcd_mark);
            let mut handed = std::collections::BTreeSet::new();
            for (d, lands, event) in ops {
                if let Some(mark) = r.wants(value, step) {
                    if lands {
                        etcd_mark = etcd_mark.max(mark);
                        r.confirmed(mark);
                    } else {
                        r.failed();
                    }
                }
                if may_advance(value + d, r.persisted) {
                    for v in value..value + d {
                        prop_assert!(handed.insert(v), "{v} handed out twice");
                    }
                    value += d;
                }
                if event == 0 {
                    // The owner dies; the next one reads the mark.
                    value = start_value(etcd_mark);
                    r = Reserve::new(etcd_mark);
                }
                prop_assert!(value <= etcd_mark);
            }
        }
    }
}
