/*
 * health.c - GET /healthz asks the store a trivial question, so "ok" means requests can be
 * served, not merely that the process is alive; GET /metrics renders the counters.
 */
#include "health.h"

#include <stdlib.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "idemcall.h"
#include "metrics.h"
#include "response.h"
#include "router.h"
#include "util.h"
#include "banned.h"

void health_check(const struct call_ctx *cx, struct response *resp)
{
    struct app *app = cx->app;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    json_t *doc = NULL;
    int rc;

    rc = idem_tx_begin(app->store, 0, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx, "SELECT 1", 0, NULL, &rows);
    if (rc < 0) {
        idemcall_unavailable(resp, "The store does not answer.");
        goto out;
    }
    doc = xcheck(json_pack("{s:s, s:s}", "status", "ok", "store", idem_store_kind(app->store)));
    response_json(resp, 200, doc);
out:
    json_decref(doc);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

void health_metrics(const struct call_ctx *cx, struct response *resp)
{
    size_t len = 0;

    free(resp->body);
    resp->body = metrics_render(cx->app->metrics, &len);
    resp->body_len = len;
    resp->status = 200;
    response_set_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
}
