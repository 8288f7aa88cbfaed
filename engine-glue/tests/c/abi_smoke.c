/*
 * abi_smoke.c: drives dlock through include/dlock.h the way a C storage engine would.
 *
 * Built and run by engine-glue/tests/c_abi.rs against libdlock_engine_glue.a:
 *   abi_smoke          runs every check; exit status 0 only if all passed, and each failure
 *                      is printed with its line, the expression and the values seen.
 *   abi_smoke layout   prints the size of every struct and the offset of every field, as
 *                      this compiler lays them out, for the Rust test to compare.
 */

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"

#define CHECK_PROGRAM "abi_smoke"
#include "checks.h"

#define LAYOUT_SIZE(t) printf("size %s %zu\n", #t, sizeof(t))
#define LAYOUT_FIELD(t, f) printf("field %s.%s %zu\n", #t, #f, offsetof(t, f))

static int print_layout(void)
{
    LAYOUT_SIZE(struct lock_desc);
    LAYOUT_FIELD(struct lock_desc, p_desc);
    LAYOUT_FIELD(struct lock_desc, len);
    LAYOUT_FIELD(struct lock_desc, lock_type);
    LAYOUT_FIELD(struct lock_desc, lease_time);
    LAYOUT_SIZE(struct lock_request);
    LAYOUT_FIELD(struct lock_request, lock_id);
    LAYOUT_FIELD(struct lock_request, lock_op);
    LAYOUT_FIELD(struct lock_request, expire_time);
    LAYOUT_SIZE(atomic_state);
    LAYOUT_FIELD(atomic_state, client_id);
    LAYOUT_FIELD(atomic_state, rsvd);
    LAYOUT_FIELD(atomic_state, expiry_ms);
    LAYOUT_SIZE(rw_state);
    LAYOUT_FIELD(rw_state, client_id);
    LAYOUT_FIELD(rw_state, rcount);
    LAYOUT_FIELD(rw_state, since_ms);
    LAYOUT_SIZE(fairlock_state);
    LAYOUT_FIELD(fairlock_state, n_exclusive);
    LAYOUT_FIELD(fairlock_state, n_shared);
    LAYOUT_FIELD(fairlock_state, m_exclusive);
    LAYOUT_FIELD(fairlock_state, m_shared);
    LAYOUT_FIELD(fairlock_state, ext);
    LAYOUT_SIZE(lock_state);
    LAYOUT_SIZE(struct lock_op_res);
    /* The anonymous union is the Rust field `state`. */
    printf("field struct lock_op_res.state %zu\n", offsetof(struct lock_op_res, atomic));
    LAYOUT_FIELD(struct lock_op_res, op_ret);
    LAYOUT_FIELD(struct lock_op_res, rsvd);
    LAYOUT_FIELD(struct lock_op_res, fence);
    LAYOUT_SIZE(struct umo_atomic64_desc);
    LAYOUT_FIELD(struct umo_atomic64_desc, p_desc);
    LAYOUT_FIELD(struct umo_atomic64_desc, len);
    LAYOUT_FIELD(struct umo_atomic64_desc, lease_time);
    LAYOUT_SIZE(struct ssl_cfg);
    LAYOUT_FIELD(struct ssl_cfg, ssl_enable);
    LAYOUT_FIELD(struct ssl_cfg, ca_path);
    LAYOUT_FIELD(struct ssl_cfg, crl_path);
    LAYOUT_FIELD(struct ssl_cfg, cert_path);
    LAYOUT_FIELD(struct ssl_cfg, prkey_path);
    LAYOUT_FIELD(struct ssl_cfg, cert_verify_cb);
    LAYOUT_FIELD(struct ssl_cfg, prkey_pwd_cb);
    LAYOUT_FIELD(struct ssl_cfg, erase_prkey_cb);
    LAYOUT_SIZE(struct client_cfg);
    LAYOUT_FIELD(struct client_cfg, log_level);
    LAYOUT_FIELD(struct client_cfg, primary_port);
    LAYOUT_FIELD(struct client_cfg, lease_ms);
    LAYOUT_FIELD(struct client_cfg, timeout_ms);
    LAYOUT_FIELD(struct client_cfg, ssl);
    LAYOUT_SIZE(struct primary_cfg);
    LAYOUT_FIELD(struct primary_cfg, num_of_replica);
    LAYOUT_FIELD(struct primary_cfg, recovery_client_num);
    LAYOUT_FIELD(struct primary_cfg, ctrl_cpuset);
    LAYOUT_FIELD(struct primary_cfg, cmd_cpuset);
    LAYOUT_FIELD(struct primary_cfg, server_ip_str);
    LAYOUT_FIELD(struct primary_cfg, server_port);
    LAYOUT_FIELD(struct primary_cfg, replica_port);
    LAYOUT_FIELD(struct primary_cfg, replica_enable);
    LAYOUT_SIZE(struct server_cfg);
    LAYOUT_FIELD(struct server_cfg, type);
    LAYOUT_FIELD(struct server_cfg, log_level);
    LAYOUT_FIELD(struct server_cfg, sleep_mode_enable);
    LAYOUT_FIELD(struct server_cfg, primary);
    LAYOUT_FIELD(struct server_cfg, locks_max);
    LAYOUT_FIELD(struct server_cfg, clients_max);
    LAYOUT_FIELD(struct server_cfg, objects_max);
    LAYOUT_FIELD(struct server_cfg, client_lease_ms);
    LAYOUT_FIELD(struct server_cfg, client_lease_max_ms);
    LAYOUT_FIELD(struct server_cfg, epoch);
    LAYOUT_FIELD(struct server_cfg, shm_name);
    LAYOUT_FIELD(struct server_cfg, ssl);
    LAYOUT_FIELD(struct server_cfg, insecure_plaintext);
    LAYOUT_FIELD(struct server_cfg, session_key_file);
    LAYOUT_FIELD(struct server_cfg, insecure_recovery);
    LAYOUT_FIELD(struct server_cfg, recoverer_local);
    LAYOUT_FIELD(struct server_cfg, cluster);
    LAYOUT_SIZE(struct cluster_cfg);
    LAYOUT_FIELD(struct cluster_cfg, etcd_endpoints);
    LAYOUT_FIELD(struct cluster_cfg, cluster_name);
    LAYOUT_FIELD(struct cluster_cfg, server_id);
    LAYOUT_FIELD(struct cluster_cfg, ttl_ms);
    LAYOUT_FIELD(struct cluster_cfg, partitions);
    LAYOUT_FIELD(struct cluster_cfg, counter_step);
    LAYOUT_FIELD(struct cluster_cfg, advertise);
    LAYOUT_FIELD(struct cluster_cfg, etcd_ca_path);
    LAYOUT_FIELD(struct cluster_cfg, etcd_cert_path);
    LAYOUT_FIELD(struct cluster_cfg, etcd_key_path);
    LAYOUT_FIELD(struct cluster_cfg, etcd_domain);
    LAYOUT_SIZE(struct debug_stats);
    LAYOUT_FIELD(struct debug_stats, stats);
    LAYOUT_SIZE(struct dlock_revoke);
    LAYOUT_FIELD(struct dlock_revoke, lock_id);
    LAYOUT_FIELD(struct dlock_revoke, wanted_op);
    return 0;
}

/* Writes `text` to `path` (mode 0600); 0 on success. */
static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len;
    return close(fd) == 0 && ok ? 0 : -1;
}

static struct server_cfg small_server(void)
{
    struct server_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.type = SERVER_PRIMARY;
    cfg.sleep_mode_enable = true;
    cfg.locks_max = 1024;
    cfg.clients_max = 16;
    cfg.objects_max = 16;
    return cfg;
}

/* Atomic lock: exclusive, re-entrant, refused to the other client, tokens grow. */
static void atomic_lock(int c1, int c2)
{
    struct lock_desc d = desc("orders/atomic", DLOCK_ATOMIC);
    int id1 = 0, id2 = 0;
    EXPECT(get_lock(c1, &d, &id1), DLOCK_SUCCESS);
    EXPECT(get_lock(c2, &d, &id2), DLOCK_SUCCESS);
    CHECK(id1 > 0 && id1 == id2);

    lock_state st;
    struct lock_request r1 = req(id1, LOCK_EXCLUSIVE, 5);
    EXPECT(trylock(c1, &r1, &st), DLOCK_SUCCESS);
    CHECK(st.atomic.client_id == c1);
    uint64_t fence1 = 0, fence2 = 0;
    EXPECT(lock_fence(c1, id1, &fence1), DLOCK_SUCCESS);
    CHECK(fence1 > 0);

    memset(&st, 0, sizeof st);
    EXPECT(trylock(c2, &r1, &st), DLOCK_FAIL);
    CHECK(st.atomic.client_id == c1); /* the word that refused */
    EXPECT(trylock(c1, &r1, &st), DLOCK_ALREADY_LOCKED);
    EXPECT(unlock(c1, id1, &st), DLOCK_ALREADY_LOCKED);
    EXPECT(unlock(c1, id1, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(c1, id1, &fence1), DLOCK_ALREADY_UNLOCKED);
    EXPECT(unlock(c1, id1, &st), DLOCK_ALREADY_UNLOCKED);

    EXPECT(lock(c2, &r1, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(c2, id1, &fence2), DLOCK_SUCCESS);
    CHECK(fence2 > fence1);
    struct lock_request ext = req(id1, EXTEND_LOCK_EXCLUSIVE, 10);
    EXPECT(lock_extend(c2, &ext, &st), DLOCK_SUCCESS);
    CHECK(st.atomic.client_id == c2);
    /* Extending the mode not held is refused, as in the reference; the grant stays. */
    struct lock_request ext_sh = req(id1, EXTEND_LOCK_SHARED, 10);
    EXPECT(lock_extend(c2, &ext_sh, &st), DLOCK_EINVAL);
    EXPECT(lock_request_async(c2, &ext_sh), DLOCK_EINVAL);
    EXPECT(lock_fence(c2, id1, &fence2), DLOCK_SUCCESS);
    EXPECT(unlock(c2, id1, &st), DLOCK_SUCCESS);

    /* The same through the async pair. */
    EXPECT(lock_request_async(c1, &r1), DLOCK_SUCCESS);
    EXPECT(lock_request_async(c1, &r1), DLOCK_EASYNC);
    int rc;
    do {
        rc = lock_result_check(c1, &st);
    } while (rc == DLOCK_ASYNC_AGAIN);
    EXPECT(rc, DLOCK_SUCCESS);
    CHECK(st.atomic.client_id == c1);
    EXPECT(lock_result_check(c1, &st), DLOCK_NO_ASYNC);
    EXPECT(release_lock(c1, id1), -1); /* still held: the reference's -1 */
    EXPECT(unlock(c1, id1, &st), DLOCK_SUCCESS);

    /* lock() waits on the server: c1's 1 s lease runs out and c2 is granted. */
    struct lock_request short_lease = req(id1, LOCK_EXCLUSIVE, 1);
    EXPECT(trylock(c1, &short_lease, &st), DLOCK_SUCCESS);
    EXPECT(lock(c2, &r1, &st), DLOCK_SUCCESS);
    CHECK(st.atomic.client_id == c2);
    EXPECT(unlock(c1, id1, &st), DLOCK_FAIL); /* c1's grant is gone */
    CHECK(st.atomic.client_id == c2);
    EXPECT(unlock(c2, id1, &st), DLOCK_SUCCESS);
    EXPECT(release_lock(c1, id1), DLOCK_SUCCESS);
    EXPECT(release_lock(c2, id2), DLOCK_SUCCESS);
}

/* RW lock: shared by both clients, then exclusive for one. */
static void rw_lock(int c1, int c2)
{
    struct lock_desc d = desc("orders/rg-17", DLOCK_RW);
    int id = 0, id2 = 0;
    EXPECT(get_lock(c1, &d, &id), DLOCK_SUCCESS);
    EXPECT(get_lock(c2, &d, &id2), DLOCK_SUCCESS);
    lock_state st;
    struct lock_request sh = req(id, LOCK_SHARED, 5);
    struct lock_request ex = req(id, LOCK_EXCLUSIVE, 5);
    EXPECT(trylock(c1, &sh, &st), DLOCK_SUCCESS);
    EXPECT(trylock(c2, &sh, &st), DLOCK_SUCCESS);
    CHECK(st.rw.rcount == 2 && st.rw.client_id == 0);
    struct lock_request ext = req(id, EXTEND_LOCK_SHARED, 5);
    EXPECT(lock_extend(c1, &ext, &st), DLOCK_EINVAL); /* RW locks do not expire */
    EXPECT(unlock(c1, id, &st), DLOCK_SUCCESS);
    EXPECT(unlock(c2, id, &st), DLOCK_SUCCESS);
    EXPECT(trylock(c1, &ex, &st), DLOCK_SUCCESS);
    CHECK(st.rw.client_id == c1);
    EXPECT(trylock(c2, &sh, &st), DLOCK_FAIL);
    EXPECT(unlock(c1, id, &st), DLOCK_SUCCESS);
    EXPECT(release_lock(c1, id), DLOCK_SUCCESS);
    EXPECT(release_lock(c2, id), DLOCK_SUCCESS);
}

/* Lock value blocks: written by an exclusive unlock, read by the next grant; a block longer
   than DLOCK_VALUE_BLOCK_LEN and a reader's write are refused, and nothing is unlocked. */
static void value_blocks(int c1, int c2)
{
    struct lock_desc d = desc("orders/page-9", DLOCK_RW);
    int id = 0, id2 = 0, valid = -1;
    EXPECT(get_lock(c1, &d, &id), DLOCK_SUCCESS);
    EXPECT(get_lock(c2, &d, &id2), DLOCK_SUCCESS);
    EXPECT(lock_value_enable(c1, id, 1), DLOCK_SUCCESS);
    EXPECT(lock_value_enable(c2, id2, 1), DLOCK_SUCCESS);
    EXPECT(lock_value_enable(c2, id2, 2), DLOCK_EINVAL);
    unsigned char lsn[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[DLOCK_VALUE_BLOCK_LEN + 1];
    lock_state st;
    struct lock_request ex = req(id, LOCK_EXCLUSIVE, 5);
    struct lock_request sh = req(id2, LOCK_SHARED, 5);
    EXPECT(lock_value_get(c1, id, got, 8, &valid), DLOCK_ALREADY_UNLOCKED);
    EXPECT(trylock(c1, &ex, &st), DLOCK_SUCCESS);
    EXPECT(lock_value_get(c1, id, got, 8, &valid), DLOCK_SUCCESS);
    CHECK(valid == 1 && got[0] == 0);
    EXPECT(lock_value_get(c1, id, got, DLOCK_VALUE_BLOCK_LEN + 1, &valid), DLOCK_EINVAL);
    EXPECT(lock_value_set(c1, id, got, DLOCK_VALUE_BLOCK_LEN + 1), DLOCK_EINVAL);
    EXPECT(lock_value_set(c1, id, lsn, sizeof lsn), DLOCK_SUCCESS);
    EXPECT(unlock(c1, id, &st), DLOCK_SUCCESS);
    EXPECT(trylock(c2, &sh, &st), DLOCK_SUCCESS);
    memset(got, 0xEE, sizeof got);
    EXPECT(lock_value_get(c2, id2, got, DLOCK_VALUE_BLOCK_LEN, &valid), DLOCK_SUCCESS);
    CHECK(valid == 1 && memcmp(got, lsn, sizeof lsn) == 0 && got[8] == 0 && got[31] == 0);
    EXPECT(lock_value_set(c2, id2, lsn, sizeof lsn), DLOCK_EINVAL); /* readers cannot write */
    EXPECT(unlock(c2, id2, &st), DLOCK_SUCCESS);
    /* Retention is asked per lock; only a configured recoverer may release a dead client's
       locks (this server names none), and asking tells nothing about who retains. */
    EXPECT(lock_retain_enable(c1, id, 1), DLOCK_SUCCESS);
    EXPECT(lock_retain_enable(c1, id, 2), DLOCK_EINVAL);
    EXPECT(lock_retain_enable(c1, id, 0), DLOCK_SUCCESS);
    unsigned int released = 99;
    EXPECT(recovery_done(c1, c2, &released), DLOCK_EINVAL);
    EXPECT(recovery_done(c1, 0x1234567, NULL), DLOCK_EINVAL);
    CHECK(released == 99);
    EXPECT(release_lock(c1, id), DLOCK_SUCCESS);
    EXPECT(release_lock(c2, id2), DLOCK_SUCCESS);
}

/* Fair lock: FIFO tickets, a queued waiter granted by lock(), shared readers counted. */
static void fair_lock(int c1, int c2)
{
    struct lock_desc d = desc("orders/fair", DLOCK_FAIR);
    int id = 0, id2 = 0;
    EXPECT(get_lock(c1, &d, &id), DLOCK_SUCCESS);
    EXPECT(get_lock(c2, &d, &id2), DLOCK_SUCCESS);
    lock_state st;
    struct lock_request ex = req(id, LOCK_EXCLUSIVE, 5);
    struct lock_request sh = req(id, LOCK_SHARED, 5);
    EXPECT(trylock(c1, &ex, &st), DLOCK_SUCCESS);
    EXPECT(trylock(c2, &ex, &st), DLOCK_EAGAIN); /* queued behind c1 */
    EXPECT(trylock(c2, &sh, &st), DLOCK_ETICKET);
    EXPECT(release_lock(c2, id), DLOCK_TICKET_TO_UNLOCK);
    EXPECT(unlock(c1, id, &st), DLOCK_SUCCESS);
    EXPECT(lock(c2, &ex, &st), DLOCK_SUCCESS); /* its ticket's turn */
    uint64_t fence = 0;
    EXPECT(lock_fence(c2, id, &fence), DLOCK_SUCCESS);
    CHECK(fence > 0);
    EXPECT(unlock(c2, id, &st), DLOCK_SUCCESS);

    EXPECT(trylock(c1, &sh, &st), DLOCK_SUCCESS);
    EXPECT(trylock(c2, &sh, &st), DLOCK_SUCCESS);
    CHECK(DLOCK_FAIR_RCNT(st.fl.ext) == 2);
    CHECK(DLOCK_FAIR_TIMEOUT_MS(st.fl.ext) > 0);
    struct lock_request ext = req(id, EXTEND_LOCK_SHARED, 10);
    EXPECT(lock_extend(c1, &ext, &st), DLOCK_SUCCESS);
    struct lock_request ext_ex = req(id, EXTEND_LOCK_EXCLUSIVE, 10);
    EXPECT(lock_extend(c1, &ext_ex, &st), DLOCK_EINVAL); /* held shared */
    EXPECT(unlock(c1, id, &st), DLOCK_SUCCESS);
    EXPECT(unlock(c2, id, &st), DLOCK_SUCCESS);
    EXPECT(release_lock(c1, id), DLOCK_SUCCESS);
    EXPECT(release_lock(c2, id), DLOCK_SUCCESS);
}

/* A full batch of 31 keys: get, trylock (one client wins them all), extend, unlock, release. */
static void batch(int c1, int c2)
{
    char names[MAX_LOCK_BATCH_SIZE][16];
    struct lock_desc descs[MAX_LOCK_BATCH_SIZE];
    int ids[MAX_LOCK_BATCH_SIZE], ids2[MAX_LOCK_BATCH_SIZE];
    struct lock_request reqs[MAX_LOCK_BATCH_SIZE];
    struct lock_op_res res[MAX_LOCK_BATCH_SIZE];
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++) {
        snprintf(names[i], sizeof names[i], "rows/%02d", i);
        descs[i] = desc(names[i], DLOCK_ATOMIC);
    }
    EXPECT(batch_get_lock(c1, MAX_LOCK_BATCH_SIZE, descs, ids), DLOCK_SUCCESS);
    EXPECT(batch_get_lock(c2, MAX_LOCK_BATCH_SIZE, descs, ids2), DLOCK_SUCCESS);
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++) {
        CHECK(ids[i] > 0 && ids[i] == ids2[i]);
        reqs[i] = req(ids[i], LOCK_EXCLUSIVE, 5);
    }
    EXPECT(batch_trylock(c1, MAX_LOCK_BATCH_SIZE, reqs, res), DLOCK_SUCCESS);
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++) {
        EXPECT(res[i].op_ret, DLOCK_SUCCESS);
        CHECK(res[i].fence > 0 && res[i].atomic.client_id == c1);
    }
    EXPECT(batch_trylock(c2, MAX_LOCK_BATCH_SIZE, reqs, res), DLOCK_SUCCESS);
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++) {
        EXPECT(res[i].op_ret, DLOCK_FAIL);
        CHECK(res[i].fence == 0 && res[i].atomic.client_id == c1);
    }
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++)
        reqs[i].lock_op = EXTEND_LOCK_EXCLUSIVE;
    reqs[3].expire_time = 9; /* each entry has its own expiry */
    reqs[4].lock_op = EXTEND_LOCK_SHARED; /* not the mode held: that entry alone fails */
    EXPECT(batch_lock_extend(c1, MAX_LOCK_BATCH_SIZE, reqs, res), DLOCK_SUCCESS);
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++)
        EXPECT(res[i].op_ret, i == 4 ? DLOCK_EINVAL : DLOCK_SUCCESS);
    EXPECT(batch_unlock(c1, MAX_LOCK_BATCH_SIZE, ids, res), DLOCK_SUCCESS);
    for (int i = 0; i < MAX_LOCK_BATCH_SIZE; i++)
        EXPECT(res[i].op_ret, DLOCK_SUCCESS);

    /* One bad entry fails alone. */
    for (int i = 0; i < 3; i++)
        reqs[i] = req(ids[i], LOCK_EXCLUSIVE, 5);
    reqs[1].lock_op = 7;
    reqs[2].lock_id = 0;
    EXPECT(batch_trylock(c2, 3, reqs, res), DLOCK_SUCCESS);
    EXPECT(res[0].op_ret, DLOCK_SUCCESS);
    EXPECT(res[1].op_ret, DLOCK_EINVAL);
    EXPECT(res[2].op_ret, DLOCK_LOCK_NOT_GET);
    EXPECT(batch_unlock(c2, 1, ids, res), DLOCK_SUCCESS);
    EXPECT(res[0].op_ret, DLOCK_SUCCESS);

    int keep = ids[0];
    EXPECT(batch_release_lock(c1, MAX_LOCK_BATCH_SIZE, ids), DLOCK_SUCCESS);
    CHECK(ids[0] == keep); /* released ids are left as they were */
    ids2[0] = 0x7ffffff0; /* never issued to c2: zeroed */
    EXPECT(batch_release_lock(c2, MAX_LOCK_BATCH_SIZE, ids2), DLOCK_SUCCESS);
    CHECK(ids2[0] == 0 && ids2[1] > 0);
    /* None of them can be released now: -1, as the reference, and every id zeroed. */
    ids2[0] = 0x7ffffff0;
    EXPECT(batch_release_lock(c2, 2, ids2), -1);
    CHECK(ids2[0] == 0 && ids2[1] == 0);
}

/* Transaction ids: 1,000 fetch-and-adds from two clients are unique and increasing. */
static void xids(int c1, int c2)
{
    struct umo_atomic64_desc d = {"xid", 3, 60};
    int obj = 0, o1 = 0, o2 = 0;
    EXPECT(umo_atomic64_create(c1, &d, 100, &obj), DLOCK_SUCCESS);
    EXPECT(umo_atomic64_create(c1, &d, 100, &obj), DLOCK_OBJECT_ALREADY_CREATED);
    EXPECT(umo_atomic64_get(c1, &d, &o1), DLOCK_SUCCESS);
    EXPECT(umo_atomic64_get(c2, &d, &o2), DLOCK_SUCCESS);
    CHECK(o1 == obj && o2 == obj);
    uint64_t prev = 0;
    int increasing = 1;
    for (int i = 0; i < 1000; i++) {
        uint64_t xid = 0;
        EXPECT(umo_atomic64_faa(i % 2 ? c2 : c1, obj, 1, &xid), DLOCK_SUCCESS);
        if (xid != 100 + (uint64_t)i || (i > 0 && xid <= prev))
            increasing = 0;
        prev = xid;
    }
    CHECK(increasing);
    uint64_t v = 0;
    EXPECT(umo_atomic64_get_snapshot(c2, obj, &v), DLOCK_SUCCESS);
    CHECK(v == 1100);

    EXPECT(umo_atomic64_cas(c1, obj, 1100, 5000), DLOCK_SUCCESS);
    EXPECT(umo_atomic64_cas(c2, obj, 1100, 6000), DLOCK_OBJECT_CAS_FAILED);
    uint64_t seen = 0;
    EXPECT(umo_atomic64_cas_value(c2, obj, 1100, 6000, &seen), DLOCK_OBJECT_CAS_FAILED);
    CHECK(seen == 5000);
    EXPECT(umo_atomic64_cas_value(c2, obj, 5000, 6000, &seen), DLOCK_SUCCESS);
    CHECK(seen == 5000);
    EXPECT(umo_atomic64_get_snapshot(c1, obj, &v), DLOCK_SUCCESS);
    CHECK(v == 6000);

    EXPECT(umo_atomic64_release(c2, obj), DLOCK_SUCCESS);
    EXPECT(umo_atomic64_faa(c2, obj, 1, &v), DLOCK_OBJECT_NOT_GET);
    EXPECT(umo_atomic64_destroy(c2, obj), DLOCK_OBJECT_INVALID_OWNER);
    EXPECT(umo_atomic64_release(c1, obj), DLOCK_SUCCESS);
    EXPECT(umo_atomic64_destroy(c1, obj), DLOCK_SUCCESS);
}

/* Bad input gets a code, never a crash. */
static void bad_input(int sid, int c1, int c2)
{
    lock_state st;
    struct lock_desc d = desc("orders/bad", DLOCK_ATOMIC);
    int id = 0;
    EXPECT(get_lock(c1, &d, &id), DLOCK_SUCCESS);
    struct lock_request r = req(id, LOCK_EXCLUSIVE, 5);

    EXPECT(trylock(c1, NULL, &st), DLOCK_EINVAL);
    EXPECT(trylock(c1, &r, NULL), DLOCK_EINVAL);
    EXPECT(get_lock(c1, NULL, &id), DLOCK_EINVAL);
    EXPECT(get_lock(c1, &d, NULL), DLOCK_EINVAL);
    struct lock_request bad_op = req(id, 9, 5);
    EXPECT(trylock(c1, &bad_op, &st), DLOCK_EINVAL);
    EXPECT(unlock(c1, 0, &st), DLOCK_LOCK_NOT_GET);
    EXPECT(unlock(c1, -5, &st), DLOCK_LOCK_NOT_GET);

    static char long_name[MAX_LOCK_DESC_LEN + 1];
    memset(long_name, 'k', sizeof long_name);
    struct lock_desc too_long = {long_name, MAX_LOCK_DESC_LEN + 1, DLOCK_RW, 0};
    EXPECT(get_lock(c1, &too_long, &id), DLOCK_EINVAL);
    struct lock_desc longest = {long_name, MAX_LOCK_DESC_LEN, DLOCK_RW, 0};
    int longest_id = 0;
    EXPECT(get_lock(c1, &longest, &longest_id), DLOCK_SUCCESS);
    struct lock_desc empty = {long_name, 0, DLOCK_RW, 0};
    EXPECT(get_lock(c1, &empty, &id), DLOCK_EINVAL);
    struct lock_desc no_name = {NULL, 4, DLOCK_RW, 0};
    EXPECT(get_lock(c1, &no_name, &id), DLOCK_EINVAL);
    struct lock_desc bad_type = desc("orders/x", 9);
    EXPECT(get_lock(c1, &bad_type, &id), DLOCK_EINVAL);

    struct lock_request reqs[MAX_LOCK_BATCH_SIZE + 1];
    struct lock_op_res res[MAX_LOCK_BATCH_SIZE + 1];
    struct lock_desc descs[MAX_LOCK_BATCH_SIZE + 1];
    int ids[MAX_LOCK_BATCH_SIZE + 1];
    for (int i = 0; i <= MAX_LOCK_BATCH_SIZE; i++) {
        reqs[i] = r;
        descs[i] = d;
        ids[i] = r.lock_id;
    }
    EXPECT(batch_trylock(c1, MAX_LOCK_BATCH_SIZE + 1, reqs, res), DLOCK_EINVAL);
    EXPECT(batch_trylock(c1, 0, reqs, res), DLOCK_EINVAL);
    EXPECT(batch_trylock(c1, 1, NULL, res), DLOCK_EINVAL);
    EXPECT(batch_trylock(c1, 1, reqs, NULL), DLOCK_EINVAL);
    EXPECT(batch_unlock(c1, MAX_LOCK_BATCH_SIZE + 1, ids, res), DLOCK_EINVAL);
    EXPECT(batch_lock_extend(c1, MAX_LOCK_BATCH_SIZE + 1, reqs, res), DLOCK_EINVAL);
    EXPECT(batch_get_lock(c1, MAX_LOCK_BATCH_SIZE + 1, descs, ids), DLOCK_EINVAL);
    EXPECT(batch_release_lock(c1, MAX_LOCK_BATCH_SIZE + 1, ids), DLOCK_EINVAL);
    descs[5] = too_long;
    EXPECT(batch_get_lock(c1, MAX_LOCK_BATCH_SIZE, descs, ids), DLOCK_EINVAL);

    int unknown = 0x7ffffff1;
    if (unknown == c1 || unknown == c2)
        unknown--;
    EXPECT(trylock(unknown, &r, &st), DLOCK_CLIENT_NOT_INIT);
    /* Unknown ids: -1 from the control-plane calls, status codes from the others, each as the
     * reference's call of the same name answers. */
    EXPECT(get_lock(unknown, &d, &id), -1);
    EXPECT(release_lock(unknown, id), -1);
    EXPECT(batch_get_lock(unknown, 1, &d, &id), -1);
    int one_id = id;
    EXPECT(batch_release_lock(unknown, 1, &one_id), -1);
    EXPECT(client_reinit(unknown, NULL), DLOCK_EINVAL);
    EXPECT(client_reinit_done(unknown), DLOCK_CLIENT_NOT_INIT);
    EXPECT(update_all_locks(unknown), DLOCK_CLIENT_NOT_INIT);
    struct debug_stats unknown_stats;
    EXPECT(get_client_debug_stats(unknown, &unknown_stats), DLOCK_CLIENT_NOT_INIT);
    struct lock_request ext = req(id, EXTEND_LOCK_EXCLUSIVE, 5);
    EXPECT(lock_extend(unknown, &ext, &st), DLOCK_CLIENT_NOT_INIT);
    EXPECT(lock_extend(unknown, &r, &st), DLOCK_EINVAL); /* the op is checked first */
    EXPECT(umo_atomic64_release(unknown, 1), DLOCK_CLIENT_NOT_INIT);
    /* A lock never got, and a name that exists with another type: -1 too. */
    EXPECT(release_lock(c1, 0x7ffffff0), -1);
    struct lock_desc other_type = desc("orders/bad", DLOCK_RW);
    EXPECT(get_lock(c1, &other_type, &id), -1);
    id = one_id;
    EXPECT(umo_atomic64_faa(unknown, 1, 1, NULL), DLOCK_EINVAL);
    uint64_t v;
    EXPECT(umo_atomic64_faa(unknown, 1 << 20, 1, &v), DLOCK_CLIENT_NOT_INIT);
    EXPECT(umo_atomic64_faa(c1, 1 << 20, 1, &v), DLOCK_OBJECT_NOT_GET);
    EXPECT(umo_atomic64_faa(c1, -1, 1, &v), DLOCK_OBJECT_NOT_GET);
    struct umo_atomic64_desc no_lease = {"x", 1, 0};
    EXPECT(umo_atomic64_create(c1, &no_lease, 0, &id), DLOCK_EINVAL);
    EXPECT(umo_atomic64_cas_value(c1, 1, 0, 0, NULL), DLOCK_EINVAL);
    EXPECT(client_heartbeat(unknown, 5), DLOCK_EINVAL);
    EXPECT(client_heartbeat(c1, 0), DLOCK_EINVAL);
    EXPECT(client_heartbeat(c1, DLOCK_HEARTBEAT_TIMEOUT_MAX_S + 1), DLOCK_EINVAL);
    EXPECT(client_heartbeat(c1, 5), DLOCK_SUCCESS);
    EXPECT(client_deinit(unknown), -1);
    EXPECT(lock_result_check(c1, NULL), DLOCK_EINVAL);
    EXPECT(lock_fence(c1, id, NULL), DLOCK_EINVAL);
    EXPECT(client_init(NULL, NULL), DLOCK_EINVAL);
    EXPECT(client_init(&id, "db-host-7"), -1); /* not an address: the reference's -1 */
    EXPECT(client_init(&id, "10.1.2"), -1);
    EXPECT(client_reinit(c1, "db-host-7"), -1);
    EXPECT(client_reinit(c1, "10.1.2.3"), DLOCK_EINVAL); /* not where it registered */

    EXPECT(server_stop(DLOCK_SERVER_ID_MAX + 1), -1);
    EXPECT(get_server_debug_stats(sid, NULL), DLOCK_EINVAL);
    EXPECT(get_server_debug_stats(DLOCK_SERVER_ID_MAX + 1, NULL), DLOCK_EINVAL);
    struct debug_stats ds;
    EXPECT(get_server_debug_stats(DLOCK_SERVER_ID_MAX + 1, &ds), -1);
    EXPECT(server_start(NULL, &id), DLOCK_EINVAL);
    struct server_cfg cfg = small_server();
    EXPECT(server_start(&cfg, NULL), DLOCK_EINVAL);
    cfg.primary.replica_enable = true;
    EXPECT(server_start(&cfg, &id), DLOCK_EINVAL);
    cfg = small_server();
    cfg.epoch = 70000;
    EXPECT(server_start(&cfg, &id), DLOCK_EINVAL);
    cfg = small_server();
    cfg.primary.cmd_cpuset = "two";
    EXPECT(server_start(&cfg, &id), DLOCK_EINVAL);
    EXPECT(release_lock(c1, longest_id), DLOCK_SUCCESS);
}

/* Before dclient_lib_init: -1 from the control-plane calls, DLOCK_CLIENTMGR_NOT_INIT from
 * the lock, object and counter calls, each as the reference's call of the same name. */
static void before_lib_init(void)
{
    int c = 0, id = 1, ids[1] = {1};
    struct lock_desc d = desc("early", DLOCK_ATOMIC);
    struct lock_request r = req(1, LOCK_EXCLUSIVE, 5);
    struct lock_op_res res[1];
    struct debug_stats ds;
    lock_state st;
    uint64_t v;
    EXPECT(client_init(&c, NULL), -1);
    EXPECT(client_reinit(1, NULL), -1);
    EXPECT(client_reinit_done(1), -1);
    EXPECT(client_deinit(1), -1);
    EXPECT(client_heartbeat(1, 0), -1); /* the reference checks the library first */
    EXPECT(get_lock(1, &d, &id), -1);
    EXPECT(release_lock(1, 1), -1);
    EXPECT(batch_get_lock(1, 1, &d, ids), -1);
    EXPECT(batch_release_lock(1, 1, ids), -1);
    EXPECT(update_all_locks(1), -1);
    EXPECT(get_client_debug_stats(1, &ds), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(clear_client_debug_stats(1), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(trylock(1, &r, &st), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(unlock(1, 1, &st), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(batch_trylock(1, 1, &r, res), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(lock_request_async(1, &r), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(umo_atomic64_faa(1, 1, 1, &v), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(umo_atomic64_destroy(1, 1), DLOCK_CLIENTMGR_NOT_INIT);
}

/* A second server with a TCP listener, reached by address. */
static void tcp(void)
{
    struct server_cfg cfg = small_server();
    cfg.primary.server_ip_str = "127.0.0.1";
    cfg.primary.server_port = -1; /* any free port */
    int sid = 0, port = 0, c = 0, other = 0;
    EXPECT(server_start(&cfg, &sid), DLOCK_SUCCESS);
    EXPECT(server_tcp_port(sid, &port), DLOCK_SUCCESS);
    CHECK(port > 0);
    EXPECT(client_init(&other, NULL), DLOCK_EINVAL); /* two servers: which one? */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    EXPECT(client_init(&c, addr), DLOCK_SUCCESS);
    struct lock_desc d = desc("tcp/lock", DLOCK_FAIR);
    int id = 0;
    EXPECT(get_lock(c, &d, &id), DLOCK_SUCCESS);
    struct lock_request r = req(id, LOCK_EXCLUSIVE, 5);
    lock_state st;
    EXPECT(trylock(c, &r, &st), DLOCK_SUCCESS);
    /* A second client of the same server shares c's data connection, as itself. */
    EXPECT(client_init(&other, addr), DLOCK_SUCCESS);
    int id2 = 0;
    EXPECT(get_lock(other, &d, &id2), DLOCK_SUCCESS);
    struct lock_desc d2 = desc("tcp/other", DLOCK_ATOMIC);
    int own = 0;
    EXPECT(get_lock(other, &d2, &own), DLOCK_SUCCESS);
    struct lock_request r2 = req(own, LOCK_EXCLUSIVE, 5);
    lock_state st2;
    EXPECT(trylock(other, &r2, &st2), DLOCK_SUCCESS);
    EXPECT(unlock(other, own, &st2), DLOCK_SUCCESS);
    EXPECT(unlock(c, id, &st), DLOCK_SUCCESS);
    EXPECT(client_reinit(c, addr), DLOCK_SUCCESS);
    EXPECT(client_deinit(c), DLOCK_SUCCESS);
    EXPECT(client_deinit(other), DLOCK_SUCCESS);
    EXPECT(server_stop(sid), DLOCK_SUCCESS);
}

static int verify_nothing(void *cert, const char *crl_path)
{
    (void)cert;
    (void)crl_path;
    return 0;
}

/* TLS settings that cannot work are refused before anything starts; plaintext stays on
 * loopback unless asked for. (The TLS handshakes themselves are in tests/tls.rs, which makes
 * certificates.) */
static void tls_settings(void)
{
    int sid = 0;
    struct server_cfg cfg = small_server();
    cfg.ssl.ssl_enable = true; /* no paths at all */
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL);
    cfg.ssl.ca_path = "/";
    cfg.ssl.cert_path = "/";
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL); /* no key */
    cfg.ssl.prkey_path = "/nonexistent/dlock/server.key";
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL);
    cfg.ssl.prkey_path = "/";
    cfg.ssl.cert_verify_cb = verify_nothing;
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL);

    cfg = small_server();
    cfg.primary.server_ip_str = "0.0.0.0";
    cfg.primary.server_port = -1;
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL); /* plaintext on the network */
    cfg.insecure_plaintext = true;
    EXPECT(server_start(&cfg, &sid), DLOCK_SUCCESS);
    EXPECT(server_stop(sid), DLOCK_SUCCESS);

    /* A recovering server needs the failed server's session key, or the operator's word. */
    cfg = small_server();
    cfg.primary.recovery_client_num = 2;
    cfg.epoch = 2;
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL);
    cfg.insecure_recovery = true;
    EXPECT(server_start(&cfg, &sid), DLOCK_SUCCESS);
    EXPECT(server_stop(sid), DLOCK_SUCCESS);
    cfg.insecure_recovery = false;
    char path[64];
    snprintf(path, sizeof path, "/tmp/dlock-abi-key-%ld", (long)getpid());
    cfg.session_key_file = path;
    EXPECT(write_file(path, "0000000000000000000000000000000000000000000000000000000000000000\n"), 0);
    EXPECT(server_start(&cfg, &sid), DLOCK_EINVAL); /* all zeros: obviously low entropy */
    EXPECT(write_file(path, "3c9a51e207bd6814f92e85c04b76d31fa8620d97ee355ac4812bf049b6137ddc\n"), 0);
    EXPECT(server_start(&cfg, &sid), DLOCK_SUCCESS);
    EXPECT(server_stop(sid), DLOCK_SUCCESS);
    remove(path);

    struct client_cfg ccfg;
    memset(&ccfg, 0, sizeof ccfg);
    ccfg.ssl.ssl_enable = true;
    ccfg.ssl.ca_path = "/";
    ccfg.ssl.cert_path = "/";
    EXPECT(dclient_lib_init(&ccfg), DLOCK_EINVAL); /* no key: refused before "already" */
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "layout") == 0)
        return print_layout();

    int c1 = 0, c2 = 0, sid = 0;
    struct client_cfg ccfg;
    memset(&ccfg, 0, sizeof ccfg); /* every default, TLS off */
    before_lib_init();
    struct server_cfg cfg = small_server();
    EXPECT(server_start(&cfg, &sid), -1); /* before dserver_lib_init */
    EXPECT(dserver_lib_init(0), -1);
    EXPECT(dserver_lib_init(MAX_NUM_SERVER + 1), -1);
    EXPECT(dserver_lib_init(2), DLOCK_SUCCESS);
    EXPECT(dserver_lib_init(2), -1);
    EXPECT(dclient_lib_init(NULL), DLOCK_EINVAL);
    EXPECT(dclient_lib_init(&ccfg), DLOCK_SUCCESS);
    EXPECT(client_init(&c1, NULL), DLOCK_NOT_READY); /* no server yet */

    EXPECT(server_start(&cfg, &sid), DLOCK_SUCCESS);
    CHECK(sid >= 1 && sid <= DLOCK_SERVER_ID_MAX);
    EXPECT(client_init(&c1, NULL), DLOCK_SUCCESS);
    EXPECT(client_init(&c2, ""), DLOCK_SUCCESS);
    CHECK(c1 > 0 && c2 > 0 && c1 != c2);

    atomic_lock(c1, c2);
    rw_lock(c1, c2);
    value_blocks(c1, c2);
    fair_lock(c1, c2);
    batch(c1, c2);
    xids(c1, c2);
    bad_input(sid, c1, c2);
    tcp();
    tls_settings();

    struct debug_stats ds;
    EXPECT(get_server_debug_stats(sid, &ds), DLOCK_SUCCESS);
    CHECK(ds.stats[DEBUG_STATS_GRANTS] >= 40);
    CHECK(ds.stats[DEBUG_STATS_CLIENTS_REGISTERED] >= 2);
    CHECK(ds.stats[DEBUG_STATS_FAIL] >= 31);
    CHECK(ds.stats[DEBUG_STATS_WAITS] >= 1);
    EXPECT(clear_server_debug_stats(sid), DLOCK_SUCCESS);
    EXPECT(get_server_debug_stats(sid, &ds), DLOCK_SUCCESS);
    CHECK(ds.stats[DEBUG_STATS_GRANTS] == 0 && ds.stats[DEBUG_STATS_FAIL] == 0);
    EXPECT(get_client_debug_stats(c2, &ds), DLOCK_SUCCESS);
    CHECK(ds.stats[DEBUG_STATS_FAIL] >= 2);
    EXPECT(clear_client_debug_stats(c2), DLOCK_SUCCESS);
    EXPECT(get_client_debug_stats(c2, &ds), DLOCK_SUCCESS);
    CHECK(ds.stats[DEBUG_STATS_FAIL] == 0);

    EXPECT(client_deinit(c1), DLOCK_SUCCESS);
    EXPECT(client_deinit(c1), -1); /* gone: as unknown as an id never issued */
    struct lock_request r = req(1, LOCK_EXCLUSIVE, 5);
    lock_state st;
    EXPECT(trylock(c1, &r, &st), DLOCK_CLIENT_NOT_INIT);
    struct lock_desc d = desc("after/deinit", DLOCK_ATOMIC);
    int id = 0;
    EXPECT(get_lock(c1, &d, &id), -1);
    dclient_lib_deinit(); /* deregisters c2 */
    EXPECT(trylock(c2, &r, &st), DLOCK_CLIENTMGR_NOT_INIT);
    EXPECT(get_lock(c2, &d, &id), -1);
    EXPECT(client_deinit(c2), -1);
    EXPECT(server_stop(sid), DLOCK_SUCCESS);
    EXPECT(server_stop(sid), -1);
    dserver_lib_deinit();
    EXPECT(dserver_lib_init(1), DLOCK_SUCCESS); /* usable again after deinit */
    dserver_lib_deinit();

    return checks_summary();
}
