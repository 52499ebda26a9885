/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_route.c - which route a request is on (src/gateway/route.c), read as lenient upstream
 * routers read a path: a trailing '/', any case, "//", dot segments (also encoded), ";params", a
 * ".json" suffix and a %2F each reach a keyed route as the upstream would run it, so none of them
 * slips past unkeyed; the exact reading wins where it fits (a value "a;b" or "report.json" stays
 * whole); a case-sensitive route ignores other cases; the method and the segment count still
 * decide.  And the templates the config refuses because a request could never be compared with
 * them as written.
 */
#include "route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t.h"

const char program_name[] = "gateway_test_route";

#define CONFIG                                                                                     \
    "upstream: {url: 'http://127.0.0.1:9000'}\n"                                                   \
    "principal: {header: X-Consumer-Id}\n"                                                         \
    "routes:\n"                                                                                    \
    "  - match: POST /v1/payments\n"                                                               \
    "    operation: payments.create\n"                                                             \
    "  - match: POST /v1/payments/{id}/refunds\n"                                                  \
    "    operation: refunds.create\n"                                                              \
    "  - match: POST /v1/files/{name}\n"                                                           \
    "    operation: files.create\n"                                                                \
    "  - match: PUT /v1/strict/{id}\n"                                                             \
    "    operation: strict.put\n"                                                                  \
    "    case_sensitive: true\n"                                                                   \
    "  - match: POST /v1/caf%C3%A9\n"                                                              \
    "    operation: cafe.create\n"                                                                 \
    "  - match: POST /\n"                                                                          \
    "    operation: root.create\n"

static struct gw_config *cfg;

/* The operation (method, target) is routed to, "-" for none; with its first path value if any. */
static void expect_route(const char *method, const char *target, const char *operation,
                         const char *value)
{
    struct route_match m;
    const char *got;

    route_find(cfg, method, target, &m);
    got = m.route ? m.route->operation : "-";
    if (strcmp(got, operation) != 0)
        fprintf(stderr, "%s %s: routed to %s, expected %s\n", method, target, got, operation);
    CHECK(strcmp(got, operation) == 0);
    if (value != NULL && m.route != NULL) {
        if (m.nparams < 1 || strcmp(m.params[0], value) != 0)
            fprintf(stderr, "%s %s: value \"%s\", expected \"%s\"\n", method, target,
                    m.nparams ? m.params[0] : "(none)", value);
        CHECK(m.nparams >= 1 && strcmp(m.params[0], value) == 0);
    }
    route_match_clear(&m);
}

static void test_what_lenient_routers_run_is_keyed(void)
{
    static const char *const payments[] = {
        "/v1/payments",          "/v1/payments/",
        "/V1/PAYMENTS",          "/v1/Payments/",
        "//v1//payments",        "/v1/./payments",
        "/v1/x/../payments",     "/v1/%2e/payments",
        "/v1/x/%2E%2e/payments", "/v1/payments;jsessionid=1",
        "/v1;v=2/payments",      "/v1/payments.json",
        "/v1/PAYMENTS.XML/",     "/v1/pay%6Dents",
        "/v1/payments?x=1",      "/v1%2Fpayments",
        "/v1%2fpayments/",       "/../v1/payments",
        "/v1/payments#frag",
    };

    for (size_t i = 0; i < sizeof payments / sizeof payments[0]; i++)
        expect_route("POST", payments[i], "payments.create", NULL);
    /* Path values: a %2F inside one is its own '/', as Express and Rails decode it. */
    expect_route("POST", "/v1/payments/abc%2Fdef/refunds", "refunds.create", "abc/def");
    expect_route("POST", "/v1/payments/py_1/refunds/", "refunds.create", "py_1");
    expect_route("POST", "/V1/payments/Py_1/REFUNDS", "refunds.create", "Py_1");
    expect_route("POST", "/v1/payments/py_1;x=1/refunds", "refunds.create", "py_1;x=1");
    expect_route("POST", "/v1/payments/py%201/refunds", "refunds.create", "py 1");
    expect_route("POST", "/v1/caf%c3%a9", "cafe.create", NULL);
    expect_route("POST", "/", "root.create", NULL);
    expect_route("POST", "//", "root.create", NULL);
    expect_route("POST", "/x/..", "root.create", NULL);
}

static void test_the_exact_reading_wins(void)
{
    /* A value that a lenient reading would cut stays whole where the path fits as it is. */
    expect_route("POST", "/v1/files/report.json", "files.create", "report.json");
    expect_route("POST", "/v1/files/a;b", "files.create", "a;b");
    /* A case-sensitive route: other cases are not it; the other normalisations still apply. */
    expect_route("PUT", "/v1/strict/A", "strict.put", "A");
    expect_route("PUT", "/v1/strict/A/", "strict.put", "A");
    expect_route("PUT", "/V1/Strict/A", "-", NULL);
}

static void test_what_no_route_takes(void)
{
    static const char *const none[] = {
        "/v1/paymentsx",         "/v1/payments/extra",
        "/v2/payments",          "/v1/payments.toolongsuffix",
        "/v1/payments/%2e%2e/x", "/v1/payments.js.on",
        "/v1/payments/refunds",  "/v1/payments//refunds",
    };

    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
        expect_route("POST", none[i], "-", NULL);
    expect_route("GET", "/v1/payments", "-", NULL);
    expect_route("post", "/v1/payments", "-", NULL);
}

/* The config refuses `text` (one route), its message holding `want`. */
static void expect_refused(const char *route, const char *want)
{
    char text[512], err[512];
    struct gw_config *c = NULL;

    snprintf(text, sizeof text,
             "upstream: {url: 'http://127.0.0.1:9000'}\nprincipal: {header: X-Consumer-Id}\n"
             "routes:\n%s",
             route);
    if (gw_config_parse("t.yaml", text, strlen(text), &c, err, sizeof err) == 0) {
        fprintf(stderr, "accepted: %s\n", route);
        gw_config_free(c);
        CHECK(0);
        return;
    }
    if (strstr(err, want) == NULL)
        fprintf(stderr, "for %s: %s\n(expected \"%s\")\n", route, err, want);
    CHECK(strstr(err, want) != NULL);
}

static void test_templates_compared_as_requests_are(void)
{
    expect_refused("  - match: POST /v1/payments/\n    operation: a\n", "empty, \".\" or \"..\"");
    expect_refused("  - match: POST /v1//payments\n    operation: a\n", "empty, \".\" or \"..\"");
    expect_refused("  - match: POST /v1/./payments\n    operation: a\n", "empty, \".\" or \"..\"");
    expect_refused("  - match: POST /v1/../payments\n    operation: a\n", "empty, \".\" or \"..\"");
    expect_refused("  - match: POST /v1/payments\n    operation: a\n"
                   "  - match: POST /V1/Payments\n    operation: b\n",
                   "same route as routes[0]");
    expect_refused("  - match: POST /v1/payments\n    operation: a\n    case_sensitive: maybe\n",
                   "case_sensitive");
}

int main(void)
{
    char err[512];

    if (gw_config_parse("t.yaml", CONFIG, strlen(CONFIG), &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        return 1;
    }
    test_what_lenient_routers_run_is_keyed();
    test_the_exact_reading_wins();
    test_what_no_route_takes();
    test_templates_compared_as_requests_are();
    gw_config_free(cfg);
    return t_done();
}
