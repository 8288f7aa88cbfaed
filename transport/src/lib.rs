//! `dlock-transport`: everything of dlock that does I/O.
//!
//! It owns the region — the one memory mapping that holds a server's tables — and what builds on
//! it: the server runtime (the two poll-loop threads, feature `server`, on by default), the
//! shared-memory, TCP (with TLS) and RDMA transports, and the thin client. A process that is
//! only a client depends on it with `default-features = false` and compiles no server runtime.
//! The `dlock` command is the `dlock-cli` package.

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
