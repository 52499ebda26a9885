/*
 * main.c - idem-gateway's command line: `serve`, `check-config`, `--help`, `--version`.
 * As in orderd, a wrong flag or value is named on stderr with exit status 2, a failure at run
 * time exits with 1; a config file with a mistake is one line naming the file, the line and what
 * was expected (config.h).
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "config.h"
#include "serve.h"
#include "util.h"
#include "banned.h"

/* The word die() and the text log lines begin with (src/util/util.h). */
const char program_name[] = "idem-gateway";

#define EXIT_USAGE 2

static const char usage_main[] =
    "Usage: idem-gateway <command> [options]\n"
    "\n"
    "idem-gateway is a reverse proxy that makes the writes of any HTTP API safe to retry:\n"
    "on the routes its config names, a request with an Idempotency-Key runs upstream once,\n"
    "and every retry gets the stored answer (docs/gateway.md).\n"
    "\n"
    "Commands:\n"
    "  serve          run the gateway\n"
    "  check-config   read a config file and say whether it is valid\n"
    "\n"
    "Options:\n"
    "  -h, --help     show this help\n"
    "  --version      show the version\n"
    "\n"
    "Run 'idem-gateway <command> --help' for the options of a command.\n";

static const char usage_serve[] =
    "Usage: idem-gateway serve --config FILE [options]\n"
    "\n"
    "Runs the gateway until SIGINT or SIGTERM.  Once listening, prints one line\n"
    "'idem-gateway: listening on http://HOST:PORT (admin http://HOST:PORT)' on stdout;\n"
    "logs go to stderr.\n"
    "\n"
    "Options:\n"
    "  --config FILE            the YAML config (routes, upstream, store, principal)\n"
    "  --log-format FORMAT      text|json (default text)\n"
    "  --db-pool N              store connections, 1..1024 (default 16)\n"
    "  --sweep-interval-s N     seconds between retention sweeps, 0 to disable (default 60)\n"
    "  --replay-cache-mb N      memory for stored answers replayed without the store,\n"
    "                           0 to disable (default 8)\n"
    "HTTP limits (override the config's `limits:`):\n";

static const char usage_serve_end[] = "  -h, --help               show this help\n";

static const char usage_check[] =
    "Usage: idem-gateway check-config --config FILE\n"
    "\n"
    "Reads FILE as idem-gateway serve would and prints 'FILE: ok (N routes)', or the first\n"
    "mistake as 'FILE:LINE: what is wrong' with exit status 2.\n"
    "\n"
    "Options:\n"
    "  --config FILE  the YAML config\n"
    "  -h, --help     show this help\n";

enum {
    OPT_CONFIG = 0x100,
    OPT_LOG_FORMAT,
    OPT_DB_POOL,
    OPT_SWEEP,
    OPT_REPLAY_CACHE,
    OPT_VERSION,
};

static int usage_error(const char *command, const char *msg)
{
    fprintf(stderr, "idem-gateway %s: %s\nTry 'idem-gateway %s --help'.\n", command, msg, command);
    return EXIT_USAGE;
}

static int int_flag(const char *command, const char *flag, const char *arg, int64_t min,
                    int64_t max, int *out)
{
    int64_t v = 0;
    char msg[200];

    if (parse_int64(arg, min, max, &v) != 0) {
        snprintf(msg, sizeof msg, "--%s must be an integer from %lld to %lld, not '%s'", flag,
                 (long long)min, (long long)max, arg);
        return usage_error(command, msg);
    }
    *out = (int)v;
    return 0;
}

static int cmd_serve(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
        {"db-pool", required_argument, NULL, OPT_DB_POOL},
        {"sweep-interval-s", required_argument, NULL, OPT_SWEEP},
        {"replay-cache-mb", required_argument, NULL, OPT_REPLAY_CACHE},
        HTTP_LIMITS_OPTIONS{"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct serve_options so = {
        .log_format = LOG_TEXT, .sweep_interval_s = 60, .replay_cache_mb = 8, .db_pool = 16};
    struct http_limits flags_limits;
    const char *file = NULL;
    struct gw_config *cfg = NULL;
    char err[600];
    int idx = 0, c, status;

    memset(&flags_limits, 0, sizeof flags_limits);
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        switch (c) {
        case 'h':
            fputs(usage_serve, stdout);
            fputs(http_limits_help, stdout);
            fputs(usage_serve_end, stdout);
            return 0;
        case OPT_CONFIG:
            file = optarg;
            break;
        case OPT_LOG_FORMAT:
            if (strcmp(optarg, "text") == 0)
                so.log_format = LOG_TEXT;
            else if (strcmp(optarg, "json") == 0)
                so.log_format = LOG_JSON;
            else
                return usage_error("serve", "--log-format must be 'text' or 'json'");
            break;
        case OPT_DB_POOL:
            if (int_flag("serve", "db-pool", optarg, 1, 1024, &so.db_pool) != 0)
                return EXIT_USAGE;
            break;
        case OPT_SWEEP:
            if (int_flag("serve", "sweep-interval-s", optarg, 0, 86400, &so.sweep_interval_s) != 0)
                return EXIT_USAGE;
            break;
        case OPT_REPLAY_CACHE:
            if (int_flag("serve", "replay-cache-mb", optarg, 0, 65536, &so.replay_cache_mb) != 0)
                return EXIT_USAGE;
            break;
        case HTTP_LIMITS_OPT:
            if (http_limits_flag(&flags_limits, opts[idx].name, optarg, err, sizeof err) < 0)
                return usage_error("serve", err);
            break;
        default:
            return usage_error("serve", "unknown option");
        }
    }
    if (optind < argc)
        return usage_error("serve", "unexpected argument");
    if (!file)
        return usage_error("serve", "--config FILE is required");
    if (gw_config_load(file, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "idem-gateway: %s\n", err);
        return EXIT_USAGE;
    }
    /* A flag overrides the file, field by field. */
#define OVERRIDE(name, field, min, max)                                                            \
    if (flags_limits.field != 0)                                                                   \
        cfg->limits.field = flags_limits.field;
    HTTP_LIMITS_FLAGS(OVERRIDE)
#undef OVERRIDE
    status = serve_run(cfg, &so);
    gw_config_free(cfg);
    return status;
}

static int cmd_check(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *file = NULL;
    struct gw_config *cfg = NULL;
    char err[600];
    int c;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(usage_check, stdout);
            return 0;
        }
        if (c != OPT_CONFIG)
            return usage_error("check-config", "unknown option");
        file = optarg;
    }
    if (!file)
        return usage_error("check-config", "--config FILE is required");
    if (gw_config_load(file, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return EXIT_USAGE;
    }
    printf("%s: ok (%zu routes)\n", file, cfg->nroutes);
    gw_config_free(cfg);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("idem-gateway %s\n", IDEM_VERSION_STRING);
        return 0;
    }
    if (strcmp(argv[1], "serve") == 0)
        return cmd_serve(argc - 1, argv + 1);
    if (strcmp(argv[1], "check-config") == 0)
        return cmd_check(argc - 1, argv + 1);
    fprintf(stderr, "idem-gateway: unknown command '%s'\n%s", argv[1], usage_main);
    return EXIT_USAGE;
}
