/*
 * dlock_client_api.h: the reference's (UMDK DLock) client API, in C++, served by dlock.
 * See dlock_types.h for what these headers are and how the reference's types map to dlock.
 *
 * Functions whose signature and structs are laid out as dlock.h's are declared extern "C"
 * in namespace dlock, as the reference declares them, and are dlock.h's functions (one symbol,
 * the behaviour and return codes documented there). The others are inline C++ functions of
 * the same name and signature that convert and call dlock's dlock_compat_* entry points:
 * dclient_lib_init (the reference's client_cfg), get_client_debug_stats (its 45 counters),
 * and every call that writes a lock state (trylock, lock, unlock, lock_extend,
 * lock_result_check: the reference's 8/16-byte states; the batches: its 20-byte lock_op_res).
 *
 * What dlock does differently, in short (dlock.h and README.md have the details):
 *  - client_init(&id, ip): "ip" or "ip:port", IPv4 or IPv6, over TCP (TLS when
 *    dclient_lib_init enabled it); NULL or "" reaches the one server running in this process.
 *  - lock() waits on the server (no polling) and returns DLOCK_ETIMEOUT after 5 s (the
 *    reference: the last trylock code).
 *  - Every function is thread-safe; one client instance is still meant for one thread.
 *  - release_lock of a held lock returns DLOCK_FAIL (the reference: -1).
 *  - get_client_debug_stats is not rate-limited and counts the error statuses this instance
 *    returned.
 *  - Additions (not in the reference): client_cfg_ext and the dclient_lib_init overload that
 *    takes it, lock_fence, umo_atomic64_cas_value, lock_value_enable/get/set.
 */

#ifndef __DLOCK_CLIENT_API_H__
#define __DLOCK_CLIENT_API_H__

#include "dlock_types.h"

namespace dlock {
extern "C" {

/* Deregisters every client instance of this process. */
void dclient_lib_deinit();

/* Registers a client instance with the server at ip_str (see above) and writes its id. */
int client_init(int *p_client_id, const char *ip_str);

/* Re-registers with the same id over new connections, keeping the lock state. */
int client_reinit(int client_id, const char *ip_str);

/* The id is gone even when the exchange fails. */
int client_deinit(int client_id);

/* timeout: 1..300 s. */
int client_heartbeat(int client_id, unsigned int timeout);

int client_reinit_done(int client_id);

int get_lock(int client_id, const struct lock_desc *desc, int *lock_id);

int release_lock(int client_id, int lock_id);

/* After client_reinit found the server recovering. The server may give the locks new ids:
   call get_lock by name again after client_reinit_done (dlock.h says why). */
int update_all_locks(int client_id);

int clear_client_debug_stats(int client_id);

/* lock_ids[i]: the id, or minus the entry's status (<= 0). */
int batch_get_lock(int client_id, unsigned int lock_num, const struct lock_desc *descs,
                   int *lock_ids);

/* Ids that could not be released are set to 0. */
int batch_release_lock(int client_id, unsigned int lock_num, int *lock_ids);

/* One outstanding per client; poll with lock_result_check. */
int lock_request_async(int client_id, const struct lock_request *req);

int umo_atomic64_create(int client_id, const struct umo_atomic64_desc *desc, uint64_t init_val,
                        int *obj_id);

int umo_atomic64_destroy(int client_id, int obj_id);

int umo_atomic64_get(int client_id, const struct umo_atomic64_desc *desc, int *obj_id);

int umo_atomic64_release(int client_id, int obj_id);

/* *res_val: the value before the add. */
int umo_atomic64_faa(int client_id, int obj_id, uint64_t add_val, uint64_t *res_val);

/* 0 when swapped, DLOCK_OBJECT_CAS_FAILED when the value differed. */
int umo_atomic64_cas(int client_id, int obj_id, uint64_t cmp_val, uint64_t swap_val);

int umo_atomic64_get_snapshot(int client_id, int obj_id, uint64_t *res_val);

/* dlock addition: umo_atomic64_cas that also writes the value it found (cmp_val when it
   swapped). */
int umo_atomic64_cas_value(int client_id, int obj_id, uint64_t cmp_val, uint64_t swap_val,
                           uint64_t *observed);

/* dlock addition: the fencing token of the grant this client holds on lock_id, larger than
   every token issued before for the lock. DLOCK_ALREADY_UNLOCKED when none is held. */
int lock_fence(int client_id, int lock_id, uint64_t *fence);

/* dlock additions: lock value blocks, 32 bytes a lock keeps for the engine (dlock.h has the
   rules and return codes). lock_value_enable: every grant of lock_id returns its block (1) or
   none (0); lock_value_get: the first len (0..32) bytes of the block the grant held came with,
   and whether it is valid; lock_value_set: the block (0..32 bytes, more is DLOCK_EINVAL) the
   unlock releasing the exclusive grant held writes. */
int lock_value_enable(int client_id, int lock_id, int enable);
int lock_value_get(int client_id, int lock_id, void *value, unsigned int len, int *valid);
int lock_value_set(int client_id, int lock_id, const void *value, unsigned int len);

/* dlock additions: retained locks (dlock.h has the rules and return codes). */
int lock_retain_enable(int client_id, int lock_id, int enable);
int recovery_done(int client_id, int dead_client_id, unsigned int *released);

} /* extern "C" */

/* dlock addition: what dlock.h's client_cfg has beyond the reference's (0: the default). */
struct client_cfg_ext {
    unsigned int lease_ms;   /* client lease to ask the server for (0: the server's) */
    unsigned int timeout_ms; /* synchronous request timeout (0: 5000) */
};

/* dlock's entry points behind the inline functions below (engine-glue/src/ffi/compat/). */
namespace compat_abi {
extern "C" {
int dlock_compat_dclient_lib_init(const struct client_cfg *cfg, const struct client_cfg_ext *ext);
int dlock_compat_get_client_debug_stats(int client_id, struct debug_stats *stats);
int dlock_compat_trylock(int client_id, const struct lock_request *req, void *result);
int dlock_compat_lock(int client_id, const struct lock_request *req, void *result);
int dlock_compat_unlock(int client_id, int lock_id, void *result);
int dlock_compat_lock_extend(int client_id, const struct lock_request *req, void *result);
int dlock_compat_lock_result_check(int client_id, void *result);
int dlock_compat_batch_trylock(int client_id, unsigned int lock_num,
                               const struct lock_request *reqs, void *results);
int dlock_compat_batch_unlock(int client_id, unsigned int lock_num, const int *lock_ids,
                              void *results);
int dlock_compat_batch_lock_extend(int client_id, unsigned int lock_num,
                                   const struct lock_request *reqs, void *results);
} /* extern "C" */
} /* namespace compat_abi */

/*
 * Initialises the client library (once per process). The reference's URMA fields are never
 * read; primary_port and ssl are used. 0; DLOCK_EINVAL; -1 when already initialised.
 */
inline int dclient_lib_init(const struct client_cfg *p_client_cfg)
{
    return compat_abi::dlock_compat_dclient_lib_init(p_client_cfg, nullptr);
}

/* dlock addition: the same with dlock's own client settings. */
inline int dclient_lib_init(const struct client_cfg *p_client_cfg, const struct client_cfg_ext &ext)
{
    return compat_abi::dlock_compat_dclient_lib_init(p_client_cfg, &ext);
}

/* The reference's 45 counters; those dlock has no counterpart for stay 0. */
inline int get_client_debug_stats(int client_id, struct debug_stats *stats)
{
    return compat_abi::dlock_compat_get_client_debug_stats(client_id, stats);
}

/*
 * Lock operations. result: the reference state of the lock's kind (atomic_state, rw_state,
 * fairlock_state, or a lock_state): 8 bytes are written for an atomic lock, 16 otherwise, on
 * DLOCK_SUCCESS, DLOCK_ALREADY_LOCKED, DLOCK_EAGAIN, DLOCK_FAIL and DLOCK_ETIMEOUT.
 */
inline int trylock(int client_id, const struct lock_request *req, void *result)
{
    return compat_abi::dlock_compat_trylock(client_id, req, result);
}

inline int lock(int client_id, const struct lock_request *req, void *result)
{
    return compat_abi::dlock_compat_lock(client_id, req, result);
}

inline int unlock(int client_id, int lock_id, void *result)
{
    return compat_abi::dlock_compat_unlock(client_id, lock_id, result);
}

inline int lock_extend(int client_id, const struct lock_request *req, void *result)
{
    return compat_abi::dlock_compat_lock_extend(client_id, req, result);
}

inline int lock_result_check(int client_id, void *result)
{
    return compat_abi::dlock_compat_lock_result_check(client_id, result);
}

/* Batches of 1..31: results is an array of lock_num struct lock_op_res (20 bytes each). */
inline int batch_trylock(int client_id, unsigned int lock_num, const struct lock_request *reqs,
                         void *results)
{
    return compat_abi::dlock_compat_batch_trylock(client_id, lock_num, reqs, results);
}

inline int batch_unlock(int client_id, unsigned int lock_num, const int *lock_ids, void *results)
{
    return compat_abi::dlock_compat_batch_unlock(client_id, lock_num, lock_ids, results);
}

inline int batch_lock_extend(int client_id, unsigned int lock_num,
                             const struct lock_request *reqs, void *results)
{
    return compat_abi::dlock_compat_batch_lock_extend(client_id, lock_num, reqs, results);
}

} /* namespace dlock */

#endif /* __DLOCK_CLIENT_API_H__ */
