//! Lock value blocks through the bytes path: a grant flagged `VALUE_BLOCK` returns the lock's
//! block, an exclusive unlock carrying one writes it, and an exclusive holder lost without
//! writing leaves it invalid (`manager::value`'s table, run by the server).

use super::*;
use crate::LockKind;
use crate::ids::LockId;
use crate::manager::value::{ValueBlock, ValueRead};
use crate::proto::{
    Command, DATA_REQUEST_WITH_VALUES_MAX, DATA_RESPONSE_WITH_VALUES_MAX, DataHeader, DecodeError,
    FLAG_VALUES, LockCommand, LockFlags, LockOp, decode_data_response, encode_data_request,
    finish_value_requests, put_value_request,
};
use crate::server::FrameError;

fn flagged(kind: LockKind, op: LockOp, id: LockId) -> LockCommand {
    LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms: 10_000,
        flags: LockFlags::VALUE_BLOCK,
        ..LockCommand::NONE
    }
}

/// Sends `cmd` from `client` through the bytes path, with `block` in a value trailer when
/// given; the reply's status and value entry.
fn send(
    s: &mut TestServer,
    client: ClientId,
    cmd: LockCommand,
    block: Option<&ValueBlock>,
    now: u64,
) -> Result<(Status, Option<ValueRead>), FrameError> {
    let header = DataHeader {
        version: crate::proto::PROTO_VERSION,
        count: 0,
        message_id: 3,
        client: client.get(),
        flags: 0,
    };
    let mut req = [0u8; DATA_REQUEST_WITH_VALUES_MAX];
    let mut n = encode_data_request(&header, &[Command::Lock(cmd)], &mut req).unwrap();
    if let Some(b) = block {
        put_value_request(&mut req, 1, 0, b, true).unwrap();
        n = finish_value_requests(&mut req, 1).unwrap();
    }
    let mut out = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    let m = s.handle_data(&req[..n], &mut out, now)?;
    let resp = decode_data_response(&out[..m]).unwrap();
    Ok((resp.result(0).result.status, resp.value(0)))
}

fn pair(s: &mut TestServer, kind: LockKind) -> (ClientId, LockId, ClientId, LockId) {
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), kind, b"page 7", 0).unwrap();
    let lb = s.get_lock(b.get(), kind, b"page 7", 0).unwrap();
    (a, la, b, lb)
}

#[test]
fn a_block_written_at_an_exclusive_unlock_is_what_every_later_grant_reads() {
    use LockOp::*;
    for kind in [LockKind::Atomic, LockKind::Rw, LockKind::Fair] {
        let mut s = TestServer::new(&small());
        let (a, la, b, lb) = pair(&mut s, kind);
        let (status, fresh) = send(&mut s, a, flagged(kind, TryExclusive, la), None, 1).unwrap();
        assert_eq!(status, Status::Success, "{kind:?}");
        let fresh = fresh.expect("a flagged grant carries the block");
        assert_eq!(
            (fresh.block, fresh.seq, fresh.valid),
            (ValueBlock::ZERO, 0, true)
        );
        let lsn = ValueBlock([0x5A; 32]);
        let unlock = flagged(kind, UnlockExclusive, la);
        let (status, none) = send(&mut s, a, unlock, Some(&lsn), 2).unwrap();
        assert_eq!(
            (status, none),
            (Status::Success, None),
            "an unlock returns no block"
        );
        let take = if kind == LockKind::Atomic {
            TryExclusive
        } else {
            TryShared
        };
        let (status, read) = send(&mut s, b, flagged(kind, take, lb), None, 3).unwrap();
        assert_eq!(status, Status::Success, "{kind:?}");
        assert_eq!(
            read,
            Some(ValueRead {
                block: lsn,
                seq: 1,
                valid: true
            }),
            "{kind:?}"
        );
        // An unflagged grant carries no trailer at all.
        let mut plain = flagged(kind, take, la);
        plain.flags = LockFlags::NONE;
        let (_, none) = send(&mut s, a, plain, None, 4).unwrap();
        assert_eq!(none, None, "{kind:?}: not asked, not sent");
    }
}

/// `a` writes a block, takes the lock exclusively again and is lost without writing: `b`'s
/// next grant reads the block invalid, its bytes and write count kept.
fn lost_holder_case(lose: impl FnOnce(&mut TestServer, ClientId, ClientId)) -> ValueRead {
    use LockOp::*;
    let mut s = TestServer::new(&small());
    let (a, la, b, lb) = pair(&mut s, LockKind::Rw);
    let lsn = ValueBlock([1; 32]);
    let rw = LockKind::Rw;
    assert_eq!(
        send(&mut s, a, flagged(rw, TryExclusive, la), None, 1)
            .unwrap()
            .0,
        Status::Success
    );
    assert_eq!(
        send(&mut s, a, flagged(rw, UnlockExclusive, la), Some(&lsn), 2)
            .unwrap()
            .0,
        Status::Success
    );
    assert_eq!(
        send(&mut s, a, flagged(rw, TryExclusive, la), None, 3)
            .unwrap()
            .0,
        Status::Success
    );
    lose(&mut s, a, b);
    let (status, read) = send(&mut s, b, flagged(rw, TryShared, lb), None, 1_500).unwrap();
    assert_eq!(status, Status::Success);
    let read = read.expect("granted with its block");
    assert_eq!((read.block, read.seq), (lsn, 1), "the bytes are kept");
    read
}

#[test]
fn an_exclusive_holder_lost_without_writing_leaves_the_block_invalid() {
    let deinit = lost_holder_case(|s, a, _| s.client_deinit(a.get(), 4).unwrap());
    assert!(!deinit.valid, "deinit without an unlock");
    let died = lost_holder_case(|s, a, b| {
        // `b` stays alive; `a`'s lease (1 s) runs out.
        let _ = s.run(b, Command::Lock(LockCommand::NONE), 1_400);
        s.tick(1_450);
        assert!(s.client_slot_of(a.get()).is_none(), "a's lease ran out");
        assert!(s.client_slot_of(b.get()).is_some());
    });
    assert!(!died.valid, "death without an unlock");
}

#[test]
fn a_writer_needs_its_trailer_and_only_an_exclusive_unlock_writes() {
    use LockOp::*;
    let mut s = TestServer::new(&small());
    let (a, la, _, _) = pair(&mut s, LockKind::Rw);
    assert_eq!(
        send(&mut s, a, flagged(LockKind::Rw, TryShared, la), None, 1)
            .unwrap()
            .0,
        Status::Success
    );
    let before = s.tables().digest();
    // A shared unlock may not carry the flag (readers cannot write): the encoder refuses it,
    // and the same bytes made by hand are refused by the server (a value trailer with no
    // command that writes).
    let shared = flagged(LockKind::Rw, UnlockShared, la);
    let mut req = [0u8; DATA_REQUEST_WITH_VALUES_MAX];
    let header = DataHeader {
        version: crate::proto::PROTO_VERSION,
        count: 0,
        message_id: 1,
        client: a.get(),
        flags: 0,
    };
    assert!(encode_data_request(&header, &[Command::Lock(shared)], &mut req).is_err());
    let writer = flagged(LockKind::Rw, UnlockExclusive, la);
    encode_data_request(&header, &[Command::Lock(writer)], &mut req).unwrap();
    put_value_request(&mut req, 1, 0, &ValueBlock([9; 32]), true).unwrap();
    let n = finish_value_requests(&mut req, 1).unwrap();
    req[crate::proto::DATA_HEADER_LEN + 1] = UnlockShared as u8;
    let mut out = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    assert_eq!(
        s.handle_data(&req[..n], &mut out, 2),
        Err(FrameError::Malformed(DecodeError::BadFlags))
    );
    // An exclusive unlock flagged to write, without the trailer that carries the block.
    let exclusive = flagged(LockKind::Rw, UnlockExclusive, la);
    assert_eq!(
        send(&mut s, a, exclusive, None, 3),
        Err(FrameError::Malformed(DecodeError::BadFlags))
    );
    assert_eq!(
        s.tables().digest(),
        before,
        "refused messages changed nothing"
    );
}

#[test]
fn a_parked_request_is_granted_with_the_block_its_holder_wrote() {
    use LockOp::*;
    let mut s = TestServer::new(&small());
    let (a, la, b, lb) = pair(&mut s, LockKind::Rw);
    assert_eq!(
        send(&mut s, a, flagged(LockKind::Rw, TryExclusive, la), None, 1)
            .unwrap()
            .0,
        Status::Success
    );
    let header = DataHeader {
        version: crate::proto::PROTO_VERSION,
        count: 0,
        message_id: 9,
        client: b.get(),
        flags: 0,
    };
    let waiter = LockCommand {
        wait_ms: 5_000,
        ..flagged(LockKind::Rw, TryExclusive, lb)
    };
    let mut req = [0u8; DATA_REQUEST_WITH_VALUES_MAX];
    let n = encode_data_request(&header, &[Command::Lock(waiter)], &mut req).unwrap();
    let mut out = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    assert_eq!(s.handle_data(&req[..n], &mut out, 2), Ok(0), "parked");
    let lsn = ValueBlock([7; 32]);
    assert_eq!(
        send(
            &mut s,
            a,
            flagged(LockKind::Rw, UnlockExclusive, la),
            Some(&lsn),
            3
        )
        .unwrap()
        .0,
        Status::Success
    );
    let got = s.replies();
    let m = got[0].encode(&mut out).unwrap();
    let reply = decode_data_response(&out[..m]).unwrap();
    assert_eq!(reply.header().flags & FLAG_VALUES, FLAG_VALUES);
    assert_eq!(reply.result(0).result.status, Status::Success);
    assert_eq!(
        reply.value(0),
        Some(ValueRead {
            block: lsn,
            seq: 1,
            valid: true
        })
    );
}

/// The in-process entry carries both trailers as slices, under the bytes decoder's rules: a
/// block exactly for the commands that write one, or nothing runs.
#[test]
fn the_in_process_entry_writes_and_returns_blocks_like_the_bytes_path() {
    use crate::server::MessageValues;
    use LockOp::*;
    let mut s = TestServer::new(&small());
    let (a, la, b, lb) = pair(&mut s, LockKind::Fair);
    let fair = LockKind::Fair;
    let blank = CommandResult {
        status: Status::Einval,
        word: 0,
        aux: 0,
        plain: false,
    };
    let run =
        |s: &mut TestServer, who: ClientId, cmd: LockCommand, block: Option<ValueBlock>, now| {
            let (mut results, mut read) = ([blank], [None]);
            let blocks = [block];
            let values = MessageValues {
                blocks: if block.is_some() { &blocks } else { &[] },
                read: &mut read,
            };
            let cmds = [Command::Lock(cmd)];
            s.execute_message_with_values(who.get(), 0, &cmds, &mut results, values, now)
                .map(|_| (results[0].status, read[0]))
        };
    let got = run(&mut s, a, flagged(fair, TryExclusive, la), None, 1);
    assert_eq!(got.map(|g| g.1.map(|v| v.valid)), Ok(Some(true)));
    let before = s.tables().digest();
    let unlock = flagged(fair, UnlockExclusive, la);
    assert_eq!(
        run(&mut s, a, unlock, None, 2),
        Err(Status::Einval),
        "a writer without its block"
    );
    let shared = flagged(fair, TryShared, lb);
    let lsn = ValueBlock([3; 32]);
    assert_eq!(
        run(&mut s, b, shared, Some(lsn), 2),
        Err(Status::Einval),
        "a block for a command that writes none"
    );
    assert_eq!(s.tables().digest(), before, "refused: nothing ran");
    // The lock's first ticket is zero, as `flagged` leaves it.
    let got = run(&mut s, a, unlock, Some(lsn), 3);
    assert_eq!(got, Ok((Status::Success, None)));
    let got = run(&mut s, b, shared, None, 4);
    let want = ValueRead {
        block: lsn,
        seq: 1,
        valid: true,
    };
    assert_eq!(got, Ok((Status::Success, Some(want))));
}
