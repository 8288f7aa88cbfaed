//! How a client reaches its server: a control connection (Unix socket for a server on this host,
//! TCP otherwise; a client on a [`Mux`](super::Mux) sends its control frames over the shared
//! connection when one is open) and a data path (the client's mailbox in the region, a TCP data
//! connection of its own or a shared one, or with the `rdma` feature an RDMA queue pair).
//!
//! A link moves whole frames and knows nothing of their meaning; the [`super::Client`] above it
//! encodes, decodes and keeps the local lock state.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::Session;
use dlock_core::proto::{CONTROL_HEADER_LEN, MsgType, control_frame_len, peek_control_header};
use dlock_core::table::layout::MAILBOX_LANES;

use super::wire::{
    CONNECT_TIMEOUT, ClientTls, TcpData, Wire, attach_tcp, server_speaks_tls, time_left,
};
use crate::region::Region;
#[cfg(feature = "server")]
use crate::runtime::{ServerHandle, Shared};
use crate::shm::{Doorbells, Mailbox, lanes_current_seq};
use crate::sync::AtomicU64;

/// Where a server is.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Endpoint {
    /// A server in this process: control over its Unix socket, data through its region.
    #[cfg(feature = "server")]
    Embedded(EmbeddedRef),
    /// A server on this host that maps `/dev/shm/<shm_name>`: control over `unix_socket`.
    Local {
        /// The server's Unix socket.
        unix_socket: PathBuf,
        /// The region's name under `/dev/shm`.
        shm_name: String,
    },
    /// A server anywhere: control and data over TCP, in plaintext (a server accepts that on a
    /// loopback address, or when its operator allowed plaintext explicitly).
    Tcp(SocketAddr),
    /// A server anywhere: control and data over TCP under TLS 1.3 with this client's
    /// certificate ([`Endpoint::tls`]; feature `tls`).
    #[cfg(feature = "tls")]
    Tls {
        /// The server's TCP address.
        addr: SocketAddr,
        /// Certificates, trust and the server's expected name.
        tls: crate::tls::ClientTls,
    },
    /// A server anywhere, with data over RDMA: control over TCP to `addr` as for
    /// [`Endpoint::Tcp`], then a queue pair on the device in `rdma` for data messages and
    /// one-sided object operations. Without a usable device, or when the server has no RDMA, the
    /// data path is a TCP connection instead (logged; see [`Link::transport`]).
    #[cfg(feature = "rdma")]
    Rdma {
        /// The server's TCP address.
        addr: SocketAddr,
        /// The local device to use.
        rdma: crate::rdma::RdmaConfig,
    },
}

/// The data path a client ended up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// The client's mailbox in the server's region.
    SharedMemory,
    /// A TCP data connection (also what an RDMA endpoint falls back to).
    Tcp,
    /// An RDMA queue pair (feature `rdma`).
    Rdma,
}

/// A handle on an in-process server's shared state (cheap to clone).
#[cfg(feature = "server")]
#[derive(Clone, Debug)]
pub struct EmbeddedRef {
    shared: Arc<Shared>,
    unix_socket: PathBuf,
}

impl Endpoint {
    /// A server at `addr` reached over TLS with `cfg` (its files are read here, once).
    #[cfg(feature = "tls")]
    pub fn tls(addr: SocketAddr, cfg: &crate::tls::TlsConfig) -> io::Result<Endpoint> {
        Ok(Endpoint::Tls {
            addr,
            tls: crate::tls::ClientTls::new(cfg, addr)?,
        })
    }

    /// The TCP address and TLS settings of a remote endpoint (`None` for a local one).
    fn remote(&self) -> Option<(SocketAddr, Option<&ClientTls>)> {
        match self {
            #[cfg(feature = "server")]
            Endpoint::Embedded(_) => None,
            Endpoint::Local { .. } => None,
            Endpoint::Tcp(addr) => Some((*addr, None)),
            #[cfg(feature = "tls")]
            Endpoint::Tls { addr, tls } => Some((*addr, Some(tls))),
            #[cfg(feature = "rdma")]
            Endpoint::Rdma { addr, .. } => Some((*addr, None)),
        }
    }

    /// The endpoint of a server running in this process.
    #[cfg(feature = "server")]
    pub fn embedded(server: &ServerHandle) -> Endpoint {
        Endpoint::Embedded(EmbeddedRef {
            shared: Arc::clone(server.shared()),
            unix_socket: server.unix_socket().to_path_buf(),
        })
    }
}

#[derive(Debug)]
enum Control {
    Unix(UnixStream),
    Tcp(Wire),
    /// Over a shared connection (a client that registered over it, see `mux`).
    Mux(super::mux::MuxConn),
}

impl Control {
    /// A control connection of its own to `endpoint`, opened by `deadline` (a Unix socket's
    /// connect does not wait: the server's backlog takes it or refuses it).
    fn open(endpoint: &Endpoint, deadline: Instant) -> io::Result<Control> {
        Ok(match (endpoint, endpoint.remote()) {
            #[cfg(feature = "server")]
            (Endpoint::Embedded(e), _) => Control::Unix(UnixStream::connect(&e.unix_socket)?),
            (Endpoint::Local { unix_socket, .. }, _) => {
                Control::Unix(UnixStream::connect(unix_socket)?)
            }
            (_, Some((addr, tls))) => Control::Tcp(Wire::open(addr, tls, deadline)?),
            (_, None) => unreachable!("every endpoint is local or remote"),
        })
    }
}

/// Whether control request `req` registers its client (`ClientInit`, `ClientReinit`).
fn registers(req: &[u8]) -> bool {
    peek_control_header(req)
        .is_ok_and(|(h, _)| matches!(h.msg, MsgType::ClientInit | MsgType::ClientReinit))
}

/// Reads a reply header into `buf`, or as much of it as comes before the peer closes; returns
/// how much. (`read_exact` would not say what a short answer was: a TLS server's alert to a
/// plaintext client is 7 bytes and a close.)
fn read_header(s: &mut dyn ReadWrite, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got > 0 && is_tls_record(&buf[..got]) => {
                tracing::debug!(error = %e, "a TLS record, then an error");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Whether `bytes` start a TLS record (an alert or a handshake, TLS 1.0 to 1.3 on the wire):
/// what a TLS server answers a plaintext client with.
fn is_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The region a shared-memory data path uses: the embedded server's, or a mapping of our own.
#[derive(Debug)]
enum Mapped {
    #[cfg(feature = "server")]
    Embedded(Arc<Shared>),
    Own(Arc<Region>),
}

impl Mapped {
    /// Wakes the server's data thread if it is parked: directly in this process, through the
    /// region's bell (and the server's bridge thread) from another (`runtime/wake.rs`).
    fn wake_server(&self) {
        match self {
            #[cfg(feature = "server")]
            Mapped::Embedded(s) => s.wake_data(),
            Mapped::Own(r) => r.shm_header().wake_server(),
        }
    }

    fn region(&self) -> &Region {
        match self {
            #[cfg(feature = "server")]
            Mapped::Embedded(s) => &s.region,
            Mapped::Own(r) => r,
        }
    }
}

#[derive(Debug)]
enum Data {
    /// Not attached yet.
    None,
    /// The client's mailbox in the server's region.
    Mailbox { mapped: Mapped, slot: u32 },
    /// A TCP data connection (boxed: it carries its reply table).
    Tcp(Box<TcpData>),
    /// A place on a TCP data connection shared with other clients of this process.
    Mux(super::mux::MuxPort),
    /// An RDMA queue pair and what was taken off it (boxed: it is several times the size of
    /// the other variants).
    #[cfg(feature = "rdma")]
    Rdma(Box<super::rdma::RdmaData>),
}

/// A client's connections to one server.
#[derive(Debug)]
pub struct Link {
    endpoint: Endpoint,
    control: Control,
    data: Data,
    /// The last data message's ticket: its mailbox sequence number over shared memory, a count
    /// of messages otherwise.
    seq: u64,
    /// How long a shared-memory wait stays awake before it sleeps.
    awake: Duration,
    /// The shared data connection to attach through, if the client was given one.
    mux: Option<super::Mux>,
    /// How long opening a connection may take: the control connection, the data path's
    /// attach (or join) after a registration, and both again at a reconnect.
    connect_timeout: Duration,
    /// Over shared memory: what was read of the slot's event ring.
    ring: super::events::RingReader,
}

impl Link {
    /// Opens the control connection, giving each connection it opens 5 s (the reference's
    /// request timeout; [`Link::connect_within`] takes another).
    pub fn connect(endpoint: &Endpoint) -> io::Result<Link> {
        Link::connect_within(endpoint, CONNECT_TIMEOUT)
    }

    /// Opens the control connection, giving it and every connection the link opens later (its
    /// data path's, a reconnect's) at most `timeout`: a client configured with a short timeout
    /// does not wait longer than that on a dead address.
    pub fn connect_within(endpoint: &Endpoint, timeout: Duration) -> io::Result<Link> {
        let control = Control::open(endpoint, Instant::now() + timeout)?;
        Ok(Link::over(endpoint, control, timeout))
    }

    /// A link over `control`, not attached yet.
    fn over(endpoint: &Endpoint, control: Control, connect_timeout: Duration) -> Link {
        Link {
            endpoint: endpoint.clone(),
            control,
            data: Data::None,
            seq: 0,
            awake: Duration::ZERO,
            mux: None,
            connect_timeout,
            ring: super::events::RingReader::default(),
        }
    }

    /// A link whose data path will be `mux`'s shared connection, and whose control frames go
    /// over it too when one is open (to the same server); otherwise it opens its control
    /// connection as [`Link::connect_within`] does (with `timeout`), and will open the shared
    /// connection, or join it, within `timeout` when it attaches.
    pub fn connect_shared(
        endpoint: &Endpoint,
        mux: super::Mux,
        timeout: Duration,
    ) -> io::Result<Link> {
        let same_server = endpoint.remote().map(|(addr, _)| addr) == Some(mux.addr());
        let mut link = match mux.open_connection().filter(|_| same_server) {
            Some(conn) => Link::over(endpoint, Control::Mux(conn), timeout),
            None => Link::connect_within(endpoint, timeout)?,
        };
        link.mux = Some(mux);
        Ok(link)
    }

    /// Opens fresh connections to the same server, keeping the settings (`client_reinit`): over
    /// a shared connection, whichever is open now.
    pub fn reconnect(&mut self) -> io::Result<()> {
        let timeout = self.connect_timeout;
        let mut fresh = match &self.mux {
            Some(mux) => Link::connect_shared(&self.endpoint, mux.clone(), timeout)?,
            None => Link::connect_within(&self.endpoint, timeout)?,
        };
        fresh.awake = self.awake;
        *self = fresh;
        Ok(())
    }

    /// How long a wait for a shared-memory reply stays awake (spinning, then yielding) before it
    /// sleeps on the futex; see `ClientConfig::wait_awake`.
    pub fn set_wait_awake(&mut self, awake: Duration) {
        self.awake = awake;
    }

    /// Sends a control frame and reads the reply frame into `reply`.
    pub fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let left = deadline.map(time_left).transpose()?;
        let s: &mut dyn ReadWrite = match &mut self.control {
            Control::Mux(conn) => match conn.control(req, reply, deadline) {
                // The server closes a shared connection left with no member (its clients'
                // leases ran out, say), and this process may not have read that yet: a
                // registration that finds it closed registers over a connection of its own, as
                // the first client does, and attaching opens a new shared connection. Sending
                // it again is safe: had it run before the connection went, the registration it
                // made went with the connection and lapses with its lease.
                Err(_) if conn.is_closed() && registers(req) => {
                    let by = Instant::now() + self.connect_timeout;
                    let by = deadline.map_or(by, |d| d.min(by));
                    self.control = Control::open(&self.endpoint, by)?;
                    return self.control(req, reply, deadline);
                }
                done => return done,
            },
            Control::Unix(s) => {
                s.set_read_timeout(left)?;
                s
            }
            Control::Tcp(s) => {
                s.socket().set_read_timeout(left)?;
                s
            }
        };
        s.write_all(req)?;
        let got = read_header(s, &mut reply[..CONTROL_HEADER_LEN])?;
        let len = match control_frame_len(&reply[..got]) {
            Ok(len) if got == CONTROL_HEADER_LEN && len <= reply.len() => len,
            _ if is_tls_record(&reply[..got]) => return Err(server_speaks_tls()),
            _ if got < CONTROL_HEADER_LEN => return Err(io::ErrorKind::UnexpectedEof.into()),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad control reply header",
                ));
            }
        };
        s.read_exact(&mut reply[CONTROL_HEADER_LEN..len])?;
        Ok(len)
    }

    /// Binds the data path after registration: the mailbox `slot`, or a TCP data connection
    /// proven with `session` (opened, or the shared one joined, within the link's connect
    /// timeout).
    pub fn attach(&mut self, client: u32, slot: u32, session: Session) -> io::Result<()> {
        let by = Instant::now() + self.connect_timeout;
        // The old path goes first: a re-registration may join the same shared connection.
        self.data = Data::None;
        // A new registration's ring starts empty (the server clears a slot's ring with it).
        self.ring = super::events::RingReader::default();
        if let Some(mux) = &self.mux {
            if self.endpoint.remote().map(|(addr, _)| addr) != Some(mux.addr()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the shared connection is to another server",
                ));
            }
            self.data = Data::Mux(match &self.control {
                // Registered over it: the registration made the client a member there.
                Control::Mux(conn) => conn.port(client),
                _ => mux.attach(client, session, by)?,
            });
            return Ok(());
        }
        self.data = match &self.endpoint {
            #[cfg(feature = "server")]
            Endpoint::Embedded(e) => Data::Mailbox {
                mapped: Mapped::Embedded(Arc::clone(&e.shared)),
                slot,
            },
            Endpoint::Local { shm_name, .. } => Data::Mailbox {
                mapped: Mapped::Own(Arc::new(Region::open_shared(shm_name)?)),
                slot,
            },
            Endpoint::Tcp(addr) => {
                Data::Tcp(TcpData::new(attach_tcp(*addr, None, client, session, by)?))
            }
            #[cfg(feature = "tls")]
            Endpoint::Tls { addr, tls } => Data::Tcp(TcpData::new(attach_tcp(
                *addr,
                Some(tls),
                client,
                session,
                by,
            )?)),
            #[cfg(feature = "rdma")]
            Endpoint::Rdma { addr, rdma } => {
                match super::rdma::attach(*addr, rdma, client, session, by)? {
                    Some(qp) => Data::Rdma(super::rdma::RdmaData::new(qp)),
                    None => Data::Tcp(TcpData::new(attach_tcp(*addr, None, client, session, by)?)),
                }
            }
        };
        if let Data::Mailbox { mapped, slot } = &self.data {
            let Some(lanes) = mapped.region().client_mailboxes(*slot) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "mailbox slot out of range",
                ));
            };
            // The slot may have had an owner before: continue above its sequence numbers.
            self.seq = lanes_current_seq(lanes);
        }
        Ok(())
    }

    /// The object cells, when the data path can change them one-sided (shared memory).
    pub fn object_cells(&self) -> Option<&[AtomicU64]> {
        match &self.data {
            Data::Mailbox { mapped, .. } => Some(mapped.region().object_cells()),
            _ => None,
        }
    }

    /// The data path in use; `None` before it is attached (or after a failed re-attach).
    pub fn transport(&self) -> Option<Transport> {
        match &self.data {
            Data::None => None,
            Data::Mailbox { .. } => Some(Transport::SharedMemory),
            Data::Tcp(_) | Data::Mux(_) => Some(Transport::Tcp),
            #[cfg(feature = "rdma")]
            Data::Rdma(_) => Some(Transport::Rdma),
        }
    }

    /// The queue pair, when object operations can be one-sided RDMA atomics on it (the device
    /// does remote atomics and the server advertised its object table).
    #[cfg(feature = "rdma")]
    pub fn rdma_objects(&mut self) -> Option<&mut crate::rdma::RdmaClient> {
        match &mut self.data {
            Data::Rdma(d) if d.qp.supports_atomics() && d.qp.object_table().is_some() => {
                Some(&mut d.qp)
            }
            _ => None,
        }
    }

    /// Drops the data path (queue pair, TCP data connection or mailbox binding) and keeps the
    /// control connection: what a client whose data path died looks like to the server. For
    /// fault-injection tests.
    #[doc(hidden)]
    pub fn drop_data_path(&mut self) {
        self.data = Data::None;
    }

    /// How many data messages may be in flight (sent, reply not yet received) at once: one per
    /// mailbox lane over shared memory; as many over TCP, whose replies are matched to their
    /// messages by id; one over RDMA, where each message needs a receive posted on both sides.
    pub fn depth(&self) -> usize {
        match &self.data {
            Data::Mailbox { .. } | Data::Tcp(_) | Data::Mux(_) => MAILBOX_LANES,
            _ => 1,
        }
    }

    /// Sends a data message without waiting for its reply; returns the ticket to receive the
    /// reply with. At most [`Link::depth`] messages may be awaiting their replies.
    pub fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        let ticket = self.seq + 1;
        match &mut self.data {
            Data::None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "data path not attached",
                ));
            }
            Data::Mailbox { mapped, slot } => {
                let region = mapped.region();
                lane(region, *slot, ticket)?.post_request(req, ticket);
                Doorbells::new(region.doorbell_words()).ring(*slot);
                mapped.wake_server();
            }
            Data::Tcp(t) => t.send(ticket, req)?,
            Data::Mux(m) => m.send(ticket, req)?,
            #[cfg(feature = "rdma")]
            Data::Rdma(d) => super::rdma::send(&mut d.qp, req)?,
        }
        self.seq = ticket;
        Ok(ticket)
    }

    /// [`Link::send_data`] for a caller that does not wait for the reply now (a future): over
    /// a shared connection the request leaves with the next burst's write (see `mux`);
    /// elsewhere at once.
    pub fn send_data_deferred(&mut self, req: &[u8]) -> io::Result<u64> {
        let Data::Mux(m) = &self.data else {
            return self.send_data(req);
        };
        let ticket = self.seq + 1;
        m.send_deferred(ticket, req)?;
        self.seq = ticket;
        Ok(ticket)
    }

    /// Hands every event the server sent this client and the client has not seen yet to
    /// `sink`, without waiting: over shared memory from the slot's ring in the region, over a
    /// stream from what the connection's reader filed (its own connection is read here, one
    /// quick look), over RDMA from what was taken off the queue pair (and what has arrived).
    pub fn poll_events(
        &mut self,
        sink: &mut dyn FnMut(dlock_core::proto::Event),
    ) -> io::Result<()> {
        match &mut self.data {
            Data::Mailbox { mapped, slot } => {
                if let Some(ring) = mapped.region().client_event_ring(*slot) {
                    self.ring.drain(&ring, sink);
                }
                Ok(())
            }
            Data::Tcp(t) => t.poll_events(sink),
            Data::Mux(m) => {
                m.poll_events(sink);
                Ok(())
            }
            #[cfg(feature = "rdma")]
            Data::Rdma(d) => super::rdma::poll_events(d, sink),
            Data::None => Ok(()),
        }
    }

    /// The reply to the message sent under `ticket` if it is already there, without waiting or
    /// reading the clock (over TCP: if it was read already, while waiting for another).
    pub fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        match &mut self.data {
            Data::Mailbox { mapped, slot } => {
                mailbox_reply(lane(mapped.region(), *slot, ticket)?.try_response(ticket, reply))
            }
            Data::Tcp(t) => Ok(t.take_arrived(ticket, reply)),
            Data::Mux(m) => Ok(m.take_arrived(ticket, reply)),
            _ => Ok(None),
        }
    }

    /// Receives the reply to the message sent under `ticket`, waiting until `deadline` (`None`:
    /// forever; a deadline in the past: just look). `Ok(None)` if it has not arrived. Over TCP
    /// replies come in any order and are matched by message id; over RDMA they come in the
    /// order the messages went out, so this is the next reply.
    pub fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        match &mut self.data {
            Data::None => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "data path not attached",
            )),
            Data::Mailbox { mapped, slot } => {
                let mb = lane(mapped.region(), *slot, ticket)?;
                // Look before reading the clock: the reply is often there already.
                mailbox_reply(match mb.try_response(ticket, reply) {
                    Some(n) => Some(n),
                    None if deadline.is_some_and(|d| d <= Instant::now()) => None,
                    None => mb.wait_response(ticket, reply, deadline, self.awake),
                })
            }
            Data::Tcp(t) => t.recv(ticket, reply, deadline),
            Data::Mux(m) => m.recv(ticket, reply, deadline),
            #[cfg(feature = "rdma")]
            Data::Rdma(d) => super::rdma::recv(d, reply, deadline),
        }
    }

    /// The reply to `ticket` if it has arrived; otherwise arranges for `waker` to be woken
    /// when it may have: by whoever reads a shared connection, which wakes exactly then; on
    /// any other path at once (the caller's executor polls again: a shared-memory reply takes
    /// microseconds).
    pub fn poll_recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        waker: &std::task::Waker,
    ) -> io::Result<Option<usize>> {
        if let Data::Mux(m) = &self.data {
            return m.poll_recv(ticket, reply, waker);
        }
        let now = Instant::now();
        let got = self.recv_data(ticket, reply, Some(now))?;
        if got.is_none() {
            waker.wake_by_ref();
        }
        Ok(got)
    }

    /// One data round trip.
    pub fn data(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let ticket = self.send_data(req)?;
        self.recv_data(ticket, reply, deadline)?
            .ok_or_else(|| io::ErrorKind::TimedOut.into())
    }
}

/// The lane of client `slot`'s mailboxes that carries the message sent under `ticket`.
fn lane(region: &Region, slot: u32, ticket: u64) -> io::Result<&Mailbox> {
    let lanes = region
        .client_mailboxes(slot)
        .ok_or_else(|| io::Error::other("mailbox slot out of range"))?;
    Ok(&lanes[ticket as usize % lanes.len()])
}

/// A mailbox reply's length as the link reports it: an empty reply means the server could not
/// read the request.
fn mailbox_reply(len: Option<usize>) -> io::Result<Option<usize>> {
    match len {
        Some(0) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "request refused as malformed",
        )),
        other => Ok(other),
    }
}
