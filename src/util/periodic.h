/* SPDX-License-Identifier: Apache-2.0 */
/*
 * periodic.h - a background thread that runs a function every interval until it is stopped:
 * orderd's workers (completer, reconciler, outbox relay, sweeper) and idem-gateway's sweeper.
 * The pause is a condition variable on the monotonic clock, so a stop wakes the thread at once
 * and a step of the wall clock neither skips nor stretches a pause.
 */
#ifndef IDEM_UTIL_PERIODIC_H
#define IDEM_UTIL_PERIODIC_H

#include <pthread.h>
#include <stdint.h>

struct periodic;

/* One run.  A long run checks periodic_stopping() between its steps. */
typedef void (*periodic_fn)(struct periodic *p, void *ctx);

struct periodic {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int inited;
    int running;
    int64_t interval_ms;
    periodic_fn run;
    void *ctx;
};

/*
 * Starts a thread that waits `interval_ms` (> 0), calls run(p, ctx), and again, until
 * periodic_stop().  Returns 0, or -1 with nothing left to stop.
 */
int periodic_start(struct periodic *p, int64_t interval_ms, periodic_fn run, void *ctx);

/* Whether periodic_stop() has been called: a run that goes on at once asks this first. */
int periodic_stopping(struct periodic *p);

/* Wakes the thread, waits for its current run to end, releases it.  Safe on a zeroed struct. */
void periodic_stop(struct periodic *p);

/* pthread_cond_init on the monotonic clock (for clock_deadline(CLOCK_MONOTONIC, ...)); 0 or -1. */
int cond_init_monotonic(pthread_cond_t *cv);

#endif /* IDEM_UTIL_PERIODIC_H */
