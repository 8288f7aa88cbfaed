/*
 * dlock.h: the C ABI of dlock (libdlock_engine_glue.a / libdlock_engine_glue.so).
 *
 * Function names, parameter meanings and status values follow the reference's (UMDK DLock)
 * dlock_server_api.h and dlock_client_api.h, in plain C11: no namespace, no references.
 * Link with: -ldlock_engine_glue -lpthread -ldl -lm -lrt -lutil -lgcc_s
 *
 * This file is written by hand and checked by engine-glue/tests/c_abi.rs: every prototype
 * against the Rust definition (name, parameter and return types), every status value against
 * the Rust Status codes, every counter index and constant against the Rust side, and every
 * struct's size and field offsets as the C compiler lays them out against the Rust layout.
 *
 * Every deliberate difference from the reference is in one table, "Differences from the
 * reference" in the README; the declarations below say what each call does here.
 *
 * Return values: 0 (DLOCK_SUCCESS), a dlock_status code, or -1 exactly where the reference's
 * call of the same name returns -1, unless a row of the README's table says otherwise (a
 * refused TLS handshake is DLOCK_NOT_READY, for one). In particular, before dclient_lib_init and for a client id
 * that is unknown (never registered, or deinitialised) the control-plane calls (client_init,
 * client_reinit, client_reinit_done, client_deinit, client_heartbeat, get_lock, release_lock,
 * batch_get_lock, batch_release_lock, update_all_locks) return -1, except where a declaration
 * names the code the reference returns instead; the lock, object and counter calls return
 * DLOCK_CLIENTMGR_NOT_INIT and DLOCK_CLIENT_NOT_INIT. NULL or invalid pointers, bad lengths
 * and unknown ids are refused, never undefined behaviour; a panic inside the library is
 * returned as DLOCK_EINVAL.
 */

#ifndef DLOCK_H
#define DLOCK_H

/* The reference-compatible C++ headers (include/ub/umdk/ulock/dlock/) declare these functions
   with the reference's layouts in namespace dlock: a translation unit includes one or the other. */
#ifdef DLOCK_REFERENCE_HEADERS
#error "dlock.h and the reference-compatible headers (dlock_types.h, ...) cannot be used together"
#endif

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Constants                                                                                 */

#define MAX_LOCK_DESC_LEN 512           /* lock names: 1..512 bytes, compared byte for byte */
#define MAX_UMO_ATOMIC64_DESC_LEN 512   /* object names: 1..512 bytes */
#define MAX_LOCK_BATCH_SIZE 31          /* entries in one batch call */
#define MAX_NUM_SERVER 32               /* servers one process may run at once */
#define DLOCK_DEFAULT_PORT 21616        /* TCP port when none is given */
#define DLOCK_SERVER_ID_MAX 0xFFFFF     /* server ids run 1..DLOCK_SERVER_ID_MAX */
#define DLOCK_HEARTBEAT_TIMEOUT_MAX_S 300
#define DLOCK_KEY_PASSWORD_LEN_MAX 1024 /* bytes of the buffer prkey_pwd_cb fills */
#define DLOCK_VALUE_BLOCK_LEN 32        /* bytes of a lock value block (dlock's) */
#define DLOCK_REVOKE_ALL 0              /* dlock_revoke.lock_id: every cached lock (dlock's) */

typedef enum dlock_status {
    DLOCK_SUCCESS = 0,
    DLOCK_DONE = 1,
    DLOCK_EAGAIN = 0x1000,          /* fair lock queued (ticket kept): call again */
    DLOCK_ENOMEM = 0x1001,
    DLOCK_ETIMEOUT = 0x1002,        /* a wait ran out (lock, lock_result_check) */
    DLOCK_EINVAL = 0x1003,          /* bad argument, or not valid in the current state */
    DLOCK_ETICKET = 0x1004,         /* fair lock: other mode than the ticket held */
    DLOCK_EASYNC = 0x1005,          /* an async operation is outstanding on this client */
    DLOCK_CLIENT_NOT_INIT = 0x2000,
    DLOCK_LOCK_NOT_GET = 0x2001,
    DLOCK_ALREADY_LOCKED = 0x2002,  /* re-entry granted / unlock only counted down */
    DLOCK_ALREADY_UNLOCKED = 0x2003,
    DLOCK_TICKET_TO_UNLOCK = 0x2004,
    DLOCK_BAD_RESPONSE = 0x2005,    /* network error or timeout: client_reinit */
    DLOCK_FAIL = 0x2006,            /* the server refused (held, lost, queue full) */
    DLOCK_CLIENTMGR_NOT_INIT = 0x2007,
    DLOCK_NOT_READY = 0x2008,
    DLOCK_NO_ASYNC = 0x2009,
    DLOCK_ASYNC_AGAIN = 0x200A,
    DLOCK_REPLICA_INIT_FAIL = 0x200B,
    DLOCK_SERVER_NOT_INIT = 0x200C,
    DLOCK_CLIENT_REMOVED_BY_SERVER = 0x200D,
    DLOCK_PROTO_VERSION_NEGOTIATION_FAIL = 0x200E,
    DLOCK_SERVER_NO_RESOURCE = 0x200F,
    DLOCK_PARTITION_MOVED = 0x2010, /* cluster: not the partition's owner at that epoch (dlock's) */
    DLOCK_LOCK_RETAINED = 0x2011,   /* held by a dead client until recovery_done (dlock's) */
    DLOCK_OBJECT_ALREADY_EXISTED = 0x3000,
    DLOCK_OBJECT_ALREADY_CREATED = 0x3001,
    DLOCK_OBJECT_NOT_CREATE = 0x3002,
    DLOCK_OBJECT_INVALID_OWNER = 0x3003,
    DLOCK_OBJECT_NOT_GET = 0x3004,
    DLOCK_OBJECT_ALREADY_DESTROYED = 0x3005,
    DLOCK_OBJECT_TOO_MANY = 0x3006,
    DLOCK_OBJECT_CAS_FAILED = 0x3007
} dlock_status_t;

enum dlock_type { DLOCK_ATOMIC = 0, DLOCK_RW = 1, DLOCK_FAIR = 2, DLOCK_MAX = 3 };

enum lock_ops {
    LOCK_EXCLUSIVE = 0,
    LOCK_SHARED = 1,
    UNLOCK = 2,
    EXTEND_LOCK_EXCLUSIVE = 3,
    EXTEND_LOCK_SHARED = 4,
    LOCK_OPS_MAX = 5
};

enum server_type { SERVER_PRIMARY = 0, SERVER_REPLICA = 1, SERVER_MAX = 2 };

/* Counter indices of struct debug_stats (dlock's counters, not the reference's 45). */
typedef enum debug_stats_code {
    DEBUG_STATS_CONTROL_REQUESTS = 0,    /* control requests handled */
    DEBUG_STATS_DATA_MESSAGES = 1,       /* data messages handled */
    DEBUG_STATS_DATA_COMMANDS = 2,       /* data commands executed */
    DEBUG_STATS_GRANTS = 3,              /* grants issued */
    DEBUG_STATS_PREEMPTIONS = 4,         /* grants that displaced an expired holder */
    DEBUG_STATS_EAGAIN = 5,
    DEBUG_STATS_EINVAL = 6,
    DEBUG_STATS_CLIENT_NOT_INIT = 7,
    DEBUG_STATS_LOCK_NOT_GET = 8,
    DEBUG_STATS_FAIL = 9,
    DEBUG_STATS_NOT_READY = 10,
    DEBUG_STATS_NO_RESOURCE = 11,
    DEBUG_STATS_OBJECT_NOT_GET = 12,
    DEBUG_STATS_OBJECT_CAS_FAILED = 13,
    DEBUG_STATS_CLIENTS_REGISTERED = 14,
    DEBUG_STATS_CLIENTS_EXPIRED = 15,    /* declared dead after their lease ran out */
    DEBUG_STATS_CLIENTS_EVICTED = 16,
    DEBUG_STATS_CLIENTS_DEINIT = 17,
    DEBUG_STATS_WAITS = 18,              /* blocking lock requests parked on the server */
    DEBUG_STATS_WAIT_TIMEOUTS = 19,
    DEBUG_STATS_SESSIONS_REFUSED = 20,   /* reinits and attaches with a wrong session secret */
    DEBUG_STATS_LEASES_CAPPED = 21,      /* registrations granted the maximum lease, not theirs */
    DEBUG_STATS_CONNECTIONS_TIMED_OUT = 22, /* a frame or handshake did not complete in time */
    DEBUG_STATS_CONNECTIONS_EVICTED = 23,   /* unregistered, closed to make room at the cap */
    DEBUG_STATS_CONNECTIONS_REFUSED = 24,   /* at the cap with nothing to evict, or out of fds */
    DEBUG_STATS_CONNECTIONS_OF_GONE_CLIENTS = 25, /* their client expired or deinitialised: then closed */
    DEBUG_STATS_TLS_NO_CLIENT_CERT = 26,
    DEBUG_STATS_TLS_UNKNOWN_CA = 27,
    DEBUG_STATS_TLS_EXPIRED = 28,
    DEBUG_STATS_TLS_REVOKED = 29,
    DEBUG_STATS_TLS_BAD_CERTIFICATE = 30,
    DEBUG_STATS_TLS_PROTOCOL_VERSION = 31,
    DEBUG_STATS_TLS_NO_COMMON_CIPHER = 32,
    DEBUG_STATS_TLS_NOT_TLS = 33,
    DEBUG_STATS_TLS_OTHER = 34,
    DEBUG_STATS_RECOVERY_EXPECTED = 35,
    DEBUG_STATS_RECOVERY_REREGISTERED = 36,
    DEBUG_STATS_RECOVERY_DONE = 37,
    DEBUG_STATS_RECOVERY_LOCKS_RESTORED = 38,
    DEBUG_STATS_RECOVERY_CLIENTS_GIVEN_UP = 39,
    DEBUG_STATS_CLIENTS_REFUSED_PEER_CAP = 40, /* registrations past clients_per_peer_max */
    DEBUG_STATS_TLS_NOT_YET_VALID = 41,        /* client certificate not valid yet */
    DEBUG_STATS_TLS_HANDSHAKES_DEFERRED = 42,  /* handshake steps put off to a later turn */
    DEBUG_STATS_PARTITION_MOVED = 43,          /* cluster: answered DLOCK_PARTITION_MOVED */
    DEBUG_STATS_FENCED = 44,                   /* cluster: of those, while fenced */
    DEBUG_STATS_PARTITIONS_OWNED = 45,         /* cluster: partitions owned now (gauge) */
    DEBUG_STATS_PARTITIONS_RECOVERING = 46,    /* cluster: owned and recovering now (gauge) */
    DEBUG_STATS_TOKEN_RENEWALS = 47,           /* cluster: epoch renewals asked for */
    DEBUG_STATS_COUNTER_RESERVATIONS = 48,     /* cluster: high-water marks reserved */
    DEBUG_STATS_LOCKS_RETAINED = 49,           /* grants kept when their holder died */
    DEBUG_STATS_RETAINED_RELEASED = 50,        /* retained grants released by recovery_done */
    DEBUG_STATS_RECOVERY_DONE_REFUSED = 51,    /* recovery_done without the recoverer role */
    DEBUG_STATS_LOCK_RETAINED = 52,            /* requests answered DLOCK_LOCK_RETAINED */
    DEBUG_STATS_CLIENTS_ACTIVE = 53,           /* clients registered now (gauge) */
    DEBUG_STATS_LOCKS_IN_USE = 54,             /* lock slots in use now (gauge) */
    DEBUG_STATS_MAP_VERSION = 55,              /* cluster: the map version applied (gauge) */
    DEBUG_STATS_ETCD_UNREACHABLE_MS = 56,      /* cluster: ms since etcd stopped answering, 0 if it answers */
    DEBUG_STATS_KEEPALIVE_AGE_MS = 57,         /* cluster: ms since the last confirmed keepalive (UINT64_MAX: none) */
    DEBUG_STATS_COORDINATOR = 58,              /* cluster: 1 while the elected coordinator */
    DEBUG_STATS_DRAINING = 59,                 /* cluster: 1 once asked to drain */
    DEBUG_STATS_REVOKES_SENT = 60,             /* revokes sent to cached holders */
    DEBUG_STATS_REVOKES_GIVEN_BACK = 61,       /* revoked grants given back with an unlock */
    DEBUG_STATS_DOWNGRADES = 62,               /* exclusive grants turned shared */
    DEBUG_STATS_REVOKES_LAPSED = 63,           /* revoked grants released at the revoke timeout */
    DEBUG_STATS_RECLAIM_AWAITED = 64,          /* cluster: ReclaimDones awaited, summed over recovering partitions (gauge) */
    DEBUG_STATS_RECLAIM_AWAITED_MAX = 65,      /* cluster: the most one recovering partition awaits (gauge) */
    DEBUG_STATS_RECLAIM_UNTRACKED = 66,        /* cluster: recovering partitions that wait for their grace end (gauge) */
    DEBUG_STATS_RECLAIM_DONE_MESSAGES = 67,    /* cluster: ReclaimDone and ReclaimDones messages taken */
    DEBUG_STATS_CONTENDED_GRANTS = 68,         /* grants made plain to cacheable requests on contended locks */
    DEBUG_STATS_MIN_HOLD_CONFLICTS = 69,       /* acquisitions that met a cached grant inside its minimum hold */
    DEBUG_STATS_MAX = 70
} debug_stats_code_t;

/* ---------------------------------------------------------------------------------------- */
/* Structs                                                                                   */

struct debug_stats {
    uint64_t stats[DEBUG_STATS_MAX];
};

/* A lock to create or open by name. */
struct lock_desc {
    const char *p_desc;      /* len bytes, not NUL-terminated */
    unsigned int len;        /* 1..MAX_LOCK_DESC_LEN */
    unsigned int lock_type;  /* enum dlock_type */
    unsigned int lease_time; /* unused, as in the reference (leases are per request) */
};

/* One lock operation. */
struct lock_request {
    int lock_id;              /* from get_lock */
    int lock_op;              /* enum lock_ops */
    unsigned int expire_time; /* lease in seconds from now; 0 on trylock reads the cache */
};

/*
 * Lock words, as the server last reported them (dlock's layouts; little-endian hosts).
 * Expiry/since values are server ticks in ms since the server started.
 */
typedef struct {
    int32_t client_id;  /* holder, 0 when free */
    uint32_t rsvd;
    uint64_t expiry_ms; /* the grant lapses after this tick */
} atomic_state;

typedef struct {
    int32_t client_id; /* exclusive holder; 0 when free or shared */
    uint32_t rcount;   /* shared holders */
    uint64_t since_ms; /* first acquisition of the current hold; 0 when free */
} rw_state;

typedef struct {
    uint16_t n_exclusive; /* completed exclusive grants ("now serving") */
    uint16_t n_shared;    /* completed shared grants */
    uint16_t m_exclusive; /* next exclusive ticket */
    uint16_t m_shared;    /* next shared ticket */
    uint64_t ext;         /* rms, rflag, rcnt, timeout: unpack with the macros below */
} fairlock_state;

#define DLOCK_FAIR_RMS(ext) ((uint16_t)((ext) & 0xFFFFu))
#define DLOCK_FAIR_RFLAG(ext) ((unsigned)(((ext) >> 16) & 0x1u))
#define DLOCK_FAIR_RCNT(ext) ((unsigned)(((ext) >> 17) & 0x3Fu))
#define DLOCK_FAIR_TIMEOUT_MS(ext) ((uint64_t)(ext) >> 24)

/* What `void *result` points to: at least 16 writable bytes. */
typedef union {
    atomic_state atomic;
    rw_state rw;
    fairlock_state fl;
    uint64_t base;
    uint8_t raw[16];
} lock_state;

/* One batch entry's result. */
struct lock_op_res {
    union {
        atomic_state atomic;
        rw_state rw;
        fairlock_state fl;
        uint64_t base;
        uint8_t raw[16];
    };
    int op_ret;     /* this entry's status */
    uint32_t rsvd;
    uint64_t fence; /* the grant's fencing token (0 without a grant): stamp protected writes */
};

struct umo_atomic64_desc {
    const char *p_desc;  /* len bytes, not NUL-terminated */
    uint32_t len;        /* 1..MAX_UMO_ATOMIC64_DESC_LEN */
    uint32_t lease_time; /* seconds, > 0 */
};

/*
 * Writes the private key's password into buf (room for size bytes, no NUL needed) and returns
 * its length in bytes, or < 0 when there is none to give (then the start or the client_init
 * fails with DLOCK_EINVAL). OpenSSL's pem_password_cb without rwflag and userdata.
 */
typedef int (*dlock_prkey_pwd_cb_t)(char *buf, int size);

/*
 * Called with the buffer prkey_pwd_cb filled (the same buf and size) once dlock has copied the
 * password out, so the application can wipe it its own way; dlock zeroes it afterwards too.
 */
typedef void (*dlock_erase_prkey_cb_t)(char *buf, int size);

/*
 * The reference's hook to check a peer certificate against the CRL file itself. dlock checks
 * the peer's chain against ca_path and crl_path with its own verifier and has no OpenSSL X509
 * to pass: the field must be NULL, anything else is refused with DLOCK_EINVAL.
 */
typedef int (*dlock_cert_verify_cb_t)(void *cert, const char *crl_path);

/*
 * TLS 1.3 with a certificate on both ends of every TCP connection (control and data), cipher
 * suite TLS_AES_256_GCM_SHA384. Paths are made absolute (realpath) when the settings are
 * handed in and must name existing files then; the files are read later (see server_start
 * and client_init). NULL and "" mean none.
 */
struct ssl_cfg {
    bool ssl_enable;        /* false: plaintext TCP; every other field is ignored */
    const char *ca_path;    /* PEM CA bundle the peer's certificate must chain to; required */
    const char *crl_path;   /* PEM CRLs checked on the peer's chain; optional. Once given, a
                               certificate whose issuer has no CRL in the file is refused */
    const char *cert_path;  /* PEM certificate chain of this end, leaf first; required */
    const char *prkey_path; /* PEM private key: PKCS#8 (encrypted: needs prkey_pwd_cb),
                               PKCS#1 or SEC1; required */
    dlock_cert_verify_cb_t cert_verify_cb; /* must be NULL */
    dlock_prkey_pwd_cb_t prkey_pwd_cb;     /* NULL for an unencrypted key */
    dlock_erase_prkey_cb_t erase_prkey_cb; /* NULL, or called after prkey_pwd_cb */
};

struct client_cfg {
    int log_level;           /* accepted, ignored: logs go to the host's tracing subscriber */
    int primary_port;        /* TCP port for "ip" addresses: <= 0 is 21616, else 1024..65535 */
    unsigned int lease_ms;   /* client lease to ask the server for (0: the server's) */
    unsigned int timeout_ms; /* synchronous request timeout (0: 5000) */
    /* TLS for "ip[:port]" clients (the in-process server needs none). The server's certificate
       must carry the IP address given to client_init. The callbacks must stay callable from
       any thread until dclient_lib_deinit. */
    struct ssl_cfg ssl;
};

struct primary_cfg {
    unsigned int num_of_replica;      /* must be 0 */
    unsigned int recovery_client_num; /* clients expected to re-sync after a failover */
    const char *ctrl_cpuset;          /* NULL/"" or a CPU list: control thread on its first */
    const char *cmd_cpuset;           /* the same for the data (command) thread */
    const char *server_ip_str;        /* NULL/"": no TCP (shared memory only); else listen here */
    int server_port;                  /* 0: 21616; < 0: any free port (server_tcp_port) */
    int replica_port;                 /* ignored */
    bool replica_enable;              /* must be false */
};

/*
 * server_cfg.cluster: the server joins a dlock cluster on etcd and serves the partitions its
 * map gives it (docs/cluster.md). Needs a library built with the `cluster` feature; without
 * it, setting any field makes server_start fail with DLOCK_EINVAL (and log why) rather than
 * start a standalone server. 0 in a number means its default.
 */
struct cluster_cfg {
    const char *etcd_endpoints; /* NULL/"": standalone; else comma-separated etcd URLs */
    const char *cluster_name;   /* 1-64 of [A-Za-z0-9._-]: keys live under /dlock/<name>/ */
    unsigned int server_id;     /* 1 or more, unique in the cluster, kept across restarts */
    unsigned int ttl_ms;        /* etcd lease TTL, rounded up to whole seconds (default 10000) */
    unsigned int partitions;    /* fixed at the cluster's creation: 1..4096 (default 256) */
    unsigned int counter_step;  /* counter marks reserved this far ahead (default 100000) */
    const char *advertise;      /* NULL: primary.server_ip_str and its (fixed) port; else host:port */
    const char *etcd_ca_path;   /* etcd over TLS: CA of etcd's certificate (PEM) ... */
    const char *etcd_cert_path; /* ... this server's client certificate chain (PEM) ... */
    const char *etcd_key_path;  /* ... and its key (PEM): all three or none */
    const char *etcd_domain;    /* NULL: etcd's certificate names the endpoint's host */
};

struct server_cfg {
    int type;               /* SERVER_PRIMARY */
    int log_level;          /* accepted, ignored */
    bool sleep_mode_enable; /* park the idle data thread at once; false: spin, yield, park */
    struct primary_cfg primary;
    /* dlock's settings; 0 in any of them means its default */
    unsigned int locks_max;       /* default 51200 */
    unsigned int clients_max;     /* default 1000 */
    unsigned int objects_max;     /* default 102400 */
    unsigned int client_lease_ms; /* a silent client is dead after this (default 5000, >= 100) */
    unsigned int client_lease_max_ms; /* longest lease granted (default 30000): more is capped */
    unsigned int epoch;           /* 1..65535 (default 1); a replacement server needs a larger */
    const char *shm_name;         /* NULL: anonymous region; else /dev/shm/<name> */
    struct ssl_cfg ssl;           /* TLS on the TCP listener; checked even without one */
    bool insecure_plaintext;      /* without TLS: allow a non-loopback server_ip_str */
    const char *session_key_file; /* NULL, or 64 hex digits shared with the replacement server */
    bool insecure_recovery;       /* recover (recovery_client_num > 0) without a session key */
    bool recoverer_local;         /* local clients may call recovery_done (dlock's; default no one) */
    struct cluster_cfg cluster;   /* membership of a dlock cluster on etcd; all 0/NULL: standalone */
};

/* ---------------------------------------------------------------------------------------- */
/* Server API (dlock_server_api.h)                                                           */

/* 1..32 servers at once. 0, or -1 when already initialised or out of range. */
int dserver_lib_init(unsigned int max_server_num);

/* Stops every server. */
void dserver_lib_deinit(void);

/*
 * Starts a server in this process and writes its id (1..0xFFFFF). 0; DLOCK_EINVAL (NULL,
 * settings out of range, TLS files missing or unusable, key password refused or wrong,
 * plaintext on a non-loopback address without insecure_plaintext, a session key file that
 * cannot be read or is of obviously low entropy, recovery_client_num > 0 with neither
 * session_key_file nor insecure_recovery, cluster fields set without the `cluster` feature or
 * out of range or refused by the cluster); -1 (not initialised, address cannot be bound);
 * DLOCK_NOT_READY (a cluster member's etcd or map did not come in time);
 * DLOCK_SERVER_NO_RESOURCE (dserver_lib_init's limit reached, out of resources). A cluster
 * member returns once it serves a map that gives it its partitions. With TLS the key is read, and prkey_pwd_cb then erase_prkey_cb called, once,
 * on the calling thread, before this returns; they are never called afterwards.
 */
int server_start(const struct server_cfg *cfg, int *server_id);

/* 0, or -1 for an unknown id. */
int server_stop(int server_id);

/* The server's counters since the last clear. 0; -1 (unknown id); DLOCK_EINVAL (NULL). */
int get_server_debug_stats(int server_id, struct debug_stats *stats);

int clear_server_debug_stats(int server_id);

/* dlock: the TCP port the server listens on. 0; -1 (unknown id, no TCP); DLOCK_EINVAL. */
int server_tcp_port(int server_id, int *port);

/* ---------------------------------------------------------------------------------------- */
/* Client lifecycle (dlock_client_api.h)                                                     */

/* 0; DLOCK_EINVAL (NULL, bad port, TLS paths missing, cert_verify_cb set); -1 when already
 * initialised. */
int dclient_lib_init(const struct client_cfg *cfg);

/* Deregisters every client instance. */
void dclient_lib_deinit(void);

/*
 * Registers a client instance and writes its id (1..0x7FFFFFFF).
 * server_ip: NULL or "" = the one server running in this process (shared memory; several
 * running = DLOCK_EINVAL, none = DLOCK_NOT_READY); "ip" or "ip:port" (IPv4/IPv6) = TCP, under
 * TLS when dclient_lib_init enabled it. The TLS files are read and the key password asked for
 * once per server IP address, at its first client_init, and kept until dclient_lib_deinit.
 * 0; -1 (before dclient_lib_init; server_ip not an address); DLOCK_EINVAL (NULL p_client_id,
 * several servers in this process, TLS files unusable, key password refused or wrong);
 * DLOCK_NOT_READY (also: the TLS handshake failed, e.g. the server
 * refused this client's certificate); DLOCK_SERVER_NO_RESOURCE;
 * DLOCK_PROTO_VERSION_NEGOTIATION_FAIL; DLOCK_BAD_RESPONSE (also: a plaintext client reached
 * a TLS server).
 */
int client_init(int *p_client_id, const char *server_ip);

/*
 * Re-registers with the same id over new connections, keeping the lock state. server_ip:
 * NULL, "" or the address the client registered with (moving to another server is not
 * supported: DLOCK_EINVAL). If the server is recovering, then call update_all_locks and
 * client_reinit_done. DLOCK_EINVAL for an unknown id; -1 for server_ip not an address.
 */
int client_reinit(int client_id, const char *server_ip);

/* DLOCK_CLIENT_NOT_INIT for an unknown id; -1 (as the reference) without a client_reinit
 * since the last call. */
int client_reinit_done(int client_id);

/*
 * The id is gone even when the exchange fails (DLOCK_BAD_RESPONSE), except on a recovering
 * server's DLOCK_NOT_READY: that server keeps the client and its locks, and so does this
 * library; call again once it serves (the reference forgets the id here).
 */
int client_deinit(int client_id);

/* timeout: 1..300 s (checked; the exchange is bounded by the request timeout). DLOCK_EINVAL
 * for an unknown id. */
int client_heartbeat(int client_id, unsigned int timeout);

/* The error statuses this instance returned, under the same counter indices. */
int get_client_debug_stats(int client_id, struct debug_stats *stats);

int clear_client_debug_stats(int client_id);

/* ---------------------------------------------------------------------------------------- */
/* Lock management                                                                           */

/* Creates or opens the lock by name. 0; DLOCK_EINVAL (bad desc); -1 (the name exists with
 * another type); DLOCK_SERVER_NO_RESOURCE; ... */
int get_lock(int client_id, const struct lock_desc *desc, int *lock_id);

/* -1 for a lock never got or still held; DLOCK_TICKET_TO_UNLOCK; DLOCK_EASYNC; the failure of a
 * parked cached grant's give-back (DLOCK_BAD_RESPONSE, say: owed, the reference kept). */
int release_lock(int client_id, int lock_id);

/* lock_ids[i]: the id, or minus the entry's status (<= 0). DLOCK_EINVAL if any desc is bad. */
int batch_get_lock(int client_id, unsigned int lock_num, const struct lock_desc *descs,
                   int *lock_ids);

/* Ids that could not be released are set to 0; -1 when none could be. */
int batch_release_lock(int client_id, unsigned int lock_num, int *lock_ids);

/*
 * Re-claims every lock the client knows on a recovering server. The server may give the
 * locks new ids, which this call cannot report: after client_reinit_done, call get_lock by
 * name again to learn them (the lock state is kept), and lock_cache_enable again on the
 * locks that cache: the cache forgets every lock when the ids change (its grants were not
 * re-claimed; client_revokes_poll reports DLOCK_REVOKE_ALL). A lock whose claim is refused is
 * forgotten (the server does not hold it for this client). DLOCK_CLIENT_NOT_INIT for an unknown
 * id; -1 (as the reference) when the server is not recovering for this client: nothing is
 * claimed and every record kept.
 */
int update_all_locks(int client_id);

/* ---------------------------------------------------------------------------------------- */
/* Lock operations                                                                           */
/*
 * result: at least 16 writable bytes (lock_state). Written on DLOCK_SUCCESS,
 * DLOCK_ALREADY_LOCKED, DLOCK_EAGAIN, DLOCK_FAIL and DLOCK_ETIMEOUT; left alone otherwise.
 */

/* LOCK_EXCLUSIVE or LOCK_SHARED, no waiting. DLOCK_EAGAIN: fair lock queued, call again. */
int trylock(int client_id, const struct lock_request *req, void *result);

/* Waits on the server up to 5 s for the grant; then DLOCK_ETIMEOUT. */
int lock(int client_id, const struct lock_request *req, void *result);

/* DLOCK_ALREADY_LOCKED: a re-entry was counted down, still held. */
int unlock(int client_id, int lock_id, void *result);

/* EXTEND_LOCK_EXCLUSIVE/SHARED: DLOCK_EINVAL unless held in that mode, and for RW locks. */
int lock_extend(int client_id, const struct lock_request *req, void *result);

/* dlock: the fencing token of the grant held. DLOCK_ALREADY_UNLOCKED when none is held. */
int lock_fence(int client_id, int lock_id, uint64_t *fence);

/*
 * dlock: lock value blocks, DLOCK_VALUE_BLOCK_LEN bytes a lock keeps for the engine (a page's
 * LSN, the node with its newest copy: the Linux DLM's lock value block). Every grant of a lock
 * whose client enabled them returns the block, which lock_value_get reads while the grant is
 * held; the unlock that releases an exclusive grant writes the block lock_value_set staged
 * (unlock, batch_unlock, an async UNLOCK; an unlock that only counts a re-entry down keeps it
 * staged). When an exclusive holder is lost without writing (its client died, its lease ran
 * out, its grant expired and was taken over), the next grant reads the block not valid, with
 * the bytes last written, until an exclusive holder writes again; after a server failover a
 * block is not valid unless a re-claiming holder's copy restored it. These calls send nothing.
 */

/* enable: 1 = every grant of lock_id from now on returns its block, 0 = none. 0;
 * DLOCK_LOCK_NOT_GET; DLOCK_EINVAL (another enable). */
int lock_value_enable(int client_id, int lock_id, int enable);

/* Copies the first len (0..32) bytes of the block the grant held came with and writes *valid
 * (1, or 0: see above). 0; DLOCK_ALREADY_UNLOCKED (no grant held); DLOCK_LOCK_NOT_GET;
 * DLOCK_EINVAL (NULL, len > 32, the grant came without a block). */
int lock_value_get(int client_id, int lock_id, void *value, unsigned int len, int *valid);

/* Stages value[0..len) (0..32 bytes, zero-padded) for the unlock that releases the exclusive
 * grant held. 0; DLOCK_EINVAL (len > 32, NULL with len > 0, no exclusive grant held: readers
 * cannot write the block); DLOCK_LOCK_NOT_GET; DLOCK_EASYNC (an operation on it outstanding). */
int lock_value_set(int client_id, int lock_id, const void *value, unsigned int len);

/*
 * dlock: retained locks. A grant of a lock whose client enabled retention outlives the client
 * when it dies (its lease runs out or its connection is lost; not client_deinit): the lock stays
 * held by the dead client and others get DLOCK_LOCK_RETAINED (lock() waits, then returns it)
 * until a recoverer, having replayed the dead client's work, calls recovery_done. Who is a
 * recoverer is the server's configuration (server_cfg.recoverer_local; dlock serve
 * --recoverer), never the caller's claim.
 */

/* enable: 1 = every grant of lock_id from now on is retained if this client dies, 0 = not.
 * 0; DLOCK_LOCK_NOT_GET; DLOCK_EINVAL (another enable). Sends nothing. */
int lock_retain_enable(int client_id, int lock_id, int enable);

/* Releases the locks dead client dead_client_id retains; *released (may be NULL) receives how
 * many. 0; DLOCK_EINVAL (this client is no recoverer, counted as recovery_done_refused; or
 * dead_client_id is alive); DLOCK_CLIENT_NOT_INIT (no client has that id). */
int recovery_done(int client_id, int dead_client_id, unsigned int *released);

/*
 * dlock: cached grants. An RW lock with caching enabled keeps its grant after the worker's
 * last unlock: that unlock *parks* the grant (held on the server, nothing sent; a value block
 * staged with lock_value_set waits for the give-back), and a later trylock/lock in a mode it
 * covers (anything under an exclusive grant, shared under a shared one) is answered from it
 * with nothing sent. An exclusive request over a parked shared grant gives it back first.
 *
 * When another client wants a conflicting mode, the server sends this one a revoke. The
 * library reads revokes in trylock, lock, unlock, lock_downgrade, lock_cache_release and
 * client_revokes_poll of the client, and acts on them itself: a parked grant goes back at once
 * (or is downgraded when only shared is wanted); a grant in use goes back (or is downgraded)
 * with the unlock that ends its use. Flush what a lock protects before that unlock, as before
 * any unlock. A give-back that does not reach the server is sent again at the client's next
 * call (the call that failed returns why), never dropped. Each
 * revoke acted on is reported to the engine, by its callback or its poll, so it can hurry the
 * users in the way. While none of the client's cache-enabled locks is held or owes a give-back,
 * a call leaves the look at its revokes for later (within the client's trust bound: nothing a
 * revoke could be for is held), so over TCP it costs no extra system call. A client that never calls in does not see its revokes and loses the grant
 * at the server's revoke timeout (its lease by default). lock() on an RW lock of a client that
 * caches waits on the server in 20 ms slices and reads its revokes between them.
 *
 * Batches and lock_request_async refuse a lock that caches (DLOCK_EINVAL for its entry):
 * the local users of a cached grant are counted by trylock/lock/unlock only.
 */

/* A revoke: lock_id is wanted in wanted_op (LOCK_EXCLUSIVE, or LOCK_SHARED: lock_downgrade
 * answers it); lock_id DLOCK_REVOKE_ALL: revokes were lost and every cached lock was revoked. */
struct dlock_revoke {
    int lock_id;
    int wanted_op;
};

/*
 * Told of each revoke of client_id's cached grants, with the user_data it was registered with.
 * Called only from client_revokes_poll, on the thread that polls, with no lock of the library
 * held: it may call any function of this library, also for client_id (unlock,
 * lock_cache_release, lock_downgrade), but should only note what to flush and return. The
 * reference declares callback_func_t and never calls it; this one is called.
 */
typedef void (*dlock_revoke_cb_t)(int client_id, const struct dlock_revoke *revoke,
                                  void *user_data);

/* enable: 1 = every grant of RW lock lock_id from now on is cached, 0 = not (a parked grant is
 * given back). 0; DLOCK_LOCK_NOT_GET; DLOCK_EINVAL (another enable, not an RW lock, or held in
 * use: enable it before taking it); the failure of a give-back that did not reach the server
 * (DLOCK_BAD_RESPONSE, say: caching stays on, and the give-back is sent again at the client's
 * next call). Sends nothing but a give-back. */
int lock_cache_enable(int client_id, int lock_id, int enable);

/* Gives a parked grant back now. 0; DLOCK_ALREADY_LOCKED (in use: the unlock that ends the use
 * gives it back); DLOCK_ALREADY_UNLOCKED (nothing held); DLOCK_EINVAL (caching not enabled);
 * DLOCK_LOCK_NOT_GET; the failure of a give-back that did not reach the server
 * (DLOCK_BAD_RESPONSE, say), which the library sends again at the client's next call. */
int lock_cache_release(int client_id, int lock_id);

/* dlock: turns the exclusive grant held on an RW lock into a shared one in place (same fencing
 * token; a staged value block is written). DLOCK_EINVAL for another kind or a grant not held
 * exclusively. */
int lock_downgrade(int client_id, int lock_id, void *result);

/* cb NULL unregisters (revokes are then polled). 0; DLOCK_CLIENT_NOT_INIT (unknown client_id);
 * DLOCK_CLIENTMGR_NOT_INIT. */
int client_revoke_callback_register(int client_id, dlock_revoke_cb_t cb, void *user_data);

/* Reads and acts on the revokes the server sent. With a callback: calls it for each, *count =
 * how many. Without: copies up to max into out, *count = how many (the rest wait for the next
 * poll). 0; DLOCK_EINVAL (NULL count; NULL out with max > 0 and no callback). */
int client_revokes_poll(int client_id, struct dlock_revoke *out, unsigned int max,
                        unsigned int *count);

/*
 * Batches of 1..31 entries, one message, each entry on its own (results[i].op_ret). A bad op
 * is DLOCK_EINVAL, a bad id DLOCK_LOCK_NOT_GET for that entry. Returns 0 even when every entry
 * failed; an error only for the whole call.
 */
int batch_trylock(int client_id, unsigned int lock_num, const struct lock_request *reqs,
                  struct lock_op_res *results);

int batch_unlock(int client_id, unsigned int lock_num, const int *lock_ids,
                 struct lock_op_res *results);

int batch_lock_extend(int client_id, unsigned int lock_num, const struct lock_request *reqs,
                      struct lock_op_res *results);

/* One outstanding per client. A re-entry answered locally returns 0 with nothing to check. */
int lock_request_async(int client_id, const struct lock_request *req);

/* DLOCK_ASYNC_AGAIN until the reply arrives; DLOCK_ETIMEOUT after 5 s; DLOCK_NO_ASYNC. */
int lock_result_check(int client_id, void *result);

/* ---------------------------------------------------------------------------------------- */
/* umo_atomic64 objects                                                                      */

/* Creating is not a reference: umo_atomic64_get it to operate on it. */
int umo_atomic64_create(int client_id, const struct umo_atomic64_desc *desc, uint64_t init_val,
                        int *obj_id);

int umo_atomic64_destroy(int client_id, int obj_id);

int umo_atomic64_get(int client_id, const struct umo_atomic64_desc *desc, int *obj_id);

int umo_atomic64_release(int client_id, int obj_id);

/* *res_val: the value before the add. */
int umo_atomic64_faa(int client_id, int obj_id, uint64_t add_val, uint64_t *res_val);

/* 0 when swapped, DLOCK_OBJECT_CAS_FAILED when the value differed. */
int umo_atomic64_cas(int client_id, int obj_id, uint64_t cmp_val, uint64_t swap_val);

/* dlock: umo_atomic64_cas that also writes the value it found (cmp_val when it swapped). */
int umo_atomic64_cas_value(int client_id, int obj_id, uint64_t cmp_val, uint64_t swap_val,
                           uint64_t *observed);

int umo_atomic64_get_snapshot(int client_id, int obj_id, uint64_t *res_val);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_H */
