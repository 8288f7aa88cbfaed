use super::*;

const BAD_NAMES: [usize; 2] = [0, NAME_LEN_MAX + 1];

#[test]
fn every_control_request_round_trips() {
    let mut seen = Vec::new();
    for_each_request(|frame| {
        let bytes = encode_request(frame);
        assert_eq!(decode_control_request(&bytes), Ok(*frame));
        assert_eq!(peek_control_header(&bytes), Ok((frame.header, false)));
        assert_eq!(
            control_frame_len(&bytes[..CONTROL_HEADER_LEN]),
            Ok(bytes.len())
        );
        seen.push(frame.header.msg);
    });
    assert_eq!(seen, MsgType::ALL, "one request of every type");
}

#[test]
fn every_control_response_round_trips() {
    let mut seen = Vec::new();
    for_each_response(|header, body| {
        let bytes = encode_response(header, body);
        let decoded = decode_control_response(&bytes).unwrap();
        assert_eq!((decoded.header, decoded.body), (*header, *body));
        assert_eq!(peek_control_header(&bytes), Ok((*header, true)));
        seen.push(header.msg);
    });
    assert_eq!(
        seen.len(),
        3 * MsgType::ALL.len(),
        "success, failure and partition moved of every type"
    );
}

#[test]
fn renumbering_a_frame_changes_its_message_id_and_nothing_else() {
    for_each_request(|frame| {
        let mut bytes = encode_request(frame);
        assert_eq!(set_control_message_id(&mut bytes, 0xBEEF), Ok(()));
        let header = ControlHeader {
            message_id: 0xBEEF,
            ..frame.header
        };
        assert_eq!(peek_control_header(&bytes), Ok((header, false)));
        assert_eq!(
            decode_control_request(&bytes).map(|f| f.body),
            Ok(frame.body)
        );
    });
    for_each_response(|header, body| {
        let mut bytes = encode_response(header, body);
        assert_eq!(set_control_message_id(&mut bytes, 3), Ok(()));
        let decoded = decode_control_response(&bytes).unwrap();
        assert_eq!(decoded.header.message_id, 3);
        assert_eq!(decoded.body, *body);
    });
    let mut short = [0u8; CONTROL_HEADER_LEN - 1];
    assert_eq!(
        set_control_message_id(&mut short, 1),
        Err(DecodeError::Truncated)
    );
    let mut data = [0u8; CONTROL_HEADER_LEN];
    assert_eq!(
        set_control_message_id(&mut data, 1),
        Err(DecodeError::BadMagic),
        "no control frame: left alone"
    );
    assert_eq!(data, [0u8; CONTROL_HEADER_LEN]);
}

#[test]
fn decoded_batches_give_back_their_entries_by_index_and_in_order() {
    let ids = [5u32, 6, 7];
    let bytes = encode_request(&frame(ControlRequest::BatchReleaseLock(Batch::from_slice(
        &ids,
    ))));
    let ControlRequest::BatchReleaseLock(view) = decode_control_request(&bytes).unwrap().body
    else {
        panic!("wrong variant");
    };
    assert_eq!(view.len(), 3);
    assert_eq!(
        (view.get(0), view.get(2), view.get(3)),
        (Some(5), Some(7), None)
    );
    assert_eq!(view.iter().collect::<Vec<_>>(), ids);

    let names = [(LockKind::Rw, &b"one"[..]), (LockKind::Fair, &b"two"[..])];
    let bytes = encode_request(&frame(ControlRequest::BatchGetLock(Batch::from_slice(
        &names,
    ))));
    let ControlRequest::BatchGetLock(view) = decode_control_request(&bytes).unwrap().body else {
        panic!("wrong variant");
    };
    assert_eq!((view.get(1), view.get(2)), (Some(names[1]), None));
    assert_eq!(view.iter().len(), 2);
    assert_ne!(
        view,
        Batch::from_slice(&names[..1]),
        "batches compare by content"
    );
}

#[test]
fn a_request_body_must_match_the_header_type_to_encode() {
    let frame = ControlRequestFrame {
        header: req_header(MsgType::GetLock),
        body: ControlRequest::Heartbeat,
    };
    assert_eq!(
        encode_control_request(&frame, &mut [0u8; 64]),
        Err(EncodeError::Invalid)
    );
}

#[test]
fn control_encoders_report_a_buffer_too_small() {
    for_each_request(|frame| {
        let n = encode_request(frame).len();
        let mut buf = vec![0u8; n];
        assert_eq!(encode_control_request(frame, &mut buf), Ok(n));
        assert_eq!(
            encode_control_request(frame, &mut buf[..n - 1]),
            Err(EncodeError::BufferTooSmall)
        );
    });
    for_each_response(|header, body| {
        let n = encode_response(header, body).len();
        let mut buf = vec![0u8; n];
        assert_eq!(
            encode_control_response(header, body, &mut buf[..n - 1]),
            Err(EncodeError::BufferTooSmall)
        );
    });
}

#[test]
fn the_largest_frame_is_control_frame_max() {
    let long = [b'z'; NAME_LEN_MAX];
    let claims = [claim(&long, Held::Exclusive); BATCH_MAX];
    let frame = frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)));
    let bytes = encode_request(&frame);
    assert_eq!(bytes.len(), CONTROL_FRAME_MAX);
    assert_eq!(decode_control_request(&bytes), Ok(frame));
}

#[test]
fn batch_counts_of_zero_and_over_max_are_refused() {
    for msg in [
        MsgType::BatchGetLock,
        MsgType::BatchReleaseLock,
        MsgType::BatchUpdateLocks,
    ] {
        for count in [0u8, BATCH_MAX as u8 + 1] {
            let req = raw_control(msg.request_code(), 1, &[count, 0, 0, 0]);
            assert_eq!(decode_control_request(&req), Err(DecodeError::BadCount));
            let resp = raw_control(msg.response_code(), 0, &[count, 0, 0, 0]);
            assert_eq!(decode_control_response(&resp), Err(DecodeError::BadCount));
        }
    }
    let over = COUNTERS_MAX as u8 + 1;
    let stats = raw_control(MsgType::Stats.response_code(), 0, &[over, 0, 0, 0]);
    assert_eq!(decode_control_response(&stats), Err(DecodeError::BadCount));

    let ids = [1u32; BATCH_MAX + 1];
    let names = [(LockKind::Atomic, &b"n"[..]); BATCH_MAX + 1];
    let claims = [claim(b"n", Held::Shared); BATCH_MAX + 1];
    for n in [0, BATCH_MAX + 1] {
        for body in [
            ControlRequest::BatchReleaseLock(Batch::from_slice(&ids[..n])),
            ControlRequest::BatchGetLock(Batch::from_slice(&names[..n])),
            ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims[..n])),
        ] {
            let result = encode_control_request(&frame(body), &mut [0u8; CONTROL_FRAME_MAX]);
            assert_eq!(result, Err(EncodeError::Invalid), "{n} entries");
        }
    }
    let counters = [0u64; COUNTERS_MAX + 1];
    let body = ControlResponse::Counters(Batch::from_slice(&counters));
    let header = resp_header(MsgType::Stats, Status::Success);
    assert_eq!(
        encode_control_response(&header, &body, &mut [0u8; CONTROL_FRAME_MAX]),
        Err(EncodeError::Invalid)
    );
}

#[test]
fn batches_of_exactly_max_entries_are_accepted() {
    let ids = [3u32; BATCH_MAX];
    let frame = frame(ControlRequest::BatchReleaseLock(Batch::from_slice(&ids)));
    assert_eq!(decode_control_request(&encode_request(&frame)), Ok(frame));
}

/// Every request body that carries a name, built around `name`.
fn named_bodies(name: &[u8]) -> [ControlRequest<'_>; 3] {
    [
        ControlRequest::GetLock {
            kind: LockKind::Rw,
            name,
        },
        ControlRequest::ObjectCreate {
            name,
            init: 1,
            lease_s: 2,
        },
        ControlRequest::ObjectGet { name, lease_s: 3 },
    ]
}

#[test]
fn names_of_0_or_513_bytes_are_refused_by_the_encoder() {
    for len in BAD_NAMES {
        let name = vec![b'q'; len];
        let gets = [(LockKind::Atomic, &name[..])];
        let claims = [claim(&name, Held::Reference)];
        let mut bodies = named_bodies(&name).to_vec();
        bodies.push(ControlRequest::BatchGetLock(Batch::from_slice(&gets)));
        bodies.push(ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)));
        for body in bodies {
            let result = encode_control_request(&frame(body), &mut [0u8; CONTROL_FRAME_MAX]);
            assert_eq!(result, Err(EncodeError::Invalid), "{len}-byte name");
        }
    }
}

#[test]
fn names_of_0_or_513_bytes_are_refused_by_the_decoder() {
    for len in BAD_NAMES {
        let name = vec![b'q'; len];
        let len16 = (len as u16).to_le_bytes();
        let get_lock = [&[0, 0][..], &len16, &name].concat();
        let create = [&[0u8; 12][..], &len16, &[0, 0], &name].concat();
        let get = [&[0u8; 4][..], &len16, &[0, 0], &name].concat();
        let batch_get = [&[1, 0, 0, 0][..], &get_lock].concat();
        let claim = [&[1, 0, 0, 0, 0, 0][..], &len16, &[0u8; 60], &name].concat();
        for (msg, body) in [
            (MsgType::GetLock, get_lock),
            (MsgType::ObjectCreate, create),
            (MsgType::ObjectGet, get),
            (MsgType::BatchGetLock, batch_get),
            (MsgType::BatchUpdateLocks, claim),
        ] {
            let bytes = raw_control(msg.request_code(), 1, &body);
            assert_eq!(
                decode_control_request(&bytes),
                Err(DecodeError::BadName),
                "{msg:?} with a {len}-byte name"
            );
        }
    }
}

#[test]
fn names_of_512_bytes_are_accepted() {
    let name = [b'm'; NAME_LEN_MAX];
    for body in named_bodies(&name) {
        let frame = frame(body);
        assert_eq!(decode_control_request(&encode_request(&frame)), Ok(frame));
    }
}

#[test]
fn a_name_length_must_match_the_bytes_that_follow() {
    let bytes = encode_request(&frame(named_bodies(b"abcd")[0]));
    let mut long = bytes.clone();
    long.push(b'e');
    fix_total_len(&mut long);
    assert_eq!(decode_control_request(&long), Err(DecodeError::BadLength));
    let mut short = bytes;
    short.pop();
    fix_total_len(&mut short);
    assert_eq!(decode_control_request(&short), Err(DecodeError::BadLength));
}

fn valid_get_lock() -> Vec<u8> {
    encode_request(&frame(named_bodies(b"lock")[0]))
}

#[test]
fn a_wrong_magic_is_refused() {
    let mut bytes = valid_get_lock();
    bytes[0] ^= 1;
    assert_eq!(decode_control_request(&bytes), Err(DecodeError::BadMagic));
    assert_eq!(peek_control_header(&bytes), Err(DecodeError::BadMagic));
    assert_eq!(control_frame_len(&bytes), Err(DecodeError::BadMagic));
    let data = encode_data(&data_header(0), &every_command()[..1]);
    assert_eq!(decode_control_request(&data), Err(DecodeError::BadMagic));
}

#[test]
fn a_header_length_other_than_16_is_refused() {
    for hdr_len in [0u8, 15, 17, 255] {
        let mut bytes = valid_get_lock();
        bytes[5] = hdr_len;
        assert_eq!(
            decode_control_request(&bytes),
            Err(DecodeError::BadHeaderLen)
        );
    }
}

#[test]
fn the_reserved_header_byte_must_be_zero() {
    let mut bytes = valid_get_lock();
    bytes[7] = 0x80;
    assert_eq!(decode_control_request(&bytes), Err(DecodeError::BadField));
}

#[test]
fn total_len_must_equal_the_buffer_length() {
    let bytes = valid_get_lock();
    let n = bytes.len() as u16;

    let mut longer = bytes.clone();
    longer[8..10].copy_from_slice(&(n + 1).to_le_bytes());
    assert_eq!(decode_control_request(&longer), Err(DecodeError::Truncated));
    assert_eq!(peek_control_header(&longer), Err(DecodeError::Truncated));

    let mut shorter = bytes.clone();
    shorter[8..10].copy_from_slice(&(n - 1).to_le_bytes());
    assert_eq!(
        decode_control_request(&shorter),
        Err(DecodeError::BadLength)
    );
    assert!(
        peek_control_header(&shorter).is_ok(),
        "peek allows more bytes"
    );

    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(
        decode_control_request(&trailing),
        Err(DecodeError::BadLength)
    );

    for total in [0u16, 15, CONTROL_FRAME_MAX as u16 + 1] {
        let mut bad = bytes.clone();
        bad[8..10].copy_from_slice(&total.to_le_bytes());
        assert_eq!(
            control_frame_len(&bad),
            Err(DecodeError::BadLength),
            "{total}"
        );
    }
    assert_eq!(
        control_frame_len(&bytes[..CONTROL_HEADER_LEN - 1]),
        Err(DecodeError::Truncated)
    );
    assert_eq!(
        decode_control_request(&bytes[..10]),
        Err(DecodeError::Truncated)
    );
}

#[test]
fn undefined_and_misdirected_types_are_refused() {
    // 56 is the next free code.
    for code in [0u8, 11, 56, 57, 255] {
        let bytes = raw_control(code, 1, &[]);
        assert_eq!(
            decode_control_request(&bytes),
            Err(DecodeError::UnknownType(code))
        );
        assert_eq!(
            decode_control_response(&bytes),
            Err(DecodeError::UnknownType(code))
        );
    }
    let response = raw_control(MsgType::Heartbeat.response_code(), 0, &[]);
    assert_eq!(
        decode_control_request(&response),
        Err(DecodeError::UnknownType(17))
    );
    let request = raw_control(MsgType::Heartbeat.request_code(), 0, &[]);
    assert_eq!(
        decode_control_response(&request),
        Err(DecodeError::UnknownType(16))
    );
}

#[test]
fn fixed_size_bodies_must_have_their_exact_length() {
    let cases: [(MsgType, usize); 10] = [
        (MsgType::ClientDeinit, 0),
        (MsgType::Drain, 0),
        (MsgType::Heartbeat, 0),
        (MsgType::ReinitDone, 0),
        (MsgType::Stats, 0),
        (MsgType::ClientInit, 8),
        (MsgType::ClientReinit, 24),
        (MsgType::ReleaseLock, 4),
        (MsgType::ObjectRelease, 4),
        (MsgType::ObjectDestroy, 4),
    ];
    for (msg, len) in cases {
        let right = raw_control(msg.request_code(), 1, &vec![0; len]);
        assert!(decode_control_request(&right).is_ok(), "{msg:?}");
        for wrong in [len + 1, len.wrapping_sub(1)] {
            if wrong > 64 {
                continue;
            }
            let bytes = raw_control(msg.request_code(), 1, &vec![0; wrong]);
            assert_eq!(
                decode_control_request(&bytes),
                Err(DecodeError::BadLength),
                "{msg:?} with {wrong} bytes"
            );
        }
    }
}

/// Offsets (into the body) of reserved bytes in the requests [`for_each_request`] builds.
fn reserved_request_offsets(msg: MsgType) -> &'static [usize] {
    match msg {
        MsgType::ClientInit | MsgType::ClientReinit => &[1, 2, 3],
        MsgType::GetLock => &[1],
        MsgType::BatchGetLock => &[1, 2, 3, 5],
        MsgType::BatchReleaseLock | MsgType::BatchUpdateLocks => &[1, 2, 3],
        MsgType::ObjectCreate => &[14, 15],
        MsgType::ObjectGet => &[6, 7],
        _ => &[],
    }
}

#[test]
fn reserved_body_bytes_must_be_zero() {
    let mut checked = 0;
    for_each_request(|frame| {
        for &off in reserved_request_offsets(frame.header.msg) {
            let mut bytes = encode_request(frame);
            bytes[CONTROL_HEADER_LEN + off] = 1;
            assert_eq!(
                decode_control_request(&bytes),
                Err(DecodeError::BadField),
                "{:?} byte {off}",
                frame.header.msg
            );
            checked += 1;
        }
    });
    assert_eq!(checked, 21);

    let entries = [BatchEntry {
        id: 1,
        status: Status::Success,
    }];
    let header = resp_header(MsgType::BatchGetLock, Status::Success);
    for off in [1, 2, 3, 10, 11] {
        let mut bytes = encode_response(
            &header,
            &ControlResponse::Entries(Batch::from_slice(&entries)),
        );
        bytes[CONTROL_HEADER_LEN + off] = 1;
        assert_eq!(
            decode_control_response(&bytes),
            Err(DecodeError::BadField),
            "byte {off}"
        );
    }
}

#[test]
fn unknown_lock_kinds_and_held_values_are_refused() {
    let mut get = valid_get_lock();
    get[CONTROL_HEADER_LEN] = 3;
    assert_eq!(decode_control_request(&get), Err(DecodeError::BadKind));

    let claims = [claim(b"c", Held::Reference)];
    let update = encode_request(&frame(ControlRequest::BatchUpdateLocks(Batch::from_slice(
        &claims,
    ))));
    let entry = CONTROL_HEADER_LEN + BATCH_HEADER_LEN;
    let mut bad_kind = update.clone();
    bad_kind[entry] = 3;
    assert_eq!(decode_control_request(&bad_kind), Err(DecodeError::BadKind));
    let mut bad_held = update;
    bad_held[entry + 1] = 5;
    assert_eq!(
        decode_control_request(&bad_held),
        Err(DecodeError::BadField)
    );
}

#[test]
fn peek_reads_the_header_even_when_the_body_is_malformed() {
    let mut bytes = valid_get_lock();
    bytes[CONTROL_HEADER_LEN] = 9;
    assert_eq!(decode_control_request(&bytes), Err(DecodeError::BadKind));
    let (header, is_response) = peek_control_header(&bytes).unwrap();
    assert_eq!((header, is_response), (req_header(MsgType::GetLock), false));
}

#[test]
fn failed_responses_carry_no_body() {
    let bytes = raw_control(
        MsgType::GetLock.response_code(),
        Status::Fail as u32,
        &[1, 0, 0, 0],
    );
    assert_eq!(decode_control_response(&bytes), Err(DecodeError::BadLength));
    let header = resp_header(MsgType::GetLock, Status::Fail);
    let body = ControlResponse::Lock { lock: 1 };
    assert_eq!(
        encode_control_response(&header, &body, &mut [0u8; 64]),
        Err(EncodeError::Invalid)
    );
}

#[test]
fn response_status_must_be_a_known_code() {
    for word in [2u32, 0x1006, 0x1_0000, u32::MAX] {
        let bytes = raw_control(MsgType::Heartbeat.response_code(), word, &[]);
        assert_eq!(
            decode_control_response(&bytes),
            Err(DecodeError::BadField),
            "{word:#x}"
        );
        let header = ControlHeader {
            word,
            ..resp_header(MsgType::Heartbeat, Status::Success)
        };
        assert_eq!(
            encode_control_response(&header, &ControlResponse::Empty, &mut [0u8; 64]),
            Err(EncodeError::Invalid)
        );
    }
}

#[test]
fn a_success_body_must_match_its_type() {
    let header = resp_header(MsgType::GetLock, Status::Success);
    for body in [
        ControlResponse::Empty,
        ControlResponse::Object { object: 1 },
    ] {
        assert_eq!(
            encode_control_response(&header, &body, &mut [0u8; 64]),
            Err(EncodeError::Invalid)
        );
    }
    let empty = raw_control(MsgType::GetLock.response_code(), 0, &[]);
    assert_eq!(decode_control_response(&empty), Err(DecodeError::BadLength));
}

#[test]
fn init_reply_recovering_must_be_0_or_1_and_entry_status_known() {
    let mut body = [0u8; 40];
    body[5] = 2;
    let bytes = raw_control(MsgType::ClientInit.response_code(), 0, &body);
    assert_eq!(decode_control_response(&bytes), Err(DecodeError::BadField));
    // The word at 20 was reserved until version 7 made it the revoke timeout.
    let mut body = [0u8; 40];
    body[20] = 1;
    let bytes = raw_control(MsgType::ClientInit.response_code(), 0, &body);
    assert!(matches!(
        decode_control_response(&bytes).map(|r| r.body),
        Ok(ControlResponse::Init(InitReply {
            revoke_timeout_ms: 1,
            ..
        }))
    ));

    let entry = [1, 0, 0, 0, 9, 0, 0, 0, 0x06, 0x10, 0, 0];
    let bytes = raw_control(MsgType::BatchGetLock.response_code(), 0, &entry);
    assert_eq!(decode_control_response(&bytes), Err(DecodeError::BadField));
}

#[test]
fn every_decode_error_maps_to_einval_and_displays() {
    let all = [
        DecodeError::Truncated,
        DecodeError::BadMagic,
        DecodeError::BadHeaderLen,
        DecodeError::BadLength,
        DecodeError::UnknownType(7),
        DecodeError::BadCount,
        DecodeError::BadName,
        DecodeError::BadKind,
        DecodeError::BadOp,
        DecodeError::BadFlags,
        DecodeError::BadField,
    ];
    let mut texts: Vec<String> = all.iter().map(|e| e.to_string()).collect();
    assert!(all.iter().all(|e| e.status() == Status::Einval));
    texts.sort();
    texts.dedup();
    assert_eq!(texts.len(), all.len(), "every error has its own message");
    assert_ne!(
        EncodeError::Invalid.to_string(),
        EncodeError::BufferTooSmall.to_string()
    );
}
