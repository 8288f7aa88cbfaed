//! The running server and its clients allocate nothing on the data path once warmed up: a
//! counting global allocator sees zero allocations, in the whole process, across a window of
//! trylock/unlock, batches, uncontended blocking `lock()`, fetch-and-add and lease ticks, over
//! shared memory and over TCP (a connection of the client's own, and one shared through a `Mux`
//! by two clients, whose callers read it themselves), with the data thread serving all — under a session key, so
//! every grant's proof (an HMAC on the server, a trailer on the wire, a copy in the client's
//! record) is on the path too.
//!
//! The count is process-wide, so the window must be quiet but for the paths under test: this
//! file holds one test (nothing else of the harness runs meanwhile), it installs no log
//! subscriber, and the test thread itself only calls the client between reading the counter.
//! The control thread takes no part: no control frame is sent inside the window.
//!
//! It fails as it should. Adding an allocation to any of these paths — e.g. a
//! `let _ = Vec::<u8>::with_capacity(1);` in `runtime/tcp.rs`'s message loop, in
//! `runtime/data.rs`'s mailbox scan, or in `Client::trylock` — makes `allocations` non-zero
//! and the test report how many (checked by doing exactly that).

use std::time::Duration;

use dlock_core::{Config, LockKind, Mode};
use dlock_tests::counting::{Counting, allocations};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Mux};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

// The counting allocator the zero-allocation tests share (`dlock_tests::counting`).
#[global_allocator]
static GLOBAL: Counting = Counting;

/// One client's data-path workload: what the window repeats.
struct Work {
    client: Client,
    lock: dlock_core::LockId,
    batch: Vec<(dlock_core::LockId, Mode, u32)>,
    batch_ids: Vec<dlock_core::LockId>,
    /// The batches' results, written in place (sized once, as a caller on the hot path does).
    results: Vec<Result<dlock_transport::client::Grant, dlock_core::Status>>,
    object: dlock_core::ObjectId,
}

impl Work {
    fn new(cfg: ClientConfig, tag: &str) -> Work {
        let mut client = Client::connect(cfg).expect("registers");
        let lock = client
            .get_lock(LockKind::Rw, format!("{tag}/single").as_bytes())
            .unwrap();
        let batch_ids: Vec<_> = (0..31)
            .map(|i| {
                client
                    .get_lock(LockKind::Rw, format!("{tag}/batch-{i}").as_bytes())
                    .unwrap()
            })
            .collect();
        let batch = batch_ids
            .iter()
            .map(|&id| (id, Mode::Exclusive, 5_000))
            .collect();
        let name = format!("{tag}/xid");
        client.atomic64_create(name.as_bytes(), 1, 60).unwrap();
        let object = client.atomic64_get(name.as_bytes(), 60).unwrap();
        Work {
            client,
            lock,
            batch,
            batch_ids,
            results: vec![Err(dlock_core::Status::Fail); 31],
            object,
        }
    }

    /// One round of every data-path call; panics on any failure.
    fn round(&mut self) {
        let c = &mut self.client;
        let _grant = c.trylock(self.lock, Mode::Exclusive, 5_000).unwrap();
        assert_eq!(
            c.unlock(self.lock).map_err(dlock_core::Status::from),
            Ok(dlock_core::Status::Success)
        );
        let _grant = c
            .lock(self.lock, Mode::Shared, 5_000, Duration::from_secs(1))
            .unwrap();
        assert_eq!(
            c.unlock(self.lock).map_err(dlock_core::Status::from),
            Ok(dlock_core::Status::Success)
        );
        c.batch_trylock(&self.batch, true, &mut self.results)
            .unwrap();
        assert!(self.results.iter().all(Result::is_ok));
        c.batch_unlock(&self.batch_ids, &mut self.results).unwrap();
        c.atomic64_faa(self.object, 1).unwrap();
    }
}

#[test]
fn the_data_path_allocates_nothing_over_shared_memory_and_tcp() {
    let mut cfg = ServerConfig::new(Config {
        locks_max: 1_024,
        clients_max: 16,
        objects_max: 16,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    // With a session key every grant also costs an HMAC and travels with a proof trailer: the
    // longer path, which must allocate nothing either.
    cfg.session_key = Some(dlock_tests::sim::sim_session_key());
    let server = ServerHandle::start(cfg).expect("server starts");
    let addr = server.tcp_addr().unwrap();
    let tcp_cfg = ClientConfig::new(Endpoint::Tcp(addr));
    let mut shm = Work::new(ClientConfig::new(Endpoint::embedded(&server)), "shm");
    let mut tcp = Work::new(tcp_cfg.clone(), "tcp");
    let mux = Mux::new(&Endpoint::Tcp(addr)).unwrap();
    let mut shared = [
        Work::new(tcp_cfg.clone().with_mux(mux.clone()), "mux-a"),
        Work::new(tcp_cfg.with_mux(mux), "mux-b"),
    ];
    let mut round = || {
        shm.round();
        tcp.round();
        shared.iter_mut().for_each(Work::round);
    };
    // Warm up: every buffer, table page and lazily made state exists after this.
    for _ in 0..200 {
        round();
    }
    std::thread::sleep(Duration::from_millis(200));

    let before = allocations();
    for _ in 0..2_000 {
        round();
    }
    // Idle across several lease ticks (every 50 ms): the tick and the idle wait count too.
    std::thread::sleep(Duration::from_millis(300));
    let allocations = allocations() - before;
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in 8,000 rounds of the data path and 300 ms of idling"
    );
}
