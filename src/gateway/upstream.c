/*
 * upstream.c - the gateway's blocking HTTP/1.1 client of its one upstream (upstream.h): connect
 * with a deadline, write the request, read the answer with http-parser in response mode, keep the
 * connection for the next exchange when both sides allow it.
 *
 * Every socket is non-blocking and every wait is a poll() against the exchange's deadline, so a
 * silent upstream costs a worker at most connect_timeout_ms + timeout_ms.
 */
#include "upstream.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <http_parser.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

/*
 * A pooled connection older than this is closed rather than reused: upstreams close idle
 * keep-alive connections after a few seconds (Node.js after 5), and a request written into a
 * connection the upstream is closing at that moment ends as UPSTREAM_UNKNOWN for no good reason.
 */
#define IDLE_REUSE_MS 2000

/* The answer's status line and header fields, as stored; more is a bad reply. */
#define MAX_REPLY_HEAD 65536
#define MAX_REPLY_HEADERS 100

struct idle_conn {
    int fd;
    int64_t since_ms;
};

struct upstream {
    struct upstream_options opts;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char host_header[300]; /* "127.0.0.1:9000", for requests that come without Host */

    pthread_mutex_t lock;
    struct idle_conn *idle; /* a stack: the most recently used is reused first */
    int nidle;
};

const char *upstream_result_name(enum upstream_result r)
{
    switch (r) {
    case UPSTREAM_OK:
        return "ok";
    case UPSTREAM_NOT_SENT:
        return "not-sent";
    case UPSTREAM_UNKNOWN:
        return "unknown";
    case UPSTREAM_TOO_LARGE:
        return "too-large";
    case UPSTREAM_BAD_REPLY:
        return "bad-reply";
    }
    return "unknown";
}

static int64_t now_ms(void)
{
    return mono_ns() / 1000000;
}

int upstream_new(const struct upstream_options *opts, struct upstream **out, char *err,
                 size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    struct upstream *up;
    char port[8];
    int rc;

    *out = NULL;
    snprintf(port, sizeof port, "%u", (unsigned)opts->port);
    rc = getaddrinfo(opts->host, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "upstream host %s: %s", opts->host, gai_strerror(rc));
        return -1;
    }
    up = xcalloc(1, sizeof *up);
    up->opts = *opts;
    up->opts.host = NULL; /* not kept: the address is */
    memcpy(&up->addr, res->ai_addr, res->ai_addrlen);
    up->addr_len = res->ai_addrlen;
    freeaddrinfo(res);
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

void upstream_free(struct upstream *up)
{
    if (!up)
        return;
    for (int i = 0; i < up->nidle; i++)
        close(up->idle[i].fd);
    free(up->idle);
    pthread_mutex_destroy(&up->lock);
    free(up);
}

/* Waits until `fd` is ready for `events` or `deadline` passes: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int64_t left = deadline - now_ms();
        int n;
        if (left <= 0)
            return 0;
        n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/*
 * A pooled connection still fit for a request: young, and nothing to read on it (an EOF or stray
 * bytes mean the upstream is closing it or broke the protocol).
 */
static int idle_usable(const struct idle_conn *ic, int64_t now)
{
    struct pollfd p = {.fd = ic->fd, .events = POLLIN};
    if (now - ic->since_ms > IDLE_REUSE_MS)
        return 0;
    return poll(&p, 1, 0) == 0;
}

static int take_idle(struct upstream *up)
{
    int64_t now = now_ms();
    int fd = -1;

    pthread_mutex_lock(&up->lock);
    while (up->nidle > 0 && fd < 0) {
        struct idle_conn ic = up->idle[--up->nidle];
        if (idle_usable(&ic, now))
            fd = ic.fd;
        else
            close(ic.fd);
    }
    pthread_mutex_unlock(&up->lock);
    return fd;
}

static void give_back(struct upstream *up, int fd)
{
    pthread_mutex_lock(&up->lock);
    if (up->nidle < (up->opts.max_idle > 0 ? up->opts.max_idle : 1)) {
        up->idle[up->nidle].fd = fd;
        up->idle[up->nidle].since_ms = now_ms();
        up->nidle++;
        fd = -1;
    }
    pthread_mutex_unlock(&up->lock);
    if (fd >= 0)
        close(fd);
}

/* A new connection, or -1 with `err` set: nothing was sent on it. */
static int connect_new(struct upstream *up, char *err, size_t errlen)
{
    int fd = socket(up->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    int w;

    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&up->addr, up->addr_len) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        snprintf(err, errlen, "connect to %s: %s", up->host_header, strerror(errno));
        goto fail;
    }
    w = wait_fd(fd, POLLOUT, now_ms() + up->opts.connect_timeout_ms);
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

/* The request head: method, target, the caller's headers, Content-Length, keep-alive. */
static void build_head(const struct upstream *up, const struct upstream_request *rq,
                       struct strbuf *out)
{
    int has_host = 0;

    strbuf_addf(out, "%s %s HTTP/1.1\r\n", rq->method, rq->target);
    for (size_t i = 0; i < rq->nheaders; i++) {
        if (strcasecmp(rq->headers[i].name, "Host") == 0)
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
    strbuf_add(out, "\r\n", 2);
}

/* Writes all of `iov`; returns bytes written, or -1 (errno) having written *sent bytes. */
static int write_all(int fd, struct iovec *iov, int n, int64_t deadline, size_t *sent)
{
    *sent = 0;
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                int r = wait_fd(fd, POLLOUT, deadline);
                if (r <= 0) {
                    if (r == 0)
                        errno = ETIMEDOUT;
                    return -1;
                }
                continue;
            }
            return -1;
        }
        *sent += (size_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* ---- reading the answer ------------------------------------------------------------------ */

struct reader {
    http_parser hp;
    struct upstream_response *resp;
    struct strbuf head; /* "name\0value\0" per field */
    size_t offs[MAX_REPLY_HEADERS][2];
    size_t nfields;
    int in_value;
    struct strbuf body;
    size_t max_body;
    int head_request; /* HEAD: the answer has no body whatever it announces */
    int too_large;
    int too_many;
    int done;
};

static int on_field(http_parser *hp, const char *at, size_t len)
{
    struct reader *r = hp->data;
    if (r->in_value || r->nfields == 0) {
        if (r->nfields > 0)
            strbuf_add(&r->head, "", 1); /* ends the last value */
        if (r->nfields == MAX_REPLY_HEADERS) {
            r->too_many = 1;
            return -1;
        }
        r->offs[r->nfields][0] = r->head.len;
        r->nfields++;
        r->in_value = 0;
    }
    if (r->head.len + len > MAX_REPLY_HEAD) {
        r->too_many = 1;
        return -1;
    }
    strbuf_add(&r->head, at, len);
    return 0;
}

static int on_value(http_parser *hp, const char *at, size_t len)
{
    struct reader *r = hp->data;
    if (r->nfields == 0)
        return -1;
    if (!r->in_value) {
        strbuf_add(&r->head, "", 1); /* ends the name */
        r->offs[r->nfields - 1][1] = r->head.len;
        r->in_value = 1;
    }
    if (r->head.len + len > MAX_REPLY_HEAD) {
        r->too_many = 1;
        return -1;
    }
    strbuf_add(&r->head, at, len);
    return 0;
}

static int on_headers_complete(http_parser *hp)
{
    struct reader *r = hp->data;
    if (r->nfields > 0 && !r->in_value)
        return -1; /* a name without a value */
    if (r->nfields > 0)
        strbuf_add(&r->head, "", 1);
    if (hp->content_length != ULLONG_MAX && hp->content_length > r->max_body) {
        r->too_large = 1;
        return -1;
    }
    /* 1 tells http-parser there is no body (HEAD; 1xx, 204 and 304 it knows itself). */
    return r->head_request ? 1 : 0;
}

static int on_body(http_parser *hp, const char *at, size_t len)
{
    struct reader *r = hp->data;
    if (r->body.len + len > r->max_body) {
        r->too_large = 1;
        return -1;
    }
    strbuf_add(&r->body, at, len);
    return 0;
}

static int on_message_complete(http_parser *hp)
{
    struct reader *r = hp->data;
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

/* Moves what the reader gathered into `resp`. */
static void reader_finish(struct reader *r, struct upstream_response *resp)
{
    resp->status = (int)r->hp.status_code;
    resp->headers_cap_ = r->nfields;
    resp->headers = r->nfields ? xcalloc(r->nfields, sizeof *resp->headers) : NULL;
    resp->store_ = strbuf_detach(&r->head, &resp->store_len_);
    for (size_t i = 0; i < r->nfields; i++) {
        resp->headers[i].name = resp->store_ + r->offs[i][0];
        resp->headers[i].value = resp->store_ + r->offs[i][1];
    }
    resp->nheaders = r->nfields;
    if (r->body.len > 0) {
        resp->body = strbuf_detach(&r->body, &resp->body_len);
    }
}

void upstream_response_clear(struct upstream_response *resp)
{
    free(resp->headers);
    free(resp->store_);
    free(resp->body);
    memset(resp, 0, sizeof *resp);
}

const char *upstream_response_header(const struct upstream_response *resp, const char *name)
{
    for (size_t i = 0; i < resp->nheaders; i++)
        if (strcasecmp(resp->headers[i].name, name) == 0)
            return resp->headers[i].value;
    return NULL;
}

/*
 * Reads the answer on `fd` until it is whole, the deadline passes or the connection ends.
 * *reusable says whether the connection may carry another exchange.
 */
static enum upstream_result read_answer(struct reader *r, int fd, int64_t deadline, int *reusable,
                                        char *err, size_t errlen)
{
    char buf[16384];

    *reusable = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        size_t used;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int w = wait_fd(fd, POLLIN, deadline);
            if (w == 0) {
                snprintf(err, errlen, "no whole answer within the upstream timeout");
                r->resp->timed_out = 1;
                return UPSTREAM_UNKNOWN;
            }
            if (w < 0) {
                snprintf(err, errlen, "poll: %s", strerror(errno));
                return UPSTREAM_UNKNOWN;
            }
            continue;
        }
        if (n < 0) {
            snprintf(err, errlen, "reading the answer: %s", strerror(errno));
            return UPSTREAM_UNKNOWN;
        }
        /* n == 0 tells http-parser the stream ended (a body delimited by close completes). */
        used = http_parser_execute(&r->hp, &reader_settings, buf, (size_t)n);
        if (r->done) {
            *reusable = n > 0 && used == (size_t)n && http_should_keep_alive(&r->hp);
            return UPSTREAM_OK;
        }
        if (r->too_large) {
            snprintf(err, errlen, "the answer's body is over %zu bytes", r->max_body);
            return UPSTREAM_TOO_LARGE;
        }
        if (HTTP_PARSER_ERRNO(&r->hp) != HPE_OK) {
            snprintf(err, errlen, "the upstream's answer is not valid HTTP: %s%s",
                     http_errno_description(HTTP_PARSER_ERRNO(&r->hp)),
                     r->too_many ? " (head too large)" : "");
            return UPSTREAM_BAD_REPLY;
        }
        if (n == 0) {
            snprintf(err, errlen, "the upstream closed the connection before a whole answer");
            return UPSTREAM_UNKNOWN;
        }
    }
}

enum upstream_result upstream_exchange(struct upstream *up, const struct upstream_request *rq,
                                       struct upstream_response *resp, char *err, size_t errlen)
{
    struct strbuf head = STRBUF_INIT;
    struct reader r;
    struct iovec iov[2];
    enum upstream_result res;
    int64_t start_ns, deadline;
    size_t sent = 0;
    int reusable = 0;
    int fd;

    memset(resp, 0, sizeof *resp);
    memset(&r, 0, sizeof r);
    err[0] = '\0';
    fd = take_idle(up);
    if (fd < 0)
        fd = connect_new(up, err, errlen);
    if (fd < 0)
        return UPSTREAM_NOT_SENT;

    build_head(up, rq, &head);
    iov[0].iov_base = head.buf;
    iov[0].iov_len = head.len;
    iov[1].iov_base = (void *)rq->body;
    iov[1].iov_len = rq->body_len;
    start_ns = mono_ns();
    deadline = now_ms() + up->opts.timeout_ms;
    if (write_all(fd, iov, rq->body_len > 0 ? 2 : 1, deadline, &sent) != 0) {
        int e = errno;
        snprintf(err, errlen, "sending the request: %s", strerror(e));
        resp->timed_out = e == ETIMEDOUT;
        /* Not a byte left: the upstream cannot have acted on it. */
        res = sent == 0 ? UPSTREAM_NOT_SENT : UPSTREAM_UNKNOWN;
        goto out;
    }

    http_parser_init(&r.hp, HTTP_RESPONSE);
    r.hp.data = &r;
    r.resp = resp;
    r.max_body = up->opts.max_response_bytes;
    r.head_request = strcmp(rq->method, "HEAD") == 0;
    res = read_answer(&r, fd, deadline, &reusable, err, errlen);
    if (res == UPSTREAM_OK || res == UPSTREAM_TOO_LARGE)
        reader_finish(&r, resp);
    resp->seconds = (double)(mono_ns() - start_ns) / 1e9;
out:
    strbuf_release(&head);
    strbuf_release(&r.head);
    strbuf_release(&r.body);
    if (reusable)
        give_back(up, fd);
    else
        close(fd);
    return res;
}
