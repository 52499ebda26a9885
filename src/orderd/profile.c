/* SPDX-License-Identifier: Apache-2.0 */
/*
 * profile.c - PUT /api/me/profile.  Set semantics make the operation naturally idempotent: the
 * same body twice leaves the same state.  What a key adds is the same *answer*: "changed" is
 * true only for the request that changed something, and a retry of that request must still say
 * true (it is replayed), where a fresh identical PUT says false.  Without a key the update runs
 * in a plain write transaction.  A change queues a "profile changed" email in the outbox (to the
 * old address too when the email changed), in the transaction of the change: no change, no
 * email; a replay sends nothing again.
 */
#include "profile.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "db.h"
#include "idemcall.h"
#include "outbox.h"
#include "response.h"
#include "router.h"
#include "util.h"
#include "banned.h"

#define NAME_MAX_CHARS 200
#define EMAIL_MIN_CHARS 3
#define EMAIL_MAX_CHARS 254

struct profile_input {
    const char *name;
    const char *email;
};

/* The "profile changed" email to `to`, in the transaction of the change. */
static int queue_email(const struct app *app, struct idem_tx *tx, const char *user, const char *to)
{
    json_t *email = xcheck(
        json_pack("{s:s, s:s, s:s, s:s, s:{s:s}}", "to", to, "subject", "Your profile was changed",
                  "template", "profile_changed", "text",
                  "Your name and email address were updated. If this was not you, contact us.",
                  "metadata", "userId", user));
    int rc = outbox_enqueue(app, tx, user, NULL, email);

    json_decref(email);
    return rc;
}

/*
 * Upserts the profile in `tx` and builds the answer.  The change is decided by the write itself,
 * not by a read before it: the row is locked first (PostgreSQL runs READ COMMITTED, where two
 * concurrent PUTs would otherwise both read the old row), and the upsert only updates a row that
 * differs -- the ON CONFLICT arm waits for a concurrent insert and sees its row -- so of two
 * identical PUTs exactly one says "changed" and queues the email.  The email goes to the new
 * address and, when the address changed, to the old one too: a stolen token that changes the
 * email must not silence the real owner.
 */
static int profile_apply(const struct app *app, struct idem_tx *tx, const char *user,
                         const struct profile_input *in, json_t **doc)
{
    struct idem_rows *rows = NULL;
    const char *params[4];
    struct idem_rows *upserted = NULL;
    char now[ISO8601_LEN + 1];
    char updated[ISO8601_LEN + 1];
    int changed = 1;
    int rc;

    *doc = NULL;
    params[0] = user;
    /*
     * A no-op write takes the row's lock and returns the row as it stands once the lock is ours
     * (on SQLite, whose writer is alone anyway, it only reads it): one round trip.
     */
    rc = db_exec(app, tx,
                 "UPDATE profiles SET updated_at = updated_at WHERE user_id = $1"
                 " RETURNING name, email, updated_at",
                 1, params, &rows);
    if (rc < 0)
        goto out;
    iso8601_ms(clock_wall_ms(), now);
    params[1] = in->name;
    params[2] = in->email;
    params[3] = now;
    rc = db_exec(app, tx,
                 "INSERT INTO profiles (user_id, name, email, updated_at) VALUES ($1, $2, $3, $4)"
                 " ON CONFLICT (user_id) DO UPDATE SET name = excluded.name,"
                 " email = excluded.email, updated_at = excluded.updated_at"
                 " WHERE profiles.name <> excluded.name OR profiles.email <> excluded.email",
                 4, params, &upserted);
    if (rc < 0)
        goto out;
    changed = idem_rows_changed(upserted) == 1;
    if (changed) {
        snprintf(updated, sizeof updated, "%s", now);
        rc = queue_email(app, tx, user, in->email);
        /* The row read under the lock holds the old address. */
        if (rc == 0 && idem_rows_count(rows) > 0 && strcmp(db_text(rows, 0, 1), in->email) != 0)
            rc = queue_email(app, tx, user, db_text(rows, 0, 1));
        if (rc < 0)
            goto out;
    } else if (idem_rows_count(rows) > 0) {
        /* Unchanged: the row read under the lock is the stored one. */
        snprintf(updated, sizeof updated, "%s", db_text(rows, 0, 2));
    } else {
        /* Unchanged, yet there was no row: a concurrent PUT inserted it; read its time. */
        idem_rows_free(rows);
        rows = NULL;
        rc = db_exec(app, tx, "SELECT updated_at FROM profiles WHERE user_id = $1", 1, params,
                     &rows);
        if (rc < 0)
            goto out;
        snprintf(updated, sizeof updated, "%s",
                 idem_rows_count(rows) > 0 ? db_text(rows, 0, 0) : now);
    }
    *doc = xcheck(json_pack("{s:s, s:s, s:b, s:s}", "name", in->name, "email", in->email, "changed",
                            changed, "updatedAt", updated));
out:
    idem_rows_free(upserted);
    idem_rows_free(rows);
    return rc;
}

static int profile_run(const struct call_ctx *cx, struct idem_call *call, enum idem_outcome outcome,
                       void *arg, struct response *resp)
{
    const struct profile_input *in = arg;
    json_t *doc = NULL;
    int rc = 0;

    (void)resp;
    if (outcome == IDEM_OUTCOME_RESUME) {
        rc = idem_call_phase_begin(call);
        if (rc < 0)
            goto out;
    }
    rc = profile_apply(cx->app, idem_call_tx(call), cx->principal, in, &doc);
    if (rc < 0)
        goto out;
    rc = idemcall_complete_json(call, 200, doc, NULL);
out:
    json_decref(doc);
    return rc;
}

static void profile_without_key(const struct call_ctx *cx, const struct profile_input *in,
                                struct response *resp)
{
    struct idem_tx *tx = NULL;
    json_t *doc = NULL;
    int rc;

    rc = app_tx_begin(cx->app, cx->principal, 1, &tx);
    if (rc < 0)
        goto out;
    rc = profile_apply(cx->app, tx, cx->principal, in, &doc);
    if (rc < 0)
        goto out;
    rc = idem_tx_commit(tx);
    tx = NULL;
    if (rc < 0)
        goto out;
    response_json(resp, 200, doc);
out:
    if (rc < 0)
        keyed_answer_fail(resp, rc);
    json_decref(doc);
    idem_tx_rollback(tx);
}

/* Whether `s` holds a control character (C0, DEL, C1): in a name or an email it is never meant. */
static int has_control(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    for (; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            return 1;
        /* C1 controls are U+0080..U+009F: 0xC2 0x80..0x9F in UTF-8. */
        if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
            return 1;
    }
    return 0;
}

static int valid_string(const json_t *v, size_t min_chars, size_t max_chars)
{
    size_t n;

    /*
     * An embedded NUL ("\u0000") would make the stored text differ from what was sent; CR, LF
     * or ESC would let a profile forge a log line or an email header, or drive a terminal.
     */
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
        has_control(json_string_value(v)))
        n = 0;
    else
        n = utf8_length(json_string_value(v));
    return n >= min_chars && n <= max_chars && n > 0;
}

void profile_update(const struct call_ctx *cx, struct response *resp)
{
    struct profile_input in;
    const json_t *name, *email;

    if (!json_is_object(cx->body)) {
        response_problem(resp, 400, "validation-failed",
                         "The body must be a JSON object {\"name\": string, \"email\": string}.");
        goto out;
    }
    name = json_object_get(cx->body, "name");
    email = json_object_get(cx->body, "email");
    if (!valid_string(name, 1, NAME_MAX_CHARS)) {
        response_problem(resp, 400, "validation-failed",
                         "name must be a string of 1 to 200 characters, without control "
                         "characters.");
        goto out;
    }
    if (!valid_string(email, EMAIL_MIN_CHARS, EMAIL_MAX_CHARS) ||
        strchr(json_string_value(email), '@') == NULL) {
        response_problem(resp, 400, "validation-failed",
                         "email must be a string of 3 to 254 characters containing '@', "
                         "without control characters.");
        goto out;
    }
    in.name = json_string_value(name);
    in.email = json_string_value(email);
    if (cx->key != NULL)
        idemcall_handle(cx, &cx->app->op_profile_update, profile_run, &in, resp);
    else
        profile_without_key(cx, &in, resp);
out:
    return;
}
