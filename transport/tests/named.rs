//! The native lock API against a real server (shared memory, in-process), blocking calls:
//! guards unlock on drop, several live at once, shared and exclusive exclusion (also between
//! guards of one handle), waiting, extend, errors from explicit unlocks and from drops, guards
//! across threads, fair tries that leave no ticket, and lock sets.

mod common;

use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::gated::gated_client;
use common::{client, server};
use dlock_core::{Mode, Status};
use dlock_transport::client::{
    AtomicLock, Endpoint, ErrorKind, LockOptions, Locks, SetEntry, SetMode,
};
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

fn wait(d: Duration) -> LockOptions {
    LockOptions::new(LEASE).with_wait(d)
}

#[test]
fn a_guard_unlocks_on_drop_so_another_handle_takes_the_lock() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (la, lb) = (a.atomic("t1/rg7").unwrap(), b.atomic("t1/rg7").unwrap());
    let g = la.try_lock(LEASE).unwrap();
    let first = g.token();
    let busy = lb.try_lock(LEASE).unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::WouldBlock, "{busy}");
    // The drop sends the unlock without waiting for its answer; a waiting request of
    // another client is granted when the server executes it.
    drop(g);
    let again = lb.lock(wait(Duration::from_secs(30))).unwrap();
    assert!(again.token() > first, "tokens grow across holders");
}

#[test]
fn two_guards_of_one_handle_live_at_once_on_different_locks() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (x, y) = (a.atomic("x").unwrap(), a.fair("y").unwrap());
    let gx = x.try_lock(LEASE).unwrap();
    let gy = y.try_write(LEASE).unwrap();
    assert_ne!(gx.token(), gy.token());
    let (bx, by) = (b.atomic("x").unwrap(), b.fair("y").unwrap());
    assert!(bx.try_lock(LEASE).unwrap_err().is_would_block());
    assert!(by.try_write(LEASE).unwrap_err().is_would_block());
    drop(gx);
    let _bx = bx.lock(wait(Duration::from_secs(30))).unwrap();
    // `y` is still held by the other guard.
    assert!(by.try_write(LEASE).unwrap_err().is_would_block());
    drop(gy);
    let _by = by.write(wait(Duration::from_secs(30))).unwrap();
}

#[test]
fn read_guards_coexist_and_exclude_a_writer() {
    let s = server(false);
    let (a, b, c) = (handle(&s), handle(&s), handle(&s));
    let (ra, rb, rc) = (a.rw("r").unwrap(), b.rw("r").unwrap(), c.rw("r").unwrap());
    let ga = ra.try_read().unwrap();
    let gb = rb.try_read().unwrap();
    // A second read guard of the same handle is a re-entry, not a conflict.
    let ga2 = ra.try_read().unwrap();
    assert!(rc.try_write().unwrap_err().is_would_block());
    // Nor may the same handle upgrade behind its own read guards' backs.
    assert!(ra.try_write().unwrap_err().is_would_block());
    drop(ga);
    drop(gb);
    // One read guard of `a` is left: still held on the server.
    assert!(rc.try_write().unwrap_err().is_would_block());
    drop(ga2);
    let _gc = rc.write(Duration::from_secs(30)).unwrap();
}

#[test]
fn a_write_guard_excludes_another_guard_of_the_same_handle() {
    let s = server(false);
    let a = handle(&s);
    let x = a.rw("x").unwrap();
    let g = x.try_write().unwrap();
    // The reference client would count a re-entry; a guard must mean exclusion.
    assert!(x.try_write().unwrap_err().is_would_block());
    assert!(x.try_read().unwrap_err().is_would_block());
    let timed_out = x.write(Duration::from_millis(30)).unwrap_err();
    assert_eq!(timed_out.kind(), ErrorKind::TimedOut);
    // Another thread sharing the handle waits for the guard's drop, then gets the lock.
    let x2 = x.clone();
    let waiter = thread::spawn(move || x2.write(Duration::from_secs(30)).unwrap().token());
    let first = g.token();
    drop(g);
    assert!(waiter.join().unwrap() > first);
}

#[test]
fn a_blocking_wait_does_not_hold_up_other_guards_of_its_handle() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let held = b.atomic("x").unwrap().try_lock(LEASE).unwrap();
    let za = a.atomic("z").unwrap();
    let gz = za.try_lock(LEASE).unwrap();
    let xa = a.atomic("x").unwrap();
    let waiter = thread::spawn(move || xa.lock(wait(Duration::from_secs(30))).unwrap().token());
    thread::sleep(Duration::from_millis(100));
    // The waiter asks in short slices, so this unlock through the same handle gets in (with
    // one request for the whole wait, it would wait the 30 s out), and `z` is free at once.
    gz.unlock().unwrap();
    let _z = b.atomic("z").unwrap().try_lock(LEASE).unwrap();
    let first = held.token();
    drop(held);
    assert!(waiter.join().unwrap() > first);
}

#[test]
fn extend_keeps_an_atomic_grant_past_its_first_lease() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let mut g = xa.try_lock(Duration::from_millis(100)).unwrap();
    g.extend(LEASE).unwrap();
    thread::sleep(Duration::from_millis(250));
    assert!(xb.try_lock(LEASE).unwrap_err().is_would_block());
    g.extend(Duration::ZERO)
        .expect("zero checks the grant is held");
    g.unlock().unwrap();
    let _b = xb.try_lock(LEASE).unwrap();
}

#[test]
fn an_explicit_unlock_reports_a_grant_lost_to_expiry() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let g = xa.try_lock(Duration::from_millis(20)).unwrap();
    thread::sleep(Duration::from_millis(100));
    let taken = xb.try_lock(LEASE).unwrap();
    let e = g.unlock().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotHeld, "{e}");
    assert_eq!(e.operation(), "unlock");
    // The unlock did not touch the new holder's grant.
    assert!(xa.try_lock(LEASE).unwrap_err().is_would_block());
    drop(taken);
}

#[test]
fn a_drop_error_goes_to_the_hook_by_the_next_call_not_a_panic() {
    let s = server(false);
    let a = handle(&s);
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    // The hook may use the handle: it runs once the call that met the error is done with the
    // client. (It keeps the handle alive for ever: a test may leak it.)
    let user = a.clone();
    a.set_drop_hook(move |e| {
        user.heartbeat()
            .expect("the handle is usable from its hook");
        sink.lock().unwrap().push((e.operation(), e.status()));
    });
    let b = handle(&s);
    let (xa, xb) = (a.atomic("x").unwrap(), b.atomic("x").unwrap());
    let g = xa.try_lock(Duration::from_millis(20)).unwrap();
    thread::sleep(Duration::from_millis(100));
    let _taken = xb.try_lock(LEASE).unwrap();
    drop(g);
    // The drop sent the unlock without reading its answer; the handle's next call reads it.
    a.heartbeat().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![("unlock", Status::Fail)]);
}

/// A drop whose unlock could not be sent leaves the client's record saying "held" with no
/// guard left. Asked for the lock again, the record alone would answer a re-entry with the old
/// grant's token, without the server; the handle gives that grant back first, so the new guard
/// stands for a new grant.
#[test]
fn a_grant_whose_unlock_never_left_is_not_handed_out_again() {
    let s = server(false);
    let (c, gate) = gated_client(&Endpoint::embedded(&s), Duration::from_secs(60));
    let a = Locks::from(c);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    a.set_drop_hook(move |e| sink.lock().unwrap().push(e.operation()));
    let (x, y, z) = (
        a.rw("x").unwrap(),
        a.atomic("y").unwrap(),
        a.atomic("z").unwrap(),
    );
    let (gx, gy) = (x.try_write().unwrap(), y.try_lock(LEASE).unwrap());
    let gz = z.try_lock(Duration::from_millis(20)).unwrap();
    let (old_x, old_y) = (gx.token(), gy.token());
    gate.fail_sends(true);
    drop((gx, gy, gz));
    assert_eq!(*seen.lock().unwrap(), ["submit_unlock"; 3]);
    gate.fail_sends(false);
    let again = x.try_write().unwrap();
    assert!(
        again.token() > old_x,
        "a new grant, not the old one re-entered"
    );
    // A stale grant lost meanwhile (its lease ran out, another client took the lock and let it
    // go) is simply forgotten: the server says it is not held, and the request goes on.
    thread::sleep(Duration::from_millis(100));
    let b = handle(&s);
    b.atomic("z")
        .unwrap()
        .try_lock(LEASE)
        .unwrap()
        .unlock()
        .unwrap();
    drop(
        z.try_lock(LEASE)
            .expect("a lost stale grant does not fail the request"),
    );
    let set = a.try_lock_all([&y], LEASE, SetMode::AllOrNothing).unwrap();
    assert!(set.token(0).is_some_and(|t| t > old_y));
    // And the other client sees each lock held exactly by the new guards: freed by them.
    assert!(b.rw("x").unwrap().try_write().unwrap_err().is_would_block());
    again.unlock().unwrap();
    set.unlock().unwrap();
    let _bx = b.rw("x").unwrap().try_write().unwrap();
    let _by = b.atomic("y").unwrap().try_lock(LEASE).unwrap();
}

#[test]
fn a_grant_whose_reply_never_came_is_no_guard_when_asked_again() {
    let s = server(false);
    let (c, gate) = gated_client(&Endpoint::embedded(&s), Duration::from_millis(50));
    let a = Locks::from(c);
    let x = a.rw("x").unwrap();
    // The server grants the read, but its reply is held back past the request timeout: the
    // call gives up, and the client's record holds nothing.
    gate.close();
    x.try_read().unwrap_err();
    gate.open();
    // Asked again, the server says the lock is this client's already. The record knows no
    // grant (nor its token), so that is no guard: one would carry token 0 and its unlock would
    // be answered locally, leaving the server's grant in place.
    let again = x.try_read();
    assert_eq!(
        again.map(|g| g.token()).unwrap_err().status(),
        Status::AlreadyLocked
    );
}

#[test]
fn a_guard_moves_to_another_thread_and_unlocks_there() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let xb = b.atomic("x").unwrap();
    let guard = {
        // The handle may go: the guard keeps its own on the lock.
        let xa = a.atomic("x").unwrap();
        xa.try_lock(LEASE).unwrap()
    };
    let token = guard.token();
    assert!(xb.try_lock(LEASE).unwrap_err().is_would_block());
    thread::spawn(move || drop(guard)).join().unwrap();
    let taken = xb.lock(wait(Duration::from_secs(30))).unwrap();
    assert!(taken.token() > token);
}

/// A fair `try_` that finds others queued is refused but keeps its place (the lock word would
/// keep a given-back ticket in line anyway, stalling everyone behind it for the hand-off
/// window): the registration sees it, its next try is served in turn ahead of a later client,
/// and it can leave the queue or release the name while queued.
#[test]
fn a_refused_fair_try_keeps_its_place_in_view_until_used_or_given_back() {
    let s = server(false);
    let (a, b, c) = (handle(&s), handle(&s), handle(&s));
    let (ya, yb, yc) = (
        a.fair("y").unwrap(),
        b.fair("y").unwrap(),
        c.fair("y").unwrap(),
    );
    let writer = ya.try_write(LEASE).unwrap();
    assert_eq!(yb.queued(), None);
    let e = yb.try_write(LEASE).unwrap_err();
    assert!(e.is_would_block(), "{e}");
    assert_eq!(yb.queued(), Some(Mode::Exclusive));
    // Queued for writing: asking to read is the reference's `Eticket`.
    assert_eq!(yb.try_read(LEASE).unwrap_err().status(), Status::Eticket);
    writer.unlock().unwrap();
    // `b`'s ticket comes first: a later client's try is refused, `b`'s next try served.
    assert!(yc.try_write(LEASE).unwrap_err().is_would_block());
    let g = yb
        .try_write(LEASE)
        .expect("the kept place is served in turn");
    assert_eq!(yb.queued(), None);
    g.unlock().unwrap();
    // `c` was queued meanwhile and is first in line now: its next try is served.
    assert_eq!(yc.queued(), Some(Mode::Exclusive));
    let gc = yc.try_write(LEASE).unwrap();
    // Queued behind `c`, `b` leaves the queue; queued again, it releases the name: the ticket
    // goes with it, and nothing is left of `b` on the lock.
    assert!(yb.try_read(LEASE).unwrap_err().is_would_block());
    yb.leave_queue().unwrap();
    assert_eq!(yb.queued(), None);
    assert!(yb.try_read(LEASE).unwrap_err().is_would_block());
    yb.release().unwrap();
    assert_eq!(b.with_client(|c| c.locks().count()), 0);
    drop(gc);
}

#[test]
fn a_fair_wait_is_served_when_the_holder_leaves() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let writer = a.fair("q").unwrap().try_write(LEASE).unwrap();
    let qb = b.fair("q").unwrap();
    let reader = thread::spawn(move || qb.read(wait(Duration::from_secs(30))).unwrap().token());
    // Queued before the writer leaves or not, the reader is served.
    thread::sleep(Duration::from_millis(50));
    let first = writer.token();
    drop(writer);
    assert!(reader.join().unwrap() > first);
}

#[test]
fn a_zero_lease_is_invalid_and_leaves_nothing_held() {
    let s = server(false);
    let a = handle(&s);
    let x = a.atomic("x").unwrap();
    let e = x.try_lock(Duration::ZERO).unwrap_err();
    assert_eq!((e.status(), e.kind()), (Status::Einval, ErrorKind::Invalid));
    let f = a.fair("f").unwrap();
    assert_eq!(
        f.write(LockOptions::new(Duration::ZERO)).unwrap_err(),
        Status::Einval
    );
    let _g = x.try_lock(LEASE).unwrap();
}

#[test]
fn a_transport_failure_keeps_the_io_error_as_source() {
    let s = server(false);
    let a = handle(&s);
    let x = a.atomic("x").unwrap();
    a.with_client(|c| c.drop_data_path());
    let e = x.try_lock(LEASE).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Disconnected, "{e}");
    assert!(e.source().is_some(), "{e:?}");
    assert_eq!(
        e.io_error().map(|io| io.to_string()),
        e.source().map(|s| s.to_string())
    );
}

#[test]
fn releasing_a_handle_reports_and_the_last_one_releases() {
    let s = server(false);
    let (a, seen) = handle_with_hook(&s);
    let x = a.atomic("x").unwrap();
    let x2 = a.atomic("x").unwrap();
    let x3 = x.clone();
    assert_eq!(x.id(), x2.id());
    x.release().unwrap();
    drop(x3);
    // `x2` still counts: the reference stays and the lock works.
    drop(x2.try_lock(LEASE).unwrap());
    x2.release().unwrap();
    let known = a.with_client(|c| c.locks().count());
    assert_eq!(known, 0, "the last handle released the client's reference");
    // A dropped handle is released by the next call, without a word to the hook.
    drop(a.rw("y").unwrap());
    assert_eq!(a.with_client(|c| c.locks().count()), 0);
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn debug_and_client_id_do_not_wait_for_a_caller_using_the_client() {
    let s = server(false);
    let (c, gate) = gated_client(&Endpoint::embedded(&s), Duration::from_secs(60));
    let a = Locks::from(c);
    let x = a.rw("x").unwrap();
    gate.close();
    let user = thread::spawn(move || x.try_write().map(drop));
    // The other thread has the client, inside a wait for a reply that does not come.
    gate.until_someone_waits();
    let shown = format!("{a:?}");
    assert!(shown.contains(&format!("{:?}", a.client_id())), "{shown}");
    assert!(
        !user.is_finished(),
        "the gate held the other caller all along"
    );
    gate.open();
    user.join().unwrap().unwrap();
}

#[test]
fn all_or_nothing_sets_take_nothing_when_one_lock_is_busy() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let names = ["s0", "s1", "s2", "s3"];
    let la: Vec<_> = names.iter().map(|n| a.atomic(n).unwrap()).collect();
    let lb: Vec<_> = names.iter().map(|n| b.atomic(n).unwrap()).collect();
    let busy = lb[2].try_lock(LEASE).unwrap();

    let e = a
        .try_lock_all(&la, LEASE, SetMode::AllOrNothing)
        .unwrap_err();
    assert!(e.is_would_block(), "{e}");
    for l in [&lb[0], &lb[1], &lb[3]] {
        let free = l
            .try_lock(LEASE)
            .expect("nothing of the failed set is held");
        free.unlock().unwrap();
    }

    // Per item: the free ones are held, the busy one is not; the set counts by entry.
    let set = a.try_lock_all(&la, LEASE, SetMode::PerItem).unwrap();
    assert_eq!(set.len(), 4);
    assert!(!set.is_complete());
    let granted: Vec<bool> = set.tokens().map(|t| t.is_some()).collect();
    assert_eq!(granted, [true, true, false, true]);
    assert!(lb[0].try_lock(LEASE).unwrap_err().is_would_block());
    drop(set);
    busy.unlock().unwrap();

    let set = a.try_lock_all(&la, LEASE, SetMode::AllOrNothing).unwrap();
    assert!(set.is_complete());
    for l in &lb {
        assert!(l.try_lock(LEASE).unwrap_err().is_would_block());
    }
    set.unlock().unwrap();
    for l in &lb {
        let _free = l.try_lock(LEASE).expect("the set's unlock released it");
    }
}

#[test]
fn a_set_mixes_kinds_and_modes_and_counts_a_guard_of_its_handle_as_busy() {
    let s = server(false);
    let (a, b) = (handle(&s), handle(&s));
    let (x, r, f) = (
        a.atomic("x").unwrap(),
        a.rw("r").unwrap(),
        a.fair("f").unwrap(),
    );
    let g = x.try_lock(LEASE).unwrap();
    let entries = || -> [SetEntry; 3] {
        [
            (&x).into(),
            (&r, Mode::Shared).into(),
            (&f, Mode::Exclusive).into(),
        ]
    };
    let e = a
        .try_lock_all(entries(), LEASE, SetMode::AllOrNothing)
        .unwrap_err();
    assert!(e.is_would_block());
    let set = a.try_lock_all(entries(), LEASE, SetMode::PerItem).unwrap();
    assert_eq!(
        (set.token(0), set.token(1).is_some(), set.token(2).is_some()),
        (None, true, true)
    );
    // The read grant admits another reader, the fair write grant nobody.
    let _rb = b.rw("r").unwrap().try_read().unwrap();
    assert!(
        b.fair("f")
            .unwrap()
            .try_read(LEASE)
            .unwrap_err()
            .is_would_block()
    );
    drop((set, g));
    let dup = a
        .try_lock_all([&x, &x], LEASE, SetMode::PerItem)
        .unwrap_err();
    assert_eq!(dup.kind(), ErrorKind::Invalid);
    let other = b.atomic("x").unwrap();
    let foreign = a
        .try_lock_all([&other], LEASE, SetMode::PerItem)
        .unwrap_err();
    assert_eq!(
        foreign.kind(),
        ErrorKind::Invalid,
        "a lock of another handle"
    );
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
    let set = a.try_lock_all(&la, LEASE, SetMode::AllOrNothing).unwrap();
    assert_eq!((set.len(), set.is_complete()), (40, true));
    assert!(lb[35].try_lock(LEASE).unwrap_err().is_would_block());
    set.unlock().unwrap();
    // The 40th lock is busy: the first message (31 locks) was granted and is given back.
    let busy = lb[39].try_lock(LEASE).unwrap();
    let e = a
        .try_lock_all(&la, LEASE, SetMode::AllOrNothing)
        .unwrap_err();
    assert!(e.is_would_block(), "{e}");
    for l in &lb[..39] {
        let _free = l
            .try_lock(LEASE)
            .expect("nothing of the failed set is held");
    }
    drop(busy);
    let empty = a
        .try_lock_all(Vec::<&AtomicLock>::new(), LEASE, SetMode::AllOrNothing)
        .unwrap();
    assert!(empty.is_empty() && empty.is_complete());
}
