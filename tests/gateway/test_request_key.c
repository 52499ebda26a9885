/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_request_key.c - a request's fingerprint and body key as idem-gateway derives them
 * (src/gateway/request_key.c): a retry that differs only in JSON key order or white space has the
 * same fingerprint; the method, a path parameter, the body and the route's body policy each change
 * it; a body that is not JSON is fingerprinted by its bytes.  The fingerprints the thread
 * remembers answer only the very same request: asked again, in any order, every request gets
 * what it got the first time, and a route whose policy changed in place (the same address) is
 * not answered from memory.  The key from JSON pointers in the body: found, absent, refused.
 */
#include "request_key.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "t.h"

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "gateway_test_request_key";

#define CONFIG                                                                                     \
    "upstream:\n"                                                                                  \
    "  url: http://127.0.0.1:9000\n"                                                               \
    "principal:\n"                                                                                 \
    "  header: X-Consumer-Id\n"                                                                    \
    "routes:\n"                                                                                    \
    "  - match: POST /v1/orders/{id}/refunds\n"                                                    \
    "    operation: refunds.create\n"                                                              \
    "  - match: POST /v1/payments\n"                                                               \
    "    operation: payments.create\n"                                                             \
    "    key:\n"                                                                                   \
    "      body: [/requestId, /meta/id]\n"                                                         \
    "    fingerprint: [/amount, /currency]\n"                                                      \
    "  - match: POST /v1/search\n"                                                                 \
    "    operation: search.create\n"                                                               \
    "    fingerprint_query: false\n"

#define JSON "application/json"

static struct gw_config *cfg;

/* The fingerprint of (method, path, content type, body) on the config's routes, as hex. */
static void fp_of(const char *method, const char *path, const char *ct, const char *body,
                  char hex[2 * IDEM_FP_LEN + 1])
{
    struct route_match m;
    unsigned char fp[IDEM_FP_LEN];
    const char *why = NULL;

    memset(&m, 0, sizeof m);
    hex[0] = '\0';
    if (route_find(cfg, method, path, &m) != 1) {
        fprintf(stderr, "no route for %s %s\n", method, path);
        CHECK(0);
        return;
    }
    CHECK_INT(request_fingerprint(&m, method, path, ct, body, strlen(body), fp, &why), 0);
    idem_fingerprint_hex(fp, hex);
    route_match_clear(&m);
}

static void test_fingerprints(void)
{
    static const char *const bodies[] = {
        "{\"amount\":100,\"reason\":\"dup\"}", "{ \"reason\": \"dup\", \"amount\": 1e2 }",
        "{\"amount\":101,\"reason\":\"dup\"}", "not json at all",
        "{\"amount\":100,\"reason\":\"dup\"",
    };
    char first[5][2 * IDEM_FP_LEN + 1], again[2 * IDEM_FP_LEN + 1];
    char other_id[2 * IDEM_FP_LEN + 1], as_text[2 * IDEM_FP_LEN + 1];
    int round, i;

    for (i = 0; i < 5; i++)
        fp_of("POST", "/v1/orders/o-1/refunds", JSON, bodies[i], first[i]);
    CHECK_STR(first[1], first[0]); /* key order, white space, 1e2: one RFC 8785 form */
    CHECK(strcmp(first[2], first[0]) != 0);
    CHECK(strcmp(first[3], first[0]) != 0);
    CHECK(strcmp(first[4], first[3]) != 0); /* broken JSON: by its bytes, still its own */

    /* From memory or not, in any order, each request gets what it got the first time. */
    for (round = 0; round < 3; round++) {
        for (i = 4; i >= 0; i--) {
            fp_of("POST", "/v1/orders/o-1/refunds", JSON, bodies[i], again);
            CHECK_STR(again, first[i]);
        }
    }
    fp_of("POST", "/v1/orders/o-2/refunds", JSON, bodies[0], other_id);
    CHECK(strcmp(other_id, first[0]) != 0);
    /* The same bytes declared as text are fingerprinted as bytes: not the JSON form. */
    fp_of("POST", "/v1/orders/o-1/refunds", "text/plain", bodies[0], as_text);
    CHECK(strcmp(as_text, first[0]) != 0);
    fp_of("POST", "/v1/orders/o-1/refunds", "text/plain", bodies[1], again);
    CHECK(strcmp(again, as_text) != 0);
}

/*
 * The query string counts, as sent: a retry with another `?amount=` is another request, the same
 * query is the same request (from memory or not), and a request without one (or with a bare '?')
 * keeps the fingerprint it had.  `fingerprint_query: false` leaves it out.
 */
static void test_query_counts(void)
{
    static const char *const cts[] = {JSON, "text/plain"};
    char none[2 * IDEM_FP_LEN + 1], bare[2 * IDEM_FP_LEN + 1], a1[2 * IDEM_FP_LEN + 1];
    char a2[2 * IDEM_FP_LEN + 1], again[2 * IDEM_FP_LEN + 1];

    for (size_t i = 0; i < 2; i++) {
        fp_of("POST", "/v1/orders/o-1/refunds", cts[i], "{\"n\":1}", none);
        fp_of("POST", "/v1/orders/o-1/refunds?", cts[i], "{\"n\":1}", bare);
        fp_of("POST", "/v1/orders/o-1/refunds?amount=1", cts[i], "{\"n\":1}", a1);
        fp_of("POST", "/v1/orders/o-1/refunds?amount=2", cts[i], "{\"n\":1}", a2);
        CHECK_STR(bare, none);
        CHECK(strcmp(a1, none) != 0);
        CHECK(strcmp(a2, a1) != 0);
        for (int round = 0; round < 2; round++) {
            fp_of("POST", "/v1/orders/o-1/refunds?amount=1", cts[i], "{\"n\":1}", again);
            CHECK_STR(again, a1);
            fp_of("POST", "/v1/orders/o-1/refunds", cts[i], "{\"n\":1}", again);
            CHECK_STR(again, none);
        }
    }
    fp_of("POST", "/v1/search?q=a", JSON, "{}", a1);
    fp_of("POST", "/v1/search?q=b", JSON, "{}", a2);
    fp_of("POST", "/v1/search", JSON, "{}", none);
    CHECK_STR(a1, none);
    CHECK_STR(a2, none);
}

static void test_pointer_policy(void)
{
    char a[2 * IDEM_FP_LEN + 1], b[2 * IDEM_FP_LEN + 1], c[2 * IDEM_FP_LEN + 1];

    /* Only /amount and /currency count: another requestId or note is the same request. */
    fp_of("POST", "/v1/payments", JSON, "{\"requestId\":\"r1\",\"amount\":5,\"currency\":\"EUR\"}",
          a);
    fp_of("POST", "/v1/payments", JSON,
          "{\"currency\":\"EUR\",\"amount\":5,\"requestId\":\"r2\",\"note\":\"x\"}", b);
    CHECK_STR(b, a);
    fp_of("POST", "/v1/payments", JSON, "{\"requestId\":\"r1\",\"amount\":6,\"currency\":\"EUR\"}",
          c);
    CHECK(strcmp(c, a) != 0);
}

/* A route whose policy changes in place (same address) must not be answered from memory. */
static void test_memory_follows_the_policy(void)
{
    struct gw_route *r = &cfg->routes[0];
    char whole[2 * IDEM_FP_LEN + 1], picked[2 * IDEM_FP_LEN + 1], picked2[2 * IDEM_FP_LEN + 1];
    char amount[] = "/amount";
    char *pointer[1] = {amount};
    char **saved = r->fp_pointers;
    size_t nsaved = r->nfp_pointers;
    enum gw_fp_body mode = r->fp_body;

    fp_of("POST", "/v1/orders/o-9/refunds", JSON, "{\"amount\":1,\"reason\":\"a\"}", whole);
    r->fp_body = GW_FP_BODY_POINTERS;
    r->fp_pointers = pointer;
    r->nfp_pointers = 1;
    fp_of("POST", "/v1/orders/o-9/refunds", JSON, "{\"amount\":1,\"reason\":\"a\"}", picked);
    fp_of("POST", "/v1/orders/o-9/refunds", JSON, "{\"amount\":1,\"reason\":\"b\"}", picked2);
    CHECK(strcmp(picked, whole) != 0);
    CHECK_STR(picked2, picked); /* the reason no longer counts */
    r->fp_body = mode;
    r->fp_pointers = saved;
    r->nfp_pointers = nsaved;
}

static void test_key_from_body(void)
{
    struct route_match m;
    char key[IDEM_KEY_MAX + 1];
    const char *why = NULL;
    static const char nested[] = "{\"meta\":{\"id\":\"k-2\"}}";
    static const char first[] = "{\"requestId\":\"k-1\",\"meta\":{\"id\":\"k-2\"}}";
    static const char none[] = "{\"amount\":5}";
    static const char number[] = "{\"requestId\":5}";
    static const char ctl[] = "{\"requestId\":\"a\\u0001b\"}";

    memset(&m, 0, sizeof m);
    CHECK_INT(route_find(cfg, "POST", "/v1/payments", &m), 1);
    CHECK_INT(request_key_from_body(m.route, first, strlen(first), key, &why), 1);
    CHECK_STR(key, "k-1");
    CHECK_INT(request_key_from_body(m.route, nested, strlen(nested), key, &why), 1);
    CHECK_STR(key, "k-2");
    CHECK_INT(request_key_from_body(m.route, none, strlen(none), key, &why), 0);
    CHECK_INT(request_key_from_body(m.route, number, strlen(number), key, &why), -1);
    CHECK(why != NULL && strstr(why, "not a string") != NULL);
    CHECK_INT(request_key_from_body(m.route, ctl, strlen(ctl), key, &why), -1);
    CHECK(why != NULL && strstr(why, "printable ASCII") != NULL);
    CHECK_INT(request_key_from_body(m.route, "{", 1, key, &why), -1);
    CHECK(why != NULL && strstr(why, "not JSON") != NULL);
    route_match_clear(&m);
}

int main(void)
{
    char err[512];

    if (gw_config_parse("t.yaml", CONFIG, strlen(CONFIG), &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "config: %s\n", err);
        return 1;
    }
    test_fingerprints();
    test_query_counts();
    test_pointer_policy();
    test_memory_follows_the_policy();
    test_key_from_body();
    gw_config_free(cfg);
    return t_done();
}
