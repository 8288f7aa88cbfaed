//! The server at the byte level: version negotiation through real frames, and hostile input —
//! garbage, truncated frames (a peer that vanished mid-message), oversized batches and names —
//! which gets an error status or no reply, never a panic, and never changes the tables.

use dlock_core::proto::{
    Batch, CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    DATA_MESSAGE_MAX, DataHeader, LockOp, decode_control_response, decode_data_response,
    encode_control_request, encode_data_request,
};
use dlock_core::server::{FrameError, Server};
use dlock_core::{Config, LockKind, Status};
use dlock_tests::{lock_cmd, region, server};
use proptest::prelude::*;

fn cfg() -> Config {
    Config {
        locks_max: 32,
        clients_max: 8,
        objects_max: 8,
        ..Config::default()
    }
}

/// The protocol version these frames speak.
const V: u8 = dlock_core::proto::PROTO_VERSION;

fn frame(version: u8, word: u32, body: ControlRequest<'_>) -> Vec<u8> {
    let header = ControlHeader {
        version,
        msg: body.msg_type(),
        message_id: 0x5150,
        word,
    };
    let mut out = vec![0; CONTROL_FRAME_MAX];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut out).unwrap();
    out.truncate(n);
    out
}

/// Sends a control frame; returns the reply's status and body bytes.
fn send(s: &mut Server<'_>, req: &[u8]) -> (Status, Vec<u8>) {
    let mut out = vec![0; CONTROL_FRAME_MAX];
    let n = s
        .handle_control(req, &mut out, 1)
        .expect("a readable header gets a reply");
    out.truncate(n);
    let reply = decode_control_response(&out).expect("replies are well-formed");
    assert_eq!(reply.header.message_id, 0x5150, "the message id is echoed");
    (reply.header.status().unwrap(), out)
}

fn init(s: &mut Server<'_>, max: u8, min: u8) -> Result<(u32, u8), Status> {
    let (status, bytes) = send(
        s,
        &frame(
            max,
            0,
            ControlRequest::ClientInit {
                min_version: min,
                lease_ms: 0,
            },
        ),
    );
    match decode_control_response(&bytes).unwrap().body {
        ControlResponse::Init(i) => Ok((i.client, i.version)),
        _ => Err(status),
    }
}

#[test]
fn version_negotiation_accepts_downgrades_and_rejects() {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    assert_eq!(init(&mut s, V, V).map(|(_, v)| v), Ok(V), "same version");
    assert_eq!(
        init(&mut s, 5, V).map(|(_, v)| v),
        Ok(V),
        "a newer client is answered at ours"
    );
    assert_eq!(
        init(&mut s, 5, V + 1),
        Err(Status::ProtoVersionNegotiationFail),
        "client.min > server.max"
    );
    assert_eq!(
        init(&mut s, V - 1, 1),
        Err(Status::ProtoVersionNegotiationFail),
        "client.max < server.min"
    );
    let (client, _) = init(&mut s, V, V).unwrap();
    let hb = frame(9, client, ControlRequest::Heartbeat);
    assert_eq!(send(&mut s, &hb).0, Status::ProtoVersionNegotiationFail);
    assert_eq!(
        send(&mut s, &frame(V, client, ControlRequest::Heartbeat)).0,
        Status::Success
    );
}

#[test]
fn a_control_batch_of_32_and_a_513_byte_name_get_einval_with_the_message_id() {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let (client, _) = init(&mut s, V, V).unwrap();
    let before = s.tables().digest();
    // Build a valid 31-entry batch, then claim 32 entries in its count byte.
    let ids = [7u32; 31];
    let mut batch = frame(
        2,
        client,
        ControlRequest::BatchReleaseLock(Batch::from_slice(&ids)),
    );
    batch[16] = 32;
    assert_eq!(send(&mut s, &batch).0, Status::Einval);
    // A 512-byte name is valid; make the length field say 513 and add the byte.
    let name = [b'n'; 512];
    let mut long = frame(
        2,
        client,
        ControlRequest::GetLock {
            kind: LockKind::Rw,
            name: &name,
        },
    );
    long.push(b'n');
    let total = long.len() as u16;
    long[8..10].copy_from_slice(&total.to_le_bytes());
    let name_len_at = 16 + 2;
    long[name_len_at..name_len_at + 2].copy_from_slice(&513u16.to_le_bytes());
    assert_eq!(send(&mut s, &long).0, Status::Einval);
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn a_data_message_for_an_unknown_client_is_answered_client_not_init() {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let lock = dlock_core::LockId::new(0, 1);
    let header = DataHeader {
        version: dlock_core::proto::PROTO_VERSION,
        count: 0,
        message_id: 9,
        client: 4242,
        flags: 0,
    };
    let mut req = [0; DATA_MESSAGE_MAX];
    let n = encode_data_request(
        &header,
        &[lock_cmd(LockKind::Rw, LockOp::TryShared, lock, 0)],
        &mut req,
    )
    .unwrap();
    let mut out = [0; DATA_MESSAGE_MAX];
    let m = s.handle_data(&req[..n], &mut out, 1).unwrap();
    let reply = decode_data_response(&out[..m]).unwrap();
    assert_eq!(reply.header().message_id, 9);
    assert_eq!(reply.result(0).result.status, Status::ClientNotInit);
}

#[test]
fn a_peer_that_vanishes_mid_frame_changes_nothing() {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let (client, _) = init(&mut s, V, V).unwrap();
    let full = frame(
        V,
        client,
        ControlRequest::GetLock {
            kind: LockKind::Fair,
            name: b"half-sent",
        },
    );
    let before = s.tables().digest();
    let mut out = vec![0; CONTROL_FRAME_MAX];
    for cut in 0..full.len() {
        // Below 16 bytes there is no header to answer; above, the length field disagrees.
        let r = s.handle_control(&full[..cut], &mut out, 1);
        assert!(
            matches!(r, Err(FrameError::Malformed(_))),
            "cut at {cut}: {r:?}"
        );
    }
    assert_eq!(s.tables().digest(), before);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Garbage into both entry points: no panic, and garbage never changes a table.
    #[test]
    fn garbage_never_panics_or_changes_tables(bytes in proptest::collection::vec(any::<u8>(), 0..1_200)) {
        let cfg = cfg();
        let mut region = region(&cfg);
        let mut s = server(&mut region);
        let before = s.tables().digest();
        let mut out = vec![0; CONTROL_FRAME_MAX];
        let _ = s.handle_control(&bytes, &mut out, 1);
        let _ = s.handle_data(&bytes, &mut out, 1);
        prop_assert_eq!(s.tables().digest(), before);
    }

    /// Valid frames with random bytes flipped, cut or appended: no panic; a reply, when there
    /// is one, is well-formed and echoes the message id.
    #[test]
    fn mutated_frames_get_a_well_formed_reply_or_none(
        which in 0usize..4,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        tail in proptest::collection::vec(any::<u8>(), 0..3),
    ) {
        let cfg = cfg();
        let mut region = region(&cfg);
        let mut s = server(&mut region);
        let (client, _) = init(&mut s, V, V).unwrap();
        let ids = [1u32, 2, 3];
        let mut bytes = match which {
            0 => frame(V, client, ControlRequest::GetLock { kind: LockKind::Atomic, name: b"row-group-1" }),
            1 => frame(V, client, ControlRequest::BatchReleaseLock(Batch::from_slice(&ids))),
            2 => frame(V, client, ControlRequest::ObjectCreate { name: b"csn", init: 5, lease_s: 3 }),
            _ => {
                let header = DataHeader { version: dlock_core::proto::PROTO_VERSION, count: 0, message_id: 0x5150, client, flags: 0 };
                let mut req = vec![0; DATA_MESSAGE_MAX];
                let lock = dlock_core::LockId::new(3, 1);
                let n = encode_data_request(&header, &[lock_cmd(LockKind::Rw, LockOp::TryShared, lock, 0)], &mut req).unwrap();
                req.truncate(n);
                req
            }
        };
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= v;
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep.max(bytes.len().saturating_sub(2)));
        bytes.extend(tail);
        let mut out = vec![0; CONTROL_FRAME_MAX];
        if which < 3 {
            if let Ok(n) = s.handle_control(&bytes, &mut out, 1) {
                let reply = decode_control_response(&out[..n]);
                prop_assert!(reply.is_ok(), "{:?}", reply);
                prop_assert_eq!(reply.unwrap().header.message_id, u16::from_le_bytes([bytes[10], bytes[11]]));
            }
        } else if let Ok(n) = s.handle_data(&bytes, &mut out, 1) {
            prop_assert!(decode_data_response(&out[..n]).is_ok());
        }
    }
}
