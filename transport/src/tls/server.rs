//! The server end of one TLS connection, driven by the control thread's event loop.
//!
//! [`ServerTls`] holds rustls' state for one accepted connection and nothing else: every call
//! borrows the socket, so the event loop keeps owning it. The loop calls
//! [`ServerTls::read_plain`] on read readiness until `WouldBlock`, queues replies with
//! [`ServerTls::write_plain`], and calls [`ServerTls::flush`] whenever
//! [`ServerTls::wants_write`] (handshake messages are queued by `read_plain` too).
//!
//! A failed handshake is classified as a [`HandshakeRefusal`] so the server can count each kind
//! and log one clear line; rustls' alert is sent to the peer before the error is returned, so
//! the client sees why it was refused, not just a closed socket.

use std::fmt;
use std::io::{self, Read, Write};
use std::sync::Arc;

use rustls::{CertificateError, Error, PeerIncompatible, ServerConfig, ServerConnection};

/// Why a server refused a TLS handshake: one counter per kind in the server's stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum HandshakeRefusal {
    /// The client presented no certificate.
    NoClientCert,
    /// The client certificate does not chain to the configured CA.
    UnknownCa,
    /// The client certificate (or one in its chain) has expired.
    Expired,
    /// The client certificate (or one in its chain) is not valid yet. TLS sends the same alert
    /// as for an expired one (`certificate_expired`: "expired or not currently valid"), so the
    /// client hears "expired or not yet valid"; the server's counter and log say which.
    NotYetValid,
    /// The client certificate (or one in its chain) is revoked by a configured CRL.
    Revoked,
    /// Any other certificate defect: bad signature or encoding, wrong usage, revocation status
    /// unknown.
    BadCertificate,
    /// The client does not offer TLS 1.3.
    ProtocolVersion,
    /// The client offers none of the configured cipher suites (or key exchange groups).
    NoCommonCipher,
    /// The peer does not speak TLS: its first byte is not a TLS handshake record.
    NotTls,
    /// Anything else (malformed messages, the client refusing the server, …).
    Other,
}

impl HandshakeRefusal {
    /// How many kinds there are: the length of a per-kind counter array.
    pub const COUNT: usize = 10;

    /// Every kind, in `index` order.
    pub const ALL: [Self; Self::COUNT] = [
        Self::NoClientCert,
        Self::UnknownCa,
        Self::Expired,
        Self::NotYetValid,
        Self::Revoked,
        Self::BadCertificate,
        Self::ProtocolVersion,
        Self::NoCommonCipher,
        Self::NotTls,
        Self::Other,
    ];

    /// This kind's slot in a per-kind counter array.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// A short stable name for stats output (`no_client_cert`, `unknown_ca`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::NoClientCert => "no_client_cert",
            Self::UnknownCa => "unknown_ca",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::Revoked => "revoked",
            Self::BadCertificate => "bad_certificate",
            Self::ProtocolVersion => "protocol_version",
            Self::NoCommonCipher => "no_common_cipher",
            Self::NotTls => "not_tls",
            Self::Other => "other",
        }
    }

    /// The kind of a rustls handshake error seen by the server.
    pub fn classify(error: &Error) -> Self {
        match error {
            Error::NoCertificatesPresented => Self::NoClientCert,
            Error::InvalidCertificate(e) => match e {
                CertificateError::UnknownIssuer => Self::UnknownCa,
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    Self::Expired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    Self::NotYetValid
                }
                CertificateError::Revoked => Self::Revoked,
                _ => Self::BadCertificate,
            },
            Error::PeerIncompatible(e) => match e {
                PeerIncompatible::NoCipherSuitesInCommon | PeerIncompatible::NoKxGroupsInCommon => {
                    Self::NoCommonCipher
                }
                PeerIncompatible::ServerDoesNotSupportTls12Or13
                | PeerIncompatible::SupportedVersionsExtensionRequired
                | PeerIncompatible::Tls12NotOffered
                | PeerIncompatible::Tls12NotOfferedOrEnabled => Self::ProtocolVersion,
                _ => Self::Other,
            },
            _ => Self::Other,
        }
    }
}

impl fmt::Display for HandshakeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoClientCert => "the client presented no certificate",
            Self::UnknownCa => "the client certificate is not signed by the configured CA",
            Self::Expired => "the client certificate has expired",
            Self::NotYetValid => "the client certificate is not valid yet",
            Self::Revoked => "the client certificate is revoked",
            Self::BadCertificate => "the client certificate is invalid",
            Self::ProtocolVersion => "the client does not offer TLS 1.3",
            Self::NoCommonCipher => "the client offers none of the configured cipher suites",
            Self::NotTls => "the peer does not speak TLS (plaintext connection?)",
            Self::Other => "the TLS handshake failed",
        })
    }
}

/// The error `read_plain` returns for a refused handshake: the kind, and rustls' detail.
#[derive(Debug)]
struct Refused {
    refusal: HandshakeRefusal,
    detail: Option<Error>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS handshake refused: {}", self.refusal)?;
        match &self.detail {
            Some(detail) => write!(f, " ({detail})"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Refused {}

/// The first byte of every TLS connection: a handshake record (ClientHello).
const CONTENT_TYPE_HANDSHAKE: u8 = 0x16;

/// A plaintext TLS record holding a fatal `unexpected_message` alert: content type alert
/// (21), legacy version TLS 1.2 (as TLS 1.3 writes it), length 2, level fatal (2), description
/// unexpected_message (10).
const NOT_TLS_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a];

/// The server end of one TLS connection over a non-blocking socket it does not own.
#[derive(Debug)]
pub struct ServerTls {
    conn: ServerConnection,
    first_byte: FirstByte,
    refusal: Option<HandshakeRefusal>,
}

impl ServerTls {
    /// A connection waiting for the client's hello.
    pub fn new(config: Arc<ServerConfig>) -> io::Result<Self> {
        let conn = ServerConnection::new(config)
            .map_err(|e| io::Error::other(format!("TLS: cannot start a connection: {e}")))?;
        Ok(Self {
            conn,
            first_byte: FirstByte::Unseen,
            refusal: None,
        })
    }

    /// Reads TLS records from `sock` until it has plaintext for `out`, the socket would block,
    /// or the peer closed.
    ///
    /// Returns the plaintext length (`Ok(0)`: the peer closed), or `WouldBlock` once the socket
    /// is drained, so an edge-triggered loop may call it until then. A refused handshake
    /// returns an error whose message says why (see [`Self::refusal`]) after the alert was
    /// written to `sock`; the connection is then dead and should be closed.
    pub fn read_plain<S: Read + Write>(
        &mut self,
        sock: &mut S,
        out: &mut [u8],
    ) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(out) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // A peer that closed without close_notify is a closed peer for us: dlock frames
                // carry their own lengths, so truncation is detected one layer up.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                other => return other,
            }
            let read = self.conn.read_tls(&mut FirstByteCheck {
                sock: &mut *sock,
                first_byte: &mut self.first_byte,
            });
            let n = match read {
                Ok(n) => n,
                // The peer does not speak TLS: it cannot decrypt anything, but a plaintext alert
                // record is what every TLS server answers it with, and a dlock client reading a
                // reply recognises one ("server speaks TLS, client plaintext").
                Err(_) if self.first_byte == FirstByte::NotTls => {
                    // Best effort: the connection is closed next whatever happens here.
                    let _ = sock.write_all(&NOT_TLS_ALERT);
                    return Err(self.refused(HandshakeRefusal::NotTls, None));
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(0);
            }
            if let Err(e) = self.conn.process_new_packets() {
                return Err(self.fail(sock, e));
            }
        }
    }

    /// Queues plaintext for the peer (encrypted on [`Self::flush`]); during the handshake it
    /// is held until the handshake completes. Returns how much was accepted (rustls' buffer
    /// limit may take less).
    pub fn write_plain(&mut self, data: &[u8]) -> io::Result<usize> {
        self.conn.writer().write(data)
    }

    /// Writes queued TLS records to `sock`; `Ok(true)` when everything is written, `Ok(false)`
    /// when the socket would block first (wait for write readiness and call again).
    pub fn flush<S: Write>(&mut self, sock: &mut S) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether TLS records are waiting to be written.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Whether the handshake is still under way.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Why the handshake was refused, once `read_plain` failed with a refusal.
    pub fn refusal(&self) -> Option<HandshakeRefusal> {
        self.refusal
    }

    /// Who the client is, for logs: its certificate's subject common name, or else its first
    /// DNS subject alternative name. `None` before the handshake completes.
    pub fn peer_identity(&self) -> Option<String> {
        let leaf = self.conn.peer_certificates()?.first()?;
        let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
        common_name(cert.subject())
            .or_else(|| cert.valid_dns_names().next())
            .map(str::to_owned)
    }

    /// The client certificate's public key (its DER SubjectPublicKeyInfo): who the peer is for
    /// the per-peer cap on registrations. `None` before the handshake completes.
    pub fn peer_key_info(&self) -> Option<rustls::pki_types::SubjectPublicKeyInfoDer<'static>> {
        let leaf = self.conn.peer_certificates()?.first()?;
        let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
        Some(cert.subject_public_key_info())
    }

    /// Queues a close_notify alert; [`Self::flush`] then sends it.
    pub fn send_close_notify(&mut self) {
        self.conn.send_close_notify();
    }

    /// Records a failure, sends rustls' alert (best effort: the socket's buffer is empty
    /// during a handshake, so the few bytes fit) and turns it into the error to return.
    #[cold]
    fn fail<S: Write>(&mut self, sock: &mut S, error: Error) -> io::Error {
        // Best effort: the connection is closed next whatever happens here.
        let _ = self.flush(sock);
        if !self.conn.is_handshaking() {
            return io::Error::new(io::ErrorKind::InvalidData, format!("TLS error: {error}"));
        }
        let refusal = HandshakeRefusal::classify(&error);
        self.refused(refusal, Some(error))
    }

    fn refused(&mut self, refusal: HandshakeRefusal, detail: Option<Error>) -> io::Error {
        self.refusal = Some(refusal);
        let kind = match refusal {
            HandshakeRefusal::NotTls | HandshakeRefusal::Other => io::ErrorKind::InvalidData,
            _ => io::ErrorKind::PermissionDenied,
        };
        io::Error::new(kind, Refused { refusal, detail })
    }
}

/// What the peer's first byte said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstByte {
    Unseen,
    Tls,
    NotTls,
}

/// The socket as rustls reads it, checking that the peer's first byte starts a TLS handshake
/// record. rustls alone would wait for a whole 5-byte record header from a plaintext peer
/// that sent less, and then report a vaguer "invalid content type".
struct FirstByteCheck<'a, S> {
    sock: &'a mut S,
    first_byte: &'a mut FirstByte,
}

impl<S: Read> Read for FirstByteCheck<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.sock.read(buf)?;
        if n > 0 && *self.first_byte == FirstByte::Unseen {
            if buf[0] == CONTENT_TYPE_HANDSHAKE {
                *self.first_byte = FirstByte::Tls;
            } else {
                *self.first_byte = FirstByte::NotTls;
                return Err(io::ErrorKind::InvalidData.into());
            }
        }
        Ok(n)
    }
}

/// The first common name (OID 2.5.4.3) in a certificate's subject, the content of an X.501
/// `Name` (a sequence of sets of `{ OID, value }` sequences). For logs only; anything it cannot
/// parse gives `None`.
fn common_name(mut name: &[u8]) -> Option<&str> {
    const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
    while !name.is_empty() {
        let (set, rest) = der_take(name, 0x31)?;
        name = rest;
        let mut set = set;
        while !set.is_empty() {
            let (pair, rest) = der_take(set, 0x30)?;
            set = rest;
            let (oid, value) = der_take(pair, 0x06)?;
            if oid == OID_COMMON_NAME {
                // Any string type: UTF8String, PrintableString, IA5String, …
                let (text, _) = der_take(value, *value.first()?)?;
                return std::str::from_utf8(text).ok();
            }
        }
    }
    None
}

/// Splits one DER element with tag `tag` off `input`: (its content, the rest).
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let (len, rest) = if len0 < 0x80 {
        (usize::from(len0), rest)
    } else {
        let count = usize::from(len0 & 0x7f);
        if count == 0 || count > 2 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[count..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}
