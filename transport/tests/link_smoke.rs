//! The runtime and the links end to end at the frame level: register, attach the data path,
//! take a lock — over the embedded shared-memory path and over TCP.

use std::time::{Duration, Instant};

use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, DATA_MESSAGE_MAX, DataHeader, InitReply, LockCommand, LockOp, PROTO_VERSION,
    decode_control_response, decode_data_response, encode_control_request, encode_data_request,
};
use dlock_core::{Config, LockKind, Status, Ticket};
use dlock_transport::client::link::{Endpoint, Link};
use dlock_transport::region::Region;
use dlock_transport::runtime::{IdleStrategy, ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::shm::{lanes_current_seq, next_lane};

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

/// Registers over `endpoint`, attaches the data path and gets an RW lock: (link, client, lock).
fn registered(endpoint: &Endpoint) -> (Link, u32, u32) {
    let (link, init, lock) = registered_with(endpoint);
    (link, init.client, lock)
}

/// As [`registered`], with the whole registration reply (slot, session).
fn registered_with(endpoint: &Endpoint) -> (Link, InitReply, u32) {
    let mut link = Link::connect(endpoint).unwrap();
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
    (link, init, lock)
}

/// A one-command data message: `op` on RW lock `lock`.
fn message(client: u32, message_id: u16, op: LockOp, lock: u32) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id,
        client,
        flags: 0,
    };
    let cmd = Command::Lock(LockCommand {
        kind: LockKind::Rw,
        op,
        lock,
        expire_ms: 0,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    });
    let mut req = vec![0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, &[cmd], &mut req).unwrap();
    req.truncate(n);
    req
}

/// One data round trip of a one-command message: the reply's (message id, status).
fn one_round_trip(link: &mut Link, req: &[u8]) -> (u16, Status) {
    let mut out = [0u8; DATA_MESSAGE_MAX];
    let deadline = Some(Instant::now() + Duration::from_secs(5));
    let m = link.data(req, &mut out, deadline).unwrap();
    let r = decode_data_response(&out[..m]).unwrap();
    (r.header().message_id, r.result(0).result.status)
}

fn round_trip(endpoint: Endpoint) {
    let (mut link, client, lock) = registered(&endpoint);
    let req = message(client, 9, LockOp::TryExclusive, lock);
    assert_eq!(one_round_trip(&mut link, &req), (9, Status::Success));
}

/// A trylock and the unlock of the same lock sent back to back, before either reply is read,
/// over and over so the pair lands in every pair of lanes (also lane 3, then lane 0): both
/// succeed only if the server runs a client's messages in the order it numbered them.
fn pipelined_pairs(endpoint: Endpoint) {
    let (mut link, client, lock) = registered(&endpoint);
    assert_eq!(link.depth(), 4);
    let deadline = Some(Instant::now() + Duration::from_secs(5));
    let mut out = [0u8; DATA_MESSAGE_MAX];
    for round in 0..10u16 {
        let try_id = 2 * round;
        let t1 = link
            .send_data(&message(client, try_id, LockOp::TryExclusive, lock))
            .unwrap();
        let t2 = link
            .send_data(&message(client, try_id + 1, LockOp::UnlockExclusive, lock))
            .unwrap();
        for (ticket, id) in [(t1, try_id), (t2, try_id + 1)] {
            let m = link.recv_data(ticket, &mut out, deadline).unwrap().unwrap();
            let r = decode_data_response(&out[..m]).unwrap();
            assert_eq!(r.header().message_id, id);
            assert_eq!(r.result(0).result.status, Status::Success, "round {round}");
        }
    }
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

#[test]
fn pipelined_messages_run_in_the_order_they_were_sent() {
    let mut cfg = ServerConfig::new(small());
    // A parked data thread takes tens of µs to wake: by then both messages of a pair are
    // posted, so the server meets them side by side and must pick the order.
    cfg.idle = IdleStrategy::Park;
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let server = ServerHandle::start(cfg).unwrap();
    pipelined_pairs(Endpoint::embedded(&server));
    pipelined_pairs(Endpoint::Tcp(server.tcp_addr().unwrap()));
    server.stop();
}

/// The data thread picks the lane holding the lowest new request, then takes it. A client that
/// timed out on that request may reuse its lane for a newer one in between: the newer one must
/// not run in its place (the ones between would then sit below `last` and never run).
#[test]
fn a_lane_rewritten_between_picking_and_taking_is_not_run_out_of_order() {
    let region = Region::anonymous(&small()).unwrap();
    let lanes = region.client_mailboxes(0).unwrap();
    for seq in 1..=4u64 {
        lanes[seq as usize % 4].post_request(&[seq as u8; 16], seq);
    }
    let (seq, lane) = next_lane(lanes, 0).unwrap();
    assert_eq!(seq, 1);
    // The client gave up on request 1 and reuses its lane for request 5.
    lanes[1].post_request(&[5; 16], 5);
    let mut out = [0u8; DATA_MESSAGE_MAX];
    assert_eq!(
        lane.take_exact(seq, &mut out),
        None,
        "5 would run in 1's place"
    );
    let (seq, lane) = next_lane(lanes, 0).unwrap();
    assert_eq!((seq, lane.take_exact(seq, &mut out)), (2, Some(16)));
    assert_eq!(out[0], 2);
}

/// A client that gives up and reinitialises may leave requests in its lanes that the server
/// has not taken; after the reinit they must not run (the client has forgotten them).
#[test]
fn requests_left_in_the_lanes_do_not_run_after_a_reinit() {
    let server = ServerHandle::start(ServerConfig::new(small())).unwrap();
    let e = Endpoint::embedded(&server);
    let (_old, init, lock) = registered_with(&e);
    // An exclusive trylock written into the next lane and never rung.
    let lanes = server.region().client_mailboxes(init.slot).unwrap();
    let stale = lanes_current_seq(lanes) + 1;
    lanes[stale as usize % 4]
        .post_request(&message(init.client, 1, LockOp::TryExclusive, lock), stale);
    let mut link = Link::connect(&e).unwrap();
    let reply = control(
        &mut link,
        init.client,
        ControlRequest::ClientReinit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
            session: init.session,
        },
    );
    let ControlResponse::Init(again) = decode_control_response(&reply).unwrap().body else {
        panic!("reinit")
    };
    link.attach(again.client, again.slot, again.session)
        .unwrap();
    // A shared trylock rings the bell: had the stale exclusive one run first, it would fail.
    let req = message(init.client, 2, LockOp::TryShared, lock);
    assert_eq!(one_round_trip(&mut link, &req), (2, Status::Success));
    server.stop();
}

/// A server that takes connections and never says a word: the kernel's backlog completes each
/// TCP handshake, nothing is read or answered. A data attach to it can only time out.
fn silent_server() -> (std::net::TcpListener, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// A server that answers every data attach with success (without checking it) and then says
/// nothing more, so a second client's join over the shared connection goes unanswered.
fn mute_after_attach() -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut hello = [0u8; dlock_core::proto::ATTACH_LEN];
                if s.read_exact(&mut hello).is_ok() && s.write_all(&[0; 4]).is_ok() {
                    // Reads to the end, answering nothing, until the client lets go.
                    let _ = std::io::copy(&mut s, &mut std::io::sink());
                }
            });
        }
    });
    addr
}

/// The 5 s the links waited on an attach and a join whatever their caller's timeout was. A
/// link given a tenth of a second that has not given up well before this is not obeying it.
const OLD_FIXED_TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn a_data_attach_to_a_silent_server_gives_up_at_the_links_timeout() {
    let (_listener, addr) = silent_server();
    let timeout = Duration::from_millis(100);
    let mut link = Link::connect_within(&Endpoint::Tcp(addr), timeout).unwrap();
    let start = Instant::now();
    let attached = link.attach(1, 0, dlock_core::Session::NONE);
    assert!(attached.is_err(), "a silent server accepted nothing");
    assert!(
        start.elapsed() < OLD_FIXED_TIMEOUT / 2,
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_join_left_unanswered_gives_up_at_the_links_timeout() {
    let addr = mute_after_attach();
    let endpoint = Endpoint::Tcp(addr);
    let mux = dlock_transport::client::Mux::new(&endpoint).unwrap();
    let timeout = Duration::from_millis(100);
    // Both links open their control connections before the shared one is open, so the
    // second joins it (a join command over the shared connection) instead of registering
    // over it.
    let mut first = Link::connect_shared(&endpoint, mux.clone(), timeout).unwrap();
    let mut second = Link::connect_shared(&endpoint, mux.clone(), timeout).unwrap();
    first.attach(1, 0, dlock_core::Session::NONE).unwrap();
    let start = Instant::now();
    let joined = second.attach(2, 0, dlock_core::Session::NONE);
    assert_eq!(joined.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    assert!(
        start.elapsed() < OLD_FIXED_TIMEOUT / 2,
        "{:?}",
        start.elapsed()
    );
}
