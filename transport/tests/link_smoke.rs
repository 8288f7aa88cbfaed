//! The runtime and the links end to end at the frame level: register, attach the data path,
//! take a lock — over the embedded shared-memory path and over TCP.

use std::time::{Duration, Instant};

use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, DATA_MESSAGE_MAX, DataHeader, LockCommand, LockOp, PROTO_VERSION,
    decode_control_response, decode_data_response, encode_control_request, encode_data_request,
};
use dlock_core::{Config, LockKind, Status, Ticket};
use dlock_transport::client::link::{Endpoint, Link};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

fn control(link: &mut Link, client: u32, body: ControlRequest<'_>) -> Vec<u8> {
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: body.msg_type(),
        message_id: 1,
        word: client,
    };
    let mut req = vec![0; CONTROL_FRAME_MAX];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req).unwrap();
    let mut reply = vec![0; CONTROL_FRAME_MAX];
    let deadline = Some(Instant::now() + Duration::from_secs(5));
    let m = link.control(&req[..n], &mut reply, deadline).unwrap();
    reply.truncate(m);
    reply
}

fn round_trip(endpoint: Endpoint) {
    let mut link = Link::connect(&endpoint).unwrap();
    let reply = control(
        &mut link,
        0,
        ControlRequest::ClientInit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
        },
    );
    let ControlResponse::Init(init) = decode_control_response(&reply).unwrap().body else {
        panic!("init")
    };
    link.attach(init.client, init.slot, init.session).unwrap();
    let reply = control(
        &mut link,
        init.client,
        ControlRequest::GetLock {
            kind: LockKind::Rw,
            name: b"rg",
        },
    );
    let ControlResponse::Lock { lock } = decode_control_response(&reply).unwrap().body else {
        panic!("lock")
    };
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: 9,
        client: init.client,
        flags: 0,
    };
    let cmd = Command::Lock(LockCommand {
        kind: LockKind::Rw,
        op: LockOp::TryExclusive,
        lock,
        expire_ms: 0,
        ticket: Ticket::default(),
        wait_ms: 0,
    });
    let mut req = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, &[cmd], &mut req).unwrap();
    let mut out = [0u8; DATA_MESSAGE_MAX];
    let m = link
        .data(
            &req[..n],
            &mut out,
            Some(Instant::now() + Duration::from_secs(5)),
        )
        .unwrap();
    let r = decode_data_response(&out[..m]).unwrap();
    assert_eq!(r.result(0).result.status, Status::Success);
    assert_eq!(r.header().message_id, 9);
}

fn small() -> Config {
    Config {
        locks_max: 64,
        clients_max: 8,
        objects_max: 8,
        ..Config::default()
    }
}

#[test]
fn shared_memory_round_trip() {
    let server = ServerHandle::start(ServerConfig::new(small())).unwrap();
    round_trip(Endpoint::embedded(&server));
    server.stop();
}

#[test]
fn tcp_round_trip() {
    let mut cfg = ServerConfig::new(small());
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let server = ServerHandle::start(cfg).unwrap();
    round_trip(Endpoint::Tcp(server.tcp_addr().unwrap()));
    server.stop();
}
