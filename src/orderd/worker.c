/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.c - what every orderd background worker does on its tick (see worker.h): runs that drain
 * a backlog, each counted in /metrics.  The thread and its pause are src/util/periodic.c's.
 */
#include "worker.h"

#include <string.h>

#include "app.h"
#include "log.h"
#include "metrics.h"
#include "banned.h"

#define FULL_RUNS_MAX 8

/*
 * One tick: for each cluster (the one store, or each of a shard set), a run, and up to
 * FULL_RUNS_MAX - 1 more at once while each comes back full.
 */
static void worker_tick(struct periodic *p, void *ctx)
{
    struct worker *w = ctx;
    int items, rc, runs;

    for (size_t v = 0; v < w->app->nviews && !periodic_stopping(p); v++) {
        struct app *view = &w->app->views[v];
        for (runs = 0; runs < FULL_RUNS_MAX; runs++) {
            items = 0;
            rc = w->fn(view, &items);
            metrics_worker_run(view->metrics, w->id, items > 0 ? (uint64_t)items : 0, rc < 0);
            if (rc < 0)
                log_msg(&view->log, "warn", "%s%s%s: run failed: %s", worker_name(w->id),
                        view->shard[0] ? " on " : "", view->shard, idem_strerror(rc));
            if (rc < 0 || items < w->full_batch || periodic_stopping(p))
                break;
        }
    }
}

int worker_start(struct worker *w, struct app *app, enum worker_id id, int64_t interval_ms,
                 int full_batch, worker_fn fn)
{
    memset(w, 0, sizeof *w);
    w->app = app;
    w->id = id;
    w->full_batch = full_batch > 0 ? full_batch : 1;
    w->fn = fn;
    metrics_worker_up(app->metrics, id, interval_ms > 0, interval_ms);
    if (interval_ms <= 0)
        return 0;
    if (periodic_start(&w->periodic, interval_ms, worker_tick, w) != 0) {
        metrics_worker_up(app->metrics, id, 0, interval_ms);
        return -1;
    }
    return 0;
}

void worker_stop(struct worker *w)
{
    periodic_stop(&w->periodic);
}
