/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_parser.h - one HTTP/1.1 request read from untrusted bytes, with no socket in sight:
 * nodejs http-parser (Debian's libhttp-parser) does the grammar; this layer keeps what a handler
 * needs (method, percent-decoded path, decoded query arguments, headers, body) under caps, and
 * stops at the two points where the server must decide something before reading on: when the
 * headers are in (credentials are checked before any body byte is kept) and when the message is
 * complete (the next pipelined request waits in the buffer until this one is answered).
 *
 * The server (http_server.c) feeds it what the socket gave; fuzz/fuzz_http_request.c feeds it
 * anything.  Nothing here allocates without a cap: the header block is bounded by
 * `max_header_bytes`, the body by `max_body`.
 */
#ifndef IDEM_HTTP_REQUEST_PARSER_H
#define IDEM_HTTP_REQUEST_PARSER_H

#include <stddef.h>

#include <http_parser.h>

#include "strbuf.h"

/* The detail of the 413 for a body over the cap, announced or sent (docs/http-api.md). */
#define REQUEST_BODY_TOO_LARGE "Request bodies are limited to 1 MiB."

/* At most this many header fields per request; more is a 431 like an oversized block. */
#define REQUEST_MAX_HEADERS 100

struct request_field {
    const char *name; /* NUL-terminated, as sent (compare case-insensitively) */
    const char *value;
    size_t value_len;
};

/*
 * The request as handlers see it (http_server.h's accessors read it).  Every pointer is borrowed
 * from the parser until the next request begins on the connection.
 */
struct request {
    const char *method; /* "GET", "POST"... */
    const char *path;   /* without the query string, percent-decoded */
    const char *target; /* path and query as sent, not decoded ("/a%20b?x=1") */
    const char *body;   /* NUL-terminated copy; NULL when empty */
    size_t body_len;
    int has_body;                      /* a body was announced (Content-Length > 0 or chunked) */
    unsigned long long content_length; /* announced, 0 when absent or chunked */
    int expects_continue;              /* "Expect: 100-continue" on HTTP/1.1 */
    const char *peer;                  /* the client's address, "127.0.0.1" (set by the server) */
    long parked_ms;   /* how long the request was parked on the loop (http_server.h) */
    void *completion; /* for http_server_complete(), while `handle` runs (http_server.h) */
    /* What the program's on_head learnt (orderd: the principal), freed with the request. */
    void *note;
    void (*note_free)(void *note);

    const struct request_field *fields;
    size_t nfields;
    const struct request_field *args; /* query arguments, decoded ('+' is a space) */
    size_t nargs;
};

enum request_parse_result {
    REQUEST_PARSE_MORE,     /* every byte was taken; send more */
    REQUEST_PARSE_HEADERS,  /* the head is in: look at request_parser_request(), then resume */
    REQUEST_PARSE_COMPLETE, /* the whole request is in; the rest of the bytes is not taken */
    REQUEST_PARSE_ERROR,    /* see ->error_status / ->error_code / ->error_detail */
};

struct request_parser_limits {
    size_t max_header_bytes;    /* request line + header fields, as stored */
    size_t max_body;            /* bytes of body kept; more is a 413 */
    const char *body_too_large; /* the 413's detail (borrowed); NULL: REQUEST_BODY_TOO_LARGE */
};

struct request_parser {
    http_parser hp;
    struct request_parser_limits limits;

    /* The head as it arrives: the URL, then "name\0value\0" per field, then the decoded view. */
    struct strbuf head;
    size_t url_len;
    /*
     * Where each field's name and value are in `head`, while the head arrives; allocated per
     * request (growing up to REQUEST_MAX_HEADERS), so an idle connection holds none of it.
     */
    struct request_field_span {
        size_t name_off, name_len, value_off, value_len;
    } * spans;
    size_t spans_cap;
    size_t nfields;
    int in_value; /* the last piece was a value: the next field piece starts a new field */

    struct strbuf body;
    struct request_field *fields; /* the view of the spans, built when the head is in */
    struct request_field *args;
    struct request rq;

    int phase; /* internal: where the request is between the two stops */
    int stop;  /* internal: why a callback stopped http-parser */
    int keep_alive;
    /* On REQUEST_PARSE_ERROR: the status to answer (400, 413, 431, 501) and its problem. */
    int error_status;
    const char *error_code;
    const char *error_detail;
};

/* Ready for the first request of a connection; `limits` is copied. */
void request_parser_init(struct request_parser *p, const struct request_parser_limits *limits);
/* Frees what the last request held; `p` may be initialised again. */
void request_parser_release(struct request_parser *p);

/*
 * Reads `data`: *used receives how many bytes were taken (the rest belongs to a later call, e.g.
 * the next pipelined request).  After REQUEST_PARSE_HEADERS, call again with the bytes not taken
 * to read the body; after REQUEST_PARSE_COMPLETE, the next call begins the next request.
 */
enum request_parse_result request_parser_feed(struct request_parser *p, const char *data,
                                              size_t len, size_t *used);

/*
 * Tells the parser the connection ended: a body that ran to the end of the stream is complete
 * (REQUEST_PARSE_COMPLETE), an unfinished request is an error, nothing started is MORE.
 */
enum request_parse_result request_parser_finish(struct request_parser *p);

/* The request read so far (head after HEADERS, body too after COMPLETE); borrowed. */
const struct request *request_parser_request(const struct request_parser *p);

/* Whether a request has started: bytes of it arrived since the last COMPLETE. */
int request_parser_started(const struct request_parser *p);

/* Whether the connection may carry another request after this one (HTTP/1.1 default). */
int request_parser_keep_alive(const struct request_parser *p);

/*
 * Decodes %XX over [s, s+len) ('+' too when `plus`), writing the result at `out` (which may be
 * `s`; it needs `len` bytes).  Returns the decoded length, or -1 when a NUL would come out.  A
 * '%' that starts no valid escape is kept as it is.
 */
long request_percent_decode(const char *s, size_t len, char *out, int plus);

/*
 * The value of the field `name` in an application/x-www-form-urlencoded `body` (the first one;
 * '+' and %XX decoded) into `out`: its length, or -1 when there is none or it does not fit.
 */
long request_form_value(const char *body, size_t len, const char *name, char *out, size_t outlen);

#endif /* IDEM_HTTP_REQUEST_PARSER_H */
