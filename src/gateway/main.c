/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - idem-gateway's command line: `serve`, `check-config`, `keys list|show|resolve`,
 * `--help`,
 * `--version`.
 * As in orderd, a wrong flag or value is named on stderr with exit status 2, a failure at run
 * time exits with 1; a config file with a mistake is one line naming the file, the line and what
 * was expected (config.h).
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idem/idem.h"

#include "admin.h"
#include "config.h"
#include "gateway.h"
#include "records.h"
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
    "  keys show      print the record of one key\n"
    "  keys list      the held keys (outcome unknown) an operator must resolve, a page at a time\n"
    "  keys resolve   settle a record whose outcome is unknown (held)\n"
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
    "The HTTP limit flags below override the config's `limits:`.\n";

static const char usage_serve_end[] = "  -h, --help               show this help\n";

static const char usage_check[] =
    "Usage: idem-gateway check-config --config FILE [--no-store]\n"
    "\n"
    "Reads FILE as idem-gateway serve would; the first mistake is 'FILE:LINE: what is wrong'\n"
    "with exit status 2.  Then opens the store as serve would (libidem's tables applied); one\n"
    "that cannot be opened is said with exit status 1.  An SQLite store serve has not made yet\n"
    "is not made: the directory it would go in must be writable.  A relative sqlite: path is\n"
    "beside FILE.  'FILE: ok (N routes)' is printed only when all of it holds.\n"
    "\n"
    "Options:\n"
    "  --config FILE  the YAML config\n"
    "  --no-store     check the file only, not the store\n"
    "  -h, --help     show this help\n";

static const char usage_keys[] =
    "Usage: idem-gateway keys list --config FILE [--state unknown|in-flight|any]\n"
    "                              [--operation OP] [--after CURSOR] [--limit N]\n"
    "       idem-gateway keys show --config FILE --principal P --operation OP --key K\n"
    "       idem-gateway keys resolve --config FILE --principal P --operation OP --key K\n"
    "                                 --decision executed --status N [--header 'Name: value']...\n"
    "                                 [--body TEXT | --body-file FILE]\n"
    "       idem-gateway keys resolve ... --decision not-executed\n"
    "\n"
    "Reads the store named in FILE directly (the gateway may be running or not); a relative\n"
    "sqlite: path is beside FILE, and a store that is not there is an error, never made.\n"
    "list prints, as JSON, the records not completed whose state is --state (default unknown:\n"
    "the held keys an operator must resolve), at most --limit of them looked at (default\n"
    "100, at most 1000), and \"next\": the --after of the next page (null after the last).\n"
    "show prints the record as JSON: its state (completed, in-flight, unknown), recovery\n"
    "point, fingerprint, times, and the stored status and size.  Exit status 1 when there is\n"
    "no record.\n"
    "resolve settles a record whose outcome is unknown, once you know what happened upstream:\n"
    "'executed' stores the given answer (every retry gets it), 'not-executed' deletes the\n"
    "record (the next retry runs).  Exit status 1 when the record is missing, completed, or\n"
    "being forwarded right now.\n"
    "\n"
    "Options:\n"
    "  --config FILE       the gateway's YAML config (its store and routes)\n"
    "  --principal P       the caller, as the gateway derives it (a header's value,\n"
    "                      sha256:<hex>, jwt:<sub>)\n"
    "  --operation OP      the route's operation name\n"
    "  --key K             the idempotency key, unquoted\n"
    "  --decision D        executed | not-executed\n"
    "  --status N          the answer's status (executed)\n"
    "  --header 'N: V'     a header stored with it (repeatable; the route's store_headers apply)\n"
    "  --body TEXT, --body-file FILE   its body\n"
    "  -h, --help          show this help\n";

enum {
    OPT_CONFIG = 0x100,
    OPT_LOG_FORMAT,
    OPT_DB_POOL,
    OPT_SWEEP,
    OPT_REPLAY_CACHE,
    OPT_VERSION,
    OPT_NO_STORE,
    OPT_STATE,
    OPT_AFTER,
    OPT_LIMIT,
    OPT_PRINCIPAL,
    OPT_OPERATION,
    OPT_KEY,
    OPT_DECISION,
    OPT_STATUS,
    OPT_HEADER,
    OPT_BODY,
    OPT_BODY_FILE,
};

#define KEYS_MAX_HEADERS 32

static int usage_error(const char *command, const char *msg)
{
    fprintf(stderr, "idem-gateway %s: %s\nTry 'idem-gateway %s --help'.\n", command, msg, command);
    return EXIT_USAGE;
}

/*
 * What getopt_long() (run with opterr 0 and an optstring starting ':') found wrong, as one line:
 * a missing value, or an unknown option named as it was written.
 */
static int option_error(const char *command, int c, char **argv)
{
    char msg[300];
    const char *arg = argv[optind - 1];

    if (c == ':')
        snprintf(msg, sizeof msg, "option '%s' needs a value", arg);
    else if (optopt != 0 && optopt < 0x100)
        snprintf(msg, sizeof msg, "unknown option '-%c'", optopt);
    else
        snprintf(msg, sizeof msg, "unknown option '%s'", arg);
    return usage_error(command, msg);
}

static int print_version(void)
{
    printf("idem-gateway %s\n", IDEM_VERSION_STRING);
    return 0;
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
        HTTP_LIMITS_OPTIONS /* --max-connections and the other limits */
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
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
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, &idx)) != -1) {
        switch (c) {
        case OPT_VERSION:
            return print_version();
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
            return option_error("serve", c, argv);
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

/*
 * Whether a SQLite store's file is there: check-config and keys read the store serve writes and
 * never create one, so a config read from the wrong place cannot pass for an empty store.  0 when
 * it exists (or the store is PostgreSQL's); -1 after saying which path was looked at.
 */
static int store_file_exists(const struct gw_config *cfg, const char *cmd)
{
    struct stat st;

    if (cfg->store_file == NULL || stat(cfg->store_file, &st) == 0)
        return 0;
    fprintf(stderr,
            "idem-gateway %s: no store at %s: %s (serve creates it there on its first start)\n",
            cmd, cfg->store_file, strerror(errno));
    return -1;
}

/*
 * check-config on a SQLite store serve has not made yet: the nearest directory of its path that
 * exists must be one serve can write.  0, or -1 after saying why.
 */
static int store_file_creatable(const char *path, const char *file)
{
    char dir[4096];
    char *slash;

    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) {
        fprintf(stderr, "%s: the store's path is too long\n", file);
        return -1;
    }
    for (;;) {
        slash = strrchr(dir, '/');
        if (slash == NULL) {
            snprintf(dir, sizeof dir, ".");
        } else if (slash == dir) {
            dir[1] = '\0';
        } else {
            *slash = '\0';
        }
        if (access(dir, F_OK) == 0)
            break;
        if (slash == NULL || slash == dir)
            break;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "%s: the store %s cannot be made: %s: %s\n", file, path, dir,
                strerror(errno));
        return -1;
    }
    return 0;
}

static int cmd_check(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"no-store", no_argument, NULL, OPT_NO_STORE},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    const char *file = NULL;
    struct gw_config *cfg = NULL;
    struct idem_store *store = NULL;
    struct idem_store_options so;
    char *errmsg = NULL;
    char err[600];
    int c, no_store = 0, status = 0;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(usage_check, stdout);
            return 0;
        }
        if (c == OPT_VERSION)
            return print_version();
        if (c == OPT_NO_STORE) {
            no_store = 1;
            continue;
        }
        if (c != OPT_CONFIG)
            return option_error("check-config", c, argv);
        file = optarg;
    }
    if (!file)
        return usage_error("check-config", "--config FILE is required");
    if (gw_config_load(file, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return EXIT_USAGE;
    }
    admin_warn(cfg, stderr);
    /*
     * The store as serve opens it, so a store the gateway cannot open fails here, not at start;
     * a SQLite file serve has not made yet is not made here (its directory is checked instead).
     */
    memset(&so, 0, sizeof so);
    so.pool_size = 1;
    if (no_store) {
        /* the config alone */
    } else if (cfg->store_file != NULL && access(cfg->store_file, F_OK) != 0) {
        if (store_file_creatable(cfg->store_file, file) != 0)
            status = 1;
    } else if (idem_store_open(cfg->store, &so, &store, &errmsg) < 0) {
        fprintf(stderr, "%s: the store cannot be opened: %s\n", file,
                errmsg ? errmsg : "unknown error");
        status = 1;
    }
    idem_free(errmsg);
    idem_store_close(store);
    /* "ok" only once everything checked holds. */
    if (status == 0)
        printf("%s: ok (%zu route%s%s)\n", file, cfg->nroutes, cfg->nroutes == 1 ? "" : "s",
               no_store ? ", store not checked" : "");
    gw_config_free(cfg);
    return status;
}

/* The whole of a file, at most 16 MiB; NULL with `err` set. */
static char *read_body_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0, n = 0;

    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        size_t got;
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > ((size_t)16 << 20) + 1) {
                snprintf(err, errlen, "%s is over 16 MiB", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = xrealloc(buf, cap);
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* What the keys commands work on: the config, its store, an engine without a replay cache. */
struct keys_store {
    struct gw_config *cfg;
    struct idem_store *store;
    struct idem_engine *eng;
};

/* Loads `file` into k->cfg: 0, or EXIT_USAGE after saying why.  keys_store_close() it. */
static int keys_store_load(const char *file, struct keys_store *k)
{
    char err[600];

    memset(k, 0, sizeof *k);
    if (gw_config_load(file, &k->cfg, err, sizeof err) != 0) {
        fprintf(stderr, "idem-gateway: %s\n", err);
        return EXIT_USAGE;
    }
    return 0;
}

/* Opens k->cfg's store and an engine on it: 0, or 1 after saying why. */
static int keys_store_connect(struct keys_store *k)
{
    struct idem_store_options so = {.pool_size = 2};
    struct idem_engine_options eo = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    char *errmsg = NULL;
    int status = 0;

    if (store_file_exists(k->cfg, "keys") != 0)
        return 1;
    if (idem_store_open(k->cfg->store, &so, &k->store, &errmsg) < 0 ||
        idem_engine_new(k->store, &eo, &k->eng) < 0) {
        fprintf(stderr, "idem-gateway keys: cannot open the store: %s\n",
                errmsg ? errmsg : "engine");
        status = 1;
    }
    idem_free(errmsg);
    return status;
}

static void keys_store_close(struct keys_store *k)
{
    idem_engine_free(k->eng);
    idem_store_close(k->store);
    gw_config_free(k->cfg);
}

/* keys list: the held keys (or those in flight) of the store, a page at a time. */
static int cmd_keys_list(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"state", required_argument, NULL, OPT_STATE},
        {"operation", required_argument, NULL, OPT_OPERATION},
        {"after", required_argument, NULL, OPT_AFTER},
        {"limit", required_argument, NULL, OPT_LIMIT},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    const char *file = NULL, *state = "unknown", *operation = NULL, *after = NULL;
    struct keys_store k;
    json_t *doc = NULL;
    char *text;
    int c, limit = 100, rc, status;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(usage_keys, stdout);
            return 0;
        case OPT_VERSION:
            return print_version();
        case OPT_CONFIG:
            file = optarg;
            break;
        case OPT_STATE:
            state = optarg;
            if (strcmp(state, "unknown") != 0 && strcmp(state, "in-flight") != 0 &&
                strcmp(state, "any") != 0)
                return usage_error("keys", "--state is 'unknown', 'in-flight' or 'any'");
            break;
        case OPT_OPERATION:
            operation = optarg;
            break;
        case OPT_AFTER:
            after = optarg;
            break;
        case OPT_LIMIT:
            if (int_flag("keys", "limit", optarg, 1, 1000, &limit) != 0)
                return EXIT_USAGE;
            break;
        default:
            return option_error("keys", c, argv);
        }
    }
    if (optind < argc)
        return usage_error("keys", "unexpected argument");
    if (!file)
        return usage_error("keys", "--config FILE is required");
    status = keys_store_load(file, &k);
    if (status == 0)
        status = keys_store_connect(&k);
    if (status != 0)
        goto out;
    rc = records_list(k.store, state, operation, after, limit, &doc);
    if (rc == IDEM_EINVAL) {
        status = usage_error("keys", "--after is not a cursor this command printed");
    } else if (rc < 0) {
        fprintf(stderr, "idem-gateway keys: %s\n", idem_strerror(rc));
        status = 1;
    } else {
        text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", text ? text : "{}");
        free(text);
    }
out:
    json_decref(doc);
    keys_store_close(&k);
    return status;
}

static int cmd_keys(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"principal", required_argument, NULL, OPT_PRINCIPAL},
        {"operation", required_argument, NULL, OPT_OPERATION},
        {"key", required_argument, NULL, OPT_KEY},
        {"decision", required_argument, NULL, OPT_DECISION},
        {"status", required_argument, NULL, OPT_STATUS},
        {"header", required_argument, NULL, OPT_HEADER},
        {"body", required_argument, NULL, OPT_BODY},
        {"body-file", required_argument, NULL, OPT_BODY_FILE},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    const char *file = NULL, *principal = NULL, *operation = NULL, *key = NULL;
    const char *decision = NULL, *body = NULL, *body_file = NULL;
    char *header_copy[KEYS_MAX_HEADERS];
    struct idem_header headers[KEYS_MAX_HEADERS];
    size_t nheaders = 0;
    int status_code = 0, show, c, status = 1;
    struct keys_store k = {0};
    struct idem_operation *ops = NULL;
    char *file_body = NULL;
    char err[600];

    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        fputs(usage_keys, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "list") == 0)
        return cmd_keys_list(argc - 1, argv + 1);
    if (strcmp(argv[1], "show") != 0 && strcmp(argv[1], "resolve") != 0)
        return usage_error("keys", "the subcommand is 'list', 'show' or 'resolve'");
    show = strcmp(argv[1], "show") == 0;
    argc--;
    argv++;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            fputs(usage_keys, stdout);
            return 0;
        case OPT_VERSION:
            return print_version();
        case OPT_CONFIG:
            file = optarg;
            break;
        case OPT_PRINCIPAL:
            principal = optarg;
            break;
        case OPT_OPERATION:
            operation = optarg;
            break;
        case OPT_KEY:
            key = optarg;
            break;
        case OPT_DECISION:
            decision = optarg;
            break;
        case OPT_STATUS:
            if (int_flag("keys", "status", optarg, RECORDS_STATUS_MIN, RECORDS_STATUS_MAX,
                         &status_code) != 0)
                return EXIT_USAGE;
            break;
        case OPT_HEADER: {
            char *colon = strchr(optarg, ':');
            if (!colon || colon == optarg || nheaders == KEYS_MAX_HEADERS)
                return usage_error("keys", "--header takes 'Name: value' (at most 32)");
            header_copy[nheaders] = xstrdup(optarg);
            header_copy[nheaders][colon - optarg] = '\0';
            headers[nheaders].name = header_copy[nheaders];
            headers[nheaders].value = header_copy[nheaders] + (colon - optarg) + 1;
            while (*headers[nheaders].value == ' ')
                headers[nheaders].value++;
            nheaders++;
            break;
        }
        case OPT_BODY:
            body = optarg;
            break;
        case OPT_BODY_FILE:
            body_file = optarg;
            break;
        default:
            return option_error("keys", c, argv);
        }
    }
    if (!file || !principal || !operation || !key)
        return usage_error("keys", "--config, --principal, --operation and --key are required");
    if (!show &&
        (!decision || (strcmp(decision, "executed") != 0 && strcmp(decision, "not-executed") != 0)))
        return usage_error("keys", "--decision is 'executed' or 'not-executed'");
    if (!show && strcmp(decision, "executed") == 0 && status_code == 0)
        return usage_error("keys", "--decision executed needs --status");
    if (body && body_file)
        return usage_error("keys", "--body and --body-file exclude each other");
    if (keys_store_load(file, &k) != 0) {
        status = EXIT_USAGE;
        goto out;
    }
    ops = gateway_ops_new(k.cfg);
    if (!records_find_op(k.cfg, ops, operation)) {
        fprintf(stderr, "idem-gateway keys: no route of %s has operation '%s'\n", file, operation);
        status = EXIT_USAGE;
        goto out;
    }
    if (keys_store_connect(&k) != 0)
        goto out;
    if (show) {
        json_t *doc = NULL;
        int rc = records_show(k.eng, principal, operation, key, &doc);
        if (rc < 0) {
            fprintf(stderr, "idem-gateway keys: %s\n", idem_strerror(rc));
        } else if (rc == 0) {
            fprintf(stderr, "idem-gateway keys: no record of key '%s'\n", key);
        } else {
            char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            printf("%s\n", text ? text : "{}");
            free(text);
            status = 0;
        }
        json_decref(doc);
    } else {
        struct records_decision d = {0};
        static const char *const result_text[] = {
            [RECORDS_RESOLVED] = "resolved",
            [RECORDS_NOT_FOUND] = "there is no record of this key",
            [RECORDS_COMPLETED] = "the record has an answer already; nothing to resolve",
            [RECORDS_IN_FLIGHT] = "a gateway is forwarding this request right now",
            [RECORDS_FAILED] = "the store failed",
        };
        enum records_result r;
        size_t flen = 0;
        if (body_file) {
            file_body = read_body_file(body_file, &flen, err, sizeof err);
            if (!file_body) {
                fprintf(stderr, "idem-gateway keys: %s\n", err);
                goto out;
            }
        }
        d.executed = strcmp(decision, "executed") == 0;
        d.status = status_code;
        d.headers = headers;
        d.nheaders = nheaders;
        d.body = file_body ? file_body : body;
        d.body_len = file_body ? flen : body ? strlen(body) : 0;
        err[0] = '\0';
        r = records_resolve(k.eng, records_find_op(k.cfg, ops, operation), principal, key, &d, err,
                            sizeof err);
        if (r == RECORDS_RESOLVED) {
            printf("%s: %s\n", key, decision);
            status = 0;
        } else {
            fprintf(stderr, "idem-gateway keys: %s%s%s\n", result_text[r], err[0] ? ": " : "", err);
        }
    }
out:
    for (size_t i = 0; i < nheaders; i++)
        free(header_copy[i]);
    free(file_body);
    free(ops);
    keys_store_close(&k);
    return status;
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
    if (strcmp(argv[1], "--version") == 0)
        return print_version();
    if (strcmp(argv[1], "serve") == 0)
        return cmd_serve(argc - 1, argv + 1);
    if (strcmp(argv[1], "check-config") == 0)
        return cmd_check(argc - 1, argv + 1);
    if (strcmp(argv[1], "keys") == 0)
        return cmd_keys(argc - 1, argv + 1);
    fprintf(stderr, "idem-gateway: unknown command '%s'\n%s", argv[1], usage_main);
    return EXIT_USAGE;
}
