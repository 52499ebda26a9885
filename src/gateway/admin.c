/*
 * admin.c - the admin listener's routes (admin.h).
 */
#include "admin.h"

#include <stdlib.h>
#include <string.h>

#include "idem_answer.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

static void metrics(struct gateway *gw, struct response *resp)
{
    struct strbuf out = STRBUF_INIT;
    const char **names = xcalloc(gw->cfg->nroutes + 1, sizeof *names);
    struct http_server *srv = gw->public_server;
    size_t len = 0;
    char *text;

    for (size_t i = 0; i < gw->cfg->nroutes; i++)
        names[i] = gw->cfg->routes[i].operation;
    gw_metrics_render(gw->metrics, names, &out);
    free(names);
    if (srv) {
        struct http_server_stats st;
        http_server_stats(srv, &st);
        strbuf_addf(&out,
                    "# HELP idem_gateway_http_connections_open Connections open on the public "
                    "listener.\n# TYPE idem_gateway_http_connections_open gauge\n"
                    "idem_gateway_http_connections_open %llu\n"
                    "# HELP idem_gateway_http_refused_total Connections refused over a cap, "
                    "timeouts, heads answered early, 503s of a full queue.\n"
                    "# TYPE idem_gateway_http_refused_total counter\n"
                    "idem_gateway_http_refused_total{reason=\"connections\"} %llu\n"
                    "idem_gateway_http_refused_total{reason=\"timeout\"} %llu\n"
                    "idem_gateway_http_refused_total{reason=\"head\"} %llu\n"
                    "idem_gateway_http_refused_total{reason=\"queue_full\"} %llu\n",
                    (unsigned long long)st.connections_open,
                    (unsigned long long)st.connections_refused, (unsigned long long)st.timeouts,
                    (unsigned long long)st.rejected_heads, (unsigned long long)st.queue_full);
    }
    text = strbuf_detach(&out, &len);
    resp->status = 200;
    response_set_header(resp, "Content-Type", "text/plain; version=0.0.4");
    resp->body = text;
    resp->body_len = len;
}

static void admin_handle(void *ctx, const struct request *rq, struct response *resp)
{
    struct gateway *gw = ctx;
    int get = strcmp(rq->method, "GET") == 0 || strcmp(rq->method, "HEAD") == 0;

    resp->operation = "admin";
    if (strcmp(rq->path, "/healthz") == 0 && get) {
        json_t *doc = xcheck(json_pack("{s:s}", "status", "ok"));
        response_json(resp, 200, doc);
        json_decref(doc);
    } else if (strcmp(rq->path, "/readyz") == 0 && get) {
        struct idem_tx *tx = NULL;
        int rc = idem_tx_begin(gw->store, 0, &tx);
        if (rc == 0)
            rc = idem_tx_exec(tx, "SELECT 1", 0, NULL, NULL);
        idem_tx_rollback(tx);
        if (rc == 0) {
            json_t *doc = xcheck(
                json_pack("{s:s,s:s}", "status", "ready", "store", idem_store_kind(gw->store)));
            response_json(resp, 200, doc);
            json_decref(doc);
        } else {
            idem_answer_unavailable(resp, "The store does not answer.");
        }
    } else if (strcmp(rq->path, "/metrics") == 0 && get) {
        metrics(gw, resp);
    } else if (strcmp(rq->path, "/healthz") == 0 || strcmp(rq->path, "/readyz") == 0 ||
               strcmp(rq->path, "/metrics") == 0) {
        response_set_header(resp, "Allow", "GET, HEAD");
        response_problem(resp, 405, "method-not-allowed", "Only GET and HEAD are allowed here.");
    } else {
        response_problem(resp, 404, "not-found",
                         "The admin listener serves /healthz, /readyz and /metrics.");
    }
}

void admin_server_options(struct gateway *gw, struct http_server_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->handle = admin_handle;
    opts->ctx = gw;
    opts->ipv6 = 1;
    opts->stop_grace_s = 2;
    opts->limits.max_connections = 64;
    opts->limits.max_connections_per_ip = 64;
    opts->limits.loops = 1;
    opts->limits.workers = 2;
    opts->limits.queue = 64;
}
