/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_client.h - the HTTP layer's client side, for a program that forwards requests
 * (idem-gateway):
 *
 *   - struct http_reply and a reader that parses an HTTP/1.1 answer from untrusted bytes
 *     (http-parser in response mode) under caps: for any client, blocking or not;
 *   - http_fetch_start(): one exchange with an upstream from an event-loop thread, without
 *     blocking it, over keep-alive connections pooled per loop.  The loop goes on serving other
 *     connections while the upstream thinks; `done` runs on the same loop when the answer is in.
 *
 * What matters most is what the upstream may have seen, because that decides whether a retry may
 * run: no connection means nothing was sent (HTTP_FETCH_NOT_SENT); once the request was written,
 * an exchange that ends without a whole answer is HTTP_FETCH_UNKNOWN.  A pooled connection is
 * reused only while young, and is watched while idle, so that an upstream closing it is noticed
 * before a request is written into it.
 *
 * With TLS (http_client_options.tls), a connection's handshake is done -- the upstream's
 * certificate and name verified -- before a byte of the request is encrypted, so a handshake that
 * fails is HTTP_FETCH_NOT_SENT like a refused connect, with reply->tls_failed set.  Bytes go
 * through the engine of tls.h both ways; the socket only ever carries ciphertext.
 */
#ifndef IDEM_HTTP_HTTP_CLIENT_H
#define IDEM_HTTP_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <http_parser.h>

#include "response.h"
#include "strbuf.h"
#include "tls.h"

/* A pooled connection older than this is closed rather than reused (upstreams close idle ones). */
#define HTTP_CLIENT_IDLE_REUSE_MS 2000
/* The answer's status line and header fields, as stored; more is a bad reply. */
#define HTTP_REPLY_MAX_HEAD 65536
#define HTTP_REPLY_MAX_HEADERS 100

enum http_fetch_result {
    HTTP_FETCH_OK,        /* a whole answer: status, headers, body */
    HTTP_FETCH_NOT_SENT,  /* no connection could be made: the upstream saw nothing */
    HTTP_FETCH_UNKNOWN,   /* sent, then no whole answer: the upstream may or may not have acted */
    HTTP_FETCH_TOO_LARGE, /* an answer came but its body is over the cap */
    HTTP_FETCH_BAD_REPLY, /* an answer came that is not HTTP/1.x: it acted or not, unknown too */
};

struct http_reply_header {
    const char *name;
    const char *value;
};

struct http_body_stream;

/* An answer; its strings live until http_reply_clear(). */
struct http_reply {
    int status;
    struct http_reply_header *headers;
    size_t nheaders;
    char *body; /* NUL-terminated, NULL when empty */
    size_t body_len;
    double seconds; /* first byte sent to the end of the answer */
    int timed_out;  /* HTTP_FETCH_UNKNOWN because the timeout passed (not a reset or a close) */
    int tls_failed; /* HTTP_FETCH_NOT_SENT because the TLS handshake failed (err says why) */
    /*
     * Set when the exchange was allowed to stream and the body is over its cap: `body` holds
     * its first bytes, the rest is read from here (http_body_stream_step or _next).  Closed by
     * http_reply_clear() unless taken (set to NULL).
     */
    struct http_body_stream *rest;
    char *store_; /* internal: the header bytes */
};

void http_reply_clear(struct http_reply *reply);
/* The first value of header `name` (case-insensitive), or NULL. */
const char *http_reply_header(const struct http_reply *reply, const char *name);

/* ---- the reader ------------------------------------------------------------------------- */

struct http_reply_reader {
    http_parser hp;
    struct strbuf head; /* "name\0value\0" per field */
    size_t offs[HTTP_REPLY_MAX_HEADERS][2];
    size_t nfields;
    int in_value;
    struct strbuf body;
    size_t max_body;
    int head_request;          /* HEAD: the answer has no body whatever it announces */
    int head_done;             /* the final answer's head is in (trailer fields are not kept) */
    unsigned long long length; /* its Content-Length, ULLONG_MAX when it has none */
    int may_stream;            /* http_reply_reader_allow_stream() */
    int streaming;             /* the body is over max_body: the caller takes it as it comes */
    int stream_told;
    int too_large;
    int too_many;
    int bad_status;
    int done;
    int trailing; /* bytes came after the answer: the connection is not reusable */
};

enum http_reply_read {
    HTTP_REPLY_MORE,      /* every byte was taken; send more */
    HTTP_REPLY_DONE,      /* the whole answer is in */
    HTTP_REPLY_TOO_LARGE, /* its body is over max_body */
    HTTP_REPLY_BAD,       /* not HTTP */
    HTTP_REPLY_STREAM,    /* allowed to stream: the head is in and the body is over max_body */
};

void http_reply_reader_init(struct http_reply_reader *r, size_t max_body, int head_request);
/* Reads `len` bytes; len 0 is the end of the stream (a body delimited by close completes). */
enum http_reply_read http_reply_reader_feed(struct http_reply_reader *r, const char *data,
                                            size_t len);
/*
 * Lets the body grow past max_body: instead of TOO_LARGE, feed() says STREAM once (the head is in,
 * and the body announced or read so far is over max_body), and from then on the caller takes
 * what each feed decoded with http_reply_reader_take_body() and passes it on, until DONE.  What
 * the reader holds stays bounded by what one feed brings.
 */
void http_reply_reader_allow_stream(struct http_reply_reader *r);
/* Appends the body bytes decoded so far to `into` and forgets them. */
void http_reply_reader_take_body(struct http_reply_reader *r, struct strbuf *into);
/* Once the head is in: the body's announced length, or UINT64_MAX (chunked, or to the close). */
uint64_t http_reply_reader_length(const struct http_reply_reader *r);
/*
 * After DONE: whether the connection may carry another exchange: the answer allows it and every
 * byte read was this answer's (bytes after it are an answer to something else).
 */
int http_reply_reader_reusable(const struct http_reply_reader *r);
/* After DONE or TOO_LARGE: moves status, headers and body into `out` (initialised here). */
void http_reply_reader_take(struct http_reply_reader *r, struct http_reply *out);
/* A sentence for HTTP_REPLY_BAD. */
const char *http_reply_reader_error(const struct http_reply_reader *r);
void http_reply_reader_release(struct http_reply_reader *r);

/* ---- the rest of a streamed answer ----------------------------------------------------------- */

struct http_body_stream {
    int fd;               /* the upstream connection, never pooled again */
    struct tls_conn *tls; /* its TLS state, NULL on a plain connection */
    struct http_reply_reader reader;
    int timeout_ms; /* for each stall of the upstream, not for the whole body */
    int done;
};

/*
 * Moves `r` (which said HTTP_REPLY_STREAM, its head and first bytes taken) and the connection
 * `fd` (blocking or not) into a new stream; `r` is left empty.  Steals `tls` (NULL: plain), the
 * connection's TLS state, through which the rest is read.
 */
struct http_body_stream *http_body_stream_new(struct http_reply_reader *r, int fd,
                                              struct tls_conn *tls, int timeout_ms);
/* The body's announced length, or UINT64_MAX (chunked, or until the close). */
uint64_t http_body_stream_length(const struct http_body_stream *st);
/*
 * Appends the body's next bytes to `into`: 1 when some came, 0 when the body is whole, -1 with a
 * sentence in `err` when it ended short (a stall of timeout_ms, a reset, a close).
 */
int http_body_stream_next(struct http_body_stream *st, struct strbuf *into, char *err,
                          size_t errlen);
/*
 * The same without blocking, for an event loop (a struct http_body_source): HTTP_SOURCE_DATA
 * when bytes were appended, HTTP_SOURCE_WAIT when none are there yet (st->fd becomes readable
 * when they are: the stall timeout is the caller's to keep), HTTP_SOURCE_END when the body is
 * whole, HTTP_SOURCE_ERROR with a sentence in `err`.  The descriptor must be non-blocking
 * (http_body_stream_new() makes it so).
 */
enum http_source_step http_body_stream_step(struct http_body_stream *st, struct strbuf *into,
                                            char *err, size_t errlen);
/* Closes the connection and frees; NULL is a no-op. */
void http_body_stream_close(struct http_body_stream *st);

/* ---- fetching from an event loop -------------------------------------------------------- */

struct http_client;

struct http_client_options {
    const char *host; /* resolved once, at http_client_new() */
    uint16_t port;
    int connect_timeout_ms;
    int timeout_ms;            /* from the request written to the end of the answer */
    int max_idle;              /* connections kept per loop between exchanges */
    size_t max_response_bytes; /* a longer body ends the exchange as HTTP_FETCH_TOO_LARGE */
    struct tls_ctx *tls;       /* https: every connection through it (borrowed; NULL: plain) */
};

/* Returns 0 with *out, or -1 with a sentence in `err` (the host does not resolve). */
int http_client_new(const struct http_client_options *opts, struct http_client **out, char *err,
                    size_t errlen);
/* Frees the client; every loop that used it must have stopped. */
void http_client_free(struct http_client *cl);

/* The address resolved at http_client_new(), for a blocking client of the same upstream. */
const struct sockaddr *http_client_address(const struct http_client *cl, socklen_t *len);

struct http_fetch;

/* Told once how an exchange ended, on the loop that started it; `reply` is the callee's. */
typedef void (*http_fetch_done)(void *arg, enum http_fetch_result res, struct http_reply *reply,
                                const char *err);

/* http_fetch_start()'s flags. */
#define HTTP_FETCH_HEAD 1       /* a HEAD request: the answer has no body */
#define HTTP_FETCH_MAY_STREAM 2 /* a body over max_response_bytes comes in reply->rest */
#define HTTP_FETCH_FRESH 4      /* on a new connection, closed after the answer (never pooled) */

/*
 * Sends `head` (the whole request head, CRLFs included) and `body` (both copied) and calls `done`
 * when the exchange ends.  Only on an event-loop thread of an HTTP server; never blocks.  An
 * answer whose body is over `hold_max` bytes (0: max_response_bytes) is HTTP_FETCH_TOO_LARGE --
 * unless HTTP_FETCH_MAY_STREAM: then the exchange ends, as soon as the head is in and the body
 * is known to be over it, as HTTP_FETCH_OK with reply->rest: the rest of the body, read on the
 * loop without blocking (http_body_stream_step) or by a thread that may block.  Returns 0 with
 * *fetch (for http_fetch_cancel, valid until `done` runs), or -1 off a loop thread.
 */
int http_fetch_start(struct http_client *cl, const char *head, size_t head_len, const char *body,
                     size_t body_len, size_t hold_max, unsigned flags, http_fetch_done done,
                     void *arg, struct http_fetch **fetch);

/* Ends an exchange that has not called `done` yet; `done` is then never called. */
void http_fetch_cancel(struct http_fetch *fetch);

#endif /* IDEM_HTTP_HTTP_CLIENT_H */
