/* SPDX-License-Identifier: Apache-2.0 */
/*
 * listen.c - the server's front door: the listening sockets (one per loop, SO_REUSEPORT, after
 * checking no other server holds the address), the resolution of "HOST:PORT", the open-file
 * limit, and accepting: a new connection is counted in all and per client address
 * (--max-connections, --max-connections-per-ip) and refused with a 503 over either cap.
 */
#include "loop_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"
#include "banned.h"

/* ---- per-address counts ---------------------------------------------------------------------- */

struct ip_slot **http__ip_find(struct http_server *srv, const unsigned char ip[16])
{
    uint32_t h = 2166136261u;
    struct ip_slot **pp;
    int i;

    for (i = 0; i < 16; i++)
        h = (h ^ ip[i]) * 16777619u;
    for (pp = &srv->ips[h % IP_BUCKETS]; *pp != NULL; pp = &(*pp)->next) {
        if (memcmp((*pp)->ip, ip, 16) == 0)
            break;
    }
    return pp;
}

/* Takes a slot for `ip`; 0, or -1 when the address holds its cap already. */
static int ip_get(struct http_server *srv, const unsigned char ip[16])
{
    struct ip_slot **pp;
    int rc = 0;

    pthread_mutex_lock(&srv->ipmu);
    pp = http__ip_find(srv, ip);
    if (*pp == NULL) {
        *pp = xcalloc(1, sizeof **pp);
        memcpy((*pp)->ip, ip, 16);
    }
    if (srv->opts.limits.max_connections_per_ip > 0 &&
        (*pp)->count >= srv->opts.limits.max_connections_per_ip)
        rc = -1;
    else
        (*pp)->count++;
    pthread_mutex_unlock(&srv->ipmu);
    return rc;
}

void http__ip_put(struct http_server *srv, const unsigned char ip[16])
{
    struct ip_slot **pp, *gone = NULL;

    pthread_mutex_lock(&srv->ipmu);
    pp = http__ip_find(srv, ip);
    if (*pp != NULL && --(*pp)->count <= 0) {
        gone = *pp;
        *pp = gone->next;
    }
    pthread_mutex_unlock(&srv->ipmu);
    free(gone);
}

/* ---- accepting ------------------------------------------------------------------------------- */

static void peer_of(struct conn *c)
{
    struct sockaddr_storage ss;
    int len = (int)sizeof ss;

    memset(c->ip, 0, sizeof c->ip);
    c->peer[0] = '\0';
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;

        /* IPv4 as ::ffff:a.b.c.d, so that one table holds both families. */
        c->ip[10] = 0xff;
        c->ip[11] = 0xff;
        memcpy(c->ip + 12, &in->sin_addr, 4);
        inet_ntop(AF_INET, &in->sin_addr, c->peer, sizeof c->peer);
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;

        memcpy(c->ip, &in6->sin6_addr, 16);
        inet_ntop(AF_INET6, &in6->sin6_addr, c->peer, sizeof c->peer);
    }
}

void http__on_connection(uv_stream_t *server, int status)
{
    struct http_loop *lp = server->data;
    struct http_server *srv = lp->srv;
    struct conn *c;
    int total;

    if (status < 0)
        return;
    c = xcalloc(1, sizeof *c);
    c->lp = lp;
    c->state = CONN_NEW;
    atomic_fetch_add(&lp->in_state[CONN_NEW], 1);
    atomic_fetch_add(&srv->nconns, 1);
    request_parser_init(&c->rp, &(struct request_parser_limits){
                                    .max_header_bytes = (size_t)srv->opts.limits.max_header_bytes,
                                    .max_body = srv->opts.max_body,
                                    .body_too_large = srv->body_too_large});
    response_init(&c->resp);
    uv_tcp_init(&lp->uv, &c->tcp);
    c->tcp.data = c;
    http__set_state(c, CONN_FRESH);
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        http__conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    peer_of(c);
    if (srv->opts.tls != NULL) {
        /* Over TLS a refusal below cannot be written before a handshake: it closes. */
        c->tls = tls_conn_new(srv->opts.tls);
        c->handshaking = 1;
    }
    c->start_ns = clock_mono_ns();
    total = atomic_load(&srv->nconns);
    if (total > srv->opts.limits.max_connections) {
        atomic_fetch_add(&srv->st_refused, 1);
        http__send_problem(c, http__current_request(c), 503, "too-many-connections",
                           "This server holds as many connections as it may; retry shortly.", 0);
        return;
    }
    if (ip_get(srv, c->ip) != 0) {
        atomic_fetch_add(&srv->st_refused, 1);
        http__send_problem(c, http__current_request(c), 503, "too-many-connections",
                           "Your address holds as many connections as it may; close some, or retry "
                           "shortly.",
                           0);
        return;
    }
    c->counted = 1;
    atomic_fetch_add(&srv->st_open, 1);
    http__start_reading(c);
}

/* ---- listening sockets ----------------------------------------------------------------------- */

/*
 * Opens one listening socket on `sa` with SO_REUSEPORT, so that each loop has its own.  Returns
 * the descriptor or -errno.
 */
int http__listen_socket(const struct sockaddr *sa, socklen_t salen)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    int err;

    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (sa->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, sa, salen) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

/*
 * Whether another socket (another server, or this one started twice) holds the address: a plain
 * bind, without SO_REUSEPORT, fails then.  Without this check a second server (orderd,
 * idem-gateway, provider-sim) would quietly share the port with the first, and requests would
 * alternate between them.  SO_REUSEADDR here: a port left in TIME_WAIT by a server that just
 * stopped is free.
 */
int http__address_taken(const struct sockaddr *sa, socklen_t salen)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    int taken = 0;

    if (fd < 0)
        return 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (sa->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    taken = bind(fd, sa, salen) != 0 && errno == EADDRINUSE;
    close(fd);
    return taken;
}

int http_listen_split(const char *listen, char *host, size_t host_cap, uint16_t *port, char *err,
                      size_t errlen)
{
    const char *host_start = listen;
    const char *port_text;
    const char *end;
    size_t hlen;
    int64_t p = 0;
    int rc = -1;

    if (listen[0] == '[') {
        end = strchr(listen, ']');
        if (end == NULL || end[1] != ':') {
            snprintf(err, errlen, "bad listen address '%s': expected [IPV6]:PORT", listen);
            goto out;
        }
        hlen = (size_t)(end - listen - 1);
        port_text = end + 2;
        host_start = listen + 1;
    } else {
        end = strrchr(listen, ':');
        if (end == NULL) {
            snprintf(err, errlen, "bad listen address '%s': expected HOST:PORT", listen);
            goto out;
        }
        if (strchr(listen, ':') != end) {
            snprintf(err, errlen, "bad listen address '%s': write IPv6 as [ADDR]:PORT", listen);
            goto out;
        }
        hlen = (size_t)(end - listen);
        port_text = end + 1;
    }
    if (hlen == 0) {
        snprintf(err, errlen, "bad listen address '%s': give the address, e.g. 127.0.0.1:8080",
                 listen);
        goto out;
    }
    if (hlen >= host_cap) {
        snprintf(err, errlen, "bad listen address '%s': host too long", listen);
        goto out;
    }
    if (parse_int64(port_text, 0, 65535, &p) != 0) {
        snprintf(err, errlen, "bad listen address '%s': the port must be 0..65535", listen);
        goto out;
    }
    memcpy(host, host_start, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)p;
    rc = 0;
out:
    return rc;
}

/*
 * Resolves "HOST:PORT" / "[V6]:PORT" into a socket address (IPv4 only unless `ipv6`).  Only the
 * address given is bound: there is no "all interfaces" default, a wildcard must be spelled out
 * (0.0.0.0, [::]).
 */
int http__resolve_listen(const char *listen, int ipv6, struct sockaddr_storage *ss,
                         socklen_t *sslen, char *err, size_t errlen)
{
    char host[256];
    struct addrinfo hints, *res = NULL, *ai, *pick = NULL;
    uint16_t port = 0;
    int rc = -1;
    int gai;

    if (http_listen_split(listen, host, sizeof host, &port, err, errlen) != 0)
        goto out;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = ipv6 ? AF_UNSPEC : AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(gai));
        goto out;
    }
    /* "localhost" may give both families: prefer IPv4, which every client tries. */
    for (ai = res; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            pick = ai;
            break;
        }
        if (ai->ai_family == AF_INET6 && pick == NULL)
            pick = ai;
    }
    if (pick == NULL) {
        snprintf(err, errlen, "'%s' has no IPv4 or IPv6 address", host);
        goto out;
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, pick->ai_addr, pick->ai_addrlen);
    *sslen = pick->ai_addrlen;
    if (pick->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons(port);
    rc = 0;
out:
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

/* Enough descriptors for every connection the limits allow, as far as the hard limit goes. */
void http__raise_fd_limit(const struct http_server *srv)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)srv->opts.limits.max_connections + 1024;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        http__server_log(srv, "cannot raise the open-file limit to %llu", (unsigned long long)want);
}
