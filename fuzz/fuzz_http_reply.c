/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_http_reply.c - libFuzzer harness for the HTTP layer's answer reader
 * (src/http/http_client.c), which parses whatever an upstream sends back: idem-gateway stores and
 * replays what it reads, so its caps are part of the contract.  The first byte picks the body cap
 * (64 bytes or 1 MiB) and whether the request was a HEAD; the rest arrives in pieces of a size the
 * input chooses, then the end of the stream.
 *
 * Besides memory errors and leaks it checks: a whole answer has a status of 100..599 and no more
 * than HTTP_REPLY_MAX_HEADERS fields, each with a name; the body is within its cap, NUL-terminated
 * and empty for a HEAD; a result, once reached, does not change; the reader never stalls.
 */
#include "http_client.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char program_name[] = "fuzz_http_reply";

static void check_reply(const struct http_reply *rep, size_t max_body, int head)
{
    CHECK(rep->status >= 100 && rep->status <= 599, "a status of 100..599");
    CHECK(rep->nheaders <= HTTP_REPLY_MAX_HEADERS, "at most HTTP_REPLY_MAX_HEADERS fields");
    for (size_t i = 0; i < rep->nheaders; i++)
        CHECK(rep->headers[i].name && rep->headers[i].name[0] && rep->headers[i].value,
              "every field has a name and a value");
    CHECK(rep->body_len <= max_body, "the body is within its cap");
    CHECK((rep->body == NULL) == (rep->body_len == 0), "the body is NULL exactly when empty");
    CHECK(rep->body == NULL || rep->body[rep->body_len] == '\0', "the body is NUL-terminated");
    CHECK(!head || rep->body_len == 0, "a HEAD's answer has no body");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_reply_reader r;
    struct http_reply rep;
    enum http_reply_read res = HTTP_REPLY_MORE;
    size_t max_body, piece, off = 0;
    int head;

    if (size < 1)
        return 0;
    max_body = data[0] & 1 ? 64 : (size_t)1 << 20;
    head = (data[0] & 2) != 0;
    piece = 1 + (size_t)(data[0] >> 2) * 37;
    data++;
    size--;
    http_reply_reader_init(&r, max_body, head);
    while (res == HTTP_REPLY_MORE) {
        size_t n = size - off < piece ? size - off : piece;
        /* A copy of exactly n bytes, so a read past the piece is caught. */
        char *buf = malloc(n ? n : 1);
        CHECK(buf != NULL, "malloc");
        memcpy(buf, data + off, n);
        res = http_reply_reader_feed(&r, buf, n);
        free(buf);
        if (n == 0)
            break; /* the end of the stream was given */
        off += n;
    }
    if (res == HTTP_REPLY_DONE || res == HTTP_REPLY_TOO_LARGE) {
        http_reply_reader_take(&r, &rep);
        if (res == HTTP_REPLY_DONE)
            check_reply(&rep, max_body, head);
        http_reply_clear(&rep);
    } else if (res == HTTP_REPLY_BAD) {
        CHECK(http_reply_reader_error(&r) != NULL, "a bad answer says why");
    }
    http_reply_reader_release(&r);
    return 0;
}
