//! Cached RW locks through the client's [`CachedLocks`], over shared memory and TCP: a guard
//! taken again is local (no data message reaches the server), a conflicting request of another
//! client gets the lock once the holder's local users are done (given back by the holder
//! itself, or downgraded for a reader), and a revoke for a lock the handle does not hold is
//! ignored.

mod common;

use std::time::{Duration, Instant};

use dlock_core::manager::Timing;
use dlock_core::proto::Event;
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::{
    CachedLocks, Client, ClientConfig, Endpoint, ErrorKind, Revoked, read_server_stats,
};
use dlock_transport::runtime::ServerHandle;

const WAIT: Duration = Duration::from_secs(20);

fn endpoints(s: &ServerHandle) -> [Endpoint; 2] {
    [
        Endpoint::embedded(s),
        Endpoint::Tcp(s.tcp_addr().expect("tcp")),
    ]
}

/// Counter `name` as `dlock stat` reads it.
fn counter(s: &ServerHandle, name: &str) -> u64 {
    let stats = read_server_stats(&Endpoint::embedded(s), Duration::from_secs(5)).unwrap();
    stats
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, v)| v)
        .expect("the server has the counter")
}

/// Data messages the server has handled so far.
fn data_messages(s: &ServerHandle) -> u64 {
    counter(s, "data_messages")
}

/// Polls `locks`' revoke channel until a notice comes, for at most 10 s.
fn next_revoke(locks: &CachedLocks) -> Revoked {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Some(r) = locks.revokes().try_recv().expect("poll") {
            return r;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no revoke came");
}

/// A thread of a new plain client of `e` waiting up to 20 s for `name` in `mode`, which it
/// unlocks once granted.
fn waiter(e: &Endpoint, name: &str, mode: Mode) -> std::thread::JoinHandle<Status> {
    let mut b = Client::connect(ClientConfig::new(e.clone())).expect("registers");
    let name = name.to_owned();
    std::thread::spawn(move || {
        let id = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        match b.lock(id, mode, 60_000, WAIT) {
            Ok(g) => {
                assert_eq!(b.unlock(id).unwrap(), Status::Success);
                g.status
            }
            Err(e) => e.status(),
        }
    })
}

#[test]
fn a_cached_guard_is_taken_again_locally_without_a_message() {
    let s = common::server(true);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let a = CachedLocks::connect(ClientConfig::new(e)).unwrap();
        let page = a.rw(format!("page-{n}")).unwrap();
        let first = page.try_write().unwrap();
        let token = first.token();
        drop(first);
        assert_eq!(page.held(), Some(Mode::Exclusive), "kept after the guard");
        let before = (data_messages(&s), a.local_hits());
        let again = page.try_write().unwrap();
        assert_eq!(again.token(), token, "the same grant");
        drop(again);
        let readers = (page.try_read().unwrap(), page.try_read().unwrap());
        assert!(page.try_write().unwrap_err().is_would_block());
        drop(readers);
        assert_eq!(
            data_messages(&s),
            before.0,
            "{n}: no message for a local guard"
        );
        assert_eq!(a.local_hits(), before.1 + 3);
    }
}

#[test]
fn a_conflicting_request_gets_the_lock_after_the_holders_local_users_finish() {
    let s = common::server(true);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("hot-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let page = a.rw(&name).unwrap();
        drop(page.try_write().unwrap());
        let reader = page.try_read().unwrap();
        let b = waiter(&e, &name, Mode::Exclusive);
        let revoke = next_revoke(&a);
        assert_eq!(
            revoke,
            Revoked::Lock {
                lock: page.id().unwrap(),
                wanted: Mode::Exclusive
            }
        );
        // Asked back with a user live: kept until it is done, and no new local user.
        assert_eq!(page.held(), Some(Mode::Exclusive));
        let refused = page.try_read().unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::WouldBlock, "{n}");
        assert!(!b.is_finished(), "{n}: the waiter waits for the local user");
        drop(reader);
        assert_eq!(
            page.held(),
            None,
            "{n}: given back by the last guard's drop"
        );
        assert_eq!(b.join().unwrap(), Status::Success, "{n}");
        assert_eq!(counter(&s, "revokes_sent"), n as u64 + 1, "{n}");
        assert_eq!(counter(&s, "revokes_given_back"), n as u64 + 1, "{n}");
        // b unlocked: the lock is free again, asked of the server.
        let back = page.read(WAIT).unwrap();
        assert_eq!(page.held(), Some(Mode::Shared));
        drop(back);
    }
}

#[test]
fn a_reader_wanting_the_lock_gets_it_by_a_downgrade_and_the_holder_keeps_reading() {
    let s = common::server(true);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("read-mostly-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let page = a.rw(&name).unwrap();
        drop(page.try_write().unwrap());
        // A local reader stays through the downgrade: the shared grant still covers it.
        let reader = page.try_read().unwrap();
        let b = waiter(&e, &name, Mode::Shared);
        let revoke = next_revoke(&a);
        assert_eq!(
            revoke,
            Revoked::Lock {
                lock: page.id().unwrap(),
                wanted: Mode::Shared
            }
        );
        assert_eq!(b.join().unwrap(), Status::Success, "{n}");
        assert_eq!(
            page.held(),
            Some(Mode::Shared),
            "{n}: downgraded, not given up"
        );
        drop(reader);
        assert_eq!(counter(&s, "downgrades"), n as u64 + 1, "{n}");
        let before = data_messages(&s);
        drop(page.try_read().unwrap());
        assert_eq!(data_messages(&s), before, "{n}: still read locally");
    }
}

#[test]
fn a_revoke_for_a_lock_the_handle_does_not_hold_is_ignored() {
    let s = common::server(true);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("elsewhere-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let known = a.rw(format!("known-{n}")).unwrap();
        drop(known.try_write().unwrap());
        // A cached grant the handle knows nothing of: taken through the client directly.
        let id = a.with_client(|c| {
            let id = c.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
            c.set_cacheable(id, true).unwrap();
            let _g = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
            id
        });
        let mut b = Client::connect(ClientConfig::new(e.clone())).unwrap();
        let theirs = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        // Past the minimum hold, b's try sends a's client a revoke and is refused at once.
        std::thread::sleep(Duration::from_millis(20));
        assert!(b.trylock(theirs, Mode::Exclusive, 60_000).is_err());
        // Then a revoke of a lock the handle holds, which comes after it.
        let k = b
            .get_lock(LockKind::Rw, format!("known-{n}").as_bytes())
            .unwrap();
        assert!(b.trylock(k, Mode::Exclusive, 60_000).is_err());
        // The handle reads both, tells of the second only and gives back only that one.
        let revoke = next_revoke(&a);
        let wanted = Mode::Exclusive;
        let lock = known.id().unwrap();
        assert_eq!(revoke, Revoked::Lock { lock, wanted }, "{n}");
        assert_eq!(known.held(), None);
        let held = a.with_client(|c| c.local_lock(id).and_then(|l| l.state.held_mode()));
        assert_eq!(held, Some(Mode::Exclusive), "{n}");
        assert!(b.trylock(theirs, Mode::Exclusive, 60_000).is_err(), "{n}");
    }
}

#[test]
fn a_block_a_local_writer_sets_is_read_locally_and_reaches_the_next_holder() {
    let s = common::server(true);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("lsn-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let page = a.rw(&name).unwrap();
        page.set_value_blocks(true).unwrap();
        let mut w = page.try_write().unwrap();
        assert!(w.set_value(&[0u8; 33]).is_err(), "longer than a block");
        w.set_value(b"lsn 42").unwrap();
        drop(w);
        let r = page.try_read().unwrap();
        let local = r.value().expect("asked for");
        assert_eq!(
            &local.block.0[..6],
            b"lsn 42",
            "{n}: a local reader sees it"
        );
        drop(r);
        // Another client takes the lock: the give-back writes the block on the server.
        let mut b = Client::connect(ClientConfig::new(e.clone())).unwrap();
        let theirs = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        b.set_value_blocks(theirs, true).unwrap();
        let t = std::thread::spawn(move || {
            let g = b.lock(theirs, Mode::Exclusive, 60_000, WAIT).unwrap();
            g.value.expect("asked for")
        });
        next_revoke(&a);
        let got = t.join().unwrap();
        assert!(got.valid, "{n}");
        assert_eq!(&got.block.0[..6], b"lsn 42", "{n}");
    }
}

#[test]
fn a_revoke_ends_a_wait_that_asked_for_it_so_the_holder_can_give_back() {
    let s = common::revoke_server(true);
    for e in endpoints(&s) {
        let at = format!("{e:?}");
        let mut a = Client::connect(ClientConfig::new(e.clone())).unwrap();
        let mut c = Client::connect(ClientConfig::new(e.clone())).unwrap();
        // a caches x; c holds y plain.
        let x = a.get_lock(LockKind::Rw, b"wake-x").unwrap();
        a.set_cacheable(x, true).unwrap();
        assert_eq!(
            a.trylock(x, Mode::Exclusive, 60_000).unwrap().status,
            Status::Success
        );
        let yc = c.get_lock(LockKind::Rw, b"wake-y").unwrap();
        assert_eq!(
            c.trylock(yc, Mode::Exclusive, 60_000).unwrap().status,
            Status::Success
        );
        let ya = a.get_lock(LockKind::Rw, b"wake-y").unwrap();
        a.set_wake_on_revoke(ya, true).unwrap();
        // a waits for y far longer than anyone waits for x.
        let parked = counter(&s, "waits");
        let holder = std::thread::spawn(move || {
            let waited = a.lock(ya, Mode::Exclusive, 60_000, Duration::from_secs(120));
            let mut revoked = false;
            a.poll_events(|ev| revoked |= matches!(ev, Event::Revoke { lock, .. } if lock == x))
                .unwrap();
            // Back from its wait with the revoke read, a gives x back.
            assert_eq!(a.unlock(x).unwrap(), Status::Success);
            (waited.map(|g| g.status).map_err(|e| e.status()), revoked)
        });
        while counter(&s, "waits") == parked {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Only now, with a parked, b asks for x: its revoke must reach a inside its wait.
        let b = waiter(&e, "wake-x", Mode::Exclusive);
        assert_eq!(b.join().unwrap(), Status::Success, "{at}");
        let (waited, revoked) = holder.join().unwrap();
        assert_eq!(
            waited,
            Err(Status::Etimeout),
            "a's wait was cut short: {at}"
        );
        assert!(revoked, "{at}");
        assert_eq!(c.unlock(yc).unwrap(), Status::Success, "y stayed c's: {at}");
    }
}

/// The plain client's view of protocol 8: a cacheable acquisition on a contended lock is
/// granted with `plain` set, and no revoke notice follows it.
#[test]
fn a_plain_clients_grant_on_a_contended_lock_says_it_is_plain() {
    let s = common::contended_server();
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("plain-{n}");
        let mut a = Client::connect(ClientConfig::new(e.clone())).unwrap();
        let id = a.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        a.set_cacheable(id, true).unwrap();
        let g = a.trylock(id, Mode::Exclusive, 60_000).unwrap();
        assert!(!g.plain, "{n}: not contended yet: cached");
        let b = waiter(&e, &name, Mode::Exclusive);
        let until = Instant::now() + Duration::from_secs(10);
        let mut revoked = false;
        while !revoked && Instant::now() < until {
            a.poll_events(|e| revoked |= matches!(e, Event::Revoke { .. }))
                .unwrap();
        }
        assert!(revoked, "{n}");
        assert_eq!(a.unlock(id).unwrap(), Status::Success);
        assert_eq!(b.join().unwrap(), Status::Success, "{n}");
        let g = a.trylock(id, Mode::Exclusive, 60_000).unwrap();
        assert!(g.plain, "{n}: granted plain, and the grant says so");
        // Give a notice time to come, were one sent.
        std::thread::sleep(Duration::from_millis(20));
        // No revoke for this grant (one for the earlier, cached grant may still be on its way,
        // and names that grant's older token).
        let mut notices = Vec::new();
        a.poll_events(|e| {
            if matches!(e, Event::Revoke { fence, .. } if fence >= g.token.0) {
                notices.push(e);
            }
        })
        .unwrap();
        assert_eq!(notices, vec![], "{n}: no notice");
        assert_eq!(a.unlock(id).unwrap(), Status::Success);
    }
}

/// A cacheable request on a lock a conflict revoked within the contention window is granted
/// plain, and the handle, told by the revoke that follows the grant, gives the lock back after
/// its guard instead of keeping it (`manager::contention`): a later conflict finds the lock free
/// and sends no revoke.
#[test]
fn a_cacheable_grant_on_a_contended_lock_is_granted_plain_and_unlocked_with_its_guard() {
    let s = common::contended_server();
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("fought-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let page = a.rw(&name).unwrap();
        drop(page.try_write().unwrap());
        // b's conflict revokes a's cached grant: the lock is contended from now on.
        let b = waiter(&e, &name, Mode::Exclusive);
        let _ = next_revoke(&a);
        assert_eq!(b.join().unwrap(), Status::Success, "{n}");
        assert_eq!(counter(&s, "revokes_sent"), n as u64 + 1, "{n}");
        // a asks again: granted plain, which the grant's result says (protocol 8), so the
        // guard's drop is the plain unlock, and no notice comes.
        let again = page.try_write().unwrap();
        assert_eq!(page.held(), Some(Mode::Exclusive), "{n}");
        drop(again);
        assert_eq!(
            page.held(),
            None,
            "{n}: given back with the guard, not kept"
        );
        assert_eq!(
            a.revokes().try_recv().expect("poll"),
            None,
            "{n}: no notice"
        );
        // A conflict now finds the lock free: granted with no revoke sent.
        assert_eq!(
            waiter(&e, &name, Mode::Exclusive).join().unwrap(),
            Status::Success
        );
        assert_eq!(counter(&s, "revokes_sent"), n as u64 + 1, "{n}: no revoke");
    }
}

/// `Client::events_may_wait`, which lets a client holding nothing cached skip its look at the
/// events: only while the trust bound holds (over TCP, the revoke timeout after the last
/// answered request; a shared-memory ring is always trusted) and no broken channel owes its
/// report.
#[test]
fn events_may_wait_only_while_the_trust_bound_holds_and_no_break_is_owed() {
    let s = common::server(true);
    let timeout = Duration::from_millis(100);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let stream = matches!(e, Endpoint::Tcp(_));
        let mut cfg = ClientConfig::new(e);
        cfg.revoke_timeout = timeout;
        let mut c = Client::connect(cfg).unwrap();
        let id = c
            .get_lock(LockKind::Rw, format!("quiet-{n}").as_bytes())
            .unwrap();
        assert_eq!(
            c.events_may_wait(),
            !stream,
            "{n}: no answer yet over a stream"
        );
        let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
        assert!(c.events_may_wait(), "{n}: just answered");
        std::thread::sleep(timeout + Duration::from_millis(20));
        assert_eq!(
            c.events_may_wait(),
            !stream,
            "{n}: past the bound over a stream"
        );
        assert_eq!(c.unlock(id).unwrap(), Status::Success);
        assert!(c.events_may_wait(), "{n}: answered again");
        // A new data channel owes its report until the events are looked at.
        c.reinit().unwrap();
        assert!(!c.events_may_wait(), "{n}: a break is owed");
        c.poll_events(|_| {}).unwrap();
        let _ = c.trylock(id, Mode::Exclusive, 60_000).unwrap();
        assert!(c.events_may_wait(), "{n}: reported, and answered since");
        assert_eq!(c.unlock(id).unwrap(), Status::Success);
    }
}

/// An engine turns its write guard shared in place (`CachedWriteGuard::downgrade`): the server
/// downgrades the grant and writes the block the writer set, as an exclusive give-back does;
/// the lock stays cached shared (a second reader is local), and another client reads it at
/// once, with that block, and without a revoke.
#[test]
fn a_downgraded_write_guard_writes_its_block_and_the_lock_stays_cached_shared() {
    let s = common::revoke_server(true);
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("downgraded-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let page = a.rw(&name).unwrap();
        page.set_value_blocks(true).unwrap();
        let mut w = page.try_write().unwrap();
        w.set_value(b"lsn 7").unwrap();
        let token = w.token();
        let r = w.downgrade().unwrap();
        assert_eq!(page.held(), Some(Mode::Shared), "{n}: cached, shared");
        let read = r.value().expect("asked for");
        assert_eq!(
            (r.token(), &read.block.0[..5]),
            (token, &b"lsn 7"[..]),
            "{n}"
        );
        let hits = a.local_hits();
        drop(page.try_read().unwrap());
        assert_eq!(a.local_hits(), hits + 1, "{n}: a second reader is local");
        assert!(
            page.try_write().is_err(),
            "{n}: no writer under a shared grant in use"
        );

        let revokes = counter(&s, "revokes_sent");
        let mut b = Client::connect(ClientConfig::new(e.clone())).unwrap();
        let theirs = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        b.set_value_blocks(theirs, true).unwrap();
        let g = b.trylock(theirs, Mode::Shared, 60_000).unwrap();
        let got = g.value.expect("asked for");
        assert!(got.valid, "{n}");
        assert_eq!(&got.block.0[..5], b"lsn 7", "{n}: written by the downgrade");
        assert_eq!(counter(&s, "revokes_sent"), revokes, "{n}: no revoke");
        drop(r);
        assert_eq!(page.held(), Some(Mode::Shared), "{n}: kept after the guard");
        assert_eq!(b.unlock(theirs).unwrap(), Status::Success);
    }
}

/// A writer that outlives its grant's revoke timeout (it kept the guard while another client
/// waited) is told so by its downgrade: `Fail`, the use ended, and the lock no longer held —
/// the work done under the guard was not protected since the server let the grant go.
#[test]
fn a_downgrade_of_a_grant_the_server_let_go_fails_and_ends_the_use() {
    let s = common::timed_server(
        true,
        Timing {
            revoke_timeout_ms: 100,
            ..common::window(0)
        },
    );
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("outlived-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone())).unwrap();
        let page = a.rw(&name).unwrap();
        let w = page.try_write().unwrap();
        // The waiter is granted once the revoke lapses, and lets the lock go again.
        assert_eq!(
            waiter(&e, &name, Mode::Exclusive).join().unwrap(),
            Status::Success,
            "{n}"
        );
        let err = w.downgrade().expect_err("the grant is gone");
        assert_eq!(err.status(), Status::Fail, "{n}");
        assert_eq!(page.held(), None, "{n}: nothing held");
        drop(page.try_write().expect("asked for again"));
    }
}

/// A client pinned at protocol 7 (`ClientConfig::version_max`, as during a rolling upgrade)
/// against this server: its cacheable request on a contended lock is granted plain with no
/// mark in the result (the server's path below `PROTO_VERSION_PLAIN_GRANTS`), the revoke notice
/// an older client has always read follows the grant, and the handle gives the lock back with
/// its guard instead of keeping it — a later conflict finds it free and sends no revoke.
#[test]
fn a_protocol_7_client_is_told_a_plain_grant_by_a_notice_and_gives_the_lock_back() {
    let s = common::contended_server();
    for (n, e) in endpoints(&s).into_iter().enumerate() {
        let name = format!("pinned-{n}");
        let a = CachedLocks::connect(ClientConfig::new(e.clone()).with_version_max(7)).unwrap();
        assert_eq!(a.with_client(|c| c.version()), 7, "{n}: pinned");
        let page = a.rw(&name).unwrap();
        drop(page.try_write().unwrap());
        // b's conflict revokes a's cached grant: the lock is contended from now on.
        let b = waiter(&e, &name, Mode::Exclusive);
        let _ = next_revoke(&a);
        assert_eq!(b.join().unwrap(), Status::Success, "{n}");
        let (revokes, contended) = (counter(&s, "revokes_sent"), counter(&s, "contended_grants"));
        // a asks again: granted plain, and not told so by the result.
        let again = page.try_write().unwrap();
        assert_eq!(counter(&s, "contended_grants"), contended + 1, "{n}");
        let id = page.id().unwrap();
        let marked = a.with_client(|c| c.local_lock(id).map(|l| l.plain));
        assert_eq!(marked, Some(false), "{n}: no mark below protocol 8");
        // The notice comes, for this grant, while the guard is held.
        assert_eq!(
            next_revoke(&a),
            Revoked::Lock {
                lock: id,
                wanted: Mode::Exclusive
            },
            "{n}"
        );
        assert_eq!(page.held(), Some(Mode::Exclusive), "{n}: in use");
        drop(again);
        assert_eq!(page.held(), None, "{n}: given back with the guard");
        assert_eq!(
            waiter(&e, &name, Mode::Exclusive).join().unwrap(),
            Status::Success
        );
        assert_eq!(counter(&s, "revokes_sent"), revokes, "{n}: no revoke");
    }
}

/// The version cap: the default registers at the newest version both speak, and a cap below
/// what the client can still register with (6) is refused before anything is sent.
#[test]
fn a_client_registers_at_its_version_cap_and_refuses_one_below_6() {
    let s = common::server(false);
    let e = Endpoint::embedded(&s);
    let c = Client::connect(ClientConfig::new(e.clone())).unwrap();
    assert_eq!(c.version(), dlock_core::proto::PROTO_VERSION);
    let c = Client::connect(ClientConfig::new(e.clone()).with_version_max(6)).unwrap();
    assert_eq!(c.version(), 6);
    let refused = Client::connect(ClientConfig::new(e).with_version_max(5)).map(drop);
    assert_eq!(refused.map_err(|e| e.status()), Err(Status::Einval));
}
