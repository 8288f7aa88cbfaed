//! TLS building blocks for dlock's TCP connections (control and data).
//!
//! This module owns the *policy* and the *per-connection TLS state*: it turns a [`TlsConfig`]
//! (PEM paths, an optional key password callback, cipher suites) into shared rustls
//! configurations ([`server_config`], [`client_config`]), wraps one accepted connection in a
//! non-blocking [`ServerTls`] that the control thread's event loop drives on readiness, and
//! opens a blocking client connection with [`connect_client`].
//!
//! It does **not** own sockets or run an event loop: every call borrows the socket it needs
//! (`S: Read + Write`, a mio `TcpStream` in the server), so the control thread keeps owning all
//! sockets, their registration and their timeouts. Counting refusals and logging them is the
//! caller's, from [`ServerTls::refusal`].
//!
//! # Security choices, and why
//!
//! - **TLS 1.3 only.** 1.3 has no renegotiation, no static-RSA or CBC suites, and encrypts the
//!   certificates; there is no dlock peer that needs 1.2. rustls is built without its `tls12`
//!   feature, so a 1.2-only peer is refused with a `protocol_version` alert.
//! - **`TLS_AES_256_GCM_SHA384` only by default**, as the reference. An operator may choose
//!   `TLS_AES_128_GCM_SHA256` or `TLS_CHACHA20_POLY1305_SHA256` by name ([`Tls13Suite`]); both
//!   ends must then agree, or the handshake fails with a clear "no common cipher" refusal.
//! - **Mutual authentication.** The server requires a client certificate that chains to the
//!   configured CA bundle; the client checks the server's certificate against the same kind of
//!   bundle *and* the server's name. A client is then who its certificate says it is at the
//!   transport level; the session token still decides what it may do (ARCHITECTURE.md, "Trust
//!   model").
//! - **Optional CRLs** (PEM, one or more files) are checked on the peer's whole chain, on both
//!   ends. This fails closed: once CRLs are configured, a certificate whose issuer has no CRL
//!   among them is refused (`UnknownRevocationStatus`), so give one CRL per issuing CA. An
//!   expired CRL is still used (rustls' default): a stale list is better than none.
//! - **No session resumption** (the server's one ticket per connection is never stored, the
//!   client keeps none): every connection is a full handshake, so a certificate revoked or expired since the last connection is
//!   refused at the next one instead of being resumed past the check.
//! - **Private keys are read once and wiped.** The key file's bytes, the decoded DER and any
//!   decrypted PKCS#8 live in `Zeroizing` buffers that are cleared as soon as rustls' signing
//!   key is built; the password from the callback is `Zeroizing` too. (The signing key inside
//!   `ring` is outside our reach; it lives as long as the configuration.)

mod client;
mod pem;
mod server;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::SingleCertAndKey;
use zeroize::Zeroizing;

pub use client::{ClientTls, TlsFailure, client_io_error, connect_client};
pub use server::{HandshakeRefusal, ServerTls};

/// Where the password of an encrypted PKCS#8 key comes from, asked once when the key is read
/// (the reference's password callback). The returned string is wiped when dropped.
pub type KeyPasswordFn = dyn Fn() -> io::Result<Zeroizing<String>> + Send + Sync;

/// One TLS 1.3 cipher suite an operator may choose by its IANA name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Tls13Suite {
    /// `TLS_AES_256_GCM_SHA384`: the default and the reference's choice.
    Aes256GcmSha384,
    /// `TLS_AES_128_GCM_SHA256`.
    Aes128GcmSha256,
    /// `TLS_CHACHA20_POLY1305_SHA256`.
    Chacha20Poly1305Sha256,
}

impl Tls13Suite {
    /// The IANA name, as operators write it in flags and TOML.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Aes256GcmSha384 => "TLS_AES_256_GCM_SHA384",
            Self::Aes128GcmSha256 => "TLS_AES_128_GCM_SHA256",
            Self::Chacha20Poly1305Sha256 => "TLS_CHACHA20_POLY1305_SHA256",
        }
    }

    fn rustls(self) -> rustls::SupportedCipherSuite {
        use rustls::crypto::ring::cipher_suite;
        match self {
            Self::Aes256GcmSha384 => cipher_suite::TLS13_AES_256_GCM_SHA384,
            Self::Aes128GcmSha256 => cipher_suite::TLS13_AES_128_GCM_SHA256,
            Self::Chacha20Poly1305Sha256 => cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        }
    }
}

impl fmt::Display for Tls13Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tls13Suite {
    type Err = io::Error;

    /// Accepts the IANA name and rustls' `TLS13_` spelling, in any case.
    fn from_str(s: &str) -> io::Result<Self> {
        let upper = s.trim().to_ascii_uppercase();
        let bare = upper
            .strip_prefix("TLS13_")
            .or_else(|| upper.strip_prefix("TLS_"))
            .unwrap_or(&upper);
        match bare {
            "AES_256_GCM_SHA384" => Ok(Self::Aes256GcmSha384),
            "AES_128_GCM_SHA256" => Ok(Self::Aes128GcmSha256),
            "CHACHA20_POLY1305_SHA256" => Ok(Self::Chacha20Poly1305Sha256),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "unknown TLS 1.3 cipher suite {s:?} (expected TLS_AES_256_GCM_SHA384, \
                     TLS_AES_128_GCM_SHA256 or TLS_CHACHA20_POLY1305_SHA256)"
                ),
            )),
        }
    }
}

/// The TLS settings of one end (server or client): PEM files and policy.
///
/// Build it with [`TlsConfig::new`] and the `with_*` methods; fields stay readable (and
/// writable) so flags and TOML can fill them in. `Debug` prints paths and policy, never a
/// password (it cannot print key bytes: they are not held here, only read when a rustls
/// configuration is built).
#[derive(Clone)]
#[non_exhaustive]
pub struct TlsConfig {
    /// This end's certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// This end's private key (PEM: PKCS#8, encrypted PKCS#8 with `key_password`, also PKCS#1
    /// and SEC1).
    pub key: PathBuf,
    /// The CA bundle (PEM) the peer's certificate must chain to.
    pub ca: PathBuf,
    /// Certificate revocation lists (PEM, one or more per file) checked on the peer's chain.
    pub crls: Vec<PathBuf>,
    /// Asked once for the password of an encrypted key.
    pub key_password: Option<Arc<KeyPasswordFn>>,
    /// The suites offered or accepted, in order of preference; never empty.
    pub cipher_suites: Vec<Tls13Suite>,
    /// For a client: the name the server's certificate must carry (DNS name or IP address).
    pub server_name: Option<String>,
}

impl TlsConfig {
    /// Certificate, key and CA; no CRL, no password, `TLS_AES_256_GCM_SHA384` only.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>, ca: impl Into<PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            ca: ca.into(),
            crls: Vec::new(),
            key_password: None,
            cipher_suites: vec![Tls13Suite::Aes256GcmSha384],
            server_name: None,
        }
    }

    /// Adds a CRL file.
    pub fn with_crl(mut self, crl: impl Into<PathBuf>) -> Self {
        self.crls.push(crl.into());
        self
    }

    /// Sets the callback asked for the password of an encrypted key.
    pub fn with_key_password(
        mut self,
        password: impl Fn() -> io::Result<Zeroizing<String>> + Send + Sync + 'static,
    ) -> Self {
        self.key_password = Some(Arc::new(password));
        self
    }

    /// Replaces the cipher suites (in order of preference).
    pub fn with_cipher_suites(mut self, suites: &[Tls13Suite]) -> Self {
        self.cipher_suites = suites.to_vec();
        self
    }

    /// Sets the name a client expects in the server's certificate.
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// The ring provider reduced to the chosen suites.
    fn provider(&self) -> io::Result<Arc<CryptoProvider>> {
        if self.cipher_suites.is_empty() {
            return Err(invalid_input("TLS: no cipher suite configured"));
        }
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = self.cipher_suites.iter().map(|s| s.rustls()).collect();
        Ok(Arc::new(provider))
    }
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("ca", &self.ca)
            .field("crls", &self.crls)
            .field(
                "key_password",
                &self.key_password.as_ref().map(|_| "<callback>"),
            )
            .field("cipher_suites", &self.cipher_suites)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// The server's rustls configuration: TLS 1.3 only, the chosen suites only, a client
/// certificate required (chaining to `ca`, checked against the CRLs), no resumption.
pub fn server_config(cfg: &TlsConfig) -> io::Result<Arc<rustls::ServerConfig>> {
    let provider = cfg.provider()?;
    let roots = Arc::new(pem::load_roots(&cfg.ca)?);
    let crls = pem::load_crls(&cfg.crls)?;
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .with_crls(crls)
        .build()
        .map_err(|e| {
            invalid_input(format!(
                "TLS: client verifier from {}: {e}",
                cfg.ca.display()
            ))
        })?;
    let key = pem::load_certified_key(cfg)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| invalid_input(format!("TLS: server configuration: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(key)));
    // One ticket, never resumable: see `TicketsAsVerdict`.
    config.session_storage = Arc::new(TicketsAsVerdict);
    config.send_tls13_tickets = 1;
    Ok(Arc::new(config))
}

/// A server session store that lets rustls issue a TLS 1.3 session ticket and never finds one.
///
/// rustls sends tickets only after it has verified the client's certificate and `Finished`,
/// so the ticket is the client's signal that it was *accepted* (with TLS 1.3 the client's
/// handshake completes before the server's verdict; [`connect_client`] waits for this ticket
/// or the refusal alert). Nothing is stored, so no ticket can ever be used to resume: every
/// connection stays a full handshake with the current CA and CRLs (see the module docs).
#[derive(Debug)]
struct TicketsAsVerdict;

impl rustls::server::StoresServerSessions for TicketsAsVerdict {
    /// Claims to store so that rustls sends the ticket; the value is dropped.
    fn put(&self, _key: Vec<u8>, _value: Vec<u8>) -> bool {
        true
    }

    fn get(&self, _key: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn take(&self, _key: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// The client's rustls configuration: TLS 1.3 only, the chosen suites only, the server checked
/// against `ca` (and the CRLs), this end's certificate presented, no resumption.
pub fn client_config(cfg: &TlsConfig) -> io::Result<Arc<rustls::ClientConfig>> {
    let provider = cfg.provider()?;
    let roots = Arc::new(pem::load_roots(&cfg.ca)?);
    let crls = pem::load_crls(&cfg.crls)?;
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .with_crls(crls)
        .build()
        .map_err(|e| {
            invalid_input(format!(
                "TLS: server verifier from {}: {e}",
                cfg.ca.display()
            ))
        })?;
    let key = pem::load_certified_key(cfg)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| invalid_input(format!("TLS: client configuration: {e}")))?
        .with_webpki_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key)));
    // Tickets from the server are counted (the acceptance signal) but never kept or offered.
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}
