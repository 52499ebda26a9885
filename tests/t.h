/* SPDX-License-Identifier: Apache-2.0 */
/*
 * t.h - the smallest test harness that still says what failed: CHECK records a failure with its
 * file and line and goes on, so one run reports every broken expectation; t_done() sets the exit
 * status CTest reads.  T_WAIT_UNTIL waits, with a deadline, for what another thread or process
 * does: a test never sleeps and then checks it.
 */
#ifndef IDEM_TEST_T_H
#define IDEM_TEST_T_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int t_failures;
static int t_checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        t_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            t_failures++;                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_INT(a, b)                                                                            \
    do {                                                                                           \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                    \
        t_checks++;                                                                                \
        if (t_a_ != t_b_) {                                                                        \
            t_failures++;                                                                          \
            fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__, __LINE__, #a,    \
                    t_a_, #b, t_b_);                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *t_a_ = (a), *t_b_ = (b);                                                       \
        t_checks++;                                                                                \
        if (!t_a_ || !t_b_ || strcmp(t_a_, t_b_) != 0) {                                           \
            t_failures++;                                                                          \
            fprintf(stderr, "%s:%d: %s is \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a,      \
                    t_a_ ? t_a_ : "(null)", t_b_ ? t_b_ : "(null)");                               \
        }                                                                                          \
    } while (0)

/* The clocks: common/clock.h's clock_mono_ms()... */
#include "../common/clock.h"

/*
 * Sleeps `ms` milliseconds.  Only for time itself to pass (a lease or a lifetime must run out) or
 * for a quiet period in which nothing may happen: never to give another thread or process a head
 * start before checking what it did -- wait for that with T_WAIT_UNTIL.
 */
static inline void t_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    if (ms <= 0)
        return;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ; /* interrupted by a signal: sleep what is left */
}

/*
 * How long T_WAIT_UNTIL waits for another thread or process: what takes milliseconds alone can
 * take seconds under ASan on two loaded cores, and a deadline is only there to end a hung test.
 */
#define T_WAIT_MS 30000

/*
 * Waits until `cond` holds, evaluating it again after pauses of 1 ms growing to 50 ms; after
 * T_WAIT_MS it records a failure that names `what`, the thing awaited, and goes on.  Callers that
 * must not go on test `cond` again afterwards.
 */
#define T_WAIT_UNTIL(cond, what)                                                                   \
    do {                                                                                           \
        const int64_t t_deadline_ = clock_mono_ms() + T_WAIT_MS;                                   \
        int64_t t_pause_ = 1;                                                                      \
        t_checks++;                                                                                \
        while (!(cond)) {                                                                          \
            if (clock_mono_ms() >= t_deadline_) {                                                  \
                t_failures++;                                                                      \
                fprintf(stderr, "%s:%d: gave up after %d s waiting for %s (%s)\n", __FILE__,       \
                        __LINE__, T_WAIT_MS / 1000, what, #cond);                                  \
                break;                                                                             \
            }                                                                                      \
            t_sleep_ms(t_pause_);                                                                  \
            t_pause_ = t_pause_ * 2 > 50 ? 50 : t_pause_ * 2;                                      \
        }                                                                                          \
    } while (0)

static inline int t_done(void)
{
    if (t_checks == 0) {
        fprintf(stderr, "no checks ran\n");
        return 1;
    }
    fprintf(stderr, "%d checks, %d failed\n", t_checks, t_failures);
    return t_failures ? 1 : 0;
}

#endif
