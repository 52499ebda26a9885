/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sweeper.c - retention.  Three kinds of rows end here, each in batches of SWEEP_BATCH so one
 * sweep never holds the store's write lock for long (a full batch means more are due, so the next
 * batch follows at once, up to SWEEP_BATCHES_MAX per kind and run, so that a run stays bounded):
 *
 *   - idempotency records, after their operation's published window (24 h), by libidem;
 *   - outbox messages that were sent, --outbox-retention-s after they were sent (pending and
 *     parked ones stay: they are work, or an operator's decision);
 *   - webhook inbox entries, --inbox-retention-s after they were received.  The inbox is the
 *     dedupe of provider events, so its retention must outlast the provider's redeliveries
 *     (docs/orderd.md); the counts /metrics shows are kept apart and do not drop (schema.c).
 *
 * The order rows stay for good: they are the long-term dedupe of a late retry (schema.c).
 */
#include "sweeper.h"

#include <inttypes.h>
#include <stdio.h>

#include "idem/idem.h"

#include "app.h"
#include "db.h"
#include "log.h"
#include "util.h"
#include "banned.h"

#define SWEEP_BATCHES_MAX 20

/* One kind of row the sweeper deletes in batches. */
struct sweep {
    const char *sql; /* NULL: libidem's records (idem_engine_sweep) */
    int nparams;     /* the first of: the cutoff as ISO-8601, the batch size, the cutoff in ms */
};

static const struct sweep sweep_records = {NULL, 0};
/*
 * Sent messages, oldest first.  A message is sent at or after its next_attempt_ms, so the bound on
 * next_attempt_ms (the outbox_due index) only narrows what sent_at then decides.
 */
static const struct sweep sweep_outbox = {
    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE status = 'sent' AND"
    " next_attempt_ms < CAST($3 AS BIGINT) AND sent_at < $1 ORDER BY next_attempt_ms"
    " LIMIT CAST($2 AS INTEGER))",
    3};
/* Inbox entries, oldest first (the inbox_received index). */
static const struct sweep sweep_inbox = {
    "DELETE FROM inbox WHERE event_id IN (SELECT event_id FROM inbox WHERE received_at < $1"
    " ORDER BY received_at LIMIT CAST($2 AS INTEGER))",
    2};

/* One batch of `kind` with its cutoff `retention_s` ago; *deleted = rows gone.  0 or IDEM_E*. */
static int sweep_batch(struct app *app, const struct sweep *kind, int64_t retention_s, int *deleted)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    int64_t cutoff = clock_wall_ms() - retention_s * 1000;
    char cutoff_iso[ISO8601_LEN + 1], limit[16], cutoff_ms[24];
    const char *params[3] = {cutoff_iso, limit, cutoff_ms};
    int rc;

    *deleted = 0;
    if (kind->sql == NULL)
        return idem_engine_sweep(app->engine, SWEEP_BATCH, deleted);
    iso8601_ms(cutoff, cutoff_iso);
    snprintf(limit, sizeof limit, "%d", SWEEP_BATCH);
    snprintf(cutoff_ms, sizeof cutoff_ms, "%" PRId64, cutoff);
    rc = idem_tx_begin(app->store, 1, &tx);
    if (rc == 0)
        rc = db_exec(app, tx, kind->sql, kind->nparams, params, &rows);
    if (rc == 0) {
        *deleted = (int)idem_rows_changed(rows);
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

/* Batches of one kind until one comes back short; *total += rows gone.  0 or IDEM_E*. */
static int sweep_kind(struct app *app, const struct sweep *kind, int64_t retention_s, long *total)
{
    int deleted, batches, rc = 0;

    for (batches = 0; batches < SWEEP_BATCHES_MAX; batches++) {
        rc = sweep_batch(app, kind, retention_s, &deleted);
        if (rc < 0)
            break;
        *total += deleted;
        if (deleted < SWEEP_BATCH)
            break;
    }
    return rc;
}

int sweeper_run(struct app *app, int *items)
{
    const struct orderd_config *cfg = app->cfg;
    long records = 0, messages = 0, events = 0;
    int rc, r;

    /* One kind failing does not keep the others from their turn; the first failure is reported. */
    rc = sweep_kind(app, &sweep_records, 0, &records);
    if (cfg->outbox_retention_s > 0 &&
        (r = sweep_kind(app, &sweep_outbox, cfg->outbox_retention_s, &messages)) < 0 && rc == 0)
        rc = r;
    if (cfg->inbox_retention_s > 0 &&
        (r = sweep_kind(app, &sweep_inbox, cfg->inbox_retention_s, &events)) < 0 && rc == 0)
        rc = r;
    if (records + messages + events > 0)
        log_msg(&app->log, "info",
                "retention sweep deleted %ld expired records, %ld sent messages, %ld inbox events",
                records, messages, events);
    *items = (int)(records + messages + events);
    return rc;
}
