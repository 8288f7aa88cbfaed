//! The native lock API against a real server (shared memory, in-process): guards unlock on
//! drop, several live at once, shared and exclusive exclusion (also between guards of one
//! handle), extend, errors from explicit unlocks and from drops, owned guards across threads,
//! and batch guard sets.

mod common;

use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{client, server};
use dlock_core::{Mode, Status};
use dlock_transport::client::{Endpoint, ErrorKind, Locks};
use dlock_transport::runtime::ServerHandle;

const LEASE: Duration = Duration::from_secs(60);

fn handle(s: &ServerHandle) -> Locks {
    Locks::from(client(&Endpoint::embedded(s)))
}

/// What a drop hook saw: each error's operation and status.
type Seen = Arc<Mutex<Vec<(&'static str, Status)>>>;

/// A handle whose drop errors are collected instead of logged.
fn handle_with_hook(s: &ServerHandle) -> (Locks, Seen) {
    let locks = handle(s);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    locks.set_drop_hook(move |e| sink.lock().unwrap().push((e.operation(), e.status())));
    (locks, seen)
}

#[test]
fn guard_unlocks_on_drop_so_another_handle_takes_the_lock() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (la, lb) = (a.atomic("t1/rg7").unwrap(), b.atomic("t1/rg7").unwrap());
    let g = la.try_exclusive(LEASE).unwrap();
    let first = g.token();
    let busy = lb.try_exclusive(LEASE).unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::WouldBlock, "{busy}");
    drop(g);
    let again = lb.try_exclusive(LEASE).unwrap();
    assert!(again.token() > first, "tokens grow across holders");
}

#[test]
fn two_guards_of_one_handle_live_at_once_on_different_locks() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (x, y) = (a.atomic("x").unwrap(), a.fair("y").unwrap());
    let gx = x.try_exclusive(LEASE).unwrap();
    let gy = y.try_exclusive(LEASE).unwrap();
    assert_ne!(gx.token(), gy.token());
    let (bx, by) = (b.atomic("x").unwrap(), b.fair("y").unwrap());
    assert!(bx.try_exclusive(LEASE).unwrap_err().is_would_block());
    assert!(by.try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(gx);
    let _bx = bx.try_exclusive(LEASE).unwrap();
    // `y` is still held by the other guard.
    assert!(by.try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(gy);
    let _by = by.try_exclusive(LEASE).unwrap();
}

#[test]
fn shared_guards_coexist_and_exclude_an_exclusive_try() {
    let s = server(false);
    let (a, b, c) = (handle(&s), handle(&s), handle(&s));
    let (ra, rb, rc) = (a.rw("r").unwrap(), b.rw("r").unwrap(), c.rw("r").unwrap());
    let ga = ra.try_shared(LEASE).unwrap();
    let gb = rb.try_shared(LEASE).unwrap();
    // A second shared guard of the same handle is a re-entry, not a conflict.
    let ga2 = ra.try_shared(LEASE).unwrap();
    assert!(rc.try_exclusive(LEASE).unwrap_err().is_would_block());
    // Nor may the same handle upgrade behind its own shared guards' backs.
    assert!(ra.try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(ga);
    drop(gb);
    // One shared guard of `a` is left: still held on the server.
    assert!(rc.try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(ga2);
    let _gc = rc.try_exclusive(LEASE).unwrap();
}

#[test]
fn exclusive_guard_excludes_another_guard_of_the_same_handle() {
    let s = server(false);
    let a = handle(&s);
    let x = a.atomic("x").unwrap();
    let g = x.try_exclusive(LEASE).unwrap();
    // The reference client would count a re-entry; a guard must mean exclusion.
    assert!(x.try_exclusive(LEASE).unwrap_err().is_would_block());
    let timed_out = x
        .lock(Mode::Exclusive, Duration::from_millis(30), LEASE)
        .unwrap_err();
    assert_eq!(timed_out.kind(), ErrorKind::TimedOut);
    // Another thread sharing the handle waits for the guard's drop, then gets the lock.
    let x2 = x.clone();
    let waiter = thread::spawn(move || {
        let g = x2
            .lock(Mode::Exclusive, Duration::from_secs(10), LEASE)
            .unwrap();
        g.token()
    });
    thread::sleep(Duration::from_millis(50));
    let first = g.token();
    drop(g);
    assert!(waiter.join().unwrap() > first);
}

#[test]
fn blocking_lock_does_not_hold_up_other_guards_of_its_handle() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let xb = b.atomic("x").unwrap();
    let held = xb.try_exclusive(LEASE).unwrap();
    let za = a.atomic("z").unwrap();
    let gz = za.try_exclusive(LEASE).unwrap();
    let xa = a.atomic("x").unwrap();
    let waiter = thread::spawn(move || {
        let g = xa
            .lock(Mode::Exclusive, Duration::from_secs(10), LEASE)
            .unwrap();
        g.token()
    });
    thread::sleep(Duration::from_millis(100));
    // The waiter asks in short slices, so this unlock through the same handle gets in.
    let t = Instant::now();
    drop(gz);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let first = held.token();
    drop(held);
    assert!(waiter.join().unwrap() > first);
}

#[test]
fn extend_keeps_an_atomic_grant_past_its_first_lease() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let mut g = xa.try_exclusive(Duration::from_millis(100)).unwrap();
    g.extend(LEASE).unwrap();
    thread::sleep(Duration::from_millis(250));
    assert!(xb.try_exclusive(LEASE).unwrap_err().is_would_block());
    g.extend(Duration::ZERO)
        .expect("zero checks the grant is held");
    g.unlock().unwrap();
    let _b = xb.try_exclusive(LEASE).unwrap();
}

#[test]
fn explicit_unlock_reports_a_grant_lost_to_expiry() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let g = xa.try_exclusive(Duration::from_millis(20)).unwrap();
    thread::sleep(Duration::from_millis(100));
    let taken = xb.try_exclusive(LEASE).unwrap();
    let e = g.unlock().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    assert_eq!(e.operation(), "unlock");
    // The unlock did not touch the new holder's grant.
    assert!(xa.try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(taken);
}

#[test]
fn drop_error_goes_to_the_hook_not_a_panic() {
    let s = server(false);
    let (a, seen) = handle_with_hook(&s);
    let b = handle(&s);
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let g = xa.try_exclusive(Duration::from_millis(20)).unwrap();
    thread::sleep(Duration::from_millis(100));
    let _taken = xb.try_exclusive(LEASE).unwrap();
    drop(g);
    assert_eq!(*seen.lock().unwrap(), vec![("unlock", Status::Fail)]);
}

#[test]
fn owned_guard_moves_to_another_thread_and_unlocks_there() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let xb = b.atomic("x").unwrap();
    let owned = {
        // The named lock may go: the owned guard keeps its own handle on it.
        let xa = a.atomic("x").unwrap();
        xa.try_exclusive(LEASE).unwrap().into_owned()
    };
    let token = owned.token();
    assert!(xb.try_exclusive(LEASE).unwrap_err().is_would_block());
    thread::spawn(move || drop(owned)).join().unwrap();
    assert!(xb.try_exclusive(LEASE).unwrap().token() > token);
}

#[test]
fn all_or_nothing_set_takes_nothing_when_one_lock_is_busy() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let names = ["s0", "s1", "s2", "s3"];
    let la: Vec<_> = names.iter().map(|n| a.atomic(n).unwrap()).collect();
    let lb: Vec<_> = names.iter().map(|n| b.atomic(n).unwrap()).collect();
    let refs: Vec<_> = la.iter().collect();
    let busy = lb[2].try_exclusive(LEASE).unwrap();

    let e = a
        .try_lock_all(&refs, Mode::Exclusive, LEASE, true)
        .unwrap_err();
    assert!(e.is_would_block(), "{e}");
    for l in [&lb[0], &lb[1], &lb[3]] {
        let _free = l
            .try_exclusive(LEASE)
            .expect("nothing of the failed set is held");
    }

    // Per item: the free ones are held, the busy one is not.
    let set = a
        .try_lock_all(&refs, Mode::Exclusive, LEASE, false)
        .unwrap();
    assert_eq!(set.len(), 3);
    assert!(!set.is_complete());
    assert!(set.token(2).is_none() && set.token(0).is_some());
    assert!(lb[0].try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(set);
    drop(busy);

    let set = a.try_lock_all(&refs, Mode::Exclusive, LEASE, true).unwrap();
    assert!(set.is_complete());
    for l in &lb {
        assert!(l.try_exclusive(LEASE).unwrap_err().is_would_block());
    }
    set.unlock().unwrap();
    for l in &lb {
        let _free = l
            .try_exclusive(LEASE)
            .expect("the set's unlock released it");
    }
}

#[test]
fn set_counts_a_lock_held_by_a_guard_of_the_same_handle_as_busy() {
    let s = server(false);
    let a = handle(&s);
    let (x, y) = (a.atomic("x").unwrap(), a.atomic("y").unwrap());
    let g = x.try_exclusive(LEASE).unwrap();
    let e = a
        .try_lock_all(&[&x, &y], Mode::Exclusive, LEASE, true)
        .unwrap_err();
    assert!(e.is_would_block());
    let set = a
        .try_lock_all(&[&x, &y], Mode::Exclusive, LEASE, false)
        .unwrap();
    assert_eq!((set.token(0), set.token(1).is_some()), (None, true));
    drop(set);
    drop(g);
    let dup = a
        .try_lock_all(&[&x, &x], Mode::Exclusive, LEASE, false)
        .unwrap_err();
    assert_eq!(dup.kind(), ErrorKind::Invalid);
}

#[test]
fn zero_lease_and_shared_atomic_are_invalid() {
    let s = server(false);
    let a = handle(&s);
    let x = a.atomic("x").unwrap();
    assert_eq!(
        x.try_exclusive(Duration::ZERO).unwrap_err().status(),
        Status::Einval
    );
    assert_eq!(x.try_shared(LEASE).unwrap_err().kind(), ErrorKind::Invalid);
    // Neither left anything held.
    let _g = x.try_exclusive(LEASE).unwrap();
}

#[test]
fn transport_failure_keeps_the_io_error_as_source() {
    let s = server(false);
    let a = handle(&s);
    let x = a.atomic("x").unwrap();
    a.with_client(|c| c.drop_data_path());
    let e = x.try_exclusive(LEASE).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Disconnected, "{e}");
    assert!(e.source().is_some(), "{e:?}");
    assert_eq!(
        e.io_error().map(|io| io.to_string()),
        e.source().map(|s| s.to_string())
    );
}

#[test]
fn named_lock_release_reports_and_last_clone_releases() {
    let s = server(false);
    let (a, seen) = handle_with_hook(&s);
    let x = a.atomic("x").unwrap();
    let x2 = a.atomic("x").unwrap();
    let x3 = x.clone();
    assert_eq!(x.id(), x2.id());
    x.release().unwrap();
    drop(x3);
    // `x2` still counts: the reference stays and the lock works.
    let g = x2.try_exclusive(LEASE).unwrap();
    drop(g);
    x2.release().unwrap();
    let known = a.with_client(|c| c.locks().count());
    assert_eq!(known, 0, "the last handle released the client's reference");
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn refused_fair_try_keeps_its_ticket_until_the_name_is_released() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let ya = a.fair("y").unwrap();
    let g = ya.try_exclusive(LEASE).unwrap();
    let yb = b.fair("y").unwrap();
    assert!(yb.try_exclusive(LEASE).unwrap_err().is_would_block());
    // Queued exclusive: asking shared meanwhile is the reference's `Eticket`.
    assert_eq!(yb.try_shared(LEASE).unwrap_err().status(), Status::Eticket);
    // Releasing the name gives the ticket back first, so the release succeeds.
    yb.release().unwrap();
    assert_eq!(b.with_client(|c| c.locks().count()), 0);
    drop(g);
}

/// Sets are not batches: a set of any size goes in as many messages of up to 31 as it needs
/// (deliberately, unlike `Client::batch_trylock`, which refuses more than 31 as the reference
/// does), all or nothing across them, and an empty set asks the server nothing.
#[test]
fn sets_split_past_31_locks_and_an_empty_set_is_empty() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let names: Vec<String> = (0..40).map(|i| format!("set/{i}")).collect();
    let la: Vec<_> = names.iter().map(|n| a.atomic(n).unwrap()).collect();
    let lb: Vec<_> = names.iter().map(|n| b.atomic(n).unwrap()).collect();
    let all: Vec<_> = la.iter().collect();
    let set = a.try_lock_all(&all, Mode::Exclusive, LEASE, true).unwrap();
    assert_eq!((set.len(), set.is_complete()), (40, true));
    assert!(lb[35].try_exclusive(LEASE).unwrap_err().is_would_block());
    drop(set);
    // The 40th lock is busy: the first message (31 locks) was granted and is given back.
    let busy = lb[39].try_exclusive(LEASE).unwrap();
    let e = a
        .try_lock_all(&all, Mode::Exclusive, LEASE, true)
        .unwrap_err();
    assert!(e.is_would_block(), "{e}");
    for l in &lb[..39] {
        let _free = l
            .try_exclusive(LEASE)
            .expect("nothing of the failed set is held");
    }
    drop(busy);
    let empty = a.try_lock_all(&[], Mode::Exclusive, LEASE, true).unwrap();
    assert!(empty.is_empty() && empty.is_complete());
}
