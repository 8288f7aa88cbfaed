//! Lock value blocks end to end, over shared memory, TCP and a shared TCP connection (`Mux`):
//! a block written by an exclusive unlock is what the next grant reads (single calls,
//! batches, asynchronous calls), a holder lost without writing leaves it invalid, and a block
//! longer than 32 bytes is refused before anything is sent.

mod common;

use std::time::Duration;

use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::{Config, LockId, LockKind, Mode, Status};
use dlock_transport::client::{AsyncOp, Client, ClientConfig, Endpoint, Grant, Locks, Mux};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

/// A server with a short client lease (a dropped client is declared dead soon), on TCP too.
fn server() -> ServerHandle {
    let mut cfg = ServerConfig::new(Config {
        client_lease_ms: 200,
        ..common::small()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().expect("address")));
    ServerHandle::start(cfg).expect("server starts")
}

/// Two clients of `s` reached one way: shared memory, TCP, or TCP through one `Mux`.
#[derive(Clone, Copy, Debug)]
enum Way {
    Shm,
    Tcp,
    Mux,
}

const WAYS: [Way; 3] = [Way::Shm, Way::Tcp, Way::Mux];

fn pair(s: &ServerHandle, way: Way) -> (Client, Client) {
    let tcp = Endpoint::Tcp(s.tcp_addr().expect("tcp"));
    match way {
        Way::Shm => {
            let e = Endpoint::embedded(s);
            (common::client(&e), common::client(&e))
        }
        Way::Tcp => (common::client(&tcp), common::client(&tcp)),
        Way::Mux => {
            let mux = Mux::new(&tcp).expect("mux");
            let c = || {
                Client::connect(ClientConfig::new(tcp.clone()).with_mux(mux.clone()))
                    .expect("registers")
            };
            (c(), c())
        }
    }
}

/// `lock_request_async` on `id`, then `lock_result_check` until it is answered.
fn run_async(c: &mut Client, id: LockId, op: AsyncOp) -> Result<Grant, Status> {
    c.lock_request_async(id, op).map_err(Status::from)?;
    loop {
        match c.lock_result_check() {
            Err(e) if e == Status::AsyncAgain => std::thread::yield_now(),
            r => return r.map_err(Status::from),
        }
    }
}

fn block(b: u8) -> [u8; 32] {
    [b; 32]
}

fn read(b: u8, seq: u32, valid: bool) -> Option<ValueRead> {
    Some(ValueRead {
        block: ValueBlock(block(b)),
        seq,
        valid,
    })
}

#[test]
fn a_block_written_by_an_exclusive_unlock_is_read_by_the_next_grant() {
    let s = server();
    for way in WAYS {
        let (mut a, mut b) = pair(&s, way);
        let name = format!("page-{way:?}");
        let (la, lb) = (
            a.get_lock(LockKind::Rw, name.as_bytes()).unwrap(),
            b.get_lock(LockKind::Rw, name.as_bytes()).unwrap(),
        );
        a.set_value_blocks(la, true).unwrap();
        b.set_value_blocks(lb, true).unwrap();
        let g = a.trylock(la, Mode::Exclusive, 5_000).unwrap();
        assert_eq!(g.value, read(0, 0, true), "{way:?}: a new lock's block");
        assert_eq!(a.unlock_with_value(la, &block(7)).unwrap(), Status::Success);
        let g = b.trylock(lb, Mode::Shared, 5_000).unwrap();
        assert_eq!(g.value, read(7, 1, true), "{way:?}: the block written");
        // A reader cannot write: refused locally, and the shared unlock proceeds without one.
        assert_eq!(b.stage_value(lb, &block(9)).unwrap_err(), Status::Einval);
        let _ = b.unlock(lb).unwrap();
        // A client that does not ask gets no block, and its grants change nothing.
        a.set_value_blocks(la, false).unwrap();
        assert_eq!(a.trylock(la, Mode::Exclusive, 5_000).unwrap().value, None);
        let _ = a.unlock(la).unwrap();
        let g = b.trylock(lb, Mode::Exclusive, 5_000).unwrap();
        assert_eq!(
            g.value,
            read(7, 1, true),
            "{way:?}: a silent unlock keeps it"
        );
        let _ = b.unlock(lb).unwrap();
    }
}

#[test]
fn batches_and_asynchronous_calls_carry_blocks_both_ways() {
    let s = server();
    for way in WAYS {
        let (mut a, mut b) = pair(&s, way);
        let names = [0u8, 1, 2].map(|i| format!("rg-{way:?}-{i}"));
        let ids = names
            .clone()
            .map(|n| a.get_lock(LockKind::Fair, n.as_bytes()).unwrap());
        let theirs = names.map(|n| b.get_lock(LockKind::Fair, n.as_bytes()).unwrap());
        // Only the first two ask.
        for (&x, &y) in ids.iter().zip(&theirs).take(2) {
            a.set_value_blocks(x, true).unwrap();
            b.set_value_blocks(y, true).unwrap();
        }
        let reqs = ids.map(|id| (id, Mode::Exclusive, 5_000));
        let mut out = [Err(Status::Einval); 3];
        a.batch_trylock(&reqs, true, &mut out).unwrap();
        let values = out.map(|r| r.unwrap().value);
        assert_eq!(
            values,
            [read(0, 0, true), read(0, 0, true), None],
            "{way:?}"
        );
        // The second and third write; the third does not ask, so no one reads its block here.
        a.stage_value(ids[1], &block(2)).unwrap();
        a.stage_value(ids[2], &block(3)).unwrap();
        a.batch_unlock(&ids, &mut out).unwrap();
        assert!(out.iter().all(Result::is_ok), "{way:?}: {out:?}");
        // Pipelined: the grant's reply carries the blocks.
        let theirs_reqs = theirs.map(|id| (id, Mode::Shared, 5_000));
        b.submit_trylock(&theirs_reqs, false).unwrap();
        assert_eq!(b.complete(&mut out).unwrap(), 3);
        let values = out.map(|r| r.unwrap().value);
        assert_eq!(
            values,
            [read(0, 0, true), read(2, 1, true), None],
            "{way:?}"
        );
        let mut unlocked = [Err(Status::Einval); 3];
        b.batch_unlock(&theirs, &mut unlocked).unwrap();
        // Asynchronous: a staged block goes with an asynchronous unlock too.
        let g = run_async(&mut a, ids[0], AsyncOp::Lock(Mode::Exclusive, 5_000));
        assert_eq!(g.unwrap().value, read(0, 0, true), "{way:?}");
        a.stage_value(ids[0], &block(5)).unwrap();
        let _ = run_async(&mut a, ids[0], AsyncOp::Unlock).unwrap();
        let g = b.trylock(theirs[0], Mode::Exclusive, 5_000).unwrap();
        assert_eq!(g.value, read(5, 1, true), "{way:?}");
        let _ = b.unlock(theirs[0]).unwrap();
    }
}

#[test]
fn a_block_longer_than_32_bytes_is_refused_and_nothing_is_unlocked() {
    let s = server();
    for way in WAYS {
        let (mut a, mut b) = pair(&s, way);
        let name = format!("long-{way:?}");
        let la = a.get_lock(LockKind::Atomic, name.as_bytes()).unwrap();
        let lb = b.get_lock(LockKind::Atomic, name.as_bytes()).unwrap();
        b.set_value_blocks(lb, true).unwrap();
        let _ = a.trylock(la, Mode::Exclusive, 5_000).unwrap();
        let refused = a.unlock_with_value(la, &[1; 33]).unwrap_err();
        assert_eq!(refused.status(), Status::Einval, "{way:?}");
        assert_eq!(
            b.trylock(lb, Mode::Exclusive, 5_000).unwrap_err(),
            Status::Fail,
            "{way:?}: still held"
        );
        // A shorter block is zero-padded.
        let _ = a.unlock_with_value(la, &[4; 8]).unwrap();
        let g = b.trylock(lb, Mode::Exclusive, 5_000).unwrap();
        let mut padded = [0; 32];
        padded[..8].fill(4);
        assert_eq!(g.value.map(|v| v.block), Some(ValueBlock(padded)));
        let _ = b.unlock(lb).unwrap();
    }
}

/// An exclusive holder whose connection goes (its client dropped without a deinit) dies at
/// its lease; the next grant reads the block invalid, with the bytes last written kept, until
/// an exclusive holder writes again.
#[test]
fn an_exclusive_holder_lost_with_its_connection_leaves_the_block_invalid() {
    let s = server();
    for way in WAYS {
        let (mut a, mut b) = pair(&s, way);
        let name = format!("lost-{way:?}");
        let la = a.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        let lb = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        b.set_value_blocks(lb, true).unwrap();
        let _ = a.trylock(la, Mode::Exclusive, 5_000).unwrap();
        let _ = a.unlock_with_value(la, &block(6)).unwrap();
        let _ = a.trylock(la, Mode::Exclusive, 5_000).unwrap();
        drop(a);
        let g = b
            .lock(lb, Mode::Exclusive, 5_000, Duration::from_secs(10))
            .unwrap();
        assert_eq!(g.value, read(6, 1, false), "{way:?}");
        let _ = b.unlock_with_value(lb, &block(8)).unwrap();
        let g = b.trylock(lb, Mode::Shared, 5_000).unwrap();
        assert_eq!(g.value, read(8, 2, true), "{way:?}: written again, valid");
        let _ = b.unlock(lb).unwrap();
    }
}

/// An atomic grant whose own lease ran out and was taken over: its holder may have written
/// what the block describes, so the taker reads it invalid.
#[test]
fn an_expired_exclusive_grant_taken_over_leaves_the_block_invalid() {
    let s = common::server(true);
    let (mut a, mut b) = pair(&s, Way::Tcp);
    let la = a.get_lock(LockKind::Atomic, b"expiring").unwrap();
    let lb = b.get_lock(LockKind::Atomic, b"expiring").unwrap();
    b.set_value_blocks(lb, true).unwrap();
    let _ = a.trylock(la, Mode::Exclusive, 20).unwrap();
    let g = b
        .lock(lb, Mode::Exclusive, 5_000, Duration::from_secs(10))
        .unwrap();
    assert_eq!(g.value, read(0, 0, false));
}

/// The native API: a write guard's `set_value` is written when it is dropped or unlocked
/// (blocking or async), and every guard of a lock that asks returns the block.
#[test]
fn native_guards_read_the_block_and_write_guards_write_it_when_they_go() {
    let s = server();
    for way in [Way::Shm, Way::Tcp] {
        let (a, b) = pair(&s, way);
        let (a, b) = (Locks::from(a), Locks::from(b));
        let name = format!("native-{way:?}");
        let (wa, rb) = (a.rw(&name).unwrap(), b.rw(&name).unwrap());
        wa.set_value_blocks(true).unwrap();
        rb.set_value_blocks(true).unwrap();
        let mut w = wa.try_write().unwrap();
        assert_eq!(w.value(), read(0, 0, true), "{way:?}");
        w.set_value(&block(1));
        drop(w);
        let r = rb.read(Duration::from_secs(5)).unwrap();
        assert_eq!(r.value(), read(1, 1, true), "{way:?}: written by the drop");
        r.unlock().unwrap();
        let mut w = wa.try_write().unwrap();
        w.set_value(&block(2));
        w.unlock().unwrap();
        let r = rb.try_read().unwrap();
        assert_eq!(r.value(), read(2, 2, true), "{way:?}");
        // Unlocked and answered before `a` asks: a dropped guard's unlock is sent at once but
        // not waited for, and another client's request may reach the server before it.
        r.unlock().unwrap();
        // An unlock without a `set_value` leaves the block; a handle that stops asking gets none.
        wa.try_write().unwrap().unlock().unwrap();
        rb.set_value_blocks(false).unwrap();
        assert_eq!(rb.try_read().unwrap().value(), None, "{way:?}");
        let f = a.fair(format!("native-fair-{way:?}")).unwrap();
        f.set_value_blocks(true).unwrap();
        let lease = Duration::from_secs(5);
        let mut w = f.try_write(lease).unwrap();
        w.set_value(&block(3));
        run_blocking(w.unlock_async()).unwrap();
        assert_eq!(
            f.try_read(lease).unwrap().value(),
            read(3, 1, true),
            "{way:?}"
        );
    }
}

/// Polls `f` to completion on this thread (the futures of this crate need no runtime).
fn run_blocking<F: std::future::Future>(f: F) -> F::Output {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

/// After a server failover a lock's block comes back valid only from a holder's re-claim that
/// kept a copy; a lock nobody held (or held without asking for blocks) reads invalid.
#[test]
fn after_a_failover_blocks_come_back_only_from_reclaiming_holders() {
    let first = common::server(true);
    let addr = first.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let (mut a, mut b) = (common::client(&e), common::client(&e));
    let kept = a.get_lock(LockKind::Rw, b"kept").unwrap();
    let lost = b.get_lock(LockKind::Rw, b"lost").unwrap();
    let blind = a.get_lock(LockKind::Rw, b"blind").unwrap();
    a.set_value_blocks(kept, true).unwrap();
    b.set_value_blocks(lost, true).unwrap();
    let _ = a.trylock(kept, Mode::Exclusive, 60_000).unwrap();
    let _ = a.unlock_with_value(kept, &block(7)).unwrap();
    let g = a.trylock(kept, Mode::Shared, 60_000).unwrap();
    assert_eq!(g.value, read(7, 1, true), "a keeps a copy with its grant");
    let _ = b.trylock(lost, Mode::Exclusive, 60_000).unwrap();
    let _ = b.unlock_with_value(lost, &block(8)).unwrap();
    // Held, but without asking: its claim offers no copy.
    let _ = a.trylock(blind, Mode::Exclusive, 60_000).unwrap();
    first.stop();

    let second = common::replacement(addr, 2);
    for c in [&mut a, &mut b] {
        assert_eq!(c.reinit().map_err(Status::from), Ok(true));
        c.update_all_locks().unwrap();
        c.reinit_done().unwrap();
    }
    let kept = a.get_lock(LockKind::Rw, b"kept").unwrap();
    let blind = a.get_lock(LockKind::Rw, b"blind").unwrap();
    let _ = a.unlock(kept).unwrap();
    let _ = a.unlock(blind).unwrap();
    for (name, want) in [
        (&b"kept"[..], read(7, 1, true)),
        (b"lost", read(0, 0, false)),
        (b"blind", read(0, 0, false)),
    ] {
        let id = b.get_lock(LockKind::Rw, name).unwrap();
        b.set_value_blocks(id, true).unwrap();
        let g = b.trylock(id, Mode::Shared, 60_000).unwrap();
        assert_eq!(g.value, want, "{}", String::from_utf8_lossy(name));
        let _ = b.unlock(id).unwrap();
    }
    second.stop();
}
