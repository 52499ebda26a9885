/* SPDX-License-Identifier: Apache-2.0 */
/*
 * periodic.c - the loop of every periodic background thread (see periodic.h).
 */
#include "periodic.h"

#include <errno.h>
#include <string.h>

#include "clock.h"
#include "banned.h"

int cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    int rc;

    if (pthread_condattr_init(&attr) != 0)
        return -1;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 && pthread_cond_init(cv, &attr) == 0
             ? 0
             : -1;
    pthread_condattr_destroy(&attr);
    return rc;
}

/* Waits the interval or until stopped; returns whether to stop. */
static int pause_or_stop(struct periodic *p)
{
    struct timespec deadline = clock_deadline(CLOCK_MONOTONIC, p->interval_ms);
    int stop;

    pthread_mutex_lock(&p->mu);
    while (!p->stop)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &deadline) == ETIMEDOUT)
            break;
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    return stop;
}

static void *periodic_main(void *arg)
{
    struct periodic *p = arg;

    while (!pause_or_stop(p))
        p->run(p, p->ctx);
    return NULL;
}

int periodic_start(struct periodic *p, int64_t interval_ms, periodic_fn run, void *ctx)
{
    memset(p, 0, sizeof *p);
    p->interval_ms = interval_ms;
    p->run = run;
    p->ctx = ctx;
    if (interval_ms <= 0 || pthread_mutex_init(&p->mu, NULL) != 0)
        return -1;
    if (cond_init_monotonic(&p->cv) != 0) {
        pthread_mutex_destroy(&p->mu);
        return -1;
    }
    p->inited = 1;
    if (pthread_create(&p->thread, NULL, periodic_main, p) != 0) {
        periodic_stop(p);
        return -1;
    }
    p->running = 1;
    return 0;
}

int periodic_stopping(struct periodic *p)
{
    int stop;

    pthread_mutex_lock(&p->mu);
    stop = p->stop;
    pthread_mutex_unlock(&p->mu);
    return stop;
}

void periodic_stop(struct periodic *p)
{
    if (p->running) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
        p->running = 0;
    }
    if (p->inited) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        p->inited = 0;
    }
}
