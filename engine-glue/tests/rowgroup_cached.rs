//! Row-group locks with caching on (`RowGroupConfig::with_cached`): a worker's next transaction
//! takes the keys it cached with no message, another worker gets a cached key once the holder
//! looks at its revokes, a key revoked while a transaction holds it goes back at its end, and a
//! key revoked before it was reused is demoted from the cache for its next few uses, a worker
//! whose grants are mostly asked back before they pay stops caching fresh ones, a busy key
//! asked for alone between cached ones is waited for with no refused trylock first, and over
//! TCP a key cached past the revoke timeout is asked for again.

use std::thread;
use std::time::{Duration, Instant};

use dlock_engine_glue::EmbeddedServer;
use dlock_engine_glue::dlock_core::manager::Timing;
use dlock_engine_glue::dlock_core::{Config, Mode, Status};
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};

#[path = "common/rowgroup.rs"]
mod rowgroup;
use rowgroup::{
    WAIT, counter, data_messages, give_back_when_asked, revoke_sent_after, revokes_sent, server,
    server_with, take_once, worker,
};

/// [`server`] with contention-aware grants off: for the worker's own demotion policy, which
/// the server's rule (the default window) would pre-empt by granting a key plain for a second
/// after each conflict.
fn server_without_contention() -> EmbeddedServer {
    server_with(Timing {
        contention_window_ms: 0,
        ..Timing::DEFAULT
    })
}

/// A thread of a new (uncached) worker taking `key` exclusively, waiting up to 10 s.
fn rival(s: &EmbeddedServer, key: RowGroup) -> thread::JoinHandle<Result<(), Status>> {
    rowgroup::rival(s, key, Mode::Exclusive)
}

#[test]
fn the_next_transaction_takes_its_cached_keys_without_a_message() {
    let s = server();
    let mut w = worker(&s, true);
    let keys = [
        (RowGroup::new(1, 1), Mode::Exclusive),
        (RowGroup::new(1, 2), Mode::Shared),
        (RowGroup::new(2, 9), Mode::Exclusive),
    ];
    let mut txn = w.begin();
    txn.acquire(&keys, AcquireOptions::NO_WAIT).unwrap();
    let tokens: Vec<_> = keys.iter().map(|(k, _)| txn.token(*k)).collect();
    txn.commit().unwrap();
    assert_eq!(w.cached_grants(), 3, "kept past the commit");
    let before = data_messages(&s);
    let mut txn = w.begin();
    // A read of a key cached exclusive is covered too.
    let again = [keys[0], keys[1], (keys[2].0, Mode::Shared)];
    txn.acquire(&again, AcquireOptions::NO_WAIT).unwrap();
    let now: Vec<_> = keys.iter().map(|(k, _)| txn.token(*k)).collect();
    assert_eq!(now, tokens, "the same grants");
    txn.commit().unwrap();
    assert_eq!(data_messages(&s), before, "no message from begin to commit");
    assert_eq!(w.cache_hits(), 3);
    // A write of a key cached shared is no upgrade: it goes back and is asked for again.
    let mut txn = w.begin();
    txn.acquire(&[(keys[1].0, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    assert_eq!(txn.mode(keys[1].0), Some(Mode::Exclusive));
    txn.commit().unwrap();
    assert_eq!(w.cache_hits(), 3);
}

#[test]
fn another_worker_gets_a_cached_key_once_the_holder_looks_at_its_revokes() {
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(3, 3);
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    txn.commit().unwrap();
    let other = rival(&s, key);
    give_back_when_asked(&mut w);
    assert_eq!(other.join().unwrap(), Ok(()));
    assert_eq!(w.cached_grants(), 0);
}

#[test]
fn a_key_revoked_while_a_transaction_holds_it_goes_back_at_its_end() {
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(4, 4);
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    let other = rival(&s, key);
    // The transaction goes on; its lease upkeep reads the revoke, which must wait for it.
    revoke_sent_after(&s, 0);
    txn.keep_leases(Instant::now() + Duration::from_secs(3_600))
        .unwrap();
    assert!(!other.is_finished(), "the rival waits for the transaction");
    assert!(txn.token(key).is_some());
    txn.commit().unwrap();
    assert_eq!(other.join().unwrap(), Ok(()));
    assert_eq!(w.cached_grants(), 0, "not cached: it was asked back");
}

/// The rules are `CachedLock`'s: a transaction reading under a cached exclusive grant has
/// nothing a reader elsewhere conflicts with, so a revoke wanting shared downgrades the grant
/// at once, and the other reader is not kept waiting for the transaction to end.
#[test]
fn a_transaction_reading_under_a_cached_exclusive_grant_downgrades_it_for_a_reader_at_once() {
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(5, 5);
    take_once(&mut w, key);
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Shared)], AcquireOptions::NO_WAIT)
        .unwrap();
    assert_eq!(
        txn.mode(key),
        Some(Mode::Exclusive),
        "read from the cached grant"
    );
    let reader = rowgroup::rival(&s, key, Mode::Shared);
    revoke_sent_after(&s, 0);
    txn.keep_leases(Instant::now() + Duration::from_secs(3_600))
        .unwrap();
    assert_eq!(txn.mode(key), Some(Mode::Shared), "downgraded in place");
    assert_eq!(
        reader.join().unwrap(),
        Ok(()),
        "while the transaction reads on"
    );
    assert!(txn.token(key).is_some());
    txn.commit().unwrap();
}

#[test]
fn a_transaction_that_writes_a_key_it_read_under_a_cached_exclusive_grant_keeps_it_exclusive() {
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(5, 6);
    take_once(&mut w, key);
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Shared)], AcquireOptions::NO_WAIT)
        .unwrap();
    txn.acquire(&[(key, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    // A reader elsewhere is refused, and the server revokes the grant for shared.
    let mut r = worker(&s, false);
    let read = |r: &mut RowGroupLocks| {
        let mut rt = r.begin();
        rt.acquire(&[(key, Mode::Shared)], AcquireOptions::NO_WAIT)?;
        rt.commit()
    };
    assert_eq!(read(&mut r), Err(Status::Fail));
    revoke_sent_after(&s, 0);
    txn.keep_leases(Instant::now() + Duration::from_secs(3_600))
        .unwrap();
    assert_eq!(
        txn.mode(key),
        Some(Mode::Exclusive),
        "not downgraded under the writer"
    );
    assert_eq!(
        read(&mut r),
        Err(Status::Fail),
        "no reader beside the writer"
    );
    txn.commit().unwrap();
    assert_eq!(
        read(&mut r),
        Ok(()),
        "downgraded (or given back) at the end"
    );
}

/// A call refused for an upgrade changes nothing it asked for, not even a key it would have
/// taken over as writer before the refused one: the reader of a cached exclusive grant stays a
/// reader, so a revoke wanting shared still downgrades the grant under it.
#[test]
fn a_call_refused_for_an_upgrade_leaves_a_reader_of_a_cached_exclusive_grant_a_reader() {
    let s = server();
    let mut w = worker(&s, true);
    let (read, shared) = (RowGroup::new(5, 7), RowGroup::new(5, 8));
    take_once(&mut w, read);
    let mut txn = w.begin();
    let both = |mode| [(read, mode), (shared, mode)];
    txn.acquire(&both(Mode::Shared), AcquireOptions::NO_WAIT)
        .unwrap();
    assert_eq!(
        (txn.mode(read), txn.mode(shared)),
        (Some(Mode::Exclusive), Some(Mode::Shared)),
        "read from the cached grant, and a fresh shared grant"
    );
    assert_eq!(
        txn.acquire(&both(Mode::Exclusive), AcquireOptions::NO_WAIT),
        Err(Status::Einval),
        "an upgrade of the key held shared"
    );
    let reader = rowgroup::rival(&s, read, Mode::Shared);
    revoke_sent_after(&s, 0);
    txn.keep_leases(Instant::now() + Duration::from_secs(3_600))
        .unwrap();
    assert_eq!(
        txn.mode(read),
        Some(Mode::Shared),
        "downgraded in place: the refused call made no writer of the reader"
    );
    assert_eq!(reader.join().unwrap(), Ok(()));
    txn.commit().unwrap();
}

#[test]
fn a_grant_lost_under_a_reading_transaction_is_reported_and_not_cached() {
    let s = EmbeddedServer::start(EmbeddedServer::config(Config {
        locks_max: 64,
        clients_max: 4,
        objects_max: 4,
        timing: Timing {
            revoke_timeout_ms: 100,
            ..Timing::DEFAULT
        },
        ..Config::default()
    }))
    .expect("server starts");
    let mut w = worker(&s, true);
    let lost = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let told = lost.clone();
    w.set_on_lost(move |key, _| told.lock().unwrap().push(key));
    let key = RowGroup::new(5, 7);
    // Reused twice from the cache: a revoke now does not demote it, so the cache would keep it.
    for _ in 0..3 {
        take_once(&mut w, key);
    }
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Shared)], AcquireOptions::NO_WAIT)
        .unwrap();
    // A reader elsewhere waits; the transaction does not look at its revokes until the server
    // has let its grant go (the revoke timeout) and granted the reader.
    let reader = rowgroup::rival(&s, key, Mode::Shared);
    assert_eq!(reader.join().unwrap(), Ok(()));
    // The downgrade the revoke asks for is refused: the grant is gone.
    txn.keep_leases(Instant::now() + Duration::from_secs(3_600))
        .unwrap();
    assert_eq!(
        txn.lost().iter().map(|&(k, _)| k).collect::<Vec<_>>(),
        [key]
    );
    assert_eq!(*lost.lock().unwrap(), [key], "on_lost told");
    assert!(txn.commit().is_err(), "the transaction read unprotected");
    assert_eq!(w.cached_grants(), 0, "nothing held, nothing cached");
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Shared)], AcquireOptions::NO_WAIT)
        .unwrap();
    txn.commit().unwrap();
    assert_eq!(w.cache_hits(), 3, "asked of the server again");
}

#[test]
fn a_key_revoked_before_it_was_reused_is_let_go_for_its_next_uses_then_cached_again() {
    // `manager::Demotion`: the first such revoke demotes the key for its next 4 uses.
    let s = server_without_contention();
    let mut w = worker(&s, true);
    // One grant that paid first, so that one wasted revoke does not also suspend caching for
    // the whole worker (`manager::Payback`, the next test).
    for _ in 0..3 {
        take_once(&mut w, RowGroup::new(5, 1));
    }
    let key = RowGroup::new(5, 5);
    take_once(&mut w, key);
    let other = rival(&s, key);
    give_back_when_asked(&mut w);
    assert_eq!(other.join().unwrap(), Ok(()));
    // The grant that paid stays cached throughout.
    for use_ in 1..=4 {
        take_once(&mut w, key);
        assert_eq!(w.cached_grants(), 1, "use {use_} ends in an unlock");
    }
    take_once(&mut w, key);
    assert_eq!(w.cached_grants(), 2, "cached again after its plain uses");
}

#[test]
fn a_worker_whose_grants_are_asked_back_before_they_pay_lets_fresh_grants_go_but_probes() {
    // `manager::Payback`: a wasted revoke and no grant that paid suspends caching of fresh
    // grants; one in 64 is still cached, and grants taken from the cache stay cached.
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(7, 7);
    take_once(&mut w, key);
    let other = rival(&s, key);
    give_back_when_asked(&mut w);
    assert_eq!(other.join().unwrap(), Ok(()));
    let mut cached = 0;
    for group in 0..128 {
        take_once(&mut w, RowGroup::new(8, group));
        cached = w.cached_grants();
    }
    assert_eq!(cached, 2, "two probes in 128 fresh grants");
    // A probe that is reused pays: caching resumes.
    let before = w.cached_grants();
    for group in 0..128 {
        take_once(&mut w, RowGroup::new(8, group));
    }
    for group in 0..128 {
        take_once(&mut w, RowGroup::new(8, group));
    }
    assert!(w.cached_grants() > before, "caching resumed");
}

#[test]
fn a_key_revoked_after_it_was_reused_twice_stays_cached() {
    let s = server_without_contention();
    let mut w = worker(&s, true);
    let key = RowGroup::new(6, 6);
    for _ in 0..3 {
        take_once(&mut w, key);
    }
    assert_eq!(w.cache_hits(), 2, "reused from the cache");
    let other = rival(&s, key);
    give_back_when_asked(&mut w);
    assert_eq!(other.join().unwrap(), Ok(()));
    take_once(&mut w, key);
    assert_eq!(w.cached_grants(), 1, "caching it paid: not demoted");
}

#[test]
fn a_busy_key_between_cached_keys_is_waited_for_with_no_refused_trylock_first() {
    let s = server();
    let mut w = worker(&s, true);
    let (k1, k2, k3) = (
        RowGroup::new(6, 1),
        RowGroup::new(6, 2),
        RowGroup::new(6, 3),
    );
    let mut txn = w.begin();
    txn.acquire(
        &[(k1, Mode::Exclusive), (k3, Mode::Exclusive)],
        AcquireOptions::NO_WAIT,
    )
    .unwrap();
    txn.commit().unwrap();
    // Another worker's open transaction holds k2.
    let mut p = worker(&s, false);
    let mut held = p.begin();
    held.acquire(&[(k2, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    let (refused, parked) = (counter(&s, "fail"), counter(&s, "waits"));
    let waiting = thread::spawn(move || {
        let mut txn = w.begin();
        let wants = [
            (k1, Mode::Shared),
            (k2, Mode::Exclusive),
            (k3, Mode::Shared),
        ];
        txn.acquire(&wants, AcquireOptions::wait(WAIT))?;
        let all = txn.held().count();
        txn.commit()?;
        Ok::<_, Status>((all, w.cache_hits()))
    });
    let until = Instant::now() + WAIT;
    while counter(&s, "waits") == parked && Instant::now() < until {
        thread::sleep(Duration::from_millis(1));
    }
    held.commit().unwrap();
    assert_eq!(
        waiting.join().unwrap(),
        Ok((3, 2)),
        "k1 and k3 from the cache"
    );
    // Each request that parks is counted refused once and waiting once (a wait that outlives
    // its slice asks again, and counts both again); a trylock refused first would be a refusal
    // with no wait.
    let refusals = counter(&s, "fail") - refused;
    let waits = counter(&s, "waits") - parked;
    assert!(waits >= 1);
    assert_eq!(
        refusals, waits,
        "k2 was waited for at once, not refused to a trylock first"
    );
}

/// Over TCP a revoke may still be on its way when the server lets the grant lapse at the revoke
/// timeout and hands it on (`dlock_core::manager::trust`): a worker whose last answered data
/// request is older than that gives its cached keys back and asks again rather than take them
/// locally. (Over shared memory its ring is read where the server writes it: no bound.)
#[test]
fn over_tcp_a_key_cached_past_the_revoke_timeout_is_asked_for_again() {
    use dlock_engine_glue::dlock_transport::client::{Client, ClientConfig, Endpoint};
    use dlock_engine_glue::dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
    let mut cfg = ServerConfig::new(Config {
        locks_max: 64,
        clients_max: 4,
        objects_max: 4,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let s = ServerHandle::start(cfg).unwrap();
    // The server keeps its default revoke timeout (the lease); the worker is told less.
    let timeout = Duration::from_millis(150);
    let c = Client::connect(
        ClientConfig::new(Endpoint::Tcp(s.tcp_addr().unwrap())).with_revoke_timeout(timeout),
    )
    .unwrap();
    let mut w = RowGroupLocks::new(c, RowGroupConfig::DEFAULT.with_cached(true)).unwrap();
    let key = RowGroup::new(4, 4);
    for _ in 0..2 {
        let mut txn = w.begin();
        txn.acquire(&[(key, Mode::Exclusive)], AcquireOptions::NO_WAIT)
            .unwrap();
        txn.commit().unwrap();
    }
    assert_eq!((w.cache_hits(), w.cached_grants()), (1, 1));
    thread::sleep(timeout + Duration::from_millis(50));
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Exclusive)], AcquireOptions::NO_WAIT)
        .unwrap();
    txn.commit().unwrap();
    assert_eq!(
        w.cache_hits(),
        1,
        "given back and asked for again, not taken locally"
    );
    assert_eq!(w.cached_grants(), 1, "the new grant is cached");
    s.stop();
}

#[test]
fn a_key_granted_plain_on_a_contended_lock_is_unlocked_in_the_commits_batch() {
    let s = EmbeddedServer::start(EmbeddedServer::config(Config {
        locks_max: 1_024,
        clients_max: 16,
        objects_max: 4,
        timing: Timing {
            // Long against the test: the lock stays contended throughout.
            contention_window_ms: 600_000,
            ..Timing::DEFAULT
        },
        ..Config::default()
    }))
    .expect("server starts");
    let (key, fresh) = (RowGroup::new(5, 5), RowGroup::new(5, 6));
    // w caches the key, a rival's conflict revokes it: the lock is contended from now on.
    let mut w = worker(&s, true);
    take_once(&mut w, key);
    let other = rival(&s, key);
    give_back_when_asked(&mut w);
    assert_eq!(other.join().unwrap(), Ok(()));
    let revokes = revokes_sent(&s);
    // A fresh worker (no demotion of its own) takes it with an uncontended key.
    let mut v = worker(&s, true);
    let before = data_messages(&s);
    let mut txn = v.begin();
    let keys = [(key, Mode::Exclusive), (fresh, Mode::Exclusive)];
    txn.acquire(&keys, AcquireOptions::NO_WAIT).unwrap();
    txn.commit().unwrap();
    // The contended key was granted plain and unlocked with the commit, in one message; the
    // other stays cached.
    assert_eq!(v.cached_grants(), 1, "only the uncontended key is kept");
    assert_eq!(
        data_messages(&s) - before,
        2,
        "the acquisition and the batch unlock"
    );
    assert_eq!(v.poll_revokes(), Ok(0), "no notice to read");
    // Free now: a rival gets it with no revoke sent.
    assert_eq!(rival(&s, key).join().unwrap(), Ok(()));
    assert_eq!(revokes_sent(&s), revokes);
}
