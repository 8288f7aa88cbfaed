//! Tests of the revoke decision: every (holder state, request) pair against the module doc's
//! tables, the named rules one by one, and random holder sets against an independent oracle.

use super::*;
use crate::proto::{PROTO_VERSION, PROTO_VERSION_MIN};
use GrantState::*;
use Mode::{Exclusive as EX, Shared as SH};
use proptest::prelude::*;

const TIMING: Timing = Timing {
    min_hold_ms: 10,
    revoke_timeout_ms: 0,
    contention_window_ms: 0,
};
const LEASE_MS: u32 = 1_000;
const ME: u32 = 7;

fn req(kind: LockKind, mode: Mode, waits: bool) -> Request {
    Request {
        kind,
        mode,
        slot: ME,
        waits,
        cacheable: true,
        others_waiting: false,
    }
}

fn holder(slot: u32, state: GrantState) -> Holder {
    Holder {
        slot,
        state,
        dead: false,
        granted_ms: 100,
        contended_ms: 0,
        revoke_sent_ms: 200,
        lease_ms: LEASE_MS,
        version: PROTO_VERSION,
    }
}

/// Decides `r` against `holders` at `now_ms`, returning the actions taken and the verdict.
fn run(r: &Request, holders: &[Holder], now_ms: u64) -> (Vec<(u32, HolderAction)>, Verdict) {
    let mut acts = Vec::new();
    let v = decide(r, holders.iter().copied(), &TIMING, now_ms, |h, a| {
        acts.push((h.slot, a))
    });
    (acts, v)
}

/// The holder table, written out independently of `judge`: the action for a live holder in
/// `state` against a request for `mode` on `kind`, at a time `after_hold` the minimum hold,
/// and `lapsed` past the revoke timeout.
fn expected(
    kind: LockKind,
    state: GrantState,
    mode: Mode,
    after_hold: bool,
    lapsed: bool,
) -> HolderAction {
    let Some(held) = state.grant_mode() else {
        return HolderAction::Compatible;
    };
    if held == SH && mode == SH {
        return HolderAction::Compatible;
    }
    match (
        state.is_cached(),
        state.revoke_outstanding(),
        after_hold,
        lapsed,
    ) {
        (false, ..) => HolderAction::Blocks,
        (true, true, _, false) => HolderAction::AwaitGiveBack {
            lapses_ms: 200 + 1_000,
        },
        (true, true, _, true) => HolderAction::Lapse,
        (true, false, false, _) => HolderAction::RevokeAt { due_ms: 110 },
        (true, false, true, _) => HolderAction::Revoke {
            wanted: if kind == LockKind::Atomic { EX } else { mode },
        },
    }
}

#[test]
fn every_holder_state_and_request_is_judged_as_the_table_says() {
    // Times: inside the hold (105), after it (150), and past the lapse (1_300).
    let times = [(105, false, false), (150, true, false), (1_300, true, true)];
    for kind in [LockKind::Atomic, LockKind::Rw, LockKind::Fair] {
        for state in GrantState::ALL {
            for mode in [EX, SH] {
                for (now, after_hold, lapsed) in times {
                    let r = req(kind, mode, true);
                    let got = judge(&r, &holder(1, state), &TIMING, now);
                    let want = expected(kind, state, mode, after_hold, lapsed);
                    assert_eq!(got, want, "{kind:?} {state:?} wants {mode:?} at {now}");
                    // The requester's own grant and a dead client's are not in the table above.
                    assert_eq!(
                        judge(&r, &holder(ME, state), &TIMING, now),
                        HolderAction::Compatible
                    );
                    let dead = Holder {
                        dead: true,
                        ..holder(1, state)
                    };
                    let want_dead = match want {
                        HolderAction::Compatible => HolderAction::Compatible,
                        _ => HolderAction::Retained,
                    };
                    assert_eq!(judge(&r, &dead, &TIMING, now), want_dead, "{state:?} dead");
                }
            }
        }
    }
}

#[test]
fn a_cached_exclusive_holder_is_revoked_for_a_shared_request_and_may_downgrade() {
    for kind in [LockKind::Rw, LockKind::Fair] {
        let (acts, v) = run(&req(kind, SH, true), &[holder(1, ExclusiveCached)], 150);
        assert_eq!(acts, [(1, HolderAction::Revoke { wanted: SH })], "{kind:?}");
        assert_eq!(
            v.answer(&req(kind, SH, true)),
            Answer::Wait { retained: false }
        );
        assert_eq!(v.revokes(), 1);
    }
    // An atomic lock has no shared mode to downgrade to: its revokes want the lock back.
    let (acts, _) = run(
        &req(LockKind::Atomic, EX, true),
        &[holder(1, ExclusiveCached)],
        150,
    );
    assert_eq!(acts, [(1, HolderAction::Revoke { wanted: EX })]);
}

#[test]
fn no_revoke_before_the_minimum_hold() {
    let r = req(LockKind::Rw, EX, true);
    let h = holder(1, SharedCached);
    for now in [0, 100, 109] {
        let (acts, v) = run(&r, &[h], now);
        assert_eq!(
            acts,
            [(1, HolderAction::RevokeAt { due_ms: 110 })],
            "at {now}"
        );
        assert_eq!(v.revokes(), 0);
        assert_eq!(
            v.retry_at_ms(),
            Some(110),
            "the waiter is retried when the hold ends"
        );
    }
    let (acts, _) = run(&r, &[h], 110);
    assert_eq!(
        acts,
        [(1, HolderAction::Revoke { wanted: EX })],
        "at the end of the hold"
    );
    // A hold that would end past the clock's end saturates instead of wrapping to "now".
    let late = Holder {
        granted_ms: u64::MAX - 3,
        ..h
    };
    assert_eq!(
        judge(&r, &late, &TIMING, u64::MAX - 1),
        HolderAction::RevokeAt { due_ms: u64::MAX }
    );
}

#[test]
fn a_grant_on_a_lock_just_fought_over_is_revoked_inside_its_hold() {
    // Window 20, hold 10: a conflict at 70 turned the lock plain until 90, and the cached grant
    // at 100 that the window's end gave it is revoked at once by the next conflict.
    let timing = Timing {
        contention_window_ms: 20,
        ..TIMING
    };
    let r = req(LockKind::Rw, EX, true);
    let fought = Holder {
        contended_ms: 70,
        ..holder(1, SharedCached)
    };
    assert_eq!(
        judge(&r, &fought, &timing, 101),
        HolderAction::Revoke { wanted: EX }
    );
    // Fought over two windows before the grant, never, or only since (the request the hold
    // parked): the hold stands.
    for contended_ms in [60, 0, 101] {
        let h = Holder {
            contended_ms,
            ..fought
        };
        assert_eq!(
            judge(&r, &h, &timing, 101),
            HolderAction::RevokeAt { due_ms: 110 },
            "{contended_ms}"
        );
    }
    // With the contention rule off the hold stands whatever the stamp.
    assert_eq!(
        judge(&r, &fought, &TIMING, 101),
        HolderAction::RevokeAt { due_ms: 110 }
    );
}

#[test]
fn a_holder_with_an_outstanding_revoke_is_not_sent_a_second() {
    let r = req(LockKind::Rw, EX, true);
    // The server marks the holder when it sends; deciding again finds the mark.
    let mut h = holder(1, ExclusiveCachedRetain);
    let (acts, _) = run(&r, &[h], 150);
    assert_eq!(acts, [(1, HolderAction::Revoke { wanted: EX })]);
    h.state = h.state.with_revoke_sent();
    h.revoke_sent_ms = 150;
    for now in [150, 151, 1_149] {
        let (acts, v) = run(&r, &[h], now);
        assert_eq!(
            acts,
            [(1, HolderAction::AwaitGiveBack { lapses_ms: 1_150 })]
        );
        assert_eq!(v.revokes(), 0, "at {now}");
    }
}

#[test]
fn an_ignored_revoke_lapses_at_the_timeout_and_frees_the_way() {
    let r = req(LockKind::Rw, EX, false);
    let h = Holder {
        revoke_sent_ms: 500,
        ..holder(1, SharedRevoking)
    };
    let (acts, v) = run(&r, &[h], 1_500);
    assert_eq!(
        acts,
        [(1, HolderAction::Lapse)],
        "after the holder's lease by default"
    );
    assert_eq!(
        (v.lapses(), v.answer(&r)),
        (1, Answer::Grant { cached: true })
    );
    // Every holder that ignored its revoke lapses, and the verdict counts each.
    let other = Holder {
        revoke_sent_ms: 500,
        ..holder(2, SharedRevoking)
    };
    let (acts, v) = run(&r, &[h, other], 1_500);
    assert_eq!(acts, [(1, HolderAction::Lapse), (2, HolderAction::Lapse)]);
    assert_eq!(v.lapses(), 2);
    // A configured timeout replaces the lease.
    let quick = Timing {
        revoke_timeout_ms: 50,
        ..TIMING
    };
    assert_eq!(
        judge(&r, &h, &quick, 549),
        HolderAction::AwaitGiveBack { lapses_ms: 550 }
    );
    assert_eq!(judge(&r, &h, &quick, 550), HolderAction::Lapse);
}

#[test]
fn plain_holders_are_never_revoked() {
    for state in [Exclusive, Shared, ExclusiveRetain, SharedRetain] {
        for now in [0, 150, u64::MAX] {
            let (acts, v) = run(&req(LockKind::Fair, EX, false), &[holder(1, state)], now);
            assert_eq!(acts, [(1, HolderAction::Blocks)], "{state:?} at {now}");
            assert_eq!(v.revokes(), 0);
            assert_eq!(
                v.answer(&req(LockKind::Fair, EX, false)),
                Answer::Refuse(Status::Fail)
            );
            assert_eq!(
                v.retry_at_ms(),
                Option::None,
                "it goes by unlock or lease, not by a timer"
            );
        }
    }
}

#[test]
fn a_trylock_fails_but_still_revokes() {
    let r = req(LockKind::Rw, EX, false);
    let holders = [
        holder(1, SharedCached),
        holder(2, SharedCached),
        holder(3, Shared),
    ];
    let (acts, v) = run(&r, &holders, 150);
    let want = HolderAction::Revoke { wanted: EX };
    assert_eq!(acts, [(1, want), (2, want), (3, HolderAction::Blocks)]);
    assert_eq!(
        (v.answer(&r), v.revokes()),
        (Answer::Refuse(Status::Fail), 2)
    );
}

#[test]
fn a_retained_grant_answers_lock_retained_and_a_waiter_waits() {
    let dead = Holder {
        dead: true,
        ..holder(1, ExclusiveRetain)
    };
    let (acts, v) = run(&req(LockKind::Rw, SH, false), &[dead], 150);
    assert_eq!(acts, [(1, HolderAction::Retained)]);
    assert_eq!(
        v.answer(&req(LockKind::Rw, SH, false)),
        Answer::Refuse(Status::LockRetained)
    );
    assert_eq!(
        v.answer(&req(LockKind::Rw, SH, true)),
        Answer::Wait { retained: true }
    );
    // A retained shared grant leaves room for readers.
    let reader = Holder {
        dead: true,
        ..holder(1, SharedRetain)
    };
    let (_, v) = run(&req(LockKind::Rw, SH, false), &[reader], 150);
    assert_eq!(
        v.answer(&req(LockKind::Rw, SH, false)),
        Answer::Grant { cached: true }
    );
    // Retained outranks busy: the caller learns why it cannot have the lock.
    let both = [
        holder(2, Shared),
        Holder {
            dead: true,
            ..holder(1, SharedRetain)
        },
    ];
    let (_, v) = run(&req(LockKind::Rw, EX, false), &both, 150);
    assert_eq!(
        v.answer(&req(LockKind::Rw, EX, false)),
        Answer::Refuse(Status::LockRetained)
    );
}

#[test]
fn the_requester_tickets_and_compatible_grants_never_block() {
    let r = req(LockKind::Fair, SH, false);
    let holders = [
        holder(ME, ExclusiveCached),
        holder(1, TicketExclusive),
        holder(2, SharedCached),
        holder(3, None),
    ];
    let (acts, v) = run(&r, &holders, 150);
    assert!(
        acts.iter().all(|&(_, a)| a == HolderAction::Compatible),
        "{acts:?}"
    );
    assert_eq!(v.answer(&r), Answer::Grant { cached: true });
}

#[test]
fn a_grant_beside_a_revoked_holder_or_a_parked_request_is_cached_and_wanted() {
    let r = req(LockKind::Rw, SH, false);
    let (_, v) = run(&r, &[holder(1, SharedRevoking)], 150);
    assert_eq!(v.answer(&r), Answer::Grant { cached: true });
    assert!(v.wanted(&r), "a writer is on its way");
    let (_, v) = run(&r, &[holder(1, SharedCached)], 150);
    assert_eq!(v.answer(&r), Answer::Grant { cached: true });
    assert!(!v.wanted(&r));
    let queued = Request {
        others_waiting: true,
        ..r
    };
    assert_eq!(v.answer(&queued), Answer::Grant { cached: true });
    assert!(v.wanted(&queued), "a request is parked");
    let plain = Request {
        cacheable: false,
        ..r
    };
    assert_eq!(
        v.answer(&plain),
        Answer::Grant { cached: false },
        "not asked for"
    );
}

#[test]
fn the_retry_time_is_the_earliest_hold_end_or_lapse() {
    let holders = [
        Holder {
            granted_ms: 140,
            ..holder(1, SharedCached)
        }, // hold ends at 150
        Holder {
            revoke_sent_ms: 0,
            lease_ms: 145,
            ..holder(2, SharedRevoking)
        }, // lapses at 145
        Holder {
            granted_ms: 90,
            ..holder(3, SharedCached)
        }, // revoked now
    ];
    let (acts, v) = run(&req(LockKind::Rw, EX, true), &holders, 120);
    assert_eq!(acts[2], (3, HolderAction::Revoke { wanted: EX }));
    assert_eq!(v.retry_at_ms(), Some(145));
    assert_eq!(Verdict::NONE.retry_at_ms(), Option::None);
}

/// A holder for the property test: a state, alive or dead, granted and revoked at some time.
fn any_holder() -> impl Strategy<Value = Holder> {
    // Small times, so that the edges of the hold and of the lapse come up often.
    (
        0u32..6,
        0usize..15,
        any::<bool>(),
        0u64..16,
        0u64..16,
        1u32..16,
    )
        .prop_map(
            |(slot, state, dead, granted_ms, revoke_sent_ms, lease_ms)| Holder {
                slot,
                state: GrantState::ALL[state],
                dead,
                granted_ms,
                contended_ms: 0,
                revoke_sent_ms,
                lease_ms,
                version: PROTO_VERSION,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_048))]

    /// Over random holder sets: a revoke goes only to a live, cached, conflicting holder past
    /// its hold with none outstanding; the request is granted exactly when every conflicting
    /// holder lapses; the retry time is the earliest pending change.
    #[test]
    fn random_holder_sets_follow_the_rules(
        holders in proptest::collection::vec(any_holder(), 0..6),
        mode in prop_oneof![Just(EX), Just(SH)],
        waits in any::<bool>(),
        now in 0u64..32,
    ) {
        let r = Request { slot: 0, ..req(LockKind::Rw, mode, waits) };
        let (acts, v) = run(&r, &holders, now);
        prop_assert_eq!(acts.len(), holders.len());
        let mut in_the_way = false;
        for (h, &(_, a)) in holders.iter().zip(&acts) {
            let conflicting = h.slot != 0
                && h.state.grant_mode().is_some_and(|held| conflicts(held, mode));
            if let HolderAction::Revoke { .. } = a {
                prop_assert!(conflicting && !h.dead && h.state.is_cached());
                prop_assert!(!h.state.revoke_outstanding());
                prop_assert!(now >= h.granted_ms + u64::from(TIMING.min_hold_ms));
            }
            if a == HolderAction::Lapse {
                prop_assert!(h.state.revoke_outstanding() && !h.dead);
            }
            prop_assert_eq!(a == HolderAction::Compatible, !conflicting);
            in_the_way |= conflicting && a != HolderAction::Lapse;
        }
        let granted = matches!(v.answer(&r), Answer::Grant { .. });
        prop_assert_eq!(granted, !in_the_way);
        let pending = acts.iter().filter_map(|&(_, a)| match a {
            HolderAction::RevokeAt { due_ms: t } | HolderAction::AwaitGiveBack { lapses_ms: t } => Some(t),
            _ => Option::None,
        });
        prop_assert_eq!(v.retry_at_ms(), pending.min());
        if let Some(at) = v.retry_at_ms() {
            prop_assert!(at > now, "a retry is in the future");
        }
    }
}

#[test]
fn the_revoke_timeout_is_the_configured_one_but_never_longer_than_the_lease() {
    let t = |revoke_timeout_ms| Timing {
        revoke_timeout_ms,
        ..Timing::DEFAULT
    };
    let v = PROTO_VERSION_REVOKE_TIMEOUT;
    assert_eq!(t(0).revoke_timeout_for(1_000, v), 1_000, "none configured");
    assert_eq!(t(500).revoke_timeout_for(1_000, v), 500);
    assert_eq!(
        t(5_000).revoke_timeout_for(1_000, v),
        1_000,
        "a client trusts its cached grant no longer than the server keeps its grants"
    );
    assert_eq!(
        t(500).revoke_timeout_for(1_000, v - 1),
        1_000,
        "a client told no revoke timeout trusts its cached grant for its lease"
    );
}

/// A holder registered below protocol 7 was told no revoke timeout and trusts its cached grant
/// for its lease: a revoke it has not answered lapses at the lease, not at the shorter timeout
/// the server is configured with, which still holds for a holder of protocol 7 or later.
#[test]
fn a_holder_told_no_revoke_timeout_lapses_at_its_lease() {
    let timing = Timing {
        revoke_timeout_ms: 100,
        ..TIMING
    };
    let r = req(LockKind::Rw, EX, true);
    let at = |version, now_ms| {
        let h = Holder {
            version,
            ..holder(1, ExclusiveRevoking)
        };
        judge(&r, &h, &timing, now_ms)
    };
    // The revoke went out at 200 (`holder`): 300 with the timeout, 1,200 with the lease.
    for version in [PROTO_VERSION_REVOKE_TIMEOUT, PROTO_VERSION] {
        assert_eq!(
            at(version, 299),
            HolderAction::AwaitGiveBack { lapses_ms: 300 }
        );
        assert_eq!(at(version, 300), HolderAction::Lapse, "protocol {version}");
    }
    for version in [PROTO_VERSION_MIN, PROTO_VERSION_REVOKE_TIMEOUT - 1] {
        let waits = HolderAction::AwaitGiveBack { lapses_ms: 1_200 };
        assert_eq!(at(version, 300), waits, "protocol {version}: told nothing");
        assert_eq!(at(version, 1_199), waits);
        assert_eq!(at(version, 1_200), HolderAction::Lapse);
    }
}
