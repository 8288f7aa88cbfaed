//! What a peer can and cannot hold over TCP: another client's identity, a lease longer than the
//! server grants, or a connection it has no use for. Every test here is an attack tried against
//! a running server on loopback, with the server's counters as the witness.

#[allow(dead_code)]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::raw::{control, control_frame, register};
use dlock_core::proto::{
    ATTACH_MAGIC, Attach, ControlRequest, PROTO_VERSION, decode_control_response,
};
use dlock_core::{Config, LockKind, Mode, Session, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, read_server_stats};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};

const STEP: Duration = Duration::from_secs(5);

fn server_with(core: Config, tune: impl FnOnce(&mut ServerConfig)) -> ServerHandle {
    let mut cfg = ServerConfig::new(core);
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    tune(&mut cfg);
    ServerHandle::start(cfg).expect("server starts")
}

/// Capacities for these tests, whose clients all come from 127.0.0.1: one peer may fill the
/// whole client table (the per-peer cap has tests of its own, in `peer_cap.rs`).
fn small(clients_max: u32, lease_max_ms: u32) -> Config {
    Config {
        locks_max: 256,
        clients_max,
        clients_per_peer_max: clients_max,
        objects_max: 16,
        client_lease_ms: lease_max_ms.min(5_000),
        client_lease_max_ms: lease_max_ms,
        ..Config::default()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(STEP)).unwrap();
    s
}

/// Tries to attach a data connection as `client` with `session`; whether it was accepted.
/// A refused attach must also be closed by the server.
fn attach(addr: SocketAddr, client: u32, session: Session) -> bool {
    let mut s = connect(addr);
    let record = Attach {
        magic: ATTACH_MAGIC,
        client,
        session,
    };
    s.write_all(&record.encode()).unwrap();
    let mut status = [0u8; 4];
    s.read_exact(&mut status).expect("an attach is answered");
    if u32::from_le_bytes(status) == 0 {
        return true;
    }
    assert_eq!(
        closed_within(&mut s, STEP),
        Some(true),
        "refused and closed"
    );
    false
}

/// Whether the server closes `s` within `limit` (`None`: it sent bytes instead).
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<bool> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => Some(true),
        Ok(_) => None,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Some(false)
        }
        Err(_) => Some(true), // reset
    }
}

fn counter(addr: SocketAddr, name: &str) -> u64 {
    read_server_stats(&Endpoint::Tcp(addr), STEP)
        .expect("stats answer")
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .1
}

#[test]
fn a_client_that_knows_its_own_session_and_anothers_id_cannot_attach_as_it() {
    let server = server_with(small(8, 30_000), |_| {});
    let addr = server.tcp_addr().unwrap();
    let (mut ca, mut cb) = (connect(addr), connect(addr));
    let a = register(&mut ca, 0).unwrap();
    let b = register(&mut cb, 0).unwrap();
    assert_ne!(a.session, b.session);
    assert!(!a.session.is_none() && !b.session.is_none());

    // a knows (a.client, a.session) and b's id. Its own secret, near misses of it and of
    // nothing, and sessions of earlier and later registrations are all refused.
    let mut near = a.session;
    near.0[0] ^= 0x80;
    let mut later = Vec::new();
    for _ in 0..4 {
        let mut s = connect(addr);
        later.push(register(&mut s, 0).unwrap().session);
    }
    let guesses = [a.session, near, Session::NONE]
        .into_iter()
        .chain(later.iter().copied())
        .collect::<Vec<_>>();
    for guess in &guesses {
        assert!(
            !attach(addr, b.client, *guess),
            "attached as b with a guess"
        );
    }
    assert_eq!(counter(addr, "sessions_refused"), guesses.len() as u64);

    // Nor can it resume b's registration with any of them.
    let reinit = ControlRequest::ClientReinit {
        min_version: PROTO_VERSION,
        lease_ms: 0,
        session: a.session,
    };
    let mut s = connect(addr);
    let reply = control(&mut s, b.client, reinit).unwrap();
    let reply = decode_control_response(&reply).unwrap();
    assert_eq!(reply.header.status(), Some(Status::Einval));

    // b's own secret works.
    assert!(attach(addr, b.client, b.session));
}

#[test]
fn a_lease_above_the_maximum_is_granted_as_the_maximum_and_a_killed_holder_frees_its_lock() {
    let server = server_with(small(8, 400), |_| {});
    let addr = server.tcp_addr().unwrap();
    let mut ctl = connect(addr);
    let init = register(&mut ctl, u32::MAX).unwrap();
    assert_eq!(init.lease_ms, 400, "the reply says what was granted");
    assert_eq!(counter(addr, "leases_capped"), 1);

    // A client that asked for the longest lease it could takes a shared RW lock and is killed
    // (its connections go without a deinit).
    let mut cfg = ClientConfig::new(Endpoint::Tcp(addr));
    cfg.lease = Duration::MAX;
    let mut holder = Client::connect(cfg).unwrap();
    assert_eq!(
        holder.lease(),
        Duration::from_millis(400),
        "granted the maximum"
    );
    let lock = holder.get_lock(LockKind::Rw, b"rg/7").unwrap();
    let _ = holder.trylock(lock, Mode::Shared, 0).unwrap();
    let killed = Instant::now();
    drop(holder);

    let mut writer = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let lw = writer.get_lock(LockKind::Rw, b"rg/7").unwrap();
    let grant = writer
        .lock(lw, Mode::Exclusive, 0, Duration::from_secs(5))
        .expect("the killed reader's hold is released");
    assert_eq!(grant.status, Status::Success);
    let waited = killed.elapsed();
    assert!(
        waited < Duration::from_millis(400 + 1_000),
        "freed within the maximum lease (plus a tick): {waited:?}"
    );
}

#[test]
fn a_registered_connection_is_closed_when_its_client_expires_or_deinits() {
    let server = server_with(small(8, 200), |cfg| {
        cfg.handshake_timeout = Duration::from_millis(1_000);
    });
    let addr = server.tcp_addr().unwrap();
    let mut silent = connect(addr);
    let me = register(&mut silent, 0).unwrap();
    // Past its 200 ms lease the client is gone: told so if it asks in time...
    std::thread::sleep(Duration::from_millis(400));
    let reply = control(&mut silent, me.client, ControlRequest::Heartbeat).expect("answered");
    assert_eq!(
        decode_control_response(&reply).unwrap().header.status(),
        Some(Status::ClientNotInit)
    );
    // ...and then its connection is closed.
    assert_eq!(
        closed_within(&mut silent, Duration::from_secs(3)),
        Some(true)
    );

    let mut leaving = connect(addr);
    let me = register(&mut leaving, 0).unwrap();
    let reply = control(&mut leaving, me.client, ControlRequest::ClientDeinit).expect("deinit");
    assert_eq!(
        decode_control_response(&reply).unwrap().header.status(),
        Some(Status::Success)
    );
    assert_eq!(
        closed_within(&mut leaving, Duration::from_secs(3)),
        Some(true)
    );
    assert!(counter(addr, "connections_of_gone_clients") >= 2);
}

#[test]
fn half_a_frame_on_a_registered_connection_is_given_up_after_the_frame_timeout() {
    let server = server_with(small(8, 30_000), |cfg| {
        cfg.frame_timeout = Duration::from_millis(300);
    });
    let addr = server.tcp_addr().unwrap();
    let mut s = connect(addr);
    let me = register(&mut s, 0).unwrap();
    // A heartbeat's first 10 of 16 bytes, and then nothing.
    let frame = control_frame(me.client, ControlRequest::Heartbeat);
    s.write_all(&frame[..frame.len() - 6]).unwrap();
    let sent = Instant::now();
    assert_eq!(closed_within(&mut s, Duration::from_secs(3)), Some(true));
    assert!(sent.elapsed() >= Duration::from_millis(300));
    assert_eq!(counter(addr, "connections_timed_out"), 1);
}

/// 4,000 connections that register (or try to) and go silent: `dlock stat` answers at once,
/// and a new client registers as soon as the silent ones' leases (capped at the maximum) end.
#[test]
fn four_thousand_silent_registrations_do_not_lock_out_a_new_client_or_stats() {
    const SILENT: usize = 4_000;
    let server = server_with(small(1_000, 500), |cfg| {
        cfg.connections_max = 4_000;
        cfg.handshake_timeout = Duration::from_millis(500);
    });
    let addr = server.tcp_addr().unwrap();
    let mut silent = Vec::with_capacity(SILENT);
    let mut registered = 0u64;
    for _ in 0..SILENT {
        let Ok(mut s) = TcpStream::connect(addr) else {
            continue; // refused at the cap: counted below
        };
        s.set_read_timeout(Some(STEP)).unwrap();
        if register(&mut s, u32::MAX).is_ok() {
            registered += 1;
        }
        silent.push(s);
    }
    // Leases end while the loop runs (500 ms at most), so more than the table's 1,000 get in.
    assert!(registered >= 1_000, "{registered} registrations");

    let t = Instant::now();
    let stats = read_server_stats(&Endpoint::Tcp(addr), STEP).expect("stats answer");
    assert!(t.elapsed() < STEP);
    assert!(stats.iter().any(|&(n, _)| n == "clients_registered"));

    // A new client gets in once the silent registrations' leases (500 ms at most) are over.
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        match Client::connect(ClientConfig::new(Endpoint::Tcp(addr))) {
            Ok(c) => break c,
            Err(s) if Instant::now() < deadline => {
                assert_eq!(s, Status::ServerNoResource, "only a full table refuses");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(s) => panic!("still locked out after 10 s: {s}"),
        }
    };
    client.deinit().unwrap();
    // Every silent registration ends within its (capped) lease, and its connection with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(addr, "connections_of_gone_clients") < registered {
        assert!(
            Instant::now() < deadline,
            "silent registrations still hold connections"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_unix_socket_is_owner_only_unless_opened_to_the_group() {
    use std::os::unix::fs::PermissionsExt;
    for (group, mode) in [(false, 0o600), (true, 0o660)] {
        let server = server_with(small(8, 30_000), |cfg| cfg.group_access = group);
        let meta = std::fs::metadata(server.unix_socket()).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o777,
            mode,
            "group access {group}"
        );
    }
}

#[test]
fn a_connection_cap_that_leaves_registered_clients_no_room_is_refused_at_start() {
    let mut cfg = ServerConfig::new(small(100, 30_000));
    cfg.connections_max = 200; // 100 clients × 2: nothing left to register or read stats with
    let err = ServerHandle::start(cfg).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("connections_max"), "{err}");
}

/// A session key: 32 bytes from a CSPRNG (once, by hand).
const KEY: [u8; 32] = [
    0x3c, 0x9a, 0x51, 0xe2, 0x07, 0xbd, 0x68, 0x14, 0xf9, 0x2e, 0x85, 0xc0, 0x4b, 0x76, 0xd3, 0x1f,
    0xa8, 0x62, 0x0d, 0x97, 0xee, 0x35, 0x5a, 0xc4, 0x81, 0x2b, 0xf0, 0x49, 0xb6, 0x13, 0x7d, 0xdc,
];

/// A server that would recover without a session key hands client ids to whoever asks first
/// (the genuine client is then refused); it starts only when the operator says so.
#[test]
fn a_recovering_server_without_a_session_key_starts_only_when_told_to() {
    let recovering = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small(8, 30_000)
    };
    let err = ServerHandle::start(ServerConfig::new(recovering)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("without a session key"), "{err}");
    let mut cfg = ServerConfig::new(recovering);
    cfg.insecure_recovery = true;
    ServerHandle::start(cfg).expect("told to").stop();
    let mut cfg = ServerConfig::new(recovering);
    cfg.session_key = Some(dlock_core::SessionKey::new(KEY).unwrap());
    ServerHandle::start(cfg).expect("with a key").stop();
}

/// After a failover, a replacement server that shares the failed one's session key takes back
/// the client that comes with its session, and refuses a peer that only knows its id — which,
/// without the key, could re-register as the client and claim its locks.
#[test]
fn a_replacement_server_with_the_shared_key_refuses_a_peer_claiming_anothers_id() {
    let key = dlock_core::SessionKey::new(KEY).unwrap();
    let first = server_with(small(8, 30_000), |cfg| cfg.session_key = Some(key.clone()));
    let addr = first.tcp_addr().unwrap();
    let mut victim = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let lock = victim.get_lock(LockKind::Atomic, b"orders/rg-17").unwrap();
    let held = victim.trylock(lock, Mode::Exclusive, 60_000).unwrap();
    assert_eq!(held.status, Status::Success);
    first.stop();

    let replacement = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small(8, 30_000)
    };
    let second = server_with(replacement, |cfg| {
        cfg.tcp = Some(TcpConfig::new(addr));
        cfg.session_key = Some(key.clone());
    });
    // The attacker gets there first, with the victim's id and any session it can make up.
    let mut attacker = connect(addr);
    let reinit = ControlRequest::ClientReinit {
        min_version: PROTO_VERSION,
        lease_ms: 0,
        session: dlock_core::Session([0x13; dlock_core::Session::LEN]),
    };
    let reply = control(&mut attacker, victim.id().get(), reinit).expect("answered");
    assert_eq!(
        decode_control_response(&reply).unwrap().header.status(),
        Some(Status::Einval)
    );
    // The victim comes back with its session and gets its lock back.
    assert_eq!(
        victim.reinit().map_err(Status::from),
        Ok(true),
        "the replacement is recovering"
    );
    victim.update_all_locks().unwrap();
    victim.reinit_done().unwrap();
    assert_eq!(counter(addr, "sessions_refused"), 1);
    let mut rival = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let rival_lock = rival.get_lock(LockKind::Atomic, b"orders/rg-17").unwrap();
    assert_eq!(
        rival
            .trylock(rival_lock, Mode::Exclusive, 1_000)
            .map(|g| g.status)
            .map_err(Status::from),
        Err(Status::Fail),
        "the victim still holds it"
    );
    drop(second);
}

/// The thief, end to end: a client the failed server really registered (its session
/// was minted under the shared key) re-registers first and claims a lock it never held. The
/// replacement refuses the claim, since it comes without the proof the failed server gave the
/// holder, and the holder, coming second, gets its lock back.
#[test]
fn a_registered_client_cannot_reclaim_a_lock_it_never_held() {
    let key = dlock_core::SessionKey::new(KEY).unwrap();
    let first = server_with(small(8, 30_000), |cfg| cfg.session_key = Some(key.clone()));
    let addr = first.tcp_addr().unwrap();
    let mut holder = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let lock = holder.get_lock(LockKind::Rw, b"orders/rg-17").unwrap();
    let token = holder.trylock(lock, Mode::Exclusive, 60_000).unwrap().token;
    let mut t = connect(addr);
    let thief = register(&mut t, 30_000).expect("the thief registers");
    first.stop();

    let replacement = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small(8, 30_000)
    };
    let second = server_with(replacement, |cfg| {
        cfg.tcp = Some(TcpConfig::new(addr));
        cfg.session_key = Some(key.clone());
    });
    let mut t = connect(addr);
    let reinit = ControlRequest::ClientReinit {
        min_version: PROTO_VERSION,
        lease_ms: 30_000,
        session: thief.session,
    };
    let reply = control(&mut t, thief.client, reinit).expect("answered");
    assert_eq!(
        decode_control_response(&reply).unwrap().header.status(),
        Some(Status::Success),
        "a genuine client comes back"
    );
    // The holder's token is easy to guess (tokens count up); its proof is not.
    for mac in [[0u8; 16], [0x5A; 16]] {
        let steal = dlock_core::proto::LockClaim {
            value: None,
            kind: LockKind::Rw,
            held: dlock_core::proto::Held::Exclusive,
            name: b"orders/rg-17",
            old_lock: lock.raw(),
            word: 0,
            ticket: dlock_core::Ticket::default(),
            remaining_ms: 60_000,
            age_ms: 1,
            token: token.0,
            proof: dlock_core::GrantProof { epoch: 1, mac },
        };
        let claims = [steal];
        let body = ControlRequest::BatchUpdateLocks(dlock_core::proto::Batch::from_slice(&claims));
        let reply = control(&mut t, thief.client, body).expect("answered");
        let reply = decode_control_response(&reply).unwrap();
        let dlock_core::proto::ControlResponse::Entries(e) = reply.body else {
            panic!("claims answered per entry: {reply:?}");
        };
        assert_eq!(e.get(0).map(|e| e.status), Some(Status::Einval));
    }
    assert_eq!(holder.reinit().map_err(Status::from), Ok(true));
    holder.update_all_locks().unwrap();
    holder.reinit_done().unwrap();
    let reply = control(&mut t, thief.client, ControlRequest::ReinitDone).expect("answered");
    assert_eq!(
        decode_control_response(&reply).unwrap().header.status(),
        Some(Status::Success)
    );
    let lock = holder.get_lock(LockKind::Rw, b"orders/rg-17").unwrap();
    assert_eq!(
        holder
            .trylock(lock, Mode::Exclusive, 60_000)
            .map(|g| g.status)
            .map_err(Status::from),
        Ok(Status::AlreadyLocked),
        "the holder kept it"
    );
    let mut rival = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let theirs = rival.get_lock(LockKind::Rw, b"orders/rg-17").unwrap();
    assert_eq!(
        rival
            .trylock(theirs, Mode::Exclusive, 1_000)
            .map(|g| g.status)
            .map_err(Status::from),
        Err(Status::Fail)
    );
    drop(second);
}
