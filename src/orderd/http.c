/*
 * http.c - what orderd adds to the shared HTTP server (src/common/http_server.c): requests go
 * to the router; a body over 1 MiB announced by its Content-Length is refused before its bytes
 * are read, and a chunked one is drained only up to DRAIN_MAX; every answered request is
 * recorded in the metrics and the log once its response is queued.
 */
#include "http.h"

#include "app.h"
#include "log.h"
#include "metrics.h"
#include "router.h"
#include "banned.h"

/* A chunked body past the cap is read and dropped so a 413 can be sent, up to this much. */
#define DRAIN_MAX ((size_t)64 << 20)
/* On stop, requests in flight get this long to finish before their connections are cut. */
#define STOP_GRACE_S 15

static void handle(void *ctx, const struct request *rq, struct response *resp)
{
    router_dispatch(ctx, rq, resp);
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

int orderd_http_start(struct app *app, const char *listen, struct http_server **out, char *err,
                      size_t errlen)
{
    struct http_server_options opts = {
        .handle = handle,
        .answered = answered,
        .log = server_line,
        .ctx = app,
        .ipv6 = 1,
        .refuse_early = 1,
        .drain_max = DRAIN_MAX,
        .stop_grace_s = STOP_GRACE_S,
    };

    return http_server_start(&opts, listen, out, err, errlen);
}
