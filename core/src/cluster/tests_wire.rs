//! The map's wire encoding against hostile input, and the request check's table.

use super::super::check::Local;
use super::*;

/// A map with three servers and a mix of epochs, handovers and an unowned partition.
fn sample() -> Box<Map> {
    let (m, _) = step(
        &fresh(16),
        &[(1, 5, false), (2, 6, false), (3, 7, false)],
        &[],
    );
    let (mut m, _) = step(&m, &[(1, 5, false), (3, 7, false)], &[]);
    m.owners[0].server = None;
    m
}

fn encoded(m: &Map) -> Vec<u8> {
    let mut buf = vec![0u8; m.encoded_len()];
    let n = m.encode(&mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// Decodes `bytes` over a copy of `sample()`: an accepted input must re-encode to exactly
/// `bytes`, a refused one must leave the map untouched.
fn assert_refused_or_reencoded_exactly(bytes: &[u8]) {
    let before = sample();
    let mut m = sample();
    match Map::decode(bytes, &mut m) {
        Ok(()) => {
            assert_eq!(m.check_invariants(), Ok(()));
            assert_eq!(encoded(&m), bytes);
        }
        Err(_) => assert_eq!(m, before, "a refused input changed the map"),
    }
}

#[test]
fn the_largest_map_fits_its_bound() {
    let addr = [b'a'; ADDRESS_LEN_MAX];
    let members: Vec<Member<'_>> = (1..=SERVERS_MAX as u32)
        .map(|n| Member {
            id: id(n),
            incarnation: u64::MAX,
            address: &addr,
            draining: false,
        })
        .collect();
    let mut m = fresh(PARTITIONS_MAX);
    assign(&fresh(PARTITIONS_MAX), &members, &[], &mut m).unwrap();
    assert_eq!(m.encoded_len(), MAP_ENCODED_MAX);
    let bytes = encoded(&m);
    let mut back = fresh(1);
    Map::decode(&bytes, &mut back).unwrap();
    assert_eq!(back, m);
}

#[test]
fn a_short_buffer_or_a_broken_map_is_not_encoded() {
    let m = sample();
    let mut short = vec![0u8; m.encoded_len() - 1];
    assert_eq!(
        m.encode(&mut short),
        Err(crate::proto::EncodeError::BufferTooSmall)
    );
    let mut broken = sample();
    broken.owners[3].epoch = 0;
    let mut buf = vec![0u8; broken.encoded_len()];
    assert_eq!(
        broken.encode(&mut buf),
        Err(crate::proto::EncodeError::Invalid)
    );
}

#[test]
fn each_field_out_of_range_is_refused() {
    use crate::proto::DecodeError;
    let good = encoded(&sample());
    let owners_at = good.len() - 16 * 7;
    let refused = |at: usize, value: &[u8], why: DecodeError| {
        let mut b = good.clone();
        b[at..at + value.len()].copy_from_slice(value);
        let mut m = sample();
        assert_eq!(Map::decode(&b, &mut m), Err(why), "byte {at}");
    };
    refused(0, &[0], DecodeError::BadMagic);
    refused(4, &[2], DecodeError::BadField);
    refused(5, &[1], DecodeError::BadField);
    refused(6, &[0, 0], DecodeError::BadField);
    refused(16, &[0xFF, 0xFF], DecodeError::BadCount);
    refused(18, &[1], DecodeError::BadField);
    refused(20, &[0, 0, 0, 0], DecodeError::BadField); // server id 0
    refused(20 + 12, &[0], DecodeError::BadName); // empty address
    refused(owners_at + 7, &[9, 0], DecodeError::BadField); // no such table index
    refused(owners_at + 7 + 2, &[0, 0, 0, 0], DecodeError::BadField); // owned at epoch 0
    refused(owners_at + 7 + 6, &[4], DecodeError::BadField); // unknown handover
    let mut longer = good.clone();
    longer.push(0);
    assert_eq!(
        Map::decode(&longer, &mut sample()),
        Err(DecodeError::BadLength)
    );
    for cut in 0..good.len() {
        assert_eq!(
            Map::decode(&good[..cut], &mut sample()),
            Err(DecodeError::Truncated),
            "cut at {cut}"
        );
    }
}

#[test]
fn an_unsorted_table_is_refused() {
    let good = encoded(&sample());
    // The table is 1 then 3; make the second id 1 as well.
    let mut b = good.clone();
    let second = 20 + 13 + usize::from(good[20 + 12]);
    b[second..second + 4].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        Map::decode(&b, &mut sample()),
        Err(crate::proto::DecodeError::BadField)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn random_bytes_never_panic_or_misparse(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        assert_refused_or_reencoded_exactly(&bytes);
    }

    #[test]
    fn a_mutated_map_is_refused_or_reencoded_exactly(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut b = encoded(&sample());
        for (at, v) in flips {
            let i = at.index(b.len());
            b[i] = v;
        }
        if truncate {
            b.truncate(cut.index(b.len()));
        }
        assert_refused_or_reencoded_exactly(&b);
    }
}

#[test]
fn requests_are_served_only_by_the_owner_at_its_epoch() {
    let m = sample();
    let p = m
        .owned_by(id(3))
        .find(|&p| m.owner(p).unwrap().epoch == 2)
        .unwrap();
    let e = m.owner(p).unwrap().epoch;
    let version = m.version();
    let me = Local {
        map: &m,
        me: id(3),
        incarnation: 7,
        authority: true,
    };
    let serving = Phase::Serving;
    assert_eq!(check(&me, p, e, Class::Ordinary, serving), Verdict::Serve);
    assert_eq!(
        check(&me, p, e - 1, Class::Ordinary, serving),
        Verdict::StaleEpoch { version }
    );
    assert_eq!(
        check(&me, p, e + 1, Class::Ordinary, serving),
        Verdict::FutureEpoch { version }
    );
    assert_eq!(
        check(&me, p, u32::MAX, Class::Reclaim, Phase::Recovering),
        Verdict::FutureEpoch { version },
        "forged"
    );
    assert_eq!(
        check(&me, 16, e, Class::Ordinary, serving),
        Verdict::BadPartition
    );
    let theirs = m.owned_by(id(1)).next().unwrap();
    assert_eq!(
        check(
            &me,
            theirs,
            m.owner(theirs).unwrap().epoch,
            Class::Ordinary,
            serving
        ),
        Verdict::NotOwner { version }
    );
    assert_eq!(
        check(&me, 0, 0, Class::Ordinary, serving),
        Verdict::NotOwner { version },
        "unowned"
    );
    let restarted = Local {
        incarnation: 8,
        ..me
    };
    assert_eq!(
        check(&restarted, p, e, Class::Ordinary, serving),
        Verdict::NotOwner { version },
        "a map for my previous registration"
    );
    let fenced = Local {
        authority: false,
        ..me
    };
    assert_eq!(
        check(&fenced, p, e, Class::Ordinary, serving),
        Verdict::Fenced { version }
    );
    assert_eq!(
        check(&me, p, e, Class::Ordinary, Phase::Recovering),
        Verdict::NotReady
    );
    assert_eq!(
        check(&me, p, e, Class::Reclaim, Phase::Recovering),
        Verdict::Serve
    );
    assert_eq!(
        check(&me, p, e, Class::Reclaim, serving),
        Verdict::ReclaimClosed
    );
}
