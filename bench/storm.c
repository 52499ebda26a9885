/* SPDX-License-Identifier: Apache-2.0 */
/*
 * storm.c - S3: N requests with ONE Idempotency-Key released together, and the lone
 * request they are compared with.  A load generator written in a scripting language measures
 * its own scheduling when 200 responses arrive at once, so this is one C thread with epoll:
 * every connection is opened first, then all requests are written back to back (well under a
 * millisecond for 200), and each response is timestamped the moment its last byte arrives.
 * The lone requests go through the very same code, one connection at a time.
 *
 *   storm HOST PORT TOKEN KEY [--requests 200] [--lone 21] [--lone-prefix P]
 *
 * POSTs {"productId":"p-1024","quantity":1} to /api/orders.  Prints one JSON object on stdout:
 * statuses, how many carried Idempotent-Replayed, p50 / p99 / max of the storm and the p50 / max
 * of the lone requests (with fresh keys P-0, P-1, ...), in milliseconds.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ascii.h"
#include "clock.h" /* common/clock.h */
#include "latency.h"
#include "banned.h"

#define REQUESTS_MAX 4096
#define RESPONSE_MAX 65536
#define TIMEOUT_MS 60000
#define BODY "{\"productId\":\"p-1024\",\"quantity\":1}"

struct conn {
    int fd;
    char *req;
    size_t req_len;
    size_t sent;
    char buf[RESPONSE_MAX];
    size_t len;
    int64_t t_sent;
    int64_t t_done;
    int status;
    int replayed;
    int done;
};

static char *build_request(const char *token, const char *key, size_t *len)
{
    char *req = NULL;
    int n;

    n = snprintf(NULL, 0,
                 "POST /api/orders HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                 "Content-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %zu\r\n"
                 "\r\n%s",
                 token, key, sizeof BODY - 1, BODY);
    if (n < 0)
        return NULL;
    req = malloc((size_t)n + 1);
    if (req == NULL)
        return NULL;
    snprintf(req, (size_t)n + 1,
             "POST /api/orders HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %zu\r\n"
             "\r\n%s",
             token, key, sizeof BODY - 1, BODY);
    *len = (size_t)n;
    return req;
}

static int connect_to(const char *host, int port)
{
    struct sockaddr_in sa;
    int fd = -1;
    int one = 1;

    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -1;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether buf holds a whole response; fills status and the Idempotent-Replayed flag. */
static int response_complete(struct conn *c)
{
    const char *end, *p, *line;
    size_t head, clen = 0;

    c->buf[c->len < RESPONSE_MAX ? c->len : RESPONSE_MAX - 1] = '\0';
    end = strstr(c->buf, "\r\n\r\n");
    if (end == NULL)
        return 0;
    head = (size_t)(end - c->buf) + 4;
    if (strncmp(c->buf, "HTTP/1.", 7) != 0 || c->len < 12)
        return -1;
    c->status = atoi(c->buf + 9);
    c->replayed = 0;
    for (line = strstr(c->buf, "\r\n"); line != NULL && line < end;
         line = strstr(line + 2, "\r\n")) {
        p = line + 2;
        if (ascii_ncaseeq(p, "Content-Length:", 15))
            clen = (size_t)strtoul(p + 15, NULL, 10);
        else if (ascii_ncaseeq(p, "Idempotent-Replayed:", 20))
            c->replayed = strncmp(p + 20 + strspn(p + 20, " \t"), "true", 4) == 0;
    }
    return c->len >= head + clen ? 1 : 0;
}

/* Sends every request, then waits for every response; returns how many failed. */
static int run(struct conn *cs, int n)
{
    struct epoll_event ev, evs[64];
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int pending = n, failed = 0;
    int64_t deadline;
    ssize_t k;
    int i, m, r;

    if (ep < 0)
        return n;
    for (i = 0; i < n; i++) {
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN;
        ev.data.u32 = (uint32_t)i;
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
    }
    /* Back to back: the requests leave within a fraction of a millisecond of each other. */
    for (i = 0; i < n; i++) {
        cs[i].t_sent = clock_mono_ns();
        while (cs[i].sent < cs[i].req_len) {
            k = send(cs[i].fd, cs[i].req + cs[i].sent, cs[i].req_len - cs[i].sent, MSG_NOSIGNAL);
            if (k <= 0)
                break;
            cs[i].sent += (size_t)k;
        }
    }
    deadline = clock_mono_ns() + (int64_t)TIMEOUT_MS * 1000000;
    while (pending > 0 && clock_mono_ns() < deadline) {
        m = epoll_wait(ep, evs, 64, 1000);
        if (m < 0 && errno != EINTR)
            break;
        for (i = 0; i < m; i++) {
            struct conn *c = &cs[evs[i].data.u32];
            if (c->done)
                continue;
            k = recv(c->fd, c->buf + c->len, RESPONSE_MAX - 1 - c->len, 0);
            if (k > 0)
                c->len += (size_t)k;
            r = k > 0 ? response_complete(c) : -1;
            if (r != 0 || c->len >= RESPONSE_MAX - 1) {
                c->t_done = clock_mono_ns();
                c->done = 1;
                if (r < 0)
                    c->status = 0;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                pending--;
            }
        }
    }
    close(ep);
    for (i = 0; i < n; i++)
        if (!cs[i].done || cs[i].status == 0)
            failed++;
    return failed;
}

/* The p-quantile of the n sorted latencies v (ns) in ms; -1 when there are none. */
static double pct_ms(const int64_t *v, int n, double p)
{
    return n > 0 ? (double)latency_at(v, (size_t)n, p) / 1e6 : -1;
}

static void conn_clear(struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->req);
    c->fd = -1;
    c->req = NULL;
}

int main(int argc, char **argv)
{
    const char *host, *token, *key, *lone_prefix = "lone";
    struct conn *cs = NULL, *one = NULL;
    int64_t *lat = NULL, *lone_lat = NULL;
    int statuses[600] = {0};
    int port, n = 200, nlone = 21;
    int i, nl = 0, replayed = 0, failed = 0, first;
    char lone_key[300];
    int rc = 1;

    if (argc < 5) {
        fprintf(stderr, "usage: storm HOST PORT TOKEN KEY [--requests N] [--lone M] "
                        "[--lone-prefix P]\n");
        return 2;
    }
    host = argv[1];
    port = atoi(argv[2]);
    token = argv[3];
    key = argv[4];
    for (i = 5; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--requests") == 0)
            n = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--lone") == 0)
            nlone = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--lone-prefix") == 0)
            lone_prefix = argv[i + 1];
    }
    if (n < 1 || n > REQUESTS_MAX || nlone < 0 || nlone > 1000 || port <= 0 || port > 65535) {
        fprintf(stderr, "storm: bad arguments\n");
        return 2;
    }
    cs = calloc((size_t)n, sizeof *cs);
    one = calloc(1, sizeof *one);
    lat = calloc((size_t)n, sizeof *lat);
    lone_lat = calloc((size_t)nlone + 1, sizeof *lone_lat);
    if (cs == NULL || one == NULL || lat == NULL || lone_lat == NULL) {
        fprintf(stderr, "storm: out of memory\n");
        goto out;
    }
    for (i = 0; i < n; i++)
        cs[i].fd = -1;

    /* The lone requests: the same code path, one at a time, each on its own connection. */
    for (i = 0; i < nlone; i++) {
        memset(one, 0, sizeof *one);
        snprintf(lone_key, sizeof lone_key, "%s-%d", lone_prefix, i);
        one->req = build_request(token, lone_key, &one->req_len);
        one->fd = connect_to(host, port);
        if (one->req == NULL || one->fd < 0) {
            fprintf(stderr, "storm: cannot connect to %s:%d\n", host, port);
            conn_clear(one);
            goto out;
        }
        if (run(one, 1) == 0 && one->status == 201)
            lone_lat[nl++] = one->t_done - one->t_sent;
        conn_clear(one);
    }

    for (i = 0; i < n; i++) {
        cs[i].req = build_request(token, key, &cs[i].req_len);
        cs[i].fd = connect_to(host, port);
        if (cs[i].req == NULL || cs[i].fd < 0) {
            fprintf(stderr, "storm: cannot open connection %d to %s:%d\n", i, host, port);
            goto out;
        }
    }
    /* Let the server start a thread for every connection before anything is sent. */
    usleep(200 * 1000);
    failed = run(cs, n);
    first = 0;
    for (i = 0; i < n; i++) {
        if (cs[i].done && cs[i].status > 0) {
            lat[first++] = cs[i].t_done - cs[i].t_sent;
            statuses[cs[i].status < 600 ? cs[i].status : 0]++;
            replayed += cs[i].replayed;
        } else {
            statuses[0]++;
        }
    }
    latency_sort(lat, (size_t)first);
    latency_sort(lone_lat, (size_t)nl);
    printf("{\"requests\":%d,\"answered\":%d,\"failed\":%d,\"replayed_header\":%d,\"p50_ms\":%.3f,"
           "\"p99_ms\":%.3f,\"max_ms\":%.3f,\"lone\":%d,\"lone_p50_ms\":%.3f,\"lone_max_ms\":%.3f,"
           "\"statuses\":{",
           n, first, failed, replayed, pct_ms(lat, first, 0.5), pct_ms(lat, first, 0.99),
           pct_ms(lat, first, 1.0), nl, pct_ms(lone_lat, nl, 0.5), pct_ms(lone_lat, nl, 1.0));
    for (i = 0, first = 1; i < 600; i++) {
        if (statuses[i] > 0) {
            printf("%s\"%d\":%d", first ? "" : ",", i, statuses[i]);
            first = 0;
        }
    }
    printf("}}\n");
    rc = failed == 0 && nl == nlone ? 0 : 1;
out:
    if (cs != NULL)
        for (i = 0; i < n; i++)
            conn_clear(&cs[i]);
    free(cs);
    free(one);
    free(lat);
    free(lone_lat);
    return rc;
}
