/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_server.c - the event-driven server of http_server.h: a connection's life on its loop.
 * Each loop thread runs a libuv loop with its own listening socket (listen.c), reads its
 * connections into request_parser.c, asks the program what to do with each request (on_head,
 * on_loop, on_unpark: answer, park, or hand it to a worker of workers.c), and writes the answer
 * (its head framed by http1.c) -- or streams it (stream.c), when the handler left a source of
 * its body.  A worker hands the connection back through its loop's `done` list and an async
 * wake-up: only the loop ever touches the socket, streams included.
 *
 * Every state change goes through http__set_state() (deadlines.c), which moves the connection
 * to the deadline list of its new state; the loop's tick expires what is late.
 *
 * A refused request is answered with a problem+json and, when its body was not read, closed
 * "lingering": the write side is shut and the rest of the body is read and dropped for a bounded
 * time, so that the client reads the answer instead of a reset.
 *
 * What the files beside it share -- struct conn, the loop, the server -- is in loop_internal.h.
 */
#include "loop_internal.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "problem.h"
#include "strbuf.h"
#include "util.h"
#include "banned.h"

void http__server_log(const struct http_server *srv, const char *fmt, ...)
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

/* The loop the calling thread runs, NULL on any other thread (loop_internal.h). */
static _Thread_local struct http_loop *current_loop;

#ifdef HTTP_UNDER_TSAN
char http__fd_numbers;
#endif

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

/* ---- closing --------------------------------------------------------------------------------- */

static void conn_free(struct conn *c)
{
    request_parser_release(&c->rp);
    response_release(&c->resp);
    free(c->in);
    free(c->out);
    tls_conn_free(c->tls);
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
        http__stream_release(c, HTTP_SOURCE_CLIENT); /* cut: the client went, or was cut off */
    http__stream_unreserve(c);
    if (c->counted)
        http__ip_put(srv, c->ip);
    atomic_fetch_sub(&srv->nconns, 1);
    /* A late wake-up may still hold it on the done list: on_wake frees it then. */
    pthread_mutex_lock(&lp->mu);
    queued = c->queued;
    c->free_later = queued;
    pthread_mutex_unlock(&lp->mu);
    if (!queued)
        conn_free(c);
}

static void on_self_wake(uv_idle_t *h);

/*
 * Puts `c` on its loop's done list for `why` (DONE_*) and wakes the loop.  Any thread.  The loop's
 * own thread (an upstream's answer unparking its request) needs no wake-up through the kernel: an
 * idle handle drains the list at the start of the next turn, before the loop polls, where the
 * async handle would cost a write and a read of its eventfd and a poll that returns at once.
 */
void http__loop_push(struct conn *c, int why)
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
    if (current_loop == lp && !uv_is_closing((uv_handle_t *)&lp->self_wake))
        uv_idle_start(&lp->self_wake, on_self_wake);
    else
        uv_async_send(&lp->wake);
}

void http__conn_close(struct conn *c)
{
    if (c->state == CONN_CLOSING || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    http__set_state(c, CONN_CLOSING);
    http_close_fd_handle((uv_handle_t *)&c->tcp, on_closed);
}

/* ---- writing --------------------------------------------------------------------------------- */

/* One write of ciphertext, with its buffer, for the plaintext write `orig`. */
struct tls_write {
    uv_write_t req;
    uv_write_t *orig; /* NULL: the engine's own bytes (handshake, alerts, close_notify) */
    uv_write_cb cb;
    char *buf;
};

static void tls_written(uv_write_t *req, int status)
{
    struct tls_write *w = req->data;
    uv_write_t *orig = w->orig;
    uv_write_cb cb = w->cb;

    free(w->buf);
    free(w);
    if (cb != NULL)
        cb(orig, status);
}

/*
 * Writes the ciphertext the engine has; `cb` (may be NULL) is told of it with `orig`.  0, or a
 * libuv error -- or 1 when `now` and the kernel took it all at once: `cb` is not called then,
 * the caller goes on by itself.  The engine's own bytes (cb NULL), and with `now` the caller's,
 * are tried straight into the kernel first: a uv_write() done at once still costs the loop an
 * epoll_ctl() at its next poll (libuv re-registers a descriptor whose output watcher it
 * stopped).  uv_try_write() takes nothing while earlier writes are queued, so the order holds.
 */
static int tls_send(struct conn *c, uv_write_t *orig, uv_write_cb cb, int now)
{
    struct strbuf out = STRBUF_INIT;
    struct tls_write *w;
    uv_buf_t buf;
    size_t len = 0, off = 0;
    int n, rc;

    tls_conn_take(c->tls, &out);
    if (out.len == 0 && cb == NULL)
        return 0;
    if (out.len > 0 && (cb == NULL || now)) {
        buf = uv_buf_init(out.buf, (unsigned int)out.len);
        n = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
        if (n == (int)out.len) {
            strbuf_release(&out);
            return cb == NULL ? 0 : 1;
        }
        if (n > 0)
            off = (size_t)n;
    }
    w = xcalloc(1, sizeof *w);
    w->req.data = w;
    w->orig = orig;
    w->cb = cb;
    w->buf = strbuf_detach(&out, &len);
    buf = uv_buf_init(w->buf ? w->buf + off : (char *)"", (unsigned int)(len - off));
    rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, tls_written);
    if (rc != 0) {
        free(w->buf);
        free(w);
    }
    return rc;
}

int http__write(struct conn *c, uv_write_t *wr, const char *data, size_t len, uv_write_cb cb)
{
    uv_buf_t buf = uv_buf_init((char *)data, (unsigned int)len);

    if (c->tls == NULL)
        return uv_write(wr, (uv_stream_t *)&c->tcp, &buf, 1, cb);
    if (tls_conn_write(c->tls, data, len) != 0)
        return UV_EPROTO;
    return tls_send(c, wr, cb, 0);
}

static void process_input(struct conn *c);
static void dispatch(struct conn *c, enum http_loop_verdict v, int keep);

static void on_shutdown(uv_shutdown_t *sd, int status)
{
    (void)sd;
    (void)status;
}

/* The response is out: close, linger, or wait for the next request. */
void http__written(struct conn *c, int status)
{
    free(c->out);
    c->out = NULL;
    if (status < 0) {
        http__conn_close(c);
        return;
    }
    if (!c->keep_alive) {
        if (c->tls != NULL) {
            tls_conn_shutdown(c->tls); /* close_notify, before the FIN */
            (void)tls_send(c, NULL, NULL, 0);
        }
        /*
         * The client asked to close and its request was read whole, nothing after it: a close
         * ends the connection as a shut write side would (the kernel sends the FIN after what is
         * queued), and reading went on until the answer, so no byte of it is left to turn the
         * close into a reset.  So nginx closes too.
         */
        if (c->read_whole && c->in_len == 0 && !request_parser_keep_alive(&c->rp) &&
            uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) == 0) {
            http__conn_close(c);
            return;
        }
        /*
         * Else (a refused request whose body was not read, a server stopping, bytes past the
         * request) shut the write side, and read what the client still sends until it closes:
         * a close with unread bytes would reset the connection, and the client could lose the
         * answer.
         */
        http__set_state(c, CONN_LINGER);
        if (uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
            http__conn_close(c);
            return;
        }
        http__start_reading(c);
        return;
    }
    response_release(&c->resp);
    response_init(&c->resp);
    c->read_whole = 0;
    http__set_state(c, CONN_IDLE);
    if (c->parsing)
        return; /* parse() goes on with the bytes it holds */
    if (c->in_len > 0)
        process_input(c);
    else
        http__start_reading(c);
}

static void on_write(uv_write_t *wr, int status)
{
    struct conn *c = wr->data;

    if (c->state == CONN_CLOSING)
        return;
    http__written(c, status);
}

/*
 * Writes `c->resp` as the answer to the current request (rq may be the stub of a request refused
 * early), then keeps the connection or closes it.
 */
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
        http__stream_start(c, rq, keep_alive);
        return;
    }
    http__stream_unreserve(c); /* reserved for a stream that did not happen (a 502 instead) */
    if (lp->srv->opts.before_send != NULL)
        lp->srv->opts.before_send(lp->srv->opts.ctx, rq, &c->resp);
    no_body = r->status == 204 || r->status == 304 || (r->status >= 100 && r->status < 200);
    if (atomic_load(&lp->srv->stopping))
        keep_alive = 0;
    c->keep_alive = keep_alive;
    strbuf_grow(&out, 160 + r->body_len);
    http__add_head(c, r, keep_alive, FRAME_LENGTH,
                   head_only && r->head_length >= 0 ? (unsigned long long)r->head_length
                                                    : r->body_len,
                   http__http_date(lp), &out);
    if (!head_only && !no_body && r->body_len > 0)
        strbuf_add(&out, r->body, r->body_len);

    if (c->report && lp->srv->opts.answered != NULL)
        lp->srv->opts.answered(lp->srv->opts.ctx, rq, r,
                               (double)(clock_mono_ns() - c->start_ns) / 1e9);

    /* Reading goes on: bytes that come meanwhile wait in c->in (on_read). */
    http__set_state(c, CONN_WRITING);
    c->out = strbuf_detach(&out, &len);
    buf = uv_buf_init(c->out, (unsigned int)len);
    if (c->tls != NULL) {
        c->wr.data = c;
        n = tls_conn_write(c->tls, c->out, len) != 0 ? UV_EPROTO : tls_send(c, &c->wr, on_write, 1);
        if (n != 0)
            http__written(c, n == 1 ? 0 : n);
        return;
    }
    n = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
    if (n == (int)len) {
        http__written(c, 0);
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        http__written(c, n);
        return;
    }
    if (n < 0)
        n = 0;
    buf = uv_buf_init(c->out + n, (unsigned int)(len - (size_t)n));
    c->wr.data = c;
    if (http__write(c, &c->wr, buf.base, buf.len, on_write) != 0)
        http__written(c, -1);
}

/* A problem of the server's own, for a request (or a connection) it refuses. */
void http__send_problem(struct conn *c, const struct request *rq, int status, const char *code,
                        const char *detail, int keep_alive)
{
    response_release(&c->resp);
    response_init(&c->resp);
    if (status == 503) /* busy or full: a retry soon is welcome, and says when */
        response_set_header(&c->resp, "Retry-After", "1");
    response_problem(&c->resp, status, code, detail);
    send_response(c, rq, keep_alive);
}

/* The request as far as it was read, or a stub when not even its head was. */
const struct request *http__current_request(struct conn *c)
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
    http__send_problem(c, http__current_request(c), status, code, detail, 0);
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
        if (c->tls == NULL)
            uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
        else if (tls_conn_write(c->tls, buf.base, buf.len) == 0)
            (void)tls_send(c, NULL, NULL, 0);
    }
    http__set_state(c, CONN_BODY);
    return 0;
}

/*
 * Does what the program decided of a head, on the loop or (`on_worker`) back from a worker:
 * 0 when the body may come, -1 when the request was answered or handed to a worker.
 */
static int act_on_head(struct conn *c, enum http_head_verdict v, int on_worker)
{
    if (v == HTTP_HEAD_BLOCKS && !on_worker) {
        if (http__submit(c, JOB_HEAD, 0) != 0)
            refuse_head(c, 503, "server-busy", "Every worker is busy; retry shortly.");
        return -1;
    }
    if (v == HTTP_HEAD_BLOCKS) {
        /* A program that cannot decide even when it may block: refuse, safely. */
        response_release(&c->resp);
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
    response_release(&c->resp);
    response_init(&c->resp);
    if (o->on_head != NULL)
        v = o->on_head(o->ctx, rq, &c->resp, 0);
    return act_on_head(c, v, 0);
}

/*
 * Parks the request as `park` says, until woken or its timeout: at least a millisecond, so that a
 * request parked again by http__on_tick's pass is not met again in that pass.  Reading goes on,
 * into c->in and no further than got() lets it.
 */
static void park_request(struct conn *c, const struct http_park *park)
{
    c->must_finish = park->must_finish != 0;
    if (c->must_finish)
        atomic_fetch_add(&c->lp->srv->parked_must_finish, 1);
    c->park_data = park->data;
    http__set_state(c, CONN_PARKED);
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
    response_release(&c->resp);
    response_init(&c->resp);
    if (o->on_loop != NULL)
        v = o->on_loop(o->ctx, rq, &c->resp, &park);
    if (v == HTTP_LOOP_PARKED && o->on_unpark != NULL) {
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
    response_release(&c->resp);
    response_init(&c->resp);
    if (http__submit(c, JOB_HANDLE, v == HTTP_LOOP_HANDOFF) != 0)
        http__send_problem(c, rq, 503, "server-busy", "Every worker is busy; retry shortly.", keep);
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
void http__unpark(struct conn *c, int timed_out)
{
    const struct http_server_options *o = &c->lp->srv->opts;
    const struct request *rq = request_parser_request(&c->rp);
    struct http_park park = {.token = c};
    void *data = c->park_data;
    enum http_loop_verdict v;

    unpark_begin(c);
    c->rp.rq.parked_ms += (long)(uv_now(&c->lp->uv) - c->since);
    response_release(&c->resp);
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
        http__loop_push(c, DONE_JOB);
}

void http_server_unpark(void *token)
{
    http__loop_push(token, DONE_WAKE);
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
            c->read_whole = 0;
            http__set_state(c, CONN_HEAD);
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
        if (r == REQUEST_PARSE_COMPLETE) {
            c->read_whole = 1;
            request_complete(c);
        }
        if (c->state == CONN_IDLE && len > 0)
            continue; /* answered at once: the next pipelined request */
        if (c->state == CONN_WORKING || c->state == CONN_WRITING || c->state == CONN_PARKED)
            keep_rest(c, data, len);
        break;
    }
    c->parsing = 0;
    if (c->state == CONN_IDLE || c->state == CONN_FRESH || c->state == CONN_HEAD ||
        c->state == CONN_BODY)
        http__start_reading(c);
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

static void got(struct conn *c, const char *data, ssize_t nread);

/* What a plain-HTTP client on the TLS port is told before the connection closes. */
static const char plain_on_tls[] =
    "HTTP/1.1 400 Bad Request\r\nContent-Type: application/problem+json\r\n"
    "Connection: close\r\nContent-Length: 132\r\n\r\n"
    "{\"type\":\"/problems/tls-required\",\"title\":\"TLS required\",\"status\":400,"
    "\"detail\":\"This port speaks HTTPS only.\",\"code\":\"tls-required\"}\n";

/* Ciphertext read on a TLS connection: the handshake moved on, or plaintext for got(). */
static void tls_in(struct conn *c, const char *data, size_t len)
{
    struct strbuf plain = STRBUF_INIT;
    enum tls_step step;

    tls_conn_put(c->tls, data, len);
    if (c->handshaking) {
        step = tls_conn_handshake(c->tls);
        if (step == TLS_FAIL && len > 0 && data[0] >= 'A' && data[0] <= 'Z') {
            uv_buf_t buf = uv_buf_init((char *)plain_on_tls, sizeof plain_on_tls - 1);
            uv_try_write((uv_stream_t *)&c->tcp, &buf, 1); /* best effort, as it closes */
        } else {
            (void)tls_send(c, NULL, NULL, 0); /* a flight, or the failure's alert */
        }
        if (step == TLS_FAIL) {
            http__server_log(c->lp->srv, "TLS handshake with %s failed: %s", c->peer,
                             tls_conn_error(c->tls));
            http__conn_close(c);
            return;
        }
        if (step != TLS_OK)
            return;
        c->handshaking = 0;
    }
    do
        step = tls_conn_read(c->tls, &plain, (size_t)1 << 20);
    while (step == TLS_OK);
    (void)tls_send(c, NULL, NULL, 0);
    if (plain.len > 0)
        got(c, plain.buf, (ssize_t)plain.len);
    strbuf_release(&plain);
    /* The end (or a broken record) while the connection still reads; else the socket's EOF. */
    if ((step == TLS_EOF || step == TLS_FAIL) && c->reading && c->state != CONN_CLOSING)
        got(c, NULL, UV_EOF);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = (struct conn *)s;

    if (nread == 0)
        return;
    if (c->tls != NULL && nread > 0 && c->state != CONN_LINGER) {
        tls_in(c, buf->base, (size_t)nread);
        return;
    }
    if (c->tls != NULL && c->handshaking && nread < 0) {
        http__conn_close(c);
        return;
    }
    got(c, buf->base, nread);
}

/*
 * `nread` bytes of `data` from the client (plaintext), or its end or an error (negative).
 *
 * Reading goes on while a request is on a worker or parked: stopping and starting it again for
 * each request would cost the loop two epoll_ctl() calls (libuv re-adds the descriptor, which
 * fails with EEXIST, then modifies it).  What comes meanwhile waits in c->in, as behind a
 * response being written, and reading stops once that holds READ_CHUNK bytes.
 */
static void got(struct conn *c, const char *data, ssize_t nread)
{
    int away = c->state == CONN_WORKING || c->state == CONN_PARKED;

    if (c->state == CONN_LINGER) {
        c->drained += nread > 0 ? (size_t)nread : 0;
        if (nread < 0 || c->drained > LINGER_MAX_BYTES)
            http__conn_close(c);
        return;
    }
    if (nread < 0 && away) {
        /*
         * A worker or the program holds the request: the connection stays until it is answered
         * (the answer may still reach a client that only shut its write side), then closes.
         */
        http__stop_reading(c);
        c->hung_up = 1;
        return;
    }
    if (nread < 0) {
        /* The client went away; a request cut short has nobody to answer. */
        http__conn_close(c);
        return;
    }
    if (away || c->state == CONN_WRITING || c->state == CONN_STREAMING) {
        /* The next pipelined request waits for this response to be out; not without bound. */
        keep_rest(c, data, (size_t)nread);
        if (c->in_len > READ_CHUNK)
            http__stop_reading(c);
        return;
    }
    parse(c, data, (size_t)nread);
}

void http__start_reading(struct conn *c)
{
    if (c->hung_up && c->state != CONN_CLOSING) {
        http__conn_close(c); /* its end was read while its request was away */
        return;
    }
    if (!c->reading && c->state != CONN_CLOSING) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
            c->reading = 1;
        else
            http__conn_close(c);
    }
}

void http__stop_reading(struct conn *c)
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
        http__conn_close(c);
        return;
    }
    send_response(c, rq, request_parser_keep_alive(&c->rp));
}

/* Takes the loop's done list and acts on each connection on it (the loop's thread). */
static void drain_done(struct http_loop *lp)
{
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
            http__unpark(c, 0); /* a wake that lost the race with its timeout finds it moved on */
    }
    if (atomic_load(&lp->srv->stopping))
        http__begin_stop(lp);
}

static void on_wake(uv_async_t *a)
{
    drain_done(a->data);
}

/* The loop's own pushes (http__loop_push): once drained, the handle stops until the next one. */
static void on_self_wake(uv_idle_t *h)
{
    uv_idle_stop(h);
    drain_done(h->data);
}

/* ---- the loops ------------------------------------------------------------------------------- */

/* No new connections; idle ones close; the others finish their request and close. */
void http__begin_stop(struct http_loop *lp)
{
    struct conn *c;

    if (!lp->closing_listener) {
        lp->closing_listener = 1;
        uv_close((uv_handle_t *)&lp->listener, NULL);
    }
    while ((c = lp->head[LIST_IDLE]) != NULL)
        http__conn_close(c);
    while ((c = lp->head[LIST_FRESH]) != NULL)
        http__conn_close(c);
    /* Each is told once per turn: one parked again goes to the list's end. */
    for (int n = atomic_load(&lp->in_state[CONN_PARKED]); n > 0 && lp->head[LIST_PARKED]; n--)
        http__unpark(lp->head[LIST_PARKED], 1);
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
    if (http__stream_handle(h))
        return;
    /* A connection's handle points at itself (the listener's at its loop): its close frees it. */
    if (h->type == UV_TCP && h->data == (void *)h)
        http__conn_close((struct conn *)h);
    else
        uv_close(h, NULL);
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
    uv_idle_init(&lp->uv, &lp->self_wake);
    lp->self_wake.data = lp;
    uv_timer_init(&lp->uv, &lp->tick);
    lp->tick.data = lp;
    uv_timer_start(&lp->tick, http__on_tick, TICK_MS, TICK_MS);
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
    return uv_listen((uv_stream_t *)&lp->listener, LISTEN_BACKLOG, http__on_connection) == 0 ? 0
                                                                                             : -1;
}

int http_server_reload_tls(struct http_server *srv, char *err, size_t errlen)
{
    if (srv == NULL || srv->own_tls == NULL)
        return 1;
    return tls_ctx_server_reload(srv->own_tls, err, errlen);
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
    if (http__resolve_listen(listen, opts->ipv6, &ss, &sslen, err, errlen) != 0)
        goto out;
    srv = xcalloc(1, sizeof *srv);
    srv->opts = *opts;
    http_limits_resolve(&srv->opts.limits);
    if ((opts->limits.tls_cert_file == NULL) != (opts->limits.tls_key_file == NULL)) {
        snprintf(err, errlen, "--tls-cert and --tls-key go together");
        goto out;
    }
    if (opts->tls == NULL && opts->limits.tls_cert_file != NULL) {
        struct tls_server_options to = {.cert_file = opts->limits.tls_cert_file,
                                        .key_file = opts->limits.tls_key_file};
        if (tls_ctx_server_new(&to, &srv->own_tls, err, errlen) != 0)
            goto out;
        srv->opts.tls = srv->own_tls;
    }
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
    http__raise_fd_limit(srv);

    port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (port != 0 && http__address_taken((struct sockaddr *)&ss, sslen)) {
        snprintf(err, errlen, "cannot listen on %s: the address is in use", listen);
        goto out;
    }
    srv->nloops = srv->opts.limits.loops;
    srv->loops = xcalloc((size_t)srv->nloops, sizeof *srv->loops);
    for (i = 0; i < srv->nloops; i++) {
        fd = http__listen_socket((struct sockaddr *)&ss, sslen);
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
        snprintf(srv->url, sizeof srv->url, "%s://[%s]:%u", srv->opts.tls ? "https" : "http", host,
                 (unsigned)port);
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
        snprintf(srv->url, sizeof srv->url, "%s://%s:%u", srv->opts.tls ? "https" : "http", host,
                 (unsigned)port);
    }

    srv->nworkers = srv->opts.limits.workers;
    srv->workers = xcalloc((size_t)srv->nworkers, sizeof *srv->workers);
    for (i = 0; i < srv->nworkers; i++) {
        if (pthread_create(&srv->workers[i], NULL, http__worker_main, srv) != 0)
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
            http__server_log(srv, "stopping with %d requests unfinished", left);
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
            http__set_state(c, CONN_WORKING);
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
    tls_ctx_free(srv->own_tls);
    pthread_cond_destroy(&srv->qcond);
    pthread_mutex_destroy(&srv->qmu);
    pthread_mutex_destroy(&srv->ipmu);
    free(srv);
}
