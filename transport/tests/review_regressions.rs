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
    a.trylock(id, Mode::Exclusive, 60_000).unwrap();
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
    victim.trylock(lock, Mode::Exclusive, 60_000).unwrap();
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

fn read_control(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).ok()?;
    let len = dlock_core::proto::control_frame_len(&h).ok()?;
    let mut v = h.to_vec();
    v.resize(len, 0);
    s.read_exact(&mut v[16..]).ok()?;
    Some(v)
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
            while let Some(f) = read_control(&mut ctl) {
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
                            session: 9,
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
        let mut att = [0u8; 16];
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
        got.push(c.trylock(id, Mode::Exclusive, 1000).map(|g| g.status));
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
    holder.trylock(lh, Mode::Exclusive, 60_000).unwrap();
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
                session: 0,
            },
        },
        &mut buf,
    )
    .unwrap();
    raw.write_all(&buf[..n]).unwrap();
    let r = read_control(&mut raw).unwrap();
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
    assert_eq!(holder.unlock(lh), Ok(Status::Success));
    let (r, waited, next) = t.join().unwrap();
    assert!(
        r.is_ok(),
        "the parked lock request was answered: {r:?} after {waited:?}"
    );
    assert!(next.is_ok(), "the connection still serves: {next:?}");
}
