//! The shared connection's socket, in plaintext or under TLS: whole writes, and reads of what
//! has arrived, waiting until a deadline or not at all ([`Pipe`]). It knows nothing of who reads
//! or why ([`super::hub`] decides that).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::hub::{Pipe, Wait};
use crate::client::wire::Wire;

/// TLS records read at once (rustls's default limit on received plaintext).
#[cfg(feature = "tls")]
const RAW_READ: usize = 16 * 1024;

/// How far past a read's deadline the socket's receive timeout may reach before it is set
/// again: setting it is a system call, and a reader reads many times within a deadline.
const TIMEOUT_SLACK: Duration = Duration::from_millis(1);

/// The connection.
#[derive(Debug)]
pub(super) struct TcpPipe {
    sock: TcpStream,
    #[cfg(feature = "tls")]
    tls: Option<Mutex<rustls::ClientConnection>>,
    /// The read side's own state: only the reader reads, so this lock is never contended.
    read_side: Mutex<ReadSide>,
}

#[derive(Debug)]
struct ReadSide {
    /// TLS records as read off the socket (unused in plaintext).
    raw: Vec<u8>,
    /// The socket's receive timeout as last set (`None`: blocks until data).
    timeout: Option<Duration>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TcpPipe {
    /// Takes over an attached connection.
    pub(super) fn new(wire: Wire) -> io::Result<Self> {
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
        // Room for a raw read of TLS records; a plaintext connection reads straight into the
        // hub's buffer.
        #[cfg(feature = "tls")]
        let raw = if tls.is_some() {
            vec![0; RAW_READ]
        } else {
            Vec::new()
        };
        #[cfg(not(feature = "tls"))]
        let raw = Vec::new();
        Ok(Self {
            sock,
            #[cfg(feature = "tls")]
            tls,
            read_side: Mutex::new(ReadSide { raw, timeout: None }),
        })
    }

    /// Whether the connection is under TLS (never without the `tls` feature).
    fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Reads off the socket: what is there (`Look`), or waiting as the socket's receive
    /// timeout allows (set by [`TcpPipe::set_timeout`]).
    fn recv(&self, buf: &mut [u8], wait: Wait) -> io::Result<usize> {
        if wait != Wait::Look {
            return (&self.sock).read(buf);
        }
        crate::client::wire::recv_dontwait(&self.sock, buf)
    }

    /// Makes a blocking read return by `deadline` (within [`TIMEOUT_SLACK`]), setting the
    /// socket's receive timeout only when the one set last would overshoot or cut it short.
    fn set_timeout(&self, side: &mut ReadSide, deadline: Option<Instant>) -> io::Result<()> {
        let want = deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_micros(1))
        });
        let keep = match (side.timeout, want) {
            (None, None) => true,
            (Some(set), Some(want)) => set <= want + TIMEOUT_SLACK && set >= want / 2,
            _ => false,
        };
        if !keep {
            self.sock.set_read_timeout(want)?;
            side.timeout = want;
        }
        Ok(())
    }

    /// Without the `tls` feature there is no TLS session (`is_tls` is false, so `read` never
    /// calls this): the answer for a connection without one.
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
            // Nothing whole yet: not an end (the reader reads on).
            (0, false) => Err(io::ErrorKind::WouldBlock.into()),
            _ => Ok(n),
        }
    }
}

impl Pipe for TcpPipe {
    fn read(&self, out: &mut [u8], wait: Wait) -> io::Result<usize> {
        let mut side = lock(&self.read_side);
        if let Wait::Until(deadline) = wait {
            self.set_timeout(&mut side, deadline)?;
        }
        if !self.is_tls() {
            return self.recv(out, wait);
        }
        let ReadSide { raw, .. } = &mut *side;
        match self.recv(raw, wait)? {
            0 => Ok(0),
            n => self.decrypt(&raw[..n], out),
        }
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

    fn shutdown(&self) {
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}
