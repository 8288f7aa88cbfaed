//! TCP data connections served by the data thread: many requests in flight on one connection,
//! answered out of order (a parked lock does not hold back the requests behind it); a window
//! that bounds what a peer that does not read can make the server hold; and the same over TLS
//! through the client API (pipelined batches, a parked lock).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, server};
use dlock_core::proto::*;
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

/// Reads one control frame.
fn read_control(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; CONTROL_HEADER_LEN];
    s.read_exact(&mut h).expect("a control reply header");
    let len = control_frame_len(&h).expect("a control frame");
    let mut v = h.to_vec();
    v.resize(len, 0);
    s.read_exact(&mut v[CONTROL_HEADER_LEN..])
        .expect("a control reply");
    v
}

/// One control exchange on a raw connection; the reply's body.
fn raw_control(ctl: &mut TcpStream, word: u32, body: ControlRequest<'_>) -> Vec<u8> {
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: body.msg_type(),
        message_id: 1,
        word,
    };
    let mut buf = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut buf).unwrap();
    ctl.write_all(&buf[..n]).unwrap();
    read_control(ctl)
}

/// A client registered over a raw control connection, with the locks `names`: (control
/// stream, id, session, lock ids).
fn raw_client(
    addr: SocketAddr,
    names: &[&[u8]],
) -> (TcpStream, u32, dlock_core::Session, Vec<u32>) {
    let mut ctl = TcpStream::connect(addr).unwrap();
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
    let locks = names
        .iter()
        .map(|name| {
            let reply = raw_control(
                &mut ctl,
                init.client,
                ControlRequest::GetLock {
                    kind: LockKind::Atomic,
                    name,
                },
            );
            match decode_control_response(&reply).map(|r| r.body) {
                Ok(ControlResponse::Lock { lock }) => lock,
                other => panic!("get_lock failed: {other:?}"),
            }
        })
        .collect();
    (ctl, init.client, init.session, locks)
}

/// Attaches `data` (connected, buffers set) to `client`.
fn raw_attach(data: &mut TcpStream, client: u32, session: dlock_core::Session) {
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
}

/// One exclusive trylock of `lock` (waiting up to `wait_ms`) as message `id`, encoded.
fn trylock_msg(client: u32, lock: u32, wait_ms: u32, id: u16) -> ([u8; DATA_MESSAGE_MAX], usize) {
    let m = lock_msg(client, lock, LockOp::TryExclusive, wait_ms, id);
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    buf[..m.len()].copy_from_slice(&m);
    (buf, m.len())
}

/// Reads one single-command data reply: (message id, status).
fn read_reply(data: &mut TcpStream) -> (u16, Status) {
    let mut buf = [0u8; DATA_HEADER_LEN + COMMAND_LEN];
    data.read_exact(&mut buf).expect("a data reply");
    let reply = decode_data_response(&buf).unwrap();
    (reply.header().message_id, reply.result(0).result.status)
}

/// A parked blocking lock on A (message 1) does not hold back the trylocks on B, C and D sent
/// behind it on the same connection: they are answered first, and A's reply (echoing id 1)
/// follows when the holder lets A go.
#[test]
fn a_parked_lock_does_not_hold_back_later_requests_on_its_connection() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let mut holder = client(&Endpoint::Tcp(addr));
    let a = holder.get_lock(LockKind::Atomic, b"ooo-A").unwrap();
    assert_eq!(
        holder.trylock(a, Mode::Exclusive, 60_000).unwrap().status,
        Status::Success
    );

    let (_ctl, id, session, locks) = raw_client(addr, &[b"ooo-A", b"ooo-B", b"ooo-C", b"ooo-D"]);
    let mut data = TcpStream::connect(addr).unwrap();
    raw_attach(&mut data, id, session);
    // All four in one write: the server finds them in one read.
    let mut burst = Vec::new();
    for (k, &lock) in locks.iter().enumerate() {
        let wait_ms = if k == 0 { 60_000 } else { 0 };
        let (m, n) = trylock_msg(id, lock, wait_ms, k as u16 + 1);
        burst.extend_from_slice(&m[..n]);
    }
    data.write_all(&burst).unwrap();

    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(read_reply(&mut data));
    }
    first.sort_by_key(|r| r.0);
    assert_eq!(
        first,
        [
            (2, Status::Success),
            (3, Status::Success),
            (4, Status::Success)
        ],
        "the trylocks behind the parked lock are answered while it waits"
    );
    // Nothing else yet: A is still held.
    data.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        data.read(&mut b).is_err(),
        "no reply for the parked lock yet"
    );

    assert_eq!(holder.unlock(a).map_err(Status::from), Ok(Status::Success));
    data.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        read_reply(&mut data),
        (1, Status::Success),
        "the parked lock is granted, its reply echoing its message id"
    );
}

/// A peer that sends far more than the window without reading its replies: the server stops
/// reading it (the sender blocks: nothing is buffered for it beyond the window and the
/// kernel's socket buffers), keeps serving others meanwhile, and answers every message, in
/// order, once the peer reads.
#[test]
fn a_peer_that_does_not_read_is_held_to_the_window_and_served_once_it_reads() {
    const MESSAGES: usize = 100_000;
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let (_ctl, id, session, locks) = raw_client(addr, &[b"window"]);
    let lock = locks[0];

    // Small socket buffers on our side, so the kernel holds little for us.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.set_send_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut data: TcpStream = sock.into();
    raw_attach(&mut data, id, session);

    let sent = Arc::new(Mutex::new(0usize));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut w = data.try_clone().unwrap();
        let (sent, done) = (Arc::clone(&sent), Arc::clone(&done));
        std::thread::spawn(move || {
            for k in 0..MESSAGES {
                let (m, n) = trylock_msg(id, lock, 0, k as u16);
                w.write_all(&m[..n]).unwrap();
                *sent.lock().unwrap() = k + 1;
            }
            done.store(true, Ordering::Release);
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !done.load(Ordering::Acquire),
        "the sender is held back ({} of {MESSAGES} sent) while it reads nothing",
        sent.lock().unwrap()
    );

    // The data thread still serves everyone else.
    let mut other = client(&Endpoint::Tcp(addr));
    let l = other.get_lock(LockKind::Atomic, b"elsewhere").unwrap();
    let t = Instant::now();
    assert_eq!(
        other.trylock(l, Mode::Exclusive, 1_000).unwrap().status,
        Status::Success
    );
    assert!(t.elapsed() < Duration::from_secs(1));

    // Now read: every message is answered, in the order sent.
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, data);
    for k in 0..MESSAGES {
        let mut buf = [0u8; DATA_HEADER_LEN + COMMAND_LEN];
        reader.read_exact(&mut buf).expect("a data reply");
        let reply = decode_data_response(&buf).unwrap();
        assert_eq!(reply.header().message_id, k as u16, "reply {k} in order");
        // The first takes the lock; the rest find it held by their own client (`Fail`).
        let status = reply.result(0).result.status;
        let want = if k == 0 {
            Status::Success
        } else {
            Status::Fail
        };
        assert_eq!(status, want, "reply {k}");
    }
    writer.join().unwrap();
}

/// Over TLS, on the data thread: four pipelined batches complete, and a lock() parked on the
/// server is granted when the holder lets go.
#[test]
fn tls_data_connections_serve_pipelined_batches_and_parked_locks() {
    let (_s, endpoint, _dir) = common::tls_server(
        "tcp-data",
        Config {
            locks_max: 256,
            clients_max: 16,
            objects_max: 16,
            ..Config::default()
        },
    );

    let mut c = Client::connect(ClientConfig::new(endpoint.clone())).unwrap();
    let depth = c.pipeline_depth();
    assert!(depth >= 2, "TCP pipelines ({depth})");
    let ids: Vec<_> = (0..depth * 8)
        .map(|k| {
            c.get_lock(LockKind::Atomic, format!("p{k}").as_bytes())
                .unwrap()
        })
        .collect();
    for batch in ids.chunks(8) {
        let reqs: Vec<_> = batch
            .iter()
            .map(|&id| (id, Mode::Exclusive, 60_000))
            .collect();
        c.submit_trylock(&reqs, false).unwrap();
    }
    let mut out = [Err(Status::Einval); 31];
    for _ in 0..depth {
        let n = c.complete(&mut out).unwrap();
        assert!(out[..n].iter().all(|r| r.is_ok()), "{:?}", &out[..n]);
    }

    // A lock() parked on the server, granted when `c` lets go of ids[0].
    let waiter = std::thread::spawn(move || {
        let mut w = Client::connect(ClientConfig::new(endpoint)).unwrap();
        let id = w.get_lock(LockKind::Atomic, b"p0").unwrap();
        let r = w.lock(id, Mode::Exclusive, 60_000, Duration::from_secs(10));
        (r.map(|g| g.status), Instant::now())
    });
    // Let go only once the server has parked the waiter's request (its `waits` counter), so the
    // grant below can only be the hand-off, however slowly this machine runs the waiter.
    let parked = Instant::now();
    while waits(&mut c) == 0 {
        assert!(parked.elapsed() < Duration::from_secs(10), "never parked");
        std::thread::sleep(Duration::from_millis(5));
    }
    let unlocking = Instant::now();
    assert_eq!(c.unlock(ids[0]).map_err(Status::from), Ok(Status::Success));
    let (r, granted) = waiter.join().unwrap();
    assert_eq!(r.map_err(Status::from), Ok(Status::Success));
    assert!(granted >= unlocking, "granted before the holder let go");
}

/// The server's count of lock requests it parked.
fn waits(c: &mut Client) -> u64 {
    let stats = c.server_stats().unwrap();
    stats
        .iter()
        .find(|(n, _)| *n == "waits")
        .expect("a counter")
        .1
}

/// A plaintext TCP server whose frame timeout is `frame_timeout`.
fn server_timing_out(frame_timeout: Duration) -> ServerHandle {
    let mut cfg = ServerConfig::new(common::small());
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    cfg.frame_timeout = frame_timeout;
    ServerHandle::start(cfg).unwrap()
}

/// Whether the server closes `s` within `within` (end of stream or reset; not a timeout).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // replies still queued for us
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

/// On the data thread too, a data message begun must be finished within the frame timeout,
/// and a message speaking for a registered client that is not the connection's closes it; one
/// for an id nobody holds is refused (`ClientNotInit`) and the connection stays.
#[test]
fn half_a_data_message_or_a_foreign_one_closes_the_data_connection() {
    let s = server_timing_out(Duration::from_millis(300));
    let addr = s.tcp_addr().unwrap();
    let (_ctl, id, session, locks) = raw_client(addr, &[b"half"]);

    let mut data = TcpStream::connect(addr).unwrap();
    raw_attach(&mut data, id, session);
    let (m, n) = trylock_msg(id, locks[0], 0, 7);
    data.write_all(&m[..n - 5]).unwrap();
    let sent = Instant::now();
    assert!(
        closed_within(&mut data, Duration::from_secs(3)),
        "half a message times out"
    );
    assert!(sent.elapsed() >= Duration::from_millis(300));

    let (_ctl2, other, _, _) = raw_client(addr, &[b"other"]);
    let mut data = TcpStream::connect(addr).unwrap();
    raw_attach(&mut data, id, session);
    let nobody = (1..).map(|k| id ^ k).find(|&c| c != other).unwrap();
    let (m, n) = trylock_msg(nobody, locks[0], 0, 8);
    data.write_all(&m[..n]).unwrap();
    assert_eq!(read_reply(&mut data), (8, Status::ClientNotInit));
    let (m, n) = trylock_msg(id, locks[0], 0, 9);
    data.write_all(&m[..n]).unwrap();
    assert_eq!(read_reply(&mut data), (9, Status::Success), "still served");

    let (m, n) = trylock_msg(other, locks[0], 0, 10);
    data.write_all(&m[..n]).unwrap();
    assert!(
        closed_within(&mut data, Duration::from_secs(3)),
        "a message of another registered client closes the connection"
    );
}

/// A peer that stops reading its replies holds its connection no longer than the frame
/// timeout once the server cannot write to it.
#[test]
fn replies_not_read_within_the_frame_timeout_close_the_data_connection() {
    let s = server_timing_out(Duration::from_millis(300));
    let addr = s.tcp_addr().unwrap();
    let (_ctl, id, session, locks) = raw_client(addr, &[b"unread"]);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut data: TcpStream = sock.into();
    raw_attach(&mut data, id, session);
    data.set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    let mut refused = false;
    // Send until the server gives up on us (a write fails once it closed the connection).
    while started.elapsed() < Duration::from_secs(5) {
        let (m, n) = trylock_msg(id, locks[0], 0, 1);
        let burst: Vec<u8> = std::iter::repeat_n(&m[..n], 256)
            .flatten()
            .copied()
            .collect();
        if let Err(e) = data.write_all(&burst) {
            // Blocked writes time out; a closed connection resets them.
            refused = !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            );
            break;
        }
    }
    assert!(
        refused,
        "the server closed a connection whose replies nobody read"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
}

/// One lock command as message `id`, encoded.
fn lock_msg(client: u32, lock: u32, op: LockOp, wait_ms: u32, id: u16) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: id,
        client,
        flags: 0,
    };
    let cmd = Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op,
        lock,
        expire_ms: 60_000,
        ticket: dlock_core::Ticket::default(),
        wait_ms,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    });
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, &[cmd], &mut buf).unwrap();
    buf[..n].to_vec()
}

/// A join of `client` (proving `session`) as message `id`, encoded.
fn join_msg(client: u32, session: dlock_core::Session, id: u16) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: id,
        client,
        flags: 0,
    };
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    let n =
        encode_data_request(&header, &[Command::Join(JoinCommand { session })], &mut buf).unwrap();
    buf[..n].to_vec()
}

/// Many clients joined on one connection are each served as themselves; more of them parked
/// on one lock than the window holds do not shut out the holder's unlock that grants the
/// next; a join with a wrong session closes the connection it came on.
#[test]
fn clients_joined_on_one_connection_share_it_and_a_wrong_session_closes_it() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let (_hctl, holder, hsession, locks) = raw_client(addr, &[b"hot"]);
    let hot = locks[0];
    let waiters: Vec<_> = (0..40).map(|_| raw_client(addr, &[b"hot"])).collect();
    assert!(waiters.len() > 32, "more waiters than the window");

    let mut data = TcpStream::connect(addr).unwrap();
    raw_attach(&mut data, holder, hsession);
    data.write_all(&lock_msg(holder, hot, LockOp::TryExclusive, 0, 1))
        .unwrap();
    assert_eq!(read_reply(&mut data), (1, Status::Success));
    for (k, (_, id, session, _)) in waiters.iter().enumerate() {
        data.write_all(&join_msg(*id, *session, 100 + k as u16))
            .unwrap();
        assert_eq!(read_reply(&mut data), (100 + k as u16, Status::Success));
    }
    // Each member speaks as itself: the lock is the holder's.
    let (_, w0, _, _) = waiters[0];
    data.write_all(&lock_msg(w0, hot, LockOp::TryExclusive, 0, 2))
        .unwrap();
    assert_eq!(read_reply(&mut data), (2, Status::Fail));
    for (k, (_, id, _, _)) in waiters.iter().enumerate() {
        data.write_all(&lock_msg(
            *id,
            hot,
            LockOp::TryExclusive,
            30_000,
            200 + k as u16,
        ))
        .unwrap();
    }
    data.write_all(&lock_msg(holder, hot, LockOp::UnlockExclusive, 0, 3))
        .unwrap();
    let mut seen = Vec::new();
    while !(seen.contains(&(3, Status::Success)) && seen.len() == 2) {
        seen.push(read_reply(&mut data));
        assert!(seen.len() <= 2, "one unlock and one grant: {seen:?}");
    }
    let granted = seen.iter().find(|r| r.0 != 3).unwrap();
    assert!((200..240).contains(&granted.0) && granted.1 == Status::Success);

    let (_, w1, w1session, _) = waiters[1];
    let mut wrong = w1session;
    wrong.0[0] ^= 1;
    let mut other = TcpStream::connect(addr).unwrap();
    raw_attach(&mut other, holder, hsession);
    other.write_all(&join_msg(w1, wrong, 7)).unwrap();
    assert!(
        closed_within(&mut other, Duration::from_secs(3)),
        "a join with a wrong session closes the connection"
    );
    // The members left on the first connection are still served.
    data.write_all(&lock_msg(w1, hot, LockOp::TryExclusive, 0, 4))
        .unwrap();
    let (id, status) = read_reply(&mut data);
    assert_eq!(id, 4);
    assert!(
        matches!(status, Status::Fail | Status::AlreadyLocked),
        "{status:?}"
    );
}

/// A join among other commands closes the connection, wherever it stands, and nothing of the
/// message runs (`dlock_core::server::route`): before, a lock ahead of the join was executed
/// and the join answered `Einval`.
#[test]
fn a_join_among_other_commands_closes_the_connection_and_runs_nothing() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let (_hctl, holder, hsession, locks) = raw_client(addr, &[b"mixed"]);
    let (_wctl, _, msession, _) = raw_client(addr, &[b"mixed"]);
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: 1,
        client: holder,
        flags: 0,
    };
    let lock = Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op: LockOp::TryExclusive,
        lock: locks[0],
        expire_ms: 60_000,
        ticket: dlock_core::Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    });
    let join = Command::Join(JoinCommand { session: msession });
    for commands in [[lock, join], [join, lock]] {
        let mut data = TcpStream::connect(addr).unwrap();
        raw_attach(&mut data, holder, hsession);
        let mut buf = [0u8; DATA_MESSAGE_MAX];
        let n = encode_data_request(&header, &commands, &mut buf).unwrap();
        data.write_all(&buf[..n]).unwrap();
        assert!(
            closed_within(&mut data, Duration::from_secs(3)),
            "{commands:?}"
        );
    }
    // The lock was never taken: the holder takes it now, over a connection of its own.
    let mut data = TcpStream::connect(addr).unwrap();
    raw_attach(&mut data, holder, hsession);
    data.write_all(&lock_msg(holder, locks[0], LockOp::TryExclusive, 0, 9))
        .unwrap();
    assert_eq!(read_reply(&mut data), (9, Status::Success));
}
