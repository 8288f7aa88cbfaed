//! Property tests: no input makes a decoder panic, and no input is silently misparsed — a frame
//! that decodes re-encodes to exactly the bytes it came from, so every byte was either checked
//! or carried through (which implies the re-encoded frame decodes to the same value).
//!
//! # Long campaign
//!
//! Every property here runs [`CASES_DEFAULT`] cases, so the normal suite stays fast. Set
//! `DLOCK_FUZZ_CASES` to run each with that many instead, for example a million in release:
//!
//! ```text
//! DLOCK_FUZZ_CASES=1000000 cargo test -p dlock-core --release --lib proto::tests::fuzz
//! ```
//!
//! `tests/tests/frames.rs` reads the same variable for the server fed the same kind of frames.

use super::*;
use crate::cluster::MAP_ENCODED_MAX;
use proptest::prelude::*;
use std::sync::OnceLock;

/// Cases per property unless `DLOCK_FUZZ_CASES` says otherwise.
const CASES_DEFAULT: u32 = 1_000;

/// The campaign's size: `DLOCK_FUZZ_CASES` if set (a bad value is a mistake worth stopping
/// for, not a silent fallback), else [`CASES_DEFAULT`].
pub(super) fn cases() -> u32 {
    match std::env::var("DLOCK_FUZZ_CASES") {
        Ok(v) => v.parse().expect("DLOCK_FUZZ_CASES is a case count"),
        Err(_) => CASES_DEFAULT,
    }
}

/// Runs every decoder on `bytes`; whatever one accepts must re-encode to exactly `bytes`.
fn assert_refused_or_reencoded_exactly(bytes: &[u8]) {
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    if let Ok(frame) = decode_control_request(bytes) {
        let n = encode_control_request(&frame, &mut out).expect("a decoded request re-encodes");
        assert_eq!(&out[..n], bytes, "{frame:?}");
    }
    if let Ok(frame) = decode_control_response(bytes) {
        let n = encode_control_response(&frame.header, &frame.body, &mut out)
            .expect("a decoded response re-encodes");
        assert_eq!(&out[..n], bytes, "{frame:?}");
    }
    if let Ok(req) = decode_data_request(bytes) {
        let commands: Vec<Command> = req.commands().collect();
        assert_eq!(usize::from(req.header().count), commands.len());
        let n = encode_data_request(&req.header(), &commands, &mut out)
            .expect("a decoded data request re-encodes");
        assert_eq!(&out[..n], bytes, "{req:?}");
        assert_results_written_alike(&req, &commands);
    }
    // The server's one-pass decoder accepts and reads exactly what the two-pass one does.
    let mut read = [command_with(0, 0, 1); BATCH_MAX];
    match (
        decode_data_request(bytes),
        decode_data_request_into(bytes, &mut read),
    ) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            assert!(a.commands().eq(read[..a.len()].iter().copied()));
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        (a, b) => panic!("decoders disagree: {a:?} / {b:?}"),
    }
    if let Ok(resp) = decode_data_response(bytes) {
        let n = reencode_data_response(&resp, &mut out);
        assert_eq!(&out[..n], bytes, "{resp:?}");
    }
    if let Ok((header, _)) = peek_control_header(bytes) {
        let len = control_frame_len(bytes).expect("peek accepted this header");
        assert!((CONTROL_HEADER_LEN..=bytes.len()).contains(&len));
        assert_eq!(header.message_id.to_le_bytes(), bytes[10..12]);
    }
}

/// `put_command_result` (from decoded commands) writes the same response bytes as
/// `put_data_result` (from the request's bytes).
fn assert_results_written_alike(req: &DataRequest<'_>, commands: &[Command]) {
    let (mut by_bytes, mut by_command) = ([0u8; DATA_MESSAGE_MAX], [0u8; DATA_MESSAGE_MAX]);
    let n = begin_data_response(req, &mut by_bytes).expect("room for the response");
    begin_data_response(req, &mut by_command).expect("room for the response");
    for (i, c) in commands.iter().enumerate() {
        let r = CommandResult {
            status: Status::ALL[i % Status::ALL.len()],
            word: u128::MAX / 3 + i as u128,
            aux: 0xA5A5_0000 + i as u64,
            plain: false,
        };
        put_data_result(req, i, &r, &mut by_bytes).expect("in range");
        put_command_result(&mut by_command, i, c, &r).expect("in range");
    }
    assert_eq!(by_bytes[..n], by_command[..n]);
}

/// Re-encodes a decoded response through the public API: rebuild the request it answers from
/// the echoed kind, op and id, then encode the results against it.
fn reencode_data_response(resp: &DataResponse<'_>, out: &mut [u8]) -> usize {
    let commands: Vec<Command> = resp
        .results()
        .map(|r| command_with(r.kind, r.op, r.id))
        .collect();
    let mut req_buf = vec![0u8; DATA_MESSAGE_MAX];
    // The request had no trailer; the response announces its own.
    let header = DataHeader {
        flags: resp.header().flags & !FLAG_PROOFS,
        ..resp.header()
    };
    let n = encode_data_request(&header, &commands, &mut req_buf).unwrap();
    let req = decode_data_request(&req_buf[..n]).unwrap();
    let results: Vec<CommandResult> = resp.results().map(|r| r.result).collect();
    let n = encode_data_response(&req, &results, out).unwrap();
    if resp.header().flags & FLAG_PROOFS == 0 {
        return n;
    }
    for i in 0..resp.len() {
        put_data_proof(out, resp.len(), i, &resp.proof_mac(i), i == 0).unwrap();
    }
    finish_data_proofs(out, resp.len()).unwrap()
}

/// A command with this kind, op and id; panics if the decoder let an invalid kind or op through.
pub(super) fn command_with(kind: u8, op: u8, id: u32) -> Command {
    if kind == JOIN_KIND {
        assert_eq!((op, id), (0, 0), "decoder validated the join");
        return Command::Join(JoinCommand {
            session: crate::ids::Session([0; 16]),
        });
    }
    if kind == OBJECT_KIND {
        return Command::Object(ObjectCommand {
            op: ObjectOp::from_u8(op).expect("decoder validated the object op"),
            object: id,
            a: 0,
            b: 0,
            partition_epoch: 0,
        });
    }
    Command::Lock(LockCommand {
        kind: LockKind::from_u8(kind).expect("decoder validated the kind"),
        op: LockOp::from_u8(op).expect("decoder validated the lock op"),
        lock: id,
        expire_ms: 0,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: crate::proto::LockFlags::NONE,
    })
}

/// One valid frame of every shape the codec knows.
fn corpus() -> &'static [Vec<u8>] {
    static CORPUS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let mut frames = Vec::new();
        for_each_request(|f| frames.push(encode_request(f)));
        for_each_response(|h, b| frames.push(encode_response(h, b)));
        let commands = every_command();
        for chunk in [
            &commands[..],
            &commands[..1],
            &commands[commands.len() - 1..],
        ] {
            let req = encode_data(&data_header(FLAG_ALL_OR_NOTHING), chunk);
            frames.push(encode_data_reply(&req));
            frames.push(req);
        }
        frames
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    Truncate {
        at: usize,
    },
    Extend(Vec<u8>),
    Insert {
        at: usize,
        byte: u8,
    },
    Remove {
        at: usize,
    },
    /// Make the length fields agree with the buffer again, so the checks behind them are
    /// reached instead of every mutation dying on a length mismatch.
    FixLengths,
    /// Overwrite one of the [`LENGTH_FIELDS`] with any value: counts and lengths that lie.
    Length {
        field: prop::sample::Index,
        value: u16,
    },
}

/// Where frames keep a count or a length, as (offset, width in bytes): the data header's
/// `count`; the control header's `total_len`; a counted list's `count`; the `name_len` of
/// `GetLock`, of `ObjectGet`, of a list's first lock request or claim, and of `ObjectCreate`.
/// A field that is not there in a given frame overwrites other bytes, which is fine too.
const LENGTH_FIELDS: [(usize, usize); 7] = [
    (5, 1),
    (8, 2),
    (CONTROL_HEADER_LEN, 1),
    (CONTROL_HEADER_LEN + 2, 2),
    (CONTROL_HEADER_LEN + 4, 2),
    (CONTROL_HEADER_LEN + 6, 2),
    (CONTROL_HEADER_LEN + 12, 2),
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 1..=u8::MAX).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        1 => prop::collection::vec(any::<u8>(), 1..40).prop_map(Mutation::Extend),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        1 => any::<usize>().prop_map(|at| Mutation::Remove { at }),
        2 => Just(Mutation::FixLengths),
        2 => (any::<prop::sample::Index>(), length_value())
            .prop_map(|(field, value)| Mutation::Length { field, value }),
    ]
}

/// A count or length: mostly near the edges the decoders check (0, 1, 31/32, 512/513, the
/// buffer sizes), sometimes anything.
fn length_value() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => prop::sample::select(vec![0u16, 1, 2, 30, 31, 32, 33, 255, 256, 511, 512, 513]),
        1 => Just(CONTROL_FRAME_MAX as u16),
        1 => Just(CONTROL_FRAME_MAX as u16 + 1),
        2 => any::<u16>(),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len();
    match *mutation {
        Mutation::Flip { at, mask } if len > 0 => bytes[at % len] ^= mask,
        Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
        Mutation::Extend(ref more) => bytes.extend_from_slice(more),
        Mutation::Insert { at, byte } => bytes.insert(at % (len + 1), byte),
        Mutation::Remove { at } if len > 0 => {
            bytes.remove(at % len);
        }
        Mutation::Length { ref field, value } => {
            let (at, width) = LENGTH_FIELDS[field.index(LENGTH_FIELDS.len())];
            if at + width <= len {
                bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
        }
        Mutation::FixLengths if len >= CONTROL_HEADER_LEN => {
            let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            if magic == CONTROL_MAGIC && len <= usize::from(u16::MAX) {
                fix_total_len(bytes);
            } else if magic == DATA_MAGIC {
                bytes[5] = ((len - DATA_HEADER_LEN) / COMMAND_LEN).min(255) as u8;
            }
        }
        _ => {}
    }
}

/// Nudges 32 random bytes towards a valid command (small kind and op, zero status and reserved
/// bytes) so the fuzzer reaches the accepting paths, while still producing kinds 3..=4 and op 8.
/// The partition epoch (lock 20..24, object 24..28) keeps its random value.
fn tidy_command(c: &mut [u8]) {
    c[0] %= 5;
    c[1] %= 9;
    c[2..4].fill(0);
    let reserved = if c[0] == OBJECT_KIND { 28 } else { 24 };
    c[reserved..].fill(0);
}

fn arb_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (
            0u8..3,
            0u8..8,
            any::<u32>(),
            any::<u32>(),
            any::<u16>(),
            any::<u16>(),
            (any::<u32>(), any::<u32>())
        )
            .prop_map(
                |(kind, op, lock, expire_ms, tx, ts, (wait_ms, partition_epoch))| Command::Lock(
                    LockCommand {
                        kind: LockKind::from_u8(kind).unwrap(),
                        op: LockOp::from_u8(op).unwrap(),
                        lock,
                        expire_ms,
                        wait_ms,
                        ticket: Ticket {
                            exclusive: tx,
                            shared: ts,
                        },
                        partition_epoch,
                        flags: crate::proto::LockFlags::NONE,
                    }
                )
            ),
        (
            0u8..3,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(op, object, a, b, partition_epoch)| {
                Command::Object(ObjectCommand {
                    op: ObjectOp::from_u8(op).unwrap(),
                    object,
                    a,
                    b,
                    partition_epoch,
                })
            }),
        any::<[u8; 16]>().prop_map(|s| Command::Join(JoinCommand {
            session: crate::ids::Session(s)
        })),
    ]
}

type ClaimParts = (u8, u8, Vec<u8>, u32, u128, (u16, u16), (u32, u32, u64));

fn arb_claim_parts() -> impl Strategy<Value = ClaimParts> {
    (
        0u8..3,
        0u8..5,
        prop::collection::vec(any::<u8>(), 1..=NAME_LEN_MAX),
        any::<u32>(),
        any::<u128>(),
        any::<(u16, u16)>(),
        any::<(u32, u32, u64)>(),
    )
}

fn claim_from(parts: &ClaimParts) -> LockClaim<'_> {
    let (kind, held, ref name, old_lock, word, (tx, ts), (remaining_ms, age_ms, token)) = *parts;
    LockClaim {
        // Present or not, valid or not: the old id's low bits pick.
        value: (old_lock % 3 != 0).then_some(crate::manager::value::ValueRead {
            block: crate::manager::ValueBlock([word as u8; 32]),
            seq: old_lock,
            valid: old_lock % 2 == 0,
        }),
        kind: LockKind::from_u8(kind).unwrap(),
        held: Held::from_code(held).unwrap(),
        name,
        old_lock,
        word,
        ticket: Ticket {
            exclusive: tx,
            shared: ts,
        },
        remaining_ms,
        age_ms,
        token,
        // Any bytes will do; the word's give every proof byte a value.
        proof: crate::GrantProof {
            epoch: (token >> 32) as u32,
            mac: word.to_le_bytes(),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn random_bytes_are_refused_or_reencoded_exactly(
        bytes in prop::collection::vec(any::<u8>(), 0..2000)
    ) {
        assert_refused_or_reencoded_exactly(&bytes);
    }

    #[test]
    fn random_control_bodies_are_refused_or_reencoded_exactly(
        code in 10u8..54,
        word in prop_oneof![Just(0u32), 0u32..0x3010, any::<u32>()],
        body in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        assert_refused_or_reencoded_exactly(&raw_control(code, word, &body));
    }

    #[test]
    fn random_data_commands_are_refused_or_reencoded_exactly(
        count in 0u8..=32,
        flags in 0u32..4,
        commands in prop::collection::vec((any::<[u8; 32]>(), any::<bool>()), 0..33),
    ) {
        let mut bytes = DATA_MAGIC.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[PROTO_VERSION, count, 0x34, 0x12]);
        bytes.extend_from_slice(&9u32.to_le_bytes());
        bytes.extend_from_slice(&flags.to_le_bytes());
        for (mut c, tidy) in commands {
            if tidy {
                tidy_command(&mut c);
            }
            bytes.extend_from_slice(&c);
        }
        assert_refused_or_reencoded_exactly(&bytes);
    }

    #[test]
    fn mutated_frames_are_refused_or_reencoded_exactly(
        index in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..5),
    ) {
        let mut bytes = index.get(corpus()).clone();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        assert_refused_or_reencoded_exactly(&bytes);
    }

    #[test]
    fn any_data_request_round_trips(
        commands in prop::collection::vec(arb_command(), 1..=BATCH_MAX),
        message_id in any::<u16>(),
        client in any::<u32>(),
        // A value trailer needs a command that writes (`value_trailers_*` in `tests/manager.rs`).
        flags in 0..=FLAG_ALL_OR_NOTHING,
    ) {
        let header = DataHeader { version: PROTO_VERSION, count: 0, message_id, client, flags };
        let bytes = encode_data(&header, &commands);
        let req = decode_data_request(&bytes).unwrap();
        prop_assert_eq!(req.header(), DataHeader { count: commands.len() as u8, ..header });
        prop_assert_eq!(req.commands().collect::<Vec<_>>(), commands);
    }

    #[test]
    fn any_named_request_round_trips(
        name in prop::collection::vec(any::<u8>(), 1..=NAME_LEN_MAX),
        kind in 0u8..3,
        init in any::<u64>(),
        lease_s in any::<u32>(),
    ) {
        let kind = LockKind::from_u8(kind).unwrap();
        for body in [
            ControlRequest::GetLock { kind, name: &name },
            ControlRequest::ObjectCreate { name: &name, init, lease_s },
            ControlRequest::ObjectGet { name: &name, lease_s },
        ] {
            let frame = frame(body);
            let bytes = encode_request(&frame);
            prop_assert_eq!(decode_control_request(&bytes), Ok(frame));
        }
    }

    #[test]
    fn any_cluster_request_round_trips(
        offset in any::<u32>(),
        (partition, epoch) in any::<(u16, u32)>(),
        (min_version, lease_ms) in any::<(u8, u32)>(),
        session in any::<[u8; 16]>(),
    ) {
        for body in [
            ControlRequest::GetMap { offset },
            ControlRequest::ReclaimDone { partition, epoch },
            ControlRequest::ClientJoin { min_version, lease_ms, session: crate::ids::Session(session) },
        ] {
            let frame = frame(body);
            let bytes = encode_request(&frame);
            prop_assert_eq!(decode_control_request(&bytes), Ok(frame));
        }
    }

    /// Any chunk of any map length, and a `PartitionMoved` of any type and version, round trip;
    /// the chunk is exactly as long as its place says.
    #[test]
    fn any_map_chunk_and_moved_reply_round_trips(
        total_len in 1..=MAP_ENCODED_MAX as u32,
        at in any::<prop::sample::Index>(),
        version in any::<u64>(),
        msg in any::<prop::sample::Index>(),
    ) {
        let map: Vec<u8> = (0..total_len).map(|i| i as u8).collect();
        let offset = at.index(map.len()) as u32;
        let chunk = MapChunk::of(version, &map, offset).unwrap();
        prop_assert_eq!(Some(chunk.chunk.len()), map_chunk_len(total_len, offset));
        let header = resp_header(MsgType::GetMap, Status::Success);
        let bytes = encode_response(&header, &ControlResponse::MapChunk(chunk));
        let back = decode_control_response(&bytes).unwrap();
        prop_assert_eq!(back.body, ControlResponse::MapChunk(chunk));
        let msg = MsgType::ALL[msg.index(MsgType::ALL.len())];
        let moved = ControlResponse::PartitionMoved { map_version: version };
        let bytes = encode_response(&resp_header(msg, Status::PartitionMoved), &moved);
        prop_assert_eq!(decode_control_response(&bytes).unwrap().body, moved);
    }

    #[test]
    fn any_claim_batch_round_trips(
        parts in prop::collection::vec(arb_claim_parts(), 1..=BATCH_MAX),
    ) {
        let claims: Vec<LockClaim<'_>> = parts.iter().map(claim_from).collect();
        let frame = frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)));
        let bytes = encode_request(&frame);
        prop_assert!(bytes.len() <= CONTROL_FRAME_MAX);
        prop_assert_eq!(decode_control_request(&bytes), Ok(frame));
    }
}
