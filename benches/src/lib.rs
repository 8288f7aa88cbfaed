//! What the benchmarks share: a server over a fresh region, and the baseline lock table they are
//! measured against.

use std::collections::HashMap;
use std::sync::Mutex;

use dlock_core::proto::{
    Command, DATA_MESSAGE_MAX, DataHeader, LockCommand, LockOp, PROTO_VERSION, encode_data_request,
};
use dlock_core::server::{Server, predictable_entropy};
use dlock_core::{Config, LockId, LockKind, Status, Ticket};
use dlock_transport::Region;

/// A fresh region for `cfg`.
pub fn region(cfg: &Config) -> Region {
    Region::anonymous(cfg).expect("map region")
}

/// A server over `region`.
pub fn server(region: &mut Region) -> Server<'_> {
    let cfg = *region.config();
    Server::new(
        region.tables().expect("carve tables"),
        &cfg,
        predictable_entropy,
    )
}

/// An atomic-lock command `op` on `id` with a 5 s lease.
pub fn cmd(op: LockOp, id: LockId) -> Command {
    Command::Lock(LockCommand {
        kind: LockKind::Atomic,
        op,
        lock: id.raw(),
        expire_ms: 5_000,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: dlock_core::proto::LockFlags::NONE,
    })
}

/// The data request `client` would send for `commands`, as a transport hands it to
/// `Server::handle_data`.
pub fn encoded(client: u32, commands: &[Command]) -> Vec<u8> {
    let header = DataHeader {
        version: PROTO_VERSION,
        count: 0,
        message_id: 1,
        client,
        flags: 0,
    };
    let mut buf = vec![0; DATA_MESSAGE_MAX];
    let n = encode_data_request(&header, commands, &mut buf).expect("encodable request");
    buf.truncate(n);
    buf
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

/// The median and 99th percentile of `samples` (nanoseconds), in microseconds; sorts them.
pub fn quantiles(samples: &mut [u64]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    (at(0.5), at(0.99))
}

/// The CPU seconds (user + system) that getrusage(2)'s `who` (`RUSAGE_SELF`, `RUSAGE_THREAD`)
/// has used so far.
pub fn cpu_s(who: libc::c_int) -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct, which getrusage(2)
    // overwrites; the pointer is to this frame's local, alive for the whole call.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable `rusage` pointer (above); an unknown `who` is refused with
    // EINVAL and leaves it zero.
    unsafe { libc::getrusage(who, &mut r) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    s(r.ru_utime) + s(r.ru_stime)
}
