//! Tests of the wire codec: round trips, every field boundary, and fuzzing (random input must
//! never panic; a mutated frame must either be refused or re-encode to exactly its own bytes).
//!
//! Shared builders live here; the checks are split by topic.

mod cluster;
mod control;
mod data;
mod fuzz;
mod manager;
mod version;

use super::*;
use crate::config::NAME_LEN_MAX;
use crate::ids::{LockKind, Mode, Session, Ticket};
use crate::status::Status;

/// A request header for `msg` with distinctive field values.
fn req_header(msg: MsgType) -> ControlHeader {
    ControlHeader {
        version: PROTO_VERSION,
        msg,
        message_id: 0xBEEF,
        word: 0x1234_5678,
    }
}

/// A response header for `msg` with `status`.
fn resp_header(msg: MsgType, status: Status) -> ControlHeader {
    ControlHeader {
        version: PROTO_VERSION,
        msg,
        message_id: 0xCAFE,
        word: u32::from(status as u16),
    }
}

fn frame(body: ControlRequest<'_>) -> ControlRequestFrame<'_> {
    ControlRequestFrame {
        header: req_header(body.msg_type()),
        body,
    }
}

fn encode_request(frame: &ControlRequestFrame<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(frame, &mut buf).expect("encodable request");
    buf.truncate(n);
    buf
}

fn encode_response(header: &ControlHeader, body: &ControlResponse<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_response(header, body, &mut buf).expect("encodable response");
    buf.truncate(n);
    buf
}

/// A control frame with a well-formed header around an arbitrary body.
fn raw_control(code: u8, word: u32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(CONTROL_HEADER_LEN + body.len());
    b.extend_from_slice(&CONTROL_MAGIC.to_le_bytes());
    b.extend_from_slice(&[PROTO_VERSION, CONTROL_HEADER_LEN as u8, code, 0]);
    b.extend_from_slice(&((CONTROL_HEADER_LEN + body.len()) as u16).to_le_bytes());
    b.extend_from_slice(&7u16.to_le_bytes());
    b.extend_from_slice(&word.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// Rewrites `total_len` to the buffer's length (after a test changed the body).
fn fix_total_len(b: &mut [u8]) {
    let n = b.len() as u16;
    b[8..10].copy_from_slice(&n.to_le_bytes());
}

fn claim(name: &[u8], held: Held) -> LockClaim<'_> {
    LockClaim {
        value: Some(crate::manager::value::ValueRead {
            block: crate::manager::ValueBlock([0xA5; 32]),
            seq: 0xDEAD_0001,
            valid: false,
        }),
        kind: LockKind::Fair,
        held,
        name,
        old_lock: 0x0010_0003,
        word: 0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10,
        ticket: Ticket {
            exclusive: 0xFFFE,
            shared: 3,
        },
        remaining_ms: 1_500,
        age_ms: 20,
        token: 0x0001_0000_0000_0009,
        proof: crate::GrantProof {
            epoch: 1,
            mac: *b"0123456789abcdef",
        },
    }
}

/// Calls `f` with one request of every type, in [`MsgType::ALL`] order.
fn for_each_request(mut f: impl FnMut(&ControlRequestFrame<'_>)) {
    let long = [b'x'; NAME_LEN_MAX];
    let gets = [
        (LockKind::Atomic, &b"a"[..]),
        (LockKind::Rw, &b"rw-lock"[..]),
        (LockKind::Fair, &long[..]),
    ];
    let ids = [1u32, 0x7FFF_FFFF, 42];
    let claims = [
        claim(b"c0", Held::Reference),
        claim(b"c1", Held::Exclusive),
        claim(b"c2", Held::Shared),
        claim(b"c3", Held::Ticketed(Mode::Exclusive)),
        claim(&long, Held::Ticketed(Mode::Shared)),
    ];
    let dones = [
        crate::proto::PartitionEpoch {
            partition: 0,
            epoch: 1,
        },
        crate::proto::PartitionEpoch {
            partition: u16::MAX,
            epoch: u32::MAX,
        },
    ];
    let bodies = [
        ControlRequest::ClientInit {
            min_version: 2,
            lease_ms: 5_000,
        },
        ControlRequest::ClientDeinit,
        ControlRequest::Heartbeat,
        ControlRequest::GetLock {
            kind: LockKind::Fair,
            name: b"orders/17",
        },
        ControlRequest::ReleaseLock { lock: 0x0010_0001 },
        ControlRequest::BatchGetLock(Batch::from_slice(&gets)),
        ControlRequest::BatchReleaseLock(Batch::from_slice(&ids)),
        ControlRequest::ObjectCreate {
            name: b"counter",
            init: u64::MAX,
            lease_s: 30,
        },
        ControlRequest::ObjectGet {
            name: &long,
            lease_s: 0,
        },
        ControlRequest::ObjectRelease { object: 7 },
        ControlRequest::ObjectDestroy { object: 8 },
        ControlRequest::ClientReinit {
            min_version: 2,
            lease_ms: 1,
            session: Session([0x5A; Session::LEN]),
        },
        ControlRequest::ReinitDone,
        ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)),
        ControlRequest::Stats,
        ControlRequest::GetMap { offset: 0x4000 },
        ControlRequest::RecoveryDone { dead: 0x7FFF_0001 },
        ControlRequest::ListRetained(crate::proto::ListRetained {
            client: 9,
            cursor: 0x0000_0003_0000_0011,
        }),
        ControlRequest::ClientJoin {
            min_version: 5,
            lease_ms: 2_500,
            session: Session([0xA5; Session::LEN]),
        },
        ControlRequest::ReclaimDone {
            partition: 4_095,
            epoch: 0x0102_0304,
        },
        ControlRequest::Drain,
        ControlRequest::ReclaimDones(Batch::from_slice(&dones)),
    ];
    for body in bodies {
        f(&frame(body));
    }
}

/// Calls `f` with a success response of every type (in [`MsgType::ALL`] order), then a failure
/// response of every type, then a `PartitionMoved` of every type.
fn for_each_response(mut f: impl FnMut(&ControlHeader, &ControlResponse<'_>)) {
    let map = [0x6Du8; 3_000];
    let chunk = MapChunk {
        version: u64::MAX - 1,
        total_len: (MAP_CHUNK_MAX + map.len()) as u32,
        offset: MAP_CHUNK_MAX as u32,
        chunk: &map,
    };
    let entries = [
        BatchEntry {
            id: 0x0010_0001,
            status: Status::Success,
        },
        BatchEntry {
            id: 0,
            status: Status::ServerNoResource,
        },
    ];
    let counters = [0u64, 1, u64::MAX];
    let retained = [crate::proto::RetainedEntry {
        client: 0x0123_4567,
        lock: 0x0010_0002,
        kind: LockKind::Rw,
        mode: Mode::Shared,
        name: b"page/9",
    }];
    let init = InitReply {
        client: 0x7ABC_DEF0,
        version: 2,
        recovering: false,
        epoch: 3,
        lease_ms: 5_000,
        objects_max: 102_400,
        slot: 999,
        session: Session([0xC3; Session::LEN]),
        revoke_timeout_ms: 750,
    };
    let statuses = [
        crate::proto::PartitionStatus {
            partition: 7,
            status: Status::Success,
        },
        crate::proto::PartitionStatus {
            partition: 4_095,
            status: Status::NotReady,
        },
    ];
    for msg in MsgType::ALL {
        let body = match msg {
            MsgType::ClientInit => ControlResponse::Init(init),
            MsgType::ClientReinit => ControlResponse::Init(InitReply {
                recovering: true,
                ..init
            }),
            MsgType::ClientJoin => ControlResponse::Init(InitReply { epoch: 0, ..init }),
            MsgType::GetMap => ControlResponse::MapChunk(chunk),
            MsgType::GetLock => ControlResponse::Lock { lock: 0x0020_0005 },
            MsgType::ObjectCreate => ControlResponse::Object { object: 9 },
            MsgType::ObjectGet => ControlResponse::ObjectRef {
                object: 9,
                cell: 102_399,
            },
            MsgType::BatchGetLock | MsgType::BatchReleaseLock | MsgType::BatchUpdateLocks => {
                ControlResponse::Entries(Batch::from_slice(&entries))
            }
            MsgType::Stats => ControlResponse::Counters(Batch::from_slice(&counters)),
            MsgType::RecoveryDone => ControlResponse::Released { locks: 3 },
            MsgType::ReclaimDones => {
                ControlResponse::PartitionStatuses(Batch::from_slice(&statuses))
            }
            MsgType::ListRetained => ControlResponse::Retained(crate::proto::RetainedPage {
                next: 0x0000_0002_0000_0005,
                entries: Batch::from_slice(&retained),
            }),
            _ => ControlResponse::Empty,
        };
        f(&resp_header(msg, Status::Success), &body);
    }
    for msg in MsgType::ALL {
        f(&resp_header(msg, Status::Fail), &ControlResponse::Empty);
    }
    for (i, msg) in MsgType::ALL.into_iter().enumerate() {
        let moved = ControlResponse::PartitionMoved {
            map_version: 0x0F00 + i as u64,
        };
        f(&resp_header(msg, Status::PartitionMoved), &moved);
    }
}

/// A data header with distinctive values (`count` is filled in by the encoder).
fn data_header(flags: u32) -> DataHeader {
    DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: 0x5A5A,
        client: 0x0765_4321,
        flags,
    }
}

/// Every lock kind with every lock op, then every object op: 27 commands.
fn every_command() -> Vec<Command> {
    let mut commands = Vec::new();
    for kind in [LockKind::Atomic, LockKind::Rw, LockKind::Fair] {
        for op in 0..8 {
            commands.push(Command::Lock(LockCommand {
                kind,
                op: LockOp::from_u8(op).unwrap(),
                lock: 0x0010_0000 | u32::from(op),
                expire_ms: 30_000 + u32::from(op),
                wait_ms: u32::from(op) * 7,
                ticket: Ticket {
                    exclusive: 0xFFFF,
                    shared: u16::from(op),
                },
                partition_epoch: u32::MAX - u32::from(op),
                flags: crate::proto::LockFlags::NONE,
            }));
        }
    }
    for op in 0..3 {
        commands.push(Command::Object(ObjectCommand {
            op: ObjectOp::from_u8(op).unwrap(),
            object: 0x0010_0100 | u32::from(op),
            a: u64::MAX - u64::from(op),
            b: 0x8000_0000_0000_0000 | u64::from(op),
            partition_epoch: 0x0001_0000 | u32::from(op),
        }));
    }
    commands
}

fn encode_data(header: &DataHeader, commands: &[Command]) -> Vec<u8> {
    let mut buf = vec![0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(header, commands, &mut buf).expect("encodable data request");
    buf.truncate(n);
    buf
}

/// The response to the request in `req_bytes`, with result `i` built from `i`.
fn encode_data_reply(req_bytes: &[u8]) -> Vec<u8> {
    let req = decode_data_request(req_bytes).unwrap();
    let results: Vec<CommandResult> = (0..req.len())
        .map(|i| CommandResult {
            status: Status::ALL[i % Status::ALL.len()],
            word: u128::MAX - i as u128,
            aux: 0xA000 + i as u64,
            plain: false,
        })
        .collect();
    let mut buf = vec![0u8; DATA_MESSAGE_MAX];
    let n = encode_data_response(&req, &results, &mut buf).unwrap();
    buf.truncate(n);
    buf
}
