/* SPDX-License-Identifier: Apache-2.0 */
/*
 * app.h - the server context: what every request handler may use, built once by serve.c and
 * passed down explicitly (no global server struct).  Handlers read it; the parts that change
 * (metrics, the order id generator) guard themselves.
 *
 * On a shard set (--db shards:URI, docs/shards.md) there is one view of the context per cluster:
 * a copy whose store and engine are that cluster's, everything else shared.  A request takes the
 * view of its user's cluster once the token names the user, so every handler below the router
 * runs its calls and its transactions there without knowing about shards.  With one store the
 * only view is the context itself.
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
struct prices;
struct provider;

struct app {
    const struct orderd_config *cfg;
    struct provider *provider; /* NULL without --provider: orders are not charged */
    struct logger log;
    struct idem_store *store;   /* this view's cluster (the store itself without shards) */
    struct idem_engine *engine; /* its engine */
    /* Users, tokens and products: the --catalogue store on a shard set, else `store`. */
    struct idem_store *catalogue;
    struct idem_shards *shards; /* --db shards:URI; NULL for one store */
    const char *shard;          /* this view's cluster name; "" without shards */
    size_t nviews;              /* 1, or the clusters of the set */
    struct app *views;          /* [nviews]: views[i] runs on cluster i; the context itself at 1 */
    atomic_int *map_stale;      /* a write was refused as moved: read the map before routing */
    struct auth_cache *tokens;  /* bearer token -> user, trusted for AUTH_CACHE_TTL_MS */
    struct metrics *metrics;
    struct idgen *ids;
    struct prices *prices; /* what each product last sold at (orders.c's held-back writes) */
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

/* Whether `db` names a shard set ("shards:DIRECTORY_URI"). */
int app_db_is_shards(const char *db);

/*
 * The view of `principal`'s cluster into *view (borrowed from `app`, which may be any view).
 * Returns 0; IDEM_EMOVED while the principal's bucket is moving (answer 503 with a Retry-After);
 * or, when a refusal marked the map stale and `may_block` is 0, 1: ask again where a blocking
 * read of the directory is allowed.  Without shards *view is `app` and nothing is read.
 */
int app_route(struct app *app, const char *principal, int may_block, struct app **view);

/*
 * Says that a call of this view failed with `rc`: IDEM_EMOVED marks the map stale, so the next
 * route reads it again (no-op without shards or for another code).
 */
void app_store_failed(const struct app *app, int rc);

/*
 * A transaction of the application's own rows of `principal` on its cluster: idem_tx_begin() on
 * the store without shards, idem_shards_tx_begin() (fenced) on a set, tried once more after a
 * refusal as moved.  Returns what those return.
 */
int app_tx_begin(const struct app *app, const char *principal, int write, struct idem_tx **out);

#endif /* ORDERD_APP_H */
