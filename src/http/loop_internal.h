/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop_internal.h - the event loops' insides, for the HTTP layer's own files.  First what its
 * client (http_client.c) needs: the loop of the calling thread, and a hook to close what it keeps
 * on a loop before the loop's handles are closed at stop.  Then what the server's files share
 * (http_server.c, and listen.c, deadlines.c, http1.c, workers.c, stream.c beside it): a
 * connection, a loop, the server, and the calls between them, prefixed http__.  Not for
 * programs: they never see libuv.
 */
#ifndef IDEM_HTTP_LOOP_INTERNAL_H
#define IDEM_HTTP_LOOP_INTERNAL_H

#include <unistd.h>
#include <uv.h>

/* The libuv loop the calling thread runs (a server's loop thread), or NULL on any other thread. */
uv_loop_t *http_loop_current(void);

/*
 * Registers fn(arg) to run when the calling thread's loop stops, after its parked requests were
 * told and before its remaining handles are closed: close them there, with their callbacks (the
 * loop runs once more to call them).  Returns 0, or -1 off a loop thread or when full.
 */
int http_loop_at_stop(void (*fn)(void *arg), void *arg);

/*
 * Closes a handle that owns a descriptor (a TCP stream), as uv_close().  libuv closes the
 * descriptor with a bare close system call, which ThreadSanitizer does not see, and touches it
 * once more after that (taking it out of the epoll set).  Under ThreadSanitizer this tells it of
 * the close, and marks that last touch as done before any later dup(), whose new number may be
 * the same one on another loop thread (see http_fd_dup).  Elsewhere it is uv_close().
 */
#if defined(__SANITIZE_THREAD__)
#define HTTP_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HTTP_UNDER_TSAN 1
#endif
#endif
#ifdef HTTP_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
void __sanitizer_syscall_pre_impl_close(long fd);
extern char http__fd_numbers; /* what a closed number's next dup() waits on, for TSan */
static inline void http_close_fd_handle(uv_handle_t *h, uv_close_cb cb)
{
    uv_os_fd_t fd;

    if (uv_fileno(h, &fd) == 0)
        __sanitizer_syscall_pre_impl_close(fd);
    uv_close(h, cb);
    __tsan_release(&http__fd_numbers);
}
static inline int http_fd_dup(int fd)
{
    __tsan_acquire(&http__fd_numbers);
    return dup(fd);
}
#else
static inline void http_close_fd_handle(uv_handle_t *h, uv_close_cb cb)
{
    uv_close(h, cb);
}
static inline int http_fd_dup(int fd)
{
    return dup(fd);
}
#endif

/* ---- the server's own ---------------------------------------------------------------------- */

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "http_server.h"
#include "strbuf.h"
#include "tls.h"

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
    CONN_WORKING,   /* on a worker (or queued for one): the loop reads on, bounded */
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
    LIST_STREAMING, /* a stream's stalls and minimum rate (http__stream_check) */
    NLISTS
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
    int read_whole; /* the request being answered was read to its end */
    int report;     /* a request came (even a malformed one): tell `answered` */
    int reading;
    int hung_up; /* its end (or a read error) came while a request was away: close once answered */
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

    struct tls_conn *tls; /* a TLS listener's: every byte in and out goes through it */
    int handshaking;      /* its handshake is not done: nothing is parsed or answered yet */
};

struct http_loop {
    struct http_server *srv;
    uv_loop_t uv;
    uv_tcp_t listener;
    uv_async_t wake;
    uv_idle_t self_wake; /* the done list pushed to by the loop's own thread: drained next turn */
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
    struct tls_ctx *own_tls; /* made from limits.tls_cert_file (opts.tls points to it) */
};

/* How a response's body is delimited. */
enum framing {
    FRAME_LENGTH,  /* Content-Length: the body's length (or none, for a status without a body) */
    FRAME_CHUNKED, /* Transfer-Encoding: chunked (a streamed body of unknown length) */
    FRAME_CLOSE,   /* the end of the connection (the same, to an HTTP/1.0 client) */
};

/* http_server.c: connections, reading, answering, the loops */
void http__server_log(const struct http_server *srv, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void http__conn_close(struct conn *c);
void http__loop_push(struct conn *c, int why);
void http__start_reading(struct conn *c);
void http__stop_reading(struct conn *c);
void http__written(struct conn *c, int status);
void http__send_problem(struct conn *c, const struct request *rq, int status, const char *code,
                        const char *detail, int keep_alive);
const struct request *http__current_request(struct conn *c);
void http__unpark(struct conn *c, int timed_out);
void http__begin_stop(struct http_loop *lp);
/*
 * uv_write() of `len` bytes of `data` on `c`, or over TLS their ciphertext (encrypted now: `data`
 * need not outlive the call); `cb` gets `wr` as uv_write's would.  0 or a libuv error.
 */
int http__write(struct conn *c, uv_write_t *wr, const char *data, size_t len, uv_write_cb cb);

/* deadlines.c */
void http__set_state(struct conn *c, enum conn_state st);
void http__on_tick(uv_timer_t *t);

/* http1.c */
const char *http__http_date(struct http_loop *lp);
void http__add_head(const struct conn *c, const struct response *r, int keep_alive,
                    enum framing framing, unsigned long long length, const char *date,
                    struct strbuf *out);

/* listen.c */
struct ip_slot **http__ip_find(struct http_server *srv, const unsigned char ip[16]);
void http__ip_put(struct http_server *srv, const unsigned char ip[16]);
void http__on_connection(uv_stream_t *server, int status);
int http__listen_socket(const struct sockaddr *sa, socklen_t salen);
int http__address_taken(const struct sockaddr *sa, socklen_t salen);
int http__resolve_listen(const char *listen, int ipv6, struct sockaddr_storage *ss,
                         socklen_t *sslen, char *err, size_t errlen);
void http__raise_fd_limit(const struct http_server *srv);

/* workers.c */
void *http__worker_main(void *arg);
int http__submit(struct conn *c, enum job job, int always);

/* stream.c */
void http__stream_start(struct conn *c, const struct request *rq, int keep_alive);
void http__stream_check(struct conn *c, uint64_t now);
void http__stream_release(struct conn *c, enum http_source_end how);
void http__stream_unreserve(struct conn *c);
int http__stream_handle(const uv_handle_t *h);

#endif /* IDEM_HTTP_LOOP_INTERNAL_H */
