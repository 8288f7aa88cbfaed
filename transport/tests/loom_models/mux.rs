//! Loom models of a shared connection's leader/follower hand-off (`client/mux/hub.rs`): the
//! production hub — its lock, bells and standby thread — over an in-memory connection whose
//! other side a model thread answers, echoing each request as its reply. Loom reports a lost
//! wake-up, a reply nobody reads or a request nobody writes as a deadlock: every thread
//! waiting, the server for a request or a caller for a reply.
//!
//! Checked locally, each caught as a deadlock: a caller that lets go of the lock between
//! looking at the state and sleeping on its bell (`Hub::recv`'s wait not atomic with its check:
//! the reply filed and the bell rung in between are lost); a reader that stops without naming
//! the next (`Sched::resign` leaving reading vacant while a caller sleeps); and the last caller
//! back from a burst not writing the queue (`come_back` without its `flush` duty: the second
//! model's server waits for a request forever).
//!
//! These models explore at most [`PREEMPTIONS`] preemptions per execution (2, where the shared
//! memory models above take 3): each weakening above is caught within 2, and the three models
//! then finish in about 7 s here, against about 5 minutes with 3.
use dlock_core::Session;
use dlock_core::proto::{
    Command, DATA_HEADER_LEN, DATA_RESPONSE_MAX, DataHeader, JoinCommand, PROTO_VERSION,
    encode_data_request,
};
use dlock_transport::client::mux::loom_support::{Bell, Hub, MemPipe, Reader};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// Preemptions explored per execution (see the module doc).
const PREEMPTIONS: usize = 2;

/// Explores `f` under loom with at most [`PREEMPTIONS`] preemptions (`LOOM_MAX_PREEMPTIONS`
/// overrides it); with `LOOM_LOG` set, under `loom::model`, which prints each step.
fn model(f: impl Fn() + Sync + Send + 'static) {
    if std::env::var_os("LOOM_LOG").is_some() {
        loom::model(f);
        return;
    }
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(PREEMPTIONS);
    builder.check(f);
}

/// A one-command data message of `client` with `message_id`: only its framing matters, and the
/// echo makes it its own reply.
fn message(client: u32, message_id: u16) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id,
        client,
        flags: 0,
    };
    let mut out = vec![0u8; DATA_HEADER_LEN + 32];
    let join = Command::Join(JoinCommand {
        session: Session::NONE,
    });
    let n = encode_data_request(&header, &[join], &mut out).expect("one command fits");
    out.truncate(n);
    out
}

fn hub(clients: &[u32]) -> (Arc<Hub<MemPipe>>, Vec<Arc<Bell>>) {
    let hub = Arc::new(Hub::new(MemPipe::default(), 4 * DATA_RESPONSE_MAX));
    let bells = clients.iter().map(|&c| hub.attach(c)).collect();
    (hub, bells)
}

/// The server's side: answers `n` requests, then ends.
fn serve(hub: &Arc<Hub<MemPipe>>, n: usize) -> thread::JoinHandle<()> {
    let hub = Arc::clone(hub);
    thread::spawn(move || {
        for _ in 0..n {
            hub.pipe().echo_one().expect("every request is written");
        }
    })
}

/// A blocking round trip of `client`: its message `id` sent as `ticket`, and its own reply back.
fn round_trip(hub: &Hub<MemPipe>, client: u32, bell: &Bell, ticket: u64, id: u16) {
    let sent = message(client, id);
    hub.send(client, ticket, &sent)
        .expect("the connection is open");
    let mut reply = [0u8; DATA_RESPONSE_MAX];
    let n = hub
        .recv(client, bell, ticket, &mut reply, None)
        .expect("the connection is open")
        .expect("no deadline");
    assert_eq!(&reply[..n], &sent[..], "a caller got another's reply");
}

/// Two blocked callers wait on one connection, in every order: one reads, the other sleeps,
/// or both come to the connection after their replies are in. Proves that each gets its own
/// reply, whoever reads — the reader files the other's reply and rings its bell, or names the
/// other reader when its own reply comes first — and that reading ends vacant.
#[test]
fn two_blocked_callers_each_get_their_reply_whoever_reads() {
    model(|| {
        let (hub, bells) = hub(&[1, 2]);
        let server = serve(&hub, 2);
        let other = {
            let (hub, bell) = (Arc::clone(&hub), Arc::clone(&bells[1]));
            thread::spawn(move || round_trip(&hub, 2, &bell, 1, 20))
        };
        round_trip(&hub, 1, &bells[0], 1, 10);
        other.join().unwrap();
        server.join().unwrap();
        assert_eq!(hub.reader(), Reader::Vacant);
        assert_eq!(hub.parked(), 0);
    });
}

/// Two callers make two round trips each. Proves the burst rule: a request queued while a
/// caller woken with its reply is still to come back is written by the last of those to come
/// back (the server would otherwise wait for it forever), and reading passes between the
/// callers as their replies come.
#[test]
fn callers_woken_by_one_burst_write_their_next_requests() {
    model(|| {
        let (hub, bells) = hub(&[1, 2]);
        let server = serve(&hub, 4);
        let other = {
            let (hub, bell) = (Arc::clone(&hub), Arc::clone(&bells[1]));
            thread::spawn(move || {
                round_trip(&hub, 2, &bell, 1, 20);
                round_trip(&hub, 2, &bell, 2, 21);
            })
        };
        round_trip(&hub, 1, &bells[0], 1, 10);
        round_trip(&hub, 1, &bells[0], 2, 11);
        other.join().unwrap();
        server.join().unwrap();
        assert_eq!(hub.reader(), Reader::Vacant);
    });
}

/// A waker that raises a flag its task's thread sleeps on.
#[derive(Default)]
struct Flag {
    raised: Mutex<bool>,
    cv: Condvar,
}

impl Flag {
    fn wait_and_lower(&self) {
        let mut raised = self.raised.lock().unwrap();
        while !*raised {
            raised = self.cv.wait(raised).unwrap();
        }
        *raised = false;
    }
}

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        *self.raised.lock().unwrap() = true;
        self.cv.notify_one();
    }
}

/// A future's request and a blocked caller's share the connection, with the standby thread
/// running. Proves that the future is read for — by the caller while it reads, or by the
/// standby thread it names when nobody does — and woken with its reply, that the caller gets
/// its own, and that the standby thread ends when the hub is let go. (The future's request is
/// sent at once: a deferred one would need the flusher thread too, one thread more than loom
/// explores in reasonable time; its hand-off is the flag and condition variable of
/// `Hub::defer` and `Hub::run_flusher`.)
#[test]
fn a_future_and_a_blocked_caller_are_both_served() {
    model(|| {
        let (hub, bells) = hub(&[1, 2]);
        let server = serve(&hub, 2);
        let standby = {
            let hub = Arc::clone(&hub);
            thread::spawn(move || hub.run_standby())
        };
        let caller = {
            let (hub, bell) = (Arc::clone(&hub), Arc::clone(&bells[1]));
            thread::spawn(move || round_trip(&hub, 2, &bell, 1, 20))
        };
        let flag = std::sync::Arc::new(Flag::default());
        let waker = std::task::Waker::from(std::sync::Arc::clone(&flag));
        let sent = message(1, 10);
        hub.send(1, 1, &sent).expect("the connection is open");
        let mut reply = [0u8; DATA_RESPONSE_MAX];
        let n = loop {
            match hub.poll(1, 1, &mut reply, &waker).expect("open") {
                Some(n) => break n,
                None => flag.wait_and_lower(),
            }
        };
        assert_eq!(&reply[..n], &sent[..], "the future got another's reply");
        caller.join().unwrap();
        server.join().unwrap();
        hub.close_down();
        standby.join().unwrap();
    });
}
