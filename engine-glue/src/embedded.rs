//! The server embedded in the engine's process.

use std::io;
use std::net::SocketAddr;

use dlock_core::Config;
use dlock_transport::client::{Client, ClientConfig, Endpoint, Error};
use dlock_transport::runtime::{ServerConfig, ServerHandle};

/// A dlock server running inside the engine. Dropping it (or [`EmbeddedServer::shutdown`])
/// stops its threads and unmaps its region.
#[derive(Debug)]
pub struct EmbeddedServer {
    handle: ServerHandle,
    shm_name: Option<String>,
}

impl EmbeddedServer {
    /// Settings for an embedded server with these capacities: shared memory only (no TCP
    /// listener, anonymous region), adaptive idling. Set `tcp` on the result to let other nodes
    /// join, or `shm_name` to let other processes on this host map the region.
    pub fn config(core: Config) -> ServerConfig {
        ServerConfig::new(core)
    }

    /// Starts the server.
    pub fn start(cfg: ServerConfig) -> io::Result<EmbeddedServer> {
        let shm_name = cfg.shm_name.clone();
        Ok(EmbeddedServer {
            handle: ServerHandle::start(cfg)?,
            shm_name,
        })
    }

    /// A new client instance over shared memory, for one worker thread ([`Client::connect`]).
    pub fn client(&self) -> Result<Client, Error> {
        Client::connect(ClientConfig::new(self.endpoint()))
    }

    /// The in-process endpoint (shared memory).
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::embedded(&self.handle)
    }

    /// The endpoint for clients in other processes on this host, when the region is a
    /// `/dev/shm` file.
    pub fn local_endpoint(&self) -> Option<Endpoint> {
        let shm_name = self.shm_name.clone()?;
        Some(Endpoint::Local {
            unix_socket: self.handle.unix_socket().to_path_buf(),
            shm_name,
        })
    }

    /// The TCP address other nodes connect to, when a listener is configured.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.handle.tcp_addr()
    }

    /// The runtime handle (region, sockets).
    pub fn handle(&self) -> &ServerHandle {
        &self.handle
    }

    /// Stops the server and releases its region.
    pub fn shutdown(self) {
        self.handle.stop();
    }
}
