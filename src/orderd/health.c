/*
 * health.c - GET /healthz asks the store a trivial question, so "ok" means requests can be
 * served, not merely that the process is alive; GET /metrics renders the counters.
 */
#include "health.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "db.h"
#include "idemcall.h"
#include "metrics.h"
#include "response.h"
#include "router.h"
#include "strbuf.h"
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

/*
 * The outbox by state, read at scrape time: a growing "pending" or any "parked" is what an
 * operator watches.  A store that does not answer leaves the gauge out rather than fail the page.
 */
static void render_outbox(const struct app *app, struct strbuf *sb)
{
    static const char *const states[] = {"pending", "sent", "parked"};
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    long long n;
    size_t i;
    int r;

    if (idem_tx_begin(app->store, 0, &tx) != 0 ||
        idem_tx_exec(tx, "SELECT status, COUNT(*) FROM outbox GROUP BY status", 0, NULL, &rows) !=
            0)
        goto out;
    strbuf_adds(sb, "# HELP orderd_outbox_messages Messages in the outbox by state.\n"
                    "# TYPE orderd_outbox_messages gauge\n");
    for (i = 0; i < sizeof states / sizeof states[0]; i++) {
        n = 0;
        for (r = 0; r < idem_rows_count(rows); r++)
            if (strcmp(db_text(rows, r, 0), states[i]) == 0)
                n = (long long)db_int(rows, r, 1);
        strbuf_addf(sb, "orderd_outbox_messages{status=\"%s\"} %lld\n", states[i], n);
    }
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

void health_metrics(const struct call_ctx *cx, struct response *resp)
{
    struct strbuf sb = STRBUF_INIT;
    size_t len = 0;
    char *text;

    text = metrics_render(cx->app->metrics, &len);
    strbuf_add(&sb, text, len);
    free(text);
    render_outbox(cx->app, &sb);
    free(resp->body);
    resp->body = strbuf_detach(&sb, &len);
    resp->body_len = len;
    resp->status = 200;
    response_set_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
}
