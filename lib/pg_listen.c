/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pg_listen.c - waking waiting duplicates across processes with LISTEN/NOTIFY.
 *
 * A duplicate whose scope another process executes waits for that record to change.  Polling
 * alone would cost a read per pause; instead one listener connection and thread per store LISTEN
 * on a channel, and every commit that completes or releases a record is followed by a
 * notification whose payload is the hash of its scope (store_pg.c, pg_commit).  The listener
 * counts notifications per bucket of scope hashes and wakes the waiters of that bucket; when its
 * connection drops it reconnects with growing pauses, and meanwhile waits say they cannot wait,
 * so the engine polls.  A lost notification costs a waiter only its next poll.
 *
 * Layer: above pg_conn.c, below store_pg.c, whose wait_change this file is and whose close stops
 * the listener (store_pg.h lists the layers).
 */
#include "store_pg.h"
#include "clock.h" /* common/clock.h: clock_deadline for the listener's monotonic condvar */

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* FNV-1a over the scope: the notification payload, and the wait bucket. */
uint64_t idem__pg_scope_hash(const struct idem_scope *s)
{
    const char *parts[3] = {s->principal, s->operation, s->key};
    uint64_t h = 1469598103934665603ULL;

    for (int i = 0; i < 3; i++) {
        for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++) {
            h ^= *p;
            h *= 1099511628211ULL;
        }
        h ^= 0xff; /* a separator no text contains */
        h *= 1099511628211ULL;
    }
    return h;
}

static int listener_stopping(struct pg_shared *sh)
{
    int stop;
    pthread_mutex_lock(&sh->mu);
    stop = sh->stop;
    pthread_mutex_unlock(&sh->mu);
    return stop;
}

/* Sleeps `ms`, or less if the store is closing. */
static void listener_pause(struct pg_shared *sh, int ms)
{
    struct pollfd p = {.fd = sh->wake[0], .events = POLLIN};
    if (poll(&p, 1, ms) < 0 && errno != EINTR)
        clock_sleep_ms(ms);
}

/* Waits until `fd` is ready for `events`, the store closes, or `deadline` (monotonic ms). */
static int listener_wait_fd(struct pg_shared *sh, int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = sh->wake[0], .events = POLLIN}};
        int64_t left = deadline - clock_mono_ms();
        int n;

        if (left <= 0)
            return -1;
        n = poll(p, 2, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || p[1].revents)
            return -1;
        if (n > 0)
            return 0;
    }
}

/* Connects without blocking the store's close, and LISTENs. NULL on failure. */
static PGconn *listener_connect(struct pg_shared *sh)
{
    PGconn *pg = PQconnectStartParams(sh->keys, sh->vals, 1);
    int64_t deadline = clock_mono_ms() + 1000 * (int64_t)atoi(CONNECT_TIMEOUT_S);
    PostgresPollingStatusType ps = PGRES_POLLING_WRITING;
    PGresult *res = NULL;

    if (!pg || PQstatus(pg) == CONNECTION_BAD)
        goto fail;
    while (ps != PGRES_POLLING_OK) {
        if (ps == PGRES_POLLING_FAILED)
            goto fail;
        if (listener_wait_fd(sh, PQsocket(pg), ps == PGRES_POLLING_READING ? POLLIN : POLLOUT,
                             deadline) < 0)
            goto fail;
        ps = PQconnectPoll(pg);
    }
    PQsetNoticeProcessor(pg, idem__pg_notice_ignore, NULL);
    res = PQexec(pg, "LISTEN " NOTIFY_CHANNEL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK)
        goto fail;
    PQclear(res);
    return pg;
fail:
    PQclear(res);
    PQfinish(pg);
    return NULL;
}

/* Wakes waiters whose scope was notified; the payload is the scope hash in hex. */
static void listener_drain(struct pg_shared *sh, PGconn *pg)
{
    PGnotify *nt;
    int any = 0;

    pthread_mutex_lock(&sh->mu);
    while ((nt = PQnotifies(pg)) != NULL) {
        char *end = NULL;
        unsigned long long h = strtoull(nt->extra, &end, 16);
        if (end && end != nt->extra && *end == '\0')
            sh->bucket[h % WAIT_BUCKETS]++;
        else
            sh->epoch++; /* not ours to parse: wake everyone, a spurious wake costs one read */
        PQfreemem(nt);
        any = 1;
    }
    if (any)
        pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

static void listener_set(struct pg_shared *sh, int listening)
{
    pthread_mutex_lock(&sh->mu);
    sh->listening = listening;
    /* Waiters re-read: a change may have slipped by while nobody was listening. */
    sh->epoch++;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
}

/*
 * The listener thread: one connection per store that LISTENs on the channel and turns each
 * notification into a wake-up.  When the connection drops it reconnects with growing pauses;
 * meanwhile waits report that they cannot wait and the engine polls.
 */
static void *listener_main(void *arg)
{
    struct pg_shared *sh = arg;
    int backoff = 50;

    while (!listener_stopping(sh)) {
        PGconn *pg = listener_connect(sh);
        if (pg) {
            listener_set(sh, 1);
            backoff = 50;
            for (;;) {
                struct pollfd p[2] = {{.fd = PQsocket(pg), .events = POLLIN},
                                      {.fd = sh->wake[0], .events = POLLIN}};
                int n = poll(p, 2, -1);
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 || p[1].revents)
                    break;
                if (!PQconsumeInput(pg))
                    break; /* the connection is gone */
                listener_drain(sh, pg);
            }
            PQfinish(pg);
            listener_set(sh, 0);
        }
        if (listener_stopping(sh))
            break;
        listener_pause(sh, backoff);
        backoff = backoff * 2 > LISTEN_BACKOFF_MAX_MS ? LISTEN_BACKOFF_MAX_MS : backoff * 2;
    }
    return NULL;
}

/*
 * Blocks until a notification for the scope's bucket arrives, the listener (re)connects or
 * drops, or `timeout_ms` passes.  The first wait of a store starts its listener; until that
 * listens, IDEM_EUNAVAIL tells the engine to poll.
 */
int idem__pg_wait_change(struct idem_store *st, const struct idem_scope *s, int64_t timeout_ms)
{
    struct pg_shared *sh = st->backend;
    size_t b;
    uint64_t seen, epoch;
    struct timespec ts;

    if (!sh || sh->wake[0] < 0)
        return IDEM_EINVAL;
    b = (size_t)(idem__pg_scope_hash(s) % WAIT_BUCKETS);
    pthread_mutex_lock(&sh->mu);
    if (!sh->started && !sh->stop) {
        if (pthread_create(&sh->thread, NULL, listener_main, sh) == 0)
            sh->started = 1;
    }
    if (!sh->listening || sh->stop) {
        pthread_mutex_unlock(&sh->mu);
        return IDEM_EUNAVAIL;
    }
    seen = sh->bucket[b];
    epoch = sh->epoch;
    ts = clock_deadline(CLOCK_MONOTONIC, timeout_ms); /* sh->cv waits on CLOCK_MONOTONIC */
    while (sh->bucket[b] == seen && sh->epoch == epoch && !sh->stop)
        if (pthread_cond_timedwait(&sh->cv, &sh->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&sh->mu);
    return 0;
}

void idem__pg_listener_stop(struct pg_shared *sh)
{
    pthread_mutex_lock(&sh->mu);
    sh->stop = 1;
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    if (sh->started) {
        ssize_t w;
        do
            w = write(sh->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(sh->thread, NULL);
    }
}
