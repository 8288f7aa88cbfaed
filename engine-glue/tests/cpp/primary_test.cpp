/*
 * primary_test.cpp: a dlock server started the way the reference's
 * examples/server/primary_test.cpp starts its primary, through the drop-in headers only.
 *
 *   primary_test -i IP -p PORT (-d DEV | -e EID) [-c recovery_clients] [-m tp_mode] [-g level]
 *
 * What differs from the reference's example, for a test harness:
 *  - it serves until its standard input closes (the reference's sleeps 6000 s);
 *  - -p -1 asks for any free port (dlock: server_port < 0), and the port is printed
 *    (server_tcp_port, a dlock addition);
 *  - at the end it prints the server's counters in the reference's layout ("stat INDEX VALUE"
 *    for all 45), clears them and checks that they then read 0.
 * The config struct is filled with garbage first, standing for what reference code leaves
 * uninitialised (sleep_mode_enable, ub_token_disable): dlock must not depend on it.
 */

#include <cstddef>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <stdlib.h>
#include <syslog.h>

#include "dlock_server_api.h"
#include "example_common.h"

using namespace dlock;

static char *g_dev_name = nullptr;
static char *g_eid_str = nullptr;
static char *g_server_ip = nullptr;
static uint32_t g_recovery_client_num = 0;
static int g_server_port = 0;
static int g_loglevel = LOG_WARNING;
static trans_mode_t g_tp_mode = SEPERATE_CONN;

/* Serves until the harness closes standard input. */
static void serve_until_stdin_closes(void)
{
    char buf[64];
    while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
    }
}

/* Prints the counters, clears them, and checks that they read 0 afterwards. */
static void report_stats(int server_id)
{
    struct debug_stats stats;
    memset(&stats, 0xFF, sizeof(stats));
    EXPECT_RET(get_server_debug_stats(server_id, &stats), DLOCK_SUCCESS);
    for (int i = 0; i < DEBUG_STATS_MAX; i++) {
        printf("stat %d %llu\n", i, (unsigned long long)stats.stats[i]);
    }
    EXPECT_RET(clear_server_debug_stats(server_id), DLOCK_SUCCESS);
    EXPECT_RET(get_server_debug_stats(server_id, &stats), DLOCK_SUCCESS);
    for (int i = 0; i < DEBUG_STATS_MAX; i++) {
        CHECK(stats.stats[i] == 0);
    }
    EXPECT_RET(get_server_debug_stats(server_id, nullptr), DLOCK_EINVAL);
    EXPECT_RET(get_server_debug_stats(server_id + 1, &stats), -1);
}

int main(int argc, char *argv[])
{
    printf("this is primary\n");
    int opt;

    while ((opt = getopt(argc, argv, "c:i:e:d:p:m:g:")) != -1) {
        switch (opt) {
            case 'c':
                g_recovery_client_num = atoi(optarg);
                break;
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
            case 'm':
                g_tp_mode = (trans_mode_t)atoi(optarg);
                break;
            case 'g':
                g_loglevel = atoi(optarg);
                break;
            default:
                printf("Usage: %s [-c recovery_client_num] [-i server_ip] [-e eid] [-d dev_name] "
                       "[-p server_port] [-m transport_mode] [-g log_level]\n", argv[0]);
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
    if (g_server_port == 0) {
        printf("Error: Server port is either not provided or provided with invalid value\n");
        return -1;
    }

    int ret;
    unsigned int max_server_num = 10;
    int server_id;
    struct server_cfg cfg;
    memset(&cfg, 0xA5, sizeof(cfg));
    cfg.type = SERVER_PRIMARY;
    cfg.dev_name = g_dev_name;
    cfg.primary.num_of_replica = 0;
    cfg.primary.recovery_client_num = g_recovery_client_num;
    cfg.primary.ctrl_cpuset = nullptr;
    cfg.primary.cmd_cpuset = nullptr;
    cfg.primary.server_ip_str = g_server_ip;
    cfg.primary.server_port = g_server_port;
    cfg.primary.replica_port = 0;
    cfg.primary.replica_enable = false;
    cfg.log_level = g_loglevel;
    cfg.tp_mode = g_tp_mode;

    cfg.ssl.ssl_enable = false;
    cfg.ssl.ca_path = nullptr;
    cfg.ssl.crl_path = nullptr;
    cfg.ssl.cert_path = nullptr;
    cfg.ssl.prkey_path = nullptr;
    cfg.ssl.cert_verify_cb = nullptr;
    cfg.ssl.prkey_pwd_cb = nullptr;
    cfg.ssl.erase_prkey_cb = nullptr;

    if (g_eid_str != nullptr) {
        ret = str_to_urma_eid(g_eid_str, &cfg.eid);
        if (ret != 0) {
            printf("invalid eid: %s\n", g_eid_str);
            return -1;
        }
    } else {
        cfg.eid = {0};
    }

    ret = dserver_lib_init(max_server_num);
    if (ret != 0) {
        printf("dlock server lib init failed! ret: %d\n", ret);
        return -1;
    }

    /* The reference refuses replicas; so does dlock, before reading the union. */
    cfg.type = SERVER_REPLICA;
    EXPECT_RET(server_start(cfg, server_id), DLOCK_EINVAL);
    cfg.type = SERVER_PRIMARY;

    ret = server_start(cfg, server_id);
    if (ret != 0) {
        printf("server start failed! ret: %d\n", ret);
        dserver_lib_deinit();
        return -1;
    }
    int port = 0;
    EXPECT_RET(server_tcp_port(server_id, &port), DLOCK_SUCCESS);
    printf("server start successfully! server_id: %d, server_type: %d, recovery_client_num: %d, "
           "port: %d\n", server_id, cfg.type, cfg.primary.recovery_client_num, port);
    fflush(stdout);

    serve_until_stdin_closes();
    report_stats(server_id);

    ret = server_stop(server_id);
    if (ret != 0) {
        printf("server stop failed! ret: %d, server_id: %d\n", ret, server_id);
        return -1;
    }
    printf("server stop successfully! server_id: %d\n", server_id);
    EXPECT_RET(server_stop(server_id), -1);

    dserver_lib_deinit();

    free(g_server_ip);
    free(g_eid_str);
    free(g_dev_name);
    return finish();
}
