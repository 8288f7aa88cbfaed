//! One TCP (or TLS) data connection shared by many clients of this process: the multiplexing
//! client.
//!
//! A process that runs many clients — one per worker thread of an engine, say — gives each
//! its own control connection (registration, names, heartbeats: the slow path) and lets all of
//! them share one data connection through a [`Mux`]. The first client to attach opens it with
//! its attach record; every later one joins it with a join command proving its session
//! (`dlock_core::proto::JoinCommand`). The server then serves all of them on that connection,
//! each as itself, with one read and one write per turn however many of them have requests
//! in flight.
//!
//! No thread per client: a blocking call sends from its own thread, and requests that become
//! ready together leave in one write (whichever thread finds the connection idle writes
//! everything queued meanwhile: group commit). A future ([`super::Client::lock_async`]) only
//! queues its request: many tasks of one executor thread send in a burst, and one flusher
//! thread per connection, woken by the first of them, writes the burst at once. One reader
//! thread per connection files each reply under the client and message id it echoes and wakes
//! whoever waits for it — a blocked thread, or a task.
//!
//! When the server closes the connection (every member gone, a frame timeout, a failover),
//! each waiter gets an error and the next attach through the same [`Mux`] opens a new one.
//! The connection closes when the last client on it detaches and no [`Mux`] keeps it.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::task::Waker;
use std::time::Instant;

use dlock_core::proto::{
    Command, DATA_HEADER_LEN, DATA_RESPONSE_WITH_VALUES_MAX, DataHeader, DecodeError, FLAG_EVENT,
    JoinCommand, PROTO_VERSION, decode_data_response, encode_data_request, peek_data_header,
    peek_data_response_header,
};
use dlock_core::{Session, Status};

use super::awaited::AwaitTable;
use super::link::Endpoint;
use super::wire::{ClientTls, Wire, attach_tcp};

/// Plaintext the reader holds at once: many replies per read when many clients are busy.
const READ_BUF: usize = 64 * DATA_RESPONSE_WITH_VALUES_MAX;

/// TLS records read at once (rustls's default limit on received plaintext).
const RAW_READ: usize = 16 * 1024;

/// How long a join may wait for its answer.
const JOIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A data connection to one server, shared by the clients configured with it
/// ([`super::ClientConfig::with_mux`]). Cheap to clone; every clone shares the connection.
///
/// ```
/// # use dlock_core::Config;
/// # use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
/// # let mut cfg = ServerConfig::new(Config {
/// #     locks_max: 64, clients_max: 8, objects_max: 4, ..Config::default()
/// # });
/// # cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse()?));
/// # let server = ServerHandle::start(cfg)?;
/// # let addr = server.tcp_addr().unwrap();
/// use dlock_core::{LockKind, Mode, Status};
/// use dlock_transport::client::{Client, ClientConfig, Endpoint, Mux};
///
/// let endpoint = Endpoint::Tcp(addr);
/// let mux = Mux::new(&endpoint)?;
/// // Four clients (one per worker thread, say), one data connection.
/// let mut workers = (0..4)
///     .map(|_| Client::connect(ClientConfig::new(endpoint.clone()).with_mux(mux.clone())))
///     .collect::<Result<Vec<_>, _>>()?;
/// for (k, w) in workers.iter_mut().enumerate() {
///     let id = w.get_lock(LockKind::Atomic, format!("rg-{k}").as_bytes())?;
///     assert_eq!(w.trylock(id, Mode::Exclusive, 5_000)?.status, Status::Success);
/// }
/// # drop(workers);
/// # server.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Mux {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    tls: Option<ClientTls>,
    /// The open connection, if any (weak: the clients on it keep it open, not the `Mux`).
    current: Mutex<Weak<Conn>>,
}

impl Mux {
    /// A multiplexer for the TCP or TLS server at `endpoint`. Nothing is opened until the
    /// first client attaches; `InvalidInput` for an endpoint with no TCP data path.
    pub fn new(endpoint: &Endpoint) -> io::Result<Mux> {
        let (addr, tls) = match endpoint {
            Endpoint::Tcp(addr) => (*addr, None),
            #[cfg(feature = "tls")]
            Endpoint::Tls { addr, tls } => (*addr, Some(tls.clone())),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "only a TCP or TLS endpoint has a data connection to share",
                ));
            }
        };
        Ok(Mux {
            shared: Arc::new(Shared {
                addr,
                tls,
                current: Mutex::new(Weak::new()),
            }),
        })
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Clients attached to the open connection (zero when none is open).
    pub fn clients(&self) -> usize {
        lock(&self.shared.current)
            .upgrade()
            .map_or(0, |c| lock(&c.ports).len())
    }

    /// Binds registered `client` to the shared connection: joins the open one, or opens one
    /// with this client's attach.
    pub(crate) fn attach(&self, client: u32, session: Session) -> io::Result<MuxPort> {
        let mut current = lock(&self.shared.current);
        if let Some(conn) = current.upgrade()
            && !conn.broken.load(Ordering::Acquire)
        {
            drop(current);
            return join(conn, client, session);
        }
        let wire = attach_tcp(self.shared.addr, self.shared.tls.as_ref(), client, session)?;
        let conn = Conn::start(wire)?;
        *current = Arc::downgrade(&conn);
        Ok(MuxPort::new(conn, client))
    }
}

/// Joins `client` to `conn` and waits for the server's answer.
fn join(conn: Arc<Conn>, client: u32, session: Session) -> io::Result<MuxPort> {
    let port = MuxPort::new(conn, client);
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: 0,
        client,
        flags: 0,
    };
    let mut req = [0u8; DATA_HEADER_LEN + dlock_core::proto::COMMAND_LEN];
    let n = encode_data_request(&header, &[Command::Join(JoinCommand { session })], &mut req)
        .map_err(|_| io::Error::other("cannot encode a join"))?;
    port.send(1, &req[..n])?;
    let mut reply = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
    let len = port
        .recv(1, &mut reply, Some(Instant::now() + JOIN_TIMEOUT))?
        .ok_or(io::ErrorKind::TimedOut)?;
    let status = decode_data_response(&reply[..len])
        .ok()
        .filter(|r| r.len() == 1)
        .map(|r| r.result(0).result.status);
    match status {
        Some(Status::Success) => Ok(port),
        _ => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the server refused to join this client to the shared connection",
        )),
    }
}

/// The shared connection.
struct Conn {
    /// The socket: plaintext writes go straight to it; under TLS records do.
    sock: TcpStream,
    #[cfg(feature = "tls")]
    tls: Option<Mutex<rustls::ClientConnection>>,
    /// Requests queued for the next write.
    queued: Mutex<Vec<u8>>,
    /// Held by the one thread writing, with the buffer it writes from.
    writing: Mutex<Vec<u8>>,
    /// The clients on it, by id.
    ports: Mutex<HashMap<u32, Arc<Port>>>,
    /// The connection failed or was closed: no reply will come.
    broken: AtomicBool,
    /// A flush of deferred requests is asked for and not yet begun.
    flush_asked: AtomicBool,
    /// Requests sent whose replies have not been read yet (approximate: a statistic that
    /// decides whether a deferred request can go at once).
    in_flight: AtomicUsize,
    /// How the flusher is woken (and told to stop).
    flusher: Arc<Signal>,
}

/// The flusher's wake-up: it holds this, and only a weak reference to the connection.
#[derive(Debug, Default)]
struct Signal {
    /// (a flush is wanted, the connection is gone)
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Signal {
    fn raise(&self, wanted: bool, closed: bool) {
        let mut s = lock(&self.state);
        s.0 |= wanted;
        s.1 |= closed;
        drop(s);
        self.cv.notify_one();
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("tls", &self.is_tls())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Ends the reader's blocking read and the flusher's wait: both hold only weak
        // references to us.
        let _ = self.sock.shutdown(Shutdown::Both);
        self.flusher.raise(false, true);
    }
}

impl Conn {
    /// Takes over an attached connection and starts its reader.
    fn start(wire: Wire) -> io::Result<Arc<Conn>> {
        #[cfg(feature = "tls")]
        let (sock, tls) = match wire {
            Wire::Plain(s) => (s, None),
            Wire::Tls(s) => {
                let rustls::StreamOwned { conn, sock } = *s;
                (sock, Some(Mutex::new(conn)))
            }
        };
        #[cfg(not(feature = "tls"))]
        let Wire::Plain(sock) = wire;
        sock.set_read_timeout(None)?;
        let reader = sock.try_clone()?;
        let conn = Arc::new(Conn {
            sock,
            #[cfg(feature = "tls")]
            tls,
            queued: Mutex::new(Vec::with_capacity(READ_BUF)),
            writing: Mutex::new(Vec::with_capacity(READ_BUF)),
            ports: Mutex::new(HashMap::new()),
            broken: AtomicBool::new(false),
            flush_asked: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            flusher: Arc::new(Signal::default()),
        });
        let weak = Arc::downgrade(&conn);
        std::thread::Builder::new()
            .name("dlock-mux-reader".into())
            .spawn(move || read_replies(reader, weak))?;
        let (weak, signal) = (Arc::downgrade(&conn), Arc::clone(&conn.flusher));
        std::thread::Builder::new()
            .name("dlock-mux-flusher".into())
            .spawn(move || flush_deferred(&signal, weak))?;
        Ok(conn)
    }

    /// Queues `bytes` for the flusher, waking it unless a flush is asked for already (it will
    /// take ours: it clears the request before it takes the queue). On an idle connection
    /// (nothing in flight) there is no burst to join: written at once, as a blocking call's.
    fn defer(&self, bytes: &[u8]) -> io::Result<()> {
        // Relaxed: a heuristic; either way the bytes are written, only when differs.
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            return self.write(bytes);
        }
        lock(&self.queued).extend_from_slice(bytes);
        // AcqRel: pairs with the flusher's store, so either it sees our bytes in the queue it
        // takes after clearing the flag, or we see the flag cleared and wake it again.
        if !self.flush_asked.swap(true, Ordering::AcqRel) {
            self.flusher.raise(true, false);
        }
        Ok(())
    }

    /// Queues `bytes` and writes everything queued unless another thread is writing (it will
    /// write ours too: it looks again after it lets go).
    fn write(&self, bytes: &[u8]) -> io::Result<()> {
        lock(&self.queued).extend_from_slice(bytes);
        loop {
            let mut out = match self.writing.try_lock() {
                Ok(out) => out,
                Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            };
            std::mem::swap(&mut *lock(&self.queued), &mut *out);
            if out.is_empty() {
                return Ok(());
            }
            let written = self.write_all(&out);
            out.clear();
            drop(out);
            if let Err(e) = written {
                self.fail();
                return Err(e);
            }
            // Bytes queued while we wrote, by threads that found us writing, are ours to send.
            if lock(&self.queued).is_empty() {
                return Ok(());
            }
        }
    }

    /// Whether the connection is under TLS (never without the `tls` feature).
    fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    #[cfg(not(feature = "tls"))]
    fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        (&self.sock).write_all(bytes)
    }

    #[cfg(feature = "tls")]
    fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        let Some(tls) = &self.tls else {
            return (&self.sock).write_all(bytes);
        };
        let mut tls = lock(tls);
        tls.writer().write_all(bytes)?;
        while tls.wants_write() {
            tls.write_tls(&mut &self.sock)?;
        }
        Ok(())
    }

    /// The connection is lost: every waiter learns it.
    fn fail(&self) {
        self.broken.store(true, Ordering::Release);
        let _ = self.sock.shutdown(Shutdown::Both);
        for port in lock(&self.ports).values() {
            port.close();
        }
    }
}

/// The flusher thread: writes what futures queued, one write per burst, until the connection
/// is gone.
fn flush_deferred(signal: &Signal, conn: Weak<Conn>) {
    loop {
        {
            let mut s = lock(&signal.state);
            while !s.0 && !s.1 {
                s = signal.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            if s.1 {
                return;
            }
            s.0 = false;
        }
        let Some(c) = conn.upgrade() else {
            return;
        };
        // Cleared before the queue is taken (in `write`): a request queued after this asks
        // again.
        c.flush_asked.store(false, Ordering::Release);
        // An error is the waiters' to learn: `write` failed the connection.
        let _ = c.write(&[]);
    }
}

/// The reader thread: files every reply under the client and message it answers, until the
/// connection ends (or the last user of it let go, which shuts the socket down).
fn read_replies(mut sock: TcpStream, conn: Weak<Conn>) {
    let mut plain = vec![0u8; READ_BUF];
    // At most what rustls buffers as plaintext, so a read's records always fit in `plain`.
    let mut raw = vec![0u8; RAW_READ];
    let mut filled = 0;
    loop {
        let got = match conn.upgrade().map(|c| c.is_tls()) {
            None => return,
            Some(false) => sock.read(&mut plain[filled..]),
            Some(true) => match sock.read(&mut raw) {
                Ok(0) => Ok(0),
                Ok(n) => match conn.upgrade() {
                    Some(c) => c.decrypt(&raw[..n], &mut plain[filled..]),
                    None => return,
                },
                Err(e) => Err(e),
            },
        };
        let ended = match got {
            Ok(0) => true,
            Ok(n) => {
                filled += n;
                false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(_) => true,
        };
        let Some(c) = conn.upgrade() else {
            return;
        };
        let used = match c.dispatch(&plain[..filled]) {
            Ok(used) => used,
            Err(()) => {
                c.fail();
                return;
            }
        };
        plain.copy_within(used..filled, 0);
        filled -= used;
        if ended {
            c.fail();
            return;
        }
    }
}

impl Conn {
    /// Without the `tls` feature there is no TLS session (`is_tls` is false, so the reader
    /// never calls this): the answer for a connection without one.
    #[cfg(not(feature = "tls"))]
    fn decrypt(&self, _records: &[u8], _out: &mut [u8]) -> io::Result<usize> {
        Err(io::Error::other("not a TLS connection"))
    }

    /// Feeds TLS records to the session and takes out the plaintext they carry (as much as
    /// `out` holds; the rest stays in the session for the next call). `Ok(0)` only when the
    /// peer closed the session.
    #[cfg(feature = "tls")]
    fn decrypt(&self, mut records: &[u8], out: &mut [u8]) -> io::Result<usize> {
        let Some(tls) = &self.tls else {
            return Err(io::Error::other("not a TLS connection"));
        };
        let mut tls = lock(tls);
        let mut n = 0;
        let mut closed = false;
        while !records.is_empty() {
            tls.read_tls(&mut records)?;
            tls.process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            // Drained after every record batch: the session holds little plaintext (rustls
            // refuses more records past its limit), and `out` has room for a whole raw read's.
            while n < out.len() {
                match tls.reader().read(&mut out[n..]) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        // A key update or an alert owes the peer records.
        while tls.wants_write() {
            tls.write_tls(&mut &self.sock)?;
        }
        match (n, closed) {
            (0, true) => Ok(0),
            // Nothing whole yet: not an end (`read_replies` reads on).
            (0, false) => Err(io::ErrorKind::WouldBlock.into()),
            _ => Ok(n),
        }
    }

    /// Files every whole reply at the start of `bytes`; returns how many bytes they took.
    /// `Err` on bytes that are no data reply.
    fn dispatch(&self, bytes: &[u8]) -> Result<usize, ()> {
        let ports = lock(&self.ports);
        let mut at = 0;
        loop {
            let (header, len) = match peek_data_response_header(&bytes[at..]) {
                Ok(peeked) => peeked,
                Err(DecodeError::Truncated) => return Ok(at),
                Err(_) => return Err(()),
            };
            let Some(reply) = bytes.get(at..at + len) else {
                return Ok(at);
            };
            if header.flags == FLAG_EVENT {
                // Sent unasked: no request is in flight for it.
                if let Some(port) = ports.get(&header.client) {
                    port.deliver_events(reply);
                }
                at += len;
                continue;
            }
            // Relaxed: see `in_flight`; never below zero (a reply to a request sent before a
            // count began is not counted twice).
            let _ = self
                .in_flight
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            // A reply for a client that detached meanwhile has nobody to go to.
            if let Some(port) = ports.get(&header.client) {
                port.deliver(header.message_id, reply);
            }
            at += len;
        }
    }
}

/// One client's replies on the shared connection.
#[derive(Debug)]
struct Port {
    state: Mutex<PortState>,
    arrived: Condvar,
}

#[derive(Debug)]
struct PortState {
    awaited: AwaitTable,
    /// The connection is gone.
    closed: bool,
    /// The task to wake when a reply arrives (an async caller).
    waker: Option<Waker>,
    /// Event messages for this client (`events.rs`).
    events: super::events::EventQueue,
}

impl Port {
    fn deliver_events(&self, msg: &[u8]) {
        lock(&self.state).events.file_message(msg);
    }

    fn deliver(&self, message_id: u16, reply: &[u8]) {
        let mut s = lock(&self.state);
        if !s.awaited.file(message_id, reply) {
            return; // a late reply to a message given up on
        }
        let waker = s.waker.take();
        drop(s);
        self.arrived.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn close(&self) {
        let waker = {
            let mut s = lock(&self.state);
            s.closed = true;
            s.waker.take()
        };
        self.arrived.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

fn lost() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the shared data connection was closed",
    )
}

/// A client's place on a shared connection (held by its link).
#[derive(Debug)]
pub(crate) struct MuxPort {
    conn: Arc<Conn>,
    port: Arc<Port>,
    client: u32,
}

impl Drop for MuxPort {
    fn drop(&mut self) {
        let mut ports = lock(&self.conn.ports);
        if ports
            .get(&self.client)
            .is_some_and(|p| Arc::ptr_eq(p, &self.port))
        {
            ports.remove(&self.client);
        }
    }
}

impl MuxPort {
    fn new(conn: Arc<Conn>, client: u32) -> MuxPort {
        let port = Arc::new(Port {
            state: Mutex::new(PortState {
                awaited: AwaitTable::new(),
                closed: conn.broken.load(Ordering::Acquire),
                waker: None,
                events: super::events::EventQueue::default(),
            }),
            arrived: Condvar::new(),
        });
        lock(&conn.ports).insert(client, Arc::clone(&port));
        MuxPort { conn, port, client }
    }

    /// Sends `req` (a data message of this client) as `ticket`, written now (or with the
    /// write in progress). When every entry is taken, the oldest is given up: it belongs to a
    /// message its caller stopped waiting for.
    pub(crate) fn send(&self, ticket: u64, req: &[u8]) -> io::Result<()> {
        self.expect(ticket, req)?;
        // Relaxed: see `Conn::in_flight`.
        self.conn.in_flight.fetch_add(1, Ordering::Relaxed);
        self.conn.write(req)
    }

    /// Sends `req` as `ticket` with the flusher's next write: for a caller that does not wait
    /// for the reply now (a future), so the requests of many can leave together.
    pub(crate) fn send_deferred(&self, ticket: u64, req: &[u8]) -> io::Result<()> {
        self.expect(ticket, req)?;
        self.conn.defer(req)
    }

    /// Files `ticket` as awaiting the reply to `req`.
    fn expect(&self, ticket: u64, req: &[u8]) -> io::Result<()> {
        let (header, _) = peek_data_header(req)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a data message"))?;
        let mut s = lock(&self.port.state);
        if s.closed {
            return Err(lost());
        }
        s.awaited.expect(ticket, header.message_id);
        Ok(())
    }

    /// Hands the events the reader filed for this client to `sink`.
    pub(crate) fn poll_events(&self, sink: &mut dyn FnMut(dlock_core::proto::Event)) {
        lock(&self.port.state).events.drain(sink);
    }

    /// The reply to `ticket` if it has arrived already.
    pub(crate) fn take_arrived(&self, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        lock(&self.port.state).awaited.take(ticket, reply)
    }

    /// Waits until `deadline` (`None`: forever) for the reply to `ticket`.
    pub(crate) fn recv(
        &self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        let mut s = lock(&self.port.state);
        loop {
            if let Some(n) = s.awaited.take(ticket, reply) {
                return Ok(Some(n));
            }
            if !s.awaited.awaits(ticket) {
                return Err(io::Error::other(
                    "no data message awaits a reply under this ticket",
                ));
            }
            if s.closed {
                return Err(lost());
            }
            s = match deadline {
                None => self
                    .port
                    .arrived
                    .wait(s)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let Some(left) = d.checked_duration_since(Instant::now()) else {
                        return Ok(None);
                    };
                    self.port
                        .arrived
                        .wait_timeout(s, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    /// The reply to `ticket` if it has arrived; otherwise `waker` is woken when it does (or
    /// when the connection is lost).
    pub(crate) fn poll_recv(
        &self,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        let mut s = lock(&self.port.state);
        if let Some(n) = s.awaited.take(ticket, reply) {
            return Ok(Some(n));
        }
        if s.closed {
            return Err(lost());
        }
        match &mut s.waker {
            Some(w) if w.will_wake(waker) => {}
            slot => *slot = Some(waker.clone()),
        }
        Ok(None)
    }
}

/// Locks `m`, taking the data over from a thread that panicked holding it (every update
/// here leaves the state consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
