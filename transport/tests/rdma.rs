//! RDMA transport tests (feature `rdma`).
//!
//! The first tests run everywhere: they prove that a host without RDMA gets a clean
//! `NoDevice` (so callers fall back to TCP), that bad arguments are refused before any
//! device is touched, that a client asking for RDMA on such a host works over TCP, and that the
//! attach exchange refuses forged sessions and malformed records. The `#[ignore]`d tests need a
//! device; name it in `DLOCK_RDMA_DEVICE` (`ibv_devices` lists them; a Soft-RoCE `rxe0` on any
//! Ethernet interface works) and, on RoCE with a non-default GID, set `DLOCK_RDMA_GID_INDEX`:
//!
//! ```text
//! DLOCK_RDMA_DEVICE=rxe0 cargo test -p dlock-transport --features rdma --test rdma -- --ignored
//! ```
//!
//! Every hardware test connects queue pairs in loopback on that one device: the client and the
//! server are two RC queue pairs of the same process. The tests of events over a queue pair
//! (revokes, and the credits that keep them out of the replies' receive slots) are in
//! `rdma/events.rs`.

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

#[path = "rdma/events.rs"]
mod events;

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
fn send_recv_round_trip_of_a_message_of_the_longest_length() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    let (mut client, mut conn) = rig.connect();
    // MESSAGE_MAX is a data reply with its value and proof trailers (2,744 bytes); the test
    // once said 1,008, a request of 31 commands, and would have failed on hardware.
    assert_eq!(
        MESSAGE_MAX,
        dlock_core::proto::DATA_RESPONSE_WITH_VALUES_MAX
    );
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

// ---- the runtime and the client, over RDMA or falling back to TCP -------------------------------

mod wired {
    use std::io::{Read, Write};
    use std::net::{Shutdown, SocketAddr, TcpStream};
    use std::thread;
    use std::time::{Duration, Instant};

    use dlock_core::proto::{
        CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
        MsgType, PROTO_VERSION, decode_control_response, encode_control_request,
    };
    use dlock_core::{Config, LockKind, Mode, Status};
    use dlock_transport::client::link::{Endpoint as Where, Link};
    use dlock_transport::client::{Client, ClientConfig, Endpoint, Transport};
    use dlock_transport::rdma::{
        AttachRecord, Endpoint as QpEndpoint, RDMA_ATTACH_LEN, RdmaClient, RdmaConfig,
    };
    use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

    const NO_SUCH_DEVICE: &str = "dlock-no-such-device";

    /// A TCP server that is asked to serve RDMA on `device`.
    pub(super) fn server(device: &str, lease_ms: u32) -> ServerHandle {
        let mut cfg = ServerConfig::new(Config {
            locks_max: 256,
            clients_max: 16,
            objects_max: 16,
            client_lease_ms: lease_ms,
            ..Config::default()
        });
        cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
        let mut rdma = RdmaConfig::new(device);
        rdma.gid_index = std::env::var("DLOCK_RDMA_GID_INDEX")
            .ok()
            .map(|s| s.parse().expect("DLOCK_RDMA_GID_INDEX must be 0..=255"));
        cfg.rdma = Some(rdma);
        ServerHandle::start(cfg).expect("a server starts whether or not RDMA is there")
    }

    fn rdma_endpoint(s: &ServerHandle, device: &str) -> Endpoint {
        let mut rdma = RdmaConfig::new(device);
        rdma.gid_index = std::env::var("DLOCK_RDMA_GID_INDEX")
            .ok()
            .map(|s| s.parse().expect("DLOCK_RDMA_GID_INDEX must be 0..=255"));
        Endpoint::Rdma {
            addr: s.tcp_addr().unwrap(),
            rdma,
        }
    }

    /// A well-formed client endpoint record; no queue pair behind it.
    fn some_endpoint() -> QpEndpoint {
        QpEndpoint {
            qp_num: 0x42,
            lid: 1,
            gid: None,
            psn: 7,
            mtu: 3,
            objects: None,
        }
    }

    /// Sends `bytes` as a new connection's first bytes; returns everything the server answers
    /// until it closes the connection.
    fn raw_attach(addr: SocketAddr, bytes: &[u8], half_close: bool) -> Vec<u8> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        if half_close {
            s.shutdown(Shutdown::Write).unwrap();
        }
        let mut got = Vec::new();
        // A reset after the reply is as good as a close.
        let _ = s.read_to_end(&mut got);
        got
    }

    /// Registers over a raw control link; the client id and the session secret.
    fn register(addr: SocketAddr) -> (Link, u32, dlock_core::Session) {
        let mut link = Link::connect(&Where::Tcp(addr)).unwrap();
        let header = ControlHeader {
            version: PROTO_VERSION,
            msg: MsgType::ClientInit,
            message_id: 1,
            word: 0,
        };
        let body = ControlRequest::ClientInit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
        };
        let (client, session) = control(&mut link, header, body, |body| match body {
            ControlResponse::Init(init) => (init.client, init.session),
            other => panic!("not an init reply: {other:?}"),
        });
        (link, client, session)
    }

    /// Sends one control request over `link`; what `read` makes of its reply's body.
    fn control<R>(
        link: &mut Link,
        header: ControlHeader,
        body: ControlRequest<'_>,
        read: impl FnOnce(ControlResponse<'_>) -> R,
    ) -> R {
        let mut req = vec![0; CONTROL_FRAME_MAX];
        let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req).unwrap();
        let mut reply = vec![0; CONTROL_FRAME_MAX];
        let deadline = Some(Instant::now() + Duration::from_secs(5));
        let m = link.control(&req[..n], &mut reply, deadline).unwrap();
        read(decode_control_response(&reply[..m]).unwrap().body)
    }

    /// The raw id of the lock `name` of kind `kind`, got by `client` over its control `link`.
    pub(super) fn get_lock(link: &mut Link, client: u32, kind: LockKind, name: &[u8]) -> u32 {
        let header = ControlHeader {
            version: PROTO_VERSION,
            msg: MsgType::GetLock,
            message_id: 2,
            word: client,
        };
        control(
            link,
            header,
            ControlRequest::GetLock { kind, name },
            |body| match body {
                ControlResponse::Lock { lock } => lock,
                other => panic!("GetLock answered {other:?}"),
            },
        )
    }

    /// A client registered over a raw control link (kept open: it carries the registration)
    /// with a queue pair of its own attached, and no [`Client`] around it, so that a test can
    /// have several requests in flight: the link, the client id and the queue pair.
    pub(super) fn raw_rdma_client(s: &ServerHandle, cfg: &RdmaConfig) -> (Link, u32, RdmaClient) {
        let addr = s.tcp_addr().unwrap();
        let (link, client, session) = register(addr);
        let mut qp = RdmaClient::connect(cfg).unwrap();
        let record = AttachRecord {
            client,
            session,
            endpoint: qp.endpoint(),
        };
        let got = raw_attach(addr, &record.to_bytes(), false);
        assert_eq!(status_of(&got), Status::Success as u32, "attach: {got:?}");
        let server = QpEndpoint::from_bytes(&got[4..]).unwrap();
        qp.handshake(&server).unwrap();
        (link, client, qp)
    }

    fn status_of(reply: &[u8]) -> u32 {
        u32::from_le_bytes(reply[..4].try_into().unwrap())
    }

    #[test]
    fn an_rdma_client_without_a_device_works_over_tcp() {
        let s = server(NO_SUCH_DEVICE, 5_000);
        assert!(!s.rdma_enabled(), "the server must have fallen back");
        let mut c = Client::connect(ClientConfig::new(rdma_endpoint(&s, NO_SUCH_DEVICE))).unwrap();
        assert_eq!(c.transport(), Some(Transport::Tcp));
        let id = c.get_lock(LockKind::Atomic, b"fallback").unwrap();
        assert_eq!(
            c.trylock(id, Mode::Exclusive, 5_000).unwrap().status,
            Status::Success
        );
        assert_eq!(c.unlock(id).map_err(Status::from), Ok(Status::Success));
        let xid = c.atomic64_create(b"xid", 100, 60).unwrap();
        let xid_ref = c.atomic64_get(b"xid", 60).unwrap();
        assert_eq!(xid, xid_ref);
        assert_eq!(c.atomic64_faa(xid, 5).map_err(Status::from), Ok(100));
        assert_eq!(c.atomic64_faa(xid, 1).map_err(Status::from), Ok(105));
        assert_eq!(c.atomic64_snapshot(xid).map_err(Status::from), Ok(106));
        c.deinit().unwrap();
    }

    #[test]
    fn an_rdma_attach_with_a_forged_session_is_refused() {
        let s = server(NO_SUCH_DEVICE, 5_000);
        let addr = s.tcp_addr().unwrap();
        let (_link, client, session) = register(addr);
        let forged = AttachRecord {
            client,
            session: {
                let mut forged = session;
                forged.0[0] ^= 1;
                forged
            },
            endpoint: some_endpoint(),
        };
        let got = raw_attach(addr, &forged.to_bytes(), false);
        assert_eq!(got.len(), 4, "a status and nothing else: {got:?}");
        assert_eq!(status_of(&got), Status::ClientNotInit as u32);
        // An id nobody registered is refused the same way.
        let stranger = AttachRecord {
            client: client.wrapping_add(1),
            ..forged
        };
        let got = raw_attach(addr, &stranger.to_bytes(), false);
        assert_eq!(status_of(&got), Status::ClientNotInit as u32);
    }

    #[test]
    fn an_rdma_attach_with_the_right_session_on_a_server_without_rdma_says_so() {
        let s = server(NO_SUCH_DEVICE, 5_000);
        let addr = s.tcp_addr().unwrap();
        let (_link, client, session) = register(addr);
        let record = AttachRecord {
            client,
            session,
            endpoint: some_endpoint(),
        };
        let got = raw_attach(addr, &record.to_bytes(), false);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(status_of(&got), Status::ServerNotInit as u32);
    }

    #[test]
    fn malformed_or_short_attach_records_close_the_connection_without_a_reply() {
        let s = server(NO_SUCH_DEVICE, 5_000);
        let addr = s.tcp_addr().unwrap();
        let (_link, client, session) = register(addr);
        let good = AttachRecord {
            client,
            session,
            endpoint: some_endpoint(),
        }
        .to_bytes();
        type Patch = fn(&mut [u8; RDMA_ATTACH_LEN]);
        // Where the endpoint starts: after the attach record's magic, id and session.
        const E: usize = dlock_core::proto::ATTACH_LEN;
        let patches: &[(&str, Patch)] = &[
            ("endpoint magic", |b| b[E] ^= 0xff),
            ("endpoint version", |b| b[E + 4] = 9),
            ("endpoint mtu", |b| b[E + 6] = 0),
            ("endpoint reserved", |b| b[E + 7] = 1),
            ("object table from a client", |b| {
                b[E + 5] |= 2;
                b[E + 20..E + 24].copy_from_slice(&1u32.to_le_bytes());
                b[E + 40..E + 48].copy_from_slice(&0x1000u64.to_le_bytes());
            }),
        ];
        for (what, patch) in patches {
            let mut b = good;
            patch(&mut b);
            assert_eq!(raw_attach(addr, &b, false), Vec::<u8>::new(), "{what}");
        }
        // A record cut short, then the end of the stream.
        assert_eq!(raw_attach(addr, &good[..40], true), Vec::<u8>::new());
        // Random bytes after a valid magic.
        let mut noise = [0u8; RDMA_ATTACH_LEN];
        noise[..4].copy_from_slice(&good[..4]);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for b in &mut noise[4..] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        assert_eq!(raw_attach(addr, &noise, false), Vec::<u8>::new());
        // None of it hurt the server.
        let mut c = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
        let id = c.get_lock(LockKind::Atomic, b"still-serving").unwrap();
        assert!(c.trylock(id, Mode::Exclusive, 1_000).is_ok());
    }

    // ---- hardware --------------------------------------------------------------------------

    pub(super) fn device() -> Option<String> {
        let d = std::env::var("DLOCK_RDMA_DEVICE").ok();
        if d.is_none() {
            eprintln!("skipped: set DLOCK_RDMA_DEVICE to an RDMA device name (see `ibv_devices`)");
        }
        d
    }

    /// A client that really got a queue pair.
    pub(super) fn rdma_client(s: &ServerHandle, device: &str, lease_ms: u32) -> Client {
        let mut cfg = ClientConfig::new(rdma_endpoint(s, device));
        cfg.lease = Duration::from_millis(lease_ms.into());
        let c = Client::connect(cfg).unwrap();
        assert_eq!(c.transport(), Some(Transport::Rdma));
        c
    }

    #[test]
    #[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
    fn rdma_lock_unlock_and_a_31_command_batch() {
        let Some(dev) = device() else { return };
        let s = server(&dev, 5_000);
        assert!(s.rdma_enabled());
        let mut a = rdma_client(&s, &dev, 0);
        let mut b = rdma_client(&s, &dev, 0);
        let la = a.get_lock(LockKind::Atomic, b"one").unwrap();
        let lb = b.get_lock(LockKind::Atomic, b"one").unwrap();
        assert_eq!(
            a.trylock(la, Mode::Exclusive, 5_000).unwrap().status,
            Status::Success
        );
        assert!(
            b.trylock(lb, Mode::Exclusive, 5_000).is_err(),
            "b got a held lock"
        );
        assert_eq!(a.unlock(la).map_err(Status::from), Ok(Status::Success));
        assert_eq!(
            b.trylock(lb, Mode::Exclusive, 5_000).unwrap().status,
            Status::Success
        );
        assert_eq!(b.unlock(lb).map_err(Status::from), Ok(Status::Success));

        let names: Vec<String> = (0..31).map(|k| format!("row-{k}")).collect();
        let req: Vec<(LockKind, &[u8])> = names
            .iter()
            .map(|n| (LockKind::Atomic, n.as_bytes()))
            .collect();
        let ids: Vec<_> = a
            .batch_get_lock(&req)
            .unwrap()
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        let reqs: Vec<_> = ids.iter().map(|&id| (id, Mode::Exclusive, 5_000)).collect();
        let mut out = vec![Err(Status::Einval); 31];
        a.batch_trylock(&reqs, true, &mut out).unwrap();
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
        a.batch_unlock(&ids, &mut out).unwrap();
        assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
        a.deinit().unwrap();
        b.deinit().unwrap();
    }

    #[test]
    #[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
    fn rdma_blocking_lock_is_granted_on_unlock() {
        let Some(dev) = device() else { return };
        let s = server(&dev, 5_000);
        let mut a = rdma_client(&s, &dev, 0);
        let mut b = rdma_client(&s, &dev, 0);
        let la = a.get_lock(LockKind::Rw, b"hot").unwrap();
        let lb = b.get_lock(LockKind::Rw, b"hot").unwrap();
        let _held = a.trylock(la, Mode::Exclusive, 30_000).unwrap();
        let waiter = thread::spawn(move || {
            let t = Instant::now();
            let g = b.lock(lb, Mode::Exclusive, 30_000, Duration::from_secs(10));
            (g, t.elapsed(), b)
        });
        thread::sleep(Duration::from_millis(200));
        assert_eq!(a.unlock(la).map_err(Status::from), Ok(Status::Success));
        let (g, waited, _b) = waiter.join().unwrap();
        assert_eq!(g.unwrap().status, Status::Success);
        assert!(
            waited >= Duration::from_millis(150) && waited < Duration::from_secs(5),
            "granted after {waited:?}"
        );
    }

    #[test]
    #[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
    fn rdma_faa_cas_and_snapshot_are_one_sided_and_agree_with_the_server() {
        let Some(dev) = device() else { return };
        let s = server(&dev, 5_000);
        let mut c = rdma_client(&s, &dev, 0);
        let id = c.atomic64_create(b"csn", 10, 60).unwrap();
        assert_eq!(c.atomic64_get(b"csn", 60).unwrap(), id);
        assert_eq!(c.atomic64_faa(id, 5).map_err(Status::from), Ok(10));
        assert_eq!(c.atomic64_snapshot(id).map_err(Status::from), Ok(15));
        let swapped = c.atomic64_cas(id, 15, 100).unwrap();
        assert!(swapped.swapped && swapped.observed == 15);
        let stale = c.atomic64_cas(id, 15, 7).unwrap();
        assert!(!stale.swapped && stale.observed == 100);
        // A TCP client's view goes through the server's own handling of the same cell.
        let mut t =
            Client::connect(ClientConfig::new(Endpoint::Tcp(s.tcp_addr().unwrap()))).unwrap();
        let tid = t.atomic64_get(b"csn", 60).unwrap();
        assert_eq!(t.atomic64_snapshot(tid).map_err(Status::from), Ok(100));
        assert_eq!(t.atomic64_faa(tid, 1).map_err(Status::from), Ok(100));
        assert_eq!(c.atomic64_snapshot(id).map_err(Status::from), Ok(101));
    }

    #[test]
    #[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
    fn a_client_whose_queue_pair_dies_loses_its_locks_after_its_lease() {
        let Some(dev) = device() else { return };
        let lease_ms = 400;
        let s = server(&dev, lease_ms);
        let mut a = rdma_client(&s, &dev, lease_ms);
        let mut b = rdma_client(&s, &dev, 0);
        let la = a.get_lock(LockKind::Atomic, b"lost").unwrap();
        let lb = b.get_lock(LockKind::Atomic, b"lost").unwrap();
        let _held = a.trylock(la, Mode::Exclusive, 60_000).unwrap();
        // The queue pair goes (destroyed with its client end); the control connection stays,
        // silent.
        a.drop_data_path();
        assert!(
            b.trylock(lb, Mode::Exclusive, 60_000).is_err(),
            "freed too early"
        );
        let t = Instant::now();
        loop {
            if b.trylock(lb, Mode::Exclusive, 60_000).is_ok() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "never freed");
            thread::sleep(Duration::from_millis(50));
        }
        assert!(a.unlock(la).is_err(), "a dead client still unlocks");
    }
}
