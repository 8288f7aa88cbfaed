//! Events over RDMA (a module of `tests/rdma.rs`; every test needs `DLOCK_RDMA_DEVICE`): event
//! messages take the receive slots set aside for them and wait for credit rather than take a
//! reply's slot, credit comes back with the client's messages or in a credit return of its own
//! (which needs no reply slot),
//! and a cached holder on a queue pair is revoked through it end to end.

use std::thread;
use std::time::{Duration, Instant};

use dlock_core::proto::{Event, EventHeader, PROTO_VERSION, encode_event_message};
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::rdma::{
    EVENT_MESSAGES_INFLIGHT_MAX, EventRoom, MESSAGE_MAX, MESSAGES_INFLIGHT_MAX, Received,
    ServerConnection,
};

use super::wired::{device, rdma_client, server};
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
