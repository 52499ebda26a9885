/* SPDX-License-Identifier: Apache-2.0 */
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
#include "intake.h"
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

struct reload_arg {
    struct app *app;
    struct http_server *srv;
};

/* SIGHUP with --tls-cert: the certificate and key read again for new connections. */
static void reload_tls(void *arg)
{
    struct reload_arg *ra = arg;
    char err[512];

    if (http_server_reload_tls(ra->srv, err, sizeof err) < 0)
        log_msg(&ra->app->log, "error", "SIGHUP: kept the TLS certificate: %s", err);
    else
        log_msg(&ra->app->log, "info", "SIGHUP: the TLS certificate was read again");
}

int serve_run(const struct orderd_config *cfg)
{
    struct app app;
    struct worker workers[WORKER_COUNT];
    struct http_server *srv = NULL;
    struct http_server *metrics_srv = NULL;
    sigset_t stop_signals;
    char err[512];
    int applied = 0;
    int status = 1;
    int rc;

    memset(&app, 0, sizeof app);
    memset(workers, 0, sizeof workers);

    /* Before any thread exists, so every thread inherits the mask. */
    stop_signals_block(&stop_signals);
    if (cfg->http.tls_cert_file != NULL)
        reload_signal_block(&stop_signals);
    /* Before any thread: libcurl's global set-up is not thread-safe. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        log_msg(&app.log, "error", "curl_global_init failed");
        return 1;
    }

    app_init(&app, cfg);
    if (cfg->test_hooks)
        log_msg(&app.log, "warn", "ORDERD_TEST_HOOKS=1: X-Test-* request headers are honoured");
    if (cfg->provider != NULL) {
        provider_open(cfg->provider, cfg->provider_ca, cfg->provider_timeout_ms, &app.provider);
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

    rc = app_open_store(&app, &applied, err, sizeof err);
    if (rc < 0) {
        log_msg(&app.log, "error", "%s", err);
        goto out;
    }
    if (applied > 0)
        log_msg(&app.log, "info", "applied %d migrations", applied);
    if (orderd_http_start(&app, cfg->listen, &srv, err, sizeof err) != 0) {
        log_msg(&app.log, "error", "%s", err);
        goto out;
    }
    atomic_store(&app.http, srv);
    if (cfg->metrics_listen != NULL &&
        orderd_metrics_start(&app, cfg->metrics_listen, &metrics_srv, err, sizeof err) != 0) {
        log_msg(&app.log, "error", "--metrics-listen %s: %s", cfg->metrics_listen, err);
        goto out;
    }
    if (start_workers(&app, workers) != 0) {
        log_msg(&app.log, "error", "cannot start the background workers");
        goto out;
    }

    if (metrics_srv != NULL)
        printf("orderd: listening on %s (metrics %s)\n", http_server_url(srv),
               http_server_url(metrics_srv));
    else
        printf("orderd: listening on %s\n", http_server_url(srv));
    fflush(stdout);
    log_msg(&app.log, "info",
            "serving %s on %s (store %s, pool %d, lease %lld ms, wait %lld ms, provider %s)",
            IDEM_VERSION_STRING, http_server_url(srv), idem_store_kind(app.store), cfg->db_pool,
            (long long)cfg->lease_ms, (long long)cfg->wait_ms,
            cfg->provider ? cfg->provider : "none: orders are not charged");

    {
        struct reload_arg ra = {.app = &app, .srv = srv};
        log_msg(&app.log, "info", "stopping on %s",
                stop_signals_wait_reloading(&stop_signals, reload_tls, &ra));
    }
    status = 0;
out:
    http_server_stop(srv);
    http_server_stop(metrics_srv);
    for (int i = 0; i < WORKER_COUNT; i++)
        worker_stop(&workers[i]);
    provider_close(app.provider);
    app_close(&app);
    curl_global_cleanup();
    if (status == 0)
        log_msg(&app.log, "info", "stopped");
    return status;
}
