//! Who may act as a recoverer (`recovery_done`, `ListRetained`): the server's configuration,
//! never the client's claim (`dlock_core::manager::retain`).
//!
//! | connection        | a recoverer when                                                        |
//! |-------------------|-------------------------------------------------------------------------|
//! | TLS               | its client certificate's identity (the subject's common name, or else its first DNS name) is in `names` (`dlock serve --recoverer NAME`) |
//! | plaintext TCP     | its address is in `addresses`                                           |
//! | Unix socket       | `local` is set: every local client, the embedded ones included (whoever may use the socket may map the region and act as any local client anyway) |
//!
//! The TLS identity is the one the server already logs for a connection; the certificate chain
//! was verified against the server's CA during the handshake, so a name there is the CA's
//! word, not the client's. A plaintext address is only as good as the network, as everything
//! else on a plaintext listener.

use std::net::IpAddr;

use dlock_core::manager::retain::Role;

use super::stream::Stream;

/// The recoverer role's configuration (module doc). Empty by default: nobody is a recoverer,
/// and retained locks stay until an operator configures one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recoverers {
    /// TLS client certificate identities (common name, or else first DNS name).
    pub names: Vec<String>,
    /// Plaintext TCP client addresses.
    pub addresses: Vec<IpAddr>,
    /// Every client over the Unix socket (local and embedded clients).
    pub local: bool,
}

impl Recoverers {
    /// The role of the client behind `stream` (from `ip`), once its TLS handshake is complete.
    pub(crate) fn role_of(&self, stream: &Stream, ip: Option<IpAddr>) -> Role {
        let recoverer = match stream {
            Stream::Tls(_, tls) => tls
                .peer_identity()
                .is_some_and(|name| self.names.contains(&name)),
            Stream::Tcp(_) => ip.is_some_and(|ip| self.addresses.contains(&ip)),
            Stream::Unix(_) => self.local,
        };
        if recoverer {
            Role::Recoverer
        } else {
            Role::Client
        }
    }
}
