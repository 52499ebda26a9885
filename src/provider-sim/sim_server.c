/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim_server.c - what provider-sim adds to the shared HTTP server (src/http/http_server.c):
 * requests go to api_dispatch(), IPv4 only, the address reusable at once, a short stop; and the
 * one thing orderd's server never does on purpose, a response dropped after the handler ran
 * (api.c sets `drop`), so the client gets no answer although the effect is committed.
 */
#include "sim_server.h"

#include "sim.h"
#include "sim_util.h"
#include "banned.h"

#define STOP_GRACE_S 5

static void handle(void *ctx, const struct request *rq, struct response *resp)
{
    api_dispatch(ctx, rq, resp);
}

static void server_line(void *ctx, const char *line)
{
    (void)ctx;
    log_msg(&sim_log, "warn", "%s", line);
}

int sim_http_start(struct sim *sim, const char *listen, struct http_server **out, char *err,
                   size_t errlen)
{
    struct http_server_options opts = {
        .handle = handle,
        .log = server_line,
        .ctx = sim,
        .stop_grace_s = STOP_GRACE_S,
        .limits = sim->cfg->http,
    };

    return http_server_start(&opts, listen, out, err, errlen);
}
