//! A TCP connection to the server, in plaintext or under TLS 1.3 (feature `tls`), and a
//! client's own TCP data connection over one: opening it, binding it to a registration, and
//! reading whole replies off it, each filed under the message it answers.
//!
//! Without the `tls` feature a connection is plaintext only and none of the TLS code is built;
//! a server that answers in TLS records is then reported in words (`server_speaks_tls`).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use dlock_core::Session;
use dlock_core::proto::{
    ATTACH_MAGIC, Attach, DATA_HEADER_LEN, DATA_RESPONSE_WITH_VALUES_MAX, DecodeError,
    is_event_message, peek_data_header, peek_data_response_header,
};

use super::awaited::AwaitTable;

/// A remote endpoint's TLS settings. Without the `tls` feature no endpoint has any: the type
/// then has no values, so the code that would use one is unreachable and compiled away.
#[cfg(feature = "tls")]
pub(crate) type ClientTls = crate::tls::ClientTls;
/// A remote endpoint's TLS settings: none without the `tls` feature (the type has no values).
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
pub(crate) enum ClientTls {}

/// How long opening a TCP connection (its TLS handshake and its attach included) may take when
/// the caller configured no timeout of its own (the reference's 5 s, as `REQUEST_TIMEOUT`).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A TCP connection to the server, in plaintext or under TLS.
#[derive(Debug)]
pub(crate) enum Wire {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Wire {
    /// Connects to `addr` (and completes the TLS handshake, server's verdict included) by
    /// `deadline`; `TimedOut` once it has passed.
    pub(super) fn open(
        addr: SocketAddr,
        tls: Option<&ClientTls>,
        deadline: Instant,
    ) -> io::Result<Wire> {
        let s = TcpStream::connect_timeout(&addr, time_left(deadline)?)?;
        s.set_nodelay(true)?;
        match tls {
            None => Ok(Wire::Plain(s)),
            #[cfg(feature = "tls")]
            Some(tls) => {
                s.set_read_timeout(Some(time_left(deadline)?))?;
                Ok(Wire::Tls(Box::new(tls.connect(s)?)))
            }
            #[cfg(not(feature = "tls"))]
            Some(no_tls) => match *no_tls {},
        }
    }

    pub(super) fn socket(&self) -> &TcpStream {
        match self {
            Wire::Plain(s) => s,
            #[cfg(feature = "tls")]
            Wire::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Wire::Tls(s) => s.read(buf).map_err(crate::tls::client_io_error),
        }
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Wire::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Wire::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Wire::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Wire::Tls(s) => s.flush(),
        }
    }
}

/// What a client without TLS settings reads when the server answers in TLS records: under the
/// `tls` feature the [`TlsFailure`](crate::tls::TlsFailure) callers match on, without it the
/// same words.
pub(super) fn server_speaks_tls() -> io::Error {
    #[cfg(feature = "tls")]
    return crate::tls::TlsFailure::ServerSpeaksTls.into_io();
    #[cfg(not(feature = "tls"))]
    io::Error::new(
        io::ErrorKind::InvalidData,
        "server speaks TLS, client plaintext: this client is built without TLS (feature `tls`)",
    )
}

/// What is left until `deadline`: `TimedOut` once none is (a zero timeout means "none" to the
/// socket calls, which would then wait forever or refuse it).
pub(crate) fn time_left(deadline: Instant) -> io::Result<Duration> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(left) if !left.is_zero() => Ok(left),
        _ => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Opens a TCP data connection to `addr` and binds it to `client` with its session secret, the
/// server's verdict read by `deadline`.
pub(crate) fn attach_tcp(
    addr: SocketAddr,
    tls: Option<&ClientTls>,
    client: u32,
    session: Session,
    deadline: Instant,
) -> io::Result<Wire> {
    let mut s = Wire::open(addr, tls, deadline)?;
    let hello = Attach {
        magic: ATTACH_MAGIC,
        client,
        session,
    };
    s.write_all(&hello.encode())?;
    let mut status = [0u8; 4];
    s.socket().set_read_timeout(Some(time_left(deadline)?))?;
    s.read_exact(&mut status)?;
    if u32::from_le_bytes(status) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "data channel refused",
        ));
    }
    Ok(s)
}

/// A TCP data connection and the replies awaited on it ([`AwaitTable`]); a reply nobody
/// awaits any more (its caller timed out) is dropped.
#[derive(Debug)]
pub(super) struct TcpData {
    wire: Wire,
    /// Bytes of a reply read before a deadline cut the read short.
    partial: Vec<u8>,
    awaited: AwaitTable,
    /// Event messages read meanwhile (`events.rs`).
    events: super::events::EventQueue,
}

impl TcpData {
    pub(super) fn new(wire: Wire) -> Box<Self> {
        Box::new(Self {
            wire,
            partial: Vec::with_capacity(DATA_RESPONSE_WITH_VALUES_MAX),
            awaited: AwaitTable::new(),
            events: super::events::EventQueue::default(),
        })
    }

    /// Files the whole message in `partial` (`len` bytes): an event message in the event
    /// queue, a reply under the message that awaits it.
    fn file(&mut self, len: usize) {
        match peek_data_response_header(&self.partial) {
            Ok((h, _)) if is_event_message(&h) => self.events.file_message(&self.partial[..len]),
            Ok((h, _)) => {
                self.awaited.file(h.message_id, &self.partial[..len]);
            }
            Err(_) => {}
        }
        self.partial.clear();
    }

    /// Reads what has arrived, without waiting, and hands the events among it to `sink`.
    pub(super) fn poll_events(
        &mut self,
        sink: &mut dyn FnMut(dlock_core::proto::Event),
    ) -> io::Result<()> {
        // A deadline already passed: `recv_tcp` takes one quick look.
        while let Some(len) = recv_tcp(&mut self.wire, &mut self.partial, Some(Instant::now()))? {
            self.file(len);
        }
        self.events.drain(sink);
        Ok(())
    }

    /// Sends `req` (a data message) as `ticket`.
    pub(super) fn send(&mut self, ticket: u64, req: &[u8]) -> io::Result<()> {
        let (header, _) = peek_data_header(req)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a data message"))?;
        self.wire.write_all(req)?;
        self.awaited.expect(ticket, header.message_id);
        Ok(())
    }

    /// The reply to `ticket` if it has been read already (the entry is freed).
    pub(super) fn take_arrived(&mut self, ticket: u64, reply: &mut [u8]) -> Option<usize> {
        self.awaited.take(ticket, reply)
    }

    /// Reads replies until the one to `ticket` arrives or `deadline` passes, filing the others
    /// under the messages that await them.
    pub(super) fn recv(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        loop {
            if let Some(n) = self.awaited.take(ticket, reply) {
                return Ok(Some(n));
            }
            if !self.awaited.awaits(ticket) {
                return Err(io::Error::other(
                    "no data message awaits a reply under this ticket",
                ));
            }
            let Some(len) = recv_tcp(&mut self.wire, &mut self.partial, deadline)? else {
                return Ok(None);
            };
            self.file(len);
        }
    }
}

/// One read that does not wait, whatever the socket's mode. A plaintext socket takes it as one
/// `recv(MSG_DONTWAIT)`: a cached lock's every local acquisition looks at its connection for
/// revokes this way, and toggling the socket non-blocking around a read cost three system calls
/// where one does. A TLS stream may hold decrypted bytes the socket no longer shows, so it is
/// read through rustls with the socket non-blocking for that read.
fn read_now(s: &mut Wire, buf: &mut [u8]) -> io::Result<usize> {
    match s {
        Wire::Plain(tcp) => recv_dontwait(tcp, buf),
        #[cfg(feature = "tls")]
        Wire::Tls(_) => {
            s.socket().set_nonblocking(true)?;
            let read = s.read(buf);
            s.socket().set_nonblocking(false)?;
            read
        }
    }
}

/// One `recv(MSG_DONTWAIT)` off `sock`: what is there, without waiting and without changing
/// the socket's mode (which a reader blocked on it in another call could observe).
pub(crate) fn recv_dontwait(sock: &std::net::TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call (it is borrowed
    // mutably), which is all recv(2) writes; the descriptor is `sock`'s own, open while `sock`
    // is borrowed here.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Reads one data message off `s` into `partial` (which may hold its start already), keeping
/// what arrived there if the deadline cuts in; returns its length once whole.
fn recv_tcp(
    s: &mut Wire,
    partial: &mut Vec<u8>,
    deadline: Option<Instant>,
) -> io::Result<Option<usize>> {
    loop {
        let want = match peek_data_response_header(partial) {
            Ok((_, len)) => len,
            Err(DecodeError::Truncated) => DATA_HEADER_LEN,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad data reply header",
                ));
            }
        };
        if partial.len() >= want && want > DATA_HEADER_LEN {
            return Ok(Some(want));
        }
        // A deadline already passed still gets one quick look, and a quick look must not
        // block: the kernel rounds a receive timeout up to a whole scheduler tick (1 to 10 ms),
        // so the 1 µs timeout this took before made every `poll_events` over TCP wait that long
        // on an idle connection — a cached holder answered each revoke milliseconds late.
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let mut buf = [0u8; DATA_RESPONSE_WITH_VALUES_MAX];
        let buf = &mut buf[..want - partial.len()];
        let read = if left == Some(Duration::ZERO) {
            read_now(s, buf)
        } else {
            s.socket().set_read_timeout(left)?;
            s.read(buf)
        };
        match read {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => partial.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if deadline.is_some_and(|d| d <= Instant::now()) {
                    return Ok(None);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
