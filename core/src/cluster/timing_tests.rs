use super::*;
use proptest::prelude::*;

const TEN_S: Timing = Timing {
    ttl_ms: 10_000,
    drift_ppm: DRIFT_PPM_DEFAULT,
    grant_lease_max_ms: 30_000,
};

#[test]
fn the_margin_is_twice_the_drift_of_a_ttl_plus_slack() {
    // 10 s at 1 %: ⌈10,000 · 0.02 / 1.01⌉ = 199, plus 2 ms of rounding.
    assert_eq!(TEN_S.margin_ms(), 201);
    let exact = Timing {
        drift_ppm: 0,
        ..TEN_S
    };
    assert_eq!(exact.margin_ms(), TICK_SLACK_MS);
    assert_eq!(TEN_S.invalid_field(), None);
}

#[test]
fn an_owner_grants_only_within_its_confirmed_authority() {
    assert!(!TEN_S.may_grant(0, None), "no round has counted yet");
    assert!(TEN_S.may_grant(1_000, Some(1_000)));
    assert!(TEN_S.may_grant(1_000 + 10_000 - 202, Some(1_000)));
    assert!(
        !TEN_S.may_grant(1_000 + 10_000 - 201, Some(1_000)),
        "TTL minus the margin after the round was sent"
    );
    assert!(!TEN_S.may_grant(60_000, Some(1_000)), "etcd lost long ago");
}

#[test]
fn a_new_owner_waits_by_how_it_took_over() {
    let t = TEN_S;
    assert_eq!(t.takeover(5, Handover::First).first_grant_ms, 5);
    assert_eq!(t.takeover(5, Handover::Renewal).grace_end_ms, 5);
    assert_eq!(t.takeover(5, Handover::Expired).first_grant_ms, 5 + 201);
    let moved = t.takeover(5, Handover::Moved);
    assert_eq!(moved.first_grant_ms, 5 + 10_000 + TICK_SLACK_MS);
    // 30 s stretched by 1.01/0.99, rounded up, plus slack.
    assert_eq!(
        moved.grace_end_ms,
        moved.first_grant_ms + 30_607 + TICK_SLACK_MS
    );
}

#[test]
fn grace_ends_when_every_client_reclaimed_but_never_before_the_wait() {
    let t = TEN_S.takeover(0, Handover::Moved);
    assert_eq!(t.phase(0, true), Phase::Recovering, "the wait is not over");
    assert_eq!(t.phase(t.first_grant_ms, false), Phase::Recovering);
    assert_eq!(t.phase(t.first_grant_ms, true), Phase::Serving);
    assert_eq!(t.phase(t.grace_end_ms - 1, false), Phase::Recovering);
    assert_eq!(t.phase(t.grace_end_ms, false), Phase::Serving);
}

#[test]
fn timings_that_leave_no_room_are_refused() {
    let bad = [
        Timing {
            ttl_ms: 999,
            ..TEN_S
        },
        Timing {
            drift_ppm: DRIFT_PPM_MAX + 1,
            ..TEN_S
        },
    ];
    for t in bad {
        assert!(t.invalid_field().is_some(), "{t:?}");
    }
    let widest = Timing {
        ttl_ms: 1_000,
        drift_ppm: DRIFT_PPM_MAX,
        ..TEN_S
    };
    assert_eq!(widest.invalid_field(), None, "{}", widest.margin_ms());
}

/// A clock: `offset_ms + ⌊t_us · rate_ppm / 10^9⌋` at real time `t_us` (µs).
#[derive(Clone, Copy, Debug)]
struct Clock {
    offset_ms: u64,
    rate_ppm: u64,
}

impl Clock {
    fn at(self, t_us: u64) -> u64 {
        self.offset_ms + (u128::from(t_us) * u128::from(self.rate_ppm) / 1_000_000_000) as u64
    }

    /// The first real instant at which the clock reads `ms` or more.
    fn reaches(self, ms: u64) -> u64 {
        let ahead = u128::from(ms.saturating_sub(self.offset_ms));
        (ahead * 1_000_000_000).div_ceil(u128::from(self.rate_ppm)) as u64
    }
}

fn clock(rho: u32) -> impl Strategy<Value = Clock> {
    let rho = u64::from(rho);
    (0u64..1_000_000_000, (1_000_000 - rho)..=(1_000_000 + rho)).prop_map(
        |(offset_ms, rate_ppm)| Clock {
            offset_ms,
            rate_ppm,
        },
    )
}

/// A timing, its four clocks (old owner, new owner, etcd leader, the old owner's client) and
/// the delays between the events of a handover, all in µs.
fn scenario() -> impl Strategy<Value = (Timing, [Clock; 4], [u64; 4], bool)> {
    (0u32..=DRIFT_PPM_MAX, 1_000u32..60_000, 100u32..120_000)
        .prop_filter_map(
            "the margin must leave room",
            |(drift_ppm, ttl_ms, lease)| {
                let t = Timing {
                    ttl_ms,
                    drift_ppm,
                    grant_lease_max_ms: lease,
                };
                t.invalid_field().is_none().then_some(t)
            },
        )
        .prop_flat_map(|t| {
            (
                Just(t),
                [
                    clock(t.drift_ppm),
                    clock(t.drift_ppm),
                    clock(t.drift_ppm),
                    clock(t.drift_ppm),
                ],
                [
                    0u64..1_000_000_000_000,
                    0u64..100_000_000,
                    1u64..100_000_000,
                    0u64..100_000_000,
                ],
                any::<bool>(),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    /// The module doc's claim: whatever the clock rates within the drift bound, their offsets
    /// and the delays, the old owner's last grant comes before the new owner's first, and no
    /// holder of an old grant still believes in it when the new owner grants freely.
    #[test]
    fn an_old_owner_stops_granting_before_a_new_owner_starts(
        (t, [old, new, etcd, holder], [s_us, receive_us, write_us, learn_us], expired) in scenario()
    ) {
        // The old owner's last counting round is sent at real time s; it grants strictly before
        // its clock reaches `authority_until`.
        let sent = old.at(s_us);
        let fence_us = old.reaches(t.authority_until_ms(sent));
        // etcd receives the keepalive after s and expires the lease a TTL of its clock later.
        let receive = s_us + receive_us;
        let expiry_us = etcd.reaches(etcd.at(receive) + u64::from(t.ttl_ms));
        prop_assert!(fence_us <= expiry_us, "the owner outlived its lease: {fence_us} > {expiry_us}");
        // The map moving the partition is written after the round (Moved) or after the expiry
        // (Expired), and the new owner learns of it after that.
        let handover = if expired { Handover::Expired } else { Handover::Moved };
        let write = if expired { expiry_us } else { s_us } + write_us;
        let learned = new.at(write + learn_us);
        let plan = t.takeover(learned, handover);
        let first_us = new.reaches(plan.first_grant_ms);
        prop_assert!(fence_us <= first_us, "two owners: old until {fence_us}, new from {first_us}");
        // The old owner's last grant answers a request the holder sent at most at the fence; the
        // holder believes in it for `grant_lease_max` of its own clock.
        let asked = holder.at(fence_us.saturating_sub(1));
        let believed_us = holder.reaches(asked + u64::from(t.grant_lease_max_ms));
        let free_us = new.reaches(plan.grace_end_ms);
        prop_assert!(believed_us <= free_us, "a holder still believes until {believed_us}, new grants from {free_us}");
    }
}
