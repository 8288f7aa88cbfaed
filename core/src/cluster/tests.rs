//! The map, rebalancing, the request check and the wire encoding, driven together.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn id(n: u32) -> ServerId {
    ServerId::new(n).unwrap()
}

/// Runs `assign` on members given as (id, incarnation, draining).
fn step(
    current: &Map,
    ms: &[(u32, u64, bool)],
    renewals: &[(ServerId, u16)],
) -> (Box<Map>, Change) {
    let addrs: Vec<Vec<u8>> = ms
        .iter()
        .map(|(n, _, _)| format!("10.0.0.{n}:21616").into_bytes())
        .collect();
    let members: Vec<Member<'_>> = ms
        .iter()
        .zip(&addrs)
        .map(|(&(n, inc, draining), a)| Member {
            id: id(n),
            incarnation: inc,
            address: a,
            draining,
        })
        .collect();
    let mut out = Box::new(Map::new(current.partitions()));
    let change = assign(current, &members, renewals, &mut out).unwrap();
    assert_eq!(out.check_invariants(), Ok(()));
    (out, change)
}

fn counts(map: &Map) -> BTreeMap<u32, usize> {
    let mut c = BTreeMap::new();
    for o in map.owners() {
        if let Some(s) = o.server {
            *c.entry(s.get()).or_default() += 1;
        }
    }
    c
}

fn fresh(p: u16) -> Box<Map> {
    Box::new(Map::new(Partitions::new(p).unwrap()))
}

#[test]
fn a_new_cluster_spreads_evenly_at_epoch_one() {
    let (m, change) = step(
        &fresh(256),
        &[(1, 11, false), (2, 12, false), (3, 13, false)],
        &[],
    );
    assert_eq!(
        counts(&m).values().copied().collect::<Vec<_>>(),
        [86, 85, 85]
    );
    assert!(
        m.owners()
            .iter()
            .all(|o| o.epoch == 1 && o.handover == Handover::First)
    );
    assert_eq!((m.version(), change.moved, change.changed), (1, 256, true));
    assert_eq!(m.server(id(2)).unwrap().address(), b"10.0.0.2:21616");
}

#[test]
fn the_same_inputs_give_the_same_map_whatever_the_member_order() {
    let base = step(&fresh(100), &[(1, 1, false), (2, 2, false)], &[]).0;
    let a = step(
        &base,
        &[(3, 3, false), (1, 1, false), (2, 2, true), (4, 4, false)],
        &[],
    )
    .0;
    let b = step(
        &base,
        &[(4, 4, false), (2, 2, true), (1, 1, false), (3, 3, false)],
        &[],
    )
    .0;
    assert_eq!(a, b);
}

#[test]
fn an_unchanged_membership_writes_nothing() {
    let ms = [(1, 1, false), (2, 2, false)];
    let (m, _) = step(&fresh(64), &ms, &[]);
    let (again, change) = step(&m, &ms, &[]);
    assert_eq!(change, Change::default());
    assert_eq!(*again, *m);
}

#[test]
fn a_leaver_loses_only_its_partitions_at_raised_epochs() {
    let (m, _) = step(
        &fresh(256),
        &[(1, 1, false), (2, 2, false), (3, 3, false)],
        &[],
    );
    let (after, change) = step(&m, &[(1, 1, false), (3, 3, false)], &[]);
    assert_eq!(usize::from(change.moved), m.owned_by(id(2)).count());
    for (before, now) in m.owners().iter().zip(after.owners()) {
        if before.server == Some(id(2)) {
            assert_eq!(now.epoch, before.epoch + 1);
            assert_eq!(now.handover, Handover::Expired, "its lease is gone");
        } else {
            assert_eq!(now, before, "a survivor keeps what it had");
        }
    }
    assert_eq!(
        counts(&after).values().copied().collect::<Vec<_>>(),
        [128, 128]
    );
}

#[test]
fn a_reregistered_member_is_treated_as_new() {
    let (m, _) = step(&fresh(8), &[(1, 1, false), (2, 2, false)], &[]);
    // Server 2 lost its lease and registered again (incarnation 7).
    let (after, change) = step(&m, &[(1, 1, false), (2, 7, false)], &[]);
    assert_eq!(change.moved, 4);
    for p in m.owned_by(id(2)) {
        let o = after.owner(p).unwrap();
        assert_eq!((o.epoch, o.handover), (2, Handover::Expired));
    }
    assert!(after.is_for(id(2), 7) && !after.is_for(id(2), 2));
}

#[test]
fn a_draining_member_ends_with_nothing_and_its_partitions_are_moved() {
    let (m, _) = step(&fresh(30), &[(1, 1, false), (2, 2, false)], &[]);
    let (after, change) = step(&m, &[(1, 1, false), (2, 2, true)], &[]);
    assert_eq!(change.moved, 15);
    assert_eq!(after.owned_by(id(2)).count(), 0);
    assert!(after.owners().iter().all(|o| o.server == Some(id(1))));
    for p in m.owned_by(id(2)) {
        assert_eq!(
            after.owner(p).unwrap().handover,
            Handover::Moved,
            "it is still alive"
        );
    }
    assert!(
        after.server(id(2)).is_some(),
        "clients can still reach a drainer"
    );
}

#[test]
fn with_everyone_draining_partitions_stay_and_the_departed_are_unowned() {
    let (m, _) = step(&fresh(10), &[(1, 1, false), (2, 2, false)], &[]);
    let (after, change) = step(&m, &[(1, 1, true)], &[]);
    assert_eq!(change.orphaned, 5);
    for (before, now) in m.owners().iter().zip(after.owners()) {
        if before.server == Some(id(1)) {
            assert_eq!(now, before);
        } else {
            assert_eq!(
                (now.server, now.epoch),
                (None, before.epoch),
                "epoch kept, never lowered"
            );
        }
    }
    // When someone comes, the unowned partitions go to it at a raised epoch.
    let (later, _) = step(&after, &[(1, 1, true), (3, 3, false)], &[]);
    assert!(
        later
            .owners()
            .iter()
            .all(|o| o.server == Some(id(3)) && o.epoch == 2)
    );
}

#[test]
fn a_renewal_raises_the_epoch_and_keeps_the_owner() {
    let ms = [(1, 1, false), (2, 2, false)];
    let (m, _) = step(&fresh(4), &ms, &[]);
    let mine = m.owned_by(id(1)).next().unwrap();
    let theirs = m.owned_by(id(2)).next().unwrap();
    let asks = [(id(1), mine), (id(1), mine), (id(1), theirs), (id(1), 999)];
    let (after, change) = step(&m, &ms, &asks);
    assert_eq!(
        (change.renewed, change.moved),
        (1, 0),
        "once, and only by the owner"
    );
    let o = after.owner(mine).unwrap();
    assert_eq!(
        (o.server, o.epoch, o.handover),
        (Some(id(1)), 2, Handover::Renewal)
    );
    assert_eq!(after.version(), m.version() + 1);
}

#[test]
fn bad_memberships_are_refused() {
    let map = fresh(4);
    let mut out = fresh(4);
    let a = b"a:1".as_slice();
    let m = |n, address: &'static [u8]| Member {
        id: id(n),
        incarnation: 1,
        address,
        draining: false,
    };
    assert_eq!(
        assign(&map, &[m(1, a), m(1, a)], &[], &mut out),
        Err(AssignError::DuplicateServer(id(1)))
    );
    assert_eq!(
        assign(&map, &[m(1, b"")], &[], &mut out),
        Err(AssignError::BadAddress(id(1)))
    );
    let long = [b'x'; ADDRESS_LEN_MAX + 1];
    let members = [Member {
        address: &long,
        ..m(1, a)
    }];
    assert_eq!(
        assign(&map, &members, &[], &mut out),
        Err(AssignError::BadAddress(id(1)))
    );
    let many: Vec<Member<'_>> = (1..=SERVERS_MAX as u32 + 1).map(|n| m(n, a)).collect();
    assert_eq!(
        assign(&map, &many, &[], &mut out),
        Err(AssignError::TooManyServers)
    );
    let mut last = fresh(4);
    let (m1, _) = step(&map, &[(1, 1, false)], &[]);
    *last = (*m1).clone();
    last.owners[2].epoch = token::EPOCH_MAX;
    assert_eq!(
        assign(&last, &[m(2, a)], &[], &mut out),
        Err(AssignError::EpochExhausted(2))
    );
}

/// One membership event for the property below.
#[derive(Clone, Copy, Debug)]
enum Event {
    Join,
    Leave(usize),
    Drain(usize),
    Restart(usize),
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    proptest::collection::vec(
        prop_oneof![
            Just(Event::Join),
            any::<usize>().prop_map(Event::Leave),
            any::<usize>().prop_map(Event::Drain),
            any::<usize>().prop_map(Event::Restart),
        ],
        1..40,
    )
}

proptest! {
    /// Through any sequence of joins, leaves, drains and restarts: every map is valid and even,
    /// drainers hold nothing while anyone else can, epochs never go down, a moved partition's
    /// epoch rises by exactly one, and one leave or join from an even map moves exactly the
    /// leaver's partitions or the joiner's share.
    #[test]
    fn rebalancing_is_even_minimal_and_epochs_only_grow(p in 1u16..=600, evs in events()) {
        let mut map = fresh(p);
        let mut members: Vec<(u32, u64, bool)> = vec![(1, 1, false)];
        let mut next = 2u32;
        map = step(&map, &members, &[]).0;
        for ev in evs {
            let before = counts(&map);
            let mut expect_moves = None;
            match ev {
                Event::Join => {
                    let n = members.iter().filter(|m| !m.2).count() as u16 + 1;
                    if members.iter().all(|m| !m.2) && map.owners().iter().all(|o| o.server.is_some()) {
                        expect_moves = Some(p / n);
                    }
                    members.push((next, u64::from(next), false));
                    next += 1;
                }
                Event::Leave(i) if !members.is_empty() => {
                    let gone = members.remove(i % members.len());
                    if members.iter().any(|m| !m.2) && members.iter().all(|m| !m.2) {
                        expect_moves = Some(before.get(&gone.0).copied().unwrap_or(0) as u16);
                    }
                }
                Event::Drain(i) if !members.is_empty() => {
                    let i = i % members.len();
                    members[i].2 = true;
                }
                Event::Restart(i) if !members.is_empty() => {
                    let i = i % members.len();
                    members[i].1 += 1_000;
                }
                _ => continue,
            }
            let (after, change) = step(&map, &members, &[]);
            if let Some(m) = expect_moves {
                prop_assert_eq!(change.moved, m, "{:?}", ev);
            }
            let eligible: Vec<u32> = members.iter().filter(|m| !m.2).map(|m| m.0).collect();
            let c = counts(&after);
            if !eligible.is_empty() {
                let n = eligible.len();
                let (lo, hi) = (usize::from(p) / n, usize::from(p).div_ceil(n));
                for e in &eligible {
                    let have = c.get(e).copied().unwrap_or(0);
                    prop_assert!((lo..=hi).contains(&have), "{} has {}", e, have);
                }
                prop_assert_eq!(c.values().sum::<usize>(), usize::from(p), "drainers hold nothing");
            }
            for (b, a) in map.owners().iter().zip(after.owners()) {
                prop_assert!(a.epoch >= b.epoch);
                if a.server != b.server && a.server.is_some() {
                    prop_assert_eq!(a.epoch, b.epoch + 1);
                }
            }
            prop_assert!(after.version() == map.version() + u64::from(change.changed));
            map = after;
        }
    }

    /// Every map `assign` writes survives its wire encoding exactly.
    #[test]
    fn an_assigned_map_round_trips_through_its_encoding(p in 1u16..=PARTITIONS_MAX, n in 0u32..40) {
        let ms: Vec<(u32, u64, bool)> = (1..=n).map(|i| (i * 7, u64::from(i) << 40, i % 5 == 0)).collect();
        let (m, _) = step(&fresh(p), &ms, &[]);
        let mut buf = vec![0u8; m.encoded_len()];
        prop_assert_eq!(m.encode(&mut buf), Ok(buf.len()));
        let mut back = fresh(1);
        prop_assert_eq!(Map::decode(&buf, &mut back), Ok(()));
        prop_assert_eq!(&*back, &*m);
    }
}

#[path = "tests_wire.rs"]
mod wire;
