/*
 * http_server.c - libmicrohttpd glue for orderd and provider-sim.  MHD runs one thread per
 * connection, so a handler may block in the engine while a duplicate request waits for the first
 * one (or a provider-sim fault delays only its own client); that is the simplest model that is
 * correct here, and the thread stack is kept small so a thousand waiting connections stay cheap.
 * This file owns everything MHD-specific: binding the listen address, collecting the body under
 * the 1 MiB cap, turning a struct response into an MHD response (or into no response at all, for
 * provider-sim's lost-response fault), and a graceful stop.  What the programs do with a request
 * comes in through struct http_server_options.
 */
#include "http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include <microhttpd.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define CONNECTION_LIMIT 1024
#define THREAD_STACK_SIZE ((size_t)256 * 1024)
/*
 * libmicrohttpd's per-connection memory pool holds the request line and headers and the response
 * headers (bodies are kept elsewhere).  Its 32 KiB default is most of the memory of an idle
 * keep-alive connection; 16 KiB still leaves room for 8 KiB of request headers.
 */
#define CONNECTION_MEMORY ((size_t)16 * 1024)
#define CONNECTION_TIMEOUT_S 60

struct http_server {
    struct MHD_Daemon *daemon;
    struct http_server_options opts;
    char url[128];

    /* Requests between their first byte and the end of their response, for a graceful stop. */
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int active;
    int stopping;
};

/* One request in flight: MHD's per-request pointer. */
struct pending {
    int64_t start_ns;
    struct strbuf body;
    size_t drained;
    int has_body;
    int too_big;
    int answered;
};

static void server_log(const struct http_server *srv, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void server_log(const struct http_server *srv, const char *fmt, ...)
{
    char line[640];
    va_list ap;

    if (srv->opts.log == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    srv->opts.log(srv->opts.ctx, line);
}

/* ---- request accessors ---------------------------------------------------------------------- */

const char *request_header(const struct request *rq, const char *name)
{
    return MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name);
}

struct header_count {
    const char *name;
    int count;
    const char *first;
    size_t first_len;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    size_t key_size, const char *value, size_t value_size)
{
    struct header_count *hc = cls;

    (void)kind;
    (void)key_size;
    if (key != NULL && strcasecmp(key, hc->name) == 0) {
        if (hc->count == 0) {
            hc->first = value ? value : "";
            hc->first_len = value ? value_size : 0;
        }
        hc->count++;
    }
    return MHD_YES;
}

int request_header_count(const struct request *rq, const char *name, const char **first,
                         size_t *first_len)
{
    struct header_count hc = {name, 0, NULL, 0};

    MHD_get_connection_values_n(rq->conn, MHD_HEADER_KIND, count_header, &hc);
    if (first != NULL)
        *first = hc.first;
    if (first_len != NULL)
        *first_len = hc.first_len;
    return hc.count;
}

const char *request_query(const struct request *rq, const char *name)
{
    return MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* ---- answering ------------------------------------------------------------------------------ */

static enum MHD_Result answer(struct http_server *srv, struct MHD_Connection *conn,
                              const char *method, const char *url, struct pending *p)
{
    const struct http_server_options *o = &srv->opts;
    struct request rq;
    struct response resp;
    struct MHD_Response *mr = NULL;
    enum MHD_Result ret = MHD_NO;
    size_t i;
    int stopping;

    memset(&rq, 0, sizeof rq);
    rq.conn = conn;
    rq.method = method;
    rq.path = url;
    rq.body = p->too_big ? NULL : p->body.buf;
    rq.body_len = p->too_big ? 0 : p->body.len;
    rq.has_body = p->has_body;
    rq.body_too_big = p->too_big;

    response_init(&resp);
    o->handle(o->ctx, &rq, &resp);
    p->answered = 1;
    if (resp.drop) {
        /* The lost response: whatever the handler did stays done, the client hears nothing. */
        response_clear(&resp);
        return MHD_NO;
    }

    /* MHD frees the body with free() once sent: hand it over. */
    mr = xcheck(MHD_create_response_from_buffer(resp.body_len, resp.body, MHD_RESPMEM_MUST_FREE));
    resp.body = NULL;
    for (i = 0; i < resp.nheaders; i++) {
        if (MHD_add_response_header(mr, resp.headers[i].name, resp.headers[i].value) != MHD_YES)
            server_log(srv, "cannot add response header %s", resp.headers[i].name);
    }
    pthread_mutex_lock(&srv->mu);
    stopping = srv->stopping;
    pthread_mutex_unlock(&srv->mu);
    /* A stopping server answers, then lets the client reconnect elsewhere. */
    if (stopping)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONNECTION, "close");
    ret = MHD_queue_response(conn, (unsigned)resp.status, mr);
    MHD_destroy_response(mr);

    if (o->answered != NULL)
        o->answered(o->ctx, &rq, &resp, (double)(mono_ns() - p->start_ns) / 1e9);
    response_clear(&resp);
    return ret;
}

static void keep_body(struct pending *p, const char *data, size_t n)
{
    p->has_body = 1;
    if (p->too_big || p->body.len + n > HTTP_BODY_MAX) {
        /* Drop what was kept: the request will be refused, its bytes are only drained. */
        p->too_big = 1;
        p->drained += n;
        strbuf_release(&p->body);
    } else {
        strbuf_add(&p->body, data, n);
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct http_server *srv = cls;
    struct pending *p = *req_cls;
    enum MHD_Result ret = MHD_YES;
    const char *cl;
    const char *te;
    int64_t announced = 0;

    (void)version;
    if (p == NULL) {
        /* The first call: headers only. */
        p = xcalloc(1, sizeof *p);
        p->start_ns = mono_ns();
        *req_cls = p;
        pthread_mutex_lock(&srv->mu);
        srv->active++;
        pthread_mutex_unlock(&srv->mu);
        cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
        if (cl != NULL && parse_int64(cl, 0, INT64_MAX, &announced) == 0 && announced > 0)
            p->has_body = 1;
        if (te != NULL)
            p->has_body = 1;
        if (srv->opts.refuse_early && (uint64_t)announced > HTTP_BODY_MAX) {
            /* Answer before the body is read: MHD then closes the connection. */
            p->too_big = 1;
            ret = answer(srv, conn, method, url, p);
        }
    } else if (p->answered) {
        *upload_data_size = 0;
    } else if (*upload_data_size > 0) {
        keep_body(p, upload_data, *upload_data_size);
        *upload_data_size = 0;
        if (srv->opts.drain_max > 0 && p->drained > srv->opts.drain_max)
            ret = MHD_NO;
    } else {
        ret = answer(srv, conn, method, url, p);
    }
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *srv = cls;
    struct pending *p = *req_cls;

    (void)conn;
    (void)toe;
    if (p != NULL) {
        strbuf_release(&p->body);
        free(p);
        *req_cls = NULL;
        pthread_mutex_lock(&srv->mu);
        srv->active--;
        pthread_cond_broadcast(&srv->idle);
        pthread_mutex_unlock(&srv->mu);
    }
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    const struct http_server *srv = cls;
    char msg[512];
    size_t n;

    vsnprintf(msg, sizeof msg, fmt, ap);
    n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    server_log(srv, "libmicrohttpd: %s", msg);
}

/* ---- listening ------------------------------------------------------------------------------ */

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
static int resolve_listen(const char *listen, int ipv6, struct sockaddr_storage *ss, int *v6,
                          uint16_t *port, char *err, size_t errlen)
{
    char host[256];
    struct addrinfo hints, *res = NULL, *ai, *pick = NULL;
    int rc = -1;
    int gai;

    if (http_listen_split(listen, host, sizeof host, port, err, errlen) != 0)
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
    if (pick->ai_family == AF_INET6) {
        ((struct sockaddr_in6 *)ss)->sin6_port = htons(*port);
        *v6 = 1;
    } else {
        ((struct sockaddr_in *)ss)->sin_port = htons(*port);
        *v6 = 0;
    }
    rc = 0;
out:
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

int http_server_start(const struct http_server_options *opts, const char *listen,
                      struct http_server **out, char *err, size_t errlen)
{
    struct http_server *srv = NULL;
    struct sockaddr_storage ss;
    struct MHD_OptionItem extra[2];
    const union MHD_DaemonInfo *info;
    char host[INET6_ADDRSTRLEN];
    pthread_condattr_t attr;
    uint16_t port = 0;
    unsigned int flags;
    int v6 = 0;
    int rc = -1;

    *out = NULL;
    if (resolve_listen(listen, opts->ipv6, &ss, &v6, &port, err, errlen) != 0)
        goto out;
    srv = xcalloc(1, sizeof *srv);
    srv->opts = *opts;
    if (pthread_mutex_init(&srv->mu, NULL) != 0 || pthread_condattr_init(&attr) != 0)
        die("cannot initialise a mutex");
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (pthread_cond_init(&srv->idle, &attr) != 0)
        die("cannot initialise a condition variable");
    pthread_condattr_destroy(&attr);

    /* MHD_USE_ITC lets http_server_stop() quiesce the listening socket first. */
    flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
            MHD_USE_ITC;
    /* poll(), not select(): a thousand connections and the store pass FD_SETSIZE. */
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES)
        flags |= MHD_USE_POLL;
    if (v6)
        flags |= MHD_USE_IPv6;
    /* The reuse option only when asked: absent, MHD keeps its default, which a 0 would not be. */
    memset(extra, 0, sizeof extra);
    extra[0].option = opts->reuse_address ? MHD_OPTION_LISTENING_ADDRESS_REUSE : MHD_OPTION_END;
    extra[0].value = 1;
    extra[1].option = MHD_OPTION_END;
    /* The logger comes first so that MHD's own start-up messages go through it too. */
    srv->daemon = MHD_start_daemon(
        flags, port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)CONNECTION_LIMIT, MHD_OPTION_THREAD_STACK_SIZE, THREAD_STACK_SIZE,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT_S,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_ARRAY, extra, MHD_OPTION_END);
    if (srv->daemon == NULL) {
        snprintf(err, errlen, "cannot listen on %s (address in use, or not a local address?)",
                 listen);
        goto out;
    }
    info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (info == NULL || info->port == 0) {
        snprintf(err, errlen, "cannot learn the port bound for %s", listen);
        goto out;
    }
    if (v6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
        snprintf(srv->url, sizeof srv->url, "http://[%s]:%u", host, (unsigned)info->port);
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
        snprintf(srv->url, sizeof srv->url, "http://%s:%u", host, (unsigned)info->port);
    }
    *out = srv;
    srv = NULL;
    rc = 0;
out:
    http_server_stop(srv);
    return rc;
}

const char *http_server_url(const struct http_server *srv)
{
    return srv->url;
}

/*
 * A graceful stop: no new connections, the requests in flight finish (a request in its
 * handler is answered and its result stored) within stop_grace_s, then everything closes.
 */
void http_server_stop(struct http_server *srv)
{
    struct timespec deadline;
    MHD_socket listen_fd;

    if (srv == NULL)
        return;
    if (srv->daemon != NULL) {
        pthread_mutex_lock(&srv->mu);
        srv->stopping = 1;
        pthread_mutex_unlock(&srv->mu);
        listen_fd = MHD_quiesce_daemon(srv->daemon);
        if (listen_fd != MHD_INVALID_SOCKET)
            close(listen_fd);
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += srv->opts.stop_grace_s;
        pthread_mutex_lock(&srv->mu);
        while (srv->active > 0) {
            if (pthread_cond_timedwait(&srv->idle, &srv->mu, &deadline) != 0)
                break;
        }
        if (srv->active > 0)
            server_log(srv, "stopping with %d requests unfinished", srv->active);
        pthread_mutex_unlock(&srv->mu);
        MHD_stop_daemon(srv->daemon);
    }
    pthread_cond_destroy(&srv->idle);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}
