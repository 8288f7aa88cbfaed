//! `dlock-core`: the lock words, the fixed tables, the wire frames and the server state machine
//! of dlock — everything that decides *what* happens, with nothing that decides *when*.
//!
//! This crate does no I/O, reads no clock, spawns no thread and never allocates: it is
//! `#![no_std]` without `alloc`, memory is handed in as a region, and time is handed in as a
//! monotonic tick in milliseconds (`now_ms`). The transport crate owns threads, sockets and the
//! mapping; this crate owns the semantics.
//!
//! | module     | owns                                                                  |
//! |------------|-----------------------------------------------------------------------|
//! | [`status`] | the reference's status codes                                          |
//! | [`ids`]    | id newtypes (`ClientId`, `LockId`, `ObjectId`, `Ticket`, `FencingToken`) |
//! | [`word`]   | the three lock words and their pure transitions                        |
//! | [`config`] | capacities, validation and the exact region size                       |
//! | [`table`]  | the fixed tables laid over the region                                  |
//! | [`proto`]  | control and data frames, encoded into and decoded from caller buffers  |
//! | [`server`] | the state machine (`handle_control`, `handle_data`) and the rules of who may send what (`dispatch`, `route`, `control`) |
//! | [`client`] | the client's record of one lock and its (state × operation) decisions  |
//! | [`time`]   | durations as the protocol carries them: one rounding rule              |
//! | [`cluster`] | partitions, the map, epochs, rebalancing and the timing rules of a cluster |
//! | [`manager`] | cached grants and their revocation, lock value blocks, retained locks |
//!
//! # A first look
//!
//! The state machine runs over memory you hand it, with time and entropy passed in; here a
//! client registers, names a lock and takes it, all without a thread or a socket:
//!
//! ```
//! use dlock_core::proto::{Command, CommandResult, LockCommand, LockFlags, LockOp, PROTO_VERSION};
//! use dlock_core::server::{Server, predictable_entropy};
//! use dlock_core::{Config, LockKind, Status, Ticket, table::Tables};
//!
//! let cfg = Config { locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default() };
//! let size = cfg.region_size().unwrap();
//! let mut memory = vec![0u8; size + 64];
//! let at = memory.as_ptr().align_offset(64); // the tables want 64-byte alignment
//! let tables = Tables::format(&mut memory[at..at + size], &cfg).unwrap();
//! // Tests may use a predictable entropy source; a server on a network uses the OS's.
//! let mut server = Server::new(tables, &cfg, predictable_entropy);
//!
//! let now_ms = 0;
//! let client = server.client_init(PROTO_VERSION, 0, now_ms).unwrap();
//! let lock = server.get_lock(client.get(), LockKind::Rw, b"t1/rg7", now_ms).unwrap();
//! let take = Command::Lock(LockCommand {
//!     kind: LockKind::Rw,
//!     op: LockOp::TryExclusive,
//!     lock: lock.raw(),
//!     expire_ms: 5_000,
//!     ticket: Ticket { exclusive: 0, shared: 0 },
//!     wait_ms: 0,
//!     partition_epoch: 0, // a standalone server's (a cluster's names the partition's epoch)
//!     flags: LockFlags::NONE, // no lock-manager options (cached, retained, value block)
//! });
//! let mut result = [CommandResult { status: Status::Fail, word: 0, aux: 0, plain: false }];
//! server.execute_message(client.get(), 0, &[take], &mut result, now_ms).unwrap();
//! assert_eq!(result[0].status, Status::Success);
//! // `aux` carries the grant's fencing token.
//! assert!(result[0].aux > 0);
//! ```
//!
//! Where next: [`server::Server`] for every operation, [`proto`] for the bytes a transport
//! moves, [`word`] for the lock-word algorithms and their state tables. The transports, threads
//! and client are in `dlock-transport`; what an engine links is `dlock-engine-glue`.
#![cfg_attr(not(any(test, dlock_loom)), no_std)]

pub mod client;
pub mod cluster;
pub mod config;
pub mod ids;
pub mod manager;
#[cfg(feature = "sim-mutations")]
pub mod mutation;
pub mod proto;
pub mod server;
pub mod status;
pub mod table;
pub mod time;
pub mod word;

pub use config::Config;
pub use ids::{
    ClientId, FencingToken, GrantProof, LockId, LockKind, Mode, ObjectId, Peer, Session,
    SessionKey, SessionMac, Ticket, WeakSessionKey,
};
pub use status::Status;

/// Whether a mutation point is switched on: the literal `false` without the `sim-mutations`
/// feature (see `mutation` in a build that has it).
#[cfg(not(feature = "sim-mutations"))]
#[macro_export]
macro_rules! mutated {
    ($name:ident) => {
        false
    };
}
