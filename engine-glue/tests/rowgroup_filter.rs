//! Row-group locks with caching on and a cache filter that changes between transactions
//! (`RowGroupLocks::set_cache_filter`, or a filter reading state that moves): whether a grant
//! is cached follows what the server was asked for it, never the filter's answer after. A key
//! asked for plain is not kept (the server would never revoke it), a key the filter comes to
//! keep is asked for cacheable from its next acquisition, and a cached grant the filter no
//! longer keeps still has its revokes read until its transaction ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_engine_glue::dlock_core::Mode;
use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup};

#[path = "common/rowgroup.rs"]
mod rowgroup;
use rowgroup::{
    give_back_when_asked, revoke_sent_after, revokes_sent, rival, server, take_once, worker,
};

/// Before the fix the name stayed plain (flagged once, when resolved) while the grant was kept
/// as cached: the server never revoked it, and the rival waited as long as the worker kept it.
#[test]
fn a_key_the_filter_comes_to_keep_is_asked_for_cacheable_and_given_back_when_revoked() {
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(7, 1);
    // The worker's range, as an engine that rebalances would move it: the key is not in it.
    let mine = Arc::new(AtomicBool::new(false));
    let range = Arc::clone(&mine);
    // Relaxed: the test's thread alone stores and loads it.
    w.set_cache_filter(move |_| range.load(Ordering::Relaxed));
    take_once(&mut w, key);
    assert_eq!(w.cached_grants(), 0, "not kept: the filter leaves it out");
    mine.store(true, Ordering::Relaxed);
    take_once(&mut w, key);
    assert_eq!(w.cached_grants(), 1, "kept: the filter keeps it now");
    let revokes = revokes_sent(&s);
    let other = rival(&s, key, Mode::Exclusive);
    // Revoked, as a cacheable grant, and given back.
    give_back_when_asked(&mut w);
    assert_eq!(revokes_sent(&s), revokes + 1);
    assert_eq!(other.join().unwrap(), Ok(()));
    assert_eq!(w.cached_grants(), 0);
}

/// Before the fix the grant taken from the cache counted as never cached once the filter
/// dropped its key: the worker skipped its look at the events, and the revoke went unread
/// while the transaction held a grant the server counted as revocable.
#[test]
fn a_cached_grant_the_filter_no_longer_keeps_has_its_revokes_read_then_goes_back() {
    let s = server();
    let mut w = worker(&s, true);
    let key = RowGroup::new(7, 2);
    take_once(&mut w, key);
    assert_eq!(w.cached_grants(), 1);
    w.set_cache_filter(move |k| k != key);
    let mut txn = w.begin();
    txn.acquire(&[(key, Mode::Shared)], AcquireOptions::NO_WAIT)
        .unwrap();
    assert_eq!(
        txn.mode(key),
        Some(Mode::Exclusive),
        "read from the cached grant"
    );
    let revokes = revokes_sent(&s);
    let reader = rival(&s, key, Mode::Shared);
    revoke_sent_after(&s, revokes);
    // A look at the events (the heartbeat is due an hour on).
    txn.keep_leases(Instant::now() + Duration::from_secs(3_600))
        .unwrap();
    assert_eq!(
        txn.mode(key),
        Some(Mode::Shared),
        "the revoke was read and the grant downgraded in place"
    );
    assert_eq!(
        reader.join().unwrap(),
        Ok(()),
        "while the transaction reads on"
    );
    txn.commit().unwrap();
    assert_eq!(w.cached_grants(), 0, "given back: the filter leaves it out");
    take_once(&mut w, key);
    assert_eq!(w.cached_grants(), 0, "asked for plain, and not kept");
}
