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
//! | [`server`] | the state machine: `handle_control` and `handle_data`                  |
#![cfg_attr(not(any(test, dlock_loom)), no_std)]

pub mod config;
pub mod ids;
pub mod proto;
pub mod server;
pub mod status;
pub mod table;
pub mod word;

pub use config::Config;
pub use ids::{ClientId, FencingToken, LockId, LockKind, Mode, ObjectId, Session, Ticket};
pub use status::Status;
