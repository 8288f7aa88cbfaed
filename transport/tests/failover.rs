//! Failover re-claims that go wrong half-way: a client re-claims its locks in batches of 31
//! (`update_all_locks`), and an error after some batches were answered must leave every record
//! it holds where a retry after the next `reinit` finds it.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{client, server};
use dlock_core::proto::{CONTROL_MAGIC, MsgType, control_frame_len, peek_control_header};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::Endpoint;

/// Where [`proxy`] breaks the `cut_at`-th claim batch.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    /// The frame never reaches the server.
    Request,
    /// The server executes the frame; its reply never reaches the client.
    Reply,
}

/// A TCP proxy to `target` that forwards everything, except that it closes the control
/// connection carrying the `cut_at`-th `BatchUpdateLocks` frame (counted from 1), before or
/// after forwarding that frame (`cut`).
fn proxy(target: Arc<Mutex<SocketAddr>>, cut_at: usize, cut: Cut) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    thread::spawn(move || {
        for down in listener.incoming() {
            let Ok(mut down) = down else { return };
            let up = TcpStream::connect(*target.lock().unwrap()).unwrap();
            let seen = seen.clone();
            let (mut up_r, mut down_w) = (up.try_clone().unwrap(), down.try_clone().unwrap());
            thread::spawn(move || {
                let _ = std::io::copy(&mut up_r, &mut down_w);
                let _ = down_w.shutdown(Shutdown::Both);
            });
            thread::spawn(move || {
                let mut up = up;
                let mut first = true;
                loop {
                    let mut frame = vec![0u8; 16];
                    if down.read_exact(&mut frame[..4]).is_err() {
                        return;
                    }
                    if first && u32::from_le_bytes(frame[..4].try_into().unwrap()) != CONTROL_MAGIC
                    {
                        // A data connection: pass it through.
                        up.write_all(&frame[..4]).unwrap();
                        let _ = std::io::copy(&mut down, &mut up);
                        return;
                    }
                    first = false;
                    if down.read_exact(&mut frame[4..]).is_err() {
                        return;
                    }
                    let len = control_frame_len(&frame).unwrap();
                    frame.resize(len, 0);
                    if down.read_exact(&mut frame[16..]).is_err() {
                        return;
                    }
                    let (h, _) = peek_control_header(&frame).unwrap();
                    if h.msg == MsgType::BatchUpdateLocks
                        && seen.fetch_add(1, Ordering::SeqCst) + 1 == cut_at
                    {
                        let _ = down.shutdown(Shutdown::Both);
                        if cut == Cut::Reply {
                            // The client is gone before the reply; the server still executes.
                            let _ = up.write_all(&frame);
                            thread::sleep(std::time::Duration::from_millis(200));
                        }
                        let _ = up.shutdown(Shutdown::Both);
                        return;
                    }
                    if up.write_all(&frame).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// 32 records need two claim batches. The replacement numbers the first 31 from slot 1 (another
/// client's lock took slot 0), so the 31st's new id is the 32nd's old one. The second batch's
/// exchange fails: filing the first batch under its new ids at once would push the 32nd record
/// (and its grant) out; every record must stay under its old id instead.
#[test]
fn a_failed_second_claim_batch_keeps_every_record() {
    let first = server(true);
    let target = Arc::new(Mutex::new(first.tcp_addr().unwrap()));
    // Claim batches: #1 is the other client's, #2 and #3 are c's; #3 is cut.
    let e = Endpoint::Tcp(proxy(target.clone(), 3, Cut::Request));
    let mut c = client(&e);
    for k in 0..32 {
        let id = c
            .get_lock(LockKind::Atomic, format!("n{k:02}").as_bytes())
            .unwrap();
        let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
    }
    let mut other = client(&e);
    let x = other.get_lock(LockKind::Atomic, b"x").unwrap();
    let _ = other.trylock(x, Mode::Exclusive, 60_000).unwrap();
    assert_eq!(c.locks().count(), 32);
    first.stop();

    let second = common::replacement("127.0.0.1:0".parse().unwrap(), 2);
    *target.lock().unwrap() = second.tcp_addr().unwrap();

    assert_eq!(other.reinit().map_err(Status::from), Ok(true));
    other.update_all_locks().unwrap(); // "x" takes slot 0
    assert_eq!(c.reinit().map_err(Status::from), Ok(true));
    assert!(
        c.update_all_locks().is_err(),
        "the second claim batch is cut"
    );
    let held = c
        .locks()
        .filter(|(_, l)| l.state == dlock_transport::client::LocalState::ExclusiveLocked)
        .count();
    assert_eq!(
        (c.locks().count(), held),
        (32, 32),
        "records not yet re-claimed must be kept (to re-claim after the next reinit)"
    );
    // Retried after the next reinit, every record is re-claimed.
    assert_eq!(c.reinit().map_err(Status::from), Ok(true));
    c.update_all_locks().unwrap();
    assert_eq!(c.locks().count(), 32);
    second.stop();
}

/// The first hole, end to end: `update_all_locks` against a server that is not
/// recovering made the client drop every record whose claim was refused, so `unlock` of a lock
/// it still held said `LOCK_NOT_GET` while the server kept the lock. Now the server refuses
/// the call whole and the client keeps every record.
#[test]
fn update_all_locks_on_a_serving_server_keeps_every_record() {
    let s = server(false);
    let mut c = client(&Endpoint::embedded(&s));
    let held = c.get_lock(LockKind::Atomic, b"held").unwrap();
    let _ = c.trylock(held, Mode::Exclusive, 60_000).unwrap();
    let idle = c.get_lock(LockKind::Rw, b"idle").unwrap();
    assert_eq!(
        c.update_all_locks().map_err(Status::from),
        Err(dlock_core::Status::Einval)
    );
    assert_eq!(c.locks().count(), 2);
    assert_eq!(
        c.unlock(held).map_err(Status::from),
        Ok(dlock_core::Status::Success)
    );
    c.release_lock(idle).unwrap();
    s.stop();
}

/// A recovering server refuses a deinit (`NotReady`) and keeps the client and its locks;
/// `try_deinit` keeps the client too, and leaves once the server serves.
#[test]
fn a_refused_deinit_keeps_the_client_until_the_server_serves() {
    let first = server(true);
    let addr = first.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let (mut a, mut b) = (client(&e), client(&e));
    let x = a.get_lock(LockKind::Atomic, b"x").unwrap();
    let _ = a.trylock(x, Mode::Exclusive, 60_000).unwrap();
    first.stop();

    let second = common::replacement(addr, 2);
    assert_eq!(a.reinit().map_err(Status::from), Ok(true));
    a.update_all_locks().unwrap();
    a.reinit_done().unwrap();
    assert_eq!(
        a.try_deinit().map_err(Status::from),
        Err(dlock_core::Status::NotReady),
        "b has not come back"
    );
    assert_eq!(
        a.locks().count(),
        1,
        "the client keeps what the server keeps"
    );
    assert_eq!(b.reinit().map_err(Status::from), Ok(true));
    b.update_all_locks().unwrap();
    b.reinit_done().unwrap();
    a.try_deinit().unwrap();
    assert_eq!(a.locks().count(), 0);
    let x = b.get_lock(LockKind::Atomic, b"x").unwrap();
    let granted = b.trylock(x, Mode::Exclusive, 60_000).unwrap();
    assert_eq!(
        granted.status,
        dlock_core::Status::Success,
        "a's deinit released x"
    );
    second.stop();
}

/// Lost replies never make the client forget a grant the server still holds: an unlock, a
/// pipelined batch of unlocks and an asynchronous unlock whose data path is gone all leave the
/// record locked, and once the client reinits it releases the lock for real.
#[test]
fn a_lost_unlock_reply_keeps_the_grant_until_the_server_answers() {
    use dlock_transport::client::{AsyncOp, LocalState};
    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mut c = client(&e);
    let ids: Vec<_> = [&b"sync"[..], b"batch", b"async"]
        .iter()
        .map(|n| c.get_lock(LockKind::Rw, n).unwrap())
        .collect();
    for &id in &ids {
        let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
    }
    let held = |c: &dlock_transport::client::Client| {
        c.locks()
            .filter(|(_, l)| l.state == LocalState::ExclusiveLocked)
            .count()
    };
    c.drop_data_path();
    assert!(c.unlock(ids[0]).is_err());
    let mut out = vec![Err(dlock_core::Status::Einval); 1];
    let bad = Err(dlock_core::Status::BadResponse);
    assert_eq!(
        c.batch_unlock(&ids[1..2], &mut out).map_err(Status::from),
        bad
    );
    assert_eq!(
        c.lock_request_async(ids[2], AsyncOp::Unlock)
            .map_err(Status::from),
        bad
    );
    assert_eq!(held(&c), 3, "nothing forgotten on a lost reply");
    assert_eq!(
        c.reinit().map_err(Status::from),
        Ok(false),
        "the same server, still serving"
    );
    for &id in &ids {
        assert_eq!(
            c.unlock(id).map_err(Status::from),
            Ok(dlock_core::Status::Success)
        );
    }
    assert_eq!(held(&c), 0);
    s.stop();
}

/// A claim batch the server executed but whose reply was lost, and the recovery ends before
/// the client comes back (the one client the server expected finished first): the client's
/// next reinit still asks for the re-claim, and the server answers it with the new ids of the
/// 31 locks it restored (so none is forgotten while the server holds it), and `Fail` for the
/// 32nd, whose claim it never got (it does not hold that one).
#[test]
fn a_claim_batch_whose_reply_was_lost_is_answered_after_the_recovery_ended() {
    let first = server(true);
    let target = Arc::new(Mutex::new(first.tcp_addr().unwrap()));
    let e = Endpoint::Tcp(proxy(target.clone(), 1, Cut::Reply));
    let mut c = client(&e);
    for k in 0..32 {
        let id = c
            .get_lock(LockKind::Atomic, format!("n{k:02}").as_bytes())
            .unwrap();
        let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
    }
    let mut other = client(&e);
    first.stop();

    let second = common::replacement("127.0.0.1:0".parse().unwrap(), 1);
    *target.lock().unwrap() = second.tcp_addr().unwrap();
    assert_eq!(c.reinit().map_err(Status::from), Ok(true));
    assert!(
        c.update_all_locks().is_err(),
        "the first batch's reply is lost"
    );
    // The batch reached the server (the proxy forwards it after cutting the client off).
    let addr = second.tcp_addr().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while restored(addr) < 31 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cut batch never arrived"
        );
        thread::sleep(std::time::Duration::from_millis(5));
    }
    // The one client the server waits for finishes: it serves without c's second batch.
    assert_eq!(other.reinit().map_err(Status::from), Ok(true));
    other.update_all_locks().unwrap();
    other.reinit_done().unwrap();
    assert_eq!(
        c.reinit().map_err(Status::from),
        Ok(true),
        "the re-claim is not done yet"
    );
    assert_eq!(
        c.get_lock(LockKind::Atomic, b"n00").map_err(Status::from),
        Err(dlock_core::Status::NotReady),
        "no id of the new server while the records carry the old one's"
    );
    c.update_all_locks().unwrap();
    c.reinit_done().unwrap();
    assert_eq!(
        c.locks().count(),
        31,
        "restored ones kept, the unclaimed one forgotten"
    );
    for k in 0..31 {
        let id = c
            .get_lock(LockKind::Atomic, format!("n{k:02}").as_bytes())
            .unwrap();
        assert_eq!(
            c.unlock(id).map_err(Status::from),
            Ok(dlock_core::Status::Success),
            "n{k:02}"
        );
    }
    second.stop();
}

/// The server's `recovery_locks_restored` counter.
fn restored(addr: SocketAddr) -> u64 {
    let timeout = std::time::Duration::from_secs(5);
    dlock_transport::client::read_server_stats(&Endpoint::Tcp(addr), timeout)
        .expect("stats answer")
        .into_iter()
        .find(|(n, _)| *n == "recovery_locks_restored")
        .map_or(0, |(_, v)| v)
}

/// A client that re-claimed from a recovering server and reconnects to it before it serves
/// keeps what it re-claimed, even when its own count says its lease lapsed (a recovering
/// server's `NOT_READY`s renew nothing on the client's side, while the server does count them
/// as signs of life). Found by the simulator (seed 0xb799db5439a43212): the client claimed
/// nothing on that reconnect and forgot a lock the server kept for it.
#[test]
fn a_client_resuming_with_the_server_it_reclaimed_from_keeps_its_locks() {
    let first = server(true);
    let addr = first.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let cfg = dlock_transport::client::ClientConfig::new(e.clone())
        .with_lease(std::time::Duration::from_millis(1_000));
    let mut c = dlock_transport::client::Client::connect(cfg).unwrap();
    let mut other = client(&e);
    let x = c.get_lock(LockKind::Rw, b"x").unwrap();
    let _ = c.trylock(x, Mode::Exclusive, 60_000).unwrap();
    first.stop();

    let second = common::replacement(addr, 2);
    assert_eq!(c.reinit().map_err(Status::from), Ok(true));
    c.update_all_locks().unwrap();
    c.reinit_done().unwrap();
    // Waiting for the other client: every heartbeat is NOT_READY, which the server takes as a
    // sign of life and the client does not count as a renewal.
    for _ in 0..15 {
        assert_eq!(
            c.heartbeat().map_err(Status::from),
            Err(dlock_core::Status::NotReady)
        );
        thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        c.reinit().map_err(Status::from),
        Ok(true),
        "still recovering"
    );
    c.update_all_locks().unwrap();
    c.reinit_done().unwrap();
    let held = c
        .locks()
        .filter(|(_, l)| l.state == dlock_transport::client::LocalState::ExclusiveLocked)
        .count();
    assert_eq!(held, 1, "the re-claimed lock is kept");
    assert_eq!(other.reinit().map_err(Status::from), Ok(true));
    other.update_all_locks().unwrap();
    other.reinit_done().unwrap();
    let x = c.get_lock(LockKind::Rw, b"x").unwrap();
    assert_eq!(
        c.unlock(x).map_err(Status::from),
        Ok(dlock_core::Status::Success)
    );
    second.stop();
}
