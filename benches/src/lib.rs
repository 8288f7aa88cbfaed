//! What the benchmarks share: a server over a fresh region, and the baseline lock table they are
//! measured against.

use std::collections::HashMap;
use std::sync::Mutex;

use dlock_core::server::Server;
use dlock_core::{Config, Status};
use dlock_transport::Region;

/// A fresh region for `cfg`.
pub fn region(cfg: &Config) -> Region {
    Region::anonymous(cfg).expect("map region")
}

/// A server over `region`.
pub fn server(region: &mut Region) -> Server<'_> {
    let cfg = *region.config();
    Server::new(region.tables().expect("carve tables"), &cfg)
}

/// The baseline: the atomic lock's trylock/unlock on the table a service would write first — a
/// `HashMap` from lock id to `(owner, expiry)` behind a `std::sync::Mutex`.
#[derive(Debug, Default)]
pub struct MutexTable {
    locks: Mutex<HashMap<u32, (u32, u64)>>,
}

impl MutexTable {
    /// A table with `n` free locks.
    pub fn with_locks(n: u32) -> Self {
        Self {
            locks: Mutex::new((0..n).map(|i| (i, (0, 0))).collect()),
        }
    }

    /// Takes `ids` for `owner` (each independently, like a per-item batch).
    pub fn try_lock(
        &self,
        ids: &[u32],
        owner: u32,
        expire_ms: u64,
        now_ms: u64,
        out: &mut [Status],
    ) {
        let mut t = self.locks.lock().expect("not poisoned");
        for (id, o) in ids.iter().zip(out) {
            *o = match t.get_mut(id) {
                Some(e) if e.0 != 0 && now_ms <= e.1 => Status::Fail,
                Some(e) => {
                    *e = (owner, now_ms + expire_ms);
                    Status::Success
                }
                None => Status::LockNotGet,
            };
        }
    }

    /// Releases `ids` held by `owner`.
    pub fn unlock(&self, ids: &[u32], owner: u32, out: &mut [Status]) {
        let mut t = self.locks.lock().expect("not poisoned");
        for (id, o) in ids.iter().zip(out) {
            *o = match t.get_mut(id) {
                Some(e) if e.0 == owner => {
                    *e = (0, 0);
                    Status::Success
                }
                Some(_) => Status::Fail,
                None => Status::LockNotGet,
            };
        }
    }
}
