//! The batches: `batch_trylock`, `batch_unlock`, `batch_lock_extend`.
//!
//! A batch is one message for up to 31 locks, each entry decided on its own (not
//! all-or-nothing). Entries with a bad op or id fail alone; the others are sent. Each result
//! carries the entry's status, the lock word (as for a single operation: on success, and on
//! `DLOCK_FAIL`/`DLOCK_EAGAIN`/`DLOCK_ETIMEOUT` the word the client recorded) and the grant's
//! fencing token. Everything is decoded into fixed arrays of 31: nothing is allocated.

use std::ffi::{c_int, c_uint};

use dlock_core::config::BATCH_MAX;
use dlock_core::{LockId, Mode, Status};
use dlock_transport::client::{Client, Grant};

use super::client::{Refusals, Slot, with_client};
use super::locks::lock_id;
use super::ops::{extend_mode, lock_mode, reports_word};
use super::types::{lock_op_res, lock_request, lock_state};
use super::{batch_len, guard, non_null, read_at, seconds_to_ms, write_at};

/// A batch entry's result.
fn entry(r: Result<Grant, Status>, word: Option<u128>) -> lock_op_res {
    let (status, fence, word) = match r {
        Ok(g) => (g.status, g.token.0, Some(g.word)),
        Err(s) => (s, 0, word),
    };
    lock_op_res {
        state: lock_state::from_word(word.unwrap_or(0)),
        op_ret: status.code(),
        rsvd: 0,
        fence,
    }
}

/// Writes the results of entries `0..n` from `out`. Failed entries whose status comes with a
/// word get the one the client recorded for their lock: one scan of the client's locks for the
/// whole batch, and none when nothing failed.
///
/// # Safety
///
/// - `results` is not NULL and valid for writing `n` `lock_op_res`.
unsafe fn write_batch(
    client: &Client,
    n: usize,
    ids: &[Option<LockId>; BATCH_MAX],
    out: &[Result<Grant, Status>; BATCH_MAX],
    results: *mut lock_op_res,
) {
    let mut words = [None; BATCH_MAX];
    if out[..n].iter().any(|r| r.is_err_and(reports_word)) {
        for (id, l) in client.locks() {
            for i in 0..n {
                if ids[i] == Some(*id) && out[i].is_err_and(reports_word) {
                    words[i] = Some(l.word);
                }
            }
        }
    }
    for i in 0..n {
        // SAFETY: `results` has `n` writable entries (caller's contract).
        unsafe { write_at(results, i, entry(out[i], words[i])) };
    }
}

/// Runs a batch over the entries `checked` found valid and writes every entry's result.
/// `run` gets the positions of the valid entries and their outputs, in order; an error from it
/// is the whole call's (nothing is written then).
///
/// # Safety
///
/// - `results` is not NULL and valid for writing `n` `lock_op_res`.
unsafe fn batch(
    slot: &mut Slot,
    n: usize,
    checked: &[Result<LockId, Status>; BATCH_MAX],
    results: *mut lock_op_res,
    run: impl FnOnce(&mut Client, &[usize], &mut [Result<Grant, Status>]) -> Result<(), Status>,
) -> c_int {
    let mut pos = [0usize; BATCH_MAX];
    let mut ids = [None; BATCH_MAX];
    let mut out = [Err(Status::Einval); BATCH_MAX];
    let mut k = 0;
    for i in 0..n {
        match checked[i] {
            // A cached grant's local users are counted by the single calls only.
            Ok(id) if slot.cache.caches(id) => out[i] = Err(Status::Einval),
            Ok(id) => {
                ids[i] = Some(id);
                pos[k] = i;
                k += 1;
            }
            Err(s) => out[i] = Err(s),
        }
    }
    if k > 0 {
        let mut sent = [Err(Status::Einval); BATCH_MAX];
        if let Err(s) = run(&mut slot.client, &pos[..k], &mut sent[..k]) {
            return s.code();
        }
        for (j, &i) in pos[..k].iter().enumerate() {
            out[i] = sent[j];
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { write_batch(&slot.client, n, &ids, &out, results) };
    Status::Success.code()
}

/// Reads `n` requests, checking each with `op`.
///
/// # Safety
///
/// - `reqs` is not NULL and valid for reading `n` `lock_request`s.
unsafe fn requests(
    reqs: *const lock_request,
    n: usize,
    op: impl Fn(c_int) -> Result<(), Status>,
) -> (
    [lock_request; BATCH_MAX],
    [Result<LockId, Status>; BATCH_MAX],
) {
    let mut r = [lock_request {
        lock_id: 0,
        lock_op: 0,
        expire_time: 0,
    }; BATCH_MAX];
    let mut checked = [Err(Status::Einval); BATCH_MAX];
    for i in 0..n {
        // SAFETY: `reqs` has `n` readable entries (caller's contract).
        r[i] = unsafe { read_at(reqs, i) };
        checked[i] = op(r[i].lock_op).and_then(|()| lock_id(r[i].lock_id));
    }
    (r, checked)
}

/// Tries `lock_num` (1..=31) locks in one message, each on its own (not all-or-nothing).
/// Per entry: `results[i].op_ret` as for `trylock`, the word, and the grant's `fence`. An
/// entry with a bad op gets `DLOCK_EINVAL`, a bad id `DLOCK_LOCK_NOT_GET`. Returns 0 even if
/// every entry failed; an error only for the whole call (`DLOCK_EINVAL` for NULL pointers or a
/// count outside 1..=31, `DLOCK_EASYNC`, `DLOCK_BAD_RESPONSE`, …).
///
/// # Safety
///
/// - `reqs` is NULL or valid for reading `lock_num` `lock_request`s.
/// - `results` is NULL or valid for writing `lock_num` `lock_op_res`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn batch_trylock(
    client_id: c_int,
    lock_num: c_uint,
    reqs: *const lock_request,
    results: *mut lock_op_res,
) -> c_int {
    guard(|| {
        if let Err(s) = batch_len(lock_num)
            .and(non_null(reqs))
            .and(non_null(results))
        {
            return s.code();
        }
        let n = lock_num as usize;
        // SAFETY: `reqs` is not NULL and has `n` entries (caller's contract).
        let (r, checked) = unsafe { requests(reqs, n, |op| lock_mode(op).map(drop)) };
        with_client(client_id, Refusals::DATA, |slot| {
            let run = |c: &mut Client, pos: &[usize], out: &mut [Result<Grant, Status>]| {
                let mut list = [(LockId::new(0, 1), Mode::Exclusive, 0); BATCH_MAX];
                for (l, &i) in list.iter_mut().zip(pos) {
                    let mode = lock_mode(r[i].lock_op)?;
                    *l = (
                        lock_id(r[i].lock_id)?,
                        mode,
                        seconds_to_ms(r[i].expire_time),
                    );
                }
                c.batch_trylock(&list[..pos.len()], false, out)
                    .map_err(Status::from)
            };
            // SAFETY: `results` is not NULL and has `n` entries (caller's contract).
            unsafe { batch(slot, n, &checked, results, run) }
        })
    })
}

/// Unlocks `lock_num` (1..=31) locks in one message, each on its own; per-entry results as
/// for `unlock`.
///
/// # Safety
///
/// - `lock_ids` is NULL or valid for reading `lock_num` `int`s.
/// - `results` is NULL or valid for writing `lock_num` `lock_op_res`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn batch_unlock(
    client_id: c_int,
    lock_num: c_uint,
    lock_ids: *const c_int,
    results: *mut lock_op_res,
) -> c_int {
    guard(|| {
        if let Err(s) = batch_len(lock_num)
            .and(non_null(lock_ids))
            .and(non_null(results))
        {
            return s.code();
        }
        let n = lock_num as usize;
        let mut checked = [Err(Status::Einval); BATCH_MAX];
        for (i, c) in checked.iter_mut().enumerate().take(n) {
            // SAFETY: `lock_ids` is not NULL and has `n` entries (caller's contract).
            *c = lock_id(unsafe { read_at(lock_ids, i) });
        }
        with_client(client_id, Refusals::DATA, |slot| {
            let run = |c: &mut Client, pos: &[usize], out: &mut [Result<Grant, Status>]| {
                let mut list = [LockId::new(0, 1); BATCH_MAX];
                for (l, &i) in list.iter_mut().zip(pos) {
                    *l = checked[i]?;
                }
                c.batch_unlock(&list[..pos.len()], out)
                    .map_err(Status::from)
            };
            // SAFETY: `results` is not NULL and has `n` entries (caller's contract).
            unsafe { batch(slot, n, &checked, results, run) }
        })
    })
}

/// Extends `lock_num` (1..=31) grants, each held in its op's mode, in one message, each on its
/// own; per-entry results as for `lock_extend`.
///
/// # Safety
///
/// - `reqs` is NULL or valid for reading `lock_num` `lock_request`s.
/// - `results` is NULL or valid for writing `lock_num` `lock_op_res`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn batch_lock_extend(
    client_id: c_int,
    lock_num: c_uint,
    reqs: *const lock_request,
    results: *mut lock_op_res,
) -> c_int {
    guard(|| {
        if let Err(s) = batch_len(lock_num)
            .and(non_null(reqs))
            .and(non_null(results))
        {
            return s.code();
        }
        let n = lock_num as usize;
        // SAFETY: `reqs` is not NULL and has `n` entries (caller's contract).
        let (r, checked) = unsafe { requests(reqs, n, |op| extend_mode(op).map(drop)) };
        with_client(client_id, Refusals::DATA, |slot| {
            let run = |c: &mut Client, pos: &[usize], out: &mut [Result<Grant, Status>]| {
                let mut list = [(LockId::new(0, 1), Mode::Exclusive, 0); BATCH_MAX];
                for (l, &i) in list.iter_mut().zip(pos) {
                    let mode = extend_mode(r[i].lock_op)?;
                    *l = (
                        lock_id(r[i].lock_id)?,
                        mode,
                        seconds_to_ms(r[i].expire_time),
                    );
                }
                c.batch_lock_extend(&list[..pos.len()], out)
                    .map_err(Status::from)
            };
            // SAFETY: `results` is not NULL and has `n` entries (caller's contract).
            unsafe { batch(slot, n, &checked, results, run) }
        })
    })
}
