//! End to end against a running server: 64 TCP clients contending under an oracle, a client in
//! another process over shared memory that is killed holding a lock, and hostile peers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlock_core::proto::{
    ControlHeader, ControlRequest, ControlRequestFrame, PROTO_VERSION, encode_control_request,
};
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

fn tcp_server(clients_max: u32, lease_ms: u32) -> ServerHandle {
    let core = Config {
        locks_max: 256,
        clients_max,
        objects_max: 16,
        client_lease_ms: lease_ms,
        // Every client comes from 127.0.0.1: one peer, which may use the whole table.
        clients_per_peer_max: clients_max,
        ..Config::default()
    };
    let mut cfg = ServerConfig::new(core);
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    cfg.handshake_timeout = Duration::from_millis(300);
    ServerHandle::start(cfg).unwrap()
}

#[test]
fn sixty_four_tcp_clients_never_share_an_exclusive_grant_and_tokens_only_grow() {
    let server = tcp_server(80, 10_000);
    let addr = server.tcp_addr().unwrap();
    const LOCKS: usize = 3;
    // The oracle: who holds each lock right now, and the last token seen on it.
    let holders: Vec<AtomicU32> = (0..LOCKS).map(|_| AtomicU32::new(0)).collect();
    let last_token: Vec<Mutex<u64>> = (0..LOCKS).map(|_| Mutex::new(0)).collect();
    let grants = AtomicU32::new(0);
    thread::scope(|s| {
        for t in 0..64u32 {
            let (holders, last_token, grants) = (&holders, &last_token, &grants);
            s.spawn(move || {
                let mut c = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
                let ids: Vec<_> = (0..LOCKS)
                    .map(|k| {
                        c.get_lock(LockKind::Atomic, format!("hot-{k}").as_bytes())
                            .unwrap()
                    })
                    .collect();
                for round in 0..20 {
                    let k = (t as usize + round) % LOCKS;
                    let g = match c.lock(ids[k], Mode::Exclusive, 30_000, Duration::from_secs(20)) {
                        Ok(g) => g,
                        Err(s) => panic!("client {t}: {s}"),
                    };
                    let me = c.id().get();
                    assert_eq!(
                        holders[k].swap(me, Ordering::AcqRel),
                        0,
                        "two holders of lock {k}"
                    );
                    {
                        let mut last = last_token[k].lock().unwrap();
                        assert!(g.token.0 > *last, "token {} after {}", g.token.0, *last);
                        *last = g.token.0;
                    }
                    grants.fetch_add(1, Ordering::Relaxed);
                    assert_eq!(holders[k].swap(0, Ordering::AcqRel), me);
                    assert_eq!(c.unlock(ids[k]).map_err(Status::from), Ok(Status::Success));
                }
                c.deinit().unwrap();
            });
        }
    });
    assert_eq!(grants.load(Ordering::Relaxed), 64 * 20);
}

/// Run by `a_client_process_killed_holding_a_lock_frees_it_after_its_lease` in a child process.
#[test]
#[ignore = "runs as the child of another test"]
fn child_takes_a_lock_over_shared_memory_and_waits_to_be_killed() {
    let (Ok(unix), Ok(shm)) = (
        std::env::var("DLOCK_CHILD_UNIX"),
        std::env::var("DLOCK_CHILD_SHM"),
    ) else {
        return;
    };
    let endpoint = Endpoint::Local {
        unix_socket: unix.into(),
        shm_name: shm,
    };
    let mut c = Client::connect(ClientConfig::new(endpoint)).unwrap();
    let id = c.get_lock(LockKind::Rw, b"orphaned").unwrap();
    let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
    let xid = c.atomic64_get(b"xid", 60).unwrap();
    let v = c.atomic64_faa(xid, 1).unwrap();
    println!("LOCKED {v}");
    std::io::stdout().flush().unwrap();
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_client_process_killed_holding_a_lock_frees_it_after_its_lease() {
    let name = format!("dlock-e2e-{}", std::process::id());
    let core = Config {
        locks_max: 64,
        clients_max: 8,
        objects_max: 8,
        client_lease_ms: 400,
        ..Config::default()
    };
    let mut cfg = ServerConfig::new(core);
    cfg.shm_name = Some(name.clone());
    let server = ServerHandle::start(cfg).unwrap();
    let mut me = Client::connect(ClientConfig::new(Endpoint::embedded(&server))).unwrap();
    let xid = me.atomic64_create(b"xid", 100, 60).unwrap();
    let _ = xid;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_takes_a_lock_over_shared_memory_and_waits_to_be_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("DLOCK_CHILD_UNIX", server.unix_socket())
        .env("DLOCK_CHILD_SHM", &name)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let locked = lines
        .find_map(|l| l.ok().filter(|l| l.starts_with("LOCKED")))
        .expect("child locked");
    assert_eq!(
        locked, "LOCKED 100",
        "the child's one-sided FAA saw the shared cell"
    );
    let id = me.get_lock(LockKind::Rw, b"orphaned").unwrap();
    assert_eq!(
        me.trylock(id, Mode::Shared, 1).map_err(Status::from),
        Err(Status::Fail),
        "held by the child"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let got = loop {
        match me.lock(id, Mode::Exclusive, 1, Duration::from_secs(5)) {
            Ok(g) => break g,
            Err(e) if e == Status::Etimeout && killed.elapsed() < Duration::from_secs(10) => {}
            Err(s) => panic!("{s}"),
        }
    };
    assert_eq!(got.status, Status::Success);
    let waited = killed.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "freed {waited:?} after the kill (lease 400 ms)"
    );
}

#[test]
fn hostile_peers_are_cut_off_and_the_server_keeps_serving() {
    let server = tcp_server(8, 10_000);
    let addr = server.tcp_addr().unwrap();
    let mut good = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let id = good.get_lock(LockKind::Atomic, b"still-served").unwrap();
    let closed = |mut s: TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        matches!(s.read(&mut b), Ok(0) | Err(_))
    };
    // Garbage: closed at once.
    let mut g = TcpStream::connect(addr).unwrap();
    g.write_all(&[0xAB; 64]).unwrap();
    assert!(closed(g), "garbage is answered by closing");
    // Half a frame, then silence: closed by the handshake timeout.
    let mut h = TcpStream::connect(addr).unwrap();
    h.write_all(&0xedf7_c94au32.to_le_bytes()).unwrap();
    assert!(closed(h), "a half frame never registers");
    // Never says anything.
    assert!(
        closed(TcpStream::connect(addr).unwrap()),
        "a silent connection is dropped"
    );
    // A frame that claims another client's id on a registered connection: closed.
    let mut spoof = TcpStream::connect(addr).unwrap();
    let frame = |word: u32, body: ControlRequest<'_>| {
        let header = ControlHeader {
            version: PROTO_VERSION,
            msg: body.msg_type(),
            message_id: 1,
            word,
        };
        let mut b = vec![0u8; 64];
        let n = encode_control_request(&ControlRequestFrame { header, body }, &mut b).unwrap();
        b.truncate(n);
        b
    };
    spoof
        .write_all(&frame(
            0,
            ControlRequest::ClientInit {
                min_version: PROTO_VERSION,
                lease_ms: 0,
            },
        ))
        .unwrap();
    let mut reply = [0u8; 56]; // header 16 + init reply 40
    spoof
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    spoof.read_exact(&mut reply).unwrap();
    let other = good.id().get();
    spoof
        .write_all(&frame(other, ControlRequest::Heartbeat))
        .unwrap();
    assert!(
        closed(spoof),
        "a connection speaking for another client is dropped"
    );
    // A peer that vanishes mid-frame: the server does not care.
    let mut v = TcpStream::connect(addr).unwrap();
    v.write_all(&[0x4a, 0xc9, 0xf7, 0xed, 2, 16, 18, 0, 200, 0])
        .unwrap();
    drop(v);
    // Through all of it the good client is served.
    assert_eq!(
        good.trylock(id, Mode::Exclusive, 1_000)
            .map(|g| g.status)
            .map_err(Status::from),
        Ok(Status::Success)
    );
    assert_eq!(good.unlock(id).map_err(Status::from), Ok(Status::Success));
}
