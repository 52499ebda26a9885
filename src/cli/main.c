/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - the idem command line: `post`, `put`, `get`, `delete`, `journal`, `--help`,
 * `--version`.  It reads like curl on purpose (-d, -H, -i, -v), so the one thing a user has to
 * learn is what it adds: a stable Idempotency-Key per intent and retries that are safe.  A wrong
 * flag or value is named on stderr and exits 2; every other exit code is the request's outcome
 * (cli.h).  Flags are parsed into a struct cli_config that run.c receives.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "idem/client.h"
#include "ascii.h"

#include "cli.h"
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

static const char usage_request[] =
    "Usage: idem %s URL [options]\n"
    "\n"
    "%s"
    "Prints the final answer's body on stdout.\n"
    "\n"
    "Options:\n"
    "%s"
    "  -H, --header 'K: V'      add a request header (repeatable)\n"
    "  --token T                send 'Authorization: Bearer T' (default: $IDEM_TOKEN)\n"
    "%s"
    "  --max-attempts N         attempts in all, 1..1000 (default 5)\n"
    "  --max-time S             seconds for all attempts and pauses (default 60)\n"
    "  --attempt-timeout S      seconds for one attempt (default 30)\n"
    "  -i, --include            print the status line and headers before the body\n"
    "  -v, --verbose            print each attempt on stderr: number, status, pause, reason\n"
    "  -h, --help               show this help\n"
    "\n"
    "Retried: connection errors, timeouts, 409 in progress, 429, 502, 503, 504, after a pause\n"
    "with exponential backoff and full jitter, or Retry-After if longer.  Not retried: every\n"
    "other answer (400, 401, 403, 404, 413, 415, 422, 500, ...).\n"
    "Exit codes: 0 2xx, 1 local failure, 2 bad usage, 3 final 4xx, 4 other final answer,\n"
    "5 retries exhausted, 6 transport failure, 7 journal error.\n";

static const char help_body[] =
    "  -d, --data DATA          request body, sent byte for byte; @FILE reads a file, @- stdin;\n"
    "                           Content-Type: application/json unless -H sets another\n";

static const char help_key[] =
    "  --key K                  the Idempotency-Key to send (default: a new UUIDv4)\n"
    "  --intent NAME            journal the key under NAME before sending; the same NAME\n"
    "                           again reuses that key, so a re-run is a retry (and an intent\n"
    "                           already answered is sent again: the server replays its answer)\n"
    "  --journal PATH           the journal (default $IDEM_JOURNAL, else\n"
    "                           ${XDG_STATE_HOME:-~/.local/state}/idem/journal)\n";

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
    "Options:\n"
    "  --journal PATH         the journal (default $IDEM_JOURNAL, else\n"
    "                         ${XDG_STATE_HOME:-~/.local/state}/idem/journal)\n"
    "  --older-than-days N    compact: what 'old' means, 1..36500 (default 7)\n"
    "  -h, --help             show this help\n";

enum {
    OPT_TOKEN = 256,
    OPT_OLDER_THAN_DAYS,
    OPT_KEY,
    OPT_INTENT,
    OPT_JOURNAL,
    OPT_MAX_ATTEMPTS,
    OPT_MAX_TIME,
    OPT_ATTEMPT_TIMEOUT,
};

static const struct option request_options[] = {
    {"data", required_argument, NULL, 'd'},
    {"header", required_argument, NULL, 'H'},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"key", required_argument, NULL, OPT_KEY},
    {"intent", required_argument, NULL, OPT_INTENT},
    {"journal", required_argument, NULL, OPT_JOURNAL},
    {"max-attempts", required_argument, NULL, OPT_MAX_ATTEMPTS},
    {"max-time", required_argument, NULL, OPT_MAX_TIME},
    {"attempt-timeout", required_argument, NULL, OPT_ATTEMPT_TIMEOUT},
    {"include", no_argument, NULL, 'i'},
    {"verbose", no_argument, NULL, 'v'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

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

static void print_request_usage(const struct command *cmd)
{
    printf(usage_request, cmd->name, cmd->what, cmd->bodied ? help_body : "",
           cmd->keyed ? help_key : "");
}

/* Names what is wrong on stderr, with the way to the help; returns the usage exit code. */
static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fputs("idem: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'idem %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
    return CLI_EXIT_USAGE;
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

static int parse_int(const char *s, long lo, long hi, int *out)
{
    int64_t v;

    if (parse_int64(s, lo, hi, &v) < 0)
        return -1;
    *out = (int)v;
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
    if (read_file_capped(arg + 1, BODY_MAX, &cfg->body, &cfg->body_len) < 0) {
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

/* Parses the options of post/put/delete/get (argv[0] is the command) and runs the request. */
static int request_command(const struct command *cmd, int argc, char **argv)
{
    int rc = CLI_EXIT_USAGE;
    struct cli_config cfg;
    const char *token = getenv("IDEM_TOKEN"), *jpath = NULL, *why = NULL;
    const char *name = cmd->name;
    int opt;

    memset(&cfg, 0, sizeof cfg);
    cfg.method = cmd->method;
    cfg.headers = xcalloc((size_t)argc + 1, sizeof *cfg.headers);
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":d:H:ivh", request_options, NULL)) != -1) {
        switch (opt) {
        case 'd':
            if (!cmd->bodied) {
                rc = usage_error(name, "%s sends no body (-d)", name);
                goto out;
            }
            if (cfg.body) {
                rc = usage_error(name, "%s", "-d given twice");
                goto out;
            }
            rc = load_body(optarg, &cfg);
            if (rc != 0)
                goto out;
            rc = CLI_EXIT_USAGE;
            break;
        case 'H':
            if (!strchr(optarg, ':') || optarg[0] == ':' || strchr(optarg, '\n') ||
                strchr(optarg, '\r')) {
                rc = usage_error(name, "bad header \"%s\": expected 'Name: value'", optarg);
                goto out;
            }
            cfg.headers[cfg.nheaders++] = optarg;
            break;
        case OPT_TOKEN:
            token = optarg;
            break;
        case OPT_KEY:
            if (!cmd->keyed) {
                rc = usage_error(name, "%s sends no Idempotency-Key (--key)", name);
                goto out;
            }
            if (idem_client_key_check(optarg, &why) < 0) {
                rc = usage_error(name, "bad --key: %s", why);
                goto out;
            }
            cfg.key = optarg;
            break;
        case OPT_INTENT:
            if (!cmd->keyed) {
                rc = usage_error(name, "%s sends no Idempotency-Key (--intent)", name);
                goto out;
            }
            if (optarg[0] == '\0' || strlen(optarg) > IDEM_CLIENT_INTENT_MAX) {
                rc = usage_error(name, "%s", "--intent must be 1 to 255 bytes");
                goto out;
            }
            cfg.intent = optarg;
            break;
        case OPT_JOURNAL:
            if (optarg[0] == '\0') {
                rc = usage_error(name, "%s", "--journal needs a path");
                goto out;
            }
            jpath = optarg;
            break;
        case OPT_MAX_ATTEMPTS:
            if (parse_int(optarg, 1, 1000, &cfg.max_attempts) < 0) {
                rc = usage_error(name, "--max-attempts must be 1..1000, not \"%s\"", optarg);
                goto out;
            }
            break;
        case OPT_MAX_TIME:
            if (parse_seconds(optarg, &cfg.max_time_ms) < 0) {
                rc = usage_error(name, "--max-time must be seconds in (0, 86400], not \"%s\"",
                                 optarg);
                goto out;
            }
            break;
        case OPT_ATTEMPT_TIMEOUT:
            if (parse_seconds(optarg, &cfg.attempt_timeout_ms) < 0) {
                rc = usage_error(
                    name, "--attempt-timeout must be seconds in (0, 86400], not \"%s\"", optarg);
                goto out;
            }
            break;
        case 'i':
            cfg.include = 1;
            break;
        case 'v':
            cfg.verbose = 1;
            break;
        case 'h':
            print_request_usage(cmd);
            rc = CLI_EXIT_OK;
            goto out;
        case ':':
            rc = usage_error(name, "option %s needs a value", argv[optind - 1]);
            goto out;
        default:
            rc = usage_error(name, "unknown option %s", argv[optind - 1]);
            goto out;
        }
    }
    if (optind >= argc) {
        rc = usage_error(name, "%s needs a URL", name);
        goto out;
    }
    if (optind + 1 < argc) {
        rc = usage_error(name, "unexpected argument \"%s\"", argv[optind + 1]);
        goto out;
    }
    cfg.url = argv[optind];
    if (cfg.key && cfg.intent) {
        rc = usage_error(name, "%s",
                         "--key and --intent exclude each other: an intent's key comes from "
                         "the journal");
        goto out;
    }
    if (has_header(&cfg, "Idempotency-Key")) {
        rc = usage_error(name, "%s", "set the key with --key or --intent, not with -H");
        goto out;
    }
    if (token && token[0]) {
        if (strchr(token, '\n') || strchr(token, '\r')) {
            rc = usage_error(name, "%s", "the token holds a line break");
            goto out;
        }
        if (has_header(&cfg, "Authorization")) {
            rc = usage_error(name, "%s",
                             "--token (or $IDEM_TOKEN) and -H 'Authorization: ...' both given");
            goto out;
        }
        cfg.auth_header = concat("Authorization: Bearer ", token);
        cfg.headers[cfg.nheaders++] = cfg.auth_header;
    }
    if (cfg.intent) {
        cfg.journal_path = journal_path(jpath);
        if (!cfg.journal_path) {
            rc = usage_error(name, "%s", "no journal path: set --journal, $IDEM_JOURNAL or $HOME");
            goto out;
        }
    }
    rc = cli_run(&cfg);
out:
    config_release(&cfg);
    return rc;
}

static int journal_command(int argc, char **argv)
{
    static const struct option opts[] = {
        {"journal", required_argument, NULL, OPT_JOURNAL},
        {"older-than-days", required_argument, NULL, OPT_OLDER_THAN_DAYS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *jpath = NULL;
    char *path = NULL;
    int opt, rc;
    int compact = 0;
    int64_t days = 7;

    if (argc > 1 && strcmp(argv[1], "compact") == 0) {
        compact = 1;
        argc--;
        argv++;
    }
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (opt) {
        case OPT_JOURNAL:
            jpath = optarg;
            break;
        case OPT_OLDER_THAN_DAYS:
            if (!compact || parse_int64(optarg, 1, 36500, &days) != 0)
                return usage_error("journal", "%s",
                                   "--older-than-days takes 1..36500 days, with 'compact'");
            break;
        case 'h':
            fputs(usage_journal, stdout);
            return CLI_EXIT_OK;
        case ':':
            return usage_error("journal", "option %s needs a value", argv[optind - 1]);
        default:
            return usage_error("journal", "unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("journal", "unexpected argument \"%s\"", argv[optind]);
    path = journal_path(jpath);
    if (!path)
        return usage_error("journal", "%s",
                           "no journal path: set --journal, $IDEM_JOURNAL or $HOME");
    rc = compact ? cli_journal_compact(path, days * 24 * 3600 * 1000) : cli_journal_list(path);
    free(path);
    return rc;
}

int main(int argc, char **argv)
{
    const struct command *cmd;
    const char *name;

    if (argc < 2) {
        fputs(usage_main, stderr);
        return CLI_EXIT_USAGE;
    }
    name = argv[1];
    if (strcmp(name, "help") == 0 && argc > 2) {
        /* `idem help post` is `idem post --help`. */
        if (strcmp(argv[2], "journal") == 0) {
            fputs(usage_journal, stdout);
            return CLI_EXIT_OK;
        }
        cmd = find_command(argv[2]);
        if (!cmd)
            return usage_error(NULL, "unknown command \"%s\"", argv[2]);
        print_request_usage(cmd);
        return CLI_EXIT_OK;
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
        return usage_error(NULL, "unknown command \"%s\"", name);
    return request_command(cmd, argc - 1, argv + 1);
}
