//! The client end: a blocking TLS connection over a `std::net::TcpStream`.
//!
//! With TLS 1.3 the client finishes its handshake *before* the server has judged the client's
//! certificate: the server's verdict comes one flight later. So that a refusal surfaces at
//! connect time rather than on the first request, [`connect_client`] waits for that flight: a
//! dlock server that accepted the client sends one session ticket (which the client discards;
//! see `TicketsAsVerdict` in the parent module), a server that refused it sends its alert. No
//! guessed timeout is involved; the cost is ~200 bytes per connection.

use std::io;
use std::net::TcpStream;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use rustls::{AlertDescription, ClientConfig, ClientConnection, Error, StreamOwned};

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
    while conn.is_handshaking() {
        conn.complete_io(&mut sock).map_err(client_io_error)?;
    }
    // Wait for the server's verdict; see the module docs. rustls processes whole records only,
    // so a counted ticket is a whole ticket.
    while conn.tls13_tickets_received() == 0 {
        let n = conn.read_tls(&mut sock).map_err(client_io_error)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "TLS: the server closed the connection right after the handshake",
            ));
        }
        if let Err(e) = conn.process_new_packets() {
            // Best effort: tell the server why, then report it.
            let _ = conn.write_tls(&mut sock);
            return Err(client_io_error(io::Error::new(
                io::ErrorKind::InvalidData,
                e,
            )));
        }
    }
    Ok(StreamOwned::new(conn, sock))
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
        Error::AlertReceived(alert) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("TLS handshake refused by server: {}", alert_text(*alert)),
        ),
        Error::InvalidCertificate(e) => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("TLS: server certificate rejected: {e}"),
        ),
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
        AlertDescription::CertificateExpired => "client certificate expired",
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
