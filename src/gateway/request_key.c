/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_key.c - a request's idempotency key from its body, and its fingerprint
 * (request_key.h).  libidem does the hashing (idem_fingerprint: every field length-prefixed) and
 * the canonical JSON; this file decides what goes in.
 */
#include "request_key.h"
#include "ascii.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"
#include "jdoc.h"
#include "banned.h"

json_t *json_pointer_get(json_t *doc, const char *ptr)
{
    const char *p = ptr;

    if (!doc || !ptr)
        return NULL;
    while (*p) {
        char token[256];
        size_t n = 0;
        if (*p != '/')
            return NULL;
        p++;
        /* One reference token, with ~1 for '/' and ~0 for '~' (RFC 6901, section 4). */
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~') {
                if (*p != '0' && *p != '1')
                    return NULL;
                c = *p++ == '0' ? '~' : '/';
            }
            if (n + 1 >= sizeof token)
                return NULL;
            token[n++] = c;
        }
        token[n] = '\0';
        if (json_is_object(doc)) {
            doc = json_object_getn(doc, token, n);
        } else if (json_is_array(doc)) {
            int64_t i;
            /* "0" or digits without a leading zero (RFC 6901); "-" names nothing that exists. */
            if (n == 0 || (n > 1 && token[0] == '0') || parse_int64(token, 0, 1000000000, &i) != 0)
                return NULL;
            doc = json_array_get(doc, (size_t)i);
        } else {
            return NULL;
        }
        if (!doc)
            return NULL;
    }
    return doc;
}

/*
 * The body as JSON, or NULL.  Deeper nesting than libidem accepts is refused before jansson
 * recurses into it (a hostile body must not spend the stack).
 */
static json_t *parse_body(const char *body, size_t len)
{
    return jdoc_load(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
}

int request_key_from_body(const struct gw_route *route, const char *body, size_t len,
                          char key[IDEM_KEY_MAX + 1], const char **why)
{
    json_t *doc;
    int rc = 0;

    if (len == 0)
        return 0;
    doc = parse_body(body, len);
    if (!doc) {
        *why = "the body is not JSON, so the idempotency key in it cannot be read";
        return -1;
    }
    for (size_t i = 0; i < route->nkey_pointers && rc == 0; i++) {
        json_t *v = json_pointer_get(doc, route->key_pointers[i]);
        const char *s;
        size_t n;
        if (!v || json_is_null(v))
            continue;
        if (!json_is_string(v)) {
            *why = "the idempotency key in the body is not a string";
            rc = -1;
            break;
        }
        s = json_string_value(v);
        n = json_string_length(v);
        if (n == 0 || n > IDEM_KEY_MAX) {
            *why = "the idempotency key in the body must be 1 to 255 characters";
            rc = -1;
            break;
        }
        for (size_t k = 0; k < n; k++) {
            if ((unsigned char)s[k] < 0x20 || (unsigned char)s[k] > 0x7e) {
                *why = "the idempotency key in the body must be printable ASCII";
                rc = -1;
                break;
            }
        }
        if (rc == 0) {
            memcpy(key, s, n);
            key[n] = '\0';
            rc = 1;
        }
    }
    json_decref(doc);
    return rc;
}

/* Whether a Content-Type names JSON: application/json or any +json type, parameters aside. */
static int is_json_type(const char *ct)
{
    size_t n;

    if (!ct)
        return 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    n = strcspn(ct, "; \t");
    if (n == 16 && ascii_ncaseeq(ct, "application/json", 16))
        return 1;
    return n > 5 && ascii_ncaseeq(ct + n - 5, "+json", 5);
}

/*
 * "sha256:<hex>" of a body that is not fingerprinted as JSON, written into `raw` and returned: it
 * goes in as one more length-prefixed field after the path parameters.
 */
static const char *body_digest(const char *body, size_t len, char raw[7 + 2 * SHA256_BYTES + 1])
{
    unsigned char d[SHA256_BYTES];

    sha256_bytes(body, len, d);
    memcpy(raw, "sha256:", 7);
    hex_encode(d, sizeof d, raw + 7);
    return raw;
}

/*
 * "query:<the query string as sent>" when the route fingerprints a request's query and it has
 * one, else NULL: one more length-prefixed field, last.  Absent when there is no query, so a
 * request without one keeps the fingerprint it always had.  New; free() it.
 */
static char *query_field(const struct gw_route *r, const char *target)
{
    const char *q = r->fp_query && target ? strchr(target, '?') : NULL;
    size_t n;
    char *f;

    if (q == NULL || q[1] == '\0')
        return NULL;
    n = strlen(q + 1);
    f = xmalloc(6 + n + 1);
    memcpy(f, "query:", 6);
    memcpy(f + 6, q + 1, n + 1);
    return f;
}

static int compute_fingerprint(const struct route_match *m, const char *method, const char *query,
                               const char *content_type, const char *body, size_t len,
                               unsigned char fp[IDEM_FP_LEN], const char **why)
{
    const struct gw_route *r = m->route;
    const char *params[ROUTE_MAX_PARAMS + 2];
    size_t np = m->nparams;
    char raw[7 + 2 * SHA256_BYTES + 1];
    json_t *doc = NULL, *picked = NULL;
    char *picked_text = NULL;
    const char *fp_body = NULL;
    size_t fp_len = 0;
    int rc;

    memcpy(params, m->params, np * sizeof params[0]);
    if (r->fp_body == GW_FP_BODY_ALL && len > 0) {
        /*
         * A JSON body goes to libidem as it is: its canonicaliser is the one parse (a body it
         * refuses falls back to its bytes below).  Anything else is fingerprinted by its bytes.
         */
        if (is_json_type(content_type)) {
            fp_body = body;
            fp_len = len;
        } else {
            params[np++] = body_digest(body, len, raw);
        }
    } else if (r->fp_body == GW_FP_BODY_POINTERS) {
        /* The chosen values in order, as one JSON array (absent ones are null). */
        doc = len > 0 ? parse_body(body, len) : NULL;
        picked = xcheck(json_array());
        for (size_t i = 0; i < r->nfp_pointers; i++) {
            json_t *v = doc ? json_pointer_get(doc, r->fp_pointers[i]) : NULL;
            json_array_append(picked, v ? v : json_null());
        }
        picked_text = json_dumps(picked, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!picked_text) {
            *why = "out of memory";
            rc = -1;
            goto out;
        }
        fp_body = picked_text;
        fp_len = strlen(picked_text);
    }
    if (query)
        params[np++] = query;
    rc = idem_fingerprint(method, r->path, params, np, fp_body, fp_len, fp, why);
    if (rc < 0 && rc != IDEM_ENOMEM && fp_body == body) {
        /* Not JSON after all, or JSON RFC 8785 refuses (a number beyond a double): its bytes. */
        if (query)
            np--;
        params[np++] = body_digest(body, len, raw);
        if (query)
            params[np++] = query;
        rc = idem_fingerprint(method, r->path, params, np, NULL, 0, fp, why);
    }
    rc = rc < 0 ? -1 : 0;
out:
    free(picked_text);
    json_decref(picked);
    json_decref(doc);
    return rc;
}

/*
 * The fingerprints this thread computed last, by a digest of everything they depend on: the
 * route's template and body policy, the method, the path parameters, whether the body is JSON,
 * the SHA-256 of its bytes, and the query when it counts.  A storm of retries sends the same bytes
 * again and again, and hashing them costs a fraction of parsing and canonicalising them.
 * Direct-mapped and per thread (the event loops compute fingerprints): no lock; a collision of
 * slots only evicts, and an entry answers only the same digest.  Only what parses JSON is
 * remembered; the other policies are a hash already.
 */
#define MEMO_SLOTS 64
#define MEMO_MAX_POINTERS 8
static _Thread_local struct {
    unsigned char in[IDEM_FP_LEN];
    unsigned char fp[IDEM_FP_LEN];
    int used;
} memo[MEMO_SLOTS];

/* The digest `memo` is keyed by into `in`; 0, or -1 when this request is not remembered. */
static int memo_digest(const struct route_match *m, const char *method, const char *query, int json,
                       const char *body, size_t len, unsigned char in[IDEM_FP_LEN])
{
    const struct gw_route *r = m->route;
    const char *fields[ROUTE_MAX_PARAMS + MEMO_MAX_POINTERS + 4];
    char raw[7 + 2 * SHA256_BYTES + 1];
    const char *why;
    size_t n = m->nparams;

    if (!(r->fp_body == GW_FP_BODY_ALL && json && len > 0) &&
        !(r->fp_body == GW_FP_BODY_POINTERS && r->nfp_pointers <= MEMO_MAX_POINTERS))
        return -1;
    memcpy(fields, m->params, n * sizeof fields[0]);
    fields[n++] = r->fp_body == GW_FP_BODY_ALL ? "body:all" : "body:pointers";
    for (size_t i = 0; r->fp_body == GW_FP_BODY_POINTERS && i < r->nfp_pointers; i++)
        fields[n++] = r->fp_pointers[i];
    fields[n++] = json ? "json" : "bytes";
    fields[n++] = body_digest(body, len, raw);
    fields[n++] = query ? query : "no query";
    return idem_fingerprint(method, r->path, fields, n, NULL, 0, in, &why) == 0 ? 0 : -1;
}

int request_fingerprint(const struct route_match *m, const char *method, const char *target,
                        const char *content_type, const char *body, size_t len,
                        unsigned char fp[IDEM_FP_LEN], const char **why)
{
    unsigned char in[IDEM_FP_LEN];
    char *query = query_field(m->route, target);
    size_t slot;
    int rc = 0;

    if (memo_digest(m, method, query, is_json_type(content_type), body, len, in) != 0) {
        rc = compute_fingerprint(m, method, query, content_type, body, len, fp, why);
        goto out;
    }
    slot = (size_t)(in[0] | (unsigned)in[1] << 8) % MEMO_SLOTS;
    if (memo[slot].used && memcmp(memo[slot].in, in, sizeof in) == 0) {
        memcpy(fp, memo[slot].fp, IDEM_FP_LEN);
        goto out;
    }
    rc = compute_fingerprint(m, method, query, content_type, body, len, fp, why);
    if (rc != 0)
        goto out;
    memcpy(memo[slot].in, in, sizeof in);
    memcpy(memo[slot].fp, fp, IDEM_FP_LEN);
    memo[slot].used = 1;
out:
    free(query);
    return rc;
}
