/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tx_batch.h - the PostgreSQL store's batcher (tx_batch.c): whole transactions of callers that
 * do not wait, several to one database transaction, on runner threads of its own.  What it runs
 * on is handed to it when it is made, so it calls nothing above it: store_pg.c gives it the
 * store's pool, a unit test a backend of its own.
 */
#ifndef IDEM_TX_BATCH_H
#define IDEM_TX_BATCH_H

#include "internal.h"

#include <stdint.h>

/*
 * What a batcher's jobs run on, all borrowed until idem__batcher_close(): the backend's functions
 * (begin, commit, rollback, errmsg, conn_ok; whole_tx and batch_tx by its version), where a runner
 * gets a connection for a batch and gives it back, and whom it tells what each COMMIT made durable.
 */
struct idem__batch_source {
    const struct idem_conn_methods *cm;
    /* Lends a connection, waiting a bounded time; else a negative code, the reason in `err`. */
    int (*get)(void *ctx, struct idem_conn **out, char *err, size_t errlen);
    /* Takes the connection back (a broken one, `cm->conn_ok` false, is to be closed). */
    void (*put)(void *ctx, struct idem_conn *c);
    /* `ntx` jobs made durable by one COMMIT on `c` that began at clock_mono_ns() `t0` (counting
     * those whose claim that COMMIT answered: the backend knows which of them wrote nothing). */
    void (*committed)(void *ctx, struct idem_conn *c, uint64_t ntx, int64_t t0);
    void *ctx;
};

struct idem__batcher;

/*
 * A batcher over `src` (copied; what it points to is borrowed) in *out (new,
 * idem__batcher_close).  Its runner threads start with the first job.  0, or IDEM_ENOMEM.
 */
int idem__batcher_open(const struct idem__batch_source *src, struct idem__batcher **out);
/*
 * write_run_async on a batcher: the job joins the queue of its runner threads, each of which runs
 * what was queued as one transaction and tells each job once that transaction committed (or each
 * job alone, should one of them fail).  A negative return: nothing was queued, `done` is not
 * called (the reason is in `err`), as for every job given once idem__batcher_close() began.
 */
int idem__batch_run_async(struct idem__batcher *b, struct idem__job_slot *slot, idem__tx_fn fn,
                          void *arg, unsigned flags, idem__commit_done done, void *done_arg,
                          char *err, size_t errlen);
/*
 * Stops the runners once every job queued was run and told, then frees the batcher.  NULL is a
 * no-op.  The source must still work meanwhile (the store's pool is closed after this).
 */
void idem__batcher_close(struct idem__batcher *b);

#endif
