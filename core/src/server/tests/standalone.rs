//! A standalone server and protocol 5's cluster fields: a version-4 client sees no change, a
//! partition epoch other than 0 is refused as its (then reserved) bytes were, and the cluster's
//! control messages are answered `Einval`.

use super::*;
use crate::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    DATA_RESPONSE_MAX, DataHeader, DecodeError, PROTO_VERSION, decode_control_response,
    decode_data_response, encode_control_request, encode_data_request,
};
use crate::server::FrameError;

/// Sends `body` from `client` with header version `version`; the reply's bytes.
fn control_at(s: &mut TestServer, version: u8, client: u32, body: ControlRequest<'_>) -> Vec<u8> {
    let frame = ControlRequestFrame {
        header: ControlHeader {
            version,
            msg: body.msg_type(),
            message_id: 3,
            word: client,
        },
        body,
    };
    let mut req = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut req).unwrap();
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let m = s.handle_control(&req[..n], &mut out, 1).unwrap();
    out.truncate(m);
    out
}

/// One data message of `cmds` from `client` at `version`, through the bytes path.
fn data_at(
    s: &mut TestServer,
    version: u8,
    client: ClientId,
    cmds: &[Command],
) -> Result<Vec<u8>, FrameError> {
    let header = DataHeader {
        version,
        count: 0,
        message_id: 9,
        client: client.get(),
        flags: 0,
    };
    let mut req = [0u8; DATA_RESPONSE_MAX];
    let n = encode_data_request(&header, cmds, &mut req).unwrap();
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let m = s.handle_data(&req[..n], &mut out, 2)?;
    out.truncate(m);
    Ok(out)
}

#[test]
fn a_version_4_client_registers_and_locks_as_before() {
    let mut s = TestServer::new(&small());
    let init = ControlRequest::ClientInit {
        min_version: 4,
        lease_ms: 0,
    };
    let reply = control_at(&mut s, 4, 0, init);
    let ControlResponse::Init(r) = decode_control_response(&reply).unwrap().body else {
        panic!("registered");
    };
    assert_eq!(r.version, 4, "the newest both speak");
    let me = ClientId::new(r.client).unwrap();
    let x = s.get_lock(me.get(), LockKind::Atomic, b"x", 1).unwrap();
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 1_000);
    let bytes = data_at(&mut s, 4, me, &[take]).unwrap();
    let got = decode_data_response(&bytes).unwrap().result(0).result;
    assert_eq!(got.status, Status::Success);
    assert_eq!(
        crate::FencingToken(got.aux).standalone_epoch(),
        small().epoch
    );
}

#[test]
fn a_partition_epoch_other_than_0_is_refused_whole_as_malformed() {
    let mut s = TestServer::new(&small());
    let me = s.client(0);
    let x = s.get_lock(me.get(), LockKind::Atomic, b"x", 0).unwrap();
    let o = s.object_create(me.get(), b"o", 5, 60, 0).unwrap();
    s.object_get(me.get(), b"o", 60, 0).unwrap();
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 1_000);
    let Command::Lock(l) = take else {
        unreachable!()
    };
    let named = Command::Lock(LockCommand {
        partition_epoch: 1,
        ..l
    });
    let faa = Command::Object(ObjectCommand {
        op: ObjectOp::Faa,
        object: o.raw(),
        a: 1,
        b: 0,
        partition_epoch: u32::MAX,
    });
    for cmds in [&[named][..], &[take, named], &[faa]] {
        assert_eq!(
            data_at(&mut s, PROTO_VERSION, me, cmds),
            Err(FrameError::Malformed(DecodeError::BadField)),
            "{cmds:?}"
        );
        let mut results = [CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0,
            plain: false,
        }; 2];
        assert_eq!(
            s.execute_message(me.get(), 0, cmds, &mut results, 2),
            Err(Status::Einval)
        );
    }
    // Nothing ran: the lock is free and the object unchanged.
    let Command::Object(f) = faa else {
        unreachable!()
    };
    let zero = Command::Object(ObjectCommand {
        partition_epoch: 0,
        ..f
    });
    assert_eq!(s.run(me, take, 3).status, Status::Success);
    let faa = s.run(me, zero, 3);
    assert_eq!((faa.status, faa.aux), (Status::Success, 5));
}

#[test]
fn the_cluster_control_messages_are_answered_einval() {
    let mut s = TestServer::new(&small());
    let me = s.client(0);
    let session = s.session(me.get());
    for body in [
        ControlRequest::GetMap { offset: 0 },
        ControlRequest::ClientJoin {
            min_version: 5,
            lease_ms: 0,
            session,
        },
        ControlRequest::ReclaimDone {
            partition: 0,
            epoch: 1,
        },
        // The transport answers drains; one that reaches the state machine is refused.
        ControlRequest::Drain,
    ] {
        let msg = body.msg_type();
        let bytes = control_at(&mut s, PROTO_VERSION, me.get(), body);
        let reply = decode_control_response(&bytes).unwrap();
        assert_eq!(reply.header.msg, msg);
        assert_eq!(reply.header.status(), Some(Status::Einval), "{msg:?}");
        assert_eq!(reply.body, ControlResponse::Empty);
    }
}
