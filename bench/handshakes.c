/* SPDX-License-Identifier: Apache-2.0 */
/*
 * handshakes.c - new TLS connections per second: every request on a connection of its own, with
 * a full handshake.  wrk cannot measure that: told `Connection: close`, it reconnects with the
 * same SSL object, which keeps the last session and offers it again, so its handshakes resume.
 * Here each connection gets a new SSL from a context whose session cache is off and no session
 * is ever set, so every handshake is a full one (certificate, signature, key exchange); one that
 * resumed anyway is counted as such.
 *
 *   handshakes HOST PORT [--connections 16] [--threads 2] [--seconds 5] [--path /]
 *                        [--tls 1.3|1.2]
 *
 * Each of --threads threads keeps its share of --connections going with epoll, one state machine
 * per connection: connect, handshake (TLS 1.3 only by default, or 1.2 only; ALPN http/1.1; the
 * server's certificate is not checked, as wrk does not, though TLS 1.3's signature still is),
 * `GET PATH` with `Connection: close`, the whole response (Content-Length), then the server's
 * close; then the next connection.  A connection that does not end within 10 s is a timeout.
 * The run stops after --seconds.
 *
 * Prints one JSON object on stdout: the run's length, the handshakes and the requests answered,
 * the non-2xx answers, the errors by step, how many handshakes resumed (0 unless the server
 * forces it), the latency from connect() to the response's last byte (p50 / p90 / p99 / max, µs)
 * and the protocol, cipher and key-exchange group of the first handshake.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/objects.h>
#include <openssl/ssl.h>

#include "ascii.h"
#include "clock.h" /* common/clock.h */
#include "latency.h"
#include "banned.h"

#define CONNECTIONS_MAX 4096
#define THREADS_MAX 64
#define RESPONSE_MAX 65536
#define CONN_TIMEOUT_NS (10 * (int64_t)1000000000)
#define SAMPLES_MAX ((size_t)1 << 22)

static const unsigned char alpn_http11[] = "\x08http/1.1";

enum step { CONNECTING, HANDSHAKING, WRITING, READING, DRAINING };

struct conn {
    int fd;
    SSL *ssl;
    enum step step;
    int64_t t_start;
    size_t sent;
    char buf[RESPONSE_MAX];
    size_t len;
};

struct counts {
    unsigned long long handshakes, requests, non2xx, resumed;
    unsigned long long err_connect, err_handshake, err_write, err_read, err_timeout;
};

struct worker {
    pthread_t thread;
    SSL_CTX *ctx;
    struct sockaddr_in sa;
    const char *req;
    size_t req_len;
    int nconns;
    int64_t until;
    struct conn *cs;
    struct counts n;
    int64_t *lat; /* ns, connect() to the response's last byte */
    size_t nlat, caplat;
    char protocol[32], cipher[64], group[32];
};

/* Whether c->buf holds a whole response: 1, 0 (not yet), -1 (not HTTP); sets *status. */
static int response_complete(struct conn *c, int *status)
{
    const char *end, *line, *p;
    size_t head, clen = 0;

    c->buf[c->len] = '\0';
    end = strstr(c->buf, "\r\n\r\n");
    if (end == NULL)
        return c->len >= RESPONSE_MAX - 1 ? -1 : 0;
    if (c->len < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0)
        return -1;
    head = (size_t)(end - c->buf) + 4;
    *status = atoi(c->buf + 9);
    for (line = strstr(c->buf, "\r\n"); line != NULL && line < end;
         line = strstr(line + 2, "\r\n")) {
        p = line + 2;
        if (ascii_ncaseeq(p, "Content-Length:", 15))
            clen = (size_t)strtoul(p + 15, NULL, 10);
    }
    return c->len >= head + clen ? 1 : 0;
}

static void conn_close(struct worker *w, int ep, struct conn *c)
{
    (void)w;
    if (c->fd >= 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    SSL_free(c->ssl); /* no close_notify: the server already ended, or the connection failed */
    c->fd = -1;
    c->ssl = NULL;
}

/* Opens connection `i`'s next connection; 0, or -1 (counted) when connect() fails at once. */
static int conn_open(struct worker *w, int ep, int i)
{
    struct conn *c = &w->cs[i];
    struct epoll_event ev;
    int one = 1;

    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c->ssl = SSL_new(w->ctx);
    c->t_start = clock_mono_ns();
    c->step = CONNECTING;
    c->sent = 0;
    c->len = 0;
    if (c->fd < 0 || c->ssl == NULL)
        goto fail;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&w->sa, sizeof w->sa) != 0 && errno != EINPROGRESS)
        goto fail;
    SSL_set_fd(c->ssl, c->fd);
    SSL_set_connect_state(c->ssl);
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLOUT;
    ev.data.u32 = (uint32_t)i;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0)
        goto fail;
    return 0;
fail:
    w->n.err_connect++;
    conn_close(w, ep, c);
    return -1;
}

/* Waits for the socket to be readable (want_write 0) or writable (1). */
static void conn_wait(int ep, struct conn *c, int i, int want_write)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof ev);
    ev.events = want_write ? EPOLLOUT : EPOLLIN;
    ev.data.u32 = (uint32_t)i;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* The SSL call's result `rc` as "wait" (0, the wait set) or "failed" (-1). */
static int ssl_wait(int ep, struct conn *c, int i, int rc)
{
    int e = SSL_get_error(c->ssl, rc);

    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        conn_wait(ep, c, i, e == SSL_ERROR_WANT_WRITE);
        return 0;
    }
    return -1;
}

static void record_first(struct worker *w, SSL *ssl)
{
    int nid;

    if (w->protocol[0] != '\0')
        return;
    snprintf(w->protocol, sizeof w->protocol, "%s", SSL_get_version(ssl));
    snprintf(w->cipher, sizeof w->cipher, "%s", SSL_get_cipher_name(ssl));
    nid = SSL_get_negotiated_group(ssl);
    snprintf(w->group, sizeof w->group, "%s",
             nid > 0 ? OBJ_nid2sn(nid & ~TLSEXT_nid_unknown) : "?");
}

static void record_latency(struct worker *w, int64_t ns)
{
    if (w->nlat == w->caplat) {
        size_t cap = w->caplat ? w->caplat * 2 : 65536;
        int64_t *p;
        if (cap > SAMPLES_MAX)
            return; /* enough samples for the percentiles */
        p = realloc(w->lat, cap * sizeof *p);
        if (p == NULL)
            return;
        w->lat = p;
        w->caplat = cap;
    }
    w->lat[w->nlat++] = ns;
}

/*
 * Moves connection `i` on as far as it goes without waiting.  Returns 1 when it has ended
 * (answered and closed, or failed, both counted) and the slot may open the next one.
 */
static int conn_step(struct worker *w, int ep, int i)
{
    struct conn *c = &w->cs[i];
    int rc, status = 0;

    for (;;) {
        switch (c->step) {
        case CONNECTING: {
            int err = 0;
            socklen_t len = sizeof err;
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                w->n.err_connect++;
                return 1;
            }
            c->step = HANDSHAKING;
            break;
        }
        case HANDSHAKING:
            rc = SSL_do_handshake(c->ssl);
            if (rc != 1) {
                if (ssl_wait(ep, c, i, rc) == 0)
                    return 0;
                w->n.err_handshake++;
                return 1;
            }
            w->n.handshakes++;
            if (SSL_session_reused(c->ssl))
                w->n.resumed++;
            record_first(w, c->ssl);
            c->step = WRITING;
            break;
        case WRITING:
            rc = SSL_write(c->ssl, w->req + c->sent, (int)(w->req_len - c->sent));
            if (rc <= 0) {
                if (ssl_wait(ep, c, i, rc) == 0)
                    return 0;
                w->n.err_write++;
                return 1;
            }
            c->sent += (size_t)rc;
            if (c->sent == w->req_len) {
                c->step = READING;
                conn_wait(ep, c, i, 0);
            }
            break;
        case READING:
        case DRAINING:
            if (c->step == DRAINING)
                c->len = 0; /* what comes after the response (close_notify) is not kept */
            rc = SSL_read(c->ssl, c->buf + c->len, (int)(RESPONSE_MAX - 1 - c->len));
            if (rc <= 0) {
                int e = SSL_get_error(c->ssl, rc);
                if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
                    ERR_clear_error();
                    conn_wait(ep, c, i, e == SSL_ERROR_WANT_WRITE);
                    return 0;
                }
                ERR_clear_error();
                if (c->step == READING)
                    w->n.err_read++; /* the end before the whole response */
                return 1;            /* DRAINING: the server's close, as Connection: close asks */
            }
            if (c->step == DRAINING)
                break;
            c->len += (size_t)rc;
            rc = response_complete(c, &status);
            if (rc < 0) {
                w->n.err_read++;
                return 1;
            }
            if (rc > 0) {
                w->n.requests++;
                if (status < 200 || status > 299)
                    w->n.non2xx++;
                record_latency(w, clock_mono_ns() - c->t_start);
                c->step = DRAINING;
            }
            break;
        }
    }
}

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    struct epoll_event evs[256];
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int64_t now, next_sweep = 0;
    int i, m;

    if (ep < 0)
        return NULL;
    for (i = 0; i < w->nconns; i++)
        w->cs[i].fd = -1;
    for (i = 0; i < w->nconns; i++)
        (void)conn_open(w, ep, i);
    while ((now = clock_mono_ns()) < w->until) {
        m = epoll_wait(ep, evs, 256, 100);
        if (m < 0 && errno != EINTR)
            break;
        for (i = 0; i < m; i++) {
            int k = (int)evs[i].data.u32;
            if (conn_step(w, ep, k)) {
                conn_close(w, ep, &w->cs[k]);
                if (clock_mono_ns() < w->until)
                    (void)conn_open(w, ep, k);
            }
        }
        if (now < next_sweep)
            continue;
        /* Connections stuck past the timeout, and slots a failed connect() left empty. */
        next_sweep = now + 100000000;
        for (i = 0; i < w->nconns; i++) {
            struct conn *c = &w->cs[i];
            if (c->fd >= 0 && now - c->t_start > CONN_TIMEOUT_NS) {
                w->n.err_timeout++;
                conn_close(w, ep, c);
            }
            if (c->fd < 0)
                (void)conn_open(w, ep, i);
        }
    }
    for (i = 0; i < w->nconns; i++)
        conn_close(w, ep, &w->cs[i]);
    close(ep);
    return NULL;
}

static SSL_CTX *client_ctx(int version)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    if (ctx == NULL || SSL_CTX_set_min_proto_version(ctx, version) != 1 ||
        SSL_CTX_set_max_proto_version(ctx, version) != 1 ||
        SSL_CTX_set_alpn_protos(ctx, alpn_http11, sizeof alpn_http11 - 1) != 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    /* Never a session to offer: every handshake is a full one. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    return ctx;
}

static unsigned long long sum(const struct worker *ws, int n, size_t off)
{
    unsigned long long s = 0;
    int i;

    for (i = 0; i < n; i++)
        s += *(const unsigned long long *)((const char *)&ws[i].n + off);
    return s;
}

int main(int argc, char **argv)
{
    const char *host, *path = "/";
    struct worker *ws = NULL;
    struct counts n;
    SSL_CTX *ctx = NULL;
    int64_t *lat = NULL, t0, t1;
    size_t nlat = 0, k;
    char *req = NULL;
    double seconds = 5;
    int port, conns = 16, threads = 2, version = TLS1_3_VERSION;
    int i, req_len, started = 0, first = -1, rc = 1;

    if (argc < 3) {
        fprintf(stderr, "usage: handshakes HOST PORT [--connections N] [--threads T] "
                        "[--seconds S] [--path P] [--tls 1.3|1.2]\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    for (i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--connections") == 0)
            conns = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--path") == 0)
            path = argv[i + 1];
        else if (strcmp(argv[i], "--tls") == 0 && strcmp(argv[i + 1], "1.2") == 0)
            version = TLS1_2_VERSION;
        else if (strcmp(argv[i], "--tls") != 0 || strcmp(argv[i + 1], "1.3") != 0)
            argc = 0; /* unknown: refused below */
    }
    if (argc == 0 || port <= 0 || port > 65535 || conns < 1 || conns > CONNECTIONS_MAX ||
        threads < 1 || threads > THREADS_MAX || seconds <= 0 || seconds > 600) {
        fprintf(stderr, "handshakes: bad arguments\n");
        return 2;
    }
    if (threads > conns)
        threads = conns;
    ctx = client_ctx(version);
    if (ctx == NULL) {
        fprintf(stderr, "handshakes: cannot make a TLS context\n");
        goto out;
    }
    req_len = snprintf(NULL, 0, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", path,
                       host, port);
    req = malloc((size_t)req_len + 1);
    ws = calloc((size_t)threads, sizeof *ws);
    if (req == NULL || ws == NULL)
        goto out;
    snprintf(req, (size_t)req_len + 1,
             "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", path, host, port);
    t0 = clock_mono_ns();
    for (i = 0; i < threads; i++) {
        struct worker *w = &ws[i];
        w->ctx = ctx;
        w->sa.sin_family = AF_INET;
        w->sa.sin_port = htons((unsigned short)port);
        if (inet_pton(AF_INET, host, &w->sa.sin_addr) != 1) {
            fprintf(stderr, "handshakes: %s is not an IPv4 address\n", host);
            goto out;
        }
        w->req = req;
        w->req_len = (size_t)req_len;
        w->nconns = conns / threads + (i < conns % threads);
        w->until = t0 + (int64_t)(seconds * 1e9);
        w->cs = calloc((size_t)w->nconns, sizeof *w->cs);
        if (w->cs == NULL)
            goto out;
    }
    while (started < threads &&
           pthread_create(&ws[started].thread, NULL, worker_run, &ws[started]) == 0)
        started++;
    for (i = 0; i < started; i++)
        pthread_join(ws[i].thread, NULL);
    if (started < threads) {
        fprintf(stderr, "handshakes: cannot start a thread\n");
        goto out;
    }
    t1 = clock_mono_ns();
    for (i = 0; i < threads; i++)
        nlat += ws[i].nlat;
    lat = malloc((nlat ? nlat : 1) * sizeof *lat);
    if (lat == NULL)
        goto out;
    for (i = 0, nlat = 0; i < threads; i++) {
        for (k = 0; k < ws[i].nlat; k++)
            lat[nlat++] = ws[i].lat[k];
        if (first < 0 && ws[i].protocol[0] != '\0')
            first = i;
    }
    latency_sort(lat, nlat);
#define SUM(f) sum(ws, threads, offsetof(struct counts, f))
    n.handshakes = SUM(handshakes);
    n.requests = SUM(requests);
    n.non2xx = SUM(non2xx);
    n.resumed = SUM(resumed);
    n.err_connect = SUM(err_connect);
    n.err_handshake = SUM(err_handshake);
    n.err_write = SUM(err_write);
    n.err_read = SUM(err_read);
    n.err_timeout = SUM(err_timeout);
#undef SUM
    printf("{\"duration_us\":%lld,\"connections\":%d,\"threads\":%d,\"handshakes\":%llu,"
           "\"requests\":%llu,\"non2xx\":%llu,\"resumed\":%llu,\"err_connect\":%llu,"
           "\"err_handshake\":%llu,\"err_write\":%llu,\"err_read\":%llu,\"err_timeout\":%llu,"
           "\"p50_us\":%lld,\"p90_us\":%lld,\"p99_us\":%lld,\"max_us\":%lld,"
           "\"protocol\":\"%s\",\"cipher\":\"%s\",\"group\":\"%s\"}\n",
           (long long)((t1 - t0) / 1000), conns, threads, n.handshakes, n.requests, n.non2xx,
           n.resumed, n.err_connect, n.err_handshake, n.err_write, n.err_read, n.err_timeout,
           (long long)(latency_at(lat, nlat, 0.5) / 1000),
           (long long)(latency_at(lat, nlat, 0.9) / 1000),
           (long long)(latency_at(lat, nlat, 0.99) / 1000),
           (long long)(latency_at(lat, nlat, 1.0) / 1000), first >= 0 ? ws[first].protocol : "",
           first >= 0 ? ws[first].cipher : "", first >= 0 ? ws[first].group : "");
    rc = 0;
out:
    if (ws != NULL)
        for (i = 0; i < threads; i++) {
            free(ws[i].cs);
            free(ws[i].lat);
        }
    free(ws);
    free(lat);
    free(req);
    SSL_CTX_free(ctx);
    return rc;
}
