/*
 * client_test_object.cpp: the reference's examples/client/client_test_object.cpp workload
 * (create, get, then snapshot/FAA/CAS in a loop, release, destroy) through the drop-in headers
 * only, against a running server, with the values checked: every thread works on an object of
 * its own (the reference's example gives all threads one name, so all but the first creator
 * stop at DLOCK_OBJECT_ALREADY_EXISTED) and adds to one shared counter, which must end at
 * clients x loops. A refused CAS is counted under the reference's DEBUG_STATS_OBJECT_CAS_FAILED.
 *
 *   client_test_object -i IP -p PORT (-d DEV | -e EID) [-c clients] [-l loops] [-m tp_mode]
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
#include "example_common.h"

using namespace dlock;

#define CLIENT_INIT(a, b) client_init(a, b)

#define BASE_CLIENT_ID 1
#define CLIENT_NUM 32
#define LOOP_NUM 10000

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

static char g_shared_name[] = "dlock_shared_counter";

void *client_launch(void *p_object)
{
    int client_id = *(int *)p_object;
    int object_id = 0;
    int shared_id = 0;
    struct umo_atomic64_desc desc;
    struct umo_atomic64_desc shared;
    int ret;
    char desc_str[256];
    uint64_t v = 1;

    snprintf(desc_str, sizeof(desc_str), "dlock_desc/%d", client_id);
    {
        std::unique_lock<std::mutex> locker(g_client_mgr_lock);
        ret = CLIENT_INIT(&client_id, g_server_ip);
    }
    if (ret != 0) {
        printf("client_init failed! ret: %d\n", ret);
        g_failures++;
        return 0;
    }

    desc.lease_time = 600000;
    desc.p_desc = desc_str;
    desc.len = strlen(desc_str);

    ret = umo_atomic64_create(client_id, &desc, v, &object_id);
    if (ret != 0) {
        printf("client create object failed: %d\n", ret);
        g_failures++;
        return NULL;
    }
    EXPECT_RET(umo_atomic64_create(client_id, &desc, v, &object_id),
               DLOCK_OBJECT_ALREADY_CREATED);

    ret = umo_atomic64_get(client_id, &desc, &object_id);
    if (ret != 0) {
        printf("client get object failed %d\n", ret);
        g_failures++;
        return NULL;
    }

    shared.lease_time = 600;
    shared.p_desc = g_shared_name;
    shared.len = strlen(g_shared_name);
    EXPECT_RET(umo_atomic64_get(client_id, &shared, &shared_id), DLOCK_SUCCESS);

    for (int k = 0; k < g_loop_num; k++) {
        uint64_t t = 1;
        ret = umo_atomic64_get_snapshot(client_id, object_id, &v);
        if (ret != 0) {
            printf("client get snapshot failed: %d\n", ret);
            g_failures++;
            break;
        }
        CHECK(v == 1);

        ret = umo_atomic64_faa(client_id, object_id, t, &v);
        if (ret != 0) {
            printf("client perform FAA failed: %d\n", ret);
            g_failures++;
            break;
        }
        CHECK(v == 1); /* the value before the add */

        ret = umo_atomic64_cas(client_id, object_id, v + t, v);
        if (ret != 0) {
            printf("client perform CAS failed: %d\n", ret);
            g_failures++;
            break;
        }

        uint64_t before = 0;
        EXPECT_RET(umo_atomic64_faa(client_id, shared_id, 1, &before), DLOCK_SUCCESS);
    }

    /* A CAS that misses; dlock's addition reports the value it found. */
    EXPECT_RET(umo_atomic64_cas(client_id, object_id, 999, 0), DLOCK_OBJECT_CAS_FAILED);
    uint64_t observed = 0;
    EXPECT_RET(umo_atomic64_cas_value(client_id, object_id, 999, 0, &observed),
               DLOCK_OBJECT_CAS_FAILED);
    CHECK(observed == 1);
    struct debug_stats stats;
    EXPECT_RET(get_client_debug_stats(client_id, &stats), DLOCK_SUCCESS);
    CHECK(stats.stats[DEBUG_STATS_OBJECT_CAS_FAILED] == 2);

    EXPECT_RET(umo_atomic64_release(client_id, shared_id), DLOCK_SUCCESS);
    ret = umo_atomic64_release(client_id, object_id);
    if (ret != 0) {
        printf("client release object failed: %d\n", ret);
        g_failures++;
        return NULL;
    }
    EXPECT_RET(umo_atomic64_get_snapshot(client_id, object_id, &v), DLOCK_OBJECT_NOT_GET);

    ret = umo_atomic64_destroy(client_id, object_id);
    if (ret != 0) {
        printf("client destroy object failed: %d\n", ret);
        g_failures++;
        return NULL;
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
    return NULL;
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
    if (g_server_ip == nullptr || (g_eid_str == nullptr && g_dev_name == nullptr) ||
        g_server_port <= 0 || g_client_num <= 0 || g_client_num > CLIENT_NUM) {
        printf("Error: invalid arguments\n");
        return -1;
    }

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
    if (g_eid_str != nullptr && str_to_urma_eid(g_eid_str, &s_client_cfg.eid) != 0) {
        printf("invalid eid: %s\n", g_eid_str);
        return -1;
    }

    ret = dclient_lib_init(&s_client_cfg);
    if (ret != 0) {
        printf("dlock client lib init failed! ret: %d\n", ret);
        return -1;
    }

    /* The shared counter, created (not got: creating is no reference) before the threads. */
    int owner;
    int counter_id = 0;
    struct umo_atomic64_desc counter = {g_shared_name, (uint32_t)strlen(g_shared_name), 600};
    EXPECT_RET(CLIENT_INIT(&owner, g_server_ip), DLOCK_SUCCESS);
    EXPECT_RET(umo_atomic64_create(owner, &counter, 0, &counter_id), DLOCK_SUCCESS);

    for (int i = 0; i < g_client_num; i++) {
        g_client_id[i] = BASE_CLIENT_ID + i;
        ret = pthread_create(&g_client_tid[i], NULL, client_launch, &g_client_id[i]);
        if (ret != 0) {
            printf("error to create thread for client\n");
            return -1;
        }
    }
    for (int i = 0; i < g_client_num; i++) {
        pthread_join(g_client_tid[i], NULL);
    }

    uint64_t total = 0;
    EXPECT_RET(umo_atomic64_get(owner, &counter, &counter_id), DLOCK_SUCCESS);
    EXPECT_RET(umo_atomic64_get_snapshot(owner, counter_id, &total), DLOCK_SUCCESS);
    CHECK(total == (uint64_t)g_client_num * (uint64_t)g_loop_num);
    printf("shared counter: %llu\n", (unsigned long long)total);
    EXPECT_RET(umo_atomic64_release(owner, counter_id), DLOCK_SUCCESS);
    EXPECT_RET(umo_atomic64_destroy(owner, counter_id), DLOCK_SUCCESS);
    EXPECT_RET(client_deinit(owner), DLOCK_SUCCESS);

    dclient_lib_deinit();

    free(g_server_ip);
    free(g_eid_str);
    free(g_dev_name);
    return finish();
}
