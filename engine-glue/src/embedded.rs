//! The server embedded in the engine's process.

use std::io;
use std::net::SocketAddr;

use dlock_core::Config;
use dlock_transport::client::{Client, ClientConfig, Endpoint, Error};
use dlock_transport::runtime::{ServerConfig, ServerHandle};

/// A dlock server running inside the engine. Dropping it (or [`EmbeddedServer::shutdown`])
/// stops its threads and unmaps its region, and then, for a cluster member, leaves the cluster.
#[derive(Debug)]
pub struct EmbeddedServer {
    // Dropped first: the server stops granting before its agent leaves the cluster (fields
    // drop in declaration order), so its partitions move only once it grants nothing.
    handle: ServerHandle,
    shm_name: Option<String>,
    #[cfg(feature = "cluster")]
    member: Option<crate::cluster::Member>,
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
            #[cfg(feature = "cluster")]
            member: None,
        })
    }

    /// Starts the server as a member of the cluster `join` names (feature `cluster`; the
    /// module [`crate::cluster`]): its agent registers in etcd, and this returns once the
    /// server serves a map that gives it its share of the partitions (within the agent's
    /// `start_timeout`). `cfg` needs a TCP listener at a fixed address (the other nodes reach
    /// this one there) unless `join.agent.address` names one. Without a session key in `cfg`,
    /// the server takes the one etcd keeps for the cluster.
    ///
    /// Errors: `InvalidInput` for settings (no address to advertise, a standalone recovery
    /// (`recovery_clients`), a cluster that refused this server's partition count or id),
    /// `TimedOut` when etcd did not answer or no map came in time, and the server's own.
    #[cfg(feature = "cluster")]
    pub fn start_cluster(
        mut cfg: ServerConfig,
        join: crate::cluster::ClusterJoin,
    ) -> io::Result<EmbeddedServer> {
        let limit = join.agent.start_timeout;
        let member = crate::cluster::Member::join(&mut cfg, join)?;
        let mut server = EmbeddedServer::start(cfg)?;
        let mut member = member;
        member.bind_local(server.endpoint());
        member.wait_serving(limit)?;
        server.member = Some(member);
        Ok(server)
    }

    /// A new client instance of the whole cluster, for one worker thread (feature `cluster`):
    /// this node's server through shared memory, the others over TCP or TLS
    /// ([`crate::cluster::ClusterJoin::peer_tls`]). On a server that is not a cluster member it
    /// fails as a cluster client does when no server gives it a map: `NotReady`.
    #[cfg(feature = "cluster")]
    pub fn cluster_client(&self) -> Result<crate::cluster::ClusterClient, Error> {
        let timeout = dlock_transport::client::REQUEST_TIMEOUT;
        match &self.member {
            Some(member) => member.client(timeout),
            None => crate::cluster::EngineDial::local_only(self.endpoint()).client(timeout),
        }
    }

    /// The cluster agent of a member (feature `cluster`): the map it knows, its status, drain.
    #[cfg(feature = "cluster")]
    pub fn cluster_agent(&self) -> Option<crate::cluster::AgentHandle> {
        self.member.as_ref().map(|m| m.agent())
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
