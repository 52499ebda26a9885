/* SPDX-License-Identifier: Apache-2.0 */
/*
 * clock.h - reading a clock and sleeping, written once for every part of idem, under one name
 * each (clock_mono_ms, clock_wall_ms, clock_sleep_ms...): the two libraries must not share a
 * symbol (a program may link both statically), so the code is shared as static inline functions
 * rather than as an object file linked twice.
 */
#ifndef IDEM_COMMON_CLOCK_H
#define IDEM_COMMON_CLOCK_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

/* Milliseconds of `id` (CLOCK_REALTIME: since the epoch; CLOCK_MONOTONIC: for durations). */
static inline int64_t clock_now_ms(clockid_t id)
{
    struct timespec ts = {0, 0};

    /* clock_gettime cannot fail for these two clocks on POSIX; a zeroed ts is the fallback. */
    (void)clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}

/* Nanoseconds of `id`, for durations measured finer than a millisecond. */
static inline int64_t clock_now_ns(clockid_t id)
{
    struct timespec ts = {0, 0};

    (void)clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* The three every part reads: the monotonic clock (durations, deadlines), finer, and the wall. */
static inline int64_t clock_mono_ms(void)
{
    return clock_now_ms(CLOCK_MONOTONIC);
}

static inline int64_t clock_mono_ns(void)
{
    return clock_now_ns(CLOCK_MONOTONIC);
}

static inline int64_t clock_wall_ms(void)
{
    return clock_now_ms(CLOCK_REALTIME);
}

/* Sleeps `ms` milliseconds (nothing for ms <= 0), the whole pause even when signals cut it. */
static inline void clock_sleep_ms(int64_t ms)
{
    struct timespec req, rem;

    if (ms <= 0)
        return;
    req.tv_sec = (time_t)(ms / 1000);
    req.tv_nsec = (long)(ms % 1000) * 1000000L;
    /* A signal cuts nanosleep short; sleep the rest, so callers get the pause they asked for. */
    while (nanosleep(&req, &rem) != 0 && errno == EINTR)
        req = rem;
}

/* The absolute time `ms` milliseconds from now on clock `id`: a deadline for a timed wait. */
static inline struct timespec clock_deadline(clockid_t id, int64_t ms)
{
    struct timespec ts = {0, 0};

    (void)clock_gettime(id, &ts);
    if (ms < 0)
        ms = 0;
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif /* IDEM_COMMON_CLOCK_H */
