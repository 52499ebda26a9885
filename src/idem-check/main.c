/*
 * main.c - the idem-check command line: parses the options of a mode, runs it and turns its
 * verdicts into a report and an exit code.  `conformance` is parsed here; `chaos` (chaos.c) parses
 * its own options.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int bad_usage(const char *fmt, const char *arg)
{
    fputs("idem-check: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n(try: idem-check conformance --help)\n", stderr);
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
                return bad_usage("--storm wants a number from 2 to 500, not '%s'", optarg);
            opt.storm = (int)v;
            break;
        case O_TIMEOUT:
            if (ck_parse_long(optarg, 1, 3600, &v) < 0)
                return bad_usage("--timeout wants seconds from 1 to 3600, not '%s'", optarg);
            opt.timeout_ms = v * 1000;
            break;
        case O_JSON:
            json = 1;
            break;
        case 'h':
            usage(stdout);
            return CK_EXIT_OK;
        case ':':
            return bad_usage("%s needs a value", argv[optind - 1]);
        default:
            return bad_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad_usage("unexpected argument '%s'", argv[optind]);
    if (!opt.url || !(token || header) || !(token2 || header2))
        return bad_usage("%s", "--url, and --token or --header for each of two users "
                               "(--token2 or --header2), are required");
    if ((token && header) || (token2 && header2))
        return bad_usage("%s", "a user is named by --token or by --header, not both");
    if (caller_line(token, header, who, sizeof(who)) < 0)
        return bad_usage("--header wants 'Name: value', not '%s'", header);
    if (caller_line(token2, header2, who2, sizeof(who2)) < 0)
        return bad_usage("--header2 wants 'Name: value', not '%s'", header2);
    opt.who = who;
    opt.who2 = who2;
    if (strncmp(opt.url, "http://", 7) != 0 && strncmp(opt.url, "https://", 8) != 0)
        return bad_usage("--url must start with http:// or https://, not '%s'", opt.url);
    if (opt.count_url && strncmp(opt.count_url, "http://", 7) != 0 &&
        strncmp(opt.count_url, "https://", 8) != 0)
        return bad_usage("--count-url must start with http:// or https://, not '%s'",
                         opt.count_url);
    if (opt.path[0] != '/')
        return bad_usage("--path must start with '/', not '%s'", opt.path);
    if (strcmp(opt.who, opt.who2) == 0)
        return bad_usage("%s", "the two users must be two different callers");

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

int main(int argc, char **argv)
{
    if (argc < 2)
        return bad_usage("%s", "which mode? (conformance, chaos)");
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
        return ck_chaos_main(argc - 1, argv + 1);
    return bad_usage("unknown mode '%s' (known: conformance, chaos)", argv[1]);
}
