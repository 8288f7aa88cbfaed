//! One TCP (or TLS) data connection shared by many clients of this process: the multiplexing
//! client.
//!
//! A process that runs many clients — one per worker thread of an engine, say — lets all of
//! them share one connection through a [`Mux`]: their data messages, and their control frames
//! too (registration, names, heartbeats: the slow path), so a thousand workers cost two sockets,
//! not a thousand and one. The first client registers over a control connection of its own
//! (there is no shared connection yet), which it keeps, and opens the shared one with its
//! attach record. Every later client registers over the shared connection, which makes it a
//! member at once (`dlock_core::server::control` has the server's rules); a client that
//! registered elsewhere joins with a join command proving its session
//! (`dlock_core::proto::JoinCommand`). The server then serves all of them on that connection,
//! each as itself, with one read and one write per turn however many of them have requests
//! in flight.
//!
//! No thread per client, and none between a blocked caller and the socket: a blocking call
//! writes its request from its own thread (requests that become ready together leave in one
//! write) and, while nobody else reads the connection, reads it itself, filing the replies of
//! the others and waking them (the leader/follower hand-off in `hub.rs`). A future
//! ([`super::Client::lock_async`]) only queues its request: many tasks of one executor thread
//! send in a burst, and one flusher thread per connection, woken by the first of them, writes
//! the burst at once; a standby thread reads for futures while no blocked caller does.
//!
//! When the server closes the connection (every member gone, a frame timeout, a failover),
//! each waiter gets an error and the next attach through the same [`Mux`] opens a new one.
//! The connection closes when the last client on it detaches and no [`Mux`] keeps it.
//!
//! Files: this one holds the [`Mux`] and a client's place on it (`MuxPort`); `hub.rs` the
//! hand-off (who reads, who sleeps, who writes), over `sched.rs`, its state; `pipe.rs` the
//! socket.

mod bell;
mod hub;
#[cfg(test)]
mod hub_tests;
#[cfg(any(test, dlock_loom))]
mod mem;
mod pipe;
mod sched;

/// What the loom models of the hand-off (`transport/tests/loom_models/mux.rs`) drive: the hub
/// itself over an in-memory connection.
#[cfg(dlock_loom)]
#[doc(hidden)]
pub mod loom_support {
    pub use super::hub::{Hub, Pipe, Reader, Wait};
    pub use super::mem::MemPipe;
    pub use super::sched::Bell;
}

use std::io;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError, Weak};
use std::task::Waker;
use std::time::Instant;

use dlock_core::proto::{
    Command, DATA_HEADER_LEN, DATA_RESPONSE_WITH_VALUES_MAX, DataHeader, JoinCommand,
    PROTO_VERSION, decode_data_response, encode_data_request,
};
use dlock_core::{Session, Status};

use super::link::Endpoint;
use super::wire::{ClientTls, attach_tcp};
use crate::sync::Arc;
use hub::Hub;
use pipe::TcpPipe;
use sched::Bell;

/// Plaintext the reader holds at once: many replies per read when many clients are busy.
const READ_BUF: usize = 64 * DATA_RESPONSE_WITH_VALUES_MAX;

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
    shared: std::sync::Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    tls: Option<ClientTls>,
    /// The open connection, if any (weak: the clients on it keep it open, not the `Mux`).
    current: Mutex<Weak<Conn>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
            shared: std::sync::Arc::new(Shared {
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
            .map_or(0, |c| c.hub.clients())
    }

    /// The open shared connection, for a client to register over (and then send its control
    /// frames over); `None` when none is open.
    pub(crate) fn open_connection(&self) -> Option<MuxConn> {
        lock(&self.shared.current)
            .upgrade()
            .filter(|c| !c.hub.is_closed())
            .map(MuxConn)
    }

    /// Binds registered `client` to the shared connection by `deadline`: joins the open one,
    /// or opens one with this client's attach.
    pub(crate) fn attach(
        &self,
        client: u32,
        session: Session,
        deadline: Instant,
    ) -> io::Result<MuxPort> {
        let mut current = lock(&self.shared.current);
        if let Some(conn) = current.upgrade()
            && !conn.hub.is_closed()
        {
            drop(current);
            return join(conn, client, session, deadline);
        }
        let tls = self.shared.tls.as_ref();
        let wire = attach_tcp(self.shared.addr, tls, client, session, deadline)?;
        let conn = Conn::start(TcpPipe::new(wire)?)?;
        *current = std::sync::Arc::downgrade(&conn);
        Ok(MuxPort::new(conn, client))
    }
}

/// Joins `client` to `conn` and waits for the server's answer until `deadline`.
fn join(
    conn: std::sync::Arc<Conn>,
    client: u32,
    session: Session,
    deadline: Instant,
) -> io::Result<MuxPort> {
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
        .recv(1, &mut reply, Some(deadline))?
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

/// The shared connection, held by the clients on it: when the last lets go, it is shut and
/// its two threads end.
#[derive(Debug)]
struct Conn {
    hub: Arc<Hub<TcpPipe>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.hub.close_down();
    }
}

impl Conn {
    /// Takes over an attached connection and starts its standby reader and its flusher.
    fn start(pipe: TcpPipe) -> io::Result<std::sync::Arc<Conn>> {
        let hub = Arc::new(Hub::new(pipe, READ_BUF));
        let conn = std::sync::Arc::new(Conn {
            hub: Arc::clone(&hub),
        });
        let standby = Arc::clone(&hub);
        std::thread::Builder::new()
            .name("dlock-mux-reader".into())
            .spawn(move || standby.run_standby())?;
        std::thread::Builder::new()
            .name("dlock-mux-flusher".into())
            .spawn(move || hub.run_flusher())?;
        Ok(conn)
    }
}

/// A shared connection a client sends its control frames over (held by its link).
#[derive(Debug)]
pub(crate) struct MuxConn(std::sync::Arc<Conn>);

impl MuxConn {
    /// One control exchange over the shared connection (see [`Hub::control`]).
    pub(crate) fn control(
        &self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        self.0.hub.control(req, reply, deadline)
    }

    /// Whether the connection is known to be closed (see [`Hub::is_closed`]).
    pub(crate) fn is_closed(&self) -> bool {
        self.0.hub.is_closed()
    }

    /// A place on this connection for `client`, which registered over it: the registration
    /// bound it here already, so no join is needed.
    pub(crate) fn port(&self, client: u32) -> MuxPort {
        MuxPort::new(std::sync::Arc::clone(&self.0), client)
    }
}

/// A client's place on a shared connection (held by its link).
#[derive(Debug)]
pub(crate) struct MuxPort {
    conn: std::sync::Arc<Conn>,
    bell: Arc<Bell>,
    client: u32,
}

impl Drop for MuxPort {
    fn drop(&mut self) {
        self.conn.hub.detach(self.client, &self.bell);
    }
}

impl MuxPort {
    fn new(conn: std::sync::Arc<Conn>, client: u32) -> MuxPort {
        let bell = conn.hub.attach(client);
        MuxPort { conn, bell, client }
    }

    /// Sends `req` (a data message of this client) as `ticket`, written now (or with the
    /// write in progress, or with the burst of the callers woken with it). When every entry is
    /// taken, the oldest is given up: it belongs to a message its caller stopped waiting for.
    pub(crate) fn send(&self, ticket: u64, req: &[u8]) -> io::Result<()> {
        self.conn.hub.send(self.client, ticket, req)
    }

    /// Sends `req` as `ticket` with the flusher's next write: for a caller that does not wait
    /// for the reply now (a future), so the requests of many can leave together.
    pub(crate) fn send_deferred(&self, ticket: u64, req: &[u8]) -> io::Result<()> {
        self.conn.hub.defer(self.client, ticket, req)
    }

    /// The reply to `ticket` if it has arrived already.
    pub(crate) fn take_arrived(&self, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        self.conn.hub.take(self.client, ticket, reply)
    }

    /// Waits until `deadline` (`None`: forever; a past one: one look) for the reply to
    /// `ticket`, reading the connection meanwhile if nobody else does.
    pub(crate) fn recv(
        &self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        self.conn
            .hub
            .recv(self.client, &self.bell, ticket, reply, deadline)
    }

    /// Hands the events the server sent this client unasked to `sink` (see
    /// [`Hub::poll_events`]).
    pub(crate) fn poll_events(&self, sink: &mut dyn FnMut(dlock_core::proto::Event)) {
        self.conn.hub.poll_events(self.client, sink);
    }

    /// The reply to `ticket` if it has arrived; otherwise `waker` is woken when it does (or
    /// when the connection is lost).
    pub(crate) fn poll_recv(
        &self,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        self.conn.hub.poll(self.client, ticket, reply, waker)
    }
}
