/* SPDX-License-Identifier: Apache-2.0 */
/*
 * response.h - an HTTP response as the programs' handlers build it, before it meets
 * the HTTP server (http_server.c): status, a few headers, the body bytes, plus what orderd's
 * request log and metrics want to know (operation, idempotency outcome, principal) and
 * provider-sim's lost-response fault (drop).  Keeping it a plain struct lets the engine glue copy
 * a stored response into it byte for byte, and keeps the server out of the business code.
 *
 * Every error is an RFC 9457 problem (problem.h).
 */
#ifndef IDEM_HTTP_RESPONSE_H
#define IDEM_HTTP_RESPONSE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "problem.h"

struct strbuf;

/* What http_body_source.proceed() gives. */
enum http_source_step {
    HTTP_SOURCE_DATA,  /* bytes were appended */
    HTTP_SOURCE_WAIT,  /* none now: call again once *wait_fd is readable */
    HTTP_SOURCE_END,   /* the body is whole */
    HTTP_SOURCE_ERROR, /* the body ended short (the source keeps its own sentence for stop) */
};

/* How a streamed body ended, as http_body_source.stop() is told. */
enum http_source_end {
    HTTP_SOURCE_WHOLE,   /* every byte was written to the client */
    HTTP_SOURCE_CLIENT,  /* the client went, stalled, read too slowly, or a stop's grace ended */
    HTTP_SOURCE_FAILED,  /* proceed() said HTTP_SOURCE_ERROR */
    HTTP_SOURCE_STALLED, /* proceed() said HTTP_SOURCE_WAIT and nothing came for stall_ms */
};

/*
 * The rest of a body too large to hold, read by the event loop that writes it (h2o's
 * generator): the server asks for more only once what it wrote before is out, so a client that
 * reads slowly holds a few buffers and no thread.  Both calls run on that loop and must not
 * block.
 */
struct http_body_source {
    /*
     * Appends the body's next bytes (about 64 KiB at most) to `into`, or says why not: for
     * HTTP_SOURCE_WAIT it sets *wait_fd to a descriptor that becomes readable when there is more.
     */
    enum http_source_step (*proceed)(struct http_body_source *src, struct strbuf *into,
                                     int *wait_fd);
    /* The stream is over (`how`): frees the source.  Called once. */
    void (*stop)(struct http_body_source *src, enum http_source_end how);
    int stall_ms; /* the longest proceed() may keep the stream waiting for a byte; 0: no bound */
};

/* At most this many header fields per response (a proxied answer brings the upstream's). */
#define RESPONSE_MAX_HEADERS 100

struct response_header {
    char *name;
    char *value;
};

struct response {
    int status;
    char *body; /* malloc'd, may be NULL when body_len is 0 */
    size_t body_len;
    struct response_header *headers; /* grown as headers are set; NULL while there are none */
    size_t nheaders, headers_cap;
    /* Close the connection instead of answering: provider-sim's lost response. */
    int drop;
    /* Set by a handler that answers later, from another thread: http_server_complete(). */
    int deferred;
    /*
     * The answer to a HEAD request: the Content-Length a GET would have had, which a proxy relays
     * (an upstream's HEAD answer has no body to count); -1 (the default): body_len.
     */
    long long head_length;
    /*
     * A body streamed after `body` (which holds its first bytes, if any), of `stream_length`
     * bytes in all (`body` included), or of unknown length (UINT64_MAX): the server frames it
     * with Content-Length, chunked, or to the close for HTTP/1.0, and the client sees a body cut
     * short (the connection closes) whenever it does not end whole.  Owned by the response: set
     * it with response_stream(); response_release() stops a source that was never sent.
     */
    struct http_body_source *stream;
    uint64_t stream_length;

    /*
     * The stable code of the problem this program wrote itself (response_problem*, static), so a
     * program can restyle its own errors before they are sent (idem-gateway's error_format);
     * NULL once any other body is set.  A proxy that moves an answer in clears it.
     */
    const char *problem;

    /* For orderd's log and metrics, not sent. */
    const char *operation; /* static: "orders.create", "other"... */
    const char *outcome;   /* static; NULL: derived from the status when sent */
    char *principal;       /* the user id once authenticated; NULL before */
};

/* An empty response: status 500, operation "other", until a handler says otherwise. */
void response_init(struct response *r);
/* Frees the body, the headers and the principal; `r` may be initialised again. */
void response_release(struct response *r);

/* Sets (replaces) a header; both strings are copied.  Dies past RESPONSE_MAX_HEADERS. */
void response_set_header(struct response *r, const char *name, const char *value);
/*
 * Adds a header even when one of that name is set (a proxy passes Set-Cookie, Link, Vary as
 * sent).  Returns 0, or -1 when the response already has RESPONSE_MAX_HEADERS headers.
 */
int response_add_header(struct response *r, const char *name, const char *value);
/* The value of a header set on `r`, or NULL (borrowed). */
const char *response_header(const struct response *r, const char *name);
/*
 * Makes `r` a streamed answer (see struct response): steals `src`, which the server reads on its
 * event loop once the handler returns (a worker is not held while the client reads).
 */
void response_stream(struct response *r, struct http_body_source *src, uint64_t length);

/* Replaces the body with a copy of `len` bytes. */
void response_set_body(struct response *r, const void *body, size_t len);

/* Status, Content-Type application/json and the compact serialisation of `doc` (borrowed). */
void response_json(struct response *r, int status, const json_t *doc);

/*
 * Status and a problem+json body for `code` (a stable code from docs/http-api.md or
 * docs/provider-sim.md; its title comes from problem.c's table), with a sentence of `detail`.
 * Headers already set stay.
 */
void response_problem(struct response *r, int status, const char *code, const char *detail);

/* The same with the members of `extra` (borrowed, may be NULL) added: "state", "orderId"... */
void response_problem_ext(struct response *r, int status, const char *code, const char *detail,
                          const json_t *extra);

#define CONTENT_TYPE_JSON "application/json"

#endif /* IDEM_HTTP_RESPONSE_H */
