//! `dlock-engine-glue`: what a storage engine links to get global transaction ids, commit
//! sequence numbers and row-group locks from dlock.
//!
//! # The guide
//!
//! An engine embeds the dlock server in its own process and gives each worker thread its own
//! client handle (a client instance is single-threaded, as in the reference):
//!
//! ```
//! use dlock_engine_glue::EmbeddedServer;
//! use dlock_engine_glue::dlock_core::{Config, LockKind, Mode};
//!
//! let server = EmbeddedServer::start(EmbeddedServer::config(Config {
//!     locks_max: 1_024,
//!     clients_max: 16,
//!     objects_max: 16,
//!     ..Config::default()
//! }))
//! .unwrap();
//! let mut worker = server.client().unwrap();
//! let rg = worker.get_lock(LockKind::Rw, b"orders/rg-17").unwrap();
//! let grant = worker.trylock(rg, Mode::Exclusive, 5_000).unwrap();
//! // Storage writes carry `grant.token`: a fencing token larger than any issued before.
//! assert!(grant.token.0 > 0);
//! worker.unlock(rg).unwrap();
//! server.shutdown();
//! ```
//!
//! Clients in other processes on the host reach the same server through shared memory
//! ([`EmbeddedServer::local_endpoint`], when started with a `/dev/shm` name), other nodes over
//! TCP ([`EmbeddedServer::tcp_addr`], when a listener is configured).

pub mod embedded;
/// The C ABI (`include/dlock.h`): the reference's `dlock_server_api.h` and `dlock_client_api.h`.
pub mod ffi;
pub mod ids;
pub mod rowgroup;

pub use dlock_core;
pub use dlock_transport;
pub use embedded::EmbeddedServer;
pub use ids::{
    BlockPolicy, Csn, CsnAllocator, HighWaterMark, IdConfig, IdStats, TxnId, TxnIdAllocator,
    TxnIdHandle, Volatile,
};
