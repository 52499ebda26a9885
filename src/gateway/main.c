/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - idem-gateway's command line: `serve`, `check-config`, `keys list|show|resolve`,
 * `shards init|add|show|move` (shards_cmd.c), `--help`, `--version`.
 * As in orderd, a wrong flag or value is named on stderr with exit status 2, a failure at run
 * time exits with 1; a config file with a mistake is one line naming the file, the line and what
 * was expected (config.h).
 */
#include <errno.h>
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
#include "http_limits_options.h"
#include "options.h"
#include "records.h"
#include "serve.h"
#include "shards_cmd.h"
#include "tls.h"
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
    "  shards init    set a shard set's directory up (its clusters, the buckets spread)\n"
    "  shards add     name a new cluster in a shard set, owning no bucket yet\n"
    "  shards show    print a shard set's map: clusters, bucket counts, buckets moving\n"
    "  shards move    move a bucket to another cluster while the gateways run\n"
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
    "Options:\n";

static const char usage_check[] =
    "Usage: idem-gateway check-config --config FILE [--no-store]\n"
    "\n"
    "Reads FILE as idem-gateway serve would; the first mistake is 'FILE:LINE: what is wrong'\n"
    "with exit status 2.  Then opens the store as serve would (libidem's tables applied); one\n"
    "that cannot be opened is said with exit status 1.  An SQLite store serve has not made yet\n"
    "is not made: the directory it would go in must be writable.  A relative sqlite: path is\n"
    "beside FILE.  'FILE: ok (N routes)' is printed only when all of it holds.\n"
    "\n"
    "Options:\n";

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
    "Options:\n";

#define KEYS_MAX_HEADERS 32

static int print_version(void)
{
    printf("idem-gateway %s\n", IDEM_VERSION_STRING);
    return 0;
}

static int version_option(struct options *o, const struct option_row *row, const char *arg)
{
    (void)o;
    (void)row;
    (void)arg;
    return print_version();
}

/* `--version` in every command's table, not in its --help. */
#define OPT_VERSION_HIDDEN OPT_CALLBACK(0, "version", NULL, NULL, NULL, version_option)

static int log_format_option(struct options *o, const struct option_row *row, const char *arg)
{
    enum log_format *format = row->value;

    if (strcmp(arg, "text") == 0)
        *format = LOG_TEXT;
    else if (strcmp(arg, "json") == 0)
        *format = LOG_JSON;
    else
        return options_error(o, "--log-format must be 'text' or 'json'");
    return OPTIONS_CONTINUE;
}

/* Parses a command's options into `rows`; refuses what is left.  As options_parse(). */
static int parse_command(struct options *o, int argc, char **argv)
{
    int status = options_parse(o, argc, argv);

    if (status < 0 && o->next < argc)
        status = options_error(o, "unexpected argument '%s'", argv[o->next]);
    return status;
}

static int cmd_serve(int argc, char **argv)
{
    struct serve_options so = {
        .log_format = LOG_TEXT, .sweep_interval_s = 60, .replay_cache_mb = 8, .db_pool = 16};
    struct http_limits flags_limits;
    const char *file = NULL;
    const struct option_row rows[] = {
        OPT_STRING(0, "config", &file, "FILE",
                   "the YAML config (routes, upstream, store, principal)"),
        OPT_CALLBACK(0, "log-format", &so.log_format, "FORMAT", "text|json (default text)",
                     log_format_option),
        OPT_INT(0, "db-pool", &so.db_pool, "N", 1, 1024, "store connections, 1..1024 (default 16)"),
        OPT_INT(0, "sweep-interval-s", &so.sweep_interval_s, "N", 0, 86400,
                "seconds between retention sweeps, 0 to disable (default 60)"),
        OPT_INT(0, "replay-cache-mb", &so.replay_cache_mb, "N", 0, 65536,
                "memory for stored answers replayed without the store,\n0 to disable (default 8)"),
        OPT_TEXT("The HTTP limit flags below override the config's `limits:`.\n"),
        OPT_HTTP_LIMITS(&flags_limits), /* --max-connections and the other limits */
        OPT_HELP("show this help"),
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };
    struct options o = {
        .prog = "idem-gateway serve", .usage = usage_serve, .rows = rows, .column = 27};
    struct gw_config *cfg = NULL;
    char err[600];
    int status;

    memset(&flags_limits, 0, sizeof flags_limits);
    status = parse_command(&o, argc, argv);
    if (status >= 0)
        return status;
    if (!file)
        return options_error(&o, "--config FILE is required");
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
    const char *file = NULL;
    int no_store = 0, status = 0;
    const struct option_row rows[] = {
        OPT_STRING(0, "config", &file, "FILE", "the YAML config"),
        OPT_FLAG(0, "no-store", &no_store, "check the file only, not the store"),
        OPT_HELP("show this help"),
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };
    struct options o = {
        .prog = "idem-gateway check-config", .usage = usage_check, .rows = rows, .column = 17};
    struct gw_config *cfg = NULL;
    struct gateway gw = {0}; /* its stores only */
    struct idem_engine_options no_cache = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_store_options so;
    char err[600];

    status = parse_command(&o, argc, argv);
    if (status >= 0)
        return status;
    status = 0;
    if (!file)
        return options_error(&o, "--config FILE is required");
    if (gw_config_load(file, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return EXIT_USAGE;
    }
    admin_warn(cfg, stderr);
    /* The upstream's TLS files as serve reads them (a key that is not the certificate's...). */
    if (cfg->upstream_tls) {
        struct tls_ctx *tls = NULL;
        if (serve_upstream_tls(cfg, &tls, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", file, err);
            status = 1;
        }
        tls_ctx_free(tls);
    }
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
    } else if (gateway_stores_open(&gw, cfg->store, &so, &no_cache, err, sizeof err) != 0) {
        fprintf(stderr, "%s: the store cannot be opened: %s\n", file, err);
        status = 1;
    }
    gateway_stores_close(&gw);
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
    struct gateway gw; /* its stores and engines only (a shard set's: one per cluster) */
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
    char err[600];

    if (store_file_exists(k->cfg, "keys") != 0)
        return 1;
    if (gateway_stores_open(&k->gw, k->cfg->store, &so, &eo, err, sizeof err) != 0) {
        fprintf(stderr, "idem-gateway keys: cannot open the store: %s\n", err);
        return 1;
    }
    return 0;
}

static void keys_store_close(struct keys_store *k)
{
    gateway_stores_close(&k->gw);
    gw_config_free(k->cfg);
}

/* What the keys commands were told. */
struct keys_args {
    const char *file, *operation;
    const char *state, *after;                                 /* list */
    int limit;                                                 /* list; 0: not given */
    const char *principal, *key, *decision, *body, *body_file; /* show, resolve */
    int status_code;
    char *header_copy[KEYS_MAX_HEADERS];
    struct idem_header headers[KEYS_MAX_HEADERS];
    size_t nheaders;
};

static int header_option(struct options *o, const struct option_row *row, const char *arg)
{
    struct keys_args *a = row->value;
    const char *colon = strchr(arg, ':');
    struct idem_header *h = &a->headers[a->nheaders];

    if (!colon || colon == arg || a->nheaders == KEYS_MAX_HEADERS)
        return options_error(o, "--header takes 'Name: value' (at most 32)");
    a->header_copy[a->nheaders] = xstrdup(arg);
    a->header_copy[a->nheaders][colon - arg] = '\0';
    h->name = a->header_copy[a->nheaders];
    h->value = a->header_copy[a->nheaders] + (colon - arg) + 1;
    while (*h->value == ' ')
        h->value++;
    a->nheaders++;
    return OPTIONS_CONTINUE;
}

static int state_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (strcmp(arg, "unknown") != 0 && strcmp(arg, "in-flight") != 0 && strcmp(arg, "any") != 0)
        return options_error(o, "--state is 'unknown', 'in-flight' or 'any'");
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

/*
 * The options of `keys list|show|resolve` (argv[0] the subcommand), in one table as their
 * --help is one; an option of the other kind of subcommand is refused.  As options_parse().
 */
static int keys_parse(struct keys_args *a, struct options *o, int list, int argc, char **argv)
{
    const struct option_row rows[] = {
        OPT_STRING(0, "config", &a->file, "FILE",
                   "the gateway's YAML config (its store and routes)"),
        OPT_STRING(0, "principal", &a->principal, "P",
                   "the caller, as the gateway derives it (a header's value,\n"
                   "sha256:<hex>, jwt:<sub>)"),
        OPT_STRING(0, "operation", &a->operation, "OP", "the route's operation name"),
        OPT_STRING(0, "key", &a->key, "K", "the idempotency key, unquoted"),
        OPT_STRING(0, "decision", &a->decision, "D", "executed | not-executed"),
        OPT_INT(0, "status", &a->status_code, "N", RECORDS_STATUS_MIN, RECORDS_STATUS_MAX,
                "the answer's status (executed)"),
        OPT_CALLBACK(0, "header", a, "'N: V'",
                     "a header stored with it (repeatable; the route's store_headers apply)",
                     header_option),
        OPT_STRING(0, "body", &a->body, "TEXT", NULL),
        OPT_STRING(0, "body-file", &a->body_file, "FILE", NULL),
        OPT_TEXT("  --body TEXT, --body-file FILE   its body\n"),
        /* list's, said in the usage's synopsis and text */
        OPT_CALLBACK(0, "state", &a->state, "S", NULL, state_option),
        OPT_STRING(0, "after", &a->after, "CURSOR", NULL),
        OPT_INT(0, "limit", &a->limit, "N", 1, 1000, NULL),
        OPT_HELP("show this help"),
        OPT_VERSION_HIDDEN,
        OPT_END(),
    };
    int status;

    o->rows = rows;
    status = parse_command(o, argc, argv);
    if (status < 0 && list &&
        (a->principal || a->key || a->decision || a->status_code || a->nheaders || a->body ||
         a->body_file))
        status = options_error(o, "--principal, --key, --decision, --status, --header, --body "
                                  "and --body-file are options of show and resolve");
    if (status < 0 && !list && (a->state || a->after || a->limit))
        status = options_error(o, "--state, --after and --limit are options of list");
    return status;
}

/* keys list: the held keys (or those in flight) of the store, a page at a time. */
static int cmd_keys_list(struct keys_args *a, struct options *o)
{
    struct keys_store k;
    json_t *doc = NULL;
    char *text;
    int rc, status;

    if (!a->file)
        return options_error(o, "--config FILE is required");
    status = keys_store_load(a->file, &k);
    if (status == 0)
        status = keys_store_connect(&k);
    if (status != 0)
        goto out;
    rc = records_list(k.gw.stores, k.gw.nengines, a->state ? a->state : "unknown", a->operation,
                      a->after, a->limit ? a->limit : 100, &doc);
    if (rc == IDEM_EINVAL) {
        status = options_error(o, "--after is not a cursor this command printed");
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
    struct keys_args a = {0};
    struct options o = {.prog = "idem-gateway keys", .usage = usage_keys, .column = 22};
    int show, list, status = 1;
    struct keys_store k = {0};
    struct idem_operation *ops = NULL;
    char *file_body = NULL;
    char err[600];

    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        if (argc < 2) {
            fputs(usage_keys, stderr);
            return EXIT_USAGE;
        }
        return keys_parse(&a, &o, 0, argc, argv);
    }
    list = strcmp(argv[1], "list") == 0;
    if (!list && strcmp(argv[1], "show") != 0 && strcmp(argv[1], "resolve") != 0)
        return options_error(&o, "the subcommand is 'list', 'show' or 'resolve'");
    show = strcmp(argv[1], "show") == 0;
    status = keys_parse(&a, &o, list, argc - 1, argv + 1);
    if (status >= 0)
        goto out;
    if (list) {
        status = cmd_keys_list(&a, &o);
        goto out;
    }
    status = 1;
    if (!a.file || !a.principal || !a.operation || !a.key) {
        status = options_error(&o, "--config, --principal, --operation and --key are required");
        goto out;
    }
    if (!show && (!a.decision || (strcmp(a.decision, "executed") != 0 &&
                                  strcmp(a.decision, "not-executed") != 0))) {
        status = options_error(&o, "--decision is 'executed' or 'not-executed'");
        goto out;
    }
    if (!show && strcmp(a.decision, "executed") == 0 && a.status_code == 0) {
        status = options_error(&o, "--decision executed needs --status");
        goto out;
    }
    if (a.body && a.body_file) {
        status = options_error(&o, "--body and --body-file exclude each other");
        goto out;
    }
    if (keys_store_load(a.file, &k) != 0) {
        status = EXIT_USAGE;
        goto out;
    }
    ops = gateway_ops_new(k.cfg);
    if (!records_find_op(k.cfg, ops, a.operation)) {
        fprintf(stderr, "idem-gateway keys: no route of %s has operation '%s'\n", a.file,
                a.operation);
        status = EXIT_USAGE;
        goto out;
    }
    if (keys_store_connect(&k) != 0)
        goto out;
    if (show) {
        json_t *doc = NULL;
        struct idem_engine *eng = gateway_engine(&k.gw, a.principal, 1);
        int rc = eng ? records_show(eng, a.principal, a.operation, a.key, &doc) : IDEM_EMOVED;
        if (rc < 0) {
            fprintf(stderr, "idem-gateway keys: %s\n", idem_strerror(rc));
        } else if (rc == 0) {
            fprintf(stderr, "idem-gateway keys: no record of key '%s'\n", a.key);
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
        struct idem_engine *eng;
        size_t flen = 0;
        if (a.body_file) {
            file_body = read_body_file(a.body_file, &flen, err, sizeof err);
            if (!file_body) {
                fprintf(stderr, "idem-gateway keys: %s\n", err);
                goto out;
            }
        }
        d.executed = strcmp(a.decision, "executed") == 0;
        d.status = a.status_code;
        d.headers = a.headers;
        d.nheaders = a.nheaders;
        d.body = file_body ? file_body : a.body;
        d.body_len = file_body ? flen : a.body ? strlen(a.body) : 0;
        err[0] = '\0';
        eng = gateway_engine(&k.gw, a.principal, 1);
        if (!eng) {
            snprintf(err, sizeof err, "the principal's bucket is moving; try again");
            r = RECORDS_FAILED;
        } else {
            r = records_resolve(eng, records_find_op(k.cfg, ops, a.operation), a.principal, a.key,
                                &d, err, sizeof err);
        }
        if (r == RECORDS_RESOLVED) {
            printf("%s: %s\n", a.key, a.decision);
            status = 0;
        } else {
            fprintf(stderr, "idem-gateway keys: %s%s%s\n", result_text[r], err[0] ? ": " : "", err);
        }
    }
out:
    for (size_t i = 0; i < a.nheaders; i++)
        free(a.header_copy[i]);
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
    if (strcmp(argv[1], "shards") == 0)
        return cmd_shards(argc - 1, argv + 1);
    fprintf(stderr, "idem-gateway: unknown command '%s'\n%s", argv[1], usage_main);
    return EXIT_USAGE;
}
