/* SPDX-License-Identifier: Apache-2.0 */
/*
 * response.c - what came back: the final attempt's status line, header lines and body, plus how
 * the call went (attempts, time, key, why it stopped).  Bodies and headers come from strangers,
 * so every buffer here has a cap; a server cannot make the client swallow all memory.
 */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "banned.h"

/* Header lines of one answer, and the bytes of one line: generous, and still bounded. */
#define MAX_HEADER_LINES 256
#define MAX_HEADER_LINE 16384

int idem_client__body_add(struct idem_client_response *r, const void *p, size_t len)
{
    int rc = capped_buf_add(&r->body, p, len);

    return rc == 0 ? 0 : rc == CAPPED_BUF_TOO_BIG ? IDEM_CLIENT_ETOOBIG : IDEM_CLIENT_ENOMEM;
}

struct idem_client_response *idem_client__response_new(size_t limit)
{
    struct idem_client_response *r = calloc(1, sizeof *r);

    if (r)
        r->body.limit = limit;
    return r;
}

static void clear_headers(struct idem_client_response *r)
{
    size_t i;

    for (i = 0; i < r->nheaders; i++)
        free(r->header_lines[i]);
    r->nheaders = 0;
    free(r->status_line);
    r->status_line = NULL;
    r->status = 0;
}

void idem_client__response_reset(struct idem_client_response *r)
{
    clear_headers(r);
    capped_buf_reset(&r->body);
    free(r->error);
    r->error = NULL;
}

/* Reads the status code of "HTTP/1.1 201 Created" or "HTTP/2 201". */
static int status_of(const char *line)
{
    const char *p = strchr(line, ' ');
    int code = 0, i;

    if (!p)
        return 0;
    p++;
    for (i = 0; i < 3; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        code = code * 10 + (p[i] - '0');
    }
    return code;
}

int idem_client__response_add_header(struct idem_client_response *r, const char *line, size_t len)
{
    char **lines;
    char *copy;
    size_t ncap;

    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    if (len == 0)
        return 0; /* the blank line that ends a header block */
    if (len > MAX_HEADER_LINE)
        return IDEM_CLIENT_ETOOBIG;
    if (len >= 5 && memcmp(line, "HTTP/", 5) == 0) {
        /* A new answer begins (the final one after a 1xx): forget the previous block. */
        clear_headers(r);
        r->status_line = idem_client__strndup(line, len);
        if (!r->status_line)
            return IDEM_CLIENT_ENOMEM;
        r->status = status_of(r->status_line);
        return 0;
    }
    if (r->nheaders >= MAX_HEADER_LINES)
        return IDEM_CLIENT_ETOOBIG;
    if (r->nheaders == r->headers_cap) {
        ncap = r->headers_cap ? r->headers_cap * 2 : 16;
        lines = realloc(r->header_lines, ncap * sizeof *lines);
        if (!lines)
            return IDEM_CLIENT_ENOMEM;
        r->header_lines = lines;
        r->headers_cap = ncap;
    }
    copy = idem_client__strndup(line, len);
    if (!copy)
        return IDEM_CLIENT_ENOMEM;
    r->header_lines[r->nheaders++] = copy;
    return 0;
}

int idem_client_response_status(const struct idem_client_response *r)
{
    return r ? r->status : 0;
}

const char *idem_client_response_status_line(const struct idem_client_response *r)
{
    return r ? r->status_line : NULL;
}

const void *idem_client_response_body(const struct idem_client_response *r, size_t *len)
{
    if (len)
        *len = r ? r->body.len : 0;
    if (!r)
        return NULL;
    return r->body.data ? r->body.data : "";
}

size_t idem_client_response_header_count(const struct idem_client_response *r)
{
    return r ? r->nheaders : 0;
}

const char *idem_client_response_header_line(const struct idem_client_response *r, size_t i)
{
    return r && i < r->nheaders ? r->header_lines[i] : NULL;
}

const char *idem_client_response_header(const struct idem_client_response *r, const char *name)
{
    size_t i, n;
    const char *v;

    if (!r || !name)
        return NULL;
    n = strlen(name);
    for (i = 0; i < r->nheaders; i++) {
        if (idem_client__strncaseeq(r->header_lines[i], name, n) && r->header_lines[i][n] == ':') {
            v = r->header_lines[i] + n + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            return v;
        }
    }
    return NULL;
}

int idem_client_response_attempts(const struct idem_client_response *r)
{
    return r ? r->attempts : 0;
}

int64_t idem_client_response_elapsed_ms(const struct idem_client_response *r)
{
    return r ? r->elapsed_ms : 0;
}

const char *idem_client_response_key(const struct idem_client_response *r)
{
    return r ? r->key : NULL;
}

const char *idem_client_response_reason(const struct idem_client_response *r)
{
    return r && r->reason ? r->reason : "";
}

const char *idem_client_response_error(const struct idem_client_response *r)
{
    return r ? r->error : NULL;
}

const char *idem_client_response_journal_error(const struct idem_client_response *r)
{
    return r ? r->journal_error : NULL;
}

void idem_client_response_free(struct idem_client_response *r)
{
    if (!r)
        return;
    clear_headers(r);
    free(r->header_lines);
    capped_buf_clear(&r->body);
    free(r->key);
    free(r->reason);
    free(r->error);
    free(r->journal_error);
    free(r);
}
