//! Control frames over a TCP data connection, spoken by hand: how the server treats the control
//! frames a multiplexing client's members send over their shared connection
//! (`dlock_core::server::control`'s rules for a stream, and `runtime/tcp.rs`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{raw, server};
use dlock_core::proto::*;
use dlock_core::{LockKind, Status};

/// Opens a data connection to `addr` attached as `client`.
fn attached(addr: SocketAddr, client: u32, session: dlock_core::Session) -> TcpStream {
    let mut data = TcpStream::connect(addr).unwrap();
    data.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = Attach {
        magic: ATTACH_MAGIC,
        client,
        session,
    };
    data.write_all(&hello.encode()).unwrap();
    let mut status = [0u8; 4];
    data.read_exact(&mut status).unwrap();
    assert_eq!(u32::from_le_bytes(status), 0, "the attach is accepted");
    data
}

/// A client registered over its own control connection: (that connection, its registration).
fn registered(addr: SocketAddr) -> (TcpStream, InitReply) {
    let mut ctl = TcpStream::connect(addr).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let init = raw::register(&mut ctl, 0).expect("registers");
    (ctl, init)
}

/// The status and body of control reply `reply`.
fn answer(reply: &[u8]) -> (Option<Status>, ControlResponse<'_>) {
    let r = decode_control_response(reply).expect("a control reply");
    (r.header.status(), r.body)
}

/// One exclusive trylock of `lock` by `client` as message `id`; the reply's status.
fn trylock(data: &mut TcpStream, client: u32, lock: u32, id: u16) -> Status {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: id,
        client,
        flags: 0,
    };
    let cmd = Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op: LockOp::TryExclusive,
        lock,
        expire_ms: 60_000,
        ticket: dlock_core::Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    });
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, &[cmd], &mut buf).unwrap();
    data.write_all(&buf[..n]).unwrap();
    let mut reply = [0u8; DATA_HEADER_LEN + COMMAND_LEN];
    data.read_exact(&mut reply).expect("a data reply");
    let reply = decode_data_response(&reply).unwrap();
    assert_eq!(reply.header().message_id, id);
    reply.result(0).result.status
}

/// A client registered over a data connection is a member of it at once: its control frames
/// and data messages are served there, its replies come back there. A control frame for a
/// client nobody registered is answered `ClientNotInit`; one for a registered client bound
/// elsewhere closes the connection, as a data message for it does.
#[test]
fn a_client_registered_over_a_data_connection_is_served_there() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let (_ctl, a) = registered(addr);
    let mut data = attached(addr, a.client, a.session);
    let b = raw::register(&mut data, 0).expect("registers over the data connection");
    assert_ne!(b.client, a.client);
    let get = ControlRequest::GetLock {
        kind: LockKind::Atomic,
        name: b"over-data",
    };
    let reply = raw::control(&mut data, b.client, get).expect("answered");
    let (Some(Status::Success), ControlResponse::Lock { lock }) = answer(&reply) else {
        panic!("get_lock failed: {:?}", answer(&reply));
    };
    assert_eq!(trylock(&mut data, b.client, lock, 3), Status::Success);
    assert_eq!(trylock(&mut data, a.client, lock, 4), Status::LockNotGet);
    let reply = raw::control(&mut data, b.client, ControlRequest::Heartbeat).unwrap();
    assert_eq!(answer(&reply).0, Some(Status::Success));
    let nobody = (1..)
        .map(|k| b.client ^ k)
        .find(|&c| c != a.client)
        .unwrap();
    let reply = raw::control(&mut data, nobody, ControlRequest::Heartbeat).unwrap();
    assert_eq!(answer(&reply).0, Some(Status::ClientNotInit));
    let (_ctl, c) = registered(addr);
    assert_eq!(
        raw::control(&mut data, c.client, ControlRequest::Heartbeat),
        None,
        "a heartbeat for a client bound elsewhere closes the connection"
    );
}

/// One control path per client: a client that re-registers over a data connection has its
/// control connection closed by the server, as a re-registration over another control
/// connection would.
#[test]
fn a_reinit_over_a_data_connection_closes_the_clients_control_connection() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let (mut ctl, a) = registered(addr);
    let mut data = attached(addr, a.client, a.session);
    let reinit = ControlRequest::ClientReinit {
        min_version: PROTO_VERSION,
        lease_ms: 0,
        session: a.session,
    };
    let reply = raw::control(&mut data, a.client, reinit).expect("answered");
    assert!(matches!(
        answer(&reply),
        (Some(Status::Success), ControlResponse::Init(_))
    ));
    ctl.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut byte = [0u8; 1];
    assert!(
        matches!(ctl.read(&mut byte), Ok(0)),
        "the old control connection is closed"
    );
    let reply = raw::control(&mut data, a.client, ControlRequest::Heartbeat).unwrap();
    assert_eq!(
        answer(&reply).0,
        Some(Status::Success),
        "served over the data connection"
    );
}
