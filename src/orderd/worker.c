/*
 * worker.c - the loop every background worker shares (see worker.h).  The pause is a condition
 * variable on the monotonic clock, so a stop wakes the worker at once and a clock step does not.
 */
#include "worker.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "app.h"
#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "banned.h"

#define FULL_RUNS_MAX 8

/* Waits `ms` or until stopped; returns whether the worker should stop. */
static int wait_or_stop(struct worker *w, int64_t ms)
{
    struct timespec deadline;
    int stop;

    deadline = clock_deadline(CLOCK_MONOTONIC, ms);
    pthread_mutex_lock(&w->mu);
    while (!w->stop)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &deadline) == ETIMEDOUT)
            break;
    stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return stop;
}

static void *worker_loop(void *arg)
{
    struct worker *w = arg;
    int items, rc, runs;

    while (!wait_or_stop(w, w->interval_ms)) {
        for (runs = 0; runs < FULL_RUNS_MAX; runs++) {
            items = 0;
            rc = w->fn(w->app, &items);
            metrics_worker_run(w->app->metrics, w->id, items > 0 ? (uint64_t)items : 0, rc < 0);
            if (rc < 0)
                log_msg(&w->app->log, "warn", "%s: run failed: %s", worker_name(w->id),
                        idem_strerror(rc));
            if (rc < 0 || items < w->full_batch || wait_or_stop(w, 0))
                break;
        }
    }
    return NULL;
}

int worker_start(struct worker *w, struct app *app, enum worker_id id, int64_t interval_ms,
                 int full_batch, worker_fn fn)
{
    pthread_condattr_t attr;

    memset(w, 0, sizeof *w);
    w->app = app;
    w->id = id;
    w->interval_ms = interval_ms;
    w->full_batch = full_batch > 0 ? full_batch : 1;
    w->fn = fn;
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        return -1;
    if (pthread_condattr_init(&attr) != 0) {
        pthread_mutex_destroy(&w->mu);
        return -1;
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (pthread_cond_init(&w->cv, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        pthread_mutex_destroy(&w->mu);
        return -1;
    }
    pthread_condattr_destroy(&attr);
    w->inited = 1;
    metrics_worker_up(app->metrics, id, interval_ms > 0, interval_ms);
    if (interval_ms <= 0)
        return 0;
    if (pthread_create(&w->thread, NULL, worker_loop, w) != 0) {
        metrics_worker_up(app->metrics, id, 0, interval_ms);
        return -1;
    }
    w->running = 1;
    return 0;
}

void worker_stop(struct worker *w)
{
    if (w->running) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        w->running = 0;
    }
    if (w->inited) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        w->inited = 0;
    }
}
