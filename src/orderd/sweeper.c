/*
 * sweeper.c - retention.  Records are kept for their operation's published window (24 h) and
 * then deleted here, in batches of SWEEP_BATCH so one sweep never holds the store's write lock
 * for long; a full batch means more are due, so the next batch follows at once, up to
 * SWEEP_BATCHES_MAX per run so that a run stays bounded.
 */
#include "sweeper.h"

#include "idem/idem.h"

#include "app.h"
#include "log.h"
#include "banned.h"

#define SWEEP_BATCHES_MAX 20

int sweeper_run(struct app *app, int *items)
{
    long total = 0;
    int deleted, batches;
    int rc = 0;

    for (batches = 0; batches < SWEEP_BATCHES_MAX; batches++) {
        deleted = 0;
        rc = idem_engine_sweep(app->engine, SWEEP_BATCH, &deleted);
        if (rc < 0)
            break;
        total += deleted;
        if (deleted < SWEEP_BATCH)
            break;
    }
    if (total > 0)
        log_msg(&app->log, "info", "retention sweep deleted %ld expired records", total);
    *items = (int)total;
    return rc;
}
