/*
 * cached_locks.c: cached grants through include/dlock.h, as a C storage engine with one client
 * per worker would drive them. Built and run by engine-glue/tests/c_abi.rs against
 * libdlock_engine_glue.a; exit status 0 only if every check passed.
 *
 * Each scenario runs twice: with both clients on the in-process server's shared memory (the
 * revokes come through the client's event ring), and over TCP (as event frames on the shared
 * data connection). Nothing waits on a clock: a revoke is polled for until it comes (the
 * server sends it once the grant's minimum hold is over), up to a bound far past any delay.
 */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"

#define CHECK_PROGRAM "cached_locks"
#include "checks.h"

/* Polls for a revoke at most this many times, 1 ms apart: far past the minimum hold. */
#define POLLS_MAX 20000

/* What the revoke callback saw. */
struct seen {
    int calls;
    int client_id;
    struct dlock_revoke last;
};

/* Notes the revoke and returns, as the header asks: the engine acts after its poll. */
static void on_revoke(int client_id, const struct dlock_revoke *revoke, void *user_data)
{
    struct seen *s = user_data;
    s->calls++;
    s->client_id = client_id;
    s->last = *revoke;
}

/*
 * Client b asks for rb (a trylock, refused while a holds the lock) and a polls, until a
 * reports a revoke: through its callback into s when out is NULL, else into out (up to max).
 * How many revokes the poll reported. b asks again each round, as an engine would (a trylock
 * inside a's minimum hold revokes only when the hold ends, and the poll may look sooner).
 */
static unsigned ask_until_revoked(int a, int b, const struct lock_request *rb,
                                  const struct seen *s, struct dlock_revoke *out, unsigned max)
{
    lock_state st;
    unsigned n = 0;
    int before = s->calls;
    for (int polls = 0; polls < POLLS_MAX; polls++) {
        EXPECT(trylock(b, rb, &st), DLOCK_FAIL);
        EXPECT(client_revokes_poll(a, out, max, &n), DLOCK_SUCCESS);
        if (out == NULL ? s->calls != before : n > 0)
            return out == NULL ? (unsigned)(s->calls - before) : n;
        usleep(1000);
    }
    return 0;
}

/* Polls client c (no callback) into out until a revoke comes; how many came. */
static unsigned poll_array(int c, struct dlock_revoke *out, unsigned max)
{
    unsigned n = 0;
    for (int polls = 0; n == 0 && polls < POLLS_MAX; polls++) {
        EXPECT(client_revokes_poll(c, out, max, &n), DLOCK_SUCCESS);
        if (n == 0)
            usleep(1000);
    }
    return n;
}

/* What a waiting worker of client b asks for, on its own thread. */
struct waiter {
    int client_id;
    struct lock_request r;
    int rc;
};

static void *wait_for_lock(void *arg)
{
    struct waiter *w = arg;
    lock_state st;
    w->rc = lock(w->client_id, &w->r, &st);
    return NULL;
}

/* Bad input: each refused with a clear status, nothing changed. */
static void bad_input(int a, int ida)
{
    struct seen s = {0, 0, {0, 0}};
    struct dlock_revoke out[1];
    unsigned n = 7;
    EXPECT(lock_cache_enable(a, ida, 2), DLOCK_EINVAL);
    EXPECT(lock_cache_enable(a, 0, 1), DLOCK_LOCK_NOT_GET);
    EXPECT(lock_cache_enable(0x7654321, ida, 1), DLOCK_CLIENT_NOT_INIT);
    EXPECT(lock_cache_release(a, ida), DLOCK_EINVAL); /* caching not enabled */
    EXPECT(client_revoke_callback_register(0x7654321, on_revoke, &s), DLOCK_CLIENT_NOT_INIT);
    EXPECT(client_revoke_callback_register(-1, NULL, NULL), DLOCK_CLIENT_NOT_INIT);
    EXPECT(client_revokes_poll(0x7654321, out, 1, &n), DLOCK_CLIENT_NOT_INIT);
    EXPECT(client_revokes_poll(a, out, 1, NULL), DLOCK_EINVAL);
    EXPECT(client_revokes_poll(a, NULL, 1, &n), DLOCK_EINVAL); /* no callback, nowhere to write */
    CHECK(n == 7);
    EXPECT(client_revokes_poll(a, NULL, 0, &n), DLOCK_SUCCESS);
    CHECK(n == 0);

    struct lock_desc d = desc("cached/atomic", DLOCK_ATOMIC);
    int atomic_id = 0;
    EXPECT(get_lock(a, &d, &atomic_id), DLOCK_SUCCESS);
    EXPECT(lock_cache_enable(a, atomic_id, 1), DLOCK_EINVAL); /* a lease would outlive it */
    EXPECT(release_lock(a, atomic_id), DLOCK_SUCCESS);
}

/*
 * Moves the scenario to a lock nobody fought over yet, cached by a: the server grants a lock
 * fought over within its contention window (a second by default) plain, and a plain grant goes
 * back at its unlock, so each part that makes b conflict with a cached grant takes a fresh one.
 */
static void fresh_lock(int a, int b, const char *name, int part, int *ida, int *idb)
{
    char full[64];
    snprintf(full, sizeof full, "%s/%d", name, part);
    struct lock_desc d = desc(full, DLOCK_RW);
    EXPECT(get_lock(a, &d, ida), DLOCK_SUCCESS);
    EXPECT(get_lock(b, &d, idb), DLOCK_SUCCESS);
    EXPECT(lock_cache_enable(a, *ida, 1), DLOCK_SUCCESS);
}

static void scenario(int a, int b, const char *name)
{
    fprintf(stderr, "cached_locks: %s\n", name);
    struct lock_desc d = desc(name, DLOCK_RW);
    int ida = 0, idb = 0;
    EXPECT(get_lock(a, &d, &ida), DLOCK_SUCCESS);
    EXPECT(get_lock(b, &d, &idb), DLOCK_SUCCESS);
    bad_input(a, ida);

    lock_state st;
    struct lock_request ex = req(ida, LOCK_EXCLUSIVE, 5);
    struct lock_request sh = req(ida, LOCK_SHARED, 5);
    struct lock_request exb = req(idb, LOCK_EXCLUSIVE, 5);
    struct lock_request shb = req(idb, LOCK_SHARED, 5);
    uint64_t fence = 0, again = 0;
    struct seen s = {0, 0, {0, 0}};

    EXPECT(lock_cache_enable(a, ida, 1), DLOCK_SUCCESS);
    EXPECT(lock_cache_release(a, ida), DLOCK_ALREADY_UNLOCKED);
    EXPECT(client_revoke_callback_register(a, on_revoke, &s), DLOCK_SUCCESS);

    /* The last unlock parks the grant; the next lock is answered from it: the same grant. */
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(lock_cache_enable(a, ida, 0), DLOCK_EINVAL); /* in use */
    EXPECT(lock_fence(a, ida, &fence), DLOCK_SUCCESS);
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    EXPECT(unlock(a, ida, &st), DLOCK_ALREADY_UNLOCKED);
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(a, ida, &again), DLOCK_SUCCESS);
    CHECK(again == fence);
    /* A re-entry counts, and only the last unlock parks. */
    EXPECT(trylock(a, &ex, &st), DLOCK_ALREADY_LOCKED);
    EXPECT(unlock(a, ida, &st), DLOCK_ALREADY_LOCKED);
    /* Batches and async calls would count users the cache does not see. */
    struct lock_op_res res;
    EXPECT(batch_trylock(a, 1, &ex, &res), DLOCK_SUCCESS);
    EXPECT(res.op_ret, DLOCK_EINVAL);
    EXPECT(lock_request_async(a, &ex), DLOCK_EINVAL);

    /* B wants it while A uses it: refused, A's callback is told, A's unlock gives it back. */
    CHECK(ask_until_revoked(a, b, &exb, &s, NULL, 0) == 1);
    CHECK(s.calls == 1 && s.client_id == a);
    CHECK(s.last.lock_id == ida && s.last.wanted_op == LOCK_EXCLUSIVE);
    EXPECT(trylock(b, &exb, &st), DLOCK_FAIL); /* still in use */
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(a, ida, &again), DLOCK_ALREADY_UNLOCKED); /* given back, not parked */
    EXPECT(trylock(b, &exb, &st), DLOCK_SUCCESS);
    CHECK(st.rw.client_id == b);
    EXPECT(unlock(b, idb, &st), DLOCK_SUCCESS);

    /* Fought over a moment ago, the lock is granted plain (the result says so): the unlock
     * gives it back, and no revoke is reported for it. */
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(a, ida, &again), DLOCK_ALREADY_UNLOCKED); /* given back, not parked */
    CHECK(s.calls == 1);
    EXPECT(trylock(b, &exb, &st), DLOCK_SUCCESS);
    EXPECT(unlock(b, idb, &st), DLOCK_SUCCESS);

#define FRESH(part)                                       \
    do {                                                  \
        fresh_lock(a, b, name, (part), &ida, &idb);       \
        ex = req(ida, LOCK_EXCLUSIVE, 5);                 \
        sh = req(ida, LOCK_SHARED, 5);                    \
        exb = req(idb, LOCK_EXCLUSIVE, 5);                \
        shb = req(idb, LOCK_SHARED, 5);                   \
    } while (0)

    /* NULL unregisters: revokes are polled. A parked grant goes back by itself. */
    FRESH(2);
    EXPECT(client_revoke_callback_register(a, NULL, NULL), DLOCK_SUCCESS);
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(a, ida, &again), DLOCK_SUCCESS);
    CHECK(again > fence); /* a new grant from the server */
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    struct dlock_revoke out[4];
    unsigned n = ask_until_revoked(a, b, &exb, &s, out, 4);
    CHECK(n == 1 && out[0].lock_id == ida && out[0].wanted_op == LOCK_EXCLUSIVE);
    CHECK(s.calls == 1); /* unregistered: not called */
    EXPECT(lock_cache_release(a, ida), DLOCK_ALREADY_UNLOCKED); /* already given back */
    EXPECT(trylock(b, &exb, &st), DLOCK_SUCCESS);
    EXPECT(unlock(b, idb, &st), DLOCK_SUCCESS);

    /* Readers wanted: a parked writer's grant is downgraded, and A keeps reading locally. */
    FRESH(3);
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(a, ida, &fence), DLOCK_SUCCESS);
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    n = ask_until_revoked(a, b, &shb, &s, out, 4);
    CHECK(n == 1 && out[0].lock_id == ida && out[0].wanted_op == LOCK_SHARED);
    EXPECT(trylock(b, &shb, &st), DLOCK_SUCCESS);
    EXPECT(trylock(a, &sh, &st), DLOCK_SUCCESS);
    EXPECT(lock_fence(a, ida, &again), DLOCK_SUCCESS);
    CHECK(again == fence); /* the same grant, downgraded in place */
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    /* A writer over a parked reader gives the reader back first, then asks the server. */
    EXPECT(trylock(a, &ex, &st), DLOCK_FAIL); /* B still reads */
    EXPECT(unlock(b, idb, &st), DLOCK_SUCCESS);

    /* A worker of B blocked in lock() is granted when A, polling, gives the parked grant back. */
    FRESH(4);
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(lock_downgrade(a, ida, &st), DLOCK_SUCCESS);
    EXPECT(lock_downgrade(a, ida, &st), DLOCK_EINVAL); /* not exclusive any more */
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    /* B caches another lock, so its lock() waits in slices, reading its own revokes. */
    struct lock_desc other = desc("cached/other", DLOCK_RW);
    int idother = 0;
    EXPECT(get_lock(b, &other, &idother), DLOCK_SUCCESS);
    EXPECT(lock_cache_enable(b, idother, 1), DLOCK_SUCCESS);
    struct waiter w = {b, exb, -1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, wait_for_lock, &w) == 0);
    n = poll_array(a, out, 4);
    CHECK(n == 1 && out[0].lock_id == ida && out[0].wanted_op == LOCK_EXCLUSIVE);
    CHECK(pthread_join(t, NULL) == 0);
    EXPECT(w.rc, DLOCK_SUCCESS);
    EXPECT(unlock(b, idb, &st), DLOCK_SUCCESS);
    EXPECT(lock_cache_enable(b, idother, 0), DLOCK_SUCCESS);
    EXPECT(release_lock(b, idother), DLOCK_SUCCESS);

    /* release_lock gives a parked grant back with the reference. */
    FRESH(5);
    EXPECT(trylock(a, &ex, &st), DLOCK_SUCCESS);
    EXPECT(unlock(a, ida, &st), DLOCK_SUCCESS);
    EXPECT(release_lock(a, ida), DLOCK_SUCCESS);
    EXPECT(trylock(b, &exb, &st), DLOCK_SUCCESS);
    EXPECT(unlock(b, idb, &st), DLOCK_SUCCESS);
    EXPECT(release_lock(b, idb), DLOCK_SUCCESS);
#undef FRESH
}

static struct server_cfg small_server(void)
{
    struct server_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.type = SERVER_PRIMARY;
    cfg.sleep_mode_enable = false;
    cfg.locks_max = 64;
    cfg.clients_max = 8;
    cfg.objects_max = 4;
    return cfg;
}

int main(void)
{
    struct client_cfg ccfg;
    memset(&ccfg, 0, sizeof ccfg);
    struct server_cfg cfg = small_server();
    cfg.primary.server_ip_str = "127.0.0.1";
    cfg.primary.server_port = -1; /* any free port */
    int sid = 0, port = 0, a = 0, b = 0;
    EXPECT(dserver_lib_init(1), DLOCK_SUCCESS);
    EXPECT(dclient_lib_init(&ccfg), DLOCK_SUCCESS);
    EXPECT(server_start(&cfg, &sid), DLOCK_SUCCESS);
    EXPECT(server_tcp_port(sid, &port), DLOCK_SUCCESS);

    EXPECT(client_init(&a, NULL), DLOCK_SUCCESS);
    EXPECT(client_init(&b, NULL), DLOCK_SUCCESS);
    scenario(a, b, "shm/rg-1");
    EXPECT(client_deinit(a), DLOCK_SUCCESS);
    EXPECT(client_deinit(b), DLOCK_SUCCESS);

    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    EXPECT(client_init(&a, addr), DLOCK_SUCCESS);
    EXPECT(client_init(&b, addr), DLOCK_SUCCESS);
    scenario(a, b, "tcp/rg-1");
    EXPECT(client_deinit(a), DLOCK_SUCCESS);
    EXPECT(client_deinit(b), DLOCK_SUCCESS);

    dclient_lib_deinit();
    EXPECT(server_stop(sid), DLOCK_SUCCESS);
    dserver_lib_deinit();
    return checks_summary();
}
