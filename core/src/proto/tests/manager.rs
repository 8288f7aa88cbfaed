//! Tests of issue 19's wire forms: the lock flags byte, value trailers, event messages and the
//! retained-lock control bodies. Every decoder is fed random and mutated bytes: it refuses them
//! or what it accepts re-encodes to exactly the same bytes, and it never panics.

use super::fuzz::{cases, command_with};
use super::*;
use crate::manager::value::{ValueBlock, ValueRead};
use proptest::prelude::*;

const OPS_WITH_ALL_FLAGS: [u8; 4] = [0, 3, 4, 7];

#[test]
fn each_op_carries_only_its_flags_and_unknown_bits_are_refused() {
    for op in 0..=u8::MAX {
        for bits in 0..=u8::MAX {
            let mut c = [0u8; COMMAND_LEN];
            c[1] = op;
            c[LOCK_FLAGS_OFFSET] = bits;
            let allowed = match op {
                _ if OPS_WITH_ALL_FLAGS.contains(&op) => 15,
                1 | DOWNGRADE_OP => 4,
                _ => 0,
            };
            let ok = bits & !allowed == 0;
            assert_eq!(read_lock_flags(&c).is_ok(), ok, "op {op} flags {bits:#x}");
            if let Ok(f) = read_lock_flags(&c) {
                let mut again = [0u8; COMMAND_LEN];
                again[1] = op;
                put_lock_flags(&mut again, f).unwrap();
                assert_eq!(again, c, "op {op} flags {bits:#x} re-encodes");
            } else if let Ok(f) = LockFlags::from_bits(bits) {
                let mut again = [0u8; COMMAND_LEN];
                again[1] = op;
                assert_eq!(put_lock_flags(&mut again, f), Err(EncodeError::Invalid));
            }
        }
    }
}

#[test]
fn wake_on_revoke_rides_on_acquisitions_only() {
    let f = LockFlags::WAKE_ON_REVOKE.union(LockFlags::CACHEABLE);
    for op in OPS_WITH_ALL_FLAGS {
        let mut c = [0u8; COMMAND_LEN];
        c[1] = op;
        put_lock_flags(&mut c, f).unwrap();
        assert_eq!(c[LOCK_FLAGS_OFFSET], 9, "op {op}");
        assert_eq!(read_lock_flags(&c), Ok(f), "op {op}");
        assert!(
            read_lock_flags(&c)
                .unwrap()
                .contains(LockFlags::WAKE_ON_REVOKE)
        );
    }
    // An unlock or a downgrade has no wait to cut short.
    for op in [1, 2, 5, DOWNGRADE_OP] {
        let mut c = [0u8; COMMAND_LEN];
        c[1] = op;
        assert_eq!(
            put_lock_flags(&mut c, LockFlags::WAKE_ON_REVOKE),
            Err(EncodeError::Invalid),
            "op {op}"
        );
        c[LOCK_FLAGS_OFFSET] = 8;
        assert_eq!(read_lock_flags(&c), Err(DecodeError::BadField), "op {op}");
    }
}

#[test]
fn the_bytes_after_the_flags_stay_reserved() {
    for at in LOCK_FLAGS_OFFSET + 1..COMMAND_LEN {
        let mut c = [0u8; COMMAND_LEN];
        c[at] = 1;
        assert_eq!(read_lock_flags(&c), Err(DecodeError::BadField), "byte {at}");
    }
    let mut c = [0xFFu8; COMMAND_LEN];
    c[1] = 0;
    c[LOCK_FLAGS_OFFSET] = 0;
    put_lock_flags(&mut c, LockFlags::CACHEABLE).unwrap();
    assert_eq!(c[LOCK_FLAGS_OFFSET..], [1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        c[20..24],
        [0xFF; 4],
        "the partition epoch is not ours to write"
    );
}

#[test]
fn only_an_exclusive_unlock_or_a_downgrade_writes_a_value() {
    for op in 0..=u8::MAX {
        let f = LockFlags::VALUE_BLOCK.union(LockFlags::CACHEABLE);
        assert_eq!(f.writes_value(op), op == 1 || op == DOWNGRADE_OP, "op {op}");
        assert!(!LockFlags::CACHEABLE.writes_value(op));
    }
}

#[test]
fn message_lengths_follow_from_the_header() {
    let v = FLAG_VALUES;
    assert_eq!(data_message_len(31, 0, false), DATA_MESSAGE_MAX);
    assert_eq!(data_message_len(31, FLAG_PROOFS, true), DATA_RESPONSE_MAX);
    assert_eq!(data_message_len(31, v, false), DATA_REQUEST_WITH_VALUES_MAX);
    assert_eq!(
        data_message_len(31, v | FLAG_PROOFS, true),
        DATA_RESPONSE_WITH_VALUES_MAX
    );
    assert_eq!(data_message_len(2, v, true), 16 + 2 * (32 + 40));
    assert_eq!(
        data_message_len(2, FLAG_PROOFS, false),
        16 + 2 * 32,
        "requests have no proofs"
    );
}

/// A request of `n` lock commands with room for a value trailer.
fn request(n: usize) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: 3,
        client: 9,
        flags: 0,
    };
    let commands = vec![command_with(1, 1, 0x0010_0001); n];
    let mut out = vec![0u8; DATA_REQUEST_WITH_VALUES_MAX];
    encode_data_request(&header, &commands, &mut out).unwrap();
    out
}

#[test]
fn a_request_trailer_carries_blocks_where_commands_write_them() {
    let mut out = request(3);
    put_value_request(&mut out, 3, 1, &ValueBlock([7; 32]), true).unwrap();
    let len = finish_value_requests(&mut out, 3).unwrap();
    assert_eq!(len, data_message_len(3, FLAG_VALUES, false));
    assert_eq!(get_u32(&out, 12).unwrap() & FLAG_VALUES, FLAG_VALUES);
    let trailer = &out[16 + 3 * 32..len];
    let t = ValueRequests::decode(trailer, 3, |i| i == 1).unwrap();
    assert_eq!(t.block(1), Some(ValueBlock([7; 32])));
    assert_eq!(t.block(0), Some(ValueBlock::ZERO));
    assert_eq!(t.block(3), None);
    // A block where no command writes one would be silently dropped: refused.
    assert_eq!(
        ValueRequests::decode(trailer, 3, |_| false),
        Err(DecodeError::BadField)
    );
    assert_eq!(
        ValueRequests::decode(&trailer[1..], 3, |_| true),
        Err(DecodeError::BadLength)
    );
    assert_eq!(
        put_value_request(&mut out, 3, 3, &ValueBlock::ZERO, false),
        Err(EncodeError::Invalid)
    );
    assert_eq!(
        put_value_request(&mut out[..100], 3, 0, &ValueBlock::ZERO, false),
        Err(EncodeError::BufferTooSmall)
    );
}

#[test]
fn a_response_trailer_says_which_results_carry_a_block_and_whether_it_is_valid() {
    let mut out = vec![0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    out[..16].copy_from_slice(&request(3)[..16]);
    let valid = ValueRead {
        block: ValueBlock([1; 32]),
        seq: 9,
        valid: true,
    };
    let invalid = ValueRead {
        block: ValueBlock([2; 32]),
        seq: 4,
        valid: false,
    };
    put_value_reply(&mut out, 3, 0, Some(&valid), true).unwrap();
    put_value_reply(&mut out, 3, 2, Some(&invalid), false).unwrap();
    let end = finish_value_replies(&mut out, 3).unwrap();
    assert_eq!(end, 16 + 3 * (32 + 40));
    let t = ValueReplies::decode(&out[16 + 3 * 32..end], 3).unwrap();
    assert_eq!(
        (t.get(0), t.get(1), t.get(2)),
        (Some(valid), None, Some(invalid))
    );
    assert_eq!(t.len(), 3);
}

#[test]
fn a_malformed_response_entry_is_refused() {
    let entry = |f: &dyn Fn(&mut [u8; 40])| {
        let mut e = [0u8; 40];
        e[36] = 1;
        f(&mut e);
        ValueReplies::decode(&e, 1).map(|t| t.get(0))
    };
    assert!(entry(&|_| {}).is_ok());
    assert!(entry(&|e| e[36] = 3).is_ok());
    assert_eq!(
        entry(&|e| e[36] = 5),
        Err(DecodeError::BadField),
        "unknown flag"
    );
    assert_eq!(
        entry(&|e| e[36] = 2),
        Err(DecodeError::BadField),
        "valid but absent"
    );
    assert_eq!(
        entry(&|e| e[39] = 1),
        Err(DecodeError::BadField),
        "reserved"
    );
    assert_eq!(
        entry(&|e| (e[36], e[0]) = (0, 1)),
        Err(DecodeError::BadField),
        "an absent entry with bytes"
    );
}

fn any_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (1u32..(1 << 20), 1u32..2048, any::<bool>(), any::<u64>()).prop_map(
            |(index, generation, shared, fence)| Event::Revoke {
                lock: crate::ids::LockId::new(index, generation),
                wanted: if shared {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                },
                fence,
            }
        ),
        Just(Event::Overflow),
    ]
}

#[test]
fn an_event_message_is_bounded_and_its_header_exact() {
    let header = EventHeader {
        version: PROTO_VERSION,
        client: 5,
    };
    let mut out = [0u8; DATA_MESSAGE_MAX];
    assert_eq!(
        encode_event_message(&header, &[], &mut out),
        Err(EncodeError::Invalid)
    );
    let full = [Event::Overflow; EVENTS_MAX];
    assert_eq!(
        encode_event_message(&header, &full, &mut out),
        Ok(DATA_MESSAGE_MAX)
    );
    let over = [Event::Overflow; EVENTS_MAX + 1];
    assert_eq!(
        encode_event_message(&header, &over, &mut out),
        Err(EncodeError::Invalid)
    );
    let n = encode_event_message(&header, &[Event::Overflow], &mut out).unwrap();
    let msg = decode_event_message(&out[..n]).unwrap();
    assert_eq!((msg.header(), msg.len()), (header, 1));
    let refused = |at: usize, v: u8| {
        let mut bad = out;
        bad[at] = v;
        decode_event_message(&bad[..n]).unwrap_err()
    };
    assert_eq!(
        refused(6, 1),
        DecodeError::BadField,
        "an event answers no message id"
    );
    assert_eq!(refused(12, 9), DecodeError::BadFlags, "only the event flag");
    assert_eq!(refused(5, 0), DecodeError::BadCount);
    assert_eq!(refused(5, 2), DecodeError::BadLength);
    assert_eq!(refused(0, 0), DecodeError::BadMagic);
    assert_eq!(refused(16 + 4, 3), DecodeError::BadKind);
    assert_eq!(
        refused(16, 1),
        DecodeError::BadField,
        "an overflow names no lock"
    );
}

#[test]
fn a_revoke_names_a_valid_lock_and_mode() {
    let revoke = Event::Revoke {
        lock: crate::ids::LockId::new(3, 1),
        wanted: Mode::Shared,
        fence: 77,
    };
    let e = encode_event(&revoke);
    assert_eq!(decode_event(&e), Ok(revoke));
    for (at, v) in [(5, 0), (5, 3), (6, 1), (7, 1), (0, 0)] {
        let mut bad = e;
        bad[at] = v;
        if at == 0 {
            bad[..4].fill(0);
        }
        assert_eq!(
            decode_event(&bad),
            Err(DecodeError::BadField),
            "byte {at} = {v}"
        );
    }
}

/// A page of `n` retained entries with names of `name_len` bytes.
fn page_bytes(n: usize, name_len: usize) -> Vec<u8> {
    let name = vec![b'r'; name_len];
    let entries: Vec<RetainedEntry<'_>> = (0..n)
        .map(|i| RetainedEntry {
            client: 40 + i as u32,
            lock: 0x0010_0000 + i as u32,
            kind: LockKind::Rw,
            mode: if i % 2 == 0 {
                Mode::Exclusive
            } else {
                Mode::Shared
            },
            name: &name,
        })
        .collect();
    let page = RetainedPage {
        next: n as u64,
        entries: Batch::from_slice(&entries),
    };
    let mut out = vec![0u8; CONTROL_FRAME_MAX - CONTROL_HEADER_LEN];
    let len = page.encode(&mut out).unwrap();
    let back = RetainedPage::decode(&out[..len]).unwrap();
    assert_eq!(back, page);
    out.truncate(len);
    out
}

#[test]
fn retained_pages_and_recovery_bodies_round_trip() {
    assert_eq!(page_bytes(0, 1).len(), 12, "an empty last page");
    page_bytes(1, 1);
    page_bytes(BATCH_MAX, crate::config::NAME_LEN_MAX);
    let mut b = [0u8; 16];
    let q = ListRetained {
        client: 3,
        cursor: u64::MAX,
    };
    assert_eq!(q.encode(&mut b), Ok(16));
    assert_eq!(ListRetained::decode(&b), Ok(q));
    b[5] = 1;
    assert_eq!(ListRetained::decode(&b), Err(DecodeError::BadField));
    assert_eq!(encode_recovery_done(77, &mut b), Ok(4));
    assert_eq!(decode_recovery_done(&b[..4]), Ok(77));
    assert_eq!(decode_recovery_done(&b[..5]), Err(DecodeError::BadLength));
    assert_eq!(decode_recovery_done(&b[..3]), Err(DecodeError::Truncated));
    assert_eq!(encode_recovery_done_reply(2, &mut b), Ok(4));
    assert_eq!(decode_recovery_done_reply(&b[..4]), Ok(2));
    // The message types carry the codes the bodies were laid out for.
    assert_eq!(MsgType::RecoveryDone.request_code(), RECOVERY_DONE_CODE);
    assert_eq!(MsgType::ListRetained.request_code(), LIST_RETAINED_CODE);
}

/// Every decoder of this file on `bytes`: refused, or re-encoded to exactly `bytes`.
fn assert_refused_or_reencoded(bytes: &[u8]) {
    if let Ok(msg) = decode_event_message(bytes) {
        let events: Vec<Event> = msg.events().collect();
        let mut out = vec![0u8; bytes.len()];
        assert_eq!(
            encode_event_message(&msg.header(), &events, &mut out),
            Ok(bytes.len())
        );
        assert_eq!(out, bytes);
    }
    if let Some(e) = bytes.first_chunk::<EVENT_LEN>()
        && let Ok(event) = decode_event(e)
    {
        assert_eq!(&encode_event(&event), e);
    }
    if let Ok(page) = RetainedPage::decode(bytes) {
        let mut out = vec![0u8; bytes.len()];
        assert_eq!(page.encode(&mut out), Ok(bytes.len()));
        assert_eq!(out, bytes);
    }
    if let Ok(q) = ListRetained::decode(bytes) {
        let mut out = [0u8; 16];
        q.encode(&mut out).unwrap();
        assert_eq!(out[..], *bytes);
    }
    if let Ok(t) = ValueReplies::decode(bytes, bytes.len() / VALUE_REPLY_LEN) {
        let n = t.len();
        let mut out = vec![0u8; DATA_HEADER_LEN + n * (COMMAND_LEN + VALUE_REPLY_LEN)];
        for i in 0..n {
            put_value_reply(&mut out, n, i, t.get(i).as_ref(), i == 0).unwrap();
        }
        assert_eq!(out[DATA_HEADER_LEN + n * COMMAND_LEN..], *bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn event_messages_round_trip(events in proptest::collection::vec(any_event(), 1..=EVENTS_MAX)) {
        let header = EventHeader { version: PROTO_VERSION, client: 11 };
        let mut out = [0u8; DATA_MESSAGE_MAX];
        let n = encode_event_message(&header, &events, &mut out).unwrap();
        prop_assert_eq!(n, event_message_len(events.len()));
        let msg = decode_event_message(&out[..n]).unwrap();
        prop_assert!(msg.events().eq(events.iter().copied()));
        assert_refused_or_reencoded(&out[..n]);
    }

    #[test]
    fn random_bytes_never_panic_and_what_decodes_re_encodes(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        assert_refused_or_reencoded(&bytes);
    }

    #[test]
    fn mutated_frames_are_refused_or_re_encode_exactly(
        events in proptest::collection::vec(any_event(), 1..8),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let header = EventHeader { version: PROTO_VERSION, client: 11 };
        let mut out = [0u8; DATA_MESSAGE_MAX];
        let n = encode_event_message(&header, &events, &mut out).unwrap();
        let mut frames = vec![out[..n].to_vec(), page_bytes(events.len(), 1 + events.len())];
        for f in &mut frames {
            let i = at.index(f.len());
            f[i] = byte;
            assert_refused_or_reencoded(f);
            f.truncate(cut.index(f.len()));
            assert_refused_or_reencoded(f);
        }
    }
}

#[test]
fn a_response_stream_frames_an_event_message_and_a_request_stream_refuses_one() {
    let header = EventHeader {
        version: PROTO_VERSION,
        client: 5,
    };
    let mut out = [0u8; DATA_MESSAGE_MAX];
    for count in [1, EVENTS_MAX] {
        let events = [Event::Overflow; EVENTS_MAX];
        let n = encode_event_message(&header, &events[..count], &mut out).unwrap();
        let (peeked, len) = peek_data_response_header(&out[..DATA_HEADER_LEN]).unwrap();
        assert_eq!((peeked.flags, peeked.client, len), (FLAG_EVENT, 5, n));
        // A client never sends one, and a response decoder is never handed one.
        assert!(peek_data_header(&out[..n]).is_err());
        assert!(decode_data_response(&out[..n]).is_err());
    }
    // An event count past what one message holds is refused, not framed.
    out[5] = EVENTS_MAX as u8 + 1;
    assert_eq!(
        peek_data_response_header(&out[..DATA_HEADER_LEN]),
        Err(DecodeError::BadCount)
    );
}
