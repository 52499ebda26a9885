/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - the idem-check command line: parses the options of a mode (conformance, chaos), runs
 * it (conformance.c, chaos.c) and turns its verdicts into a report and an exit code.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "idem/idem.h"

#include "chaos.h"
#include "check.h"
#include "options.h"
#include "banned.h"

const char program_name[] = "idem-check"; /* util.h: die() and the allocators' messages */

#define DEFAULT_BODY "{\"productId\":\"p-1024\",\"quantity\":1}"

static const char usage_conformance[] =
    "usage: idem-check conformance --url URL (--token T | --header 'N: V')\n"
    "                              (--token2 T2 | --header2 'N: V2') [options]\n"
    "       idem-check chaos --orderd-bin PATH --provider-bin PATH [options]\n"
    "       idem-check chaos --attach --orderd-url URL[,URL...] --token T [options]\n"
    "         (see: idem-check chaos --help)\n"
    "\n"
    "Checks, from the outside, that a write endpoint honours Idempotency-Key as\n"
    "docs/http-api.md says: missing and invalid keys (400), replay of the same request\n"
    "(same status, byte-identical body, Idempotent-Replayed: true), JSON key order and white\n"
    "space, another body under a used key (422), keys scoped per user, a concurrent storm\n"
    "of same-key requests (one execution), validation errors not stored, Retry-After on 409.\n"
    "Every run uses fresh random keys, so it can be repeated against the same server.\n"
    "\n"
    "options:\n";

static const char usage_conformance_end[] =
    "\n"
    "Each check prints PASS, FAIL, WARN (works, but not as http-api.md says, e.g. a replay\n"
    "without its marker) or SKIP (cannot be judged, e.g. no 409 was seen), with evidence.\n"
    "\n"
    "exit codes: 0 no check failed, 1 a check failed, 2 bad usage,\n"
    "            3 the API could not be reached\n";

static int version_option(struct options *o, const struct option_row *row, const char *arg)
{
    (void)o;
    (void)row;
    (void)arg;
    printf("idem-check %s\n", IDEM_VERSION_STRING);
    return CK_EXIT_OK;
}

/*
 * The header line that names a caller: "Authorization: Bearer T" for a token, or `header` as
 * given ("X-Consumer-Id: alice": a name of token characters, a colon, a value).  -1 when it is
 * not one such line.
 */
static int caller_line(const char *token, const char *header, char *out, size_t cap)
{
    const char *colon;
    size_t n;

    if (token) {
        snprintf(out, cap, "Authorization: Bearer %s", token);
        return strpbrk(token, "\r\n") ? -1 : 0;
    }
    colon = strchr(header, ':');
    n = colon ? (size_t)(colon - header) : 0;
    if (n == 0 ||
        strspn(header, "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != n ||
        strpbrk(colon, "\r\n") || colon[strspn(colon + 1, " \t") + 1] == '\0')
        return -1;
    snprintf(out, cap, "%s", header);
    return 0;
}

static int conformance(int argc, char **argv)
{
    struct ck_conformance_options opt = {.path = "/api/orders",
                                         .body = DEFAULT_BODY,
                                         .invalid_body = "{}",
                                         .timeout_ms = 10000,
                                         .storm = 50};
    const char *token = NULL, *token2 = NULL, *header = NULL, *header2 = NULL;
    long timeout_s = 10;
    int json = 0;
    const struct option_row rows[] = {
        OPT_STRING(0, "url", &opt.url, "URL",
                   "base URL of the API, e.g. http://127.0.0.1:8080 (required)"),
        OPT_STRING(0, "token", &token, "T", "bearer token of user 1 (Authorization: Bearer T)"),
        OPT_STRING(0, "token2", &token2, "T2", "bearer token of user 2, another scope"),
        OPT_STRING(0, "header", &header, "'N: V'",
                   "instead of --token: the header that names user 1, e.g. the\n"
                   "principal header of an idem-gateway ('X-Consumer-Id: alice')"),
        OPT_STRING(0, "header2", &header2, "'N: V2'",
                   "instead of --token2: the same header naming user 2"),
        OPT_STRING(0, "path", &opt.path, "PATH",
                   "the POST endpoint under test (default /api/orders)"),
        OPT_STRING(0, "body", &opt.body, "JSON", "a valid request body (default " DEFAULT_BODY ")"),
        OPT_STRING(0, "invalid-body", &opt.invalid_body, "JSON",
                   "a body the API refuses before executing (default {})"),
        OPT_STRING(0, "count-url", &opt.count_url, "URL",
                   "a GET (with user 1's token) whose JSON answer is, or has as its\n"
                   "first array (else number) member, a list or count of user 1's\n"
                   "effects; the storm then demands exactly one new effect"),
        OPT_INT(0, "storm", &opt.storm, "N", 2, 500,
                "parallel same-key requests in the storm (default 50, 2..500)"),
        OPT_LONG(0, "timeout", &timeout_s, "S", 1, 3600, "seconds per request (default 10)"),
        OPT_FLAG(0, "json", &json, "one JSON object with a \"checks\" array instead of the table"),
        OPT_HELP("this help"),
        OPT_CALLBACK(0, "version", NULL, NULL, "the version", version_option),
        OPT_TEXT(usage_conformance_end),
        OPT_END(),
    };
    struct options o = {
        .prog = "idem-check conformance", .usage = usage_conformance, .rows = rows, .column = 21};
    struct ck_report *rep = NULL;
    char why[512] = "";
    char *target = NULL;
    char who[1024], who2[1024];
    int rc;

    rc = options_parse(&o, argc, argv);
    if (rc >= 0)
        return rc;
    opt.timeout_ms = timeout_s * 1000;
    if (o.next < argc)
        return options_error(&o, "unexpected argument '%s'", argv[o.next]);
    if (!opt.url || !(token || header) || !(token2 || header2))
        return options_error(&o, "%s",
                             "--url, and --token or --header for each of two users "
                             "(--token2 or --header2), are required");
    if ((token && header) || (token2 && header2))
        return options_error(&o, "%s", "a user is named by --token or by --header, not both");
    if (caller_line(token, header, who, sizeof(who)) < 0)
        return options_error(&o, "--header wants 'Name: value', not '%s'", header);
    if (caller_line(token2, header2, who2, sizeof(who2)) < 0)
        return options_error(&o, "--header2 wants 'Name: value', not '%s'", header2);
    opt.who = who;
    opt.who2 = who2;
    if (strncmp(opt.url, "http://", 7) != 0 && strncmp(opt.url, "https://", 8) != 0)
        return options_error(&o, "--url must start with http:// or https://, not '%s'", opt.url);
    if (opt.count_url && strncmp(opt.count_url, "http://", 7) != 0 &&
        strncmp(opt.count_url, "https://", 8) != 0)
        return options_error(&o, "--count-url must start with http:// or https://, not '%s'",
                             opt.count_url);
    if (opt.path[0] != '/')
        return options_error(&o, "--path must start with '/', not '%s'", opt.path);
    if (strcmp(opt.who, opt.who2) == 0)
        return options_error(&o, "%s", "the two users must be two different callers");

    if (ck_http_global_init() < 0) {
        fputs("idem-check: cannot initialise libcurl\n", stderr);
        return CK_EXIT_FAIL;
    }
    rep = xmalloc(sizeof(*rep));
    memset(rep, 0, sizeof(*rep));
    rc = ck_conformance_run(&opt, rep, why, sizeof(why));
    if (rc == CK_EXIT_UNREACHABLE) {
        fprintf(stderr, "idem-check: the API cannot be reached: %s\n", why);
        goto out;
    }
    rc = ck_report_failed(rep) ? CK_EXIT_FAIL : CK_EXIT_OK;
    {
        size_t n = strlen(opt.url) + strlen(opt.path) + 8;
        target = xmalloc(n);
        snprintf(target, n, "POST %s%s", opt.url, opt.path);
    }
    if (json)
        ck_report_print_json(rep, target, rc);
    else
        ck_report_print_table(rep, target);
out:
    free(target);
    free(rep);
    ck_http_global_cleanup();
    return rc;
}

/* ---- chaos --------------------------------------------------------------------------- */

static const char usage_chaos[] =
    "usage: idem-check chaos --orderd-bin PATH --provider-bin PATH [options]\n"
    "       idem-check chaos --attach --orderd-url URL[,URL...] --token T\n"
    "                        [--provider-url URL] [options]\n"
    "\n"
    "Starts provider-sim and N orderd instances on one store on 127.0.0.1 (or, with\n"
    "--attach, uses running ones), a fault-injecting proxy in front of orderd, and drives\n"
    "business intents (POST /api/orders, one fresh Idempotency-Key each) through it with\n"
    "libidem-client, under dropped responses, connection resets, requests cut mid-body,\n"
    "duplicated sends, provider faults, duplicated webhooks and kill -9 of orderd; then\n"
    "audits that every intent made exactly one order, one charge and one confirmation\n"
    "email, and that every webhook event was accepted (docs/chaos.md).\n"
    "\n";

static const char usage_chaos_end[] =
    "\n"
    "exit codes: 0 clean, 1 something duplicated, lost or unsettled (or a webhook not\n"
    "            accepted, or orderd could not be restarted, or a failover or move\n"
    "            command failed), 2 bad usage,\n"
    "            3 the services could not be started (or reached, with --attach)\n";

/*
 * "http://HOST:PORT" with an optional "/" at the end; HOST an IPv4 address or "localhost" (the
 * proxy speaks plain TCP to it).  Fills the normalised URL, the address and the port; 0 or -1.
 */
static int parse_url(const char *s, size_t len, char *url, size_t cap, uint32_t *addr, int *port)
{
    char host[64], portbuf[8];
    const char *colon;
    struct in_addr in;
    long p;

    if (len < 8 || strncmp(s, "http://", 7) != 0)
        return -1;
    s += 7;
    len -= 7;
    if (len > 0 && s[len - 1] == '/')
        len--;
    colon = memchr(s, ':', len);
    if (!colon || (size_t)(colon - s) >= sizeof(host) || colon == s ||
        len - (size_t)(colon - s) - 1 >= sizeof(portbuf) || len - (size_t)(colon - s) - 1 == 0)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    memcpy(portbuf, colon + 1, len - (size_t)(colon - s) - 1);
    portbuf[len - (size_t)(colon - s) - 1] = '\0';
    if (ck_parse_long(portbuf, 1, 65535, &p) < 0)
        return -1;
    if (strcmp(host, "localhost") == 0)
        in.s_addr = htonl(0x7f000001u);
    else if (inet_pton(AF_INET, host, &in) != 1)
        return -1;
    *addr = in.s_addr;
    *port = (int)p;
    snprintf(url, cap, "http://%s:%d", host, *port);
    return 0;
}

/* The comma-separated --orderd-url list into cx->inst; 0 or a usage error. */
static int parse_orderd_urls(struct options *o, struct chaos *cx, const char *list)
{
    const char *p = list;
    cx->n_inst = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        struct ck_instance *in;
        if (cx->n_inst == CK_MAX_INSTANCES)
            return options_error(o, "--orderd-url takes at most 8 URLs, not '%s'", list);
        in = &cx->inst[cx->n_inst];
        if (parse_url(p, len, in->url, sizeof(in->url), &in->addr, &in->port) < 0)
            return options_error(
                o, "--orderd-url wants http://IPv4:PORT[,http://IPv4:PORT...], not '%s'", list);
        in->pid = -1;
        cx->n_inst++;
        p += len;
        if (*p == ',')
            p++;
    }
    return cx->n_inst > 0 ? 0 : options_error(o, "--orderd-url is empty");
}

static int balance_option(struct options *o, const struct option_row *row, const char *arg)
{
    int *balance = row->value;

    if (strcmp(arg, "rr") == 0)
        *balance = CK_BALANCE_RR;
    else if (strcmp(arg, "random") == 0)
        *balance = CK_BALANCE_RANDOM;
    else
        return options_error(o, "--balance is rr or random, not '%s'", arg);
    return OPTIONS_CONTINUE;
}

/* --failover-cmd, --move-cmd: a command for /bin/sh, not blank. */
static int command_option(struct options *o, const struct option_row *row, const char *arg)
{
    if (!arg[0] || strspn(arg, " \t") == strlen(arg))
        return options_error(o, "--%s wants a command, not '%s'", row->name, arg);
    *(const char **)row->value = arg;
    return OPTIONS_CONTINUE;
}

/* --token, repeated: one more user of the run. */
static int token_option(struct options *o, const struct option_row *row, const char *arg)
{
    struct chaos_opts *co = row->value;

    if (co->n_tokens == CK_USERS_MAX)
        return options_error(o, "at most %d tokens", CK_USERS_MAX);
    co->tokens[co->n_tokens++] = arg;
    return OPTIONS_CONTINUE;
}

/* A bearer token as a header carries it: not empty, no white space. */
static int token_ok(const char *t, size_t len)
{
    size_t i;

    if (len == 0 || len >= sizeof(((struct ck_user *)0)->token))
        return 0;
    for (i = 0; i < len; i++)
        if (t[i] == ' ' || t[i] == '\t' || t[i] == '\r' || t[i] == '\n')
            return 0;
    return 1;
}

/* One more user with token `t` (`len` bytes) and principal `p` (may be NULL) into cx->users; 0
 * or a usage error. */
static int add_user(struct options *o, struct chaos *cx, const char *t, size_t len, const char *p)
{
    int i;

    if (p && (!token_ok(p, strlen(p)) || strlen(p) >= sizeof(cx->users[0].principal)))
        return options_error(o, "'%s' is not a principal (orderd's user id)", p);
    if (!token_ok(t, len))
        return options_error(o, "%s", "a token must be one non-empty bearer token");
    if (cx->n_users == CK_USERS_MAX)
        return options_error(o, "at most %d tokens", CK_USERS_MAX);
    for (i = 0; i < cx->n_users; i++)
        if (strlen(cx->users[i].token) == len && memcmp(cx->users[i].token, t, len) == 0)
            return options_error(o, "token %d is given twice: each token is one user", i + 1);
    memcpy(cx->users[cx->n_users].token, t, len);
    cx->users[cx->n_users].token[len] = '\0';
    if (p)
        snprintf(cx->users[cx->n_users].principal, sizeof(cx->users[cx->n_users].principal), "%s",
                 p);
    cx->n_users++;
    return 0;
}

/*
 * The users of an attached run: every --token, then every line of --tokens FILE (blank lines and
 * lines starting with # left out).  0 or a usage error.
 */
static int attach_users(struct options *o, struct chaos *cx)
{
    const struct chaos_opts *co = &cx->o;
    char line[512], *principal;
    size_t tok_len;
    FILE *f = NULL;
    long i;
    int rc = 0;

    cx->users = xmalloc(CK_USERS_MAX * sizeof(*cx->users));
    memset(cx->users, 0, CK_USERS_MAX * sizeof(*cx->users));
    for (i = 0; i < co->n_tokens && rc == 0; i++)
        rc = add_user(o, cx, co->tokens[i], strlen(co->tokens[i]), NULL);
    if (rc != 0 || !co->tokens_file)
        goto out;
    f = fopen(co->tokens_file, "r");
    if (!f) {
        rc = options_error(o, "--tokens '%s' cannot be read: %s", co->tokens_file, strerror(errno));
        goto out;
    }
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        size_t len = strcspn(line, "\r\n");
        if (len == sizeof(line) - 1) {
            rc = options_error(o, "--tokens '%s': a line too long for a token", co->tokens_file);
            break;
        }
        line[len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        /* "TOKEN" or "TOKEN PRINCIPAL": the user's id, for --shard-directory. */
        tok_len = strcspn(line, " \t");
        principal = line + tok_len + strspn(line + tok_len, " \t");
        principal[strcspn(principal, " \t")] = '\0';
        rc = add_user(o, cx, line, tok_len, principal[0] ? principal : NULL);
    }
out:
    if (f)
        fclose(f);
    if (rc == 0 && cx->n_users == 0)
        rc = options_error(o, "%s", "--attach needs --token or --tokens FILE (no token given)");
    for (i = 0; rc == 0 && co->shard_directory && i < cx->n_users; i++)
        if (!cx->users[i].principal[0])
            rc = options_error(o,
                               "--shard-directory needs each user's principal: give the tokens in "
                               "--tokens FILE as lines 'TOKEN PRINCIPAL' (token %ld has none)",
                               i + 1);
    return rc;
}

/*
 * The options of chaos into cx->o, checked together.  Returns 0 to run, -1 after --help, or an
 * exit status.
 */
static int parse_chaos(int argc, char **argv, struct chaos *cx)
{
    struct chaos_opts *co = &cx->o;
    const struct option_row rows[] = {
        OPT_TEXT("what runs:\n"),
        OPT_STRING(0, "orderd-bin", &co->orderd_bin, "PATH",
                   "the orderd program (required unless --attach)"),
        OPT_STRING(0, "provider-bin", &co->provider_bin, "PATH",
                   "the provider-sim program (required unless --attach)"),
        OPT_STRING(0, "db", &co->db, "URI",
                   "orderd's store, sqlite:PATH, postgresql://... or a shard\n"
                   "set, shards:DIRECTORY_URI (default: sqlite in a new\n"
                   "temp dir)"),
        OPT_STRING(0, "catalogue", &co->catalogue, "URI",
                   "orderd's catalogue store, given to every orderd and to\n"
                   "orderd token create as --catalogue URI; only meaningful\n"
                   "with --db shards:..."),
        OPT_LONG(0, "instances", &co->instances, "N", 1, CK_MAX_INSTANCES,
                 "orderd processes on that one store, 1..8 (default 1)"),
        OPT_CALLBACK(0, "balance", &co->balance, "rr|random",
                     "how the proxy spreads connections over them (default rr)", balance_option),
        OPT_FLAG(0, "no-webhooks", &co->no_webhooks,
                 "provider-sim sends no webhooks (default: on, through a\n"
                 "second fault proxy to the instances)"),
        OPT_LONG(0, "webhook-dup", &co->webhook_dup, "N", 1, 10,
                 "deliver every webhook event N times, 1..10 (default 2)"),
        OPT_STRING(0, "haproxy-config", &co->haproxy_config, "FILE",
                   "start HAProxy with FILE (docs/ops/haproxy.cfg) between\n"
                   "the proxy and the instances: its retry-on re-sends what\n"
                   "failed on one instance to another (addresses in\n"
                   "IDEM_ORDERD_1..8, IDEM_LB_BIND, IDEM_LB_STATS)"),
        OPT_STRING(0, "haproxy-bin", &co->haproxy_bin, "PATH",
                   "the haproxy program (default: haproxy, in PATH or in\n"
                   "/usr/sbin)"),
        OPT_TEXT("attaching to running services (nothing is started or killed):\n"),
        OPT_FLAG(0, "attach", &co->attach, "use running services instead of starting them"),
        OPT_STRING(0, "orderd-url", &co->orderd_urls, "URL[,URL]",
                   "orderd instance(s) of one service, http://IPv4:PORT"),
        OPT_CALLBACK(0, "token", co, "T",
                     "bearer token of a user nothing else uses during the run;\n"
                     "repeat it for more users (at most 1000 in all)",
                     token_option),
        OPT_STRING(0, "tokens", &co->tokens_file, "FILE",
                   "more tokens, one a line (blank lines and # comments\n"
                   "left out), each optionally followed by its user's\n"
                   "principal (orderd's user id, for --shard-directory)"),
        OPT_STRING(0, "provider-url", &co->provider_url, "URL",
                   "provider-sim: its faults and ledger (optional; without\n"
                   "it no provider fault and no ledger audit)"),
        OPT_TEXT("load:\n"),
        OPT_LONG(0, "intents", &co->intents, "N", 1, 10000000, "business intents (default 300)"),
        OPT_LONG(0, "users", &co->users, "N", 1, CK_USERS_MAX,
                 "users to make (orderd token create), 1..1000 (default\n"
                 "1); the intents go to them in turn, and the audit\n"
                 "checks each user's orders"),
        OPT_LONG(0, "clients", &co->clients, "M", 1, 256, "concurrent client threads (default 8)"),
        OPT_LONG(0, "max-time", &co->max_time_s, "S", 1, 86400,
                 "stop starting intents after S seconds (default 60)"),
        OPT_LONG(0, "grace", &co->grace_s, "S", 1, 3600,
                 "after the drive, how long the audit waits for the\n"
                 "service to settle what is pending (default 30)"),
        OPT_TEXT("faults (rates are 0..1):\n"),
        OPT_DOUBLE(0, "drop-rate", &co->drop_rate, "R", 0.0, 1.0,
                   "share of proxied requests whose response is dropped"),
        OPT_DOUBLE(0, "reset-rate", &co->reset_rate, "R", 0.0, 1.0,
                   "share of proxied requests reset before forwarding"),
        OPT_DOUBLE(0, "cut-rate", &co->cut_rate, "R", 0.0, 1.0,
                   "share of proxied requests cut mid-body: headers and part\n"
                   "of the body forwarded, then both sides reset"),
        OPT_DOUBLE(0, "dup-rate", &co->dup_rate, "R", 0.0, 1.0,
                   "share of intents also sent by a second, concurrent sender"),
        OPT_DOUBLE(0, "provider-lost-rate", &co->lost_rate, "R", 0.0, 1.0,
                   "provider-sim: effect done, response lost"),
        OPT_DOUBLE(0, "provider-5xx-rate", &co->fail_rate, "R", 0.0, 1.0,
                   "provider-sim: 503 before anything runs"),
        OPT_LONG(0, "kill-every", &co->kill_every_s, "S", 1, 86400,
                 "kill -9 a random orderd every S seconds and restart it"),
        OPT_LONG(0, "failover-every", &co->failover_every_s, "S", 1, 86400,
                 "every S seconds of the drive, fail the database over\n"
                 "with --failover-cmd: switchover, kill, switchover, ..."),
        OPT_CALLBACK(0, "failover-cmd", &co->failover_cmd, "CMD",
                     "run as /bin/sh -c 'CMD \"$1\"' with $1 switchover or\n"
                     "kill; returns once the database takes writes again\n"
                     "(at most 180 s; its output in the work dir's\n"
                     "failover.log)",
                     command_option),
        OPT_LONG(0, "min-failovers", &co->min_failovers, "N", 1, 1000,
                 "with --failover-every: past --max-time the drive goes\n"
                 "on until N failovers ran (--intents still ends it)"),
        OPT_LONG(0, "move-every", &co->move_every_s, "S", 1, 86400,
                 "every S seconds of the drive, move a bucket of the\n"
                 "shard set with --move-cmd"),
        OPT_CALLBACK(0, "move-cmd", &co->move_cmd, "CMD",
                     "run as /bin/sh -c 'CMD \"$1\"' with $1 the move's number\n"
                     "(1, 2, ...); it picks the bucket and where to, and\n"
                     "returns once the move is over (at most 180 s; its\n"
                     "output in the work dir's move.log)",
                     command_option),
        OPT_LONG(0, "min-moves", &co->min_moves, "N", 1, 1000,
                 "with --move-every: past --max-time the drive goes on\n"
                 "until N moves ran (--intents still ends it)"),
        OPT_STRING(0, "shard-directory", &co->shard_directory, "URI",
                   "the shard set's directory (postgresql://...): its map is\n"
                   "read at the start, each user placed in the cluster of\n"
                   "its bucket, and the verdict gives per cluster the\n"
                   "intents, the attempts that failed and the longest time\n"
                   "without a 2xx; unreadable: exit 3"),
        OPT_TEXT("audit:\n"),
        OPT_LONG(0, "audit-page-size", &co->page_size, "N", 1, CK_PAGE_SIZE_MAX,
                 "references per page of provider-sim's ledger, 1..1000\n"
                 "(default 1000), and orders per page of orderd's list\n"
                 "(at most 100); small values are for tests"),
        OPT_TEXT("output:\n"),
        OPT_FLAG(0, "json", &co->json, "one JSON object instead of the table"),
        OPT_HELP("this help"),
        OPT_TEXT(usage_chaos_end),
        OPT_END(),
    };
    struct options opts = {
        .prog = "idem-check chaos", .usage = usage_chaos, .rows = rows, .column = 26};
    struct options *o = &opts;
    int status;

    /*
     * The defaults the help states.  0 (and -1 for the provider's rates) stands for "not given"
     * until the parse is done, for the checks below of what goes with --attach.
     */
    *co = (struct chaos_opts){.intents = 300,
                              .clients = 8,
                              .max_time_s = 60,
                              .grace_s = 30,
                              .page_size = CK_PAGE_SIZE_MAX,
                              .lost_rate = -1,
                              .fail_rate = -1};
    status = options_parse(o, argc, argv);
    if (status >= 0)
        return status == 0 ? -1 : status;
    co->instances_set = co->instances != 0;
    co->instances = co->instances_set ? co->instances : 1;
    co->webhook_dup_set = co->webhook_dup != 0;
    co->webhook_dup = co->webhook_dup_set ? co->webhook_dup : 2;
    co->lost_set = co->lost_rate >= 0;
    co->lost_rate = co->lost_set ? co->lost_rate : 0;
    co->fail_set = co->fail_rate >= 0;
    co->fail_rate = co->fail_set ? co->fail_rate : 0;
    if (o->next < argc)
        return options_error(o, "unexpected argument '%s'", argv[o->next]);
    if (co->drop_rate + co->reset_rate + co->cut_rate > 0.9)
        return options_error(o, "%s",
                             "--drop-rate, --reset-rate and --cut-rate together must stay at or "
                             "below 0.9");
    if (co->fail_rate + co->lost_rate > 0.9)
        return options_error(o, "%s", "the provider rates together must stay at or below 0.9");
    if (co->no_webhooks && co->webhook_dup_set)
        return options_error(o, "%s", "--webhook-dup and --no-webhooks contradict each other");
    /* A failover is the database's: the same with --attach as with services started here. */
    if (co->failover_every_s && !co->failover_cmd)
        return options_error(o, "%s",
                             "--failover-every needs --failover-cmd, the command that fails the "
                             "database over");
    if (co->failover_cmd && !co->failover_every_s)
        return options_error(o, "%s", "--failover-cmd needs --failover-every, how often to run it");
    if (co->min_failovers && !co->failover_every_s)
        return options_error(o, "%s", "--min-failovers needs --failover-every and --failover-cmd");
    if (co->shard_directory && strncmp(co->shard_directory, "postgresql://", 13) != 0 &&
        strncmp(co->shard_directory, "postgres://", 11) != 0)
        return options_error(o, "--shard-directory wants a postgresql:// URI, not '%s'",
                             co->shard_directory);
    /* A move is the shard set's, whoever started the services. */
    if (co->move_every_s && !co->move_cmd)
        return options_error(o, "%s",
                             "--move-every needs --move-cmd, the command that moves a bucket");
    if (co->move_cmd && !co->move_every_s)
        return options_error(o, "%s", "--move-cmd needs --move-every, how often to run it");
    if (co->min_moves && !co->move_every_s)
        return options_error(o, "%s", "--min-moves needs --move-every and --move-cmd");
    if (co->attach) {
        /* Nothing is started or killed: the flags that would do so are mistakes. */
        if (co->kill_every_s)
            return options_error(o, "%s",
                                 "--kill-every needs processes idem-check started; with --attach "
                                 "nothing is started or killed");
        if (co->instances_set)
            return options_error(o, "%s",
                                 "--instances starts orderd processes; with --attach, list the "
                                 "running instances in --orderd-url");
        if (co->orderd_bin || co->provider_bin || co->db || co->catalogue)
            return options_error(o, "%s",
                                 "--orderd-bin, --provider-bin, --db and --catalogue start "
                                 "services; with --attach nothing is started");
        if (co->no_webhooks)
            return options_error(o, "%s",
                                 "--no-webhooks configures a provider-sim idem-check starts; with "
                                 "--attach webhooks are as provider-sim was started");
        if (co->haproxy_config || co->haproxy_bin)
            return options_error(o, "%s",
                                 "--haproxy-config starts HAProxy on the orderd instances "
                                 "idem-check starts; with --attach nothing is started");
        if (co->users)
            return options_error(o, "%s",
                                 "--users makes users with orderd token create; with --attach "
                                 "give their tokens (--token, repeated, or --tokens FILE)");
        if (!co->orderd_urls)
            return options_error(o, "%s", "--attach needs --orderd-url and --token");
        if (!co->provider_url && (co->lost_set || co->fail_set || co->webhook_dup_set))
            return options_error(o, "%s", "provider faults and --webhook-dup need --provider-url");
        if (parse_orderd_urls(o, cx, co->orderd_urls) != 0)
            return CK_EXIT_USAGE;
        if (co->provider_url) {
            uint32_t a;
            int p;
            if (parse_url(co->provider_url, strlen(co->provider_url), cx->provider_url,
                          sizeof(cx->provider_url), &a, &p) < 0)
                return options_error(o, "--provider-url wants http://IPv4:PORT, not '%s'",
                                     co->provider_url);
        }
        return attach_users(o, cx);
    }
    if (co->orderd_urls || co->provider_url || co->n_tokens || co->tokens_file)
        return options_error(o, "%s",
                             "--orderd-url, --provider-url, --token and --tokens are for --attach");
    if (!co->orderd_bin || !co->provider_bin)
        return options_error(o, "%s", "--orderd-bin and --provider-bin are required (or --attach)");
    if (access(co->orderd_bin, X_OK) != 0)
        return options_error(o, "--orderd-bin '%s' is not an executable", co->orderd_bin);
    if (access(co->provider_bin, X_OK) != 0)
        return options_error(o, "--provider-bin '%s' is not an executable", co->provider_bin);
    if (co->db && strncmp(co->db, "sqlite:", 7) != 0 && strncmp(co->db, "postgres", 8) != 0 &&
        strncmp(co->db, "shards:", 7) != 0)
        return options_error(o, "--db wants sqlite:PATH, postgresql://... or shards:URI, not '%s'",
                             co->db);
    if (co->catalogue && !co->catalogue[0])
        return options_error(o, "%s", "--catalogue wants a store URI");
    /* The principals are orderd's user ids: on a set its users table is in the catalogue. */
    if (co->shard_directory && co->db && strncmp(co->db, "shards:", 7) == 0 && !co->catalogue)
        return options_error(o, "%s",
                             "--shard-directory with --db shards:... needs --catalogue, where "
                             "orderd keeps its users");
    if (co->haproxy_bin && !co->haproxy_config)
        return options_error(o, "%s", "--haproxy-bin needs --haproxy-config");
    if (co->haproxy_config) {
        char why[PATH_MAX + 200];
        if (access(co->haproxy_config, R_OK) != 0)
            return options_error(o, "--haproxy-config '%s' is not a readable file",
                                 co->haproxy_config);
        if (ck_haproxy_find_bin(cx, why, sizeof(why)) < 0)
            return options_error(o, "%s", why);
    }
    cx->n_inst = (int)co->instances;
    cx->n_users = co->users ? (int)co->users : 1;
    cx->users = xmalloc((size_t)cx->n_users * sizeof(*cx->users));
    memset(cx->users, 0, (size_t)cx->n_users * sizeof(*cx->users));
    return 0;
}

static int chaos(int argc, char **argv)
{
    struct chaos *cx = ck_chaos_new();
    int rc = parse_chaos(argc, argv, cx);

    if (rc != 0) {
        ck_chaos_free(cx);
        return rc < 0 ? CK_EXIT_OK : rc;
    }
    return ck_chaos_run(cx);
}

int main(int argc, char **argv)
{
    static char help_flag[] = "--help";
    const struct options top = {.prog = "idem-check"}; /* for the messages of no mode */

    if (argc < 2)
        return options_error(&top, "%s", "which mode? (conformance, chaos)");
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        char *help[] = {argv[0], help_flag, NULL}; /* conformance's help is idem-check's */
        return conformance(2, help);
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("idem-check %s\n", IDEM_VERSION_STRING);
        return CK_EXIT_OK;
    }
    if (strcmp(argv[1], "conformance") == 0)
        return conformance(argc - 1, argv + 1);
    if (strcmp(argv[1], "chaos") == 0)
        return chaos(argc - 1, argv + 1);
    return options_error(&top, "unknown mode '%s' (known: conformance, chaos)", argv[1]);
}
