/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - orderd's command line: `serve`, `token create`, `migrate`, `outbox list|retry`,
 * `--help`, `--version`.
 * Every subcommand has its own --help; a wrong flag or value is named on stderr and exits with
 * status 2, a failure at run time exits with 1, so scripts can tell "you called me wrong" from
 * "it did not work".  Flags are parsed into a struct orderd_config that is passed down.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idem/idem.h"

#include "auth.h"
#include "config.h"
#include "db.h"
#include "flag_file.h"
#include "intake.h"
#include "outbox.h"
#include "schema.h"
#include "serve.h"
#include "util.h"
#include "banned.h"

/* The word die() and the text log lines begin with (src/util/util.h). */
const char program_name[] = "orderd";

#define EXIT_USAGE 2

static const char usage_main[] =
    "Usage: orderd <command> [options]\n"
    "\n"
    "orderd is the reference service of idem: an orders API whose writes are safe to retry.\n"
    "\n"
    "Commands:\n"
    "  serve          run the HTTP server\n"
    "  token create   create a user (if needed) and print a new bearer token for it\n"
    "  token list     list the bearer tokens (ids, users, dates)\n"
    "  token revoke   revoke a user's tokens, or one token\n"
    "  migrate        apply the database migrations and print how many ran\n"
    "  outbox list    show the outbox of emails (pending, sent, parked)\n"
    "  outbox retry   queue a parked email again\n"
    "\n"
    "Options:\n"
    "  -h, --help     show this help\n"
    "  --version      show the version\n"
    "\n"
    "Run 'orderd <command> --help' for the options of a command.\n";

static const char usage_serve[] =
    "Usage: orderd serve [options]\n"
    "\n"
    "Runs the HTTP API until SIGINT or SIGTERM.  Once listening, prints one line\n"
    "'orderd: listening on http://HOST:PORT' on stdout; logs go to stderr.\n"
    "\n"
    "Options:\n"
    "  --config FILE            options from a YAML file, one 'name: value' per option\n"
    "                           ('listen: 127.0.0.1:8080'); an option given here wins\n"
    "  --listen HOST:PORT       address to listen on (default " ORDERD_DEFAULT_LISTEN ");\n"
    "                           IPv6 as [::1]:8080; port 0 picks a free port\n"
    "  --metrics-listen HOST:PORT  serve GET /metrics there (e.g. 127.0.0.1:9101) instead of\n"
    "                           on --listen, so a scraper needs no access to the API\n"
    "  --db URI                 store (default " ORDERD_DEFAULT_DB ")\n"
    "  --db-pool N              store connections, 1..1024 (default 16)\n"
    "  --sqlite-sync MODE       full|normal: SQLite durability (default full); normal does\n"
    "                           not fsync every commit and is refused with --provider\n"
    "  --log-format FORMAT      text|json (default text)\n"
    "  --lease-ms N             lease of a request on its idempotency record (default 10000)\n"
    "  --wait-ms N              how long a duplicate waits for the first request (default 2000)\n"
    "  --sweep-interval-s N     seconds between retention sweeps, 0 to disable (default 60)\n"
    "  --replay-cache-mb N      memory for completed responses replayed without the store,\n"
    "                           0 to disable (default 8)\n"
    "  --idempotency on|off     off: POST /api/orders runs without an idempotency record;\n"
    "                           a benchmark baseline only, retries are NOT safe (default on)\n"
    "Payments (without --provider, orders are not charged and stay \"created\"):\n"
    "  --provider URL           payment + email provider, e.g. http://127.0.0.1:8090\n"
    "  --provider-timeout-ms N  timeout of one provider call (default 5000)\n"
    "  --webhook-secret S       HMAC key of POST /webhooks/provider (or ORDERD_WEBHOOK_SECRET)\n"
    "  --webhook-tolerance-s N  accepted age of a webhook signature (default 300)\n"
    "  --completer-interval-ms N    pause between completer runs, 0 disables (default 1000)\n"
    "  --reconciler-interval-ms N   pause between reconciler runs, 0 disables (default 1000)\n"
    "  --reconcile-after-ms N   an unknown outcome waits this long for the client's retry\n"
    "                           before the reconciler asks the provider (default 2000)\n"
    "  --outbox-interval-ms N   pause between outbox relay runs, 0 disables (default 250)\n"
    "  --outbox-max-attempts N  failed deliveries before an email is parked (default 10)\n"
    "  --outbox-backoff-max-ms N    cap of the relay's backoff between deliveries of one email\n"
    "                           (250 ms doubling; default 60000)\n"
    "  --outbox-retention-s N   sent emails are swept N s after sending, 0 keeps them\n"
    "                           (default 604800, 7 days)\n"
    "  --inbox-retention-s N    webhook inbox entries are swept N s after receipt, 0 keeps them;\n"
    "                           must outlast the provider's redeliveries, at least 3600\n"
    "                           (default 2592000, 30 days)\n"
    "  -h, --help               show this help\n"
    "\n"
    "Environment: ORDERD_TEST_HOOKS=1 enables the X-Test-* request headers (tests only);\n"
    "ORDERD_WEBHOOK_SECRET is the webhook secret when --webhook-secret is not given.\n";

static const char usage_token[] =
    "Usage: orderd token create --db URI --user NAME\n"
    "       orderd token list --db URI [--user NAME]\n"
    "       orderd token revoke --db URI (--user NAME | --token-id ID | --token TOKEN)\n"
    "\n"
    "create makes user NAME if it does not exist, then a new bearer token for it, and prints\n"
    "the token alone on stdout.  Only its SHA-256 is stored: the token cannot be shown again.\n"
    "list prints every token (or NAME's): its id (the first 12 hex digits of its SHA-256),\n"
    "when it was made, its user.\n"
    "revoke deletes NAME's tokens, the token with that id (8 or more of its digits), or the\n"
    "token itself, and prints how many.  The store forgets them at once; a running orderd\n"
    "stops accepting a revoked token within 5 seconds (its token cache).\n"
    "\n"
    "Options:\n"
    "  --db URI        store (default " ORDERD_DEFAULT_DB ")\n"
    "  --user NAME     user name (create: required)\n"
    "  --token-id ID   revoke: a token id from 'orderd token list'\n"
    "  --token TOKEN   revoke: the token itself\n"
    "  -h, --help      show this help\n";

static const char usage_migrate[] =
    "Usage: orderd migrate --db URI\n"
    "\n"
    "Applies orderd's database migrations (libidem's own schema included) and prints how many\n"
    "ran.  `orderd serve` does the same at start-up.\n"
    "\n"
    "Options:\n"
    "  --db URI       store (default " ORDERD_DEFAULT_DB ")\n"
    "  -h, --help     show this help\n";

static const char usage_outbox[] =
    "Usage: orderd outbox list [--db URI] [--status pending|sent|parked] [--limit N]\n"
    "       orderd outbox retry [--db URI] ID\n"
    "\n"
    "The outbox holds the emails orderd queued in the same transaction as their cause (an order\n"
    "paid, a profile changed); `orderd serve --provider` delivers them.  A message that failed\n"
    "--outbox-max-attempts times is parked; `retry` queues it again with its attempts reset.\n"
    "\n"
    "Options:\n"
    "  --db URI       store (default " ORDERD_DEFAULT_DB ")\n"
    "  --status S     list only messages in state S\n"
    "  --limit N      list at most N messages, newest first (default 100)\n"
    "  -h, --help     show this help\n";

enum {
    OPT_HELP = 'h',
    OPT_LISTEN = 256,
    OPT_DB,
    OPT_DB_POOL,
    OPT_SQLITE_SYNC,
    OPT_LOG_FORMAT,
    OPT_LEASE_MS,
    OPT_WAIT_MS,
    OPT_SWEEP,
    OPT_USER,
    OPT_PROVIDER,
    OPT_PROVIDER_TIMEOUT,
    OPT_WEBHOOK_SECRET,
    OPT_WEBHOOK_TOLERANCE,
    OPT_COMPLETER,
    OPT_RECONCILER,
    OPT_RECONCILE_AFTER,
    OPT_OUTBOX_INTERVAL,
    OPT_OUTBOX_ATTEMPTS,
    OPT_OUTBOX_BACKOFF,
    OPT_OUTBOX_RETENTION,
    OPT_INBOX_RETENTION,
    OPT_STATUS,
    OPT_LIMIT,
    OPT_IDEMPOTENCY,
    OPT_CONFIG,
    OPT_REPLAY_CACHE,
    OPT_TOKEN_ID,
    OPT_TOKEN,
    OPT_METRICS_LISTEN,
};

static const struct option serve_options[] = {
    {"config", required_argument, NULL, OPT_CONFIG},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"metrics-listen", required_argument, NULL, OPT_METRICS_LISTEN},
    {"db", required_argument, NULL, OPT_DB},
    {"db-pool", required_argument, NULL, OPT_DB_POOL},
    {"sqlite-sync", required_argument, NULL, OPT_SQLITE_SYNC},
    {"log-format", required_argument, NULL, OPT_LOG_FORMAT},
    {"lease-ms", required_argument, NULL, OPT_LEASE_MS},
    {"wait-ms", required_argument, NULL, OPT_WAIT_MS},
    {"sweep-interval-s", required_argument, NULL, OPT_SWEEP},
    {"provider", required_argument, NULL, OPT_PROVIDER},
    {"provider-timeout-ms", required_argument, NULL, OPT_PROVIDER_TIMEOUT},
    {"webhook-secret", required_argument, NULL, OPT_WEBHOOK_SECRET},
    {"webhook-tolerance-s", required_argument, NULL, OPT_WEBHOOK_TOLERANCE},
    {"completer-interval-ms", required_argument, NULL, OPT_COMPLETER},
    {"reconciler-interval-ms", required_argument, NULL, OPT_RECONCILER},
    {"reconcile-after-ms", required_argument, NULL, OPT_RECONCILE_AFTER},
    {"outbox-interval-ms", required_argument, NULL, OPT_OUTBOX_INTERVAL},
    {"outbox-max-attempts", required_argument, NULL, OPT_OUTBOX_ATTEMPTS},
    {"outbox-backoff-max-ms", required_argument, NULL, OPT_OUTBOX_BACKOFF},
    {"outbox-retention-s", required_argument, NULL, OPT_OUTBOX_RETENTION},
    {"inbox-retention-s", required_argument, NULL, OPT_INBOX_RETENTION},
    {"idempotency", required_argument, NULL, OPT_IDEMPOTENCY},
    {"replay-cache-mb", required_argument, NULL, OPT_REPLAY_CACHE},
    HTTP_LIMITS_OPTIONS /* --max-connections and the other limits */
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static const struct option outbox_options[] = {
    {"db", required_argument, NULL, OPT_DB},
    {"status", required_argument, NULL, OPT_STATUS},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static const struct option token_options[] = {
    {"db", required_argument, NULL, OPT_DB},
    {"user", required_argument, NULL, OPT_USER},
    {"token-id", required_argument, NULL, OPT_TOKEN_ID},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static const struct option migrate_options[] = {
    {"db", required_argument, NULL, OPT_DB},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* What each command was told; `serve` uses all of it, the others the store part. */
struct cli {
    const char *command; /* "serve", "token create", "migrate": for messages */
    struct orderd_config cfg;
    const char *user;
    const char *token_id; /* token revoke --token-id */
    const char *token;    /* token revoke --token */
    const char *status;   /* outbox list --status */
    int64_t limit;        /* outbox list --limit */
    const char *arg;      /* the one positional argument of commands that take one */
    int allow_arg;
    /* serve --config: the file's options and the arguments they were parsed with (cfg points
     * into them), freed as orderd exits */
    char **config_args, **config_argv;
    int nconfig_args;
};

/*
 * Says what is wrong with the command line and returns EXIT_USAGE.  The message may quote an
 * argument, which may be a connection string: any password in it is masked (never truncated
 * first, so no half a URI escapes the masking).
 */
static int usage_error(const struct cli *cli, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int usage_error(const struct cli *cli, const char *fmt, ...)
{
    char *msg;
    va_list ap, ap2;
    int n;

    va_start(ap, fmt);
    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    msg = xmalloc(n > 0 ? (size_t)n + 1 : 1);
    msg[0] = '\0';
    if (n > 0)
        vsnprintf(msg, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    db_redact_secrets(msg);
    fprintf(stderr, "orderd %s: %s\nTry 'orderd %s --help'.\n", cli->command, msg, cli->command);
    free(msg);
    return EXIT_USAGE;
}

static const char *option_name(const struct option *opts, int val)
{
    for (; opts->name != NULL; opts++) {
        if (opts->val == val)
            return opts->name;
    }
    return "?";
}

static int number_flag(const struct cli *cli, const char *flag, const char *arg, int64_t min,
                       int64_t max, int64_t *out)
{
    int rc = 0;

    if (parse_int64(arg, min, max, out) != 0)
        rc = usage_error(cli, "--%s must be an integer from %lld to %lld, not '%s'", flag,
                         (long long)min, (long long)max, arg);
    return rc;
}

/* Applies one parsed option to `cli`.  Returns -1 to go on, or an exit status. */
static int apply_option(struct cli *cli, int c, const char *arg)
{
    struct orderd_config *cfg = &cli->cfg;
    char host[256];
    char err[320];
    uint16_t port = 0;
    int64_t v = 0;
    int status = -1;

    switch (c) {
    case OPT_LISTEN:
        if (http_listen_split(arg, host, sizeof host, &port, err, sizeof err) != 0)
            status = usage_error(cli, "%s", err);
        cfg->listen = arg;
        break;
    case OPT_METRICS_LISTEN:
        if (http_listen_split(arg, host, sizeof host, &port, err, sizeof err) != 0)
            status = usage_error(cli, "--metrics-listen: %s", err);
        cfg->metrics_listen = arg;
        break;
    case OPT_DB:
        cfg->db = arg;
        break;
    case OPT_USER:
        cli->user = arg;
        break;
    case OPT_TOKEN_ID:
        cli->token_id = arg;
        break;
    case OPT_TOKEN:
        cli->token = arg;
        break;
    case OPT_DB_POOL:
        if (number_flag(cli, "db-pool", arg, 1, 1024, &v) != 0)
            status = EXIT_USAGE;
        cfg->db_pool = (int)v;
        break;
    case OPT_SQLITE_SYNC:
        if (strcmp(arg, "full") == 0)
            cfg->sync = IDEM_SYNC_FULL;
        else if (strcmp(arg, "normal") == 0)
            cfg->sync = IDEM_SYNC_NORMAL;
        else
            status = usage_error(cli, "--sqlite-sync must be 'full' or 'normal', not '%s'", arg);
        break;
    case OPT_LOG_FORMAT:
        if (strcmp(arg, "text") == 0)
            cfg->log_format = LOG_TEXT;
        else if (strcmp(arg, "json") == 0)
            cfg->log_format = LOG_JSON;
        else
            status = usage_error(cli, "--log-format must be 'text' or 'json', not '%s'", arg);
        break;
    case OPT_LEASE_MS:
        if (number_flag(cli, "lease-ms", arg, 1, 86400000, &v) != 0)
            status = EXIT_USAGE;
        cfg->lease_ms = v;
        break;
    case OPT_WAIT_MS:
        if (number_flag(cli, "wait-ms", arg, 0, 600000, &v) != 0)
            status = EXIT_USAGE;
        cfg->wait_ms = v;
        break;
    case OPT_SWEEP:
        if (number_flag(cli, "sweep-interval-s", arg, 0, 86400, &v) != 0)
            status = EXIT_USAGE;
        cfg->sweep_interval_s = (int)v;
        break;
    case OPT_REPLAY_CACHE:
        if (number_flag(cli, "replay-cache-mb", arg, 0, 4096, &v) != 0)
            status = EXIT_USAGE;
        cfg->replay_cache_mb = (int)v;
        break;
    case OPT_PROVIDER:
        if (strncmp(arg, "http://", 7) != 0 && strncmp(arg, "https://", 8) != 0)
            status =
                usage_error(cli, "--provider must be an http:// or https:// URL, not '%s'", arg);
        cfg->provider = arg;
        break;
    case OPT_PROVIDER_TIMEOUT:
        if (number_flag(cli, "provider-timeout-ms", arg, 10, 600000, &cfg->provider_timeout_ms) !=
            0)
            status = EXIT_USAGE;
        break;
    case OPT_WEBHOOK_SECRET:
        if (arg[0] == '\0')
            status = usage_error(cli, "--webhook-secret must not be empty");
        cfg->webhook_secret = arg;
        break;
    case OPT_WEBHOOK_TOLERANCE:
        if (number_flag(cli, "webhook-tolerance-s", arg, 1, 86400, &cfg->webhook_tolerance_s) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_COMPLETER:
        if (number_flag(cli, "completer-interval-ms", arg, 0, 3600000,
                        &cfg->completer_interval_ms) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_RECONCILER:
        if (number_flag(cli, "reconciler-interval-ms", arg, 0, 3600000,
                        &cfg->reconciler_interval_ms) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_RECONCILE_AFTER:
        if (number_flag(cli, "reconcile-after-ms", arg, 1, 3600000, &cfg->reconcile_after_ms) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_OUTBOX_INTERVAL:
        if (number_flag(cli, "outbox-interval-ms", arg, 0, 3600000, &cfg->outbox_interval_ms) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_OUTBOX_ATTEMPTS:
        if (number_flag(cli, "outbox-max-attempts", arg, 1, 1000, &v) != 0)
            status = EXIT_USAGE;
        cfg->outbox_max_attempts = (int)v;
        break;
    case OPT_OUTBOX_BACKOFF:
        if (number_flag(cli, "outbox-backoff-max-ms", arg, 250, 3600000,
                        &cfg->outbox_backoff_max_ms) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_OUTBOX_RETENTION:
        if (number_flag(cli, "outbox-retention-s", arg, 0, 3650LL * 86400,
                        &cfg->outbox_retention_s) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_INBOX_RETENTION:
        if (number_flag(cli, "inbox-retention-s", arg, 0, 3650LL * 86400,
                        &cfg->inbox_retention_s) != 0)
            status = EXIT_USAGE;
        else if (cfg->inbox_retention_s > 0 &&
                 cfg->inbox_retention_s < ORDERD_MIN_INBOX_RETENTION_S)
            status = usage_error(cli,
                                 "--inbox-retention-s must be 0 or at least %d: the inbox is the"
                                 " dedupe of the provider's redelivered events",
                                 ORDERD_MIN_INBOX_RETENTION_S);
        break;
    case OPT_STATUS:
        if (strcmp(arg, "pending") != 0 && strcmp(arg, "sent") != 0 && strcmp(arg, "parked") != 0)
            status = usage_error(cli, "--status must be pending, sent or parked, not '%s'", arg);
        cli->status = arg;
        break;
    case OPT_LIMIT:
        if (number_flag(cli, "limit", arg, 1, 100000, &cli->limit) != 0)
            status = EXIT_USAGE;
        break;
    case OPT_CONFIG:
        break; /* read before the other options (parse_serve_options) */
    case OPT_IDEMPOTENCY:
        if (strcmp(arg, "on") == 0)
            cfg->idempotency_off = 0;
        else if (strcmp(arg, "off") == 0)
            cfg->idempotency_off = 1;
        else
            status = usage_error(cli, "--idempotency must be 'on' or 'off', not '%s'", arg);
        break;
    default:
        status = usage_error(cli, "internal error: option %d", c);
        break;
    }
    return status;
}

/*
 * Parses the options of one command.  Returns -1 to go on, or an exit status: 0 after --help,
 * EXIT_USAGE for a bad command line.
 */
static void print_version(void)
{
    printf("orderd %s (libidem %s)\n", IDEM_VERSION_STRING, IDEM_VERSION_STRING);
}

static int parse_options(struct cli *cli, int argc, char **argv, const struct option *opts,
                         const char *usage)
{
    char shortopt[3] = {'-', '?', '\0'};
    char err[320];
    int status = -1;
    int longindex = 0;
    int c;

    opterr = 0;
    optind = 1;
    while (status < 0) {
        c = getopt_long(argc, argv, ":h", opts, &longindex);
        if (c == -1)
            break;
        if (c == OPT_HELP) {
            fputs(usage, stdout);
            if (opts == serve_options)
                printf("\n%s", http_limits_help);
            status = 0;
        } else if (c == ':' && optopt >= OPT_LISTEN) {
            status = usage_error(cli, "option '--%s' needs a value", option_name(opts, optopt));
        } else if (c == ':') {
            status = usage_error(cli, "option '%s' needs a value", argv[optind - 1]);
        } else if (c == '?' && optopt != 0 && optopt < OPT_LISTEN) {
            shortopt[1] = (char)optopt;
            status = usage_error(cli, "unknown option '%s'", shortopt);
        } else if (c == '?' && strcmp(argv[optind - 1], "--version") == 0) {
            print_version(); /* `orderd serve --version`: the man page says it works everywhere */
            status = 0;
        } else if (c == '?') {
            status = usage_error(cli, "unknown option '%s'", argv[optind - 1]);
        } else if (c == HTTP_LIMITS_OPT) {
            if (http_limits_flag(&cli->cfg.http, opts[longindex].name, optarg, err, sizeof err) < 0)
                status = usage_error(cli, "%s", err);
        } else {
            status = apply_option(cli, c, optarg);
        }
    }
    if (status < 0 && cli->allow_arg && optind < argc)
        cli->arg = argv[optind++];
    if (status < 0 && optind < argc)
        status = usage_error(cli, "unexpected argument '%s'", argv[optind]);
    return status;
}

/*
 * `serve`'s options: those of --config FILE first (flag_file.c), then the command line's, so a
 * flag given there wins over the file.  Returns as parse_options().
 */
static int parse_serve_options(struct cli *cli, int argc, char **argv)
{
    const char *config = NULL;
    char **from_file = NULL, **all;
    char err[600];
    int nfile = 0, status, i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strncmp(argv[i], "--config=", 9) == 0)
            config = argv[i] + 9;
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            config = argv[++i];
    }
    if (config != NULL &&
        flag_file_load(config, serve_options, "config", &from_file, &nfile, err, sizeof err) != 0)
        return usage_error(cli, "--config %s", err);
    all = xcalloc((size_t)(argc + nfile + 1), sizeof *all);
    all[0] = argv[0];
    for (i = 0; i < nfile; i++)
        all[1 + i] = from_file[i];
    for (i = 1; i < argc; i++)
        all[nfile + i] = argv[i];
    status = parse_options(cli, argc + nfile, all, serve_options, usage_serve);
    /* The configuration keeps pointers into the arguments: they live as long as the process. */
    cli->config_args = from_file;
    cli->nconfig_args = nfile;
    cli->config_argv = all;
    return status;
}

/*
 * The store of cli->cfg for a one-shot command (one connection), with the migrations applied
 * (*applied receives how many, when not NULL).  With `existing`, an SQLite file that is not there
 * yet is made, as for `migrate` (a script may make a token before the server's first start), but
 * not silently: a token in a database no server reads is refused by the server the user meant, so
 * a mistyped --db must show.  NULL after saying why as "orderd WHAT: ...".
 */
static struct idem_store *open_command_store(const struct cli *cli, const char *what, int existing,
                                             int *applied)
{
    struct idem_store *st = NULL;
    const char *db = cli->cfg.db;
    int made = 0;
    char err[512];
    char *errmsg = NULL;
    int rc;

    if (existing && strncmp(db, "sqlite:", 7) == 0 && strcmp(db + 7, ":memory:") != 0 &&
        access(db + 7, F_OK) != 0 && errno == ENOENT)
        made = 1;
    rc = db_open(db, 1, cli->cfg.sync, &st, err, sizeof err);
    if (rc == 0 && made)
        fprintf(stderr,
                "orderd %s: warning: there was no database at %s: made a new, empty one; a "
                "server started with another --db will not see what this command did\n",
                what, db + 7);
    if (rc < 0) {
        fprintf(stderr, "orderd %s: %s\n", what, err);
        return NULL;
    }
    rc = schema_migrate(st, applied, &errmsg);
    if (rc < 0) {
        fprintf(stderr, "orderd %s: migrations failed: %s\n", what,
                errmsg ? errmsg : idem_strerror(rc));
        idem_free(errmsg);
        idem_store_close(st);
        return NULL;
    }
    return st;
}

static int run_token_create(const struct cli *cli)
{
    struct idem_store *st;
    char err[512];
    char *token = NULL;
    int status = 1;
    int rc;

    st = open_command_store(cli, "token create", 1, NULL);
    if (st == NULL)
        goto out;
    rc = auth_token_create(st, cli->user, &token, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "orderd token create: %s\n", err);
        goto out;
    }
    printf("%s\n", token);
    fflush(stdout);
    status = 0;
out:
    free(token);
    idem_store_close(st);
    return status;
}

static int run_migrate(const struct cli *cli)
{
    int applied = 0;
    struct idem_store *st = open_command_store(cli, "migrate", 0, &applied);

    if (st == NULL)
        return 1;
    printf("orderd: applied %d migration%s\n", applied, applied == 1 ? "" : "s");
    idem_store_close(st);
    return 0;
}

static void config_defaults(struct orderd_config *cfg)
{
    const char *hooks = getenv("ORDERD_TEST_HOOKS");
    const char *secret = getenv("ORDERD_WEBHOOK_SECRET");

    *cfg = (struct orderd_config){
        .listen = ORDERD_DEFAULT_LISTEN,
        .db = ORDERD_DEFAULT_DB,
        .db_pool = ORDERD_DEFAULT_POOL,
        .sync = IDEM_SYNC_FULL,
        .log_format = LOG_TEXT,
        .lease_ms = ORDERD_DEFAULT_LEASE_MS,
        .wait_ms = ORDERD_DEFAULT_WAIT_MS,
        .sweep_interval_s = ORDERD_DEFAULT_SWEEP_S,
        .replay_cache_mb = ORDERD_DEFAULT_REPLAY_CACHE_MB,
        .test_hooks = hooks != NULL && strcmp(hooks, "1") == 0,
        .provider_timeout_ms = ORDERD_DEFAULT_PROVIDER_TIMEOUT_MS,
        .webhook_secret = secret != NULL && secret[0] != '\0' ? secret : NULL,
        .webhook_tolerance_s = ORDERD_DEFAULT_WEBHOOK_TOLERANCE_S,
        .completer_interval_ms = ORDERD_DEFAULT_COMPLETER_MS,
        .reconciler_interval_ms = ORDERD_DEFAULT_RECONCILER_MS,
        .reconcile_after_ms = ORDERD_DEFAULT_RECONCILE_AFTER_MS,
        .outbox_interval_ms = ORDERD_DEFAULT_OUTBOX_MS,
        .outbox_max_attempts = ORDERD_DEFAULT_OUTBOX_ATTEMPTS,
        .outbox_backoff_max_ms = ORDERD_DEFAULT_OUTBOX_BACKOFF_MAX_MS,
        .outbox_retention_s = ORDERD_DEFAULT_OUTBOX_RETENTION_S,
        .inbox_retention_s = ORDERD_DEFAULT_INBOX_RETENTION_S,
    };
}

/* `orderd token list` and `orderd token revoke`. */
static int run_token_admin(const struct cli *cli, int revoke)
{
    struct idem_store *st;
    char err[512];
    int status = 1;
    int rc, n = 0;

    st = open_command_store(cli, cli->command, 1, NULL);
    if (st == NULL)
        goto out;
    if (revoke)
        rc = auth_token_revoke(st, cli->user, cli->token_id, cli->token, &n, err, sizeof err);
    else
        rc = auth_token_list(st, cli->user, stdout, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "orderd %s: %s\n", cli->command, err);
        status = rc == IDEM_EINVAL ? EXIT_USAGE : 1;
        goto out;
    }
    if (revoke)
        printf("%d token%s revoked\n", n, n == 1 ? "" : "s");
    fflush(stdout);
    status = 0;
out:
    idem_store_close(st);
    return status;
}

/* `orderd token create|list|revoke`. */
static int command_token(struct cli *cli, int argc, char **argv)
{
    int status;

    cli->command = "token";
    if (argc >= 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        fputs(usage_token, stdout);
        status = 0;
        goto out;
    }
    if (argc < 3) {
        status = usage_error(cli, "a subcommand is needed: 'create', 'list' or 'revoke'");
        goto out;
    }
    if (strcmp(argv[2], "list") == 0 || strcmp(argv[2], "revoke") == 0) {
        int revoke = strcmp(argv[2], "revoke") == 0;
        cli->command = revoke ? "token revoke" : "token list";
        status = parse_options(cli, argc - 2, argv + 2, token_options, usage_token);
        if (status >= 0)
            goto out;
        if (!revoke && (cli->token_id || cli->token)) {
            status = usage_error(cli, "list takes --user only");
            goto out;
        }
        if (revoke && (cli->user != NULL) + (cli->token_id != NULL) + (cli->token != NULL) != 1) {
            status = usage_error(cli, "name exactly one of --user, --token-id, --token");
            goto out;
        }
        status = run_token_admin(cli, revoke);
        goto out;
    }
    if (strcmp(argv[2], "create") != 0) {
        status = usage_error(cli,
                             "unknown subcommand '%s' (expected 'create', 'list' or "
                             "'revoke')",
                             argv[2]);
        goto out;
    }
    cli->command = "token create";
    status = parse_options(cli, argc - 2, argv + 2, token_options, usage_token);
    if (status >= 0)
        goto out;
    if (cli->token_id || cli->token) {
        status = usage_error(cli, "create takes --user only");
        goto out;
    }
    if (cli->user == NULL || cli->user[0] == '\0') {
        status = usage_error(cli, "--user NAME is required");
        goto out;
    }
    status = run_token_create(cli);
out:
    return status;
}

static int run_outbox(const struct cli *cli, int retry)
{
    struct idem_store *st;
    char err[512];
    int status = 1;
    int rc;

    st = open_command_store(cli, cli->command, 1, NULL);
    if (st == NULL)
        goto out;
    if (!retry) {
        rc = outbox_list(st, cli->status, cli->limit > 0 ? (int)cli->limit : 100, stdout, err,
                         sizeof err);
    } else {
        rc = outbox_retry(st, cli->arg, err, sizeof err);
        if (rc == 1)
            fprintf(stderr, "orderd outbox retry: there is no message %s\n", cli->arg);
        else if (rc == 2)
            fprintf(stderr, "orderd outbox retry: message %s was sent already\n", cli->arg);
        else if (rc == 0)
            printf("orderd: message %s queued again\n", cli->arg);
    }
    if (rc < 0)
        fprintf(stderr, "orderd %s: %s\n", cli->command, err);
    status = rc == 0 ? 0 : 1;
out:
    idem_store_close(st);
    return status;
}

/* `orderd outbox list|retry ...`. */
static int command_outbox(struct cli *cli, int argc, char **argv)
{
    const char *sub = argc >= 3 ? argv[2] : "";
    int retry = strcmp(sub, "retry") == 0;
    int status;

    cli->command = "outbox";
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
        fputs(usage_outbox, stdout);
        return 0;
    }
    if (argc < 3)
        return usage_error(cli, "a subcommand is needed: 'list' or 'retry'");
    if (!retry && strcmp(sub, "list") != 0)
        return usage_error(cli, "unknown subcommand '%s' (expected 'list' or 'retry')", sub);
    cli->command = retry ? "outbox retry" : "outbox list";
    cli->allow_arg = retry;
    status = parse_options(cli, argc - 2, argv + 2, outbox_options, usage_outbox);
    if (status >= 0)
        return status;
    if (retry && (cli->arg == NULL || cli->arg[0] == '\0'))
        return usage_error(cli, "the id of the message is needed: orderd outbox retry ID");
    if (retry && (cli->status != NULL || cli->limit > 0))
        return usage_error(cli, "--status and --limit are options of 'outbox list'");
    return run_outbox(cli, retry);
}

int main(int argc, char **argv)
{
    struct cli cli;
    const char *cmd = argc >= 2 ? argv[1] : "";
    int status;

    memset(&cli, 0, sizeof cli);
    config_defaults(&cli.cfg);
    if (argc < 2) {
        fputs(usage_main, stderr);
        status = EXIT_USAGE;
    } else if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_main, stdout);
        status = 0;
    } else if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        print_version();
        status = 0;
    } else if (strcmp(cmd, "serve") == 0) {
        cli.command = "serve";
        status = parse_serve_options(&cli, argc - 1, argv + 1);
        /* The baseline measures records against none, not payments: it never charges. */
        if (status < 0 && cli.cfg.idempotency_off && cli.cfg.provider != NULL)
            status = usage_error(&cli, "--idempotency off cannot be used with --provider");
        /*
         * A charge follows phase 1's commit: were that commit lost in a crash (normal does not
         * fsync every commit), the retry would make a new order, so a second charge.
         */
        if (status < 0 && cli.cfg.sync == IDEM_SYNC_NORMAL && cli.cfg.provider != NULL)
            status = usage_error(&cli, "--sqlite-sync normal cannot be used with --provider: an "
                                       "order must be on disk before its card is charged");
        if (status < 0 && cli.cfg.idempotency_off)
            fprintf(stderr, "orderd: warn: --idempotency off: POST /api/orders keeps no "
                            "idempotency record, retries are NOT safe (benchmark baseline)\n");
        if (status < 0)
            status = serve_run(&cli.cfg);
    } else if (strcmp(cmd, "migrate") == 0) {
        cli.command = "migrate";
        status = parse_options(&cli, argc - 1, argv + 1, migrate_options, usage_migrate);
        if (status < 0)
            status = run_migrate(&cli);
    } else if (strcmp(cmd, "token") == 0) {
        status = command_token(&cli, argc, argv);
    } else if (strcmp(cmd, "outbox") == 0) {
        status = command_outbox(&cli, argc, argv);
    } else {
        char *what = xstrdup(cmd); /* a connection string given without a command, maybe */
        db_redact_secrets(what);
        fprintf(stderr, "orderd: unknown command '%s'\nTry 'orderd --help'.\n", what);
        free(what);
        status = EXIT_USAGE;
    }
    flag_file_free(cli.config_args, cli.nconfig_args);
    free(cli.config_argv);
    return status;
}
