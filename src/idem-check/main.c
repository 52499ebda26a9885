/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c - the idem-check command line: parses the options of a mode (conformance, chaos), runs
 * it (conformance.c, chaos.c) and turns its verdicts into a report and an exit code.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "idem/idem.h"

#include "chaos.h"
#include "check.h"
#include "banned.h"

const char program_name[] = "idem-check"; /* util.h: die() and the allocators' messages */

#define DEFAULT_BODY "{\"productId\":\"p-1024\",\"quantity\":1}"

static void usage(FILE *f)
{
    fputs(
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
        "options:\n"
        "  --url URL          base URL of the API, e.g. http://127.0.0.1:8080 (required)\n"
        "  --token T          bearer token of user 1 (Authorization: Bearer T)\n"
        "  --token2 T2        bearer token of user 2, another scope\n"
        "  --header 'N: V'    instead of --token: the header that names user 1, e.g. the\n"
        "                     principal header of an idem-gateway ('X-Consumer-Id: alice')\n"
        "  --header2 'N: V2'  instead of --token2: the same header naming user 2\n"
        "  --path PATH        the POST endpoint under test (default /api/orders)\n"
        "  --body JSON        a valid request body (default " DEFAULT_BODY ")\n"
        "  --invalid-body JSON  a body the API refuses before executing (default {})\n"
        "  --count-url URL    a GET (with user 1's token) whose JSON answer is, or has as its\n"
        "                     first array (else number) member, a list or count of user 1's\n"
        "                     effects; the storm then demands exactly one new effect\n"
        "  --storm N          parallel same-key requests in the storm (default 50, 2..500)\n"
        "  --timeout S        seconds per request (default 10)\n"
        "  --json             one JSON object with a \"checks\" array instead of the table\n"
        "  -h, --help         this help\n"
        "  --version          the version\n"
        "\n"
        "Each check prints PASS, FAIL, WARN (works, but not as http-api.md says, e.g. a replay\n"
        "without its marker) or SKIP (cannot be judged, e.g. no 409 was seen), with evidence.\n"
        "\n"
        "exit codes: 0 no check failed, 1 a check failed, 2 bad usage,\n"
        "            3 the API could not be reached\n",
        f);
}

/* Names what is wrong with the command line of `mode` (NULL: of idem-check) on stderr. */
static int usage_error(const char *mode, const char *fmt, const char *arg)
{
    const char *sep = mode ? " " : "";

    mode = mode ? mode : "";
    fprintf(stderr, "idem-check%s%s: ", sep, mode);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'idem-check%s%s --help'.\n", sep, mode);
    return CK_EXIT_USAGE;
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
    enum {
        O_URL = 256,
        O_TOKEN,
        O_TOKEN2,
        O_PATH,
        O_BODY,
        O_INVALID,
        O_COUNT,
        O_STORM,
        O_TIMEOUT,
        O_JSON,
        O_HEADER,
        O_HEADER2
    };
    static const struct option longopts[] = {
        {"url", required_argument, NULL, O_URL},
        {"token", required_argument, NULL, O_TOKEN},
        {"token2", required_argument, NULL, O_TOKEN2},
        {"path", required_argument, NULL, O_PATH},
        {"body", required_argument, NULL, O_BODY},
        {"invalid-body", required_argument, NULL, O_INVALID},
        {"count-url", required_argument, NULL, O_COUNT},
        {"storm", required_argument, NULL, O_STORM},
        {"timeout", required_argument, NULL, O_TIMEOUT},
        {"json", no_argument, NULL, O_JSON},
        {"header", required_argument, NULL, O_HEADER},
        {"header2", required_argument, NULL, O_HEADER2},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct ck_conformance_options opt = {.path = "/api/orders",
                                         .body = DEFAULT_BODY,
                                         .invalid_body = "{}",
                                         .timeout_ms = 10000,
                                         .storm = 50};
    struct ck_report *rep = NULL;
    char why[512] = "";
    char *target = NULL;
    const char *token = NULL, *token2 = NULL, *header = NULL, *header2 = NULL;
    char who[1024], who2[1024];
    int json = 0, c, rc;
    long v;

    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case O_URL:
            opt.url = optarg;
            break;
        case O_TOKEN:
            token = optarg;
            break;
        case O_TOKEN2:
            token2 = optarg;
            break;
        case O_HEADER:
            header = optarg;
            break;
        case O_HEADER2:
            header2 = optarg;
            break;
        case O_PATH:
            opt.path = optarg;
            break;
        case O_BODY:
            opt.body = optarg;
            break;
        case O_INVALID:
            opt.invalid_body = optarg;
            break;
        case O_COUNT:
            opt.count_url = optarg;
            break;
        case O_STORM:
            if (ck_parse_long(optarg, 2, 500, &v) < 0)
                return usage_error("conformance", "--storm wants a number from 2 to 500, not '%s'",
                                   optarg);
            opt.storm = (int)v;
            break;
        case O_TIMEOUT:
            if (ck_parse_long(optarg, 1, 3600, &v) < 0)
                return usage_error("conformance",
                                   "--timeout wants seconds from 1 to 3600, not '%s'", optarg);
            opt.timeout_ms = v * 1000;
            break;
        case O_JSON:
            json = 1;
            break;
        case 'h':
            usage(stdout);
            return CK_EXIT_OK;
        case ':':
            return usage_error("conformance", "%s needs a value", argv[optind - 1]);
        default:
            return usage_error("conformance", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("conformance", "unexpected argument '%s'", argv[optind]);
    if (!opt.url || !(token || header) || !(token2 || header2))
        return usage_error("conformance", "%s",
                           "--url, and --token or --header for each of two users "
                           "(--token2 or --header2), are required");
    if ((token && header) || (token2 && header2))
        return usage_error("conformance", "%s",
                           "a user is named by --token or by --header, not both");
    if (caller_line(token, header, who, sizeof(who)) < 0)
        return usage_error("conformance", "--header wants 'Name: value', not '%s'", header);
    if (caller_line(token2, header2, who2, sizeof(who2)) < 0)
        return usage_error("conformance", "--header2 wants 'Name: value', not '%s'", header2);
    opt.who = who;
    opt.who2 = who2;
    if (strncmp(opt.url, "http://", 7) != 0 && strncmp(opt.url, "https://", 8) != 0)
        return usage_error("conformance", "--url must start with http:// or https://, not '%s'",
                           opt.url);
    if (opt.count_url && strncmp(opt.count_url, "http://", 7) != 0 &&
        strncmp(opt.count_url, "https://", 8) != 0)
        return usage_error("conformance",
                           "--count-url must start with http:// or https://, not '%s'",
                           opt.count_url);
    if (opt.path[0] != '/')
        return usage_error("conformance", "--path must start with '/', not '%s'", opt.path);
    if (strcmp(opt.who, opt.who2) == 0)
        return usage_error("conformance", "%s", "the two users must be two different callers");

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

static void chaos_usage(FILE *f)
{
    fputs("usage: idem-check chaos --orderd-bin PATH --provider-bin PATH [options]\n"
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
          "\n"
          "what runs:\n"
          "  --orderd-bin PATH       the orderd program (required unless --attach)\n"
          "  --provider-bin PATH     the provider-sim program (required unless --attach)\n"
          "  --db URI                orderd's store, sqlite:PATH or postgresql://...\n"
          "                          (default: sqlite in a new temp dir)\n"
          "  --instances N           orderd processes on that one store, 1..8 (default 1)\n"
          "  --balance rr|random     how the proxy spreads connections over them (default rr)\n"
          "  --no-webhooks           provider-sim sends no webhooks (default: on, through a\n"
          "                          second fault proxy to the instances)\n"
          "  --webhook-dup N         deliver every webhook event N times, 1..10 (default 2)\n"
          "  --haproxy-config FILE   start HAProxy with FILE (docs/ops/haproxy.cfg) between\n"
          "                          the proxy and the instances: its retry-on re-sends what\n"
          "                          failed on one instance to another (addresses in\n"
          "                          IDEM_ORDERD_1..8, IDEM_LB_BIND, IDEM_LB_STATS)\n"
          "  --haproxy-bin PATH      the haproxy program (default: haproxy, in PATH or in\n"
          "                          /usr/sbin)\n"
          "attaching to running services (nothing is started or killed):\n"
          "  --attach                use running services instead of starting them\n"
          "  --orderd-url URL[,URL]  orderd instance(s) of one service, http://IPv4:PORT\n"
          "  --token T               bearer token of a user nothing else uses during the run\n"
          "  --provider-url URL      provider-sim: its faults and ledger (optional; without\n"
          "                          it no provider fault and no ledger audit)\n"
          "load:\n"
          "  --intents N             business intents (default 300)\n"
          "  --clients M             concurrent client threads (default 8)\n"
          "  --max-time S            stop starting intents after S seconds (default 60)\n"
          "  --grace S               after the drive, how long the audit waits for the\n"
          "                          service to settle what is pending (default 30)\n",
          f);
    /* Two strings: one would pass the 4095 characters C99 compilers must support. */
    fputs("faults (rates are 0..1):\n"
          "  --drop-rate R           share of proxied requests whose response is dropped\n"
          "  --reset-rate R          share of proxied requests reset before forwarding\n"
          "  --cut-rate R            share of proxied requests cut mid-body: headers and part\n"
          "                          of the body forwarded, then both sides reset\n"
          "  --dup-rate R            share of intents also sent by a second, concurrent sender\n"
          "  --provider-lost-rate R  provider-sim: effect done, response lost\n"
          "  --provider-5xx-rate R   provider-sim: 503 before anything runs\n"
          "  --kill-every S          kill -9 a random orderd every S seconds and restart it\n"
          "  --failover-every S      every S seconds of the drive, fail the database over\n"
          "                          with --failover-cmd: switchover, kill, switchover, ...\n"
          "  --failover-cmd CMD      run as /bin/sh -c 'CMD \"$1\"' with $1 switchover or\n"
          "                          kill; returns once the database takes writes again\n"
          "                          (at most 180 s; its output in the work dir's\n"
          "                          failover.log)\n"
          "audit:\n"
          "  --audit-page-size N     references per page of provider-sim's ledger, 1..1000\n"
          "                          (default 1000), and orders per page of orderd's list\n"
          "                          (at most 100); small values are for tests\n"
          "output:\n"
          "  --json                  one JSON object instead of the table\n"
          "  -h, --help              this help\n"
          "\n"
          "exit codes: 0 clean, 1 something duplicated, lost or unsettled (or a webhook not\n"
          "            accepted, or orderd could not be restarted, or a failover command\n"
          "            failed), 2 bad usage,\n"
          "            3 the services could not be started (or reached, with --attach)\n",
          f);
}

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
static int parse_orderd_urls(struct chaos *cx, const char *list)
{
    const char *p = list;
    cx->n_inst = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        struct ck_instance *in;
        if (cx->n_inst == CK_MAX_INSTANCES)
            return usage_error("chaos", "--orderd-url takes at most 8 URLs, not '%s'", list);
        in = &cx->inst[cx->n_inst];
        if (parse_url(p, len, in->url, sizeof(in->url), &in->addr, &in->port) < 0)
            return usage_error(
                "chaos", "--orderd-url wants http://IPv4:PORT[,http://IPv4:PORT...], not '%s'",
                list);
        in->pid = -1;
        cx->n_inst++;
        p += len;
        if (*p == ',')
            p++;
    }
    return cx->n_inst > 0 ? 0 : usage_error("chaos", "--orderd-url is empty%s", "");
}

static int parse_chaos(int argc, char **argv, struct chaos *cx)
{
    enum {
        O_ORD = 256,
        O_PROV,
        O_DB,
        O_INT,
        O_CLI,
        O_MAX,
        O_DROP,
        O_RESET,
        O_CUT,
        O_DUP,
        O_LOST,
        O_5XX,
        O_KILL,
        O_JSON,
        O_INST,
        O_BAL,
        O_NOHOOK,
        O_HOOKDUP,
        O_ATTACH,
        O_OURL,
        O_PURL,
        O_TOKEN,
        O_GRACE,
        O_PAGE,
        O_LBCFG,
        O_LBBIN,
        O_FOEVERY,
        O_FOCMD
    };
    static const struct option lo[] = {
        {"orderd-bin", required_argument, NULL, O_ORD},
        {"provider-bin", required_argument, NULL, O_PROV},
        {"db", required_argument, NULL, O_DB},
        {"instances", required_argument, NULL, O_INST},
        {"balance", required_argument, NULL, O_BAL},
        {"no-webhooks", no_argument, NULL, O_NOHOOK},
        {"webhook-dup", required_argument, NULL, O_HOOKDUP},
        {"haproxy-config", required_argument, NULL, O_LBCFG},
        {"haproxy-bin", required_argument, NULL, O_LBBIN},
        {"attach", no_argument, NULL, O_ATTACH},
        {"orderd-url", required_argument, NULL, O_OURL},
        {"provider-url", required_argument, NULL, O_PURL},
        {"token", required_argument, NULL, O_TOKEN},
        {"intents", required_argument, NULL, O_INT},
        {"clients", required_argument, NULL, O_CLI},
        {"max-time", required_argument, NULL, O_MAX},
        {"grace", required_argument, NULL, O_GRACE},
        {"drop-rate", required_argument, NULL, O_DROP},
        {"reset-rate", required_argument, NULL, O_RESET},
        {"cut-rate", required_argument, NULL, O_CUT},
        {"dup-rate", required_argument, NULL, O_DUP},
        {"provider-lost-rate", required_argument, NULL, O_LOST},
        {"provider-5xx-rate", required_argument, NULL, O_5XX},
        {"kill-every", required_argument, NULL, O_KILL},
        {"failover-every", required_argument, NULL, O_FOEVERY},
        {"failover-cmd", required_argument, NULL, O_FOCMD},
        {"audit-page-size", required_argument, NULL, O_PAGE},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct chaos_opts *o = &cx->o;
    int c, li = 0;

    /* The defaults chaos_usage() states. */
    *o = (struct chaos_opts){.intents = 300,
                             .clients = 8,
                             .max_time_s = 60,
                             .grace_s = 30,
                             .instances = 1,
                             .webhook_dup = 2,
                             .page_size = CK_PAGE_SIZE_MAX};
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", lo, &li)) != -1) {
        switch (c) {
        case O_ORD:
            o->orderd_bin = optarg;
            break;
        case O_PROV:
            o->provider_bin = optarg;
            break;
        case O_DB:
            o->db = optarg;
            break;
        case O_INST:
            if (ck_parse_long(optarg, 1, CK_MAX_INSTANCES, &o->instances) < 0)
                return usage_error("chaos", "--instances wants a number from 1 to 8, not '%s'",
                                   optarg);
            o->instances_set = 1;
            break;
        case O_BAL:
            if (strcmp(optarg, "rr") == 0)
                o->balance = CK_BALANCE_RR;
            else if (strcmp(optarg, "random") == 0)
                o->balance = CK_BALANCE_RANDOM;
            else
                return usage_error("chaos", "--balance is rr or random, not '%s'", optarg);
            break;
        case O_NOHOOK:
            o->no_webhooks = 1;
            break;
        case O_HOOKDUP:
            if (ck_parse_long(optarg, 1, 10, &o->webhook_dup) < 0)
                return usage_error("chaos", "--webhook-dup wants a number from 1 to 10, not '%s'",
                                   optarg);
            o->webhook_dup_set = 1;
            break;
        case O_ATTACH:
            o->attach = 1;
            break;
        case O_LBCFG:
            o->haproxy_config = optarg;
            break;
        case O_LBBIN:
            o->haproxy_bin = optarg;
            break;
        case O_OURL:
            o->orderd_urls = optarg;
            break;
        case O_PURL:
            o->provider_url = optarg;
            break;
        case O_TOKEN:
            o->token = optarg;
            break;
        case O_INT:
            if (ck_parse_long(optarg, 1, 10000000, &o->intents) < 0)
                return usage_error("chaos", "--intents wants a number from 1 to 10000000, not '%s'",
                                   optarg);
            break;
        case O_CLI:
            if (ck_parse_long(optarg, 1, 256, &o->clients) < 0)
                return usage_error("chaos", "--clients wants a number from 1 to 256, not '%s'",
                                   optarg);
            break;
        case O_MAX:
            if (ck_parse_long(optarg, 1, 86400, &o->max_time_s) < 0)
                return usage_error("chaos", "--max-time wants seconds from 1 to 86400, not '%s'",
                                   optarg);
            break;
        case O_GRACE:
            if (ck_parse_long(optarg, 1, 3600, &o->grace_s) < 0)
                return usage_error("chaos", "--grace wants seconds from 1 to 3600, not '%s'",
                                   optarg);
            break;
        case O_KILL:
            if (ck_parse_long(optarg, 1, 86400, &o->kill_every_s) < 0)
                return usage_error("chaos", "--kill-every wants seconds from 1 to 86400, not '%s'",
                                   optarg);
            break;
        case O_FOEVERY:
            if (ck_parse_long(optarg, 1, 86400, &o->failover_every_s) < 0)
                return usage_error(
                    "chaos", "--failover-every wants seconds from 1 to 86400, not '%s'", optarg);
            break;
        case O_FOCMD:
            if (!optarg[0] || strspn(optarg, " \t") == strlen(optarg))
                return usage_error("chaos", "--failover-cmd wants a command, not '%s'", optarg);
            o->failover_cmd = optarg;
            break;
        case O_PAGE:
            if (ck_parse_long(optarg, 1, CK_PAGE_SIZE_MAX, &o->page_size) < 0)
                return usage_error(
                    "chaos", "--audit-page-size wants a number from 1 to 1000, not '%s'", optarg);
            break;
        case O_DROP:
        case O_RESET:
        case O_CUT:
        case O_DUP:
        case O_LOST:
        case O_5XX: {
            double *d = c == O_DROP    ? &o->drop_rate
                        : c == O_RESET ? &o->reset_rate
                        : c == O_CUT   ? &o->cut_rate
                        : c == O_DUP   ? &o->dup_rate
                        : c == O_LOST  ? &o->lost_rate
                                       : &o->fail_rate;
            char msg[300];

            if (parse_double(optarg, 0.0, 1.0, d) < 0) {
                snprintf(msg, sizeof msg, "--%s must be a number from 0 to 1, not '%s'",
                         lo[li].name, optarg);
                return usage_error("chaos", "%s", msg);
            }
            o->lost_set |= c == O_LOST;
            o->fail_set |= c == O_5XX;
            break;
        }
        case O_JSON:
            o->json = 1;
            break;
        case 'h':
            chaos_usage(stdout);
            return -1;
        case ':':
            return usage_error("chaos", "%s needs a value", argv[optind - 1]);
        default:
            return usage_error("chaos", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("chaos", "unexpected argument '%s'", argv[optind]);
    if (o->drop_rate + o->reset_rate + o->cut_rate > 0.9)
        return usage_error("chaos", "%s",
                           "--drop-rate, --reset-rate and --cut-rate together must stay at or "
                           "below 0.9");
    if (o->fail_rate + o->lost_rate > 0.9)
        return usage_error("chaos", "%s", "the provider rates together must stay at or below 0.9");
    if (o->no_webhooks && o->webhook_dup_set)
        return usage_error("chaos", "%s", "--webhook-dup and --no-webhooks contradict each other");
    /* A failover is the database's: the same with --attach as with services started here. */
    if (o->failover_every_s && !o->failover_cmd)
        return usage_error("chaos", "%s",
                           "--failover-every needs --failover-cmd, the command that fails the "
                           "database over");
    if (o->failover_cmd && !o->failover_every_s)
        return usage_error("chaos", "%s",
                           "--failover-cmd needs --failover-every, how often to run it");
    if (o->attach) {
        /* Nothing is started or killed: the flags that would do so are mistakes. */
        if (o->kill_every_s)
            return usage_error("chaos", "%s",
                               "--kill-every needs processes idem-check started; with --attach "
                               "nothing is started or killed");
        if (o->instances_set)
            return usage_error("chaos", "%s",
                               "--instances starts orderd processes; with --attach, list the "
                               "running instances in --orderd-url");
        if (o->orderd_bin || o->provider_bin || o->db)
            return usage_error("chaos", "%s",
                               "--orderd-bin, --provider-bin and --db start services; with "
                               "--attach nothing is started");
        if (o->no_webhooks)
            return usage_error("chaos", "%s",
                               "--no-webhooks configures a provider-sim idem-check starts; with "
                               "--attach webhooks are as provider-sim was started");
        if (o->haproxy_config || o->haproxy_bin)
            return usage_error("chaos", "%s",
                               "--haproxy-config starts HAProxy on the orderd instances "
                               "idem-check starts; with --attach nothing is started");
        if (!o->orderd_urls || !o->token)
            return usage_error("chaos", "%s", "--attach needs --orderd-url and --token");
        if (!o->token[0] || strpbrk(o->token, " \r\n"))
            return usage_error("chaos", "%s", "--token must be one non-empty bearer token");
        if (!o->provider_url && (o->lost_set || o->fail_set || o->webhook_dup_set))
            return usage_error("chaos", "%s",
                               "provider faults and --webhook-dup need --provider-url");
        if (parse_orderd_urls(cx, o->orderd_urls) != 0)
            return CK_EXIT_USAGE;
        if (o->provider_url) {
            uint32_t a;
            int p;
            if (parse_url(o->provider_url, strlen(o->provider_url), cx->provider_url,
                          sizeof(cx->provider_url), &a, &p) < 0)
                return usage_error("chaos", "--provider-url wants http://IPv4:PORT, not '%s'",
                                   o->provider_url);
        }
        snprintf(cx->token, sizeof(cx->token), "%s", o->token);
        return 0;
    }
    if (o->orderd_urls || o->provider_url || o->token)
        return usage_error("chaos", "%s",
                           "--orderd-url, --provider-url and --token are for --attach");
    if (!o->orderd_bin || !o->provider_bin)
        return usage_error("chaos", "%s",
                           "--orderd-bin and --provider-bin are required (or --attach)");
    if (access(o->orderd_bin, X_OK) != 0)
        return usage_error("chaos", "--orderd-bin '%s' is not an executable", o->orderd_bin);
    if (access(o->provider_bin, X_OK) != 0)
        return usage_error("chaos", "--provider-bin '%s' is not an executable", o->provider_bin);
    if (o->db && strncmp(o->db, "sqlite:", 7) != 0 && strncmp(o->db, "postgres", 8) != 0)
        return usage_error("chaos", "--db wants sqlite:PATH or postgresql://..., not '%s'", o->db);
    if (o->haproxy_bin && !o->haproxy_config)
        return usage_error("chaos", "%s", "--haproxy-bin needs --haproxy-config");
    if (o->haproxy_config) {
        char why[PATH_MAX + 200];
        if (access(o->haproxy_config, R_OK) != 0)
            return usage_error("chaos", "--haproxy-config '%s' is not a readable file",
                               o->haproxy_config);
        if (ck_haproxy_find_bin(cx, why, sizeof(why)) < 0)
            return usage_error("chaos", "%s", why);
    }
    cx->n_inst = (int)o->instances;
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
    if (argc < 2)
        return usage_error(NULL, "%s", "which mode? (conformance, chaos)");
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return CK_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("idem-check %s\n", IDEM_VERSION_STRING);
        return CK_EXIT_OK;
    }
    if (strcmp(argv[1], "conformance") == 0)
        return conformance(argc - 1, argv + 1);
    if (strcmp(argv[1], "chaos") == 0)
        return chaos(argc - 1, argv + 1);
    return usage_error(NULL, "unknown mode '%s' (known: conformance, chaos)", argv[1]);
}
