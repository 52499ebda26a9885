/* SPDX-License-Identifier: Apache-2.0 */
/*
 * method_override.c - every place a request can ask for another method, read as the frameworks
 * that honour them read it (method_override.h).
 *
 * The rule is one: every value of every source, trimmed, split at commas, must name the request's
 * own method.  It is stricter than any one framework on purpose: Express's method-override takes
 * the first item of a header's list and the last of two middlewares wins, Rack reads the form
 * before the header and the last duplicate, PHP the last `?_method` -- a check that imitated one
 * of them would let another's reading through.  A body the gateway cannot read (a coding it does
 * not know, a gzip stream that does not inflate) could hold an override, so it is refused too.
 */
#include "method_override.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "ascii.h"
#include "jdoc.h"
#include "util.h"
#include "banned.h"

/* Content codings applied one over another that are inflated; more is refused. */
#define MAX_CODINGS 4

/* What the scan found first: the source, and what it asks for (cut to fit). */
struct scan {
    const char *own; /* the request's method */
    char how[96];
    char asked[40];
    int found;
};

/* Checks one value of a source: every non-empty comma-separated item must be `own`. */
static void check_value(struct scan *sc, const char *how, const char *v, size_t len)
{
    while (!sc->found) {
        const char *comma = memchr(v, ',', len);
        size_t n = comma ? (size_t)(comma - v) : len;
        const char *item = v;
        size_t ilen = n;

        ascii_trim_ows(&item, &ilen);
        if (ilen > 0 && !(ilen == strlen(sc->own) && ascii_ncaseeq(item, sc->own, ilen))) {
            size_t i, cut = ilen < sizeof sc->asked - 1 ? ilen : sizeof sc->asked - 1;
            for (i = 0; i < cut; i++) {
                unsigned char c = (unsigned char)item[i];
                sc->asked[i] = c >= 0x21 && c <= 0x7e ? ascii_upper((char)c) : '?';
            }
            sc->asked[cut] = '\0';
            snprintf(sc->how, sizeof sc->how, "%s", how);
            sc->found = 1;
        }
        if (!comma)
            return;
        v = comma + 1;
        len -= n + 1;
    }
}

/*
 * Whether a decoded form field name is `_method` as some framework reads it: PHP turns ' ' and
 * '.' into '_' (after dropping leading spaces; both readings are taken, so ` method` and
 * ` _method` are `_method`), PHP, qs (Express) and Rack read `_method[]` and `_method[x]` as
 * `_method`, and PHP reads a name up to a NUL byte; case is ignored (no framework needs it, and
 * refusing more is safe).
 */
static int is_method_name_from(const char *name, size_t len, size_t i)
{
    static const char want[] = "_method";
    size_t k = 0;

    for (; i < len && name[i] != '[' && name[i] != '\0'; i++, k++) {
        char c = name[i] == ' ' || name[i] == '.' ? '_' : name[i];
        if (k >= sizeof want - 1 || ascii_lower(c) != want[k])
            return 0;
    }
    return k == sizeof want - 1;
}

static int is_method_name(const char *name, size_t len)
{
    size_t lead = 0;

    while (lead < len && name[lead] == ' ')
        lead++;
    return is_method_name_from(name, len, 0) || is_method_name_from(name, len, lead);
}

/*
 * Each `name=value` of a query or form in [s, s+len), split at '&' and ';' (Rack 2 splits a query
 * at both), names and values percent-decoded with '+' as a space.  A name is read up to an
 * escaped NUL (or a raw one), as PHP does; a value holding one is no method.  `scratch` holds
 * `len` bytes.
 */
static void scan_form(struct scan *sc, const char *how, const char *s, size_t len, char *scratch)
{
    size_t i = 0;

    while (i < len && !sc->found) {
        size_t end = i, eq, nlen;
        long dl;

        while (end < len && s[end] != '&' && s[end] != ';')
            end++;
        for (eq = i; eq < end && s[eq] != '='; eq++)
            ;
        nlen = eq - i;
        for (size_t k = i; k + 2 < eq; k++) {
            if (s[k] == '%' && s[k + 1] == '0' && s[k + 2] == '0') {
                nlen = k - i;
                break;
            }
        }
        dl = request_percent_decode(s + i, nlen, scratch, 1);
        if (dl >= 0 && is_method_name(scratch, (size_t)dl) && eq < end) {
            dl = request_percent_decode(s + eq + 1, end - eq - 1, scratch, 1);
            if (dl >= 0)
                check_value(sc, how, scratch, (size_t)dl);
            else
                check_value(sc, how, "(a value holding NUL)", 21);
        }
        i = end + 1;
    }
}

/* The media type of a Content-Type value, parameters and white space aside. */
static int media_type_is(const char *ct, const char *type)
{
    size_t n;

    while (*ct == ' ' || *ct == '\t')
        ct++;
    n = strcspn(ct, "; \t");
    return n == strlen(type) && ascii_ncaseeq(ct, type, n);
}

/* Whether a Content-Type names JSON as some framework reads it ("/json" or "+json" in it). */
static int names_json(const char *ct)
{
    for (const char *p = ct; *p; p++)
        if ((*p == '/' || *p == '+') && ascii_ncaseeq(p + 1, "json", 4))
            return 1;
    return 0;
}

/*
 * The top-level `_method` of a JSON body.  jansson keeps the last of duplicate members, as
 * JSON.parse and PHP do; a parser that keeps the first would see another, so a `_method` in an
 * object with duplicate members is refused whatever it says.  A body jansson cannot read (bytes
 * that are not UTF-8, nesting too deep) may still be read by the upstream: refused when it may
 * spell the name (the word, or any \u escape).  Returns 0, or -1 for "cannot be read".
 */
static int scan_json(struct scan *sc, const char *body, size_t len)
{
    json_t *doc = jdoc_load(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
    int duplicates = 0;
    json_t *v;

    if (!doc) {
        doc = jdoc_load(body, len, JSON_ALLOW_NUL, NULL);
        duplicates = doc != NULL;
    }
    if (!doc) {
        for (size_t i = 0; i + 1 < len; i++)
            if ((body[i] == '\\' && body[i + 1] == 'u') ||
                (i + 6 <= len && ascii_ncaseeq(body + i, "method", 6)))
                return -1;
        return 0;
    }
    v = json_is_object(doc) ? json_object_get(doc, "_method") : NULL;
    if (v && duplicates)
        check_value(sc, "a _method member of the JSON body (with duplicate members)", "(ambiguous)",
                    11);
    else if (v && json_is_string(v))
        check_value(sc, "a _method member of the JSON body", json_string_value(v),
                    json_string_length(v));
    else if (v && !json_is_null(v))
        check_value(sc, "a _method member of the JSON body", "(not a string)", 14);
    json_decref(doc);
    return 0;
}

/*
 * Inflates one gzip or deflate coding of [in, in+len) into *out (new, NUL-terminated), at most
 * `max` bytes.  gzip members one after another are read as one body (Node's gunzip does).
 * Returns 0, -1 when it does not inflate, -2 when it inflates past `max`.
 */
static int inflate_body(const char *in, size_t len, int gzip, size_t max, char **out, size_t *olen)
{
    z_stream zs;
    char *buf = xmalloc(max + 1);
    int rc = -1, zrc;
    int raw = 0;
    size_t produced = 0;

again:
    memset(&zs, 0, sizeof zs);
    /* 15 + 32: a zlib or a gzip header, told apart by the stream; -15: a bare deflate stream. */
    if (inflateInit2(&zs, raw ? -15 : 15 + 32) != Z_OK)
        goto out;
    zs.next_in = (unsigned char *)(uintptr_t)in;
    zs.avail_in = (uInt)len;
    zs.next_out = (unsigned char *)buf;
    zs.avail_out = (uInt)max + 1; /* one byte more than allowed: reaching it is "too large" */
    for (;;) {
        zrc = inflate(&zs, Z_NO_FLUSH);
        /* Counted from the buffer: inflateReset() zeroes total_out at each gzip member. */
        produced = (size_t)((char *)zs.next_out - buf);
        if (produced > max) {
            rc = -2;
            break;
        }
        if (zrc == Z_STREAM_END && zs.avail_in > 0 && gzip && zs.avail_in >= 2 &&
            zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b) {
            if (inflateReset(&zs) != Z_OK)
                break;
            continue;
        }
        if (zrc == Z_STREAM_END) {
            /* Bytes after the end: the body is not one the gateway read whole. */
            if (zs.avail_in == 0) {
                *olen = produced;
                rc = 0;
            }
            break;
        }
        if (zrc != Z_OK) {
            /* A deflate coding some clients send without its zlib header. */
            if (!gzip && !raw && produced == 0) {
                inflateEnd(&zs);
                raw = 1;
                goto again;
            }
            break;
        }
    }
    inflateEnd(&zs);
out:
    if (rc == 0) {
        buf[*olen] = '\0';
        *out = buf;
        buf = NULL;
    }
    free(buf);
    return rc;
}

/*
 * The entry of `headers` that field name `name` is, or NULL: ASCII case ignored, and '_' the same
 * as '-' (CGI, PHP and Rack see both as HTTP_X_HTTP_METHOD_OVERRIDE).
 */
static const char *override_header(const char *name, char *const *headers, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *a = name, *b = headers[i];
        for (; *a && *b; a++, b++) {
            char x = *a == '_' ? '-' : ascii_lower(*a), y = *b == '_' ? '-' : ascii_lower(*b);
            if (x != y)
                break;
        }
        if (*a == '\0' && *b == '\0')
            return headers[i];
    }
    return NULL;
}

int method_override_possible(const struct request *rq, char *const *headers, size_t n)
{
    if (rq->body_len > 0 || (rq->target && strchr(rq->target, '?') != NULL))
        return 1;
    for (size_t f = 0; f < rq->nfields; f++)
        if (override_header(rq->fields[f].name, headers, n) != NULL)
            return 1;
    return 0;
}

static int refuse(struct response *resp, int status, const char *code, const char *detail)
{
    response_problem(resp, status, code, detail);
    resp->outcome = "refused";
    return status;
}

/*
 * The body as the upstream's body parser reads it: each coding of every Content-Encoding field
 * undone, last first (only when `read_it`: a body nobody reads for `_method` is only checked for
 * codings the gateway knows).  Returns 0 with *body (new, or NULL for the request's own bytes), or
 * the status of a refusal with `resp` filled.
 */
static int decoded_body(const struct request *rq, size_t max_body, int read_it, char **body,
                        size_t *len, struct response *resp)
{
    const char *codings[MAX_CODINGS];
    size_t clen[MAX_CODINGS], nc = 0;
    char detail[300];
    char *cur = NULL;
    size_t curlen = rq->body_len;

    *body = NULL;
    *len = rq->body_len;
    for (size_t f = 0; f < rq->nfields; f++) {
        const char *v = rq->fields[f].value;
        size_t vlen = rq->fields[f].value_len;
        if (!ascii_caseeq(rq->fields[f].name, "Content-Encoding"))
            continue;
        while (vlen > 0) {
            const char *comma = memchr(v, ',', vlen);
            size_t n = comma ? (size_t)(comma - v) : vlen;
            const char *c = v;
            size_t cl = n;
            ascii_trim_ows(&c, &cl);
            if (cl > 0 && !(cl == 8 && ascii_ncaseeq(c, "identity", 8))) {
                int known = (cl == 4 && ascii_ncaseeq(c, "gzip", 4)) ||
                            (cl == 6 && ascii_ncaseeq(c, "x-gzip", 6)) ||
                            (cl == 7 && ascii_ncaseeq(c, "deflate", 7));
                if (!known || nc == MAX_CODINGS) {
                    snprintf(detail, sizeof detail,
                             "This gateway keeps idempotency records for requests to this path "
                             "and must read a body to know what the upstream will run; it reads "
                             "the content codings gzip and deflate (at most %d), not \"%.*s\". "
                             "Send the body uncompressed.",
                             MAX_CODINGS, (int)(cl > 40 ? 40 : cl), c);
                    return refuse(resp, 415, "unsupported-media-type", detail);
                }
                codings[nc] = c;
                clen[nc++] = cl;
            }
            if (!comma)
                break;
            v = comma + 1;
            vlen -= n + 1;
        }
    }
    while (read_it && nc > 0) {
        char *next = NULL;
        size_t nlen = 0;
        int rc;

        nc--;
        rc = inflate_body(cur ? cur : rq->body, curlen, clen[nc] != 7, max_body, &next, &nlen);
        free(cur);
        cur = NULL;
        if (rc == -2) {
            snprintf(detail, sizeof detail,
                     "The body inflates to more than %zu bytes, the most this gateway reads.",
                     max_body);
            return refuse(resp, 413, "body-too-large", detail);
        }
        if (rc != 0) {
            snprintf(detail, sizeof detail,
                     "The body's Content-Encoding says %.*s, but it does not inflate to one "
                     "whole body.",
                     (int)clen[nc], codings[nc]);
            return refuse(resp, 400, "bad-request", detail);
        }
        cur = next;
        curlen = nlen;
    }
    *body = cur;
    *len = curlen;
    return 0;
}

int method_override_refuse(const struct request *rq, char *const *headers, size_t n,
                           size_t max_body, struct response *resp)
{
    struct scan sc;
    const char *query, *ct = NULL;
    char *body = NULL, *scratch = NULL;
    size_t body_len = 0;
    int form = 0, json = 0, cts = 0, rc = 0;
    char detail[400];

    memset(&sc, 0, sizeof sc);
    sc.own = rq->method;
    /* Every field of every override header, duplicates included. */
    for (size_t f = 0; f < rq->nfields && !sc.found; f++) {
        const char *name = override_header(rq->fields[f].name, headers, n);
        if (name != NULL)
            check_value(&sc, name, rq->fields[f].value, rq->fields[f].value_len);
    }
    query = rq->target ? strchr(rq->target, '?') : NULL;
    if (!sc.found && query != NULL) {
        scratch = xmalloc(strlen(query) + 1);
        scan_form(&sc, "a _method query argument", query + 1, strlen(query + 1), scratch);
        free(scratch);
        scratch = NULL;
    }
    for (size_t f = 0; f < rq->nfields; f++) {
        if (!ascii_caseeq(rq->fields[f].name, "Content-Type"))
            continue;
        ct = rq->fields[f].value;
        cts++;
        form |= media_type_is(ct, "application/x-www-form-urlencoded");
        json |= names_json(ct);
    }
    /* Rack reads a body sent without a Content-Type as a form. */
    form |= cts == 0 || (cts == 1 && ct[strspn(ct, " \t")] == '\0');
    if (!sc.found && rq->body_len > 0) {
        rc = decoded_body(rq, max_body, form || json, &body, &body_len, resp);
        if (rc != 0)
            goto out;
        if (form) {
            scratch = xmalloc(body_len + 1);
            scan_form(&sc, "a _method form field", body ? body : rq->body, body_len, scratch);
        }
        if (!sc.found && json && scan_json(&sc, body ? body : rq->body, body_len) != 0) {
            rc = refuse(resp, 400, "bad-request",
                        "This gateway keeps idempotency records for requests to this path and "
                        "reads a JSON body for a _method member; this body is not JSON it can "
                        "read, and may hold one.");
            goto out;
        }
    }
    if (sc.found) {
        snprintf(detail, sizeof detail,
                 "This gateway keeps idempotency records for requests to this path, and %s asks "
                 "the upstream to run this %s as %s, which would pass them by. Send the method "
                 "itself.",
                 sc.how, rq->method, sc.asked);
        rc = refuse(resp, 400, "method-override-refused", detail);
    }
out:
    free(scratch);
    free(body);
    return rc;
}
