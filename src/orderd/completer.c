/* SPDX-License-Identifier: Apache-2.0 */
/*
 * completer.c - finishes stalled records (see recovery.h).  The library lists records whose lease
 * expired (idem_engine_stalled) and hands one over without the request's fingerprint
 * (idem_call_recover); the recovery point and its data (the order id; on a shard set, before the
 * order, what the order is made of) say what is left to do.
 * The scan looks further than one batch, so records the reconciler owns cannot starve the rest.
 */
#include <stdio.h>
#include <string.h>

#include "idem/idem.h"

#include "app.h"
#include "cancel.h"
#include "checkout.h"
#include "db.h"
#include "log.h"
#include "orders.h"
#include "recovery.h"
#include "banned.h"

#define STALLED_SCAN 256

/*
 * Whether the reconciler owns this record (its outcome was unknown and it has not settled it).
 * With the reconciler off, nothing is left to it: the completer takes every stalled record.
 */
static int flagged(const struct app *app, int create, const char *principal, const char *key)
{
    struct idem_rows *rows = NULL;
    const char *params[2] = {principal, key};
    int yes = 0;

    if (app->provider == NULL || app->cfg->reconciler_interval_ms <= 0)
        return 0;
    if (db_read(app, NULL,
                create ? "SELECT 1 FROM orders WHERE user_id = $1 AND idem_key = $2 AND "
                         "payment_check_ms IS NOT NULL"
                       : "SELECT 1 FROM refunds WHERE flag_principal = $1 AND flag_key = $2 AND "
                         "status = 'requested' AND check_ms IS NOT NULL",
                2, params, &rows) == 0)
        yes = idem_rows_count(rows) > 0;
    idem_rows_free(rows);
    return yes;
}

/*
 * Takes one stalled record over and runs what is left of it; *settled when it completed,
 * *passed when it is not the completer's to go on with (nothing done).
 */
static int resume(struct app *app, const struct idem_operation *op, int create,
                  const struct idem_stalled *s, int *settled, int *passed)
{
    struct checkout_opts opts = {0, NULL};
    struct idem_call *call = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    const char *point, *data;
    char from[64]; /* the point it resumed at: advancing the call frees `point` */
    int unknown = 0;
    int rc;

    *settled = 0;
    *passed = 0;
    rc = idem_call_recover(app->engine, op, s->principal, s->key, &call, &outcome);
    if (rc < 0 || outcome != IDEM_OUTCOME_RESUME)
        goto out;
    point = idem_call_recovery_point(call);
    data = idem_call_recovery_data(call);
    snprintf(from, sizeof from, "%s", point);
    if (create &&
        (strcmp(point, POINT_STOCK_RESERVED) == 0 || strcmp(point, POINT_STOCK_RESERVING) == 0)) {
        rc = orders_create_from_reserved(app, call, s->principal, s->key, &unknown, passed);
    } else if (create && strcmp(point, POINT_ORDER_CREATED) == 0 && data != NULL) {
        rc = checkout_settle(app, call, data, &opts, &unknown);
    } else if (!create && strcmp(point, POINT_REFUND_REQUESTED) == 0 && data != NULL) {
        rc = cancel_refund_settle(app, call, data, s->principal, s->key, 0, &unknown);
    } else {
        log_msg(&app->log, "error", "completer: %s record %s/%s at unknown point '%s'", op->name,
                s->principal, s->key, point);
        goto out;
    }
    if (rc == 0 && !unknown && !*passed) {
        *settled = 1;
        log_msg(&app->log, "info", "completer: finished %s %s/%s from '%s'", op->name, s->principal,
                s->key, from);
    }
out:
    if (rc < 0)
        log_msg(&app->log, rc == IDEM_ELEASE ? "info" : "warn", "completer: %s %s/%s: %s: %s",
                op->name, s->principal, s->key, idem_err_name(rc),
                call ? idem_call_errmsg(call) : "");
    idem_call_end(call); /* an unfinished call is aborted: its lease is released */
    return rc == IDEM_ELEASE ? 0 : rc;
}

int completer_run(struct app *app, int *items)
{
    const struct idem_operation *ops[2] = {&app->op_orders_create, &app->op_orders_cancel};
    struct idem_stalled *list = NULL;
    size_t n = 0, i;
    int done = 0, settled, passed, k;
    int rc = 0;

    *items = 0;
    for (k = 0; k < 2 && rc == 0 && done < RECOVERY_BATCH; k++) {
        rc = idem_engine_stalled(app->engine, ops[k]->name, STALLED_SCAN, &list, &n);
        for (i = 0; rc == 0 && i < n && done < RECOVERY_BATCH; i++) {
            if (flagged(app, k == 0, list[i].principal, list[i].key))
                continue;
            rc = resume(app, ops[k], k == 0, &list[i], &settled, &passed);
            /* A record passed by (its retry's) leaves room for one to finish. */
            done += !passed;
            *items += settled;
        }
        idem_stalled_free(list, n);
        list = NULL;
        n = 0;
    }
    return rc;
}
