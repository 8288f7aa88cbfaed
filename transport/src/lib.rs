//! `dlock-transport`: everything of dlock that does I/O.
//!
//! Today it owns the region — the one memory mapping that holds a server's tables. The runtime
//! (poll-loop threads), the shared-memory, TCP and RDMA transports, the thin client and the
//! `dlock` binary build on it.

pub mod client;
pub mod futex;
mod patience;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod region;
pub mod runtime;
pub mod shm;
mod sync;
pub mod tls;

pub use region::Region;
