//! The server's count of clients registered below protocol 8 (`Server::old_clients`), which lets
//! an acquisition of a contended lock nobody caches skip the holders' scan (`revokes.rs`): the
//! count through every way an entry is made, resumed and freed, and the one thing the scan
//! still does there — waking a plain holder below protocol 8 parked on another lock; and a
//! cacheable request granted plain over a holder the scan saw in its way, which is marked (or
//! told) as one granted plain on a contended lock is.

use super::contention::{WINDOW_MS, cmd, config, events, waiting};
use super::*;
use crate::proto::{Event, LockFlags, PROTO_VERSION_PLAIN_GRANTS};

const OLD: u8 = PROTO_VERSION_PLAIN_GRANTS - 1;
const NEW: u8 = PROTO_VERSION_PLAIN_GRANTS;
const EX: LockOp = LockOp::TryExclusive;

/// The count, after checking the tables agree with it.
fn old(s: &TestServer) -> u32 {
    s.check_invariants().unwrap();
    s.old_clients
}

#[test]
fn the_count_of_old_clients_follows_registration_resumption_and_departure() {
    let mut s = TestServer::new(&small());
    let a = s.client_init(OLD, 0, 0).unwrap();
    let b = s.client_init(NEW, 0, 0).unwrap();
    let c = s.client_init(OLD, 0, 0).unwrap();
    assert_eq!(old(&s), 2);
    // A resumed registration counts at the version it came back with, either way.
    let session = s.session(b.get());
    s.client_reinit(b.get(), OLD, 0, &session, 1).unwrap();
    assert_eq!(old(&s), 3);
    let session = s.session(a.get());
    s.client_reinit(a.get(), NEW, 0, &session, 1).unwrap();
    assert_eq!(old(&s), 2);
    s.reinit_done(a.get(), 1).unwrap();
    s.reinit_done(b.get(), 1).unwrap();
    // A deinit frees the entry.
    s.client_deinit(b.get(), 2).unwrap();
    assert_eq!(old(&s), 1);
    // A death that retains a grant keeps the entry, counted, until `recovery_done` frees it;
    // a death that retains nothing frees it at once.
    let l = s.get_lock(c.get(), LockKind::Rw, b"kept", 2).unwrap();
    let retain = Command::Lock(LockCommand {
        flags: LockFlags::RETAIN,
        ..match lock(LockKind::Rw, EX, l, 0) {
            Command::Lock(c) => c,
            _ => unreachable!(),
        }
    });
    assert_eq!(s.run(c, retain, 2).status, Status::Success);
    s.client_init(OLD, 0, 2).unwrap();
    let _ = s.heartbeat(a.get(), 1_400);
    assert_eq!(s.tick(1_500), 2, "c and d died");
    assert_eq!((s.retaining_clients(), old(&s)), (1, 1), "c, retaining");
    assert_eq!(
        s.recovery_done(crate::manager::retain::Role::Recoverer, c.get(), 1_500),
        Ok(1)
    );
    assert_eq!(old(&s), 0);
}

/// A plain holder `b` of contended lock x (at `holder` version) parked on lock y with
/// `WAKE_ON_REVOKE`, and `a` (at protocol 8) parking on x: whether `b`'s wait is cut short,
/// with a third client of version `bystander` registered.
fn holder_woken(holder: u8, bystander: u8) -> bool {
    let mut s = TestServer::new(&config(WINDOW_MS as u32));
    let a = s.client_init(NEW, 0, 0).unwrap();
    let b = s.client_init(holder, 0, 0).unwrap();
    let c = s.client_init(bystander, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    // A conflict between plain holders makes x contended; then b holds it plain.
    assert_eq!(
        s.run(a, cmd(EX, la, LockFlags::NONE), 1).status,
        Status::Success
    );
    assert_eq!(
        s.run(b, cmd(EX, lb, LockFlags::NONE), 2).status,
        Status::Fail
    );
    let unlock = cmd(LockOp::UnlockExclusive, la, LockFlags::NONE);
    assert_eq!(s.run(a, unlock, 3).status, Status::Success);
    assert_eq!(
        s.run(b, cmd(EX, lb, LockFlags::CACHEABLE), 4).status,
        Status::Success
    );
    let _ = events(&s, b);
    let yc = s.get_lock(c.get(), LockKind::Rw, b"y", 0).unwrap();
    let yb = s.get_lock(b.get(), LockKind::Rw, b"y", 0).unwrap();
    assert_eq!(
        s.run(c, cmd(EX, yc, LockFlags::NONE), 5).status,
        Status::Success
    );
    let park = |id, flags| waiting(cmd(EX, id, flags), 50_000);
    assert_eq!(s.wait_for(b, park(yb, LockFlags::WAKE_ON_REVOKE), 6), None);
    assert_eq!(s.wait_for(a, park(la, LockFlags::NONE), 7), None);
    s.poll_waiters(7);
    let got = s.replies();
    s.check_invariants().unwrap();
    match got.as_slice() {
        [] => false,
        [r] if r.client == b.get() && r.result.status == Status::Etimeout => true,
        other => panic!("{other:?}"),
    }
}

#[test]
fn only_a_plain_holder_below_protocol_8_is_woken_whoever_else_is_registered() {
    // The old holder is woken whether or not it is the only old client (the scan runs for it);
    // a holder of protocol 8 read its mark in the result, and is not woken, even when an old
    // client elsewhere makes the scan run.
    assert!(holder_woken(OLD, NEW));
    assert!(holder_woken(OLD, OLD));
    assert!(!holder_woken(NEW, OLD));
    assert!(!holder_woken(NEW, NEW));
}

/// A cacheable request by a client at `version` that takes over `kind` lock's overdue plain
/// grant of an old client (an atomic lock's expired one, a fair lock's preempted one) after a
/// conflict made the lock contended, with the old client's registration making the revoke
/// decision scan, where the holder is in its way: the grant's result, and the revoke notice a
/// client below protocol 8 is sent for it.
fn overdue_taken_over(kind: LockKind, version: u8) -> (CommandResult, Vec<Event>, Vec<Event>) {
    let mut s = TestServer::new(&config(1_000));
    let a = s.client_init(OLD, 0, 0).unwrap();
    let b = s.client_init(version, 0, 0).unwrap();
    let la = s.get_lock(a.get(), kind, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), kind, b"x", 0).unwrap();
    assert_eq!(s.run(a, lock(kind, EX, la, 100), 0).status, Status::Success);
    let ask = |op, ticket| {
        Command::Lock(LockCommand {
            ticket,
            flags: LockFlags::CACHEABLE,
            ..match lock(kind, op, lb, 100) {
                Command::Lock(c) => c,
                _ => unreachable!(),
            }
        })
    };
    let first = s.run(b, ask(EX, Ticket::default()), 50);
    assert_ne!(first.status, Status::Success, "a conflict");
    let got = match kind {
        LockKind::Fair => {
            let ticket = Ticket {
                exclusive: first.aux as u16,
                shared: (first.aux >> 16) as u16,
            };
            s.run(b, ask(LockOp::TicketExclusive, ticket), 101)
        }
        _ => s.run(b, ask(EX, Ticket::default()), 101),
    };
    assert_eq!(got.status, Status::Success, "{kind:?}: taken over");
    let held = s.recorded_hold(s.client_slot_of(b.get()).unwrap(), lb.index());
    assert!(!held.is_cached(), "{kind:?}: recorded plain");
    let notice = Event::Revoke {
        lock: lb,
        wanted: crate::Mode::Exclusive,
        fence: got.aux,
    };
    (got, events(&s, b), vec![notice])
}

#[test]
fn a_cacheable_request_granted_plain_over_an_overdue_holder_is_marked_or_told() {
    for kind in [LockKind::Atomic, LockKind::Fair] {
        let (got, told, _) = overdue_taken_over(kind, NEW);
        assert!(got.plain, "{kind:?}: protocol 8 reads the mark");
        assert_eq!(told, vec![], "{kind:?}");
        let (got, told, notice) = overdue_taken_over(kind, OLD);
        assert!(!got.plain, "{kind:?}");
        assert_eq!(told, notice, "{kind:?}: an older client is sent a notice");
    }
}
