/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.h - a background worker: one thread that runs a bounded batch every interval until the
 * server stops.  Each run does at most a fixed amount of work (its batch) with every external call
 * under a timeout, so a run always ends and stopping never waits long.  A run that came back with
 * a full batch goes again at once (up to a few times), so a backlog drains without waiting out
 * the interval.  Every run is counted in /metrics (orderd_worker_*).
 */
#ifndef ORDERD_WORKER_H
#define ORDERD_WORKER_H

#include <stdint.h>

#include "metrics.h"
#include "periodic.h"

struct app;

/* One bounded run: *items says how much it did.  Returns 0, or a negative code (counted). */
typedef int (*worker_fn)(struct app *app, int *items);

struct worker {
    struct periodic periodic; /* the thread; unused while the worker is off */
    enum worker_id id;
    int full_batch; /* items at which a run is considered full (run again at once) */
    worker_fn fn;
    struct app *app;
};

/*
 * Starts worker `id` running `fn` every `interval_ms` (0: the worker is off, visible as such in
 * /metrics).  Returns 0 or -1.
 */
int worker_start(struct worker *w, struct app *app, enum worker_id id, int64_t interval_ms,
                 int full_batch, worker_fn fn);

/* Wakes the worker, waits for its current run to end.  Safe if never started. */
void worker_stop(struct worker *w);

#endif /* ORDERD_WORKER_H */
