/*
 * t.h - the smallest test harness that still says what failed: CHECK records a failure with its
 * file and line and goes on, so one run reports every broken expectation; t_done() sets the exit
 * status CTest reads.
 */
#ifndef IDEM_TEST_T_H
#define IDEM_TEST_T_H

#include <stdio.h>
#include <string.h>

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
