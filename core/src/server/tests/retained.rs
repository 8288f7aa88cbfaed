//! Retained locks: a dead client's grants flagged `RETAIN` stay held by it, blocking others
//! with `LockRetained`, until a recoverer's `recovery_done` (`server/retained.rs`).

use super::*;
use crate::Mode;
use crate::manager::GrantState;
use crate::manager::retain::Role;
use crate::server::retained::Retained;

/// A lock command flagged `RETAIN` (and `wait_ms` to wait on the server).
fn retain(kind: LockKind, op: LockOp, id: LockId, wait_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms: 200,
        wait_ms,
        flags: crate::proto::LockFlags::RETAIN,
        ..LockCommand::NONE
    })
}

/// `a` takes `name` of `kind` exclusively with `RETAIN` at tick 0 (and `plain` without it),
/// then dies by its lease while `b` keeps its own alive; returns `(a, b, b's id of name)`.
fn dead_holder(s: &mut TestServer, kind: LockKind) -> (ClientId, ClientId, LockId, LockId) {
    let (a, b) = (s.client(0), s.client(0));
    let la = s.get_lock(a.get(), kind, b"page", 0).unwrap();
    let lb = s.get_lock(b.get(), kind, b"page", 0).unwrap();
    let pa = s.get_lock(a.get(), kind, b"plain", 0).unwrap();
    let pb = s.get_lock(b.get(), kind, b"plain", 0).unwrap();
    let op = LockOp::TryExclusive;
    assert_eq!(s.run(a, retain(kind, op, la, 0), 0).status, Status::Success);
    assert_eq!(s.run(a, lock(kind, op, pa, 200), 0).status, Status::Success);
    // b stays alive; a's lease (1 s) runs out.
    let _ = s.heartbeat(b.get(), 1_400);
    assert_eq!(s.tick(1_500), 1, "a died");
    assert_eq!(s.retaining_clients(), 1);
    (a, b, lb, pb)
}

#[test]
fn a_dead_holders_retained_grant_blocks_others_until_recovery_done() {
    for kind in [LockKind::Atomic, LockKind::Rw, LockKind::Fair] {
        let mut s = TestServer::new(&small());
        let (a, b, lb, pb) = dead_holder(&mut s, kind);
        let at = format!("{kind:?}");
        // The plain grant went with its holder; the retained one stays, also past its lease.
        let ex = LockOp::TryExclusive;
        assert_eq!(
            s.run(b, lock(kind, ex, pb, 100), 1_600).status,
            Status::Success,
            "{at}"
        );
        assert_eq!(
            s.run(b, lock(kind, ex, lb, 100), 1_600).status,
            Status::LockRetained,
            "{at}"
        );
        if kind != LockKind::Atomic {
            let sh = LockOp::TryShared;
            assert_eq!(
                s.run(b, lock(kind, sh, lb, 100), 1_600).status,
                Status::LockRetained
            );
        }
        assert_eq!(
            s.stats().get(Counter::LockRetained),
            1 + u64::from(kind != LockKind::Atomic)
        );
        // Only a recoverer, and only for a retaining client.
        assert_eq!(
            s.recovery_done(Role::Client, a.get(), 1_700),
            Err(Status::Einval)
        );
        assert_eq!(s.stats().get(Counter::RecoveryDoneRefused), 1);
        assert_eq!(
            s.recovery_done(Role::Recoverer, 12_345, 1_700),
            Err(Status::ClientNotInit)
        );
        assert_eq!(
            s.recovery_done(Role::Recoverer, b.get(), 1_700),
            Err(Status::Einval)
        );
        assert_eq!(
            s.recovery_done(Role::Recoverer, a.get(), 1_700),
            Ok(1),
            "{at}"
        );
        assert_eq!(s.retaining_clients(), 0);
        assert_eq!(
            s.recovery_done(Role::Recoverer, a.get(), 1_700),
            Err(Status::ClientNotInit)
        );
        assert_eq!(
            s.run(b, lock(kind, ex, lb, 100), 1_800).status,
            Status::Success,
            "{at}"
        );
        assert_eq!(s.stats().get(Counter::LocksRetained), 1);
        assert_eq!(s.stats().get(Counter::RetainedReleased), 1);
    }
}

#[test]
fn a_graceful_deinit_releases_what_a_death_would_retain() {
    let mut s = TestServer::new(&small());
    let (a, b) = (s.client(0), s.client(0));
    let la = s.get_lock(a.get(), LockKind::Rw, b"page", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"page", 0).unwrap();
    let ex = LockOp::TryExclusive;
    assert_eq!(
        s.run(a, retain(LockKind::Rw, ex, la, 0), 0).status,
        Status::Success
    );
    s.client_deinit(a.get(), 1).unwrap();
    assert_eq!(s.retaining_clients(), 0);
    assert_eq!(
        s.run(b, lock(LockKind::Rw, ex, lb, 0), 2).status,
        Status::Success
    );
}

#[test]
fn readers_share_an_rw_lock_with_a_retained_reader_but_a_writer_does_not() {
    let mut s = TestServer::new(&small());
    let (a, b) = (s.client(0), s.client(0));
    let la = s.get_lock(a.get(), LockKind::Rw, b"page", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"page", 0).unwrap();
    let rw = LockKind::Rw;
    assert_eq!(
        s.run(a, retain(rw, LockOp::TryShared, la, 0), 0).status,
        Status::Success
    );
    let _ = s.heartbeat(b.get(), 1_400);
    assert_eq!(s.tick(1_500), 1);
    assert_eq!(
        s.run(b, lock(rw, LockOp::TryShared, lb, 0), 1_600).status,
        Status::Success
    );
    assert_eq!(
        s.run(b, lock(rw, LockOp::UnlockShared, lb, 0), 1_600)
            .status,
        Status::Success
    );
    let ex = s.run(b, lock(rw, LockOp::TryExclusive, lb, 0), 1_600);
    assert_eq!(ex.status, Status::LockRetained);
}

#[test]
fn a_waiting_request_is_granted_at_recovery_done_or_told_retained_at_its_deadline() {
    let mut s = TestServer::new(&small());
    let (a, b, lb, _) = dead_holder(&mut s, LockKind::Rw);
    let c = s.client(1_500);
    let lc = s.get_lock(c.get(), LockKind::Rw, b"page", 1_500).unwrap();
    let rw = LockKind::Rw;
    let waits = |id, wait_ms| {
        Command::Lock(LockCommand {
            wait_ms,
            ..match lock(rw, LockOp::TryExclusive, id, 0) {
                Command::Lock(l) => l,
                _ => unreachable!(),
            }
        })
    };
    assert_eq!(s.wait_for(b, waits(lb, 100), 1_600), None, "parked");
    s.poll_waiters(1_701);
    let told = s.replies();
    assert_eq!(told.len(), 1);
    assert_eq!(
        told[0].result.status,
        Status::LockRetained,
        "not a bare timeout"
    );
    assert_eq!(s.wait_for(c, waits(lc, 5_000), 1_800), None, "parked");
    assert_eq!(s.recovery_done(Role::Recoverer, a.get(), 1_900), Ok(1));
    let granted = s.replies();
    assert_eq!(granted.len(), 1);
    assert_eq!(
        (granted[0].client, granted[0].result.status),
        (c.get(), Status::Success)
    );
}

#[test]
fn a_dead_client_cannot_speak_or_come_back_and_its_slot_is_kept() {
    let mut s = TestServer::new(&small());
    let (a, b, _, _) = dead_holder(&mut s, LockKind::Atomic);
    let session = s.session(a.get());
    assert_eq!(session, Session::NONE, "out of the client index");
    assert_eq!(
        s.client_reinit(a.get(), 2, 0, &session, 1_600),
        Err(Status::ClientRemovedByServer)
    );
    assert_eq!(s.heartbeat(a.get(), 1_600), Err(Status::ClientNotInit));
    // A later tick does not touch it; the table keeps its slot.
    assert_eq!(s.tick(10_000_000), 1, "only b, silent since");
    assert_eq!(s.retaining_clients(), 1);
    let _ = b;
}

#[test]
fn retained_grants_are_listed_by_dead_client_a_page_at_a_time() {
    let mut s = TestServer::new(&small());
    let (a, b) = (s.client(0), s.client(0));
    let rw = LockKind::Rw;
    let mut ids = Vec::new();
    for name in [&b"p1"[..], b"p2", b"p3"] {
        let id = s.get_lock(a.get(), rw, name, 0).unwrap();
        assert_eq!(
            s.run(a, retain(rw, LockOp::TryExclusive, id, 0), 0).status,
            Status::Success
        );
        ids.push(id);
    }
    let _ = s.heartbeat(b.get(), 1_400);
    assert_eq!(s.tick(1_500), 1);
    let blank = Retained {
        client: 0,
        lock: ids[0],
        kind: rw,
        mode: Mode::Shared,
    };
    let mut page = [blank; 2];
    assert_eq!(
        s.retained(Role::Client, 0, 0, &mut page),
        Err(Status::Einval)
    );
    let (n, next) = s.retained(Role::Recoverer, 0, 0, &mut page).unwrap();
    assert_ne!(next, 0, "more to come");
    let mut listed = page[..n].to_vec();
    let (m, last) = s
        .retained(Role::Recoverer, a.get(), next, &mut page)
        .unwrap();
    assert_eq!((n, m, last), (2, 1, 0));
    listed.extend_from_slice(&page[..m]);
    for r in &listed {
        assert_eq!((r.client, r.kind, r.mode), (a.get(), rw, Mode::Exclusive));
        assert_eq!(s.lock_name(r.lock).map(<[u8]>::len), Some(2));
    }
    assert_eq!(listed.iter().map(|r| r.lock).collect::<Vec<_>>(), ids);
    assert_eq!(
        s.retained(Role::Recoverer, b.get(), 0, &mut page),
        Ok((0, 0)),
        "b is alive"
    );
}

/// The control frames: `RecoveryDone` and `ListRetained` are served to the role the transport
/// gives the sender, never by the frame's own say.
#[test]
fn recovery_frames_serve_only_a_recoverer() {
    use crate::proto::{
        ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse, ListRetained,
        decode_control_response, encode_control_request,
    };
    let mut s = TestServer::new(&small());
    let (a, b, _, _) = dead_holder(&mut s, LockKind::Rw);
    let frame = |s: &mut TestServer, role, body: ControlRequest<'_>| {
        let header = ControlHeader {
            version: crate::proto::PROTO_VERSION,
            msg: body.msg_type(),
            message_id: 4,
            word: b.get(),
        };
        let mut req = vec![0u8; crate::proto::CONTROL_FRAME_MAX];
        let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req).unwrap();
        let mut out = vec![0u8; crate::proto::CONTROL_FRAME_MAX];
        let m = s.handle_control_as((crate::Peer::EXEMPT, role), &req[..n], &mut out, 1_600);
        let reply = decode_control_response(&out[..m.unwrap()]).unwrap();
        let status = reply.header.status().unwrap();
        let listed: Vec<(u32, Vec<u8>)> = match reply.body {
            ControlResponse::Retained(page) => page
                .entries
                .iter()
                .map(|e| (e.client, e.name.to_vec()))
                .collect(),
            _ => Vec::new(),
        };
        let released = match reply.body {
            ControlResponse::Released { locks } => Some(locks),
            _ => None,
        };
        (status, listed, released)
    };
    let list = ControlRequest::ListRetained(ListRetained {
        client: 0,
        cursor: 0,
    });
    let done = ControlRequest::RecoveryDone { dead: a.get() };
    assert_eq!(frame(&mut s, Role::Client, list).0, Status::Einval);
    assert_eq!(frame(&mut s, Role::Client, done).0, Status::Einval);
    assert_eq!(s.stats().get(Counter::RecoveryDoneRefused), 2);
    let (status, listed, _) = frame(&mut s, Role::Recoverer, list);
    assert_eq!(
        (status, listed),
        (Status::Success, vec![(a.get(), b"page".to_vec())])
    );
    let (status, _, released) = frame(&mut s, Role::Recoverer, done);
    assert_eq!((status, released), (Status::Success, Some(1)));
    let (status, listed, _) = frame(&mut s, Role::Recoverer, list);
    assert_eq!((status, listed), (Status::Success, vec![]));
}

#[test]
fn a_dead_clients_grant_it_did_not_ask_to_retain_breaks_the_invariants() {
    let mut s = TestServer::new(&small());
    let (a, ..) = dead_holder(&mut s, LockKind::Rw);
    s.check_invariants()
        .expect("a retained grant is what a dead client may keep");
    // What a death that forgot to release a plain grant would leave.
    let slot = s.retaining_slot(a.get()).unwrap();
    let (lock, _) = s.t.lock_holds.next_in_row(slot, 0).unwrap();
    s.t.lock_holds.set(slot, lock, GrantState::Exclusive.bits());
    let v = s
        .check_invariants()
        .expect_err("a plain grant of a dead client");
    assert!(
        matches!(v, crate::server::invariants::Violation::Retained { client, .. } if client == slot),
        "{v}"
    );
}
