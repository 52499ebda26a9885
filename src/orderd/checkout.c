/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checkout.c - the payment phases of orders.create (see checkout.h):
 *
 *   phase 1 (orders.c):  claim + order row (pending_payment) + stock  -> "order_created"
 *   between phases:      POST /v1/charges, Idempotency-Key "order-<id>-charge"
 *   phase 2:             paid + payment row + confirmation email (outbox) + 201 stored, or
 *                        payment_failed + stock released + 402 stored
 *
 * An unknown answer stores nothing: the record stays at "order_created" and the order is flagged
 * for the reconciler.  Calling the provider again with the same key is always safe, so every path
 * that resumes the record simply does it again (the reconciler asks first).  The order's state,
 * not the path, decides the answer: an order a webhook already marked paid is completed without
 * calling anyone.
 */
#include "checkout.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "app.h"
#include "intake.h"
#include "idemcall.h"
#include "log.h"
#include "metrics.h"
#include "order_doc.h"
#include "payments.h"
#include "provider.h"
#include "router.h"
#include "util.h"
#include "banned.h"

enum verdict { VERDICT_PAID, VERDICT_DECLINED, VERDICT_UNKNOWN };

static int complete_declined(struct idem_call *call, const char *order_id)
{
    json_t *ext = xcheck(json_pack("{s:s}", "orderId", order_id));
    int rc = 0;

    if (idem_call_tx(call) == NULL)
        rc = idem_call_phase_begin(call);
    if (rc == 0)
        rc = idemcall_complete_problem_ext(
            call, 402, "payment-declined",
            "The payment was declined. The order was not placed and its stock was released.", ext);
    json_decref(ext);
    return rc;
}

/* What a charge object says. */
static enum verdict charge_verdict(const json_t *charge)
{
    const json_t *st = json_object_get(charge, "status");
    const char *s = json_is_string(st) ? json_string_value(st) : "";

    if (strcmp(s, "succeeded") == 0)
        return VERDICT_PAID;
    if (strcmp(s, "failed") == 0)
        return VERDICT_DECLINED;
    return VERDICT_UNKNOWN;
}

/* The test hook X-Test-Crash: after-charge: the provider charged, orderd never commits it. */
static void after_charge(const struct app *app, const struct checkout_opts *opts)
{
    const char *crash;

    if (opts->cx == NULL || !app->cfg->test_hooks)
        return;
    crash = request_header(opts->cx->rq, "X-Test-Crash");
    if (crash != NULL && strcmp(crash, "after-charge") == 0) {
        log_msg(&app->log, "warn", "test hook: exiting with 137 after the charge");
        exit_at_once(137);
    }
}

/* Asks the provider (lookup by key, then the charge itself); *charge (new) holds its object. */
static enum verdict charge(struct app *app, const struct order_pay *o,
                           const struct checkout_opts *opts, json_t **charge_out)
{
    struct provider_reply r;
    char key[PAYMENT_KEY_MAX], desc[128];
    const json_t *found;
    json_t *body = NULL;
    enum verdict v = VERDICT_UNKNOWN;

    *charge_out = NULL;
    memset(&r, 0, sizeof r);
    payments_charge_key(o->id, key);
    if (opts->ask_first) {
        provider_get_by_key(app->provider, "/v1/charges", key, &r);
        metrics_provider(app->metrics, PCALL_LOOKUP, (int)r.outcome);
        if (r.outcome != PROVIDER_OK) {
            log_msg(&app->log, "warn", "orders.create: lookup of %s failed: %s", key, r.detail);
            goto out;
        }
        found = provider_first(&r);
        if (found != NULL) {
            *charge_out = json_incref((json_t *)found);
            v = charge_verdict(found);
            goto out;
        }
        /* Never reached the provider: charging now with the same key is the roll forward. */
        provider_reply_clear(&r);
    }
    snprintf(desc, sizeof desc, "Order %s", o->id);
    body =
        xcheck(json_pack("{s:I, s:s, s:s, s:s, s:{s:s, s:s}}", "amount", (json_int_t)o->amount,
                         "currency", o->currency, "source", o->source[0] ? o->source : "tok_ok",
                         "description", desc, "metadata", "orderId", o->id, "userId", o->user_id));
    provider_post(app->provider, "/v1/charges", key, body, &r);
    metrics_provider(app->metrics, PCALL_CHARGE, (int)r.outcome);
    if (r.outcome == PROVIDER_OK) {
        after_charge(app, opts);
        *charge_out = json_incref(r.doc);
        v = charge_verdict(r.doc);
    } else if (r.outcome == PROVIDER_REFUSED && r.status == 402) {
        after_charge(app, opts);
        v = VERDICT_DECLINED;
    } else {
        /* A refusal other than a decline is our bug or the provider's; never guess it away. */
        log_msg(&app->log, r.outcome == PROVIDER_REFUSED ? "error" : "warn",
                "orders.create: charge %s: outcome unknown: %s", key, r.detail);
    }
out:
    json_decref(body);
    provider_reply_clear(&r);
    return v;
}

/*
 * Marks the order paid (with the charge `ch`) or declined by verdict `v`, in `tx`: read again
 * under the write lock first, since another path may have settled it meanwhile.
 */
static int mark_settled(struct app *app, struct idem_tx *tx, const char *order_id, enum verdict v,
                        const json_t *ch, int *settled)
{
    struct order_pay o;
    const json_t *cid;
    int rc = payments_load(app, tx, order_id, &o);

    if (rc < 0 || !o.found)
        return rc;
    if (v == VERDICT_PAID) {
        cid = json_object_get(ch, "id");
        return payments_mark_paid(app, tx, &o, json_is_string(cid) ? json_string_value(cid) : "",
                                  settled);
    }
    return payments_mark_declined(app, tx, &o, settled);
}

int checkout_settle(struct app *app, struct idem_call *call, const char *order_id,
                    const struct checkout_opts *opts, int *unknown)
{
    struct order_pay o;
    json_t *ch = NULL;
    enum verdict v;
    int rc;

    *unknown = 0;
    rc = payments_load(app, NULL, order_id, &o);
    if (rc < 0)
        goto out;
    if (!o.found) {
        log_msg(&app->log, "error", "orders.create: order %s of the record is missing", order_id);
        rc = IDEM_ESTATE;
        goto out;
    }
    if (strcmp(o.status, "payment_failed") == 0) {
        rc = complete_declined(call, order_id);
        goto out;
    }
    if (strcmp(o.status, "pending_payment") != 0) {
        /* No payment involved ("created"), or settled already by another path. */
        rc = order_complete_call(app, call, order_id, 1);
        goto out;
    }
    if (app->provider == NULL) {
        log_msg(&app->log, "warn",
                "orders.create: order %s awaits payment but no --provider "
                "is configured",
                order_id);
        v = VERDICT_UNKNOWN;
    } else {
        v = charge(app, &o, opts, &ch);
    }
    if (v == VERDICT_UNKNOWN) {
        rc = payments_flag_unknown(app, order_id);
        *unknown = rc == 0;
        goto out;
    }
    rc = idem_call_phase_begin(call);
    if (rc == 0)
        rc = mark_settled(app, idem_call_tx(call), order_id, v, ch, NULL);
    if (rc < 0)
        goto out;
    rc = payments_load(app, idem_call_tx(call), order_id, &o);
    if (rc < 0)
        goto out;
    if (strcmp(o.status, "payment_failed") == 0)
        rc = complete_declined(call, order_id);
    else
        rc = order_complete_call(app, call, order_id, 1);
out:
    json_decref(ch);
    return rc;
}

int checkout_settle_orphan(struct app *app, const char *order_id, int *settled)
{
    const struct checkout_opts opts = {1, NULL}; /* a charge may exist: ask first */
    struct idem_tx *tx = NULL;
    struct order_pay o;
    json_t *ch = NULL;
    enum verdict v;
    int rc;

    *settled = 0;
    rc = payments_load(app, NULL, order_id, &o);
    if (rc < 0 || !o.found || strcmp(o.status, "pending_payment") != 0) {
        *settled = rc == 0; /* gone, or settled by another path meanwhile */
        goto out;
    }
    v = charge(app, &o, &opts, &ch);
    if (v == VERDICT_UNKNOWN) {
        metrics_orphan_payment(app->metrics, ORPHAN_UNKNOWN);
        rc = payments_flag_unknown(app, order_id);
        goto out;
    }
    rc = idem_tx_begin(app->store, 1, &tx);
    if (rc == 0)
        rc = mark_settled(app, tx, order_id, v, ch, settled);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
    if (rc == 0)
        metrics_orphan_payment(app->metrics, v == VERDICT_PAID ? ORPHAN_PAID : ORPHAN_DECLINED);
out:
    idem_tx_rollback(tx);
    json_decref(ch);
    return rc;
}
