//! `dlock`: run a server, read its counters, or drive a workload against it.
//!
//! ```text
//! dlock serve [--bind 127.0.0.1:21616] [--config dlock.toml] [--idle adaptive] ...
//! dlock stat  [--connect 127.0.0.1:21616]
//! dlock drain [--connect 127.0.0.1:21616]      (a cluster server: give its partitions away)
//! dlock cluster status [--connect ANY-SERVER]
//! dlock bench [--embedded | --connect ADDR] [--mix trylock] [--clients 4] [--duration 5]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[cfg(feature = "cluster")]
mod cluster;
mod drain;
mod metrics;
mod status;

use clap::{Parser, Subcommand, ValueEnum};
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Error};
use dlock_transport::runtime::{IdleStrategy, ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::{Tls13Suite, TlsConfig};
use serde::Deserialize;

#[derive(Parser, Debug)]
#[command(
    name = "dlock",
    version,
    about = "A distributed lock core for database storage engines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a standalone server until SIGINT or SIGTERM.
    Serve(Box<ServeArgs>),
    /// Print a server's counters (without registering a client, so it answers while the
    /// client table is full).
    Stat {
        /// The server's TCP address.
        #[arg(long, default_value = "127.0.0.1:21616")]
        connect: SocketAddr,
        #[command(flatten)]
        tls: ClientTlsArgs,
    },
    /// List the locks dead clients retain for recovery (needs the recoverer role: see
    /// `serve --recoverer`).
    Retained {
        /// The server's TCP address.
        #[arg(long, default_value = "127.0.0.1:21616")]
        connect: SocketAddr,
        /// Only this dead client's (default: every dead client's).
        #[arg(long, default_value_t = 0)]
        client: u32,
        #[command(flatten)]
        tls: ClientTlsArgs,
    },
    /// Release the locks dead client CLIENT retains, once its work is replayed (needs the
    /// recoverer role).
    RecoveryDone {
        /// The server's TCP address.
        #[arg(long, default_value = "127.0.0.1:21616")]
        connect: SocketAddr,
        /// The dead client's id (as `dlock retained` lists it).
        client: u32,
        #[command(flatten)]
        tls: ClientTlsArgs,
    },
    /// Drive a workload and print throughput and latency percentiles.
    Bench(BenchArgs),
    /// Ask a cluster server to give its partitions away, and wait until it owns none (then
    /// stop it with SIGTERM). Only over TLS with a client certificate, or from its own host.
    Drain {
        /// The server to drain.
        #[arg(long, default_value = "127.0.0.1:21616")]
        connect: SocketAddr,
        #[command(flatten)]
        tls: ClientTlsArgs,
        /// How long to wait for the partitions to move, in seconds.
        #[arg(long, default_value_t = 300)]
        wait_s: u64,
    },
    /// A cluster's state as its servers see it (no etcd needed).
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// The map (members, partitions, epochs, takeovers) from any server, and each member's
    /// counters (partitions owned and recovering, moved and fenced answers, load) and link to
    /// etcd (reachable or since when not, last keepalive confirmed).
    Status {
        /// Any server of the cluster.
        #[arg(long, default_value = "127.0.0.1:21616")]
        connect: SocketAddr,
        #[command(flatten)]
        tls: ClientTlsArgs,
        /// Also print every partition's owner, epoch and handover.
        #[arg(long)]
        partitions: bool,
    },
}

/// Server settings; every flag can also come from the TOML file (flags win).
#[derive(clap::Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServeArgs {
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
    /// milliseconds (default 5), so two nodes cannot bounce a hot lock faster than either gets
    /// work done.
    #[arg(long)]
    min_hold_ms: Option<u32>,
    /// Cached grants: how long a holder has to give a revoked lock back before it loses it as
    /// at the end of its lease, in milliseconds (default 0: the holder's lease).
    #[arg(long)]
    revoke_timeout_ms: Option<u32>,
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

/// A client's TLS settings (`dlock stat`, `dlock bench --connect`): all three files, or none
/// for plaintext.
#[derive(clap::Args, Debug, Default)]
struct ClientTlsArgs {
    /// This client's certificate chain (PEM); with it, the connection is TLS 1.3.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA bundle (PEM) the server's certificate must chain to.
    #[arg(long, requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// The name the server's certificate must carry (default: the address's IP).
    #[arg(long, requires = "tls_cert")]
    tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    /// The endpoint of a server at `addr`: TLS with these files, or plaintext without.
    fn endpoint(&self, addr: SocketAddr) -> Result<Endpoint, String> {
        let (Some(cert), Some(key), Some(ca)) = (&self.tls_cert, &self.tls_key, &self.tls_ca)
        else {
            return Ok(Endpoint::Tcp(addr));
        };
        let mut cfg = TlsConfig::new(cert, key, ca);
        if let Some(name) = &self.tls_server_name {
            cfg = cfg.with_server_name(name);
        }
        Endpoint::tls(addr, &cfg).map_err(|e| e.to_string())
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

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mix {
    /// Trylock + unlock of a private key per client (no contention).
    Trylock,
    /// Blocking lock + unlock on a few shared keys (contention and hand-offs).
    Contended,
    /// 31-key batch trylock + batch unlock.
    Batch,
    /// Fetch-and-add on one shared object (XID allocation).
    Faa,
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    /// Start a server in this process and use the shared-memory transport.
    #[arg(long, conflicts_with = "connect")]
    embedded: bool,
    /// A server's TCP address.
    #[arg(long)]
    connect: Option<SocketAddr>,
    #[command(flatten)]
    tls: ClientTlsArgs,
    /// The operation mix.
    #[arg(long, value_enum, default_value = "trylock")]
    mix: Mix,
    /// Client threads.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Keys (locks) to spread the load over.
    #[arg(long, default_value_t = 64)]
    keys: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5)]
    duration: u64,
    /// Batch mix: batches each client keeps in flight (1: synchronous; up to 4, see
    /// `Client::submit_trylock`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=4))]
    depth: u8,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Serve(args) => serve(*args),
        Command::Stat { connect, tls } => stat(connect, &tls),
        Command::Retained {
            connect,
            client,
            tls,
        } => retained(connect, client, &tls),
        Command::RecoveryDone {
            connect,
            client,
            tls,
        } => recovered(connect, client, &tls),
        Command::Bench(args) => bench(args),
        Command::Drain {
            connect,
            tls,
            wait_s,
        } => drain_server(connect, &tls, Duration::from_secs(wait_s)),
        Command::Cluster {
            command:
                ClusterCommand::Status {
                    connect,
                    tls,
                    partitions,
                },
        } => status::status(connect, &|a| tls.endpoint(a), partitions),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlock: {e}");
            ExitCode::FAILURE
        }
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

fn serve(args: ServeArgs) -> Result<(), String> {
    let args = with_file(args)?;
    let metrics_addr = args.metrics_addr;
    #[cfg(feature = "cluster")]
    let (args, cluster) = take_cluster(args)?;
    #[allow(unused_mut)]
    let mut cfg = serve_config(args)?;
    #[cfg(feature = "cluster")]
    let agent = match cluster.enabled() {
        true => {
            let bind = cfg
                .tcp
                .as_ref()
                .map(|t| t.listen)
                .ok_or("a cluster server needs TCP")?;
            Some(cluster.join(&mut cfg, bind)?)
        }
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

fn drain_server(addr: SocketAddr, tls: &ClientTlsArgs, wait: Duration) -> Result<(), String> {
    let endpoint = tls.endpoint(addr)?;
    drain::drain(&endpoint, wait, &mut |n| {
        println!("{addr}: owns {n} partitions");
    })
    .map_err(|e| format!("{addr}: {e}"))?;
    println!("{addr} is drained: it owns no partition; stop it with SIGTERM");
    Ok(())
}

fn stat(addr: SocketAddr, tls: &ClientTlsArgs) -> Result<(), String> {
    let stats =
        dlock_transport::client::read_server_stats(&tls.endpoint(addr)?, Duration::from_secs(5))
            .map_err(|e| format!("{addr}: {}", reason(&e)))?;
    let count = |n: &str| stats.iter().find(|(k, _)| *k == n).map_or(0, |(_, v)| *v);
    let retained_now = count("locks_retained").saturating_sub(count("retained_released"));
    for (name, v) in &stats {
        println!("{name:<28} {v}");
    }
    println!("{:<28} {retained_now}", "retained_now");
    Ok(())
}

fn retained(addr: SocketAddr, client: u32, tls: &ClientTlsArgs) -> Result<(), String> {
    let locks = dlock_transport::client::list_retained(
        &tls.endpoint(addr)?,
        client,
        Duration::from_secs(5),
    )
    .map_err(|e| format!("{addr}: {}", reason(&e)))?;
    println!(
        "{:<12} {:<12} {:<6} {:<9} name",
        "client", "lock", "kind", "mode"
    );
    for l in locks {
        println!(
            "{:<12} {:<12} {:<6} {:<9} {}",
            l.client,
            l.lock,
            format!("{:?}", l.kind),
            format!("{:?}", l.mode),
            String::from_utf8_lossy(&l.name)
        );
    }
    Ok(())
}

fn recovered(addr: SocketAddr, client: u32, tls: &ClientTlsArgs) -> Result<(), String> {
    let n = dlock_transport::client::recovery_done(
        &tls.endpoint(addr)?,
        client,
        Duration::from_secs(5),
    )
    .map_err(|e| format!("{addr}: {}", reason(&e)))?;
    println!("released {n} retained locks of client {client}");
    Ok(())
}

/// What a person should read about a failed call: why the transport failed when it did (a TLS
/// refusal says which: "TLS handshake refused by server: client certificate expired or not yet
/// valid", "server certificate not trusted", "server name mismatch", "server speaks TLS, client
/// plaintext"), else the status.
fn reason(e: &Error) -> String {
    match e.io_error() {
        Some(io) => format!("{io} [{}]", e.status()),
        None => e.status().to_string(),
    }
}

fn bench(args: BenchArgs) -> Result<(), String> {
    let (server, endpoint) = match (args.embedded, args.connect) {
        (_, Some(addr)) => (None, args.tls.endpoint(addr)?),
        (_, None) => {
            let s = ServerHandle::start(ServerConfig::new(Config::default()))
                .map_err(|e| e.to_string())?;
            let e = Endpoint::embedded(&s);
            (Some(s), e)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    let done = AtomicU64::new(0);
    let bar = indicatif::ProgressBar::new(args.duration);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:30}] {msg}")
            .map_err(|e| e.to_string())?,
    );
    let start = Instant::now();
    let hist = std::thread::scope(|sc| -> Result<hdrhistogram::Histogram<u64>, String> {
        let workers: Vec<_> = (0..args.clients)
            .map(|i| {
                let (endpoint, done) = (endpoint.clone(), &done);
                sc.spawn(move || {
                    worker(
                        i, &endpoint, args.mix, args.depth, args.keys, deadline, done,
                    )
                })
            })
            .collect();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            let ops = done.load(Ordering::Relaxed);
            bar.set_position(start.elapsed().as_secs());
            bar.set_message(format!(
                "{:.2} M ops/s",
                ops as f64 / start.elapsed().as_secs_f64() / 1e6
            ));
        }
        let mut total = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        for w in workers {
            let h = w.join().map_err(|_| "a worker panicked".to_string())??;
            total.add(h).map_err(|e| e.to_string())?;
        }
        Ok(total)
    })?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let ops = done.load(Ordering::Relaxed);
    println!(
        "{:?} over {}: {} clients, {} keys, {:.1} s",
        args.mix,
        if server.is_some() {
            "shared memory (embedded)"
        } else {
            "TCP"
        },
        args.clients,
        args.keys,
        secs
    );
    println!(
        "throughput  {:.3} M lock operations/s ({ops} operations)",
        ops as f64 / secs / 1e6
    );
    println!(
        "latency     p50 {:.2} µs   p99 {:.2} µs   p99.9 {:.2} µs   max {:.2} µs (per request; a batch is one)",
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
        hist.value_at_quantile(0.999) as f64 / 1e3,
        hist.max() as f64 / 1e3
    );
    if let Some(s) = server {
        s.stop();
    }
    Ok(())
}

/// One benchmark client: runs `mix` until `deadline`, recording each request's latency (ns).
fn worker(
    i: usize,
    endpoint: &Endpoint,
    mix: Mix,
    depth: u8,
    keys: usize,
    deadline: Instant,
    done: &AtomicU64,
) -> Result<hdrhistogram::Histogram<u64>, String> {
    let mut h = hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let mut c = Client::connect(ClientConfig::new(endpoint.clone()))
        .map_err(|e| format!("connect: {}", reason(&e)))?;
    let err = |e: Error| reason(&e);
    match mix {
        Mix::Trylock => {
            let id = c
                .get_lock(
                    LockKind::Atomic,
                    format!("bench-{i}-{}", i % keys.max(1)).as_bytes(),
                )
                .map_err(err)?;
            while Instant::now() < deadline {
                let t = Instant::now();
                // The benchmark writes nothing the token would fence.
                let _grant = c.trylock(id, Mode::Exclusive, 5_000).map_err(err)?;
                let _unlocked = c.unlock(id).map_err(err)?;
                let _ = h.record(t.elapsed().as_nanos() as u64 / 2);
                done.fetch_add(2, Ordering::Relaxed);
            }
        }
        Mix::Contended => {
            let ids: Vec<_> = (0..keys.clamp(1, 4))
                .map(|k| c.get_lock(LockKind::Rw, format!("hot-{k}").as_bytes()))
                .collect::<Result<_, _>>()
                .map_err(err)?;
            let mut k = i;
            while Instant::now() < deadline {
                let id = ids[k % ids.len()];
                k += 1;
                let t = Instant::now();
                match c.lock(id, Mode::Exclusive, 5_000, Duration::from_millis(500)) {
                    Ok(_) => {
                        let _ = h.record(t.elapsed().as_nanos() as u64);
                        let _unlocked = c.unlock(id).map_err(err)?;
                        done.fetch_add(2, Ordering::Relaxed);
                    }
                    Err(e) if e == Status::Etimeout => {}
                    Err(e) => return Err(reason(&e)),
                }
            }
        }
        Mix::Batch => {
            // One set of 31 locks per batch in flight, each alternating trylock and unlock.
            let depth = usize::from(depth).min(c.pipeline_depth());
            let mut sets = Vec::with_capacity(depth);
            for set in 0..depth {
                let names: Vec<String> = (0..31).map(|k| format!("batch-{i}-{set}-{k}")).collect();
                let req: Vec<(LockKind, &[u8])> = names
                    .iter()
                    .map(|n| (LockKind::Atomic, n.as_bytes()))
                    .collect();
                let ids: Vec<_> = c
                    .batch_get_lock(&req)
                    .map_err(err)?
                    .into_iter()
                    .collect::<Result<_, Status>>()
                    .map_err(|s| s.to_string())?;
                let reqs: Vec<_> = ids.iter().map(|&id| (id, Mode::Exclusive, 5_000)).collect();
                sets.push((ids, reqs));
            }
            let mut out = vec![Err(Status::Einval); 31];
            // In flight, oldest first: (set, whether it is a trylock, when it was submitted).
            let mut flight = std::collections::VecDeque::with_capacity(depth);
            for (set, (_, reqs)) in sets.iter().enumerate() {
                c.submit_trylock(reqs, false).map_err(err)?;
                flight.push_back((set, true, Instant::now()));
            }
            while let Some((set, locked, at)) = flight.pop_front() {
                c.complete(&mut out).map_err(err)?;
                let _ = h.record(at.elapsed().as_nanos() as u64);
                if let Some(r) = out.iter().find(|r| r.is_err()) {
                    return Err(format!("batch entry: {r:?}"));
                }
                done.fetch_add(31, Ordering::Relaxed);
                if Instant::now() >= deadline && !locked {
                    continue;
                }
                let (ids, reqs) = &sets[set];
                if locked {
                    c.submit_unlock(ids).map_err(err)?;
                } else {
                    c.submit_trylock(reqs, false).map_err(err)?;
                }
                flight.push_back((set, !locked, Instant::now()));
            }
        }
        Mix::Faa => {
            let _ = c.atomic64_create(b"bench-xid", 1, 3_600);
            let id = c.atomic64_get(b"bench-xid", 3_600).map_err(err)?;
            while Instant::now() < deadline {
                let t = Instant::now();
                c.atomic64_faa(id, 1).map_err(err)?;
                let _ = h.record(t.elapsed().as_nanos() as u64);
                done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let _ = c.deinit();
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_transport::runtime::Recoverers;

    /// `dlock serve --config FILE`, FILE holding `toml`: its cluster settings as `serve` sees
    /// them.
    #[cfg(feature = "cluster")]
    fn serve_cluster(toml: &str) -> Result<cluster::ClusterArgs, String> {
        let dir = std::env::temp_dir().join(format!("dlock-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("serve.toml");
        std::fs::write(&path, toml).unwrap();
        let argv = ["dlock", "serve", "--config", path.to_str().unwrap()];
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
            panic!("not the serve command");
        };
        let r = take_cluster(*args).map(|(_, c)| c);
        let _ = std::fs::remove_dir_all(&dir);
        r
    }

    /// `serve` took the cluster settings out of the flags before it read the file, so a
    /// `[cluster]` table made a standalone server (and its `epoch` went unchecked).
    #[cfg(feature = "cluster")]
    #[test]
    fn a_cluster_table_in_the_file_makes_a_cluster_member() {
        let table = "[cluster]\nendpoints = [\"http://e:2379\"]\nname = \"x\"\nserver_id = 1\n";
        assert!(serve_cluster(table).unwrap().enabled());
        let err = serve_cluster(&format!("epoch = 3\n{table}")).unwrap_err();
        assert!(err.contains("--epoch"), "{err}");
    }

    /// `dlock serve` with `flags`, over a TOML file holding `toml`: the server's config.
    fn merged(flags: &[&str], toml: &str) -> ServerConfig {
        let argv = ["dlock", "serve"].iter().chain(flags);
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
            panic!("not the serve command");
        };
        let file: ServeArgs = toml::from_str(toml).expect("TOML parses");
        serve_config(args.over(file)).expect("a valid config")
    }

    #[test]
    fn huge_pages_flag_overrides_the_toml_file_both_ways() {
        let on = "huge_pages = true";
        let off = "huge_pages = false";
        assert!(
            !merged(&["--huge-pages=false"], on).huge_pages,
            "flag switches it off"
        );
        assert!(
            merged(&["--huge-pages"], off).huge_pages,
            "bare flag switches it on"
        );
        assert!(merged(&["--huge-pages=true"], off).huge_pages);
        assert!(merged(&[], on).huge_pages, "no flag: the file decides");
        assert!(!merged(&[], off).huge_pages);
        assert!(!merged(&[], "").huge_pages, "neither: off");
        assert!(
            Cli::try_parse_from(["dlock", "serve", "--huge-pages", "false"]).is_err(),
            "a value needs `=`, so `--huge-pages` never swallows the next argument"
        );
    }

    /// `dlock serve` with `flags` over the TOML `toml`: the error, if the config is refused.
    fn refusal(flags: &[&str], toml: &str) -> Option<String> {
        let argv = ["dlock", "serve"].iter().chain(flags);
        let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
            panic!("not the serve command");
        };
        let file: ServeArgs = toml::from_str(toml).expect("TOML parses");
        serve_config(args.over(file)).err()
    }

    /// A key file holding `hex`, mode 0600, removed when the returned guard drops.
    fn key_file(tag: &str, hex: &str) -> (PathBuf, impl Drop) {
        use std::os::unix::fs::PermissionsExt;
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let path = std::env::temp_dir().join(format!("dlock-cli-key-{tag}-{}", std::process::id()));
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        (path.clone(), Rm(path))
    }

    #[test]
    fn recovery_without_a_session_key_needs_the_operator_to_say_so() {
        let no_key = refusal(&["--recovery-clients", "3"], "").expect("refused");
        assert!(no_key.contains("without a session key"), "{no_key}");
        assert!(refusal(&["--recovery-clients", "3", "--insecure-recovery"], "").is_none());
        assert!(refusal(&["--recovery-clients", "3"], "insecure_recovery = true").is_none());
        let cfg = merged(&["--recovery-clients", "3", "--insecure-recovery"], "");
        assert!(cfg.insecure_recovery);
        let (path, _rm) = key_file(
            "good",
            "3c9a51e207bd6814f92e85c04b76d31fa8620d97ee355ac4812bf049b6137ddc",
        );
        let cfg = merged(
            &[
                "--recovery-clients",
                "3",
                "--session-key-file",
                path.to_str().unwrap(),
            ],
            "",
        );
        assert!(cfg.session_key.is_some() && !cfg.insecure_recovery);
    }

    #[test]
    fn a_session_key_of_obviously_low_entropy_is_refused_at_start() {
        for (tag, hex) in [("zero", "0".repeat(64)), ("ones", "ab".repeat(32))] {
            let (path, _rm) = key_file(tag, &hex);
            let e = refusal(&["--session-key-file", path.to_str().unwrap()], "").expect("refused");
            assert!(e.contains("distinct byte values"), "{tag}: {e}");
        }
        let counting: String = (0..32u8).map(|b| format!("{b:02x}")).collect();
        let (path, _rm) = key_file("counting", &counting);
        let e = refusal(&["--session-key-file", path.to_str().unwrap()], "").expect("refused");
        assert!(e.contains("step by a constant"), "{e}");
    }

    #[test]
    fn other_flags_override_the_toml_file_and_fill_in_from_it() {
        let file = "locks = 1024\nclients = 10\nidle = \"park\"";
        let cfg = merged(&["--locks", "2048", "--idle", "spin"], file);
        assert_eq!(cfg.core.locks_max, 2048, "the flag wins");
        assert_eq!(cfg.core.clients_max, 10, "the file fills in");
        assert_eq!(cfg.idle, IdleStrategy::Spin);
    }

    #[test]
    fn clients_per_peer_comes_from_the_flag_or_the_file_and_defaults_to_half_the_table() {
        let cfg = merged(&["--clients", "100"], "");
        assert_eq!(cfg.core.clients_per_peer(), 50);
        let cfg = merged(&["--clients-per-peer", "7"], "clients_per_peer = 9");
        assert_eq!(cfg.core.clients_per_peer(), 7, "the flag wins");
        let cfg = merged(&[], "clients_per_peer = 9");
        assert_eq!(cfg.core.clients_per_peer(), 9, "the file fills in");
    }

    #[test]
    fn recoverers_come_from_the_flags_or_the_file_and_default_to_nobody() {
        assert_eq!(merged(&[], "").recoverers, Recoverers::default());
        let cfg = merged(
            &[
                "--recoverer",
                "node-a",
                "--recoverer",
                "node-b",
                "--recoverer-local",
            ],
            "recoverer_address = [\"10.0.0.7\"]",
        );
        assert_eq!(cfg.recoverers.names, ["node-a", "node-b"]);
        assert_eq!(
            cfg.recoverers.addresses,
            ["10.0.0.7".parse::<std::net::IpAddr>().unwrap()]
        );
        assert!(cfg.recoverers.local);
    }
}
