/*
 * sweeper.c - retention.  Records are kept for their operation's published window (24 h) and
 * then deleted here, in batches of SWEEP_BATCH so one sweep never holds the store's write lock
 * for long; a full batch means more are due, so the next batch follows at once.  The wait
 * between sweeps is a condition variable on the monotonic clock, so stopping the server does
 * not wait out an interval.
 */
#include "sweeper.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "idem/idem.h"

#include "log.h"
#include "banned.h"

#define SWEEP_BATCH 500

/* Waits `seconds` or until stopped; returns whether the sweeper should stop. */
static int wait_or_stop(struct sweeper *sw, int seconds)
{
    struct timespec deadline;
    int stop;

    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += seconds;
    pthread_mutex_lock(&sw->mu);
    while (!sw->stop) {
        if (pthread_cond_timedwait(&sw->cv, &sw->mu, &deadline) == ETIMEDOUT)
            break;
    }
    stop = sw->stop;
    pthread_mutex_unlock(&sw->mu);
    return stop;
}

static int stopping(struct sweeper *sw)
{
    int stop;

    pthread_mutex_lock(&sw->mu);
    stop = sw->stop;
    pthread_mutex_unlock(&sw->mu);
    return stop;
}

static void *sweep_loop(void *arg)
{
    struct sweeper *sw = arg;
    long total;
    int deleted;
    int rc;

    while (!wait_or_stop(sw, sw->interval_s)) {
        total = 0;
        do {
            deleted = 0;
            rc = idem_engine_sweep(sw->engine, SWEEP_BATCH, &deleted);
            if (rc < 0) {
                log_msg(sw->log, "warn", "retention sweep failed: %s", idem_strerror(rc));
                break;
            }
            total += deleted;
        } while (deleted >= SWEEP_BATCH && !stopping(sw));
        if (total > 0)
            log_msg(sw->log, "info", "retention sweep deleted %ld expired records", total);
    }
    return NULL;
}

int sweeper_start(struct sweeper *sw, struct idem_engine *engine, int interval_s,
                  const struct logger *log)
{
    pthread_condattr_t attr;
    int rc = -1;

    memset(sw, 0, sizeof *sw);
    sw->engine = engine;
    sw->interval_s = interval_s;
    sw->log = log;
    if (pthread_mutex_init(&sw->mu, NULL) != 0)
        goto out;
    if (pthread_condattr_init(&attr) != 0)
        goto out;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (pthread_cond_init(&sw->cv, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        pthread_mutex_destroy(&sw->mu);
        goto out;
    }
    pthread_condattr_destroy(&attr);
    sw->inited = 1;
    rc = 0;
    if (interval_s <= 0)
        goto out;
    if (pthread_create(&sw->thread, NULL, sweep_loop, sw) != 0) {
        rc = -1;
        goto out;
    }
    sw->running = 1;
out:
    return rc;
}

void sweeper_stop(struct sweeper *sw)
{
    if (sw->running) {
        pthread_mutex_lock(&sw->mu);
        sw->stop = 1;
        pthread_cond_signal(&sw->cv);
        pthread_mutex_unlock(&sw->mu);
        pthread_join(sw->thread, NULL);
        sw->running = 0;
    }
    if (sw->inited) {
        pthread_cond_destroy(&sw->cv);
        pthread_mutex_destroy(&sw->mu);
        sw->inited = 0;
    }
}
