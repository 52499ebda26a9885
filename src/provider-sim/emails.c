/* SPDX-License-Identifier: Apache-2.0 */
/*
 * emails.c - the mail service: POST /v1/emails sends (records) one email per Idempotency-Key.  A
 * sender that relays an outbox uses the outbox row's id as the key, so a relay that retries after
 * a lost answer sends nothing twice.  The ledger flags two emails of one template about one order
 * (metadata.orderId) even under different keys: that would be a duplicate the sender caused.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "handlers.h"
#include "resource.h"
#include "sim_util.h"
#include "jdoc.h"
#include "banned.h"

#define EMAIL_COLS "id, idem_key, recipient, subject, template, body_text, metadata, created_ms"
#define FIELD_MAX 998

static json_t *email_doc(const char *id, const char *key, const char *to, const char *subject,
                         const char *template_name, json_t *metadata, int64_t created_ms)
{
    return xcheck(json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:O, s:s, s:I}", "id", id, "object",
                            "email", "to", to, "subject", subject, "template", template_name,
                            "status", "sent", "metadata", metadata, "idempotency_key", key,
                            "created", (json_int_t)(created_ms / 1000)));
}

/* The email in row `r` of a result selected with EMAIL_COLS (new). */
static json_t *email_row(const struct idem_rows *rows, int r)
{
    json_t *meta = resource_metadata(idem_rows_get(rows, r, 6));
    json_t *doc = email_doc(idem_rows_get(rows, r, 0), idem_rows_get(rows, r, 1),
                            idem_rows_get(rows, r, 2), idem_rows_get(rows, r, 3),
                            idem_rows_get(rows, r, 4), meta, resource_int(rows, r, 7));

    json_decref(meta);
    return doc;
}

static int string_field(const json_t *body, const char *name, int required, char *detail,
                        size_t cap)
{
    const json_t *v = json_object_get(body, name);

    if (v == NULL && !required)
        return 0;
    if (!json_is_string(v) || (required && json_string_length(v) == 0) ||
        json_string_length(v) > FIELD_MAX) {
        snprintf(detail, cap, "%s must be a %sstring of at most %d bytes.", name,
                 required ? "non-empty " : "", FIELD_MAX);
        return -1;
    }
    return 0;
}

static int validate_email(const json_t *body, char *detail, size_t cap)
{
    const json_t *meta = json_object_get(body, "metadata");

    if (string_field(body, "to", 1, detail, cap) != 0 ||
        string_field(body, "subject", 1, detail, cap) != 0 ||
        string_field(body, "template", 1, detail, cap) != 0 ||
        string_field(body, "text", 0, detail, cap) != 0)
        return -1;
    if (strchr(json_string_value(json_object_get(body, "to")), '@') == NULL) {
        snprintf(detail, cap, "to must be an email address.");
        return -1;
    }
    if (meta != NULL && !json_is_object(meta)) {
        snprintf(detail, cap, "metadata must be an object.");
        return -1;
    }
    return 0;
}

static int exec_email(struct sim *sim, struct idem_call *call, enum idem_outcome outcome,
                      const json_t *body, const char *key, struct exec_result *out)
{
    const char *to = json_string_value(json_object_get(body, "to"));
    const char *subject = json_string_value(json_object_get(body, "subject"));
    const char *tmpl = json_string_value(json_object_get(body, "template"));
    const json_t *text_v = json_object_get(body, "text");
    const json_t *order = NULL;
    const char *params[9];
    json_t *meta = body_metadata(body);
    json_t *doc = NULL;
    char id[40], created_text[24], reference[320];
    char *meta_text = NULL;
    int64_t created;
    int rc = 0;

    (void)sim;
    if (outcome == IDEM_OUTCOME_RESUME)
        rc = idem_call_phase_begin(call);
    if (rc < 0)
        goto out;
    order = json_object_get(meta, "orderId");
    new_id("em_", id, sizeof id);
    created = clock_wall_ms();
    meta_text = jdoc_text(meta, NULL);
    snprintf(created_text, sizeof created_text, "%" PRId64, created);
    snprintf(reference, sizeof reference, "%.100s:%.200s", tmpl,
             json_is_string(order) ? json_string_value(order) : "");
    params[0] = id;
    params[1] = key;
    params[2] = to;
    params[3] = subject;
    params[4] = tmpl;
    params[5] = json_is_string(text_v) ? json_string_value(text_v) : "";
    params[6] = meta_text;
    params[7] = created_text;
    params[8] = json_is_string(order) ? reference : NULL;
    rc = idem_tx_exec(idem_call_tx(call),
                      "INSERT INTO emails (" EMAIL_COLS ", reference) VALUES ($1, $2, $3, $4, $5, "
                      "$6, $7, CAST($8 AS BIGINT), $9)",
                      9, params, NULL);
    if (rc < 0)
        goto out;
    doc = email_doc(id, key, to, subject, tmpl, meta, created);
    exec_json(out, 201, doc);
out:
    free(meta_text);
    json_decref(doc);
    json_decref(meta);
    return rc;
}

void emails_create(struct sim *sim, const struct request *rq, struct response *resp)
{
    idempotent_post(sim, rq, resp, &sim->op_emails, "/v1/emails", validate_email, exec_email);
}

const struct sim_resource emails_resource = {
    .path = "/v1/emails",
    .table = "emails",
    .cols = EMAIL_COLS,
    .row = email_row,
    .missing_code = "email-not-found",
    .create = emails_create,
};
