/* SPDX-License-Identifier: Apache-2.0 */
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

/*
 * Fills `app` for `cfg` (borrowed): log, metrics, ids, the token cache and the operations'
 * policies; nothing that can fail.
 */
void app_init(struct app *app, const struct orderd_config *cfg);

/*
 * Opens the store of app->cfg, applies the migrations (*applied receives how many ran) and makes
 * the engine.  Returns 0, or a negative IDEM_E* with a sentence in `err`.
 */
int app_open_store(struct app *app, int *applied, char *err, size_t errlen);

/* Frees what app_init and app_open_store made (not the provider, not the HTTP server). */
void app_close(struct app *app);

#endif /* ORDERD_APP_H */
