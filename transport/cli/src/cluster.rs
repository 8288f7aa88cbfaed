//! `dlock serve --cluster …` (feature `cluster`): the flags and TOML table that make the server a
//! member of a cluster on etcd, and the agent that joins it.
//!
//! ```text
//! dlock serve --cluster http://etcd-1:2379,http://etcd-2:2379 --cluster-name orders \
//!             --server-id 3 --session-key-file /etc/dlock/cluster.key [--partitions 256] \
//!             [--cluster-ttl-ms 10000] [--advertise 10.0.0.3:21616] [--counter-step 100000]
//! ```
//!
//! or, in the TOML file, a `[cluster]` table with the same names (`endpoints = [...]`,
//! `name`, `server_id`, `partitions`, `ttl_ms`, `advertise`, `counter_step`, and for etcd over
//! TLS with a client certificate `etcd_tls_ca`, `etcd_tls_cert`, `etcd_tls_key`,
//! `etcd_tls_domain`).

use std::sync::Arc;

use dlock_cluster::{Agent, AgentConfig, AgentMembership, EtcdTls};
use dlock_core::cluster::{Partitions, ServerId};
use dlock_transport::runtime::{ClusterConfig, ServerConfig};
use serde::Deserialize;

/// Cluster settings (module doc).
#[derive(clap::Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ClusterArgs {
    /// Join the cluster whose etcd answers at these endpoints (comma-separated URLs). Without
    /// it the server is standalone.
    #[arg(long = "cluster", value_delimiter = ',', value_name = "ENDPOINTS")]
    endpoints: Option<Vec<String>>,
    /// The cluster's name: its keys live under `/dlock/<name>/` in etcd.
    #[arg(long = "cluster-name", value_name = "NAME", requires = "endpoints")]
    name: Option<String>,
    /// This server's id in the cluster (1 or more, unique, kept across restarts).
    #[arg(long = "server-id", value_name = "ID", requires = "endpoints")]
    server_id: Option<u32>,
    /// The cluster's partition count, fixed at its creation (default 256); a server that says
    /// otherwise is refused at join.
    #[arg(long, requires = "endpoints")]
    partitions: Option<u16>,
    /// The etcd lease TTL in milliseconds (rounded up to whole seconds, as etcd grants them;
    /// default 10000). A server that loses etcd stops granting before it runs out; keep it
    /// above the longest etcd outage to ride out.
    #[arg(long = "cluster-ttl-ms", value_name = "MS", requires = "endpoints")]
    ttl_ms: Option<u32>,
    /// The address clients reach this server at, published in the map (default: the bind
    /// address, which must then not be unspecified).
    #[arg(long, value_name = "ADDR", requires = "endpoints")]
    advertise: Option<String>,
    /// How far ahead of a counter's value its high-water mark is reserved in etcd (default
    /// 100000): a few seconds' worth of fetch-and-adds.
    #[arg(long = "counter-step", value_name = "N", requires = "endpoints")]
    counter_step: Option<u64>,
    /// etcd over TLS: the CA that signed etcd's server certificate (PEM); the endpoints then
    /// start `https://`. Needs `--etcd-tls-cert` and `--etcd-tls-key`.
    #[arg(long = "etcd-tls-ca", value_name = "PEM", requires_all = ["etcd_tls_cert", "etcd_tls_key"])]
    etcd_tls_ca: Option<std::path::PathBuf>,
    /// This server's client certificate chain for etcd (PEM).
    #[arg(long = "etcd-tls-cert", value_name = "PEM", requires = "etcd_tls_ca")]
    etcd_tls_cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long = "etcd-tls-key", value_name = "PEM", requires = "etcd_tls_ca")]
    etcd_tls_key: Option<std::path::PathBuf>,
    /// The name etcd's certificate carries, if not the endpoints' host.
    #[arg(
        long = "etcd-tls-domain",
        value_name = "NAME",
        requires = "etcd_tls_ca"
    )]
    etcd_tls_domain: Option<String>,
}

impl ClusterArgs {
    /// These (flags) over `file`'s.
    pub(crate) fn over(self, file: ClusterArgs) -> ClusterArgs {
        ClusterArgs {
            endpoints: self.endpoints.or(file.endpoints),
            name: self.name.or(file.name),
            server_id: self.server_id.or(file.server_id),
            partitions: self.partitions.or(file.partitions),
            ttl_ms: self.ttl_ms.or(file.ttl_ms),
            advertise: self.advertise.or(file.advertise),
            counter_step: self.counter_step.or(file.counter_step),
            etcd_tls_ca: self.etcd_tls_ca.or(file.etcd_tls_ca),
            etcd_tls_cert: self.etcd_tls_cert.or(file.etcd_tls_cert),
            etcd_tls_key: self.etcd_tls_key.or(file.etcd_tls_key),
            etcd_tls_domain: self.etcd_tls_domain.or(file.etcd_tls_domain),
        }
    }

    /// Whether the server is to join a cluster.
    pub(crate) fn enabled(&self) -> bool {
        self.endpoints.is_some()
    }

    /// The agent's configuration, checked; `bind` is the server's listening address.
    pub(crate) fn agent_config(&self, bind: std::net::SocketAddr) -> Result<AgentConfig, String> {
        let endpoints = self.endpoints.clone().unwrap_or_default();
        if endpoints.is_empty() {
            return Err("--cluster needs at least one etcd endpoint".into());
        }
        let name = self.name.clone().ok_or("--cluster needs --cluster-name")?;
        let id = self
            .server_id
            .and_then(ServerId::new)
            .ok_or("--cluster needs --server-id (1 or more)")?;
        let advertise = match &self.advertise {
            Some(a) => a.clone(),
            None if bind.ip().is_unspecified() => {
                return Err(format!(
                    "the server binds {bind}: give --advertise with the address clients reach it at"
                ));
            }
            None => bind.to_string(),
        };
        let mut cfg = AgentConfig::new(endpoints, &name, id, &advertise);
        if let Some(p) = self.partitions {
            cfg.partitions = Partitions::new(p).ok_or("--partitions must be 1 to 4096")?;
        }
        if let Some(ms) = self.ttl_ms {
            cfg.lease_ttl_s = ms.div_ceil(1_000);
        }
        cfg.tls = self.etcd_tls()?;
        if let Some(why) = cfg.invalid_field() {
            return Err(why);
        }
        Ok(cfg)
    }

    /// The etcd TLS settings: all of CA, certificate and key, or none (the TOML file is not
    /// checked by the flags' `requires`).
    fn etcd_tls(&self) -> Result<Option<EtcdTls>, String> {
        let read =
            |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        match (&self.etcd_tls_ca, &self.etcd_tls_cert, &self.etcd_tls_key) {
            (None, None, None) if self.etcd_tls_domain.is_none() => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(EtcdTls {
                ca_pem: read(ca)?,
                cert_pem: read(cert)?,
                key_pem: read(key)?,
                domain: self.etcd_tls_domain.clone(),
            })),
            _ => {
                Err("etcd over TLS needs --etcd-tls-ca, --etcd-tls-cert and --etcd-tls-key".into())
            }
        }
    }

    /// Joins the cluster and makes `cfg` a member of it; the agent must outlive the server and
    /// leave only after it stopped ([`Agent::leave`]).
    pub(crate) fn join(
        &self,
        cfg: &mut ServerConfig,
        bind: std::net::SocketAddr,
    ) -> Result<Agent, String> {
        if cfg.core.recovery_clients > 0 {
            return Err(
                "--recovery-clients is for a standalone replacement server; a cluster recovers \
                 per partition by itself"
                    .into(),
            );
        }
        let agent_cfg = self.agent_config(bind)?;
        let etcd_tls = agent_cfg.tls.is_some();
        let agent = Agent::start(agent_cfg).map_err(|e| e.to_string())?;
        if cfg.session_key.is_none() {
            // Every server must verify the others' sessions and grant proofs: without a key
            // file they share the one etcd keeps (created by the first server that asks).
            if !etcd_tls {
                tracing::warn!(
                    "the cluster's session key is kept in etcd, which this server reaches \
                     without TLS: whoever reads etcd can impersonate any client; give \
                     --session-key-file or run etcd with TLS and client certificates"
                );
            }
            let bytes = agent
                .handle()
                .session_key()
                .wait(std::time::Duration::from_secs(10))
                .ok_or("etcd did not answer for the cluster's session key")?
                .map_err(|e| format!("the cluster's session key: {e}"))?;
            let key = dlock_core::SessionKey::new(bytes)
                .map_err(|e| format!("the session key in etcd is refused: {e:?}"))?;
            cfg.session_key = Some(key);
        }
        cfg.cluster = Some(ClusterConfig {
            membership: Arc::new(AgentMembership::new(agent.handle())),
            counter_step: self.counter_step.unwrap_or(100_000).max(1),
        });
        Ok(agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        cluster: ClusterArgs,
    }

    fn parse(args: &[&str]) -> ClusterArgs {
        Flags::parse_from(std::iter::once("dlock").chain(args.iter().copied())).cluster
    }

    #[test]
    fn the_cluster_flags_make_the_agents_config_and_say_what_is_missing() {
        let bind = "127.0.0.1:21616".parse().unwrap();
        let a = parse(&[
            "--cluster",
            "http://e1:2379,http://e2:2379",
            "--cluster-name",
            "orders",
            "--server-id",
            "3",
            "--partitions",
            "64",
            "--cluster-ttl-ms",
            "2500",
        ]);
        let cfg = a.agent_config(bind).unwrap();
        assert_eq!(cfg.endpoints, ["http://e1:2379", "http://e2:2379"]);
        assert_eq!((cfg.cluster.as_str(), cfg.server_id.get()), ("orders", 3));
        assert_eq!(
            (cfg.partitions.get(), cfg.lease_ttl_s),
            (64, 3),
            "TTL rounded up"
        );
        assert_eq!(
            cfg.address, "127.0.0.1:21616",
            "advertises the bind address"
        );
        let no_name = parse(&["--cluster", "http://e:2379", "--server-id", "3"]);
        assert!(
            no_name
                .agent_config(bind)
                .unwrap_err()
                .contains("--cluster-name")
        );
        let no_id = parse(&["--cluster", "http://e:2379", "--cluster-name", "x"]);
        assert!(
            no_id
                .agent_config(bind)
                .unwrap_err()
                .contains("--server-id")
        );
        let any = "0.0.0.0:21616".parse().unwrap();
        let ok = parse(&[
            "--cluster",
            "http://e:2379",
            "--cluster-name",
            "x",
            "--server-id",
            "1",
        ]);
        assert!(ok.agent_config(any).unwrap_err().contains("--advertise"));
        assert!(!parse(&[]).enabled(), "standalone without --cluster");
        let half = ClusterArgs {
            etcd_tls_ca: Some("/nonexistent/ca.pem".into()),
            ..parse(&[
                "--cluster",
                "http://e:2379",
                "--cluster-name",
                "x",
                "--server-id",
                "1",
            ])
        };
        assert!(
            half.agent_config(bind)
                .unwrap_err()
                .contains("--etcd-tls-cert")
        );
    }

    #[test]
    fn the_toml_table_and_the_flags_merge_flags_first() {
        let file: ClusterArgs = toml::from_str(
            "endpoints = [\"http://e:2379\"]\nname = \"orders\"\nserver_id = 2\ncounter_step = 10",
        )
        .unwrap();
        let merged = parse(&["--server-id", "5", "--cluster", "http://f:2379"]).over(file);
        let cfg = merged.agent_config("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_eq!(
            (cfg.server_id.get(), cfg.endpoints[0].as_str()),
            (5, "http://f:2379")
        );
        assert_eq!(merged.counter_step, Some(10));
    }
}
