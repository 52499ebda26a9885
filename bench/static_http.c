/* SPDX-License-Identifier: Apache-2.0 */
/*
 * static_http.c - the HTTP ceiling of the replay and fresh-order targets: orderd's own server
 * layer (src/http/http_server.c: the same event loops, parser, limits and response writer) with
 * no work behind it.  Every request is read, body included, and answered on the loop with a fixed
 * small JSON, as a replay from orderd's cache is, so the gap between the two is what orderd's
 * own work costs.
 *
 *   static_http [--listen 127.0.0.1:0] [HTTP limit flags, as orderd serve takes them]
 *
 * Prints "static_http: listening on http://127.0.0.1:PORT" on stdout once it listens; SIGINT or
 * SIGTERM stops it.  A benchmark fixture, not a server.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_server.h"
#include "signals.h"
#include "util.h"
#include "banned.h"

const char program_name[] = "static_http";

/* About the size of a stored order response (orderd's 201 body is ~230 bytes). */
static const char body[] =
    "{\"orderId\":\"ord_00000000000000000000000000000000\",\"status\":\"created\","
    "\"productId\":\"p-1024\",\"quantity\":1,\"unitPrice\":1999,\"amount\":1999,"
    "\"currency\":\"EUR\",\"createdAt\":\"2026-12-02T13:00:00.000Z\"}";

static void answer(struct response *resp)
{
    resp->status = 201;
    response_set_header(resp, "Content-Type", CONTENT_TYPE_JSON);
    response_set_body(resp, body, sizeof body - 1);
}

static enum http_loop_verdict on_loop(void *ctx, const struct request *rq, struct response *resp,
                                      struct http_park *park)
{
    (void)ctx;
    (void)rq;
    (void)park;
    answer(resp);
    return HTTP_LOOP_ANSWERED;
}

/* Never reached (every request is answered on the loop); the server needs a handler. */
static void handle(void *ctx, const struct request *rq, struct response *resp)
{
    (void)ctx;
    (void)rq;
    answer(resp);
}

static const struct option options[] = {
    {"listen", required_argument, NULL, 'l'},
    HTTP_LIMITS_OPTIONS /* --max-connections and the other limits */
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int main(int argc, char **argv)
{
    struct http_server_options opts = {.handle = handle, .on_loop = on_loop, .stop_grace_s = 1};
    struct http_server *srv = NULL;
    const char *listen = "127.0.0.1:0";
    sigset_t set;
    char err[320];
    int longindex = 0;
    int c;

    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", options, &longindex)) != -1) {
        if (c == 'l') {
            listen = optarg;
        } else if (c == HTTP_LIMITS_OPT) {
            const char *name = options[longindex].name;
            if (http_limits_flag(&opts.limits, name, optarg, err, sizeof err) < 0) {
                fprintf(stderr, "static_http: %s\n", err);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: static_http [--listen 127.0.0.1:PORT] [limit flags]\n%s",
                    http_limits_help);
            return c == 'h' ? 0 : 2;
        }
    }
    stop_signals_block(&set);
    if (http_server_start(&opts, listen, &srv, err, sizeof err) != 0) {
        fprintf(stderr, "static_http: %s\n", err);
        return 1;
    }
    printf("static_http: listening on %s\n", http_server_url(srv));
    fflush(stdout);
    stop_signals_wait(&set);
    http_server_stop(srv);
    return 0;
}
