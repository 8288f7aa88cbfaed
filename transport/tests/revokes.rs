//! Cached grants revoked end to end, over every data path a client can have — shared memory,
//! its own TCP connection, a TCP connection shared through a `Mux`: a conflicting request
//! makes the server send the cached holder a revoke, the holder gives the lock back and the
//! waiter is granted; the minimum hold is respected; an ignored revoke loses the grant at the
//! revoke timeout (at the lease for a client below protocol 7, which was told no timeout);
//! revokes beyond what a client can hold come out as an overflow.

mod common;

use std::time::{Duration, Instant};

use dlock_core::manager::Timing;
use dlock_core::proto::Event;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Mux};
use dlock_transport::runtime::ServerHandle;

const LONG: u32 = 60_000;

/// The three ways a client reaches the server's data path.
#[derive(Clone, Copy, Debug)]
enum Path {
    SharedMemory,
    Tcp,
    Mux,
}

const PATHS: [Path; 3] = [Path::SharedMemory, Path::Tcp, Path::Mux];

/// A client of `s` over `path` (a fresh `Mux` for `Path::Mux`).
fn client(s: &ServerHandle, path: Path) -> Client {
    let tcp = Endpoint::Tcp(s.tcp_addr().expect("tcp"));
    match path {
        Path::SharedMemory => common::client(&Endpoint::embedded(s)),
        Path::Tcp => common::client(&tcp),
        Path::Mux => {
            let mux = Mux::new(&tcp).expect("mux");
            Client::connect(ClientConfig::new(tcp).with_mux(mux)).expect("registers")
        }
    }
}

/// Polls `c` until `enough` says the events collected are enough, for at most 10 s.
fn events_until(c: &mut Client, enough: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let until = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while !enough(&got) && Instant::now() < until {
        c.poll_events(|e| got.push(e)).expect("poll");
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// `a` holds `name` exclusively and cached; returns its id and the grant's token.
fn cached_writer(a: &mut Client, name: &[u8]) -> (LockId, u64) {
    let id = a.get_lock(LockKind::Rw, name).unwrap();
    a.set_cacheable(id, true).unwrap();
    let g = a.trylock(id, Mode::Exclusive, LONG).unwrap();
    (id, g.token.0)
}

/// A thread of a new client over `path` waiting up to 20 s for `name` exclusively.
fn waiter(s: &ServerHandle, path: Path, name: String) -> std::thread::JoinHandle<Status> {
    let mut b = client(s, path);
    std::thread::spawn(move || {
        let id = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        match b.lock(id, Mode::Exclusive, LONG, Duration::from_secs(20)) {
            Ok(g) => g.status,
            Err(e) => e.status(),
        }
    })
}

#[test]
fn a_conflicting_request_revokes_the_cached_holder_which_gives_back_to_the_waiter() {
    // The default timing: a 5 ms minimum hold, revokes that lapse after the holder's lease.
    let s = common::server(true);
    for path in PATHS {
        let mut a = client(&s, path);
        let name = format!("page-{path:?}");
        let (id, token) = cached_writer(&mut a, name.as_bytes());
        let b = waiter(&s, path, name);
        let got = events_until(&mut a, |e| !e.is_empty());
        let revoke = Event::Revoke {
            lock: id,
            wanted: Mode::Exclusive,
            fence: token,
        };
        assert_eq!(got, vec![revoke], "{path:?}");
        assert!(
            !b.is_finished(),
            "{path:?}: the waiter waits for the holder"
        );
        assert_eq!(a.unlock(id).unwrap(), Status::Success);
        assert_eq!(b.join().unwrap(), Status::Success, "{path:?}");
        a.release_lock(id).unwrap();
    }
}

#[test]
fn the_revoke_waits_for_the_end_of_the_minimum_hold() {
    let hold = Duration::from_millis(300);
    let s = common::timed_server(
        true,
        Timing {
            min_hold_ms: hold.as_millis() as u32,
            revoke_timeout_ms: 0,
            contention_window_ms: 0,
        },
    );
    for path in PATHS {
        let mut a = client(&s, path);
        let granted = Instant::now();
        let name = format!("hot-{path:?}");
        let (id, _) = cached_writer(&mut a, name.as_bytes());
        let b = waiter(&s, path, name);
        let got = events_until(&mut a, |e| !e.is_empty());
        assert!(
            granted.elapsed() >= hold,
            "{path:?}: revoked inside the hold"
        );
        assert!(
            matches!(got[..], [Event::Revoke { .. }]),
            "{path:?}: {got:?}"
        );
        assert_eq!(a.unlock(id).unwrap(), Status::Success);
        assert_eq!(b.join().unwrap(), Status::Success, "{path:?}");
        a.release_lock(id).unwrap();
    }
}

#[test]
fn an_ignored_revoke_loses_the_grant_at_the_revoke_timeout() {
    let timeout = Duration::from_millis(200);
    let s = common::timed_server(
        true,
        Timing {
            min_hold_ms: 0,
            revoke_timeout_ms: timeout.as_millis() as u32,
            contention_window_ms: 0,
        },
    );
    for path in PATHS {
        let mut a = client(&s, path);
        let name = format!("stuck-{path:?}");
        let (id, _) = cached_writer(&mut a, name.as_bytes());
        let asked = Instant::now();
        let b = waiter(&s, path, name);
        assert_eq!(b.join().unwrap(), Status::Success, "{path:?}");
        assert!(
            asked.elapsed() >= timeout,
            "{path:?}: lost before the timeout"
        );
        let got = events_until(&mut a, |e| !e.is_empty());
        // Over a stream the client was told the server's 200 ms at registration and lived on
        // its cache past it: the trust bound's overflow comes too (`manager::trust`).
        let revokes: Vec<&Event> = got.iter().filter(|e| **e != Event::Overflow).collect();
        assert!(
            matches!(revokes[..], [Event::Revoke { .. }]),
            "{path:?}: {got:?}"
        );
        // The grant is gone on the server: the holder's unlock is refused.
        let refused = a.unlock(id).unwrap_err();
        assert_eq!(refused.status(), Status::Fail, "{path:?}");
    }
}

/// A client capped at protocol 6 (`ClientConfig::version_max` during a rolling upgrade, or a
/// node of an older release) is told no revoke timeout and trusts its cached grant for its
/// lease. Its ignored revoke lapses at that lease, not at the server's shorter revoke timeout:
/// had a revoke been delayed on the wire past the timeout, the grant given to another then
/// would still be handed out by the client — two writers. The holder stays alive meanwhile,
/// so the grant goes by the lapse, not by its lease running out.
#[test]
fn an_ignored_revoke_of_a_client_below_protocol_7_lapses_at_its_lease() {
    let s = common::timed_server(
        true,
        Timing {
            min_hold_ms: 0,
            revoke_timeout_ms: 100,
            contention_window_ms: 0,
        },
    );
    let tcp = Endpoint::Tcp(s.tcp_addr().expect("tcp"));
    let lease = Duration::from_millis(1_500);
    let cfg = ClientConfig::new(tcp).with_version_max(6).with_lease(lease);
    let mut a = Client::connect(cfg).expect("registers");
    assert_eq!((a.version(), a.lease()), (6, lease));
    assert_eq!(
        a.revoke_timeout(),
        lease,
        "told no revoke timeout: the lease"
    );
    let (id, _) = cached_writer(&mut a, b"old-release");
    let asked = Instant::now();
    let b = waiter(&s, Path::Tcp, "old-release".to_owned());
    while !b.is_finished() {
        a.heartbeat().expect("alive");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.join().unwrap(), Status::Success);
    // (Less a few milliseconds: the server's clock counts whole ones.)
    let lapse = lease - Duration::from_millis(5);
    assert!(
        asked.elapsed() >= lapse,
        "given to another inside the lease"
    );
    // Lapsed, not expired: a is still registered, and its unlock is refused.
    a.heartbeat().expect("still registered");
    assert_eq!(a.unlock(id).unwrap_err().status(), Status::Fail);
}

#[test]
fn revokes_beyond_what_the_client_holds_come_out_as_an_overflow() {
    let s = common::timed_server(
        true,
        Timing {
            min_hold_ms: 0,
            revoke_timeout_ms: 0,
            contention_window_ms: 0,
        },
    );
    let n = dlock_core::table::EVENT_RING_LEN + 6;
    for path in PATHS {
        let (mut a, mut b) = (client(&s, path), client(&s, path));
        let mut ids = Vec::new();
        for i in 0..n {
            let name = format!("rg-{path:?}-{i}");
            let (id, _) = cached_writer(&mut a, name.as_bytes());
            let theirs = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
            // A trylock that does not wait fails at once, and its revoke still goes out.
            let refused = b.trylock(theirs, Mode::Exclusive, LONG).unwrap_err();
            assert_eq!(refused.status(), Status::Fail);
            ids.push(id);
        }
        // Nothing was read meanwhile: a client holds one ring's worth, then counts the loss.
        std::thread::sleep(Duration::from_millis(200));
        let got = events_until(&mut a, |e| {
            e.len() == n || (e.contains(&Event::Overflow) && e.len() > 64)
        });
        let revoked = got
            .iter()
            .filter(|e| matches!(e, Event::Revoke { lock, .. } if ids.contains(lock)))
            .count();
        let overflowed = got.contains(&Event::Overflow);
        assert!(
            revoked == n || (overflowed && revoked <= 64),
            "{path:?}: {revoked} revokes, overflow {overflowed}"
        );
        if let Path::SharedMemory = path {
            assert_eq!(
                (revoked, got[0]),
                (64, Event::Overflow),
                "the ring holds 64"
            );
        }
    }
}
