/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_gateway_request.c - libFuzzer harness for what idem-gateway reads of a client's request
 * before it claims a record: the route of a path (src/gateway/route.c), the key from JSON pointers
 * into the body, the fingerprint (src/gateway/request_key.c), the scope and the headers Connection
 * may not name (src/gateway/request_scope.c), and method overrides (src/gateway/method_override.c).
 * The input is split at its first NUL: the target (path and query), then the body; its first byte
 * picks the Content-Type (JSON or not).  For the scope and the overrides, a body holding a blank
 * line is header fields ("Name: value" lines) and then the body proper.
 *
 * Besides memory errors and leaks it checks: path values are non-empty; a path written as a lenient
 * router reads it alike (a trailing '/', a "." segment, upper case) finds the same route; a key
 * from the body is 1..255 printable ASCII characters; the fingerprint of the same request is the
 * same twice, and the key route's fingerprint does not depend on the body at all; a scope is the
 * same with its header values padded with white space; a header said to be hidden is one a
 * Connection field names; an override refusal is one of its four statuses with its problem, the
 * same twice, and a request with no override source (no such header, no query, no body) is never
 * refused.
 */
#include "request_key.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ascii.h"
#include "config.h"
#include "method_override.h"
#include "request_scope.h"
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
                                  "    operation: all.create\n"
                                  "  - match: POST /v1/scoped\n"
                                  "    operation: scoped.create\n"
                                  "    key: {header: Request-Key}\n"
                                  "    scope_headers: [Stripe-Account, X-Tenant]\n"
                                  "    fingerprint_query: false\n";

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

#define MAX_FIELDS 24

/*
 * A request from `target` and `text`: header fields ("Name: value" lines) up to a blank line,
 * then the body; without a blank line, all of `text` is the body.  Points into `text`, which it
 * cuts with NULs.
 */
static void fake_request(struct request *rq, struct request_field *fields, const char *target,
                         char *text, size_t len)
{
    char *blank = NULL, *line = text;
    size_t n = 0;

    memset(rq, 0, sizeof *rq);
    for (size_t i = 0; i + 1 < len && !blank; i++)
        if (text[i] == '\n' && text[i + 1] == '\n')
            blank = text + i;
    rq->method = "POST";
    rq->target = target;
    rq->fields = fields;
    if (!blank) {
        rq->body = len ? text : NULL;
        rq->body_len = len;
        return;
    }
    *blank = '\0';
    while (line && n < MAX_FIELDS) {
        char *nl = strchr(line, '\n'), *colon;
        if (nl)
            *nl = '\0';
        colon = strchr(line, ':');
        if (colon && colon != line) {
            *colon = '\0';
            fields[n].name = line;
            fields[n].value = colon + 1;
            fields[n].value_len = strlen(colon + 1);
            n++;
        }
        line = nl ? nl + 1 : NULL;
    }
    rq->nfields = n;
    rq->body_len = (size_t)(text + len - (blank + 2));
    rq->body = rq->body_len ? blank + 2 : NULL;
}

/* The scope and the Connection check of the scoped route, and the overrides, over `rq`. */
static void headers_and_overrides(struct request *rq)
{
    const struct gw_route *r = &cfg->routes[4];
    struct request_field padded[MAX_FIELDS];
    char first[IDEM_SCOPE_PART_MAX + 1] = "p", second[IDEM_SCOPE_PART_MAX + 1] = "p";
    char detail[300], values[MAX_FIELDS][64];
    const struct request_field *own = rq->fields;
    const char *hidden;
    struct response resp, again;
    int rc, rc2, sources = 0;

    rc = request_scope_principal(rq, r, first, detail, sizeof detail);
    CHECK(rc == 0 || rc == -1, "a scope or a refusal");
    if (rc == 0) {
        CHECK(strncmp(first, "p;Stripe-Account", 16) == 0, "the scope starts with the caller");
        /* Padded with white space, each value is the same value. */
        memcpy(padded, rq->fields, rq->nfields * sizeof padded[0]);
        for (size_t i = 0; i < rq->nfields; i++) {
            const char *v = rq->fields[i].value;
            size_t vlen = rq->fields[i].value_len;
            ascii_trim_ows(&v, &vlen);
            if (vlen + 4 > sizeof values[i])
                continue;
            memcpy(values[i], " \t", 2);
            memcpy(values[i] + 2, v, vlen);
            memcpy(values[i] + 2 + vlen, "\t ", 3);
            padded[i].value = values[i];
            padded[i].value_len = vlen + 4;
        }
        rq->fields = padded;
        CHECK(request_scope_principal(rq, r, second, detail, sizeof detail) == 0 &&
                  strcmp(first, second) == 0,
              "white space around a scope header's value is not part of it");
        rq->fields = own;
    }
    hidden = request_scope_hidden(rq, cfg, r);
    CHECK(hidden == NULL || request_connection_lists(rq, hidden), "a hidden header is listed");

    response_init(&resp);
    response_init(&again);
    rc = method_override_refuse(rq, cfg->method_override_headers, cfg->nmethod_override_headers,
                                4096, &resp);
    rc2 = method_override_refuse(rq, cfg->method_override_headers, cfg->nmethod_override_headers,
                                 4096, &again);
    CHECK(rc == rc2, "the same request, the same verdict");
    CHECK(rc == 0 || rc == 400 || rc == 413 || rc == 415, "a refusal's status");
    if (rc != 0)
        CHECK(resp.status == rc && resp.problem != NULL, "a refusal is a problem");
    sources =
        method_override_possible(rq, cfg->method_override_headers, cfg->nmethod_override_headers);
    if (!sources)
        CHECK(rc == 0, "nothing to read, nothing refused");
    for (size_t i = 0; i < rq->nfields && !sources; i++)
        CHECK(ascii_caseeq_any(rq->fields[i].name,
                               (const char *const *)cfg->method_override_headers,
                               cfg->nmethod_override_headers) == NULL,
              "an override header is something to read");
    CHECK(sources || (strchr(rq->target, '?') == NULL && rq->body_len == 0),
          "a query or a body is something to read");
    response_release(&resp);
    response_release(&again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct request rq;
    struct request_field fields[MAX_FIELDS];
    char *text;
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
        const char *paths[] = {"/v1/orders/7/items/a", "/v1/pay", "/v1/nobody/z", "/v1/all",
                               "/v1/scoped"};
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
    text = malloc(blen + 1);
    CHECK(text != NULL, "malloc");
    memcpy(text, body, blen + 1);
    fake_request(&rq, fields, path, text, blen);
    headers_and_overrides(&rq);
    free(text);
    free(path);
    free(body);
    return 0;
}
