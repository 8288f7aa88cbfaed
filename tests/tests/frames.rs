//! The server at the byte level: version negotiation through real frames, and hostile input —
//! garbage, truncated frames (a peer that vanished mid-message), oversized batches and names,
//! valid frames of every type with bytes flipped, cut, appended and length or count fields
//! that lie — which gets an error status or no reply, never a panic, and never changes the
//! tables.
//!
//! # Long campaign
//!
//! The property tests run a few thousand cases so the normal suite stays fast. Set
//! `DLOCK_FUZZ_CASES` to run each with that many cases instead (see
//! [`dlock_tests::fuzz_cases`]), for example:
//!
//! ```text
//! DLOCK_FUZZ_CASES=1000000 cargo test -p dlock-tests --release --test frames
//! ```
//!
//! The codec's own properties (every decoder, without a server) are in `dlock-core`'s
//! `proto/tests/fuzz.rs` and read the same variable.

use dlock_core::proto::{
    Batch, CONTROL_FRAME_MAX, Command, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, DATA_MESSAGE_MAX, DataHeader, FLAG_ALL_OR_NOTHING, Held, LockClaim, LockOp,
    ObjectOp, decode_control_response, decode_data_request, decode_data_response,
    encode_control_request, encode_data_request,
};
use dlock_core::server::{FrameError, Server};
use dlock_core::{ClientId, Config, LockId, LockKind, ObjectId, Status, Ticket};
use dlock_tests::{fuzz_cases, lock_cmd, object_cmd, region, run, server, ticket_cmd};
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

/// A `ClientInit` frame from a client that speaks versions `min..=max`.
fn init_frame(max: u8, min: u8) -> Vec<u8> {
    frame(
        max,
        0,
        ControlRequest::ClientInit {
            min_version: min,
            lease_ms: 0,
        },
    )
}

fn init(s: &mut Server<'_>, max: u8, min: u8) -> Result<(u32, u8), Status> {
    let (status, bytes) = send(s, &init_frame(max, min));
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
        init(&mut s, V + 1, V).map(|(_, v)| v),
        Ok(V),
        "a newer client is answered at ours"
    );
    let oldest = dlock_core::proto::PROTO_VERSION_MIN;
    assert_eq!(
        init(&mut s, oldest, 1).map(|(_, v)| v),
        Ok(oldest),
        "an older client is answered at its own"
    );
    assert_eq!(
        init(&mut s, V + 2, V + 1),
        Err(Status::ProtoVersionNegotiationFail),
        "client.min > server.max"
    );
    assert_eq!(
        init(&mut s, oldest - 1, 1),
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
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(2_000)))]

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
}

/// A server with something in every table for hostile frames to try to change: clients `a`
/// and `b`, a lock of each kind (`a` holds the atomic and fair locks exclusively and reads the
/// RW lock with `b`; `b` queues on the fair lock) and an object of `a`'s.
struct Scene {
    a: u32,
    locks: [(LockKind, LockId); 3],
    object: ObjectId,
}

fn scene(s: &mut Server<'_>) -> Scene {
    use LockOp::{TryExclusive, TryShared};
    let (a, _) = init(s, V, V).unwrap();
    let (b, _) = init(s, V, V).unwrap();
    let (ca, cb) = (ClientId::new(a).unwrap(), ClientId::new(b).unwrap());
    let plan: [(LockKind, &[u8], LockOp, Status); 3] = [
        (LockKind::Atomic, b"atomic", TryExclusive, Status::Fail),
        (LockKind::Rw, b"rw", TryShared, Status::Success),
        (LockKind::Fair, b"fair", TryExclusive, Status::Eagain),
    ];
    let locks = plan.map(|(kind, name, op, b_gets)| {
        let id = s.get_lock(a, kind, name, 1).unwrap();
        s.get_lock(b, kind, name, 1).unwrap();
        assert_eq!(
            run(s, ca, lock_cmd(kind, op, id, 60_000), 1).status,
            Status::Success
        );
        let b_op = if kind == LockKind::Rw { TryShared } else { op };
        assert_eq!(
            run(s, cb, lock_cmd(kind, b_op, id, 60_000), 1).status,
            b_gets
        );
        (kind, id)
    });
    let object = s.object_create(a, b"csn", 5, 3, 1).unwrap();
    Scene { a, locks, object }
}

/// Which entry point a frame is meant for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Channel {
    Control,
    Data,
}

/// One valid frame from client `a` of every control request type (but `ClientReinit`, which a
/// flipped type byte reaches) and of every lock and object command, alone, in a full message,
/// and all-or-nothing — aimed at the scene's real ids, so mutations start from frames that
/// reach the tables.
fn corpus(sc: &Scene) -> Vec<(Channel, Vec<u8>)> {
    let a = sc.a;
    let [(_, atomic), (_, rw), (_, fair)] = sc.locks;
    let ids = [atomic.raw(), rw.raw(), fair.raw(), 0xDEAD];
    let gets: [(LockKind, &[u8]); 2] = [(LockKind::Rw, b"rw"), (LockKind::Fair, b"fresh")];
    let claims = [LockClaim {
        value: None,
        kind: LockKind::Fair,
        held: Held::Exclusive,
        name: b"fair",
        old_lock: fair.raw(),
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 1_000,
        age_ms: 0,
        token: 1,
        proof: dlock_core::GrantProof {
            epoch: 1,
            mac: [9; 16],
        },
    }];
    let control = [
        ControlRequest::ClientDeinit,
        ControlRequest::Heartbeat,
        ControlRequest::ReinitDone,
        ControlRequest::Stats,
        ControlRequest::GetLock {
            kind: LockKind::Atomic,
            name: b"atomic",
        },
        ControlRequest::GetLock {
            kind: LockKind::Rw,
            name: b"new",
        },
        ControlRequest::ReleaseLock { lock: rw.raw() },
        ControlRequest::ReleaseLock { lock: 0xDEAD },
        ControlRequest::BatchGetLock(Batch::from_slice(&gets)),
        ControlRequest::BatchReleaseLock(Batch::from_slice(&ids)),
        ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)),
        ControlRequest::ObjectCreate {
            name: b"xid",
            init: 9,
            lease_s: 3,
        },
        ControlRequest::ObjectGet {
            name: b"csn",
            lease_s: 3,
        },
        ControlRequest::ObjectRelease {
            object: sc.object.raw(),
        },
        ControlRequest::ObjectDestroy {
            object: sc.object.raw(),
        },
    ];
    let mut frames = vec![(Channel::Control, init_frame(V, V))];
    frames.extend(control.map(|body| (Channel::Control, frame(V, a, body))));
    let mut locks = Vec::new();
    for (kind, id) in sc.locks {
        for op in (0..8).filter_map(LockOp::from_u8) {
            // Fair tickets start at (0, 0) here, the ticket `a` holds and `b` queued after.
            locks.push(ticket_cmd(kind, op, id, 1_000, Ticket::default()));
        }
    }
    let objects = [ObjectOp::Faa, ObjectOp::Cas, ObjectOp::Snapshot].map(|op| {
        let a = if op == ObjectOp::Cas { 5 } else { 1 };
        object_cmd(op, sc.object, a, 7)
    });
    let mut waiting = lock_cmd(LockKind::Fair, LockOp::TryShared, fair, 1_000);
    if let Command::Lock(c) = &mut waiting {
        c.wait_ms = 50;
    }
    let all: Vec<Command> = locks.iter().chain(&objects).copied().collect();
    let mut messages: Vec<(u32, Vec<Command>)> = all.iter().map(|&c| (0, vec![c])).collect();
    messages.push((0, vec![waiting]));
    // Full messages (31 commands) in both orders, so each command also meets the others'
    // effects.
    messages.push((0, all.iter().cycle().take(31).copied().collect()));
    messages.push((0, all.iter().rev().cycle().take(31).copied().collect()));
    messages.push((FLAG_ALL_OR_NOTHING, locks[..16].to_vec()));
    messages.push((FLAG_ALL_OR_NOTHING, locks[8..].to_vec()));
    messages.push((FLAG_ALL_OR_NOTHING, all[all.len() - 4..].to_vec()));
    for (flags, commands) in messages {
        let header = DataHeader {
            version: V,
            count: 0,
            message_id: 0x5150,
            client: a,
            flags,
        };
        let mut req = vec![0; DATA_MESSAGE_MAX];
        let n = encode_data_request(&header, &commands, &mut req).unwrap();
        req.truncate(n);
        frames.push((Channel::Data, req));
    }
    frames
}

/// Where frames keep a count or a length, as (offset, width): the data header's `count`, the
/// control header's `total_len`, a counted list's `count`, and the `name_len` of `GetLock`,
/// `ObjectGet`, a list's first entry and `ObjectCreate` (the same fields `dlock-core`'s codec
/// fuzzing overwrites).
const LENGTH_FIELDS: [(usize, usize); 7] =
    [(5, 1), (8, 2), (16, 1), (18, 2), (20, 2), (22, 2), (28, 2)];

/// How one corpus frame is damaged: bytes flipped, up to two cut off the end, up to two
/// appended, a length or count field overwritten, and (or not) the length fields made to agree
/// with the new size again so the checks behind them are reached.
#[derive(Clone, Debug)]
struct Damage {
    frame: prop::sample::Index,
    flips: Vec<(prop::sample::Index, u8)>,
    cut: prop::sample::Index,
    tail: Vec<u8>,
    length: Option<(prop::sample::Index, u16)>,
    fix_lengths: bool,
}

fn damage() -> impl Strategy<Value = Damage> {
    (
        any::<prop::sample::Index>(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        any::<prop::sample::Index>(),
        proptest::collection::vec(any::<u8>(), 0..3),
        proptest::option::of((any::<prop::sample::Index>(), any::<u16>())),
        any::<bool>(),
    )
        .prop_map(|(frame, flips, cut, tail, length, fix_lengths)| Damage {
            frame,
            flips,
            cut,
            tail,
            length,
            fix_lengths,
        })
}

fn apply(corpus: &[(Channel, Vec<u8>)], d: &Damage) -> (Channel, Vec<u8>) {
    let (channel, mut bytes) = d.frame.get(corpus).clone();
    for (at, v) in &d.flips {
        let i = at.index(bytes.len());
        bytes[i] ^= v;
    }
    let keep = d.cut.index(bytes.len() + 1);
    bytes.truncate(keep.max(bytes.len().saturating_sub(2)));
    bytes.extend(&d.tail);
    if let Some((field, value)) = d.length {
        let (at, width) = LENGTH_FIELDS[field.index(LENGTH_FIELDS.len())];
        if at + width <= bytes.len() {
            bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        }
    }
    if d.fix_lengths && bytes.len() >= 16 {
        match channel {
            Channel::Control => {
                let total = bytes.len().min(usize::from(u16::MAX)) as u16;
                bytes[8..10].copy_from_slice(&total.to_le_bytes());
            }
            Channel::Data => bytes[5] = ((bytes.len() - 16) / 32).min(255) as u8,
        }
    }
    (channel, bytes)
}

/// Statuses a data command gets only from checks made before anything is touched.
const REFUSED_UNTOUCHED: [Status; 8] = [
    Status::ClientNotInit,
    Status::NotReady,
    Status::ProtoVersionNegotiationFail,
    Status::LockNotGet,
    Status::ObjectNotGet,
    Status::Einval,
    Status::Eticket,
    Status::Easync,
];

/// Feeds one frame to the server: no panic; a reply, when there is one, is well-formed and
/// echoes the message id; and a frame refused whole, or whose commands were all refused before
/// touching anything, or an all-or-nothing message that did not get everything, leaves the
/// tables as they were.
fn feed(s: &mut Server<'_>, channel: Channel, bytes: &[u8]) -> Result<(), TestCaseError> {
    let before = s.tables().digest();
    let mut out = vec![0; CONTROL_FRAME_MAX.max(DATA_MESSAGE_MAX)];
    let unchanged = match channel {
        Channel::Control => match s.handle_control(bytes, &mut out, 1) {
            Err(_) => true,
            Ok(n) => {
                let reply = decode_control_response(&out[..n]);
                prop_assert!(reply.is_ok(), "{:?}", reply);
                let header = reply.unwrap().header;
                prop_assert_eq!(
                    header.message_id,
                    u16::from_le_bytes([bytes[10], bytes[11]])
                );
                header.status() != Some(Status::Success)
            }
        },
        Channel::Data => match s.handle_data(bytes, &mut out, 1) {
            Err(_) => true,
            // A waiting trylock was parked: the server answers it later.
            Ok(0) => false,
            Ok(n) => {
                let reply = decode_data_response(&out[..n]);
                prop_assert!(reply.is_ok(), "{:?}", reply);
                let reply = reply.unwrap();
                let req = decode_data_request(bytes).expect("the server answered it");
                prop_assert_eq!(reply.header().message_id, req.header().message_id);
                prop_assert_eq!(reply.len(), req.len());
                let statuses: Vec<Status> = reply.results().map(|r| r.result.status).collect();
                let untouched = statuses.iter().all(|s| REFUSED_UNTOUCHED.contains(s));
                // A lone waiting trylock is run on its own, outside all-or-nothing.
                let waits = req
                    .commands()
                    .any(|c| matches!(c, Command::Lock(l) if l.wait_ms != 0));
                let rolled_back = req.header().flags & FLAG_ALL_OR_NOTHING != 0
                    && !waits
                    && !statuses
                        .iter()
                        .all(|s| matches!(s, Status::Success | Status::AlreadyLocked));
                untouched || rolled_back
            }
        },
    };
    if unchanged {
        prop_assert_eq!(
            s.tables().digest(),
            before,
            "refused, yet the tables changed"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fuzz_cases(2_000)))]

    /// Damaged frames of every type, a few in a row against a server with something in every
    /// table: never a panic, a well-formed reply or none, and a refusal changes nothing.
    #[test]
    fn damaged_frames_get_a_reply_or_none_and_refusals_change_nothing(
        damages in proptest::collection::vec(damage(), 1..4),
    ) {
        let cfg = cfg();
        let mut region = region(&cfg);
        let mut s = server(&mut region);
        let sc = scene(&mut s);
        let corpus = corpus(&sc);
        for d in &damages {
            let (channel, bytes) = apply(&corpus, d);
            feed(&mut s, channel, &bytes)?;
        }
    }
}
