//! `dlock-engine-glue`: what a storage engine links to get global transaction ids, commit
//! sequence numbers and row-group locks from dlock.
//!
//! # Which API to start with
//!
//! - **A Rust engine starts with the engine's own pieces**: [`EmbeddedServer`] (the server in
//!   the engine's process), [`TxnIdAllocator`] and [`CsnAllocator`] (ids leased in blocks, most
//!   of them without a round trip, never repeated across a failover with a [`HighWaterMark`])
//!   and [`rowgroup::RowGroupLocks`] (a transaction's row groups taken in key order, so without
//!   deadlock, all or nothing, released at commit or abort). Each is built on a client from
//!   [`EmbeddedServer::client`].
//! - **For other locks, the native API of `dlock-transport`**: a handle
//!   ([`dlock_transport::client::Locks`], `Locks::from(server.client()?)`) and guards that unlock
//!   when dropped. It is the default for new Rust code.
//! - **The reference-shaped [`Client`](dlock_transport::client::Client)** that
//!   [`EmbeddedServer::client`] returns is the port path: the reference's calls one by one, for
//!   code written against it.
//! - **A C or C++ engine uses the C ABI** ([`ffi`], `include/dlock.h`) or the reference's own
//!   header names (`include/ub/umdk/ulock/dlock/`): the reference's functions, names and status
//!   codes, so ported code changes its include path and link line only.
//!
//! # The guide
//!
//! An engine embeds the dlock server in its own process and gives each worker thread its own
//! client (a client instance is single-threaded, as in the reference); here a worker takes
//! transaction ids and then the row groups its transaction writes:
//!
//! ```
//! use std::time::Duration;
//!
//! use dlock_engine_glue::dlock_core::{Config, Mode};
//! use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};
//! use dlock_engine_glue::{EmbeddedServer, IdConfig, TxnIdAllocator, Volatile};
//!
//! let server = EmbeddedServer::start(EmbeddedServer::config(Config {
//!     locks_max: 1_024,
//!     clients_max: 16,
//!     objects_max: 16,
//!     ..Config::default()
//! }))?;
//! let xids = TxnIdAllocator::open(server.client()?, IdConfig::txn_ids(), Volatile)?;
//! let mut ids = xids.handle(); // one per worker thread
//! let mut row_groups = RowGroupLocks::new(server.client()?, RowGroupConfig::default())?;
//!
//! let xid = ids.next()?;
//! let mut txn = row_groups.begin();
//! let orders = RowGroup::new(1, 17);
//! txn.acquire(&[(orders, Mode::Exclusive)], AcquireOptions::wait(Duration::from_secs(1)))?;
//! // Storage writes carry the grant's fencing token: larger than any issued before.
//! let token = txn.token(orders).expect("held");
//! # let _ = (xid, token);
//! txn.commit()?;
//! # drop((ids, xids, row_groups));
//! server.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Clients in other processes on the host reach the same server through shared memory
//! ([`EmbeddedServer::local_endpoint`], when started with a `/dev/shm` name), other nodes over
//! TCP ([`EmbeddedServer::tcp_addr`], when a listener is configured).

#[cfg(feature = "cluster")]
pub mod cluster;
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
