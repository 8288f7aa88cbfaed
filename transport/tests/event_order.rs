//! The order of events and replies on a stream data connection: every event the server wrote
//! into a client's ring before it read a request of that client goes out ahead of that
//! request's reply. The client's trust bound (`dlock_core::manager::trust`, rule 1) counts on
//! it: a reply says that no revoke sent before its request was read is still on its way.
//!
//! The test speaks the protocol by hand, so that it sees the bytes in the order they left.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::raw::{control, register};
use dlock_core::proto::*;
use dlock_core::{LockKind, Mode, Session, Status};
use dlock_transport::client::{CachedLocks, ClientConfig, Endpoint, Revoked};
use dlock_transport::runtime::ServerHandle;

/// A client registered on its own control connection (kept open: closing it would end the
/// registration), with its ids of RW locks `names`.
struct Raw {
    _ctl: TcpStream,
    id: u32,
    session: Session,
    locks: Vec<u32>,
}

fn raw_client(s: &ServerHandle, names: &[&[u8]]) -> Raw {
    let mut ctl = TcpStream::connect(s.tcp_addr().unwrap()).unwrap();
    ctl.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let init = register(&mut ctl, 0).expect("registered");
    let locks = names
        .iter()
        .map(|name| {
            let get = ControlRequest::GetLock {
                kind: LockKind::Rw,
                name,
            };
            let reply = control(&mut ctl, init.client, get).expect("answered");
            match decode_control_response(&reply).map(|r| r.body) {
                Ok(ControlResponse::Lock { lock }) => lock,
                other => panic!("get_lock failed: {other:?}"),
            }
        })
        .collect();
    Raw {
        _ctl: ctl,
        id: init.client,
        session: init.session,
        locks,
    }
}

/// One data message of `client` (message `id`) carrying `cmd`.
fn message(client: u32, id: u16, cmd: Command) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: id,
        client,
        flags: 0,
    };
    let mut buf = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, &[cmd], &mut buf).unwrap();
    buf[..n].to_vec()
}

/// An exclusive RW trylock of `lock`, asking for a cached grant when `flags` says so.
fn trylock(lock: u32, flags: LockFlags) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Rw,
        op: LockOp::TryExclusive,
        lock,
        expire_ms: 60_000,
        flags,
        ..LockCommand::NONE
    })
}

/// What came next on the data connection.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    /// A reply: message id and the first command's status.
    Reply(u16, Status),
    /// An event message for this client, with this many entries.
    Events { client: u32, count: usize },
}

fn read_frame(data: &mut TcpStream) -> Frame {
    let mut buf = vec![0u8; DATA_HEADER_LEN];
    data.read_exact(&mut buf).expect("a frame header");
    let (header, len) = peek_data_response_header(&buf).expect("a data frame");
    buf.resize(len, 0);
    data.read_exact(&mut buf[DATA_HEADER_LEN..])
        .expect("the rest of the frame");
    if is_event_message(&header) {
        let m = decode_event_message(&buf).expect("an event message");
        return Frame::Events {
            client: header.client,
            count: m.len(),
        };
    }
    let reply = decode_data_response(&buf).expect("a reply");
    Frame::Reply(header.message_id, reply.result(0).result.status)
}

/// A data connection attached as `first`, with `second` joined on it (a multiplexing
/// client's shape).
fn shared_connection(s: &ServerHandle, first: &Raw, second: &Raw) -> TcpStream {
    let mut data = TcpStream::connect(s.tcp_addr().unwrap()).unwrap();
    data.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = Attach {
        magic: ATTACH_MAGIC,
        client: first.id,
        session: first.session,
    };
    data.write_all(&hello.encode()).unwrap();
    let mut status = [0u8; 4];
    data.read_exact(&mut status).unwrap();
    assert_eq!(u32::from_le_bytes(status), 0, "attached");
    let join = Command::Join(JoinCommand {
        session: second.session,
    });
    data.write_all(&message(second.id, 1, join)).unwrap();
    assert_eq!(read_frame(&mut data), Frame::Reply(1, Status::Success));
    data
}

/// One exclusive RW unlock of `lock`.
fn unlock(lock: u32) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Rw,
        op: LockOp::UnlockExclusive,
        lock,
        ..LockCommand::NONE
    })
}

/// Two clients on one data connection (a multiplexing client's shape): `holder` caches a lock,
/// `other` asks for it. Both requests arrive in one write, so the server reads them in one
/// turn: `other`'s trylock writes a revoke into the holder's ring, and the holder's request
/// behind it must not be answered before that revoke has gone out.
#[test]
fn a_revoke_written_before_a_request_was_read_goes_out_ahead_of_its_reply() {
    let s = common::server(true);
    let holder = raw_client(&s, &[b"page", b"other page"]);
    let other = raw_client(&s, &[b"page"]);
    let mut data = shared_connection(&s, &holder, &other);
    let cached = trylock(holder.locks[0], LockFlags::CACHEABLE);
    data.write_all(&message(holder.id, 2, cached)).unwrap();
    assert_eq!(read_frame(&mut data), Frame::Reply(2, Status::Success));

    let mut both = message(other.id, 3, trylock(other.locks[0], LockFlags::NONE));
    both.extend(message(
        holder.id,
        4,
        trylock(holder.locks[1], LockFlags::NONE),
    ));
    data.write_all(&both).unwrap();
    let frames: Vec<Frame> = (0..3).map(|_| read_frame(&mut data)).collect();
    assert_eq!(
        frames,
        [
            Frame::Reply(3, Status::Fail),
            Frame::Events {
                client: holder.id,
                count: 1
            },
            Frame::Reply(4, Status::Success),
        ],
        "the holder's revoke before the holder's reply"
    );
}

/// With events ahead of replies, a revoke can reach a client before the reply granting what it
/// revokes: a parked request granted by one message of a turn, and revoked by a later one of
/// the same turn, is answered at the end of the turn, after the turn's events. A cached handle
/// reads its events only between its calls, so it acts on the revoke once the grant is
/// recorded, and gives the lock back rather than ignoring a revoke of a lock it did not hold
/// yet (which would keep the other client waiting until the revoke lapsed).
#[test]
fn a_cached_handle_gives_back_a_grant_whose_revoke_came_before_it() {
    let s = common::revoke_server(true);
    let (w, z) = (raw_client(&s, &[b"page"]), raw_client(&s, &[b"page"]));
    let mut data = shared_connection(&s, &w, &z);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mut x = Some(CachedLocks::connect(ClientConfig::new(e)).unwrap());
    let (wl, zl) = (w.locks[0], z.locks[0]);
    let ask = |data: &mut TcpStream, client: u32, cmd: Command| {
        data.write_all(&message(client, 7, cmd)).unwrap();
        read_frame(data)
    };
    for attempt in 0.. {
        assert!(attempt < 20, "x was never parked when w let go");
        assert_eq!(
            ask(&mut data, w.id, trylock(wl, LockFlags::NONE)),
            Frame::Reply(7, Status::Success)
        );
        let locks = x.take().unwrap();
        let waiter = std::thread::spawn(move || {
            let page = locks.rw("page").unwrap();
            let got = page.write(Duration::from_secs(10)).map(drop);
            (locks, got.is_ok())
        });
        // x parks on the server (in slices of `cached::WAIT_SLICE`); w lets go and z asks in
        // one write, so one turn grants x's parked request and then revokes it for z.
        std::thread::sleep(Duration::from_millis(100));
        let mut both = message(w.id, 8, unlock(wl));
        both.extend(message(z.id, 9, trylock(zl, LockFlags::NONE)));
        data.write_all(&both).unwrap();
        assert_eq!(read_frame(&mut data), Frame::Reply(8, Status::Success));
        let z_first = read_frame(&mut data) == Frame::Reply(9, Status::Success);
        if z_first {
            // x was between two slices: z took the lock. Undo, and try again.
            assert_eq!(
                ask(&mut data, z.id, unlock(zl)),
                Frame::Reply(7, Status::Success)
            );
        }
        let (locks, granted) = waiter.join().unwrap();
        assert!(granted, "x is granted the lock");
        if z_first {
            // x caches it now, unasked: w's trylock revokes it, x's next look gives it back.
            while ask(&mut data, w.id, trylock(wl, LockFlags::NONE))
                != Frame::Reply(7, Status::Success)
            {
                let _ = locks.revokes().try_recv().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(
                ask(&mut data, w.id, unlock(wl)),
                Frame::Reply(7, Status::Success)
            );
            x = Some(locks);
            continue;
        }
        // The revoke came first, read with the grant's reply; x's next look acts on it.
        let notice = locks.revokes().try_recv().unwrap();
        assert!(
            matches!(
                notice,
                Some(Revoked::Lock {
                    wanted: Mode::Exclusive,
                    ..
                })
            ),
            "{notice:?}"
        );
        assert_eq!(locks.rw("page").unwrap().held(), None, "given back");
        assert_eq!(
            ask(&mut data, z.id, trylock(zl, LockFlags::NONE)),
            Frame::Reply(7, Status::Success),
            "z gets it without waiting for a lapse"
        );
        return;
    }
}
