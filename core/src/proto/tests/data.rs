use super::*;

/// Byte offset of command `i` in a data message.
const fn cmd(i: usize) -> usize {
    DATA_HEADER_LEN + i * COMMAND_LEN
}

#[test]
fn every_data_command_round_trips() {
    let commands = every_command();
    let bytes = encode_data(&data_header(FLAG_ALL_OR_NOTHING), &commands);
    assert_eq!(bytes.len(), cmd(commands.len()));
    let req = decode_data_request(&bytes).unwrap();
    assert_eq!(
        req.header(),
        DataHeader {
            count: commands.len() as u8,
            ..data_header(FLAG_ALL_OR_NOTHING)
        }
    );
    assert_eq!(req.len(), commands.len());
    assert_eq!(req.commands().collect::<Vec<_>>(), commands);
    for (i, c) in commands.iter().enumerate() {
        assert_eq!(req.command(i), *c);
    }
}

#[test]
fn a_data_response_echoes_the_request_and_round_trips() {
    let commands = every_command();
    let req_bytes = encode_data(&data_header(0), &commands);
    let resp_bytes = encode_data_reply(&req_bytes);
    assert_eq!(resp_bytes.len(), req_bytes.len());
    let req = decode_data_request(&req_bytes).unwrap();
    let resp = decode_data_response(&resp_bytes).unwrap();
    assert_eq!(resp.header(), req.header());
    assert_eq!(resp.len(), commands.len());
    for (i, (c, r)) in commands.iter().zip(resp.results()).enumerate() {
        assert_eq!((r.kind, r.op, r.id), (c.kind_code(), c.op_code(), c.id()));
        let expected = CommandResult {
            status: Status::ALL[i % Status::ALL.len()],
            word: u128::MAX - i as u128,
            aux: 0xA000 + i as u64,
            plain: false,
        };
        assert_eq!(r.result, expected);
        assert_eq!(resp.result(i), r);
    }
}

#[test]
fn a_response_needs_one_result_per_command() {
    let req_bytes = encode_data(&data_header(0), &every_command()[..2]);
    let req = decode_data_request(&req_bytes).unwrap();
    let result = CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
        plain: false,
    };
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    for n in [0, 1, 3] {
        assert_eq!(
            encode_data_response(&req, &vec![result; n], &mut buf),
            Err(EncodeError::Invalid)
        );
    }
}

#[test]
fn data_counts_must_be_1_to_31() {
    let commands = every_command();
    let full: Vec<Command> = commands.iter().cycle().take(BATCH_MAX).copied().collect();
    let bytes = encode_data(&data_header(0), &full);
    assert_eq!(bytes.len(), DATA_MESSAGE_MAX);
    assert_eq!(decode_data_request(&bytes).unwrap().len(), BATCH_MAX);

    let mut zero = bytes[..DATA_HEADER_LEN].to_vec();
    zero[5] = 0;
    assert_eq!(decode_data_request(&zero), Err(DecodeError::BadCount));
    assert_eq!(decode_data_response(&zero), Err(DecodeError::BadCount));
    let mut over = bytes.clone();
    over.extend_from_slice(&bytes[cmd(0)..cmd(1)]);
    over[5] = BATCH_MAX as u8 + 1;
    assert_eq!(decode_data_request(&over), Err(DecodeError::BadCount));

    let mut buf = [0u8; 2 * DATA_MESSAGE_MAX];
    let over: Vec<Command> = commands
        .iter()
        .cycle()
        .take(BATCH_MAX + 1)
        .copied()
        .collect();
    for cmds in [&[][..], &over[..]] {
        assert_eq!(
            encode_data_request(&data_header(0), cmds, &mut buf),
            Err(EncodeError::Invalid)
        );
    }
}

#[test]
fn data_length_must_match_the_count_exactly() {
    let bytes = encode_data(&data_header(0), &every_command()[..2]);
    let mut extra_byte = bytes.clone();
    extra_byte.push(0);
    let mut extra_cmd = bytes.clone();
    extra_cmd.extend_from_slice(&bytes[cmd(0)..cmd(1)]);
    for bad in [
        &bytes[..bytes.len() - 1],
        &bytes[..cmd(1)],
        &extra_byte,
        &extra_cmd,
    ] {
        assert_eq!(decode_data_request(bad), Err(DecodeError::BadLength));
        assert_eq!(decode_data_response(bad), Err(DecodeError::BadLength));
    }
    assert_eq!(
        decode_data_request(&bytes[..DATA_HEADER_LEN - 1]),
        Err(DecodeError::Truncated)
    );
}

#[test]
fn data_messages_need_the_data_magic() {
    let mut bytes = encode_data(&data_header(0), &every_command()[..1]);
    bytes[..4].copy_from_slice(&CONTROL_MAGIC.to_le_bytes());
    assert_eq!(decode_data_request(&bytes), Err(DecodeError::BadMagic));
    assert_eq!(decode_data_response(&bytes), Err(DecodeError::BadMagic));
}

#[test]
fn unknown_flag_bits_are_refused() {
    let bytes = encode_data(&data_header(FLAG_ALL_OR_NOTHING), &every_command()[..1]);
    for flags in [2u32, 1 << 31, u32::MAX] {
        let mut bad = bytes.clone();
        bad[12..16].copy_from_slice(&flags.to_le_bytes());
        assert_eq!(
            decode_data_request(&bad),
            Err(DecodeError::BadFlags),
            "{flags:#x}"
        );
        assert_eq!(
            encode_data_request(&data_header(flags), &every_command()[..1], &mut [0u8; 64]),
            Err(EncodeError::Invalid)
        );
    }
}

#[test]
fn unknown_command_kinds_and_ops_are_refused() {
    let commands = every_command();
    // Command 0 is an atomic lock op, the last one an object op.
    let object = commands.len() - 1;
    let req = encode_data(&data_header(0), &commands);
    let resp = encode_data_reply(&req);
    let cases = [
        (cmd(0), 5u8, DecodeError::BadKind),
        (cmd(0), 255, DecodeError::BadKind),
        (cmd(0) + 1, 9, DecodeError::BadOp),
        (cmd(object) + 1, 3, DecodeError::BadOp),
    ];
    type Decode = fn(&[u8]) -> Result<(), DecodeError>;
    let decoders: [(&Vec<u8>, Decode); 2] = [
        (&req, |b| decode_data_request(b).map(|_| ())),
        (&resp, |b| decode_data_response(b).map(|_| ())),
    ];
    for (at, value, error) in cases {
        for (bytes, decode) in decoders {
            let mut bad = bytes.clone();
            bad[at] = value;
            assert_eq!(decode(&bad), Err(error), "byte {at} = {value}");
        }
    }
}

#[test]
fn request_commands_carry_no_status_and_zero_reserved_bytes() {
    let commands = every_command();
    let object = commands.len() - 1;
    let bytes = encode_data(&data_header(0), &commands);
    // 20..24 of a lock command and 24..28 of an object command are the partition epoch.
    let lock_reserved = (24..32).map(|o| cmd(0) + o);
    let object_reserved = (28..32).map(|o| cmd(object) + o);
    let status = [cmd(0) + 2, cmd(0) + 3, cmd(object) + 2];
    let mut checked = 0;
    for at in lock_reserved.chain(object_reserved).chain(status) {
        let mut bad = bytes.clone();
        bad[at] = 0x40;
        assert_eq!(
            decode_data_request(&bad),
            Err(DecodeError::BadField),
            "byte {at}"
        );
        checked += 1;
    }
    assert_eq!(checked, 15);
}

#[test]
fn a_response_with_an_unknown_status_is_refused() {
    let req = encode_data(&data_header(0), &every_command()[..1]);
    let mut resp = encode_data_reply(&req);
    resp[cmd(0) + 2..cmd(0) + 4].copy_from_slice(&0x3008u16.to_le_bytes());
    assert_eq!(decode_data_response(&resp), Err(DecodeError::BadField));
}

#[test]
fn data_encoders_report_a_buffer_too_small() {
    let commands = every_command();
    let req = encode_data(&data_header(0), &commands);
    let n = req.len();
    let mut buf = vec![0u8; n - 1];
    assert_eq!(
        encode_data_request(&data_header(0), &commands, &mut buf),
        Err(EncodeError::BufferTooSmall)
    );
    let decoded = decode_data_request(&req).unwrap();
    let results = vec![
        CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0,
            plain: false,
        };
        commands.len()
    ];
    assert_eq!(
        encode_data_response(&decoded, &results, &mut buf),
        Err(EncodeError::BufferTooSmall)
    );
}

#[test]
fn lock_op_codes_0_to_3_are_exclusive_4_to_7_shared_and_8_a_downgrade_of_an_exclusive_grant() {
    for code in 0..8 {
        let op = LockOp::from_u8(code).unwrap();
        assert_eq!(op as u8, code);
        let expected = if code < 4 {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        assert_eq!(op.mode(), expected, "{op:?}");
    }
    let down = LockOp::from_u8(8).unwrap();
    assert_eq!((down, down.mode()), (LockOp::Downgrade, Mode::Exclusive));
    assert!(!down.acquires());
    assert_eq!(LockOp::from_u8(9), None);
    assert_eq!(ObjectOp::from_u8(3), None);
}

#[test]
fn a_join_carries_the_session_and_nothing_else() {
    let session = crate::ids::Session(core::array::from_fn(|i| i as u8 + 1));
    let join = Command::Join(JoinCommand { session });
    let bytes = encode_data(&data_header(0), &[join]);
    assert_eq!(bytes[cmd(0)], JOIN_KIND);
    assert_eq!(&bytes[cmd(0) + 8..cmd(0) + 24], &session.0);
    assert_eq!(decode_data_request(&bytes).unwrap().command(0), join);
    // Op, id and the reserved tail must be zero.
    for (at, error) in [
        (cmd(0) + 1, DecodeError::BadOp),
        (cmd(0) + 4, DecodeError::BadField),
        (cmd(0) + 31, DecodeError::BadField),
    ] {
        let mut bad = bytes.clone();
        bad[at] = 1;
        assert_eq!(
            decode_data_request(&bad).map(|_| ()),
            Err(error),
            "byte {at}"
        );
    }
}

/// A response's proof trailer: one MAC per command after the results, announced by
/// `FLAG_PROOFS`, so a stream frames the response from its header alone; zero where a command
/// has no proof. Requests may not carry it.
#[test]
fn a_proof_trailer_follows_the_results_and_only_in_responses() {
    let commands = &every_command()[..3];
    let req_bytes = encode_data(&data_header(FLAG_ALL_OR_NOTHING), commands);
    let req = decode_data_request(&req_bytes).unwrap();
    let mut out = [0xEEu8; DATA_RESPONSE_MAX];
    let len = begin_data_response(&req, &mut out).unwrap();
    let ok = CommandResult {
        status: Status::Success,
        word: 5,
        aux: 6,
        plain: false,
    };
    for i in 0..3 {
        put_data_result(&req, i, &ok, &mut out).unwrap();
    }
    let mac = *b"proof of grant 1";
    put_data_proof(&mut out, 3, 1, &mac, true).unwrap();
    let full = finish_data_proofs(&mut out, 3).unwrap();
    assert_eq!((len, full), (cmd(3), cmd(3) + 3 * PROOF_LEN));
    let (header, framed) = peek_data_response_header(&out[..DATA_HEADER_LEN]).unwrap();
    assert_eq!(framed, full, "the header announces the trailer");
    assert_eq!(header.flags, FLAG_ALL_OR_NOTHING | FLAG_PROOFS);
    let resp = decode_data_response(&out[..full]).unwrap();
    assert_eq!(
        [resp.proof_mac(0), resp.proof_mac(1), resp.proof_mac(2)],
        [[0; PROOF_LEN], mac, [0; PROOF_LEN]],
        "the first proof zeroed the rest of the trailer"
    );
    assert_eq!(resp.result(1).result, ok);
    // Cut or padded, the trailer is refused; a response without it has no proofs.
    assert_eq!(
        decode_data_response(&out[..full - 1]),
        Err(DecodeError::BadLength)
    );
    assert_eq!(
        decode_data_response(&[&out[..full], &[0][..]].concat()),
        Err(DecodeError::BadLength)
    );
    let plain = encode_data_reply(&req_bytes);
    assert_eq!(
        decode_data_response(&plain).unwrap().proof_mac(0),
        [0; PROOF_LEN]
    );
    // A request announcing a trailer is refused, whatever follows it.
    let mut forged = [&req_bytes[..], &[0u8; 3 * PROOF_LEN][..]].concat();
    forged[12..16].copy_from_slice(&(FLAG_PROOFS | FLAG_ALL_OR_NOTHING).to_le_bytes());
    assert_eq!(decode_data_request(&forged), Err(DecodeError::BadFlags));
    assert_eq!(
        decode_data_request_into(&forged, &mut [Command::NONE; BATCH_MAX]),
        Err(DecodeError::BadFlags)
    );
    // No room for the trailer: refused, not truncated.
    assert_eq!(
        put_data_proof(&mut out[..cmd(3) + 10], 3, 0, &mac, true),
        Err(EncodeError::BufferTooSmall)
    );
}

#[test]
fn a_plain_grant_rides_the_top_bit_of_a_lock_results_echoed_op() {
    let commands = every_command();
    let object = commands.len() - 1;
    let req_bytes = encode_data(&data_header(0), &commands);
    let req = decode_data_request(&req_bytes).unwrap();
    let plain = |i: usize| matches!(commands[i], Command::Lock(_));
    let results: Vec<_> = (0..commands.len())
        .map(|i| CommandResult {
            plain: plain(i),
            ..CommandResult::status(Status::Success)
        })
        .collect();
    let mut out = vec![0; req_bytes.len()];
    encode_data_response(&req, &results, &mut out).unwrap();
    // The streaming encoder writes the same bytes.
    let mut streamed = vec![0; req_bytes.len()];
    begin_data_response(&req, &mut streamed).unwrap();
    for (i, (c, r)) in commands.iter().zip(&results).enumerate() {
        put_command_result(&mut streamed, i, c, r).unwrap();
    }
    assert_eq!(streamed, out);
    let resp = decode_data_response(&out).unwrap();
    for (i, c) in commands.iter().enumerate() {
        let marked = out[cmd(i) + 1] & RESULT_PLAIN_GRANT != 0;
        assert_eq!(marked, plain(i), "command {i}");
        // The decoder masks it off the op and reports it beside the result.
        let r = resp.result(i);
        assert_eq!(
            (r.op, r.result.plain),
            (c.op_code(), plain(i)),
            "command {i}"
        );
    }
    // Only a lock's result may carry it; in a request it is an unknown op.
    let mut bad = out.clone();
    bad[cmd(object) + 1] |= RESULT_PLAIN_GRANT;
    assert_eq!(decode_data_response(&bad), Err(DecodeError::BadOp));
    let mut bad = req_bytes.clone();
    bad[cmd(0) + 1] |= RESULT_PLAIN_GRANT;
    assert_eq!(decode_data_request(&bad), Err(DecodeError::BadOp));
    // Masked, the op must still be a known one.
    let mut bad = out.clone();
    bad[cmd(0) + 1] = RESULT_PLAIN_GRANT | 9;
    assert_eq!(decode_data_response(&bad), Err(DecodeError::BadOp));
}
