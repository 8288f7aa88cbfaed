/*
 * dlock_server_api.h: the reference's (UMDK DLock) server API, in C++, served by dlock: its
 * servers run in this process, as the reference's do. See dlock_types.h for what these headers
 * are and how the reference's types map to dlock.
 *
 * dserver_lib_init, dserver_lib_deinit, server_stop and clear_server_debug_stats are dlock.h's
 * functions, declared extern "C" as the reference declares them. server_start (C++
 * references, the reference's server_cfg) and get_server_debug_stats (its 45 counters) are
 * inline C++ functions that convert and call dlock's dlock_compat_* entry points.
 *
 * Additions (not in the reference): server_cfg_ext and the server_start overload that takes
 * it, server_tcp_port.
 */

#ifndef __DLOCK_SERVER_API_H__
#define __DLOCK_SERVER_API_H__

#include "dlock_types.h"

namespace dlock {
extern "C" {

/* 1..32 servers at once. 0, or -1 when already initialised or out of range. */
int dserver_lib_init(unsigned int max_server_num);

/* Stops every server. */
void dserver_lib_deinit();

/* 0, or -1 for an unknown id. */
int server_stop(int server_id);

int clear_server_debug_stats(int server_id);

/* dlock addition: the TCP port server_id listens on (after asking for any free port with
   primary.server_port < 0). 0; -1 (unknown id, no TCP listener); DLOCK_EINVAL (NULL). */
int server_tcp_port(int server_id, int *port);

} /* extern "C" */

/*
 * dlock addition: what dlock.h's server_cfg has beyond the reference's; 0 in any field is the
 * default. The reference's struct cannot carry these: reference code leaves fields it does not
 * know uninitialised.
 */
struct server_cfg_ext {
    unsigned int locks_max;           /* lock slots (default 51200) */
    unsigned int clients_max;         /* registered clients (default 1000) */
    unsigned int objects_max;         /* umo_atomic64 objects (default 102400) */
    unsigned int client_lease_ms;     /* a silent client is dead after this (default 5000) */
    unsigned int client_lease_max_ms; /* longest lease granted (default 30000) */
    unsigned int epoch;               /* 1..65535 (default 1); a replacement server needs a
                                         larger one */
    bool insecure_plaintext;          /* without TLS: allow a non-loopback server_ip_str */
    bool insecure_recovery;           /* recover (recovery_client_num > 0) without a key */
    const char *session_key_file;     /* NULL, or the failed server's session key (64 hex
                                         digits); a recovering server needs it unless
                                         insecure_recovery */
    bool recoverer_local;             /* local clients may call recovery_done */
};

/* dlock's entry points behind the inline functions below (engine-glue/src/ffi/compat/). */
namespace compat_abi {
extern "C" {
int dlock_compat_server_start(const struct server_cfg *cfg, const struct server_cfg_ext *ext,
                              int *server_id);
int dlock_compat_get_server_debug_stats(int server_id, struct debug_stats *stats);
} /* extern "C" */
} /* namespace compat_abi */

/*
 * Starts a primary server in this process and writes its id (1..0xFFFFF). The URMA fields are
 * never read; the server listens on TCP at primary.server_ip_str:server_port, and without TLS
 * only on a loopback address (see dlock_types.h). 0; DLOCK_EINVAL (settings out of range,
 * SERVER_REPLICA, TLS files or key password unusable, a cert_verify_cb, plaintext on a
 * non-loopback address); -1 (not initialised, address cannot be bound);
 * DLOCK_SERVER_NO_RESOURCE.
 */
inline int server_start(const struct server_cfg &cfg, int &server_id)
{
    return compat_abi::dlock_compat_server_start(&cfg, nullptr, &server_id);
}

/* dlock addition: the same with dlock's own server settings. */
inline int server_start(const struct server_cfg &cfg, int &server_id,
                        const struct server_cfg_ext &ext)
{
    return compat_abi::dlock_compat_server_start(&cfg, &ext, &server_id);
}

/* The reference's 45 counters; those dlock has no counterpart for stay 0. 0; -1 (unknown id);
   DLOCK_EINVAL (NULL). */
inline int get_server_debug_stats(int server_id, struct debug_stats *stats)
{
    return compat_abi::dlock_compat_get_server_debug_stats(server_id, stats);
}

} /* namespace dlock */

#endif /* __DLOCK_SERVER_API_H__ */
