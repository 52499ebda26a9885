/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault_proxy.c - the fault-injecting TCP proxy of `idem-check chaos`: it listens on 127.0.0.1
 * (port chosen by the kernel) and forwards every connection to one of its upstreams (the orderd
 * instances, round robin or at random), whose ports may change while it runs (orderd restarted).
 * Per request it draws one fate:
 *
 *   reset  the client connection is closed with an RST before a byte of the request is forwarded;
 *   cut    the request line, the headers and only part of the body are forwarded, then both
 *          connections are reset: the server holds half a request it must never execute;
 *   drop   the request is forwarded, and when the upstream's answer starts the client connection
 *          is reset instead: the server did the work, the client never heard of it;
 *   pass   bytes are copied both ways.
 *
 * A request starts when the client sends bytes after the upstream answered (or first on a
 * connection): HTTP/1.1 clients that do not pipeline (curl, libidem-client) send the next
 * request on a kept-alive connection only after the whole answer, so faults hit provider-sim's
 * kept-alive webhook deliveries as well as the intents' one-request connections.
 *
 * One detached thread per connection, poll()-driven; an upstream that cannot be reached (orderd
 * being restarted) is a reset too, counted apart.  Every wait is bounded.
 */
#define _GNU_SOURCE 1 /* accept4, memmem */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "chaos.h"
#include "ascii.h"
#include "banned.h"

#define CUT_WAIT_MS 3000 /* how long a cut waits for the bytes it means to forward */
#define STOP_WAIT_MS 5000

enum fate { FATE_PASS, FATE_RESET, FATE_CUT, FATE_DROP };

struct conn {
    struct ck_proxy *p;
    int client;
    int up;
};

static void close_rst(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

static int connect_upstream(uint32_t addr, int port)
{
    struct sockaddr_in a;
    int fd, one = 1;

    if (port <= 0)
        return -1;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = addr;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Writes all of buf; -1 on failure. */
static int write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The value of Content-Length in the header block head[0..len), or -1. */
static long content_length(const char *head, size_t len)
{
    static const char name[] = "content-length:";
    const size_t nl = sizeof(name) - 1;
    size_t i = 0;

    while (i < len) {
        const char *eol = memchr(head + i, '\n', len - i);
        size_t line_end = eol ? (size_t)(eol - head) : len;
        if (line_end - i > nl && ascii_ncaseeq(head + i, name, nl)) {
            char *end = NULL;
            long v = strtol(head + i + nl, &end, 10);
            return end != head + i + nl && v >= 0 ? v : -1;
        }
        i = line_end + 1;
    }
    return -1;
}

/*
 * The cut: starting from the `have` bytes of the request already read into `buf`, reads on
 * (bounded in bytes and time) until it knows the header block, forwards the request line, the
 * headers and a part of the body chosen by `cut_at` in [0, 1) (at least one byte short of it; a
 * request without a body is cut inside its headers), waits a moment so the server has read those
 * bytes, and resets both sides.
 */
static void cut_request(struct conn *c, char *buf, size_t cap, size_t have, double cut_at)
{
    size_t want = 0;
    long long end = clock_mono_ms() + CUT_WAIT_MS;
    int known = 0;

    for (;;) {
        struct pollfd pf = {.fd = c->client, .events = POLLIN};
        ssize_t r;
        if (!known) {
            const char *hend = memmem(buf, have, "\r\n\r\n", 4);
            if (hend) {
                size_t head = (size_t)(hend - buf) + 4;
                long cl = content_length(buf, head);
                if (cl >= 2)
                    want = head + 1 + (size_t)(cut_at * (double)(cl - 1));
                else
                    want = 1 + (size_t)(cut_at * (double)(head - 2));
                if (want > cap)
                    want = cap;
                known = 1;
            }
        }
        if ((known && have >= want) || have >= cap || clock_mono_ms() >= end)
            break;
        if (poll(&pf, 1, 100) <= 0)
            continue;
        r = recv(c->client, buf + have, cap - have, 0);
        if (r <= 0)
            break;
        have += (size_t)r;
    }
    if (!known)
        want = have / 2;
    if (want > have)
        want = have;
    if (want > 0 && write_all(c->up, buf, want) == 0)
        clock_sleep_ms(20);
    atomic_fetch_add(&c->p->cuts, 1);
    close_rst(c->up);
    close_rst(c->client);
}

/* The fate of the next request, and where a cut would fall. */
static enum fate draw_fate(struct ck_proxy *p, double *cut_at)
{
    double u, reset, cut, drop;

    pthread_mutex_lock(&p->rng_lock);
    u = ck_rng_double(&p->rng);
    *cut_at = ck_rng_double(&p->rng);
    reset = p->reset_rate;
    cut = p->cut_rate;
    drop = p->drop_rate;
    pthread_mutex_unlock(&p->rng_lock);
    if (u < reset)
        return FATE_RESET;
    if (u < reset + cut)
        return FATE_CUT;
    return u < reset + cut + drop ? FATE_DROP : FATE_PASS;
}

/* Copies both ways, drawing a fate for every request, until either side is done. */
static void serve_conn(struct conn *c)
{
    struct ck_proxy *p = c->p;
    char buf[16384];
    enum fate fate = FATE_PASS;
    int new_request = 1;

    for (;;) {
        struct pollfd pf[2] = {{.fd = c->client, .events = POLLIN},
                               {.fd = c->up, .events = POLLIN}};
        double cut_at = 0;
        ssize_t r;
        if (poll(pf, 2, 200) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (atomic_load(&p->stopping))
            break;
        if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            r = recv(c->client, buf, sizeof(buf), 0);
            if (r <= 0)
                break;
            if (new_request) {
                new_request = 0;
                atomic_fetch_add(&p->requests, 1);
                fate = draw_fate(p, &cut_at);
                if (fate == FATE_RESET) {
                    atomic_fetch_add(&p->resets, 1);
                    close_rst(c->client);
                    close(c->up);
                    return;
                }
                if (fate == FATE_CUT) {
                    cut_request(c, buf, sizeof(buf), (size_t)r, cut_at);
                    return;
                }
            }
            if (write_all(c->up, buf, (size_t)r) < 0)
                break;
        }
        if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            r = recv(c->up, buf, sizeof(buf), 0);
            if (r <= 0)
                break;
            if (fate == FATE_DROP) {
                atomic_fetch_add(&p->drops, 1);
                close_rst(c->client);
                close(c->up);
                return;
            }
            if (write_all(c->client, buf, (size_t)r) < 0)
                break;
            new_request = 1;
        }
    }
    close(c->client);
    close(c->up);
}

static void *conn_main(void *arg)
{
    struct conn *c = arg;
    struct ck_proxy *p = c->p;

    serve_conn(c);
    free(c);
    atomic_fetch_sub(&p->active, 1); /* the last touch of p */
    return NULL;
}

/* Which upstream the next connection goes to. */
static int pick_upstream(struct ck_proxy *p, double u)
{
    if (p->n_up <= 1)
        return 0;
    if (p->balance == CK_BALANCE_RANDOM) {
        int i = (int)(u * p->n_up);
        return i < p->n_up ? i : p->n_up - 1;
    }
    return (int)(atomic_fetch_add(&p->next_up, 1) % (unsigned)p->n_up);
}

static void handle(struct ck_proxy *p, int fd)
{
    struct ck_upstream *up;
    struct conn *c;
    pthread_t t;
    pthread_attr_t attr;
    double u_up;
    int one = 1, upfd;

    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    atomic_fetch_add(&p->connections, 1);
    pthread_mutex_lock(&p->rng_lock);
    u_up = ck_rng_double(&p->rng);
    pthread_mutex_unlock(&p->rng_lock);
    up = &p->up[pick_upstream(p, u_up)];
    atomic_fetch_add(&up->connections, 1);
    upfd = connect_upstream(up->addr, atomic_load(&up->port));
    if (upfd < 0) {
        atomic_fetch_add(&up->down, 1);
        atomic_fetch_add(&p->upstream_down, 1);
        close_rst(fd);
        return;
    }
    c = xmalloc(sizeof(*c));
    c->p = p;
    c->client = fd;
    c->up = upfd;
    atomic_fetch_add(&p->active, 1);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (pthread_create(&t, &attr, conn_main, c) != 0) {
        atomic_fetch_sub(&p->active, 1);
        close_rst(fd);
        close(upfd);
        free(c);
    }
    pthread_attr_destroy(&attr);
}

static void *accept_main(void *arg)
{
    struct ck_proxy *p = arg;
    while (!atomic_load(&p->stopping)) {
        struct pollfd pf = {.fd = p->listen_fd, .events = POLLIN};
        int fd;

        if (poll(&pf, 1, 200) <= 0)
            continue;
        fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            handle(p, fd);
    }
    return NULL;
}

int ck_listen_loopback(int *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1024) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

int ck_proxy_start(struct ck_proxy *p, int n, const uint32_t *addr, const int *port,
                   enum ck_balance balance)
{
    int i;

    if (n < 1 || n > CK_MAX_INSTANCES) {
        errno = EINVAL;
        return -1;
    }
    p->n_up = n;
    p->balance = balance;
    for (i = 0; i < n; i++) {
        p->up[i].addr = addr[i];
        atomic_store(&p->up[i].port, port[i]);
    }
    atomic_store(&p->stopping, 0);
    pthread_mutex_init(&p->rng_lock, NULL);
    ck_rng_seed(&p->rng);
    p->listen_fd = ck_listen_loopback(&p->port);
    if (p->listen_fd < 0)
        return -1;
    if (pthread_create(&p->thread, NULL, accept_main, p) != 0) {
        close(p->listen_fd);
        return -1;
    }
    return 0;
}

void ck_proxy_set_upstream_port(struct ck_proxy *p, int i, int port)
{
    if (i >= 0 && i < p->n_up)
        atomic_store(&p->up[i].port, port);
}

void ck_proxy_set_faults(struct ck_proxy *p, double drop_rate, double reset_rate, double cut_rate)
{
    pthread_mutex_lock(&p->rng_lock);
    p->drop_rate = drop_rate;
    p->reset_rate = reset_rate;
    p->cut_rate = cut_rate;
    pthread_mutex_unlock(&p->rng_lock);
}

void ck_proxy_stop(struct ck_proxy *p)
{
    long long end = clock_mono_ms() + STOP_WAIT_MS;

    atomic_store(&p->stopping, 1);
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
    /* Connection threads see `stopping` within one poll (200 ms); a cut may take CUT_WAIT_MS. */
    while (atomic_load(&p->active) > 0 && clock_mono_ms() < end)
        clock_sleep_ms(20);
    pthread_mutex_destroy(&p->rng_lock);
}
