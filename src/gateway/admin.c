/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.c - the admin listener's routes (admin.h).
 */
#include "admin.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "ascii.h"
#include "keyed_answer.h"
#include "prom.h"
#include "records.h"
#include "strbuf.h"
#include "unrouted.h"
#include "util.h"
#include "jdoc.h"
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
    unrouted_render(gw->unrouted, &out);
    free(names);
    if (gw->shards) {
        /* Each cluster's replay cache and store, labelled shard="NAME" (one engine each). */
        const char *shard[IDEM_SHARDS_MAX];
        size_t n = atomic_load(&gw->nengines);
        for (size_t i = 0; i < n; i++)
            shard[i] = idem_shards_name(gw->shards, i);
        prom_replay_cache_shards(&out, "idem_gateway", n, shard, gw->engines);
        prom_store_shards(&out, "idem_gateway", n, shard,
                          (const struct idem_store *const *)gw->stores);
    } else {
        prom_replay_cache(&out, "idem_gateway", gw->engine);
        prom_store(&out, "idem_gateway", gw->store);
    }
    if (gw->quota)
        quota_render(gw->quota, "idem_gateway", clock_wall_ms(), &out);
    if (gw->shards)
        gw_metrics_render_shards(gw->metrics, gw->shards, gw->engines, gw->nengines, &out);
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

/* GET /records?principal=P&operation=O&key=K */
static void show_record(struct gateway *gw, const struct request *rq, struct response *resp)
{
    const char *principal = request_query(rq, "principal");
    const char *operation = request_query(rq, "operation");
    const char *key = request_query(rq, "key");
    struct idem_engine *eng;
    json_t *doc = NULL;
    int rc;

    if (!principal || !operation || !key) {
        response_problem(resp, 400, "validation-failed",
                         "Name the record: ?principal=...&operation=...&key=...");
        return;
    }
    eng = gateway_engine(gw, principal, 1);
    rc = eng ? records_show(eng, principal, operation, key, &doc) : IDEM_EMOVED;
    if (rc < 0) {
        keyed_answer_fail(resp, rc);
    } else if (rc == 0) {
        response_problem(resp, 404, "not-found", "There is no record of this key.");
    } else {
        response_json(resp, 200, doc);
        json_decref(doc);
    }
}

/* GET /records/list?state=unknown|in-flight|any&operation=OP&after=CURSOR&limit=N */
static void list_records(struct gateway *gw, const struct request *rq, struct response *resp)
{
    const char *state = request_query(rq, "state");
    const char *limit_text = request_query(rq, "limit");
    int64_t limit = 100;
    json_t *doc = NULL;
    int rc;

    if (limit_text && parse_int64(limit_text, 1, 1000, &limit) != 0) {
        response_problem(resp, 400, "validation-failed", "limit is a number from 1 to 1000.");
        return;
    }
    rc = records_list(gw->stores, gw->nengines, state ? state : "unknown",
                      request_query(rq, "operation"), request_query(rq, "after"), (int)limit, &doc);
    if (rc == IDEM_EINVAL) {
        response_problem(resp, 400, "validation-failed",
                         "state is unknown, in-flight or any; after is the next of an earlier "
                         "page.");
    } else if (rc < 0) {
        keyed_answer_fail(resp, rc);
    } else {
        response_json(resp, 200, doc);
        json_decref(doc);
    }
}

/*
 * POST /records/resolve {"principal", "operation", "key", "decision": "executed" |
 * "not-executed", "response": {"status", "headers": {name: value}, "body": text}}
 */
static void resolve_record(struct gateway *gw, const struct request *rq, struct response *resp)
{
    const char *principal = NULL, *operation = NULL, *key = NULL, *decision = NULL;
    json_t *doc = NULL, *response = NULL, *headers = NULL;
    struct records_decision d;
    struct idem_header h[32];
    const struct idem_operation *op;
    struct idem_engine *eng;
    const char *name;
    json_t *value;
    char err[300];
    size_t body_len = 0;
    const char *body = NULL;
    int status = 0;

    memset(&d, 0, sizeof d);
    doc = rq->body ? jdoc_load(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, NULL) : NULL;
    if (!doc ||
        json_unpack(doc, "{s:s,s:s,s:s,s:s,s?o}", "principal", &principal, "operation", &operation,
                    "key", &key, "decision", &decision, "response", &response) != 0) {
        response_problem(resp, 400, "validation-failed",
                         "Send JSON {principal, operation, key, decision, response}.");
        goto out;
    }
    op = records_find_op(gw->cfg, gw->ops, operation);
    if (!op) {
        response_problem(resp, 404, "not-found", "No route has this operation.");
        goto out;
    }
    if (strcmp(decision, "executed") == 0) {
        if (!response ||
            json_unpack(response, "{s:i,s?o,s?s%}", "status", &status, "headers", &headers, "body",
                        &body, &body_len) != 0 ||
            status < RECORDS_STATUS_MIN || status > RECORDS_STATUS_MAX ||
            (headers && !json_is_object(headers)) ||
            (headers && json_object_size(headers) > sizeof h / sizeof h[0])) {
            response_problem(resp, 400, "validation-failed",
                             "\"executed\" needs \"response\": {\"status\": 200..499 (a 1xx is "
                             "no final answer, a 5xx is never stored), \"headers\": {name: "
                             "value}, \"body\": text}.");
            goto out;
        }
        d.executed = 1;
        d.status = status;
        json_object_foreach(headers, name, value)
        {
            if (!json_is_string(value)) {
                response_problem(resp, 400, "validation-failed", "Header values are strings.");
                goto out;
            }
            h[d.nheaders].name = name;
            h[d.nheaders].value = json_string_value(value);
            d.nheaders++;
        }
        d.headers = h;
        d.body = body;
        d.body_len = body_len;
    } else if (strcmp(decision, "not-executed") != 0) {
        response_problem(resp, 400, "validation-failed",
                         "\"decision\" is \"executed\" or \"not-executed\".");
        goto out;
    }
    eng = gateway_engine(gw, principal, 1);
    if (!eng) {
        keyed_answer_fail(resp, IDEM_EMOVED);
        goto out;
    }
    switch (records_resolve(eng, op, principal, key, &d, err, sizeof err)) {
    case RECORDS_RESOLVED: {
        json_t *ok = xcheck(json_pack("{s:s,s:s}", "resolved", decision, "key", key));
        log_msg(&gw->log, "info", "record %s/%s resolved: %s", operation, key, decision);
        response_json(resp, 200, ok);
        json_decref(ok);
        break;
    }
    case RECORDS_NOT_FOUND:
        response_problem(resp, 404, "not-found", "There is no record of this key.");
        break;
    case RECORDS_COMPLETED:
        response_problem(resp, 409, "record-completed",
                         "This record has an answer already; there is nothing to resolve.");
        break;
    case RECORDS_IN_FLIGHT:
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 409, "idempotency-request-in-progress",
                         "A gateway is forwarding this request right now; resolve it only "
                         "once its outcome is unknown.");
        break;
    case RECORDS_FAILED:
        response_problem(resp, 503, "idempotency-store-unavailable", err);
        break;
    }
out:
    json_decref(doc);
}

/* ---- who may ask ---------------------------------------------------------------------------- */

/* Whether `host` (an address or a name, no port) is this machine's loopback. */
static int loopback_host(const char *host, size_t len)
{
    if (len == 9 && ascii_ncaseeq(host, "localhost", 9))
        return 1;
    if ((len == 3 && memcmp(host, "::1", 3) == 0) || (len == 5 && memcmp(host, "[::1]", 5) == 0))
        return 1;
    if (len < 7 || memcmp(host, "127.", 4) != 0)
        return 0;
    for (size_t i = 4; i < len; i++)
        if (!((host[i] >= '0' && host[i] <= '9') || host[i] == '.'))
            return 0;
    return 1;
}

/* The host part of a Host header or of admin_listen ("[::1]:8181" -> "[::1]"): its length. */
static size_t host_part(const char *hostport)
{
    const char *end;

    if (hostport[0] == '[') {
        end = strchr(hostport, ']');
        return end ? (size_t)(end - hostport) + 1 : strlen(hostport);
    }
    end = strrchr(hostport, ':');
    return end ? (size_t)(end - hostport) : strlen(hostport);
}

int admin_on_loopback(const struct gw_config *cfg)
{
    return loopback_host(cfg->admin_listen, host_part(cfg->admin_listen));
}

void admin_warn(const struct gw_config *cfg, FILE *to)
{
    if (admin_on_loopback(cfg))
        return;
    if (cfg->admin_token)
        fprintf(to,
                "idem-gateway: warning: admin_listen %s is not on loopback: whoever reaches it "
                "with the token of admin_token_file can resolve records\n",
                cfg->admin_listen);
    else
        fprintf(to,
                "idem-gateway: warning: admin_listen %s is not on loopback and admin_token_file "
                "is not set: anyone who reaches it can resolve records and read /metrics\n",
                cfg->admin_listen);
}

/*
 * Before the body is read: who may use the admin API.  A browser on the operator's machine can
 * reach a loopback listener too -- a page's cross-site POST, or a DNS name rebound to 127.0.0.1 --
 * so a request with an Origin (browsers send one; curl, Prometheus and scripts do not) is refused,
 * and on a loopback listener so is a Host that is not loopback.  With admin_token_file, every
 * request but /healthz needs that bearer token.  A request that changes something must be JSON,
 * which a page cannot send cross-site without a preflight.
 */
static enum http_head_verdict admin_on_head(void *ctx, struct request *rq, struct response *resp,
                                            int may_block)
{
    struct gateway *gw = ctx;
    const char *host = request_header(rq, "Host");
    const char *auth = request_header(rq, "Authorization");
    const char *ct = request_header(rq, "Content-Type");
    const char *token = gw->cfg->admin_token;

    (void)may_block;
    resp->operation = "admin";
    if (request_header(rq, "Origin") != NULL) {
        response_problem(resp, 403, "forbidden",
                         "The admin API does not answer requests from web pages (they carry an "
                         "Origin header).");
        return HTTP_HEAD_ANSWER;
    }
    if (host != NULL && admin_on_loopback(gw->cfg) && !loopback_host(host, host_part(host))) {
        response_problem(resp, 403, "forbidden",
                         "The admin API listens on loopback: ask it as localhost, 127.0.0.1 or "
                         "[::1] (another Host is a name rebound to it).");
        return HTTP_HEAD_ANSWER;
    }
    if (token != NULL && strcmp(rq->path, "/healthz") != 0) {
        size_t n = strlen(token);
        int ok = auth != NULL && strlen(auth) == 7 + n && ascii_ncaseeq(auth, "Bearer ", 7) &&
                 CRYPTO_memcmp(auth + 7, token, n) == 0;
        if (!ok) {
            response_set_header(resp, "WWW-Authenticate", "Bearer");
            response_problem(resp, 401, "unauthorized",
                             "The admin API needs Authorization: Bearer and the token of "
                             "admin_token_file.");
            return HTTP_HEAD_ANSWER;
        }
    }
    if (strcmp(rq->path, "/records/resolve") == 0 && strcmp(rq->method, "POST") == 0 &&
        (ct == NULL || !ascii_ncaseeq(ct, "application/json", 16) ||
         (ct[16] != '\0' && ct[16] != ';' && ct[16] != ' '))) {
        response_problem(resp, 415, "unsupported-media-type",
                         "Send the resolution as Content-Type: application/json.");
        return HTTP_HEAD_ANSWER;
    }
    return HTTP_HEAD_CONTINUE;
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
        int rc = 0;
        /* Every cluster of a shard set: a principal of any one may call. */
        for (size_t i = 0; i < gw->nengines && rc == 0; i++) {
            struct idem_tx *tx = NULL;
            rc = idem_tx_begin(gw->stores[i], 0, &tx);
            if (rc == 0)
                rc = idem_tx_exec(tx, "SELECT 1", 0, NULL, NULL);
            idem_tx_rollback(tx);
        }
        if (rc == 0) {
            json_t *doc = xcheck(
                json_pack("{s:s,s:s}", "status", "ready", "store", idem_store_kind(gw->store)));
            response_json(resp, 200, doc);
            json_decref(doc);
        } else {
            keyed_answer_unavailable(resp, "The store does not answer.");
        }
    } else if (strcmp(rq->path, "/metrics") == 0 && get) {
        metrics(gw, resp);
    } else if (strcmp(rq->path, "/records") == 0 && get) {
        show_record(gw, rq, resp);
    } else if (strcmp(rq->path, "/records/list") == 0 && get) {
        list_records(gw, rq, resp);
    } else if (strcmp(rq->path, "/records/resolve") == 0 && strcmp(rq->method, "POST") == 0) {
        resolve_record(gw, rq, resp);
    } else if (strcmp(rq->path, "/healthz") == 0 || strcmp(rq->path, "/readyz") == 0 ||
               strcmp(rq->path, "/metrics") == 0 || strcmp(rq->path, "/records") == 0 ||
               strcmp(rq->path, "/records/list") == 0) {
        response_set_header(resp, "Allow", "GET, HEAD");
        response_problem(resp, 405, "method-not-allowed", "Only GET and HEAD are allowed here.");
    } else if (strcmp(rq->path, "/records/resolve") == 0) {
        response_set_header(resp, "Allow", "POST");
        response_problem(resp, 405, "method-not-allowed", "Only POST is allowed here.");
    } else {
        response_problem(resp, 404, "not-found",
                         "The admin listener serves /healthz, /readyz, /metrics, /records, "
                         "/records/list and /records/resolve.");
    }
}

void admin_server_options(struct gateway *gw, struct http_server_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->handle = admin_handle;
    opts->on_head = admin_on_head;
    opts->ctx = gw;
    opts->ipv6 = 1;
    opts->stop_grace_s = 2;
    opts->limits.max_connections = 64;
    opts->limits.max_connections_per_ip = 64;
    opts->limits.loops = 1;
    opts->limits.workers = 2;
    opts->limits.queue = 64;
}
