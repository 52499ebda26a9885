/* SPDX-License-Identifier: Apache-2.0 */
/*
 * response.c - building the responses of response.h: headers set once by name, bodies copied,
 * JSON and problem documents serialised compactly in insertion order.  A replay passes through
 * here on every request, so a header costs one allocation and a stored body one copy.
 */
#include "response.h"
#include "ascii.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"
#include "jdoc.h"
#include "banned.h"

void response_init(struct response *r)
{
    memset(r, 0, sizeof *r);
    r->status = 500;
    r->operation = "other";
    r->head_length = -1;
}

void response_release(struct response *r)
{
    size_t i;

    free(r->body);
    for (i = 0; i < r->nheaders; i++)
        free(r->headers[i].name); /* the value lives in the same block */
    free(r->headers);
    free(r->principal);
    if (r->stream != NULL)
        r->stream->stop(r->stream, HTTP_SOURCE_CLIENT); /* never sent */
    memset(r, 0, sizeof *r);
}

void response_stream(struct response *r, struct http_body_source *src, uint64_t length)
{
    if (r->stream != NULL)
        r->stream->stop(r->stream, HTTP_SOURCE_CLIENT);
    r->stream = src;
    r->stream_length = length;
}

/* A header is one allocation, "name\0value\0": half the allocations of two copies. */
static void header_store(struct response_header *h, const char *name, const char *value)
{
    size_t nlen = strlen(name);
    size_t vlen = strlen(value);
    char *block = xmalloc(nlen + vlen + 2);

    memcpy(block, name, nlen + 1);
    memcpy(block + nlen + 1, value, vlen + 1);
    h->name = block;
    h->value = block + nlen + 1;
}

/* Room for one more header; -1 at the cap. */
static int header_slot(struct response *r)
{
    if (r->nheaders == RESPONSE_MAX_HEADERS)
        return -1;
    if (r->nheaders == r->headers_cap) {
        r->headers_cap = r->headers_cap ? 2 * r->headers_cap : 8;
        r->headers = xrealloc(r->headers, r->headers_cap * sizeof(*r->headers));
    }
    return 0;
}

void response_set_header(struct response *r, const char *name, const char *value)
{
    char *old;
    size_t i;

    for (i = 0; i < r->nheaders; i++) {
        if (ascii_caseeq(r->headers[i].name, name))
            break;
    }
    if (i == r->nheaders) {
        if (header_slot(r) < 0)
            die("too many response headers");
        header_store(&r->headers[r->nheaders++], name, value);
        return;
    }
    old = r->headers[i].name;
    header_store(&r->headers[i], old, value); /* a replaced value keeps the name as first set */
    free(old);
}

int response_add_header(struct response *r, const char *name, const char *value)
{
    if (header_slot(r) < 0)
        return -1;
    header_store(&r->headers[r->nheaders++], name, value);
    return 0;
}

const char *response_header(const struct response *r, const char *name)
{
    size_t i;

    for (i = 0; i < r->nheaders; i++) {
        if (ascii_caseeq(r->headers[i].name, name))
            return r->headers[i].value;
    }
    return NULL;
}

void response_set_body(struct response *r, const void *body, size_t len)
{
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    r->problem = NULL;
    if (len > 0) {
        r->body = xmalloc(len);
        memcpy(r->body, body, len);
        r->body_len = len;
    }
}

void response_json(struct response *r, int status, const json_t *doc)
{
    free(r->body);
    r->status = status;
    r->problem = NULL;
    r->body = jdoc_text(doc, &r->body_len);
    response_set_header(r, "Content-Type", CONTENT_TYPE_JSON);
}

void response_problem(struct response *r, int status, const char *code, const char *detail)
{
    response_problem_ext(r, status, code, detail, NULL);
}

void response_problem_ext(struct response *r, int status, const char *code, const char *detail,
                          const json_t *extra)
{
    free(r->body);
    r->status = status;
    r->body = problem_body_ext(status, code, detail, extra, &r->body_len);
    r->problem = code;
    response_set_header(r, "Content-Type", CONTENT_TYPE_PROBLEM);
}
