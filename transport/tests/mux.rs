//! Many clients of one process over one shared data connection ([`Mux`]): each is served as
//! itself, blocking `lock()`s parked for some do not hold up the others, mutual exclusion holds
//! among them, a connection closed is reopened by the next attach, and the same works under
//! TLS.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::server;
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Mux, Transport};

fn mux_client(e: &Endpoint, mux: &Mux) -> Client {
    Client::connect(ClientConfig::new(e.clone()).with_mux(mux.clone())).expect("registers")
}

/// A client of its own connection beside mux clients: both kinds are served on one server.
#[test]
fn a_client_of_its_own_connection_and_mux_clients_share_a_server() {
    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let mut own = common::client(&e);
    let mut shared = mux_client(&e, &mux);
    let a = own.get_lock(LockKind::Atomic, b"x").unwrap();
    let b = shared.get_lock(LockKind::Atomic, b"x").unwrap();
    assert_eq!(
        own.trylock(a, Mode::Exclusive, 5_000).unwrap().status,
        Status::Success
    );
    assert_eq!(
        shared
            .trylock(b, Mode::Exclusive, 5_000)
            .map(|g| g.status)
            .map_err(Status::from),
        Err(Status::Fail)
    );
}

/// 16 threads, one client each, one connection: private locks cycle, and a contended lock
/// taken with blocking `lock()` is never held by two at once.
#[test]
fn threads_sharing_one_connection_keep_mutual_exclusion_and_are_each_served() {
    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    const THREADS: usize = 16;
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicUsize::new(0));
    let all_in = Arc::new(Barrier::new(THREADS + 1));
    let done = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (e, mux) = (e.clone(), mux.clone());
            let (inside, entries) = (Arc::clone(&inside), Arc::clone(&entries));
            let (all_in, done) = (Arc::clone(&all_in), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut c = mux_client(&e, &mux);
                assert_eq!(c.transport(), Some(Transport::Tcp));
                let own = c
                    .get_lock(LockKind::Atomic, format!("own-{t}").as_bytes())
                    .unwrap();
                let hot = c.get_lock(LockKind::Atomic, b"hot").unwrap();
                all_in.wait();
                for _ in 0..50 {
                    assert_eq!(
                        c.trylock(own, Mode::Exclusive, 10_000).unwrap().status,
                        Status::Success
                    );
                    assert_eq!(c.unlock(own).map_err(Status::from), Ok(Status::Success));
                    let g = c
                        .lock(hot, Mode::Exclusive, 10_000, Duration::from_secs(20))
                        .unwrap();
                    assert_eq!(g.status, Status::Success);
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders of hot");
                    entries.fetch_add(1, Ordering::Relaxed);
                    std::thread::yield_now();
                    inside.store(false, Ordering::SeqCst);
                    assert_eq!(c.unlock(hot).map_err(Status::from), Ok(Status::Success));
                }
                done.wait();
                c.deinit().unwrap();
            })
        })
        .collect();
    all_in.wait();
    assert_eq!(mux.clients(), THREADS, "every client on the one connection");
    done.wait();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(entries.load(Ordering::Relaxed), THREADS * 50);
}

/// When its last client detaches, the shared connection closes; the next client attaching
/// through the same `Mux` opens a new one and is served.
#[test]
fn a_closed_shared_connection_is_reopened_by_the_next_attach() {
    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let a = mux_client(&e, &mux);
    assert_eq!(mux.clients(), 1);
    a.deinit().unwrap();
    assert_eq!(mux.clients(), 0, "a detached client leaves the connection");
    std::thread::sleep(Duration::from_millis(50));
    let mut b = mux_client(&e, &mux);
    let id = b.get_lock(LockKind::Rw, b"after").unwrap();
    assert_eq!(
        b.trylock(id, Mode::Shared, 5_000).unwrap().status,
        Status::Success
    );
    assert_eq!(
        b.atomic64_create(b"xid", 0, 60)
            .map(|_| ())
            .map_err(Status::from),
        Ok(())
    );
}

/// A `Mux` only shares TCP data connections, and only with clients of its own server.
#[test]
fn a_mux_needs_a_tcp_endpoint_of_the_same_server() {
    let local = server(false);
    assert!(Mux::new(&Endpoint::embedded(&local)).is_err());
    let one = server(true);
    let other = server(true);
    let mux = Mux::new(&Endpoint::Tcp(one.tcp_addr().unwrap())).unwrap();
    let cfg = ClientConfig::new(Endpoint::Tcp(other.tcp_addr().unwrap())).with_mux(mux);
    assert!(
        Client::connect(cfg).is_err(),
        "another server's mux is refused"
    );
}

/// Under TLS: clients on one shared connection take and hand over a lock.
#[test]
fn clients_share_a_tls_connection() {
    let (_s, e, _dir) = common::tls_server(
        "mux",
        Config {
            locks_max: 64,
            clients_max: 8,
            objects_max: 8,
            ..Config::default()
        },
    );
    let mux = Mux::new(&e).unwrap();
    let mut a = mux_client(&e, &mux);
    let id = a.get_lock(LockKind::Atomic, b"t").unwrap();
    assert_eq!(
        a.trylock(id, Mode::Exclusive, 10_000).unwrap().status,
        Status::Success
    );
    let (e2, mux2) = (e.clone(), mux.clone());
    let waiter = std::thread::spawn(move || {
        let mut b = mux_client(&e2, &mux2);
        let id = b.get_lock(LockKind::Atomic, b"t").unwrap();
        b.lock(id, Mode::Exclusive, 10_000, Duration::from_secs(10))
            .map(|g| g.status)
    });
    while mux.clients() < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(a.unlock(id).map_err(Status::from), Ok(Status::Success));
    assert_eq!(
        waiter.join().unwrap().map_err(Status::from),
        Ok(Status::Success)
    );
}

/// A waker that counts its wakes.
struct Count(AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Futures of many clients make progress on one thread: no thread per client. A parked
/// `LockWait` stays pending, is woken by the connection's reader when the lock is handed over,
/// and resolves granted.
#[test]
fn lock_futures_of_many_clients_run_on_one_thread_and_are_woken_by_replies() {
    use dlock_transport::client::AsyncOp;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&count));
    let mut cx = Context::from_waker(&waker);

    let mut clients: Vec<Client> = (0..8).map(|_| mux_client(&e, &mux)).collect();
    let ids: Vec<_> = clients
        .iter_mut()
        .enumerate()
        .map(|(k, c)| {
            c.get_lock(LockKind::Atomic, format!("f{k}").as_bytes())
                .unwrap()
        })
        .collect();
    let mut futures: Vec<_> = clients
        .iter_mut()
        .zip(&ids)
        .map(|(c, &id)| Box::pin(c.lock_async(id, AsyncOp::Lock(Mode::Exclusive, 10_000))))
        .collect();
    let mut results = vec![None; futures.len()];
    while results.iter().any(Option::is_none) {
        for (f, r) in futures.iter_mut().zip(results.iter_mut()) {
            if r.is_none()
                && let Poll::Ready(v) = f.as_mut().poll(&mut cx)
            {
                *r = Some(v.map(|g| g.status).map_err(Status::from));
            }
        }
    }
    drop(futures);
    assert!(
        results.iter().all(|r| *r == Some(Ok(Status::Success))),
        "{results:?}"
    );

    // clients[1] waits for clients[0]'s lock without a thread.
    let (first, rest) = clients.split_at_mut(1);
    let hot = rest[0].get_lock(LockKind::Atomic, b"f0").unwrap();
    let wait = AsyncOp::LockWait(Mode::Exclusive, 10_000, Duration::from_secs(10));
    let mut parked = Box::pin(rest[0].lock_async(hot, wait));
    assert!(parked.as_mut().poll(&mut cx).is_pending());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        parked.as_mut().poll(&mut cx).is_pending(),
        "held by clients[0]"
    );
    let before = count.0.load(Ordering::SeqCst);
    assert_eq!(
        first[0].unlock(ids[0]).map_err(Status::from),
        Ok(Status::Success)
    );
    let t = std::time::Instant::now();
    while count.0.load(Ordering::SeqCst) == before {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the reader wakes the task"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    match parked.as_mut().poll(&mut cx) {
        Poll::Ready(r) => assert_eq!(
            r.map(|g| g.status).map_err(Status::from),
            Ok(Status::Success)
        ),
        Poll::Pending => panic!("woken with its reply there"),
    }
}

/// FAA futures of many clients on one thread: every result distinct, the counter at their sum.
#[test]
fn faa_futures_on_one_thread_hand_out_distinct_values() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
    let mut cx = Context::from_waker(&waker);
    let mut clients: Vec<Client> = (0..6).map(|_| mux_client(&e, &mux)).collect();
    let _ = clients[0].atomic64_create(b"xid", 100, 60);
    let objects: Vec<_> = clients
        .iter_mut()
        .map(|c| c.atomic64_get(b"xid", 60).unwrap())
        .collect();
    let mut seen = Vec::new();
    for _round in 0..20 {
        let mut futures: Vec<_> = clients
            .iter_mut()
            .zip(&objects)
            .map(|(c, &o)| Box::pin(c.atomic64_faa_async(o, 1)))
            .collect();
        let mut done = vec![false; futures.len()];
        while done.iter().any(|d| !d) {
            for (f, d) in futures.iter_mut().zip(done.iter_mut()) {
                if !*d && let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    seen.push(v.unwrap());
                    *d = true;
                }
            }
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (100..100 + 120).collect::<Vec<u64>>());
    assert_eq!(
        clients[0]
            .atomic64_snapshot(objects[0])
            .map_err(Status::from),
        Ok(220)
    );
}
