//! The atomics the shared-memory protocols use, swapped for loom's under `--cfg dlock_loom` so
//! the model checker can explore every interleaving of the mailbox handshake, the doorbell scan
//! and park/wake (crossbeam's habit).

#[cfg(not(dlock_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(dlock_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
