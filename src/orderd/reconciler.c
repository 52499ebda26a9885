/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reconciler.c - settles unknown outcomes by asking the provider (see recovery.h).  An order or a
 * refund is flagged when a call about it got no answer; once its check time comes, the reconciler
 * takes the record of the request that met the unknown, looks the charge (refund) up by its
 * derived key, and settles from what the provider says.  When the record cannot be taken (it was
 * completed or swept), the business row alone is settled: a refund from the lookup, an order from
 * the lookup or, when the provider has no charge, a charge made now with the order's derived key
 * (checkout_settle_orphan), so such an order always reaches an end state.  Checks back off up to
 * a minute while the provider stays silent.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "cancel.h"
#include "checkout.h"
#include "db.h"
#include "log.h"
#include "metrics.h"
#include "payments.h"
#include "provider.h"
#include "recovery.h"
#include "util.h"
#include "banned.h"

static int settle_refund_row(struct app *app, const char *order_id, int *settled)
{
    struct provider_reply r;
    struct idem_tx *tx = NULL;
    char key[PAYMENT_KEY_MAX];
    const json_t *found, *id;
    int rc = 0;

    *settled = 0;
    payments_refund_key(order_id, key);
    provider_get_by_key(app->provider, "/v1/refunds", key, &r);
    metrics_provider(app->metrics, PCALL_LOOKUP, (int)r.outcome);
    found = r.outcome == PROVIDER_OK ? provider_first(&r) : NULL;
    id = json_object_get(found, "id");
    if (!json_is_string(id)) {
        rc = refunds_flag_unknown(app, order_id, NULL, NULL);
        goto out;
    }
    rc = idem_tx_begin(app->store, 1, &tx);
    if (rc == 0)
        rc = refunds_mark_done(app, tx, order_id, 1, json_string_value(id), NULL, settled);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
out:
    idem_tx_rollback(tx);
    provider_reply_clear(&r);
    return rc;
}

/* Reconciles one order or refund through its record, or its row alone. */
static int reconcile(struct app *app, int create, const char *order_id, const char *principal,
                     const char *key, int *settled)
{
    const struct idem_operation *op = create ? &app->op_orders_create : &app->op_orders_cancel;
    const char *want = create ? POINT_ORDER_CREATED : POINT_REFUND_REQUESTED;
    struct checkout_opts opts = {1, NULL};
    struct idem_call *call = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    int unknown = 0;
    int rc = 0;

    *settled = 0;
    if (principal != NULL && key != NULL)
        rc = idem_call_recover(app->engine, op, principal, key, &call, &outcome);
    if (rc < 0)
        goto out;
    if (outcome == IDEM_OUTCOME_IN_PROGRESS) {
        /* A retry or the completer is on it: look again later. */
        rc = create ? payments_flag_unknown(app, order_id)
                    : refunds_flag_unknown(app, order_id, principal, key);
        goto out;
    }
    if (outcome != IDEM_OUTCOME_RESUME) {
        rc = create ? checkout_settle_orphan(app, order_id, settled)
                    : settle_refund_row(app, order_id, settled);
        goto out;
    }
    if (strcmp(idem_call_recovery_point(call), want) != 0) {
        log_msg(&app->log, "error", "reconciler: %s %s/%s at unexpected point '%s'", op->name,
                principal, key, idem_call_recovery_point(call));
        rc = create ? payments_flag_unknown(app, order_id)
                    : refunds_flag_unknown(app, order_id, principal, key);
        goto out;
    }
    if (create)
        rc = checkout_settle(app, call, order_id, &opts, &unknown);
    else
        rc = cancel_refund_settle(app, call, order_id, principal, key, 1, &unknown);
    *settled = rc == 0 && !unknown;
out:
    if (*settled)
        log_msg(&app->log, "info", "reconciler: settled the %s of %s", create ? "charge" : "refund",
                order_id);
    if (rc < 0)
        log_msg(&app->log, "warn", "reconciler: %s of %s: %s", create ? "charge" : "refund",
                order_id, idem_err_name(rc));
    idem_call_end(call);
    return rc == IDEM_ELEASE ? 0 : rc;
}

int reconciler_run(struct app *app, int *items)
{
    struct idem_rows *orders = NULL, *refunds = NULL;
    const char *params[1];
    char now[24];
    int i, n, settled;
    int rc;

    *items = 0;
    if (app->provider == NULL)
        return 0;
    snprintf(now, sizeof now, "%" PRId64, clock_wall_ms());
    params[0] = now;
    rc = db_read(app, NULL,
                 "SELECT id, user_id, idem_key FROM orders WHERE status = 'pending_payment' "
                 "AND payment_check_ms IS NOT NULL AND payment_check_ms <= CAST($1 AS BIGINT) "
                 "ORDER BY payment_check_ms LIMIT 16",
                 1, params, &orders);
    if (rc == 0)
        rc = db_read(app, NULL,
                     "SELECT order_id, flag_principal, flag_key FROM refunds WHERE status = "
                     "'requested' AND check_ms IS NOT NULL AND check_ms <= CAST($1 AS BIGINT) "
                     "ORDER BY check_ms LIMIT 16",
                     1, params, &refunds);
    n = idem_rows_count(orders);
    for (i = 0; rc == 0 && i < n; i++) {
        rc = reconcile(app, 1, db_text(orders, i, 0), idem_rows_get(orders, i, 1),
                       idem_rows_get(orders, i, 2), &settled);
        *items += settled;
    }
    n = idem_rows_count(refunds);
    for (i = 0; rc == 0 && i < n; i++) {
        rc = reconcile(app, 0, db_text(refunds, i, 0), idem_rows_get(refunds, i, 1),
                       idem_rows_get(refunds, i, 2), &settled);
        *items += settled;
    }
    idem_rows_free(orders);
    idem_rows_free(refunds);
    return rc;
}
