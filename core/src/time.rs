//! Durations as the protocol carries them: one rounding rule for every conversion.
//!
//! The wire carries leases and waits as `u32` milliseconds (and the C ABI and objects some
//! leases as `u32` seconds); callers hold [`Duration`]s. Every place that turns one into the
//! other goes through this module, so a lease means the same thing whichever API asked for it.
//!
//! # The rule for an amount of time: round up, saturate
//!
//! | input                         | [`duration_to_ms`] | [`duration_to_s`] |
//! |-------------------------------|--------------------|-------------------|
//! | zero                          | 0                  | 0                 |
//! | 1 ns                          | 1                  | 1                 |
//! | 1.000 000 001 s               | 1 001              | 2                 |
//! | `u32::MAX` ms or more         | `u32::MAX`         | —                 |
//! | `u32::MAX` s or more          | —                  | `u32::MAX`        |
//!
//! - **Up**, because every amount the protocol carries is a promise to the caller: a lease
//!   rounded down could end before the caller expects its grant to, and a wait of 0.4 ms
//!   rounded down would become zero, which the protocol reads as "do not wait". Rounded up, a
//!   lease lasts at least as long as asked and a wait is at most one unit longer.
//! - **Saturating**, because a duration longer than the wire can say (about 49.7 days in
//!   milliseconds) means "as long as it can", never a short one that wrapped around.
//! - **Zero stays zero**: what zero means (the reference's "answer from the cache" for a lease,
//!   "ask once" for a wait) is the caller's to decide, not the rounding's.
//!
//! # The rule for a clock reading: round down
//!
//! A point on a monotonic clock, given as the time elapsed since the clock's start, becomes a
//! tick with [`elapsed_ms`]: the whole milliseconds that have passed. Down, because a client
//! counts a grant from the moment it sent the request: a tick rounded down says the grant began
//! no later than it did, so the client never believes in it longer than the server keeps it.

use core::time::Duration;

/// The longest amount [`duration_to_ms`] can express; longer ones saturate to it. Also the cap
/// that keeps `Instant + wait` from overflowing where a wait is added to a clock reading.
pub const MS_MAX: Duration = Duration::from_millis(u32::MAX as u64);

/// An amount of time in the protocol's whole milliseconds: rounded up, saturating at
/// `u32::MAX` (see the module doc for why).
///
/// ```
/// use core::time::Duration;
/// use dlock_core::time::duration_to_ms;
///
/// assert_eq!(duration_to_ms(Duration::ZERO), 0);
/// assert_eq!(duration_to_ms(Duration::from_micros(400)), 1); // never a zero wait
/// assert_eq!(duration_to_ms(Duration::from_millis(5_000)), 5_000);
/// assert_eq!(duration_to_ms(Duration::MAX), u32::MAX);
/// ```
#[inline]
#[must_use]
pub const fn duration_to_ms(d: Duration) -> u32 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms > u32::MAX as u128 {
        u32::MAX
    } else {
        ms as u32
    }
}

/// An amount of time in whole seconds (the unit of the C ABI's leases and of object leases):
/// rounded up, saturating at `u32::MAX`, by the same rule as [`duration_to_ms`].
///
/// ```
/// use core::time::Duration;
/// use dlock_core::time::duration_to_s;
///
/// assert_eq!(duration_to_s(Duration::from_millis(1_001)), 2);
/// assert_eq!(duration_to_s(Duration::from_secs(30)), 30);
/// ```
#[inline]
#[must_use]
pub const fn duration_to_s(d: Duration) -> u32 {
    let s = d.as_nanos().div_ceil(1_000_000_000);
    if s > u32::MAX as u128 {
        u32::MAX
    } else {
        s as u32
    }
}

/// A clock reading as a tick: the whole milliseconds in `elapsed` (the time since the clock's
/// start), rounded down, saturating at `u64::MAX` (see the module doc for why down).
///
/// ```
/// use core::time::Duration;
/// use dlock_core::time::elapsed_ms;
///
/// assert_eq!(elapsed_ms(Duration::from_micros(1_999)), 1);
/// ```
#[inline]
#[must_use]
pub const fn elapsed_ms(elapsed: Duration) -> u64 {
    let ms = elapsed.as_millis();
    if ms > u64::MAX as u128 {
        u64::MAX
    } else {
        ms as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rounding_rule_for_every_duration() {
        // Up to the next unit, never down: a lease lasts at least as long as asked.
        for (d, ms, s) in [
            (Duration::ZERO, 0, 0),
            (Duration::from_nanos(1), 1, 1),
            (Duration::from_micros(999), 1, 1),
            (Duration::from_millis(1), 1, 1),
            (Duration::from_nanos(1_000_001), 2, 1),
            (Duration::from_millis(999), 999, 1),
            (Duration::new(1, 1), 1_001, 2),
            (Duration::from_secs(5), 5_000, 5),
        ] {
            assert_eq!(duration_to_ms(d), ms, "{d:?} in ms");
            assert_eq!(duration_to_s(d), s, "{d:?} in s");
            assert!(Duration::from_millis(ms.into()) >= d, "{d:?}: rounded down");
        }
    }

    #[test]
    fn durations_beyond_the_wire_saturate_instead_of_wrapping() {
        assert_eq!(duration_to_ms(MS_MAX), u32::MAX);
        assert_eq!(duration_to_ms(MS_MAX + Duration::from_nanos(1)), u32::MAX);
        // 2^32 ms would wrap to 0 with `as u32`: a wait for ever turned into no wait.
        assert_eq!(duration_to_ms(Duration::from_millis(1 << 32)), u32::MAX);
        assert_eq!(duration_to_ms(Duration::MAX), u32::MAX);
        assert_eq!(duration_to_s(Duration::from_secs(1 << 32)), u32::MAX);
        assert_eq!(duration_to_s(Duration::MAX), u32::MAX);
        assert_eq!(elapsed_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn a_clock_reading_counts_only_whole_milliseconds_passed() {
        assert_eq!(elapsed_ms(Duration::ZERO), 0);
        assert_eq!(elapsed_ms(Duration::from_micros(999)), 0);
        assert_eq!(elapsed_ms(Duration::from_micros(1_000)), 1);
        assert_eq!(elapsed_ms(Duration::new(2, 999_999_999)), 2_999);
    }
}
