/* SPDX-License-Identifier: Apache-2.0 */
/*
 * charges.c - money: charges and refunds.  A charge's source decides its fate (tok_ok succeeds,
 * tok_declined is declined with 402, tok_slow succeeds after slow_ms); a refund gives back at most
 * what its charge took.  Each effect commits with its Idempotency-Key's stored response and its
 * webhook event in one transaction.  Lookups by key (GET /v1/charges?idempotency_key=K) are what a
 * client's reconciler asks when it never heard the answer to its POST.
 *
 * tok_slow is two phases on purpose: the claim commits first ("accepted"), the charge only after
 * the pause, so a duplicate that arrives meanwhile finds the key in progress (409), as it would at
 * a real provider, and the store's write lock is not held while the charge "thinks".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "handlers.h"
#include "resource.h"
#include "sim_util.h"
#include "webhook_sender.h"
#include "jdoc.h"
#include "banned.h"

#define AMOUNT_MAX 100000000000LL
#define CHARGE_COLS                                                                                \
    "id, idem_key, amount, currency, source, status, failure_code, description, metadata, "        \
    "created_ms"
#define REFUND_COLS "id, idem_key, charge_id, amount, currency, metadata, created_ms"

/* ---- shared ------------------------------------------------------------------------------- */

static json_t *text_or_null(const char *s)
{
    return s ? xcheck(json_string(s)) : json_null();
}

static json_t *charge_doc(const char *id, const char *key, int64_t amount, const char *currency,
                          const char *source, const char *status, const char *failure_code,
                          const char *description, json_t *metadata, int64_t created_ms)
{
    json_t *doc = xcheck(json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:s, s:o, s:o, s:O, s:s, s:I}", "id", id, "object", "charge",
        "amount", (json_int_t)amount, "currency", currency, "source", source, "status", status,
        "failure_code", text_or_null(failure_code), "description", text_or_null(description),
        "metadata", metadata, "idempotency_key", key, "created", (json_int_t)(created_ms / 1000)));

    return doc;
}

/* The charge in row `r` of a result selected with CHARGE_COLS (new). */
static json_t *charge_row(const struct idem_rows *rows, int r)
{
    json_t *meta = resource_metadata(idem_rows_get(rows, r, 8));
    json_t *doc = charge_doc(
        idem_rows_get(rows, r, 0), idem_rows_get(rows, r, 1), resource_int(rows, r, 2),
        idem_rows_get(rows, r, 3), idem_rows_get(rows, r, 4), idem_rows_get(rows, r, 5),
        idem_rows_get(rows, r, 6), idem_rows_get(rows, r, 7), meta, resource_int(rows, r, 9));

    json_decref(meta);
    return doc;
}

static json_t *refund_doc(const char *id, const char *key, const char *charge, int64_t amount,
                          const char *currency, json_t *metadata, int64_t created_ms)
{
    return xcheck(json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:O, s:s, s:I}", "id", id, "object",
                            "refund", "charge", charge, "amount", (json_int_t)amount, "currency",
                            currency, "status", "succeeded", "metadata", metadata,
                            "idempotency_key", key, "created", (json_int_t)(created_ms / 1000)));
}

static json_t *refund_row(const struct idem_rows *rows, int r)
{
    json_t *meta = resource_metadata(idem_rows_get(rows, r, 5));
    json_t *doc = refund_doc(idem_rows_get(rows, r, 0), idem_rows_get(rows, r, 1),
                             idem_rows_get(rows, r, 2), resource_int(rows, r, 3),
                             idem_rows_get(rows, r, 4), meta, resource_int(rows, r, 6));

    json_decref(meta);
    return doc;
}

static const char *reference_of(const json_t *metadata)
{
    const json_t *r = json_object_get(metadata, "reference");

    if (!json_is_string(r))
        r = json_object_get(metadata, "orderId");
    return json_is_string(r) ? json_string_value(r) : NULL;
}

/* ---- charges ------------------------------------------------------------------------------- */

static int validate_charge(const json_t *body, char *detail, size_t cap)
{
    const json_t *source = json_object_get(body, "source");
    const json_t *currency = json_object_get(body, "currency");
    const json_t *meta = json_object_get(body, "metadata");
    const json_t *desc = json_object_get(body, "description");
    int64_t amount = 0;
    const char *s;

    if (json_whole(json_object_get(body, "amount"), 1, AMOUNT_MAX, &amount) != 0) {
        snprintf(detail, cap, "amount must be a positive integer (minor units).");
        return -1;
    }
    if (!json_is_string(currency) || json_string_length(currency) != 3) {
        snprintf(detail, cap, "currency must be a three-letter code such as \"EUR\".");
        return -1;
    }
    s = json_is_string(source) ? json_string_value(source) : "";
    if (strcmp(s, "tok_ok") != 0 && strcmp(s, "tok_declined") != 0 && strcmp(s, "tok_slow") != 0) {
        snprintf(detail, cap, "source must be \"tok_ok\", \"tok_declined\" or \"tok_slow\".");
        return -1;
    }
    if (meta != NULL && !json_is_object(meta)) {
        snprintf(detail, cap, "metadata must be an object.");
        return -1;
    }
    if (desc != NULL && !json_is_string(desc)) {
        snprintf(detail, cap, "description must be a string.");
        return -1;
    }
    return 0;
}

static int exec_charge(struct sim *sim, struct idem_call *call, enum idem_outcome outcome,
                       const json_t *body, const char *key, struct exec_result *out)
{
    struct fault_settings fs;
    const char *source = json_string_value(json_object_get(body, "source"));
    const char *currency = json_string_value(json_object_get(body, "currency"));
    const json_t *desc_v = json_object_get(body, "description");
    const char *desc = json_is_string(desc_v) ? json_string_value(desc_v) : NULL;
    const char *point = idem_call_recovery_point(call);
    int declined = strcmp(source, "tok_declined") == 0;
    const char *status = declined ? "failed" : "succeeded";
    const char *params[11];
    json_t *meta = body_metadata(body);
    json_t *doc = NULL, *extra = NULL;
    char id[40], amount_text[24], created_text[24];
    char *meta_text = NULL;
    int64_t amount = 0, created;
    int rc = 0;

    json_whole(json_object_get(body, "amount"), 1, AMOUNT_MAX, &amount);
    if (strcmp(source, "tok_slow") == 0 && point[0] == '\0') {
        if (outcome == IDEM_OUTCOME_RESUME)
            rc = idem_call_phase_begin(call);
        if (rc == 0)
            rc = idem_call_advance(call, "accepted", NULL);
        if (rc < 0)
            goto out;
        faults_get(&sim->faults, &fs);
        clock_sleep_ms(fs.slow_ms);
    }
    if (idem_call_tx(call) == NULL) {
        rc = idem_call_phase_begin(call);
        if (rc < 0)
            goto out;
    }
    new_id("ch_", id, sizeof id);
    created = clock_wall_ms();
    meta_text = jdoc_text(meta, NULL);
    snprintf(amount_text, sizeof amount_text, "%" PRId64, amount);
    snprintf(created_text, sizeof created_text, "%" PRId64, created);
    params[0] = id;
    params[1] = key;
    params[2] = amount_text;
    params[3] = currency;
    params[4] = source;
    params[5] = status;
    params[6] = declined ? "card_declined" : NULL;
    params[7] = desc;
    params[8] = meta_text;
    params[9] = reference_of(meta);
    params[10] = created_text;
    rc = idem_tx_exec(idem_call_tx(call),
                      "INSERT INTO charges (" CHARGE_COLS ", reference) VALUES ($1, $2, CAST($3 AS "
                      "BIGINT), $4, $5, $6, $7, $8, $9, CAST($11 AS BIGINT), $10)",
                      11, params, NULL);
    if (rc < 0)
        goto out;
    doc = charge_doc(id, key, amount, currency, source, status, params[6], desc, meta, created);
    if (declined) {
        atomic_fetch_add(&sim->counters.declined, 1);
        extra = xcheck(json_pack("{s:O}", "charge", doc));
        exec_problem(out, 402, "card-declined", "The card was declined.", extra);
        goto out;
    }
    rc = webhooks_enqueue(sim, idem_call_tx(call), "charge.succeeded", doc);
    if (rc < 0)
        goto out;
    exec_json(out, 201, doc);
out:
    free(meta_text);
    json_decref(extra);
    json_decref(doc);
    json_decref(meta);
    return rc;
}

void charges_create(struct sim *sim, const struct request *rq, struct response *resp)
{
    idempotent_post(sim, rq, resp, &sim->op_charges, "/v1/charges", validate_charge, exec_charge);
}

const struct sim_resource charges_resource = {
    .path = "/v1/charges",
    .table = "charges",
    .cols = CHARGE_COLS,
    .row = charge_row,
    .missing_code = "charge-not-found",
    .create = charges_create,
};

/* ---- refunds ------------------------------------------------------------------------------- */

static int validate_refund(const json_t *body, char *detail, size_t cap)
{
    const json_t *charge = json_object_get(body, "charge");
    const json_t *amount = json_object_get(body, "amount");
    const json_t *meta = json_object_get(body, "metadata");
    int64_t n = 0;

    if (!json_is_string(charge) || json_string_length(charge) == 0) {
        snprintf(detail, cap, "charge must be the id of a charge.");
        return -1;
    }
    if (amount != NULL && json_whole(amount, 1, AMOUNT_MAX, &n) != 0) {
        snprintf(detail, cap, "amount, if given, must be a positive integer.");
        return -1;
    }
    if (meta != NULL && !json_is_object(meta)) {
        snprintf(detail, cap, "metadata must be an object.");
        return -1;
    }
    return 0;
}

static int exec_refund(struct sim *sim, struct idem_call *call, enum idem_outcome outcome,
                       const json_t *body, const char *key, struct exec_result *out)
{
    const char *charge = json_string_value(json_object_get(body, "charge"));
    struct idem_rows *rows = NULL;
    const char *params[7];
    json_t *meta = body_metadata(body);
    json_t *doc = NULL;
    char id[40], amount_text[24], created_text[24], detail[200];
    char currency[8];
    char *meta_text = NULL;
    int64_t amount = 0, charged, refunded, created;
    int rc = 0;

    if (outcome == IDEM_OUTCOME_RESUME)
        rc = idem_call_phase_begin(call);
    if (rc < 0)
        goto out;
    params[0] = charge;
    rc = idem_tx_exec(idem_call_tx(call),
                      "SELECT c.amount, c.currency, c.status, (SELECT COALESCE(SUM(r.amount), 0) "
                      "FROM refunds r WHERE r.charge_id = c.id) FROM charges c WHERE c.id = $1",
                      1, params, &rows);
    if (rc < 0)
        goto out;
    if (idem_rows_count(rows) == 0) {
        exec_problem(out, 404, "charge-not-found", "There is no charge with this id.", NULL);
        goto out;
    }
    if (strcmp(idem_rows_get(rows, 0, 2), "succeeded") != 0) {
        exec_problem(out, 409, "charge-not-refundable", "Only a succeeded charge is refunded.",
                     NULL);
        goto out;
    }
    charged = resource_int(rows, 0, 0);
    refunded = resource_int(rows, 0, 3);
    snprintf(currency, sizeof currency, "%s", idem_rows_get(rows, 0, 1));
    amount = charged - refunded;
    json_whole(json_object_get(body, "amount"), 1, AMOUNT_MAX, &amount);
    if (amount <= 0 || refunded + amount > charged) {
        snprintf(detail, sizeof detail,
                 "The charge took %" PRId64 " and %" PRId64 " was refunded already.", charged,
                 refunded);
        exec_problem(out, 409, "charge-already-refunded", detail, NULL);
        goto out;
    }
    new_id("re_", id, sizeof id);
    created = clock_wall_ms();
    meta_text = jdoc_text(meta, NULL);
    snprintf(amount_text, sizeof amount_text, "%" PRId64, amount);
    snprintf(created_text, sizeof created_text, "%" PRId64, created);
    params[0] = id;
    params[1] = key;
    params[2] = charge;
    params[3] = amount_text;
    params[4] = currency;
    params[5] = meta_text;
    params[6] = created_text;
    rc = idem_tx_exec(idem_call_tx(call),
                      "INSERT INTO refunds (" REFUND_COLS ") VALUES ($1, $2, $3, CAST($4 AS "
                      "BIGINT), $5, $6, CAST($7 AS BIGINT))",
                      7, params, NULL);
    if (rc < 0)
        goto out;
    doc = refund_doc(id, key, charge, amount, currency, meta, created);
    rc = webhooks_enqueue(sim, idem_call_tx(call), "refund.succeeded", doc);
    if (rc < 0)
        goto out;
    exec_json(out, 201, doc);
out:
    free(meta_text);
    json_decref(doc);
    json_decref(meta);
    idem_rows_free(rows);
    return rc;
}

void refunds_create(struct sim *sim, const struct request *rq, struct response *resp)
{
    idempotent_post(sim, rq, resp, &sim->op_refunds, "/v1/refunds", validate_refund, exec_refund);
}

const struct sim_resource refunds_resource = {
    .path = "/v1/refunds",
    .table = "refunds",
    .cols = REFUND_COLS,
    .row = refund_row,
    .missing_code = "not-found",
    .filter_param = "charge",
    .filter_column = "charge_id",
    .create = refunds_create,
};
