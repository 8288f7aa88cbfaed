//! Which partition a name belongs to: `partition_of(name, P) = name_hash(hash_tag(name)) mod P`.
//!
//! Clients and servers of different builds, versions and architectures must agree on this
//! forever, or a client asks the wrong server and is refused every time. So the hash is written
//! out here, with test vectors, instead of borrowed from a library whose output may change
//! between releases (as `core::hash::SipHasher` is deprecated and std's `DefaultHasher` is
//! explicitly unspecified). It is no defence against chosen names — any peer can compute it —
//! and needs none: the worst a peer can do is put its own names in one partition.
//!
//! # The hash
//!
//! 64-bit FNV-1a over the bytes (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`),
//! then MurmurHash3's 64-bit finalizer (`fmix64`), so that names differing only in their last
//! bytes — `t1/rg1`, `t1/rg2` — spread over all partitions instead of landing in neighbours.
//! The partition is the finalized hash modulo `P` (the bias is below `P / 2^64`).
//!
//! # The `{tag}` rule (Redis Cluster's hash tags)
//!
//! If a name contains `{`, and a `}` follows it with at least one byte between them, only the
//! bytes between the **first** `{` and the first `}` after it are hashed. Otherwise the whole
//! name is. This is Redis Cluster's rule exactly (its `keyHashSlot`), including its corner
//! cases, so that anyone who knows Redis predicts where a name goes:
//!
//! | name                   | hashed            | why                                          |
//! |------------------------|-------------------|----------------------------------------------|
//! | `{orders}.rg7`         | `orders`          | the tag                                      |
//! | `t{orders}{x}`         | `orders`          | only the first `{` counts                    |
//! | `orders{}.rg7`         | `orders{}.rg7`    | an empty tag: the whole name                 |
//! | `foo{}{bar}`           | `foo{}{bar}`      | the first `{` has an empty tag; no second try |
//! | `foo{{bar}}`           | `{bar`            | the first `}` after the first `{`            |
//! | `foo{bar`              | `foo{bar`         | no closing brace                             |
//!
//! Names are opaque bytes (1–512 of them); braces are the bytes `0x7B` and `0x7D`.

use super::Partitions;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The bytes of `name` that decide its partition (module doc: the `{tag}` rule).
#[inline]
#[must_use]
pub fn hash_tag(name: &[u8]) -> &[u8] {
    let Some(open) = name.iter().position(|&b| b == b'{') else {
        return name;
    };
    let rest = &name[open + 1..];
    match rest.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => &rest[..close],
        _ => name,
    }
}

/// The stable 64-bit hash of `bytes`: FNV-1a, then `fmix64` (module doc). Fixed forever.
#[inline]
#[must_use]
pub const fn name_hash(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET_BASIS;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    fmix64(h)
}

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
#[inline]
const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The partition of `name` in a cluster of `partitions` partitions: in `0..partitions.get()`.
#[inline]
#[must_use]
pub fn partition_of(name: &[u8], partitions: Partitions) -> u16 {
    // The remainder is below `partitions`, a u16.
    (name_hash(hash_tag(name)) % u64::from(partitions.get())) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hash_tags_follow_redis_cluster_rules() {
        let cases: [(&[u8], &[u8]); 8] = [
            (b"{orders}.rg7", b"orders"),
            (b"t{orders}{x}", b"orders"),
            (b"orders{}.rg7", b"orders{}.rg7"),
            (b"foo{}{bar}", b"foo{}{bar}"),
            (b"foo{{bar}}", b"{bar"),
            (b"foo{bar", b"foo{bar"),
            (b"{user1000}.following", b"user1000"),
            (b"plain", b"plain"),
        ];
        for (name, tag) in cases {
            assert_eq!(
                hash_tag(name),
                tag,
                "{:?}",
                core::str::from_utf8(name).unwrap()
            );
        }
    }

    #[test]
    fn the_hash_is_fnv1a_then_fmix64() {
        // FNV-1a's own published vectors, before the finalizer.
        assert_eq!(fnv1a_alone(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_alone(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_alone(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(name_hash(b""), fmix64(0xcbf2_9ce4_8422_2325));
    }

    /// FNV-1a alone, to check the first stage against its published vectors.
    fn fnv1a_alone(bytes: &[u8]) -> u64 {
        bytes.iter().fold(FNV_OFFSET_BASIS, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
        })
    }

    /// These values are the contract between every client and server ever built: if this test
    /// fails, the change broke routing for every cluster in existence. Do not update them.
    #[test]
    fn partition_test_vectors_never_change() {
        let p256 = Partitions::new(256).unwrap();
        let p4096 = Partitions::new(4096).unwrap();
        let p7 = Partitions::new(7).unwrap();
        let vectors: [(&[u8], u64, u16, u16, u16); 7] = [
            (b"", 0xefd0_1f60_ba99_2926, 38, 2342, 1),
            (b"a", 0x82a2_a958_a9be_ce5b, 91, 3675, 1),
            (b"t1/rg7", 0x55f5_e200_f46a_d6a5, 165, 1701, 1),
            (b"{orders}.rg7", 0x3252_0fbd_b4da_d5b9, 185, 1465, 5),
            (b"orders", 0x3252_0fbd_b4da_d5b9, 185, 1465, 5),
            (b"xid", 0x4097_4393_4fd9_96e6, 230, 1766, 1),
            (b"csn", 0xbeb1_644f_d029_edbd, 189, 3517, 3),
        ];
        for (name, hash, in256, in4096, in7) in vectors {
            let shown = core::str::from_utf8(name).unwrap();
            assert_eq!(name_hash(hash_tag(name)), hash, "{shown:?}");
            assert_eq!(partition_of(name, p256), in256, "{shown:?}");
            assert_eq!(partition_of(name, p4096), in4096, "{shown:?}");
            assert_eq!(partition_of(name, p7), in7, "{shown:?}");
        }
    }

    #[test]
    fn partition_counts_outside_the_limits_are_refused() {
        assert_eq!(Partitions::new(0), None);
        assert_eq!(Partitions::new(super::super::PARTITIONS_MAX + 1), None);
        assert_eq!(Partitions::new(1).map(Partitions::get), Some(1));
        assert_eq!(Partitions::default().get(), 256);
    }

    #[test]
    fn row_groups_spread_over_the_partitions() {
        // Neighbouring names must not crowd into few partitions: 25,600 row-group names over
        // 256 partitions put between half and twice the mean (100) in every one.
        let p = Partitions::DEFAULT;
        let mut counts = [0u32; 256];
        for t in 0..100 {
            for rg in 0..256 {
                let name = format!("t{t}/rg{rg}");
                counts[usize::from(partition_of(name.as_bytes(), p))] += 1;
            }
        }
        assert!(
            counts.iter().all(|&c| (50..=200).contains(&c)),
            "{counts:?}"
        );
    }

    proptest! {
        #[test]
        fn a_tagged_name_lives_with_its_tag(
            tag in proptest::collection::vec(any::<u8>().prop_filter("no braces", |b| *b != b'{' && *b != b'}'), 1..20),
            prefix in proptest::collection::vec(any::<u8>().prop_filter("no open brace", |b| *b != b'{'), 0..20),
            suffix in proptest::collection::vec(any::<u8>(), 0..20),
            p in 1u16..=4096,
        ) {
            let mut name = prefix.clone();
            name.push(b'{');
            name.extend_from_slice(&tag);
            name.push(b'}');
            name.extend_from_slice(&suffix);
            let p = Partitions::new(p).unwrap();
            prop_assert_eq!(hash_tag(&name), &tag[..]);
            prop_assert_eq!(partition_of(&name, p), partition_of(&tag, p));
        }

        #[test]
        fn every_name_lands_in_range(name in proptest::collection::vec(any::<u8>(), 0..600), p in 1u16..=4096) {
            prop_assert!(partition_of(&name, Partitions::new(p).unwrap()) < p);
        }
    }
}
