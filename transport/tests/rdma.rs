//! RDMA transport tests (feature `rdma`).
//!
//! The first tests run everywhere: they prove that a host without RDMA gets a clean
//! `NoDevice` (so callers fall back to TCP) and that bad arguments are refused before any
//! device is touched. The `#[ignore]`d tests need a device; name it in `DLOCK_RDMA_DEVICE`
//! (`ibv_devices` lists them; a Soft-RoCE `rxe0` on any Ethernet interface works) and, on RoCE
//! with a non-default GID, set `DLOCK_RDMA_GID_INDEX`:
//!
//! ```text
//! DLOCK_RDMA_DEVICE=rxe0 cargo test -p dlock-transport --features rdma --test rdma -- --ignored
//! ```
//!
//! Every hardware test connects queue pairs in loopback on that one device: the client and the
//! server are two RC queue pairs of the same process.

#![cfg(feature = "rdma")]

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlock_core::Config;
use dlock_core::table::{Layout, Part};
use dlock_transport::rdma::{
    self, Endpoint, MESSAGE_MAX, RdmaClient, RdmaConfig, RdmaDevice, RdmaError, RdmaServer,
    ServerConnection,
};
use memmap2::MmapMut;

#[test]
fn probe_reports_no_device_or_a_non_empty_list() {
    match rdma::probe() {
        Err(RdmaError::NoDevice) => assert!(!rdma::available()),
        Ok(devices) => {
            assert!(!devices.is_empty());
            assert!(devices.iter().all(|d| !d.name.is_empty()));
            assert!(rdma::available());
        }
        Err(other) => panic!("probe failed with {other} instead of NoDevice"),
    }
}

#[test]
fn opening_an_unknown_device_is_a_clean_error() {
    let err = RdmaDevice::open(&RdmaConfig::new("dlock-no-such-device")).unwrap_err();
    match rdma::probe() {
        Err(_) => assert_eq!(err, RdmaError::NoDevice),
        Ok(_) => assert!(matches!(err, RdmaError::DeviceNotFound { .. }), "{err}"),
    }
}

#[test]
fn server_refuses_object_cells_outside_the_region_before_opening_a_device() {
    let mut map = MmapMut::map_anon(4096).unwrap();
    let cfg = RdmaConfig::new("dlock-no-such-device");
    for cells in [
        Part {
            offset: 4096,
            len: 8,
        },
        Part { offset: 4, len: 8 },
        Part { offset: 0, len: 0 },
    ] {
        // SAFETY: `map` is a live mapping that outlives the call; nothing is registered because
        // the range is refused first.
        let err = unsafe { RdmaServer::new(&cfg, map.as_mut_ptr(), map.len(), cells) };
        assert!(
            matches!(err, Err(RdmaError::InvalidArgument(_))),
            "{cells:?}: {err:?}"
        );
    }
}

// ---- hardware tests -------------------------------------------------------------------------

/// The device named in the environment, or `None` (and a note on stderr) to skip.
fn device_config() -> Option<RdmaConfig> {
    let Ok(name) = std::env::var("DLOCK_RDMA_DEVICE") else {
        eprintln!("skipped: set DLOCK_RDMA_DEVICE to an RDMA device name (see `ibv_devices`)");
        return None;
    };
    let mut cfg = RdmaConfig::new(&name);
    cfg.gid_index = std::env::var("DLOCK_RDMA_GID_INDEX")
        .ok()
        .map(|s| s.parse().expect("DLOCK_RDMA_GID_INDEX must be 0..=255"));
    cfg.op_timeout = Duration::from_secs(5);
    Some(cfg)
}

/// A server region laid out as dlock lays it out, registered on the device.
struct Rig {
    // Field order is drop order: deregister (server) before unmapping (map).
    server: RdmaServer,
    cells: Part,
    map: MmapMut,
    cfg: RdmaConfig,
}

impl Rig {
    fn new(cfg: RdmaConfig) -> Rig {
        let dlock = Config {
            locks_max: 16,
            clients_max: 4,
            objects_max: 64,
            ..Config::default()
        };
        let layout = Layout::new(&dlock);
        let mut map = MmapMut::map_anon(layout.total).unwrap();
        // SAFETY: `map` is one live mapping that `Rig` keeps until after `server` is dropped
        // (field order); its object cells are accessed only through `AtomicU64`s (`cell`).
        let server =
            unsafe { RdmaServer::new(&cfg, map.as_mut_ptr(), map.len(), layout.object_cells) }
                .unwrap();
        Rig {
            server,
            cells: layout.object_cells,
            map,
            cfg,
        }
    }

    /// The server's own view of object cell `i`.
    fn cell(&self, i: usize) -> &AtomicU64 {
        assert!(i * 8 < self.cells.len);
        // SAFETY: the address is inside the mapping (asserted), 8-byte aligned (the cells part
        // is 64-byte aligned in a page-aligned mapping), lives as long as `&self`, and is only
        // ever accessed atomically, here and by the device.
        unsafe {
            AtomicU64::from_ptr(
                self.map
                    .as_ptr()
                    .add(self.cells.offset + i * 8)
                    .cast_mut()
                    .cast(),
            )
        }
    }

    /// A client and its server connection, with endpoints exchanged as bytes, the way the TCP
    /// control connection will carry them.
    fn connect(&self) -> (RdmaClient, ServerConnection) {
        let mut client = RdmaClient::connect(&self.cfg).unwrap();
        let mut conn = self.server.accept().unwrap();
        let to_server = Endpoint::from_bytes(&client.endpoint().to_bytes()).unwrap();
        let to_client = Endpoint::from_bytes(&conn.endpoint().to_bytes()).unwrap();
        conn.handshake(&to_server).unwrap();
        client.handshake(&to_client).unwrap();
        (client, conn)
    }
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn loopback_rc_queue_pairs_connect_and_carry_the_object_table() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    let (client, conn) = rig.connect();
    let table = client
        .object_table()
        .expect("server endpoint carries the table");
    assert_eq!(table, rig.server.object_table());
    assert_eq!(table.cells, 64);
    assert_eq!(
        table.addr,
        rig.map.as_ptr() as u64 + rig.cells.offset as u64
    );
    assert_ne!(client.endpoint().qp_num, conn.endpoint().qp_num);
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn send_recv_round_trip_of_a_full_1008_byte_message() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    let (mut client, mut conn) = rig.connect();
    assert_eq!(MESSAGE_MAX, 1008);
    let server = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        // The reply is the request reversed, so a reply that merely echoes would fail.
        let served = conn
            .serve(deadline, |req, out| {
                assert_eq!(req.len(), MESSAGE_MAX);
                for (o, i) in out.iter_mut().zip(req.iter().rev()) {
                    *o = *i;
                }
                req.len()
            })
            .unwrap();
        assert!(served);
        conn
    });
    let request: Vec<u8> = (0..MESSAGE_MAX).map(|i| (i * 7 + 1) as u8).collect();
    let mut reply = [0u8; MESSAGE_MAX];
    let n = client.call(&request, &mut reply).unwrap();
    assert_eq!(n, MESSAGE_MAX);
    assert!(reply.iter().eq(request.iter().rev()));
    drop(server.join().unwrap());
    // Longer than a data message is refused locally, before anything is posted.
    assert!(matches!(
        client.post_send(&[0; MESSAGE_MAX + 1]),
        Err(RdmaError::InvalidArgument(_))
    ));
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn fetch_add_values_are_unique_across_two_queue_pairs() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    const PER_CLIENT: u64 = 2_000;
    let cell = 3;
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (mut client, conn) = rig.connect();
            thread::spawn(move || {
                let seen: Vec<u64> = (0..PER_CLIENT)
                    .map(|_| client.fetch_add(cell, 1).unwrap())
                    .collect();
                drop(conn);
                seen
            })
        })
        .collect();
    let mut all = HashSet::new();
    for run in runs {
        for v in run.join().unwrap() {
            assert!(all.insert(v), "fetch_add returned {v} twice");
        }
    }
    assert_eq!(all, (0..2 * PER_CLIENT).collect::<HashSet<_>>());
    // Acquire, as for any value another agent (here the device) published; its writes were
    // done before the completions the clients polled.
    assert_eq!(
        rig.cell(cell as usize).load(Ordering::Acquire),
        2 * PER_CLIENT
    );
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn compare_swap_returns_the_observed_value_on_success_and_failure() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    let (mut client, _conn) = rig.connect();
    assert_eq!(client.compare_swap(5, 0, 42).unwrap(), 0, "swap from 0");
    assert_eq!(client.compare_swap(5, 0, 7).unwrap(), 42, "stale expected");
    assert_eq!(rig.cell(5).load(Ordering::Acquire), 42, "failed CAS wrote");
    assert_eq!(client.compare_swap(5, 42, u64::MAX).unwrap(), 42);
    assert_eq!(rig.cell(5).load(Ordering::Acquire), u64::MAX);
    // Out-of-range cells are refused before anything is posted.
    assert!(matches!(
        client.compare_swap(64, 0, 1),
        Err(RdmaError::InvalidArgument(_))
    ));
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn read_sees_values_the_server_stored() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    let (mut client, _conn) = rig.connect();
    for (i, v) in [(0usize, 1u64), (1, 0xdead_beef_0bad_cafe), (63, u64::MAX)] {
        // Release: publishes the value before the client's READ, which is issued afterwards.
        rig.cell(i).store(v, Ordering::Release);
        assert_eq!(client.read(i as u32).unwrap(), v);
    }
    assert_eq!(client.fetch_add(1, 1).unwrap(), 0xdead_beef_0bad_cafe);
    assert_eq!(client.read(1).unwrap(), 0xdead_beef_0bad_caff);
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn registering_a_memmap2_anonymous_mapping_reports_its_range_and_keys() {
    let Some(cfg) = device_config() else { return };
    let device = RdmaDevice::open(&cfg).unwrap();
    let mut map = MmapMut::map_anon(1 << 20).unwrap();
    // SAFETY: `map` outlives both registrations (dropped explicitly below, first) and is not
    // touched meanwhile.
    let mr = unsafe { device.register(map.as_mut_ptr(), map.len()) }.unwrap();
    assert_eq!(mr.addr(), map.as_ptr() as u64);
    assert_eq!(mr.len(), 1 << 20);
    // A second registration of the same pages is a distinct memory region with its own keys.
    // SAFETY: as above.
    let again = unsafe { device.register(map.as_mut_ptr(), 4096) }.unwrap();
    assert_eq!(again.addr(), mr.addr());
    assert_ne!(again.rkey(), mr.rkey());
    drop((mr, again));
    drop(map);
}
