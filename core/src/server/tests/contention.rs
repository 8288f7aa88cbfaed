//! Contention-aware grants in the data path (`manager::contention`, `server/revokes.rs`): a
//! request that asks for a cached grant on a lock a conflict revoked within the contention
//! window is granted plain, and its holder told: in the grant's own result at protocol 8
//! ([`CommandResult::plain`]), by a revoke for that grant sent at once before.

use super::*;
use crate::Mode;
use crate::manager::{GrantState, Timing};
use crate::proto::{Event, LockFlags, PROTO_VERSION_PLAIN_GRANTS, decode_data_response};

const LEASE: u32 = 60_000;
/// The window these tests run with.
pub(super) const WINDOW_MS: u64 = 20;

pub(super) fn config(window_ms: u32) -> Config {
    Config {
        timing: Timing {
            contention_window_ms: window_ms,
            ..Timing::DEFAULT
        },
        ..small()
    }
}

pub(super) fn cmd(op: LockOp, id: LockId, flags: LockFlags) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Rw,
        op,
        lock: id.raw(),
        expire_ms: LEASE,
        flags,
        ..LockCommand::NONE
    })
}

const EX: LockOp = LockOp::TryExclusive;
const SH: LockOp = LockOp::TryShared;
const UNLOCK: LockOp = LockOp::UnlockExclusive;
const CACHE: LockFlags = LockFlags::CACHEABLE;
const PLAIN: LockFlags = LockFlags::NONE;

/// What client `c` holds on `id`.
pub(super) fn hold(s: &TestServer, c: ClientId, id: LockId) -> GrantState {
    s.recorded_hold(s.client_slot_of(c.get()).unwrap(), id.index())
}

/// Every event waiting in client `c`'s ring.
pub(super) fn events(s: &TestServer, c: ClientId) -> Vec<Event> {
    s.check_invariants().unwrap();
    let ring = s.event_ring(s.client_slot_of(c.get()).unwrap()).unwrap();
    core::iter::from_fn(|| ring.pop()).collect()
}

/// `cmd`, a lock command, made to wait up to `wait_ms` for its grant.
pub(super) fn waiting(cmd: Command, wait_ms: u32) -> Command {
    match cmd {
        Command::Lock(c) => Command::Lock(LockCommand { wait_ms, ..c }),
        _ => unreachable!(),
    }
}

/// A server, two clients `a` and `b` of it, and `a`'s and `b`'s handles of one RW lock.
type TwoClients = (TestServer, ClientId, ClientId, LockId, LockId);

/// A server with contention window `window_ms`, two clients registered on it at protocol
/// `version`, and each one's handle of the RW lock `name`.
fn two_clients(window_ms: u32, version: u8, name: &[u8]) -> TwoClients {
    let mut s = TestServer::new(&config(window_ms));
    let a = s.client_init(version, 0, 0).unwrap();
    let b = s.client_init(version, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, name, 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, name, 0).unwrap();
    (s, a, b, la, lb)
}

/// Two clients of one RW lock, and the lock made contended at tick 10: a caches it, b's
/// conflicting trylock revokes it (at 10), a gives it back (at 11).
fn contended_at_10(window_ms: u32) -> TwoClients {
    contended_at_10_with(window_ms, 2)
}

/// [`contended_at_10`] with both clients registered at protocol `version`.
fn contended_at_10_with(window_ms: u32, version: u8) -> TwoClients {
    let (mut s, a, b, la, lb) = two_clients(window_ms, version, b"row-group");
    assert_eq!(s.run(a, cmd(EX, la, CACHE), 1).status, Status::Success);
    assert_eq!(hold(&s, a, la), GrantState::ExclusiveCached);
    assert_eq!(s.run(b, cmd(EX, lb, CACHE), 10).status, Status::Fail);
    assert_eq!(events(&s, a).len(), 1, "the conflict's revoke");
    assert_eq!(s.run(a, cmd(UNLOCK, la, PLAIN), 11).status, Status::Success);
    assert_eq!(s.stats().get(Counter::RevokesSent), 1);
    (s, a, b, la, lb)
}

/// Two clients at protocol `version` of one RW lock: a caches it (at 1), b's caching request,
/// parked at 10, revokes that grant, which makes the lock contended, and a's give-back (at 11)
/// grants it. The server, b, b's handle, and the replies to b's wait.
fn parked_on_a_revoke(version: u8) -> (TestServer, ClientId, LockId, Vec<WaitReply>) {
    let (mut s, a, b, la, lb) = two_clients(WINDOW_MS as u32, version, b"row-group");
    assert_eq!(s.run(a, cmd(EX, la, CACHE), 1).status, Status::Success);
    let wait = waiting(cmd(EX, lb, CACHE), 5_000);
    assert_eq!(s.wait_for(b, wait, 10), None);
    assert_eq!(events(&s, a).len(), 1, "the conflict's revoke");
    assert_eq!(s.run(a, cmd(UNLOCK, la, PLAIN), 11).status, Status::Success);
    let got = s.replies();
    (s, b, lb, got)
}

#[test]
fn a_cacheable_request_on_a_lock_revoked_within_the_window_is_granted_plain_and_told_at_once() {
    for mode in [EX, SH] {
        let (mut s, a, b, la, lb) = contended_at_10(WINDOW_MS as u32);
        let _ = s.take_events_pending();
        let got = s.run(b, cmd(mode, lb, CACHE), 12);
        assert_eq!(got.status, Status::Success, "{mode:?}");
        let plain = match mode {
            EX => GrantState::Exclusive,
            _ => GrantState::Shared,
        };
        assert_eq!(hold(&s, b, lb), plain, "recorded plain: {mode:?}");
        // The notice wants exclusive, so a shared holder gives back too, and names the
        // grant's own token, so the client keeps it even ahead of the grant's reply.
        let notice = Event::Revoke {
            lock: lb,
            wanted: Mode::Exclusive,
            fence: got.aux,
        };
        assert!(s.take_events_pending(), "{mode:?}");
        assert_eq!(events(&s, b), vec![notice], "{mode:?}");
        assert_eq!(events(&s, a), vec![], "{mode:?}");
        // A plain holder is not revoked: a conflict waits for its unlock, and sends nothing.
        assert_eq!(s.run(a, cmd(EX, la, CACHE), 13).status, Status::Fail);
        assert_eq!(events(&s, b), vec![], "{mode:?}");
        assert_eq!(s.stats().get(Counter::RevokesSent), 1, "{mode:?}");
        // The holder's give-back is an ordinary unlock.
        let unlock = match mode {
            EX => UNLOCK,
            _ => LockOp::UnlockShared,
        };
        assert_eq!(s.run(b, cmd(unlock, lb, PLAIN), 14).status, Status::Success);
        assert_eq!(s.stats().get(Counter::RevokesGivenBack), 1, "a's only");
    }
}

#[test]
fn after_the_window_a_cacheable_request_is_cached_again() {
    let (mut s, _, b, _, lb) = contended_at_10(WINDOW_MS as u32);
    assert_eq!(
        s.run(b, cmd(EX, lb, CACHE), 10 + WINDOW_MS).status,
        Status::Success
    );
    assert_eq!(hold(&s, b, lb), GrantState::ExclusiveCached);
    assert_eq!(events(&s, b), vec![]);
}

#[test]
fn the_notice_of_a_contended_grant_does_not_extend_the_window() {
    let (mut s, a, b, la, lb) = contended_at_10(WINDOW_MS as u32);
    // Contended grants and their unlocks until the last tick of the window...
    for now in [12, 10 + WINDOW_MS - 1] {
        assert_eq!(s.run(b, cmd(EX, lb, CACHE), now).status, Status::Success);
        assert_eq!(hold(&s, b, lb), GrantState::Exclusive, "{now}");
        assert_eq!(
            s.run(b, cmd(UNLOCK, lb, PLAIN), now).status,
            Status::Success
        );
    }
    // ...then the window counted from the conflict is over: cached again.
    assert_eq!(
        s.run(a, cmd(EX, la, CACHE), 10 + WINDOW_MS).status,
        Status::Success
    );
    assert_eq!(hold(&s, a, la), GrantState::ExclusiveCached);
}

#[test]
fn a_parked_request_granted_on_a_contended_lock_is_granted_plain_and_told() {
    // b waits, caching: its request revokes a's grant, which makes the lock contended.
    let (s, b, lb, got) = parked_on_a_revoke(2);
    assert_eq!((got.len(), got[0].result.status), (1, Status::Success));
    assert_eq!(hold(&s, b, lb), GrantState::Exclusive, "plain");
    let notice = Event::Revoke {
        lock: lb,
        wanted: Mode::Exclusive,
        fence: got[0].result.aux,
    };
    assert_eq!(events(&s, b), vec![notice]);
}

#[test]
fn a_window_of_zero_keeps_every_cacheable_grant_cached() {
    let (mut s, _, b, _, lb) = contended_at_10(0);
    // The revoke at 10 left the cell untouched: with the rule off nothing stamps it.
    assert_eq!(manager_cell(&s, lb).contended_ms, 0);
    assert_eq!(s.run(b, cmd(EX, lb, CACHE), 12).status, Status::Success);
    assert_eq!(hold(&s, b, lb), GrantState::ExclusiveCached);
    assert_eq!(events(&s, b), vec![]);
}

#[test]
fn a_request_that_does_not_ask_for_caching_gets_no_notice() {
    let (mut s, _, b, _, lb) = contended_at_10(WINDOW_MS as u32);
    assert_eq!(s.run(b, cmd(EX, lb, PLAIN), 12).status, Status::Success);
    assert_eq!(hold(&s, b, lb), GrantState::Exclusive);
    assert_eq!(events(&s, b), vec![]);
}

#[test]
fn a_conflict_wakes_a_plain_holder_of_a_contended_lock_parked_elsewhere_if_it_asked() {
    for flagged in [true, false] {
        let (mut s, a, b, la, lb) = contended_at_10(WINDOW_MS as u32);
        // b is granted x plain with a notice, then parks on y (c's) before reading it.
        assert_eq!(s.run(b, cmd(EX, lb, CACHE), 12).status, Status::Success);
        assert_eq!(events(&s, b).len(), 1, "the notice");
        let c = s.client(0);
        let yc = s.get_lock(c.get(), LockKind::Rw, b"other", 0).unwrap();
        let yb = s.get_lock(b.get(), LockKind::Rw, b"other", 0).unwrap();
        assert_eq!(s.run(c, cmd(EX, yc, PLAIN), 12).status, Status::Success);
        let wake = match flagged {
            true => LockFlags::WAKE_ON_REVOKE,
            false => PLAIN,
        };
        let park = |id, flags| waiting(cmd(EX, id, flags), 50_000);
        assert_eq!(s.wait_for(b, park(yb, wake), 13), None);
        // a wants x: no revoke goes to b (its grant is plain), but its wait ends if it asked.
        assert_eq!(s.wait_for(a, park(la, CACHE), 14), None);
        assert_eq!(events(&s, b), vec![], "{flagged}");
        s.poll_waiters(14);
        let got = s.replies();
        if !flagged {
            assert_eq!(got, vec![], "a plain wait is not cut short");
            continue;
        }
        assert_eq!(
            (got.len(), got[0].client, got[0].result.status),
            (1, b.get(), Status::Etimeout)
        );
        // Back from its wait with the notice read, b gives x back, and a is granted.
        assert_eq!(s.run(b, cmd(UNLOCK, lb, PLAIN), 15).status, Status::Success);
        let got = s.replies();
        assert_eq!(
            (got.len(), got[0].client, got[0].result.status),
            (1, a.get(), Status::Success)
        );
        s.check_invariants().unwrap();
    }
}

#[test]
fn a_protocol_8_client_reads_its_plain_grant_in_the_result_and_is_sent_no_notice() {
    for mode in [EX, SH] {
        let (mut s, a, b, la, lb) =
            contended_at_10_with(WINDOW_MS as u32, PROTO_VERSION_PLAIN_GRANTS);
        let _ = s.take_events_pending();
        let got = s.run(b, cmd(mode, lb, CACHE), 12);
        assert_eq!((got.status, got.plain), (Status::Success, true), "{mode:?}");
        assert!(hold(&s, b, lb).grant_mode().is_some() && !hold(&s, b, lb).is_cached());
        assert!(!s.take_events_pending(), "no notice: {mode:?}");
        assert_eq!(events(&s, b), vec![], "{mode:?}");
        // Only a grant is marked: the conflict it now meets is a plain refusal.
        let refused = s.run(a, cmd(EX, la, CACHE), 13);
        assert_eq!((refused.status, refused.plain), (Status::Fail, false));
        // A request that did not ask for caching is plain anyway, and not marked.
        let unlock = match mode {
            EX => UNLOCK,
            _ => LockOp::UnlockShared,
        };
        assert_eq!(s.run(b, cmd(unlock, lb, PLAIN), 14).status, Status::Success);
        let got = s.run(b, cmd(mode, lb, PLAIN), 15);
        assert_eq!((got.status, got.plain), (Status::Success, false));
    }
}

#[test]
fn an_older_client_is_sent_the_notice_and_its_result_is_not_marked() {
    let (mut s, _, b, _, lb) =
        contended_at_10_with(WINDOW_MS as u32, PROTO_VERSION_PLAIN_GRANTS - 1);
    let got = s.run(b, cmd(EX, lb, CACHE), 12);
    assert_eq!((got.status, got.plain), (Status::Success, false));
    let notice = Event::Revoke {
        lock: lb,
        wanted: Mode::Exclusive,
        fence: got.aux,
    };
    assert_eq!(events(&s, b), vec![notice]);
}

#[test]
fn a_cached_grant_is_not_marked_plain() {
    let (mut s, _, b, _, lb) = contended_at_10_with(WINDOW_MS as u32, PROTO_VERSION_PLAIN_GRANTS);
    let got = s.run(b, cmd(EX, lb, CACHE), 10 + WINDOW_MS);
    assert_eq!((got.status, got.plain), (Status::Success, false));
    assert_eq!(hold(&s, b, lb), GrantState::ExclusiveCached);
}

#[test]
fn a_parked_request_of_protocol_8_granted_plain_says_so_in_its_late_reply() {
    for version in [PROTO_VERSION_PLAIN_GRANTS - 1, PROTO_VERSION_PLAIN_GRANTS] {
        let (s, b, _, got) = parked_on_a_revoke(version);
        assert_eq!(got.len(), 1);
        let marked = version >= PROTO_VERSION_PLAIN_GRANTS;
        assert_eq!(got[0].result.plain, marked, "{version}");
        assert_eq!(events(&s, b).len(), usize::from(!marked), "{version}");
        // The late reply's bytes carry the mark, and the header's flags do not.
        let mut out = [0u8; 256];
        let n = got[0].encode(&mut out).unwrap();
        let decoded = decode_data_response(&out[..n]).unwrap();
        assert_eq!(decoded.result(0).result.plain, marked, "{version}");
        assert_eq!(decoded.result(0).op, EX as u8);
        assert_eq!(decoded.header().flags, 0);
    }
}

#[test]
fn an_all_or_nothing_unit_undone_marks_no_grant_plain() {
    let (mut s, a, b, _, lb) = contended_at_10_with(WINDOW_MS as u32, PROTO_VERSION_PLAIN_GRANTS);
    // a holds another lock b's unit also wants: the unit fails and is undone.
    let other_a = s.get_lock(a.get(), LockKind::Rw, b"other", 0).unwrap();
    let other_b = s.get_lock(b.get(), LockKind::Rw, b"other", 0).unwrap();
    assert_eq!(
        s.run(a, cmd(EX, other_a, PLAIN), 12).status,
        Status::Success
    );
    let got = s.run_all(
        b,
        crate::proto::FLAG_ALL_OR_NOTHING,
        &[cmd(EX, lb, CACHE), cmd(EX, other_b, CACHE)],
        13,
    );
    assert!(
        got.iter().all(|r| r.status != Status::Success && !r.plain),
        "{got:?}"
    );
    // Alone, it is granted plain and marked.
    let got = s.run_all(
        b,
        crate::proto::FLAG_ALL_OR_NOTHING,
        &[cmd(EX, lb, CACHE)],
        14,
    );
    assert_eq!((got[0].status, got[0].plain), (Status::Success, true));
    assert_eq!(events(&s, b), vec![]);
}

#[test]
fn a_plain_holder_of_protocol_8_parked_elsewhere_is_not_woken_by_a_conflict() {
    let (mut s, a, b, la, lb) = contended_at_10_with(WINDOW_MS as u32, PROTO_VERSION_PLAIN_GRANTS);
    let got = s.run(b, cmd(EX, lb, CACHE), 12);
    assert_eq!(
        (got.status, got.plain),
        (Status::Success, true),
        "told in the result"
    );
    let c = s.client(0);
    let yc = s.get_lock(c.get(), LockKind::Rw, b"other", 0).unwrap();
    let yb = s.get_lock(b.get(), LockKind::Rw, b"other", 0).unwrap();
    assert_eq!(s.run(c, cmd(EX, yc, PLAIN), 12).status, Status::Success);
    let park = |id, flags| waiting(cmd(EX, id, flags), 50_000);
    assert_eq!(s.wait_for(b, park(yb, LockFlags::WAKE_ON_REVOKE), 13), None);
    // a wants x: b has nothing to read, so its wait goes on.
    assert_eq!(s.wait_for(a, park(la, CACHE), 14), None);
    s.poll_waiters(14);
    assert_eq!(s.replies(), vec![], "nobody's wait is cut");
    assert_eq!(s.stats().get(Counter::WaitTimeouts), 0);
}

/// Lock `id`'s manager cell.
fn manager_cell(s: &TestServer, id: LockId) -> crate::table::LockManagerCell {
    s.t.lock_manager[id.index() as usize]
}

#[test]
fn a_conflict_between_plain_holders_makes_the_lock_contended() {
    for window in [WINDOW_MS as u32, 0] {
        let (mut s, p, q, lp, lq) = two_clients(window, 2, b"fought");
        assert_eq!(s.run(p, cmd(EX, lp, PLAIN), 100).status, Status::Success);
        // q is refused for p's plain grant: a conflict, with no revoke.
        assert_eq!(s.run(q, cmd(SH, lq, PLAIN), 101).status, Status::Fail);
        assert_eq!(s.stats().get(Counter::RevokesSent), 0);
        assert_eq!(
            s.run(p, cmd(UNLOCK, lp, PLAIN), 102).status,
            Status::Success
        );
        // Asked for caching right after: plain while the window runs, cached with the rule off.
        assert_eq!(s.run(q, cmd(EX, lq, CACHE), 103).status, Status::Success);
        let (stamped, held) = match window {
            0 => (0, GrantState::ExclusiveCached),
            _ => (101, GrantState::Exclusive),
        };
        assert_eq!(manager_cell(&s, lq).contended_ms, stamped, "{window}");
        assert_eq!(hold(&s, q, lq), held, "{window}");
    }
}

#[test]
fn a_parked_request_stamps_the_conflict_too() {
    let (mut s, p, q, lp, lq) = two_clients(WINDOW_MS as u32, 2, b"fought");
    assert_eq!(s.run(p, cmd(EX, lp, PLAIN), 100).status, Status::Success);
    assert_eq!(s.wait_for(q, waiting(cmd(EX, lq, PLAIN), 5_000), 105), None);
    assert_eq!(manager_cell(&s, lq).contended_ms, 105);
}

#[test]
fn a_fight_that_goes_on_keeps_the_lock_plain_past_the_first_window() {
    let (mut s, a, b, la, lb) = contended_at_10(WINDOW_MS as u32);
    assert_eq!(s.run(b, cmd(EX, lb, CACHE), 12).status, Status::Success);
    assert_eq!(
        hold(&s, b, lb),
        GrantState::Exclusive,
        "contended by the revoke at 10"
    );
    // a's conflict with b's plain grant at 25 goes on fighting: no revoke, a new stamp.
    assert_eq!(s.run(a, cmd(EX, la, CACHE), 25).status, Status::Fail);
    assert_eq!(s.run(b, cmd(UNLOCK, lb, PLAIN), 26).status, Status::Success);
    // One window after the revoke, the fight at 25 keeps it plain...
    assert_eq!(
        s.run(a, cmd(EX, la, CACHE), 10 + WINDOW_MS).status,
        Status::Success
    );
    assert_eq!(hold(&s, a, la), GrantState::Exclusive, "still fought over");
    assert_eq!(s.run(a, cmd(UNLOCK, la, PLAIN), 31).status, Status::Success);
    // ...and one window after the last conflict it is cached again.
    assert_eq!(
        s.run(a, cmd(EX, la, CACHE), 25 + WINDOW_MS).status,
        Status::Success
    );
    assert_eq!(hold(&s, a, la), GrantState::ExclusiveCached);
    assert_eq!(
        s.stats().get(Counter::RevokesSent),
        1,
        "only the first conflict's"
    );
}

#[test]
fn later_conflicts_do_not_push_back_an_outstanding_revokes_lapse() {
    let (mut s, a, b, la, lb) = two_clients(WINDOW_MS as u32, 2, b"row-group");
    assert_eq!(s.run(a, cmd(EX, la, CACHE), 1).status, Status::Success);
    assert_eq!(s.run(b, cmd(EX, lb, PLAIN), 10).status, Status::Fail);
    assert_eq!(s.run(b, cmd(EX, lb, PLAIN), 15).status, Status::Fail);
    let m = manager_cell(&s, lb);
    assert_eq!((m.revoke_sent_ms, m.contended_ms), (10, 15));
    assert_eq!(
        s.stats().get(Counter::RevokesSent),
        1,
        "one outstanding per holder"
    );
}

#[test]
fn a_conflict_in_the_servers_first_millisecond_still_makes_the_lock_contended() {
    // The server's clock starts at 0, which the cell reads as "no conflict".
    for revoked in [false, true] {
        let (mut s, p, q, lp, lq) = two_clients(WINDOW_MS as u32, 2, b"early");
        let flags = if revoked { CACHE } else { PLAIN };
        assert_eq!(s.run(p, cmd(EX, lp, flags), 0).status, Status::Success);
        assert_eq!(s.run(q, cmd(EX, lq, PLAIN), 0).status, Status::Fail);
        assert_eq!(manager_cell(&s, lq).contended_ms, 1, "{revoked}");
        assert_eq!(s.run(p, cmd(UNLOCK, lp, PLAIN), 0).status, Status::Success);
        assert_eq!(s.run(q, cmd(EX, lq, CACHE), 0).status, Status::Success);
        assert_eq!(hold(&s, q, lq), GrantState::Exclusive, "{revoked}: plain");
    }
}

#[test]
fn every_grant_made_plain_is_counted_whatever_the_clients_protocol() {
    for version in [PROTO_VERSION_PLAIN_GRANTS - 1, PROTO_VERSION_PLAIN_GRANTS] {
        let (mut s, _, b, _, lb) = contended_at_10_with(WINDOW_MS as u32, version);
        assert_eq!(s.stats().get(Counter::ContendedGrants), 0, "{version}");
        // A plain request is no contended grant; a cacheable one is, each time.
        assert_eq!(s.run(b, cmd(SH, lb, PLAIN), 12).status, Status::Success);
        assert_eq!(
            s.run(b, cmd(LockOp::UnlockShared, lb, PLAIN), 12).status,
            Status::Success
        );
        for now in [13, 14] {
            assert_eq!(s.run(b, cmd(EX, lb, CACHE), now).status, Status::Success);
            assert_eq!(
                s.run(b, cmd(UNLOCK, lb, PLAIN), now).status,
                Status::Success
            );
        }
        assert_eq!(s.stats().get(Counter::ContendedGrants), 2, "{version}");
        // Cached once the window is over: not counted.
        assert_eq!(
            s.run(b, cmd(EX, lb, CACHE), 10 + WINDOW_MS).status,
            Status::Success
        );
        assert_eq!(s.stats().get(Counter::ContendedGrants), 2, "{version}");
    }
}
