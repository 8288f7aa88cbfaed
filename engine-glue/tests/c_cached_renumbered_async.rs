//! After a renumbering failover, an asynchronous call on a plain lock that inherited a cached
//! lock's old id goes ahead: the cache's ids from before are dropped first, as at every single
//! call. Before, it asked the cache with its stale ids and refused the plain lock
//! (`DLOCK_EINVAL`) as if it cached. (Its own test binary: the server and client registries
//! are process-wide.)

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::ops;
use dlock_engine_glue::ffi::types::*;

#[path = "common/renumbered.rs"]
mod renumbered;

#[test]
fn an_async_call_drops_the_caches_ids_from_before_a_renumbering() {
    // SAFETY: the only C-ABI calls of this binary; `st` outlives the calls.
    unsafe {
        renumbered::after_a_renumbering(|c1, plain_id| {
            let req = renumbered::failover::exclusive(plain_id);
            assert_eq!(
                ops::lock_request_async(c1, &req),
                0,
                "the plain lock is not refused as cached"
            );
            let mut st = lock_state::from_word(0);
            let done = loop {
                match ops::lock_result_check(c1, (&raw mut st).cast()) {
                    again if again == Status::AsyncAgain.code() => std::thread::yield_now(),
                    done => break done,
                }
            };
            assert_eq!(done, 0, "granted");
            assert_eq!(ops::unlock(c1, plain_id, (&raw mut st).cast()), 0);
        });
    }
}
