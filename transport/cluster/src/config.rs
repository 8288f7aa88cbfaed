//! The agent's settings, checked once at start.

use std::time::Duration;

use dlock_core::cluster::timing::{DRIFT_PPM_DEFAULT, Timing};
use dlock_core::cluster::{ADDRESS_LEN_MAX, Partitions, ServerId};
use dlock_transport::runtime::ServerConfig;

/// Client certificates for etcd over TLS (PEM bytes; the endpoints then start `https://`).
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificate.
    pub ca_pem: Vec<u8>,
    /// This server's client certificate chain.
    pub cert_pem: Vec<u8>,
    /// Its private key.
    pub key_pem: Vec<u8>,
    /// The name etcd's certificate must carry, if not the endpoint's host.
    pub domain: Option<String>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// What an agent needs to join a cluster.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// etcd endpoints (`http://host:port`, or `https://` with [`AgentConfig::tls`]).
    pub endpoints: Vec<String>,
    /// etcd over TLS with a client certificate.
    pub tls: Option<EtcdTls>,
    /// The cluster's name: its keys live under `/dlock/<cluster>/`.
    pub cluster: String,
    /// This server's id in the cluster.
    pub server_id: ServerId,
    /// Where clients reach this server (copied into the map's server table).
    pub address: String,
    /// The partition count this server was configured with. The cluster's creation record
    /// decides; a server that disagrees is refused at join.
    pub partitions: Partitions,
    /// The etcd lease TTL to ask for, in whole seconds (etcd may grant more: the agent uses
    /// what it grants).
    pub lease_ttl_s: u32,
    /// ρ, the clock drift bound, in millionths (see `dlock_core::cluster::timing`).
    pub drift_ppm: u32,
    /// The longest grant lease (lock expiry or client lease) the server hands out.
    pub grant_lease_max_ms: u32,
    /// How long `Agent::start` keeps trying to reach etcd before it gives up.
    pub start_timeout: Duration,
    /// How long one etcd request may take before it counts as failed.
    pub request_timeout: Duration,
}

impl AgentConfig {
    /// A config with the defaults: a 10 s lease, 1 % drift, 30 s grant leases, 10 s to reach
    /// etcd at start, 2 s per request.
    pub fn new(
        endpoints: Vec<String>,
        cluster: &str,
        server_id: ServerId,
        address: &str,
    ) -> AgentConfig {
        AgentConfig {
            endpoints,
            tls: None,
            cluster: cluster.to_owned(),
            server_id,
            address: address.to_owned(),
            partitions: Partitions::DEFAULT,
            lease_ttl_s: 10,
            drift_ppm: DRIFT_PPM_DEFAULT,
            grant_lease_max_ms: 30_000,
            start_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(2),
        }
    }

    /// The first setting out of range, with the rule it breaks.
    pub fn invalid_field(&self) -> Option<String> {
        if self.endpoints.is_empty() {
            return Some("at least one etcd endpoint is needed".into());
        }
        let name_ok = !self.cluster.is_empty()
            && self.cluster.len() <= 64
            && self
                .cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !name_ok {
            return Some(format!(
                "cluster name {:?} must be 1-64 of [A-Za-z0-9._-]",
                self.cluster
            ));
        }
        if self.address.is_empty() || self.address.len() > ADDRESS_LEN_MAX {
            return Some(format!(
                "the advertised address must be 1-{ADDRESS_LEN_MAX} bytes"
            ));
        }
        self.timing(self.lease_ttl_s.saturating_mul(1_000))
            .invalid_field()
            .map(|why| format!("lease_ttl_s {}: {why}", self.lease_ttl_s))
    }

    /// Fits these settings to the server that is to join: its longest client lease becomes
    /// [`AgentConfig::grant_lease_max_ms`] — a new owner keeps a taken-over partition
    /// recovering until every grant of the old owner may have run out
    /// (`dlock_core::cluster::timing`, assumption 4), so the agent must know the longest lease
    /// the server grants. A server set to recover a standalone predecessor's clients is refused:
    /// a cluster recovers per partition by itself.
    pub fn fit_to(&mut self, server: &ServerConfig) -> Result<(), String> {
        if server.core.recovery_clients > 0 {
            return Err(
                "recovery_clients is for a standalone replacement server; a cluster recovers \
                 per partition by itself"
                    .into(),
            );
        }
        self.grant_lease_max_ms = server.core.client_lease_max_ms;
        Ok(())
    }

    /// The timing rules for a lease of `ttl_ms` (what etcd granted).
    pub fn timing(&self, ttl_ms: u32) -> Timing {
        Timing {
            ttl_ms,
            drift_ppm: self.drift_ppm,
            grant_lease_max_ms: self.grant_lease_max_ms,
        }
    }
}
