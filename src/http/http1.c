/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http1.c - an HTTP/1.1 response head as the server writes it: the status line with its reason
 * phrase, the handler's header fields, the framing of the body (Content-Length, chunked, or to
 * the close), Date (formatted once a second per loop) and Connection.
 */
#include "loop_internal.h"

#include <time.h>

#include "banned.h"

// clang-format off
static const char *reason_phrase(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 425: return "Too Early";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
// clang-format on

/* The Date header's value for `t` (IMF-fixdate) into `out`. */
static void format_date(time_t t, char out[48])
{
    struct tm tm;

    gmtime_r(&t, &tm);
    strftime(out, 48, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

/* Now, as the loop's cached Date (formatted once a second). */
const char *http__http_date(struct http_loop *lp)
{
    time_t now = time(NULL);

    if (now != lp->date_at) {
        format_date(now, lp->date);
        lp->date_at = now;
    }
    return lp->date;
}

/* The status line and header fields of `r` into `out`, with `framing` for a `length`-byte body. */
void http__add_head(const struct conn *c, const struct response *r, int keep_alive,
                    enum framing framing, unsigned long long length, const char *date,
                    struct strbuf *out)
{
    int no_body = r->status == 204 || r->status == 304 || (r->status >= 100 && r->status < 200);
    size_t i;

    /* Piece by piece, no printf: this runs once per response. */
    strbuf_add(out, "HTTP/1.1 ", 9);
    strbuf_add_uint(out, (unsigned)r->status);
    strbuf_addch(out, ' ');
    strbuf_adds(out, reason_phrase(r->status));
    strbuf_add(out, "\r\n", 2);
    for (i = 0; i < r->nheaders; i++) {
        strbuf_adds(out, r->headers[i].name);
        strbuf_add(out, ": ", 2);
        strbuf_adds(out, r->headers[i].value);
        strbuf_add(out, "\r\n", 2);
    }
    if (!no_body && framing == FRAME_LENGTH) {
        strbuf_add(out, "Content-Length: ", 16);
        strbuf_add_uint(out, length);
        strbuf_add(out, "\r\n", 2);
    } else if (!no_body && framing == FRAME_CHUNKED) {
        strbuf_adds(out, "Transfer-Encoding: chunked\r\n");
    }
    strbuf_add(out, "Date: ", 6);
    strbuf_adds(out, date);
    strbuf_add(out, "\r\n", 2);
    if (!keep_alive)
        strbuf_adds(out, "Connection: close\r\n");
    else if (c->rp.hp.http_major == 1 && c->rp.hp.http_minor == 0)
        strbuf_adds(out, "Connection: keep-alive\r\n");
    strbuf_add(out, "\r\n", 2);
}
