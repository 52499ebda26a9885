/*
 * http.c - libmicrohttpd glue for provider-sim: one thread per connection (a tok_slow charge or
 * an injected latency then blocks only its own client), bodies capped at 1 MiB, and the one thing
 * orderd's server never does on purpose: returning MHD_NO after the handler ran, so MHD closes
 * the connection and the client gets no response although the effect is committed.
 */
#include "http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include <microhttpd.h>

#include "sim.h"
#include "util.h"
#include "banned.h"

#define CONNECTION_LIMIT 1024
#define THREAD_STACK_SIZE ((size_t)256 * 1024)
#define CONNECTION_TIMEOUT_S 60
#define STOP_GRACE_S 5

struct sim_server {
    struct MHD_Daemon *daemon;
    struct sim *sim;
    char url[128];
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int active;
};

struct pending {
    char *body;
    size_t len;
    size_t cap;
    int too_big;
    int answered;
};

/* ---- requests and responses ---------------------------------------------------------------- */

const char *request_header(const struct sim_request *rq, const char *name)
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

int request_header_count(const struct sim_request *rq, const char *name, const char **first,
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

const char *request_query(const struct sim_request *rq, const char *name)
{
    return MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, name);
}

void response_set_header(struct sim_response *r, const char *name, const char *value)
{
    if (r->nheaders == SIM_RESPONSE_MAX_HEADERS)
        die("too many response headers");
    r->headers[r->nheaders].name = xstrdup(name);
    r->headers[r->nheaders].value = xstrdup(value);
    r->nheaders++;
}

void response_bytes(struct sim_response *r, int status, const char *content_type, const void *body,
                    size_t len)
{
    free(r->body);
    r->body = xmalloc(len + 1);
    if (len > 0)
        memcpy(r->body, body, len);
    r->body[len] = '\0';
    r->body_len = len;
    r->status = status;
    r->content_type = content_type;
}

void response_json(struct sim_response *r, int status, const json_t *doc)
{
    free(r->body);
    r->body = json_text(doc, &r->body_len);
    r->status = status;
    r->content_type = "application/json";
}

static const char *title_of(const char *code)
{
    static const struct {
        const char *code, *title;
    } titles[] = {
        {"not-found", "Not found"},
        {"method-not-allowed", "Method not allowed"},
        {"body-too-large", "Request body too large"},
        {"invalid-json", "Body is not valid JSON"},
        {"validation-failed", "Validation failed"},
        {"idempotency-key-missing", "Idempotency-Key header missing"},
        {"idempotency-key-invalid", "Idempotency-Key header invalid"},
        {"idempotency-key-reused", "Idempotency-Key reused with a different request"},
        {"idempotency-request-in-progress", "A request with this Idempotency-Key is in progress"},
        {"provider-unavailable", "Provider unavailable"},
        {"card-declined", "Card declined"},
        {"charge-not-found", "Charge not found"},
        {"charge-not-refundable", "Charge cannot be refunded"},
        {"charge-already-refunded", "Charge already refunded"},
        {"internal-error", "Internal server error"},
    };
    size_t i;

    for (i = 0; i < sizeof titles / sizeof titles[0]; i++)
        if (strcmp(titles[i].code, code) == 0)
            return titles[i].title;
    return "Error";
}

char *problem_text(int status, const char *code, const char *detail, const json_t *extra,
                   size_t *len)
{
    json_t *doc = xcheck(json_object());
    const char *name;
    json_t *v;
    char type[128];
    char *text;

    snprintf(type, sizeof type, "/problems/%s", code);
    json_object_set_new(doc, "type", xcheck(json_string(type)));
    json_object_set_new(doc, "title", xcheck(json_string(title_of(code))));
    json_object_set_new(doc, "status", xcheck(json_integer(status)));
    if (json_object_set_new(doc, "detail", json_string(detail)) != 0)
        json_object_set_new(doc, "detail", xcheck(json_string(title_of(code))));
    json_object_set_new(doc, "code", xcheck(json_string(code)));
    if (extra != NULL)
        json_object_foreach((json_t *)extra, name, v) json_object_set(doc, name, v);
    text = json_text(doc, len);
    json_decref(doc);
    return text;
}

void response_problem(struct sim_response *r, int status, const char *code, const char *detail)
{
    free(r->body);
    r->body = problem_text(status, code, detail, NULL, &r->body_len);
    r->status = status;
    r->content_type = "application/problem+json";
}

static void response_clear(struct sim_response *r)
{
    size_t i;

    free(r->body);
    for (i = 0; i < r->nheaders; i++) {
        free(r->headers[i].name);
        free(r->headers[i].value);
    }
    memset(r, 0, sizeof *r);
}

/* ---- MHD callbacks ------------------------------------------------------------------------- */

static enum MHD_Result answer(struct sim_server *srv, struct MHD_Connection *conn,
                              const char *method, const char *url, struct pending *p)
{
    struct sim_request rq;
    struct sim_response resp;
    struct MHD_Response *mr;
    enum MHD_Result ret;
    size_t i;

    memset(&rq, 0, sizeof rq);
    memset(&resp, 0, sizeof resp);
    rq.conn = conn;
    rq.method = method;
    rq.path = url;
    rq.body = p->too_big ? NULL : p->body;
    rq.body_len = p->too_big ? 0 : p->len;
    rq.body_too_big = p->too_big;
    resp.status = 500;
    p->answered = 1;

    api_dispatch(srv->sim, &rq, &resp);
    if (resp.drop) {
        /* The lost response: whatever the handler did stays done, the client hears nothing. */
        response_clear(&resp);
        return MHD_NO;
    }
    mr = xcheck(MHD_create_response_from_buffer(resp.body_len, resp.body, MHD_RESPMEM_MUST_FREE));
    resp.body = NULL;
    if (resp.content_type != NULL)
        MHD_add_response_header(mr, MHD_HTTP_HEADER_CONTENT_TYPE, resp.content_type);
    for (i = 0; i < resp.nheaders; i++)
        MHD_add_response_header(mr, resp.headers[i].name, resp.headers[i].value);
    ret = MHD_queue_response(conn, (unsigned)resp.status, mr);
    MHD_destroy_response(mr);
    response_clear(&resp);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct sim_server *srv = cls;
    struct pending *p = *req_cls;
    size_t n = *upload_data_size;
    size_t cap;

    (void)version;
    if (p == NULL) {
        p = xcheck(calloc(1, sizeof *p));
        *req_cls = p;
        pthread_mutex_lock(&srv->mu);
        srv->active++;
        pthread_mutex_unlock(&srv->mu);
        return MHD_YES;
    }
    if (p->answered) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (n > 0) {
        if (p->too_big || p->len + n > SIM_BODY_MAX) {
            p->too_big = 1;
            free(p->body);
            p->body = NULL;
            p->len = p->cap = 0;
        } else {
            if (p->len + n + 1 > p->cap) {
                cap = p->cap ? p->cap : 1024;
                while (cap < p->len + n + 1)
                    cap *= 2;
                p->body = xrealloc(p->body, cap);
                p->cap = cap;
            }
            memcpy(p->body + p->len, upload_data, n);
            p->len += n;
            p->body[p->len] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    return answer(srv, conn, method, url, p);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct sim_server *srv = cls;
    struct pending *p = *req_cls;

    (void)conn;
    (void)toe;
    if (p == NULL)
        return;
    free(p->body);
    free(p);
    *req_cls = NULL;
    pthread_mutex_lock(&srv->mu);
    srv->active--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    size_t n;

    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    /* The lost-response fault closes connections on purpose; MHD calls that an error. */
    if (strstr(msg, "Application reported internal error") != NULL)
        return;
    log_msg("warn", "libmicrohttpd: %s", msg);
}

/* ---- listening ------------------------------------------------------------------------------ */

/* "HOST:PORT" with a literal or resolvable IPv4 host (the simulator serves loopback tests). */
static int resolve_listen(const char *listen, struct sockaddr_in *sa, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    const char *colon = strrchr(listen, ':');
    char host[256];
    int64_t port = 0;
    size_t hlen;
    int rc = -1;

    if (colon == NULL || colon == listen || strchr(listen, ':') != colon) {
        snprintf(err, errlen, "bad listen address '%s': expected HOST:PORT (IPv4)", listen);
        goto out;
    }
    hlen = (size_t)(colon - listen);
    if (hlen >= sizeof host || parse_int64(colon + 1, 0, 65535, &port) != 0) {
        snprintf(err, errlen, "bad listen address '%s': the port must be 0..65535", listen);
        goto out;
    }
    memcpy(host, listen, hlen);
    host[hlen] = '\0';
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL) {
        snprintf(err, errlen, "cannot resolve '%s' to an IPv4 address", host);
        goto out;
    }
    memcpy(sa, res->ai_addr, sizeof *sa);
    sa->sin_port = htons((uint16_t)port);
    rc = 0;
out:
    if (res != NULL)
        freeaddrinfo(res);
    return rc;
}

int sim_server_start(struct sim *sim, const char *listen, struct sim_server **out, char *err,
                     size_t errlen)
{
    struct sim_server *srv = NULL;
    struct sockaddr_in sa;
    const union MHD_DaemonInfo *info;
    pthread_condattr_t attr;
    char host[INET_ADDRSTRLEN];
    unsigned int flags;
    int rc = -1;

    *out = NULL;
    if (resolve_listen(listen, &sa, err, errlen) != 0)
        goto out;
    srv = xcheck(calloc(1, sizeof *srv));
    srv->sim = sim;
    if (pthread_mutex_init(&srv->mu, NULL) != 0 || pthread_condattr_init(&attr) != 0)
        die("cannot initialise a mutex");
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (pthread_cond_init(&srv->idle, &attr) != 0)
        die("cannot initialise a condition variable");
    pthread_condattr_destroy(&attr);
    flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
            MHD_USE_ITC;
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES)
        flags |= MHD_USE_POLL;
    srv->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)CONNECTION_LIMIT, MHD_OPTION_THREAD_STACK_SIZE, THREAD_STACK_SIZE,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT_S,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, srv, MHD_OPTION_END);
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
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
    snprintf(srv->url, sizeof srv->url, "http://%s:%u", host, (unsigned)info->port);
    *out = srv;
    srv = NULL;
    rc = 0;
out:
    sim_server_stop(srv);
    return rc;
}

const char *sim_server_url(const struct sim_server *srv)
{
    return srv->url;
}

void sim_server_stop(struct sim_server *srv)
{
    struct timespec deadline;
    MHD_socket fd;

    if (srv == NULL)
        return;
    if (srv->daemon != NULL) {
        fd = MHD_quiesce_daemon(srv->daemon);
        if (fd != MHD_INVALID_SOCKET)
            close(fd);
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += STOP_GRACE_S;
        pthread_mutex_lock(&srv->mu);
        while (srv->active > 0)
            if (pthread_cond_timedwait(&srv->idle, &srv->mu, &deadline) != 0)
                break;
        pthread_mutex_unlock(&srv->mu);
        MHD_stop_daemon(srv->daemon);
    }
    pthread_cond_destroy(&srv->idle);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}
