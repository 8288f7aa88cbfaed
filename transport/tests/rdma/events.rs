//! Events over RDMA (a module of `tests/rdma.rs`; every test needs `DLOCK_RDMA_DEVICE`): event
//! messages take the receive slots set aside for them and wait for credit rather than take a
//! reply's slot, credit comes back with the client's messages or in a credit return of its own
//! (which needs no reply slot), a client's events go ahead of the replies to its requests even
//! when they are more than its credit lets out at once, and a cached holder on a queue pair is
//! revoked through it end to end.

use std::thread;
use std::time::{Duration, Instant};

use dlock_core::proto::{
    Command, DataHeader, Event, EventHeader, LockCommand, LockFlags, LockOp, PROTO_VERSION,
    decode_data_response, decode_event_message, encode_data_request, encode_event_message,
};
use dlock_core::{LockId, LockKind, Mode, Status, Ticket};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::rdma::{
    EVENT_MESSAGES_INFLIGHT_MAX, EventRoom, MESSAGE_MAX, MESSAGES_INFLIGHT_MAX, RdmaClient,
    Received, ServerConnection,
};

use super::wired::{device, get_lock, raw_rdma_client, rdma_client, server};
use super::{Rig, device_config};

/// An event message revoking lock `n`, as the server sends it.
fn event_message(n: u32) -> Vec<u8> {
    let mut buf = vec![0u8; MESSAGE_MAX];
    let revoke = Event::Revoke {
        lock: LockId::new(n, 1),
        wanted: Mode::Exclusive,
        fence: u64::from(n),
    };
    let header = EventHeader {
        version: PROTO_VERSION,
        client: 1,
    };
    let len = encode_event_message(&header, &[revoke], &mut buf).unwrap();
    buf.truncate(len);
    buf
}

/// `conn.event_room()` until it is not `Busy` (send completions are microseconds away).
fn room(conn: &mut ServerConnection) -> EventRoom {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match conn.event_room().unwrap() {
            EventRoom::Busy if Instant::now() < until => thread::yield_now(),
            other => return other,
        }
    }
}

/// Serves one message with `try_serve` (waiting up to 5 s for it), answering a request with
/// its first byte; returns whether the handler ran (a credit return does not reach it).
fn serve_one(conn: &mut ServerConnection) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    let mut handled = false;
    while !conn
        .try_serve(|req, out| {
            handled = true;
            out[0] = req[0];
            1
        })
        .unwrap()
    {
        assert!(Instant::now() < until, "no message came");
        thread::yield_now();
    }
    handled
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn event_messages_wait_for_credit_and_never_take_a_reply_s_slot() {
    let Some(cfg) = device_config() else { return };
    let rig = Rig::new(cfg);
    let (mut client, mut conn) = rig.connect();
    for n in 0..EVENT_MESSAGES_INFLIGHT_MAX as u32 {
        assert_eq!(room(&mut conn), EventRoom::Ready);
        assert!(conn.send_event(&event_message(n)).unwrap());
    }
    assert_eq!(room(&mut conn), EventRoom::NoCredit);
    // The client, which has taken nothing yet, fills every reply slot too: with the events in
    // theirs, each reply still finds a posted receive (or the server's queue pair would stall).
    for k in 0..MESSAGES_INFLIGHT_MAX as u8 {
        client.post_send(&[k + 1]).unwrap();
    }
    for _ in 0..MESSAGES_INFLIGHT_MAX {
        assert!(
            serve_one(&mut conn),
            "a request was taken for a credit return"
        );
    }
    let mut out = [0u8; MESSAGE_MAX];
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < EVENT_MESSAGES_INFLIGHT_MAX + MESSAGES_INFLIGHT_MAX {
        assert!(Instant::now() < until, "only {got:?} arrived");
        match client.poll(&mut out).unwrap() {
            Some(Received::Reply(1)) => got.push(Some(out[0])),
            Some(Received::Event(_)) => got.push(None),
            Some(other) => panic!("unexpected {other:?}"),
            None => thread::yield_now(),
        }
    }
    assert_eq!(got, [None, None, Some(1), Some(2), Some(3), Some(4)]);
    // The requests told the server of no event taken; the client returned its credit as soon
    // as it had taken both event messages, with every reply slot in flight: an empty SEND into
    // a receive slot the server keeps for it, which the channel acknowledges by itself.
    assert_eq!(room(&mut conn), EventRoom::Ready);
    assert!(conn.take_unblocked());
    assert!(
        !conn
            .try_serve(|_, _| panic!("the credit return reached the handler"))
            .unwrap()
    );
    // The acknowledgement is the channel's own: the client sees nothing.
    thread::sleep(Duration::from_millis(10));
    assert_eq!(client.poll(&mut out).unwrap(), None);
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn a_cached_holder_on_a_queue_pair_is_revoked_and_the_waiter_granted() {
    let Some(dev) = device() else { return };
    let s = server(&dev, 5_000);
    let mut a = rdma_client(&s, &dev, 0);
    let id = a.get_lock(LockKind::Rw, b"page").unwrap();
    a.set_cacheable(id, true).unwrap();
    let token = a.trylock(id, Mode::Exclusive, 60_000).unwrap().token.0;
    let tcp = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mut b = Client::connect(ClientConfig::new(tcp)).unwrap();
    let waiter = thread::spawn(move || {
        let theirs = b.get_lock(LockKind::Rw, b"page").unwrap();
        b.lock(theirs, Mode::Exclusive, 60_000, Duration::from_secs(20))
            .map(|g| g.status)
    });
    let got = events_until(&mut a, |e| !e.is_empty());
    let revoke = Event::Revoke {
        lock: id,
        wanted: Mode::Exclusive,
        fence: token,
    };
    assert_eq!(got, [revoke]);
    assert!(!waiter.is_finished(), "the waiter waits for the holder");
    assert_eq!(a.unlock(id).unwrap(), Status::Success);
    assert_eq!(
        waiter.join().unwrap().map_err(Status::from),
        Ok(Status::Success)
    );
}

#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn revokes_to_a_client_that_sends_nothing_come_through_its_credit_returns() {
    let Some(dev) = device() else { return };
    let s = server(&dev, 5_000);
    let mut a = rdma_client(&s, &dev, 0);
    let tcp = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mut b = Client::connect(ClientConfig::new(tcp)).unwrap();
    let n = 12;
    let mut ids = Vec::new();
    for i in 0..n {
        let name = format!("rg-{i}");
        let id = a.get_lock(LockKind::Rw, name.as_bytes()).unwrap();
        a.set_cacheable(id, true).unwrap();
        let granted = a.trylock(id, Mode::Exclusive, 60_000).unwrap();
        assert_eq!(granted.status, Status::Success);
        ids.push(id);
    }
    // From here `a` sends nothing but what polling returns: each refused trylock revokes one of
    // its grants, in as many event messages as the server's turns make of them.
    for i in 0..n {
        let theirs = b
            .get_lock(LockKind::Rw, format!("rg-{i}").as_bytes())
            .unwrap();
        let refused = b.trylock(theirs, Mode::Exclusive, 60_000).unwrap_err();
        assert_eq!(refused.status(), Status::Fail);
    }
    let got = events_until(&mut a, |e| e.len() >= n);
    assert!(!got.contains(&Event::Overflow), "{got:?}");
    let revoked: Vec<LockId> = got
        .iter()
        .filter_map(|e| match e {
            Event::Revoke { lock, .. } => Some(*lock),
            Event::Overflow => None,
        })
        .collect();
    assert_eq!(revoked, ids);
}

/// An exclusive trylock of raw lock id `lock` by `client`, as message `message_id`, asking for
/// a cached grant if `cacheable`.
fn trylock(client: u32, message_id: u16, lock: u32, cacheable: bool) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 1,
        message_id,
        client,
        flags: 0,
    };
    let command = Command::Lock(LockCommand {
        kind: LockKind::Rw,
        op: LockOp::TryExclusive,
        lock,
        expire_ms: 60_000,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: if cacheable {
            LockFlags::CACHEABLE
        } else {
            LockFlags::NONE
        },
    });
    let mut buf = vec![0u8; MESSAGE_MAX];
    let len = encode_data_request(&header, &[command], &mut buf).unwrap();
    buf.truncate(len);
    buf
}

/// The message id and first status of data response `reply`.
fn answer(reply: &[u8]) -> (u16, Status) {
    let r = decode_data_response(reply).unwrap();
    (r.header().message_id, r.result(0).result.status)
}

/// A client holding cached grants is revoked more of them than the event messages its credit
/// lets out at once carry (each revoke comes in a server turn of its own, and the client takes
/// nothing meanwhile), then sends a request per reply slot. Every revoke must reach it before
/// any reply — the server holds the requests until the events have gone, and the client
/// returns the credit they wait for with every reply slot in flight — and every request must be
/// answered.
#[test]
#[ignore = "needs an RDMA device named in DLOCK_RDMA_DEVICE"]
fn events_beyond_the_credit_go_before_the_replies_to_requests_held_behind_them() {
    let Some(cfg) = super::device_config() else {
        return;
    };
    let s = server(&cfg.device, 60_000);
    let (mut link, me, mut qp) = raw_rdma_client(&s, &cfg);
    let mut out = [0u8; MESSAGE_MAX];
    let n = 12;
    let mut held = Vec::new();
    for i in 0..n {
        let lock = get_lock(&mut link, me, LockKind::Rw, format!("held-{i}").as_bytes());
        let len = qp.call(&trylock(me, i, lock, true), &mut out).unwrap();
        assert_eq!(answer(&out[..len]), (i, Status::Success));
        held.push(lock);
    }
    let fresh: Vec<u32> = (0..MESSAGES_INFLIGHT_MAX)
        .map(|k| get_lock(&mut link, me, LockKind::Rw, format!("fresh-{k}").as_bytes()))
        .collect();
    // Each refused trylock revokes one cached grant, in a turn of its own: the first
    // EVENT_MESSAGES_INFLIGHT_MAX revokes use up the credit, one message each, and the rest
    // wait in the client's event ring.
    let tcp = Endpoint::Tcp(s.tcp_addr().unwrap());
    let mut b = Client::connect(ClientConfig::new(tcp)).unwrap();
    for i in 0..n {
        let theirs = b
            .get_lock(LockKind::Rw, format!("held-{i}").as_bytes())
            .unwrap();
        let refused = b.trylock(theirs, Mode::Exclusive, 60_000).unwrap_err();
        assert_eq!(refused.status(), Status::Fail);
    }
    // Every request tells the server of no event message taken.
    let ids: Vec<u16> = (0..MESSAGES_INFLIGHT_MAX as u16).map(|k| 100 + k).collect();
    for (&id, &lock) in ids.iter().zip(&fresh) {
        qp.post_send(&trylock(me, id, lock, false)).unwrap();
    }
    let (revoked, messages, replies) = take_until_answered(&mut qp, ids.len());
    assert!(
        messages > EVENT_MESSAGES_INFLIGHT_MAX,
        "the events fitted the credit ({messages} messages): nothing was held"
    );
    let mut want = held.clone();
    want.sort_unstable();
    assert_eq!(
        revoked, want,
        "every cached grant revoked once, before any reply"
    );
    let answered: Vec<(u16, Status)> = ids.iter().map(|&id| (id, Status::Success)).collect();
    assert_eq!(replies, answered);
}

/// Takes messages off `qp` until `replies` replies came (for at most 10 s): the raw ids of the
/// locks revoked before the first reply (sorted; an event after a reply fails the test), how
/// many event messages brought them, and each reply's message id and status in order.
fn take_until_answered(
    qp: &mut RdmaClient,
    replies: usize,
) -> (Vec<u32>, usize, Vec<(u16, Status)>) {
    let mut out = [0u8; MESSAGE_MAX];
    let (mut revoked, mut messages, mut answered) = (Vec::new(), 0, Vec::new());
    let until = Instant::now() + Duration::from_secs(10);
    while answered.len() < replies {
        assert!(Instant::now() < until, "only {answered:?} answered");
        match qp.poll(&mut out).unwrap() {
            Some(Received::Event(len)) => {
                assert!(answered.is_empty(), "an event came after a reply");
                messages += 1;
                for e in decode_event_message(&out[..len]).unwrap().events() {
                    match e {
                        Event::Revoke { lock, .. } => revoked.push(lock.raw()),
                        Event::Overflow => panic!("the event ring overflowed"),
                    }
                }
            }
            Some(Received::Reply(len)) => answered.push(answer(&out[..len])),
            None => thread::yield_now(),
        }
    }
    revoked.sort_unstable();
    (revoked, messages, answered)
}

/// Polls `c` until `enough` says the events collected are enough, for at most 10 s.
fn events_until(c: &mut Client, enough: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let until = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while !enough(&got) && Instant::now() < until {
        c.poll_events(|e| got.push(e)).expect("poll");
        thread::sleep(Duration::from_millis(1));
    }
    got
}
