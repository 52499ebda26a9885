/*
 * proxy.c - the fault-injecting TCP proxy of `idem-check chaos`: it listens on 127.0.0.1 (port
 * chosen by the kernel) and forwards every connection to the upstream port, which may change
 * while it runs (orderd restarted).  Per accepted connection it draws one fate:
 *
 *   reset  the client connection is closed with an RST before a byte is forwarded;
 *   drop   the request is forwarded, and when the upstream's answer starts the client connection
 *          is reset instead: the server did the work, the client never heard of it;
 *   pass   bytes are copied both ways until either side closes.
 *
 * One detached thread per connection, poll()-driven; an upstream that cannot be reached (orderd
 * being restarted) is a reset too, counted apart.
 */
#define _GNU_SOURCE 1 /* accept4 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "chaos.h"
#include "banned.h"

struct conn {
    struct ck_proxy *p;
    int client;
    int fate; /* 0 pass, 1 drop */
};

static void close_rst(int fd)
{
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
}

static int connect_upstream(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return -1;
    }
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

static void *conn_main(void *arg)
{
    struct conn *c = arg;
    struct ck_proxy *p = c->p;
    char buf[16384];
    int up = connect_upstream(atomic_load(&p->upstream_port));
    int dropped = 0;

    if (up < 0) {
        atomic_fetch_add(&p->upstream_down, 1);
        close_rst(c->client);
        free(c);
        return NULL;
    }
    for (;;) {
        struct pollfd pf[2] = {{.fd = c->client, .events = POLLIN},
                               {.fd = up, .events = POLLIN}};
        ssize_t r;
        if (poll(pf, 2, 1000) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (atomic_load(&p->stopping))
            break;
        if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            r = recv(c->client, buf, sizeof(buf), 0);
            if (r <= 0 || write_all(up, buf, (size_t)r) < 0)
                break;
        }
        if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            r = recv(up, buf, sizeof(buf), 0);
            if (r <= 0)
                break;
            if (c->fate == 1) {
                atomic_fetch_add(&p->drops, 1);
                dropped = 1;
                break;
            }
            if (write_all(c->client, buf, (size_t)r) < 0)
                break;
        }
    }
    if (dropped)
        close_rst(c->client);
    else
        close(c->client);
    close(up);
    free(c);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct ck_proxy *p = arg;
    while (!atomic_load(&p->stopping)) {
        struct pollfd pf = {.fd = p->listen_fd, .events = POLLIN};
        int fd, one = 1;
        double u, rr, dr;
        struct conn *c;
        pthread_t t;
        pthread_attr_t attr;

        if (poll(&pf, 1, 200) <= 0)
            continue;
        fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        atomic_fetch_add(&p->connections, 1);
        pthread_mutex_lock(&p->rng_lock);
        u = ck_rng_double(&p->rng);
        rr = p->reset_rate;
        dr = p->drop_rate;
        pthread_mutex_unlock(&p->rng_lock);
        if (u < rr) {
            atomic_fetch_add(&p->resets, 1);
            close_rst(fd);
            continue;
        }
        c = ck_xmalloc(sizeof(*c));
        c->p = p;
        c->client = fd;
        c->fate = (u < rr + dr) ? 1 : 0;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 128 * 1024);
        if (pthread_create(&t, &attr, conn_main, c) != 0) {
            close_rst(fd);
            free(c);
        }
        pthread_attr_destroy(&attr);
    }
    return NULL;
}

int ck_proxy_start(struct ck_proxy *p, int upstream_port, double drop_rate, double reset_rate)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int one = 1;

    memset(&a, 0, sizeof(a));
    atomic_store(&p->upstream_port, upstream_port);
    atomic_store(&p->stopping, 0);
    p->drop_rate = drop_rate;
    p->reset_rate = reset_rate;
    pthread_mutex_init(&p->rng_lock, NULL);
    ck_rng_seed(&p->rng);
    p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (p->listen_fd < 0)
        return -1;
    (void)setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    a.sin_family = AF_INET;
    a.sin_port = 0;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(p->listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(p->listen_fd, 1024) < 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) < 0) {
        close(p->listen_fd);
        return -1;
    }
    p->port = ntohs(a.sin_port);
    if (pthread_create(&p->thread, NULL, accept_main, p) != 0) {
        close(p->listen_fd);
        return -1;
    }
    return 0;
}

void ck_proxy_set_faults(struct ck_proxy *p, double drop_rate, double reset_rate)
{
    pthread_mutex_lock(&p->rng_lock);
    p->drop_rate = drop_rate;
    p->reset_rate = reset_rate;
    pthread_mutex_unlock(&p->rng_lock);
}

void ck_proxy_stop(struct ck_proxy *p)
{
    atomic_store(&p->stopping, 1);
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
}
