//! The native API allocates nothing to take, drop and unlock guards once a handle is warm: a
//! counting global allocator sees zero allocations, in the whole process, across a window of
//! blocking and async takes, drops (an unlock sent, its answer read by the next call),
//! explicit and async unlocks and extends, over shared memory and over TCP.
//!
//! What the native API does allocate is said in its module doc (`client::named`): a handle per
//! name resolved, a set's list of entries, a waker clone for a future that finds the client or a
//! lock of its own handle busy, and the bookkeeping's growth up to the number of guards out at
//! once. None of those is inside the window.
//!
//! The count is process-wide, so this file holds one test and installs no log subscriber, as
//! `zero_alloc_runtime.rs` does. It fails as it should: a `Vec::<u8>::with_capacity(1)` in
//! `Locks::let_go` (a guard's drop) makes it report them (checked by doing that).

use std::sync::Arc;
use std::task::Waker;
use std::thread;
use std::time::Duration;

use dlock_core::Config;
use dlock_tests::counting::{Counting, Unpark, allocations, block_on};
use dlock_transport::client::{
    AtomicLock, ClientConfig, Endpoint, FairLock, LockOptions, Locks, RwLock,
};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

// The counting allocator the zero-allocation tests share (`dlock_tests::counting`).
#[global_allocator]
static GLOBAL: Counting = Counting;

/// One handle's workload.
struct Work {
    rw: RwLock,
    atomic: AtomicLock,
    fair: FairLock,
    _locks: Locks,
}

const LEASE: Duration = Duration::from_secs(30);

impl Work {
    fn new(endpoint: Endpoint, tag: &str) -> Work {
        let locks = Locks::connect(ClientConfig::new(endpoint)).expect("registers");
        Work {
            rw: locks.rw(format!("rw/{tag}")).unwrap(),
            atomic: locks.atomic(format!("atomic/{tag}")).unwrap(),
            fair: locks.fair(format!("fair/{tag}")).unwrap(),
            _locks: locks,
        }
    }

    /// One round of every guard path; panics on any failure.
    fn round(&self, waker: &Waker) {
        drop(self.rw.try_write().unwrap());
        self.rw
            .read(Duration::from_secs(1))
            .unwrap()
            .unlock()
            .unwrap();
        let mut g = self.atomic.try_lock(LEASE).unwrap();
        g.extend(LEASE).unwrap();
        g.unlock().unwrap();
        let opts = LockOptions::new(LEASE).with_wait(Duration::from_secs(1));
        drop(self.fair.write(opts).unwrap());
        block_on(waker, async {
            let w = self.rw.write_async(Duration::from_secs(1)).await.unwrap();
            w.unlock_async().await.unwrap();
            drop(self.atomic.lock_async(opts).await.unwrap());
        });
    }
}

#[test]
fn taking_and_dropping_guards_allocates_nothing_once_warm() {
    let mut cfg = ServerConfig::new(Config {
        locks_max: 1_024,
        clients_max: 16,
        objects_max: 16,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let server = ServerHandle::start(cfg).expect("server starts");
    let addr = server.tcp_addr().unwrap();
    let shm = Work::new(Endpoint::embedded(&server), "shm");
    let tcp = Work::new(Endpoint::Tcp(addr), "tcp");
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    // Warm up: every buffer, table page and bookkeeping map has its size after this.
    for _ in 0..100 {
        shm.round(&waker);
        tcp.round(&waker);
    }
    thread::sleep(Duration::from_millis(200));

    let before = allocations();
    for _ in 0..500 {
        shm.round(&waker);
        tcp.round(&waker);
    }
    let allocations = allocations() - before;
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in 1,000 rounds of the native API's guard paths"
    );
}
