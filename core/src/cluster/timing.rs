//! When a server may grant in a partition: self-fencing of an owner that may have lost its etcd
//! lease, the new owner's wait before its first grant, and the grace period in which it takes
//! re-claims of the old owner's grants — with the argument that two servers never both grant in
//! one partition, and that a new owner never grants a lock an old holder may still believe in.
//!
//! # Assumptions
//!
//! 1. **Bounded drift.** Every clock involved — each server's monotonic clock, each client's,
//!    and the etcd leader's — advances at a rate within `[1 − ρ, 1 + ρ]` of real time
//!    ([`Timing::drift_ppm`] is ρ in millionths). Clocks need not agree on the time, only on
//!    its rate. Readings are whole milliseconds ([`TICK_SLACK_MS`] covers the rounding).
//! 2. **etcd is linearizable and keeps leases as documented**: a lease expires no earlier than
//!    its TTL, on the leader's clock, after the last keepalive the leader received (a leader
//!    change only extends leases), a keepalive answered with a positive TTL reached a live
//!    lease, and a key bound to the lease is deleted only when it expires or is revoked.
//! 3. **Only a server revokes its own lease, and only after it stopped granting.** An operator
//!    who revokes a live server's lease by hand breaks [`Handover::Expired`]'s shortcut (the
//!    `Moved` wait would still hold); never do that.
//! 4. **A holder counts its grant's lease from when it sent the request**, on its own clock, and
//!    a grant lasts at most [`Timing::grant_lease_max_ms`] without a renewal the server sees.
//! 5. A grant decided at `now_ms` takes effect at `now_ms`: the data thread does not stall
//!    between reading the clock and writing the lock word for longer than the slack. A longer
//!    stall (a stopped VM) is what fencing tokens are for: the new owner's tokens are larger.
//!
//! # The owner's authority (self-fencing)
//!
//! The agent confirms the owner's standing in rounds: a lease keepalive *and* a linearizable
//! read of the map's revision. A round counts when the keepalive came back with a positive TTL
//! and the map read showed the map the server has applied; its instant is `s`, when the round
//! was **sent** (the earlier of the two sends, on the server's clock). The server may grant in
//! a partition it owns while `now < s + TTL − margin` ([`Timing::may_grant`]), with
//!
//! ```text
//!     margin = ⌈TTL · 2ρ / (1 + ρ)⌉ + slack
//! ```
//!
//! Why: the keepalive reached etcd at or after real time `s`, so the lease lives at least until
//! `s + TTL/(1 + ρ)` (etcd's clock runs at most `1 + ρ` fast). The owner's clock runs at least
//! `1 − ρ` fast, so `TTL − margin` of its milliseconds end by `s + (TTL − margin)/(1 − ρ)`,
//! which the margin makes at most `s + TTL/(1 + ρ)`: **the owner stops granting before its
//! lease can have expired**. When etcd is unreachable, no round counts, `s` stops advancing, and
//! the owner fences itself at `s + TTL − margin` — only for as long as it cannot reach etcd.
//!
//! # The new owner's wait
//!
//! A new owner learns of a partition from a map written at real time `w`, so at real time
//! `≥ w`. What it waits before its first grant ([`Timing::takeover`]) depends on how the old
//! owner lost the partition ([`Handover`]):
//!
//! - `Expired`: the old owner's membership key was gone when the map was written, so its lease
//!   had expired (assumption 3): its last grant came before the expiry, before `w`. Waiting is
//!   not needed for safety; the new owner still waits `margin`, which absorbs an etcd clock that
//!   runs up to `2ρ` faster than assumed.
//! - `Moved`: the old owner is still a member and may not have seen the new map. Its last
//!   counting round was sent before `w` (it showed the old map, and etcd is linearizable), so
//!   it grants until at most `w + TTL/(1 + ρ)` (as above). The new owner waits `TTL + slack` of
//!   its own milliseconds, at least `TTL/(1 + ρ)` real: **its first grant comes after the old
//!   owner's last**.
//! - `First` and `Renewal`: there is no other owner; no wait.
//!
//! # The grace period
//!
//! After its wait the new owner still grants nothing new until every client of the old owner
//! has re-claimed its grants (each claim proved by the MAC the old owner issued with it), or the
//! grace period ends ([`Takeover::phase`]). The old owner's last grant came at most
//! `TTL/(1 + ρ)` real after `w` (`Moved`; before `w` for `Expired`), and its holder believes in
//! it at most `grant_lease_max/(1 − ρ)` real after that (assumption 4). So the grace period
//! ends `stretch(grant_lease_max) = ⌈grant_lease_max · (1 + ρ)/(1 − ρ)⌉ + slack` of the new
//! owner's milliseconds after its wait: **no holder of a grant it did not re-claim still believes
//! in it when the new owner grants the lock to someone else.**
//!
//! The claim "two owners never both grant" is the test
//! `an_old_owner_stops_granting_before_a_new_owner_starts`, a property over clock rates within
//! the bound, offsets, message delays and both handovers.

use super::map::Handover;

/// Milliseconds added to every derived bound for clock readings in whole milliseconds: each of
/// the two clocks compared may read up to 1 ms behind the real instant.
pub const TICK_SLACK_MS: u64 = 2;
/// The largest drift bound accepted: 10 % (a clock that is off by more is broken, not slow).
pub const DRIFT_PPM_MAX: u32 = 100_000;
/// A drift bound that covers ordinary hardware clocks and NTP slewing (500 ppm) with room to
/// spare: 1 %.
pub const DRIFT_PPM_DEFAULT: u32 = 10_000;

const PPM: u64 = 1_000_000;

/// The timing of one cluster member: its etcd lease TTL (as etcd granted it), the drift bound,
/// and the longest grant lease a server of the cluster hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The etcd lease TTL, in milliseconds (etcd grants whole seconds; use what it granted).
    pub ttl_ms: u32,
    /// ρ, the drift bound, in millionths ([`DRIFT_PPM_DEFAULT`]).
    pub drift_ppm: u32,
    /// The longest a holder may believe in a grant without renewing it: the largest lock expiry
    /// or client lease a server grants (assumption 4).
    pub grant_lease_max_ms: u32,
}

/// When a new owner may do what, from the instant it learned it owns a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// It learned from the map (its clock).
    pub learned_ms: u64,
    /// Before this it grants nothing (it may take re-claims).
    pub first_grant_ms: u64,
    /// From this it serves even if some of the old owner's clients never re-claimed.
    pub grace_end_ms: u64,
}

/// What a new owner does in a partition at an instant ([`Takeover::phase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Phase {
    /// Take re-claims of the old owner's grants; answer everything else `NotReady`.
    Recovering,
    /// Serve everything (re-claims are over).
    Serving,
}

impl Timing {
    /// The first field out of range, with the rule it breaks: a TTL of 1 s to 1 h, ρ at most
    /// [`DRIFT_PPM_MAX`], and a margin that leaves the owner at least half its TTL to grant in.
    pub fn invalid_field(&self) -> Option<&'static str> {
        if !(1_000..=3_600_000).contains(&self.ttl_ms) {
            return Some("the lease TTL must be 1 s to 1 h");
        }
        if self.drift_ppm > DRIFT_PPM_MAX {
            return Some("the drift bound must be at most 100000 ppm (10 %)");
        }
        if self.margin_ms() * 2 > u64::from(self.ttl_ms) {
            return Some("the drift margin must leave at least half the lease TTL");
        }
        None
    }

    /// How long before its lease's TTL runs out (counted from a confirmation round's send) an
    /// owner stops granting: `⌈TTL · 2ρ/(1 + ρ)⌉ + slack` (module doc).
    #[inline]
    #[must_use]
    pub const fn margin_ms(&self) -> u64 {
        let rho = self.drift_ppm as u64;
        (self.ttl_ms as u64 * 2 * rho).div_ceil(PPM + rho) + TICK_SLACK_MS
    }

    /// The instant (owner's clock) until which an owner whose last counting confirmation round
    /// was sent at `confirmed_sent_ms` may grant (exclusive).
    #[inline]
    #[must_use]
    pub const fn authority_until_ms(&self, confirmed_sent_ms: u64) -> u64 {
        confirmed_sent_ms + (self.ttl_ms as u64).saturating_sub(self.margin_ms())
    }

    /// Self-fencing: whether an owner may grant at `now_ms`, its last counting confirmation
    /// round having been sent at `confirmed_sent_ms` (`None`: no round has counted yet).
    #[inline]
    #[must_use]
    pub const fn may_grant(&self, now_ms: u64, confirmed_sent_ms: Option<u64>) -> bool {
        match confirmed_sent_ms {
            Some(s) => now_ms < self.authority_until_ms(s),
            None => false,
        }
    }

    /// `ms` of a slow clock, in the milliseconds of a fast one: `⌈ms · (1 + ρ)/(1 − ρ)⌉ + slack`.
    #[inline]
    #[must_use]
    pub const fn stretch_ms(&self, ms: u64) -> u64 {
        let rho = self.drift_ppm as u64;
        // `invalid_field` keeps ρ far below 1; the floor of 1 only keeps an unchecked one from
        // dividing by zero.
        let slow = if rho < PPM { PPM - rho } else { 1 };
        (ms * (PPM + rho)).div_ceil(slow) + TICK_SLACK_MS
    }

    /// What a new owner waits, after learning, before its first grant (module doc).
    #[inline]
    #[must_use]
    pub const fn wait_ms(&self, handover: Handover) -> u64 {
        match handover {
            Handover::First | Handover::Renewal => 0,
            Handover::Expired => self.margin_ms(),
            Handover::Moved => self.ttl_ms as u64 + TICK_SLACK_MS,
        }
    }

    /// The schedule of an owner that learned at `learned_ms` it owns a partition by `handover`.
    #[must_use]
    pub const fn takeover(&self, learned_ms: u64, handover: Handover) -> Takeover {
        let first_grant_ms = learned_ms + self.wait_ms(handover);
        let grace_end_ms = match handover {
            Handover::First | Handover::Renewal => first_grant_ms,
            Handover::Expired | Handover::Moved => {
                first_grant_ms + self.stretch_ms(self.grant_lease_max_ms as u64)
            }
        };
        Takeover {
            learned_ms,
            first_grant_ms,
            grace_end_ms,
        }
    }
}

impl Takeover {
    /// Recovering until the wait is over and, after it, until every client of the old owner has
    /// re-claimed (`all_reclaimed`) or the grace period has ended; serving from then on.
    #[inline]
    pub const fn phase(&self, now_ms: u64, all_reclaimed: bool) -> Phase {
        if now_ms >= self.first_grant_ms && (all_reclaimed || now_ms >= self.grace_end_ms) {
            Phase::Serving
        } else {
            Phase::Recovering
        }
    }
}

#[cfg(test)]
#[path = "timing_tests.rs"]
mod tests;
