//! The hand-off end to end over an in-memory connection ([`MemPipe`]), with real threads:
//! what a reader does when it times out, when the connection closes, and for futures.

use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, DATA_HEADER_LEN, DATA_RESPONSE_WITH_VALUES_MAX, DataHeader, JoinCommand,
    MsgType, PROTO_VERSION, decode_control_response, encode_control_request,
    encode_control_response, encode_data_request, peek_control_header,
};
use dlock_core::{Session, Status};

use super::hub::Hub;
use super::mem::MemPipe;
use super::sched::{Bell, Reader};
use crate::sync::Arc;

const A: u32 = 1;
const B: u32 = 2;

/// A one-command data message of `client` with `message_id` (only its framing matters here).
fn message(client: u32, message_id: u16) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id,
        client,
        flags: 0,
    };
    let mut out = vec![0u8; DATA_HEADER_LEN + 32];
    let command = Command::Join(JoinCommand {
        session: Session::NONE,
    });
    let n = encode_data_request(&header, &[command], &mut out).unwrap();
    out.truncate(n);
    out
}

fn hub() -> Arc<Hub<MemPipe>> {
    Arc::new(Hub::new(
        MemPipe::default(),
        64 * DATA_RESPONSE_WITH_VALUES_MAX,
    ))
}

/// Waits (bounded) until `cond` holds.
fn until(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_reader_that_times_out_hands_reading_on_to_a_sleeper() {
    let hub = hub();
    let (bell_a, bell_b) = (hub.attach(A), hub.attach(B));
    hub.send(A, 1, &message(A, 1)).unwrap();
    hub.send(B, 1, &message(B, 2)).unwrap();
    let h = Arc::clone(&hub);
    let a = std::thread::spawn(move || {
        let mut reply = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
        let deadline = Instant::now() + Duration::from_millis(100);
        h.recv(A, &bell_a, 1, &mut reply, Some(deadline))
    });
    until("A reads", || hub.reader() == Reader::Caller(A));
    let h = Arc::clone(&hub);
    let b = std::thread::spawn(move || {
        let mut reply = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
        h.recv(B, &bell_b, 1, &mut reply, None)
            .map(|n| n.map(|_| reply[6]))
    });
    until("B sleeps", || hub.parked() == 1);
    assert_eq!(a.join().unwrap().unwrap(), None, "A timed out");
    assert_eq!(hub.reader(), Reader::Caller(B), "A named B on its way out");
    // The server answers both; B, reading now, files A's late reply and returns with its own.
    assert!(hub.pipe().echo_one().is_some());
    assert!(hub.pipe().echo_one().is_some());
    assert_eq!(b.join().unwrap().unwrap(), Some(2));
    assert_eq!(hub.reader(), Reader::Vacant);
}

#[test]
fn a_closed_connection_fails_the_reader_and_every_sleeper() {
    let hub = hub();
    let (bell_a, bell_b) = (hub.attach(A), hub.attach(B));
    hub.send(A, 1, &message(A, 1)).unwrap();
    hub.send(B, 1, &message(B, 2)).unwrap();
    let waiter = |h: Arc<Hub<MemPipe>>, c, bell: Arc<Bell>| {
        std::thread::spawn(move || {
            let mut reply = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
            h.recv(c, &bell, 1, &mut reply, None)
        })
    };
    let a = waiter(Arc::clone(&hub), A, bell_a);
    until("A reads", || hub.reader() == Reader::Caller(A));
    let b = waiter(Arc::clone(&hub), B, bell_b);
    until("B sleeps", || hub.parked() == 1);
    hub.pipe().close();
    for w in [a, b] {
        let e = w.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted);
    }
    assert!(hub.is_closed());
}

#[test]
fn a_look_past_the_deadline_reads_what_came_when_nobody_reads() {
    let hub = hub();
    let bell = hub.attach(A);
    let mut reply = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    hub.send(A, 1, &message(A, 1)).unwrap();
    assert_eq!(
        hub.recv(A, &bell, 1, &mut reply, Some(Instant::now()))
            .unwrap(),
        None
    );
    assert!(hub.pipe().echo_one().is_some());
    let got = hub
        .recv(A, &bell, 1, &mut reply, Some(Instant::now()))
        .unwrap();
    assert!(got.is_some(), "the look read it");
    assert_eq!(hub.reader(), Reader::Vacant);
}

#[test]
fn futures_are_read_for_by_the_standby_thread_until_none_waits() {
    let hub = hub();
    hub.attach(A);
    let standby = {
        let h = Arc::clone(&hub);
        std::thread::spawn(move || h.run_standby())
    };
    let count = StdArc::new(Count::default());
    let waker = Waker::from(StdArc::clone(&count));
    let mut reply = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    hub.defer(A, 1, &message(A, 1)).unwrap();
    assert_eq!(hub.poll(A, 1, &mut reply, &waker).unwrap(), None);
    assert_eq!(hub.reader(), Reader::Thread);
    assert!(hub.pipe().echo_one().is_some());
    until("the task is woken", || count.0.load(Ordering::SeqCst) == 1);
    assert!(hub.poll(A, 1, &mut reply, &waker).unwrap().is_some());
    until("the thread stops reading", || {
        hub.reader() == Reader::Vacant
    });
    hub.close_down();
    standby.join().unwrap();
}

/// A heartbeat of `client` numbered `message_id`.
fn heartbeat(client: u32, message_id: u16) -> Vec<u8> {
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: MsgType::Heartbeat,
        message_id,
        word: client,
    };
    let frame = ControlRequestFrame {
        header,
        body: ControlRequest::Heartbeat,
    };
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut out).unwrap();
    out.truncate(n);
    out
}

/// The server's answer `status` to control request `req`, echoing its type and message id.
fn answer(req: &[u8], status: Status) -> Vec<u8> {
    let (header, _) = peek_control_header(req).unwrap();
    let header = ControlHeader {
        word: status as u32,
        ..header
    };
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_response(&header, &ControlResponse::Empty, &mut out).unwrap();
    out.truncate(n);
    out
}

/// Clients number their messages each from 1, so two members' control requests often carry the
/// same message id. A reply that comes after its caller gave up must not pass for the answer to
/// the next exchange, whoever's it is: each exchange is numbered by the hub on the wire, and
/// the caller gets its own number back.
#[test]
fn a_late_control_reply_is_not_taken_for_the_next_exchanges() {
    let hub = hub();
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    let soon = Some(Instant::now() + Duration::from_millis(50));
    let e = hub.control(&heartbeat(A, 7), &mut reply, soon).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    let late = hub.pipe().take_control().unwrap();
    let h = Arc::clone(&hub);
    let b = std::thread::spawn(move || {
        let mut reply = vec![0u8; CONTROL_FRAME_MAX];
        let n = h.control(&heartbeat(B, 7), &mut reply, None).unwrap();
        reply.truncate(n);
        reply
    });
    let asked = hub.pipe().take_control().unwrap();
    hub.pipe().answer(&answer(&late, Status::ClientNotInit));
    hub.pipe().answer(&answer(&asked, Status::Success));
    let got = b.join().unwrap();
    let got = decode_control_response(&got).unwrap().header;
    assert_eq!(got.status(), Some(Status::Success), "B's own answer");
    assert_eq!(got.message_id, 7, "under B's own number");
}

#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: StdArc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
