/* SPDX-License-Identifier: Apache-2.0 */
/*
 * app.c - making and freeing what one orderd holds (app.h), shared by `serve` and the request
 * fuzzer (fuzz/fuzz_orderd_request.c), so that both run orderd as it is configured.
 */
#include "app.h"

#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "db.h"
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
    app->metrics = metrics_new();
    idgen_init(&app->ids);
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

int app_open_store(struct app *app, int *applied, char *err, size_t errlen)
{
    const struct orderd_config *cfg = app->cfg;
    struct idem_engine_options eng_opts;
    char *errmsg = NULL;
    int rc;

    rc = db_open(cfg->db, cfg->db_pool, cfg->sync, &app->store, err, errlen);
    if (rc < 0)
        return rc;
    rc = schema_migrate(app->store, applied, &errmsg);
    if (rc < 0) {
        snprintf(err, errlen, "migrations failed: %s", errmsg ? errmsg : idem_strerror(rc));
        idem_free(errmsg);
        return rc;
    }
    memset(&eng_opts, 0, sizeof eng_opts);
    eng_opts.replay_cache_bytes =
        cfg->replay_cache_mb > 0 ? (int64_t)cfg->replay_cache_mb << 20 : IDEM_REPLAY_CACHE_OFF;
    rc = idem_engine_new(app->store, &eng_opts, &app->engine);
    if (rc < 0)
        snprintf(err, errlen, "cannot make the engine: %s", idem_strerror(rc));
    return rc;
}

void app_close(struct app *app)
{
    idem_engine_free(app->engine);
    auth_cache_free(app->tokens);
    idem_store_close(app->store);
    idgen_destroy(&app->ids);
    metrics_free(app->metrics);
    app->engine = NULL;
    app->tokens = NULL;
    app->store = NULL;
    app->metrics = NULL;
}
