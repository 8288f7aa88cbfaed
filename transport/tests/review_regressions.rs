//! Regressions from a review of the transport: each test is a scenario that once broke mutual
//! exclusion, let a peer speak for another client, or stranded a request.

mod common;

use common::{client, server};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::{AsyncOp, Client, ClientConfig, Endpoint};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Slot reuse: a new client in a slot whose previous owner sent exactly one data message.
#[test]
fn a_client_in_a_reused_slot_never_takes_the_previous_owners_reply() {
    let s = server(false);
    let e = Endpoint::embedded(&s);
    let mut h = client(&e);
    let id_h = h.get_lock(LockKind::Atomic, b"x").unwrap();
    let mut a = client(&e);
    let id = a.get_lock(LockKind::Atomic, b"x").unwrap();
    let _ = a.trylock(id, Mode::Exclusive, 60_000).unwrap();
    a.deinit().unwrap(); // releases the grant
    let mut b = client(&e);
    let id_b = b.get_lock(LockKind::Atomic, b"x").unwrap();
    assert_eq!(id_b, id);
    let rb = b.trylock(id_b, Mode::Exclusive, 60_000);
    let rh = h.trylock(id_h, Mode::Exclusive, 60_000);
    assert!(!(rb.is_ok() && rh.is_ok()), "both hold the exclusive lock");
}

/// Async + heartbeat: the reply must still be matched to the async request.
#[test]
fn an_async_reply_is_matched_after_control_calls_in_between() {
    let s = server(false);
    let e = Endpoint::embedded(&s);
    let mut a = client(&e);
    let id = a.get_lock(LockKind::Atomic, b"y").unwrap();
    a.lock_request_async(id, AsyncOp::Lock(Mode::Exclusive, 60_000))
        .unwrap();
    a.heartbeat().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let r = a.lock_result_check();
    assert!(r.is_ok(), "{r:?}");
}

/// An unbound connection may not speak for a registered client.
#[test]
fn an_unregistered_connection_cannot_deregister_another_client() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mut victim = client(&e);
    let vid = victim.id().get();
    let lock = victim.get_lock(LockKind::Atomic, b"v").unwrap();
    let _ = victim.trylock(lock, Mode::Exclusive, 60_000).unwrap();
    // Attacker: registers itself, learns nothing but the victim's id.
    let mut att = client(&e);
    let _ = att.get_lock(LockKind::Atomic, b"v").unwrap();
    // Unbound control connection: ClientDeinit with word = victim id.
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    let mut buf = vec![0u8; 4096];
    let hdr = dlock_core::proto::ControlHeader {
        version: dlock_core::proto::PROTO_VERSION,
        msg: dlock_core::proto::MsgType::ClientDeinit,
        message_id: 7,
        word: vid,
    };
    let n = dlock_core::proto::encode_control_request(
        &dlock_core::proto::ControlRequestFrame {
            header: hdr,
            body: dlock_core::proto::ControlRequest::ClientDeinit,
        },
        &mut buf,
    )
    .unwrap();
    raw.write_all(&buf[..n]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rep = [0u8; 16];
    assert!(
        matches!(raw.read(&mut rep), Ok(0) | Err(_)),
        "an unbound connection speaking for a client is closed, not answered"
    );
    let hb = victim.heartbeat();
    assert!(
        hb.is_ok(),
        "victim was deregistered by an unbound connection: {hb:?}"
    );
}

/// TCP: a reply that arrives after the client gave up desynchronises the data stream for good.
#[test]
fn a_late_tcp_reply_does_not_put_later_exchanges_out_of_step() {
    use dlock_core::proto::*;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut ctl, _) = l.accept().unwrap();
        std::thread::spawn(move || {
            while let Some(f) = common::raw::read_control(&mut ctl) {
                let req = decode_control_request(&f).unwrap();
                let body = match req.body {
                    ControlRequest::ClientInit { .. } | ControlRequest::ClientReinit { .. } => {
                        ControlResponse::Init(InitReply {
                            client: 77,
                            version: req.header.version,
                            recovering: false,
                            epoch: 1,
                            lease_ms: 5000,
                            objects_max: 16,
                            slot: 0,
                            session: dlock_core::Session([9; 16]),
                            revoke_timeout_ms: 0,
                        })
                    }
                    ControlRequest::GetLock { .. } => ControlResponse::Lock {
                        lock: dlock_core::LockId::new(1, 1).raw(),
                    },
                    _ => ControlResponse::Empty,
                };
                let mut out = vec![0u8; 8192];
                let h = ControlHeader {
                    word: 0,
                    ..req.header
                };
                let n = encode_control_response(&h, &body, &mut out).unwrap();
                ctl.write_all(&out[..n]).unwrap();
            }
        });
        let (mut data, _) = l.accept().unwrap();
        let mut att = [0u8; dlock_core::proto::ATTACH_LEN];
        data.read_exact(&mut att).unwrap();
        data.write_all(&0u32.to_le_bytes()).unwrap();
        let mut k = 0;
        loop {
            let mut h = [0u8; 16];
            if data.read_exact(&mut h).is_err() {
                return;
            }
            let mut v = h.to_vec();
            v.resize(16 + h[5] as usize * 32, 0);
            data.read_exact(&mut v[16..]).unwrap();
            let req = decode_data_request(&v).unwrap();
            let mut out = [0u8; DATA_MESSAGE_MAX];
            let n = begin_data_response(&req, &mut out).unwrap();
            for i in 0..req.len() {
                put_data_result(
                    &req,
                    i,
                    &CommandResult {
                        status: dlock_core::Status::Success,
                        word: 0,
                        aux: 0,
                        plain: false,
                    },
                    &mut out,
                )
                .unwrap();
            }
            k += 1;
            if k == 1 {
                std::thread::sleep(Duration::from_millis(400));
            }
            data.write_all(&out[..n]).unwrap();
        }
    });
    let mut cfg = ClientConfig::new(Endpoint::Tcp(addr));
    cfg.timeout = Duration::from_millis(200);
    let mut c = Client::connect(cfg).unwrap();
    let id = c.get_lock(LockKind::Atomic, b"q").unwrap();
    let mut got = vec![];
    for _ in 0..5 {
        got.push(
            c.trylock(id, Mode::Exclusive, 1000)
                .map(|g| g.status)
                .map_err(Status::from),
        );
    }
    // The first times out (its reply comes 400 ms late); the ones after it must not read the
    // late reply as theirs and stay one behind.
    assert_eq!(got[0], Err(Status::BadResponse), "{got:?}");
    assert!(
        got[2..].iter().all(|r| r.is_ok()),
        "the stream fell out of step: {got:?}"
    );
}

/// A second connection bound to the same client (e.g. the half-open control connection a client
/// left behind when it reinit'ed) closes: the parked request of the live data connection is
/// dropped and that connection never gets another reply.
#[test]
fn closing_a_connection_that_failed_to_reinit_leaves_the_parked_request_alone() {
    use dlock_core::proto::*;
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mut holder = client(&e);
    let mut victim = client(&e);
    let vid = victim.id().get();
    let lh = holder.get_lock(LockKind::Atomic, b"p").unwrap();
    let lv = victim.get_lock(LockKind::Atomic, b"p").unwrap();
    let _ = holder.trylock(lh, Mode::Exclusive, 60_000).unwrap();
    // Another control connection bound to the victim's id (ClientReinit needs no secret).
    let mut raw = std::net::TcpStream::connect(addr).unwrap();
    let mut buf = vec![0u8; 4096];
    let hdr = ControlHeader {
        version: PROTO_VERSION,
        msg: MsgType::ClientReinit,
        message_id: 7,
        word: vid,
    };
    let n = encode_control_request(
        &ControlRequestFrame {
            header: hdr,
            body: ControlRequest::ClientReinit {
                min_version: PROTO_VERSION,
                lease_ms: 0,
                session: dlock_core::Session::NONE,
            },
        },
        &mut buf,
    )
    .unwrap();
    raw.write_all(&buf[..n]).unwrap();
    let r = common::raw::read_control(&mut raw).unwrap();
    let status = u32::from_le_bytes([r[12], r[13], r[14], r[15]]);
    assert_eq!(
        status,
        Status::Einval as u32,
        "a reinit without the session secret is refused"
    );
    let t = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = victim.lock(lv, Mode::Exclusive, 60_000, Duration::from_secs(1));
        let e1 = t0.elapsed();
        let r2 = victim.trylock(lv, Mode::Exclusive, 60_000);
        (r, e1, r2)
    });
    std::thread::sleep(Duration::from_millis(200));
    drop(raw); // the stale connection goes away
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(holder.unlock(lh).map_err(Status::from), Ok(Status::Success));
    let (r, waited, next) = t.join().unwrap();
    assert!(
        r.is_ok(),
        "the parked lock request was answered: {r:?} after {waited:?}"
    );
    assert!(next.is_ok(), "the connection still serves: {next:?}");
}

/// A client registered over a raw TCP control connection: (control stream, id, session).
fn raw_register(addr: std::net::SocketAddr) -> (std::net::TcpStream, u32, dlock_core::Session) {
    use dlock_core::proto::*;
    let mut ctl = std::net::TcpStream::connect(addr).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reply = raw_control(
        &mut ctl,
        0,
        ControlRequest::ClientInit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
        },
    );
    let Ok(ControlResponse::Init(init)) = decode_control_response(&reply).map(|r| r.body) else {
        panic!("registration failed");
    };
    (ctl, init.client, init.session)
}

/// A raw client (registered, `name` got, a data connection attached) whose exclusive lock
/// request (message 1, waiting up to a minute) is parked behind another holder of `name`:
/// (control stream, id, session, lock, data connection).
fn raw_parked_behind(
    addr: std::net::SocketAddr,
    name: &[u8],
) -> (
    std::net::TcpStream,
    u32,
    dlock_core::Session,
    u32,
    std::net::TcpStream,
) {
    use dlock_core::proto::*;
    let (mut ctl, id, session) = raw_register(addr);
    let reply = raw_control(
        &mut ctl,
        id,
        ControlRequest::GetLock {
            kind: LockKind::Atomic,
            name,
        },
    );
    let Ok(ControlResponse::Lock { lock }) = decode_control_response(&reply).map(|r| r.body) else {
        panic!("get_lock failed");
    };
    let mut data = raw_attach(addr, id, session);
    raw_trylock(&mut data, id, lock, 60_000, 1); // parks behind the holder
    std::thread::sleep(Duration::from_millis(100));
    (ctl, id, session, lock, data)
}

/// One control exchange on a raw connection; the reply frame.
fn raw_control(
    ctl: &mut std::net::TcpStream,
    word: u32,
    body: dlock_core::proto::ControlRequest<'_>,
) -> Vec<u8> {
    common::raw::control(ctl, word, body).expect("a control reply")
}

/// A raw TCP data connection attached to `client` (the server must accept it).
fn raw_attach(
    addr: std::net::SocketAddr,
    client: u32,
    session: dlock_core::Session,
) -> std::net::TcpStream {
    use dlock_core::proto::{ATTACH_MAGIC, Attach};
    let mut data = std::net::TcpStream::connect(addr).unwrap();
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

/// Sends one exclusive trylock of `lock` (waiting up to `wait_ms`) as message `message_id`.
fn raw_trylock(data: &mut std::net::TcpStream, client: u32, lock: u32, wait_ms: u32, id: u16) {
    use dlock_core::proto::*;
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
        wait_ms,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    });
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, &[cmd], &mut buf).unwrap();
    data.write_all(&buf[..n]).unwrap();
}

/// Reads one single-command data reply: (message id, status).
fn raw_data_reply(data: &mut std::net::TcpStream) -> (u16, Status) {
    use dlock_core::proto::*;
    let mut buf = [0u8; DATA_HEADER_LEN + COMMAND_LEN];
    data.read_exact(&mut buf).expect("a data reply");
    let reply = decode_data_response(&buf).unwrap();
    (reply.header().message_id, reply.result(0).result.status)
}

/// Whether the server closed `s` (a read sees the end of the stream or a reset, not a timeout).
fn closed_by_server(s: &mut std::net::TcpStream) -> bool {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// One TCP data connection per client: a second attach (a client that reconnected) closes the
/// first, whose parked request is dropped with it — it neither keeps the client's one waiter
/// busy nor answers on the new connection — and the second connection serves, parked requests
/// included.
#[test]
fn a_second_attach_replaces_the_first_data_connection() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let mut holder = client(&Endpoint::Tcp(addr));
    let held = holder.get_lock(LockKind::Atomic, b"one-data-conn").unwrap();
    let _ = holder.trylock(held, Mode::Exclusive, 60_000).unwrap();

    // The control connection stays open (bound, not `_`): its loss would end the client.
    let (_ctl, id, session, lock, mut first) = raw_parked_behind(addr, b"one-data-conn");

    let mut second = raw_attach(addr, id, session);
    assert!(
        closed_by_server(&mut first),
        "the first data connection is closed once the second is attached"
    );

    // The client gave up on the first connection's request: it may park a new one at once
    // (not `Easync`), and the grant answers that one, on the new connection.
    raw_trylock(&mut second, id, lock, 60_000, 2);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        holder.unlock(held).map_err(Status::from),
        Ok(Status::Success)
    );
    assert_eq!(
        raw_data_reply(&mut second),
        (2, Status::Success),
        "the new connection's parked request gets the grant, and only its own reply"
    );
    // And the second connection keeps serving plain requests.
    raw_trylock(&mut second, id, lock, 0, 3);
    assert_eq!(
        raw_data_reply(&mut second).0,
        3,
        "answered on the new connection"
    );
}

/// A client that gives up on its data path and reinitialises has forgotten the request it had
/// parked there, even while the server has not yet noticed that path go (here: the old data
/// connection stays open). The reinit drops the parked request, so the lock is not granted to a
/// reply nobody reads: once the holder unlocks, another client takes it.
#[test]
fn a_reinit_drops_the_request_parked_on_the_path_it_gave_up() {
    use dlock_core::proto::*;
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mut holder = client(&e);
    let lh = holder.get_lock(LockKind::Atomic, b"given-up").unwrap();
    let _ = holder.trylock(lh, Mode::Exclusive, 60_000).unwrap();

    let (_ctl, id, session, _lock, old_data) = raw_parked_behind(addr, b"given-up");

    // Reinit on a new control connection; the old data connection is left open.
    let mut ctl2 = std::net::TcpStream::connect(addr).unwrap();
    ctl2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reply = raw_control(
        &mut ctl2,
        id,
        ControlRequest::ClientReinit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
            session,
        },
    );
    assert!(
        matches!(
            decode_control_response(&reply).map(|r| r.body),
            Ok(ControlResponse::Init(_))
        ),
        "the reinit is accepted"
    );

    assert_eq!(holder.unlock(lh).map_err(Status::from), Ok(Status::Success));
    let mut other = client(&e);
    let lo = other.get_lock(LockKind::Atomic, b"given-up").unwrap();
    assert!(
        other.trylock(lo, Mode::Exclusive, 60_000).is_ok(),
        "the forgotten request was granted the lock"
    );
    drop(old_data);
}
