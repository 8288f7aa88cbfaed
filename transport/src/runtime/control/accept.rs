//! Taking connections in: the listening sockets, bound before the threads start so errors
//! reach the caller, and the accepts of each turn, which make room at the connection cap by
//! closing the oldest connection that holds a place without a registration.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use dlock_core::Peer;
use dlock_core::proto::CONTROL_FRAME_MAX;
use dlock_core::server::Counter;
use mio::net::{TcpListener, UnixListener};
use mio::{Interest, Token};

use super::{Conn, Control, FIRST_CONN, Role};
use crate::runtime::ServerConfig;
use crate::runtime::fds::{FdReserve, out_of_fds};
use crate::runtime::handshakes::ACCEPTS_PER_TURN;
use crate::runtime::peer::Peers;
use crate::runtime::stream::Stream;
use crate::tls::ServerTls;

/// The bound listening sockets, created before the threads start so errors reach the caller.
#[derive(Debug)]
pub(in crate::runtime) struct Listeners {
    pub(super) tcp: Option<TcpListener>,
    pub(super) unix: UnixListener,
    unix_path: PathBuf,
    tcp_cfg: Option<crate::runtime::TcpConfig>,
    /// TLS for every accepted TCP connection, built (and its key read) once at start.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Spent to refuse a connection when the process is out of descriptors.
    reserve: FdReserve,
}

impl Listeners {
    pub(in crate::runtime) fn bind(cfg: &ServerConfig) -> io::Result<Self> {
        let tcp = match &cfg.tcp {
            Some(t) => Some(bind_tcp(t.listen)?),
            None => None,
        };
        let unix_path = cfg.unix_socket.clone().unwrap_or_else(|| {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::env::temp_dir().join(format!("dlock-{}-{n}.sock", std::process::id()))
        });
        let _ = std::fs::remove_file(&unix_path);
        let unix = bind_unix(&unix_path, cfg.file_mode())?;
        Ok(Self {
            tcp,
            unix,
            unix_path,
            tcp_cfg: cfg.tcp.clone(),
            tls: match cfg.tcp.as_ref().and_then(|t| t.tls.as_ref()) {
                Some(tls) => Some(crate::tls::server_config(tls)?),
                None => None,
            },
            reserve: FdReserve::new()?,
        })
    }

    pub(in crate::runtime) fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub(in crate::runtime) fn unix_path(&self) -> &Path {
        &self.unix_path
    }
}

/// Binds the Unix socket with permission bits `mode`, set before it listens: until then a
/// connect is refused, so nobody the mode shuts out is ever let in.
fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let s = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    s.bind(&socket2::SockAddr::unix(path)?)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    let fd = std::os::fd::OwnedFd::from(s);
    Ok(UnixListener::from_std(fd.into()))
}

/// Binds with `SO_REUSEADDR` (a restarted server gets its port back at once) and, for IPv6,
/// dual-stack off so `[::]` and `0.0.0.0` can be served by two servers.
fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(TcpListener::from_std(s.into()))
}

impl Control<'_> {
    /// Accepts up to [`ACCEPTS_PER_TURN`] TCP connections; true if more may be waiting.
    pub(super) fn accept_tcp(&mut self, l: &mut Listeners) -> bool {
        let Some(listener) = &l.tcp else {
            return false;
        };
        for _ in 0..ACCEPTS_PER_TURN {
            match listener.accept() {
                Ok((s, peer)) => {
                    if let Some(t) = &l.tcp_cfg {
                        let sock = socket2::SockRef::from(&s);
                        let ka = socket2::TcpKeepalive::new()
                            .with_time(t.keepalive_idle)
                            .with_interval(t.keepalive_interval)
                            .with_retries(t.keepalive_probes);
                        if let Err(e) = sock
                            .set_tcp_keepalive(&ka)
                            .and_then(|()| sock.set_tcp_nodelay(true))
                        {
                            tracing::warn!(%peer, error = %e, "cannot set socket options");
                        }
                    }
                    let stream = match &l.tls {
                        None => Stream::Tcp(s),
                        Some(tls) => match ServerTls::new(Arc::clone(tls)) {
                            Ok(session) => Stream::Tls(s, Box::new(session)),
                            Err(e) => {
                                tracing::warn!(%peer, error = %e, "cannot start TLS");
                                continue;
                            }
                        },
                    };
                    self.admit(stream, Some(peer.ip()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if out_of_fds(&e) => {
                    if !l
                        .reserve
                        .refuse(Instant::now(), || listener.accept().map(drop))
                    {
                        return false;
                    }
                    self.shared.counters.bump(Counter::ConnectionsRefused);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return false;
                }
            }
        }
        true
    }

    /// Accepts up to [`ACCEPTS_PER_TURN`] Unix-socket connections; true if more may be waiting.
    pub(super) fn accept_unix(&mut self, l: &mut Listeners) -> bool {
        for _ in 0..ACCEPTS_PER_TURN {
            match l.unix.accept() {
                Ok((s, _)) => self.admit(Stream::Unix(s), None),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if out_of_fds(&e) => {
                    if !l
                        .reserve
                        .refuse(Instant::now(), || l.unix.accept().map(drop))
                    {
                        return false;
                    }
                    self.shared.counters.bump(Counter::ConnectionsRefused);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return false;
                }
            }
        }
        true
    }

    /// Takes a new connection in, making room by closing the oldest unregistered one when at
    /// the cap (as the reference closes an "empty" socket), or refusing it when none is.
    fn admit(&mut self, mut stream: Stream, ip: Option<IpAddr>) {
        let stream_kind = match &stream {
            Stream::Tcp(_) => StreamKind::Tcp,
            Stream::Tls(..) => StreamKind::Tls,
            Stream::Unix(_) => StreamKind::Unix,
        };
        if self.open() >= self.cfg.connections_max {
            let oldest = self
                .conns
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    c.as_ref()
                        .filter(|c| c.bound_client().is_none())
                        .map(|c| (c.gone.unwrap_or(c.opened), i))
                })
                .min();
            match oldest {
                Some((_, i)) => {
                    self.close(i);
                    self.shared.counters.bump(Counter::ConnectionsEvicted);
                }
                None => {
                    self.shared.counters.bump(Counter::ConnectionsRefused);
                    return; // dropping `stream` refuses it
                }
            }
        }
        let i = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.generations.push(0);
            self.conns.len() - 1
        });
        self.generations[i] = self.generations[i].wrapping_add(1);
        if let Err(e) = self.poll.registry().register(
            stream.source(),
            Token(i + FIRST_CONN),
            Interest::READABLE,
        ) {
            tracing::warn!(error = %e, "cannot register a connection");
            self.free.push(i);
            return;
        }
        self.conns[i] = Some(Conn {
            stream,
            generation: self.generations[i],
            role: Role::Unknown,
            rbuf: vec![0; CONTROL_FRAME_MAX],
            rlen: 0,
            wbuf: Vec::new(),
            in_flight: false,
            opened: Instant::now(),
            frame_started: None,
            write_blocked: None,
            gone: None,
            writable_interest: false,
            handshake_queued: false,
            peer: match (&stream_kind, ip) {
                (StreamKind::Tcp, Some(ip)) => Some(self.peers.of_address(ip)),
                (StreamKind::Tls, _) => None,
                _ => Some(Peer::EXEMPT),
            },
            recovery: None,
            ip,
        });
    }
}

/// How a connection's kind decides its peer (`Conn::peer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamKind {
    Tcp,
    Tls,
    Unix,
}

/// The peer of a TLS connection, whose handshake is complete (a frame was read): its client
/// certificate's key. Without one (which the server's verifier does not let through), its address.
pub(super) fn identify(stream: &Stream, ip: Option<IpAddr>, peers: &Peers) -> Peer {
    let key = match stream {
        Stream::Tls(_, tls) => tls.peer_key_info(),
        Stream::Tcp(_) | Stream::Unix(_) => None,
    };
    match (key, ip) {
        (Some(spki), _) => peers.of_key(spki.as_ref()),
        (None, Some(ip)) => peers.of_address(ip),
        (None, None) => Peer::EXEMPT,
    }
}
