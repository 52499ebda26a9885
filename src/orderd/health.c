/*
 * health.c - GET /healthz asks the store a trivial question, so "ok" means requests can be
 * served, not merely that the process is alive; GET /metrics renders the counters, and the
 * gauges that are read from the store at scrape time (outbox, webhook inbox).  Those survive a
 * restart and are the same on every instance sharing the store.
 */
#include "health.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "db.h"
#include "http_server.h"
#include "idemcall.h"
#include "metrics.h"
#include "response.h"
#include "router.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define NTYPES 3   /* inbox event types: charge.succeeded, refund.succeeded, other */
#define NRESULTS 3 /* inbox results: applied, ignored, other */

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
        idem_answer_unavailable(resp, "The store does not answer.");
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
 * The outbox by state: a growing "pending" or any "parked" is what an operator watches; writes
 * nothing when the store does not answer: the gauge is left out, the page stays.
 */
static void render_outbox(struct idem_tx *tx, struct strbuf *sb)
{
    static const char *const states[] = {"pending", "sent", "parked"};
    struct idem_rows *rows = NULL;
    long long n;
    size_t i;
    int r;

    if (idem_tx_exec(tx, "SELECT status, COUNT(*) FROM outbox GROUP BY status", 0, NULL, &rows) !=
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
}

/* Index of `name` in `names`, or of the last entry ("other") when it is not there. */
static size_t label_of(const char *const *names, size_t n, const char *name)
{
    size_t i;

    for (i = 0; i + 1 < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return n - 1;
}

/*
 * The webhook inbox: one row per provider event id ever accepted, with what became of it
 * (webhooks.c writes "applied" or "ignored" in the transaction that records the id).  Unlike
 * orderd_webhooks_total it is durable, so a checker can take a difference across kills and
 * instances.  The event type comes from the provider: types orderd does not handle are summed
 * into "other", as are results it never writes, so the label set stays fixed and every series is
 * exposed, zeros included.  A full count per scrape: the inbox is never swept.
 */
static void render_inbox(struct idem_tx *tx, struct strbuf *sb)
{
    static const char *const types[] = {"charge.succeeded", "refund.succeeded", "other"};
    static const char *const results[] = {"applied", "ignored", "other"};
    struct idem_rows *rows = NULL;
    long long n[NTYPES][NRESULTS];
    size_t t, x;
    int r;

    memset(n, 0, sizeof n);
    if (idem_tx_exec(tx, "SELECT type, result, COUNT(*) FROM inbox GROUP BY type, result", 0, NULL,
                     &rows) != 0)
        goto out;
    for (r = 0; r < idem_rows_count(rows); r++) {
        t = label_of(types, NTYPES, db_text(rows, r, 0));
        x = label_of(results, NRESULTS, db_text(rows, r, 1));
        n[t][x] += (long long)db_int(rows, r, 2);
    }
    strbuf_adds(sb, "# HELP orderd_webhook_inbox_events Provider events in the webhook inbox "
                    "(each event id once) by type and result, read from the store.\n"
                    "# TYPE orderd_webhook_inbox_events gauge\n");
    for (t = 0; t < NTYPES; t++)
        for (x = 0; x < NRESULTS; x++)
            strbuf_addf(sb, "orderd_webhook_inbox_events{type=\"%s\",result=\"%s\"} %lld\n",
                        types[t], results[x], n[t][x]);
out:
    idem_rows_free(rows);
}

/*
 * The gauges read from the store, in one read transaction per scrape.  A store that does not
 * answer leaves them out rather than fail the page (the counters are still worth having); a
 * failed statement leaves the transaction usable on every store (idem_tx_exec), so one gauge
 * missing does not take the other with it.
 */
static void render_store(const struct app *app, struct strbuf *sb)
{
    struct idem_tx *tx = NULL;
    struct idem_store_stats stats;

    idem_store_stats(app->store, &stats);
    strbuf_addf(sb,
                "# HELP orderd_store_write_commits_total Write transactions committed, each"
                " acknowledged once durable.\n"
                "# TYPE orderd_store_write_commits_total counter\n"
                "orderd_store_write_commits_total %llu\n"
                "# HELP orderd_store_durable_commits_total Durable commits that carried them"
                " (SQLite group commit: one per batch).\n"
                "# TYPE orderd_store_durable_commits_total counter\n"
                "orderd_store_durable_commits_total %llu\n",
                (unsigned long long)stats.write_commits, (unsigned long long)stats.durable_commits);

    if (idem_tx_begin(app->store, 0, &tx) != 0)
        return;
    render_outbox(tx, sb);
    render_inbox(tx, sb);
    idem_tx_rollback(tx);
}

/* The HTTP layer's own counters: what it refused, and why (docs/http-server.md). */
static void render_http(const struct app *app, struct strbuf *sb)
{
    const struct http_server *srv = atomic_load(&app->http);
    struct http_server_stats st;

    if (srv == NULL)
        return;
    http_server_stats(srv, &st);
    strbuf_addf(sb,
                "# HELP orderd_http_connections Connections open now.\n"
                "# TYPE orderd_http_connections gauge\n"
                "orderd_http_connections %llu\n"
                "# HELP orderd_http_connections_refused_total Connections refused at the total or"
                " per-address cap (503 too-many-connections).\n"
                "# TYPE orderd_http_connections_refused_total counter\n"
                "orderd_http_connections_refused_total %llu\n"
                "# HELP orderd_http_timeouts_total Requests whose head or body did not arrive in"
                " time (408), and responses the client did not read.\n"
                "# TYPE orderd_http_timeouts_total counter\n"
                "orderd_http_timeouts_total %llu\n"
                "# HELP orderd_http_refused_heads_total Requests answered from their head alone"
                " (400, 401, 404, 405, 413, 415, 431, 501, 505), the body unread.\n"
                "# TYPE orderd_http_refused_heads_total counter\n"
                "orderd_http_refused_heads_total %llu\n"
                "# HELP orderd_http_queue_full_total Requests refused because every worker was"
                " busy and the queue full (503 server-busy).\n"
                "# TYPE orderd_http_queue_full_total counter\n"
                "orderd_http_queue_full_total %llu\n",
                (unsigned long long)st.connections_open, (unsigned long long)st.connections_refused,
                (unsigned long long)st.timeouts, (unsigned long long)st.rejected_heads,
                (unsigned long long)st.queue_full);
}

void health_metrics(const struct call_ctx *cx, struct response *resp)
{
    struct strbuf sb = STRBUF_INIT;
    size_t len = 0;
    char *text;

    text = metrics_render(cx->app->metrics, &len);
    strbuf_add(&sb, text, len);
    free(text);
    render_store(cx->app, &sb);
    render_http(cx->app, &sb);
    free(resp->body);
    resp->body = strbuf_detach(&sb, &len);
    resp->body_len = len;
    resp->status = 200;
    response_set_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
}
