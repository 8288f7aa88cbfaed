//! The cluster's model clients, routing as the thin client does (`ClusterLink`): one id
//! registered with any server and joined to the others with its session, a cached map that a
//! `PartitionMoved` answer refreshes (from the server that sent it, as `GetMap` would), every
//! data request carrying its partition's epoch, one call at a time with a deadline (a reply
//! after it is dropped, as the client drops flights it gave up on), and after a partition it
//! knows locks in changed owner, `ReclaimDone` to the new owner. These clients hold nothing
//! across a move: a grant of a moved partition is let go (not re-claimed), so their
//! `ReclaimDone` is true and may end the new owner's recovery early.
//!
//! What runs at a server is the real `Server`'s embedded API (`client_init`, `get_lock`,
//! `execute_message`, objects) and its control frames for `ClientJoin` and `ReclaimDone`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use dlock_core::cluster::Map;
use dlock_core::ids::Session;
use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, CommandResult, ControlHeader, ControlRequest, ControlRequestFrame,
    LockCommand, LockOp, MsgType, ObjectCommand, ObjectOp, PROTO_VERSION, encode_control_request,
    peek_control_header,
};
use dlock_core::server::Server;
use dlock_core::{LockKind, Status};

/// A lock a client believes it holds.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub host: usize,
    pub life: u32,
    pub partition: u16,
    pub lock: u32,
    pub epoch: u32,
    /// Its lease ends (model clock), counted from the request's send.
    pub until: u64,
}

/// A call in flight.
#[derive(Clone, Debug)]
pub struct Pending {
    pub seq: u64,
    pub sent: u64,
    pub host: usize,
    pub life: u32,
    pub req: Req,
}

/// One model client.
#[derive(Debug, Default)]
pub struct Client {
    pub reg: Option<(u32, Session)>,
    pub map: Option<Arc<Map>>,
    /// Servers (host, process generation) it is registered with.
    pub joined: HashMap<usize, u32>,
    /// Lock ids per (host, generation, name); object ids likewise.
    pub locks: HashMap<(usize, u32, usize), u32>,
    pub objects: HashMap<(usize, u32, usize), u32>,
    pub held: BTreeMap<usize, Held>,
    /// Partitions it has used (it owes their new owner a `ReclaimDone` after a move).
    pub known: BTreeSet<u16>,
    pub pending: Option<Pending>,
    /// `ReclaimDone`s owed: (host, partition, epoch).
    pub owed: Vec<(usize, u16, u32)>,
    /// Idle until this model instant (after a `NotReady`, a lost call).
    pub idle_until: u64,
}

/// What a client asks a server (one call; a join first when it is not registered there).
#[derive(Clone, Debug)]
pub enum Req {
    Init,
    GetMap,
    Lock {
        name: usize,
        lock: Option<u32>,
        epoch: u32,
        expire_ms: u32,
    },
    Unlock {
        lock: u32,
        epoch: u32,
    },
    Faa {
        name: usize,
        object: Option<u32>,
        epoch: u32,
    },
    Done {
        partition: u16,
        epoch: u32,
    },
}

/// A server's answer.
#[derive(Clone, Debug)]
pub struct Rep {
    pub status: Status,
    pub aux: u64,
    /// The lock or object id the call looked up.
    pub id: Option<u32>,
    /// The registration made (`Init`) or confirmed (a join).
    pub registered: Option<(u32, Session)>,
    pub joined: bool,
    /// The server's applied map (`GetMap`, or with a `PartitionMoved`).
    pub map: Option<Arc<Map>>,
    /// When the server decided (model clock).
    pub at: u64,
}

impl Rep {
    pub fn status(status: Status, at: u64) -> Rep {
        Rep {
            status,
            aux: 0,
            id: None,
            registered: None,
            joined: false,
            map: None,
            at,
        }
    }
}

/// A lock name's bytes; names with a `{tag}` share their tag's partition.
pub fn lock_name(i: usize) -> Vec<u8> {
    match i % 4 {
        0 => format!("{{table-{}}}row-{i}", i % 3).into_bytes(),
        _ => format!("lock-{i}").into_bytes(),
    }
}

pub fn counter_name(i: usize) -> Vec<u8> {
    format!("xid-{i}").into_bytes()
}

/// Runs a control frame `body` from client `raw` at `srv`: its status.
pub fn control(srv: &mut Server<'_>, raw: u32, body: ControlRequest<'_>, now: u64) -> Status {
    let frame = ControlRequestFrame {
        header: ControlHeader {
            version: PROTO_VERSION,
            msg: body.msg_type(),
            message_id: 1,
            word: raw,
        },
        body,
    };
    let mut req = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut req).expect("encode a control request");
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let len = srv
        .handle_control(&req[..n], &mut out, now)
        .expect("the server answers a well-formed frame");
    let (h, _) = peek_control_header(&out[..len]).expect("a reply header");
    debug_assert_eq!(h.msg, frame.header.msg);
    let _: MsgType = h.msg;
    h.status().unwrap_or(Status::Einval)
}

/// Joins client `raw` to `srv` with `session`.
pub fn join(srv: &mut Server<'_>, raw: u32, session: Session, now: u64) -> Status {
    let body = ControlRequest::ClientJoin {
        min_version: PROTO_VERSION,
        lease_ms: 0,
        session,
    };
    control(srv, raw, body, now)
}

/// Executes one data command from client `raw` at `srv`.
pub fn execute(srv: &mut Server<'_>, raw: u32, cmd: Command, now: u64) -> CommandResult {
    let mut results = [CommandResult {
        status: Status::Einval,
        word: 0,
        aux: 0,
        plain: false,
    }];
    match srv.execute_message(raw, 0, &[cmd], &mut results, now) {
        Ok(_) => results[0],
        Err(s) => CommandResult {
            status: s,
            word: 0,
            aux: 0,
            plain: false,
        },
    }
}

pub fn trylock(lock: u32, epoch: u32, expire_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op: LockOp::TryExclusive,
        lock,
        expire_ms,
        partition_epoch: epoch,
        ..LockCommand::NONE
    })
}

pub fn unlock(lock: u32, epoch: u32) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op: LockOp::UnlockExclusive,
        lock,
        partition_epoch: epoch,
        ..LockCommand::NONE
    })
}

pub fn faa(object: u32, epoch: u32) -> Command {
    Command::Object(ObjectCommand {
        op: ObjectOp::Faa,
        object,
        a: 1,
        b: 0,
        partition_epoch: epoch,
    })
}
