/*
 * ledger.c - GET /v1/ledger, the audit a test (or a person) reads after a storm: every charge,
 * refund and email counted in total and per Idempotency-Key, with any duplicate effect flagged:
 * the same key twice (the simulator's own idempotency failed), two successful charges for one
 * order, two refunds of one charge or more refunded than charged, two emails of one template
 * about one order.  "clean" is true when nothing is flagged.  It also reports what the faults
 * did since start, and where the webhook deliveries stand.  ?keys=0 leaves out the per-key maps;
 * ?refs=1 adds per-reference maps (successful charges per order, emails per template and order),
 * so that an outside audit (idem-check chaos) can demand one charge and one email of each order it
 * made, whatever else the ledger holds.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "handlers.h"
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

/* {key: count} of a "key, count" result, flagging counts above one as duplicates (into `dups`,
 * unless it is NULL). */
static json_t *count_map(const struct idem_rows *rows, const char *kind, const char *by,
                         json_t *dups)
{
    json_t *map = xcheck(json_object());
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
 * Runs `sql` (rows of "value, count") and flags the values counted more than once as duplicate
 * `kind`s by `by` (into `dups`, unless it is NULL).  With `into` (may be NULL), the counts also
 * go into it as member `member`.
 */
static int count_dups(struct idem_tx *tx, const char *sql, const char *kind, const char *by,
                      json_t *into, const char *member, json_t *dups)
{
    struct idem_rows *rows = NULL;
    json_t *map;
    int rc = run(tx, sql, &rows);

    if (rc == 0) {
        map = count_map(rows, kind, by, dups);
        if (into != NULL)
            json_object_set_new(into, member, map);
        else
            json_decref(map);
    }
    idem_rows_free(rows);
    return rc;
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
    rc = count_dups(tx, "SELECT idem_key, COUNT(*) FROM charges GROUP BY idem_key", "charge", "key",
                    with_keys ? charges : NULL, "byKey", dups);
    if (rc == 0)
        rc = count_dups(tx,
                        "SELECT reference, COUNT(*) FROM charges WHERE status = 'succeeded' AND "
                        "reference IS NOT NULL GROUP BY reference",
                        "charge", "reference", with_refs ? charges : NULL, "byReference", dups);
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
    rc = count_dups(tx, "SELECT idem_key, COUNT(*) FROM refunds GROUP BY idem_key", "refund", "key",
                    with_keys ? refunds : NULL, "byKey", dups);
    if (rc < 0)
        goto fail;
    rc = run(tx,
             "SELECT r.charge_id, COUNT(*), SUM(r.amount), MAX(c.amount) FROM refunds r JOIN "
             "charges c ON c.id = r.charge_id GROUP BY r.charge_id",
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
    rc = count_dups(tx, "SELECT idem_key, COUNT(*) FROM emails GROUP BY idem_key", "email", "key",
                    with_keys ? emails : NULL, "byKey", dups);
    if (rc == 0)
        rc = count_dups(tx,
                        "SELECT reference, COUNT(*) FROM emails WHERE reference IS NOT NULL "
                        "GROUP BY reference",
                        "email", "reference", with_refs ? emails : NULL, "byReference", dups);
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
