/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_parser.c - http-parser's callbacks, and the caps and decoding around them
 * (request_parser.h says why the layer exists).  http-parser hands over the URL and each header
 * field in pieces that may span reads; they are appended to one buffer, `head`, whose size is the
 * header cap, and turned into the request view once the head is complete.  The parser is paused
 * at the two stops the server needs: end of head, end of message.
 */
#include "request_parser.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ascii.h"
#include "util.h"
#include "banned.h"

enum phase {
    PHASE_IDLE,      /* between requests: no byte of the next one yet */
    PHASE_HEAD,      /* request line and header fields arriving */
    PHASE_HEAD_DONE, /* paused at the end of the head */
    PHASE_BODY,      /* resumed: body arriving */
    PHASE_COMPLETE,  /* paused at the end of the message */
};

/* Why a callback stopped the parser, beyond http-parser's own errors. */
enum stop_reason {
    STOP_NONE,
    STOP_HEAD_TOO_LARGE,
    STOP_BODY_TOO_LARGE,
    STOP_BAD_TARGET,
    STOP_TARGET_BYTE,
    STOP_CONNECT,
    STOP_TRANSFER_CODING,
    STOP_BAD_FIELD_NAME,
    STOP_BAD_FIELD_VALUE,
    STOP_BAD_VERSION,
};

/* RFC 9110 5.1: a field name is a token. */
static int is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* RFC 9110 5.5: a field value has no control character but HTAB. */
static int valid_value(const char *at, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)at[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 0;
    }
    return 1;
}

static struct request_parser *parser_of(http_parser *hp)
{
    return hp->data;
}

static void fail(struct request_parser *p, int status, const char *code, const char *detail)
{
    p->error_status = status;
    p->error_code = code;
    p->error_detail = detail;
}

/* Appends a piece of the head, or stops the parser when the head would pass its cap. */
static int head_add(struct request_parser *p, const char *at, size_t len)
{
    if (p->head.len + len + 1 > p->limits.max_header_bytes) {
        p->stop = STOP_HEAD_TOO_LARGE;
        return 1;
    }
    strbuf_add(&p->head, at, len);
    return 0;
}

static void reset_request(struct request_parser *p)
{
    if (p->rq.note_free != NULL)
        p->rq.note_free(p->rq.note);
    strbuf_release(&p->head);
    strbuf_release(&p->body);
    free(p->args);
    p->args = NULL;
    free(p->spans);
    p->spans = NULL;
    p->spans_cap = 0;
    free(p->fields);
    p->fields = NULL;
    p->url_len = 0;
    p->nfields = 0;
    p->in_value = 0;
    memset(&p->rq, 0, sizeof p->rq);
    p->stop = STOP_NONE;
    p->error_status = 0;
    p->error_code = NULL;
    p->error_detail = NULL;
}

static int on_message_begin(http_parser *hp)
{
    struct request_parser *p = parser_of(hp);

    reset_request(p);
    p->phase = PHASE_HEAD;
    return 0;
}

static int on_url(http_parser *hp, const char *at, size_t len)
{
    struct request_parser *p = parser_of(hp);

    if (head_add(p, at, len) != 0)
        return 1;
    p->url_len += len;
    return 0;
}

static int on_header_field(http_parser *hp, const char *at, size_t len)
{
    struct request_parser *p = parser_of(hp);

    /* Trailer fields of a chunked body: read and dropped (the head is built and must not move). */
    if (p->phase != PHASE_HEAD)
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (!is_tchar((unsigned char)at[i])) {
            p->stop = STOP_BAD_FIELD_NAME;
            return 1;
        }
    }

    if (p->nfields == 0 || p->in_value) {
        /* A new field: the previous value (or the URL) ends with a NUL. */
        if (p->nfields == REQUEST_MAX_HEADERS) {
            p->stop = STOP_HEAD_TOO_LARGE;
            return 1;
        }
        if (head_add(p, "", 1) != 0)
            return 1;
        if (p->nfields == p->spans_cap) {
            p->spans_cap = p->spans_cap ? p->spans_cap * 2 : 16;
            if (p->spans_cap > REQUEST_MAX_HEADERS)
                p->spans_cap = REQUEST_MAX_HEADERS;
            p->spans = xrealloc(p->spans, p->spans_cap * sizeof *p->spans);
        }
        p->spans[p->nfields].name_off = p->head.len;
        p->spans[p->nfields].name_len = 0;
        p->spans[p->nfields].value_off = 0;
        p->spans[p->nfields].value_len = 0;
        p->nfields++;
        p->in_value = 0;
    }
    if (head_add(p, at, len) != 0)
        return 1;
    p->spans[p->nfields - 1].name_len += len;
    return 0;
}

static int on_header_value(http_parser *hp, const char *at, size_t len)
{
    struct request_parser *p = parser_of(hp);

    if (p->phase != PHASE_HEAD)
        return 0; /* a trailer field's */
    if (!valid_value(at, len)) {
        p->stop = STOP_BAD_FIELD_VALUE;
        return 1;
    }

    if (!p->in_value) {
        if (head_add(p, "", 1) != 0)
            return 1;
        p->spans[p->nfields - 1].value_off = p->head.len;
        p->in_value = 1;
    }
    if (head_add(p, at, len) != 0)
        return 1;
    p->spans[p->nfields - 1].value_len += len;
    return 0;
}

long request_percent_decode(const char *s, size_t len, char *out, int plus)
{
    size_t i, o = 0;
    int hi, lo;

    for (i = 0; i < len; i++) {
        if (s[i] == '%' && i + 2 < len && (hi = hex_value(s[i + 1])) >= 0 &&
            (lo = hex_value(s[i + 2])) >= 0) {
            if (hi == 0 && lo == 0)
                return -1;
            out[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else if (plus && s[i] == '+') {
            out[o++] = ' ';
        } else {
            out[o++] = s[i];
        }
    }
    return (long)o;
}

/*
 * Appends a decoded copy of the `len` URL bytes at `off` in the head, with its NUL, and points
 * *out at it.  Returns its decoded length, or -1 when a NUL would come out.  build_view() has
 * reserved the room, so the head does not move.
 */
static long add_decoded(struct request_parser *p, size_t off, size_t len, int plus,
                        const char **out)
{
    size_t start = p->head.len;
    long dl;

    strbuf_add(&p->head, p->head.buf + off, len);
    dl = request_percent_decode(p->head.buf + start, len, p->head.buf + start, plus);
    if (dl < 0)
        return -1;
    p->head.len = start + (size_t)dl;
    strbuf_add(&p->head, "", 1);
    *out = p->head.buf + start;
    return dl;
}

long request_form_value(const char *body, size_t len, const char *name, char *out, size_t outlen)
{
    size_t nlen = strlen(name), i = 0;

    while (i < len) {
        const char *amp = memchr(body + i, '&', len - i);
        size_t end = amp ? (size_t)(amp - body) : len;
        if (end - i > nlen && memcmp(body + i, name, nlen) == 0 && body[i + nlen] == '=') {
            size_t vlen = end - i - nlen - 1;
            long dl;
            if (vlen >= outlen)
                return -1;
            dl = request_percent_decode(body + i + nlen + 1, vlen, out, 1);
            if (dl < 0)
                return -1;
            out[dl] = '\0';
            return dl;
        }
        i = end + 1;
    }
    return -1;
}

/*
 * Whether the request target's `len` bytes are all RFC 3986 allows in it: unreserved and
 * sub-delims, ':' '@' '/' '?', and "%XX" escapes.  http-parser lets a tab, a form feed and bytes
 * 0x80-0xFF through, which a server behind a proxy may read otherwise (Werkzeug splits the request
 * line on any white space): a proxy that forwards them raw forwards a request it did not see.
 * '[' and ']' are kept where browsers send them raw (the query, "a[]=1") and in an absolute
 * form's authority (an IPv6 address); '#' never belongs in a request.
 */
static int target_is_rfc3986(const char *t, size_t len)
{
    static const char allowed[] = "-._~!$&'()*+,;=:@/?";
    size_t i, path_start = 0;
    int in_query = 0;

    if (len > 0 && t[0] != '/') { /* absolute or authority form: "http://[::1]:8080/x" */
        size_t auth = 0;
        for (i = 0; i + 2 < len && auth == 0; i++)
            if (t[i] == ':' && t[i + 1] == '/' && t[i + 2] == '/')
                auth = i + 3;
        path_start = auth;
        while (path_start < len && t[path_start] != '/')
            path_start++;
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '%') {
            if (i + 2 >= len || hex_value(t[i + 1]) < 0 || hex_value(t[i + 2]) < 0)
                return 0;
            i += 2;
            continue;
        }
        if (c == '?')
            in_query = 1;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            (c != '\0' && strchr(allowed, c) != NULL))
            continue;
        if ((c == '[' || c == ']') && (i < path_start || in_query))
            continue;
        return 0;
    }
    return 1;
}

/*
 * The head is in: appends the decoded path and query arguments after the fields, then points the
 * request view into the buffer (which no longer moves until the next request).
 */
static int build_view(struct request_parser *p)
{
    struct http_parser_url u;
    size_t path_off = 0, path_len = 0, query_off = 0, query_len = 0;
    size_t i, nargs = 0, cap_args = 0;
    const char *path = "/";
    long dl;
    char *q;

    /*
     * The raw target, the decoded path and the arguments are copied from the URL within the same
     * buffer, so it must not move from here on: they never take more than five times the URL (a
     * NUL per piece).
     */
    if (!target_is_rfc3986(p->head.buf, p->url_len)) {
        p->stop = STOP_TARGET_BYTE;
        return -1;
    }
    strbuf_add(&p->head, "", 1);
    strbuf_grow(&p->head, p->url_len * 5 + 16);
    http_parser_url_init(&u);
    if (p->url_len == 0 ||
        http_parser_parse_url(p->head.buf, p->url_len, p->hp.method == HTTP_CONNECT, &u) != 0)
        goto bad_target;
    if (u.field_set & (1 << UF_PATH)) {
        path_off = u.field_data[UF_PATH].off;
        path_len = u.field_data[UF_PATH].len;
    }
    if (u.field_set & (1 << UF_QUERY)) {
        query_off = u.field_data[UF_QUERY].off;
        query_len = u.field_data[UF_QUERY].len;
    }
    /* Only the origin form (or the path of the absolute form) names a resource here. */
    if (path_len > 0 && (add_decoded(p, path_off, path_len, 0, &path) < 0 || path[0] != '/'))
        goto bad_target;
    /* The target as sent, path and query (a proxy forwards it undecoded). */
    if (path_len > 0) {
        size_t start = p->head.len;
        size_t end = query_len > 0 ? query_off + query_len : path_off + path_len;
        strbuf_add(&p->head, p->head.buf + path_off, end - path_off);
        strbuf_add(&p->head, "", 1);
        p->rq.target = p->head.buf + start;
    } else {
        p->rq.target = "/";
    }

    /* The query arguments, decoded ('+' is a space); "?name" has the value "". */
    for (i = 0; i < query_len; i++)
        cap_args += p->head.buf[query_off + i] == '&';
    if (query_len > 0)
        p->args = xcalloc(cap_args + 1, sizeof *p->args);
    i = 0;
    while (i < query_len) {
        size_t end = i, eq;

        while (end < query_len && p->head.buf[query_off + end] != '&')
            end++;
        if (end > i) {
            eq = i;
            while (eq < end && p->head.buf[query_off + eq] != '=')
                eq++;
            if (add_decoded(p, query_off + i, eq - i, 1, &p->args[nargs].name) < 0)
                goto bad_target;
            dl = add_decoded(p, eq < end ? query_off + eq + 1 : query_off + end,
                             eq < end ? end - eq - 1 : 0, 1, &p->args[nargs].value);
            if (dl < 0)
                goto bad_target;
            p->args[nargs].value_len = (size_t)dl;
            nargs++;
        }
        i = end + 1;
    }

    /* The fields, NUL-terminated in place. */
    q = p->head.buf;
    if (p->nfields > 0)
        p->fields = xcalloc(p->nfields, sizeof *p->fields);
    for (i = 0; i < p->nfields; i++) {
        const struct request_field_span *sp = &p->spans[i];

        p->fields[i].name = q + sp->name_off;
        p->fields[i].value = sp->value_off ? q + sp->value_off : "";
        p->fields[i].value_len = sp->value_len;
        q[sp->name_off + sp->name_len] = '\0';
        if (sp->value_off)
            q[sp->value_off + sp->value_len] = '\0';
    }
    q[p->url_len] = '\0';

    p->rq.method = http_method_str((enum http_method)p->hp.method);
    p->rq.path = path;
    p->rq.fields = p->fields;
    p->rq.nfields = p->nfields;
    p->rq.args = p->args;
    p->rq.nargs = nargs;
    p->rq.has_body = (p->hp.flags & F_CHUNKED) != 0 ||
                     (p->hp.content_length > 0 && p->hp.content_length != ULLONG_MAX);
    p->rq.content_length =
        (p->hp.flags & F_CHUNKED) || p->hp.content_length == ULLONG_MAX ? 0 : p->hp.content_length;
    return 0;
bad_target:
    p->stop = STOP_BAD_TARGET;
    return -1;
}

static int expects_continue(const struct request_parser *p)
{
    static const char want[] = "100-continue";
    size_t i;

    if (p->hp.http_major != 1 || p->hp.http_minor < 1)
        return 0;
    for (i = 0; i < p->rq.nfields; i++) {
        if (ascii_ncaseeq(p->rq.fields[i].name, "Expect", sizeof "Expect") &&
            p->rq.fields[i].value_len == sizeof want - 1 &&
            ascii_ncaseeq(p->rq.fields[i].value, want, sizeof want - 1))
            return 1;
    }
    return 0;
}

/*
 * Whether every Transfer-Encoding field lists only "chunked": the one coding this layer decodes.
 * Another ("gzip, chunked") would be passed on decoded of chunked but still gzip'd, and labelled
 * as neither (RFC 9112 6.1: a server answers 501 to a coding it does not understand).
 */
static int only_chunked(const struct request_parser *p)
{
    for (size_t i = 0; i < p->nfields; i++) {
        const struct request_field *f = &p->fields[i];
        const char *v = f->value, *end = f->value + f->value_len;
        if (!ascii_ncaseeq(f->name, "Transfer-Encoding", sizeof "Transfer-Encoding"))
            continue;
        while (v < end) {
            size_t n;
            while (v < end && (*v == ' ' || *v == '\t' || *v == ','))
                v++;
            n = 0;
            while (v + n < end && v[n] != ',' && v[n] != ' ' && v[n] != '\t')
                n++;
            if (n > 0 && !(n == 7 && ascii_ncaseeq(v, "chunked", 7)))
                return 0;
            v += n;
        }
    }
    return 1;
}

static int on_headers_complete(http_parser *hp)
{
    struct request_parser *p = parser_of(hp);

    if (hp->http_major != 1 || hp->http_minor > 1) {
        p->stop = STOP_BAD_VERSION;
        return -1;
    }
    /* A tunnel is no request for any program here, and no proxy forwards it. */
    if (hp->method == HTTP_CONNECT) {
        p->stop = STOP_CONNECT;
        return -1;
    }
    if (build_view(p) != 0)
        return -1;
    if (!only_chunked(p)) {
        p->stop = STOP_TRANSFER_CODING;
        return -1;
    }
    p->rq.expects_continue = expects_continue(p);
    p->phase = PHASE_HEAD_DONE;
    http_parser_pause(hp, 1);
    return 0;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    struct request_parser *p = parser_of(hp);

    if (p->body.len + len > p->limits.max_body) {
        p->stop = STOP_BODY_TOO_LARGE;
        return 1;
    }
    strbuf_add(&p->body, at, len);
    return 0;
}

static int on_message_complete(http_parser *hp)
{
    struct request_parser *p = parser_of(hp);

    p->rq.body = p->body.len > 0 ? p->body.buf : NULL;
    p->rq.body_len = p->body.len;
    p->keep_alive = http_should_keep_alive(hp);
    p->phase = PHASE_COMPLETE;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void request_parser_init(struct request_parser *p, const struct request_parser_limits *limits)
{
    memset(p, 0, sizeof *p);
    p->limits = *limits;
    http_parser_init(&p->hp, HTTP_REQUEST);
    p->hp.data = p;
}

void request_parser_release(struct request_parser *p)
{
    reset_request(p);
}

/* The problem each reason to stop answers. */
static const struct stop_problem {
    int status;
    const char *code;
    const char *detail;
} stop_problems[] = {
    [STOP_HEAD_TOO_LARGE] = {431, "request-header-too-large",
                             "The request line and header fields are over this server's limit."},
    [STOP_BODY_TOO_LARGE] = {413, "body-too-large", REQUEST_BODY_TOO_LARGE},
    [STOP_BAD_TARGET] = {400, "bad-request", "The request target is not a valid path."},
    [STOP_TARGET_BYTE] = {400, "bad-request",
                          "The request target holds a byte RFC 3986 does not allow: white space, "
                          "a control character, a byte over 0x7F, one of \"#<>\\^`{|}, or a '%' "
                          "without two hex digits after it. Percent-encode it."},
    [STOP_CONNECT] = {501, "method-not-implemented", "CONNECT is not served here: no tunnels."},
    [STOP_TRANSFER_CODING] = {501, "transfer-coding-not-implemented",
                              "Transfer-Encoding may only be chunked here; send the body with "
                              "another coding as Content-Encoding."},
    [STOP_BAD_FIELD_NAME] = {400, "bad-request",
                             "A header field name is not a token (no white space before the "
                             "colon)."},
    [STOP_BAD_FIELD_VALUE] = {400, "bad-request",
                              "A header field value holds a control character."},
    [STOP_BAD_VERSION] = {505, "http-version-not-supported",
                          "Only HTTP/1.0 and HTTP/1.1 are spoken here."},
};

/* Turns a stopped parser into the problem to answer. */
static enum request_parse_result parse_error(struct request_parser *p)
{
    enum http_errno e = HTTP_PARSER_ERRNO(&p->hp);
    int reason = e == HPE_HEADER_OVERFLOW ? STOP_HEAD_TOO_LARGE : p->stop;
    const struct stop_problem *sp = &stop_problems[reason];

    if (reason == STOP_BODY_TOO_LARGE && p->limits.body_too_large)
        fail(p, sp->status, sp->code, p->limits.body_too_large);
    else if (reason != STOP_NONE)
        fail(p, sp->status, sp->code, sp->detail);
    else if (e == HPE_INVALID_METHOD)
        fail(p, 501, "method-not-implemented", "This server does not know the request method.");
    else if (e == HPE_UNEXPECTED_CONTENT_LENGTH)
        fail(p, 400, "bad-request",
             "Send one Content-Length, or Transfer-Encoding: chunked, not both.");
    else if (e == HPE_INVALID_VERSION)
        fail(p, 400, "bad-request", "Only HTTP/1.0 and HTTP/1.1 are spoken here.");
    else
        fail(p, 400, "bad-request", http_errno_description(e));
    p->keep_alive = 0;
    return REQUEST_PARSE_ERROR;
}

enum request_parse_result request_parser_feed(struct request_parser *p, const char *data,
                                              size_t len, size_t *used)
{
    enum http_errno e;
    size_t n;

    *used = 0;
    if (p->error_code != NULL)
        return REQUEST_PARSE_ERROR;
    if (p->phase == PHASE_COMPLETE) {
        reset_request(p);
        p->phase = PHASE_IDLE;
        http_parser_pause(&p->hp, 0);
    } else if (p->phase == PHASE_HEAD_DONE) {
        p->phase = PHASE_BODY;
        http_parser_pause(&p->hp, 0);
    }
    if (len == 0)
        return REQUEST_PARSE_MORE;
    n = http_parser_execute(&p->hp, &settings, data, len);
    *used = n;
    e = HTTP_PARSER_ERRNO(&p->hp);
    if (e == HPE_PAUSED && p->phase == PHASE_HEAD_DONE)
        return REQUEST_PARSE_HEADERS;
    if (e == HPE_PAUSED && p->phase == PHASE_COMPLETE)
        return REQUEST_PARSE_COMPLETE;
    if (e != HPE_OK)
        return parse_error(p);
    return REQUEST_PARSE_MORE;
}

enum request_parse_result request_parser_finish(struct request_parser *p)
{
    if (p->phase == PHASE_IDLE || p->phase == PHASE_COMPLETE)
        return REQUEST_PARSE_MORE;
    fail(p, 400, "bad-request", "The connection ended in the middle of a request.");
    p->keep_alive = 0;
    return REQUEST_PARSE_ERROR;
}

const struct request *request_parser_request(const struct request_parser *p)
{
    return &p->rq;
}

int request_parser_started(const struct request_parser *p)
{
    return p->phase == PHASE_HEAD || p->phase == PHASE_HEAD_DONE || p->phase == PHASE_BODY;
}

int request_parser_keep_alive(const struct request_parser *p)
{
    return p->keep_alive;
}
