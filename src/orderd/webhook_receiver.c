/* SPDX-License-Identifier: Apache-2.0 */
/*
 * webhook_receiver.c - the provider's webhooks (see webhook_receiver.h).  The signature is checked
 * on the raw bytes before the body is even parsed (signature.c, in constant time), so a forger
 * learns nothing from how long a refusal took.  An event only moves an order along transitions that
 * are conditional on its current state (payments.h), and only for the charge or refund whose
 * Idempotency-Key is the one orderd derived for that order: an event about anything else is
 * recorded and ignored.
 */
#include "webhook_receiver.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "app.h"
#include "db.h"
#include "intake.h"
#include "idemcall.h"
#include "metrics.h"
#include "payments.h"
#include "response.h"
#include "router.h"
#include "signature.h"
#include "util.h"
#include "jdoc.h"
#include "banned.h"

#define EVENT_ID_MAX 128

/* Returns NULL when the request is authentic, else why not (a static sentence). */
static const char *verify(const struct app *app, const struct request *rq)
{
    if (app->cfg->webhook_secret == NULL)
        return "orderd has no --webhook-secret, so no webhook can be verified";
    if (request_header_count(rq, WEBHOOK_SIGNATURE_HEADER, NULL, NULL) != 1)
        return "send one Provider-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>";
    return webhook_signature_check(
        app->cfg->webhook_secret, request_header(rq, WEBHOOK_SIGNATURE_HEADER), rq->body,
        rq->body_len, clock_wall_ms() / 1000, app->cfg->webhook_tolerance_s);
}

static const char *string_at(const json_t *obj, const char *a, const char *b)
{
    const json_t *v = json_object_get(obj, a);

    if (b != NULL)
        v = json_object_get(v, b);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* charge.succeeded: the order of this charge is paid, if it still waited for it. */
static int apply_charge(const struct app *app, struct idem_tx *tx, const json_t *charge,
                        int *applied)
{
    const char *order_id = string_at(charge, "metadata", "orderId");
    const char *key = string_at(charge, "idempotency_key", NULL);
    const char *charge_id = string_at(charge, "id", NULL);
    const char *status = string_at(charge, "status", NULL);
    char want[PAYMENT_KEY_MAX];
    struct order_pay o;
    int rc;

    *applied = 0;
    if (order_id == NULL || key == NULL || charge_id == NULL || status == NULL ||
        strcmp(status, "succeeded") != 0)
        return 0;
    payments_charge_key(order_id, want);
    if (strcmp(key, want) != 0)
        return 0;
    rc = payments_load(app, tx, order_id, &o);
    if (rc == 0 && o.found)
        rc = payments_mark_paid(app, tx, &o, charge_id, applied);
    return rc;
}

/* refund.succeeded: the refund of this order is done, if it was still requested. */
static int apply_refund(const struct app *app, struct idem_tx *tx, const json_t *refund,
                        int *applied)
{
    const char *order_id = string_at(refund, "metadata", "orderId");
    const char *key = string_at(refund, "idempotency_key", NULL);
    const char *refund_id = string_at(refund, "id", NULL);
    char want[PAYMENT_KEY_MAX];

    *applied = 0;
    if (order_id == NULL || key == NULL || refund_id == NULL)
        return 0;
    payments_refund_key(order_id, want);
    if (strcmp(key, want) != 0)
        return 0;
    return refunds_mark_done(app, tx, order_id, 1, refund_id, NULL, applied);
}

static void answer(struct response *resp, const char *event_id, int duplicate, const char *result)
{
    json_t *doc = xcheck(json_pack("{s:b, s:s, s:b, s:s}", "received", 1, "eventId", event_id,
                                   "duplicate", duplicate, "result", result));

    response_json(resp, 200, doc);
    json_decref(doc);
}

void webhooks_provider(const struct call_ctx *cx, struct response *resp)
{
    struct app *app = cx->app;
    const struct request *rq = cx->rq;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[4];
    const char *why, *event_id, *type, *user;
    const json_t *object;
    char now[ISO8601_LEN + 1];
    json_error_t jerr;
    json_t *event = NULL;
    enum webhook_result result = WEBHOOK_IGNORED;
    int applied = 0;
    int rc;

    resp->outcome = "none";
    why = verify(app, rq);
    if (why != NULL) {
        metrics_webhook(app->metrics, WEBHOOK_REJECTED);
        log_msg(&app->log, "warn", "webhook refused: %s", why);
        response_problem(resp, 401, "webhook-signature-invalid", why);
        resp->outcome = "rejected";
        goto out;
    }
    event = rq->body_len ? jdoc_load(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    event_id = string_at(event, "id", NULL);
    type = string_at(event, "type", NULL);
    object = json_object_get(json_object_get(event, "data"), "object");
    if (event_id == NULL || type == NULL || strlen(event_id) > EVENT_ID_MAX ||
        !json_is_object(object)) {
        metrics_webhook(app->metrics, WEBHOOK_REJECTED);
        response_problem(resp, 400, "webhook-invalid",
                         "The event must be {\"id\": string, \"type\": string, \"data\": "
                         "{\"object\": {...}}}.");
        resp->outcome = "rejected";
        goto out;
    }

    /*
     * On a shard set the event goes to the cluster of the user orderd named in the charge's or
     * refund's metadata (its inbox dedupes there); one without a user is recorded on the first.
     */
    user = string_at(object, "metadata", "userId");
    if (app->shards != NULL && user != NULL) {
        rc = app_route(app, user, 1, &app);
        if (rc != 0)
            goto fail;
    }
    iso8601_ms(clock_wall_ms(), now);
    params[0] = event_id;
    params[1] = type;
    params[2] = now;
    params[3] = user;
    rc = app->shards != NULL && user != NULL ? app_tx_begin(app, user, 1, &tx)
                                             : idem_tx_begin(app->store, 1, &tx);
    if (rc == 0)
        rc = db_exec(app, tx,
                     "INSERT INTO inbox (event_id, type, result, received_at, user_id) VALUES "
                     "($1, $2, 'received', $3, $4) ON CONFLICT (event_id) DO NOTHING",
                     4, params, &rows);
    if (rc < 0)
        goto fail;
    if (idem_rows_changed(rows) == 0) {
        /* Seen before (maybe at this very moment by another delivery): nothing to do again. */
        rc = idem_tx_commit(tx);
        tx = NULL;
        if (rc < 0)
            goto fail;
        metrics_webhook(app->metrics, WEBHOOK_DUPLICATE);
        answer(resp, event_id, 1, "duplicate");
        goto out;
    }
    if (strcmp(type, "charge.succeeded") == 0)
        rc = apply_charge(app, tx, object, &applied);
    else if (strcmp(type, "refund.succeeded") == 0)
        rc = apply_refund(app, tx, object, &applied);
    if (rc < 0)
        goto fail;
    result = applied ? WEBHOOK_APPLIED : WEBHOOK_IGNORED;
    params[1] = applied ? "applied" : "ignored";
    rc = db_exec(app, tx, "UPDATE inbox SET result = $2 WHERE event_id = $1", 2, params, NULL);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
    if (rc < 0)
        goto fail;
    metrics_webhook(app->metrics, result);
    log_msg(&app->log, "info", "webhook %s %s: %s", type, event_id, params[1]);
    answer(resp, event_id, 0, params[1]);
    goto out;
fail:
    /* Nothing committed: the provider retries, and the retry is not a duplicate. */
    keyed_answer_fail(resp, rc);
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    json_decref(event);
}
