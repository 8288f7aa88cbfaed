//! The client's one error type against a real server: every call names itself, a transport
//! failure keeps its I/O error as the source (also where the server cannot be reached at all),
//! and a refusal met through `?` keeps what it meant.

mod common;

use std::error::Error as _;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use common::{client, server};
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Error, ErrorKind, Locks};

/// A loopback address nothing listens on (bound, then let go).
fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
}

/// The I/O error kind behind `e`, which must have one.
fn io_kind(e: &Error) -> io::ErrorKind {
    let source = e.source().expect("the I/O error is the source");
    let io = e.io_error().expect("an I/O error");
    assert_eq!(source.to_string(), io.to_string());
    io.kind()
}

#[test]
fn connecting_to_a_closed_port_is_not_ready_with_the_io_error_as_source() {
    let cfg = ClientConfig::new(Endpoint::Tcp(closed_port()));
    let e = Locks::connect(cfg.clone()).expect_err("nothing listens");
    assert_eq!(e.status(), Status::NotReady, "{e}");
    assert_eq!(e.kind(), ErrorKind::Disconnected);
    assert_eq!(e.operation(), "connect");
    assert_eq!(io_kind(&e), io::ErrorKind::ConnectionRefused, "{e:?}");
    // The reference-shaped client says the same: one connect, one error.
    let e = Client::connect(cfg).expect_err("nothing listens");
    assert_eq!(e, Status::NotReady);
    assert_eq!(io_kind(&e), io::ErrorKind::ConnectionRefused, "{e:?}");
}

#[test]
fn reinit_with_the_server_gone_is_not_ready_with_the_io_error_as_source() {
    let s = server(true);
    let addr = s.tcp_addr().expect("TCP");
    let mut c = client(&Endpoint::Tcp(addr));
    s.stop();
    let e = c.reinit().expect_err("the server is gone");
    assert_eq!(e.status(), Status::NotReady, "{e}");
    assert_eq!(e.operation(), "reinit");
    assert_eq!(io_kind(&e), io::ErrorKind::ConnectionRefused, "{e:?}");
}

/// A caller's own function that mixes calls and lets `?` carry their errors.
fn take(c: &mut Client, name: &[u8]) -> Result<(), Error> {
    let id = c.get_lock(LockKind::Atomic, name)?;
    let _grant = c.trylock(id, Mode::Exclusive, 60_000)?;
    Ok(())
}

#[test]
fn a_busy_lock_met_through_the_question_mark_reads_as_busy_not_as_lost() {
    let s = server(false);
    let e = Endpoint::embedded(&s);
    let (mut a, mut b) = (client(&e), client(&e));
    take(&mut a, b"rg-1").expect("free");
    let busy = take(&mut b, b"rg-1").expect_err("held by a");
    assert_eq!(busy, Status::Fail);
    assert_eq!(busy.operation(), "trylock");
    assert_eq!(busy.kind(), ErrorKind::WouldBlock, "{busy}");
    assert!(busy.source().is_none(), "no transport failure: {busy:?}");
    assert_eq!(
        busy.to_string(),
        "dlock trylock failed: DLOCK_FAIL (0x2006)"
    );
}

#[test]
fn each_call_names_itself_in_its_error() {
    let s = server(false);
    let mut c = client(&Endpoint::embedded(&s));
    let id = c.get_lock(LockKind::Atomic, b"x").unwrap();
    let unlock = c.unlock(id).expect_err("not held");
    assert_eq!(unlock.operation(), "unlock");
    assert_eq!(unlock.kind(), ErrorKind::NotHeld, "{unlock}");
    let extend = c
        .lock_extend(id, Mode::Exclusive, 1_000)
        .expect_err("not held");
    assert_eq!(extend.operation(), "lock_extend");
    let mut out = [Err(Status::Einval); 1];
    let batch = c.batch_trylock(&[], false, &mut out).expect_err("empty");
    assert_eq!(
        (batch.operation(), batch.status()),
        ("batch_trylock", Status::Einval)
    );
    assert_eq!(c.complete(&mut out).unwrap_err().operation(), "complete");
    let check = c.lock_result_check().expect_err("nothing outstanding");
    assert_eq!(
        (check.operation(), check.status()),
        ("lock_result_check", Status::NoAsync)
    );
    let object = c.atomic64_get(b"missing", 60).expect_err("never created");
    assert_eq!(object.operation(), "atomic64_get");
    // A wait that runs out is a timeout of the `lock` call, whatever carried it.
    let mut other = client(&Endpoint::embedded(&s));
    let held = other.get_lock(LockKind::Atomic, b"x").unwrap();
    let _grant = other.trylock(held, Mode::Exclusive, 60_000).unwrap();
    let waited = c
        .lock(id, Mode::Exclusive, 1_000, Duration::from_millis(20))
        .expect_err("held by the other");
    assert_eq!(
        (waited.operation(), waited.kind()),
        ("lock", ErrorKind::TimedOut)
    );
}
