//! Protocol 5's cluster forms: the partition epoch in data commands, the claim's 32-bit proof
//! epoch, `GetMap` chunks, `ClientJoin`, `ReclaimDone` and the `PartitionMoved` reply; and
//! protocol 6's `ReclaimDones`.

use super::*;
use crate::cluster::{
    ADDRESS_LEN_MAX, MAP_ENCODED_MAX, Map, Member, PARTITIONS_MAX, Partitions, SERVERS_MAX,
    ServerId, assign,
};

/// The largest map there is: every server with the longest address, every partition.
fn largest_map() -> Box<Map> {
    let addr = [b'a'; ADDRESS_LEN_MAX];
    let members: Vec<Member<'_>> = (1..=SERVERS_MAX as u32)
        .map(|n| Member {
            id: ServerId::new(n).unwrap(),
            incarnation: u64::from(n) << 32,
            address: &addr,
            draining: false,
        })
        .collect();
    let empty = Box::new(Map::new(Partitions::new(PARTITIONS_MAX).unwrap()));
    let mut map = Box::new(Map::new(Partitions::new(PARTITIONS_MAX).unwrap()));
    assign(&empty, &members, &[], &mut map).unwrap();
    map
}

fn moved(msg: MsgType, map_version: u64) -> Vec<u8> {
    encode_response(
        &resp_header(msg, Status::PartitionMoved),
        &ControlResponse::PartitionMoved { map_version },
    )
}

#[test]
fn the_largest_map_comes_back_whole_in_four_get_map_replies() {
    let map = largest_map();
    let mut encoded = vec![0u8; map.encoded_len()];
    map.encode(&mut encoded).unwrap();
    assert_eq!(encoded.len(), MAP_ENCODED_MAX);
    // The client's loop: ask from 0, then from each reply's end.
    let (mut got, mut offset, mut replies) = (Vec::new(), Some(0u32), 0);
    while let Some(at) = offset {
        let ask = encode_request(&frame(ControlRequest::GetMap { offset: at }));
        let ControlRequest::GetMap { offset: asked } = decode_control_request(&ask).unwrap().body
        else {
            panic!("a GetMap");
        };
        let chunk = MapChunk::of(map.version(), &encoded, asked).unwrap();
        let reply = encode_response(
            &resp_header(MsgType::GetMap, Status::Success),
            &ControlResponse::MapChunk(chunk),
        );
        assert!(reply.len() <= CONTROL_FRAME_MAX);
        let ControlResponse::MapChunk(c) = decode_control_response(&reply).unwrap().body else {
            panic!("a chunk");
        };
        assert_eq!(
            (c.version, c.total_len, c.offset),
            (map.version(), MAP_ENCODED_MAX as u32, at)
        );
        got.extend_from_slice(c.chunk);
        offset = c.next_offset();
        replies += 1;
    }
    assert_eq!(replies, 4);
    assert_eq!(got, encoded);
    let mut back = Box::new(Map::new(Partitions::new(1).unwrap()));
    Map::decode(&got, &mut back).unwrap();
    assert_eq!(back, map);
    // Past the end there is nothing to send: the server answers `Einval`.
    assert_eq!(MapChunk::of(1, &encoded, MAP_ENCODED_MAX as u32), None);
    assert_eq!(MapChunk::of(1, &[], 0), None);
}

#[test]
fn a_map_chunk_of_any_other_length_or_place_is_refused() {
    let map = [7u8; MAP_CHUNK_MAX + 1];
    let body = |total_len: u32, offset: u32, chunk_len: usize| {
        let mut b = 9u64.to_le_bytes().to_vec();
        b.extend_from_slice(&total_len.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b.extend_from_slice(&map[..chunk_len]);
        raw_control(MsgType::GetMap.response_code(), 0, &b)
    };
    let good = body(100, 40, 60);
    assert!(decode_control_response(&good).is_ok());
    let total = MAP_ENCODED_MAX as u32;
    for (bytes, why) in [
        (body(100, 40, 59), "a chunk short of the end"),
        (body(100, 40, 61), "a chunk past the end"),
        (body(100, 100, 0), "an offset at the end"),
        (body(100, 101, 0), "an offset past the end"),
        (body(0, 0, 0), "an empty map"),
        (body(total + 1, 0, MAP_CHUNK_MAX), "a map longer than any"),
        (body(total, 0, MAP_CHUNK_MAX - 1), "less than a full chunk"),
        (body(total, 0, MAP_CHUNK_MAX + 1), "more than a chunk"),
        (
            good[..CONTROL_HEADER_LEN + 15].to_vec(),
            "no room for the offset",
        ),
    ] {
        let mut bytes = bytes;
        fix_total_len(&mut bytes);
        assert!(decode_control_response(&bytes).is_err(), "{why}");
    }
    // The encoder refuses what the decoder would.
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let chunk = MapChunk {
        version: 1,
        total_len: 100,
        offset: 40,
        chunk: &map[..59],
    };
    assert_eq!(
        encode_control_response(
            &resp_header(MsgType::GetMap, Status::Success),
            &ControlResponse::MapChunk(chunk),
            &mut out
        ),
        Err(EncodeError::Invalid)
    );
}

#[test]
fn partition_moved_carries_exactly_the_map_version_on_every_type() {
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    for msg in MsgType::ALL {
        let bytes = moved(msg, 0x1122_3344_5566_7788);
        assert_eq!(bytes.len(), CONTROL_HEADER_LEN + MOVED_LEN);
        let r = decode_control_response(&bytes).unwrap();
        assert_eq!(r.header.status(), Some(Status::PartitionMoved));
        assert_eq!(
            r.body,
            ControlResponse::PartitionMoved {
                map_version: 0x1122_3344_5566_7788
            }
        );
        // Without its version, with a byte more or less, or the version under another status.
        let word = u32::from(Status::PartitionMoved as u16);
        for body in [&[][..], &[0u8; 7], &[0u8; 9]] {
            let raw = raw_control(msg.response_code(), word, body);
            assert!(
                decode_control_response(&raw).is_err(),
                "{msg:?} {}",
                body.len()
            );
        }
        let fail = raw_control(msg.response_code(), Status::Fail as u32, &[0u8; 8]);
        assert_eq!(
            decode_control_response(&fail).map(|_| ()),
            Err(DecodeError::BadLength)
        );
        let mut encode = |status, body: ControlResponse<'_>| {
            encode_control_response(&resp_header(msg, status), &body, &mut out)
        };
        let version = ControlResponse::PartitionMoved { map_version: 1 };
        assert_eq!(
            encode(Status::PartitionMoved, ControlResponse::Empty),
            Err(EncodeError::Invalid)
        );
        assert_eq!(encode(Status::Fail, version), Err(EncodeError::Invalid));
        assert_eq!(encode(Status::Success, version), Err(EncodeError::Invalid));
    }
}

#[test]
fn cluster_request_bodies_of_any_other_shape_are_refused() {
    let word = 0x1234_5678;
    let session = [0x5Au8; Session::LEN];
    let join = |min: u8, reserved: [u8; 3], tail: &[u8]| {
        let mut b = vec![min];
        b.extend_from_slice(&reserved);
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(tail);
        raw_control(MsgType::ClientJoin.request_code(), word, &b)
    };
    let done = |partition: u16, reserved: u16, epoch: u32| {
        let mut b = partition.to_le_bytes().to_vec();
        b.extend_from_slice(&reserved.to_le_bytes());
        b.extend_from_slice(&epoch.to_le_bytes());
        raw_control(MsgType::ReclaimDone.request_code(), word, &b)
    };
    let get_map = |body: &[u8]| raw_control(MsgType::GetMap.request_code(), word, body);
    assert_eq!(
        decode_control_request(&join(5, [0; 3], &session)).map(|f| f.body),
        Ok(ControlRequest::ClientJoin {
            min_version: 5,
            lease_ms: 7,
            session: Session(session)
        })
    );
    assert_eq!(
        decode_control_request(&done(3, 0, 9)).map(|f| f.body),
        Ok(ControlRequest::ReclaimDone {
            partition: 3,
            epoch: 9
        })
    );
    let mut short_done = done(3, 0, 9);
    short_done.pop();
    fix_total_len(&mut short_done);
    for (bytes, why) in [
        (join(5, [0, 1, 0], &session), "a reserved byte set"),
        (join(5, [0; 3], &[]), "no session"),
        (join(5, [0; 3], &session[1..]), "a short session"),
        (join(5, [0; 3], &[0; Session::LEN + 1]), "a byte too many"),
        (done(3, 1, 9), "a reserved byte set"),
        (short_done, "a byte short"),
        (get_map(&[0; 3]), "a short offset"),
        (get_map(&[0; 5]), "a byte too many"),
        (get_map(&[]), "no offset"),
    ] {
        assert!(decode_control_request(&bytes).is_err(), "{why}");
    }
    // A response type byte is not a request, and the other way round.
    let reply = raw_control(MsgType::ReclaimDone.response_code(), 0, &[]);
    assert!(decode_control_request(&reply).is_err());
    assert!(decode_control_response(&done(3, 0, 9)).is_err());
}

#[test]
fn the_partition_epoch_rides_at_its_offsets_and_the_reserved_bytes_stay_zero() {
    let lock = Command::Lock(LockCommand {
        partition_epoch: 0xDEAD_BEEF,
        ..LockCommand::NONE
    });
    let object = Command::Object(ObjectCommand {
        op: ObjectOp::Snapshot,
        object: 5,
        a: 0,
        b: 0,
        partition_epoch: 0x0102_0304,
    });
    let bytes = encode_data(&data_header(0), &[lock, object]);
    let (l, o) = (DATA_HEADER_LEN, DATA_HEADER_LEN + COMMAND_LEN);
    assert_eq!(bytes[l + 20..l + 24], 0xDEAD_BEEFu32.to_le_bytes());
    assert_eq!(bytes[o + 24..o + 28], 0x0102_0304u32.to_le_bytes());
    let req = decode_data_request(&bytes).unwrap();
    assert_eq!(req.command(0).partition_epoch(), 0xDEAD_BEEF);
    assert_eq!(req.command(1).partition_epoch(), 0x0102_0304);
    // Byte 24 of a lock command is its lock flags (`lock_flags.rs`, tested there); the rest
    // stays reserved.
    for at in (l + 25..l + 32).chain(o + 28..o + 32) {
        let mut bad = bytes.clone();
        bad[at] = 1;
        assert_eq!(
            decode_data_request(&bad).map(|_| ()),
            Err(DecodeError::BadField),
            "byte {at}"
        );
    }
    // A join names no partition: its bytes 24..32 stay reserved.
    let join = Command::Join(JoinCommand {
        session: Session([3; Session::LEN]),
    });
    assert_eq!(join.partition_epoch(), 0);
    let mut bad = encode_data(&data_header(0), &[join]);
    bad[DATA_HEADER_LEN + 24] = 1;
    assert_eq!(
        decode_data_request(&bad).map(|_| ()),
        Err(DecodeError::BadField)
    );
}

#[test]
fn a_claims_proof_epoch_is_32_bits_and_a_version_4_claim_reads_the_same() {
    let mut c = claim(b"c", Held::Exclusive);
    c.proof.epoch = 0x0001_0002;
    let bytes = encode_request(&frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(
        &[c],
    ))));
    let at = CONTROL_HEADER_LEN + BATCH_HEADER_LEN + 44;
    assert_eq!(bytes[at..at + 4], [2, 0, 1, 0]);
    let ControlRequest::BatchUpdateLocks(back) = decode_control_request(&bytes).unwrap().body
    else {
        panic!("claims");
    };
    assert_eq!(back.get(0).unwrap().proof.epoch, 0x0001_0002);
    // What a version-4 client wrote: a u16 epoch and two reserved zero bytes.
    c.proof.epoch = 7;
    let bytes = encode_request(&frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(
        &[c],
    ))));
    assert_eq!(bytes[at..at + 4], [7, 0, 0, 0]);
}

#[test]
fn a_cluster_server_speaks_versions_5_to_7_and_a_standalone_one_still_4() {
    let v4 = VersionRange { min: 4, max: 4 };
    assert_eq!(negotiate(v4, SERVER_VERSIONS), Ok(4));
    assert_eq!(
        negotiate(v4, CLUSTER_VERSIONS),
        Err(Status::ProtoVersionNegotiationFail)
    );
    assert_eq!(
        negotiate(SERVER_VERSIONS, CLUSTER_VERSIONS),
        Ok(PROTO_VERSION)
    );
    assert_eq!(PROTO_VERSION, 8);
    // A new client joining a version-5 server (one built before `ReclaimDones`) agrees on 5,
    // and so says its `ReclaimDone`s one partition at a time there.
    let v5_server = VersionRange { min: 5, max: 5 };
    let new_client = VersionRange {
        min: PROTO_VERSION_CLUSTER_MIN,
        max: PROTO_VERSION,
    };
    assert_eq!(negotiate(new_client, v5_server), Ok(5));
    assert_eq!(negotiate(new_client, CLUSTER_VERSIONS), Ok(8));
}

/// A `ReclaimDones` body: `count`, its reserved bytes, then the entries' bytes as given.
fn reclaim_dones(count: u8, reserved: [u8; 3], entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut b = vec![count];
    b.extend_from_slice(&reserved);
    for &(partition, reserved, epoch) in entries {
        b.extend_from_slice(&partition.to_le_bytes());
        b.extend_from_slice(&reserved.to_le_bytes());
        b.extend_from_slice(&epoch.to_le_bytes());
    }
    raw_control(MsgType::ReclaimDones.request_code(), 0x1234_5678, &b)
}

#[test]
fn reclaim_dones_lists_partitions_at_reclaim_dones_offsets_and_refuses_any_other_shape() {
    let two = reclaim_dones(2, [0; 3], &[(3, 0, 9), (65_535, 0, 1)]);
    let ControlRequest::ReclaimDones(dones) = decode_control_request(&two).unwrap().body else {
        panic!("not a ReclaimDones");
    };
    let dones: Vec<PartitionEpoch> = dones.iter().collect();
    assert_eq!(
        dones,
        [
            PartitionEpoch {
                partition: 3,
                epoch: 9
            },
            PartitionEpoch {
                partition: 65_535,
                epoch: 1
            }
        ]
    );
    // The most one message holds, and its encoding is the same bytes.
    let most: Vec<(u16, u16, u32)> = (0..RECLAIM_DONES_MAX as u16).map(|p| (p, 0, 7)).collect();
    let bytes = reclaim_dones(RECLAIM_DONES_MAX as u8, [0; 3], &most);
    let frame = decode_control_request(&bytes).unwrap();
    let mut out = [0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut out).unwrap();
    assert_eq!(&out[..n], &bytes[..]);
    for (bytes, why) in [
        (reclaim_dones(0, [0; 3], &[]), "no partition"),
        (reclaim_dones(2, [0; 3], &[(3, 0, 9)]), "an entry short"),
        (
            reclaim_dones(1, [0; 3], &[(3, 0, 9), (4, 0, 9)]),
            "an entry too many",
        ),
        (
            reclaim_dones(1, [0; 3], &[(3, 1, 9)]),
            "an entry's reserved bytes set",
        ),
        (
            reclaim_dones(1, [0, 0, 1], &[(3, 0, 9)]),
            "the list's reserved bytes set",
        ),
    ] {
        assert!(decode_control_request(&bytes).is_err(), "{why}");
    }
    let too_many = [PartitionEpoch {
        partition: 0,
        epoch: 0,
    }; RECLAIM_DONES_MAX + 1];
    let frame = ControlRequestFrame {
        body: ControlRequest::ReclaimDones(Batch::from_slice(&too_many)),
        ..frame
    };
    assert_eq!(
        encode_control_request(&frame, &mut out),
        Err(EncodeError::Invalid)
    );
}

#[test]
fn a_reclaim_dones_reply_has_a_status_per_partition_in_order() {
    let statuses = [
        PartitionStatus {
            partition: 3,
            status: Status::Success,
        },
        PartitionStatus {
            partition: 4,
            status: Status::NotReady,
        },
        PartitionStatus {
            partition: 5,
            status: Status::PartitionMoved,
        },
    ];
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: MsgType::ReclaimDones,
        message_id: 77,
        word: Status::Success as u32,
    };
    let body = ControlResponse::PartitionStatuses(Batch::from_slice(&statuses));
    let mut out = [0u8; CONTROL_FRAME_MAX];
    let n = encode_control_response(&header, &body, &mut out).unwrap();
    // 16 header, 4 list header, 4 per partition: `u16 partition | u16 status`.
    assert_eq!(n, CONTROL_HEADER_LEN + 4 + 3 * 4);
    assert_eq!(&out[n - 4..n], &[5, 0, 0x10, 0x20]);
    let frame = decode_control_response(&out[..n]).unwrap();
    assert_eq!(frame.body, body);
    // A status that is no status is refused.
    out[n - 2..n].copy_from_slice(&0xFFFFu16.to_le_bytes());
    assert!(decode_control_response(&out[..n]).is_err());
}

#[test]
fn map_chunk_lengths_cover_a_map_exactly_once() {
    for total in [
        1u32,
        2,
        MAP_CHUNK_MAX as u32,
        MAP_CHUNK_MAX as u32 + 1,
        MAP_ENCODED_MAX as u32,
    ] {
        let (mut offset, mut covered) = (0u32, 0usize);
        while let Some(len) = map_chunk_len(total, offset) {
            assert!((1..=MAP_CHUNK_MAX).contains(&len));
            covered += len;
            offset += len as u32;
        }
        assert_eq!((covered, offset), (total as usize, total));
    }
    assert_eq!(map_chunk_len(0, 0), None);
    assert_eq!(map_chunk_len(MAP_ENCODED_MAX as u32 + 1, 0), None);
}

/// A claim offers its grant's value block behind a bit of its `held` byte, so a claim without
/// one is what protocol 4 sent; an offered block must be present.
#[test]
fn a_claims_value_block_follows_its_fixed_part_only_when_flagged() {
    use crate::manager::value::{ValueBlock, ValueRead};
    use crate::proto::{CLAIM_FIXED_LEN, CLAIM_HAS_VALUE, CLAIM_VALUE_LEN};
    let mut c = claim(b"page", Held::Exclusive);
    c.value = None;
    let plain = encode_request(&frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(
        &[c],
    ))));
    let held_at = CONTROL_HEADER_LEN + BATCH_HEADER_LEN + 1;
    assert_eq!(plain[held_at], Held::Exclusive.code(), "no flag, no entry");
    let name_at = CONTROL_HEADER_LEN + BATCH_HEADER_LEN + CLAIM_FIXED_LEN;
    assert_eq!(&plain[name_at..], b"page");
    let offered = ValueRead {
        block: ValueBlock([3; 32]),
        seq: 9,
        valid: true,
    };
    c.value = Some(offered);
    let bytes = encode_request(&frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(
        &[c],
    ))));
    assert_eq!(bytes[held_at], Held::Exclusive.code() | CLAIM_HAS_VALUE);
    assert_eq!(bytes.len(), plain.len() + CLAIM_VALUE_LEN);
    assert_eq!(&bytes[name_at + CLAIM_VALUE_LEN..], b"page");
    let ControlRequest::BatchUpdateLocks(back) = decode_control_request(&bytes).unwrap().body
    else {
        panic!("claims");
    };
    assert_eq!(back.get(0).unwrap().value, Some(offered));
    // Flagged with an entry that is not present: refused, as is an unknown entry flag.
    for (at, byte) in [(name_at + 36, 0), (name_at + 36, 0x41)] {
        let mut bad = bytes.clone();
        if byte == 0 {
            bad[name_at..name_at + CLAIM_VALUE_LEN].fill(0);
        } else {
            bad[at] = byte;
        }
        assert_eq!(
            decode_control_request(&bad).map(|_| ()),
            Err(DecodeError::BadField),
            "entry flags {byte:#x}"
        );
    }
}
