/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_server.c - the event-driven server of http_server.h.  Each loop thread runs a libuv loop
 * with its own listening socket (SO_REUSEPORT: the kernel spreads new connections over the
 * loops), reads its connections into request_parser.c, and writes their responses.  A request
 * whose handler may block goes to the worker pool (one queue for the server, bounded); the worker
 * hands the connection back through its loop's `done` list and an async wake-up, and only the
 * loop ever touches the socket.
 *
 * Time limits are kept without a timer per connection: a connection sits in at most one list per
 * kind of deadline (idle, head, body, write, linger), appended when it enters that state, so each
 * list is in deadline order and a tick of the loop only looks at the heads.
 *
 * A refused request is answered with a problem+json and, when its body was not read, closed
 * "lingering": the write side is shut and the rest of the body is read and dropped for a bounded
 * time, so that the client reads the answer instead of a reset.
 *
 * Why one file of ~2,000 lines: a connection's states (head, body, handler, worker, write,
 * stream, linger) and its deadline lists are one state machine owned by its loop, and every
 * transition touches both; the parts that are not it have their own files (request_parser.c,
 * response.c, http_client.c).
 */
#include "http_server.h"
#include "ascii.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>
#ifdef __linux__
#include <linux/sockios.h> /* SIOCOUTQ */
#endif

#include "loop_internal.h"
#include "problem.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

#define LOOPS_MAX 8 /* as HTTP_LIMITS_FLAGS' http-threads */
#define READ_CHUNK ((size_t)64 * 1024)
#define TICK_MS 100
#define LISTEN_BACKLOG 4096
/* A refused request's unread body is dropped for at most this long, and this many bytes. */
#define LINGER_MS 5000
#define LINGER_MAX_BYTES ((size_t)64 << 20)
#define IP_BUCKETS 1024

enum conn_state {
    CONN_IDLE,      /* waiting for the first byte of a request */
    CONN_HEAD,      /* request line and header fields arriving */
    CONN_BODY,      /* body arriving */
    CONN_WORKING,   /* on a worker (or queued for one): the loop does not read */
    CONN_WRITING,   /* the response is being written */
    CONN_LINGER,    /* answered, write side shut, dropping what the client still sends */
    CONN_CLOSING,   /* uv_close() called */
    CONN_NEW,       /* accepted, not placed yet */
    CONN_PARKED,    /* the program parked the request on the loop (on_loop): no thread held */
    CONN_FRESH,     /* accepted, no byte yet: the head deadline, not the idle one, applies */
    CONN_STREAMING, /* a streamed body is being written (struct stream) */
    CONN_NSTATES
};

/*
 * The deadline lists a connection sits in, one per state that has a deadline.  In each list
 * but the last two every entry has the same timeout, so the list is in deadline order.
 */
enum deadline_list {
    LIST_NONE = -1,
    LIST_IDLE,   /* idle_timeout_ms */
    LIST_HEAD,   /* head_timeout_ms */
    LIST_BODY,   /* body_timeout_ms */
    LIST_WRITE,  /* write_timeout_ms */
    LIST_LINGER, /* LINGER_MS */
    LIST_FRESH,  /* head_timeout_ms, from the accept */
    /* Deadlines that differ per connection: the tick looks at every entry. */
    LIST_PARKED,    /* the program's park timeout */
    LIST_STREAMING, /* a stream's stalls and minimum rate (stream_check) */
    NLISTS
};

static const enum deadline_list state_list[CONN_NSTATES] = {
    [CONN_IDLE] = LIST_IDLE,           [CONN_HEAD] = LIST_HEAD,
    [CONN_BODY] = LIST_BODY,           [CONN_WORKING] = LIST_NONE,
    [CONN_WRITING] = LIST_WRITE,       [CONN_LINGER] = LIST_LINGER,
    [CONN_CLOSING] = LIST_NONE,        [CONN_NEW] = LIST_NONE,
    [CONN_PARKED] = LIST_PARKED,       [CONN_FRESH] = LIST_FRESH,
    [CONN_STREAMING] = LIST_STREAMING,
};

/* Why a connection is on its loop's `done` list (several may be true at once). */
#define DONE_JOB 1  /* a worker finished its job */
#define DONE_WAKE 2 /* http_server_unpark() */

enum job { JOB_HEAD, JOB_HANDLE };

struct http_loop;
struct stream;

struct conn {
    uv_tcp_t tcp; /* first: a uv_handle_t * of it is the conn */
    struct http_loop *lp;
    enum conn_state state;
    struct conn *prev, *next; /* in the deadline list of `state` */
    uint64_t since;           /* loop time the state began */
    struct conn *qnext;       /* in the worker queue, then in the loop's done list */
    int done_flags;           /* DONE_*: why it is on the done list (lp->mu) */
    _Atomic int job_refs;     /* the worker and a deferred answer: the last one hands it back */
    int queued;               /* on the done list (lp->mu) */
    int free_later;           /* closed while on the done list: freed when taken off it */
    enum job job;
    void *park_data;        /* the program's, while parked */
    int must_finish;        /* parked with http_park.must_finish: counted in the server's */
    uint64_t park_deadline; /* loop time */
    enum http_head_verdict verdict;

    struct request_parser rp;
    struct request rq_stub; /* for a request refused before its head was read */
    char *in;               /* bytes read, not parsed yet (a pipelined request) */
    size_t in_len;

    struct response resp;
    int64_t start_ns;
    int keep_alive; /* after this response */
    int report;     /* a request came (even a malformed one): tell `answered` */
    int reading;
    int parsing; /* inside parse(): it goes on by itself after a response written at once */
    uv_write_t wr;
    uv_shutdown_t sd;
    char *out;
    size_t drained;
    struct stream *st;   /* in CONN_STREAMING (and until it is closed after a cut stream) */
    int stream_reserved; /* holds a stream slot (http_stream_reserve, or the stream's start) */

    char peer[INET6_ADDRSTRLEN];
    unsigned char ip[16];
    int counted; /* holds a slot in the per-address table */
};

struct http_loop {
    struct http_server *srv;
    uv_loop_t uv;
    uv_tcp_t listener;
    uv_async_t wake;
    uv_timer_t tick;
    uv_prepare_t before_wait; /* opts.before_wait, each turn before the loop polls */
    pthread_t thread;
    int started;

    pthread_mutex_t mu; /* guards `done` */
    struct conn *done;

    struct conn *head[NLISTS], *tail[NLISTS];
    _Atomic int in_state[CONN_NSTATES]; /* read by the stopping thread */
    int closing_listener;
    _Atomic int halted; /* set by http_server_stop(), read by the loop */
    char date[48];
    time_t date_at;
    /* What else lives on this loop (http_client.c's pools), closed before its handles are. */
    struct {
        void (*fn)(void *arg);
        void *arg;
    } at_stop[4];
    int nat_stop;
    char buf[READ_CHUNK];
};

/* The loop the calling thread runs, NULL on any other thread (loop_internal.h). */
static _Thread_local struct http_loop *current_loop;

uv_loop_t *http_loop_current(void)
{
    return current_loop ? &current_loop->uv : NULL;
}

int http_loop_at_stop(void (*fn)(void *arg), void *arg)
{
    struct http_loop *lp = current_loop;

    if (!lp || lp->nat_stop == (int)(sizeof lp->at_stop / sizeof lp->at_stop[0]))
        return -1;
    lp->at_stop[lp->nat_stop].fn = fn;
    lp->at_stop[lp->nat_stop].arg = arg;
    lp->nat_stop++;
    return 0;
}

/*
 * A stream is held to stream_min_rate once it has waited this long for its client in all (a slow
 * start is no offence).
 */
#define STREAM_RATE_GRACE_MS 10000

struct ip_slot {
    struct ip_slot *next;
    unsigned char ip[16];
    int count;
    int streams; /* http_stream_reserve()d */
};

struct http_server {
    struct http_server_options opts;
    char url[128];
    char body_too_large[96]; /* the 413's detail for opts.max_body */
    int nloops;
    struct http_loop *loops;

    pthread_t *workers;
    int nworkers;
    pthread_mutex_t qmu;
    pthread_cond_t qcond;
    struct conn *qhead, *qtail;
    int qlen;
    int qstop;

    pthread_mutex_t ipmu;
    struct ip_slot *ips[IP_BUCKETS];
    int nstreams; /* http_stream_reserve()d, all clients (ipmu) */
    _Atomic int nconns;

    _Atomic int stopping;
    _Atomic int64_t stop_deadline_ns; /* the end of a stop's grace: streams are cut there */
    _Atomic int parked_must_finish;   /* parked requests a stop waits for past its grace */
    int64_t stop_quiet_ns;            /* past the grace, since when nothing was finishing */
    _Atomic uint64_t st_open, st_refused, st_timeouts, st_heads, st_queue_full;
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

/* ---- limits ---------------------------------------------------------------------------------- */

void http_limits_resolve(struct http_limits *l)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (l->max_connections <= 0)
        l->max_connections = HTTP_DEFAULT_MAX_CONNECTIONS;
    if (l->max_connections_per_ip == 0)
        l->max_connections_per_ip = HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP;
    if (l->head_timeout_ms <= 0)
        l->head_timeout_ms = HTTP_DEFAULT_HEAD_TIMEOUT_MS;
    if (l->body_timeout_ms <= 0)
        l->body_timeout_ms = HTTP_DEFAULT_BODY_TIMEOUT_MS;
    if (l->idle_timeout_ms <= 0)
        l->idle_timeout_ms = HTTP_DEFAULT_IDLE_TIMEOUT_MS;
    if (l->write_timeout_ms <= 0)
        l->write_timeout_ms = HTTP_DEFAULT_WRITE_TIMEOUT_MS;
    if (l->max_header_bytes <= 0)
        l->max_header_bytes = HTTP_DEFAULT_MAX_HEADER_BYTES;
    if (l->loops <= 0)
        l->loops = cpus < 1 ? 1 : cpus > LOOPS_MAX ? LOOPS_MAX : (int)cpus;
    if (l->workers <= 0)
        l->workers = HTTP_DEFAULT_WORKERS;
    if (l->queue <= 0)
        l->queue = HTTP_DEFAULT_QUEUE;
    if (l->stream_min_rate == 0)
        l->stream_min_rate = HTTP_DEFAULT_STREAM_MIN_RATE;
    if (l->streams_per_ip == 0)
        l->streams_per_ip = HTTP_DEFAULT_STREAMS_PER_IP;
    if (l->max_streams == 0)
        l->max_streams = HTTP_DEFAULT_MAX_STREAMS;
}

const char http_limits_help[] =
    "HTTP limits (per server; a client over them gets a problem+json, then the connection "
    "closes):\n"
    "  --max-connections N      open connections in all (default 10000)\n"
    "  --max-connections-per-ip N   open connections from one client address, -1 for no cap\n"
    "                           (default 256)\n"
    "  --head-timeout-ms N      first byte of a request to the end of its headers, and a new\n"
    "                           connection's wait for its first byte (default 10000)\n"
    "  --body-timeout-ms N      end of the headers to the end of the body (default 30000)\n"
    "  --idle-timeout-ms N      a keep-alive connection with no request (default 60000)\n"
    "  --write-timeout-ms N     a response the client does not read (default 30000)\n"
    "  --max-header-bytes N     request line + headers, over it 431 (default 8192)\n"
    "  --http-threads N         event-loop threads (default: the number of CPUs, at most 8)\n"
    "  --http-workers N         threads that run handlers which may block (default 64)\n"
    "  --http-queue N           requests waiting for a worker before 503 (default 4096)\n"
    "  --stream-min-rate N      bytes/s a client must take a streamed answer at once the server\n"
    "                           has waited 10 s for it, or it is cut; -1 for none (default 16384)\n"
    "  --streams-per-ip N       streamed answers one client address may read at once, 503\n"
    "                           beyond; -1 for no cap (default 4)\n"
    "  --max-streams N          streamed answers all clients may read at once, 503 beyond; -1\n"
    "                           for no cap (default 1024)\n";

int http_limits_flag(struct http_limits *l, const char *name, const char *value, char *err,
                     size_t errlen)
{
#define HTTP_LIMIT_ROW(n, field, lo, hi) {n, offsetof(struct http_limits, field), lo, hi},
    static const struct {
        const char *name;
        size_t offset;
        int64_t min, max;
    } flags[] = {HTTP_LIMITS_FLAGS(HTTP_LIMIT_ROW)};
#undef HTTP_LIMIT_ROW
    size_t i;
    int64_t v = 0;

    if (strncmp(name, "--", 2) == 0)
        name += 2;
    for (i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (strcmp(name, flags[i].name) != 0)
            continue;
        if (value == NULL || parse_int64(value, flags[i].min, flags[i].max, &v) != 0 ||
            (v == 0 && flags[i].min < 0)) {
            snprintf(err, errlen, "--%s must be an integer from %lld to %lld%s, not '%s'",
                     flags[i].name, (long long)flags[i].min, (long long)flags[i].max,
                     flags[i].min < 0 ? " other than 0" : "", value ? value : "");
            return -1;
        }
        *(int *)(void *)((char *)l + flags[i].offset) = (int)v;
        return 1;
    }
    return 0;
}

/* ---- request accessors ----------------------------------------------------------------------- */

int request_header_count(const struct request *rq, const char *name, const char **first,
                         size_t *first_len)
{
    size_t i;
    int count = 0;

    for (i = 0; i < rq->nfields; i++) {
        if (!ascii_caseeq(rq->fields[i].name, name))
            continue;
        if (count == 0 && first != NULL)
            *first = rq->fields[i].value;
        if (count == 0 && first_len != NULL)
            *first_len = rq->fields[i].value_len;
        count++;
    }
    if (count == 0 && first != NULL)
        *first = NULL;
    if (count == 0 && first_len != NULL)
        *first_len = 0;
    return count;
}

const char *request_header(const struct request *rq, const char *name)
{
    const char *v = NULL;

    request_header_count(rq, name, &v, NULL);
    return v;
}

int http_list_has_token(const char *list, const char *name)
{
    size_t n = strlen(name);

    while (list && *list) {
        size_t len;
        list += strspn(list, " \t,");
        len = strcspn(list, " \t,");
        if (len == n && ascii_ncaseeq(list, name, n))
            return 1;
        list += len;
    }
    return 0;
}

const char *http_hop_by_hop(const char *name)
{
    static const char *const names[] = {
        "Connection",        "Keep-Alive",         "Proxy-Connection",   "TE", "Trailer", "Upgrade",
        "Transfer-Encoding", "Proxy-Authenticate", "Proxy-Authorization"};

    return ascii_caseeq_any(name, names, sizeof names / sizeof names[0]);
}

int request_connection_lists(const struct request *rq, const char *name)
{
    for (size_t i = 0; i < rq->nfields; i++)
        if (ascii_caseeq(rq->fields[i].name, "Connection") &&
            http_list_has_token(rq->fields[i].value, name))
            return 1;
    return 0;
}

const char *request_query(const struct request *rq, const char *name)
{
    size_t i;

    for (i = 0; i < rq->nargs; i++) {
        if (strcmp(rq->args[i].name, name) == 0)
            return rq->args[i].value;
    }
    return NULL;
}

/* ---- per-address counts ---------------------------------------------------------------------- */

static struct ip_slot **ip_find(struct http_server *srv, const unsigned char ip[16])
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
static int ip_acquire(struct http_server *srv, const unsigned char ip[16])
{
    struct ip_slot **pp;
    int rc = 0;

    pthread_mutex_lock(&srv->ipmu);
    pp = ip_find(srv, ip);
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

static void ip_release(struct http_server *srv, const unsigned char ip[16])
{
    struct ip_slot **pp, *gone = NULL;

    pthread_mutex_lock(&srv->ipmu);
    pp = ip_find(srv, ip);
    if (*pp != NULL && --(*pp)->count <= 0) {
        gone = *pp;
        *pp = gone->next;
    }
    pthread_mutex_unlock(&srv->ipmu);
    free(gone);
}

/*
 * Takes a stream slot for c: 0, or -1 when the caps are reached (unless `force`: a stream its
 * handler cannot refuse still counts, so that the streams that can be refused are).
 */
static int stream_take(struct conn *c, int force)
{
    struct http_server *srv = c->lp->srv;
    struct ip_slot **pp;
    int cap_all, rc = 0;

    if (c->stream_reserved)
        return 0;
    cap_all = srv->opts.limits.max_streams;
    pthread_mutex_lock(&srv->ipmu);
    pp = c->counted ? ip_find(srv, c->ip) : NULL;
    if (!force && ((cap_all > 0 && srv->nstreams >= cap_all) ||
                   (pp != NULL && *pp != NULL && srv->opts.limits.streams_per_ip > 0 &&
                    (*pp)->streams >= srv->opts.limits.streams_per_ip))) {
        rc = -1;
    } else {
        srv->nstreams++;
        if (pp != NULL && *pp != NULL)
            (*pp)->streams++;
        c->stream_reserved = 1;
    }
    pthread_mutex_unlock(&srv->ipmu);
    return rc;
}

int http_stream_reserve(const struct request *rq)
{
    /* On the loop rq->completion is not set: the request is the one its connection parsed. */
    return stream_take((struct conn *)((char *)rq - offsetof(struct conn, rp.rq)), 0);
}

/* Gives back c's stream slot, if it holds one (its answer ended, or the connection did). */
static void stream_unreserve(struct conn *c)
{
    struct http_server *srv = c->lp->srv;
    struct ip_slot **pp;

    if (!c->stream_reserved)
        return;
    c->stream_reserved = 0;
    pthread_mutex_lock(&srv->ipmu);
    srv->nstreams--;
    pp = c->counted ? ip_find(srv, c->ip) : NULL;
    if (pp != NULL && *pp != NULL && (*pp)->streams > 0)
        (*pp)->streams--;
    pthread_mutex_unlock(&srv->ipmu);
}

/* ---- states and deadlines -------------------------------------------------------------------- */

static void list_unlink(struct http_loop *lp, struct conn *c)
{
    enum deadline_list l = state_list[c->state];

    if (l == LIST_NONE)
        return;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        lp->head[l] = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    else
        lp->tail[l] = c->prev;
    c->prev = c->next = NULL;
}

static void set_state(struct conn *c, enum conn_state st)
{
    struct http_loop *lp = c->lp;
    enum deadline_list l = state_list[st];

    list_unlink(lp, c);
    atomic_fetch_sub(&lp->in_state[c->state], 1);
    c->state = st;
    atomic_fetch_add(&lp->in_state[st], 1);
    c->since = uv_now(&lp->uv);
    if (l != LIST_NONE) {
        c->prev = lp->tail[l];
        c->next = NULL;
        if (lp->tail[l] != NULL)
            lp->tail[l]->next = c;
        else
            lp->head[l] = c;
        lp->tail[l] = c;
    }
}

static uint64_t state_timeout(const struct http_server *srv, enum conn_state st)
{
    const struct http_limits *l = &srv->opts.limits;

    switch (st) {
    case CONN_IDLE:
        return (uint64_t)l->idle_timeout_ms;
    case CONN_FRESH:
    case CONN_HEAD:
        return (uint64_t)l->head_timeout_ms;
    case CONN_BODY:
        return (uint64_t)l->body_timeout_ms;
    case CONN_WRITING:
        return (uint64_t)l->write_timeout_ms;
    case CONN_LINGER:
        return LINGER_MS;
    default:
        return UINT64_MAX;
    }
}

/* ---- closing --------------------------------------------------------------------------------- */

static void stream_release(struct conn *c, enum http_source_end how);

static void conn_free(struct conn *c)
{
    request_parser_release(&c->rp);
    response_clear(&c->resp);
    free(c->in);
    free(c->out);
    free(c);
}

static void on_closed(uv_handle_t *h)
{
    struct conn *c = (struct conn *)h;
    struct http_loop *lp = c->lp;
    struct http_server *srv = lp->srv;
    int queued;

    atomic_fetch_sub(&lp->in_state[c->state], 1);
    if (c->st != NULL)
        stream_release(c, HTTP_SOURCE_CLIENT); /* cut: the client went, or was cut off */
    stream_unreserve(c);
    if (c->counted)
        ip_release(srv, c->ip);
    atomic_fetch_sub(&srv->nconns, 1);
    /* A late wake-up may still hold it on the done list: on_wake frees it then. */
    pthread_mutex_lock(&lp->mu);
    queued = c->queued;
    c->free_later = queued;
    pthread_mutex_unlock(&lp->mu);
    if (!queued)
        conn_free(c);
}

/* Puts `c` on its loop's done list for `why` (DONE_*) and wakes the loop.  Any thread. */
static void loop_push(struct conn *c, int why)
{
    struct http_loop *lp = c->lp;
    int push;

    pthread_mutex_lock(&lp->mu);
    c->done_flags |= why;
    push = !c->queued;
    if (push) {
        c->queued = 1;
        c->qnext = lp->done;
        lp->done = c;
    }
    pthread_mutex_unlock(&lp->mu);
    uv_async_send(&lp->wake);
}

static void conn_close(struct conn *c)
{
    if (c->state == CONN_CLOSING || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    set_state(c, CONN_CLOSING);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/* ---- writing --------------------------------------------------------------------------------- */

// clang-format off
static const char *reason_phrase(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 425: return "Too Early";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}
// clang-format on

/* The Date header's value for `t` (IMF-fixdate) into `out`. */
static void format_date(time_t t, char out[48])
{
    struct tm tm;

    gmtime_r(&t, &tm);
    strftime(out, 48, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

/* Now, as the loop's cached Date (formatted once a second). */
static const char *http_date(struct http_loop *lp)
{
    time_t now = time(NULL);

    if (now != lp->date_at) {
        format_date(now, lp->date);
        lp->date_at = now;
    }
    return lp->date;
}

static void process_input(struct conn *c);
static void stream_start(struct conn *c, const struct request *rq, int keep_alive);
static void dispatch(struct conn *c, enum http_loop_verdict v, int keep);
static void start_reading(struct conn *c);
static void stop_reading(struct conn *c);

static void on_shutdown(uv_shutdown_t *sd, int status)
{
    (void)sd;
    (void)status;
}

/* The response is out: close, linger, or wait for the next request. */
static void written(struct conn *c, int status)
{
    free(c->out);
    c->out = NULL;
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (!c->keep_alive) {
        /* Shut the write side, and read what the client still sends until it closes. */
        set_state(c, CONN_LINGER);
        if (uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
            conn_close(c);
            return;
        }
        start_reading(c);
        return;
    }
    response_clear(&c->resp);
    response_init(&c->resp);
    set_state(c, CONN_IDLE);
    if (c->parsing)
        return; /* parse() goes on with the bytes it holds */
    if (c->in_len > 0)
        process_input(c);
    else
        start_reading(c);
}

static void on_write(uv_write_t *wr, int status)
{
    struct conn *c = wr->data;

    if (c->state == CONN_CLOSING)
        return;
    written(c, status);
}

/*
 * Writes `c->resp` as the answer to the current request (rq may be the stub of a request refused
 * early), then keeps the connection or closes it.
 */
/* How a response's body is delimited. */
enum framing {
    FRAME_LENGTH,  /* Content-Length: the body's length (or none, for a status without a body) */
    FRAME_CHUNKED, /* Transfer-Encoding: chunked (a streamed body of unknown length) */
    FRAME_CLOSE,   /* the end of the connection (the same, to an HTTP/1.0 client) */
};

/* The status line and header fields of `r` into `out`, with `framing` for a `length`-byte body. */
static void add_head(const struct conn *c, const struct response *r, int keep_alive,
                     enum framing framing, unsigned long long length, const char *date,
                     struct strbuf *out)
{
    int no_body = r->status == 204 || r->status == 304 || (r->status >= 100 && r->status < 200);
    size_t i;

    /* Piece by piece, no printf: this runs once per response. */
    strbuf_add(out, "HTTP/1.1 ", 9);
    strbuf_add_uint(out, (unsigned)r->status);
    strbuf_addch(out, ' ');
    strbuf_adds(out, reason_phrase(r->status));
    strbuf_add(out, "\r\n", 2);
    for (i = 0; i < r->nheaders; i++) {
        strbuf_adds(out, r->headers[i].name);
        strbuf_add(out, ": ", 2);
        strbuf_adds(out, r->headers[i].value);
        strbuf_add(out, "\r\n", 2);
    }
    if (!no_body && framing == FRAME_LENGTH) {
        strbuf_add(out, "Content-Length: ", 16);
        strbuf_add_uint(out, length);
        strbuf_add(out, "\r\n", 2);
    } else if (!no_body && framing == FRAME_CHUNKED) {
        strbuf_adds(out, "Transfer-Encoding: chunked\r\n");
    }
    strbuf_add(out, "Date: ", 6);
    strbuf_adds(out, date);
    strbuf_add(out, "\r\n", 2);
    if (!keep_alive)
        strbuf_adds(out, "Connection: close\r\n");
    else if (c->rp.hp.http_major == 1 && c->rp.hp.http_minor == 0)
        strbuf_adds(out, "Connection: keep-alive\r\n");
    strbuf_add(out, "\r\n", 2);
}

static void send_response(struct conn *c, const struct request *rq, int keep_alive)
{
    struct http_loop *lp = c->lp;
    const struct response *r = &c->resp;
    struct strbuf out = STRBUF_INIT;
    uv_buf_t buf;
    size_t len;
    int head_only = rq->method != NULL && strcmp(rq->method, "HEAD") == 0;
    int no_body, n;

    if (r->stream != NULL && !c->resp.drop) {
        stream_start(c, rq, keep_alive);
        return;
    }
    stream_unreserve(c); /* reserved for a stream that did not happen (a 502 instead) */
    if (lp->srv->opts.before_send != NULL)
        lp->srv->opts.before_send(lp->srv->opts.ctx, rq, &c->resp);
    no_body = r->status == 204 || r->status == 304 || (r->status >= 100 && r->status < 200);
    if (atomic_load(&lp->srv->stopping))
        keep_alive = 0;
    c->keep_alive = keep_alive;
    strbuf_grow(&out, 160 + r->body_len);
    add_head(c, r, keep_alive, FRAME_LENGTH,
             head_only && r->head_length >= 0 ? (unsigned long long)r->head_length : r->body_len,
             http_date(lp), &out);
    if (!head_only && !no_body && r->body_len > 0)
        strbuf_add(&out, r->body, r->body_len);

    if (c->report && lp->srv->opts.answered != NULL)
        lp->srv->opts.answered(lp->srv->opts.ctx, rq, r,
                               (double)(clock_mono_ns() - c->start_ns) / 1e9);

    /* Reading goes on: bytes that come meanwhile wait in c->in (on_read). */
    set_state(c, CONN_WRITING);
    c->out = strbuf_detach(&out, &len);
    buf = uv_buf_init(c->out, (unsigned int)len);
    n = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
    if (n == (int)len) {
        written(c, 0);
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        written(c, n);
        return;
    }
    if (n < 0)
        n = 0;
    buf = uv_buf_init(c->out + n, (unsigned int)(len - (size_t)n));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, on_write) != 0)
        written(c, -1);
}

/* A problem of the server's own, for a request (or a connection) it refuses. */
static void send_problem(struct conn *c, const struct request *rq, int status, const char *code,
                         const char *detail, int keep_alive)
{
    response_clear(&c->resp);
    response_init(&c->resp);
    if (status == 503) /* busy or full: a retry soon is welcome, and says when */
        response_set_header(&c->resp, "Retry-After", "1");
    response_problem(&c->resp, status, code, detail);
    send_response(c, rq, keep_alive);
}

/* ---- a streamed body, written by the loop -------------------------------------------------- */

/*
 * A body too large to hold (struct response's `stream`), pulled from its source one piece at a
 * time: the next piece is asked for only once the last one is in the kernel, so what a stream
 * holds is one piece, whatever the client's pace, and neither side holds a thread.  A source that
 * has nothing yet names a descriptor to wait for (the upstream's socket), watched on this loop.
 */
struct stream {
    struct http_body_source *src;
    struct stream_poll *poll; /* while the source is waited for (and after: reused) */
    struct strbuf piece;      /* framed bytes being written: one uv_write at a time */
    struct strbuf data;       /* what the source gave, before its framing */
    uv_write_t wr;
    int writing; /* `piece` is being written */
    int waiting; /* for the source's descriptor */
    int ended;   /* the source said END (the last chunk is in `piece`, or out) */
    int chunked, body;
    int reported;
    int over;                 /* `how` is said */
    enum http_source_end how; /* how it ended */
    uint64_t length, sent;    /* the body's announced length (UINT64_MAX: unknown), sent so far */
    uint64_t out;             /* bytes in the kernel, head and framing too */
    uint64_t taken;           /* of those, what the client took, when last looked at */
    uint64_t write_since;     /* loop time the write under way began */
    uint64_t progress_at;     /* loop time the client last took more */
    uint64_t waited_ms;       /* time spent waiting for the client, writes under way excluded */
    uint64_t wait_since;      /* loop time the source began to be waited for */
};

/*
 * The watcher of a source's descriptor.  Allocated apart, so that its close (which libuv
 * finishes later) outlives the stream; its `data` marks it for close_any(), which leaves it to
 * its connection's close.
 */
struct stream_poll {
    uv_poll_t h;
    struct conn *c;
    int fd;
};

static char stream_poll_mark;

static void stream_pump(struct conn *c);

static void stream_poll_closed(uv_handle_t *h)
{
    free(h);
}

/* A stop's grace is over: a stream still going is cut, so the stop ends in bounded time. */
static int stream_past_grace(const struct conn *c)
{
    int64_t d = atomic_load(&c->lp->srv->stop_deadline_ns);

    return d != 0 && clock_mono_ns() > d;
}

/* Tells the program the answer went (or was cut): the request log and metrics, once. */
static void stream_report(struct conn *c)
{
    struct http_loop *lp = c->lp;
    const struct http_server_options *o = &lp->srv->opts;

    if (c->st->reported)
        return;
    c->st->reported = 1;
    if (c->report && o->answered != NULL && !lp->halted)
        o->answered(o->ctx, request_parser_request(&c->rp), &c->resp,
                    (double)(clock_mono_ns() - c->start_ns) / 1e9);
}

/* Frees the stream of `c` and stops its source with `how` (unless it ended otherwise first). */
static void stream_release(struct conn *c, enum http_source_end how)
{
    struct stream *st = c->st;

    if (!st->over)
        st->how = how;
    st->over = 1;
    stream_report(c);
    if (st->poll != NULL && !uv_is_closing((uv_handle_t *)&st->poll->h))
        uv_close((uv_handle_t *)&st->poll->h, stream_poll_closed);
    /* The watcher is stopped before the source closes its descriptor. */
    st->src->stop(st->src, st->how);
    strbuf_release(&st->piece);
    strbuf_release(&st->data);
    free(st);
    c->st = NULL;
    stream_unreserve(c);
}

/*
 * The stream ended: whole, the connection goes on as after any answer; cut, it closes (after
 * the write under way is cancelled), so the client sees a body cut short, never a whole one.
 */
static void stream_finish(struct conn *c, enum http_source_end how)
{
    struct stream *st = c->st;

    if (!st->over)
        st->how = how;
    st->over = 1;
    if (how != HTTP_SOURCE_WHOLE) {
        stream_report(c);
        conn_close(c); /* on_closed releases the stream */
        return;
    }
    stream_release(c, how);
    set_state(c, CONN_WRITING);
    written(c, 0);
}

static void stream_written(uv_write_t *wr, int status)
{
    struct conn *c = wr->data;
    struct stream *st = c->st;
    uint64_t now = uv_now(&c->lp->uv);

    st->writing = 0;
    if (c->state == CONN_CLOSING)
        return; /* cut: on_closed releases the stream */
    st->waited_ms += now - st->write_since;
    if (status < 0) {
        stream_finish(c, HTTP_SOURCE_CLIENT);
        return;
    }
    st->out += st->piece.len;
    strbuf_reset(&st->piece);
    stream_pump(c);
}

static void stream_readable(uv_poll_t *h, int status, int events)
{
    struct stream_poll *p = (struct stream_poll *)h;
    struct conn *c = p->c;

    (void)status; /* an error on the descriptor: the source's next read says what */
    (void)events;
    uv_poll_stop(h);
    if (c->state == CONN_CLOSING)
        return; /* cut: on_closed releases the stream */
    c->st->waiting = 0;
    stream_pump(c);
}

/* Waits, on the loop, for the source's descriptor `fd` to be readable.  0, or -1. */
static int stream_wait_source(struct conn *c, int fd)
{
    struct stream *st = c->st;

    if (st->poll != NULL && st->poll->fd != fd) {
        uv_close((uv_handle_t *)&st->poll->h, stream_poll_closed);
        st->poll = NULL;
    }
    if (st->poll == NULL) {
        struct stream_poll *p = xcalloc(1, sizeof *p);

        if (uv_poll_init(&c->lp->uv, &p->h, fd) != 0) {
            free(p);
            return -1;
        }
        p->h.data = &stream_poll_mark;
        p->c = c;
        p->fd = fd;
        st->poll = p;
    }
    if (uv_poll_start(&st->poll->h, UV_READABLE, stream_readable) != 0)
        return -1;
    st->waiting = 1;
    st->wait_since = uv_now(&c->lp->uv);
    return 0;
}

/* `len` bytes of the body into `piece`, framed as a chunk when the body is chunked. */
static void stream_frame(struct stream *st, const void *data, size_t len)
{
    char size[24];

    if (len == 0)
        return;
    if (st->chunked) {
        strbuf_add(&st->piece, size, (size_t)snprintf(size, sizeof size, "%zx\r\n", len));
        strbuf_add(&st->piece, data, len);
        strbuf_add(&st->piece, "\r\n", 2);
    } else {
        strbuf_add(&st->piece, data, len);
    }
    st->sent += len;
}

static void stream_write(struct conn *c)
{
    struct stream *st = c->st;
    uv_buf_t buf = uv_buf_init(st->piece.buf, (unsigned int)st->piece.len);

    st->writing = 1;
    st->write_since = uv_now(&c->lp->uv);
    st->wr.data = c;
    if (uv_write(&st->wr, (uv_stream_t *)&c->tcp, &buf, 1, stream_written) != 0) {
        st->writing = 0;
        stream_finish(c, HTTP_SOURCE_CLIENT);
    }
}

/* Writes what is ready, or asks the source for the next piece, until something is under way. */
static void stream_pump(struct conn *c)
{
    struct stream *st = c->st;
    enum http_source_step step;
    int fd;

    while (!st->writing && !st->waiting) {
        if (st->piece.len > 0) {
            stream_write(c);
            return;
        }
        if (st->ended) {
            stream_finish(c, HTTP_SOURCE_WHOLE);
            return;
        }
        if (stream_past_grace(c)) {
            stream_finish(c, HTTP_SOURCE_CLIENT);
            return;
        }
        fd = -1;
        strbuf_reset(&st->data);
        step = st->src->proceed(st->src, &st->data, &fd);
        if (step == HTTP_SOURCE_DATA) {
            if (st->length != UINT64_MAX && st->length - st->sent < st->data.len) {
                stream_finish(c, HTTP_SOURCE_FAILED); /* more than it announced */
                return;
            }
            stream_frame(st, st->data.buf, st->data.len);
        } else if (step == HTTP_SOURCE_WAIT) {
            if (fd < 0 || stream_wait_source(c, fd) != 0)
                stream_finish(c, HTTP_SOURCE_FAILED);
            return;
        } else if (step == HTTP_SOURCE_END &&
                   (st->length == UINT64_MAX || st->sent == st->length)) {
            st->ended = 1;
            if (st->chunked)
                strbuf_add(&st->piece, "0\r\n\r\n", 5);
        } else {
            stream_finish(c, HTTP_SOURCE_FAILED); /* an error, or whole short of its length */
            return;
        }
    }
}

/*
 * Begins the answer of `c` whose response has a `stream`: the head (and the body's first bytes,
 * in `body`) now, the rest as the client takes it.
 */
static void stream_start(struct conn *c, const struct request *rq, int keep_alive)
{
    struct http_loop *lp = c->lp;
    struct response *r = &c->resp;
    struct stream *st = xcalloc(1, sizeof *st);
    int head_only = rq->method != NULL && strcmp(rq->method, "HEAD") == 0;
    int no_body = r->status == 204 || r->status == 304 || (r->status >= 100 && r->status < 200);
    enum framing framing;

    st->src = r->stream;
    r->stream = NULL;
    st->length = r->stream_length;
    (void)stream_take(c, 1); /* counted, even over the caps: see http_stream_reserve() */
    if (atomic_load(&lp->srv->stopping))
        keep_alive = 0;
    if (st->length != UINT64_MAX) {
        framing = FRAME_LENGTH;
    } else if (c->rp.hp.http_major == 1 && c->rp.hp.http_minor >= 1) {
        framing = FRAME_CHUNKED;
    } else {
        framing = FRAME_CLOSE;
        keep_alive = 0;
    }
    c->keep_alive = keep_alive;
    st->chunked = framing == FRAME_CHUNKED;
    st->body = !head_only && !no_body;
    add_head(c, r, keep_alive, framing, st->length, http_date(lp), &st->piece);
    c->st = st;
    set_state(c, CONN_STREAMING);
    st->progress_at = uv_now(&lp->uv);
    if (!st->body) {
        st->ended = 1; /* the head alone */
    } else if (r->body_len > 0) {
        if (st->length != UINT64_MAX && r->body_len > st->length) {
            stream_finish(c, HTTP_SOURCE_FAILED);
            return;
        }
        stream_frame(st, r->body, r->body_len);
    }
    stream_pump(c);
}

/* Bytes of the stream its client has taken: in the kernel, less what is still in its queue. */
static uint64_t stream_taken(const struct conn *c)
{
    const struct stream *st = c->st;
    uint64_t in_kernel = st->out;
    uv_os_fd_t fd;

    if (st->writing) {
        size_t queued = uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);

        in_kernel += st->piece.len > queued ? st->piece.len - queued : 0;
    }
#ifdef SIOCOUTQ
    int unsent = 0;

    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &unsent) == 0 &&
        unsent > 0)
        return (uint64_t)unsent < in_kernel ? in_kernel - (uint64_t)unsent : 0;
#else
    (void)fd;
#endif
    return in_kernel;
}

/*
 * A stream's deadlines, on each tick.  Its client may take no byte for the write timeout (a
 * stall); and once the stream has waited STREAM_RATE_GRACE_MS for its client in all, only as long
 * as what the client took covers at stream_min_rate -- so a client that reads a few bytes now
 * and then cannot hold a stream for ever, each stall short of the timeout.  Only the time spent
 * waiting for the client counts: a source slow to give the bytes is not the client's doing (and
 * a keyed answer cut is lost).  The source may keep it waiting for its stall_ms.
 */
static void stream_check(struct conn *c, uint64_t now)
{
    const struct http_limits *l = &c->lp->srv->opts.limits;
    struct stream *st = c->st;

    if (stream_past_grace(c)) {
        stream_finish(c, HTTP_SOURCE_CLIENT);
        return;
    }
    if (st->waiting && st->src->stall_ms > 0 &&
        now - st->wait_since >= (uint64_t)st->src->stall_ms) {
        stream_finish(c, HTTP_SOURCE_STALLED);
        return;
    }
    if (st->writing) {
        uint64_t taken = stream_taken(c), waited, allowed, since;

        if (taken > st->taken) {
            st->taken = taken;
            st->progress_at = now;
        }
        since = st->progress_at > st->write_since ? st->progress_at : st->write_since;
        if (now - since >= (uint64_t)l->write_timeout_ms) {
            atomic_fetch_add(&c->lp->srv->st_timeouts, 1);
            stream_finish(c, HTTP_SOURCE_CLIENT);
            return;
        }
        waited = st->waited_ms + (now - st->write_since);
        if (l->stream_min_rate > 0) {
            allowed = st->taken * 1000 / (uint64_t)l->stream_min_rate;
            if (allowed < STREAM_RATE_GRACE_MS)
                allowed = STREAM_RATE_GRACE_MS;
            if (waited >= allowed) {
                atomic_fetch_add(&c->lp->srv->st_timeouts, 1);
                stream_finish(c, HTTP_SOURCE_CLIENT);
            }
        }
    }
}

/* The request as far as it was read, or a stub when not even its head was. */
static const struct request *current_request(struct conn *c)
{
    const struct request *rq = request_parser_request(&c->rp);

    if (rq->method != NULL && rq->path != NULL)
        return rq;
    memset(&c->rq_stub, 0, sizeof c->rq_stub);
    c->rq_stub.method = "-";
    c->rq_stub.path = "-";
    c->rq_stub.peer = c->peer;
    return &c->rq_stub;
}

/* ---- the worker pool ------------------------------------------------------------------------- */

/* The next job for a worker (under qmu), or NULL. */
static struct conn *take_job(struct http_server *srv)
{
    struct conn *c = srv->qhead;

    if (c != NULL) {
        srv->qhead = c->qnext;
        if (srv->qhead == NULL)
            srv->qtail = NULL;
        srv->qlen--;
    }
    return c;
}

static void *worker_main(void *arg)
{
    struct http_server *srv = arg;
    const struct http_server_options *o = &srv->opts;
    struct conn *c;
    int drop;

    for (;;) {
        pthread_mutex_lock(&srv->qmu);
        while ((c = take_job(srv)) == NULL && !(srv->qstop && srv->qhead == NULL))
            pthread_cond_wait(&srv->qcond, &srv->qmu);
        pthread_mutex_unlock(&srv->qmu);
        if (c == NULL)
            break;

        if (c->job == JOB_HEAD) {
            c->verdict = o->on_head(o->ctx, &c->rp.rq, &c->resp, 1);
            loop_push(c, DONE_JOB);
            continue;
        }
        /* Two references: this worker's, and a deferred answer's (http_server_complete). */
        atomic_store(&c->job_refs, 2);
        c->rp.rq.completion = c;
        o->handle(o->ctx, request_parser_request(&c->rp), &c->resp);
        /* Read once, before letting go: past the decrement the connection may be reused. */
        drop = c->resp.deferred ? 1 : 2;
        if (atomic_fetch_sub(&c->job_refs, drop) == drop)
            loop_push(c, DONE_JOB);
    }
    return NULL;
}

/*
 * Hands `c` to a worker; 0, or -1 when the queue is full (nothing changed).  `always`: past the
 * queue's cap (HTTP_LOOP_HANDOFF).
 */
static int submit(struct conn *c, enum job job, int always)
{
    struct http_server *srv = c->lp->srv;
    int rc = -1;

    pthread_mutex_lock(&srv->qmu);
    if (always || srv->qlen < srv->opts.limits.queue) {
        c->job = job;
        c->qnext = NULL;
        if (srv->qtail != NULL)
            srv->qtail->qnext = c;
        else
            srv->qhead = c;
        srv->qtail = c;
        srv->qlen++;
        rc = 0;
    }
    pthread_mutex_unlock(&srv->qmu);
    if (rc == 0) {
        stop_reading(c);
        set_state(c, CONN_WORKING);
        pthread_cond_signal(&srv->qcond);
    } else {
        atomic_fetch_add(&srv->st_queue_full, 1);
    }
    return rc;
}

/* ---- reading --------------------------------------------------------------------------------- */

/* Keeps the bytes the parser did not take, for when the connection reads on. */
static void keep_rest(struct conn *c, const char *data, size_t len)
{
    char *in;

    if (len == 0)
        return;
    in = xmalloc(c->in_len + len);
    if (c->in_len > 0)
        memcpy(in, c->in, c->in_len);
    memcpy(in + c->in_len, data, len);
    free(c->in);
    c->in = in;
    c->in_len += len;
}

static void refuse_head(struct conn *c, int status, const char *code, const char *detail)
{
    c->report = 1; /* a malformed request may not have started in the parser's eyes */
    atomic_fetch_add(&c->lp->srv->st_heads, 1);
    send_problem(c, current_request(c), status, code, detail, 0);
}

static const char continue_line[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* The head passed the program's check: the body may come (or the request is complete). */
static int head_accepted(struct conn *c)
{
    const struct request *rq = request_parser_request(&c->rp);
    uv_buf_t buf;

    if (rq->content_length > c->lp->srv->opts.max_body) {
        refuse_head(c, 413, "body-too-large", c->lp->srv->body_too_large);
        return -1;
    }
    if (rq->expects_continue && rq->has_body) {
        /* Best effort: a client that does not hear it sends the body after its own pause. */
        buf = uv_buf_init((char *)continue_line, sizeof continue_line - 1);
        uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
    }
    set_state(c, CONN_BODY);
    return 0;
}

/*
 * Does what the program decided of a head, on the loop or (`on_worker`) back from a worker:
 * 0 when the body may come, -1 when the request was answered or handed to a worker.
 */
static int act_on_head(struct conn *c, enum http_head_verdict v, int on_worker)
{
    if (v == HTTP_HEAD_BLOCKS && !on_worker) {
        if (submit(c, JOB_HEAD, 0) != 0)
            refuse_head(c, 503, "server-busy", "Every worker is busy; retry shortly.");
        return -1;
    }
    if (v == HTTP_HEAD_BLOCKS) {
        /* A program that cannot decide even when it may block: refuse, safely. */
        response_clear(&c->resp);
        response_init(&c->resp);
        response_problem(&c->resp, 500, "internal-error", "The request could not be checked.");
        v = HTTP_HEAD_ANSWER;
    }
    if (v == HTTP_HEAD_ANSWER) {
        atomic_fetch_add(&c->lp->srv->st_heads, 1);
        send_response(c, request_parser_request(&c->rp), 0);
        return -1;
    }
    return head_accepted(c);
}

/* The head is in: the program may refuse the request before a byte of its body is kept. */
static int head_arrived(struct conn *c)
{
    const struct http_server_options *o = &c->lp->srv->opts;
    struct request *rq = &c->rp.rq;
    enum http_head_verdict v = HTTP_HEAD_CONTINUE;

    c->rp.rq.peer = c->peer;
    response_clear(&c->resp);
    response_init(&c->resp);
    if (o->on_head != NULL)
        v = o->on_head(o->ctx, rq, &c->resp, 0);
    return act_on_head(c, v, 0);
}

/*
 * Parks the request (its reading stopped) as `park` says, until woken or its timeout: at least a
 * millisecond, so that a request parked again by on_tick's pass is not met again in that pass.
 */
static void park_request(struct conn *c, const struct http_park *park)
{
    c->must_finish = park->must_finish != 0;
    if (c->must_finish)
        atomic_fetch_add(&c->lp->srv->parked_must_finish, 1);
    c->park_data = park->data;
    set_state(c, CONN_PARKED);
    c->park_deadline = c->since + (uint64_t)(park->timeout_ms > 1 ? park->timeout_ms : 1);
}

/* The whole request is in: answer it on the loop, or give it to a worker. */
static void request_complete(struct conn *c)
{
    const struct http_server_options *o = &c->lp->srv->opts;
    const struct request *rq = request_parser_request(&c->rp);
    int keep = request_parser_keep_alive(&c->rp);
    struct http_park park = {.token = c};
    enum http_loop_verdict v = HTTP_LOOP_WORKER;

    /* What on_head may have left (a principal, headers) is not the answer's. */
    response_clear(&c->resp);
    response_init(&c->resp);
    if (o->on_loop != NULL)
        v = o->on_loop(o->ctx, rq, &c->resp, &park);
    if (v == HTTP_LOOP_PARKED && o->on_unpark != NULL) {
        stop_reading(c);
        park_request(c, &park);
        return;
    }
    dispatch(c, v, keep);
}

/* Answers what the program answered on the loop, or hands the request to a worker. */
static void dispatch(struct conn *c, enum http_loop_verdict v, int keep)
{
    const struct request *rq = request_parser_request(&c->rp);

    if (v == HTTP_LOOP_ANSWERED) {
        send_response(c, rq, keep);
        return;
    }
    response_clear(&c->resp);
    response_init(&c->resp);
    if (submit(c, JOB_HANDLE, v == HTTP_LOOP_HANDOFF) != 0)
        send_problem(c, rq, 503, "server-busy", "Every worker is busy; retry shortly.", keep);
}

/* A parked request leaves its park: what park_request() counted is undone. */
static void unpark_begin(struct conn *c)
{
    c->park_data = NULL;
    if (c->must_finish)
        atomic_fetch_sub(&c->lp->srv->parked_must_finish, 1);
    c->must_finish = 0;
}

/* A parked request was woken, or timed out: the program decides again, on the loop. */
static void unpark(struct conn *c, int timed_out)
{
    const struct http_server_options *o = &c->lp->srv->opts;
    const struct request *rq = request_parser_request(&c->rp);
    struct http_park park = {.token = c};
    void *data = c->park_data;
    enum http_loop_verdict v;

    unpark_begin(c);
    c->rp.rq.parked_ms += (long)(uv_now(&c->lp->uv) - c->since);
    response_clear(&c->resp);
    response_init(&c->resp);
    v = o->on_unpark(o->ctx, rq, &c->resp, data, timed_out, &park);
    if (v == HTTP_LOOP_PARKED) {
        park_request(c, &park);
        return;
    }
    dispatch(c, v, request_parser_keep_alive(&c->rp));
}

void http_server_complete(void *completion)
{
    struct conn *c = completion;

    if (atomic_fetch_sub(&c->job_refs, 1) == 1)
        loop_push(c, DONE_JOB);
}

void http_server_unpark(void *token)
{
    loop_push(token, DONE_WAKE);
}

/*
 * Parses `data` (what a read gave, or the bytes kept from before) until the parser wants more or
 * the connection has something to do first.  A request answered at once (on the loop) lets the
 * next pipelined one be parsed in the same pass, without recursion; bytes that must wait for a
 * worker are kept in c->in.
 */
static void parse(struct conn *c, const char *data, size_t len)
{
    enum request_parse_result r;
    size_t used = 0;

    c->parsing = 1;
    for (;;) {
        r = request_parser_feed(&c->rp, data, len, &used);
        data += used;
        len -= used;
        if ((c->state == CONN_IDLE || c->state == CONN_FRESH) && request_parser_started(&c->rp)) {
            c->report = 1;
            set_state(c, CONN_HEAD);
            c->start_ns = clock_mono_ns();
        }
        if (r == REQUEST_PARSE_MORE)
            break;
        if (r == REQUEST_PARSE_ERROR) {
            refuse_head(c, c->rp.error_status, c->rp.error_code, c->rp.error_detail);
            break;
        }
        if (r == REQUEST_PARSE_HEADERS && head_arrived(c) == 0)
            continue;
        if (r == REQUEST_PARSE_COMPLETE)
            request_complete(c);
        if (c->state == CONN_IDLE && len > 0)
            continue; /* answered at once: the next pipelined request */
        if (c->state == CONN_WORKING || c->state == CONN_WRITING || c->state == CONN_PARKED)
            keep_rest(c, data, len);
        break;
    }
    c->parsing = 0;
    if (c->state == CONN_IDLE || c->state == CONN_FRESH || c->state == CONN_HEAD ||
        c->state == CONN_BODY)
        start_reading(c);
}

/* Parses the bytes kept from before (after a response, or after the head went to a worker). */
static void process_input(struct conn *c)
{
    char *in = c->in;
    size_t len = c->in_len;

    c->in = NULL;
    c->in_len = 0;
    parse(c, in, len);
    free(in);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = (struct conn *)h;

    (void)suggested;
    *buf = uv_buf_init(c->lp->buf, (unsigned int)sizeof c->lp->buf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = (struct conn *)s;

    if (nread == 0)
        return;
    if (c->state == CONN_LINGER) {
        c->drained += nread > 0 ? (size_t)nread : 0;
        if (nread < 0 || c->drained > LINGER_MAX_BYTES)
            conn_close(c);
        return;
    }
    if (nread < 0) {
        /* The client went away; a request cut short has nobody to answer. */
        conn_close(c);
        return;
    }
    if (c->state == CONN_WRITING || c->state == CONN_STREAMING) {
        /* The next pipelined request waits for this response to be out; not without bound. */
        keep_rest(c, buf->base, (size_t)nread);
        if (c->in_len > READ_CHUNK)
            stop_reading(c);
        return;
    }
    parse(c, buf->base, (size_t)nread);
}

static void start_reading(struct conn *c)
{
    if (!c->reading && c->state != CONN_CLOSING) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
            c->reading = 1;
        else
            conn_close(c);
    }
}

static void stop_reading(struct conn *c)
{
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

/* ---- a worker's result, back on the loop ----------------------------------------------------- */

static void job_done(struct conn *c)
{
    const struct request *rq = request_parser_request(&c->rp);

    if (c->job == JOB_HEAD) {
        if (act_on_head(c, c->verdict, 1) == 0)
            process_input(c);
        return;
    }
    if (c->resp.drop) {
        /* The lost response: whatever the handler did stays done, the client hears nothing. */
        conn_close(c);
        return;
    }
    send_response(c, rq, request_parser_keep_alive(&c->rp));
}

static void begin_stop(struct http_loop *lp);

static void on_wake(uv_async_t *a)
{
    struct http_loop *lp = a->data;
    struct conn *c, *next;

    if (lp->halted) {
        uv_stop(&lp->uv);
        return;
    }
    pthread_mutex_lock(&lp->mu);
    c = lp->done;
    lp->done = NULL;
    for (struct conn *q = c; q != NULL; q = q->qnext)
        q->queued = 0;
    pthread_mutex_unlock(&lp->mu);
    for (; c != NULL; c = next) {
        int why = c->done_flags;

        next = c->qnext;
        c->qnext = NULL;
        c->done_flags = 0;
        if (c->free_later)
            conn_free(c);
        else if (why & DONE_JOB)
            job_done(c);
        else if (c->state == CONN_PARKED)
            unpark(c, 0); /* a wake that lost the race with its timeout finds it moved on */
    }
    if (atomic_load(&lp->srv->stopping))
        begin_stop(lp);
}

/* ---- deadlines ------------------------------------------------------------------------------- */

static void expire(struct http_loop *lp, struct conn *c)
{
    struct http_server *srv = lp->srv;

    switch (c->state) {
    case CONN_HEAD:
    case CONN_BODY:
        atomic_fetch_add(&srv->st_timeouts, 1);
        send_problem(c, current_request(c), 408, "request-timeout",
                     c->state == CONN_HEAD ? "The request headers did not arrive in time."
                                           : "The request body did not arrive in time.",
                     0);
        break;
    case CONN_WRITING:
        atomic_fetch_add(&srv->st_timeouts, 1);
        conn_close(c);
        break;
    default:
        conn_close(c);
        break;
    }
}

static void on_tick(uv_timer_t *t)
{
    struct http_loop *lp = t->data;
    uint64_t now = uv_now(&lp->uv);
    struct conn *c, *next;
    enum deadline_list l;
    enum conn_state st;

    for (c = lp->head[LIST_PARKED]; c != NULL; c = next) {
        next = c->next;
        if (c->park_deadline <= now)
            unpark(c, 1);
    }
    for (c = lp->head[LIST_STREAMING]; c != NULL; c = next) {
        next = c->next;
        stream_check(c, now);
    }
    for (st = CONN_IDLE; st < CONN_NSTATES; st++) {
        l = state_list[st];
        if (l == LIST_NONE || l == LIST_PARKED || l == LIST_STREAMING)
            continue;
        /* Each expiry leaves the list (a new state, or closing), so the loop advances. */
        while ((c = lp->head[l]) != NULL && c->since + state_timeout(lp->srv, st) <= now)
            expire(lp, c);
    }
    if (atomic_load(&lp->srv->stopping))
        begin_stop(lp);
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

static void on_connection(uv_stream_t *server, int status)
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
    set_state(c, CONN_FRESH);
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    peer_of(c);
    c->start_ns = clock_mono_ns();
    total = atomic_load(&srv->nconns);
    if (total > srv->opts.limits.max_connections) {
        atomic_fetch_add(&srv->st_refused, 1);
        send_problem(c, current_request(c), 503, "too-many-connections",
                     "This server holds as many connections as it may; retry shortly.", 0);
        return;
    }
    if (ip_acquire(srv, c->ip) != 0) {
        atomic_fetch_add(&srv->st_refused, 1);
        send_problem(c, current_request(c), 503, "too-many-connections",
                     "Your address holds as many connections as it may; close some, or retry "
                     "shortly.",
                     0);
        return;
    }
    c->counted = 1;
    atomic_fetch_add(&srv->st_open, 1);
    start_reading(c);
}

/* ---- the loops ------------------------------------------------------------------------------- */

/* No new connections; idle ones close; the others finish their request and close. */
static void begin_stop(struct http_loop *lp)
{
    struct conn *c;

    if (!lp->closing_listener) {
        lp->closing_listener = 1;
        uv_close((uv_handle_t *)&lp->listener, NULL);
    }
    while ((c = lp->head[LIST_IDLE]) != NULL)
        conn_close(c);
    while ((c = lp->head[LIST_FRESH]) != NULL)
        conn_close(c);
    /* Each is told once per turn: one parked again goes to the list's end. */
    for (int n = atomic_load(&lp->in_state[CONN_PARKED]); n > 0 && lp->head[LIST_PARKED]; n--)
        unpark(lp->head[LIST_PARKED], 1);
}

static void on_before_wait(uv_prepare_t *h)
{
    struct http_loop *lp = h->data;

    lp->srv->opts.before_wait(lp->srv->opts.ctx, 0);
}

static void *loop_main(void *arg)
{
    struct http_loop *lp = arg;

    current_loop = lp;
    uv_run(&lp->uv, UV_RUN_DEFAULT);
    if (lp->srv->opts.before_wait != NULL)
        lp->srv->opts.before_wait(lp->srv->opts.ctx, 1);
    current_loop = NULL;
    return NULL;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (uv_is_closing(h))
        return;
    /* A stream's watcher is closed with its connection (stream_release). */
    if (h->data == &stream_poll_mark)
        return;
    /* A connection's handle points at itself (the listener's at its loop): its close frees it. */
    if (h->type == UV_TCP && h->data == (void *)h)
        conn_close((struct conn *)h);
    else
        uv_close(h, NULL);
}

/*
 * Opens one listening socket on `sa` with SO_REUSEPORT, so that each loop has its own.  Returns
 * the descriptor or -errno.
 */
static int listen_socket(const struct sockaddr *sa, socklen_t salen)
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
static int address_taken(const struct sockaddr *sa, socklen_t salen)
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
static int resolve_listen(const char *listen, int ipv6, struct sockaddr_storage *ss,
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
static void raise_fd_limit(const struct http_server *srv)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)srv->opts.limits.max_connections + 1024;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        server_log(srv, "cannot raise the open-file limit to %llu", (unsigned long long)want);
}

static int loop_init(struct http_server *srv, struct http_loop *lp, int fd)
{
    lp->srv = srv;
    if (uv_loop_init(&lp->uv) != 0)
        die("cannot initialise an event loop");
    if (pthread_mutex_init(&lp->mu, NULL) != 0)
        die("cannot initialise a mutex");
    uv_async_init(&lp->uv, &lp->wake, on_wake);
    lp->wake.data = lp;
    uv_timer_init(&lp->uv, &lp->tick);
    lp->tick.data = lp;
    uv_timer_start(&lp->tick, on_tick, TICK_MS, TICK_MS);
    if (srv->opts.before_wait != NULL) {
        uv_prepare_init(&lp->uv, &lp->before_wait);
        lp->before_wait.data = lp;
        uv_prepare_start(&lp->before_wait, on_before_wait);
    }
    uv_tcp_init(&lp->uv, &lp->listener);
    lp->listener.data = lp;
    if (uv_tcp_open(&lp->listener, fd) != 0) {
        close(fd);
        return -1;
    }
    return uv_listen((uv_stream_t *)&lp->listener, LISTEN_BACKLOG, on_connection) == 0 ? 0 : -1;
}

int http_server_start(const struct http_server_options *opts, const char *listen,
                      struct http_server **out, char *err, size_t errlen)
{
    struct http_server *srv = NULL;
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    char host[INET6_ADDRSTRLEN];
    uint16_t port;
    int fd, i;
    int rc = -1;

    *out = NULL;
    if (resolve_listen(listen, opts->ipv6, &ss, &sslen, err, errlen) != 0)
        goto out;
    srv = xcalloc(1, sizeof *srv);
    srv->opts = *opts;
    http_limits_resolve(&srv->opts.limits);
    if (srv->opts.max_body == 0)
        srv->opts.max_body = HTTP_BODY_MAX;
    if (srv->opts.max_body == HTTP_BODY_MAX)
        snprintf(srv->body_too_large, sizeof srv->body_too_large, "%s", REQUEST_BODY_TOO_LARGE);
    else if (srv->opts.max_body % ((size_t)1 << 20) == 0)
        snprintf(srv->body_too_large, sizeof srv->body_too_large,
                 "Request bodies are limited to %zu MiB.", srv->opts.max_body >> 20);
    else
        snprintf(srv->body_too_large, sizeof srv->body_too_large,
                 "Request bodies are limited to %zu bytes.", srv->opts.max_body);
    if (pthread_mutex_init(&srv->qmu, NULL) != 0 || pthread_cond_init(&srv->qcond, NULL) != 0 ||
        pthread_mutex_init(&srv->ipmu, NULL) != 0)
        die("cannot initialise a mutex");
    raise_fd_limit(srv);

    port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (port != 0 && address_taken((struct sockaddr *)&ss, sslen)) {
        snprintf(err, errlen, "cannot listen on %s: the address is in use", listen);
        goto out;
    }
    srv->nloops = srv->opts.limits.loops;
    srv->loops = xcalloc((size_t)srv->nloops, sizeof *srv->loops);
    for (i = 0; i < srv->nloops; i++) {
        fd = listen_socket((struct sockaddr *)&ss, sslen);
        if (fd < 0) {
            snprintf(err, errlen, "cannot listen on %s: %s", listen, strerror(-fd));
            goto out;
        }
        if (i == 0 && port == 0) {
            /* The kernel picked a port: the other loops join that one. */
            struct sockaddr_storage bound;
            socklen_t blen = sizeof bound;

            getsockname(fd, (struct sockaddr *)&bound, &blen);
            port = bound.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&bound)->sin6_port)
                                               : ntohs(((struct sockaddr_in *)&bound)->sin_port);
            if (ss.ss_family == AF_INET6)
                ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
            else
                ((struct sockaddr_in *)&ss)->sin_port = htons(port);
        }
        if (loop_init(srv, &srv->loops[i], fd) != 0) {
            snprintf(err, errlen, "cannot listen on %s", listen);
            goto out;
        }
    }
    if (ss.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
        snprintf(srv->url, sizeof srv->url, "http://[%s]:%u", host, (unsigned)port);
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
        snprintf(srv->url, sizeof srv->url, "http://%s:%u", host, (unsigned)port);
    }

    srv->nworkers = srv->opts.limits.workers;
    srv->workers = xcalloc((size_t)srv->nworkers, sizeof *srv->workers);
    for (i = 0; i < srv->nworkers; i++) {
        if (pthread_create(&srv->workers[i], NULL, worker_main, srv) != 0)
            die("cannot start a worker thread");
    }
    for (i = 0; i < srv->nloops; i++) {
        if (pthread_create(&srv->loops[i].thread, NULL, loop_main, &srv->loops[i]) != 0)
            die("cannot start an event-loop thread");
        srv->loops[i].started = 1;
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

void http_server_stats(const struct http_server *srv, struct http_server_stats *out)
{
    out->connections_open = (uint64_t)atomic_load(&srv->nconns);
    out->connections_refused = atomic_load(&srv->st_refused);
    out->timeouts = atomic_load(&srv->st_timeouts);
    out->rejected_heads = atomic_load(&srv->st_heads);
    out->queue_full = atomic_load(&srv->st_queue_full);
}

/* Requests between their first byte and their answer, on every loop. */
static int requests_in_flight(const struct http_server *srv)
{
    int i, n = 0;

    for (i = 0; i < srv->nloops; i++) {
        const struct http_loop *lp = &srv->loops[i];

        n += atomic_load(&lp->in_state[CONN_HEAD]) + atomic_load(&lp->in_state[CONN_BODY]) +
             atomic_load(&lp->in_state[CONN_WORKING]) + atomic_load(&lp->in_state[CONN_WRITING]) +
             atomic_load(&lp->in_state[CONN_PARKED]) + atomic_load(&lp->in_state[CONN_STREAMING]);
    }
    return n;
}

/* Requests in a handler on a worker, and parked ones that must end by themselves. */
static int requests_finishing(const struct http_server *srv)
{
    int n = atomic_load(&srv->parked_must_finish);

    for (int i = 0; i < srv->nloops; i++)
        n += atomic_load(&srv->loops[i].in_state[CONN_WORKING]);
    return n;
}

/*
 * Whether a stop may end the loops with requests still in flight: once its grace is over and
 * nothing is finishing (a handler will return anyway, since the workers are joined, and a parked
 * request that must finish ends within its own timeout), plus a second for the answers of the
 * last of them to be written.  A stream past the grace is cut by its own writes.
 */
static int stop_may_end(struct http_server *srv, int64_t deadline)
{
    int64_t now = clock_mono_ns();

    if (now < deadline)
        return 0;
    if (requests_finishing(srv) > 0) {
        srv->stop_quiet_ns = 0;
        return 0;
    }
    if (srv->stop_quiet_ns == 0)
        srv->stop_quiet_ns = now;
    return now - srv->stop_quiet_ns >= 1000000000;
}

/*
 * A graceful stop: no new connections, the requests in flight finish (a request in its handler
 * is answered and its result stored) within stop_grace_s, then everything closes; past the grace
 * the loops run on for requests still in a handler or parked with must_finish.
 */
void http_server_stop(struct http_server *srv)
{
    int64_t deadline;
    int i, left;

    if (srv == NULL)
        return;
    atomic_store(&srv->stopping, 1);
    if (srv->loops != NULL) {
        for (i = 0; i < srv->nloops; i++) {
            if (srv->loops[i].started)
                uv_async_send(&srv->loops[i].wake);
        }
        deadline = clock_mono_ns() + (int64_t)srv->opts.stop_grace_s * 1000000000;
        atomic_store(&srv->stop_deadline_ns, deadline);
        while ((left = requests_in_flight(srv)) > 0 && !stop_may_end(srv, deadline))
            clock_sleep_ms(10);
        if (left > 0)
            server_log(srv, "stopping with %d requests unfinished", left);
        for (i = 0; i < srv->nloops; i++) {
            srv->loops[i].halted = 1;
            if (srv->loops[i].started) {
                uv_async_send(&srv->loops[i].wake);
                pthread_join(srv->loops[i].thread, NULL);
            }
        }
    }
    /* Workers finish what they hold (their loops are still allocated), then leave. */
    pthread_mutex_lock(&srv->qmu);
    srv->qstop = 1;
    pthread_cond_broadcast(&srv->qcond);
    pthread_mutex_unlock(&srv->qmu);
    for (i = 0; i < srv->nworkers; i++)
        pthread_join(srv->workers[i], NULL);
    for (i = 0; srv->loops != NULL && i < srv->nloops; i++) {
        struct http_loop *lp = &srv->loops[i];

        if (lp->srv == NULL)
            continue;
        lp->halted = 2;
        /* A request still parked lets the program end its wait, so no wake-up comes later. */
        while (lp->head[LIST_PARKED] != NULL) {
            struct conn *c = lp->head[LIST_PARKED];

            void *data = c->park_data;

            unpark_begin(c);
            srv->opts.on_unpark(srv->opts.ctx, request_parser_request(&c->rp), &c->resp, data, 1,
                                NULL);
            set_state(c, CONN_WORKING);
        }
        for (int k = 0; k < lp->nat_stop; k++)
            lp->at_stop[k].fn(lp->at_stop[k].arg);
        uv_walk(&lp->uv, close_any, NULL);
        uv_run(&lp->uv, UV_RUN_DEFAULT);
        /*
         * A worker that finished after its loop halted (a request past the grace: a stream cut
         * at its end) left its connection on the done list, where on_closed left it to be freed.
         */
        while (lp->done != NULL) {
            struct conn *c = lp->done;

            lp->done = c->qnext;
            if (c->free_later)
                conn_free(c);
        }
        uv_loop_close(&lp->uv);
        pthread_mutex_destroy(&lp->mu);
    }
    for (i = 0; i < IP_BUCKETS; i++) {
        while (srv->ips[i] != NULL) {
            struct ip_slot *s = srv->ips[i];

            srv->ips[i] = s->next;
            free(s);
        }
    }
    free(srv->loops);
    free(srv->workers);
    pthread_cond_destroy(&srv->qcond);
    pthread_mutex_destroy(&srv->qmu);
    pthread_mutex_destroy(&srv->ipmu);
    free(srv);
}
