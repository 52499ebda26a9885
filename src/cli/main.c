/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - the idem command line: `post`, `put`, `get`, `delete`, `journal`, `--help`,
 * `--version`.  It reads like curl on purpose (-d, -H, -i, -v), so the one thing a user has to
 * learn is what it adds: a stable Idempotency-Key per intent and retries that are safe.  A wrong
 * flag or value is named on stderr and exits 2; every other exit code is the request's outcome
 * (cli.h).  Flags are parsed into a struct cli_config that run.c receives.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "idem/client.h"
#include "ascii.h"

#include "cli.h"
#include "options.h"
#include "util.h" /* src/util: read_file_capped, parse_int64, xstrdup */
#include "banned.h"

const char program_name[] = "idem"; /* util.h: die() and the allocators' messages */

#define BODY_MAX ((size_t)64 << 20)

static const char usage_main[] =
    "Usage: idem <command> URL [options]\n"
    "\n"
    "idem sends HTTP requests that are safe to retry: every attempt of one request carries the\n"
    "same Idempotency-Key and the same bytes, and an --intent name keeps its key in a journal so\n"
    "that running the same command again (after a crash, a Ctrl-C, a lost answer) is a retry,\n"
    "not a second purchase.\n"
    "\n"
    "Commands:\n"
    "  post URL      send a POST (with a new key, or the key of --intent / --key)\n"
    "  put URL       send a PUT (with a key, as post)\n"
    "  delete URL    send a DELETE (with a key, as post)\n"
    "  get URL       send a GET (no key: a GET is safe to repeat by itself)\n"
    "  journal       list the intents of the journal, their keys and final statuses\n"
    "\n"
    "Options:\n"
    "  -h, --help    show this help ('idem help <command>' or 'idem <command> --help' for one)\n"
    "  --version     show the version\n"
    "\n"
    "Exit codes:\n"
    "  0  final 2xx answer              4  final answer neither 2xx nor 4xx (500, 3xx, ...)\n"
    "  1  local failure                 5  retries exhausted: no final answer, outcome unknown\n"
    "  2  bad usage                     6  transport failure no retry can fix (bad URL, TLS)\n"
    "  3  final 4xx answer              7  journal error (unreadable, corrupt, truncated)\n"
    "\n"
    "See 'man idem' (docs/idem.1) for the details.\n";

static const char usage_request[] = "Usage: idem %s URL [options]\n"
                                    "\n"
                                    "%s"
                                    "Prints the final answer's body on stdout.\n"
                                    "\n"
                                    "Options:\n";

static const char usage_request_end[] =
    "\n"
    "Retried: connection errors, timeouts, 409 in progress, 429, 502, 503, 504, after a pause\n"
    "with exponential backoff and full jitter, or Retry-After if longer.  Not retried: every\n"
    "other answer (400, 401, 403, 404, 413, 415, 422, 500, ...).\n"
    "Exit codes: 0 2xx, 1 local failure, 2 bad usage, 3 final 4xx, 4 other final answer,\n"
    "5 retries exhausted, 6 transport failure, 7 journal error.\n";

/* The help of the options only some commands have (-d: a body; the others: a key). */
static const char help_body[] = "request body, sent byte for byte; @FILE reads a file, @- stdin;\n"
                                "Content-Type: application/json unless -H sets another";
static const char help_key[] = "the Idempotency-Key to send (default: a new UUIDv4)";
static const char help_intent[] = "journal the key under NAME before sending; the same NAME\n"
                                  "again reuses that key, so a re-run is a retry (and an intent\n"
                                  "already answered is sent again: the server replays its answer)";
static const char help_journal[] = "the journal (default $IDEM_JOURNAL, else\n"
                                   "${XDG_STATE_HOME:-~/.local/state}/idem/journal)";

static const char usage_journal[] =
    "Usage: idem journal [--journal PATH]\n"
    "       idem journal compact [--journal PATH] [--older-than-days N]\n"
    "\n"
    "Lists the intents of the journal, one per line: name, key, final status ('-' while\n"
    "unknown), and when the key was journaled.  A corrupt or truncated record is reported with\n"
    "its line number (exit 7).\n"
    "\n"
    "compact rewrites the journal without the finished intents (a final status is known)\n"
    "journaled more than N days ago, and prints how many were dropped and kept.  Unfinished\n"
    "intents are always kept: a retry may still come.  Keep N above the server's retention of\n"
    "idempotency keys (a dropped intent run again gets a new key).  The journal also compacts\n"
    "itself (N = 7) when an append takes it past 16 MiB.\n"
    "\n"
    "Options:\n";

/* The request commands, and what each may send. */
struct command {
    const char *name;
    const char *method;
    int keyed;  /* sends an Idempotency-Key */
    int bodied; /* accepts -d */
    const char *what;
};

static const struct command commands[] = {
    {"post", "POST", 1, 1,
     "Sends a POST with an Idempotency-Key and retries it until a final answer.\n"},
    {"put", "PUT", 1, 1,
     "Sends a PUT with an Idempotency-Key and retries it until a final answer.\n"},
    {"delete", "DELETE", 1, 1,
     "Sends a DELETE with an Idempotency-Key and retries it until a final answer.\n"},
    {"get", "GET", 0, 0,
     "Sends a GET (no Idempotency-Key: it is safe to repeat) and retries it until a final\n"
     "answer.\n"},
};

static const struct command *find_command(const char *name)
{
    size_t i;

    for (i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    }
    return NULL;
}

/* Parses a decimal number of seconds (fractions allowed) into milliseconds, 1 ms .. 1 day. */
static int parse_seconds(const char *s, int64_t *ms)
{
    double v;

    if (parse_double(s, 0.0, 86400.0, &v) != 0 || !(v > 0))
        return -1;
    *ms = (int64_t)(v * 1000.0 + 0.5);
    if (*ms < 1)
        *ms = 1;
    return 0;
}

/* -d DATA, -d @FILE, -d @-.  Returns 0, or an exit code with the reason on stderr. */
static int load_body(const char *arg, struct cli_config *cfg)
{
    if (arg[0] != '@') {
        cfg->body_len = strlen(arg);
        cfg->body = xstrdup(arg);
        return 0;
    }
    if (strcmp(arg, "@-") == 0) {
        if (read_fd_capped(STDIN_FILENO, BODY_MAX, &cfg->body, &cfg->body_len) < 0) {
            fprintf(stderr, "idem: cannot read the body from stdin: %s\n",
                    errno == EFBIG ? "larger than 64 MiB" : strerror(errno));
            return CLI_EXIT_LOCAL;
        }
        return 0;
    }
    if (read_file_capped(arg + 1, BODY_MAX, 0, &cfg->body, &cfg->body_len) < 0) {
        fprintf(stderr, "idem: cannot read body file %s: %s\n", arg + 1,
                errno == EFBIG ? "larger than 64 MiB" : strerror(errno));
        return CLI_EXIT_LOCAL;
    }
    return 0;
}

/* `a` then `b`, new (util.h's allocators: out of memory ends the CLI with exit 1). */
static char *concat(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = xmalloc(na + nb + 1);

    memcpy(p, a, na);
    memcpy(p + na, b, nb + 1);
    return p;
}

/* --journal, else $IDEM_JOURNAL, else ${XDG_STATE_HOME:-$HOME/.local/state}/idem/journal. */
static char *journal_path(const char *given)
{
    const char *env = getenv("IDEM_JOURNAL"), *base;

    if (given)
        return xstrdup(given);
    if (env && env[0])
        return xstrdup(env);
    base = getenv("XDG_STATE_HOME");
    if (base && base[0] == '/')
        return concat(base, "/idem/journal");
    base = getenv("HOME");
    if (!base || !base[0])
        return NULL;
    return concat(base, "/.local/state/idem/journal");
}

static void config_release(struct cli_config *cfg)
{
    free(cfg->body);
    free(cfg->headers);
    free(cfg->auth_header);
    free(cfg->journal_path);
}

static int has_header(const struct cli_config *cfg, const char *name)
{
    size_t i, n = strlen(name);

    for (i = 0; i < cfg->nheaders; i++) {
        if (ascii_ncaseeq(cfg->headers[i], name, n) && cfg->headers[i][n] == ':')
            return 1;
    }
    return 0;
}

/* What one request command was told, for its options' callbacks (options.ctx). */
struct request_args {
    const struct command *cmd;
    struct cli_config cfg;
    const char *token; /* --token, else $IDEM_TOKEN */
    const char *jpath; /* --journal */
};

static int data_option(struct options *o, const struct option_row *row, const char *arg)
{
    struct request_args *r = o->ctx;
    int rc;

    (void)row;
    if (!r->cmd->bodied)
        return options_error(o, "a %s sends no body (-d)", r->cmd->method);
    if (r->cfg.body)
        return options_error(o, "%s", "-d given twice");
    rc = load_body(arg, &r->cfg);
    return rc != 0 ? rc : OPTIONS_CONTINUE;
}

static int header_option(struct options *o, const struct option_row *row, const char *arg)
{
    struct request_args *r = o->ctx;

    (void)row;
    if (!strchr(arg, ':') || arg[0] == ':' || strchr(arg, '\n') || strchr(arg, '\r'))
        return options_error(o, "bad header \"%s\": expected 'Name: value'", arg);
    r->cfg.headers[r->cfg.nheaders++] = arg;
    return OPTIONS_CONTINUE;
}

static int key_option(struct options *o, const struct option_row *row, const char *arg)
{
    struct request_args *r = o->ctx;
    const char *why = NULL;

    if (!r->cmd->keyed && strcmp(row->name, "journal") != 0)
        return options_error(o, "a %s sends no Idempotency-Key (--%s)", r->cmd->method, row->name);
    if (strcmp(row->name, "key") == 0) {
        if (idem_client_key_check(arg, &why) < 0)
            return options_error(o, "bad --key: %s", why);
        r->cfg.key = arg;
    } else if (strcmp(row->name, "intent") == 0) {
        if (arg[0] == '\0' || strlen(arg) > IDEM_CLIENT_INTENT_MAX)
            return options_error(o, "%s", "--intent must be 1 to 255 bytes");
        r->cfg.intent = arg;
    } else {
        if (arg[0] == '\0')
            return options_error(o, "%s", "--journal needs a path");
        r->jpath = arg;
    }
    return OPTIONS_CONTINUE;
}

/* --max-time, --attempt-timeout: seconds (fractions allowed) into milliseconds. */
static int seconds_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (parse_seconds(arg, row->value) < 0)
        return options_error(o, "--%s must be seconds in (0, 86400], not \"%s\"", row->name, arg);
    return OPTIONS_CONTINUE;
}

/* Parses the options of post/put/delete/get (argv[0] is the command) and runs the request. */
static int request_command(const struct command *cmd, int argc, char **argv)
{
    int rc = CLI_EXIT_USAGE;
    struct request_args r = {.cmd = cmd, .token = getenv("IDEM_TOKEN")};
    struct cli_config *cfg = &r.cfg;
    const char *body_help = cmd->bodied ? help_body : NULL;
    const char *key_help = cmd->keyed ? help_key : NULL;
    const char *intent_help = cmd->keyed ? help_intent : NULL;
    const char *journal_help = cmd->keyed ? help_journal : NULL;
    const struct option_row rows[] = {
        OPT_CALLBACK('d', "data", NULL, "DATA", body_help, data_option),
        OPT_CALLBACK('H', "header", NULL, "'K: V'", "add a request header (repeatable)",
                     header_option),
        OPT_STRING(0, "token", &r.token, "T",
                   "send 'Authorization: Bearer T' (default: $IDEM_TOKEN)"),
        OPT_CALLBACK(0, "key", NULL, "K", key_help, key_option),
        OPT_CALLBACK(0, "intent", NULL, "NAME", intent_help, key_option),
        OPT_CALLBACK(0, "journal", NULL, "PATH", journal_help, key_option),
        OPT_INT(0, "max-attempts", &cfg->max_attempts, "N", 1, 1000,
                "attempts in all, 1..1000 (default 5)"),
        OPT_CALLBACK(0, "max-time", &cfg->max_time_ms, "S",
                     "seconds for all attempts and pauses (default 60)", seconds_option),
        OPT_CALLBACK(0, "attempt-timeout", &cfg->attempt_timeout_ms, "S",
                     "seconds for one attempt (default 30)", seconds_option),
        OPT_FLAG('i', "include", &cfg->include,
                 "print the status line and headers before the body"),
        OPT_FLAG('v', "verbose", &cfg->verbose,
                 "print each attempt on stderr: number, status, pause, reason"),
        OPT_HELP("show this help"),
        OPT_TEXT(usage_request_end),
        OPT_END(),
    };
    char prog[32], usage[512];
    struct options o = {.prog = prog, .usage = usage, .rows = rows, .column = 27, .ctx = &r};

    snprintf(prog, sizeof prog, "idem %s", cmd->name);
    snprintf(usage, sizeof usage, usage_request, cmd->name, cmd->what);
    cfg->method = cmd->method;
    cfg->headers = xcalloc((size_t)argc + 1, sizeof *cfg->headers);
    rc = options_parse(&o, argc, argv);
    if (rc >= 0)
        goto out;
    rc = CLI_EXIT_USAGE;
    if (o.next >= argc) {
        rc = options_error(&o, "the %s needs a URL", cmd->method);
        goto out;
    }
    if (o.next + 1 < argc) {
        rc = options_error(&o, "unexpected argument \"%s\"", argv[o.next + 1]);
        goto out;
    }
    cfg->url = argv[o.next];
    if (cfg->key && cfg->intent) {
        rc = options_error(&o, "%s",
                           "--key and --intent exclude each other: an intent's key comes from "
                           "the journal");
        goto out;
    }
    if (has_header(cfg, "Idempotency-Key")) {
        rc = options_error(&o, "%s", "set the key with --key or --intent, not with -H");
        goto out;
    }
    if (r.token && r.token[0]) {
        if (strchr(r.token, '\n') || strchr(r.token, '\r')) {
            rc = options_error(&o, "%s", "the token holds a line break");
            goto out;
        }
        if (has_header(cfg, "Authorization")) {
            rc = options_error(&o, "%s",
                               "--token (or $IDEM_TOKEN) and -H 'Authorization: ...' both given");
            goto out;
        }
        cfg->auth_header = concat("Authorization: Bearer ", r.token);
        cfg->headers[cfg->nheaders++] = cfg->auth_header;
    }
    if (cfg->intent) {
        cfg->journal_path = journal_path(r.jpath);
        if (!cfg->journal_path) {
            rc = options_error(&o, "%s", "no journal path: set --journal, $IDEM_JOURNAL or $HOME");
            goto out;
        }
    }
    rc = cli_run(cfg);
out:
    config_release(cfg);
    return rc;
}

static int older_than_option(struct options *o, const struct option_row *row, const char *arg)
{
    const int *compact = o->ctx;

    if (!*compact || parse_int64(arg, 1, 36500, row->value) != 0)
        return options_error(o, "%s", "--older-than-days takes 1..36500 days, with 'compact'");
    return OPTIONS_CONTINUE;
}

static int journal_command(int argc, char **argv)
{
    const char *jpath = NULL;
    int64_t days = 7;
    int compact = 0;
    const struct option_row rows[] = {
        OPT_STRING(0, "journal", &jpath, "PATH",
                   "the journal (default $IDEM_JOURNAL, else\n"
                   "${XDG_STATE_HOME:-~/.local/state}/idem/journal)"),
        OPT_CALLBACK(0, "older-than-days", &days, "N",
                     "compact: what 'old' means, 1..36500 (default 7)", older_than_option),
        OPT_HELP("show this help"),
        OPT_END(),
    };
    struct options o = {.prog = "idem journal",
                        .usage = usage_journal,
                        .rows = rows,
                        .column = 25,
                        .ctx = &compact};
    char *path = NULL;
    int rc;

    if (argc > 1 && strcmp(argv[1], "compact") == 0) {
        compact = 1;
        argc--;
        argv++;
    }
    rc = options_parse(&o, argc, argv);
    if (rc >= 0)
        return rc;
    if (o.next < argc)
        return options_error(&o, "unexpected argument \"%s\"", argv[o.next]);
    path = journal_path(jpath);
    if (!path)
        return options_error(&o, "%s", "no journal path: set --journal, $IDEM_JOURNAL or $HOME");
    rc = compact ? cli_journal_compact(path, days * 24 * 3600 * 1000) : cli_journal_list(path);
    free(path);
    return rc;
}

int main(int argc, char **argv)
{
    static char help_flag[] = "--help";
    const struct options top = {.prog = "idem"}; /* for the messages of no command */
    const struct command *cmd;
    const char *name;

    if (argc < 2) {
        fputs(usage_main, stderr);
        return CLI_EXIT_USAGE;
    }
    name = argv[1];
    if (strcmp(name, "help") == 0 && argc > 2) {
        /* `idem help post` is `idem post --help`. */
        char *help[] = {argv[2], help_flag, NULL};
        if (strcmp(argv[2], "journal") == 0)
            return journal_command(2, help);
        cmd = find_command(argv[2]);
        if (!cmd)
            return options_error(&top, "unknown command \"%s\"", argv[2]);
        return request_command(cmd, 2, help);
    }
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0 || strcmp(name, "help") == 0) {
        fputs(usage_main, stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("idem %s (libidem-client)\n", IDEM_CLIENT_VERSION_STRING);
        return CLI_EXIT_OK;
    }
    if (strcmp(name, "journal") == 0)
        return journal_command(argc - 1, argv + 1);
    cmd = find_command(name);
    if (!cmd)
        return options_error(&top, "unknown command \"%s\"", name);
    return request_command(cmd, argc - 1, argv + 1);
}
