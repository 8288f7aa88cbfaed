/*
 * dlock_types.h: the reference's (UMDK DLock) public types, for C++ code written against its
 * API, served by dlock (libdlock_engine_glue.a / .so).
 *
 * One of four drop-in headers (dlock_types.h, dlock_client_api.h, dlock_server_api.h,
 * dlock_log.h) with the reference's names, installed where the reference installs its own
 * (<prefix>/include/ub/umdk/ulock/dlock/): a program written against the reference builds by
 * changing its include path and link line only. They are C++17; plain C uses dlock.h, whose
 * layouts differ, and a translation unit includes either dlock.h or these, never both.
 *
 * Everything sits in namespace dlock, inside extern "C" where the reference has it there. The
 * structs have the reference's layouts, fields and types, also where dlock ignores a field:
 *  - dev_name, eid, tp_mode, ub_token_disable (URMA settings): never read. dlock has no URMA;
 *    clients reach the server over TCP at the address given to client_init, the server
 *    listens on primary.server_ip_str:server_port.
 *  - log_level: accepted, ignored (dlock logs through the host's tracing subscriber).
 *  - lock_desc::lease_time: unused, as in the reference.
 *  - err_event, callback_func_t, replica_cfg, lock_context, thread_type, new_jetty_t,
 *    SLEEP_INTERVAL: declared by the reference, unused by it and by dlock.
 * Fields the reference's programs leave uninitialised (they are never read) are harmless; the
 * fields dlock has beyond the reference's come from server_cfg_ext / client_cfg_ext
 * (dlock_server_api.h, dlock_client_api.h) and are zero, the defaults, without them.
 *
 * Plaintext: without ssl.ssl_enable a dlock server listens on a loopback address only; on any
 * other address server_start returns DLOCK_EINVAL unless server_cfg_ext::insecure_plaintext
 * is set (anyone who reaches the port could register, and everything would cross the network
 * in clear). With it, TLS 1.3 with certificates on both ends (TLS_AES_256_GCM_SHA384), as the
 * reference's control channel. A plaintext client connects to whatever address it is given.
 *
 * Where dlock fills a reference struct, what goes where:
 *  - lock states (atomic_state, rw_state, fairlock_state, the union in lock_op_res): written
 *    in these layouts, sized by the lock's kind (8 bytes for atomic, 16 otherwise). time_out
 *    is NOT wall-clock epoch seconds as in the reference: it is the server's monotonic clock in
 *    seconds since the server started (rounded up, so a held lock never shows 0). Compare the
 *    values one server gave with each other, not with time(NULL).
 *  - debug_stats: the reference's 45 counters in its order (DEBUG_STATS_EAGAIN is 0 as in the
 *    reference, though 5 in dlock.h); dlock fills those it has a counterpart for and leaves
 *    the others 0 (the table is in README.md, "Port from the reference", and in
 *    engine-glue/src/ffi/compat/stats.rs).
 *
 * Where the reference's source is silent, these headers choose what a porting team would
 * expect and say so at the declaration.
 */

#ifndef _DLOCK_TYPES_H__
#define _DLOCK_TYPES_H__

#ifndef __cplusplus
#error "dlock_types.h is the reference's C++ API: include dlock.h from C"
#endif

#ifdef DLOCK_H
#error "dlock.h and the reference-compatible headers declare the same functions with different layouts: include one of them"
#endif

#include <cstdint>

/* Set before including dlock.h, which refuses to follow (see above). */
#define DLOCK_REFERENCE_HEADERS 1

namespace dlock {
extern "C" {

/* The reference's counter indices (struct debug_stats), in its order. */
typedef enum debug_stats_code {
    DEBUG_STATS_EAGAIN = 0,
    DEBUG_STATS_NO_URMA_BUF,
    DEBUG_STATS_ENOMEM,
    DEBUG_STATS_ETIMEOUT,
    DEBUG_STATS_EINVAL_LOCK_OP,
    DEBUG_STATS_EINVAL_LOCK_TYPE,
    DEBUG_STATS_EINVAL_LOCK_OFFSET,
    DEBUG_STATS_EINVAL_LOCK_RET,
    DEBUG_STATS_ETICKET,
    DEBUG_STATS_EASYNC,
    DEBUG_STATS_CLIENT_NOT_INIT,
    DEBUG_STATS_LOCK_NOT_GET,
    DEBUG_STATS_ALREADY_LOCKED,
    DEBUG_STATS_ALREADY_UNLOCKED,
    DEBUG_STATS_ATOMIC_TRYLOCK_FAIL,
    DEBUG_STATS_ATOMIC_UNLOCK_FAIL,
    DEBUG_STATS_ATOMIC_EXTEND_FAIL,
    DEBUG_STATS_RW_TRYLOCK_EX_FAIL,
    DEBUG_STATS_RW_UNLOCK_EX_FAIL,
    DEBUG_STATS_RW_TRYLOCK_SH_FAIL,
    DEBUG_STATS_RW_UNLOCK_SH_FAIL,
    DEBUG_STATS_FAIR_QUEUE_LIMIT,
    DEBUG_STATS_FAIR_UNLOCK_EX_FAIL,
    DEBUG_STATS_FAIR_UNLOCK_SH_FAIL,
    DEBUG_STATS_FAIR_EX_TICKET_PASSED,
    DEBUG_STATS_FAIR_SH_TICKET_PASSED,
    DEBUG_STATS_INVALID_LOCK_STATE,
    DEBUG_STATS_TICKET_TO_UNLOCK,
    DEBUG_STATS_NETWORK_FAIL,
    DEBUG_STATS_SEND_FAIL,
    DEBUG_STATS_BAD_RESPONSE,
    DEBUG_STATS_CLIENT_DISCONNECT,
    DEBUG_STATS_FAIL,
    DEBUG_STATS_CLIENTMGR_NOT_INIT,
    DEBUG_STATS_NOT_READY,
    DEBUG_STATS_NO_ASYNC,
    DEBUG_STATS_ASYNC_AGAIN,
    DEBUG_STATS_REPLICA_INIT_FAIL,
    DEBUG_STATS_SERVER_NOT_INIT,
    DEBUG_STATS_ENCRYPT_FAIL,
    DEBUG_STATS_DECRYPT_FAIL,
    DEBUG_STATS_CLIENT_ID_VERIFY_FAIL,
    DEBUG_STATS_BAD_REQUEST,
    DEBUG_STATS_OBJECT_NOT_GET,
    DEBUG_STATS_OBJECT_CAS_FAILED,
    DEBUG_STATS_MAX
} debug_stats_code_t;

struct debug_stats {
    uint64_t stats[DEBUG_STATS_MAX];
};

enum lock_ops {
    LOCK_EXCLUSIVE = 0,
    LOCK_SHARED,
    UNLOCK,
    EXTEND_LOCK_EXCLUSIVE,
    EXTEND_LOCK_SHARED,
    LOCK_OPS_MAX
};

enum dlock_type { DLOCK_ATOMIC = 0, DLOCK_RW, DLOCK_FAIR, DLOCK_MAX };

/* Declared by the reference, used by neither it nor dlock. */
struct err_event {
    uint8_t err_type;
};

constexpr unsigned int MAX_LOCK_DESC_LEN = 512;
constexpr unsigned int MAX_UMO_ATOMIC64_DESC_LEN = MAX_LOCK_DESC_LEN;
constexpr unsigned int MAX_LOCK_BATCH_SIZE = 31;
/* The reference's lock() polling interval in microseconds; dlock's lock() waits on the
   server without polling, so nothing uses it. */
constexpr int SLEEP_INTERVAL = 100000;

/* The reference sizes endpoint ids from URMA; dlock has none, and its layouts expect 16. */
#if defined(URMA_EID_SIZE) && URMA_EID_SIZE != 16
#error "dlock's reference-compatible layouts need a 16-byte dlock_eid_t"
#endif
#define DLOCK_EID_SIZE (16)

/* A lock to create or open by name (1..512 bytes, compared byte for byte). */
struct lock_desc {
    char *p_desc;
    unsigned int len;
    unsigned int lock_type;  /* enum dlock_type */
    unsigned int lease_time; /* unused, as in the reference */
};

struct lock_request {
    int lock_id;
    int lock_op;              /* enum lock_ops */
    unsigned int expire_time; /* lease in seconds from now; 0 on trylock reads the cache */
};

/* Declared by the reference, used by neither it nor dlock. */
typedef int (*callback_func_t)(const struct err_event *);

/* Lock states: see the header comment for time_out. */
typedef struct {
    int client_id; /* holder, 0 when free */
    uint32_t time_out;
} atomic_state;

typedef struct {
    uint32_t time_out; /* when the current hold began; 0 when free */
    int32_t client_id; /* exclusive holder; 0 when free or shared */
    uint32_t rcount;   /* shared holders */
    uint32_t rsvd;
} rw_state;

typedef struct {
    uint16_t n_exclusive;
    uint16_t n_shared;
    uint16_t m_exclusive;
    uint16_t m_shared;
    uint32_t time_out;
    union {
        uint32_t t_value;
        struct {
            uint16_t rms;
            uint16_t rflag : 1;
            uint16_t rsvd : 9;
            uint16_t rcnt : 6;
        } bs;
    };
} fairlock_state;

typedef union {
    atomic_state atomic;
    rw_state rw;
    fairlock_state fl;
    uint64_t base;
} lock_state;

/* One batch entry's result. dlock's fencing token has no place here: lock_fence reads it. */
struct lock_op_res {
    union {
        atomic_state atomic;
        rw_state rw;
        fairlock_state fl;
    };
    int op_ret;
};

/* Declared by the reference, used by neither it nor dlock. */
struct lock_context {
    unsigned int lock_type;
    int32_t lock_id;
    uint32_t lease_time;
    unsigned int ref_count;
    lock_state ls;
};

enum server_type {
    SERVER_PRIMARY,
    SERVER_REPLICA, /* refused by server_start, as by the reference */
    SERVER_MAX
};

/* Declared by the reference, unused. */
enum thread_type {
    CTRL_THREAD,
    CMD_THREAD
};

/*
 * TLS callbacks, the reference's shapes.
 *  - cert_verify_cb must be NULL: dlock checks the peer's chain against ca_path and crl_path
 *    itself and has no OpenSSL context to pass (server_start / dclient_lib_init return
 *    DLOCK_EINVAL otherwise, rather than skip checks the callback would have made).
 *  - prkey_pwd_cb stores a pointer to the key password and its length (the password is those
 *    bytes: no NUL needed, up to 1,024); dlock copies it out and then calls
 *    erase_prkey_cb(pointer, length) at once. A server asks once, in server_start, on the
 *    calling thread; the client library once per server address, at its first client_init
 *    (the reference: at every connection). Both may be NULL for an unencrypted key (the
 *    reference requires them).
 */
typedef int (*tls_cert_verify_callback_func_t)(void *ctx, const char *crl_path);
typedef void (*tls_prkey_pwd_callback_func_t)(char **prkey_pwd, int *prkey_pwd_len);
typedef void (*tls_erase_prkey_callback_func_t)(void *prkey_pwd, int prkey_pwd_len);

/* TLS 1.3 on every TCP connection; paths are PEM files, made absolute when handed in. */
struct ssl_cfg {
    bool ssl_enable; /* false: plaintext, every other field ignored */
    char *ca_path;   /* required: the CA bundle the peer's certificate must chain to */
    char *crl_path;  /* optional: CRLs checked on the peer's chain */
    char *cert_path; /* required: this end's certificate chain, leaf first */
    char *prkey_path; /* required: this end's key (PKCS#8, encrypted PKCS#8, PKCS#1, SEC1) */
    tls_cert_verify_callback_func_t cert_verify_cb;
    tls_prkey_pwd_callback_func_t prkey_pwd_cb;
    tls_erase_prkey_callback_func_t erase_prkey_cb;
};

/* URMA connection mode: ignored (dlock has no URMA). */
typedef enum trans_mode {
    SEPERATE_CONN,
    UNI_CONN
} trans_mode_t;

/* Declared by the reference, unused. */
typedef enum new_jetty_type {
    CLIENT,
    CLIENT_PRIMARY,
    REPLICA_PRIMARY
} new_jetty_t;

/* URMA endpoint id: ignored. */
typedef union dlock_eid {
    uint8_t raw[DLOCK_EID_SIZE];
    struct {
        uint64_t reserved;
        uint32_t prefix;
        uint32_t addr;
    } in4;
    struct {
        uint64_t subnet_prefix;
        uint64_t interface_id;
    } in6;
} dlock_eid_t;

struct client_cfg {
    char *dev_name;   /* ignored */
    dlock_eid_t eid;  /* ignored */
    int log_level;    /* ignored */
    int primary_port; /* TCP port for client_init("ip"): <= 0 is 21616, else 1024..65535 */
    struct ssl_cfg ssl;
    trans_mode_t tp_mode;  /* ignored */
    bool ub_token_disable; /* ignored */
};

struct primary_cfg {
    unsigned int num_of_replica;      /* must be 0 */
    unsigned int recovery_client_num; /* clients expected to re-sync after a failover */
    char *ctrl_cpuset;                /* NULL/"" or a CPU list: the control thread on its first */
    char *cmd_cpuset;                 /* the same for the data (command) thread */
    char *server_ip_str;              /* the TCP listener's address, IPv4 or IPv6 (NULL: none,
                                         clients in this process only) */
    int server_port;                  /* 0: 21616; < 0 (dlock): any free port, see
                                         server_tcp_port */
    int replica_port;                 /* ignored */
    bool replica_enable;              /* must be false */
};

/* Declared by the reference; replicas are refused by both. */
struct replica_cfg {
    char *primary_ip_str;
    int primary_port;
};

struct server_cfg {
    enum server_type type; /* SERVER_PRIMARY */
    char *dev_name;        /* ignored */
    dlock_eid_t eid;       /* ignored */
    int log_level;         /* ignored */
    bool sleep_mode_enable; /* park the idle data thread at once; false: spin, yield, park */
    union {
        struct primary_cfg primary;
        struct replica_cfg replica;
    };
    struct ssl_cfg ssl;
    trans_mode_t tp_mode;  /* ignored */
    bool ub_token_disable; /* ignored */
};

struct umo_atomic64_desc {
    char *p_desc;        /* 1..512 bytes */
    uint32_t len;
    uint32_t lease_time; /* seconds, > 0 */
};

typedef enum dlock_status {
    DLOCK_SUCCESS = 0,
    DLOCK_DONE,
    DLOCK_EAGAIN = 0x1000,
    DLOCK_ENOMEM,
    DLOCK_ETIMEOUT,
    DLOCK_EINVAL,
    DLOCK_ETICKET,
    DLOCK_EASYNC,
    DLOCK_CLIENT_NOT_INIT = 0x2000,
    DLOCK_LOCK_NOT_GET,
    DLOCK_ALREADY_LOCKED,
    DLOCK_ALREADY_UNLOCKED,
    DLOCK_TICKET_TO_UNLOCK,
    DLOCK_BAD_RESPONSE,
    DLOCK_FAIL,
    DLOCK_CLIENTMGR_NOT_INIT,
    DLOCK_NOT_READY,
    DLOCK_NO_ASYNC,
    DLOCK_ASYNC_AGAIN,
    DLOCK_REPLICA_INIT_FAIL,
    DLOCK_SERVER_NOT_INIT,
    DLOCK_CLIENT_REMOVED_BY_SERVER,
    DLOCK_PROTO_VERSION_NEGOTIATION_FAIL,
    DLOCK_SERVER_NO_RESOURCE,
    DLOCK_PARTITION_MOVED = 0x2010, /* dlock's: not the partition's owner at that epoch */
    DLOCK_LOCK_RETAINED = 0x2011, /* dlock's: held by a dead client until recovery_done */
    DLOCK_OBJECT_ALREADY_EXISTED = 0x3000,
    DLOCK_OBJECT_ALREADY_CREATED,
    DLOCK_OBJECT_NOT_CREATE,
    DLOCK_OBJECT_INVALID_OWNER,
    DLOCK_OBJECT_NOT_GET,
    DLOCK_OBJECT_ALREADY_DESTROYED,
    DLOCK_OBJECT_TOO_MANY,
    DLOCK_OBJECT_CAS_FAILED
} dlock_status_t;

} /* extern "C" */

/* The layouts dlock's library reads and writes (engine-glue/src/ffi/compat/types.rs). */
static_assert(DEBUG_STATS_MAX == 45, "the reference's 45 counters");
static_assert(sizeof(debug_stats) == 45 * 8, "struct debug_stats");
static_assert(sizeof(atomic_state) == 8, "atomic_state");
static_assert(sizeof(rw_state) == 16 && sizeof(fairlock_state) == 16, "lock states");
static_assert(sizeof(lock_state) == 16 && sizeof(lock_op_res) == 20, "lock_state, lock_op_res");
static_assert(sizeof(dlock_eid_t) == 16, "dlock_eid_t");
static_assert(sizeof(lock_request) == 12, "lock_request");
#if defined(__LP64__)
static_assert(sizeof(ssl_cfg) == 64, "ssl_cfg");
static_assert(sizeof(client_cfg) == 104, "client_cfg");
static_assert(sizeof(server_cfg) == 160, "server_cfg");
#endif

} /* namespace dlock */

#endif /* _DLOCK_TYPES_H__ */
