//! The three client rules that keep a cached grant from being used after the server handed it
//! on (`dlock_core::manager::trust`; the model simulator's oracle checks the same rules): a
//! cached grant is trusted only within the revoke timeout of the last answered data request,
//! a broken connection counts every cached grant revoked, and a failover re-claims none (a grant
//! asked cached but marked plain is no cached grant, and is re-claimed).

mod common;

use common::gated::gated_client;

use std::thread;
use std::time::Duration;

use dlock_core::manager::Timing;
use dlock_core::proto::LockFlags;
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::{CachedLocks, CachedRwLock, Client, ClientConfig, Endpoint, Revoked};
use dlock_transport::runtime::ServerHandle;

/// The revoke timeout the clients are told; the server keeps its default (the lease, 60 s
/// here), so a client that waits this long trusts less than it could, never more.
const REVOKE_TIMEOUT: Duration = Duration::from_millis(150);

/// A caching handle of `s` over TCP or shared memory, trusting its grants for
/// [`REVOKE_TIMEOUT`].
fn cached(s: &ServerHandle, tcp: bool) -> CachedLocks {
    let e = match tcp {
        true => Endpoint::Tcp(s.tcp_addr().expect("tcp")),
        false => Endpoint::embedded(s),
    };
    let cfg = ClientConfig::new(e)
        .with_lease(Duration::from_secs(60))
        .with_revoke_timeout(REVOKE_TIMEOUT);
    CachedLocks::connect(cfg).expect("registers")
}

/// A caching handle of `s` ([`cached`]) whose lock `name` was written once and is parked in
/// its cache.
fn parked(s: &ServerHandle, tcp: bool, name: impl AsRef<[u8]>) -> (CachedLocks, CachedRwLock) {
    let locks = cached(s, tcp);
    let page = locks.rw(name).unwrap();
    drop(page.try_write().unwrap());
    (locks, page)
}

/// Client `c` re-syncs with the replacement of its failed server: registered again (the
/// replacement never knew it), its locks re-claimed, its recovery done.
fn resync(c: &mut Client) {
    assert_eq!(c.reinit().map_err(Status::from), Ok(true));
    c.update_all_locks().unwrap();
    c.reinit_done().unwrap();
}

/// A client of the server at `addr` over TCP that asks for lock "cached" exclusive, with what
/// it was answered.
fn rival(addr: std::net::SocketAddr) -> (Client, Result<Status, Status>) {
    let mut other = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let theirs = other.get_lock(LockKind::Rw, b"cached").unwrap();
    let answer = other.trylock(theirs, Mode::Exclusive, 60_000);
    (other, answer.map(|g| g.status).map_err(|e| e.status()))
}

#[test]
fn over_tcp_a_grant_idle_past_the_revoke_timeout_is_asked_for_again_not_taken_locally() {
    let s = common::server(true);
    for tcp in [true, false] {
        let (locks, page) = parked(&s, tcp, format!("page-{tcp}"));
        drop(page.try_write().unwrap());
        assert_eq!(
            locks.local_hits(),
            1,
            "tcp {tcp}: cached, and taken locally"
        );
        // Heartbeats renew the lease on the control connection; they say nothing of revokes
        // still on their way on the data connection.
        locks.with_client(|c| c.heartbeat()).unwrap();
        thread::sleep(REVOKE_TIMEOUT + Duration::from_millis(50));
        let g = page.try_write().unwrap();
        let (hits, notice) = (locks.local_hits(), locks.revokes().try_recv().unwrap());
        if tcp {
            assert_eq!(
                hits, 1,
                "a grant past the bound goes back and is asked for again"
            );
            assert_eq!(notice, Some(Revoked::All));
        } else {
            // The event ring is read where the server writes it: nothing can be on its way.
            assert_eq!((hits, notice), (2, None), "shared memory needs no bound");
        }
        drop(g);
        // The new grant's reply renewed the anchor: taken locally again.
        drop(page.try_write().unwrap());
        assert_eq!(locks.local_hits(), if tcp { 2 } else { 3 }, "tcp {tcp}");
    }
    s.stop();
}

#[test]
fn a_reconnected_client_counts_every_cached_grant_revoked() {
    let s = common::server(true);
    for tcp in [true, false] {
        let (locks, page) = parked(&s, tcp, format!("row-{tcp}"));
        // The server still knows the client: it resumes, with new connections.
        assert_eq!(
            locks.with_client(|c| c.reinit()).map_err(Status::from),
            Ok(false)
        );
        let g = page.try_write().unwrap();
        assert_eq!(
            locks.local_hits(),
            0,
            "tcp {tcp}: revokes on the old connection are lost"
        );
        assert_eq!(locks.revokes().try_recv().unwrap(), Some(Revoked::All));
        drop(g);
    }
    s.stop();
}

#[test]
fn a_failover_re_claims_no_cached_grant_and_the_cache_asks_the_replacement() {
    let first = common::server(true);
    let addr = first.tcp_addr().unwrap();
    let (locks, page) = parked(&first, true, "cached");
    let grant = locks.with_client(|c| {
        let id = c.get_lock(LockKind::Rw, b"plain").unwrap();
        c.trylock(id, Mode::Exclusive, 60_000).unwrap()
    });
    assert_eq!(grant.status, Status::Success);
    first.stop();

    let second = common::replacement(addr, 1);
    locks.with_client(|c: &mut Client| {
        resync(c);
        let states: Vec<(Option<Mode>, bool)> = c
            .locks()
            .map(|(_, l)| (l.state.held_mode(), l.ask.contains(LockFlags::CACHEABLE)))
            .collect();
        // The cached grant may have been revoked with the revoke lost with the connection, and
        // lapsed and been granted to another on the old server: not re-claimed, but still
        // referenced and still asked for as cacheable. The plain grant is re-claimed.
        assert!(states.contains(&(None, true)), "{states:?}");
        assert!(
            states.contains(&(Some(Mode::Exclusive), false)),
            "{states:?}"
        );
    });
    // The handle hears of it as an overflow and asks the replacement.
    let g = page.try_write().unwrap();
    assert_eq!(locks.local_hits(), 0);
    assert_eq!(locks.revokes().try_recv().unwrap(), Some(Revoked::All));
    drop(g);
    let plain = locks
        .with_client(|c| c.get_lock(LockKind::Rw, b"plain"))
        .unwrap();
    assert_eq!(
        locks.with_client(|c| c.unlock(plain)).map_err(Status::from),
        Ok(Status::Success)
    );
    second.stop();
}

/// A grant asked for cached but marked plain (protocol 8, a contended lock) never lapses by
/// the revoke timeout, so a failover re-claims it as it re-claims any plain grant: forgetting
/// it would lose a grant the client holds safely.
#[test]
fn a_failover_re_claims_a_grant_asked_cached_but_granted_plain() {
    let first = common::contended_server();
    let addr = first.tcp_addr().unwrap();
    let e = Endpoint::Tcp(addr);
    // p's plain grant refuses a's request: a conflict, which makes the lock contended.
    let mut p = common::client(&e);
    let pid = p.get_lock(LockKind::Rw, b"fought").unwrap();
    assert_eq!(
        p.trylock(pid, Mode::Exclusive, 60_000).unwrap().status,
        Status::Success
    );
    let mut a = common::client(&e);
    let id = a.get_lock(LockKind::Rw, b"fought").unwrap();
    a.set_cacheable(id, true).unwrap();
    let refused = a.trylock(id, Mode::Exclusive, 60_000).map(|g| g.status);
    assert_eq!(refused.map_err(Status::from), Err(Status::Fail));
    p.deinit().unwrap();
    let g = a.trylock(id, Mode::Exclusive, 60_000).unwrap();
    assert_eq!((g.status, g.plain), (Status::Success, true));
    first.stop();

    let second = common::replacement(addr, 1);
    resync(&mut a);
    let states: Vec<Option<Mode>> = a.locks().map(|(_, l)| l.state.held_mode()).collect();
    assert_eq!(states, vec![Some(Mode::Exclusive)], "re-claimed");
    let id = a.get_lock(LockKind::Rw, b"fought").unwrap();
    assert_eq!(a.unlock(id).map_err(Status::from), Ok(Status::Success));
    second.stop();
}

/// The server says its revoke timeout at registration (protocol 7), so a client told nothing
/// by hand trusts its cached grants no longer than the server holds them: here 150 ms against
/// a 60 s lease. Before, such a client assumed the lease, and used a grant locally long after
/// the server could have lapsed it and handed it on.
#[test]
fn a_client_trusts_a_cached_grant_for_the_revoke_timeout_its_server_said() {
    let s = common::timed_server(
        true,
        Timing {
            revoke_timeout_ms: REVOKE_TIMEOUT.as_millis() as u32,
            ..Timing::DEFAULT
        },
    );
    let e = Endpoint::Tcp(s.tcp_addr().expect("tcp"));
    let locks =
        CachedLocks::connect(ClientConfig::new(e).with_lease(Duration::from_secs(60))).unwrap();
    assert_eq!(
        locks.with_client(|c| c.revoke_timeout()),
        REVOKE_TIMEOUT,
        "told at registration"
    );
    let page = locks.rw("page").unwrap();
    drop(page.try_write().unwrap());
    drop(page.try_write().unwrap());
    assert_eq!(locks.local_hits(), 1, "cached, and taken locally");
    locks.with_client(|c| c.heartbeat()).unwrap();
    thread::sleep(REVOKE_TIMEOUT + Duration::from_millis(50));
    let g = page.try_write().unwrap();
    assert_eq!(
        (locks.local_hits(), locks.revokes().try_recv().unwrap()),
        (1, Some(Revoked::All)),
        "past the server's bound the grant goes back and is asked for again"
    );
    drop(g);
    s.stop();
}

/// A replacement server numbers locks afresh (here a lock of a client that did not come back
/// took a slot on the failed one), and the client's recovery files its records under the new
/// ids. A cached handle keeps naming its lock, not the id it had: before, its next guard asked
/// for whatever lock now had the old id — another of this client's locks — and left its own
/// to anyone.
#[test]
fn a_cached_handle_follows_its_lock_to_the_id_a_failover_gave_it() {
    let first = common::server(true);
    let addr = first.tcp_addr().unwrap();
    // A client that will not come back takes the first lock slot.
    let mut gone = Client::connect(ClientConfig::new(Endpoint::Tcp(addr))).unwrap();
    let _ = gone.get_lock(LockKind::Rw, b"gone").unwrap();
    let (locks, page) = parked(&first, true, "cached");
    let plain = locks.with_client(|c| c.get_lock(LockKind::Rw, b"plain").unwrap());
    let before = page.id().unwrap();
    first.stop();
    drop(gone);

    let second = common::replacement(addr, 1);
    let now = locks.with_client(|c: &mut Client| {
        resync(c);
        c.get_lock(LockKind::Rw, b"cached").unwrap()
    });
    assert_ne!(now, before, "the replacement numbered the lock afresh");
    assert_eq!(page.id(), Some(now), "the handle names its lock's new id");
    let g = page.try_write().unwrap();
    // Held on the replacement: another client is refused it, and may take "plain".
    let (_other, answer) = rival(addr);
    assert_eq!(answer, Err(Status::Fail), "the guard holds its own lock");
    let _ = plain;
    drop(g);
    second.stop();
}

/// A guard from before a failover that forgot its lock (the replacement refused the claim:
/// here its table is full) belongs to the grant that is gone. Before, dropping it released the
/// user of the grant the handle took afresh: the write guard taken after the failover lost its
/// count, and the handle handed out a second writer locally (and would give the grant back to
/// a revoke under the first). Meanwhile the handle has no id: the one from before may name
/// another lock on the replacement.
#[test]
fn a_guard_from_before_a_forgetting_failover_leaves_the_new_grants_users_alone() {
    let first = common::server(true);
    let addr = first.tcp_addr().unwrap();
    let locks = cached(&first, true);
    // Claimed first, it takes the replacement's one lock slot.
    locks.with_client(|c| c.get_lock(LockKind::Rw, b"filler").unwrap());
    let page = locks.rw("cached").unwrap();
    let old = page.try_write().unwrap();
    first.stop();

    let second = common::replacement_of(
        addr,
        dlock_core::Config {
            recovery_clients: 1,
            locks_max: 1,
            ..common::small()
        },
    );
    locks.with_client(|c: &mut Client| {
        resync(c);
        assert_eq!(c.lock_id(LockKind::Rw, b"cached"), None, "claim refused");
        let filler = c.lock_id(LockKind::Rw, b"filler").expect("claimed");
        c.release_lock(filler).unwrap();
    });
    assert_eq!(page.id(), None, "no id from before");
    // The lock is taken afresh, and the guard from before drops.
    let new = page.try_write().unwrap();
    assert!(page.id().is_some());
    drop(old);
    assert_eq!(
        page.try_write().map(drop).map_err(|e| e.status()),
        Err(Status::Fail),
        "a second writer beside the guard taken after the failover"
    );
    drop(new);
    drop(page.try_write().unwrap());
    second.stop();
}

/// A give-back that does not reach the server is owed, and its failure is what a guard that
/// must wait for it is told. Before, the failure was swallowed: `try_write` said the lock was
/// busy and `write` waited out its time for `Etimeout`, with the connection lost all along.
#[test]
fn a_guard_waiting_for_an_owed_give_back_is_told_its_failure() {
    let s = common::server(true);
    let (client, gate) = gated_client(&Endpoint::embedded(&s), Duration::from_secs(60));
    let locks = CachedLocks::new(client);
    let page = locks.rw("page").unwrap();
    drop(page.try_read().unwrap());
    gate.fail_sends(true);
    // The parked shared grant goes back before a writer asks: the give-back fails.
    let tried = page.try_write().map(drop).map_err(|e| e.status());
    assert_eq!(
        tried,
        Err(Status::BadResponse),
        "the give-back's failure, not busy"
    );
    // Still owed: sent again at the next look, in vain, and its failure is the answer.
    let waited = page.write(Duration::from_secs(5)).map(drop);
    assert_eq!(waited.map_err(|e| e.status()), Err(Status::BadResponse));
    gate.fail_sends(false);
    drop(page.try_write().unwrap());
    s.stop();
}

/// The revoke notices the engine had not read when a failover renumbered the locks name ids
/// from before, and grants the failover did not re-claim: they are replaced by the one notice
/// for every lock. Before, the engine read a notice naming a lock by its old id (another
/// lock's, or none, on the replacement).
#[test]
fn a_renumbering_replaces_the_unread_notices_with_one_for_every_lock() {
    let first = common::server(true);
    let addr = first.tcp_addr().unwrap();
    let (locks, page) = parked(&first, true, "cached");
    let (other, answer) = rival(addr);
    assert!(answer.is_err());
    // Another handle's guards look at the connection: the revoke is acted on and its notice
    // queued, unread.
    let spare = locks.rw("spare").unwrap();
    while page.held().is_some() {
        drop(spare.try_write().unwrap());
        thread::sleep(Duration::from_millis(1));
    }
    drop(other);
    first.stop();

    let second = common::replacement(addr, 1);
    locks.with_client(resync);
    let revokes = locks.revokes();
    assert_eq!(revokes.try_recv().unwrap(), Some(Revoked::All));
    assert_eq!(revokes.try_recv().unwrap(), None, "no notice by an old id");
    second.stop();
}

/// A handle that holds no grant on the server leaves its look at the events for later while
/// its trust bound holds (`Client::events_may_wait`; over TCP a look is a `recv`), and looks at
/// every call again once it caches a grant, so a revoke of that grant still comes and is acted
/// on. Before, every guard looked, on an uncached lock too.
#[test]
fn a_handle_caching_nothing_does_not_look_at_its_events_until_it_caches() {
    let s = common::revoke_server(true);
    for tcp in [true, false] {
        let e = match tcp {
            true => Endpoint::Tcp(s.tcp_addr().expect("tcp")),
            false => Endpoint::embedded(&s),
        };
        let (client, gate) = gated_client(&e, Duration::from_secs(60));
        let locks = CachedLocks::new(client);
        let (page, row) = (
            locks.rw(format!("page-{tcp}")).unwrap(),
            locks.rw(format!("row-{tcp}")).unwrap(),
        );
        // The page is cached, then revoked by a writer elsewhere and given back at a look.
        drop(page.try_write().unwrap());
        let writer = writer_elsewhere(&s, format!("page-{tcp}"));
        while locks.revokes().try_recv().unwrap().is_none() {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(writer.join().unwrap(), Status::Success, "tcp {tcp}");
        assert_eq!(page.held(), None, "tcp {tcp}: given back");

        let looks = gate.event_looks();
        let g = row.try_write().unwrap();
        assert_eq!(
            gate.event_looks(),
            looks,
            "tcp {tcp}: nothing cached, no look"
        );
        drop(g);
        assert_eq!(locks.revokes().try_recv().unwrap(), None);
        assert_eq!(
            gate.event_looks(),
            looks + 1,
            "tcp {tcp}: the row is cached: a look"
        );
        // The row's revoke still comes, and the row goes back.
        let writer = writer_elsewhere(&s, format!("row-{tcp}"));
        while locks.revokes().try_recv().unwrap().is_none() {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(writer.join().unwrap(), Status::Success, "tcp {tcp}");
        assert_eq!(row.held(), None, "tcp {tcp}: given back");
    }
    s.stop();
}

/// A client of `s` that takes RW lock `name` exclusively (waiting for it) and lets it go: its
/// status.
fn writer_elsewhere(s: &ServerHandle, name: String) -> thread::JoinHandle<Status> {
    let mut b = Client::connect(ClientConfig::new(Endpoint::embedded(s))).expect("registers");
    thread::spawn(move || {
        let id = b.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        let got = b.lock(id, Mode::Exclusive, 60_000, Duration::from_secs(30));
        match got {
            Ok(g) => {
                assert_eq!(b.unlock(id).unwrap(), Status::Success);
                g.status
            }
            Err(e) => e.status(),
        }
    })
}
