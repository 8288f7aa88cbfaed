//! The one way through (`dispatch.rs`): each path's rule of whom a message may speak for, where
//! the reply of a request it parks goes, joins, and a stream's framing — through
//! [`Server::dispatch`] and [`Server::dispatch_stream`], as the runtime and the simulators call
//! them.

use super::*;
use crate::proto::{
    DATA_RESPONSE_MAX, DataHeader, JoinCommand, PROTO_VERSION, decode_data_response,
    encode_data_request,
};
use crate::server::{Delivery, Dispatched, Route, Routing, SlotRouting, Source, Streamed};

/// The bytes of a data message from `client` with `message_id` carrying `cmds`.
pub(super) fn message(client: ClientId, message_id: u16, cmds: &[Command]) -> Vec<u8> {
    message_from(client.get(), message_id, cmds)
}

fn message_from(client: u32, message_id: u16, cmds: &[Command]) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id,
        client,
        flags: 0,
    };
    let mut buf = vec![0u8; DATA_RESPONSE_MAX];
    let n = encode_data_request(&header, cmds, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Routing entries for `s`'s client slots.
pub(super) fn slots(s: &TestServer) -> Vec<SlotRouting> {
    vec![SlotRouting::default(); s.config().clients_max as usize]
}

/// The statuses of a reply.
fn statuses(reply: &[u8]) -> Vec<Status> {
    let r = decode_data_response(reply).unwrap();
    r.results().map(|r| r.result.status).collect()
}

/// Client `a` holds atomic lock "x"; `b` has a reference to it. Both at tick 0.
fn a_holds_x(s: &mut TestServer) -> (ClientId, ClientId, LockId) {
    let (a, b) = (s.client(0), s.client(0));
    let x = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    s.get_lock(b.get(), LockKind::Atomic, b"x", 0).unwrap();
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 60_000);
    assert_eq!(s.run(a, take, 0).status, Status::Success);
    (a, b, x)
}

#[test]
fn a_mailbox_runs_only_its_own_slots_client_and_takes_every_number() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b) = (s.client(0), s.client(0));
    let slot_a = s.client_slot_of(a.get()).unwrap();
    let x = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 60_000);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let mailbox = |seq| Source::Mailbox { slot: slot_a, seq };
    // Another client's message in a's mailbox: nothing runs, and the number is taken.
    let foreign = message(b, 1, &[take]);
    let d = s.dispatch(&mut routing, mailbox(5), &foreign, &mut out, 1);
    assert_eq!(d, Dispatched::Refused);
    assert_eq!(routing.mailbox_seq(slot_a), Some(5));
    assert_eq!(s.stats().get(Counter::DataMessages), 0, "nothing ran");
    let d = s.dispatch(&mut routing, mailbox(6), b"no data message", &mut out, 1);
    assert_eq!(d, Dispatched::Refused);
    assert_eq!(routing.mailbox_seq(slot_a), Some(6));
    // Its own client's message runs.
    let own = message(a, 2, &[take]);
    let Dispatched::Replied(n) = s.dispatch(&mut routing, mailbox(7), &own, &mut out, 1) else {
        panic!("a's own message was not answered");
    };
    assert_eq!(statuses(&out[..n]), [Status::Success]);
    assert_eq!(routing.mailbox_seq(slot_a), Some(7));
    assert_eq!(routing.route(slot_a), Route::None);
}

#[test]
fn a_newer_mailbox_request_gives_up_the_parked_one() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b, x) = a_holds_x(&mut s);
    let slot_b = s.client_slot_of(b.get()).unwrap();
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let from = |seq| Source::Mailbox { slot: slot_b, seq };
    let parked = s.dispatch(&mut routing, from(1), &message(b, 1, &[wait]), &mut out, 1);
    assert_eq!(parked, Dispatched::Parked);
    assert_eq!(routing.route(slot_b), Route::Mailbox { seq: 1 });
    // b sends something else: it gave up on the parked request.
    let y = s.get_lock(b.get(), LockKind::Atomic, b"y", 1).unwrap();
    let other = message(b, 2, &[lock(LockKind::Atomic, LockOp::TryExclusive, y, 10)]);
    let d = s.dispatch(&mut routing, from(2), &other, &mut out, 2);
    assert!(matches!(d, Dispatched::Replied(_)), "{d:?}");
    assert_eq!(routing.route(slot_b), Route::None);
    // a unlocks: nobody is waiting any more, so nothing is granted and no reply comes.
    let unlock = lock(LockKind::Atomic, LockOp::UnlockExclusive, x, 0);
    assert_eq!(s.run(a, unlock, 3).status, Status::Success);
    assert!(s.replies().is_empty());
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 100);
    assert_eq!(s.run(a, take, 4).status, Status::Success, "x is free");
}

#[test]
fn a_stream_speaks_only_for_its_members_and_answers_strangers_client_not_init() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let a = s.client(0);
    let slot_a = s.client_slot_of(a.get()).unwrap();
    assert_eq!(
        s.bind_stream(&mut routing, (slot_a, a.get()), (3, 1), 0),
        None
    );
    let x = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let take = message(
        a,
        1,
        &[lock(LockKind::Atomic, LockOp::TryExclusive, x, 100)],
    );
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let on = |conn, generation| Source::Stream { conn, generation };
    for (conn, generation) in [(4, 1), (3, 2)] {
        let d = s.dispatch(&mut routing, on(conn, generation), &take, &mut out, 1);
        assert_eq!(d, Dispatched::Refused, "connection {conn} at {generation}");
    }
    let Dispatched::Replied(n) = s.dispatch(&mut routing, on(3, 1), &take, &mut out, 1) else {
        panic!("a member's message was not answered");
    };
    assert_eq!(statuses(&out[..n]), [Status::Success]);
    let stranger = message_from(99, 2, &[lock(LockKind::Atomic, LockOp::TryExclusive, x, 1)]);
    let Dispatched::Replied(n) = s.dispatch(&mut routing, on(3, 1), &stranger, &mut out, 1) else {
        panic!("an unregistered id was not answered");
    };
    assert_eq!(statuses(&out[..n]), [Status::ClientNotInit]);
}

#[test]
fn a_parked_stream_request_is_answered_on_its_connection_with_its_message_id() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b, x) = a_holds_x(&mut s);
    let slot_b = s.client_slot_of(b.get()).unwrap();
    let _ = s.bind_stream(&mut routing, (slot_b, b.get()), (3, 1), 0);
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let at = Source::Stream {
        conn: 3,
        generation: 1,
    };
    let d = s.dispatch(&mut routing, at, &message(b, 41, &[wait]), &mut out, 1);
    assert_eq!(d, Dispatched::Parked);
    let unlock = lock(LockKind::Atomic, LockOp::UnlockExclusive, x, 0);
    assert_eq!(s.run(a, unlock, 2).status, Status::Success);
    let mut delivered = Vec::new();
    s.dispatch_replies(&mut routing, &mut out, |delivery, r, bytes| {
        delivered.push((delivery, r.header.message_id, statuses(bytes)));
    });
    let to_3 = Delivery::Stream {
        conn: 3,
        generation: 1,
    };
    assert_eq!(delivered, [(to_3, 41, vec![Status::Success])]);
    assert_eq!(routing.route(slot_b), Route::None);
}

#[test]
fn a_join_binds_its_client_and_vacates_the_connection_it_left() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b) = (s.client(0), s.client(0));
    let slot_a = s.client_slot_of(a.get()).unwrap();
    let _ = s.bind_stream(&mut routing, (slot_a, a.get()), (3, 1), 0);
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let on_5 = Source::Stream {
        conn: 5,
        generation: 1,
    };
    let join = |session| Command::Join(JoinCommand { session });
    // Another registration's session, or a join among other commands: the connection closes.
    let wrong = message(a, 1, &[join(s.session(b.get()))]);
    assert_eq!(
        s.dispatch(&mut routing, on_5, &wrong, &mut out, 1),
        Dispatched::Refused
    );
    assert_eq!(s.stats().get(Counter::SessionsRefused), 1);
    let x = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 100);
    // Sent on a's own connection, where a's other messages run.
    let mixed = message(a, 2, &[join(s.session(a.get())), take]);
    let on_3 = Source::Stream {
        conn: 3,
        generation: 1,
    };
    assert_eq!(
        s.dispatch(&mut routing, on_3, &mixed, &mut out, 1),
        Dispatched::Refused
    );
    assert_eq!(routing.binding(slot_a).conn, 3, "nothing bound by either");
    assert_eq!(
        s.stats().get(Counter::DataMessages),
        0,
        "nothing of the mix ran"
    );
    // The registration's own session: bound here, and connection 3 is left with nobody.
    let right = message(a, 3, &[join(s.session(a.get()))]);
    let d = s.dispatch(&mut routing, on_5, &right, &mut out, 1);
    let Dispatched::Joined { reply, vacated } = d else {
        panic!("{d:?}");
    };
    assert_eq!(statuses(&out[..reply]), [Status::Success]);
    assert_eq!(vacated, Some(3));
    assert_eq!((routing.binding(slot_a).conn, routing.members(3)), (5, 0));
}

#[test]
fn a_stream_is_framed_one_whole_message_at_a_time() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let a = s.client(0);
    let slot_a = s.client_slot_of(a.get()).unwrap();
    let _ = s.bind_stream(&mut routing, (slot_a, a.get()), (3, 1), 0);
    let x = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let first = message(
        a,
        1,
        &[lock(LockKind::Atomic, LockOp::TryExclusive, x, 100)],
    );
    let second = message(
        a,
        2,
        &[lock(LockKind::Atomic, LockOp::UnlockExclusive, x, 0)],
    );
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let at = (3, 1);
    for cut in [0, 8, first.len() - 1] {
        let d = s.dispatch_stream(&mut routing, at, &first[..cut], &mut out, 1);
        assert_eq!(d, Streamed::Incomplete, "{cut} bytes");
    }
    assert_eq!(s.stats().get(Counter::DataMessages), 0);
    let bytes = [first.clone(), second].concat();
    let d = s.dispatch_stream(&mut routing, at, &bytes, &mut out, 1);
    let Streamed::Message { len, dispatched } = d else {
        panic!("{d:?}");
    };
    assert_eq!(len, first.len(), "only the first message");
    assert!(matches!(dispatched, Dispatched::Replied(_)));
    assert_eq!(s.stats().get(Counter::DataMessages), 1);
    let junk = [0xAB; 64];
    let d = s.dispatch_stream(&mut routing, at, &junk, &mut out, 1);
    assert_eq!(d, Streamed::Malformed);
}

#[test]
fn a_queue_pair_speaks_for_its_client_and_a_newer_message_gives_up_the_parked_one() {
    let mut s = TestServer::new(&small());
    let mut entries = slots(&s);
    let mut routing = Routing::new(&mut entries);
    let (a, b, x) = a_holds_x(&mut s);
    let slot_b = s.client_slot_of(b.get()).unwrap();
    let pair = Source::QueuePair {
        slot: slot_b,
        client: b.get(),
    };
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let unlock = lock(LockKind::Atomic, LockOp::UnlockExclusive, x, 0);
    let foreign = message(a, 1, &[unlock]);
    assert_eq!(
        s.dispatch(&mut routing, pair, &foreign, &mut out, 1),
        Dispatched::Refused
    );
    let wait = waiting(LockKind::Atomic, LockOp::TryExclusive, x, 60_000, 60_000);
    let parked = s.dispatch(&mut routing, pair, &message(b, 2, &[wait]), &mut out, 1);
    assert_eq!(parked, Dispatched::Parked);
    assert_eq!(routing.route(slot_b), Route::QueuePair);
    let y = s.get_lock(b.get(), LockKind::Atomic, b"y", 1).unwrap();
    let other = message(b, 3, &[lock(LockKind::Atomic, LockOp::TryExclusive, y, 10)]);
    let d = s.dispatch(&mut routing, pair, &other, &mut out, 2);
    assert!(matches!(d, Dispatched::Replied(_)), "{d:?}");
    assert_eq!(routing.route(slot_b), Route::None);
    assert_eq!(s.run(a, unlock, 3).status, Status::Success);
    assert!(
        s.replies().is_empty(),
        "the given-up request is never granted"
    );
}
