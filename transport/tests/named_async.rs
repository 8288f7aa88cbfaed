//! The native lock API's futures and drops against a real server: guards held across `.await`
//! exclude others, futures run on any executor (here a few lines of std) and are woken by the
//! connection or the timer, a dropped waiting future leaves no grant behind, and dropping a
//! guard sends its unlock without waiting for the reply.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use common::gated::gated_client;
use common::{client, server};
use dlock_core::Status;
use dlock_core::client::LocalState;
use dlock_transport::client::{ClientConfig, Endpoint, ErrorKind, LockOptions, Locks, Mux};
use dlock_transport::runtime::ServerHandle;

const LEASE: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(30);

fn handle(s: &ServerHandle) -> Locks {
    Locks::from(client(&Endpoint::embedded(s)))
}

/// Wakes a parked thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The smallest executor: polls `f` on this thread, parking between wake-ups.
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => thread::park(),
        }
    }
}

/// Resolves once `flag` is set, polled again and again meanwhile (an `.await` point that
/// lasts as long as the test wants).
async fn until(flag: &AtomicBool) {
    std::future::poll_fn(|cx| {
        if flag.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        thread::yield_now();
        Poll::Pending
    })
    .await;
}

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[test]
fn an_async_write_guard_held_across_await_excludes_others() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (ra, rb) = (a.rw("t1").unwrap(), b.rw("t1").unwrap());
    let held = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicBool::new(false));
    let (h, c) = (Arc::clone(&held), Arc::clone(&checked));
    let task = thread::spawn(move || {
        // The future is Send: a multi-threaded executor could move it between awaits.
        block_on(assert_send(async move {
            let guard = ra.write_async(LONG).await?;
            h.store(true, Ordering::SeqCst);
            until(&c).await; // the guard lives across this await
            let token = guard.token();
            guard.unlock_async().await.map(|()| token)
        }))
    });
    let spin = std::time::Instant::now();
    while !held.load(Ordering::SeqCst) {
        assert!(spin.elapsed() < LONG, "the async writer never got the lock");
        thread::yield_now();
    }
    assert!(rb.try_write().unwrap_err().is_would_block());
    assert!(rb.try_read().unwrap_err().is_would_block());
    checked.store(true, Ordering::SeqCst);
    let first = task.join().unwrap().unwrap();
    let next = rb
        .try_write()
        .expect("the async unlock was answered before it resolved");
    assert!(next.token() > first);
}

#[test]
fn async_waits_over_a_shared_connection_are_woken_by_the_reply() {
    let s = server(true);
    let endpoint = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&endpoint).unwrap();
    let cfg = ClientConfig::new(endpoint).with_mux(mux);
    let (a, b) = (
        Locks::connect(cfg.clone()).unwrap(),
        Locks::connect(cfg).unwrap(),
    );
    let (xa, fb) = (a.atomic("x").unwrap(), b.fair("f").unwrap());
    let holder = b.atomic("x").unwrap().try_lock(LEASE).unwrap();
    let fair_holder = a.fair("f").unwrap().try_write(LEASE).unwrap();
    let waiter = thread::spawn(move || {
        block_on(async {
            // An atomic lock waits in slices; a fair one in one request.
            let g = xa
                .lock_async(LockOptions::new(LEASE).with_wait(LONG))
                .await?;
            let f = fb
                .read_async(LockOptions::new(LEASE).with_wait(LONG))
                .await?;
            Ok::<_, dlock_transport::client::Error>((g.token(), f.token()))
        })
    });
    thread::sleep(Duration::from_millis(50));
    let (first, fair_first) = (holder.token(), fair_holder.token());
    holder.unlock().unwrap();
    fair_holder.unlock().unwrap();
    let (got, fair_got) = waiter.join().unwrap().unwrap();
    assert!(got > first && fair_got > fair_first);
}

#[test]
fn an_async_wait_for_a_guard_of_the_same_handle_ends_on_time_or_when_it_goes() {
    let s = server(false);
    let a = handle(&s);
    let x = a.rw("x").unwrap();
    let g = x.try_write().unwrap();
    // No server reply ends this wait: the timer does (without it, nothing would wake the task
    // again, and the answer would never come).
    let (tx, rx) = mpsc::channel();
    let x1 = x.clone();
    thread::spawn(move || tx.send(block_on(x1.write_async(Duration::from_millis(50))).map(drop)));
    let e = rx
        .recv_timeout(LONG)
        .expect("woken at its deadline")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    // And a waiter is woken as soon as the guard goes.
    let x2 = x.clone();
    let waiter = thread::spawn(move || block_on(x2.write_async(LONG)).map(|g| g.token()));
    thread::sleep(Duration::from_millis(50));
    let first = g.token();
    drop(g);
    assert!(waiter.join().unwrap().unwrap() > first);
}

#[test]
fn dropping_a_guard_releases_without_waiting_for_the_reply() {
    let s = server(false);
    let (c, gate) = gated_client(&Endpoint::embedded(&s), LONG);
    let (a, b) = (Locks::from(c), handle(&s));
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    // Three guards more, dropped separately: four unlock messages in flight at once, what the
    // pipeline holds (a fifth drop would read the oldest reply first).
    let guards: Vec<_> = (0..3)
        .map(|i| a.atomic(format!("y{i}")).unwrap().try_lock(LEASE).unwrap())
        .collect();
    let g = xa.try_lock(LEASE).unwrap();
    let first = g.token();
    gate.close();
    // No reply can reach `a` now: a drop that waited for one would be counted (and stuck).
    drop(g);
    drop(guards);
    assert_eq!(gate.waits(), 0, "a drop waited for the server's reply");
    // Yet the server executed the unlock: another client waiting for the lock gets it.
    let taken = xb
        .lock(LockOptions::new(LEASE).with_wait(LONG))
        .expect("released by the drop's unlock");
    assert!(taken.token() > first);
    // `a`'s next call reads the replies the drops left, and then the records agree.
    gate.open();
    a.heartbeat().unwrap();
    let id = xa.id();
    let state = a.with_client(|c| c.local_lock(id).map(|l| l.state));
    assert_eq!(state, Some(LocalState::Unlocked));
}

#[test]
fn a_dropped_wait_future_leaves_no_grant_behind() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (qa, qb) = (a.fair("q").unwrap(), b.fair("q").unwrap());
    let holder = qb.try_write(LEASE).unwrap();
    {
        // One poll sends the request, which waits in the queue on the server; then the future
        // is dropped (a timeout around it, a `select!` that went the other way).
        let mut wait = pin!(qa.write_async(LockOptions::new(LEASE).with_wait(LONG)));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
    }
    // The holder leaves: the server grants the abandoned request, which nobody will hold.
    holder.unlock().unwrap();
    // `a`'s next call finishes the request and gives the grant back.
    a.heartbeat().unwrap();
    let again = qb
        .try_write(LEASE)
        .expect("the grant of the dropped future was given back");
    drop(again);
}

#[test]
fn an_async_unlock_reports_a_lost_grant_as_unlock_does() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let g = xa.try_lock(Duration::from_millis(20)).unwrap();
    thread::sleep(Duration::from_millis(100));
    let _taken = xb.try_lock(LEASE).unwrap();
    let e = block_on(g.unlock_async()).unwrap_err();
    assert_eq!(
        (e.kind(), e.status()),
        (ErrorKind::NotHeld, Status::Fail),
        "{e}"
    );
    assert_eq!(e.operation(), "unlock");
}
