//! The cluster client's data path allocates nothing once warm (issue 19): against a real
//! cluster server, with hundreds of locks held, a lock, an unlock, a trylock the server refuses,
//! an async lock and unlock, a fetch-and-add, and batches of 31 (per item, all-or-nothing, and
//! cut into four messages in flight at once) make no allocation on the client's thread while
//! the map stays as it is and nothing is owed. Before, each message built its flight from
//! fresh lists, copied the client's message and the server's address (twice per command), and
//! sorted an all-or-nothing batch by copies of its names: this test counted 64,582 allocations
//! in its 2,000 messages.
//!
//! The count is the test thread's own ([`thread_allocations`]): the server's threads, and each
//! connection's reader thread, allocate as they like. This file holds one test, so nothing else
//! runs on its thread.

use std::sync::Arc;
use std::task::Waker;
use std::thread;
use std::time::Duration;

use dlock_core::cluster::{Map, Member, Partitions, ServerId, Timing, assign};
use dlock_core::{Config, LockId, LockKind, Mode, ObjectId, SessionKey, Status};
use dlock_tests::counting::{Counting, Unpark, block_on, thread_allocations};
use dlock_transport::client::cluster::{ClusterConfig as LinkConfig, ClusterLink, NetDial};
use dlock_transport::client::{AsyncOp, Client, Grant};
use dlock_transport::runtime::membership::StaticCluster;
use dlock_transport::runtime::{ClusterConfig, ServerConfig, ServerHandle, TcpConfig};

// The counting allocator the zero-allocation tests share (`dlock_tests::counting`).
#[global_allocator]
static GLOBAL: Counting = Counting;

const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 30_000,
};
const LEASE_MS: u32 = 30_000;
/// Locks the client holds throughout, beside the ones it takes and lets go.
const HELD: usize = 512;
/// The largest batch.
const BATCH: usize = 31;

/// The one server of the cluster, on a free loopback port, owning every partition.
fn server(cluster: &StaticCluster) -> ServerHandle {
    let id = ServerId::new(1).unwrap();
    let membership = cluster.member(id, 10, TIMING);
    let mut cfg = ServerConfig::new(Config {
        locks_max: 1_024,
        clients_max: 16,
        objects_max: 16,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    cfg.session_key =
        Some(SessionKey::new(std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a)).unwrap());
    cfg.cluster = Some(ClusterConfig {
        membership: Arc::new(membership),
        counter_step: 50,
    });
    let s = ServerHandle::start(cfg).unwrap();
    let address = s.tcp_addr().unwrap().to_string().into_bytes();
    let member = Member {
        id,
        incarnation: 10,
        address: &address,
        draining: false,
    };
    let mut map = Map::new(Partitions::new(16).unwrap());
    assign(&Map::new(map.partitions()), &[member], &[], &mut map).unwrap();
    cluster.set_map(map);
    s
}

/// A cluster client of `s`, once the server serves its map.
fn client(s: &ServerHandle) -> Client<ClusterLink> {
    let seed = s.tcp_addr().unwrap().to_string();
    for _ in 0..500 {
        // The longest lease a server grants: neither client lapses while the other works.
        let cfg = LinkConfig::with_dial([&seed], NetDial::tcp())
            .with_timeout(Duration::from_secs(5))
            .with_lease(Duration::from_secs(30));
        if let Ok(c) = Client::connect_cluster(cfg) {
            return c;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the cluster server never served its map");
}

/// `n` lock references named `prefix-i`.
fn locks(c: &mut Client<ClusterLink>, prefix: &str, n: usize) -> Vec<LockId> {
    (0..n)
        .map(|i| {
            c.get_lock(LockKind::Rw, format!("{prefix}-{i}").as_bytes())
                .unwrap()
        })
        .collect()
}

/// The steady state's commands, each checked.
struct Round {
    page: LockId,
    taken: LockId,
    counter: ObjectId,
    batch: Vec<LockId>,
    tries: Vec<(LockId, Mode, u32)>,
    out: Vec<Result<Grant, Status>>,
    waker: Waker,
}

impl Round {
    fn run(&mut self, c: &mut Client<ClusterLink>) {
        self.one_by_one(c);
        for all_or_nothing in [false, true] {
            c.batch_trylock(&self.tries, all_or_nothing, &mut self.out)
                .unwrap();
            assert!(self.out.iter().all(|r| r.is_ok()), "{:?}", self.out);
            c.batch_unlock(&self.batch, &mut self.out).unwrap();
            assert!(self.out.iter().all(|r| r.is_ok()), "{:?}", self.out);
        }
        self.pipelined(c);
    }

    /// Single commands: blocking, refused, async, and a fetch-and-add.
    fn one_by_one(&mut self, c: &mut Client<ClusterLink>) {
        let g = c.trylock(self.page, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(g.status, Status::Success);
        assert_eq!(c.unlock(self.page).unwrap(), Status::Success);
        let g = c
            .lock(self.page, Mode::Shared, LEASE_MS, Duration::from_secs(1))
            .unwrap();
        assert_eq!(g.status, Status::Success);
        assert_eq!(c.unlock(self.page).unwrap(), Status::Success);
        // Held by the rival: refused.
        let refused = c.trylock(self.taken, Mode::Exclusive, LEASE_MS);
        assert_eq!(refused.map_err(|e| e.status()), Err(Status::Fail));
        let wait = AsyncOp::LockWait(Mode::Exclusive, LEASE_MS, Duration::from_secs(1));
        let g = block_on(&self.waker, c.lock_async(self.page, wait)).unwrap();
        assert_eq!(g.status, Status::Success);
        let g = block_on(&self.waker, c.lock_async(self.page, AsyncOp::Unlock)).unwrap();
        assert_eq!(g.status, Status::Success);
        c.atomic64_faa(self.counter, 1).unwrap();
    }

    /// The batch in four messages in flight at once (the link's depth), taken then let go.
    fn pipelined(&mut self, c: &mut Client<ClusterLink>) {
        let quarter = BATCH.div_ceil(4);
        for tries in self.tries.chunks(quarter) {
            c.submit_trylock(tries, false).unwrap();
        }
        for _ in self.tries.chunks(quarter) {
            let n = c.complete(&mut self.out).unwrap();
            assert!(self.out[..n].iter().all(|r| r.is_ok()), "{:?}", self.out);
        }
        for ids in self.batch.chunks(quarter) {
            c.submit_unlock(ids).unwrap();
        }
        for _ in self.batch.chunks(quarter) {
            let n = c.complete(&mut self.out).unwrap();
            assert!(self.out[..n].iter().all(|r| r.is_ok()), "{:?}", self.out);
        }
    }
}

#[test]
fn a_cluster_clients_data_commands_allocate_nothing_once_warm() {
    let cluster = StaticCluster::new();
    let s = server(&cluster);
    let mut c = client(&s);
    let mut rival = client(&s);

    for id in locks(&mut c, "orders/held", HELD) {
        let g = c.trylock(id, Mode::Exclusive, LEASE_MS).unwrap();
        assert_eq!(g.status, Status::Success);
    }
    let taken = rival.get_lock(LockKind::Rw, b"orders/taken").unwrap();
    let g = rival.trylock(taken, Mode::Exclusive, LEASE_MS).unwrap();
    assert_eq!(g.status, Status::Success);

    let batch = locks(&mut c, "orders/batch", BATCH);
    let mut round = Round {
        page: c.get_lock(LockKind::Rw, b"orders/page").unwrap(),
        taken: c.get_lock(LockKind::Rw, b"orders/taken").unwrap(),
        counter: {
            c.atomic64_create(b"orders/xid", 0, 60).unwrap();
            c.atomic64_get(b"orders/xid", 60).unwrap()
        },
        tries: batch
            .iter()
            .map(|&id| (id, Mode::Exclusive, LEASE_MS))
            .collect(),
        batch,
        out: vec![Err(Status::Einval); BATCH],
        waker: Waker::from(Arc::new(Unpark(thread::current()))),
    };
    // Warm up: every list the link keeps has its size after this.
    for _ in 0..20 {
        round.run(&mut c);
    }

    let before = thread_allocations();
    assert!(before > 0, "the counter sees the set-up's allocations");
    let rounds = 100;
    for _ in 0..rounds {
        round.run(&mut c);
    }
    let allocations = thread_allocations() - before;
    assert_eq!(
        allocations,
        0,
        "{allocations} allocations in {} data messages",
        rounds * 20
    );
    drop((c, rival, s));
}
