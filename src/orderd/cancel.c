/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cancel.c - cancelling an order (see cancel.h).  An order whose payment is not settled yet
 * (pending_payment) cannot be cancelled: its charge may still land, and a cancel now would leave
 * money taken for nothing.  That refusal is transient, so it is not stored (409 with Retry-After);
 * every other answer is.  Without a provider, orders are "created" and cancel as they always did.
 */
#include "cancel.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "app.h"
#include "db.h"
#include "idemcall.h"
#include "metrics.h"
#include "order_doc.h"
#include "orders.h"
#include "payments.h"
#include "provider.h"
#include "response.h"
#include "router.h"
#include "stock.h"
#include "util.h"
#include "banned.h"

/* Ask (lookup by key) and/or refund; *ok = refunded, with *refund_id (new) or a refusal detail. */
static int refund(struct app *app, const char *order_id, const char *user,
                  const struct refund_row *rf, int ask_first, char **refund_id, char *detail,
                  size_t cap)
{
    struct provider_reply r;
    char key[PAYMENT_KEY_MAX];
    const json_t *found, *id;
    json_t *body = NULL;
    int verdict = -1; /* -1 unknown, 0 refused, 1 refunded */

    *refund_id = NULL;
    memset(&r, 0, sizeof r);
    payments_refund_key(order_id, key);
    if (ask_first) {
        provider_get_by_key(app->provider, "/v1/refunds", key, &r);
        metrics_provider(app->metrics, PCALL_LOOKUP, (int)r.outcome);
        if (r.outcome != PROVIDER_OK)
            goto out;
        found = provider_first(&r);
        if (found != NULL) {
            id = json_object_get(found, "id");
            *refund_id = xstrdup(json_is_string(id) ? json_string_value(id) : "");
            verdict = 1;
            goto out;
        }
        provider_reply_clear(&r);
    }
    /* The user routes the refund's webhook to the user's cluster on a shard set. */
    body =
        xcheck(json_pack("{s:s, s:I, s:{s:s, s:s}}", "charge", rf->charge_id, "amount",
                         (json_int_t)rf->amount, "metadata", "orderId", order_id, "userId", user));
    provider_post(app->provider, "/v1/refunds", key, body, &r);
    metrics_provider(app->metrics, PCALL_REFUND, (int)r.outcome);
    if (r.outcome == PROVIDER_OK) {
        id = json_object_get(r.doc, "id");
        *refund_id = xstrdup(json_is_string(id) ? json_string_value(id) : "");
        verdict = 1;
    } else if (r.outcome == PROVIDER_REFUSED) {
        snprintf(detail, cap, "%s", r.detail);
        verdict = 0;
    }
out:
    if (verdict < 0)
        log_msg(&app->log, "warn", "orders.cancel: refund %s: outcome unknown: %s", key, r.detail);
    json_decref(body);
    provider_reply_clear(&r);
    return verdict;
}

int cancel_refund_settle(struct app *app, struct idem_call *call, const char *order_id,
                         const char *principal, const char *key, int ask_first, int *unknown)
{
    struct refund_row rf;
    char detail[256] = "";
    char *refund_id = NULL;
    int verdict = -1;
    int rc;

    *unknown = 0;
    rc = refunds_load(app, NULL, order_id, &rf);
    if (rc < 0)
        goto out;
    if (!rf.found || strcmp(rf.status, "requested") != 0) {
        rc = order_complete_call(app, call, order_id, 0);
        goto out;
    }
    if (app->provider != NULL)
        verdict =
            refund(app, order_id, principal, &rf, ask_first, &refund_id, detail, sizeof detail);
    else
        log_msg(&app->log, "warn", "orders.cancel: refund of %s waits for a --provider", order_id);
    if (verdict < 0) {
        rc = refunds_flag_unknown(app, order_id, principal, key);
        *unknown = rc == 0;
        goto out;
    }
    if (verdict == 0)
        log_msg(&app->log, "error", "orders.cancel: the provider refused the refund of %s: %s",
                order_id, detail);
    rc = idem_call_phase_begin(call);
    if (rc == 0)
        rc = refunds_mark_done(app, idem_call_tx(call), order_id, verdict, refund_id,
                               verdict ? NULL : detail, NULL);
    if (rc == 0)
        rc = order_complete_call(app, call, order_id, 0);
out:
    free(refund_id);
    return rc;
}

/* Phase 1 in the open phase; may advance to "refund_requested" (*order_id set) or complete. */
static int cancel_begin(const struct call_ctx *cx, struct idem_call *call, struct response *resp,
                        int *go_refund)
{
    struct app *app = cx->app;
    struct idem_tx *tx = idem_call_tx(call);
    struct idem_rows *rows = NULL;
    struct order_pay o;
    const char *params[2] = {cx->params[0], cx->principal};
    char detail[320];
    int rc;

    *go_refund = 0;
    rc = db_exec(app, tx, "SELECT id, idem_key FROM orders WHERE id = $1 AND user_id = $2", 2,
                 params, &rows);
    if (rc < 0)
        goto out;
    if (idem_rows_count(rows) == 0) {
        rc = idemcall_complete_problem(call, 404, "order-not-found",
                                       "You have no order with this id.");
        goto out;
    }
    rc = payments_load(app, tx, cx->params[0], &o);
    if (rc < 0)
        goto out;
    if (app->shards != NULL && (strcmp(o.status, "created") == 0 || strcmp(o.status, "paid") == 0 ||
                                strcmp(o.status, "cancelled") == 0)) {
        /*
         * A shard set: the stock goes back on the catalogue first, once whatever retries follow
         * (the reservation is marked released with it), then the order is cancelled here.
         */
        rc = stock_release(app, cx->principal, app->op_orders_create.name, db_text(rows, 0, 1),
                           NULL);
        if (rc < 0)
            goto out;
    }
    if (strcmp(o.status, "created") == 0) {
        rc = db_exec(app, tx, "UPDATE orders SET status = 'cancelled' WHERE id = $1", 1, params,
                     NULL);
        if (rc == 0)
            rc = order_complete_call(app, call, o.id, 0);
    } else if (strcmp(o.status, "paid") == 0) {
        rc = refunds_request(app, tx, &o);
        if (rc == 0)
            rc = idem_call_advance(call, POINT_REFUND_REQUESTED, o.id);
        *go_refund = rc == 0;
    } else if (strcmp(o.status, "cancelled") == 0 && strcmp(o.refund_status, "requested") == 0) {
        /* An earlier cancel's refund is still open: drive it too, with the same derived key. */
        rc = idem_call_advance(call, POINT_REFUND_REQUESTED, o.id);
        *go_refund = rc == 0;
    } else if (strcmp(o.status, "cancelled") == 0) {
        rc = order_complete_call(app, call, o.id, 0);
    } else if (strcmp(o.status, "pending_payment") == 0) {
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 409, "order-payment-pending",
                         "The order's payment is still being settled; it can be cancelled once "
                         "it is paid. Retry after the seconds in Retry-After.");
        rc = IDEMCALL_ANSWERED;
    } else {
        snprintf(detail, sizeof detail, "The order is %s and cannot be cancelled.", o.status);
        rc = idemcall_complete_problem(call, 409, "order-not-cancellable", detail);
    }
out:
    idem_rows_free(rows);
    return rc;
}

static int cancel_run(const struct call_ctx *cx, struct idem_call *call, enum idem_outcome outcome,
                      void *arg, struct response *resp)
{
    const char *point = outcome == IDEM_OUTCOME_RESUME ? idem_call_recovery_point(call) : "";
    char *order_id = NULL;
    int go_refund = 0, unknown = 0;
    int rc = 0;

    (void)arg;
    if (point[0] == '\0') {
        if (outcome == IDEM_OUTCOME_RESUME)
            rc = idem_call_phase_begin(call);
        if (rc == 0)
            rc = cancel_begin(cx, call, resp, &go_refund);
        if (rc != 0 || !go_refund)
            goto out;
        order_id = xstrdup(cx->params[0]);
    } else if (strcmp(point, POINT_REFUND_REQUESTED) == 0 &&
               idem_call_recovery_data(call) != NULL) {
        order_id = xstrdup(idem_call_recovery_data(call));
    } else {
        log_msg(&cx->app->log, "error", "orders.cancel: unknown recovery point '%s'", point);
        rc = IDEM_ESTATE;
        goto out;
    }
    rc = cancel_refund_settle(cx->app, call, order_id, cx->principal, cx->key, 0, &unknown);
    if (rc == 0 && unknown)
        rc = idemcall_outcome_unknown(resp, "The order is cancelled; the provider did not confirm "
                                            "its refund. Nothing was stored: retry with the same "
                                            "Idempotency-Key, the refund is made once.");
out:
    free(order_id);
    return rc;
}

void orders_cancel(const struct call_ctx *cx, struct response *resp)
{
    idemcall_handle(cx, &cx->app->op_orders_cancel, cancel_run, NULL, resp);
}
