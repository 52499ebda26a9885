/*
 * serve.c - `orderd serve`.  Start-up is ordered so that nothing is served before it can be
 * answered truthfully: open the store, apply migrations, make the engine, listen, and only then
 * print the "listening" line tests and scripts wait for.  Stop signals are blocked in every
 * thread and taken synchronously by the main thread with sigwait(), so no signal handler and no
 * global flag are needed; the stop then unwinds in reverse order, letting in-flight requests end.
 */
#include "serve.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <pthread.h>

#include "idem/idem.h"

#include "app.h"
#include "config.h"
#include "db.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "schema.h"
#include "sweeper.h"
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

int serve_run(const struct orderd_config *cfg)
{
    struct app app;
    struct sweeper sw;
    struct http_server *srv = NULL;
    sigset_t stop_signals;
    char err[512];
    char *errmsg = NULL;
    int applied = 0;
    int status = 1;
    int sig = 0;
    int rc;

    memset(&app, 0, sizeof app);
    memset(&sw, 0, sizeof sw);

    /* Before any thread exists, so every thread inherits the mask. */
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    app.cfg = cfg;
    app.log.format = cfg->log_format;
    app.metrics = metrics_new();
    idgen_init(&app.ids);
    operation_init(&app.op_orders_create, "orders.create", cfg);
    operation_init(&app.op_orders_cancel, "orders.cancel", cfg);
    operation_init(&app.op_profile_update, "profile.update", cfg);
    if (cfg->test_hooks)
        log_msg(&app.log, "warn", "ORDERD_TEST_HOOKS=1: X-Test-* request headers are honoured");

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
    rc = idem_engine_new(app.store, NULL, &app.engine);
    if (rc < 0) {
        log_msg(&app.log, "error", "cannot make the engine: %s", idem_strerror(rc));
        goto out;
    }
    if (http_server_start(&app, cfg->listen, &srv, err, sizeof err) != 0) {
        log_msg(&app.log, "error", "%s", err);
        goto out;
    }
    if (sweeper_start(&sw, app.engine, cfg->sweep_interval_s, &app.log) != 0) {
        log_msg(&app.log, "error", "cannot start the retention sweeper");
        goto out;
    }

    printf("orderd: listening on %s\n", http_server_url(srv));
    fflush(stdout);
    log_msg(&app.log, "info", "serving %s on %s (store %s, pool %d, lease %lld ms, wait %lld ms)",
            IDEM_VERSION_STRING, http_server_url(srv), idem_store_kind(app.store), cfg->db_pool,
            (long long)cfg->lease_ms, (long long)cfg->wait_ms);

    while (sigwait(&stop_signals, &sig) != 0)
        ;
    log_msg(&app.log, "info", "stopping on %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
    status = 0;
out:
    sweeper_stop(&sw);
    http_server_stop(srv);
    idem_engine_free(app.engine);
    idem_store_close(app.store);
    idgen_destroy(&app.ids);
    metrics_free(app.metrics);
    idem_free(errmsg);
    if (status == 0)
        log_msg(&app.log, "info", "stopped");
    return status;
}
