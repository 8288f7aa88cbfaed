//! Two engine nodes in one process, each an embedded server that joined one cluster on a real
//! etcd (feature `cluster`): each masters a share of the partitions, and every worker's client
//! reaches its own node's server through shared memory and the other's over TCP, the node's
//! clients sharing one connection per remote server. The engine's pieces run over it unchanged: transaction ids from the one counter never repeat whichever
//! node asks, CSNs stay ordered across nodes, and a row group locked on one node is refused on
//! the other until it is released.

#[path = "../../transport/cluster/tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use common::etcd::free_port;
use common::{Etcd, eventually};
use dlock_engine_glue::cluster::ClusterJoin;
use dlock_engine_glue::dlock_core::cluster::{ServerId, partition_of};
use dlock_engine_glue::dlock_core::{Config, Mode, Status};
use dlock_engine_glue::dlock_transport::client::read_server_stats;
use dlock_engine_glue::dlock_transport::runtime::TcpConfig;
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};
use dlock_engine_glue::{CsnAllocator, EmbeddedServer, IdConfig, TxnIdAllocator, Volatile};

const CLUSTER: &str = "engines";
const PARTITIONS: u16 = 16;
const WAIT: Duration = Duration::from_secs(10);

/// Engine node `id`: an embedded server listening on a free loopback port, joined to the
/// cluster with a 1-second etcd lease and 2-second client leases (short takeovers).
fn node(etcd: &Etcd, id: u32) -> EmbeddedServer {
    let mut cfg = EmbeddedServer::config(Config {
        locks_max: 1_024,
        clients_max: 32,
        objects_max: 64,
        client_lease_ms: 1_000,
        client_lease_max_ms: 2_000,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new(SocketAddr::from((
        [127, 0, 0, 1],
        free_port(),
    ))));
    let mut join = ClusterJoin::new(vec![], CLUSTER, ServerId::new(id).unwrap());
    join.agent = etcd.config(CLUSTER, id, PARTITIONS);
    // The server's listener is the address the other node reaches this one at.
    join.agent.address.clear();
    join.counter_step = 1_000;
    EmbeddedServer::start_cluster(cfg, join).expect("the node joins the cluster")
}

/// Waits until both nodes know a map in which each owns some partitions, and serve every one
/// of them: a partition the second node took over from the first takes only re-claims until
/// the first node's clients are done or its grace period ends, and a request that waits
/// longer than its client's timeout fails.
fn split_between(a: &EmbeddedServer, b: &EmbeddedServer) {
    let owners = |s: &EmbeddedServer| {
        let map = s.cluster_agent()?.map()?;
        let mut owners: Vec<ServerId> = (0..PARTITIONS)
            .filter_map(|p| map.owner(p)?.server)
            .collect();
        owners.sort_unstable();
        owners.dedup();
        (owners.len() == 2).then_some(map.version())
    };
    eventually(Duration::from_secs(30), "both nodes own partitions", || {
        let (va, vb) = (owners(a)?, owners(b)?);
        (va == vb).then_some(())
    });
    let serving = |s: &EmbeddedServer| {
        let stats = read_server_stats(&s.endpoint(), WAIT).ok()?;
        let count = |n: &str| stats.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        (count("partitions_owned")? > 0 && count("partitions_recovering")? == 0).then_some(())
    };
    eventually(
        Duration::from_secs(30),
        "both nodes serve their partitions",
        || {
            serving(a)?;
            serving(b)
        },
    );
}

/// A row group whose lock lives in a partition node `owner` masters.
fn row_group_of(node: &EmbeddedServer, owner: u32) -> RowGroup {
    let map = node.cluster_agent().unwrap().map().unwrap();
    (0..)
        .map(|g| RowGroup::new(7, g))
        .find(|k| {
            let p = partition_of(&k.lock_name(), map.partitions());
            map.owner(p).unwrap().server == ServerId::new(owner)
        })
        .unwrap()
}

#[test]
fn two_engine_nodes_share_one_xid_counter_and_exclude_each_other_on_row_groups() {
    let etcd = Etcd::start();
    let a = node(&etcd, 1);
    let b = node(&etcd, 2);
    split_between(&a, &b);

    let standalone = EmbeddedServer::start(EmbeddedServer::config(Config {
        locks_max: 16,
        clients_max: 4,
        objects_max: 4,
        ..Config::default()
    }))
    .unwrap();
    let refused = standalone.cluster_client().map(drop).map_err(Status::from);
    assert_eq!(
        refused,
        Err(Status::NotReady),
        "a standalone server has no map"
    );
    standalone.shutdown();

    // Transaction ids: two workers on each node, from the one counter (whose partition one
    // node masters; the other reaches it over TCP).
    let xids = [&a, &b].map(|n| {
        TxnIdAllocator::open(n.cluster_client().unwrap(), IdConfig::txn_ids(), Volatile).unwrap()
    });
    let per_worker = 3_000;
    let taken: Vec<Vec<u64>> = thread::scope(|s| {
        let workers: Vec<_> = xids
            .iter()
            .flat_map(|x| [x.handle(), x.handle()])
            .map(|mut h| {
                s.spawn(move || {
                    (0..per_worker)
                        .map(|_| h.next().expect("a transaction id").0)
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut seen = HashSet::new();
    for worker in &taken {
        assert!(
            worker.windows(2).all(|w| w[0] < w[1]),
            "ids rise per handle"
        );
        for &id in worker {
            assert!(seen.insert(id), "transaction id {id} handed out twice");
        }
    }
    assert_eq!(seen.len(), 4 * per_worker);

    // CSNs: a commit on one node after a commit on the other gets the larger one.
    let csns = [&a, &b].map(|n| {
        CsnAllocator::open(n.cluster_client().unwrap(), IdConfig::csns(), Volatile).unwrap()
    });
    let mut last = csns[0].next().unwrap();
    for i in 0..20 {
        let next = csns[(i + 1) % 2].next().unwrap();
        assert!(next > last, "CSN {next:?} after {last:?}");
        last = next;
    }

    // Row groups, one in a partition of each node: held exclusively on one node, refused on
    // the other (shared and exclusive) until released, then granted with a larger token.
    let mut on_a =
        RowGroupLocks::new(a.cluster_client().unwrap(), RowGroupConfig::DEFAULT).unwrap();
    let mut on_b =
        RowGroupLocks::new(b.cluster_client().unwrap(), RowGroupConfig::DEFAULT).unwrap();
    // A cluster client reads no revokes, so it caches nothing: asked to, it says so.
    let cached = RowGroupConfig::DEFAULT.with_cached(true);
    assert_eq!(
        RowGroupLocks::new(a.cluster_client().unwrap(), cached).err(),
        Some(Status::Einval)
    );
    for owner in [1, 2] {
        let key = row_group_of(&a, owner);
        let mut first = on_a.begin();
        first
            .acquire(&[(key, Mode::Exclusive)], AcquireOptions::wait(WAIT))
            .expect("the first node takes the row group");
        let token = first.token(key).unwrap();
        let mut second = on_b.begin();
        for mode in [Mode::Shared, Mode::Exclusive] {
            assert_eq!(
                second.acquire(&[(key, mode)], AcquireOptions::NO_WAIT),
                Err(Status::Fail),
                "node 2 took {key:?} ({mode:?}) while node 1 held it"
            );
        }
        first.commit().unwrap();
        second
            .acquire(&[(key, Mode::Exclusive)], AcquireOptions::wait(WAIT))
            .expect("the second node takes the row group once it is free");
        assert!(
            second.token(key).unwrap() > token,
            "tokens rise across nodes"
        );
        second.commit().unwrap();
    }

    drop((xids, csns, on_a, on_b));
    b.shutdown();
    a.shutdown();
}

/// Two servers started through the C ABI (`server_start` with `server_cfg.cluster` set) join
/// one cluster and split its partitions between them, as their counters
/// (`get_server_debug_stats`) show.
#[test]
fn servers_started_through_the_c_abi_join_the_cluster_and_split_its_partitions() {
    use dlock_engine_glue::dlock_core::server::Counter;
    use dlock_engine_glue::ffi::server::{
        dserver_lib_deinit, dserver_lib_init, get_server_debug_stats, server_start, server_stop,
    };
    use dlock_engine_glue::ffi::types::{
        SERVER_PRIMARY, cluster_cfg, debug_stats, primary_cfg, server_cfg, ssl_cfg,
    };
    use std::ffi::CString;

    let etcd = Etcd::start();
    let endpoints = CString::new(etcd.endpoint()).unwrap();
    let cfg = |id: u32| server_cfg {
        r#type: SERVER_PRIMARY,
        log_level: 0,
        sleep_mode_enable: 0,
        primary: primary_cfg {
            num_of_replica: 0,
            recovery_client_num: 0,
            ctrl_cpuset: std::ptr::null(),
            cmd_cpuset: std::ptr::null(),
            server_ip_str: c"127.0.0.1".as_ptr(),
            server_port: i32::from(free_port()),
            replica_port: 0,
            replica_enable: 0,
        },
        locks_max: 256,
        clients_max: 16,
        objects_max: 16,
        client_lease_ms: 1_000,
        client_lease_max_ms: 2_000,
        epoch: 0,
        shm_name: std::ptr::null(),
        ssl: ssl_cfg::DISABLED,
        insecure_plaintext: 0,
        session_key_file: std::ptr::null(),
        insecure_recovery: 0,
        recoverer_local: 0,
        cluster: cluster_cfg {
            etcd_endpoints: endpoints.as_ptr(),
            cluster_name: c"c-engines".as_ptr(),
            server_id: id,
            ttl_ms: 1_000,
            partitions: u32::from(PARTITIONS),
            counter_step: 1_000,
            ..cluster_cfg::STANDALONE
        },
    };
    assert_eq!(dserver_lib_init(2), 0);
    let mut ids = [0; 2];
    for (n, id) in ids.iter_mut().enumerate() {
        // SAFETY: a valid config whose strings outlive the call, and a writable id.
        let r = unsafe { server_start(&cfg(n as u32 + 1), id) };
        assert_eq!(r, 0, "server_start of cluster member {}", n + 1);
    }
    let owned = |id| {
        let mut stats = debug_stats {
            stats: [0; Counter::COUNT],
        };
        // SAFETY: `stats` is writable.
        assert_eq!(unsafe { get_server_debug_stats(id, &mut stats) }, 0);
        stats.stats[Counter::PartitionsOwned as usize]
    };
    eventually(
        Duration::from_secs(30),
        "the partitions split in two",
        || {
            let (a, b) = (owned(ids[0]), owned(ids[1]));
            (a > 0 && b > 0 && a + b == u64::from(PARTITIONS)).then_some(())
        },
    );
    for id in ids {
        assert_eq!(server_stop(id), 0);
    }
    dserver_lib_deinit();
}
