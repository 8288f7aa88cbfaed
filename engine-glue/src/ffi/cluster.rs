//! `server_cfg.cluster`: a server started through the C ABI that joins a dlock cluster on etcd
//! (the library's `cluster` feature; `EmbeddedServer::start_cluster`).
//!
//! Without the feature the fields still exist (one header for every build), and setting any
//! of them is refused with `DLOCK_EINVAL` and a logged reason: a caller who asked for a
//! cluster member and silently got a standalone server would hand out locks and transaction
//! ids that no other node knows of.

use std::io;

use dlock_core::Status;
use dlock_transport::runtime::ServerConfig;

use super::types::cluster_cfg;
use crate::EmbeddedServer;

/// What `server_start` starts.
#[derive(Debug)]
pub(super) enum Role {
    Standalone,
    #[cfg(feature = "cluster")]
    Member(Box<crate::cluster::ClusterJoin>),
}

impl Role {
    /// Starts the server `settings` describe, as this role.
    pub(super) fn start(self, settings: ServerConfig) -> io::Result<EmbeddedServer> {
        match self {
            Role::Standalone => EmbeddedServer::start(settings),
            #[cfg(feature = "cluster")]
            Role::Member(join) => EmbeddedServer::start_cluster(settings, *join),
        }
    }
}

/// The role `c` asks for: standalone when every field is zero or NULL.
///
/// # Safety
///
/// - The string pointers in `c` are NULL or NUL-terminated strings.
#[cfg(not(feature = "cluster"))]
pub(super) unsafe fn role(c: &cluster_cfg) -> Result<Role, Status> {
    if c.is_set() {
        tracing::error!(
            "server_start: server_cfg.cluster is set, but this library was built without the \
             `cluster` feature; rebuild dlock-engine-glue with it, or leave the fields zero"
        );
        return Err(Status::Einval);
    }
    Ok(Role::Standalone)
}

/// The role `c` asks for: standalone when every field is zero or NULL, else a member of the
/// cluster it names (`Einval`, logged, for settings out of range or missing).
///
/// # Safety
///
/// - The string pointers in `c` are NULL or NUL-terminated strings.
#[cfg(feature = "cluster")]
pub(super) unsafe fn role(c: &cluster_cfg) -> Result<Role, Status> {
    if !c.is_set() {
        return Ok(Role::Standalone);
    }
    // SAFETY: forwarded from the caller.
    match unsafe { member::join(c) } {
        Ok(join) => Ok(Role::Member(Box::new(join))),
        Err(why) => {
            tracing::error!("server_start: server_cfg.cluster: {why}");
            Err(Status::Einval)
        }
    }
}

#[cfg(feature = "cluster")]
mod member {
    use dlock_cluster::EtcdTls;
    use dlock_core::cluster::{Partitions, ServerId};

    use super::super::opt_str;
    use super::cluster_cfg;
    use crate::cluster::ClusterJoin;

    /// A string field: `Ok(None)` for NULL or "", `Err` naming the field when it is not UTF-8
    /// or longer than `max`.
    ///
    /// # Safety
    ///
    /// - `p` is NULL or a NUL-terminated string.
    unsafe fn text<'a>(p: *const std::ffi::c_char, field: &str) -> Result<Option<&'a str>, String> {
        // SAFETY: forwarded from the caller.
        unsafe { opt_str(p, 4096) }
            .map_err(|_| format!("{field} is not UTF-8 of at most 4096 bytes"))
    }

    /// The settings `c` names, checked.
    ///
    /// # Safety
    ///
    /// - The string pointers in `c` are NULL or NUL-terminated strings.
    pub(super) unsafe fn join(c: &cluster_cfg) -> Result<ClusterJoin, String> {
        // SAFETY: forwarded from the caller (and for every `text` below).
        let endpoints = unsafe { text(c.etcd_endpoints, "etcd_endpoints") }?
            .ok_or("the cluster fields are set but etcd_endpoints is not")?;
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        // SAFETY: as above.
        let name =
            unsafe { text(c.cluster_name, "cluster_name") }?.ok_or("cluster_name is needed")?;
        let id = ServerId::new(c.server_id).ok_or("server_id must be 1 or more")?;
        let mut join = ClusterJoin::new(endpoints, name, id);
        let a = &mut join.agent;
        if c.partitions != 0 {
            a.partitions = u16::try_from(c.partitions)
                .ok()
                .and_then(Partitions::new)
                .ok_or("partitions must be 1 to 4096")?;
        }
        if c.ttl_ms != 0 {
            a.lease_ttl_s = c.ttl_ms.div_ceil(1_000);
        }
        // SAFETY: as above.
        if let Some(advertise) = unsafe { text(c.advertise, "advertise") }? {
            a.address = advertise.to_owned();
        }
        // SAFETY: as above.
        a.tls = unsafe { etcd_tls(c) }?;
        if c.counter_step != 0 {
            join.counter_step = c.counter_step.into();
        }
        Ok(join)
    }

    /// etcd over TLS: all of CA, certificate and key, or none (a domain alone is a mistake).
    ///
    /// # Safety
    ///
    /// - The string pointers in `c` are NULL or NUL-terminated strings.
    unsafe fn etcd_tls(c: &cluster_cfg) -> Result<Option<EtcdTls>, String> {
        let read = |p: &str| std::fs::read(p).map_err(|e| format!("{p}: {e}"));
        // SAFETY: forwarded from the caller, for all four.
        let (ca, cert, key, domain) = unsafe {
            (
                text(c.etcd_ca_path, "etcd_ca_path")?,
                text(c.etcd_cert_path, "etcd_cert_path")?,
                text(c.etcd_key_path, "etcd_key_path")?,
                text(c.etcd_domain, "etcd_domain")?,
            )
        };
        match (ca, cert, key) {
            (None, None, None) if domain.is_none() => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(EtcdTls {
                ca_pem: read(ca)?,
                cert_pem: read(cert)?,
                key_pem: read(key)?,
                domain: domain.map(str::to_owned),
            })),
            _ => Err("etcd over TLS needs etcd_ca_path, etcd_cert_path and etcd_key_path".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standalone_config_is_standalone_and_a_set_field_is_never_ignored() {
        // SAFETY: every pointer NULL or a NUL-terminated literal.
        unsafe {
            assert!(matches!(
                role(&cluster_cfg::STANDALONE),
                Ok(Role::Standalone)
            ));
            let only_id = cluster_cfg {
                server_id: 3,
                ..cluster_cfg::STANDALONE
            };
            assert!(
                role(&only_id).is_err(),
                "a field without endpoints is refused"
            );
            let named = cluster_cfg {
                etcd_endpoints: c"http://127.0.0.1:2379".as_ptr(),
                cluster_name: c"orders".as_ptr(),
                server_id: 3,
                ..cluster_cfg::STANDALONE
            };
            #[cfg(not(feature = "cluster"))]
            assert_eq!(
                role(&named).map(drop),
                Err(Status::Einval),
                "no silent standalone"
            );
            #[cfg(feature = "cluster")]
            {
                let Ok(Role::Member(join)) = role(&named) else {
                    panic!("a member");
                };
                assert_eq!(join.agent.endpoints, ["http://127.0.0.1:2379"]);
                assert_eq!(join.agent.server_id.get(), 3);
                let half_tls = cluster_cfg {
                    etcd_ca_path: c"/nonexistent/ca.pem".as_ptr(),
                    ..named
                };
                assert_eq!(role(&half_tls).map(drop), Err(Status::Einval));
                let too_many = cluster_cfg {
                    partitions: 5_000,
                    ..named
                };
                assert_eq!(role(&too_many).map(drop), Err(Status::Einval));
            }
        }
    }
}
