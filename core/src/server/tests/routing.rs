//! The per-slot routing state (`routing.rs`): one test per row of its module doc's table, and
//! control frames over a stream connection (`control_on_stream`).

use super::dispatch::{message, slots};
use super::*;
use crate::ids::Peer;
use crate::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, DATA_RESPONSE_MAX,
    PROTO_VERSION, encode_control_request,
};
use crate::server::{Binding, Dispatched, Registration, Route, Routing, Source, StreamControlled};
use crate::table::ClientState;

/// The bytes of control request `body` naming client `client`.
fn control(client: u32, body: ControlRequest<'_>) -> Vec<u8> {
    let frame = ControlRequestFrame {
        header: ControlHeader {
            version: PROTO_VERSION,
            msg: body.msg_type(),
            message_id: 1,
            word: client,
        },
        body,
    };
    let mut buf = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Registers a client over control connection `conn` through [`Server::control`].
fn register_over(s: &mut TestServer, routing: &mut Routing<'_>, conn: u64) -> Registration {
    let init = control(
        0,
        ControlRequest::ClientInit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
        },
    );
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let done = s
        .control(
            routing,
            (conn, Peer::EXEMPT, crate::manager::retain::Role::Client),
            &init,
            &mut out,
            0,
        )
        .unwrap();
    done.registered.expect("a registration")
}

/// `client` parks a waiting trylock on `x` (held by someone else) through its mailbox.
fn park(s: &mut TestServer, routing: &mut Routing<'_>, client: ClientId, x: LockId) {
    let slot = s.client_slot_of(client.get()).unwrap();
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let from = Source::Mailbox { slot, seq: 1 };
    let d = s.dispatch(routing, from, &message(client, 1, &[wait]), &mut out, 1);
    assert_eq!(d, Dispatched::Parked);
}

/// Whether `client` waits for a lock (its waiter slot is taken).
fn parked(s: &TestServer, client: ClientId) -> bool {
    let slot = s.client_slot_of(client.get()).unwrap();
    s.t.waiters[slot as usize].client == client.get()
}

/// Client `holder` holds atomic lock "x"; returns it.
fn held_x(s: &mut TestServer, holder: ClientId, others: &[ClientId]) -> LockId {
    let x = s.get_lock(holder.get(), LockKind::Atomic, b"x", 0).unwrap();
    for c in others {
        s.get_lock(c.get(), LockKind::Atomic, b"x", 0).unwrap();
    }
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 60_000);
    assert_eq!(s.run(holder, take, 0).status, Status::Success);
    x
}

#[test]
fn a_registration_routes_its_slot_afresh_and_reports_a_gone_predecessor() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let first = register_over(&mut s, &mut routing, 7);
    assert_eq!(first.displaced, None);
    let a = ClientId::new(first.client).unwrap();
    // a parks, then re-registers (the same id, with its session): the parked request goes.
    let holder = s.client(0);
    let x = held_x(&mut s, holder, &[a]);
    park(&mut s, &mut routing, a, x);
    assert!(parked(&s, a));
    let reinit = control(
        a.get(),
        ControlRequest::ClientReinit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
            session: s.session(a.get()),
        },
    );
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let again = s
        .control(
            &mut routing,
            (8, Peer::EXEMPT, crate::manager::retain::Role::Client),
            &reinit,
            &mut out,
            2,
        )
        .unwrap()
        .registered
        .unwrap();
    assert_eq!((again.client, again.displaced), (a.get(), None));
    assert!(!parked(&s, a));
    assert_eq!(routing.route(again.slot), Route::None);
    // a leaves; whoever is given its slot next displaces it, and a is registered nowhere.
    s.client_deinit(a.get(), 3).unwrap();
    let next = register_over(&mut s, &mut routing, 9);
    assert_eq!(next.slot, again.slot);
    assert_eq!(next.displaced, Some(a.get()));
    // A control frame that registers nobody reports nothing.
    let stats = control(0, ControlRequest::Stats);
    let done = s
        .control(
            &mut routing,
            (10, Peer::EXEMPT, crate::manager::retain::Role::Client),
            &stats,
            &mut out,
            4,
        )
        .unwrap();
    assert_eq!(done.registered, None);
}

#[test]
fn only_the_control_connection_that_registered_a_client_loses_it() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let r = register_over(&mut s, &mut routing, 7);
    let state = |s: &TestServer| s.t.clients[r.slot as usize].client_state();
    s.control_closed(&mut routing, r.client, 6, 1);
    assert_eq!(state(&s), ClientState::Active, "a stale connection");
    s.control_closed(&mut routing, r.client, 7, 1);
    assert_eq!(state(&s), ClientState::Abnormal);
    assert_eq!(s.stats().get(Counter::ClientsDeinit), 0);
}

#[test]
fn a_removed_client_is_forgotten_once_and_reported_if_registered_nowhere() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let r = register_over(&mut s, &mut routing, 7);
    let mut gone = Vec::new();
    assert!(
        !s.forget_gone_clients(&mut routing, |c| gone.push(c)),
        "nobody removed"
    );
    s.client_deinit(r.client, 1).unwrap();
    assert!(s.forget_gone_clients(&mut routing, |c| gone.push(c)));
    assert_eq!(gone, [r.client]);
    assert!(!s.forget_gone_clients(&mut routing, |c| gone.push(c)));
    assert_eq!(gone, [r.client], "reported once");
    // Forgotten there: losing its old connection now changes nothing.
    s.control_closed(&mut routing, r.client, 7, 2);
}

#[test]
fn a_client_registered_again_elsewhere_keeps_its_connections() {
    let cfg = Config {
        recovery_clients: 3,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    // A recovering server takes old ids back: 77 re-registers over connection 7, then misses
    // its lease, and its slot goes to 88 before 77 comes back.
    let reinit = control(
        77,
        ControlRequest::ClientReinit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
            session: crate::ids::Session::NONE,
        },
    );
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let first = s
        .control(
            &mut routing,
            (7, Peer::EXEMPT, crate::manager::retain::Role::Client),
            &reinit,
            &mut out,
            0,
        )
        .unwrap()
        .registered
        .unwrap();
    let lease = u64::from(s.config().client_lease_ms);
    assert_eq!(s.tick(lease + 1), 1);
    s.reinit(88, lease + 1).unwrap();
    assert_eq!(s.client_slot_of(88), Some(first.slot));
    s.reinit(77, lease + 1).unwrap();
    assert_ne!(s.client_slot_of(77), Some(first.slot));
    let mut gone = Vec::new();
    assert!(s.forget_gone_clients(&mut routing, |c| gone.push(c)));
    assert!(gone.is_empty(), "77 is registered, in another slot");
    // Its old slot forgot it: losing connection 7 no longer disconnects it.
    s.control_closed(&mut routing, 77, 7, lease + 2);
    let slot = s.client_slot_of(77).unwrap();
    assert_eq!(
        s.t.clients[slot as usize].client_state(),
        ClientState::Recovering
    );
}

#[test]
fn binding_a_client_elsewhere_gives_up_its_parked_request_and_reports_an_emptied_connection() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b, c) = (s.client(0), s.client(0), s.client(0));
    let slot = |s: &TestServer, c: ClientId| s.client_slot_of(c.get()).unwrap();
    let x = held_x(&mut s, c, &[a]);
    let (sa, sb) = (slot(&s, a), slot(&s, b));
    assert_eq!(s.bind_stream(&mut routing, (sa, a.get()), (3, 1), 0), None);
    assert_eq!(s.bind_stream(&mut routing, (sb, b.get()), (3, 1), 0), None);
    assert_eq!(routing.members(3), 2);
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let on_3 = Source::Stream {
        conn: 3,
        generation: 1,
    };
    let d = s.dispatch(&mut routing, on_3, &message(a, 1, &[wait]), &mut out, 1);
    assert_eq!(d, Dispatched::Parked);
    // a moves to connection 4: its request parked on 3 is given up; b is still on 3.
    assert_eq!(s.bind_stream(&mut routing, (sa, a.get()), (4, 1), 2), None);
    assert!(!parked(&s, a));
    assert_eq!(routing.route(sa), Route::None);
    // b moves too: 3 has nobody left.
    assert_eq!(
        s.bind_stream(&mut routing, (sb, b.get()), (4, 1), 2),
        Some(3)
    );
    assert_eq!((routing.members(3), routing.members(4)), (0, 2));
    // Binding again where it already is changes nothing.
    assert_eq!(s.bind_stream(&mut routing, (sb, b.get()), (4, 1), 2), None);
}

#[test]
fn a_closed_stream_gives_up_its_members_parked_requests_and_unbinds_them() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, c) = (s.client(0), s.client(0));
    let x = held_x(&mut s, c, &[a]);
    let sa = s.client_slot_of(a.get()).unwrap();
    let _ = s.bind_stream(&mut routing, (sa, a.get()), (3, 1), 0);
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let on_3 = Source::Stream {
        conn: 3,
        generation: 1,
    };
    let d = s.dispatch(&mut routing, on_3, &message(a, 1, &[wait]), &mut out, 1);
    assert_eq!(d, Dispatched::Parked);
    s.stream_closed(&mut routing, 3, 2);
    assert!(!parked(&s, a));
    assert!(!routing.binding(sa).is_bound());
    assert_eq!(routing.members(3), 0);
}

#[test]
fn the_sweep_unbinds_gone_members_and_reports_each_emptied_connection_once() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b, c) = (s.client(0), s.client(0), s.client(0));
    for (client, conn) in [(a, 3), (b, 3), (c, 4)] {
        let slot = s.client_slot_of(client.get()).unwrap();
        let _ = s.bind_stream(&mut routing, (slot, client.get()), (conn, 1), 0);
    }
    let mut emptied = Vec::new();
    s.sweep_streams(&mut routing, |conn| emptied.push(conn));
    assert!(emptied.is_empty(), "everyone is still registered");
    s.client_deinit(a.get(), 1).unwrap();
    s.sweep_streams(&mut routing, |conn| emptied.push(conn));
    assert!(emptied.is_empty(), "b is still on 3");
    assert_eq!(routing.members(3), 1);
    s.client_deinit(b.get(), 1).unwrap();
    s.sweep_streams(&mut routing, |conn| emptied.push(conn));
    assert_eq!(emptied, [3]);
    assert_eq!(routing.members(4), 1);
}

#[test]
fn a_lost_queue_pair_gives_up_only_a_request_parked_over_it() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, c) = (s.client(0), s.client(0));
    let x = held_x(&mut s, c, &[a]);
    let sa = s.client_slot_of(a.get()).unwrap();
    // Parked through the mailbox: losing a queue pair does not touch it.
    park(&mut s, &mut routing, a, x);
    s.queue_pair_lost(&mut routing, sa, a.get(), 2);
    assert!(parked(&s, a));
    assert_eq!(routing.route(sa), Route::Mailbox { seq: 1 });
    // Parked through the queue pair: it goes with it.
    s.cancel_parked(a.get(), 3);
    let pair = Source::QueuePair {
        slot: sa,
        client: a.get(),
    };
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let d = s.dispatch(&mut routing, pair, &message(a, 2, &[wait]), &mut out, 4);
    assert_eq!(d, Dispatched::Parked);
    s.queue_pair_lost(&mut routing, sa, a.get(), 5);
    assert!(!parked(&s, a));
    assert_eq!(routing.route(sa), Route::None);
}

#[test]
fn a_fresh_routing_routes_nothing_and_clear_forgets_everything() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    assert_eq!(routing.mailbox_seq(0), Some(0));
    assert_eq!(
        routing.mailbox_seq(s.config().clients_max),
        None,
        "no such slot"
    );
    let a = s.client(0);
    let sa = s.client_slot_of(a.get()).unwrap();
    routing.fence_mailbox(sa, 9);
    let _ = s.bind_stream(&mut routing, (sa, a.get()), (3, 1), 0);
    assert_eq!(routing.mailbox_seq(sa), Some(9));
    routing.clear();
    assert_eq!(routing.mailbox_seq(sa), Some(0));
    assert!(!routing.binding(sa).is_bound());
}

/// Control frame `req` over stream connection (`conn`, 1) from a local peer.
fn on_stream(
    s: &mut TestServer,
    routing: &mut Routing<'_>,
    conn: u32,
    req: &[u8],
    now: u64,
) -> (StreamControlled, Vec<u8>) {
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let done = s.control_on_stream(routing, (conn, 1), Peer::EXEMPT, req, &mut out, now);
    if let StreamControlled::Replied { len, .. } = done {
        out.truncate(len);
    }
    (done, out)
}

/// The status of control reply `out`.
fn status_of(out: &[u8]) -> Option<Status> {
    crate::proto::decode_control_response(out)
        .ok()
        .and_then(|r| r.header.status())
}

fn init() -> Vec<u8> {
    control(
        0,
        ControlRequest::ClientInit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
        },
    )
}

#[test]
fn a_registration_over_a_stream_binds_its_client_there_and_the_stream_carries_it() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (done, out) = on_stream(&mut s, &mut routing, 3, &init(), 0);
    let StreamControlled::Replied {
        registered: Some(r),
        vacated: None,
        ..
    } = done
    else {
        panic!("not a registration: {done:?}");
    };
    assert_eq!(status_of(&out), Some(Status::Success));
    assert_eq!(
        routing.binding(r.slot),
        Binding {
            conn: 3,
            generation: 1,
            client: r.client
        },
        "a member of the stream, as after a join"
    );
    let state = |s: &TestServer| s.t.clients[r.slot as usize].client_state();
    // A control connection closing with its id does not touch it: the stream carries it.
    s.control_closed(&mut routing, r.client, 3, 1);
    assert_eq!(state(&s), ClientState::Active);
    s.stream_closed(&mut routing, 4, 1);
    assert_eq!(state(&s), ClientState::Active, "another stream");
    s.stream_closed(&mut routing, 3, 1);
    assert_eq!(
        state(&s),
        ClientState::Abnormal,
        "its stream is its control path"
    );
    assert_eq!(routing.members(3), 0);
}

#[test]
fn on_a_stream_a_member_is_served_a_stranger_answered_and_anothers_client_refused() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (member, elsewhere) = (s.client(0), s.client(0));
    for (c, conn) in [(member, 3), (elsewhere, 4)] {
        let slot = s.client_slot_of(c.get()).unwrap();
        let _ = s.bind_stream(&mut routing, (slot, c.get()), (conn, 1), 0);
    }
    let get = |c: u32| {
        control(
            c,
            ControlRequest::GetLock {
                kind: LockKind::Atomic,
                name: b"x",
            },
        )
    };
    let (done, out) = on_stream(&mut s, &mut routing, 3, &get(member.get()), 1);
    assert!(matches!(
        done,
        StreamControlled::Replied {
            registered: None,
            ..
        }
    ));
    assert_eq!(status_of(&out), Some(Status::Success));
    let (done, out) = on_stream(&mut s, &mut routing, 3, &get(12_345), 1);
    assert!(matches!(done, StreamControlled::Replied { .. }));
    assert_eq!(status_of(&out), Some(Status::ClientNotInit), "nobody's id");
    let (done, _) = on_stream(&mut s, &mut routing, 3, &get(elsewhere.get()), 1);
    assert_eq!(done, StreamControlled::Refused, "bound to stream 4");
    // The counters need nobody.
    let (done, out) = on_stream(
        &mut s,
        &mut routing,
        3,
        &control(0, ControlRequest::Stats),
        1,
    );
    assert!(matches!(done, StreamControlled::Replied { .. }));
    assert_eq!(status_of(&out), Some(Status::Success));
    // Bytes that are no control request.
    let (done, _) = on_stream(&mut s, &mut routing, 3, &out, 1);
    assert_eq!(done, StreamControlled::Refused, "a response");
}

#[test]
fn a_reinit_over_a_stream_moves_the_client_and_its_control_path_there() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let r = register_over(&mut s, &mut routing, 7);
    let _ = s.bind_stream(&mut routing, (r.slot, r.client), (4, 1), 0);
    let reinit = control(
        r.client,
        ControlRequest::ClientReinit {
            min_version: PROTO_VERSION,
            lease_ms: 0,
            session: s.session(r.client),
        },
    );
    let (done, _) = on_stream(&mut s, &mut routing, 3, &reinit, 1);
    let StreamControlled::Replied {
        registered: Some(again),
        vacated,
        ..
    } = done
    else {
        panic!("not a registration: {done:?}");
    };
    assert_eq!(again.client, r.client);
    assert_eq!(vacated, Some(4), "it left stream 4, now empty");
    assert_eq!(routing.binding(r.slot).conn, 3);
    let state = |s: &TestServer| s.t.clients[r.slot as usize].client_state();
    s.control_closed(&mut routing, r.client, 7, 2);
    assert_eq!(
        state(&s),
        ClientState::Active,
        "connection 7 no longer carries it"
    );
    s.stream_closed(&mut routing, 3, 2);
    assert_eq!(state(&s), ClientState::Abnormal);
}

#[test]
fn check_routing_finds_a_parked_request_whose_reply_has_no_route() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (holder, a) = (s.client(0), s.client(0));
    let x = held_x(&mut s, holder, &[a]);
    park(&mut s, &mut routing, a, x);
    assert_eq!(s.check_routing(&routing), Ok(()));
    // The route forgotten while the request stays parked: its grant would go nowhere.
    let slot = s.client_slot_of(a.get()).unwrap();
    routing.clear();
    assert_eq!(
        s.check_routing(&routing),
        Err(crate::server::invariants::Violation::Route { slot })
    );
}
