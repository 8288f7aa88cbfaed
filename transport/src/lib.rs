//! `dlock-transport`: everything of dlock that does I/O.
//!
//! It owns the region — the one memory mapping that holds a server's tables — and what builds on
//! it: the server runtime (the two poll-loop threads, feature `server`, on by default), the
//! shared-memory, TCP (with TLS) and RDMA transports, and the thin client. A process that is
//! only a client depends on it with `default-features = false` and compiles no server runtime.
//! The `dlock` command is the `dlock-cli` package.
//!
//! # A first look
//!
//! A server in this process, a client of it, and a named lock whose guard unlocks on drop:
//!
//! ```
//! use std::time::Duration;
//!
//! use dlock_core::{Config, Mode};
//! use dlock_transport::client::{ClientConfig, Endpoint, Locks};
//! use dlock_transport::runtime::{ServerConfig, ServerHandle};
//!
//! let server = ServerHandle::start(ServerConfig::new(Config {
//!     locks_max: 1_024,
//!     clients_max: 16,
//!     objects_max: 16,
//!     ..Config::default()
//! }))?;
//! let locks = Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
//! let row_group = locks.rw("orders/rg-17")?;
//! let guard = row_group.try_lock(Mode::Exclusive, Duration::from_secs(5))?;
//! println!("writing under fencing token {:?}", guard.token());
//! drop(guard); // unlocked
//! # drop((row_group, locks));
//! # server.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Where next:
//! - [`client`]: the client — the named-lock API ([`client::Locks`]) and the reference-shaped
//!   [`client::Client`] (raw ids, batches, pipelining, `umo_atomic64` objects, recovery);
//! - [`runtime`] (feature `server`): [`runtime::ServerConfig`], [`runtime::ServerHandle`], the
//!   idle strategies and what the two threads do;
//! - [`tls`]: TLS 1.3 with client certificates for TCP;
//! - the endpoints: [`client::Endpoint`] — in-process, another process on this host over
//!   `/dev/shm`, TCP, TLS, RDMA (feature `rdma`).

pub mod client;
pub mod futex;
mod patience;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod region;
#[cfg(feature = "server")]
pub mod runtime;
pub mod shm;
mod sync;
pub mod tls;

pub use region::Region;
