//! `dlock serve`: the server's settings from the flags over the TOML file, checked, and the
//! server running until SIGINT or SIGTERM (a cluster member's agent joined before it starts and
//! leaving after it stopped; `--metrics-addr` beside it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::Config;
use dlock_transport::client::Endpoint;
use dlock_transport::runtime::{IdleStrategy, ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::{Tls13Suite, TlsConfig};
use serde::Deserialize;

#[cfg(feature = "cluster")]
use crate::cluster;
use crate::metrics;

/// Server settings; every flag can also come from the TOML file (flags win).
#[derive(clap::Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ServeArgs {
    /// A TOML file with any of these settings (`bind = "0.0.0.0:21616"`, `locks = 51200`, ...).
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on for TCP clients (IPv4 or IPv6); port 1024-65535. Default
    /// 127.0.0.1:21616. A non-loopback address needs TLS or `--insecure-plaintext`.
    #[arg(long)]
    bind: Option<SocketAddr>,
    /// TLS 1.3 on every TCP connection: this server's certificate chain (PEM).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The server's private key (PEM: PKCS#8, encrypted PKCS#8 with --tls-key-password-file,
    /// PKCS#1 or SEC1). Read once at start and wiped.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA bundle (PEM) client certificates must chain to: clients without one are refused.
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// Certificate revocation lists (PEM), one per issuing CA; may be given more than once.
    #[arg(long, requires = "tls_cert")]
    tls_crl: Option<Vec<PathBuf>>,
    /// A file holding the password of an encrypted private key (its first line).
    #[arg(long, requires = "tls_key")]
    tls_key_password_file: Option<PathBuf>,
    /// TLS 1.3 cipher suites, comma-separated IANA names (default TLS_AES_256_GCM_SHA384 only).
    #[arg(long, value_delimiter = ',', requires = "tls_cert")]
    tls_cipher_suites: Option<Vec<String>>,
    /// A file with the session key this server shares with the server that may replace it (64
    /// hex digits on the first line, e.g. from `head -c 32 /dev/urandom | xxd -p -c 64`): a
    /// recovering server then takes back only clients whose session the failed one minted, and
    /// only the locks they prove were granted to them. A key of obviously low entropy (all
    /// zeros, a repeated pattern, too few distinct bytes) is refused.
    #[arg(long)]
    session_key_file: Option<PathBuf>,
    /// Recover (--recovery-clients) without a session key: whoever reaches the server first
    /// while it recovers can re-register as any client and take its locks. Only for a network
    /// you trust entirely.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    insecure_recovery: Option<bool>,
    /// Serve plaintext TCP on a non-loopback address: anyone who can reach the port can register
    /// and read every lock name and value on the wire. Only for a network you trust entirely.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    insecure_plaintext: Option<bool>,
    /// A TLS client certificate identity (its subject's common name, or else its first DNS
    /// name) that may release dead clients' retained locks (`dlock recovery-done`) and list
    /// them; may be given more than once. Nobody may by default.
    #[arg(long)]
    recoverer: Option<Vec<String>>,
    /// A plaintext TCP client address that is a recoverer; may be given more than once.
    #[arg(long)]
    recoverer_address: Option<Vec<std::net::IpAddr>>,
    /// Make every local client (Unix socket, embedded) a recoverer.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    recoverer_local: Option<bool>,
    /// Lock slots.
    #[arg(long)]
    locks: Option<u32>,
    /// Registered clients.
    #[arg(long)]
    clients: Option<u32>,
    /// Registrations one remote peer may hold at once (a client certificate's key under TLS,
    /// else an address; local clients are not counted): past it that peer is refused
    /// `SERVER_NO_RESOURCE` while others still register. Default: half of --clients.
    #[arg(long)]
    clients_per_peer: Option<u32>,
    /// Cached grants: how long one is kept before a conflicting request may revoke it, in
    /// milliseconds (default 0: revoked at once; the holder gives it back after its local
    /// users, so it always gets its use). For engines whose use outlasts the user that asked.
    /// A grant on a lock fought over in the two contention windows before it has none.
    #[arg(long)]
    min_hold_ms: Option<u32>,
    /// Cached grants: how long a holder has to give a revoked lock back before it loses it as
    /// at the end of its lease, in milliseconds (default 0: the holder's lease).
    #[arg(long)]
    revoke_timeout_ms: Option<u32>,
    /// Cached grants: how long after a conflict on it a lock is granted plain to requests that
    /// ask for caching, in milliseconds (default 1000; 0 turns contention-aware grants off).
    #[arg(long)]
    contention_window_ms: Option<u32>,
    /// umo_atomic64 objects.
    #[arg(long)]
    objects: Option<u32>,
    /// Client lease in milliseconds for clients that ask for none: silent clients are declared
    /// dead after it.
    #[arg(long)]
    lease_ms: Option<u32>,
    /// The longest lease granted in milliseconds (default 30000): a client asking for more gets
    /// this, so a killed client's locks are free within it.
    #[arg(long)]
    lease_max_ms: Option<u32>,
    /// Clients expected to re-sync after a failover before the server serves.
    #[arg(long)]
    recovery_clients: Option<u32>,
    /// Server epoch (high bits of fencing tokens): larger than the previous server's.
    #[arg(long)]
    epoch: Option<u16>,
    /// Idle strategy of the data thread: spin, adaptive or park.
    #[arg(long)]
    idle: Option<String>,
    /// Pin the control thread to this CPU.
    #[arg(long)]
    pin_control: Option<usize>,
    /// Pin the data thread to this CPU.
    #[arg(long)]
    pin_data: Option<usize>,
    /// Back the region with /dev/shm/NAME for clients in other processes on this host.
    #[arg(long)]
    shm_name: Option<String>,
    /// The Unix socket local clients connect to.
    #[arg(long)]
    unix_socket: Option<PathBuf>,
    /// Ask for transparent huge pages (`--huge-pages=false` turns off a `huge_pages = true` in
    /// the TOML file).
    // `Option` like every other setting, so a flag left out defers to the file and a flag
    // given wins either way; a plain `bool` flag could only ever switch it on.
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    huge_pages: Option<bool>,
    /// Serve the counters (`dlock stat`'s, and a cluster member's view) for Prometheus at
    /// `http://ADDR/metrics`.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Serve data messages and one-sided object operations over RDMA on this device (as
    /// `ibv_devices` names it). Without a usable device the server logs why and serves TCP and
    /// shared memory only.
    #[cfg(feature = "rdma")]
    #[arg(long)]
    rdma_device: Option<String>,
    /// The RDMA device's port, counted from 1 (default 1).
    #[cfg(feature = "rdma")]
    #[arg(long, requires = "rdma_device")]
    rdma_port: Option<u8>,
    /// The GID index to route with (RoCE; default: index 0 on Ethernet, none on InfiniBand).
    #[cfg(feature = "rdma")]
    #[arg(long, requires = "rdma_device")]
    rdma_gid_index: Option<u8>,
    /// Cluster membership (feature `cluster`; the TOML file's `[cluster]` table).
    #[cfg(feature = "cluster")]
    #[command(flatten)]
    cluster: cluster::ClusterArgs,
}

impl ServeArgs {
    /// These settings (from flags) over `file`'s: each one given here wins, the others come
    /// from the file.
    fn over(self, file: ServeArgs) -> ServeArgs {
        ServeArgs {
            config: None,
            bind: self.bind.or(file.bind),
            locks: self.locks.or(file.locks),
            clients: self.clients.or(file.clients),
            clients_per_peer: self.clients_per_peer.or(file.clients_per_peer),
            min_hold_ms: self.min_hold_ms.or(file.min_hold_ms),
            revoke_timeout_ms: self.revoke_timeout_ms.or(file.revoke_timeout_ms),
            contention_window_ms: self.contention_window_ms.or(file.contention_window_ms),
            objects: self.objects.or(file.objects),
            lease_ms: self.lease_ms.or(file.lease_ms),
            lease_max_ms: self.lease_max_ms.or(file.lease_max_ms),
            insecure_plaintext: self.insecure_plaintext.or(file.insecure_plaintext),
            session_key_file: self.session_key_file.or(file.session_key_file),
            insecure_recovery: self.insecure_recovery.or(file.insecure_recovery),
            recoverer: self.recoverer.or(file.recoverer),
            recoverer_address: self.recoverer_address.or(file.recoverer_address),
            recoverer_local: self.recoverer_local.or(file.recoverer_local),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            tls_ca: self.tls_ca.or(file.tls_ca),
            tls_crl: self.tls_crl.or(file.tls_crl),
            tls_key_password_file: self.tls_key_password_file.or(file.tls_key_password_file),
            tls_cipher_suites: self.tls_cipher_suites.or(file.tls_cipher_suites),
            recovery_clients: self.recovery_clients.or(file.recovery_clients),
            epoch: self.epoch.or(file.epoch),
            idle: self.idle.or(file.idle),
            pin_control: self.pin_control.or(file.pin_control),
            pin_data: self.pin_data.or(file.pin_data),
            shm_name: self.shm_name.or(file.shm_name),
            unix_socket: self.unix_socket.or(file.unix_socket),
            huge_pages: self.huge_pages.or(file.huge_pages),
            metrics_addr: self.metrics_addr.or(file.metrics_addr),
            #[cfg(feature = "rdma")]
            rdma_device: self.rdma_device.or(file.rdma_device),
            #[cfg(feature = "rdma")]
            rdma_port: self.rdma_port.or(file.rdma_port),
            #[cfg(feature = "rdma")]
            rdma_gid_index: self.rdma_gid_index.or(file.rdma_gid_index),
            #[cfg(feature = "cluster")]
            cluster: self.cluster.over(file.cluster),
        }
    }
}

/// The server's TLS settings from `args`, with the key's files checked now.
fn server_tls(args: &ServeArgs) -> Result<Option<TlsConfig>, String> {
    let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca) else {
        // Flags are checked by clap; a TOML file is not, and a TLS setting that is silently
        // dropped would leave the server in plaintext.
        let any = args.tls_cert.is_some()
            || args.tls_key.is_some()
            || args.tls_ca.is_some()
            || args.tls_crl.is_some()
            || args.tls_key_password_file.is_some()
            || args.tls_cipher_suites.is_some();
        if any {
            return Err("TLS needs all of tls_cert, tls_key and tls_ca".into());
        }
        return Ok(None);
    };
    for secret in [Some(key), args.tls_key_password_file.as_ref()]
        .into_iter()
        .flatten()
    {
        warn_if_shared(secret);
    }
    let mut cfg = TlsConfig::new(cert, key, ca);
    for crl in args.tls_crl.iter().flatten() {
        cfg = cfg.with_crl(crl);
    }
    if let Some(names) = &args.tls_cipher_suites {
        let suites = names
            .iter()
            .map(|n| n.parse::<Tls13Suite>().map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        cfg = cfg.with_cipher_suites(&suites);
    }
    if let Some(file) = args.tls_key_password_file.clone() {
        cfg = cfg.with_key_password(move || {
            let text = zeroize::Zeroizing::new(std::fs::read_to_string(&file)?);
            Ok(zeroize::Zeroizing::new(
                text.lines().next().unwrap_or_default().to_owned(),
            ))
        });
    }
    // Read the files now, so a bad path or key is reported before anything starts.
    dlock_transport::tls::server_config(&cfg).map_err(|e| e.to_string())?;
    Ok(Some(cfg))
}

/// Logs a warning when a secret file can be read by anyone but its owner.
fn warn_if_shared(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
            "a secret file is readable by others than its owner; chmod 600 it"
        );
    }
}

/// `args` over the TOML file it names, if any.
fn with_file(mut args: ServeArgs) -> Result<ServeArgs, String> {
    if let Some(path) = args.config.take() {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file: ServeArgs =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        args = args.over(file);
    }
    Ok(args)
}

/// The cluster settings taken out of `args` over its file (a `[cluster]` table in the file
/// counts as much as the flags), checked against the standalone server's own settings.
#[cfg(feature = "cluster")]
fn take_cluster(args: ServeArgs) -> Result<(ServeArgs, cluster::ClusterArgs), String> {
    let mut args = with_file(args)?;
    let cluster = std::mem::take(&mut args.cluster);
    if cluster.enabled() && args.epoch.is_some() {
        return Err("--epoch is for a standalone server: a cluster's epochs come from etcd".into());
    }
    Ok((args, cluster))
}

fn serve_config(args: ServeArgs) -> Result<ServerConfig, String> {
    let args = with_file(args)?;
    let d = Config::default();
    let core = Config {
        locks_max: args.locks.unwrap_or(d.locks_max),
        clients_max: args.clients.unwrap_or(d.clients_max),
        objects_max: args.objects.unwrap_or(d.objects_max),
        client_lease_ms: args.lease_ms.unwrap_or(d.client_lease_ms),
        client_lease_max_ms: args.lease_max_ms.unwrap_or(d.client_lease_max_ms),
        recovery_clients: args.recovery_clients.unwrap_or(0),
        epoch: args.epoch.unwrap_or(d.epoch),
        recovery_deadline_ms: d.recovery_deadline_ms,
        clients_per_peer_max: args.clients_per_peer.unwrap_or(d.clients_per_peer_max),
        timing: dlock_core::manager::Timing {
            min_hold_ms: args.min_hold_ms.unwrap_or(d.timing.min_hold_ms),
            revoke_timeout_ms: args.revoke_timeout_ms.unwrap_or(d.timing.revoke_timeout_ms),
            contention_window_ms: args
                .contention_window_ms
                .unwrap_or(d.timing.contention_window_ms),
        },
    };
    if let Some(field) = core.invalid_field() {
        return Err(field.to_string());
    }
    let bind = args
        .bind
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], dlock_core::config::DEFAULT_PORT)));
    if !(1024..=65535).contains(&bind.port()) {
        return Err(format!("port {} is outside 1024-65535", bind.port()));
    }
    let tls = server_tls(&args)?;
    if tls.is_none() && !bind.ip().is_loopback() && !args.insecure_plaintext.unwrap_or(false) {
        return Err(format!(
            "refusing to serve plaintext TCP on {bind}: anyone who reaches it could register, \
             and names and values would cross the network in clear; give --tls-cert, --tls-key \
             and --tls-ca, bind a loopback address, or pass --insecure-plaintext for a network \
             you trust entirely"
        ));
    }
    let mut cfg = ServerConfig::new(core);
    let mut tcp = TcpConfig::new(bind);
    tcp.tls = tls;
    tcp.insecure_plaintext = args.insecure_plaintext.unwrap_or(false);
    cfg.tcp = Some(tcp);
    cfg.idle = match args.idle {
        Some(s) => s.parse()?,
        None => IdleStrategy::Adaptive,
    };
    cfg.pin = (args.pin_control, args.pin_data);
    cfg.shm_name = args.shm_name;
    cfg.unix_socket = args.unix_socket;
    cfg.huge_pages = args.huge_pages.unwrap_or(false);
    if let Some(path) = &args.session_key_file {
        cfg.session_key =
            Some(dlock_transport::runtime::read_session_key_file(path).map_err(|e| e.to_string())?);
    }
    cfg.insecure_recovery = args.insecure_recovery.unwrap_or(false);
    cfg.recoverers = dlock_transport::runtime::Recoverers {
        names: args.recoverer.unwrap_or_default(),
        addresses: args.recoverer_address.unwrap_or_default(),
        local: args.recoverer_local.unwrap_or(false),
    };
    if core.recovery_clients > 0 && cfg.session_key.is_none() && !cfg.insecure_recovery {
        return Err(format!(
            "refusing to recover {} clients without a session key: anyone who reaches the \
             server while it recovers could re-register as any client and take its locks; give \
             the failed server's --session-key-file, or pass --insecure-recovery for a network \
             you trust entirely",
            core.recovery_clients
        ));
    }
    #[cfg(feature = "rdma")]
    if let Some(device) = &args.rdma_device {
        let mut rdma = dlock_transport::rdma::RdmaConfig::new(device);
        rdma.port_num = args.rdma_port.unwrap_or(rdma.port_num);
        if rdma.port_num == 0 {
            return Err("RDMA ports are counted from 1".to_string());
        }
        rdma.gid_index = args.rdma_gid_index;
        cfg.rdma = Some(rdma);
    } else if args.rdma_port.is_some() || args.rdma_gid_index.is_some() {
        return Err("rdma_port and rdma_gid_index need rdma_device".to_string());
    }
    Ok(cfg)
}

pub(crate) fn serve(args: ServeArgs) -> Result<(), String> {
    let args = with_file(args)?;
    let metrics_addr = args.metrics_addr;
    #[cfg(feature = "cluster")]
    let (args, cluster) = take_cluster(args)?;
    #[allow(unused_mut)]
    let mut cfg = serve_config(args)?;
    #[cfg(feature = "cluster")]
    let agent = match cluster.enabled() {
        true => Some(cluster.join(&mut cfg)?),
        false => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|e| e.to_string())?;
    }
    let server = ServerHandle::start(cfg.clone()).map_err(|e| format!("cannot start: {e}"))?;
    // The clients served, which the file-descriptor limit may have lowered from the configured.
    let fds = server.fd_budget();
    println!(
        "dlock serving on {} (unix socket {}); {} locks, {} clients, {} objects; \
         {} connections within RLIMIT_NOFILE {}; Ctrl-C stops",
        server.tcp_addr().map_or("-".into(), |a| a.to_string()),
        server.unix_socket().display(),
        cfg.core.locks_max,
        fds.clients_max,
        cfg.core.objects_max,
        fds.connections_max,
        fds.limit,
    );
    #[cfg(feature = "rdma")]
    if let Some(rdma) = &cfg.rdma {
        if server.rdma_enabled() {
            println!("RDMA data path on {}", rdma.device);
        } else {
            println!(
                "RDMA unavailable on {} (see the log); TCP and shared memory only",
                rdma.device
            );
        }
    }
    let membership = cfg.cluster.as_ref().map(|c| Arc::clone(&c.membership));
    let metrics = metrics_addr
        .map(|a| metrics::MetricsServer::start(a, Endpoint::embedded(&server), membership))
        .transpose()
        .map_err(|e| format!("--metrics-addr: {e}"))?;
    if let Some(m) = &metrics {
        println!("metrics for Prometheus at http://{}/metrics", m.addr());
    }
    // `kill -USR1 <pid>` drains a cluster server: the coordinator moves its partitions away
    // (their clients re-claim at the new owners); stop it with SIGTERM once `dlock cluster
    // status` shows it owns nothing.
    #[cfg(feature = "cluster")]
    let drain = {
        let drain = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(&drain))
            .map_err(|e| e.to_string())?;
        drain
    };
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        #[cfg(feature = "cluster")]
        if drain.swap(false, Ordering::AcqRel)
            && let Some(agent) = &agent
        {
            tracing::info!("draining: the cluster moves this server's partitions away");
            agent.handle().drain();
        }
    }
    tracing::info!("shutting down");
    drop(metrics);
    server.stop();
    // Only now, with nothing granted any more, may the partitions move at once.
    #[cfg(feature = "cluster")]
    if let Some(agent) = agent {
        agent.leave();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
