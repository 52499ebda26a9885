/* SPDX-License-Identifier: Apache-2.0 */
/*
 * app.c - making and freeing what one orderd holds (app.h), shared by `serve` and the request
 * fuzzer (fuzz/fuzz_orderd_request.c), so that both run orderd as it is configured.
 */
#include "app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "db.h"
#include "prices.h"
#include "schema.h"
#include "util.h"
#include "banned.h"

static void operation_init(struct idem_operation *op, const char *name,
                           const struct orderd_config *cfg)
{
    memset(op, 0, sizeof *op);
    op->name = name;
    op->ttl_ms = ORDERD_DEFAULT_TTL_MS;
    op->lease_ms = cfg->lease_ms;
    /* 0 would mean "the default" to the engine; a configured 0 means "do not wait". */
    op->wait_ms = cfg->wait_ms > 0 ? cfg->wait_ms : 1;
}

void app_init(struct app *app, const struct orderd_config *cfg)
{
    memset(app, 0, sizeof *app);
    app->cfg = cfg;
    app->log.format = cfg->log_format;
    app->shard = "";
    app->metrics = metrics_new();
    app->ids = xcalloc(1, sizeof *app->ids);
    idgen_init(app->ids);
    app->prices = xcalloc(1, sizeof *app->prices);
    prices_init(app->prices);
    app->map_stale = xcalloc(1, sizeof *app->map_stale);
    atomic_init(app->map_stale, 0);
    /*
     * Half the pool at most for tokens the cache does not know: real ones keep the rest.  A pool
     * of one has no half to keep; its lookups queue on the pool itself.
     */
    app->tokens = auth_cache_new(AUTH_CACHE_TTL_MS, AUTH_CACHE_SLOTS,
                                 cfg->db_pool >= 2 ? cfg->db_pool / 2 : 0);
    operation_init(&app->op_orders_create, "orders.create", cfg);
    /* Its first phase calls nothing outside the store: the record is written with the order. */
    app->op_orders_create.one_phase = 1;
    operation_init(&app->op_orders_cancel, "orders.cancel", cfg);
    operation_init(&app->op_profile_update, "profile.update", cfg);
}

int app_db_is_shards(const char *db)
{
    return db != NULL && strncmp(db, "shards:", 7) == 0;
}

static int make_engine(struct app *app, struct idem_store *st, struct idem_engine **out, char *err,
                       size_t errlen)
{
    const struct orderd_config *cfg = app->cfg;
    struct idem_engine_options eng_opts;
    int rc;

    memset(&eng_opts, 0, sizeof eng_opts);
    eng_opts.replay_cache_bytes =
        cfg->replay_cache_mb > 0 ? (int64_t)cfg->replay_cache_mb << 20 : IDEM_REPLAY_CACHE_OFF;
    rc = idem_engine_new(st, &eng_opts, out);
    if (rc < 0)
        snprintf(err, errlen, "cannot make the engine: %s", idem_strerror(rc));
    return rc;
}

/* orderd's migrations, and a cluster's (`cluster` 1) or the catalogue's (2) on a shard set. */
static int migrate(struct idem_store *st, int cluster, const char *what, int *applied, char *err,
                   size_t errlen)
{
    char *errmsg = NULL;
    int n = 0, m = 0;
    int rc;

    rc = schema_migrate(st, &n, &errmsg);
    if (rc == 0 && cluster == 1)
        rc = schema_migrate_cluster(st, &m, &errmsg);
    else if (rc == 0 && cluster == 2)
        rc = schema_migrate_catalogue(st, &m, &errmsg);
    if (rc < 0 && what == NULL)
        snprintf(err, errlen, "migrations failed: %s", errmsg ? errmsg : idem_strerror(rc));
    else if (rc < 0)
        snprintf(err, errlen, "migrations of %s failed: %s", what,
                 errmsg ? errmsg : idem_strerror(rc));
    idem_free(errmsg);
    *applied += n + m;
    return rc;
}

/*
 * --db shards:URI: the set, the catalogue, and a view per cluster, each cluster migrated (its
 * application rows only refer to users and products of the catalogue by value).
 */
static int open_shards(struct app *app, int *applied, char *err, size_t errlen)
{
    const struct orderd_config *cfg = app->cfg;
    struct idem_store_options opts;
    char *errmsg = NULL;
    size_t i, n;
    int rc;

    if (cfg->catalogue == NULL) {
        snprintf(err, errlen, "--db shards:URI needs --catalogue URI (users, tokens, products)");
        return IDEM_EINVAL;
    }
    memset(&opts, 0, sizeof opts);
    opts.pool_size = cfg->db_pool;
    opts.sync = cfg->sync;
    rc = idem_shards_open(cfg->db + 7, &opts, &app->shards, &errmsg);
    if (rc < 0) {
        snprintf(err, errlen, "cannot open the shard set: %s", errmsg ? errmsg : idem_strerror(rc));
        idem_free(errmsg);
        return rc;
    }
    rc = db_open(cfg->catalogue, cfg->db_pool, cfg->sync, &app->catalogue, err, errlen);
    if (rc < 0)
        return rc;
    rc = migrate(app->catalogue, 2, "the catalogue", applied, err, errlen);
    if (rc < 0)
        return rc;
    n = idem_shards_count(app->shards);
    app->views = xcalloc(n, sizeof *app->views);
    app->nviews = n;
    for (i = 0; i < n; i++) {
        struct app *v = &app->views[i];
        v->store = idem_shards_store(app->shards, i);
        v->shard = idem_shards_name(app->shards, i);
        rc = migrate(v->store, 1, v->shard, applied, err, errlen);
        if (rc == 0)
            rc = make_engine(app, v->store, &v->engine, err, errlen);
        if (rc < 0)
            return rc;
    }
    /* Its stock is reserved on the catalogue first, a step of its own (stock.h). */
    app->op_orders_create.one_phase = 0;
    /* The context itself stands for the first cluster (health, requests of no user). */
    app->store = app->views[0].store;
    app->engine = app->views[0].engine;
    app->shard = app->views[0].shard;
    for (i = 0; i < n; i++) {
        struct app *v = &app->views[i];
        struct idem_store *st = v->store;
        struct idem_engine *eng = v->engine;
        const char *name = v->shard;
        *v = *app;
        v->store = st;
        v->engine = eng;
        v->shard = name;
    }
    return 0;
}

int app_open_store(struct app *app, int *applied, char *err, size_t errlen)
{
    const struct orderd_config *cfg = app->cfg;
    int rc;

    *applied = 0;
    if (app_db_is_shards(cfg->db))
        return open_shards(app, applied, err, errlen);
    if (cfg->catalogue != NULL) {
        snprintf(err, errlen, "--catalogue is for --db shards:URI only");
        return IDEM_EINVAL;
    }
    rc = db_open(cfg->db, cfg->db_pool, cfg->sync, &app->store, err, errlen);
    if (rc < 0)
        return rc;
    app->catalogue = app->store;
    app->views = app;
    app->nviews = 1;
    rc = migrate(app->store, 0, NULL, applied, err, errlen);
    if (rc < 0)
        return rc;
    return make_engine(app, app->store, &app->engine, err, errlen);
}

void app_close(struct app *app)
{
    if (app->shards != NULL) {
        for (size_t i = 0; app->views != NULL && i < app->nviews; i++)
            idem_engine_free(app->views[i].engine);
        free(app->views);
        idem_store_close(app->catalogue);
        idem_shards_close(app->shards);
    } else {
        idem_engine_free(app->engine);
        idem_store_close(app->store);
    }
    auth_cache_free(app->tokens);
    if (app->ids != NULL)
        idgen_destroy(app->ids);
    free(app->ids);
    if (app->prices != NULL)
        prices_destroy(app->prices);
    free(app->prices);
    free(app->map_stale);
    metrics_free(app->metrics);
    app->engine = NULL;
    app->tokens = NULL;
    app->store = NULL;
    app->catalogue = NULL;
    app->shards = NULL;
    app->views = NULL;
    app->nviews = 0;
    app->ids = NULL;
    app->prices = NULL;
    app->map_stale = NULL;
    app->metrics = NULL;
}

int app_route(struct app *app, const char *principal, int may_block, struct app **view)
{
    size_t i = 0;
    int rc;

    *view = app;
    if (app->shards == NULL)
        return 0;
    if (atomic_load(app->map_stale)) {
        if (!may_block)
            return 1;
        /* Cleared first: a refusal after this read marks it again. */
        atomic_store(app->map_stale, 0);
        if (idem_shards_refresh(app->shards) < 0)
            atomic_store(app->map_stale, 1);
    }
    rc = idem_shards_route(app->shards, principal, &i);
    if (rc == IDEM_EMOVED)
        atomic_store(app->map_stale, 1); /* moving: read the map until the move has ended */
    if (rc < 0)
        return rc;
    if (i >= app->nviews)
        return IDEM_ESTATE;
    *view = &app->views[i];
    return 0;
}

void app_store_failed(const struct app *app, int rc)
{
    if (app->shards != NULL && rc == IDEM_EMOVED)
        atomic_store(app->map_stale, 1);
}

int app_tx_begin(const struct app *app, const char *principal, int write, struct idem_tx **out)
{
    int rc;

    if (app->shards == NULL)
        return idem_tx_begin(app->store, write, out);
    rc = idem_shards_tx_begin(app->shards, principal, write, out);
    if (rc == IDEM_EMOVED) /* it read the map again: once more, on the owner it names now */
        rc = idem_shards_tx_begin(app->shards, principal, write, out);
    app_store_failed(app, rc);
    return rc;
}
