/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_client.c - the HTTP layer's client side (http_client.h): the answer reader every client
 * shares, and exchanges started from an event loop that never block it.
 *
 * A connection of a loop's pool is a libuv TCP handle and a timer, owned by that loop's thread:
 * the pool needs no lock once found.  While a connection is idle its read stays armed, so an
 * upstream that closes it (or sends stray bytes) is seen at once and the connection dropped; a
 * request is only written into a connection that was quiet and young a moment ago.
 *
 * Over TLS a new connection runs its handshake first, under the connect timeout, and the request
 * is encrypted only once it is done; every read goes through the engine (tls.h), and only the
 * plaintext it gives counts as the upstream speaking: ciphertext that decrypts to nothing (TLS
 * 1.3's session tickets, which may come while the request is written or the connection is idle)
 * is not an answer.  Ciphertext goes out by writes of its own, each with its buffer.
 */
#include "http_client.h"
#include "ascii.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "loop_internal.h"
#include "util.h"
#include "banned.h"

/* Loops a client keeps pools for (servers run at most 8 loops each; the admin server has one). */
#define MAX_POOLS 16

/* ---- the reply and its reader ---------------------------------------------------------------- */

void http_reply_clear(struct http_reply *reply)
{
    http_body_stream_close(reply->rest);
    free(reply->headers);
    free(reply->store_);
    free(reply->body);
    memset(reply, 0, sizeof *reply);
}

const char *http_reply_header(const struct http_reply *reply, const char *name)
{
    for (size_t i = 0; i < reply->nheaders; i++)
        if (ascii_caseeq(reply->headers[i].name, name))
            return reply->headers[i].value;
    return NULL;
}

/* Appends a piece of a field name or value to the head; -1 once it is over its cap. */
static int add_to_head(struct http_reply_reader *r, const char *at, size_t len)
{
    if (r->head.len + len > HTTP_REPLY_MAX_HEAD) {
        r->too_many = 1;
        return -1;
    }
    strbuf_add(&r->head, at, len);
    return 0;
}

static int on_field(http_parser *hp, const char *at, size_t len)
{
    struct http_reply_reader *r = hp->data;
    if (r->head_done)
        return 0; /* a chunked body's trailer fields: not passed on */
    if (r->in_value || r->nfields == 0) {
        if (r->nfields > 0)
            strbuf_add(&r->head, "", 1); /* ends the last value */
        if (r->nfields == HTTP_REPLY_MAX_HEADERS) {
            r->too_many = 1;
            return -1;
        }
        r->offs[r->nfields][0] = r->head.len;
        r->nfields++;
        r->in_value = 0;
    }
    return add_to_head(r, at, len);
}

static int on_value(http_parser *hp, const char *at, size_t len)
{
    struct http_reply_reader *r = hp->data;
    if (r->head_done)
        return 0;
    if (r->nfields == 0)
        return -1;
    if (!r->in_value) {
        strbuf_add(&r->head, "", 1); /* ends the name */
        r->offs[r->nfields - 1][1] = r->head.len;
        r->in_value = 1;
    }
    return add_to_head(r, at, len);
}

static int on_headers_complete(http_parser *hp)
{
    struct http_reply_reader *r = hp->data;
    if (r->nfields > 0 && !r->in_value)
        return -1; /* a name without a value */
    /* http-parser takes any number of digits ("HTTP/1.1 20 OK"); HTTP says three, 1xx..5xx. */
    if (hp->status_code < 100 || hp->status_code > 599) {
        r->bad_status = 1;
        return -1;
    }
    if (r->nfields > 0)
        strbuf_add(&r->head, "", 1);
    if (hp->content_length != ULLONG_MAX && hp->content_length > r->max_body) {
        if (!r->may_stream) {
            r->too_large = 1;
            return -1;
        }
        r->streaming = 1;
    }
    if (hp->status_code >= 200) {
        r->head_done = 1;
        r->length = r->head_request ? ULLONG_MAX : hp->content_length;
    }
    /* 1 tells http-parser there is no body (HEAD; 1xx, 204 and 304 it knows itself). */
    return r->head_request ? 1 : 0;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    struct http_reply_reader *r = hp->data;
    /* Streaming, the caller takes what each feed decoded: `body` holds one read at most. */
    if (!r->streaming && r->body.len + len > r->max_body) {
        if (!r->may_stream) {
            r->too_large = 1;
            return -1;
        }
        r->streaming = 1;
    }
    strbuf_add(&r->body, at, len);
    return 0;
}

static int on_message_complete(http_parser *hp)
{
    struct http_reply_reader *r = hp->data;
    /* An interim answer (100 Continue, 103 Early Hints) is skipped: the real one follows. */
    if (hp->status_code >= 100 && hp->status_code < 200 && hp->status_code != 101) {
        strbuf_release(&r->head);
        r->nfields = 0;
        r->in_value = 0;
        return 0;
    }
    r->done = 1;
    http_parser_pause(hp, 1);
    return 0;
}

static const http_parser_settings reader_settings = {
    .on_header_field = on_field,
    .on_header_value = on_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void http_reply_reader_init(struct http_reply_reader *r, size_t max_body, int head_request)
{
    memset(r, 0, sizeof *r);
    http_parser_init(&r->hp, HTTP_RESPONSE);
    r->hp.data = r;
    r->max_body = max_body;
    r->head_request = head_request;
}

void http_reply_reader_release(struct http_reply_reader *r)
{
    strbuf_release(&r->head);
    strbuf_release(&r->body);
}

enum http_reply_read http_reply_reader_feed(struct http_reply_reader *r, const char *data,
                                            size_t len)
{
    size_t used = http_parser_execute(&r->hp, &reader_settings, data, len);

    if (r->done) {
        r->trailing = r->trailing || used < len;
        return HTTP_REPLY_DONE;
    }
    if (r->too_large)
        return HTTP_REPLY_TOO_LARGE;
    if (HTTP_PARSER_ERRNO(&r->hp) != HPE_OK || used != len)
        return HTTP_REPLY_BAD;
    if (r->streaming && !r->stream_told) {
        r->stream_told = 1;
        return HTTP_REPLY_STREAM;
    }
    return HTTP_REPLY_MORE;
}

int http_reply_reader_reusable(const struct http_reply_reader *r)
{
    /* Paused right at the end of the answer: a byte after it belongs to no request of ours. */
    return r->done && !r->trailing && http_should_keep_alive(&r->hp);
}

const char *http_reply_reader_error(const struct http_reply_reader *r)
{
    if (r->bad_status)
        return "its status is not a three-digit 1xx..5xx";
    if (r->too_many)
        return "its head is over 64 KiB or 100 fields";
    return http_errno_description(HTTP_PARSER_ERRNO(&r->hp));
}

void http_reply_reader_allow_stream(struct http_reply_reader *r)
{
    r->may_stream = 1;
}

uint64_t http_reply_reader_length(const struct http_reply_reader *r)
{
    return r->head_done && r->length != ULLONG_MAX ? (uint64_t)r->length : UINT64_MAX;
}

void http_reply_reader_take_body(struct http_reply_reader *r, struct strbuf *into)
{
    strbuf_add(into, r->body.buf, r->body.len);
    strbuf_reset(&r->body);
}

void http_reply_reader_take(struct http_reply_reader *r, struct http_reply *out)
{
    size_t len = 0;

    memset(out, 0, sizeof *out);
    out->status = (int)r->hp.status_code;
    out->headers = r->nfields ? xcalloc(r->nfields, sizeof *out->headers) : NULL;
    out->store_ = strbuf_detach(&r->head, &len);
    for (size_t i = 0; i < r->nfields; i++) {
        out->headers[i].name = out->store_ + r->offs[i][0];
        out->headers[i].value = out->store_ + r->offs[i][1];
    }
    out->nheaders = r->nfields;
    if (r->body.len > 0)
        out->body = strbuf_detach(&r->body, &out->body_len);
}

/* ---- the rest of a streamed answer ----------------------------------------------------------- */

struct http_body_stream *http_body_stream_new(struct http_reply_reader *r, int fd,
                                              struct tls_conn *tls, int timeout_ms)
{
    struct http_body_stream *st = xcalloc(1, sizeof *st);
    int flags = fcntl(fd, F_GETFL);

    /* Read by an event loop (http_body_stream_step) or a thread that waits in poll: either way. */
    if (flags >= 0 && !(flags & O_NONBLOCK))
        (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    st->fd = fd;
    st->tls = tls;
    st->reader = *r;
    st->reader.hp.data = &st->reader; /* the parser's callbacks find the reader there */
    st->timeout_ms = timeout_ms;
    memset(r, 0, sizeof *r);
    return st;
}

uint64_t http_body_stream_length(const struct http_body_stream *st)
{
    return http_reply_reader_length(&st->reader);
}

/*
 * Over TLS, read() for the stream: the plaintext the engine has, else the socket's ciphertext
 * put in and tried again.  Returns as read() does: >0 bytes, 0 at the end, -1 with errno
 * (EAGAIN: nothing yet; EPROTO: TLS failed, `err` says why).  What the engine has to send back
 * (an answer to a key update) is written if the socket takes it, and dropped if not: the body is
 * only read from here on.
 */
static ssize_t stream_tls_read(struct http_body_stream *st, char *buf, size_t cap, char *err,
                               size_t errlen)
{
    struct strbuf plain = STRBUF_INIT, out = STRBUF_INIT;
    ssize_t n = -1;

    for (;;) {
        enum tls_step step = tls_conn_read(st->tls, &plain, cap);
        if (tls_conn_take(st->tls, &out) > 0) {
            ssize_t w = write(st->fd, out.buf, out.len);
            (void)w;
            strbuf_reset(&out);
        }
        if (step == TLS_OK) {
            memcpy(buf, plain.buf, plain.len);
            n = (ssize_t)plain.len;
            break;
        }
        if (step == TLS_EOF) {
            n = 0;
            break;
        }
        if (step == TLS_FAIL) {
            snprintf(err, errlen, "reading the body: %s", tls_conn_error(st->tls));
            errno = EPROTO;
            break;
        }
        n = read(st->fd, buf, cap);
        if (n < 0)
            break;
        tls_conn_put(st->tls, buf, (size_t)n);
    }
    strbuf_release(&plain);
    strbuf_release(&out);
    return n;
}

enum http_source_step http_body_stream_step(struct http_body_stream *st, struct strbuf *into,
                                            char *err, size_t errlen)
{
    char buf[65536];

    while (!st->done) {
        ssize_t n = st->tls ? stream_tls_read(st, buf, sizeof buf, err, errlen)
                            : read(st->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return HTTP_SOURCE_WAIT;
        if (n < 0 && errno == EPROTO && st->tls)
            return HTTP_SOURCE_ERROR; /* `err` said it */
        if (n < 0) {
            snprintf(err, errlen, "reading the body: %s", strerror(errno));
            return HTTP_SOURCE_ERROR;
        }
        switch (http_reply_reader_feed(&st->reader, buf, (size_t)n)) {
        case HTTP_REPLY_DONE:
            st->done = 1;
            break;
        case HTTP_REPLY_MORE:
        case HTTP_REPLY_STREAM:
            if (n == 0) {
                snprintf(err, errlen, "the upstream closed the connection within the body");
                return HTTP_SOURCE_ERROR;
            }
            break;
        case HTTP_REPLY_TOO_LARGE:
        case HTTP_REPLY_BAD:
            snprintf(err, errlen, "the upstream's body is not valid HTTP: %s",
                     http_reply_reader_error(&st->reader));
            return HTTP_SOURCE_ERROR;
        }
        if (st->reader.body.len > 0) {
            http_reply_reader_take_body(&st->reader, into);
            return HTTP_SOURCE_DATA;
        }
    }
    return HTTP_SOURCE_END;
}

int http_body_stream_next(struct http_body_stream *st, struct strbuf *into, char *err,
                          size_t errlen)
{
    for (;;) {
        enum http_source_step step = http_body_stream_step(st, into, err, errlen);
        int w;

        if (step == HTTP_SOURCE_DATA)
            return 1;
        if (step == HTTP_SOURCE_END)
            return 0;
        if (step == HTTP_SOURCE_ERROR)
            return -1;
        /* The timeout is per stall, not for the whole body: a large one takes its time. */
        w = fd_wait(st->fd, POLLIN, clock_mono_ms() + st->timeout_ms);
        if (w == 0) {
            snprintf(err, errlen, "the upstream stopped sending the body for %d ms",
                     st->timeout_ms);
            return -1;
        }
        if (w < 0) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            return -1;
        }
    }
}

void http_body_stream_close(struct http_body_stream *st)
{
    if (st == NULL)
        return;
    close(st->fd);
    tls_conn_free(st->tls);
    http_reply_reader_release(&st->reader);
    free(st);
}

/* ---- fetching from an event loop ------------------------------------------------------------- */

struct fconn;

struct loop_pool {
    struct http_client *cl;
    uv_loop_t *loop;
    struct fconn *idle; /* a stack: the most recently used first */
    int nidle;
    int stopped; /* the loop is stopping: connections are closed, not kept */
};

struct http_client {
    struct http_client_options opts;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int loopback;       /* addr is a loopback address: connect_at_once() may connect to it */
    pthread_mutex_t mu; /* guards pools[] and npools (each pool is its loop's alone) */
    struct loop_pool pools[MAX_POOLS];
    int npools;
};

struct fconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_connect_t connect;
    uv_write_t write;
    struct loop_pool *pool;
    struct http_fetch *f; /* the exchange on it; NULL while idle */
    struct fconn *next;   /* in the pool's idle stack */
    int64_t idle_since_ms;
    int closing;
    int reading;           /* the read is armed (it stays armed while idle) */
    int writing;           /* the request is not all written yet */
    int early;             /* answer bytes came while it was: never reused (the upstream may
                              not read the rest of the request, and take it for another) */
    int nclosed;           /* handles closed: the connection is freed at 2 */
    int nodelay;           /* TCP_NODELAY is set */
    char connect_err[120]; /* a connect refused at once, told from the timer */
    int failed_sent;       /* ...or a failure once the request went (connect_at_once): unknown */
    struct http_reply_reader rr;
    struct tls_conn *tls; /* https: its TLS state */
    int handshaking;      /* connected, the TLS handshake not done: nothing of the request sent */
};

/* One write of ciphertext, with its buffer. */
struct tls_write {
    uv_write_t req;
    struct fconn *c;
    char *buf;
    int request; /* it carries the end of the request (the plain connection's c->write) */
};

struct http_fetch {
    struct fconn *c;
    http_fetch_done done;
    void *arg;
    char *out; /* head and body */
    size_t out_len;
    unsigned flags; /* HTTP_FETCH_* */
    size_t hold_max;
    int64_t start_ns;
};

/* Whether `sa` is 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104: this host, over the loopback. */
static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return ((const unsigned char *)&in->sin_addr)[0] == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

int http_client_new(const struct http_client_options *opts, struct http_client **out, char *err,
                    size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    struct http_client *cl;
    char port[8];
    int rc;

    *out = NULL;
    snprintf(port, sizeof port, "%u", (unsigned)opts->port);
    rc = getaddrinfo(opts->host, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "upstream host %s: %s", opts->host, gai_strerror(rc));
        return -1;
    }
    cl = xcalloc(1, sizeof *cl);
    cl->opts = *opts;
    cl->opts.host = NULL; /* not kept: the address is */
    memcpy(&cl->addr, res->ai_addr, res->ai_addrlen);
    cl->addr_len = res->ai_addrlen;
    cl->loopback = is_loopback((const struct sockaddr *)&cl->addr);
    freeaddrinfo(res);
    pthread_mutex_init(&cl->mu, NULL);
    *out = cl;
    return 0;
}

const struct sockaddr *http_client_address(const struct http_client *cl, socklen_t *len)
{
    *len = cl->addr_len;
    return (const struct sockaddr *)&cl->addr;
}

void http_client_free(struct http_client *cl)
{
    if (!cl)
        return;
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}

static void fconn_closed(uv_handle_t *h)
{
    struct fconn *c = h->data;
    if (++c->nclosed < 2)
        return;
    tls_conn_free(c->tls);
    http_reply_reader_release(&c->rr);
    free(c);
}

/* Takes `c` out of its pool's idle stack, if it is there. */
static void pool_unlink(struct fconn *c)
{
    struct fconn **pp = &c->pool->idle;

    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = c->next;
        c->pool->nidle--;
    }
    c->next = NULL;
}

static void fconn_close(struct fconn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    pool_unlink(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    http_close_fd_handle((uv_handle_t *)&c->tcp, fconn_closed);
    uv_close((uv_handle_t *)&c->timer, fconn_closed);
}

/* Closes every idle connection of a stopping loop (registered with http_loop_at_stop). */
static void pool_stop(void *arg)
{
    struct loop_pool *p = arg;

    p->stopped = 1;
    while (p->idle)
        fconn_close(p->idle);
}

/* The calling loop's pool of `cl`, made on first use. */
static struct loop_pool *pool_here(struct http_client *cl, uv_loop_t *loop)
{
    struct loop_pool *p = NULL;

    pthread_mutex_lock(&cl->mu);
    for (int i = 0; i < cl->npools && !p; i++)
        if (cl->pools[i].loop == loop)
            p = &cl->pools[i];
    if (!p && cl->npools < MAX_POOLS) {
        p = &cl->pools[cl->npools++];
        p->cl = cl;
        p->loop = loop;
        if (http_loop_at_stop(pool_stop, p) != 0)
            p->stopped = 1; /* no hook: keep nothing, so nothing outlives the loop */
    }
    pthread_mutex_unlock(&cl->mu);
    return p;
}

/* Ends the exchange: the connection is detached from it and `done` told. */
static void finish(struct http_fetch *f, enum http_fetch_result res, struct http_reply *reply,
                   const char *err)
{
    struct http_reply empty;

    if (f->c)
        f->c->f = NULL;
    f->c = NULL;
    if (!reply) {
        memset(&empty, 0, sizeof empty);
        reply = &empty;
    }
    reply->seconds = f->start_ns ? (double)(clock_mono_ns() - f->start_ns) / 1e9 : 0;
    f->done(f->arg, res, reply, err);
    free(f->out);
    free(f);
}

/* Fails the exchange on `c` and closes the connection. */
static void fail(struct fconn *c, enum http_fetch_result res, int timed_out, const char *err)
{
    struct http_fetch *f = c->f;
    struct http_reply reply;

    fconn_close(c);
    if (!f)
        return;
    memset(&reply, 0, sizeof reply);
    reply.timed_out = timed_out;
    finish(f, res, &reply, err);
    http_reply_clear(&reply);
}

/* The TLS handshake failed: nothing of the request was sent (reply->tls_failed). */
static void fail_tls(struct fconn *c, const char *err)
{
    struct http_fetch *f = c->f;
    struct http_reply reply;

    fconn_close(c);
    if (!f)
        return;
    memset(&reply, 0, sizeof reply);
    reply.tls_failed = 1;
    finish(f, HTTP_FETCH_NOT_SENT, &reply, err);
    http_reply_clear(&reply);
}

static void on_timeout(uv_timer_t *t)
{
    struct fconn *c = t->data;
    if (!c->f)
        return;
    if (c->handshaking)
        fail(c, HTTP_FETCH_NOT_SENT, 0,
             "TLS: the handshake did not end within the connect timeout");
    else if (c->failed_sent)
        fail(c, HTTP_FETCH_UNKNOWN, 0, c->connect_err);
    else if (c->f->start_ns == 0)
        fail(c, HTTP_FETCH_NOT_SENT, 0, c->connect_err[0] ? c->connect_err : "connect: timed out");
    else
        fail(c, HTTP_FETCH_UNKNOWN, 1, "no whole answer within the upstream timeout");
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static _Thread_local char chunk[65536];
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(chunk, sizeof chunk);
}

/* Back to the pool if the answer left the connection clean, else closed. */
static void release(struct fconn *c, int reusable)
{
    struct loop_pool *p = c->pool;

    uv_timer_stop(&c->timer);
    if (!reusable || p->stopped ||
        p->nidle >= (p->cl->opts.max_idle > 0 ? p->cl->opts.max_idle : 1)) {
        fconn_close(c);
        return;
    }
    c->idle_since_ms = clock_mono_ms();
    c->next = p->idle;
    p->idle = c;
    p->nidle++;
}

/*
 * What the upstream said on `c`: `nread` bytes of `data` (plaintext over TLS), or its end
 * (UV_EOF), or a read error (another negative).
 */
static void answer_bytes(struct fconn *c, const char *data, ssize_t nread)
{
    struct http_fetch *f = c->f;
    struct http_reply reply;
    enum http_reply_read r;
    char err[200];

    if (!f) {
        fconn_close(c); /* idle: the upstream closed it, or spoke out of turn */
        return;
    }
    if (nread < 0 && nread != UV_EOF) {
        snprintf(err, sizeof err, "reading the answer: %s", uv_strerror((int)nread));
        fail(c, HTTP_FETCH_UNKNOWN, 0, err);
        return;
    }
    if (c->writing && nread > 0)
        c->early = 1;
    r = http_reply_reader_feed(&c->rr, data, nread < 0 ? 0 : (size_t)nread);
    switch (r) {
    case HTTP_REPLY_MORE:
        if (nread < 0)
            fail(c, HTTP_FETCH_UNKNOWN, 0,
                 "the upstream closed the connection before a whole answer");
        return;
    case HTTP_REPLY_DONE:
        http_reply_reader_take(&c->rr, &reply);
        release(c, nread > 0 && !c->early && !(f->flags & HTTP_FETCH_FRESH) &&
                       http_reply_reader_reusable(&c->rr));
        finish(f, HTTP_FETCH_OK, &reply, "");
        http_reply_clear(&reply);
        return;
    case HTTP_REPLY_STREAM: {
        /* The rest is read from the socket apart (a dup): it goes along, the handle closes. */
        uv_os_fd_t fd = -1;
        http_reply_reader_take(&c->rr, &reply);
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 && (fd = http_fd_dup(fd)) >= 0)
            (void)fcntl(fd, F_SETFD, FD_CLOEXEC); /* as every other descriptor here */
        if (fd < 0) {
            http_reply_clear(&reply);
            fail(c, HTTP_FETCH_UNKNOWN, 0, "cannot keep the upstream connection for the body");
            return;
        }
        reply.rest = http_body_stream_new(&c->rr, fd, c->tls, c->pool->cl->opts.timeout_ms);
        c->tls = NULL; /* the stream's now, with what it holds of the body */
        fconn_close(c);
        finish(f, HTTP_FETCH_OK, &reply, "");
        http_reply_clear(&reply);
        return;
    }
    case HTTP_REPLY_TOO_LARGE:
        http_reply_reader_take(&c->rr, &reply);
        fconn_close(c);
        snprintf(err, sizeof err, "the answer's body is over %zu bytes", c->rr.max_body);
        finish(f, HTTP_FETCH_TOO_LARGE, &reply, err);
        http_reply_clear(&reply);
        return;
    case HTTP_REPLY_BAD:
        snprintf(err, sizeof err, "the upstream's answer is not valid HTTP: %s",
                 http_reply_reader_error(&c->rr));
        fail(c, HTTP_FETCH_BAD_REPLY, 0, err);
        return;
    }
}

/* The request's last write ended with `status`. */
static void request_written(struct fconn *c, int status)
{
    char err[200];

    c->writing = 0;
    if (c->closing || status == 0)
        return;
    snprintf(err, sizeof err, "sending the request: %s", uv_strerror(status));
    fail(c, HTTP_FETCH_UNKNOWN, 0, err);
}

static void write_cb(uv_write_t *w, int status)
{
    request_written(w->data, status);
}

static void send_on(struct fconn *c);

static void tls_write_cb(uv_write_t *req, int status)
{
    struct tls_write *w = req->data;
    struct fconn *c = w->c;
    int request = w->request;
    char err[200];

    free(w->buf);
    free(w);
    if (request && status < 0 && !c->closing && tls_conn_bytes_read(c->tls) == 0 &&
        !tls_conn_resumed(c->tls)) {
        /*
         * A server that refused our certificate (TLS 1.3) resets the connection after its alert:
         * the read, armed, finds the alert first and says "nothing sent", or the reset.
         */
        c->writing = 0;
        return;
    }
    if (request) {
        request_written(c, status);
        return;
    }
    if (status == 0 || c->closing)
        return;
    /* A handshake flight, or the engine's own answer after the request. */
    snprintf(err, sizeof err, "TLS: sending: %s", uv_strerror(status));
    fail(c, c->f && c->f->start_ns == 0 ? HTTP_FETCH_NOT_SENT : HTTP_FETCH_UNKNOWN, 0, err);
}

/* Writes what ciphertext the engine has; `request`: it ends the request.  uv_write's status. */
static int tls_flush(struct fconn *c, int request)
{
    struct strbuf out = STRBUF_INIT;
    struct tls_write *w;
    uv_buf_t buf;
    size_t len = 0;
    int rc;

    if (tls_conn_take(c->tls, &out) == 0)
        return 0;
    w = xcalloc(1, sizeof *w);
    w->c = c;
    w->request = request;
    w->req.data = w;
    w->buf = strbuf_detach(&out, &len);
    buf = uv_buf_init(w->buf, (unsigned int)len);
    rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, tls_write_cb);
    if (rc < 0) {
        free(w->buf);
        free(w);
    }
    return rc;
}

/* Moves the handshake on; once done, the request goes. */
static void handshake_step(struct fconn *c)
{
    enum tls_step step = tls_conn_handshake(c->tls);
    int rc = tls_flush(c, 0);
    char err[300];

    if (step == TLS_FAIL) {
        snprintf(err, sizeof err, "%s", tls_conn_error(c->tls));
        fail_tls(c, err);
        return;
    }
    if (rc < 0) {
        snprintf(err, sizeof err, "TLS: sending the handshake: %s", uv_strerror(rc));
        fail(c, HTTP_FETCH_NOT_SENT, 0, err);
        return;
    }
    if (step == TLS_OK) {
        c->handshaking = 0;
        uv_timer_stop(&c->timer);
        send_on(c);
    }
}

/* Ciphertext (or the end, or an error) read on a TLS connection. */
static void tls_read(struct fconn *c, ssize_t nread, const uv_buf_t *buf)
{
    struct strbuf plain = STRBUF_INIT;
    enum tls_step step;
    char err[300];

    if (nread < 0 && nread != UV_EOF) {
        if (c->handshaking) {
            snprintf(err, sizeof err, "TLS: the handshake: %s", uv_strerror((int)nread));
            fail(c, HTTP_FETCH_NOT_SENT, 0, err);
        } else {
            answer_bytes(c, NULL, nread);
        }
        return;
    }
    tls_conn_put(c->tls, buf->base, nread < 0 ? 0 : (size_t)nread);
    if (c->handshaking) {
        handshake_step(c);
        return;
    }
    for (;;) {
        step = tls_conn_read(c->tls, &plain, (size_t)1 << 20);
        if (step != TLS_OK)
            break;
        answer_bytes(c, plain.buf, (ssize_t)plain.len);
        strbuf_reset(&plain);
        if (c->closing || !c->tls)
            break;
    }
    strbuf_release(&plain);
    if (c->closing || !c->tls)
        return;
    (void)tls_flush(c, 0); /* a failure is told by its callback */
    if (step == TLS_EOF) {
        answer_bytes(c, NULL, UV_EOF);
    } else if (step == TLS_FAIL) {
        if (!c->f) {
            fconn_close(c);
        } else if (tls_conn_failed_in_handshake(c->tls)) {
            /* TLS 1.3: the server refused the client's certificate, and never read the request. */
            snprintf(err, sizeof err, "%s", tls_conn_error(c->tls));
            fail_tls(c, err);
        } else {
            snprintf(err, sizeof err, "reading the answer: %s", tls_conn_error(c->tls));
            fail(c, HTTP_FETCH_UNKNOWN, 0, err);
        }
    }
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct fconn *c = s->data;

    if (nread == 0)
        return;
    if (c->tls)
        tls_read(c, nread, buf);
    else
        answer_bytes(c, buf->base, nread);
}

/* Sets TCP_NODELAY on a plain connection, once. */
static void nodelay_on(struct fconn *c)
{
    if (!c->nodelay)
        uv_tcp_nodelay(&c->tcp, 1);
    c->nodelay = 1;
}

/* Makes `c` ready to read the answer to its exchange's request, which goes now (at `start_ns`). */
static void exchange_begin(struct fconn *c, int64_t start_ns)
{
    struct http_fetch *f = c->f;

    http_reply_reader_release(&c->rr);
    http_reply_reader_init(&c->rr, f->hold_max, (f->flags & HTTP_FETCH_HEAD) != 0);
    if (f->flags & HTTP_FETCH_MAY_STREAM)
        http_reply_reader_allow_stream(&c->rr);
    f->start_ns = start_ns;
}

/* The request went (or is queued): the answer's timeout, and the read armed.  0 or libuv's code. */
static int answer_wait(struct fconn *c)
{
    int rc;

    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->pool->cl->opts.timeout_ms, 0);
    if (c->reading)
        return 0;
    rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc == 0)
        c->reading = 1;
    return rc;
}

/* Writes the request on a connected `c` and waits for the answer. */
static void send_on(struct fconn *c)
{
    struct http_fetch *f = c->f;
    uv_buf_t buf = uv_buf_init(f->out, (unsigned int)f->out_len);
    char err[200];
    int rc;

    exchange_begin(c, clock_mono_ns());
    c->writing = 1;
    if (!c->tls) {
        /*
         * Straight into the kernel when it takes the whole request, as it nearly always does: a
         * uv_write() done at once still costs the loop an epoll_ctl() at its next poll (libuv
         * re-registers a descriptor whose output watcher it stopped).  A failure, or what the
         * kernel did not take, goes through uv_write, whose callback says how it ended.
         *
         * One write leaves nothing for Nagle's algorithm to hold back (it holds a small segment
         * only while an earlier one is unacknowledged, and the last answer acknowledged the last
         * request), so TCP_NODELAY is set only when the request takes more than one.
         */
        int n = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);

        if (n == (int)buf.len) {
            c->writing = 0;
            rc = 0;
        } else {
            if (n > 0)
                buf = uv_buf_init(buf.base + n, buf.len - (unsigned int)n);
            nodelay_on(c);
            rc = uv_write(&c->write, (uv_stream_t *)&c->tcp, &buf, 1, write_cb);
        }
    } else if (tls_conn_write(c->tls, f->out, f->out_len) != 0)
        rc = UV_EPROTO;
    else
        rc = tls_flush(c, 1);
    if (rc < 0) {
        /* Refused before a byte was queued: the upstream saw nothing. */
        c->writing = 0;
        f->start_ns = 0;
        snprintf(err, sizeof err, "sending the request: %s", uv_strerror(rc));
        fail(c, HTTP_FETCH_NOT_SENT, 0, err);
        return;
    }
    rc = answer_wait(c);
    if (rc < 0) {
        snprintf(err, sizeof err, "reading the answer: %s", uv_strerror(rc));
        fail(c, HTTP_FETCH_UNKNOWN, 0, err);
    }
}

/*
 * A new plain connection to an upstream on this host, its request written in the same turn of
 * the loop.  On the loopback the kernel runs both ends of the handshake within connect() (which
 * still says EINPROGRESS), so the request can go at once rather than a turn of the loop later,
 * when libuv has seen the connect complete: that saves the loop a wake-up and three system calls
 * (the connect's SO_ERROR, and an epoll_ctl() each to watch for it and to stop watching), which
 * a keyed request's fresh connection pays every time.  The socket becomes the connection's only
 * once the kernel took some of the request.  If it took none (the handshake has not ended: the
 * listener's queue is full, or the connect was refused), nothing was sent: the socket is closed
 * and 0 returned, and the caller connects the ordinary way, which waits for the connect under
 * its timeout and says how it failed.  Returns 1 once the request went (the rest of it, if any,
 * queued); a failure after that is told by the timer, at once, as HTTP_FETCH_UNKNOWN.
 */
static int connect_at_once(struct fconn *c)
{
    struct http_client *cl = c->pool->cl;
    struct http_fetch *f = c->f;
    int64_t start_ns = clock_mono_ns();
    uv_buf_t rest;
    ssize_t n;
    int fd, rc;

    if (!cl->loopback || cl->opts.tls)
        return 0;
    fd = socket(cl->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    if (connect(fd, (const struct sockaddr *)&cl->addr, cl->addr_len) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return 0;
    }
    do
        n = send(fd, f->out, f->out_len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
        close(fd);
        return 0;
    }
    exchange_begin(c, start_ns);
    rc = uv_tcp_open(&c->tcp, fd);
    if (rc < 0) {
        close(fd);
        goto failed;
    }
    if ((size_t)n < f->out_len) {
        rest = uv_buf_init(f->out + n, (unsigned int)(f->out_len - (size_t)n));
        nodelay_on(c);
        c->writing = 1;
        rc = uv_write(&c->write, (uv_stream_t *)&c->tcp, &rest, 1, write_cb);
        if (rc < 0) {
            c->writing = 0;
            goto failed;
        }
    }
    rc = answer_wait(c);
    if (rc == 0)
        return 1;
failed:
    /* `done` may not run inside the caller's own call: the timer tells it, at once. */
    c->failed_sent = 1;
    snprintf(c->connect_err, sizeof c->connect_err, "sending the request: %s", uv_strerror(rc));
    uv_timer_start(&c->timer, on_timeout, 0, 0);
    return 1;
}

static void connect_cb(uv_connect_t *req, int status)
{
    struct fconn *c = req->data;
    char err[200];
    int rc;

    if (c->closing)
        return;
    uv_timer_stop(&c->timer);
    if (status < 0) {
        snprintf(err, sizeof err, "connect: %s", uv_strerror(status));
        fail(c, HTTP_FETCH_NOT_SENT, 0, err);
        return;
    }
    if (!c->pool->cl->opts.tls) {
        send_on(c);
        return;
    }
    nodelay_on(c); /* the handshake's flights, then the request: several writes */
    /* The handshake, then the request: its own deadline, the connect's. */
    c->tls = tls_conn_new(c->pool->cl->opts.tls);
    c->handshaking = 1;
    if (!c->reading) {
        rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
        if (rc < 0) {
            snprintf(err, sizeof err, "TLS: reading the handshake: %s", uv_strerror(rc));
            fail(c, HTTP_FETCH_NOT_SENT, 0, err);
            return;
        }
        c->reading = 1;
    }
    uv_timer_start(&c->timer, on_timeout, (uint64_t)c->pool->cl->opts.connect_timeout_ms, 0);
    handshake_step(c);
}

/* A pooled connection fit for a request: young (its read is armed, so a close was seen). */
static struct fconn *take_idle(struct loop_pool *p)
{
    int64_t now = clock_mono_ms();

    while (p->idle) {
        struct fconn *c = p->idle;
        p->idle = c->next;
        p->nidle--;
        c->next = NULL;
        if (now - c->idle_since_ms <= HTTP_CLIENT_IDLE_REUSE_MS)
            return c;
        fconn_close(c);
    }
    return NULL;
}

int http_fetch_start(struct http_client *cl, const char *head, size_t head_len, const char *body,
                     size_t body_len, size_t hold_max, unsigned flags, http_fetch_done done,
                     void *arg, struct http_fetch **fetch)
{
    uv_loop_t *loop = http_loop_current();
    struct loop_pool *p;
    struct http_fetch *f;
    struct fconn *c;
    int rc;

    *fetch = NULL;
    if (!loop)
        return -1;
    p = pool_here(cl, loop);
    if (!p)
        return -1;
    f = xcalloc(1, sizeof *f);
    f->done = done;
    f->arg = arg;
    f->flags = flags;
    f->hold_max = hold_max ? hold_max : cl->opts.max_response_bytes;
    f->out_len = head_len + body_len;
    f->out = xmalloc(f->out_len + 1);
    memcpy(f->out, head, head_len);
    if (body_len)
        memcpy(f->out + head_len, body, body_len);
    *fetch = f;

    c = (flags & HTTP_FETCH_FRESH) ? NULL : take_idle(p);
    if (c) {
        c->f = f;
        f->c = c;
        send_on(c);
        return 0;
    }
    c = xcalloc(1, sizeof *c);
    c->pool = p;
    c->f = f;
    f->c = c;
    uv_tcp_init(loop, &c->tcp);
    uv_timer_init(loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->connect.data = c;
    c->write.data = c;
    if (connect_at_once(c))
        return 0;
    rc = uv_tcp_connect(&c->connect, &c->tcp, (const struct sockaddr *)&cl->addr, connect_cb);
    if (rc < 0) {
        /* `done` may not run inside the caller's own call: the timer tells it, at once. */
        snprintf(c->connect_err, sizeof c->connect_err, "connect: %s", uv_strerror(rc));
        uv_timer_start(&c->timer, on_timeout, 0, 0);
        return 0;
    }
    /*
     * The read armed with the connect: the descriptor enters the loop's epoll set once, for both,
     * instead of once for the connect and again (EEXIST, then a modify) for the answer.  libuv
     * calls nothing but connect_cb until the connect ends.
     */
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) == 0)
        c->reading = 1;
    uv_timer_start(&c->timer, on_timeout, (uint64_t)cl->opts.connect_timeout_ms, 0);
    return 0;
}

void http_fetch_cancel(struct http_fetch *f)
{
    if (!f)
        return;
    if (f->c) {
        f->c->f = NULL;
        fconn_close(f->c);
    }
    free(f->out);
    free(f);
}
