/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stream.c - answers whose body is too large to hold (response_stream()), written by the loop:
 * the caps on streams (per client address and in all), then the stream itself, pulled from its
 * source piece by piece as the client takes the last one, and its deadlines.
 */
#include "loop_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#ifdef __linux__
#include <linux/sockios.h> /* SIOCOUTQ */
#endif

#include "util.h"
#include "banned.h"

/*
 * A stream is held to stream_min_rate once it has waited this long for its client in all (a slow
 * start is no offence).
 */
#define STREAM_RATE_GRACE_MS 10000

/* ---- the caps -------------------------------------------------------------------------------- */

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
    pp = c->counted ? http__ip_find(srv, c->ip) : NULL;
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
void http__stream_unreserve(struct conn *c)
{
    struct http_server *srv = c->lp->srv;
    struct ip_slot **pp;

    if (!c->stream_reserved)
        return;
    c->stream_reserved = 0;
    pthread_mutex_lock(&srv->ipmu);
    srv->nstreams--;
    pp = c->counted ? http__ip_find(srv, c->ip) : NULL;
    if (pp != NULL && *pp != NULL && (*pp)->streams > 0)
        (*pp)->streams--;
    pthread_mutex_unlock(&srv->ipmu);
}

/* ---- a streamed body, written by the loop ---------------------------------------------------- */

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

int http__stream_handle(const uv_handle_t *h)
{
    return h->data == &stream_poll_mark;
}

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
void http__stream_release(struct conn *c, enum http_source_end how)
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
    http__stream_unreserve(c);
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
        http__conn_close(c); /* on_closed releases the stream */
        return;
    }
    http__stream_release(c, how);
    http__set_state(c, CONN_WRITING);
    http__written(c, 0);
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
    if (http__write(c, &st->wr, buf.base, buf.len, stream_written) != 0) {
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
void http__stream_start(struct conn *c, const struct request *rq, int keep_alive)
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
    http__add_head(c, r, keep_alive, framing, st->length, http__http_date(lp), &st->piece);
    c->st = st;
    http__set_state(c, CONN_STREAMING);
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
void http__stream_check(struct conn *c, uint64_t now)
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
