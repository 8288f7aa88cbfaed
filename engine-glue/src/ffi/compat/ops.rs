//! Lock operations that write the reference's lock states: `trylock`, `lock`, `unlock`,
//! `lock_extend`, `lock_result_check` and the three batches with `void *results`.
//!
//! dlock's C ABI writes its own 16-byte words (`dlock.h`'s `atomic_state`, `rw_state`,
//! `fairlock_state`, and 32-byte `lock_op_res` entries with a fencing token). Reference code
//! passes its own structs, and an `atomic_state` there is 8 bytes: a 16-byte write would run
//! past it. So each call here runs dlock's into a buffer of its own and writes the reference's
//! state, sized by the lock's kind:
//!
//! | kind   | reference struct (bytes written) | from dlock's word                                  |
//! |--------|----------------------------------|----------------------------------------------------|
//! | atomic | `atomic_state` (8)               | `client_id` = owner, `time_out` = expiry           |
//! | RW     | `rw_state` (16)                  | `time_out` = first acquisition, `client_id` = exclusive owner, `rcount` = readers |
//! | fair   | `fairlock_state` (16)            | the four ticket counters; `time_out` = expiry; `bs.rms`, `bs.rflag`, `bs.rcnt` |
//!
//! Times: the reference's `time_out` is wall-clock seconds from the server's `gettimeofday`;
//! dlock's words carry the server's monotonic tick in ms since it started, and a client cannot
//! turn one into the other. `time_out` is that tick in seconds, rounded up (so a held lock
//! never shows 0): compare the values one server gave with each other, not with `time(NULL)`.
//!
//! The state is written exactly when dlock's call writes its word (`DLOCK_SUCCESS`,
//! `DLOCK_ALREADY_LOCKED`, `DLOCK_EAGAIN`, `DLOCK_FAIL`, `DLOCK_ETIMEOUT`), and only for a lock
//! this client got (its kind is known); otherwise `*result` is left alone. A batch entry of a
//! lock the client did not get has a zeroed state. The fencing token has no place in the
//! reference's structs: `lock_fence` reads it.

use std::ffi::{c_int, c_uint, c_void};

use dlock_core::word::atomic::AtomicWord;
use dlock_core::word::fair::FairWord;
use dlock_core::word::rw::RwWord;
use dlock_core::{LockId, LockKind, Status};

use super::types::{atomic_state, fairlock_state, lock_op_res, rw_state};
use crate::ffi::client::{Refusals, with_client};
use crate::ffi::locks::lock_id;
use crate::ffi::ops::reports_word;
use crate::ffi::types::{self as native, MAX_LOCK_BATCH_SIZE, lock_request, lock_state};
use crate::ffi::{self, guard, read_at, write_at};

/// A ms tick as the reference's `u32` seconds, by the core's one rounding rule (up,
/// saturating).
fn seconds(ms: u64) -> u32 {
    dlock_core::time::duration_to_s(std::time::Duration::from_millis(ms))
}

/// A lock state in the reference's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefState {
    /// 8 bytes.
    Atomic(atomic_state),
    /// 16 bytes.
    Rw(rw_state),
    /// 16 bytes.
    Fair(fairlock_state),
}

impl RefState {
    /// The reference's view of dlock's lock word `word` of a `kind` lock.
    pub fn of(kind: LockKind, word: u128) -> RefState {
        match kind {
            LockKind::Atomic => {
                let w = AtomicWord::from_bits(word);
                RefState::Atomic(atomic_state {
                    client_id: w.owner() as i32,
                    time_out: seconds(w.expiry_ms()),
                })
            }
            LockKind::Rw => {
                let w = RwWord::from_bits(word);
                RefState::Rw(rw_state {
                    time_out: seconds(w.since_ms()),
                    client_id: w.owner() as i32,
                    rcount: w.readers(),
                    rsvd: 0,
                })
            }
            LockKind::Fair => {
                let w = FairWord::from_bits(word);
                // The reference's bit fields `u16 rms; u16 rflag:1, rsvd:9, rcnt:6`.
                let t_value =
                    u32::from(w.rms()) | u32::from(w.rflag()) << 16 | u32::from(w.rcnt()) << 26;
                RefState::Fair(fairlock_state {
                    n_exclusive: w.nx(),
                    n_shared: w.ns(),
                    m_exclusive: w.mx(),
                    m_shared: w.ms(),
                    time_out: seconds(w.timeout_ms()),
                    t_value,
                })
            }
        }
    }

    /// As the 16-byte union of `lock_op_res` holds it (an atomic state zero-padded).
    pub fn words(self) -> [u32; 4] {
        match self {
            RefState::Atomic(s) => [s.client_id as u32, s.time_out, 0, 0],
            RefState::Rw(s) => [s.time_out, s.client_id as u32, s.rcount, s.rsvd],
            RefState::Fair(s) => [
                u32::from(s.n_exclusive) | u32::from(s.n_shared) << 16,
                u32::from(s.m_exclusive) | u32::from(s.m_shared) << 16,
                s.time_out,
                s.t_value,
            ],
        }
    }

    /// Writes the state's struct (8 or 16 bytes) to `p`.
    ///
    /// # Safety
    ///
    /// - `p` is valid for writing the state's struct (any alignment).
    unsafe fn write(self, p: *mut c_void) {
        // SAFETY: the caller's contract, for the struct of this state's kind.
        unsafe {
            match self {
                RefState::Atomic(s) => write_at(p.cast(), 0, s),
                RefState::Rw(s) => write_at(p.cast(), 0, s),
                RefState::Fair(s) => write_at(p.cast(), 0, s),
            }
        }
    }
}

/// Whether dlock's call wrote its word along with `rc`.
fn wrote_word(rc: c_int) -> bool {
    let status = u16::try_from(rc).ok().and_then(Status::from_code);
    matches!(status, Some(Status::Success | Status::AlreadyLocked))
        || status.is_some_and(reports_word)
}

/// The kind of each lock in `ids` this client got (`None` for the others, and for all of them
/// when the client is unknown: then dlock's call fails alike and writes nothing).
fn kinds<const N: usize>(client_id: c_int, ids: [Option<LockId>; N]) -> [Option<LockKind>; N] {
    let mut out = [None; N];
    with_client(client_id, Refusals::DATA, |slot| {
        for (kind, id) in out.iter_mut().zip(ids) {
            *kind = id.and_then(|id| slot.client.local_lock(id)).map(|l| l.kind);
        }
        // Not an operation: nothing to count in the client's statistics.
        Status::Success.code()
    });
    out
}

/// Runs dlock's single operation `op` on lock `raw` into a buffer of its own and writes the
/// reference's state to `result` when dlock wrote its word.
///
/// # Safety
///
/// - `result` is NULL or valid for writing the reference state of the lock's kind (8 bytes
///   for an atomic lock, 16 otherwise).
unsafe fn single(
    client_id: c_int,
    raw: Option<c_int>,
    result: *mut c_void,
    op: impl FnOnce(*mut c_void) -> c_int,
) -> c_int {
    if result.is_null() {
        return Status::Einval.code();
    }
    let [kind] = kinds(client_id, [raw.and_then(|r| lock_id(r).ok())]);
    let mut word = lock_state::from_word(0);
    let rc = op((&raw mut word).cast());
    if let Some(kind) = kind
        && wrote_word(rc)
    {
        // SAFETY: `word` is a `lock_state`, all of whose views are plain data over its bytes.
        let w = u128::from_le_bytes(unsafe { word.raw });
        // SAFETY: `result` has room for the state of this lock's kind (caller's contract).
        unsafe { RefState::of(kind, w).write(result) };
    }
    rc
}

/// The lock a request names, or `None` for NULL.
///
/// # Safety
///
/// - `req` is NULL or points to a readable `lock_request`.
unsafe fn lock_of(req: *const lock_request) -> Option<c_int> {
    // SAFETY: forwarded from the caller.
    unsafe { ffi::read(req) }.ok().map(|r| r.lock_id)
}

/// Reference `trylock`: as `dlock.h`'s, writing the reference's state (module docs).
///
/// # Safety
///
/// - `req` is NULL or points to a readable `lock_request`.
/// - `result` is NULL or valid for writing the reference state of the lock's kind.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_trylock(
    client_id: c_int,
    req: *const lock_request,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: `req` and `result` are forwarded from the caller; `buf` has 16 bytes.
        unsafe {
            single(client_id, lock_of(req), result, |buf| {
                ffi::ops::trylock(client_id, req, buf)
            })
        }
    })
}

/// Reference `lock`: `dlock.h`'s (it waits on the server, up to 5 s), writing the reference's
/// state.
///
/// # Safety
///
/// As for `dlock_compat_trylock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_lock(
    client_id: c_int,
    req: *const lock_request,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: as in `dlock_compat_trylock`.
        unsafe {
            single(client_id, lock_of(req), result, |buf| {
                ffi::ops::lock(client_id, req, buf)
            })
        }
    })
}

/// Reference `unlock`, writing the reference's state.
///
/// # Safety
///
/// - `result` is NULL or valid for writing the reference state of the lock's kind.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_unlock(
    client_id: c_int,
    lock_id: c_int,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: `result` is forwarded from the caller; `buf` has 16 bytes.
        unsafe {
            single(client_id, Some(lock_id), result, |buf| {
                ffi::ops::unlock(client_id, lock_id, buf)
            })
        }
    })
}

/// Reference `lock_extend`, writing the reference's state.
///
/// # Safety
///
/// As for `dlock_compat_trylock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_lock_extend(
    client_id: c_int,
    req: *const lock_request,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: as in `dlock_compat_trylock`.
        unsafe {
            single(client_id, lock_of(req), result, |buf| {
                ffi::ops::lock_extend(client_id, req, buf)
            })
        }
    })
}

/// Reference `lock_result_check`, writing the reference's state of the lock the outstanding
/// `lock_request_async` named.
///
/// # Safety
///
/// - `result` is NULL or valid for writing the reference state of that lock's kind.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_lock_result_check(
    client_id: c_int,
    result: *mut c_void,
) -> c_int {
    guard(|| {
        let mut pending = None;
        with_client(client_id, Refusals::DATA, |slot| {
            pending = slot.async_lock.map(|id| id.raw() as c_int);
            Status::Success.code()
        });
        // SAFETY: `result` is forwarded from the caller; `buf` has 16 bytes.
        unsafe {
            single(client_id, pending, result, |buf| {
                ffi::ops::lock_result_check(client_id, buf)
            })
        }
    })
}

/// Runs dlock's batch `op` into entries of its own and writes the reference's `lock_op_res`
/// for each of the `lock_num` entries (when the call as a whole succeeded; nothing otherwise).
///
/// # Safety
///
/// - `results` is NULL or valid for writing `lock_num` reference `lock_op_res` (20 bytes each).
unsafe fn batch(
    client_id: c_int,
    lock_num: c_uint,
    ids: [Option<LockId>; MAX_LOCK_BATCH_SIZE],
    results: *mut c_void,
    op: impl FnOnce(*mut native::lock_op_res) -> c_int,
) -> c_int {
    if results.is_null() {
        return Status::Einval.code();
    }
    let kinds = kinds(client_id, ids);
    let empty = native::lock_op_res {
        state: lock_state::from_word(0),
        op_ret: 0,
        rsvd: 0,
        fence: 0,
    };
    let mut out = [empty; MAX_LOCK_BATCH_SIZE];
    let rc = op(out.as_mut_ptr());
    if rc != Status::Success.code() {
        return rc;
    }
    // dlock's call checked 1..=31 entries before it succeeded.
    for (i, (e, kind)) in out.iter().zip(kinds).take(lock_num as usize).enumerate() {
        // SAFETY: plain data over the word's bytes.
        let w = u128::from_le_bytes(unsafe { e.state.raw });
        let state = kind.map_or([0; 4], |k| RefState::of(k, w).words());
        let entry = lock_op_res {
            state,
            op_ret: e.op_ret,
        };
        // SAFETY: `results` has `lock_num` entries (caller's contract).
        unsafe { write_at(results.cast::<lock_op_res>(), i, entry) };
    }
    rc
}

/// The locks of the first `n` (at most 31) ids read by `id_at`.
fn ids_of(n: c_uint, id_at: impl Fn(usize) -> c_int) -> [Option<LockId>; MAX_LOCK_BATCH_SIZE] {
    let mut ids = [None; MAX_LOCK_BATCH_SIZE];
    for (i, id) in ids.iter_mut().enumerate().take(n as usize) {
        *id = lock_id(id_at(i)).ok();
    }
    ids
}

/// The locks `reqs` names (none for NULL or a count outside 1..=31: dlock's call refuses them).
///
/// # Safety
///
/// - `reqs` is NULL or valid for reading `n` `lock_request`s.
unsafe fn ids_of_requests(
    reqs: *const lock_request,
    n: c_uint,
) -> [Option<LockId>; MAX_LOCK_BATCH_SIZE] {
    if reqs.is_null() || n as usize > MAX_LOCK_BATCH_SIZE {
        return [None; MAX_LOCK_BATCH_SIZE];
    }
    // SAFETY: `reqs` has `n` readable entries (caller's contract).
    ids_of(n, |i| unsafe { read_at(reqs, i) }.lock_id)
}

/// Reference `batch_trylock(..., void *results)`: `results` is an array of `lock_op_res` in
/// the reference's 20-byte layout.
///
/// # Safety
///
/// - `reqs` is NULL or valid for reading `lock_num` `lock_request`s.
/// - `results` is NULL or valid for writing `lock_num` reference `lock_op_res`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_batch_trylock(
    client_id: c_int,
    lock_num: c_uint,
    reqs: *const lock_request,
    results: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller; dlock's call writes at most 31 entries into `out`.
        unsafe {
            let ids = ids_of_requests(reqs, lock_num);
            batch(client_id, lock_num, ids, results, |out| {
                ffi::batch::batch_trylock(client_id, lock_num, reqs, out)
            })
        }
    })
}

/// Reference `batch_unlock(..., void *results)`.
///
/// # Safety
///
/// - `lock_ids` is NULL or valid for reading `lock_num` `int`s.
/// - `results` is NULL or valid for writing `lock_num` reference `lock_op_res`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_batch_unlock(
    client_id: c_int,
    lock_num: c_uint,
    lock_ids: *const c_int,
    results: *mut c_void,
) -> c_int {
    guard(|| {
        let ids = if lock_ids.is_null() || lock_num as usize > MAX_LOCK_BATCH_SIZE {
            [None; MAX_LOCK_BATCH_SIZE]
        } else {
            // SAFETY: `lock_ids` has `lock_num` readable entries (caller's contract).
            ids_of(lock_num, |i| unsafe { read_at(lock_ids, i) })
        };
        // SAFETY: forwarded from the caller; dlock's call writes at most 31 entries into `out`.
        unsafe {
            batch(client_id, lock_num, ids, results, |out| {
                ffi::batch::batch_unlock(client_id, lock_num, lock_ids, out)
            })
        }
    })
}

/// Reference `batch_lock_extend(..., void *results)`.
///
/// # Safety
///
/// As for `dlock_compat_batch_trylock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_batch_lock_extend(
    client_id: c_int,
    lock_num: c_uint,
    reqs: *const lock_request,
    results: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: as in `dlock_compat_batch_trylock`.
        unsafe {
            let ids = ids_of_requests(reqs, lock_num);
            batch(client_id, lock_num, ids, results, |out| {
                ffi::batch::batch_lock_extend(client_id, lock_num, reqs, out)
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_state_is_the_owner_and_the_expiry_in_seconds_rounded_up() {
        let w = AtomicWord::new().with_owner(7).with_expiry_ms(5_001);
        let s = RefState::of(LockKind::Atomic, w.into_bits());
        assert_eq!(
            s,
            RefState::Atomic(atomic_state {
                client_id: 7,
                time_out: 6
            })
        );
        assert_eq!(s.words(), [7, 6, 0, 0]);
        let free = RefState::of(LockKind::Atomic, 0);
        assert_eq!(free, RefState::Atomic(atomic_state::default()));
    }

    #[test]
    fn an_rw_state_puts_the_acquisition_time_first_as_the_reference_does() {
        let w = RwWord::new().with_readers(3).with_since_ms(1_000);
        let s = RefState::of(LockKind::Rw, w.into_bits());
        assert_eq!(
            s,
            RefState::Rw(rw_state {
                time_out: 1,
                client_id: 0,
                rcount: 3,
                rsvd: 0
            })
        );
        assert_eq!(s.words(), [1, 0, 3, 0]);
        let ex = RwWord::new().with_owner(9).with_since_ms(1);
        assert_eq!(
            RefState::of(LockKind::Rw, ex.into_bits()).words(),
            [1, 9, 0, 0]
        );
    }

    #[test]
    fn a_fair_state_keeps_the_counters_and_packs_the_reference_bit_fields() {
        let w = FairWord::new()
            .with_nx(1)
            .with_ns(2)
            .with_mx(3)
            .with_ms(4)
            .with_rms(0xBEEF)
            .with_rflag(true)
            .with_rcnt(63)
            .with_timeout_ms(2_500);
        let s = RefState::of(LockKind::Fair, w.into_bits());
        let RefState::Fair(f) = s else {
            panic!("{s:?}")
        };
        assert_eq!(
            (f.n_exclusive, f.n_shared, f.m_exclusive, f.m_shared),
            (1, 2, 3, 4)
        );
        assert_eq!(f.time_out, 3);
        assert_eq!(f.t_value & 0xFFFF, 0xBEEF, "rms");
        assert_eq!(f.t_value >> 16 & 1, 1, "rflag");
        assert_eq!(f.t_value >> 17 & 0x1FF, 0, "rsvd");
        assert_eq!(f.t_value >> 26, 63, "rcnt");
        assert_eq!(s.words(), [1 | 2 << 16, 3 | 4 << 16, 3, f.t_value]);
    }

    #[test]
    fn seconds_saturate_instead_of_wrapping() {
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(1), 1);
        assert_eq!(seconds(u64::MAX), u32::MAX);
    }

    #[test]
    fn the_word_is_written_with_the_statuses_dlock_writes_it_with() {
        for s in [
            Status::Success,
            Status::AlreadyLocked,
            Status::Eagain,
            Status::Fail,
            Status::Etimeout,
        ] {
            assert!(wrote_word(s.code()), "{s:?}");
        }
        for s in [
            Status::Einval,
            Status::LockNotGet,
            Status::Easync,
            Status::BadResponse,
        ] {
            assert!(!wrote_word(s.code()), "{s:?}");
        }
        assert!(!wrote_word(-1));
    }

    #[test]
    fn an_atomic_state_write_touches_eight_bytes_only() {
        let mut buf = [0xEEu8; 16];
        let s = RefState::of(
            LockKind::Atomic,
            AtomicWord::new().with_owner(1).into_bits(),
        );
        // SAFETY: `buf` has 16 writable bytes, more than the 8 written.
        unsafe { s.write(buf.as_mut_ptr().cast()) };
        assert_eq!(&buf[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&buf[8..], &[0xEE; 8]);
    }
}
