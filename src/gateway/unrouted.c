/* SPDX-License-Identifier: Apache-2.0 */
/*
 * unrouted.c - requests with a key on no route (unrouted.h): the key headers the routes read, a
 * set of the method + path pairs already warned about, and the counter.
 *
 * The set holds 64-bit hashes (FNV-1a) of "METHOD PATH", open addressing in a fixed table: a
 * client that sends keys to a million paths costs UNROUTED_PATHS entries and, past them, one log
 * line a minute, never memory or a line per request.  A collision only means one path's warning
 * is not repeated; the counter counts every request.
 */
#include "unrouted.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ascii.h"
#include "clock.h"
#include "config.h"
#include "http_server.h"
#include "log.h"
#include "response.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define UNROUTED_PATHS 1024 /* a power of two */
#define UNROUTED_OVERFLOW_MS 60000

struct unrouted {
    const struct gw_config *cfg;
    char **headers; /* the key headers of the routes, each once ("Idempotency-Key" always) */
    size_t nheaders;
    pthread_mutex_t mu;
    uint64_t seen[UNROUTED_PATHS]; /* 0: empty */
    size_t nseen;
    int64_t overflow_warned_ms; /* the last warning about a path past the table, or 0 */
    atomic_uint_fast64_t count;
};

static void add_header(struct unrouted *u, const char *name)
{
    for (size_t i = 0; i < u->nheaders; i++)
        if (ascii_caseeq(u->headers[i], name))
            return;
    u->headers = xrealloc(u->headers, (u->nheaders + 1) * sizeof *u->headers);
    u->headers[u->nheaders++] = xstrdup(name);
}

struct unrouted *unrouted_new(const struct gw_config *cfg)
{
    struct unrouted *u = xcalloc(1, sizeof *u);

    u->cfg = cfg;
    add_header(u, "Idempotency-Key");
    for (size_t i = 0; i < cfg->nroutes; i++)
        if (cfg->routes[i].key_source == GW_KEY_HEADER && cfg->routes[i].key_header)
            add_header(u, cfg->routes[i].key_header);
    pthread_mutex_init(&u->mu, NULL);
    return u;
}

void unrouted_free(struct unrouted *u)
{
    if (!u)
        return;
    for (size_t i = 0; i < u->nheaders; i++)
        free(u->headers[i]);
    free(u->headers);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

const char *unrouted_key_header(const struct unrouted *u, const struct request *rq)
{
    /* A read is safe to repeat by itself: a client that sends its key on every request is fine. */
    static const char *const safe[] = {"GET", "HEAD", "OPTIONS", "TRACE"};

    for (size_t i = 0; i < sizeof safe / sizeof safe[0]; i++)
        if (strcmp(rq->method, safe[i]) == 0)
            return NULL;
    for (size_t i = 0; i < u->nheaders; i++)
        if (request_header(rq, u->headers[i]) != NULL)
            return u->headers[i];
    return NULL;
}

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Whether this is the first time `hash` is seen (and so worth a warning); 0 with the table full. */
static int first_seen(struct unrouted *u, uint64_t hash, int *full)
{
    size_t i = (size_t)hash & (UNROUTED_PATHS - 1);

    *full = 0;
    for (size_t probes = 0; probes < UNROUTED_PATHS; probes++, i = (i + 1) & (UNROUTED_PATHS - 1)) {
        if (u->seen[i] == hash)
            return 0;
        if (u->seen[i] == 0) {
            if (u->nseen >= UNROUTED_PATHS / 2) /* keep probes short */
                break;
            u->seen[i] = hash;
            u->nseen++;
            return 1;
        }
    }
    *full = 1;
    return 0;
}

/* "POST /v1/payments, POST /v1/refunds" (at most ~300 bytes, then "..."). */
static void list_routes(const struct gw_config *cfg, struct strbuf *out)
{
    for (size_t i = 0; i < cfg->nroutes; i++) {
        if (out->len > 300) {
            strbuf_adds(out, ", ...");
            return;
        }
        strbuf_addf(out, "%s%s %s", i ? ", " : "", cfg->routes[i].method, cfg->routes[i].path);
    }
    if (cfg->nroutes == 0)
        strbuf_adds(out, "none");
}

int unrouted_note(struct unrouted *u, const struct logger *lg, const struct request *rq,
                  const char *header, struct response *resp)
{
    uint64_t hash = fnv1a(fnv1a(fnv1a(0xcbf29ce484222325ULL, rq->method), " "), rq->path);
    struct strbuf routes = STRBUF_INIT, path = STRBUF_INIT;
    int warn, full;

    atomic_fetch_add(&u->count, 1);
    pthread_mutex_lock(&u->mu);
    warn = first_seen(u, hash ? hash : 1, &full);
    if (full && clock_mono_ms() - u->overflow_warned_ms >= UNROUTED_OVERFLOW_MS) {
        u->overflow_warned_ms = clock_mono_ms();
        warn = 1;
    }
    pthread_mutex_unlock(&u->mu);

    if (warn || u->cfg->unrouted_keys == GW_UNROUTED_REFUSE)
        list_routes(u->cfg, &routes);
    if (warn) {
        log_escape_text(&path, rq->path);
        log_msg(lg, "warning",
                "%s %s carries %s but no route takes it, so its retries are not protected%s; "
                "is a route mistyped? the routes: %s%s",
                rq->method, path.buf, header,
                u->cfg->unrouted_keys == GW_UNROUTED_REFUSE ? " (refused)" : " (passed through)",
                routes.buf, full ? " (and more paths: this warning comes once a minute)" : "");
    }
    if (u->cfg->unrouted_keys == GW_UNROUTED_REFUSE) {
        struct strbuf detail = STRBUF_INIT;
        strbuf_addf(&detail,
                    "This request carries %s, but this gateway keeps idempotency records for "
                    "none of its method and path, so a retry of it would run again. The routes "
                    "that are: %s.",
                    header, routes.buf);
        response_problem(resp, 400, "idempotency-key-unrouted", detail.buf);
        resp->outcome = "refused";
        strbuf_release(&detail);
    }
    strbuf_release(&routes);
    strbuf_release(&path);
    return u->cfg->unrouted_keys == GW_UNROUTED_REFUSE;
}

uint64_t unrouted_count(const struct unrouted *u)
{
    return atomic_load(&u->count);
}

void unrouted_render(const struct unrouted *u, struct strbuf *out)
{
    strbuf_addf(out,
                "# HELP idem_gateway_unrouted_keys_total Requests that carried an idempotency key "
                "to a method and path no route takes (a mistyped route?).\n"
                "# TYPE idem_gateway_unrouted_keys_total counter\n"
                "idem_gateway_unrouted_keys_total %llu\n",
                (unsigned long long)unrouted_count(u));
}
