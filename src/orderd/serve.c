/*
 * serve.c - `orderd serve`.  Start-up is ordered so that nothing is served before it can be
 * answered truthfully: open the store, apply migrations, make the engine, listen, and only then
 * print the "listening" line tests and scripts wait for.  Stop signals are blocked in every
 * thread and taken synchronously by the main thread with sigwait(), so no signal handler and no
 * global flag are needed; the stop then unwinds in reverse order, letting in-flight requests end.
 */
#include "serve.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "idem/idem.h"

#include "app.h"
#include "auth.h"
#include "config.h"
#include "db.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "outbox.h"
#include "provider.h"
#include "recovery.h"
#include "schema.h"
#include "signals.h"
#include "sweeper.h"
#include "util.h"
#include "worker.h"
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

/* Starts the background workers (each may be off: interval 0). */
static int start_workers(struct app *app, struct worker w[WORKER_COUNT])
{
    const struct orderd_config *cfg = app->cfg;
    int rc = 0;

    rc |= worker_start(&w[WORKER_COMPLETER], app, WORKER_COMPLETER, cfg->completer_interval_ms,
                       RECOVERY_BATCH, completer_run);
    rc |= worker_start(&w[WORKER_RECONCILER], app, WORKER_RECONCILER,
                       app->provider ? cfg->reconciler_interval_ms : 0, RECOVERY_BATCH,
                       reconciler_run);
    rc |= worker_start(&w[WORKER_OUTBOX], app, WORKER_OUTBOX,
                       app->provider ? cfg->outbox_interval_ms : 0, 32, outbox_relay_run);
    rc |= worker_start(&w[WORKER_SWEEPER], app, WORKER_SWEEPER,
                       (int64_t)cfg->sweep_interval_s * 1000, SWEEP_BATCH * 20, sweeper_run);
    return rc;
}

int serve_run(const struct orderd_config *cfg)
{
    struct app app;
    struct idem_engine_options eng_opts;
    struct worker workers[WORKER_COUNT];
    struct http_server *srv = NULL;
    sigset_t stop_signals;
    char err[512];
    char *errmsg = NULL;
    int applied = 0;
    int status = 1;
    int rc;

    memset(&app, 0, sizeof app);
    memset(workers, 0, sizeof workers);

    /* Before any thread exists, so every thread inherits the mask. */
    stop_signals_block(&stop_signals);
    /* Before any thread: libcurl's global set-up is not thread-safe. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        log_msg(&app.log, "error", "curl_global_init failed");
        return 1;
    }

    app.cfg = cfg;
    app.log.format = cfg->log_format;
    app.metrics = metrics_new();
    idgen_init(&app.ids);
    /*
     * Half the pool at most for tokens the cache does not know: real ones keep the rest.  A pool
     * of one has no half to keep; its lookups queue on the pool itself.
     */
    app.tokens = auth_cache_new(AUTH_CACHE_TTL_MS, AUTH_CACHE_SLOTS,
                                cfg->db_pool >= 2 ? cfg->db_pool / 2 : 0);
    operation_init(&app.op_orders_create, "orders.create", cfg);
    operation_init(&app.op_orders_cancel, "orders.cancel", cfg);
    operation_init(&app.op_profile_update, "profile.update", cfg);
    if (cfg->test_hooks)
        log_msg(&app.log, "warn", "ORDERD_TEST_HOOKS=1: X-Test-* request headers are honoured");
    if (cfg->provider != NULL) {
        provider_open(cfg->provider, cfg->provider_timeout_ms, &app.provider);
        if (cfg->provider_timeout_ms >= cfg->lease_ms)
            log_msg(&app.log, "warn",
                    "--provider-timeout-ms %lld is not below --lease-ms %lld: a slow provider "
                    "call may outlive its lease (safe, but the work is then done twice)",
                    (long long)cfg->provider_timeout_ms, (long long)cfg->lease_ms);
    }
    if (cfg->webhook_secret == NULL && cfg->provider != NULL)
        log_msg(&app.log, "warn",
                "no --webhook-secret: POST /webhooks/provider refuses every "
                "webhook (401)");

    rc = db_open(cfg->db, cfg->db_pool, cfg->sync, &app.store, err, sizeof err);
    if (rc < 0) {
        log_msg(&app.log, "error", "%s", err);
        goto out;
    }
    rc = schema_migrate(app.store, &applied, &errmsg);
    if (rc < 0) {
        log_msg(&app.log, "error", "migrations failed: %s", errmsg ? errmsg : idem_strerror(rc));
        goto out;
    }
    if (applied > 0)
        log_msg(&app.log, "info", "applied %d migrations", applied);
    memset(&eng_opts, 0, sizeof eng_opts);
    eng_opts.replay_cache_bytes =
        cfg->replay_cache_mb > 0 ? (int64_t)cfg->replay_cache_mb << 20 : IDEM_REPLAY_CACHE_OFF;
    rc = idem_engine_new(app.store, &eng_opts, &app.engine);
    if (rc < 0) {
        log_msg(&app.log, "error", "cannot make the engine: %s", idem_strerror(rc));
        goto out;
    }
    if (orderd_http_start(&app, cfg->listen, &srv, err, sizeof err) != 0) {
        log_msg(&app.log, "error", "%s", err);
        goto out;
    }
    atomic_store(&app.http, srv);
    if (start_workers(&app, workers) != 0) {
        log_msg(&app.log, "error", "cannot start the background workers");
        goto out;
    }

    printf("orderd: listening on %s\n", http_server_url(srv));
    fflush(stdout);
    log_msg(&app.log, "info",
            "serving %s on %s (store %s, pool %d, lease %lld ms, wait %lld ms, provider %s)",
            IDEM_VERSION_STRING, http_server_url(srv), idem_store_kind(app.store), cfg->db_pool,
            (long long)cfg->lease_ms, (long long)cfg->wait_ms,
            cfg->provider ? cfg->provider : "none: orders are not charged");

    log_msg(&app.log, "info", "stopping on %s", stop_signals_wait(&stop_signals));
    status = 0;
out:
    http_server_stop(srv);
    for (int i = 0; i < WORKER_COUNT; i++)
        worker_stop(&workers[i]);
    provider_close(app.provider);
    idem_engine_free(app.engine);
    auth_cache_free(app.tokens);
    idem_store_close(app.store);
    idgen_destroy(&app.ids);
    metrics_free(app.metrics);
    idem_free(errmsg);
    curl_global_cleanup();
    if (status == 0)
        log_msg(&app.log, "info", "stopped");
    return status;
}
