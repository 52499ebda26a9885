/*
 * app.h - the server context: what every request handler may use, built once by serve.c and
 * passed down explicitly (no global server struct).  Handlers read it; the parts that change
 * (metrics, the order id generator) guard themselves.
 */
#ifndef ORDERD_APP_H
#define ORDERD_APP_H

#include <stdatomic.h>

#include "idem/idem.h"

#include "config.h"
#include "idgen.h"
#include "log.h"
#include "metrics.h"

struct auth_cache;
struct http_server;
struct provider;

struct app {
    const struct orderd_config *cfg;
    struct provider *provider; /* NULL without --provider: orders are not charged */
    struct logger log;
    struct idem_store *store;
    struct idem_engine *engine;
    struct auth_cache *tokens; /* bearer token -> user, trusted for AUTH_CACHE_TTL_MS */
    struct metrics *metrics;
    struct idgen ids;
    /* The HTTP server, once started (its counters on /metrics); requests may come before. */
    struct http_server *_Atomic http;

    /* The published policies of the idempotent operations. */
    struct idem_operation op_orders_create;
    struct idem_operation op_orders_cancel;
    struct idem_operation op_profile_update;
};

#endif /* ORDERD_APP_H */
