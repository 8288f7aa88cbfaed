//! How the cluster client reaches one server of the map: [`Dial`], and [`NetDial`] for real
//! servers (TCP, or TLS with feature `tls`), one [`Mux`] per server.
//!
//! A server's address comes from the map's server table (`ServerEntry::address`, bytes the
//! agent advertised as `host:port`) or from the addresses the client was built with. Tests and
//! simulators implement [`Dial`] over connections of their own.

use std::collections::HashMap;
use std::fmt::Debug;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::client::wire::time_left;
use crate::client::{Connection, Endpoint, Link, Mux};

/// Opens a [`Connection`] to the server at an address.
pub trait Dial: Debug {
    /// The connection it opens.
    type Conn: Connection;

    /// A new connection to the server at `address` (the map's bytes, `host:port`), opened by
    /// `deadline`, the caller's (the exchange it is for may not take longer); a connection
    /// that opens others later (its data path) gives them as long as it was given.
    fn dial(&mut self, address: &[u8], deadline: Instant) -> io::Result<Self::Conn>;
}

/// Dials real servers over TCP, or TLS when given a configuration, with one [`Mux`] per server
/// address shared by every client dialled through this value and its clones: a process with
/// many cluster clients keeps one data connection per server.
#[derive(Clone, Debug, Default)]
pub struct NetDial {
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsConfig>,
    muxes: Arc<Mutex<HashMap<SocketAddr, Mux>>>,
}

impl NetDial {
    /// Plaintext TCP (a server accepts it on loopback, or when its operator allowed it).
    pub fn tcp() -> NetDial {
        NetDial::default()
    }

    /// TLS 1.3 to every server, with this client's certificate and trust (feature `tls`).
    #[cfg(feature = "tls")]
    pub fn tls(cfg: crate::tls::TlsConfig) -> NetDial {
        NetDial {
            tls: Some(cfg),
            muxes: Arc::default(),
        }
    }

    fn endpoint(&self, addr: SocketAddr) -> io::Result<Endpoint> {
        #[cfg(feature = "tls")]
        if let Some(cfg) = &self.tls {
            return Endpoint::tls(addr, cfg);
        }
        Ok(Endpoint::Tcp(addr))
    }
}

impl Dial for NetDial {
    type Conn = Link;

    fn dial(&mut self, address: &[u8], deadline: Instant) -> io::Result<Link> {
        let addr = resolve(address)?;
        let endpoint = self.endpoint(addr)?;
        let mux = {
            let mut muxes = self.muxes.lock().unwrap_or_else(PoisonError::into_inner);
            match muxes.get(&addr) {
                Some(m) => m.clone(),
                None => {
                    let m = Mux::new(&endpoint)?;
                    muxes.insert(addr, m.clone());
                    m
                }
            }
        };
        Link::connect_shared(&endpoint, mux, time_left(deadline)?)
    }
}

/// The first socket address `address` (`host:port`, UTF-8) names.
fn resolve(address: &[u8]) -> io::Result<SocketAddr> {
    let text = std::str::from_utf8(address).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "a server address in the cluster map is not UTF-8",
        )
    })?;
    text.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("the server address {text:?} names no socket address"),
        )
    })
}
