/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger.c - GET /v1/ledger, the audit a test (or a person) reads after a storm: every charge,
 * refund and email counted in total and per Idempotency-Key, with any duplicate effect flagged:
 * the same key twice (the simulator's own idempotency failed), two successful charges for one
 * order, two refunds of one charge or more refunded than charged, two emails of one template
 * about one order.  "clean" is true when nothing is flagged.  It also reports what the faults
 * did since start, and where the webhook deliveries stand.  ?keys=0 leaves out the per-key maps;
 * ?refs=1 adds per-reference maps (successful charges per order, emails per template and order).
 *
 * The totals must stay cheap at a million rows, since an audit polls them: the duplicate checks
 * ask the store only for the values counted more than once (HAVING), over indexes that hold the
 * grouped column, so nothing grows with the ledger but the scan.  The per-reference counts an
 * outside audit (idem-check chaos) needs for every order it made come in pages instead, from
 * GET /v1/ledger/references (keyset pagination by reference over the same indexes; the query
 * arguments are read by ledger_query.c): a client reads any ledger in bounded memory.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "handlers.h"
#include "ledger_query.h"
#include "sim_util.h"
#include "banned.h"

static int64_t cell_int(const struct idem_rows *rows, int r, int c)
{
    int64_t v = 0;

    parse_int64(idem_rows_get(rows, r, c), INT64_MIN, INT64_MAX, &v);
    return v;
}

/* Runs `sql`; *rows is new.  Returns 0 or a negative IDEM_E*. */
static int run(struct idem_tx *tx, const char *sql, struct idem_rows **rows)
{
    *rows = NULL;
    return idem_tx_exec(tx, sql, 0, NULL, rows);
}

/* {key: count} of a "key, count" result (NULL unless `want_map`), flagging counts above one as
 * duplicates (into `dups`, unless it is NULL). */
static json_t *count_map(const struct idem_rows *rows, int want_map, const char *kind,
                         const char *by, json_t *dups)
{
    json_t *map = want_map ? xcheck(json_object()) : NULL;
    int i, n = idem_rows_count(rows);
    int64_t c;

    for (i = 0; i < n; i++) {
        const char *k = idem_rows_get(rows, i, 0);
        c = cell_int(rows, i, 1);
        if (k == NULL)
            continue;
        if (map != NULL)
            json_object_set_new(map, k, xcheck(json_integer(c)));
        if (c > 1 && dups != NULL)
            json_array_append_new(dups, xcheck(json_pack("{s:s, s:s, s:s, s:I}", "kind", kind, "by",
                                                         by, "value", k, "count", (json_int_t)c)));
    }
    return map;
}

/*
 * Runs `group_sql` (a "SELECT value, COUNT(*) ... GROUP BY value" without HAVING) and flags the
 * values counted more than once as duplicate `kind`s by `by` (into `dups`).  With `into` (may be
 * NULL), every count also goes into it as member `member`; without, the store is asked for the
 * duplicates only, so a clean ledger of any size answers with no rows.
 */
static int count_dups(struct idem_tx *tx, const char *group_sql, const char *kind, const char *by,
                      json_t *into, const char *member, json_t *dups)
{
    struct idem_rows *rows = NULL;
    char sql[512];
    json_t *map;
    int rc;

    /* Constant SQL only: both parts are literals of this file. */
    snprintf(sql, sizeof sql, "%s%s", group_sql, into != NULL ? "" : " HAVING COUNT(*) > 1");
    rc = run(tx, sql, &rows);
    if (rc == 0) {
        map = count_map(rows, into != NULL, kind, by, dups);
        if (into != NULL)
            json_object_set_new(into, member, map);
    }
    idem_rows_free(rows);
    return rc;
}

/*
 * Flags the duplicate `kind`s of `table`: two rows under one Idempotency-Key, and, with
 * `ref_where` (a condition, may be ""; NULL: no reference check), two rows of one reference.
 * `into` (may be NULL) gets every count under byKey and byReference when `with_keys` and
 * `with_refs` ask for them.
 */
static int effect_dups(struct idem_tx *tx, const char *table, const char *kind,
                       const char *ref_where, json_t *into, int with_keys, int with_refs,
                       json_t *dups)
{
    char sql[256];
    int rc;

    /* Constant SQL only: the table and the condition are literals of this file. */
    snprintf(sql, sizeof sql, "SELECT idem_key, COUNT(*) FROM %s GROUP BY idem_key", table);
    rc = count_dups(tx, sql, kind, "key", with_keys ? into : NULL, "byKey", dups);
    if (rc < 0 || ref_where == NULL)
        return rc;
    snprintf(sql, sizeof sql,
             "SELECT reference, COUNT(*) FROM %s WHERE %sreference IS NOT NULL GROUP BY reference",
             table, ref_where);
    return count_dups(tx, sql, kind, "reference", with_refs ? into : NULL, "byReference", dups);
}

void ledger_get(struct sim *sim, const struct request *rq, struct response *resp)
{
    struct sim_counters *c = &sim->counters;
    const char *keys_q = request_query(rq, "keys");
    const char *refs_q = request_query(rq, "refs");
    int with_keys = keys_q == NULL || strcmp(keys_q, "0") != 0;
    int with_refs = refs_q != NULL && strcmp(refs_q, "1") == 0;
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    json_t *dups = xcheck(json_array());
    json_t *charges = NULL, *refunds = NULL, *emails = NULL, *hooks = NULL, *reqs = NULL;
    json_t *doc = NULL, *map, *deliv;
    int i, n, rc;

    rc = idem_tx_begin(sim->store, 0, &tx);
    if (rc < 0)
        goto fail;

    /* charges */
    rc = run(tx,
             "SELECT COUNT(*), COALESCE(SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END), 0),"
             " COALESCE(SUM(CASE WHEN status = 'succeeded' THEN amount ELSE 0 END), 0) FROM "
             "charges",
             &r);
    if (rc < 0)
        goto fail;
    charges = xcheck(json_pack("{s:I, s:I, s:I, s:I}", "total", (json_int_t)cell_int(r, 0, 0),
                               "succeeded", (json_int_t)cell_int(r, 0, 1), "failed",
                               (json_int_t)(cell_int(r, 0, 0) - cell_int(r, 0, 1)), "amount",
                               (json_int_t)cell_int(r, 0, 2)));
    idem_rows_free(r);
    r = NULL;
    rc = effect_dups(tx, "charges", "charge", "status = 'succeeded' AND ", charges, with_keys,
                     with_refs, dups);
    if (rc < 0)
        goto fail;

    /* refunds */
    rc = run(tx, "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM refunds", &r);
    if (rc < 0)
        goto fail;
    refunds = xcheck(json_pack("{s:I, s:I}", "total", (json_int_t)cell_int(r, 0, 0), "amount",
                               (json_int_t)cell_int(r, 0, 1)));
    idem_rows_free(r);
    r = NULL;
    rc = effect_dups(tx, "refunds", "refund", NULL, refunds, with_keys, with_refs, dups);
    if (rc < 0)
        goto fail;
    rc = run(tx,
             "SELECT r.charge_id, COUNT(*), SUM(r.amount), MAX(c.amount) FROM refunds r JOIN "
             "charges c ON c.id = r.charge_id GROUP BY r.charge_id HAVING COUNT(*) > 1 OR "
             "SUM(r.amount) > MAX(c.amount)",
             &r);
    if (rc < 0)
        goto fail;
    n = idem_rows_count(r);
    for (i = 0; i < n; i++)
        if (cell_int(r, i, 1) > 1 || cell_int(r, i, 2) > cell_int(r, i, 3))
            json_array_append_new(
                dups,
                xcheck(json_pack("{s:s, s:s, s:s, s:I}", "kind", "refund", "by", "charge", "value",
                                 idem_rows_get(r, i, 0), "count", (json_int_t)cell_int(r, i, 1))));
    idem_rows_free(r);

    /* emails */
    rc = run(tx, "SELECT COUNT(*) FROM emails", &r);
    if (rc < 0)
        goto fail;
    emails = xcheck(json_pack("{s:I}", "total", (json_int_t)cell_int(r, 0, 0)));
    idem_rows_free(r);
    rc = run(tx, "SELECT template, COUNT(*) FROM emails GROUP BY template", &r);
    if (rc < 0)
        goto fail;
    map = xcheck(json_object());
    n = idem_rows_count(r);
    for (i = 0; i < n; i++)
        json_object_set_new(map, idem_rows_get(r, i, 0), xcheck(json_integer(cell_int(r, i, 1))));
    json_object_set_new(emails, "byTemplate", map);
    idem_rows_free(r);
    r = NULL;
    rc = effect_dups(tx, "emails", "email", "", emails, with_keys, with_refs, dups);
    if (rc < 0)
        goto fail;

    /* webhooks */
    rc = run(tx, "SELECT COUNT(*) FROM events", &r);
    if (rc < 0)
        goto fail;
    deliv = xcheck(json_pack("{s:I, s:I, s:I}", "pending", (json_int_t)0, "delivered",
                             (json_int_t)0, "abandoned", (json_int_t)0));
    hooks = xcheck(json_pack("{s:I, s:b, s:o}", "events", (json_int_t)cell_int(r, 0, 0),
                             "configured", sim->webhooks != NULL, "deliveries", deliv));
    idem_rows_free(r);
    rc = run(tx,
             "SELECT status, COUNT(*), COALESCE(SUM(attempts), 0) FROM deliveries GROUP BY "
             "status",
             &r);
    if (rc < 0)
        goto fail;
    n = idem_rows_count(r);
    {
        int64_t attempts = 0;
        for (i = 0; i < n; i++) {
            json_object_set_new(deliv, idem_rows_get(r, i, 0),
                                xcheck(json_integer(cell_int(r, i, 1))));
            attempts += cell_int(r, i, 2);
        }
        json_object_set_new(hooks, "attempts", xcheck(json_integer(attempts)));
    }
    idem_rows_free(r);
    r = NULL;

    reqs = xcheck(json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "posts", (json_int_t)atomic_load(&c->posts),
        "executed", (json_int_t)atomic_load(&c->executed), "replayed",
        (json_int_t)atomic_load(&c->replayed), "failed5xx", (json_int_t)atomic_load(&c->failed),
        "lostResponses", (json_int_t)atomic_load(&c->lost), "declined",
        (json_int_t)atomic_load(&c->declined), "conflicts",
        (json_int_t)atomic_load(&c->conflicts)));
    doc = xcheck(json_pack("{s:O, s:O, s:O, s:O, s:O, s:O, s:b}", "charges", charges, "refunds",
                           refunds, "emails", emails, "webhooks", hooks, "requests", reqs,
                           "duplicates", dups, "clean", json_array_size(dups) == 0));
    response_json(resp, 200, doc);
    goto out;
fail:
    log_msg(&sim_log, "error", "ledger: %s", tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
    response_set_header(resp, "Retry-After", "1");
    response_problem(resp, 503, "provider-unavailable", "The store did not answer. Retry.");
out:
    idem_rows_free(r);
    idem_tx_rollback(tx);
    json_decref(charges);
    json_decref(refunds);
    json_decref(emails);
    json_decref(hooks);
    json_decref(reqs);
    json_decref(dups);
    json_decref(doc);
}

/* ---- GET /v1/ledger/references ------------------------------------------------------------ */

/*
 * One page of per-reference counts, by reference, after `$2` when given: [kind][with after].  The
 * store reads the reference index in order and stops after the page (LIMIT is the page plus one,
 * to tell whether more follow), so a page costs the same at the start and at the end of a
 * million rows.  Charges: successful and all charges per reference; emails: all per reference.
 */
static const char *const page_sql[2][2] = {
    [LEDGER_CHARGES] =
        {
            "SELECT reference, SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END), COUNT(*) "
            "FROM charges WHERE reference IS NOT NULL GROUP BY reference ORDER BY reference "
            "LIMIT CAST($1 AS BIGINT)",
            "SELECT reference, SUM(CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END), COUNT(*) "
            "FROM charges WHERE reference > $2 GROUP BY reference ORDER BY reference "
            "LIMIT CAST($1 AS BIGINT)",
        },
    [LEDGER_EMAILS] =
        {
            "SELECT reference, COUNT(*) FROM emails WHERE reference IS NOT NULL "
            "GROUP BY reference ORDER BY reference LIMIT CAST($1 AS BIGINT)",
            "SELECT reference, COUNT(*) FROM emails WHERE reference > $2 "
            "GROUP BY reference ORDER BY reference LIMIT CAST($1 AS BIGINT)",
        },
};

void ledger_references(struct sim *sim, const struct request *rq, struct response *resp)
{
    struct ledger_query q;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    json_t *data = NULL, *doc = NULL, *item;
    const char *params[2];
    char detail[160], limit_text[16];
    int i, n, more, rc;

    if (ledger_query_parse(request_query(rq, "kind"), request_query(rq, "after"),
                           request_query(rq, "limit"), &q, detail, sizeof detail) != 0) {
        response_problem(resp, 400, "validation-failed", detail);
        goto out;
    }
    snprintf(limit_text, sizeof limit_text, "%d", q.limit + 1);
    params[0] = limit_text;
    params[1] = q.after;
    rc = idem_tx_begin(sim->store, 0, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx, page_sql[q.kind][q.after != NULL], q.after != NULL ? 2 : 1, params,
                          &rows);
    if (rc < 0) {
        log_msg(&sim_log, "error", "ledger references: %s",
                tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 503, "provider-unavailable", "The store did not answer. Retry.");
        goto out;
    }
    n = idem_rows_count(rows);
    more = n > q.limit;
    if (more)
        n = q.limit;
    data = xcheck(json_array());
    for (i = 0; i < n; i++) {
        if (q.kind == LEDGER_CHARGES)
            item = json_pack("{s:s, s:I, s:I}", "reference", idem_rows_get(rows, i, 0), "succeeded",
                             (json_int_t)cell_int(rows, i, 1), "failed",
                             (json_int_t)(cell_int(rows, i, 2) - cell_int(rows, i, 1)));
        else
            item = json_pack("{s:s, s:I}", "reference", idem_rows_get(rows, i, 0), "count",
                             (json_int_t)cell_int(rows, i, 1));
        json_array_append_new(data, xcheck(item));
    }
    doc = xcheck(json_pack(
        "{s:s, s:s, s:O, s:b, s:o}", "object", "list", "kind",
        q.kind == LEDGER_CHARGES ? "charges" : "emails", "data", data, "hasMore", more, "nextAfter",
        more ? xcheck(json_string(idem_rows_get(rows, n - 1, 0))) : json_null()));
    response_json(resp, 200, doc);
out:
    json_decref(data);
    json_decref(doc);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}
