/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upstream.c - the gateway's HTTP/1.1 client of its one upstream (upstream.h).  On a worker:
 * connect with a deadline, write the request, read the answer with the HTTP layer's reader, keep
 * the connection for the next exchange when both sides allow it.  From an event loop: the same
 * request head, handed to the HTTP layer's non-blocking client (http_client.c).
 *
 * Every socket is non-blocking and every wait is a poll() against the exchange's deadline, so a
 * silent upstream costs a worker at most connect_timeout_ms + timeout_ms.
 *
 * Over TLS (an https upstream) a worker's connection runs its handshake within the connect
 * timeout, before a byte of the request is encrypted, so a refused certificate is "nothing sent";
 * then every byte goes through the engine of tls.h (struct conn below), and only plaintext counts
 * as the upstream answering: TLS 1.3's session tickets, which come after the handshake, while the
 * request is written or the connection idles, are not an answer.  Both kinds of exchange share
 * one TLS context, so a session one connection got, another resumes.
 */
#include "upstream.h"
#include "ascii.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

/*
 * A pooled connection older than this is closed rather than reused: upstreams close idle
 * keep-alive connections after a few seconds (Node.js after 5), and a request written into a
 * connection the upstream is closing at that moment ends as HTTP_FETCH_UNKNOWN for no good reason.
 */
#define IDLE_REUSE_MS HTTP_CLIENT_IDLE_REUSE_MS

/* A worker's connection: the socket, and its TLS state over https. */
struct conn {
    int fd;
    struct tls_conn *tls;
};

struct idle_conn {
    struct conn c;
    int64_t since_ms;
};

struct upstream {
    struct http_client_options opts;
    const struct sockaddr *addr; /* resolved by `async`, shared */
    socklen_t addr_len;
    char host_header[300]; /* "127.0.0.1:9000", for requests that come without Host */
    int own_host;          /* host_header replaces the caller's Host (upstream_set_host) */

    pthread_mutex_t lock;
    struct idle_conn *idle; /* a stack: the most recently used is reused first */
    int nidle;

    struct http_client *async; /* the same upstream, from the event loops */
};

int upstream_new(const struct http_client_options *opts, struct upstream **out, char *err,
                 size_t errlen)
{
    struct upstream *up = xcalloc(1, sizeof *up);

    *out = NULL;
    if (http_client_new(opts, &up->async, err, errlen) != 0) {
        free(up);
        return -1;
    }
    up->opts = *opts;
    up->opts.host = NULL; /* not kept: the address is */
    up->addr = http_client_address(up->async, &up->addr_len);
    if (strchr(opts->host, ':'))
        snprintf(up->host_header, sizeof up->host_header, "[%s]:%u", opts->host,
                 (unsigned)opts->port);
    else
        snprintf(up->host_header, sizeof up->host_header, "%s:%u", opts->host,
                 (unsigned)opts->port);
    up->idle = xcalloc((size_t)(opts->max_idle > 0 ? opts->max_idle : 1), sizeof *up->idle);
    pthread_mutex_init(&up->lock, NULL);
    *out = up;
    return 0;
}

static void conn_close(struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    tls_conn_free(c->tls);
    c->fd = -1;
    c->tls = NULL;
}

/*
 * Over TLS, reads what ciphertext the socket has into the engine and decrypts it, appending at
 * most PULL_MAX bytes of plaintext to `plain`.  Returns the engine's step (TLS_WANT when the
 * socket had no more), or TLS_FAIL with errno set when the socket failed (the engine's reason
 * empty).  What the engine has to send back is appended to `out` when the caller is writing
 * (so that it follows the records already there), else written if the socket takes it.
 */
#define PULL_MAX 16384
static enum tls_step tls_pull(struct conn *c, struct strbuf *plain, struct strbuf *out)
{
    struct strbuf mine = STRBUF_INIT;
    enum tls_step step;
    char buf[PULL_MAX];
    int e = 0;

    for (;;) {
        ssize_t n;
        step = tls_conn_read(c->tls, plain, PULL_MAX);
        if (step != TLS_WANT)
            break;
        n = read(c->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n < 0) {
            e = errno;
            step = TLS_FAIL;
            break;
        }
        tls_conn_put(c->tls, buf, (size_t)n);
    }
    if (out != NULL) {
        tls_conn_take(c->tls, out);
    } else if (tls_conn_take(c->tls, &mine) > 0) {
        ssize_t w = write(c->fd, mine.buf, mine.len);
        (void)w;
    }
    strbuf_release(&mine);
    errno = e;
    return step;
}

void upstream_set_host(struct upstream *up, const char *host)
{
    snprintf(up->host_header, sizeof up->host_header, "%s", host);
    up->own_host = 1;
}

void upstream_free(struct upstream *up)
{
    if (!up)
        return;
    for (int i = 0; i < up->nidle; i++)
        conn_close(&up->idle[i].c);
    free(up->idle);
    pthread_mutex_destroy(&up->lock);
    http_client_free(up->async);
    free(up);
}

/*
 * A pooled connection still fit for a request: young, and nothing to read on it (an EOF or stray
 * bytes mean the upstream is closing it or broke the protocol).
 */
static int idle_usable(struct idle_conn *ic, int64_t now)
{
    struct pollfd p = {.fd = ic->c.fd, .events = POLLIN};
    struct strbuf plain = STRBUF_INIT;
    int usable;

    if (now - ic->since_ms > IDLE_REUSE_MS)
        return 0;
    if (poll(&p, 1, 0) == 0)
        return 1;
    if (!ic->c.tls)
        return 0;
    /* Ciphertext that decrypts to nothing (a session ticket) leaves it quiet. */
    usable = tls_pull(&ic->c, &plain, NULL) == TLS_WANT && plain.len == 0;
    strbuf_release(&plain);
    return usable;
}

/* A pooled connection fit for a request, or one with fd -1. */
static struct conn take_idle(struct upstream *up)
{
    int64_t now = clock_mono_ms();
    struct conn c = {.fd = -1};

    pthread_mutex_lock(&up->lock);
    while (up->nidle > 0 && c.fd < 0) {
        struct idle_conn ic = up->idle[--up->nidle];
        if (idle_usable(&ic, now))
            c = ic.c;
        else
            conn_close(&ic.c);
    }
    pthread_mutex_unlock(&up->lock);
    return c;
}

static void give_back(struct upstream *up, struct conn *c)
{
    pthread_mutex_lock(&up->lock);
    if (up->nidle < (up->opts.max_idle > 0 ? up->opts.max_idle : 1)) {
        up->idle[up->nidle].c = *c;
        up->idle[up->nidle].since_ms = clock_mono_ms();
        up->nidle++;
        c->fd = -1;
        c->tls = NULL;
    }
    pthread_mutex_unlock(&up->lock);
    conn_close(c);
}

/* A new connection, or -1 with `err` set: nothing was sent on it. */
static int connect_new(struct upstream *up, char *err, size_t errlen)
{
    int fd = socket(up->addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    int w;

    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, up->addr, up->addr_len) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        snprintf(err, errlen, "connect to %s: %s", up->host_header, strerror(errno));
        goto fail;
    }
    w = fd_wait(fd, POLLOUT, clock_mono_ms() + up->opts.connect_timeout_ms);
    if (w <= 0) {
        snprintf(err, errlen, "connect to %s: %s", up->host_header,
                 w == 0 ? "timed out" : strerror(errno));
        goto fail;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
        snprintf(err, errlen, "connect to %s: %s", up->host_header,
                 strerror(soerr ? soerr : errno));
        goto fail;
    }
    return fd;
fail:
    close(fd);
    return -1;
}

/* Writes all of `len` bytes by `deadline`: 0, or -1 (errno). */
static int send_all(int fd, const char *data, size_t len, int64_t deadline)
{
    while (len > 0) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            int r = fd_wait(fd, POLLOUT, deadline);
            if (r <= 0) {
                if (r == 0)
                    errno = ETIMEDOUT;
                return -1;
            }
            continue;
        }
        if (w < 0)
            return -1;
        data += w;
        len -= (size_t)w;
    }
    return 0;
}

/*
 * The TLS handshake on the new connection `c`, by `deadline`: 0, or -1 with `err` (*refused: the
 * certificate or the name did not verify, or the server refused us, rather than a cut or a
 * timeout).  Nothing of a request is sent before it is done.
 */
static int tls_handshake(struct upstream *up, struct conn *c, int64_t deadline, int *refused,
                         char *err, size_t errlen)
{
    struct strbuf out = STRBUF_INIT;
    char buf[PULL_MAX];
    int rc = -1;

    c->tls = tls_conn_new(up->opts.tls);
    for (;;) {
        enum tls_step step = tls_conn_handshake(c->tls);
        ssize_t n;
        if (tls_conn_take(c->tls, &out) > 0 && send_all(c->fd, out.buf, out.len, deadline) != 0 &&
            step != TLS_FAIL) {
            snprintf(err, errlen, "TLS: sending the handshake to %s: %s", up->host_header,
                     strerror(errno));
            goto out;
        }
        strbuf_reset(&out);
        if (step == TLS_OK)
            break;
        if (step == TLS_FAIL) {
            snprintf(err, errlen, "%s (upstream %s)", tls_conn_error(c->tls), up->host_header);
            *refused = 1;
            goto out;
        }
        n = read(c->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int w = fd_wait(c->fd, POLLIN, deadline);
            if (w == 0) {
                snprintf(err, errlen,
                         "TLS: the handshake with %s did not end within the connect "
                         "timeout",
                         up->host_header);
                goto out;
            }
            if (w < 0) {
                snprintf(err, errlen, "poll: %s", strerror(errno));
                goto out;
            }
            continue;
        }
        if (n < 0) {
            snprintf(err, errlen, "TLS: the handshake with %s: %s", up->host_header,
                     strerror(errno));
            goto out;
        }
        tls_conn_put(c->tls, buf, (size_t)n); /* 0: the end, which fails the handshake */
    }
    rc = 0;
out:
    strbuf_release(&out);
    return rc;
}

/* A new connection, its TLS handshake done over https; -1 with `err`: nothing was sent on it. */
static int open_conn(struct upstream *up, struct conn *c, int *tls_refused, char *err,
                     size_t errlen)
{
    c->tls = NULL;
    c->fd = connect_new(up, err, errlen);
    if (c->fd < 0)
        return -1;
    if (up->opts.tls != NULL && tls_handshake(up, c, clock_mono_ms() + up->opts.connect_timeout_ms,
                                              tls_refused, err, errlen) != 0) {
        conn_close(c);
        return -1;
    }
    return 0;
}

/* The request head: method, target, the caller's headers, Content-Length, Connection. */
static void build_head(const struct upstream *up, const struct upstream_request *rq,
                       struct strbuf *out)
{
    int has_host = 0;

    strbuf_addf(out, "%s %s HTTP/1.1\r\n", rq->method, rq->target);
    for (size_t i = 0; i < rq->nheaders; i++) {
        if (ascii_caseeq(rq->headers[i].name, "Host") && up->own_host)
            continue;
        if (ascii_caseeq(rq->headers[i].name, "Host"))
            has_host = 1;
        strbuf_adds(out, rq->headers[i].name);
        strbuf_add(out, ": ", 2);
        strbuf_adds(out, rq->headers[i].value);
        strbuf_add(out, "\r\n", 2);
    }
    if (!has_host)
        strbuf_addf(out, "Host: %s\r\n", up->host_header);
    if (rq->body_len > 0 || (strcmp(rq->method, "GET") != 0 && strcmp(rq->method, "HEAD") != 0))
        strbuf_addf(out, "Content-Length: %zu\r\n", rq->body_len);
    /*
     * A connection of its own is closed after the answer: said, so the upstream closes first and
     * the wait of a closed connection (TIME_WAIT) is its, not the gateway's, whose ports to the
     * upstream would run out at a few hundred keyed requests a second.
     */
    if (rq->fresh_connection)
        strbuf_adds(out, "Connection: close\r\n");
    strbuf_add(out, "\r\n", 2);
}

/*
 * Writes all of `iov`: 0, or 1 when the upstream began to answer before all of it was written (the
 * rest is not sent: the answer is read, and the connection is not reused, as the upstream may
 * take what it did not read for another request), or -1 (errno).  *sent: the bytes written.
 */
static int write_all(int fd, struct iovec *iov, int n, int64_t deadline, size_t *sent)
{
    *sent = 0;
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            struct pollfd answer = {.fd = fd, .events = POLLIN};
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                int r = fd_wait(fd, POLLOUT | POLLIN, deadline);
                if (r <= 0) {
                    if (r == 0)
                        errno = ETIMEDOUT;
                    return -1;
                }
                if (poll(&answer, 1, 0) > 0)
                    return 1;
                continue;
            }
            return -1;
        }
        *sent += (size_t)w;
        iov_advance(&iov, &n, (size_t)w);
    }
    return 0;
}

/*
 * Over TLS, writes all of `iov` encrypted, as write_all() does: 0, 1 when the upstream began to
 * answer (plaintext came, now in `plain`, or the connection ended), or -1 (errno).  *sent: the
 * ciphertext bytes written.
 */
static int tls_write_all(struct conn *c, const struct iovec *iov, int n, int64_t deadline,
                         size_t *sent, struct strbuf *plain)
{
    struct strbuf out = STRBUF_INIT;
    size_t off = 0;
    int rc = 0;

    *sent = 0;
    for (int i = 0; i < n; i++) {
        if (iov[i].iov_len > 0 && tls_conn_write(c->tls, iov[i].iov_base, iov[i].iov_len) != 0) {
            errno = EPROTO;
            rc = -1;
            goto out;
        }
    }
    tls_conn_take(c->tls, &out);
    while (off < out.len) {
        ssize_t w = write(c->fd, out.buf + off, out.len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd answer = {.fd = c->fd, .events = POLLIN};
            int r = fd_wait(c->fd, POLLOUT | POLLIN, deadline);
            if (r <= 0) {
                if (r == 0)
                    errno = ETIMEDOUT;
                rc = -1;
                goto out;
            }
            /* A session ticket decrypts to nothing: only plaintext is the upstream answering. */
            if (poll(&answer, 1, 0) > 0 && (tls_pull(c, plain, &out) != TLS_WANT || plain->len)) {
                rc = 1;
                goto out;
            }
            continue;
        }
        if (w < 0) {
            rc = -1;
            goto out;
        }
        off += (size_t)w;
        *sent += (size_t)w;
    }
out:
    strbuf_release(&out);
    return rc;
}

/*
 * After a failed first write on a new TLS connection: whether the server's alert refusing our
 * certificate came before its reset (TLS 1.3 judges the client's certificate after the client's
 * handshake ends), so that it never read the request.
 */
static int refused_first(struct conn *c)
{
    struct strbuf plain = STRBUF_INIT;
    int refused = 0;

    if (tls_conn_bytes_read(c->tls) == 0 && !tls_conn_resumed(c->tls)) {
        (void)tls_pull(c, &plain, NULL);
        refused = plain.len == 0 && tls_conn_failed_in_handshake(c->tls);
    }
    strbuf_release(&plain);
    return refused;
}

/*
 * read() for a worker's connection: over TLS, the plaintext (first what came while the request
 * was written, in `plain`), and -1 with EPROTO when TLS failed (tls_conn_error says why).
 */
static ssize_t conn_read(struct conn *c, struct strbuf *plain, char *buf, size_t cap)
{
    size_t n;

    if (!c->tls)
        return read(c->fd, buf, cap);
    if (plain->len == 0) {
        enum tls_step step = tls_pull(c, plain, NULL);
        if (plain->len == 0) {
            if (step == TLS_EOF)
                return 0;
            if (step == TLS_FAIL && tls_conn_error(c->tls)[0] != '\0')
                errno = EPROTO;
            else if (step != TLS_FAIL)
                errno = EAGAIN;
            return -1;
        }
    }
    n = plain->len < cap ? plain->len : cap;
    memcpy(buf, plain->buf, n);
    memmove(plain->buf, plain->buf + n, plain->len - n);
    plain->len -= n;
    return (ssize_t)n;
}

/*
 * Reads the answer on `c` until it is whole, the deadline passes or the connection ends.
 * *reusable says whether the connection may carry another exchange.  `buf` holds PULL_MAX, what
 * one pull decrypts, so nothing stays in `plain` when the reader says it streams.
 */
static enum http_fetch_result read_answer(struct http_reply_reader *r, struct conn *c,
                                          struct strbuf *plain, int64_t deadline,
                                          struct http_reply *resp, int *reusable, int *streaming,
                                          char *err, size_t errlen)
{
    char buf[PULL_MAX];

    *reusable = 0;
    *streaming = 0;
    for (;;) {
        ssize_t n = conn_read(c, plain, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EPROTO && c->tls) {
            snprintf(err, errlen, "reading the answer: %s", tls_conn_error(c->tls));
            if (!tls_conn_failed_in_handshake(c->tls))
                return HTTP_FETCH_UNKNOWN;
            /* TLS 1.3: the server refused our certificate, and never read the request. */
            resp->tls_failed = 1;
            return HTTP_FETCH_NOT_SENT;
        }
        if (n < 0 && errno == EAGAIN) {
            int w = fd_wait(c->fd, POLLIN, deadline);
            if (w == 0) {
                snprintf(err, errlen, "no whole answer within the upstream timeout");
                resp->timed_out = 1;
                return HTTP_FETCH_UNKNOWN;
            }
            if (w < 0) {
                snprintf(err, errlen, "poll: %s", strerror(errno));
                return HTTP_FETCH_UNKNOWN;
            }
            continue;
        }
        if (n < 0) {
            snprintf(err, errlen, "reading the answer: %s", strerror(errno));
            return HTTP_FETCH_UNKNOWN;
        }
        /* n == 0 tells the reader the stream ended (a body delimited by close completes). */
        switch (http_reply_reader_feed(r, buf, (size_t)n)) {
        case HTTP_REPLY_DONE:
            *reusable = n > 0 && http_reply_reader_reusable(r);
            return HTTP_FETCH_OK;
        case HTTP_REPLY_TOO_LARGE:
            snprintf(err, errlen, "the answer's body is over %zu bytes", r->max_body);
            return HTTP_FETCH_TOO_LARGE;
        case HTTP_REPLY_STREAM:
            *streaming = 1;
            return HTTP_FETCH_OK;
        case HTTP_REPLY_BAD:
            snprintf(err, errlen, "the upstream's answer is not valid HTTP: %s",
                     http_reply_reader_error(r));
            return HTTP_FETCH_BAD_REPLY;
        case HTTP_REPLY_MORE:
            break;
        }
        if (n == 0) {
            snprintf(err, errlen, "the upstream closed the connection before a whole answer");
            return HTTP_FETCH_UNKNOWN;
        }
    }
}

enum http_fetch_result upstream_exchange(struct upstream *up, const struct upstream_request *rq,
                                         size_t hold_max, int may_stream, struct http_reply *resp,
                                         char *err, size_t errlen)
{
    struct strbuf head = STRBUF_INIT;
    struct http_reply_reader r;
    struct iovec iov[2];
    enum http_fetch_result res;
    int64_t start_ns, deadline;
    struct strbuf plain = STRBUF_INIT; /* TLS: answer bytes decrypted while writing */
    struct conn c = {.fd = -1};
    size_t sent = 0;
    int reusable = 0, streaming = 0, early;

    memset(resp, 0, sizeof *resp);
    err[0] = '\0';
    if (!rq->fresh_connection)
        c = take_idle(up);
    if (c.fd < 0 && open_conn(up, &c, &resp->tls_failed, err, errlen) != 0)
        return HTTP_FETCH_NOT_SENT;

    http_reply_reader_init(&r, hold_max ? hold_max : up->opts.max_response_bytes,
                           strcmp(rq->method, "HEAD") == 0);
    if (may_stream)
        http_reply_reader_allow_stream(&r);
    build_head(up, rq, &head);
    iov[0].iov_base = head.buf;
    iov[0].iov_len = head.len;
    iov[1].iov_base = (void *)rq->body;
    iov[1].iov_len = rq->body_len;
    start_ns = clock_mono_ns();
    deadline = clock_mono_ms() + up->opts.timeout_ms;
    early = c.tls ? tls_write_all(&c, iov, rq->body_len > 0 ? 2 : 1, deadline, &sent, &plain)
                  : write_all(c.fd, iov, rq->body_len > 0 ? 2 : 1, deadline, &sent);
    if (early < 0 && c.tls && refused_first(&c)) {
        snprintf(err, errlen, "%s (upstream %s)", tls_conn_error(c.tls), up->host_header);
        resp->tls_failed = 1;
        res = HTTP_FETCH_NOT_SENT;
        goto out;
    }
    if (early < 0) {
        int e = errno;
        snprintf(err, errlen, "sending the request: %s", strerror(e));
        resp->timed_out = e == ETIMEDOUT;
        /* Not a byte left: the upstream cannot have acted on it. */
        res = sent == 0 ? HTTP_FETCH_NOT_SENT : HTTP_FETCH_UNKNOWN;
        goto out;
    }
    res = read_answer(&r, &c, &plain, deadline, resp, &reusable, &streaming, err, errlen);
    if (res == HTTP_FETCH_OK || res == HTTP_FETCH_TOO_LARGE) {
        int timed_out = resp->timed_out;
        http_reply_reader_take(&r, resp);
        resp->timed_out = timed_out;
    }
    resp->seconds = (double)(clock_mono_ns() - start_ns) / 1e9;
    if (streaming) {
        /* The rest of the body is the caller's to read: the reader and the connection go along. */
        resp->rest = http_body_stream_new(&r, c.fd, c.tls, up->opts.timeout_ms);
        strbuf_release(&head);
        strbuf_release(&plain);
        return res;
    }
out:
    strbuf_release(&head);
    http_reply_reader_release(&r);
    if (reusable && early == 0 && !rq->fresh_connection && plain.len == 0)
        give_back(up, &c);
    else
        conn_close(&c);
    strbuf_release(&plain);
    return res;
}

int upstream_start(struct upstream *up, const struct upstream_request *rq, size_t hold_max,
                   http_fetch_done done, void *arg, struct http_fetch **fetch)
{
    struct strbuf head = STRBUF_INIT;
    int rc;

    build_head(up, rq, &head);
    rc = http_fetch_start(up->async, head.buf, head.len, rq->body, rq->body_len, hold_max,
                          (strcmp(rq->method, "HEAD") == 0 ? HTTP_FETCH_HEAD : 0) |
                              (rq->fresh_connection ? HTTP_FETCH_FRESH : 0) | HTTP_FETCH_MAY_STREAM,
                          done, arg, fetch);
    strbuf_release(&head);
    return rc;
}
