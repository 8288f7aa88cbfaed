/*
 * example_common.h: what the reference's examples keep beside themselves (an EID parser), and
 * the checks these test programs add to them.
 *
 * The programs in this folder are written the way the reference's examples are (getopt
 * options, pthreads, printf and return codes) against the drop-in headers only; they are
 * compiled and run by engine-glue/tests/reference_programs.rs. Each failed check prints its
 * line and what it saw and counts towards the exit status; a run without failures prints
 * "checks passed".
 */

#ifndef EXAMPLE_COMMON_H
#define EXAMPLE_COMMON_H

#include <arpa/inet.h>
#include <string.h>

#include <atomic>
#include <cstdio>

#include "dlock_types.h"

using namespace dlock;

static std::atomic<int> g_failures{0};

/* A failed check: printed, counted, and the run goes on. */
#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            g_failures++;                                                          \
            printf("%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);        \
        }                                                                          \
    } while (0)

/* A call's return compared with the code expected. */
#define EXPECT_RET(call, want)                                                     \
    do {                                                                           \
        long long got_ = (long long)(call);                                        \
        long long want_ = (long long)(want);                                       \
        if (got_ != want_) {                                                       \
            g_failures++;                                                          \
            printf("%s:%d: %s returned %#llx, expected %s (%#llx)\n", __FILE__,    \
                   __LINE__, #call, got_, #want, want_);                           \
        }                                                                          \
    } while (0)

/* The exit status: 0 and "checks passed" when nothing failed. */
static inline int finish(void)
{
    if (g_failures.load() != 0) {
        printf("%d checks failed\n", g_failures.load());
        return 1;
    }
    printf("checks passed\n");
    return 0;
}

/* An EID as the reference's examples take it: IPv6, or IPv4 mapped into IPv6. dlock never
   reads it; the programs parse it to show that a reference program's EID is accepted. */
static inline int str_to_urma_eid(const char *buf, dlock_eid_t *eid)
{
    uint32_t ipv4;
    if (buf == nullptr || eid == nullptr) {
        return -1;
    }
    if (inet_pton(AF_INET6, buf, eid->raw) > 0) {
        return 0;
    }
    if (inet_pton(AF_INET, buf, &ipv4) > 0) {
        eid->in4.reserved = 0;
        eid->in4.prefix = htonl(0x0000ffff);
        eid->in4.addr = ipv4;
        return 0;
    }
    return -1;
}

#endif /* EXAMPLE_COMMON_H */
