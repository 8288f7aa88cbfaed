//! A real link whose data replies a test can hold back: requests reach the server at once, but
//! while the gate is closed the client sees no reply, and every wait for one is counted. A
//! test proves with it that a call did not wait for a reply (the count stays zero), or holds a
//! caller inside a network wait for as long as it likes; it can also make sends fail, as over a
//! connection that was lost. The link's events pass through, and every look at them is counted
//! (a test proves with it that a call did not look: over TCP each look is a `recv`). Each test file uses a different subset, hence the allow.
#![allow(dead_code)]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use dlock_core::Session;
use dlock_core::proto::Event;
use dlock_transport::client::link::Link;
use dlock_transport::client::{Client, ClientConfig, Connection, Endpoint};

/// The gate, shared by the test and the connection.
#[derive(Debug, Default)]
pub struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
    /// Waits for a reply that began while the gate was closed.
    waits: AtomicUsize,
    /// Set when a caller is inside such a wait.
    waiting: AtomicBool,
    /// Data messages fail to send (the connection looks lost) while set.
    failing: AtomicBool,
    /// Looks at the events the server sent unasked.
    event_looks: AtomicUsize,
}

impl Gate {
    pub fn close(&self) {
        *self.closed.lock().unwrap() = true;
    }

    pub fn open(&self) {
        *self.closed.lock().unwrap() = false;
        self.opened.notify_all();
    }

    /// Makes every data send fail (`fail`) or work again.
    pub fn fail_sends(&self, fail: bool) {
        self.failing.store(fail, Ordering::SeqCst);
    }

    fn is_closed(&self) -> bool {
        *self.closed.lock().unwrap()
    }

    /// How many times the client looked at its events.
    pub fn event_looks(&self) -> usize {
        self.event_looks.load(Ordering::SeqCst)
    }

    /// How many times a caller waited for a reply while the gate was closed.
    pub fn waits(&self) -> usize {
        self.waits.load(Ordering::SeqCst)
    }

    /// Blocks until a caller is inside a wait for a reply the gate holds back.
    pub fn until_someone_waits(&self) {
        let start = Instant::now();
        while !self.waiting.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(60), "nobody waited");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the gate opens or `deadline` passes; whether it is open.
    fn wait_open(&self, deadline: Option<Instant>) -> bool {
        self.waits.fetch_add(1, Ordering::SeqCst);
        self.waiting.store(true, Ordering::SeqCst);
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            let left = deadline.map_or(Duration::from_secs(3_600), |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break;
            }
            closed = self.opened.wait_timeout(closed, left).unwrap().0;
        }
        self.waiting.store(false, Ordering::SeqCst);
        !*closed
    }
}

/// A [`Link`] behind a [`Gate`].
#[derive(Debug)]
pub struct Gated {
    inner: Link,
    gate: Arc<Gate>,
}

/// A client of the server at `endpoint` over a gated link, and its gate (open).
pub fn gated_client(endpoint: &Endpoint, timeout: Duration) -> (Client<Gated>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let link = Gated {
        inner: Link::connect(endpoint).expect("the server's socket"),
        gate: Arc::clone(&gate),
    };
    let cfg = ClientConfig::new(endpoint.clone()).with_timeout(timeout);
    (Client::over(link, cfg).expect("registers"), gate)
}

impl Connection for Gated {
    fn reconnect(&mut self) -> io::Result<()> {
        self.inner.reconnect()
    }

    fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        self.inner.control(req, reply, deadline)
    }

    fn attach(&mut self, client: u32, slot: u32, session: Session) -> io::Result<()> {
        self.inner.attach(client, slot, session)
    }

    fn depth(&self) -> usize {
        self.inner.depth()
    }

    fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        if self.gate.failing.load(Ordering::SeqCst) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "gated: sends fail",
            ));
        }
        self.inner.send_data(req)
    }

    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        if self.gate.is_closed() {
            return Ok(None);
        }
        self.inner.try_recv_data(ticket, reply)
    }

    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        // A deadline that has passed only looks; anything else is a wait.
        let looks = deadline.is_some_and(|d| d <= Instant::now());
        if self.gate.is_closed() && (looks || !self.gate.wait_open(deadline)) {
            return Ok(None);
        }
        self.inner.recv_data(ticket, reply, deadline)
    }

    fn poll_recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        if self.gate.is_closed() {
            waker.wake_by_ref();
            return Ok(None);
        }
        self.inner.poll_recv_data(ticket, reply, waker)
    }

    fn poll_events(&mut self, sink: &mut dyn FnMut(Event)) -> io::Result<()> {
        self.gate.event_looks.fetch_add(1, Ordering::SeqCst);
        Connection::poll_events(&mut self.inner, sink)
    }

    fn carries_events(&self) -> bool {
        Connection::carries_events(&self.inner)
    }

    fn events_in_place(&self) -> bool {
        Connection::events_in_place(&self.inner)
    }
}
