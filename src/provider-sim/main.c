/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - provider-sim's command line and lifecycle.  A payment + email provider simulator that
 * honours its own Idempotency-Key (with libidem, in its own SQLite file), sends duplicated,
 * signed webhooks, and injects the faults a client of a real provider must survive: latency, 5xx,
 * and "charged, but the response was lost".  Exit codes as orderd's: 0 clean stop, 1 it did not
 * work, 2 wrong command line.
 */
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "idem/idem.h"

#include "faults.h"
#include "sim_server.h"
#include "schema.h"
#include "signals.h"
#include "sim.h"
#include "sim_util.h"
#include "webhook_sender.h"
#include "banned.h"

#define EXIT_USAGE 2

static const char usage[] =
    "Usage: provider-sim [options]\n"
    "\n"
    "A payment and email provider simulator for idem's tests and demos.  POST /v1/charges,\n"
    "/v1/refunds and /v1/emails require an Idempotency-Key; webhooks are signed with\n"
    "HMAC-SHA256.  Once listening, prints 'provider-sim: listening on http://HOST:PORT' on\n"
    "stdout; logs go to stderr.  SIGINT or SIGTERM stops it.\n"
    "\n"
    "Options:\n"
    "  --listen HOST:PORT          address (default " SIM_DEFAULT_LISTEN "); port 0 picks one\n"
    "  --db sqlite:PATH            store (default " SIM_DEFAULT_DB ")\n"
    "  --webhook-url URL           POST events here (charge.succeeded, refund.succeeded)\n"
    "  --webhook-secret S          HMAC key for the Provider-Signature header (required with\n"
    "                              --webhook-url; or set PROVIDER_SIM_WEBHOOK_SECRET)\n"
    "  --webhook-backoff-max-ms N  longest pause between delivery attempts (default 2000)\n"
    "  --webhook-timeout-ms N      timeout of one delivery attempt (default 5000)\n"
    "Faults (also at run time: POST /v1/faults {\"lost_rate\":0.2,...}):\n"
    "  --latency-ms N              added to every POST (default 0)\n"
    "  --latency-jitter-ms N       plus a random 0..N ms (default 0)\n"
    "  --fail-rate R               share of POSTs answered 503, nothing done (0..1, default 0)\n"
    "  --lost-rate R               share of POSTs done, then the connection closed with no\n"
    "                              response (0..1, default 0)\n"
    "  --slow-ms N                 how long a tok_slow charge takes (default 3000)\n"
    "  --webhook-dup N             deliver every event N times, 1..10 (default 1)\n"
    "  --webhook-delay-ms N        wait before the first delivery (default 0)\n"
    "  --faults-from WHO           who may use /v1/faults: loopback (default: 127.0.0.0/8 and\n"
    "                              ::1), any, or a comma-separated list of client addresses\n"
    "  -h, --help                  show this help\n"
    "  --version                   show the version\n";

enum {
    OPT_HELP = 'h',
    OPT_LISTEN = 256,
    OPT_DB,
    OPT_WEBHOOK_URL,
    OPT_WEBHOOK_SECRET,
    OPT_WEBHOOK_BACKOFF,
    OPT_WEBHOOK_TIMEOUT,
    OPT_LATENCY,
    OPT_JITTER,
    OPT_FAIL_RATE,
    OPT_LOST_RATE,
    OPT_SLOW,
    OPT_DUP,
    OPT_DELAY,
    OPT_FAULTS_FROM,
    OPT_VERSION,
};

static const struct option options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"db", required_argument, NULL, OPT_DB},
    {"webhook-url", required_argument, NULL, OPT_WEBHOOK_URL},
    {"webhook-secret", required_argument, NULL, OPT_WEBHOOK_SECRET},
    {"webhook-backoff-max-ms", required_argument, NULL, OPT_WEBHOOK_BACKOFF},
    {"webhook-timeout-ms", required_argument, NULL, OPT_WEBHOOK_TIMEOUT},
    {"latency-ms", required_argument, NULL, OPT_LATENCY},
    {"latency-jitter-ms", required_argument, NULL, OPT_JITTER},
    {"fail-rate", required_argument, NULL, OPT_FAIL_RATE},
    {"lost-rate", required_argument, NULL, OPT_LOST_RATE},
    {"slow-ms", required_argument, NULL, OPT_SLOW},
    {"webhook-dup", required_argument, NULL, OPT_DUP},
    {"webhook-delay-ms", required_argument, NULL, OPT_DELAY},
    {"faults-from", required_argument, NULL, OPT_FAULTS_FROM},
    HTTP_LIMITS_OPTIONS /* --max-connections and the other limits */
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "provider-sim: %s\nTry 'provider-sim --help'.\n", msg);
    return EXIT_USAGE;
}

static const char *option_name(int val)
{
    const struct option *o;

    for (o = options; o->name != NULL; o++)
        if (o->val == val)
            return o->name;
    return "?";
}

static int ms_flag(const char *flag, const char *arg, int64_t min, int64_t *out)
{
    if (parse_int64(arg, min, FAULTS_MAX_MS, out) != 0)
        return usage_error("--%s must be an integer from %lld to %d, not '%s'", flag,
                           (long long)min, FAULTS_MAX_MS, arg);
    return -1;
}

static int rate_flag(const char *flag, const char *arg, double *out)
{
    if (parse_double(arg, 0.0, 1.0, out) != 0)
        return usage_error("--%s must be a number from 0 to 1, not '%s'", flag, arg);
    return -1;
}

/* Applies one option; returns -1 to go on, or an exit status. */
static int apply_option(struct sim_config *cfg, int c, const char *arg)
{
    struct fault_settings *f = &cfg->faults;
    int64_t v = 0;
    int status = -1;

    switch (c) {
    case OPT_FAULTS_FROM:
        if (arg[0] == '\0')
            status = usage_error("%s", "--faults-from needs loopback, any or addresses");
        cfg->faults_from = arg;
        break;
    case OPT_LISTEN: {
        const char *colon = strrchr(arg, ':');
        if (colon == NULL || colon == arg || strchr(arg, ':') != colon ||
            parse_int64(colon + 1, 0, 65535, &v) != 0)
            status = usage_error("--listen must be HOST:PORT (IPv4, port 0..65535), not '%s'", arg);
        cfg->listen = arg;
        break;
    }
    case OPT_DB:
        if (strncmp(arg, "sqlite:", 7) != 0 && strncmp(arg, "postgres", 8) != 0)
            status =
                usage_error("--db must be sqlite:PATH (or a postgresql:// URI), not '%s'", arg);
        cfg->db = arg;
        break;
    case OPT_WEBHOOK_URL:
        if (strncmp(arg, "http://", 7) != 0 && strncmp(arg, "https://", 8) != 0)
            status = usage_error("--webhook-url must be an http:// or https:// URL, not '%s'", arg);
        cfg->webhook_url = arg;
        break;
    case OPT_WEBHOOK_SECRET:
        if (arg[0] == '\0')
            status = usage_error("--webhook-secret must not be empty");
        cfg->webhook_secret = arg;
        break;
    case OPT_WEBHOOK_BACKOFF:
        status = ms_flag("webhook-backoff-max-ms", arg, 100, &cfg->webhook_backoff_max_ms);
        break;
    case OPT_WEBHOOK_TIMEOUT:
        status = ms_flag("webhook-timeout-ms", arg, 100, &cfg->webhook_timeout_ms);
        break;
    case OPT_LATENCY:
        status = ms_flag("latency-ms", arg, 0, &f->latency_ms);
        break;
    case OPT_JITTER:
        status = ms_flag("latency-jitter-ms", arg, 0, &f->latency_jitter_ms);
        break;
    case OPT_SLOW:
        status = ms_flag("slow-ms", arg, 0, &f->slow_ms);
        break;
    case OPT_DELAY:
        status = ms_flag("webhook-delay-ms", arg, 0, &f->webhook_delay_ms);
        break;
    case OPT_FAIL_RATE:
        status = rate_flag("fail-rate", arg, &f->fail_rate);
        break;
    case OPT_LOST_RATE:
        status = rate_flag("lost-rate", arg, &f->lost_rate);
        break;
    case OPT_DUP:
        if (parse_int64(arg, 1, FAULTS_MAX_DUP, &v) != 0)
            status = usage_error("--webhook-dup must be an integer from 1 to %d, not '%s'",
                                 FAULTS_MAX_DUP, arg);
        f->webhook_dup = (int)v;
        break;
    default:
        status = usage_error("internal error: option %d", c);
        break;
    }
    return status;
}

static int parse_args(struct sim_config *cfg, int argc, char **argv)
{
    char err[320];
    int status = -1;
    int longindex = 0;
    int c;

    opterr = 0;
    while (status < 0) {
        c = getopt_long(argc, argv, ":h", options, &longindex);
        if (c == -1)
            break;
        if (c == OPT_HELP) {
            fputs(usage, stdout);
            printf("\n%s", http_limits_help);
            status = 0;
        } else if (c == OPT_VERSION) {
            printf("provider-sim %s (libidem %s)\n", IDEM_VERSION_STRING, IDEM_VERSION_STRING);
            status = 0;
        } else if (c == ':') {
            status = optopt >= OPT_LISTEN
                         ? usage_error("option '--%s' needs a value", option_name(optopt))
                         : usage_error("option '%s' needs a value", argv[optind - 1]);
        } else if (c == '?') {
            status = usage_error("unknown option '%s'", argv[optind - 1]);
        } else if (c == HTTP_LIMITS_OPT) {
            if (http_limits_flag(&cfg->http, options[longindex].name, optarg, err, sizeof err) < 0)
                status = usage_error("%s", err);
        } else {
            status = apply_option(cfg, c, optarg);
        }
    }
    if (status < 0 && optind < argc)
        status = usage_error("unexpected argument '%s'", argv[optind]);
    if (status < 0 && cfg->webhook_url != NULL && cfg->webhook_secret == NULL)
        status = usage_error("--webhook-url needs --webhook-secret (or "
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
    log_msg(&sim_log, "info", "stopping on %s", stop_signals_wait(&stop_signals));
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
