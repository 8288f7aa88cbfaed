//! `dlock`: run a server, read its counters, or drive a workload against it.
//!
//! ```text
//! dlock serve [--bind 127.0.0.1:21616] [--config dlock.toml] [--idle adaptive] ...
//! dlock stat  [--connect 127.0.0.1:21616]
//! dlock drain [--connect 127.0.0.1:21616]      (a cluster server: give its partitions away)
//! dlock cluster status [--connect ANY-SERVER]
//! dlock bench [--embedded | --connect ADDR] [--mix trylock] [--clients 4] [--duration 5]
//! ```
//!
//! One module per subcommand that needs more than a few lines: `serve` (settings, flags over
//! the TOML file, the running server), `bench`, `drain`, `status` (`dlock cluster status`),
//! with `cluster` (the `[cluster]` settings of `serve`) and `metrics` (`--metrics-addr`)
//! beside `serve`. This file holds the command line and the small subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod bench;
#[cfg(feature = "cluster")]
mod cluster;
mod drain;
mod metrics;
mod serve;
mod status;

use clap::{Parser, Subcommand};
use dlock_transport::client::{Endpoint, Error};
use dlock_transport::tls::TlsConfig;

use bench::BenchArgs;
use serve::ServeArgs;

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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Serve(args) => serve::serve(*args),
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
        Command::Bench(args) => bench::bench(args),
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
