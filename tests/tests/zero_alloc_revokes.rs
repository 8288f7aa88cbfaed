//! Revokes flowing allocate nothing either: a counting global allocator sees zero allocations,
//! in the whole process, across a window in which a cached holder is revoked and gives back,
//! again and again, over shared memory (the event ring in the region), over the client's own
//! TCP connection and over a connection shared through a `Mux` (event messages the data
//! thread writes unasked, read by the client's reader) — the data thread's revoke decision,
//! its event rings and the drain into event messages, and the clients' event queues included.
//!
//! As in `zero_alloc_runtime.rs`, the count is process-wide: this file holds one test, installs
//! no log subscriber, and sends no control frame inside the window. It fails as it should:
//! a `let _ = Vec::<u8>::with_capacity(1);` in `runtime/data.rs`'s `deliver_events` or in
//! `Client::poll_events` makes `allocations` non-zero (checked by doing exactly that).

use std::time::Duration;

use dlock_core::manager::Timing;
use dlock_core::proto::Event;
use dlock_core::{Config, LockId, LockKind, Mode, Status};
use dlock_tests::counting::{Counting, allocations};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Mux};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

// The counting allocator the zero-allocation tests share (`dlock_tests::counting`).
#[global_allocator]
static GLOBAL: Counting = Counting;

/// A cached holder and a client that wants its lock.
struct Pair {
    holder: Client,
    other: Client,
    mine: LockId,
    theirs: LockId,
}

impl Pair {
    fn new(endpoint: &Endpoint, mux: Option<&Mux>, tag: &str) -> Pair {
        let connect = |e: &Endpoint| {
            let cfg = ClientConfig::new(e.clone());
            let cfg = match mux {
                Some(m) => cfg.with_mux(m.clone()),
                None => cfg,
            };
            Client::connect(cfg).expect("registers")
        };
        let (mut holder, mut other) = (connect(endpoint), connect(endpoint));
        let name = format!("{tag}/page");
        let mine = holder.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        holder.set_cacheable(mine, true).unwrap();
        let theirs = other.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        Pair {
            holder,
            other,
            mine,
            theirs,
        }
    }

    /// The holder takes the lock cached; the other's trylock fails and revokes it; the holder
    /// sees the revoke and gives the lock back; the other takes it and lets it go.
    fn round(&mut self) {
        let _grant = self
            .holder
            .trylock(self.mine, Mode::Exclusive, 5_000)
            .unwrap();
        let refused = self.other.trylock(self.theirs, Mode::Exclusive, 5_000);
        assert_eq!(refused.map_err(Status::from).err(), Some(Status::Fail));
        let mut revoked = false;
        while !revoked {
            let mine = self.mine;
            self.holder
                .poll_events(|e| revoked |= matches!(e, Event::Revoke { lock, .. } if lock == mine))
                .unwrap();
        }
        assert_eq!(
            self.holder.unlock(self.mine).map_err(Status::from),
            Ok(Status::Success)
        );
        let _grant = self
            .other
            .trylock(self.theirs, Mode::Exclusive, 5_000)
            .unwrap();
        assert_eq!(
            self.other.unlock(self.theirs).map_err(Status::from),
            Ok(Status::Success)
        );
    }
}

#[test]
fn revokes_allocate_nothing_over_shared_memory_tcp_and_a_mux() {
    let mut cfg = ServerConfig::new(Config {
        locks_max: 64,
        clients_max: 16,
        objects_max: 4,
        // Revoked at once: the window measures revokes, not minimum holds.
        timing: Timing {
            min_hold_ms: 0,
            revoke_timeout_ms: 0,
            contention_window_ms: 0,
        },
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let server = ServerHandle::start(cfg).expect("server starts");
    let tcp = Endpoint::Tcp(server.tcp_addr().unwrap());
    let mux = Mux::new(&tcp).unwrap();
    let mut pairs = [
        Pair::new(&Endpoint::embedded(&server), None, "shm"),
        Pair::new(&tcp, None, "tcp"),
        Pair::new(&tcp, Some(&mux), "mux"),
    ];
    // Warm up: every buffer, table page and lazily made state exists after this.
    for _ in 0..200 {
        pairs.iter_mut().for_each(Pair::round);
    }
    std::thread::sleep(Duration::from_millis(200));

    let before = allocations();
    for _ in 0..1_000 {
        pairs.iter_mut().for_each(Pair::round);
    }
    std::thread::sleep(Duration::from_millis(200));
    let allocations = allocations() - before;
    assert_eq!(
        allocations, 0,
        "{allocations} allocations in 3,000 revoked and given-back grants"
    );
}
