//! The atomics the shared-memory protocols use, and the lock and condition variables of a shared
//! connection's leader/follower hand-off (`client::mux`), swapped for loom's under
//! `--cfg dlock_loom` so the model checker can explore every interleaving of the mailbox
//! handshake, the doorbell scan, park/wake and the hand-off (crossbeam's habit).

#[cfg(not(dlock_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(dlock_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(dlock_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(dlock_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
