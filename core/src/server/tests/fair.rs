//! The fair lock on the data path: tickets, the server's guards (`crate::word::fair::serve`), and
//! tickets the server no longer records.

use super::*;

#[test]
fn fair_lock_queues_then_grants_by_ticket_and_abandoning_a_ticket_is_accepted() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    let ra = s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, l, 10_000), 0);
    assert_eq!(ra.status, Status::Success);
    let ta = crate::word::fair::FairWord::from_bits(ra.word).counters();
    let rb = s.run(b, lock(LockKind::Fair, LockOp::TryExclusive, lb, 10_000), 0);
    assert_eq!(rb.status, Status::Eagain);
    let tb = Ticket {
        exclusive: rb.aux as u16,
        shared: (rb.aux >> 16) as u16,
    };
    assert_eq!(
        s.release_lock(b.get(), lb.raw(), 0),
        Err(Status::TicketToUnlock)
    );
    assert_eq!(
        s.run(
            b,
            ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 10_000, tb),
            1
        )
        .status,
        Status::Eagain
    );
    assert_eq!(
        s.run(
            a,
            ticketed(LockKind::Fair, LockOp::UnlockExclusive, l, 0, ta),
            2
        )
        .status,
        Status::Success
    );
    let g = s.run(
        b,
        ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 10_000, tb),
        3,
    );
    assert_eq!(g.status, Status::Success);
    assert!(g.aux > ra.aux);
    assert_eq!(
        s.run(
            b,
            ticketed(LockKind::Fair, LockOp::UnlockExclusive, lb, 0, tb),
            4
        )
        .status,
        Status::Success
    );
    assert_eq!(s.release_lock(b.get(), lb.raw(), 4), Ok(()));
}

#[test]
fn fair_ticket_the_lock_never_issued_is_void() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    assert_eq!(
        s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, la, 100), 0)
            .status,
        Status::Success
    );
    assert_eq!(
        s.run(b, lock(LockKind::Fair, LockOp::TryExclusive, lb, 100), 0)
            .status,
        Status::Eagain
    );
    // b forges a ticket far ahead of `mx`: a late retry with it would otherwise preempt and
    // move `nx` past `mx`.
    let forged = Ticket {
        exclusive: 40,
        shared: 0,
    };
    let before = s.tables().digest();
    let r = s.run(
        b,
        ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 100, forged),
        10_000,
    );
    assert_eq!(r.status, Status::Fail);
    assert_ne!(
        s.tables().digest(),
        before,
        "the forged ticket's holder lost its queue place"
    );
    let w = crate::word::fair::FairWord::from_bits(s.t.lock_cells[la.index() as usize].word);
    assert_eq!((w.nx(), w.mx()), (0, 2), "the counters did not move");
}

#[test]
fn fair_writer_is_never_granted_beside_a_reader() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    // The state the reference can reach when a voided shared ticket is revived after `rflag`
    // resets: the shared counters agree (`ns == ms`) while a reader still holds.
    let w = crate::word::fair::FairWord::new()
        .with_ns(5)
        .with_ms(5)
        .with_rcnt(1)
        .with_timeout_ms(50_000);
    s.t.lock_cells[l.index() as usize].word = w.into_bits();
    let r = s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, l, 100), 0);
    assert_eq!(r.status, Status::Eagain);
    let after = crate::word::fair::FairWord::from_bits(s.t.lock_cells[l.index() as usize].word);
    assert_eq!(
        (after.rcnt(), after.mx()),
        (1, 1),
        "queued behind the reader, ticket taken"
    );
    assert_eq!(
        s.t.lock_cells[l.index() as usize].ext,
        0,
        "no exclusive owner"
    );
}

#[test]
fn forged_other_half_of_a_fair_ticket_is_refused() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    assert_eq!(
        s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, la, 100), 0)
            .status,
        Status::Success
    );
    let q = s.run(b, lock(LockKind::Fair, LockOp::TryShared, lb, 100), 0);
    assert_eq!(q.status, Status::Eagain);
    let forged = Ticket {
        exclusive: 40,
        shared: (q.aux >> 16) as u16,
    };
    let r = s.run(
        b,
        ticketed(LockKind::Fair, LockOp::TicketShared, lb, 100, forged),
        500,
    );
    assert_eq!(r.status, Status::Fail);
    let w = crate::word::fair::FairWord::from_bits(s.t.lock_cells[la.index() as usize].word);
    assert_eq!((w.nx(), w.mx()), (0, 1));
}

#[test]
fn fair_lock_in_the_other_mode_while_holding_is_einval() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let l = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    assert_eq!(
        s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, l, 100), 0)
            .status,
        Status::Success
    );
    assert_eq!(
        s.run(a, lock(LockKind::Fair, LockOp::TryShared, l, 100), 0)
            .status,
        Status::Einval
    );
    assert_eq!(
        s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, l, 100), 0)
            .status,
        Status::AlreadyLocked
    );
}

#[test]
fn a_shared_ticket_voided_by_a_preemption_stays_void_after_rflag_resets() {
    let mut s = TestServer::new(&small());
    let [a, b, c] = [0; 3].map(|_| s.client(0));
    let [la, lb, lc] = [a, b, c].map(|x| s.get_lock(x.get(), LockKind::Fair, b"f", 0).unwrap());
    let tick = |r: CommandResult| Ticket {
        exclusive: r.aux as u16,
        shared: (r.aux >> 16) as u16,
    };
    let word_ticket = |r: CommandResult| {
        let w = crate::word::fair::FairWord::from_bits(r.word);
        Ticket {
            exclusive: w.mx(),
            shared: w.ms(),
        }
    };
    assert_eq!(
        s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, la, 100), 0)
            .status,
        Status::Success
    );
    let tb = tick(s.run(b, lock(LockKind::Fair, LockOp::TryShared, lb, 100), 0));
    let tc = tick(s.run(c, lock(LockKind::Fair, LockOp::TryShared, lc, 100), 0));
    let pre = s.run(
        c,
        ticketed(LockKind::Fair, LockOp::TicketShared, lc, 100, tc),
        101,
    );
    assert_eq!(pre.status, Status::Success, "c preempts the overdue writer");
    s.run(
        c,
        ticketed(LockKind::Fair, LockOp::UnlockShared, lc, 0, tc),
        102,
    );
    for _ in 0..49 {
        let r = s.run(c, lock(LockKind::Fair, LockOp::TryShared, lc, 100), 103);
        assert_eq!(r.status, Status::Success);
        s.run(
            c,
            ticketed(LockKind::Fair, LockOp::UnlockShared, lc, 0, word_ticket(r)),
            103,
        );
    }
    // b's ticket was voided by the preemption: refused, and b queues again from scratch.
    let r = s.run(
        b,
        ticketed(LockKind::Fair, LockOp::TicketShared, lb, 100, tb),
        104,
    );
    assert_eq!(
        r.status,
        Status::Fail,
        "a passed ticket, as the reference answers it"
    );
    for x in [a, b] {
        let l = if x == a { la } else { lb };
        let r = s.run(
            x,
            lock(LockKind::Fair, LockOp::TryExclusive, l, 100),
            1_000_000,
        );
        assert!(
            matches!(r.status, Status::Success | Status::Eagain),
            "the lock is not wedged: {:?}",
            r.status
        );
        if r.status == Status::Success {
            s.run(
                x,
                ticketed(
                    LockKind::Fair,
                    LockOp::UnlockExclusive,
                    l,
                    0,
                    word_ticket(r),
                ),
                1_000_000,
            );
        }
    }
}

#[test]
fn fair_ticket_retry_with_no_lease_is_einval() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    s.run(a, lock(LockKind::Fair, LockOp::TryExclusive, la, 100), 0);
    let q = s.run(b, lock(LockKind::Fair, LockOp::TryExclusive, lb, 100), 0);
    let t = Ticket {
        exclusive: q.aux as u16,
        shared: (q.aux >> 16) as u16,
    };
    assert_eq!(
        s.run(
            b,
            ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 0, t),
            500
        )
        .status,
        Status::Einval
    );
}
