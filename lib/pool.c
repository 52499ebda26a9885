/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.c - a store's bounded pool of connections, and its commit counters: what the generic store
 * (store.c) and a backend's own machinery share.
 *
 * The pool is bounded so a burst of requests queues for a connection instead of opening hundreds;
 * a request that cannot get one within the busy timeout gets IDEM_EUNAVAIL and its client a 503,
 * which is safe: nothing ran.
 *
 * Layer: below the backends and store.c.  It reaches a backend only through the store's table of
 * function pointers (conn_open, conn_ok, conn_close), so the PostgreSQL store may hand this pool
 * to its batcher (tx_batch.h) without calling up into the store that picked it.
 */
#include "internal.h"

#include <errno.h>
#include <stdatomic.h>

int idem__store_get(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    struct timespec deadline;
    int rc = 0;

    *out = NULL;
    deadline = idem__deadline_ms(st->opts.busy_timeout_ms);
    pthread_mutex_lock(&st->mu);
    while (st->nidle == 0 && st->nopen >= st->opts.pool_size) {
        if (pthread_cond_timedwait(&st->cv, &st->mu, &deadline) == ETIMEDOUT && st->nidle == 0 &&
            st->nopen >= st->opts.pool_size) {
            pthread_mutex_unlock(&st->mu);
            idem__fmt(err, errlen, "no store connection free within %d ms (pool of %d)",
                      st->opts.busy_timeout_ms, st->opts.pool_size);
            return IDEM_EUNAVAIL;
        }
    }
    if (st->nidle > 0) {
        *out = st->idle[--st->nidle];
        pthread_mutex_unlock(&st->mu);
        return 0;
    }
    st->nopen++;
    pthread_mutex_unlock(&st->mu);

    /* Opening may take a while (a network round trip for PostgreSQL): not under the lock. */
    rc = st->m->conn_open(st, out, err, errlen);
    if (rc < 0) {
        pthread_mutex_lock(&st->mu);
        st->nopen--;
        pthread_mutex_unlock(&st->mu);
        pthread_cond_signal(&st->cv);
        if (rc != IDEM_ENOMEM)
            rc = IDEM_EUNAVAIL;
    }
    return rc;
}

void idem__store_put(struct idem_store *st, struct idem_conn *c)
{
    if (!c)
        return;
    if (!st->cm->conn_ok(c)) {
        st->cm->conn_close(c);
        pthread_mutex_lock(&st->mu);
        st->nopen--;
    } else {
        pthread_mutex_lock(&st->mu);
        st->idle[st->nidle++] = c;
    }
    pthread_mutex_unlock(&st->mu);
    /* After the unlock: a waiter woken under the mutex would only block on it again. */
    pthread_cond_signal(&st->cv);
}

void idem__store_count_commit(struct idem_store *st, uint64_t ntx, int64_t t0)
{
    atomic_fetch_add(&st->write_commits, ntx);
    atomic_fetch_add(&st->durable_commits, 1);
    atomic_fetch_add(&st->durable_commit_ns, (uint64_t)(clock_mono_ns() - t0));
}
