/* SPDX-License-Identifier: Apache-2.0 */
/*
 * intake.c - what orderd adds to the shared HTTP server (src/http/http_server.c): the head of a
 * request is checked (route, bearer token, content type) before any body byte is read, from
 * the token cache on the event loop or from the store on a worker; complete requests go to the
 * router on a worker; every answered request is recorded in the metrics and the log.
 */
#include "intake.h"

#include <string.h>

#include "app.h"
#include "config.h"
#include "health.h"
#include "log.h"
#include "metrics.h"
#include "router.h"
#include "banned.h"

/* On stop, requests in flight get this long to finish before their connections are cut. */
#define STOP_GRACE_S 15

static void handle(void *ctx, const struct request *rq, struct response *resp)
{
    router_dispatch(ctx, rq, resp);
}

static enum http_head_verdict on_head(void *ctx, struct request *rq, struct response *resp,
                                      int may_block)
{
    return router_check_head(ctx, rq, resp, may_block);
}

static enum http_loop_verdict on_loop(void *ctx, const struct request *rq, struct response *resp,
                                      struct http_park *park)
{
    return router_answer_on_loop(ctx, rq, resp, park);
}

static enum http_loop_verdict on_unpark(void *ctx, const struct request *rq, struct response *resp,
                                        void *data, int timed_out, struct http_park *park)
{
    return router_unpark(ctx, rq, resp, data, timed_out, park);
}

static const char *outcome_of(const struct response *resp)
{
    if (resp->outcome != NULL)
        return resp->outcome;
    if (resp->status >= 500)
        return "error";
    if (resp->status >= 400)
        return "rejected";
    return "none";
}

static void answered(void *ctx, const struct request *rq, const struct response *resp,
                     double seconds)
{
    struct app *app = ctx;

    metrics_observe(app->metrics, resp->operation, outcome_of(resp), seconds);
    log_request(&app->log, rq->method, rq->path, resp->status, outcome_of(resp), seconds * 1000.0,
                resp->principal);
}

static void server_line(void *ctx, const char *line)
{
    const struct app *app = ctx;

    log_msg(&app->log, "warn", "%s", line);
}

/* The metrics listener's one route (--metrics-listen). */
static void metrics_handle(void *ctx, const struct request *rq, struct response *resp)
{
    struct call_ctx cx;

    memset(&cx, 0, sizeof cx);
    cx.app = ctx;
    cx.rq = rq;
    resp->operation = "metrics";
    if (strcmp(rq->path, "/metrics") != 0) {
        response_problem(resp, 404, "not-found", "The metrics listener serves /metrics only.");
    } else if (strcmp(rq->method, "GET") != 0 && strcmp(rq->method, "HEAD") != 0) {
        response_set_header(resp, "Allow", "GET, HEAD");
        response_problem(resp, 405, "method-not-allowed", "GET /metrics.");
    } else {
        health_metrics(&cx, resp);
    }
}

int orderd_metrics_start(struct app *app, const char *listen, struct http_server **out, char *err,
                         size_t errlen)
{
    /* A scraper or two, never the public: small limits, one loop, two workers. */
    struct http_server_options opts = {
        .handle = metrics_handle,
        .log = server_line,
        .ctx = app,
        .ipv6 = 1,
        .stop_grace_s = 2,
        .limits = {.max_connections = 64,
                   .max_connections_per_ip = 64,
                   .loops = 1,
                   .workers = 2,
                   .queue = 64},
    };

    return http_server_start(&opts, listen, out, err, errlen);
}

int orderd_http_start(struct app *app, const char *listen, struct http_server **out, char *err,
                      size_t errlen)
{
    struct http_server_options opts = {
        .handle = handle,
        .on_head = on_head,
        .on_loop = on_loop,
        .on_unpark = on_unpark,
        .answered = answered,
        .before_wait = log_before_wait,
        .log = server_line,
        .ctx = app,
        .ipv6 = 1,
        .stop_grace_s = STOP_GRACE_S,
        .limits = app->cfg->http,
    };

    return http_server_start(&opts, listen, out, err, errlen);
}
