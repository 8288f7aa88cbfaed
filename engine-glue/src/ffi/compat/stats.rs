//! `get_server_debug_stats` and `get_client_debug_stats` in the reference's layout: its 45
//! counters, in its order, so that `stats[DEBUG_STATS_EAGAIN]` of reference code (index 0)
//! reads dlock's count of queued fair-lock requests and not whatever dlock keeps at 0.
//!
//! dlock counts other things than the reference (no URMA buffers, no per-kind failure
//! counters; throughput, liveness and TLS counters instead). Each of its counters that means
//! what a reference counter means fills that one; the others have no place in the reference's
//! layout (`dlock stat` prints them all):
//!
//! | reference counter            | dlock counter                                              |
//! |------------------------------|------------------------------------------------------------|
//! | `EAGAIN`                     | `eagain` (fair-lock requests queued with a ticket)         |
//! | `ETIMEOUT`                   | `wait_timeouts` (blocking `lock()` requests that ran out)  |
//! | `EINVAL_LOCK_OP`             | `einval` (every invalid request: op, type, id, malformed message) |
//! | `CLIENT_NOT_INIT`            | `client_not_init`                                          |
//! | `LOCK_NOT_GET`               | `lock_not_get`                                             |
//! | `FAIL`                       | `fail` (every refusal of a lock word, all kinds and ops)   |
//! | `NOT_READY`                  | `not_ready`                                                |
//! | `CLIENT_ID_VERIFY_FAIL`      | `sessions_refused` (a peer that could not prove the client id it claimed) |
//! | `OBJECT_NOT_GET`             | `object_not_get`                                           |
//! | `OBJECT_CAS_FAILED`          | `object_cas_failed`                                        |
//!
//! Every other reference counter stays 0: `NO_URMA_BUF`, `ENCRYPT_FAIL`, `DECRYPT_FAIL`,
//! `SEND_FAIL`, `NETWORK_FAIL` (no URMA; TLS failures are dlock's `tls_*` counters);
//! `EINVAL_LOCK_TYPE`, `EINVAL_LOCK_OFFSET`, `EINVAL_LOCK_RET` (all in `EINVAL_LOCK_OP`);
//! the twelve per-kind `*_FAIL`, `FAIR_QUEUE_LIMIT` and `*_TICKET_PASSED` (all in `FAIL`);
//! `ENOMEM` (dlock allocates nothing per request; full tables are `no_resource`);
//! `ETICKET`, `EASYNC`, `ALREADY_LOCKED`, `ALREADY_UNLOCKED`, `INVALID_LOCK_STATE`,
//! `TICKET_TO_UNLOCK`, `BAD_RESPONSE`, `NO_ASYNC`, `ASYNC_AGAIN` (client-side outcomes dlock's
//! client does not count); `CLIENT_DISCONNECT`, `BAD_REQUEST`, `CLIENTMGR_NOT_INIT`,
//! `REPLICA_INIT_FAIL`, `SERVER_NOT_INIT` (no dlock counterpart, or always 0 in the
//! reference too).
//!
//! A client counts the error statuses its calls returned (as `dlock.h`'s clients do), so of
//! the rows above a client fills `EAGAIN`, `EINVAL_LOCK_OP`, `CLIENT_NOT_INIT`, `LOCK_NOT_GET`,
//! `FAIL`, `NOT_READY`, `OBJECT_NOT_GET` and `OBJECT_CAS_FAILED`.

use std::ffi::c_int;

use dlock_core::Status;
use dlock_core::server::Counter;

use super::types::{REF_DEBUG_STATS_MAX, debug_stats};
use crate::ffi::types::{self as native, DEBUG_STATS_MAX};
use crate::ffi::{client, guard, server};

/// The reference's counters in its order, without the `DEBUG_STATS_` prefix.
pub const REF_COUNTER_NAMES: [&str; REF_DEBUG_STATS_MAX] = [
    "EAGAIN",
    "NO_URMA_BUF",
    "ENOMEM",
    "ETIMEOUT",
    "EINVAL_LOCK_OP",
    "EINVAL_LOCK_TYPE",
    "EINVAL_LOCK_OFFSET",
    "EINVAL_LOCK_RET",
    "ETICKET",
    "EASYNC",
    "CLIENT_NOT_INIT",
    "LOCK_NOT_GET",
    "ALREADY_LOCKED",
    "ALREADY_UNLOCKED",
    "ATOMIC_TRYLOCK_FAIL",
    "ATOMIC_UNLOCK_FAIL",
    "ATOMIC_EXTEND_FAIL",
    "RW_TRYLOCK_EX_FAIL",
    "RW_UNLOCK_EX_FAIL",
    "RW_TRYLOCK_SH_FAIL",
    "RW_UNLOCK_SH_FAIL",
    "FAIR_QUEUE_LIMIT",
    "FAIR_UNLOCK_EX_FAIL",
    "FAIR_UNLOCK_SH_FAIL",
    "FAIR_EX_TICKET_PASSED",
    "FAIR_SH_TICKET_PASSED",
    "INVALID_LOCK_STATE",
    "TICKET_TO_UNLOCK",
    "NETWORK_FAIL",
    "SEND_FAIL",
    "BAD_RESPONSE",
    "CLIENT_DISCONNECT",
    "FAIL",
    "CLIENTMGR_NOT_INIT",
    "NOT_READY",
    "NO_ASYNC",
    "ASYNC_AGAIN",
    "REPLICA_INIT_FAIL",
    "SERVER_NOT_INIT",
    "ENCRYPT_FAIL",
    "DECRYPT_FAIL",
    "CLIENT_ID_VERIFY_FAIL",
    "BAD_REQUEST",
    "OBJECT_NOT_GET",
    "OBJECT_CAS_FAILED",
];

/// The reference counter each dlock counter with a counterpart fills (the module docs' table).
pub const REF_FROM_DLOCK: [(&str, Counter); 10] = [
    ("EAGAIN", Counter::Eagain),
    ("ETIMEOUT", Counter::WaitTimeouts),
    ("EINVAL_LOCK_OP", Counter::Einval),
    ("CLIENT_NOT_INIT", Counter::ClientNotInit),
    ("LOCK_NOT_GET", Counter::LockNotGet),
    ("FAIL", Counter::Fail),
    ("NOT_READY", Counter::NotReady),
    ("CLIENT_ID_VERIFY_FAIL", Counter::SessionsRefused),
    ("OBJECT_NOT_GET", Counter::ObjectNotGet),
    ("OBJECT_CAS_FAILED", Counter::ObjectCasFailed),
];

/// dlock's counters in the reference's layout.
pub fn to_reference(dlock: &[u64; DEBUG_STATS_MAX]) -> debug_stats {
    let mut out = debug_stats {
        stats: [0; REF_DEBUG_STATS_MAX],
    };
    for (name, counter) in REF_FROM_DLOCK {
        let at = REF_COUNTER_NAMES
            .iter()
            .position(|n| *n == name)
            .expect("every name in REF_FROM_DLOCK is a reference counter");
        out.stats[at] = dlock[counter as usize];
    }
    out
}

/// Runs dlock's counters call `get` and writes its result to `stats` in the reference's
/// layout; returns what `get` returned (nothing is written unless it is 0).
///
/// # Safety
///
/// - `stats` is NULL or valid for writing a reference `debug_stats`.
unsafe fn reference_stats(
    stats: *mut debug_stats,
    get: impl FnOnce(*mut native::debug_stats) -> c_int,
) -> c_int {
    if stats.is_null() {
        return Status::Einval.code();
    }
    let mut own = native::debug_stats {
        stats: [0; DEBUG_STATS_MAX],
    };
    let rc = get(&raw mut own);
    if rc == Status::Success.code() {
        // SAFETY: not NULL (checked above) and writable by the caller's contract.
        unsafe { stats.write_unaligned(to_reference(&own.stats)) };
    }
    rc
}

/// Reference `get_server_debug_stats`: `dlock.h`'s, in the reference's 45-counter layout.
///
/// # Safety
///
/// - `stats` is NULL or valid for writing a reference `debug_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_get_server_debug_stats(
    server_id: c_int,
    stats: *mut debug_stats,
) -> c_int {
    guard(|| {
        // SAFETY: `stats` as the caller passed it; `own` is a local dlock `debug_stats`.
        unsafe { reference_stats(stats, |own| server::get_server_debug_stats(server_id, own)) }
    })
}

/// Reference `get_client_debug_stats`: `dlock.h`'s, in the reference's 45-counter layout.
///
/// # Safety
///
/// - `stats` is NULL or valid for writing a reference `debug_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_get_client_debug_stats(
    client_id: c_int,
    stats: *mut debug_stats,
) -> c_int {
    guard(|| {
        // SAFETY: `stats` as the caller passed it; `own` is a local dlock `debug_stats`.
        unsafe { reference_stats(stats, |own| client::get_client_debug_stats(client_id, own)) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dlock_counter_lands_under_the_reference_index_of_its_meaning() {
        let mut dlock = [0u64; DEBUG_STATS_MAX];
        for (i, v) in dlock.iter_mut().enumerate() {
            *v = 1000 + i as u64;
        }
        let r = to_reference(&dlock);
        // The reference's indices, from its dlock_types.h.
        assert_eq!(r.stats[0], dlock[Counter::Eagain as usize], "EAGAIN");
        assert_eq!(
            r.stats[3],
            dlock[Counter::WaitTimeouts as usize],
            "ETIMEOUT"
        );
        assert_eq!(
            r.stats[4],
            dlock[Counter::Einval as usize],
            "EINVAL_LOCK_OP"
        );
        assert_eq!(r.stats[10], dlock[Counter::ClientNotInit as usize]);
        assert_eq!(r.stats[11], dlock[Counter::LockNotGet as usize]);
        assert_eq!(r.stats[32], dlock[Counter::Fail as usize], "FAIL");
        assert_eq!(r.stats[34], dlock[Counter::NotReady as usize], "NOT_READY");
        assert_eq!(r.stats[41], dlock[Counter::SessionsRefused as usize]);
        assert_eq!(r.stats[43], dlock[Counter::ObjectNotGet as usize]);
        assert_eq!(r.stats[44], dlock[Counter::ObjectCasFailed as usize]);
        // Everything else stays 0.
        let filled = r.stats.iter().filter(|&&v| v != 0).count();
        assert_eq!(filled, REF_FROM_DLOCK.len());
    }

    #[test]
    fn each_reference_counter_is_filled_at_most_once() {
        let mut names: Vec<&str> = REF_FROM_DLOCK.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REF_FROM_DLOCK.len());
        let mut names: Vec<&str> = REF_COUNTER_NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REF_DEBUG_STATS_MAX);
    }
}
