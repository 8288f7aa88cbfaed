//! The client end: a blocking TLS connection over a `std::net::TcpStream`.
//!
//! With TLS 1.3 the client finishes its handshake *before* the server has judged the client's
//! certificate: the server's verdict comes one flight later. So that a refusal surfaces at
//! connect time rather than on the first request, [`connect_client`] waits for that flight: a
//! dlock server that accepted the client sends one session ticket (which the client discards;
//! see `TicketsAsVerdict` in the parent module), a server that refused it sends its alert. No
//! guessed timeout is involved; the cost is ~200 bytes per connection.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{
    AlertDescription, CertificateError, ClientConfig, ClientConnection, Error, StreamOwned,
};

/// Why a TLS connection to a dlock server failed, as the client can tell: the inner error of
/// the [`io::Error`] that [`connect_client`] (and a client call that failed because of it)
/// returns, so a caller can match on it (`dlock_transport::client::Error::tls_failure`) and a
/// person reads it (`dlock stat` prints it).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server refused this client during the handshake (its certificate, its TLS version
    /// or suites); the alert the server sent says why.
    RefusedByServer(AlertDescription),
    /// The server's certificate does not chain to a CA in this client's CA bundle.
    ServerNotTrusted,
    /// The server's certificate is not valid for the name this client expects (`expected`:
    /// `TlsConfig::server_name`, or the address's IP).
    ServerNameMismatch {
        /// The name the client checked for.
        expected: String,
    },
    /// The server's certificate is unusable for another reason (expired, not yet valid,
    /// revoked, a bad signature, not for server authentication).
    ServerCertificate(CertificateError),
    /// The server speaks TLS and this client plaintext (the client has no TLS settings).
    ServerSpeaksTls,
    /// The server speaks plaintext and this client TLS.
    ServerSpeaksPlaintext,
}

impl TlsFailure {
    /// The error kind of the [`io::Error`] carrying it: refusals are `PermissionDenied`, a
    /// protocol mismatch `InvalidData`.
    fn io_kind(&self) -> io::ErrorKind {
        match self {
            Self::ServerSpeaksTls | Self::ServerSpeaksPlaintext => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::PermissionDenied,
        }
    }

    /// As an [`io::Error`] whose inner error is this failure.
    pub(crate) fn into_io(self) -> io::Error {
        io::Error::new(self.io_kind(), self)
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RefusedByServer(alert) => {
                write!(f, "TLS handshake refused by server: {}", alert_text(*alert))
            }
            Self::ServerNotTrusted => f.write_str(
                "server certificate not trusted: it is not signed by a CA in this client's CA \
                 bundle",
            ),
            Self::ServerNameMismatch { expected } => write!(
                f,
                "server name mismatch: the server's certificate is not valid for {expected:?}"
            ),
            Self::ServerCertificate(e) => write!(f, "server certificate rejected: {e}"),
            Self::ServerSpeaksTls => f.write_str(
                "server speaks TLS, client plaintext: give the client a certificate, key and CA",
            ),
            Self::ServerSpeaksPlaintext => f.write_str(
                "server speaks plaintext, client TLS: connect without TLS settings (on a \
                 loopback or trusted network), or configure TLS on the server",
            ),
        }
    }
}

impl std::error::Error for TlsFailure {}

/// What a rustls error seen by this client during a handshake with a server expected to carry
/// `server_name` means; `None` for errors that are none of [`TlsFailure`]'s cases.
fn classify(error: &Error, server_name: &str) -> Option<TlsFailure> {
    Some(match error {
        Error::AlertReceived(alert) => TlsFailure::RefusedByServer(*alert),
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => TlsFailure::ServerNotTrusted,
        Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => TlsFailure::ServerNameMismatch {
            expected: server_name.to_owned(),
        },
        Error::InvalidCertificate(e) => TlsFailure::ServerCertificate(e.clone()),
        _ => return None,
    })
}

/// The socket as the client's handshake reads it, remembering the server's first byte: a
/// server that answers a ClientHello with bytes no TLS record starts with does not speak TLS
/// (a plaintext dlock server says so in words, `runtime/control.rs`).
struct FirstByte<'a> {
    sock: &'a mut TcpStream,
    first: Option<u8>,
}

impl FirstByte<'_> {
    /// Whether the server's first byte was no TLS record's content type (change_cipher_spec,
    /// alert, handshake, application_data, heartbeat: 20..=24).
    fn not_tls(&self) -> bool {
        self.first.is_some_and(|b| !(20..=24).contains(&b))
    }
}

impl Read for FirstByte<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        if n > 0 && self.first.is_none() {
            self.first = Some(buf[0]);
        }
        Ok(n)
    }
}

impl Write for FirstByte<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.write(buf)
    }
    // rustls writes its queued records with one vectored write, and sends the alert that tells
    // the server why we refused it with one attempt: the default (first buffer only) would
    // leave the alert behind a record queued before it.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.sock.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

/// Connects TLS over `sock` and completes the handshake, including the server's verdict on
/// this client's certificate, before returning. Meant for a dlock server (configured by
/// [`super::server_config`]): another TLS 1.3 server that sends no ticket leaves this waiting
/// until the read timeout.
///
/// Blocking; every read honors the socket's read timeout (a timeout gives `TimedOut`). A
/// refusal by the server gives `PermissionDenied` with the server's reason, e.g. "TLS handshake
/// refused by server: certificate unknown"; a server certificate this client does not trust
/// gives `PermissionDenied` too. `server_name` is the DNS name or IP address the server's
/// certificate must carry.
pub fn connect_client(
    mut sock: TcpStream,
    config: Arc<ClientConfig>,
    server_name: &str,
) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TLS: bad server name {server_name:?}: {e}"),
        )
    })?;
    let mut conn = ClientConnection::new(config, name)
        .map_err(|e| io::Error::other(format!("TLS: cannot start a connection: {e}")))?;
    let mut wire = FirstByte {
        sock: &mut sock,
        first: None,
    };
    handshake(&mut conn, &mut wire).map_err(|e| {
        if wire.not_tls() {
            return TlsFailure::ServerSpeaksPlaintext.into_io();
        }
        let failure = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Error>())
            .and_then(|tls| classify(tls, server_name));
        match failure {
            Some(failure) => failure.into_io(),
            None => client_io_error(e),
        }
    })?;
    Ok(StreamOwned::new(conn, sock))
}

/// The handshake and the server's verdict on this client (see the module docs).
fn handshake(conn: &mut ClientConnection, wire: &mut FirstByte<'_>) -> io::Result<()> {
    while conn.is_handshaking() {
        conn.complete_io(wire)?;
    }
    // rustls processes whole records only, so a counted ticket is a whole ticket.
    while conn.tls13_tickets_received() == 0 {
        let n = conn.read_tls(wire)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "TLS: the server closed the connection right after the handshake",
            ));
        }
        if let Err(e) = conn.process_new_packets() {
            // Best effort: tell the server why, then report it.
            let _ = conn.write_tls(wire);
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }
    Ok(())
}

/// Rewrites an I/O error from a client TLS connection (from [`connect_client`] or a read on
/// its stream) into one whose kind and message say what happened. Other errors pass through.
pub fn client_io_error(error: io::Error) -> io::Error {
    if matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    ) {
        return io::Error::new(io::ErrorKind::TimedOut, format!("TLS: timed out ({error})"));
    }
    let Some(tls) = error.get_ref().and_then(|e| e.downcast_ref::<Error>()) else {
        return error;
    };
    match tls {
        Error::AlertReceived(alert) => TlsFailure::RefusedByServer(*alert).into_io(),
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            TlsFailure::ServerNotTrusted.into_io()
        }
        Error::InvalidCertificate(e) => TlsFailure::ServerCertificate(e.clone()).into_io(),
        other => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("TLS handshake failed: {other}"),
        ),
    }
}

/// What the alerts a dlock server sends mean, in words.
fn alert_text(alert: AlertDescription) -> String {
    let text = match alert {
        AlertDescription::CertificateUnknown => "certificate unknown",
        AlertDescription::UnknownCA => "client certificate not signed by a trusted CA",
        // The one alert TLS has for both (RFC 8446: "has expired or is not currently valid");
        // the server's counters and log say which.
        AlertDescription::CertificateExpired => "client certificate expired or not yet valid",
        AlertDescription::CertificateRevoked => "client certificate revoked",
        AlertDescription::CertificateRequired => "a client certificate is required",
        AlertDescription::BadCertificate => "bad client certificate",
        AlertDescription::UnsupportedCertificate => "unsupported client certificate",
        AlertDescription::ProtocolVersion => "protocol version not supported (TLS 1.3 required)",
        AlertDescription::HandshakeFailure => {
            "handshake failure (no common cipher suite or key exchange)"
        }
        AlertDescription::InsufficientSecurity => "insufficient security",
        AlertDescription::DecryptError => "decrypt error",
        AlertDescription::DecodeError => "decode error",
        AlertDescription::IllegalParameter => "illegal parameter",
        other => return format!("{other:?}"),
    };
    text.to_owned()
}

/// What a client needs to reach a dlock server over TLS: the configuration (its certificate,
/// the CA it trusts, the suites) and the name the server's certificate must carry. Built once;
/// cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: String,
}

impl ClientTls {
    /// Reads `cfg`'s files (the key once, wiped after) for a server at `addr`: its certificate
    /// must carry `cfg.server_name`, or else `addr`'s IP address.
    pub fn new(cfg: &super::TlsConfig, addr: std::net::SocketAddr) -> io::Result<Self> {
        Ok(Self {
            config: super::client_config(cfg)?,
            server_name: cfg
                .server_name
                .clone()
                .unwrap_or_else(|| addr.ip().to_string()),
        })
    }

    /// Connects TLS over `sock` (see [`connect_client`]).
    pub fn connect(&self, sock: TcpStream) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
        connect_client(sock, Arc::clone(&self.config), &self.server_name)
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}
