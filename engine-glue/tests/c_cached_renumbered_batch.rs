//! After a renumbering failover, a batch on a plain lock that inherited a cached lock's old id
//! goes ahead: the cache's ids from before are dropped first, as at every single call. Before,
//! the batch asked the cache with its stale ids and refused the plain lock (`DLOCK_EINVAL`) as
//! if it cached. (Its own test binary: the server and client registries are process-wide.)

use dlock_engine_glue::ffi::batch;
use dlock_engine_glue::ffi::types::*;

#[path = "common/renumbered.rs"]
mod renumbered;

#[test]
fn a_batch_drops_the_caches_ids_from_before_a_renumbering() {
    // SAFETY: the only C-ABI calls of this binary; the arrays outlive the calls.
    unsafe {
        renumbered::after_a_renumbering(|c1, plain_id| {
            let req = renumbered::failover::exclusive(plain_id);
            let mut res = [lock_op_res {
                state: lock_state::from_word(0),
                op_ret: -1,
                rsvd: 0,
                fence: 0,
            }; 1];
            assert_eq!(batch::batch_trylock(c1, 1, &req, res.as_mut_ptr()), 0);
            assert_eq!(res[0].op_ret, 0, "the plain lock is not refused as cached");
            let ids = [plain_id];
            assert_eq!(
                batch::batch_unlock(c1, 1, ids.as_ptr(), res.as_mut_ptr()),
                0
            );
            assert_eq!(res[0].op_ret, 0);
        });
    }
}
