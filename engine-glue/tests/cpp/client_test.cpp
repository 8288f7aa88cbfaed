/*
 * client_test.cpp: the reference's examples/client/client_test.cpp workload (per thread:
 * trylock/extend/unlock latency, heartbeat latency, batch get/release latency) through the
 * drop-in headers only, against a running server, plus checks of what dlock writes into the
 * reference's structs:
 *  - lock states in the reference's layouts and sizes (an atomic_state is 8 bytes: the bytes
 *    after it stay untouched), holders and ticket counters where the reference has them;
 *  - batches with void *results holding 20-byte lock_op_res entries;
 *  - a queued fair lock (DLOCK_EAGAIN) and a refused atomic lock (DLOCK_FAIL) counted in the
 *    client's debug stats under the reference's indices;
 *  - lock_request_async/lock_result_check, lock().
 *
 *   client_test -i IP -p PORT (-d DEV | -e EID) [-c clients] [-l loops] [-m tp_mode] [-g level]
 *
 * The config struct is filled with garbage first, standing for what reference code leaves
 * uninitialised (ub_token_disable, and eid without -e in the reference's own example).
 */

#include <cstddef>
#include <sys/time.h>
#include <pthread.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>
#include <syslog.h>
#include <mutex>

#include "dlock_types.h"
#include "dlock_client_api.h"
#include "dlock_log.h"
#include "example_common.h"

using namespace dlock;

#define CLIENT_INIT(a, b) client_init(a, b)

#define BASE_CLIENT_ID 1
#define CLIENT_NUM 32
#define LOOP_NUM 10000
#define BATCH_SIZE 2

pthread_t g_client_tid[CLIENT_NUM];
int g_client_id[CLIENT_NUM];
static char *g_server_ip = nullptr;
static char *g_dev_name = nullptr;
static char *g_eid_str = nullptr;
static int g_server_port = 0;
static int g_loglevel = LOG_WARNING;
static int g_client_num = CLIENT_NUM;
static trans_mode_t g_tp_mode = SEPERATE_CONN;

static int g_loop_num = LOOP_NUM;
static std::mutex g_client_mgr_lock;

/* An atomic_state with guard words after it: dlock must write 8 bytes, not its own 16. */
struct guarded_atomic_state {
    atomic_state st;
    uint32_t guard[2];
};
static const uint32_t GUARD = 0xC0FFEEu;

static long elapsed_us(const struct timeval &start, const struct timeval &end)
{
    return (long)end.tv_usec - start.tv_usec + (end.tv_sec - start.tv_sec) * 1000000;
}

void *client_launch(void *p_object)
{
    int client_id = *(int *)p_object;
    int lock_id_1 = client_id * 2;
    int lock_id_2 = client_id * 2 + 1;
    struct timeval tv_start, tv_end;
    long time, time_total, time_min, time_max;
    struct lock_desc lock_1 = {0};
    struct lock_desc lock_2 = {0};
    struct lock_request lock_req1 = {0};
    struct lock_request lock_req2 = {0};
    struct lock_request lock_req2_ext = {0};
    struct guarded_atomic_state lock_state1 = {{0, 0}, {GUARD, GUARD}};
    struct guarded_atomic_state lock_state2 = {{0, 0}, {GUARD, GUARD}};
    atomic_state lock_state2_ext = {0, 0};
    int ret;

    time_total = time_max = 0;
    time_min = 1000000;

    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = CLIENT_INIT(&client_id, g_server_ip);
    }
    if (ret != 0) {
        printf("client_init failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }

    gettimeofday(&tv_start, NULL);

    lock_1.lock_type = DLOCK_ATOMIC;
    lock_1.lease_time = tv_start.tv_sec + 60000;
    lock_1.p_desc = (char *)(&lock_id_1);
    lock_1.len = 4;
    ret = get_lock(client_id, &lock_1, &lock_id_1);
    if (ret != 0) {
        printf("getlock failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }
    lock_req1.lock_id = lock_id_1;
    lock_req1.expire_time = 6000;

    lock_2.lock_type = DLOCK_ATOMIC;
    lock_2.lease_time = tv_start.tv_sec + 60000;
    lock_2.p_desc = (char *)(&lock_id_2);
    lock_2.len = 4;
    ret = get_lock(client_id, &lock_2, &lock_id_2);
    if (ret != 0) {
        printf("getlock failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }
    lock_req2.lock_id = lock_id_2;
    lock_req2.expire_time = 6000;

    lock_req2_ext.lock_id = lock_id_2;
    lock_req2_ext.expire_time = 7000;

    for (int i = 0; i < g_loop_num; i++) {
        lock_req1.lock_op = LOCK_EXCLUSIVE;
        lock_req2.lock_op = LOCK_EXCLUSIVE;
        lock_req2_ext.lock_op = EXTEND_LOCK_EXCLUSIVE;
        ret = trylock(client_id, &lock_req2, &lock_state2);
        if (ret != 0) {
            printf("trylock failed! ret: %d\n", ret);
            g_failures++;
            return 0;
        }
        CHECK(lock_state2.st.client_id == client_id);
        CHECK(lock_state2.st.time_out > 0);

        ret = lock_extend(client_id, &lock_req2_ext, &lock_state2_ext);
        if (ret != 0) {
            printf("lock_extend failed! ret: %d\n", ret);
            g_failures++;
            return 0;
        }
        /* Extended to 7000 s from now: later than the 6000 s the trylock asked for. */
        CHECK(lock_state2_ext.time_out > lock_state2.st.time_out);

        gettimeofday(&tv_start, NULL);

        ret = trylock(client_id, &lock_req1, &lock_state1);
        if (ret != 0) {
            printf("trylock failed! ret: %d\n", ret);
            g_failures++;
            return 0;
        }

        gettimeofday(&tv_end, NULL);
        time = elapsed_us(tv_start, tv_end);
        time_total += time;
        time_min = (time_min > time) ? time : time_min;
        time_max = (time_max < time) ? time : time_max;
        CHECK(lock_state1.st.client_id == client_id);

        ret = unlock(client_id, lock_id_1, &lock_state1);
        if (ret != 0) {
            printf("unlock failed! ret: %d\n", ret);
            g_failures++;
            return 0;
        }

        ret = unlock(client_id, lock_id_2, &lock_state2);
        if (ret != 0) {
            printf("unlock failed! ret: %d\n", ret);
            g_failures++;
            return 0;
        }
        CHECK(lock_state1.guard[0] == GUARD && lock_state1.guard[1] == GUARD);
        CHECK(lock_state2.guard[0] == GUARD && lock_state2.guard[1] == GUARD);
    }
    ret = release_lock(client_id, lock_id_1);
    if (ret != 0) {
        printf("release_lock failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }
    ret = release_lock(client_id, lock_id_2);
    if (ret != 0) {
        printf("release_lock failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }

    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = client_deinit(client_id);
    }
    if (ret != 0) {
        printf("client_deinit failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }
    printf("thread[%d] total trylock time: %ld us, average %lf us\n", *(int *)p_object, time_total,
           1.0 * time_total / g_loop_num);
    printf("thread[%d] trylock max time: %ld us, min time: %ld\n", *(int *)p_object, time_max,
           time_min);
    return 0;
}

void *client_heartbeat_test(void *p_object)
{
    int client_id = *(int *)p_object;
    struct timeval tv_start, tv_end;
    long time, time_total, time_min, time_max;
    int ret;

    time_total = time_max = 0;
    time_min = 1000000;

    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = CLIENT_INIT(&client_id, g_server_ip);
    }
    if (ret != 0) {
        printf("client_init failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }

    for (int i = 0; i < g_loop_num; i++) {
        gettimeofday(&tv_start, NULL);
        ret = client_heartbeat(client_id, 10);
        if (ret != 0) {
            printf("client_heartbeat failed! ret: %d\n", ret);
            g_failures++;
            return 0;
        }
        gettimeofday(&tv_end, NULL);
        time = elapsed_us(tv_start, tv_end);
        time_total += time;
        time_min = (time_min > time) ? time : time_min;
        time_max = (time_max < time) ? time : time_max;
    }
    EXPECT_RET(client_heartbeat(client_id, 0), DLOCK_EINVAL);
    EXPECT_RET(client_heartbeat(client_id, 301), DLOCK_EINVAL);

    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = client_deinit(client_id);
    }
    if (ret != 0) {
        printf("client_deinit failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }
    printf("thread[%d] total heartbeat time: %ld us, average %lf us\n", *(int *)p_object,
           time_total, 1.0 * time_total / g_loop_num);
    printf("thread[%d] heartbeat max time: %ld us, min time: %ld\n", *(int *)p_object, time_max,
           time_min);
    return 0;
}

void *client_getlock_test(void *p_object)
{
    int client_id = *(int *)p_object;
    int lock_ids[BATCH_SIZE];
    struct timeval tv_start, tv_end;
    long time, time_total, time_min, time_max;
    struct lock_desc lock_descs[BATCH_SIZE];
    int i;
    int ret;

    time_total = time_max = 0;
    time_min = 1000000;
    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = CLIENT_INIT(&client_id, g_server_ip);
    }
    if (ret != 0) {
        printf("client_init failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }

    for (i = 0; i < BATCH_SIZE; i++) {
        lock_ids[i] = client_id * BATCH_SIZE + i;
        lock_descs[i].lock_type = DLOCK_ATOMIC;
        lock_descs[i].lease_time = 60000;
        lock_descs[i].p_desc = (char *)(lock_ids + i);
        lock_descs[i].len = 4;
    }

    for (int k = 0; k < g_loop_num; k++) {
        gettimeofday(&tv_start, NULL);
        ret = batch_get_lock(client_id, BATCH_SIZE, lock_descs, lock_ids);
        gettimeofday(&tv_end, NULL);
        if (ret != 0) {
            printf("batch get lock ret %d\n", ret);
            g_failures++;
            return 0;
        }
        for (i = 0; i < BATCH_SIZE; i++) {
            CHECK(lock_ids[i] > 0);
        }
        time = elapsed_us(tv_start, tv_end);
        time_total += time;
        time_min = (time_min > time) ? time : time_min;
        time_max = (time_max < time) ? time : time_max;

        ret = batch_release_lock(client_id, BATCH_SIZE, lock_ids);
        if (ret != 0) {
            printf("batch release ret %d\n", ret);
            g_failures++;
            return 0;
        }
    }

    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = client_deinit(client_id);
    }
    if (ret != 0) {
        printf("client_deinit failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }
    printf("thread[%d] total get lock time: %ld us, average %lf us\n", *(int *)p_object,
           time_total, 1.0 * time_total / g_loop_num);
    printf("thread[%d] getlock max time: %ld us, min time: %ld us\n", *(int *)p_object, time_max,
           time_min);
    return NULL;
}

/* Locks "batch/atomic", "batch/rw" and "batch/fair" for client_id; their ids in ids[]. */
static void get_batch_locks(int client_id, int ids[3])
{
    static char names[3][16] = {"batch/atomic", "batch/rw", "batch/fair"};
    static const unsigned types[3] = {DLOCK_ATOMIC, DLOCK_RW, DLOCK_FAIR};
    struct lock_desc descs[3];
    for (int i = 0; i < 3; i++) {
        descs[i].p_desc = names[i];
        descs[i].len = (unsigned)strlen(names[i]);
        descs[i].lock_type = types[i];
        descs[i].lease_time = 0;
    }
    EXPECT_RET(batch_get_lock(client_id, 3, descs, ids), DLOCK_SUCCESS);
    for (int i = 0; i < 3; i++) {
        CHECK(ids[i] > 0);
    }
}

/*
 * Two clients, one thread: batches with void *results, the lock states of each kind, a queued
 * fair lock and a refused atomic lock in the debug stats, async and blocking locks.
 */
static void batch_and_states_test(void)
{
    int a, b;
    EXPECT_RET(CLIENT_INIT(&a, g_server_ip), DLOCK_SUCCESS);
    EXPECT_RET(CLIENT_INIT(&b, g_server_ip), DLOCK_SUCCESS);
    int ids_a[3], ids_b[3];
    get_batch_locks(a, ids_a);
    get_batch_locks(b, ids_b);
    for (int i = 0; i < 3; i++) {
        CHECK(ids_a[i] == ids_b[i]);
    }

    /* a takes all three in one message; the results are 20-byte entries. */
    struct lock_request reqs[3];
    for (int i = 0; i < 3; i++) {
        reqs[i].lock_id = ids_a[i];
        reqs[i].lock_op = LOCK_EXCLUSIVE;
        reqs[i].expire_time = 30;
    }
    struct lock_op_res res[4];
    memset(res, 0x5A, sizeof(res));
    void *results = res;
    EXPECT_RET(batch_trylock(a, 3, reqs, results), DLOCK_SUCCESS);
    for (int i = 0; i < 3; i++) {
        EXPECT_RET(res[i].op_ret, DLOCK_SUCCESS);
    }
    CHECK(res[0].atomic.client_id == a && res[0].atomic.time_out > 0);
    CHECK(res[1].rw.client_id == a && res[1].rw.rcount == 0 && res[1].rw.time_out > 0);
    /* A fair grant or queueing shows the caller's ticket in m_exclusive (as the reference's
       server patches its replies): a has ticket 0, the first. */
    CHECK(res[2].fl.n_exclusive == 0 && res[2].fl.m_exclusive == 0 && res[2].fl.time_out > 0);
    CHECK(res[3].op_ret == 0x5A5A5A5A); /* the fourth entry was not written */

    /* Extends of the atomic and the fair lock (RW locks have no expiry). */
    struct lock_request ext[2] = {{ids_a[0], EXTEND_LOCK_EXCLUSIVE, 60},
                                  {ids_a[2], EXTEND_LOCK_EXCLUSIVE, 60}};
    EXPECT_RET(batch_lock_extend(a, 2, ext, results), DLOCK_SUCCESS);
    EXPECT_RET(res[0].op_ret, DLOCK_SUCCESS);
    EXPECT_RET(res[1].op_ret, DLOCK_SUCCESS);
    CHECK(res[0].atomic.client_id == a);
    CHECK(res[1].fl.n_exclusive == 0 && res[1].fl.time_out > res[2].fl.time_out);

    /* b queues on the fair lock and is refused the atomic one, which a holds. */
    fairlock_state fl;
    memset(&fl, 0, sizeof(fl));
    struct lock_request fair_b = {ids_b[2], LOCK_EXCLUSIVE, 30};
    EXPECT_RET(trylock(b, &fair_b, &fl), DLOCK_EAGAIN);
    CHECK(fl.n_exclusive == 0 && fl.m_exclusive == 1); /* b's ticket: the one after a's */
    struct guarded_atomic_state held = {{0, 0}, {GUARD, GUARD}};
    struct lock_request atomic_b = {ids_b[0], LOCK_EXCLUSIVE, 30};
    EXPECT_RET(trylock(b, &atomic_b, &held), DLOCK_FAIL);
    CHECK(held.st.client_id == a);
    CHECK(held.guard[0] == GUARD && held.guard[1] == GUARD);

    /* a lets go of all three; b's ticket comes up. */
    EXPECT_RET(batch_unlock(a, 3, ids_a, results), DLOCK_SUCCESS);
    for (int i = 0; i < 3; i++) {
        EXPECT_RET(res[i].op_ret, DLOCK_SUCCESS);
    }
    CHECK(res[0].atomic.client_id == 0);
    CHECK(res[2].fl.n_exclusive == 1 && res[2].fl.m_exclusive == 2); /* b's turn; 2 issued */
    EXPECT_RET(trylock(b, &fair_b, &fl), DLOCK_SUCCESS);
    CHECK(fl.n_exclusive == 1 && fl.m_exclusive == 1);
    EXPECT_RET(unlock(b, ids_b[2], &fl), DLOCK_SUCCESS);

    /* A shared RW hold: no exclusive owner, one reader. */
    rw_state rw;
    memset(&rw, 0, sizeof(rw));
    struct lock_request shared_b = {ids_b[1], LOCK_SHARED, 30};
    EXPECT_RET(trylock(b, &shared_b, &rw), DLOCK_SUCCESS);
    CHECK(rw.client_id == 0 && rw.rcount == 1 && rw.time_out > 0);
    EXPECT_RET(unlock(b, ids_b[1], &rw), DLOCK_SUCCESS);

    /* The two failures, under the reference's indices, and nothing else. */
    struct debug_stats stats;
    EXPECT_RET(get_client_debug_stats(b, &stats), DLOCK_SUCCESS);
    for (int i = 0; i < DEBUG_STATS_MAX; i++) {
        uint64_t want = (i == DEBUG_STATS_EAGAIN || i == DEBUG_STATS_FAIL) ? 1 : 0;
        if (stats.stats[i] != want) {
            printf("client stat %d: %llu, expected %llu\n", i,
                   (unsigned long long)stats.stats[i], (unsigned long long)want);
            g_failures++;
        }
    }
    EXPECT_RET(clear_client_debug_stats(b), DLOCK_SUCCESS);
    EXPECT_RET(get_client_debug_stats(b, &stats), DLOCK_SUCCESS);
    CHECK(stats.stats[DEBUG_STATS_EAGAIN] == 0 && stats.stats[DEBUG_STATS_FAIL] == 0);

    /* Async: start, poll until the reply is there. */
    struct lock_request async_a = {ids_a[0], LOCK_EXCLUSIVE, 30};
    EXPECT_RET(lock_request_async(a, &async_a), DLOCK_SUCCESS);
    struct guarded_atomic_state st = {{0, 0}, {GUARD, GUARD}};
    int ret;
    while ((ret = lock_result_check(a, &st)) == DLOCK_ASYNC_AGAIN) {
        usleep(100);
    }
    EXPECT_RET(ret, DLOCK_SUCCESS);
    CHECK(st.st.client_id == a && st.guard[0] == GUARD && st.guard[1] == GUARD);
    EXPECT_RET(lock_result_check(a, &st), DLOCK_NO_ASYNC);
    uint64_t fence = 0;
    EXPECT_RET(lock_fence(a, ids_a[0], &fence), DLOCK_SUCCESS);
    CHECK(fence > 0);
    EXPECT_RET(unlock(a, ids_a[0], &st), DLOCK_SUCCESS);

    /* lock() waits on the server; free now, so granted at once. */
    EXPECT_RET(lock(b, &atomic_b, &held), DLOCK_SUCCESS);
    CHECK(held.st.client_id == b);
    EXPECT_RET(unlock(b, ids_b[0], &held), DLOCK_SUCCESS);

    /* Bad input is a code, as in the reference. */
    EXPECT_RET(trylock(b, &atomic_b, nullptr), DLOCK_EINVAL);
    EXPECT_RET(batch_trylock(b, 0, reqs, results), DLOCK_EINVAL);
    EXPECT_RET(batch_trylock(b, MAX_LOCK_BATCH_SIZE + 1, reqs, results), DLOCK_EINVAL);
    EXPECT_RET(get_client_debug_stats(b, nullptr), DLOCK_EINVAL);

    EXPECT_RET(batch_release_lock(a, 3, ids_a), DLOCK_SUCCESS);
    EXPECT_RET(batch_release_lock(b, 3, ids_b), DLOCK_SUCCESS);
    EXPECT_RET(client_deinit(a), DLOCK_SUCCESS);
    EXPECT_RET(client_deinit(b), DLOCK_SUCCESS);
    printf("batch and state checks done\n");
}

static int run_threads(void *(*fn)(void *))
{
    for (int i = 0; i < g_client_num; i++) {
        g_client_id[i] = BASE_CLIENT_ID + i;
        int ret = pthread_create(&g_client_tid[i], NULL, fn, &g_client_id[i]);
        if (ret != 0) {
            printf("error to create thread for client\n");
            return -1;
        }
    }
    for (int i = 0; i < g_client_num; i++) {
        pthread_join(g_client_tid[i], NULL);
    }
    return 0;
}

int main(int argc, char *argv[])
{
    printf("this is client\n");
    int ret;
    struct client_cfg s_client_cfg;
    int opt;

    while ((opt = getopt(argc, argv, "i:e:d:p:c:l:m:g:")) != -1) {
        switch (opt) {
            case 'i':
                g_server_ip = strdup(optarg);
                break;
            case 'e':
                g_eid_str = strdup(optarg);
                break;
            case 'd':
                g_dev_name = strdup(optarg);
                break;
            case 'p':
                g_server_port = atoi(optarg);
                break;
            case 'c':
                g_client_num = atoi(optarg);
                break;
            case 'l':
                g_loop_num = atoi(optarg);
                break;
            case 'm':
                g_tp_mode = (trans_mode_t)atoi(optarg);
                break;
            case 'g':
                g_loglevel = atoi(optarg);
                break;
            default:
                printf("Usage: %s [-i server_ip] [-e eid] [-d dev_name] [-p server_port] "
                       "[-c client_num] [-l loop_num] [-m transport_mode] [-g log_level]\n",
                       argv[0]);
                return -1;
        }
    }

    if (g_server_ip == nullptr) {
        printf("Error: Server IP must be provided\n");
        return -1;
    }
    if (g_eid_str == nullptr && g_dev_name == nullptr) {
        printf("Error: At least one of eid or dev_name must be provided\n");
        return -1;
    }
    if (g_server_port <= 0) {
        printf("Error: Server port is either not provided or provided with invalid value\n");
        return -1;
    }
    if (g_client_num <= 0 || g_client_num > CLIENT_NUM) {
        printf("Error: Invalid client number\n");
        return -1;
    }
    if (g_loglevel < 0 || g_loglevel > 7) {
        printf("Error: Invalid log level\n");
        return -1;
    }
    dlock_set_log_level(g_loglevel);

    memset(&s_client_cfg, 0xA5, sizeof(s_client_cfg));
    s_client_cfg.dev_name = g_dev_name;
    s_client_cfg.primary_port = g_server_port;
    s_client_cfg.log_level = g_loglevel;
    s_client_cfg.tp_mode = g_tp_mode;

    s_client_cfg.ssl.ssl_enable = false;
    s_client_cfg.ssl.ca_path = nullptr;
    s_client_cfg.ssl.crl_path = nullptr;
    s_client_cfg.ssl.cert_path = nullptr;
    s_client_cfg.ssl.prkey_path = nullptr;
    s_client_cfg.ssl.cert_verify_cb = nullptr;
    s_client_cfg.ssl.prkey_pwd_cb = nullptr;
    s_client_cfg.ssl.erase_prkey_cb = nullptr;

    if (g_eid_str != nullptr) {
        ret = str_to_urma_eid(g_eid_str, &s_client_cfg.eid);
        if (ret != 0) {
            printf("invalid eid: %s\n", g_eid_str);
            return -1;
        }
    } else {
        s_client_cfg.eid = {0};
    }

    ret = dclient_lib_init(&s_client_cfg);
    if (ret != 0) {
        printf("dlock client lib init failed! ret: %d\n", ret);
        return -1;
    }
    EXPECT_RET(dclient_lib_init(&s_client_cfg), -1); /* once per process */
    DLOCK_LOG_INFO("client library initialised, %d clients, %d loops", g_client_num, g_loop_num);

    if (run_threads(client_launch) != 0 || run_threads(client_heartbeat_test) != 0 ||
        run_threads(client_getlock_test) != 0) {
        return -1;
    }
    batch_and_states_test();

    dclient_lib_deinit();

    free(g_server_ip);
    free(g_eid_str);
    free(g_dev_name);
    return finish();
}
