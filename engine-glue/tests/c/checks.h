/*
 * checks.h: what the C tests in this folder share (abi_smoke.c, cached_locks.c): counting
 * checks, printing each failure with its line, the expression and the values seen, the
 * summary that is the program's exit status, and short constructors for the header's request
 * structs. Each program defines CHECK_PROGRAM (its name, for the messages) before including
 * it; c_abi.rs compiles each program as one translation unit, so the counters are its own.
 */

#ifndef DLOCK_TESTS_CHECKS_H
#define DLOCK_TESTS_CHECKS_H

#include <stdio.h>
#include <string.h>

#include "dlock.h"

#ifndef CHECK_PROGRAM
#error "define CHECK_PROGRAM (the program's name) before including checks.h"
#endif

static int failures;
static int checks;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        checks++;                                                                          \
        if (!(cond)) {                                                                     \
            failures++;                                                                    \
            fprintf(stderr, CHECK_PROGRAM ".c:%d: check failed: %s\n", __LINE__, #cond);   \
        }                                                                                  \
    } while (0)

/* A call's return compared with an expected code; prints both on a mismatch. */
#define EXPECT(call, want)                                                                 \
    do {                                                                                   \
        long long got_ = (long long)(call);                                                \
        long long want_ = (long long)(want);                                               \
        checks++;                                                                          \
        if (got_ != want_) {                                                               \
            failures++;                                                                    \
            fprintf(stderr, CHECK_PROGRAM ".c:%d: %s returned %#llx, expected %s (%#llx)\n", \
                    __LINE__, #call, got_, #want, want_);                                  \
        }                                                                                  \
    } while (0)

/* Prints how the checks went; the program's exit status (0 only if all passed). */
static inline int checks_summary(void)
{
    if (failures) {
        fprintf(stderr, CHECK_PROGRAM ": %d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf(CHECK_PROGRAM ": all %d checks passed\n", checks);
    return 0;
}

static inline struct lock_desc desc(const char *name, unsigned type)
{
    struct lock_desc d = {name, (unsigned)strlen(name), type, 0};
    return d;
}

static inline struct lock_request req(int lock_id, int op, unsigned expire_s)
{
    struct lock_request r = {lock_id, op, expire_s};
    return r;
}

#endif
