//! A server-side connection's byte stream: plain TCP, TCP under TLS (the session travels with
//! the socket), or a Unix socket. The control thread reads and writes it until a TCP data
//! connection is attached; the data thread owns it from then on (`runtime/tcp.rs`).

use std::io::{self, Read, Write};

use mio::net::{TcpStream, UnixStream};

use crate::tls::{HandshakeRefusal, ServerTls};

#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    /// A TCP connection under TLS: the session is ours, the socket stays the event loop's.
    Tls(TcpStream, Box<ServerTls>),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) | Stream::Tls(s, _) => s,
            Stream::Unix(s) => s,
        }
    }
    /// Plaintext from the peer; `WouldBlock` once drained.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s, tls) => tls.read_plain(s, buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
    /// Takes plaintext for the peer: written at once, or (TLS) sealed into records that
    /// [`Stream::flush_records`] sends.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s, tls) => match tls.write_plain(buf)? {
                // rustls' buffer is full: the socket must drain first. If it took everything,
                // there is room again now (and no writable edge would come to say so).
                0 if tls.flush(s)? => tls.write_plain(buf),
                0 => Err(io::ErrorKind::WouldBlock.into()),
                n => Ok(n),
            },
            Stream::Unix(s) => s.write(buf),
        }
    }
    /// Sends queued TLS records (replies, handshake messages, alerts) as far as the socket
    /// takes them.
    pub(crate) fn flush_records(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(s, tls) => tls.flush(s).map(drop),
            Stream::Tcp(_) | Stream::Unix(_) => Ok(()),
        }
    }
    /// Whether a read that returned less than asked for has drained the socket. True for a
    /// plain socket: with edge-triggered readiness, bytes arriving after such a read raise a
    /// new edge, so the `WouldBlock` read that would confirm it can be skipped (a syscall per
    /// message saved). Not under TLS, whose reads stop at record boundaries.
    pub(crate) fn short_read_drains(&self) -> bool {
        !matches!(self, Stream::Tls(..))
    }
    /// Whether a TLS handshake is still under way (its steps are the control thread's costly
    /// work, rationed per turn: `runtime/handshakes.rs`).
    pub(crate) fn is_handshaking(&self) -> bool {
        matches!(self, Stream::Tls(_, tls) if tls.is_handshaking())
    }
    /// Whether TLS records wait for the socket to take them.
    pub(crate) fn wants_write(&self) -> bool {
        matches!(self, Stream::Tls(_, tls) if tls.wants_write())
    }
    /// Why a TLS handshake was refused, once a read failed.
    pub(crate) fn refusal(&self) -> Option<HandshakeRefusal> {
        match self {
            Stream::Tls(_, tls) => tls.refusal(),
            Stream::Tcp(_) | Stream::Unix(_) => None,
        }
    }
}
