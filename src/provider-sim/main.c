/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - provider-sim's command line and lifecycle.  A payment + email provider simulator that
 * honours its own Idempotency-Key (with libidem, in its own SQLite file), sends duplicated,
 * signed webhooks, and injects the faults a client of a real provider must survive: latency, 5xx,
 * and "charged, but the response was lost".  Exit codes as orderd's: 0 clean stop, 1 it did not
 * work, 2 wrong command line.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "idem/idem.h"

#include "faults.h"
#include "http_limits_options.h"
#include "options.h"
#include "sim_server.h"
#include "schema.h"
#include "signals.h"
#include "sim.h"
#include "sim_util.h"
#include "webhook_sender.h"
#include "banned.h"

static const char usage[] =
    "Usage: provider-sim [options]\n"
    "\n"
    "A payment and email provider simulator for idem's tests and demos.  POST /v1/charges,\n"
    "/v1/refunds and /v1/emails require an Idempotency-Key; webhooks are signed with\n"
    "HMAC-SHA256.  Once listening, prints 'provider-sim: listening on http://HOST:PORT' on\n"
    "stdout; logs go to stderr.  SIGINT or SIGTERM stops it.\n"
    "\n"
    "Options:\n";

static int version_option(struct options *o, const struct option_row *row, const char *arg)
{
    (void)o;
    (void)row;
    (void)arg;
    printf("provider-sim %s (libidem %s)\n", IDEM_VERSION_STRING, IDEM_VERSION_STRING);
    return 0;
}

static int faults_from_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (arg[0] == '\0')
        return options_error(o, "%s", "--faults-from needs loopback, any or addresses");
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

static int listen_option(struct options *o, const struct option_row *row, const char *arg)
{
    const char *colon = strrchr(arg, ':');
    int64_t port = 0;

    if (colon == NULL || colon == arg || strchr(arg, ':') != colon ||
        parse_int64(colon + 1, 0, 65535, &port) != 0)
        return options_error(o, "--listen must be HOST:PORT (IPv4, port 0..65535), not '%s'", arg);
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

static int db_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (strncmp(arg, "sqlite:", 7) != 0 && strncmp(arg, "postgres", 8) != 0)
        return options_error(o, "--db must be sqlite:PATH (or a postgresql:// URI), not '%s'", arg);
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

static int webhook_url_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (strncmp(arg, "http://", 7) != 0 && strncmp(arg, "https://", 8) != 0)
        return options_error(o, "--webhook-url must be an http:// or https:// URL, not '%s'", arg);
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

static int webhook_secret_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (arg[0] == '\0')
        return options_error(o, "--webhook-secret must not be empty");
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

static int parse_args(struct sim_config *cfg, int argc, char **argv)
{
    struct fault_settings *f = &cfg->faults;
    const struct option_row rows[] = {
        OPT_CALLBACK(0, "listen", &cfg->listen, "HOST:PORT",
                     "address (default " SIM_DEFAULT_LISTEN "); port 0 picks one", listen_option),
        OPT_CALLBACK(0, "db", &cfg->db, "sqlite:PATH", "store (default " SIM_DEFAULT_DB ")",
                     db_option),
        OPT_CALLBACK(0, "webhook-url", &cfg->webhook_url, "URL",
                     "POST events here (charge.succeeded, refund.succeeded)", webhook_url_option),
        OPT_CALLBACK(0, "webhook-secret", &cfg->webhook_secret, "S",
                     "HMAC key for the Provider-Signature header (required with\n"
                     "--webhook-url; or set PROVIDER_SIM_WEBHOOK_SECRET)",
                     webhook_secret_option),
        OPT_INT64(0, "webhook-backoff-max-ms", &cfg->webhook_backoff_max_ms, "N", 100,
                  FAULTS_MAX_MS, "longest pause between delivery attempts (default 2000)"),
        OPT_INT64(0, "webhook-timeout-ms", &cfg->webhook_timeout_ms, "N", 100, FAULTS_MAX_MS,
                  "timeout of one delivery attempt (default 5000)"),
        OPT_TEXT("Faults (also at run time: POST /v1/faults {\"lost_rate\":0.2,...}):\n"),
        OPT_INT64(0, "latency-ms", &f->latency_ms, "N", 0, FAULTS_MAX_MS,
                  "added to every POST (default 0)"),
        OPT_INT64(0, "latency-jitter-ms", &f->latency_jitter_ms, "N", 0, FAULTS_MAX_MS,
                  "plus a random 0..N ms (default 0)"),
        OPT_DOUBLE(0, "fail-rate", &f->fail_rate, "R", 0.0, 1.0,
                   "share of POSTs answered 503, nothing done (0..1, default 0)"),
        OPT_DOUBLE(0, "lost-rate", &f->lost_rate, "R", 0.0, 1.0,
                   "share of POSTs done, then the connection closed with no\n"
                   "response (0..1, default 0)"),
        OPT_INT64(0, "slow-ms", &f->slow_ms, "N", 0, FAULTS_MAX_MS,
                  "how long a tok_slow charge takes (default 3000)"),
        OPT_INT(0, "webhook-dup", &f->webhook_dup, "N", 1, FAULTS_MAX_DUP,
                "deliver every event N times, 1..10 (default 1)"),
        OPT_INT64(0, "webhook-delay-ms", &f->webhook_delay_ms, "N", 0, FAULTS_MAX_MS,
                  "wait before the first delivery (default 0)"),
        OPT_CALLBACK(0, "faults-from", &cfg->faults_from, "WHO",
                     "who may use /v1/faults: loopback (default: 127.0.0.0/8 and\n"
                     "::1), any, or a comma-separated list of client addresses",
                     faults_from_option),
        OPT_HELP("show this help"),
        OPT_CALLBACK(0, "version", NULL, NULL, "show the version", version_option),
        OPT_TEXT("\n"),
        OPT_HTTP_LIMITS(&cfg->http), /* --max-connections and the other limits */
        OPT_HTTP_TLS(&cfg->http),    /* --tls-cert, --tls-key */
        OPT_END(),
    };
    struct options o = {.prog = "provider-sim", .usage = usage, .rows = rows, .column = 30};
    int status;

    status = options_parse(&o, argc, argv);
    if (status < 0 && o.next < argc)
        status = options_error(&o, "unexpected argument '%s'", argv[o.next]);
    if (status < 0 && cfg->webhook_url != NULL && cfg->webhook_secret == NULL)
        status = options_error(&o, "--webhook-url needs --webhook-secret (or "
                                   "PROVIDER_SIM_WEBHOOK_SECRET) to sign the deliveries");
    return status;
}

static void operation_init(struct idem_operation *op, const char *name)
{
    memset(op, 0, sizeof *op);
    op->name = name;
    op->ttl_ms = 24LL * 3600 * 1000;
    op->lease_ms = 30000;
    op->wait_ms = 1000;
}

/* SIGHUP with --tls-cert: the certificate and key read again for new connections. */
static void reload_tls(void *arg)
{
    char err[512];

    if (http_server_reload_tls(arg, err, sizeof err) < 0)
        log_msg(&sim_log, "error", "SIGHUP: kept the TLS certificate: %s", err);
    else
        log_msg(&sim_log, "info", "SIGHUP: the TLS certificate was read again");
}

static int run(const struct sim_config *cfg)
{
    struct sim sim = {0};
    struct idem_store_options so = {.pool_size = 16};
    struct http_server *srv = NULL;
    sigset_t stop_signals;
    char err[512];
    char *errmsg = NULL;
    int status = 1;
    int rc;

    stop_signals_block(&stop_signals);
    if (cfg->http.tls_cert_file != NULL)
        reload_signal_block(&stop_signals);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        log_msg(&sim_log, "error", "curl_global_init failed");
        return 1;
    }
    sim.cfg = cfg;
    faults_init(&sim.faults, &cfg->faults);
    operation_init(&sim.op_charges, "charges.create");
    operation_init(&sim.op_refunds, "refunds.create");
    operation_init(&sim.op_emails, "emails.create");

    rc = idem_store_open(cfg->db, &so, &sim.store, &errmsg);
    if (rc < 0) {
        log_msg(&sim_log, "error", "cannot open the store: %s",
                errmsg ? errmsg : idem_strerror(rc));
        goto out;
    }
    idem_free(errmsg);
    errmsg = NULL;
    rc = schema_migrate(sim.store, NULL, &errmsg);
    if (rc < 0) {
        log_msg(&sim_log, "error", "migrations failed: %s", errmsg ? errmsg : idem_strerror(rc));
        goto out;
    }
    rc = idem_engine_new(sim.store, NULL, &sim.engine);
    if (rc < 0) {
        log_msg(&sim_log, "error", "cannot make the engine: %s", idem_strerror(rc));
        goto out;
    }
    if (cfg->webhook_url != NULL &&
        webhooks_start(&sim, cfg->webhook_url, cfg->webhook_secret, &sim.webhooks) != 0) {
        log_msg(&sim_log, "error", "cannot start the webhook senders");
        goto out;
    }
    if (sim_http_start(&sim, cfg->listen, &srv, err, sizeof err) != 0) {
        log_msg(&sim_log, "error", "%s", err);
        goto out;
    }
    printf("provider-sim: listening on %s\n", http_server_url(srv));
    fflush(stdout);
    log_msg(&sim_log, "info",
            "serving on %s (store %s; webhooks %s; faults: latency %lld+%lld ms, fail %.2f, "
            "lost %.2f, dup %d, delay %lld ms)",
            http_server_url(srv), cfg->db, cfg->webhook_url ? cfg->webhook_url : "off",
            (long long)cfg->faults.latency_ms, (long long)cfg->faults.latency_jitter_ms,
            cfg->faults.fail_rate, cfg->faults.lost_rate, cfg->faults.webhook_dup,
            (long long)cfg->faults.webhook_delay_ms);
    log_msg(&sim_log, "info", "stopping on %s",
            stop_signals_wait_reloading(&stop_signals, reload_tls, srv));
    status = 0;
out:
    http_server_stop(srv);
    webhooks_stop(sim.webhooks);
    idem_engine_free(sim.engine);
    idem_store_close(sim.store);
    faults_destroy(&sim.faults);
    idem_free(errmsg);
    curl_global_cleanup();
    return status;
}

int main(int argc, char **argv)
{
    struct sim_config cfg;
    const char *secret = getenv("PROVIDER_SIM_WEBHOOK_SECRET");
    int status;

    memset(&cfg, 0, sizeof cfg);
    cfg.listen = SIM_DEFAULT_LISTEN;
    cfg.db = SIM_DEFAULT_DB;
    cfg.webhook_backoff_max_ms = 2000;
    cfg.webhook_timeout_ms = 5000;
    if (secret != NULL && secret[0] != '\0')
        cfg.webhook_secret = secret;
    fault_settings_default(&cfg.faults);
    cfg.faults_from = "loopback";
    status = parse_args(&cfg, argc, argv);
    if (status >= 0)
        return status;
    return run(&cfg);
}
