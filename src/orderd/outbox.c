/* SPDX-License-Identifier: Apache-2.0 */
/*
 * outbox.c - the outbox and its relay (see outbox.h).  A batch is fanned out over a few threads,
 * each bounded by the provider timeout, so one slow message does not hold up the rest and a run
 * always ends.  The state change after a delivery attempt is conditional on the row still being
 * pending, so two relays (two orderd processes on one PostgreSQL store) cannot undo each other;
 * they may both send a message, which the provider dedupes by its key.
 */
#include "outbox.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "app.h"
#include "db.h"
#include "metrics.h"
#include "provider.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define RELAY_BATCH 32
#define RELAY_THREADS 8
#define BACKOFF_FIRST_MS 250

int outbox_enqueue(const struct app *app, struct idem_tx *tx, const char *user_id,
                   const char *dedupe_key, const json_t *email)
{
    const char *params[8];
    unsigned char rnd[12];
    char id[40], created[ISO8601_LEN + 1], now_ms[24];
    char *payload = NULL;
    const json_t *to = json_object_get(email, "to");
    const json_t *tmpl = json_object_get(email, "template");
    int64_t now = clock_wall_ms();
    int rc;

    random_bytes(rnd, sizeof rnd);
    memcpy(id, "obx_", 4);
    hex_encode(rnd, sizeof rnd, id + 4);
    iso8601_ms(now, created);
    snprintf(now_ms, sizeof now_ms, "%" PRId64, now);
    payload = xcheck(json_dumps(email, JSON_COMPACT | JSON_PRESERVE_ORDER));
    params[0] = id;
    params[1] = json_is_string(tmpl) ? json_string_value(tmpl) : "email";
    params[2] = dedupe_key ? dedupe_key : id;
    params[3] = json_is_string(to) ? json_string_value(to) : "";
    params[4] = payload;
    params[5] = now_ms;
    params[6] = created;
    params[7] = user_id;
    rc = db_exec(app, tx,
                 "INSERT INTO outbox (id, kind, dedupe_key, recipient, payload, status, attempts, "
                 "next_attempt_ms, created_at, user_id) VALUES ($1, $2, $3, $4, $5, 'pending', 0, "
                 "CAST($6 AS BIGINT), $7, $8) ON CONFLICT (dedupe_key) DO NOTHING",
                 8, params, NULL);
    free(payload);
    return rc;
}

/* ---- the relay ------------------------------------------------------------------------------ */

struct message {
    char *id;
    char *payload;
    int64_t attempts;
    int sent;
};

struct slice {
    struct app *app;
    struct message *msgs;
    size_t first, step, n;
};

/* Exponential, capped, with "equal jitter": half fixed, half random. */
static int64_t backoff_ms(int64_t attempts, int64_t max_ms)
{
    int64_t ms = BACKOFF_FIRST_MS;
    unsigned char r[2];

    while (attempts-- > 1 && ms < max_ms)
        ms *= 2;
    if (ms > max_ms)
        ms = max_ms;
    random_bytes(r, sizeof r);
    return ms / 2 + (ms / 2) * ((int64_t)r[0] << 8 | r[1]) / 65535;
}

static void record(struct app *app, struct message *m, const struct provider_reply *r)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[4];
    const json_t *pid = json_object_get(r->doc, "id");
    char when[ISO8601_LEN + 1], next[24], max[16];
    int64_t attempts = m->attempts + 1;
    int rc;

    rc = idem_tx_begin(app->store, 1, &tx);
    if (rc < 0)
        goto out;
    params[0] = m->id;
    if (r->outcome == PROVIDER_OK) {
        iso8601_ms(clock_wall_ms(), when);
        params[1] = when;
        params[2] = json_is_string(pid) ? json_string_value(pid) : NULL;
        rc = db_exec(app, tx,
                     "UPDATE outbox SET status = 'sent', attempts = attempts + 1, sent_at = $2, "
                     "provider_id = $3, last_error = NULL WHERE id = $1 AND status = 'pending'",
                     3, params, NULL);
        m->sent = 1;
    } else {
        snprintf(next, sizeof next, "%" PRId64,
                 clock_wall_ms() + backoff_ms(attempts, app->cfg->outbox_backoff_max_ms));
        snprintf(max, sizeof max, "%d", app->cfg->outbox_max_attempts);
        params[1] = max;
        params[2] = next;
        params[3] = r->detail[0] ? r->detail : "failed";
        rc = db_exec(app, tx,
                     "UPDATE outbox SET attempts = attempts + 1, status = CASE WHEN attempts + 1 "
                     ">= CAST($2 AS INTEGER) THEN 'parked' ELSE 'pending' END, next_attempt_ms = "
                     "CAST($3 AS BIGINT), last_error = $4 WHERE id = $1 AND status = 'pending'",
                     4, params, &rows);
        if (rc == 0 && attempts >= app->cfg->outbox_max_attempts && idem_rows_changed(rows) > 0)
            log_msg(&app->log, "warn",
                    "outbox: message %s parked after %" PRId64 " attempts (last: %s); "
                    "`orderd outbox retry %s` queues it again",
                    m->id, attempts, params[3], m->id);
    }
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
out:
    if (rc < 0)
        log_msg(&app->log, "warn", "outbox: cannot record the attempt on %s: %s", m->id,
                idem_strerror(rc));
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

static void *deliver_slice(void *arg)
{
    struct slice *s = arg;
    struct provider_reply r;
    json_error_t jerr;
    json_t *body;
    size_t i;

    for (i = s->first; i < s->n; i += s->step) {
        struct message *m = &s->msgs[i];
        body = json_loads(m->payload, 0, &jerr);
        if (body == NULL) {
            memset(&r, 0, sizeof r);
            r.outcome = PROVIDER_REFUSED;
            snprintf(r.detail, sizeof r.detail, "payload is not JSON: %s", jerr.text);
        } else {
            provider_post(s->app->provider, "/v1/emails", m->id, body, &r);
            metrics_provider(s->app->metrics, PCALL_EMAIL, (int)r.outcome);
        }
        record(s->app, m, &r);
        provider_reply_clear(&r);
        json_decref(body);
    }
    return NULL;
}

int outbox_relay_run(struct app *app, int *items)
{
    struct idem_rows *rows = NULL;
    struct message msgs[RELAY_BATCH];
    struct slice slices[RELAY_THREADS];
    pthread_t threads[RELAY_THREADS];
    int started[RELAY_THREADS] = {0};
    const char *params[1];
    char now[24];
    size_t n = 0, i, nthreads;
    int rc;

    *items = 0;
    memset(msgs, 0, sizeof msgs);
    if (app->provider == NULL)
        return 0;
    snprintf(now, sizeof now, "%" PRId64, clock_wall_ms());
    params[0] = now;
    rc = db_read(app, NULL,
                 "SELECT id, payload, attempts FROM outbox WHERE status = 'pending' AND "
                 "next_attempt_ms <= CAST($1 AS BIGINT) ORDER BY next_attempt_ms LIMIT 32",
                 1, params, &rows);
    if (rc < 0)
        goto out;
    n = (size_t)idem_rows_count(rows);
    if (n > RELAY_BATCH)
        n = RELAY_BATCH;
    for (i = 0; i < n; i++) {
        msgs[i].id = xstrdup(db_text(rows, (int)i, 0));
        msgs[i].payload = xstrdup(db_text(rows, (int)i, 1));
        msgs[i].attempts = db_int(rows, (int)i, 2);
    }
    nthreads = n < RELAY_THREADS ? n : RELAY_THREADS;
    for (i = 0; i < nthreads; i++) {
        slices[i].app = app;
        slices[i].msgs = msgs;
        slices[i].first = i;
        slices[i].step = nthreads;
        slices[i].n = n;
        /* A thread that cannot start leaves its share to this one. */
        started[i] = pthread_create(&threads[i], NULL, deliver_slice, &slices[i]) == 0;
        if (!started[i])
            deliver_slice(&slices[i]);
    }
    for (i = 0; i < nthreads; i++)
        if (started[i])
            pthread_join(threads[i], NULL);
    for (i = 0; i < n; i++)
        *items += msgs[i].sent;
out:
    for (i = 0; i < n; i++) {
        free(msgs[i].id);
        free(msgs[i].payload);
    }
    idem_rows_free(rows);
    return rc;
}

/* ---- operators ------------------------------------------------------------------------------ */

int outbox_list(struct idem_store *st, const char *status, int limit, FILE *out, char *err,
                size_t errlen)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[2];
    char lim[16], next[ISO8601_LEN + 1];
    int i, n, rc;

    snprintf(lim, sizeof lim, "%d", limit);
    params[0] = lim;
    params[1] = status;
    rc = idem_tx_begin(st, 0, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx,
                          "SELECT id, status, attempts, next_attempt_ms, kind, recipient, "
                          "created_at, sent_at, last_error FROM outbox WHERE (CAST($2 AS TEXT) "
                          "IS NULL OR status = CAST($2 AS TEXT)) ORDER BY created_at DESC, id DESC "
                          "LIMIT CAST($1 AS "
                          "INTEGER)",
                          2, params, &rows);
    if (rc < 0) {
        snprintf(err, errlen, "%s", tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
        goto out;
    }
    n = idem_rows_count(rows);
    fprintf(out, "%-28s %-8s %8s  %-24s %-20s %-30s %s\n", "ID", "STATUS", "ATTEMPTS",
            "NEXT ATTEMPT / SENT", "KIND", "RECIPIENT", "LAST ERROR");
    for (i = 0; i < n; i++) {
        const char *st_text = db_text(rows, i, 1);
        if (strcmp(st_text, "sent") == 0)
            snprintf(next, sizeof next, "%s", db_text(rows, i, 7));
        else if (strcmp(st_text, "pending") == 0)
            iso8601_ms(db_int(rows, i, 3), next);
        else
            snprintf(next, sizeof next, "-");
        /* A recipient or a provider's error text may hold anything: escaped, never raw. */
        struct strbuf kind = STRBUF_INIT, to = STRBUF_INIT, error = STRBUF_INIT;
        log_escape_text(&kind, db_text(rows, i, 4));
        log_escape_text(&to, db_text(rows, i, 5));
        log_escape_text(&error, idem_rows_get(rows, i, 8) ? db_text(rows, i, 8) : "-");
        fprintf(out, "%-28s %-8s %8lld  %-24s %-20s %-30s %s\n", db_text(rows, i, 0), st_text,
                (long long)db_int(rows, i, 2), next, kind.buf ? kind.buf : "", to.buf ? to.buf : "",
                error.buf ? error.buf : "");
        strbuf_release(&kind);
        strbuf_release(&to);
        strbuf_release(&error);
    }
    fprintf(out, "%d message%s\n", n, n == 1 ? "" : "s");
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

int outbox_retry(struct idem_store *st, const char *id, char *err, size_t errlen)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[1] = {id};
    int rc;

    rc = idem_tx_begin(st, 1, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx,
                          "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_ms = "
                          "0 WHERE id = $1 AND status <> 'sent'",
                          1, params, &rows);
    if (rc == 0 && idem_rows_changed(rows) == 0) {
        idem_rows_free(rows);
        rows = NULL;
        rc = idem_tx_exec(tx, "SELECT status FROM outbox WHERE id = $1", 1, params, &rows);
        if (rc == 0)
            rc = idem_rows_count(rows) == 0 ? 1 : 2;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s", tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
        goto out;
    }
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
        if (rc < 0)
            snprintf(err, errlen, "commit failed: %s", idem_strerror(rc));
    }
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}
