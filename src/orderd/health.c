/* SPDX-License-Identifier: Apache-2.0 */
/*
 * health.c - GET /healthz asks the store a trivial question, so "ok" means requests can be
 * served, not merely that the process is alive; GET /metrics renders the counters, and the
 * figures read from the store at scrape time (outbox, webhook inbox).  Those survive a restart,
 * are the same on every instance sharing the store, and cost a scrape a few rows (schema.c).
 */
#include "health.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idem/idem.h"

#include "app.h"
#include "db.h"
#include "http_server.h"
#include "idemcall.h"
#include "metrics.h"
#include "prom.h"
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
    int rc = 0;

    /* On a shard set every cluster and the catalogue: a user of any one may call. */
    for (size_t i = 0; i <= app->nviews && (i < app->nviews || app->shards != NULL); i++) {
        struct idem_store *st = i < app->nviews ? app->views[i].store : app->catalogue;
        idem_rows_free(rows);
        rows = NULL;
        idem_tx_rollback(tx);
        tx = NULL;
        rc = idem_tx_begin(st, 0, &tx);
        if (rc == 0)
            rc = idem_tx_exec(tx, "SELECT 1", 0, NULL, &rows);
        if (rc < 0) {
            keyed_answer_unavailable(resp, "The store does not answer.");
            goto out;
        }
    }
    doc = xcheck(json_pack("{s:s, s:s}", "status", "ok", "store", idem_store_kind(app->store)));
    response_json(resp, 200, doc);
out:
    json_decref(doc);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

/* The counts of every cluster read by one scrape (one without shards). */
struct counts {
    size_t n;
    struct idem_rows *rows[PROM_SHARDS_MAX];
    struct idem_tx *tx[PROM_SHARDS_MAX];
};

/* The value of count `name` in each cluster's rows (name, sum), summed; 0 when it has no row. */
static long long count_of(const struct counts *c, const char *name)
{
    long long sum = 0;
    int r;

    for (size_t i = 0; i < c->n; i++)
        for (r = 0; r < idem_rows_count(c->rows[i]); r++)
            if (strcmp(db_text(c->rows[i], r, 0), name) == 0)
                sum += (long long)db_int(c->rows[i], r, 1);
    return sum;
}

/* The outbox by state: a growing "pending" or any "parked" is what an operator watches. */
static void render_outbox(const struct counts *counts, struct strbuf *sb)
{
    static const char *const states[] = {"pending", "sent", "parked"};
    char name[32];
    size_t i;

    strbuf_adds(sb, "# HELP orderd_outbox_messages Messages in the outbox by state (sent ones until"
                    " the retention sweep deletes them).\n"
                    "# TYPE orderd_outbox_messages gauge\n");
    for (i = 0; i < sizeof states / sizeof states[0]; i++) {
        snprintf(name, sizeof name, "outbox:%s", states[i]);
        strbuf_addf(sb, "orderd_outbox_messages{status=\"%s\"} %lld\n", states[i],
                    count_of(counts, name));
    }
}

/*
 * The webhook inbox: provider events ever accepted (each event id once), by type and by what
 * became of them (webhook_receiver.c decides "applied" or "ignored" in the transaction that records
 * the id).  Unlike orderd_webhooks_total it is durable and the same on every instance, so a checker
 * can take a difference across kills and instances; the retention sweep of the inbox leaves it.
 * The label values are the fixed set the schema's triggers count by (schema.c, step 5).
 */
static void render_inbox(const struct counts *counts, struct strbuf *sb)
{
    static const char *const types[] = {"charge.succeeded", "refund.succeeded", "other"};
    static const char *const results[] = {"applied", "ignored", "other"};
    char name[64];
    size_t t, x;

    strbuf_adds(sb, "# HELP orderd_webhook_inbox_events_total Provider events accepted into the"
                    " webhook inbox (each event id once) by type and result, read from the store.\n"
                    "# TYPE orderd_webhook_inbox_events_total counter\n");
    for (t = 0; t < sizeof types / sizeof types[0]; t++)
        for (x = 0; x < sizeof results / sizeof results[0]; x++) {
            snprintf(name, sizeof name, "inbox:%s:%s", types[t], results[x]);
            strbuf_addf(sb, "orderd_webhook_inbox_events_total{type=\"%s\",result=\"%s\"} %lld\n",
                        types[t], results[x], count_of(counts, name));
        }
}

/*
 * Payments and refunds whose outcome is unknown (flagged for the reconciler), by the index of
 * their next check: a few rows whatever the size of the tables, as many as are unsettled now.
 */
static void render_unknown(const struct counts *c, struct strbuf *sb)
{
    static const char *const sql[2] = {
        "SELECT COUNT(*) FROM orders WHERE payment_check_ms >= 0 AND status = 'pending_payment'",
        "SELECT COUNT(*) FROM refunds WHERE check_ms >= 0"};
    static const char *const kinds[2] = {"charge", "refund"};
    struct idem_rows *rows = NULL;
    long long n[2] = {0, 0};

    for (size_t k = 0; k < c->n; k++)
        for (int i = 0; i < 2; i++) {
            if (idem_tx_exec(c->tx[k], sql[i], 0, NULL, &rows) != 0) {
                idem_rows_free(rows);
                return;
            }
            n[i] += (long long)db_int(rows, 0, 0);
            idem_rows_free(rows);
            rows = NULL;
        }
    strbuf_adds(sb, "# HELP orderd_payments_unknown Charges and refunds whose outcome is unknown"
                    " now: waiting for a retry, a webhook or the reconciler.\n"
                    "# TYPE orderd_payments_unknown gauge\n");
    for (int i = 0; i < 2; i++)
        strbuf_addf(sb, "orderd_payments_unknown{kind=\"%s\"} %lld\n", kinds[i], n[i]);
}

/*
 * The figures read from the store: the counts the schema's triggers keep (schema.c, step 5), a
 * few rows whatever the size of the outbox and the inbox.  A store that does not answer leaves
 * them out rather than fail the page (the counters are still worth having), and says so in
 * orderd_store_up.  On a shard set the store's own series and orderd_store_up are labelled by
 * cluster (shard="c1"), and the counts are the sums over the clusters, left out when one of them
 * does not answer.
 */
static void render_store(const struct app *app, struct strbuf *sb)
{
    const char *names[PROM_SHARDS_MAX];
    const struct idem_store *stores[PROM_SHARDS_MAX];
    struct counts c;
    size_t i, n = app->nviews < PROM_SHARDS_MAX ? app->nviews : PROM_SHARDS_MAX;
    int up, all = 1;

    memset(&c, 0, sizeof c);
    c.n = n;
    for (i = 0; i < n; i++) {
        names[i] = app->views[i].shard;
        stores[i] = app->views[i].store;
    }
    if (app->shards == NULL)
        prom_store(sb, "orderd", app->store);
    else
        prom_store_shards(sb, "orderd", n, names, stores);
    strbuf_adds(sb, "# HELP orderd_store_up Whether the store answered this scrape's read (1) or"
                    " not (0).\n"
                    "# TYPE orderd_store_up gauge\n");
    for (i = 0; i < n; i++) {
        up = idem_tx_begin(app->views[i].store, 0, &c.tx[i]) == 0 &&
             idem_tx_exec(c.tx[i], "SELECT name, SUM(value) FROM counts GROUP BY name", 0, NULL,
                          &c.rows[i]) == 0;
        if (app->shards == NULL)
            strbuf_addf(sb, "orderd_store_up %d\n", up);
        else
            strbuf_addf(sb, "orderd_store_up{shard=\"%s\"} %d\n", names[i], up);
        all = all && up;
    }
    if (all) {
        render_outbox(&c, sb);
        render_inbox(&c, sb);
        render_unknown(&c, sb);
    }
    for (i = 0; i < n; i++) {
        idem_rows_free(c.rows[i]);
        idem_tx_rollback(c.tx[i]);
    }
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

/* libidem's replay cache: one per cluster on a shard set, labelled by it. */
static void render_replay_cache(const struct app *app, struct strbuf *sb)
{
    const char *names[PROM_SHARDS_MAX];
    struct idem_engine *engines[PROM_SHARDS_MAX];
    size_t i, n = app->nviews < PROM_SHARDS_MAX ? app->nviews : PROM_SHARDS_MAX;

    if (app->shards == NULL) {
        prom_replay_cache(sb, "orderd", app->engine);
        return;
    }
    for (i = 0; i < n; i++) {
        names[i] = app->views[i].shard;
        engines[i] = app->views[i].engine;
    }
    prom_replay_cache_shards(sb, "orderd", n, names, engines);
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
    render_replay_cache(cx->app, &sb);
    render_http(cx->app, &sb);
    free(resp->body);
    resp->body = strbuf_detach(&sb, &len);
    resp->body_len = len;
    resp->status = 200;
    response_set_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
}
