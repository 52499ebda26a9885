/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_server.h - the programs' HTTP server: a few event-loop threads (libuv) own every socket
 * and parse requests (request_parser.h); handlers that block (store statements, provider calls)
 * run on a bounded worker pool and hand their response back to the loop.  No thread is tied to a
 * connection, so ten thousand idle keep-alive connections cost memory, not threads.
 *
 * Hostile clients get a bounded share (struct http_limits): connections in all and per client
 * address, a deadline for the request head and one for the body, an idle timeout between
 * requests, a cap on the head and on the body.  Every refusal is an RFC 9457 problem+json.
 * A program can look at the head before any body byte is kept (on_head: orderd checks the bearer
 * token there), can answer on the loop without a hand-off (on_loop: replays from memory), and can
 * park a request on the loop, holding no thread, until another thread wakes it (a duplicate waits
 * for the first request of its key: http_server_unpark), as many times as its work has steps
 * (idem-gateway: the claim's commit, the upstream's answer, the completion's commit).  A body too
 * large to hold is left as a source (response_stream()) that the loop writes out as the client
 * reads it, so a slow reader holds a buffer, not a worker (http_stream_reserve()).
 *
 * Handlers never see libuv or http-parser; they read the request through the accessors below and
 * fill a struct response (response.h).
 */
#ifndef IDEM_HTTP_HTTP_SERVER_H
#define IDEM_HTTP_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "request_parser.h"
#include "response.h"

/* Request bodies above this many bytes are refused with 413 (docs/http-api.md). */
#define HTTP_BODY_MAX ((size_t)1 << 20)

/* The first value of header `name` (case-insensitive), or NULL; borrowed for the request. */
const char *request_header(const struct request *rq, const char *name);

/*
 * How many times header `name` was sent.  *first / *first_len (may be NULL) receive the first
 * value, borrowed for the request.
 */
int request_header_count(const struct request *rq, const char *name, const char **first,
                         size_t *first_len);

/* Whether `list` (a comma-separated header value such as Connection's) names token `name`. */
int http_list_has_token(const char *list, const char *name);

/*
 * Whether `name` is a hop-by-hop header: one that describes a connection, not the message (RFC
 * 9110, section 7.6.1, with the obsolete Keep-Alive and Proxy-Connection), and so is never passed
 * on, stored or replayed.  Its usual spelling ("Transfer-Encoding"), or NULL.  Headers a
 * Connection field lists are hop-by-hop too: ask request_connection_lists() for those.
 */
const char *http_hop_by_hop(const char *name);

/*
 * Whether any Connection field of `rq` names `name`: a header it lists is hop-by-hop, dropped by
 * the next proxy on the way.
 */
int request_connection_lists(const struct request *rq, const char *name);

/* The value of query argument `name` ("" for "?name"), or NULL when absent; borrowed. */
const char *request_query(const struct request *rq, const char *name);

/*
 * Checks the syntax of a listen address and splits it: "HOST:PORT" or "[V6]:PORT", a non-empty
 * host and a port 0..65535.  Returns 0 with `host` (NUL-terminated) and *port, or -1 with a
 * sentence in `err`.  Nothing is resolved.
 */
int http_listen_split(const char *listen, char *host, size_t host_cap, uint16_t *port, char *err,
                      size_t errlen);

/*
 * What a client may hold.  Zero in any field means its default (HTTP_LIMITS_DEFAULTS, the
 * figures docs/http-server.md gives); a program's `serve --help` lists the flags that set them.
 */
struct http_limits {
    int max_connections;        /* open connections in all (10000) */
    int max_connections_per_ip; /* open connections from one client address (256; -1: no cap) */
    int head_timeout_ms;        /* first byte of a request to the end of its head (10000) */
    int body_timeout_ms;        /* end of the head to the end of the body (30000) */
    int idle_timeout_ms;        /* a keep-alive connection with no request in it (60000) */
    int write_timeout_ms;       /* a response the client does not read (30000) */
    int max_header_bytes;       /* request line + header fields (8192) */
    int loops;                  /* event-loop threads (the number of CPUs, at most 8) */
    int workers;                /* threads that run blocking handlers (64) */
    int queue;                  /* requests waiting for a worker before 503 (4096) */
    int stream_min_rate;        /* bytes/s a client must take a streamed answer at (16384; -1) */
    int streams_per_ip;         /* streamed answers one client address may hold at once (4; -1) */
    int max_streams;            /* streamed answers all clients may hold at once (1024; -1) */
    /*
     * Borrowed, both or neither: the listener speaks TLS with this certificate chain and key
     * (PEM), its context made and owned by the server (--tls-cert, --tls-key: OPT_HTTP_TLS).
     * http_server_options.tls, when set, is used instead.
     */
    const char *tls_cert_file;
    const char *tls_key_file;
};

#define HTTP_DEFAULT_MAX_CONNECTIONS 10000
#define HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP 256
#define HTTP_DEFAULT_HEAD_TIMEOUT_MS 10000
#define HTTP_DEFAULT_BODY_TIMEOUT_MS 30000
#define HTTP_DEFAULT_IDLE_TIMEOUT_MS 60000
#define HTTP_DEFAULT_WRITE_TIMEOUT_MS 30000
#define HTTP_DEFAULT_MAX_HEADER_BYTES 8192
#define HTTP_DEFAULT_WORKERS 64
#define HTTP_DEFAULT_STREAM_MIN_RATE 16384
#define HTTP_DEFAULT_STREAMS_PER_IP 4
#define HTTP_DEFAULT_MAX_STREAMS 1024
#define HTTP_DEFAULT_QUEUE 4096

/* What on_head decided. */
enum http_head_verdict {
    HTTP_HEAD_CONTINUE, /* read the body, then answer */
    HTTP_HEAD_ANSWER,   /* `resp` is the answer; the body is not read, the connection closes */
    HTTP_HEAD_BLOCKS,   /* cannot tell without blocking: call again on a worker (may_block 1) */
};

/* What on_loop and on_unpark decided. */
enum http_loop_verdict {
    HTTP_LOOP_WORKER,   /* hand the request to `handle` on a worker (503 when the queue is full) */
    HTTP_LOOP_ANSWERED, /* `resp` is the answer */
    HTTP_LOOP_PARKED,   /* wait, holding no thread: on_unpark runs when woken or timed out */
    /*
     * on_unpark only: hand it to `handle` on a worker even past the queue's cap, because it
     * carries work begun on the loop that only a worker may finish (a record claimed, an
     * upstream that acted): never refused.  As many as there are requests parked.
     */
    HTTP_LOOP_HANDOFF,
};

/* How on_loop parks a request. */
struct http_park {
    void *token;    /* in: pass to http_server_unpark() (any thread) to wake the request */
    void *data;     /* out: the program's, handed back to on_unpark */
    int timeout_ms; /* out: on_unpark runs with timed_out 1 after this long */
    /*
     * out: 1 when the request waits for something that must end by itself (an upstream exchange
     * under way): a stop then keeps the loops running past its grace while such requests are
     * parked, each for at most its timeout, as it waits for a worker's handler.
     */
    int must_finish;
};

/*
 * Wakes a parked request: its loop calls on_unpark soon after.  Thread-safe and non-blocking.
 * Only valid while the request is parked and its on_unpark has not run; a wake that races its
 * timeout is ignored (on_unpark must make sure no later wake comes, e.g. idem_watch_end()).
 */
void http_server_unpark(void *token);

/*
 * Hands in the response of a request whose handler set resp->deferred (it answers from another
 * thread, e.g. once a group commit is durable): `completion` is rq->completion.  Any thread;
 * call it once, after `resp` is filled, and touch neither the request nor the response after.
 */
void http_server_complete(void *completion);

/*
 * Before a handler answers `rq` with a streamed body (response_stream(); on the loop, before it
 * forwards anything): takes one of the streams the server lets run at once.  0, or -1 when the
 * client's address holds `streams_per_ip` of them already, or all clients `max_streams`: answer
 * 503 then.  The slot is given back when the request's answer ends.  A stream begun without it
 * (one that cannot be refused: the upstream acted) takes a slot all the same when its head is
 * sent, over the caps if need be, so that the streams that can be refused are.
 *
 * A streamed body is written by the event loop, not by the handler's worker (which is free as
 * soon as `handle` returns): the loop asks the source for the next piece only once the last is
 * in the kernel, waits for a source that has nothing yet on its descriptor, and cuts the stream
 * -- the connection closes, so the client sees a body cut short, never a whole one -- when the
 * client takes no byte for the write timeout, when, once it has waited 10 s for the client in
 * all, the bytes the client took do not cover that waiting at stream_min_rate (only the waiting
 * for the client counts, not for the source), when the source stalls past its stall_ms or fails,
 * and when a stop's grace ends.  The server reports the response (`answered`) when the stream
 * ends.  HEAD and 1xx/204/304 answers get the head alone.
 */
int http_stream_reserve(const struct request *rq);

/* What a program serves, and the few ways orderd and provider-sim listen differently. */
struct http_server_options {
    /*
     * Answers one request into `resp` (response_init()ed; freed by the server).  Runs on a worker
     * thread once the body is in: it may block.  It may also set resp->deferred and answer later
     * through http_server_complete(rq->completion).
     */
    void (*handle)(void *ctx, const struct request *rq, struct response *resp);
    /*
     * May be NULL.  Called when the head is in, before any body byte is kept.  On a loop thread
     * with may_block 0 (it must not block: answer HTTP_HEAD_BLOCKS instead), then, if asked, on a
     * worker with may_block 1.  It may leave rq->note (and rq->note_free) for the later steps.
     */
    enum http_head_verdict (*on_head)(void *ctx, struct request *rq, struct response *resp,
                                      int may_block);
    /*
     * May be NULL.  Called on the loop thread once the body is in, without blocking: answers into
     * `resp` (a replay from memory), parks the request (fills `park`), or hands it to `handle`.
     */
    enum http_loop_verdict (*on_loop)(void *ctx, const struct request *rq, struct response *resp,
                                      struct http_park *park);
    /*
     * Needed when on_loop parks.  On the loop thread, when the parked request was woken or (with
     * timed_out 1) its timeout passed, or the server stops: answers, hands it to `handle`, or
     * parks it again (fills `park` as on_loop does: the next step of its work, or a wake that
     * came early).  `data` is what the last park left.  While the server stops, a parked
     * request is told timed_out 1 on each turn of its loop; once the loops have ended it is told
     * one last time with `park` NULL: it must end its wait then (block if it must: nothing else
     * runs), and the verdict is ignored.
     */
    enum http_loop_verdict (*on_unpark)(void *ctx, const struct request *rq, struct response *resp,
                                        void *data, int timed_out, struct http_park *park);
    /*
     * May be NULL.  Called on a loop thread with every response the server is about to send
     * whole (its own refusals too, but not a streamed answer's head): a program restyles its own
     * errors here (resp->problem).  Must not block.
     */
    void (*before_send)(void *ctx, const struct request *rq, struct response *resp);
    /*
     * May be NULL.  Told of each response once it is queued, with the time since the request
     * began: the request log and the metrics.  Called on a loop thread; not called for a dropped
     * response nor for the server's own refusals of a connection.
     */
    void (*answered)(void *ctx, const struct request *rq, const struct response *resp,
                     double seconds);
    /*
     * May be NULL.  Called on each loop thread every time it is about to wait for events (with
     * last 0), and once more as the loop ends (last 1): where a program writes out what it
     * batched during the loop's turn (its request log: log_thread_flush()).
     */
    void (*before_wait)(void *ctx, int last);
    /* May be NULL.  One line of the server's own, without a newline. */
    void (*log)(void *ctx, const char *line);
    void *ctx; /* borrowed: it must outlive the server */

    size_t max_body;  /* request bodies over this are refused with 413; 0: HTTP_BODY_MAX */
    int ipv6;         /* 1: IPv6 hosts and "[V6]:PORT" too; 0: IPv4 only */
    int stop_grace_s; /* how long a stop waits for the requests in flight */
    struct http_limits limits;
    /*
     * Borrowed, may be NULL: the listener speaks TLS with this server context (tls.h), which
     * tls_ctx_server_reload() may renew while the server runs.  The handshake happens within the
     * head deadline from the accept, on a connection already counted against its address's limit.
     */
    struct tls_ctx *tls;
};

struct http_server;

/* `limits` with every 0 replaced by its default. */
void http_limits_resolve(struct http_limits *limits);

/*
 * The flags that set struct http_limits, for a program's getopt_long table and for
 * http_limits_flag(): X(name, field, min, max).
 */
#define HTTP_LIMITS_FLAGS(X)                                                                       \
    X("max-connections", max_connections, 1, 1000000)                                              \
    X("max-connections-per-ip", max_connections_per_ip, -1, 1000000)                               \
    X("head-timeout-ms", head_timeout_ms, 100, 3600000)                                            \
    X("body-timeout-ms", body_timeout_ms, 100, 3600000)                                            \
    X("idle-timeout-ms", idle_timeout_ms, 100, 3600000)                                            \
    X("write-timeout-ms", write_timeout_ms, 100, 3600000)                                          \
    X("max-header-bytes", max_header_bytes, 1024, 1048576)                                         \
    X("http-threads", loops, 1, 8)                                                                 \
    X("http-workers", workers, 1, 4096)                                                            \
    X("http-queue", queue, 1, 1000000)                                                             \
    X("stream-min-rate", stream_min_rate, -1, 1000000000)                                          \
    X("streams-per-ip", streams_per_ip, -1, 1000000)                                               \
    X("max-streams", max_streams, -1, 1000000)

/* getopt_long entries for those flags, all returning `val` (the name tells them apart). */
#define HTTP_LIMITS_OPTION(name, field, min, max) {name, required_argument, NULL, HTTP_LIMITS_OPT},
#define HTTP_LIMITS_OPTIONS HTTP_LIMITS_FLAGS(HTTP_LIMITS_OPTION)
#define HTTP_LIMITS_OPT 0x4854 /* a getopt value no program uses for anything else */

/*
 * Parses one limit flag of `serve` ("--max-connections", "--head-timeout-ms"...) into `limits`:
 * returns 1 when `name` is such a flag (value taken), 0 when it is not, -1 with a sentence in
 * `err` for a bad value.
 */
int http_limits_flag(struct http_limits *limits, const char *name, const char *value, char *err,
                     size_t errlen);

/* The lines of `--help` for those flags, with their defaults. */
extern const char http_limits_help[];

/*
 * Starts listening on `listen` ("127.0.0.1:8080", "[::1]:0", "localhost:0"; port 0: a free one).
 * `opts` is copied.  Returns 0 and *out, or -1 with a sentence in `err`.
 */
int http_server_start(const struct http_server_options *opts, const char *listen,
                      struct http_server **out, char *err, size_t errlen);

/*
 * Reads the TLS certificate and key of a server whose context is its own (limits.tls_cert_file)
 * again, for the connections to come: 0, 1 when it has none, or -1 with a sentence in `err`
 * (the old pair stays).  Any thread.
 */
int http_server_reload_tls(struct http_server *srv, char *err, size_t errlen);

/* The URL the server is reachable at, "http://127.0.0.1:PORT" (borrowed). */
const char *http_server_url(const struct http_server *srv);

/* Counters since the start, for a program's /metrics. */
struct http_server_stats {
    uint64_t connections_open;
    uint64_t connections_refused; /* over the total or per-address cap */
    uint64_t timeouts;            /* head, body, idle-with-a-partial-request, write */
    uint64_t rejected_heads;      /* answered at the head: 401s, 413s, 431s, 400s */
    uint64_t queue_full;          /* 503: no worker free and the queue full */
};
void http_server_stats(const struct http_server *srv, struct http_server_stats *out);

/* Stops accepting, waits for the running requests to finish, frees. NULL is a no-op. */
void http_server_stop(struct http_server *srv);

#endif /* IDEM_HTTP_HTTP_SERVER_H */
