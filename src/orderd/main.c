/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - orderd's command line: `serve`, `token create`, `migrate`, `outbox list|retry`,
 * `--help`, `--version`.
 * Every subcommand has its own --help; a wrong flag or value is named on stderr and exits with
 * status 2, a failure at run time exits with 1, so scripts can tell "you called me wrong" from
 * "it did not work".  Each command's flags are one table of rows (src/util/options.h), parsed
 * into a struct orderd_config that is passed down.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idem/idem.h"

#include "app.h"
#include "auth.h"
#include "config.h"
#include "db.h"
#include "flag_file.h"
#include "http_limits_options.h"
#include "intake.h"
#include "options.h"
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
    "Options:\n";

static const char usage_token[] =
    "Usage: orderd token create --db URI [--catalogue URI] --user NAME\n"
    "       orderd token list --db URI [--catalogue URI] [--user NAME]\n"
    "       orderd token revoke --db URI [--catalogue URI] (--user NAME | --token-id ID |\n"
    "                           --token TOKEN)\n"
    "\n"
    "create makes user NAME if it does not exist, then a new bearer token for it, and prints\n"
    "the token alone on stdout.  Only its SHA-256 is stored: the token cannot be shown again.\n"
    "list prints every token (or NAME's): its id (the first 12 hex digits of its SHA-256),\n"
    "when it was made, its user.\n"
    "revoke deletes NAME's tokens, the token with that id (8 or more of its digits), or the\n"
    "token itself, and prints how many.  The store forgets them at once; a running orderd\n"
    "stops accepting a revoked token within 5 seconds (its token cache).\n"
    "On a shard set (--db shards:URI) users and tokens live in the --catalogue store.\n"
    "\n"
    "Options:\n";

static const char usage_migrate[] =
    "Usage: orderd migrate --db URI [--catalogue URI]\n"
    "\n"
    "Applies orderd's database migrations (libidem's own schema included) and prints how many\n"
    "ran.  `orderd serve` does the same at start-up.\n"
    "\n"
    "Options:\n";

static const char usage_outbox[] =
    "Usage: orderd outbox list [--db URI] [--status pending|sent|parked] [--limit N]\n"
    "       orderd outbox retry [--db URI] ID\n"
    "\n"
    "The outbox holds the emails orderd queued in the same transaction as their cause (an order\n"
    "paid, a profile changed); `orderd serve --provider` delivers them.  A message that failed\n"
    "--outbox-max-attempts times is parked; `retry` queues it again with its attempts reset.\n"
    "\n"
    "Options:\n";

#define HELP_DB "store (default " ORDERD_DEFAULT_DB "), or shards:DIRECTORY_URI"
#define HELP_CATALOGUE "with --db shards:URI: the store of users, tokens, products"

/* What each command was told; `serve` uses all of it, the others the store part. */
struct cli {
    const char *command; /* "serve", "token create", "migrate": for messages */
    /* Its options' messages start with "orderd <command>"; what they quote is redacted. */
    struct options opts;
    char prog[64];
    struct orderd_config cfg;
    const char *config; /* serve --config: read before the other options */
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

/* Names `command` for the messages of cli->opts ("orderd token create: ..."). */
static void cli_command(struct cli *cli, const char *command)
{
    cli->command = command;
    snprintf(cli->prog, sizeof cli->prog, "orderd %s", command);
    cli->opts.prog = cli->prog;
    cli->opts.redact = db_redact_secrets; /* an argument may be a connection string */
    cli->opts.ctx = cli;
}

static void print_version(void)
{
    printf("orderd %s (libidem %s)\n", IDEM_VERSION_STRING, IDEM_VERSION_STRING);
}

/* `orderd serve --version` (and every command's): the man page says it works everywhere. */
static int version_option(struct options *o, const struct option_row *row, const char *arg)
{
    (void)o;
    (void)row;
    (void)arg;
    print_version();
    return 0;
}

static int listen_option(struct options *o, const struct option_row *row, const char *arg)
{
    char host[256];
    char err[320];
    uint16_t port = 0;

    if (http_listen_split(arg, host, sizeof host, &port, err, sizeof err) != 0)
        return strcmp(row->name, "listen") == 0 ? options_error(o, "%s", err)
                                                : options_error(o, "--%s: %s", row->name, err);
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

static int sqlite_sync_option(struct options *o, const struct option_row *row, const char *arg)
{
    enum idem_sync *sync = row->value;

    if (strcmp(arg, "full") == 0)
        *sync = IDEM_SYNC_FULL;
    else if (strcmp(arg, "normal") == 0)
        *sync = IDEM_SYNC_NORMAL;
    else
        return options_error(o, "--sqlite-sync must be 'full' or 'normal', not '%s'", arg);
    return OPTIONS_CONTINUE;
}

static int log_format_option(struct options *o, const struct option_row *row, const char *arg)
{
    enum log_format *format = row->value;

    if (strcmp(arg, "text") == 0)
        *format = LOG_TEXT;
    else if (strcmp(arg, "json") == 0)
        *format = LOG_JSON;
    else
        return options_error(o, "--log-format must be 'text' or 'json', not '%s'", arg);
    return OPTIONS_CONTINUE;
}

static int idempotency_option(struct options *o, const struct option_row *row, const char *arg)
{
    int *off = row->value;

    if (strcmp(arg, "on") == 0)
        *off = 0;
    else if (strcmp(arg, "off") == 0)
        *off = 1;
    else
        return options_error(o, "--idempotency must be 'on' or 'off', not '%s'", arg);
    return OPTIONS_CONTINUE;
}

static int provider_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (strncmp(arg, "http://", 7) != 0 && strncmp(arg, "https://", 8) != 0)
        return options_error(o, "--provider must be an http:// or https:// URL, not '%s'", arg);
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

static int inbox_retention_option(struct options *o, const struct option_row *row, const char *arg)
{
    int64_t v = 0;

    if (parse_int64(arg, 0, 3650LL * 86400, &v) != 0)
        return options_error(o, "--%s must be an integer from %lld to %lld, not '%s'", row->name,
                             0LL, 3650LL * 86400, arg);
    if (v > 0 && v < ORDERD_MIN_INBOX_RETENTION_S)
        return options_error(o,
                             "--inbox-retention-s must be 0 or at least %d: the inbox is the"
                             " dedupe of the provider's redelivered events",
                             ORDERD_MIN_INBOX_RETENTION_S);
    *(int64_t *)row->value = v;
    return OPTIONS_CONTINUE;
}

static int status_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (strcmp(arg, "pending") != 0 && strcmp(arg, "sent") != 0 && strcmp(arg, "parked") != 0)
        return options_error(o, "--status must be pending, sent or parked, not '%s'", arg);
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

/*
 * --provider-ca has a meaning only for an https:// provider, and a file that cannot be read would
 * make every call fail (as unknown outcomes) until someone looks: both are refused at start.
 */
static int check_provider_ca(struct cli *cli)
{
    const struct orderd_config *cfg = &cli->cfg;
    FILE *f;

    if (cfg->provider == NULL || strncmp(cfg->provider, "https://", 8) != 0)
        return options_error(&cli->opts, "--provider-ca needs an https:// --provider");
    f = fopen(cfg->provider_ca, "r");
    if (f == NULL)
        return options_error(&cli->opts, "--provider-ca %s: %s", cfg->provider_ca, strerror(errno));
    fclose(f);
    return OPTIONS_CONTINUE;
}

/* `--version` in every command's table, not in its --help. */
#define OPT_VERSION_HIDDEN OPT_CALLBACK(0, "version", NULL, NULL, NULL, version_option)

/*
 * Parses the options of one command (cli->command named) after `rows`: -1 to go on, or an exit
 * status: 0 after --help, EXIT_USAGE for a bad command line.
 */
static int parse_options(struct cli *cli, int argc, char **argv, const struct option_row *rows,
                         const char *usage, int column)
{
    int status, next;

    cli->opts.rows = rows;
    cli->opts.usage = usage;
    cli->opts.column = column;
    status = options_parse(&cli->opts, argc, argv);
    next = cli->opts.next;
    if (status < 0 && cli->allow_arg && next < argc)
        cli->arg = argv[next++];
    if (status < 0 && next < argc)
        status = options_error(&cli->opts, "unexpected argument '%s'", argv[next]);
    return status;
}

/*
 * `serve`'s options: those of --config FILE first (flag_file.c), then the command line's, so a
 * flag given there wins over the file.  Returns as parse_options().
 */
static int parse_serve_options(struct cli *cli, int argc, char **argv)
{
    struct orderd_config *cfg = &cli->cfg;
    const struct option_row rows[] = {
        OPT_STRING(0, "config", &cli->config, "FILE",
                   "options from a YAML file, one 'name: value' per option\n"
                   "('listen: 127.0.0.1:8080'); an option given here wins"),
        OPT_CALLBACK(0, "listen", &cfg->listen, "HOST:PORT",
                     "address to listen on (default " ORDERD_DEFAULT_LISTEN ");\n"
                     "IPv6 as [::1]:8080; port 0 picks a free port",
                     listen_option),
        OPT_CALLBACK(0, "metrics-listen", &cfg->metrics_listen, "HOST:PORT",
                     "serve GET /metrics there (e.g. 127.0.0.1:9101) instead of\n"
                     "on --listen, so a scraper needs no access to the API",
                     listen_option),
        OPT_STRING(0, "db", &cfg->db, "URI", HELP_DB),
        OPT_STRING(0, "catalogue", &cfg->catalogue, "URI", HELP_CATALOGUE),
        OPT_INT(0, "db-pool", &cfg->db_pool, "N", 1, 1024,
                "store connections, 1..1024 (default 16)"),
        OPT_CALLBACK(0, "sqlite-sync", &cfg->sync, "MODE",
                     "full|normal: SQLite durability (default full); normal does\n"
                     "not fsync every commit and is refused with --provider",
                     sqlite_sync_option),
        OPT_CALLBACK(0, "log-format", &cfg->log_format, "FORMAT", "text|json (default text)",
                     log_format_option),
        OPT_INT64(0, "lease-ms", &cfg->lease_ms, "N", 1, 86400000,
                  "lease of a request on its idempotency record (default 10000)"),
        OPT_INT64(0, "wait-ms", &cfg->wait_ms, "N", 0, 600000,
                  "how long a duplicate waits for the first request (default 2000)"),
        OPT_INT(0, "sweep-interval-s", &cfg->sweep_interval_s, "N", 0, 86400,
                "seconds between retention sweeps, 0 to disable (default 60)"),
        OPT_INT(0, "replay-cache-mb", &cfg->replay_cache_mb, "N", 0, 4096,
                "memory for completed responses replayed without the store,\n"
                "0 to disable (default 8)"),
        OPT_CALLBACK(0, "idempotency", &cfg->idempotency_off, "on|off",
                     "off: POST /api/orders runs without an idempotency record;\n"
                     "a benchmark baseline only, retries are NOT safe (default on)",
                     idempotency_option),
        OPT_TEXT("Payments (without --provider, orders are not charged and stay \"created\"):\n"),
        OPT_CALLBACK(0, "provider", &cfg->provider, "URL",
                     "payment + email provider, e.g. http://127.0.0.1:8090", provider_option),
        OPT_STRING(0, "provider-ca", &cfg->provider_ca, "FILE",
                   "PEM CA certificates an https:// --provider's certificate must\n"
                   "chain to, instead of the system's CA store"),
        OPT_INT64(0, "provider-timeout-ms", &cfg->provider_timeout_ms, "N", 10, 600000,
                  "timeout of one provider call (default 5000)"),
        OPT_CALLBACK(0, "webhook-secret", &cfg->webhook_secret, "S",
                     "HMAC key of POST /webhooks/provider (or ORDERD_WEBHOOK_SECRET)",
                     webhook_secret_option),
        OPT_INT64(0, "webhook-tolerance-s", &cfg->webhook_tolerance_s, "N", 1, 86400,
                  "accepted age of a webhook signature (default 300)"),
        OPT_INT64(0, "completer-interval-ms", &cfg->completer_interval_ms, "N", 0, 3600000,
                  "pause between completer runs, 0 disables (default 1000)"),
        OPT_INT64(0, "reconciler-interval-ms", &cfg->reconciler_interval_ms, "N", 0, 3600000,
                  "pause between reconciler runs, 0 disables (default 1000)"),
        OPT_INT64(0, "reconcile-after-ms", &cfg->reconcile_after_ms, "N", 1, 3600000,
                  "an unknown outcome waits this long for the client's retry\n"
                  "before the reconciler asks the provider (default 2000)"),
        OPT_INT64(0, "outbox-interval-ms", &cfg->outbox_interval_ms, "N", 0, 3600000,
                  "pause between outbox relay runs, 0 disables (default 250)"),
        OPT_INT(0, "outbox-max-attempts", &cfg->outbox_max_attempts, "N", 1, 1000,
                "failed deliveries before an email is parked (default 10)"),
        OPT_INT64(0, "outbox-backoff-max-ms", &cfg->outbox_backoff_max_ms, "N", 250, 3600000,
                  "cap of the relay's backoff between deliveries of one email\n"
                  "(250 ms doubling; default 60000)"),
        OPT_INT64(0, "outbox-retention-s", &cfg->outbox_retention_s, "N", 0, 3650LL * 86400,
                  "sent emails are swept N s after sending, 0 keeps them\n"
                  "(default 604800, 7 days)"),
        OPT_CALLBACK(0, "inbox-retention-s", &cfg->inbox_retention_s, "N",
                     "webhook inbox entries are swept N s after receipt, 0 keeps them;\n"
                     "must outlast the provider's redeliveries, at least 3600\n"
                     "(default 2592000, 30 days)",
                     inbox_retention_option),
        OPT_HELP("show this help"),
        OPT_TEXT("\n"
                 "Environment: ORDERD_TEST_HOOKS=1 enables the X-Test-* request headers (tests "
                 "only);\n"
                 "ORDERD_WEBHOOK_SECRET is the webhook secret when --webhook-secret is not "
                 "given.\n"
                 "\n"),
        OPT_HTTP_LIMITS(&cfg->http), /* --max-connections and the other limits */
        OPT_HTTP_TLS(&cfg->http),    /* --tls-cert, --tls-key */
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };
    struct option *known = NULL;
    char **from_file = NULL, **all;
    char err[600];
    int nfile = 0, status, i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strncmp(argv[i], "--config=", 9) == 0)
            cli->config = argv[i] + 9;
        else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            cli->config = argv[++i];
    }
    if (cli->config != NULL) {
        known = options_longopts(rows);
        status = flag_file_load(cli->config, known, "config", &from_file, &nfile, err, sizeof err);
        free(known);
        if (status != 0)
            return options_error(&cli->opts, "--config %s", err);
    }
    all = xcalloc((size_t)(argc + nfile + 1), sizeof *all);
    all[0] = argv[0];
    for (i = 0; i < nfile; i++)
        all[1 + i] = from_file[i];
    for (i = 1; i < argc; i++)
        all[nfile + i] = argv[i];
    status = parse_options(cli, argc + nfile, all, rows, usage_serve, 27);
    /* The configuration keeps pointers into the arguments: they live as long as the process. */
    cli->config_args = from_file;
    cli->nconfig_args = nfile;
    cli->config_argv = all;
    return status;
}

/* The options of `token create|list|revoke` (which of them a command takes is checked after). */
static int parse_token_options(struct cli *cli, int argc, char **argv)
{
    const struct option_row rows[] = {
        OPT_STRING(0, "db", &cli->cfg.db, "URI", HELP_DB),
        OPT_STRING(0, "catalogue", &cli->cfg.catalogue, "URI", HELP_CATALOGUE),
        OPT_STRING(0, "user", &cli->user, "NAME", "user name (create: required)"),
        OPT_STRING(0, "token-id", &cli->token_id, "ID",
                   "revoke: a token id from 'orderd token list'"),
        OPT_STRING(0, "token", &cli->token, "TOKEN", "revoke: the token itself"),
        OPT_HELP("show this help"),
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };

    return parse_options(cli, argc, argv, rows, usage_token, 18);
}

static int parse_migrate_options(struct cli *cli, int argc, char **argv)
{
    const struct option_row rows[] = {
        OPT_STRING(0, "db", &cli->cfg.db, "URI", HELP_DB),
        OPT_STRING(0, "catalogue", &cli->cfg.catalogue, "URI", HELP_CATALOGUE),
        OPT_HELP("show this help"),
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };

    return parse_options(cli, argc, argv, rows, usage_migrate, 17);
}

static int parse_outbox_options(struct cli *cli, int argc, char **argv)
{
    const struct option_row rows[] = {
        OPT_STRING(0, "db", &cli->cfg.db, "URI", HELP_DB),
        OPT_CALLBACK(0, "status", &cli->status, "S", "list only messages in state S",
                     status_option),
        OPT_INT64(0, "limit", &cli->limit, "N", 1, 100000,
                  "list at most N messages, newest first (default 100)"),
        OPT_HELP("show this help"),
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };

    return parse_options(cli, argc, argv, rows, usage_outbox, 17);
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

    /* Users and tokens of a shard set are in its catalogue. */
    if (app_db_is_shards(db) != (cli->cfg.catalogue != NULL)) {
        fprintf(stderr, "orderd %s: --db shards:URI and --catalogue URI go together\n", what);
        return NULL;
    }
    if (cli->cfg.catalogue != NULL)
        db = cli->cfg.catalogue;

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

/* `orderd migrate` on a shard set: the catalogue and every cluster, as `serve` opens them. */
static int run_migrate_shards(const struct cli *cli)
{
    struct app app;
    char err[512];
    int applied = 0;
    int rc;

    app_init(&app, &cli->cfg);
    rc = app_open_store(&app, &applied, err, sizeof err);
    if (rc < 0)
        fprintf(stderr, "orderd migrate: %s\n", err);
    else
        printf("orderd: applied %d migration%s\n", applied, applied == 1 ? "" : "s");
    app_close(&app);
    return rc < 0 ? 1 : 0;
}

static int run_migrate(const struct cli *cli)
{
    int applied = 0;
    struct idem_store *st;

    if (app_db_is_shards(cli->cfg.db))
        return run_migrate_shards(cli);
    st = open_command_store(cli, "migrate", 0, &applied);
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

    cli_command(cli, "token");
    if (argc >= 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        status = parse_token_options(cli, argc - 1, argv + 1);
        goto out;
    }
    if (argc < 3) {
        status = options_error(&cli->opts, "a subcommand is needed: 'create', 'list' or 'revoke'");
        goto out;
    }
    if (strcmp(argv[2], "list") == 0 || strcmp(argv[2], "revoke") == 0) {
        int revoke = strcmp(argv[2], "revoke") == 0;
        cli_command(cli, revoke ? "token revoke" : "token list");
        status = parse_token_options(cli, argc - 2, argv + 2);
        if (status >= 0)
            goto out;
        if (!revoke && (cli->token_id || cli->token)) {
            status = options_error(&cli->opts, "list takes --user only");
            goto out;
        }
        if (revoke && (cli->user != NULL) + (cli->token_id != NULL) + (cli->token != NULL) != 1) {
            status = options_error(&cli->opts, "name exactly one of --user, --token-id, --token");
            goto out;
        }
        status = run_token_admin(cli, revoke);
        goto out;
    }
    if (strcmp(argv[2], "create") != 0) {
        status = options_error(&cli->opts,
                               "unknown subcommand '%s' (expected 'create', 'list' or "
                               "'revoke')",
                               argv[2]);
        goto out;
    }
    cli_command(cli, "token create");
    status = parse_token_options(cli, argc - 2, argv + 2);
    if (status >= 0)
        goto out;
    if (cli->token_id || cli->token) {
        status = options_error(&cli->opts, "create takes --user only");
        goto out;
    }
    if (cli->user == NULL || cli->user[0] == '\0') {
        status = options_error(&cli->opts, "--user NAME is required");
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

    if (app_db_is_shards(cli->cfg.db)) { /* the outbox is one per cluster: name one */
        fprintf(stderr, "orderd %s: give one cluster's store as --db, not the shard set\n",
                cli->command);
        return 1;
    }
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

    cli_command(cli, "outbox");
    if (strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0) {
        return parse_outbox_options(cli, argc - 1, argv + 1);
    }
    if (argc < 3)
        return options_error(&cli->opts, "a subcommand is needed: 'list' or 'retry'");
    if (!retry && strcmp(sub, "list") != 0)
        return options_error(&cli->opts, "unknown subcommand '%s' (expected 'list' or 'retry')",
                             sub);
    cli_command(cli, retry ? "outbox retry" : "outbox list");
    cli->allow_arg = retry;
    status = parse_outbox_options(cli, argc - 2, argv + 2);
    if (status >= 0)
        return status;
    if (retry && (cli->arg == NULL || cli->arg[0] == '\0'))
        return options_error(&cli->opts, "the id of the message is needed: orderd outbox retry ID");
    if (retry && (cli->status != NULL || cli->limit > 0))
        return options_error(&cli->opts, "--status and --limit are options of 'outbox list'");
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
        cli_command(&cli, "serve");
        status = parse_serve_options(&cli, argc - 1, argv + 1);
        /* The baseline measures records against none, not payments: it never charges. */
        if (status < 0 && cli.cfg.idempotency_off && cli.cfg.provider != NULL)
            status = options_error(&cli.opts, "--idempotency off cannot be used with --provider");
        /*
         * A charge follows phase 1's commit: were that commit lost in a crash (normal does not
         * fsync every commit), the retry would make a new order, so a second charge.
         */
        if (status < 0 && cli.cfg.sync == IDEM_SYNC_NORMAL && cli.cfg.provider != NULL)
            status =
                options_error(&cli.opts, "--sqlite-sync normal cannot be used with --provider: an "
                                         "order must be on disk before its card is charged");
        if (status < 0 && cli.cfg.provider_ca != NULL)
            status = check_provider_ca(&cli);
        if (status < 0 && cli.cfg.idempotency_off)
            fprintf(stderr, "orderd: warn: --idempotency off: POST /api/orders keeps no "
                            "idempotency record, retries are NOT safe (benchmark baseline)\n");
        if (status < 0)
            status = serve_run(&cli.cfg);
    } else if (strcmp(cmd, "migrate") == 0) {
        cli_command(&cli, "migrate");
        status = parse_migrate_options(&cli, argc - 1, argv + 1);
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
