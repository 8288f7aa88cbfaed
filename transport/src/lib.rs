//! `dlock-transport`: everything of dlock that does I/O.
//!
//! It owns the region — the one memory mapping that holds a server's tables — and what builds on
//! it: the server runtime (the two poll-loop threads), the shared-memory, TCP (with TLS) and
//! RDMA transports, and the client.
//!
//! # Which API to start with
//!
//! **The native API is the default: [`client::Locks`], its typed lock handles and their
//! guards.** Locks are named and typed by kind ([`client::AtomicLock`], [`client::RwLock`],
//! [`client::FairLock`]), so a call the kind does not support does not compile; every taking
//! call is blocking or `async` (any executor); a grant is a guard (e.g.
//! [`client::RwLockWriteGuard`]) that unlocks when dropped and carries the fencing token
//! storage checks writes against; a handle is shared by threads and tasks; and a busy lock is
//! an [`ErrorKind::WouldBlock`](client::ErrorKind::WouldBlock). Nothing can be left locked by a
//! forgotten unlock. New Rust code starts here.
//!
//! **The reference-shaped [`client::Client`] is the port path**: the reference's client API call
//! by call (raw ids, `trylock(id, mode, expire_ms)`, batches of 31, the async pair,
//! `umo_atomic64` objects, `update_all_locks` after a failover), for code written against the
//! reference and for the C ABI that `dlock-engine-glue` builds on it. It also reaches what the
//! native API does not yet: objects, pipelined batches, recovery.
//!
//! Both return [`client::Error`]: the reference's `Status`, the call that failed and the I/O
//! error behind a transport failure.
//!
//! **Both run over a cluster** of dlock servers ([`client::cluster`]: the map read from any
//! server, each lock routed to its partition's owner, moves followed and re-claimed), with no
//! etcd in the client.
//!
//! # Features: a client as small as its transport
//!
//! | features | what it builds | for |
//! |---|---|---|
//! | `server`, `tls` (default) | the server runtime ([`runtime`], the in-process endpoint) and TLS | a server, an engine that embeds one |
//! | none (`default-features = false`) | the client over shared memory and plaintext TCP | a client on the server's host, or on a trusted network |
//! | `tls` only | the client, also over TLS 1.3 ([`tls`], `Endpoint::tls`) | a remote client |
//! | `rdma` | the RDMA transport (needs rdma-core to build) | RDMA hardware |
//!
//! A client without `tls` compiles no rustls, ring, webpki or pkcs8 (17 crates instead of 58;
//! the README lists the counts). `server` implies `tls`. The `dlock` command is the `dlock-cli`
//! package.
//!
//! # A first look
//!
//! A server in this process, a client of it, and a named lock whose guard unlocks on drop:
//!
//! ```
//! use std::time::Duration;
//!
//! use dlock_core::Config;
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
//! let guard = row_group.write(Duration::from_secs(1))?; // waits up to 1 s on the server
//! println!("writing under fencing token {:?}", guard.token());
//! drop(guard); // unlocks (sent at once; the answer is read by the handle's next call)
//! # drop((row_group, locks));
//! # server.stop();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Where next:
//! - [`client`]: the client — the native API ([`client::Locks`]), the reference-shaped
//!   [`client::Client`], the error, the endpoints ([`client::Endpoint`]: in-process, another
//!   process on this host over `/dev/shm`, TCP, TLS, RDMA) and a shared connection
//!   ([`client::Mux`]);
//! - [`runtime`] (feature `server`): [`runtime::ServerConfig`], [`runtime::ServerHandle`], the
//!   idle strategies and what the two threads do;
//! - [`tls`] (feature `tls`): TLS 1.3 with client certificates for TCP.

// The docs link the feature-gated modules (`runtime`, `tls`) by name; documented without them,
// those links stay text rather than fail the build.
#![cfg_attr(
    not(all(feature = "server", feature = "tls")),
    allow(rustdoc::broken_intra_doc_links)
)]

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
#[cfg(feature = "tls")]
pub mod tls;

pub use region::Region;
