/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_http_request.c - libFuzzer harness for the programs' request parser
 * (src/http/request_parser.c), the first code that reads a stranger's bytes.  The input is fed the
 * way a socket would deliver it: in pieces whose sizes come from the first input bytes, each piece
 * a fresh allocation freed once fed (a pointer kept into a read buffer shows as a use after free).
 * Every stop is handled as http_server.c does: HEADERS resumes with the bytes not taken, COMPLETE
 * starts the next (pipelined) request, ERROR ends the connection.
 *
 * Besides memory errors it checks what handlers rely on: the method is one http-parser knows; the
 * path is non-empty and starts with '/' (or is the asterisk-form "*"); at most
 * REQUEST_MAX_HEADERS fields, every name non-empty, every value NUL-terminated at its length and
 * holding no NUL; the head within its cap; a body NUL-terminated, within its cap, and exactly the
 * announced Content-Length; the accessors of http_server.h agree with the fields and arguments;
 * the view of the head does not change while the body arrives; the target holds nothing RFC 3986
 * leaves out (white space, controls, non-ASCII, "<>\\^`{|}#); a form field read from the body
 * fits its buffer; every refusal is one of the problems the server answers (400, 413, 431, 501,
 * 505) with a code and a detail.
 *
 * Input layout: byte 0 picks the limits (header cap 1024 or 8192, body cap 1 MiB or 64 bytes) and
 * how the pieces are cut; bytes 1-4 seed the cuts; the rest is the stream.
 */
#include "http_server.h"
#include "ascii.h"
#include "request_parser.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "fuzz_http_request";

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i;

    for (i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* A digest of what the head made visible: it must not change while the body arrives. */
static uint64_t view_digest(const struct request *rq)
{
    uint64_t h = 14695981039346656037ull;
    size_t i;

    h = fnv(h, rq->method, strlen(rq->method) + 1);
    h = fnv(h, rq->path, strlen(rq->path) + 1);
    h = fnv(h, &rq->nfields, sizeof rq->nfields);
    for (i = 0; i < rq->nfields; i++) {
        h = fnv(h, rq->fields[i].name, strlen(rq->fields[i].name) + 1);
        h = fnv(h, rq->fields[i].value, rq->fields[i].value_len);
        h = fnv(h, &rq->fields[i].value_len, sizeof rq->fields[i].value_len);
    }
    h = fnv(h, &rq->nargs, sizeof rq->nargs);
    for (i = 0; i < rq->nargs; i++) {
        h = fnv(h, rq->args[i].name, strlen(rq->args[i].name) + 1);
        h = fnv(h, rq->args[i].value, rq->args[i].value_len + 1);
    }
    h = fnv(h, &rq->content_length, sizeof rq->content_length);
    h = fnv(h, &rq->has_body, sizeof rq->has_body);
    return h;
}

static int known_method(const char *m)
{
    int i;

    /* http-parser's own table: every method it can hand over. */
    for (i = 0; i <= HTTP_SOURCE; i++) {
        if (strcmp(m, http_method_str((enum http_method)i)) == 0)
            return 1;
    }
    return 0;
}

/* What must hold of a request once its head is in (and again once it is complete). */
/* Whether the request target is all RFC 3986 allows (the parser refuses any other). */
static int target_is_clean(const char *t)
{
    for (; *t; t++) {
        unsigned char c = (unsigned char)*t;
        if (c <= 0x20 || c >= 0x7f || strchr("\"<>\\^`{|}#", c) != NULL)
            return 0;
    }
    return 1;
}

static void check_head(const struct request *rq, const struct request_parser_limits *lim)
{
    size_t i, j, stored;
    const char *first;
    size_t first_len;
    int count, expect_count;

    CHECK(rq->method != NULL && known_method(rq->method), "method is one http-parser knows");
    CHECK(rq->path != NULL && rq->path[0] != '\0', "path is non-empty");
    CHECK(rq->target != NULL && target_is_clean(rq->target),
          "the target holds no white space, control, non-ASCII or excluded byte");
    CHECK(rq->path[0] == '/' || strcmp(rq->path, "*") == 0,
          "path starts with '/' (or is the asterisk-form \"*\")");
    CHECK(rq->nfields <= REQUEST_MAX_HEADERS, "at most REQUEST_MAX_HEADERS fields");
    CHECK(rq->nfields == 0 || rq->fields != NULL, "fields present when counted");
    CHECK(rq->nargs == 0 || rq->args != NULL, "arguments present when counted");
    CHECK(rq->content_length == 0 || rq->has_body, "Content-Length > 0 means a body");
    CHECK(!rq->expects_continue || rq->expects_continue == 1, "expects_continue is 0 or 1");

    stored = 0;
    for (i = 0; i < rq->nfields; i++) {
        const struct request_field *f = &rq->fields[i];

        CHECK(f->name != NULL && f->name[0] != '\0', "a field has a name");
        CHECK(f->value != NULL, "a field has a value");
        CHECK(f->value[f->value_len] == '\0', "a value is NUL-terminated at its length");
        CHECK(memchr(f->value, '\0', f->value_len) == NULL, "no NUL inside a value");
        stored += strlen(f->name) + 1 + f->value_len + 1;

        /* request_header_count / request_header agree with the fields. */
        expect_count = 0;
        for (j = 0; j < rq->nfields; j++)
            expect_count += ascii_caseeq(rq->fields[j].name, f->name);
        first = NULL;
        first_len = 12345;
        count = request_header_count(rq, f->name, &first, &first_len);
        CHECK(count == expect_count && count >= 1, "request_header_count counts the field");
        for (j = 0; j < rq->nfields; j++) {
            if (ascii_caseeq(rq->fields[j].name, f->name))
                break;
        }
        CHECK(first == rq->fields[j].value && first_len == rq->fields[j].value_len,
              "request_header_count gives the first value");
        CHECK(request_header(rq, f->name) == first, "request_header gives the first value");
    }
    CHECK(stored <= lim->max_header_bytes, "the fields fit the header cap");
    CHECK(request_header(rq, "X-Fuzz-Never-Sent-\x01") == NULL, "an absent header is NULL");
    first = "x";
    first_len = 1;
    CHECK(request_header_count(rq, "X-Fuzz-Never-Sent-\x01", &first, &first_len) == 0 &&
              first == NULL && first_len == 0,
          "an absent header counts 0 with a NULL first value");

    for (i = 0; i < rq->nargs; i++) {
        const struct request_field *a = &rq->args[i];
        const char *v;

        CHECK(a->name != NULL && a->value != NULL, "an argument has a name and a value");
        CHECK(a->value[a->value_len] == '\0' && strlen(a->value) == a->value_len,
              "an argument's value is NUL-terminated at its length, no NUL inside");
        v = request_query(rq, a->name);
        for (j = 0; j < rq->nargs; j++) {
            if (strcmp(rq->args[j].name, a->name) == 0)
                break;
        }
        CHECK(v == rq->args[j].value, "request_query gives the first argument of the name");
    }
    CHECK(request_query(rq, "\x01never") == NULL, "an absent argument is NULL");
}

static void check_complete(const struct request *rq, const struct request_parser_limits *lim,
                           uint64_t digest)
{
    check_head(rq, lim);
    CHECK(view_digest(rq) == digest, "the head's view did not change while the body arrived");
    CHECK(rq->body_len <= lim->max_body && rq->body_len <= HTTP_BODY_MAX, "the body fits its cap");
    CHECK((rq->body == NULL) == (rq->body_len == 0), "body is NULL exactly when empty");
    CHECK(rq->body == NULL || rq->body[rq->body_len] == '\0', "the body is NUL-terminated");
    CHECK(rq->content_length == 0 || rq->body_len == rq->content_length,
          "the body is as long as Content-Length said");
    CHECK(rq->body_len == 0 || rq->has_body, "a body was announced");
    if (rq->body != NULL) {
        char v[32];
        long n = request_form_value(rq->body, rq->body_len, "_method", v, sizeof v);
        CHECK(n < 0 || ((size_t)n < sizeof v && v[n] == '\0' && strlen(v) == (size_t)n),
              "a form value fits its buffer, NUL-terminated at its length");
    }
}

static void check_error(const struct request_parser *p)
{
    CHECK(p->error_code != NULL && p->error_detail != NULL && p->error_detail[0] != '\0',
          "an error has a code and a detail");
    switch (p->error_status) {
    case 400:
        CHECK(strcmp(p->error_code, "bad-request") == 0, "400 is bad-request");
        break;
    case 413:
        CHECK(strcmp(p->error_code, "body-too-large") == 0, "413 is body-too-large");
        break;
    case 431:
        CHECK(strcmp(p->error_code, "request-header-too-large") == 0,
              "431 is request-header-too-large");
        break;
    case 501:
        CHECK(strcmp(p->error_code, "method-not-implemented") == 0 ||
                  strcmp(p->error_code, "transfer-coding-not-implemented") == 0,
              "501 is method-not-implemented or transfer-coding-not-implemented");
        break;
    case 505:
        CHECK(strcmp(p->error_code, "http-version-not-supported") == 0,
              "505 is http-version-not-supported");
        break;
    default:
        CHECK(0, "an error is 400, 413, 431, 501 or 505");
    }
}

static uint32_t next_rand(uint32_t *s)
{
    /* xorshift32: the cuts only need to be reproducible from the input. */
    uint32_t x = *s ? *s : 0x9e3779b9u;

    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *s = x;
    return x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t max_piece[4] = {1, 7, 100, (size_t)-1};
    struct request_parser_limits lim;
    struct request_parser p;
    enum request_parse_result r;
    uint32_t seed;
    size_t off, used, piece, pos, requests = 0;
    char *buf = NULL;
    uint64_t digest = 0;
    int in_request = 0, stalls = 0, failed = 0;

    if (size < 5)
        return 0;
    memset(&lim, 0, sizeof lim); /* fields added later default to 0 / NULL */
    lim.max_header_bytes = data[0] & 1 ? 1024 : 8192;
    lim.max_body = data[0] & 2 ? 64 : HTTP_BODY_MAX;
    /* Half the runs with the 413 detail a server with another body cap passes. */
    lim.body_too_large = data[0] & 0x10 ? "Request bodies are limited to 64 bytes." : NULL;
    seed = (uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16 |
           (uint32_t)data[4] << 24;
    piece = max_piece[(data[0] >> 2) & 3];
    data += 5;
    size -= 5;

    request_parser_init(&p, &lim);
    off = 0;
    while (off < size && !failed) {
        size_t n = size - off, cut;

        if (piece != (size_t)-1) {
            cut = 1 + next_rand(&seed) % piece;
            if (cut < n)
                n = cut;
        }
        buf = malloc(n);
        CHECK(buf != NULL, "malloc");
        memcpy(buf, data + off, n);
        off += n;
        pos = 0;
        stalls = 0;
        for (;;) {
            used = (size_t)-1;
            r = request_parser_feed(&p, buf + pos, n - pos, &used);
            CHECK(used <= n - pos, "used is at most what was given");
            pos += used;
            stalls = used == 0 && r != REQUEST_PARSE_MORE ? stalls + 1 : 0;
            CHECK(stalls <= 3, "the parser makes progress");
            if (r == REQUEST_PARSE_MORE) {
                CHECK(pos == n, "MORE means every byte was taken");
                CHECK(!in_request || request_parser_started(&p), "a request begun stays begun");
                if (request_parser_started(&p))
                    in_request = 1;
                break;
            }
            if (r == REQUEST_PARSE_ERROR) {
                check_error(&p);
                CHECK(!request_parser_keep_alive(&p), "an error ends the connection");
                CHECK(request_parser_feed(&p, buf + pos, n - pos, &used) == REQUEST_PARSE_ERROR &&
                          used == 0,
                      "an error sticks and takes nothing");
                failed = 1;
                break;
            }
            if (r == REQUEST_PARSE_HEADERS) {
                CHECK(request_parser_started(&p), "a request at its head has started");
                check_head(request_parser_request(&p), &lim);
                CHECK(request_parser_request(&p)->body == NULL &&
                          request_parser_request(&p)->body_len == 0,
                      "no body before the head is resumed");
                digest = view_digest(request_parser_request(&p));
                in_request = 1;
                continue;
            }
            CHECK(r == REQUEST_PARSE_COMPLETE, "a known result");
            CHECK(in_request, "COMPLETE follows HEADERS");
            CHECK(!request_parser_started(&p), "a complete request is no longer 'started'");
            check_complete(request_parser_request(&p), &lim, digest);
            CHECK(request_parser_keep_alive(&p) == 0 || request_parser_keep_alive(&p) == 1,
                  "keep-alive is 0 or 1");
            in_request = 0;
            requests++;
            CHECK(requests <= size, "no more requests than bytes");
        }
        free(buf);
        buf = NULL;
    }
    if (!failed) {
        r = request_parser_finish(&p);
        if (r == REQUEST_PARSE_ERROR)
            check_error(&p);
        else
            CHECK(r == REQUEST_PARSE_MORE && !in_request, "finish: MORE only between requests");
    }
    request_parser_release(&p);
    return 0;
}
