//! Many clients of one process over one shared connection ([`Mux`]): each is served as itself,
//! blocking `lock()`s parked for some do not hold up the others, mutual exclusion holds among
//! them, blocked callers and futures mixed are all served (whoever waits reads), a connection
//! closed is reopened by the next attach, control frames go over the shared connection (a
//! thousand members, two sockets; registration, heartbeat, reinit, deinit), and the same works
//! under TLS.

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

/// Blocking callers on their own threads and futures on one executor thread share one
/// connection: whoever waits reads for the others (a blocked caller for the futures too, the
/// standby thread when no caller reads), and every fetch-and-add of either kind hands out a
/// value nobody else got.
#[test]
fn blocking_callers_and_futures_mixed_on_one_connection_are_all_served() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    const THREADS: usize = 6;
    const ROUNDS: usize = 40;
    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let mut first = mux_client(&e, &mux);
    first.atomic64_create(b"xid", 0, 60).unwrap();
    let start = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (e, mux, start) = (e.clone(), mux.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut c = mux_client(&e, &mux);
                let xid = c.atomic64_get(b"xid", 60).unwrap();
                let own = c
                    .get_lock(LockKind::Atomic, format!("m{t}").as_bytes())
                    .unwrap();
                start.wait();
                let mut got = Vec::new();
                for _ in 0..ROUNDS {
                    got.push(c.atomic64_faa(xid, 1).unwrap());
                    assert_eq!(
                        c.trylock(own, Mode::Exclusive, 5_000).unwrap().status,
                        Status::Success
                    );
                    assert_eq!(c.unlock(own).map_err(Status::from), Ok(Status::Success));
                }
                c.deinit().unwrap();
                got
            })
        })
        .collect();
    let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
    let mut cx = Context::from_waker(&waker);
    let mut tasks: Vec<Client> = (0..4).map(|_| mux_client(&e, &mux)).collect();
    let xids: Vec<_> = tasks
        .iter_mut()
        .map(|c| c.atomic64_get(b"xid", 60).unwrap())
        .collect();
    start.wait();
    let mut seen = Vec::new();
    for _ in 0..ROUNDS {
        let mut futures: Vec<_> = tasks
            .iter_mut()
            .zip(&xids)
            .map(|(c, &o)| Box::pin(c.atomic64_faa_async(o, 1)))
            .collect();
        let mut done = vec![false; futures.len()];
        let t = std::time::Instant::now();
        while done.iter().any(|d| !d) {
            assert!(t.elapsed() < Duration::from_secs(20), "futures stalled");
            for (f, d) in futures.iter_mut().zip(done.iter_mut()) {
                if !*d && let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    seen.push(v.unwrap());
                    *d = true;
                }
            }
        }
    }
    for t in threads {
        seen.extend(t.join().unwrap());
    }
    let total = (THREADS + 4) * ROUNDS;
    seen.sort_unstable();
    assert_eq!(seen, (0..total as u64).collect::<Vec<u64>>());
    let xid = first.atomic64_get(b"xid", 60).unwrap();
    assert_eq!(
        first.atomic64_snapshot(xid).map_err(Status::from),
        Ok(total as u64)
    );
}

/// An asynchronous lock request polled with `lock_result_check` and no other client waiting:
/// nobody reads the connection but the poller, whose look at it (a deadline already passed)
/// reads the reply when the lock is handed over.
#[test]
fn a_polled_request_is_read_by_its_poller_when_nobody_else_reads() {
    use dlock_transport::client::AsyncOp;

    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let mut holder = common::client(&e);
    let mut poller = mux_client(&e, &mux);
    let held = holder.get_lock(LockKind::Atomic, b"p").unwrap();
    let id = poller.get_lock(LockKind::Atomic, b"p").unwrap();
    assert_eq!(
        holder
            .trylock(held, Mode::Exclusive, 10_000)
            .unwrap()
            .status,
        Status::Success
    );
    let wait = AsyncOp::LockWait(Mode::Exclusive, 10_000, Duration::from_secs(10));
    poller.lock_request_async(id, wait).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        poller
            .lock_result_check()
            .map(|g| g.status)
            .map_err(Status::from),
        Err(Status::AsyncAgain),
        "held by the other client"
    );
    assert_eq!(
        holder.unlock(held).map_err(Status::from),
        Ok(Status::Success)
    );
    let t = std::time::Instant::now();
    let granted = loop {
        match poller
            .lock_result_check()
            .map(|g| g.status)
            .map_err(Status::from)
        {
            Err(Status::AsyncAgain) => {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "the reply was never read"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            other => break other,
        }
    };
    assert_eq!(granted, Ok(Status::Success));
}

/// Established TCP connections to port `port` on the loopback, counted at one end: the client
/// ends (`/proc/net/tcp` rows whose remote port is `port`) or, with `server_end`, the server's
/// (whose local port is `port`; the listener is not established).
fn established(port: u16, server_end: bool) -> usize {
    let field = if server_end { 1 } else { 2 };
    let table = std::fs::read_to_string("/proc/net/tcp").expect("Linux's TCP table");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let at_port = f
                .get(field)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            at_port == Some(port) && f.get(3) == Some(&"01")
        })
        .count()
}

/// Established TCP connections from this process's clients to port `port`.
fn sockets_to(port: u16) -> usize {
    established(port, false)
}

/// Counter `name` of `stats`.
fn counter(stats: &[(&'static str, u64)], name: &str) -> u64 {
    stats.iter().find(|(n, _)| *n == name).expect("a counter").1
}

/// A thousand clients on one `Mux` (the C ABI's layout at a thousand worker threads) cost the
/// server two connections, however many join: the first client's control connection and the
/// shared one. Every member's registration, heartbeat and lock names go over the shared one.
#[test]
fn a_thousand_members_cost_the_server_two_connections() {
    const MEMBERS: usize = 1_000;
    let cfg = Config {
        locks_max: 256,
        clients_max: MEMBERS as u32,
        objects_max: 16,
        clients_per_peer_max: MEMBERS as u32,
        ..Config::default()
    };
    let mut server_cfg = dlock_transport::runtime::ServerConfig::new(cfg);
    server_cfg.tcp = Some(dlock_transport::runtime::TcpConfig::new(
        "127.0.0.1:0".parse().unwrap(),
    ));
    let s = dlock_transport::runtime::ServerHandle::start(server_cfg).unwrap();
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mux = Mux::new(&e).unwrap();
    let mut members = vec![mux_client(&e, &mux)];
    assert_eq!(established(addr.port(), true), 2, "the first member's two");
    members.extend((1..MEMBERS).map(|_| mux_client(&e, &mux)));
    assert_eq!(mux.clients(), MEMBERS);
    for (k, m) in members.iter_mut().enumerate() {
        m.heartbeat().unwrap();
        if k % 100 == 0 {
            let id = m.get_lock(LockKind::Rw, b"shared").unwrap();
            assert_eq!(
                m.trylock(id, Mode::Shared, 5_000).unwrap().status,
                Status::Success
            );
        }
    }
    let stats = members[MEMBERS - 1].server_stats().unwrap();
    assert_eq!(counter(&stats, "clients_registered"), MEMBERS as u64);
    assert_eq!(established(addr.port(), true), 2, "server ends");
    assert_eq!(sockets_to(addr.port()), 2, "client ends");
}

/// A member's control operations over the shared connection: a heartbeat, a reinit (which
/// registers it again over the shared connection, keeping its locks), a deinit (the server
/// releases what it held). None opens a socket.
#[test]
fn a_members_heartbeat_reinit_and_deinit_go_over_the_shared_connection() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mux = Mux::new(&e).unwrap();
    let mut first = mux_client(&e, &mux);
    let mut member = mux_client(&e, &mux);
    assert_eq!(sockets_to(addr.port()), 2);
    let id = member.get_lock(LockKind::Atomic, b"held").unwrap();
    assert_eq!(
        member.trylock(id, Mode::Exclusive, 60_000).unwrap().status,
        Status::Success
    );
    member.heartbeat().unwrap();
    assert_eq!(member.reinit().map_err(Status::from), Ok(false));
    assert_eq!(mux.clients(), 2, "still a member, once");
    let other = first.get_lock(LockKind::Atomic, b"held").unwrap();
    assert_eq!(
        first
            .trylock(other, Mode::Exclusive, 60_000)
            .map(|g| g.status)
            .map_err(Status::from),
        Err(Status::Fail),
        "the reinit kept the member's grant"
    );
    member.heartbeat().unwrap();
    assert_eq!(sockets_to(addr.port()), 2, "no socket opened");
    let deinits = counter(&first.server_stats().unwrap(), "clients_deinit");
    member.deinit().unwrap();
    assert_eq!(
        counter(&first.server_stats().unwrap(), "clients_deinit"),
        deinits + 1
    );
    assert_eq!(mux.clients(), 1);
    assert_eq!(
        first
            .trylock(other, Mode::Exclusive, 60_000)
            .unwrap()
            .status,
        Status::Success,
        "the deinit released the grant"
    );
    assert_eq!(sockets_to(addr.port()), 2);
}

/// A hundred workers of one process, each its own client on one `Mux`: the first registers over
/// a control connection of its own and opens the shared connection; the other 99 register over
/// the shared connection, and all of them send their control frames (heartbeats, lock names)
/// and data messages over it, from a thread each at once. Two sockets in all; one after the
/// first worker leaves, and a newcomer still registers over the shared one.
#[test]
fn a_hundred_workers_register_and_heartbeat_over_two_sockets() {
    const WORKERS: usize = 100;
    let cfg = Config {
        locks_max: 256,
        clients_max: 128,
        objects_max: 16,
        clients_per_peer_max: 128,
        ..Config::default()
    };
    let mut server_cfg = dlock_transport::runtime::ServerConfig::new(cfg);
    server_cfg.tcp = Some(dlock_transport::runtime::TcpConfig::new(
        "127.0.0.1:0".parse().unwrap(),
    ));
    let s = dlock_transport::runtime::ServerHandle::start(server_cfg).unwrap();
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mux = Mux::new(&e).unwrap();
    let first = mux_client(&e, &mux);
    assert_eq!(sockets_to(addr.port()), 2);
    let start = Arc::new(Barrier::new(WORKERS));
    let workers: Vec<_> = (1..WORKERS)
        .map(|k| {
            let (e, mux, start) = (e.clone(), mux.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut c = mux_client(&e, &mux);
                start.wait();
                for _ in 0..5 {
                    c.heartbeat().unwrap();
                }
                let id = c
                    .get_lock(LockKind::Atomic, format!("w{k}").as_bytes())
                    .unwrap();
                assert_eq!(
                    c.trylock(id, Mode::Exclusive, 5_000).unwrap().status,
                    Status::Success
                );
                assert_eq!(c.unlock(id).map_err(Status::from), Ok(Status::Success));
                c
            })
        })
        .collect();
    start.wait();
    let mut workers: Vec<Client> = workers.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(mux.clients(), WORKERS);
    assert_eq!(
        sockets_to(addr.port()),
        2,
        "the first worker's control connection and the shared one"
    );
    first.deinit().unwrap();
    let mut late = mux_client(&e, &mux);
    late.heartbeat().unwrap();
    workers[0].heartbeat().unwrap();
    let t = std::time::Instant::now();
    while sockets_to(addr.port()) != 1 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the first worker's socket stays"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(mux.clients(), WORKERS);
    for w in workers {
        w.deinit().unwrap();
    }
    late.deinit().unwrap();
}

/// A member that registered over the shared connection sends the largest control frame there
/// is over it — 31 lock names of 512 bytes, more than a data connection's read buffer holds
/// (the server grows it once) — and the names it got serve its data messages.
#[test]
fn the_largest_control_frame_goes_over_the_shared_connection() {
    let s = server(true);
    let e = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mux = Mux::new(&e).unwrap();
    let _first = mux_client(&e, &mux);
    let mut member = mux_client(&e, &mux);
    let names: Vec<Vec<u8>> = (0..31u8).map(|k| vec![b'a' + k % 26; 512]).collect();
    let names: Vec<Vec<u8>> = names
        .into_iter()
        .enumerate()
        .map(|(k, mut n)| {
            n[..2].copy_from_slice(&(k as u16).to_le_bytes());
            n
        })
        .collect();
    let req: Vec<(LockKind, &[u8])> = names
        .iter()
        .map(|n| (LockKind::Atomic, n.as_slice()))
        .collect();
    let ids = member.batch_get_lock(&req).unwrap();
    assert_eq!(ids.len(), 31);
    for id in ids {
        let id = id.unwrap();
        assert_eq!(
            member.trylock(id, Mode::Exclusive, 5_000).unwrap().status,
            Status::Success
        );
    }
    member.heartbeat().unwrap();
}

/// The server closes a shared connection left with no member — here, the first client left and
/// the other's lease ran out — while this process still holds it and nobody reads it yet. A
/// client registering next does not fail on it: it registers over a connection of its own, as
/// the first client does, and opens a new shared connection; the one after it registers over
/// that.
#[test]
fn a_registration_that_finds_the_shared_connection_closed_registers_anew() {
    let s = server(true);
    let addr = s.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    let mux = Mux::new(&e).unwrap();
    let first = mux_client(&e, &mux);
    let short = ClientConfig::new(e.clone())
        .with_mux(mux.clone())
        .with_lease(Duration::from_millis(100));
    let _lapsed = Client::connect(short).unwrap();
    first.deinit().unwrap();
    let t = std::time::Instant::now();
    while sockets_to(addr.port()) != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the server keeps the shared connection"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut next = mux_client(&e, &mux);
    let mut after = mux_client(&e, &mux);
    assert_eq!(
        sockets_to(addr.port()),
        2,
        "a control connection, a shared one"
    );
    for c in [&mut next, &mut after] {
        c.heartbeat().unwrap();
        let id = c.get_lock(LockKind::Rw, b"anew").unwrap();
        assert_eq!(
            c.trylock(id, Mode::Shared, 5_000).unwrap().status,
            Status::Success
        );
    }
}
