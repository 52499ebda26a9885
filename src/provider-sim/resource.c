/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resource.c - the GETs of provider-sim's objects (see resource.h), each one read-only
 * transaction.  The SQL is put together from the struct sim_resource's literals only, never from
 * the request: the id, key and filter value travel as parameters.
 */
#include "resource.h"

#include <stdio.h>

#include "sim_util.h"
#include "banned.h"

/* Runs `sql` and answers its rows as one object (`single`) or as a list. */
static void answer(struct sim *sim, const struct sim_resource *res, struct response *resp,
                   const char *sql, int nparams, const char *const *params, int single)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    json_t *doc = NULL, *list = NULL;
    int i, n, rc;

    rc = idem_tx_begin(sim->store, 0, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx, sql, nparams, params, &rows);
    if (rc < 0) {
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 503, "provider-unavailable", "The store did not answer. Retry.");
        goto out;
    }
    n = idem_rows_count(rows);
    if (single) {
        if (n == 0) {
            response_problem(resp, 404, res->missing_code, "There is no object with this id.");
            goto out;
        }
        doc = res->row(rows, 0);
    } else {
        list = xcheck(json_array());
        for (i = 0; i < n; i++)
            json_array_append_new(list, res->row(rows, i));
        doc = xcheck(json_pack("{s:s, s:O}", "object", "list", "data", list));
    }
    response_json(resp, 200, doc);
out:
    json_decref(list);
    json_decref(doc);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

void resource_get(struct sim *sim, const struct sim_resource *res, struct response *resp,
                  const char *id)
{
    const char *params[1] = {id};
    char sql[512];

    snprintf(sql, sizeof sql, "SELECT %s FROM %s WHERE id = $1", res->cols, res->table);
    answer(sim, res, resp, sql, 1, params, 1);
}

void resource_list(struct sim *sim, const struct sim_resource *res, const struct request *rq,
                   struct response *resp)
{
    const char *key = request_query(rq, "idempotency_key");
    const char *filter = res->filter_param ? request_query(rq, res->filter_param) : NULL;
    const char *params[1] = {key ? key : filter};
    char sql[512];

    if (params[0] != NULL)
        snprintf(sql, sizeof sql, "SELECT %s FROM %s WHERE %s = $1 ORDER BY created_ms, id",
                 res->cols, res->table, key ? "idem_key" : res->filter_column);
    else
        snprintf(sql, sizeof sql, "SELECT %s FROM %s ORDER BY created_ms DESC, id DESC LIMIT 100",
                 res->cols, res->table);
    answer(sim, res, resp, sql, params[0] != NULL, params, 0);
}

json_t *resource_metadata(const char *text)
{
    json_t *m = text ? json_loads(text, 0, NULL) : NULL;

    if (!json_is_object(m)) {
        json_decref(m);
        m = xcheck(json_object());
    }
    return m;
}

int64_t resource_int(const struct idem_rows *rows, int r, int c)
{
    int64_t v = 0;

    parse_int64(idem_rows_get(rows, r, c), INT64_MIN, INT64_MAX, &v);
    return v;
}
