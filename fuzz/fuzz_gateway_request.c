/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_gateway_request.c - libFuzzer harness for what idem-gateway reads of a client's request
 * before it claims a record: the route of a path (src/gateway/route.c), the key from JSON pointers
 * into the body, and the fingerprint (src/gateway/request_key.c).  The input is split at its first
 * NUL: the path, then the body; its first byte picks the Content-Type (JSON or not).
 *
 * Besides memory errors and leaks it checks: path values are non-empty; a path written as a lenient
 * router reads it alike (a trailing '/', a "." segment, upper case) finds the same route; a key
 * from the body is 1..255 printable ASCII characters; the fingerprint of the same request is the
 * same twice, and the key route's fingerprint does not depend on the body at all.
 */
#include "request_key.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "route.h"
#include "fuzz.h"

const char program_name[] = "fuzz_gateway_request";

static const char config_text[] = "upstream: {url: 'http://127.0.0.1:9000'}\n"
                                  "principal: {header: X-Consumer-Id}\n"
                                  "routes:\n"
                                  "  - match: POST /v1/orders/{id}/items/{item}\n"
                                  "    operation: items.create\n"
                                  "    key: {body: [/requestId, /meta/~1key, /list/0]}\n"
                                  "  - match: POST /v1/pay\n"
                                  "    operation: pay.create\n"
                                  "    fingerprint: [/amount, /currency, /a~0b]\n"
                                  "  - match: POST /v1/nobody/{x}\n"
                                  "    operation: nobody.create\n"
                                  "    fingerprint: none\n"
                                  "  - match: POST /v1/all\n"
                                  "    operation: all.create\n";

static struct gw_config *cfg;

/*
 * What a lenient upstream router reads as the same path must find the same route: with a '/'
 * after it, with "/." before it, in upper case (the routes here ignore case).
 */
static void same_route_when_written_otherwise(const char *path, size_t len,
                                              const struct gw_route *r)
{
    struct route_match m;
    char *other = malloc(len + 3);
    size_t i;

    CHECK(other != NULL, "malloc");
    if (strcspn(path, "?#") == len) {
        memcpy(other, path, len);
        memcpy(other + len, "/", 2);
        CHECK(route_find(cfg, "POST", other, &m) == 1 && m.route == r, "a trailing '/' is ignored");
        route_match_clear(&m);
    }
    memcpy(other, "/.", 2);
    memcpy(other + 2, path, len + 1);
    CHECK(route_find(cfg, "POST", other, &m) == 1 && m.route == r, "a \".\" segment is ignored");
    route_match_clear(&m);
    for (i = 0; i < len; i++)
        other[i] = path[i] >= 'a' && path[i] <= 'z' ? (char)(path[i] - 'a' + 'A') : path[i];
    other[len] = '\0';
    CHECK(route_find(cfg, "POST", other, &m) == 1 && m.route == r, "case is ignored");
    route_match_clear(&m);
    free(other);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *nul;
    char *path, *body;
    size_t plen, blen;
    const char *ct;
    struct route_match m;
    char err[300];

    if (!cfg && gw_config_parse("fuzz.yaml", config_text, sizeof config_text - 1, &cfg, err,
                                sizeof err) != 0) {
        fprintf(stderr, "fuzz_gateway_request: %s\n", err);
        abort();
    }
    if (size < 1)
        return 0;
    ct = data[0] & 1 ? "application/json" : "text/plain";
    data++;
    size--;
    nul = memchr(data, '\0', size);
    plen = nul ? (size_t)(nul - (const char *)data) : size;
    blen = nul ? size - plen - 1 : 0;
    path = malloc(plen + 2);
    body = malloc(blen + 1);
    CHECK(path && body, "malloc");
    path[0] = '/';
    memcpy(path + 1, data, plen);
    path[plen + 1] = '\0';
    if (blen)
        memcpy(body, (const char *)data + plen + 1, blen);
    body[blen] = '\0';

    /* Every route is tried with this path; and the body goes to every route through its own. */
    if (route_find(cfg, "POST", path, &m)) {
        const struct gw_route *found = m.route;
        for (size_t i = 0; i < m.nparams; i++)
            CHECK(m.params[i][0] != '\0', "a path value is not empty");
        route_match_clear(&m);
        same_route_when_written_otherwise(path, plen + 1, found);
    }
    for (size_t r = 0; r < cfg->nroutes; r++) {
        const char *paths[] = {"/v1/orders/7/items/a", "/v1/pay", "/v1/nobody/z", "/v1/all"};
        unsigned char fp1[IDEM_FP_LEN], fp2[IDEM_FP_LEN];
        char key[IDEM_KEY_MAX + 1];
        const char *why = NULL;
        int got;

        CHECK(route_find(cfg, "POST", paths[r], &m) == 1 && m.route == &cfg->routes[r],
              "the fixed paths find their routes");
        if (m.route->key_source == GW_KEY_BODY) {
            got = request_key_from_body(m.route, body, blen, key, &why);
            CHECK(got >= -1 && got <= 1, "a key, none, or a refusal");
            if (got == -1)
                CHECK(why != NULL, "a refusal says why");
            if (got == 1) {
                size_t n = strlen(key);
                CHECK(n >= 1 && n <= IDEM_KEY_MAX, "a key of 1..255 characters");
                for (size_t k = 0; k < n; k++)
                    CHECK(key[k] >= 0x20 && key[k] <= 0x7e, "a key of printable ASCII");
            }
        }
        CHECK(request_fingerprint(&m, "POST", paths[r], ct, body, blen, fp1, &why) == 0,
              "a fingerprint");
        CHECK(request_fingerprint(&m, "POST", paths[r], ct, body, blen, fp2, &why) == 0 &&
                  memcmp(fp1, fp2, IDEM_FP_LEN) == 0,
              "the same request, the same fingerprint");
        if (m.route->fp_body == GW_FP_BODY_NONE) {
            CHECK(request_fingerprint(&m, "POST", paths[r], ct, "", 0, fp2, &why) == 0 &&
                      memcmp(fp1, fp2, IDEM_FP_LEN) == 0,
                  "fingerprint: none ignores the body");
        }
        route_match_clear(&m);
    }
    free(path);
    free(body);
    return 0;
}
