/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proxy.c - idem-gateway's request path (proxy.h).
 *
 * The life of a keyed request: its route, principal and key are read from the head (refusals
 * before the body); once the body is in, the fingerprint; a replay is answered from memory on
 * the loop; otherwise a worker claims the record, commits the claim with the recovery point
 * "forwarded" -- durable before a byte goes upstream, so a gateway killed mid-request leaves a
 * record that says "the upstream may have acted" -- forwards, and settles the record by what came
 * back:
 *
 *   a whole answer, storable status   completed with it (stored headers per the route)
 *   a whole answer, other status      deleted (idem_call_forget): a retry runs again
 *   nothing could be sent             deleted: a retry runs
 *   sent, no whole answer             recovery point "unknown": the route's unknown mode decides
 *                                     what every retry gets (run_unknown)
 *
 * A retry that finds a record at "forwarded" or "unknown" whose lease is free takes it over
 * (RESUME) and lands in run_unknown too: that is the gateway killed mid-request.
 */
#include "proxy.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ascii.h"
#include "error_format.h"
#include "keyed_answer.h"
#include "method_override.h"
#include "request_key.h"
#include "request_scope.h"
#include "route.h"
#include "strbuf.h"
#include "unrouted.h"
#include "util.h"
#include "banned.h"

/* Seconds a client is asked to wait before retrying a held request. */
#define HOLD_RETRY_AFTER "5"

/* What on_head and on_loop learnt of a request, kept with it (rq->note). */
struct note {
    struct route_match m;
    size_t route_index;                      /* cfg->nroutes when there is no route */
    int keyed;                               /* a record is kept: a route, and a key */
    int key_in_body;                         /* the key is read once the body is in */
    int prepared;                            /* key and fingerprint are known */
    char principal[IDEM_SCOPE_PART_MAX + 1]; /* with the route's scope headers */
    size_t caller_len;                       /* principal[0..caller_len): the caller alone */
    struct quota *quota;                     /* admitted (admit()): in flight until note_free */
    struct quota_slot *slot;
    char key[IDEM_KEY_MAX + 1];
    unsigned char fp[IDEM_FP_LEN];
    /*
     * What the event loop hands a worker with the request: a fresh key's exchange to settle,
     * with its `call` (fresh_on_unpark); its reply.rest, when the answer is too large to hold,
     * goes back to the loop to stream (stream_rest).
     */
    struct http_reply reply;
    struct idem_call *call;
    enum http_fetch_result res;
    int settled;     /* the record holds the answer already: only relay it */
    long watched_ms; /* how long it waited parked on a duplicate's watch (PARK_WATCH) */
    char err[300];
};

static void note_free(void *p)
{
    struct note *n = p;
    route_match_clear(&n->m);
    quota_put(n->quota, n->slot);
    http_reply_clear(&n->reply);
    idem_call_end(n->call); /* only when the worker never ran */
    free(n);
}

/* ---- headers ------------------------------------------------------------------------------ */

/*
 * Headers that belong to one connection, not to the message (http_hop_by_hop(), and `listed`: one
 * that a Connection field of the message names), plus the ones the gateway writes itself: never
 * passed on in either direction.
 */
static int hop_by_hop(const char *name, int listed)
{
    static const char *const ours[] = {"Content-Length", "Expect", "Date"};

    return listed || http_hop_by_hop(name) != NULL ||
           ascii_caseeq_any(name, ours, sizeof ours / sizeof ours[0]) != NULL;
}

/* Whether any Connection field of the upstream's answer names `name`. */
static int reply_connection_lists(const struct http_reply *ur, const char *name)
{
    for (size_t i = 0; i < ur->nheaders; i++)
        if (ascii_caseeq(ur->headers[i].name, "Connection") &&
            http_list_has_token(ur->headers[i].value, name))
            return 1;
    return 0;
}

/* `key` as an RFC 8941 sf-string, the form libidem parses back. */
static void sf_string(const char *key, struct strbuf *out)
{
    strbuf_addch(out, '"');
    for (const char *p = key; *p; p++) {
        if (*p == '"' || *p == '\\')
            strbuf_addch(out, '\\');
        strbuf_addch(out, *p);
    }
    strbuf_addch(out, '"');
}

/*
 * The key as the upstream gets it: with `token`, bare when it reads back as the same key so (as
 * libidem's parser reads a bare key: not starting with a quote, no space or comma), which is how
 * clients send keys; else, and always without `token`, as an sf-string.  Either way one key has
 * one form, whichever way each retry wrote it.
 */
static void key_as_forwarded(const char *key, int token, struct strbuf *out)
{
    if (token && key[0] != '"' && strpbrk(key, " ,") == NULL)
        strbuf_adds(out, key);
    else
        sf_string(key, out);
}

/* What a request sent upstream is for. */
enum forward_kind {
    FORWARD_REQUEST, /* the client's request: its method, target, headers and body */
    FORWARD_LOOKUP,  /* the reconcile query: no body, only the headers lookup_header() keeps */
};

/*
 * The headers of a retry that its reconcile query carries: Host and the caller's credentials (the
 * principal's header, Authorization), its scope headers, and those the route names.  Nothing else
 * of the retry: a
 * header that changes what the upstream's lookup finds would make "404, it never ran" a lie.
 */
static int lookup_header(const struct gw_config *cfg, const struct gw_route *r, const char *name)
{
    if (ascii_caseeq(name, "Host") || ascii_caseeq(name, "Authorization"))
        return 1;
    if (cfg->principal == GW_PRINCIPAL_HEADER && ascii_caseeq(name, cfg->principal_header))
        return 1;
    for (size_t i = 0; i < r->nreconcile_headers; i++)
        if (ascii_caseeq(name, r->reconcile_headers[i]))
            return 1;
    for (size_t i = 0; i < r->nscope_headers; i++)
        if (ascii_caseeq(name, r->scope_headers[i]))
            return 1; /* on whose behalf: the lookup must ask about the same account */
    return 0;
}

/*
 * The request as the upstream gets it (`urq`): `method` `target`, its own headers minus hop-by-hop
 * ones plus ours, and its body unless it is a lookup.  A keyed request carries the key the gateway
 * used as `Idempotency-Key`, in one form per key (key_as_forwarded), in place of any the
 * client sent: an upstream that dedupes on it sees one key for every retry however the client
 * wrote it, and never a key the gateway did not use.  The strings it points to live until
 * forwarded_release().
 */
struct forwarded {
    struct upstream_request urq;
    struct upstream_header *h;
    size_t n;
    struct strbuf xff, key;
};

static void forwarded_build(const struct gateway *gw, const struct request *rq,
                            const struct note *n, const char *method, const char *target,
                            enum forward_kind kind, struct forwarded *f)
{
    const char *xff = NULL;
    int keyed = n && n->keyed;

    memset(f, 0, sizeof *f);
    f->h = xcalloc(rq->nfields + 2, sizeof *f->h);
    for (size_t i = 0; i < rq->nfields; i++) {
        const char *name = rq->fields[i].name;
        if (hop_by_hop(name, request_connection_lists(rq, name)))
            continue;
        if (ascii_caseeq(name, "X-Forwarded-For")) {
            xff = rq->fields[i].value; /* the first one; extended below */
            continue;
        }
        if (keyed && ascii_caseeq(name, "Idempotency-Key"))
            continue; /* the key the gateway used goes instead, below */
        if (kind == FORWARD_LOOKUP && !lookup_header(gw->cfg, n->m.route, name))
            continue;
        f->h[f->n].name = name;
        f->h[f->n].value = rq->fields[i].value;
        f->n++;
    }
    if (xff)
        strbuf_addf(&f->xff, "%s, %s", xff, rq->peer ? rq->peer : "unknown");
    else
        strbuf_adds(&f->xff, rq->peer ? rq->peer : "unknown");
    f->h[f->n].name = "X-Forwarded-For";
    f->h[f->n].value = f->xff.buf;
    f->n++;
    if (keyed) {
        key_as_forwarded(n->key, n->m.route->key_forward_token, &f->key);
        f->h[f->n].name = "Idempotency-Key";
        f->h[f->n].value = f->key.buf;
        f->n++;
    }
    f->urq.method = method;
    f->urq.target = target;
    f->urq.headers = f->h;
    f->urq.nheaders = f->n;
    f->urq.fresh_connection = keyed && gw->cfg->upstream_keyed_fresh;
    f->urq.body = kind == FORWARD_REQUEST ? rq->body : NULL;
    f->urq.body_len = kind == FORWARD_REQUEST ? rq->body_len : 0;
}

static void forwarded_release(struct forwarded *f)
{
    free(f->h);
    strbuf_release(&f->xff);
    strbuf_release(&f->key);
}

/* ---- answers ------------------------------------------------------------------------------ */

/*
 * The upstream's answer into `resp`: status, end-to-end headers, body (moved, not copied).
 * Returns 0, or -1 when it has more headers than a response may carry (`resp` is then a 502).
 */
static int relay(struct http_reply *ur, struct response *resp)
{
    const char *length = http_reply_header(ur, "Content-Length");
    char *end = NULL;
    long long announced;

    resp->status = ur->status;
    /* A HEAD answer announces the length of the body it does not carry: passed on as it is. */
    if (length != NULL && ur->body_len == 0) {
        announced = strtoll(length, &end, 10);
        if (end != length && *end == '\0' && announced >= 0)
            resp->head_length = announced;
    }
    for (size_t i = 0; i < ur->nheaders; i++) {
        if (hop_by_hop(ur->headers[i].name, reply_connection_lists(ur, ur->headers[i].name)))
            continue;
        if (response_add_header(resp, ur->headers[i].name, ur->headers[i].value) != 0) {
            response_release(resp);
            response_init(resp);
            response_problem(resp, 502, "upstream-bad-reply",
                             "The upstream's answer has more header fields than the gateway "
                             "passes on.");
            return -1;
        }
    }
    free(resp->body);
    resp->body = ur->body;
    resp->body_len = ur->body_len;
    resp->problem = NULL; /* the upstream's, even a problem: never restyled */
    ur->body = NULL;
    ur->body_len = 0;
    return 0;
}

/*
 * An upstream whose certificate does not verify (or that refuses the gateway's) fails every
 * request until someone acts: said in the log each time, with OpenSSL's reason.
 */
static void log_tls_refusal(struct gateway *gw, const char *what, const struct http_reply *ur,
                            const char *err)
{
    if (ur->tls_failed)
        log_msg(&gw->log, "warn", "%s: TLS with the upstream failed, nothing sent: %s", what, err);
}

static void answer_not_sent(struct response *resp, const char *err)
{
    char detail[400];
    snprintf(detail, sizeof detail,
             "The upstream could not be reached (%s); nothing was sent to it. Retry.", err);
    response_set_header(resp, "Retry-After", "1");
    response_problem(resp, 502, "upstream-unavailable", detail);
}

/* ---- the caller's limits ------------------------------------------------------------------ */

/*
 * Before a keyed request claims its record: the caller's limits and the stored-bytes budget
 * (quota.h).  Returns 0, the request counted in flight until it ends, or -1 with `resp` the
 * refusal (nothing claimed, nothing sent).  Once per request.
 */
static int admit(struct gateway *gw, struct note *n, struct response *resp)
{
    const struct gw_config *cfg = gw->cfg;
    char detail[300], after[16];
    int retry_after = 1;
    enum quota_verdict v;

    if (n->quota != NULL)
        return 0;
    v = quota_admit(gw->quota, n->principal, n->caller_len, clock_wall_ms(), &n->slot,
                    &retry_after);
    switch (v) {
    case QUOTA_OK:
        n->quota = gw->quota;
        return 0;
    case QUOTA_IN_FLIGHT:
        snprintf(detail, sizeof detail,
                 "This caller has %d keyed requests running, as many as it may; retry once one "
                 "has been answered.",
                 cfg->limit_keys_in_flight);
        response_problem(resp, 429, "too-many-requests", detail);
        break;
    case QUOTA_RATE:
        snprintf(detail, sizeof detail,
                 "This caller starts new idempotency keys faster than the %d a second it may. "
                 "Retry later.",
                 cfg->limit_new_keys_per_second);
        response_problem(resp, 429, "too-many-requests", detail);
        break;
    case QUOTA_STORED:
        snprintf(detail, sizeof detail,
                 "This caller's stored answers take %llu bytes, as many as it may keep; new keys "
                 "are refused until some of its records expire.",
                 (unsigned long long)cfg->limit_stored_bytes);
        response_problem(resp, 429, "stored-bytes-exceeded", detail);
        break;
    case QUOTA_TOTAL:
        snprintf(detail, sizeof detail,
                 "The gateway's stored answers take %llu bytes, as many as it may keep; new keys "
                 "are refused until records expire. Nothing was sent.",
                 (unsigned long long)cfg->max_stored_bytes);
        response_problem(resp, 507, "store-full", detail);
        break;
    case QUOTA_BUSY:
        response_problem(resp, 503, "server-busy",
                         "Too many callers have keyed requests running right now. Retry.");
        break;
    }
    snprintf(after, sizeof after, "%d", retry_after);
    response_set_header(resp, "Retry-After", after);
    resp->outcome = "refused";
    return -1;
}

/* The bytes of an upstream answer as a record holds them: status line, header fields, body. */
static uint64_t reply_bytes(const struct http_reply *ur)
{
    uint64_t n = 16 + ur->body_len;

    for (size_t i = 0; i < ur->nheaders; i++)
        n += strlen(ur->headers[i].name) + strlen(ur->headers[i].value) + 4;
    return n;
}

/* What a record "not stored" holds (not_stored_answer's problem), as counted. */
#define NOT_STORED_BYTES 512

/* A record of the request was completed holding `answer` bytes: counted against its caller. */
static void count_stored(const struct note *n, uint64_t answer)
{
    if (n->quota == NULL)
        return;
    quota_stored(n->quota, n->slot,
                 answer + strlen(n->principal) + strlen(n->key) + QUOTA_RECORD_OVERHEAD,
                 clock_wall_ms() + n->m.route->retention_ms);
}

/* ---- the record's end states -------------------------------------------------------------- */

/*
 * Whether the upstream's answer is kept as the key's outcome: a status the route stores, and,
 * unless the route says store_retryable, no error the upstream marks as worth retrying
 * (Stripe-Should-Retry: true, a Retry-After): the record is released and a retry runs again.
 * A success is kept whatever it carries: a 202 with Retry-After says when to look, not "again".
 */
static int storable(const struct gw_route *r, const struct http_reply *ur)
{
    const char *should_retry;

    if (ur->status <= 0 || ur->status >= GW_STATUS_LIMIT || !r->store_status[ur->status])
        return 0;
    if (r->store_retryable || ur->status < 400)
        return 1;
    should_retry = http_reply_header(ur, "Stripe-Should-Retry");
    return http_reply_header(ur, "Retry-After") == NULL &&
           !(should_retry != NULL && ascii_caseeq(should_retry, "true"));
}

/*
 * What a record whose answer was too large to store holds instead: a problem saying the upstream
 * acted but its answer was not kept, so a retry learns that and never runs the request again.
 * `size`: the response's length, or UINT64_MAX for "more than `at_least`" (streamed, unknown).
 * In the gateway's error format: `styled` (response_release() it) and its headers in h (borrowed
 * from it; the count is returned).
 */
static size_t not_stored_answer(const struct gateway *gw, const struct gw_route *r, uint64_t size,
                                size_t at_least, struct response *styled, struct idem_header h[2])
{
    char detail[300], how_large[64];
    size_t nh = 0;

    if (size == UINT64_MAX)
        snprintf(how_large, sizeof how_large, "over %zu bytes", at_least);
    else
        snprintf(how_large, sizeof how_large, "%llu bytes", (unsigned long long)size);
    snprintf(detail, sizeof detail,
             "The request was executed, but its response (%s) was too large to store, so it "
             "cannot be replayed. Read the result from the API itself.",
             how_large);
    response_init(styled);
    response_problem(styled, 410, "response-not-stored", detail);
    gw_errors_restyle(gw->cfg->error_format, r, 1, NULL, styled);
    for (size_t i = 0; i < styled->nheaders && nh < 2; i++)
        h[nh++] = (struct idem_header){styled->headers[i].name, styled->headers[i].value};
    return nh;
}

/* Completes the record with not_stored_answer(). */
static int complete_not_stored(const struct gateway *gw, const struct gw_route *r,
                               struct idem_call *call, uint64_t size, size_t at_least)
{
    struct idem_header h[2];
    struct response styled;
    size_t nh = not_stored_answer(gw, r, size, at_least, &styled, h);
    int rc = idem_call_complete(call, styled.status, h, nh, styled.body, styled.body_len);

    response_release(&styled);
    return rc;
}

/* Moves the record to "unknown" (durably) unless it is there already. */
static void mark_unknown(struct gateway *gw, struct idem_call *call)
{
    int rc;

    if (strcmp(idem_call_recovery_point(call), GW_POINT_UNKNOWN) == 0)
        return;
    rc = idem_call_phase_begin(call);
    if (rc == 0)
        rc = idem_call_advance(call, GW_POINT_UNKNOWN, NULL);
    if (rc < 0) /* it stays "forwarded", which every retry treats the same way */
        log_msg(&gw->log, "warn", "cannot mark a record unknown: %s", idem_call_errmsg(call));
}

/* What the first attempt's client is told when its answer was lost on the way. */
static void answer_lost(const struct gw_route *r, int timed_out, const char *err,
                        struct response *resp)
{
    char detail[600];
    const char *next = r->unknown == GW_UNKNOWN_HOLD
                           ? "Retries with this key are answered 503 until an operator resolves "
                             "it (idem-gateway keys resolve)."
                       : r->unknown == GW_UNKNOWN_RESEND
                           ? "A retry with the same key sends it again; the upstream dedupes on "
                             "the key."
                           : "A retry with the same key asks the upstream what happened.";

    snprintf(detail, sizeof detail,
             "The request reached the upstream but no whole answer came back (%s), so whether it "
             "was executed is unknown. %s",
             err, next);
    keyed_answer_outcome_unknown(resp, timed_out ? 504 : 502, detail);
    /* What a retry will be told: a held key answers 503 with this until it is resolved. */
    if (r->unknown == GW_UNKNOWN_HOLD)
        response_set_header(resp, "Retry-After", HOLD_RETRY_AFTER);
}

/* The answer's header fields as libidem takes them (borrowed from `ur`); free() the array. */
static struct idem_header *reply_headers(const struct http_reply *ur)
{
    struct idem_header *h = xcalloc(ur->nheaders + 1, sizeof *h);

    for (size_t i = 0; i < ur->nheaders; i++) {
        h[i].name = ur->headers[i].name;
        h[i].value = ur->headers[i].value;
    }
    return h;
}

/* No claim could be made (the store failed): logged, and answered 503; nothing was sent. */
static void answer_no_claim(struct gateway *gw, const char *operation, const char *why,
                            struct response *resp)
{
    log_msg(&gw->log, "error", "%s: cannot begin: %s", operation, why);
    keyed_answer_unavailable(resp, "The idempotency store cannot be reached; nothing was sent "
                                   "upstream. Retry.");
}

static void log_unsettled(struct gateway *gw, const struct gw_route *r, int status,
                          struct idem_call *call)
{
    log_msg(&gw->log, "error",
            "%s: the upstream answered %d but the record could not be settled (%s); retries "
            "will meet the unknown-outcome mode",
            r->operation, status, idem_call_errmsg(call));
}

/* Whether settle() would store the whole answer as it is (no deletion, nothing too large). */
static int stores_whole(const struct gw_route *r, enum http_fetch_result res,
                        const struct http_reply *ur)
{
    return res == HTTP_FETCH_OK && storable(r, ur) && ur->rest == NULL &&
           ur->body_len <= r->max_stored_body;
}

/*
 * Settles the record by the exchange's result and answers.  The upstream may have acted in every
 * case but HTTP_FETCH_NOT_SENT, so a failure to store is never turned into a deletion: the record
 * then stays "forwarded" and retries meet the route's unknown mode.
 */
static void settle(struct gateway *gw, const struct note *n, struct idem_call *call,
                   enum http_fetch_result res, struct http_reply *ur, const char *err,
                   struct response *resp)
{
    const struct gw_route *r = n->m.route;
    int rc = 0;

    switch (res) {
    case HTTP_FETCH_OK:
        resp->outcome = "executed";
        if (!storable(r, ur))
            rc = idem_call_forget(call);
        else if (ur->rest != NULL)
            rc = complete_not_stored(gw, r, call, http_body_stream_length(ur->rest),
                                     r->max_stored_body);
        else if (!stores_whole(r, res, ur))
            rc = complete_not_stored(gw, r, call, ur->body_len, 0);
        else {
            struct idem_header *h = reply_headers(ur);
            rc = idem_call_complete(call, ur->status, h, ur->nheaders, ur->body, ur->body_len);
            free(h);
        }
        if (rc < 0)
            log_unsettled(gw, r, ur->status, call);
        else if (storable(r, ur))
            count_stored(n, stores_whole(r, res, ur) ? reply_bytes(ur) : NOT_STORED_BYTES);
        relay(ur, resp);
        return;
    case HTTP_FETCH_TOO_LARGE:
        rc = complete_not_stored(gw, r, call, UINT64_MAX, ur->body_len);
        if (rc < 0)
            log_msg(&gw->log, "error", "%s: cannot settle a record: %s", r->operation,
                    idem_call_errmsg(call));
        else
            count_stored(n, NOT_STORED_BYTES);
        response_problem(resp, 502, "upstream-response-too-large", err);
        resp->outcome = "executed";
        return;
    case HTTP_FETCH_NOT_SENT:
        log_tls_refusal(gw, r->operation, ur, err);
        rc = idem_call_forget(call);
        if (rc < 0)
            log_msg(&gw->log, "error", "%s: cannot release a record: %s", r->operation,
                    idem_call_errmsg(call));
        answer_not_sent(resp, err);
        resp->outcome = "released";
        return;
    case HTTP_FETCH_UNKNOWN:
    case HTTP_FETCH_BAD_REPLY:
        mark_unknown(gw, call);
        answer_lost(r, ur->timed_out, err, resp);
        return;
    }
}

/*
 * One exchange with the upstream for `rq`, as `method` `target` (the request's own, or a GET).
 * With `may_stream`, an answer over the route's max_stored_body comes with ur->rest for the rest
 * of its body (upstream_exchange).
 */
static enum http_fetch_result exchange(struct gateway *gw, const struct request *rq,
                                       const struct note *n, const char *method, const char *target,
                                       enum forward_kind kind, int may_stream,
                                       struct http_reply *ur, char *err, size_t errlen)
{
    struct forwarded f;
    enum http_fetch_result res;

    forwarded_build(gw, rq, n, method, target, kind, &f);
    res = upstream_exchange(gw->upstream, &f.urq, may_stream ? n->m.route->max_stored_body : 0,
                            may_stream, ur, err, errlen);
    if (res == HTTP_FETCH_OK || res == HTTP_FETCH_TOO_LARGE)
        gw_metrics_upstream(gw->metrics, ur->seconds);
    forwarded_release(&f);
    return res;
}

/*
 * The rest of an answer too large to hold, from the upstream to the client as it comes: the
 * server's event loop pulls it (struct http_body_source), reading the upstream's socket when it
 * is readable and only as fast as the client takes the bytes, so no thread waits on either side
 * -- each for its own timeout per stall.  A keyed request's record is settled already ("not
 * stored"), so whatever happens to this stream a retry is answered 410 and nothing runs twice.  A
 * stream that breaks (the upstream stalls or cuts it, the client stops reading) ends the client's
 * connection, so it sees a body cut short, never a whole one.
 */
struct rest_source {
    struct http_body_source src; /* first: the server's pointer is to it */
    struct http_body_stream *st;
    struct gateway *gw;
    const char *what; /* static, or a route's operation: both outlive the stream */
    char err[300];
};

static enum http_source_step rest_proceed(struct http_body_source *src, struct strbuf *into,
                                          int *wait_fd)
{
    struct rest_source *rs = (struct rest_source *)src;
    enum http_source_step step = http_body_stream_step(rs->st, into, rs->err, sizeof rs->err);

    if (step == HTTP_SOURCE_WAIT)
        *wait_fd = rs->st->fd;
    return step;
}

static void rest_stop(struct http_body_source *src, enum http_source_end how)
{
    struct rest_source *rs = (struct rest_source *)src;

    if (how == HTTP_SOURCE_STALLED)
        snprintf(rs->err, sizeof rs->err, "the upstream stopped sending the body for %d ms",
                 rs->st->timeout_ms);
    else if (how == HTTP_SOURCE_FAILED && rs->err[0] == '\0')
        snprintf(rs->err, sizeof rs->err, "%s", "the body is not the length it announced");
    if (how == HTTP_SOURCE_FAILED || how == HTTP_SOURCE_STALLED)
        log_msg(&rs->gw->log, "warn", "%s: a streamed answer ended short: %s", rs->what, rs->err);
    http_body_stream_close(rs->st);
    free(rs);
}

/* Makes `resp` (relay()ed from `ur`) stream the rest of `ur`'s body, which it takes. */
static void stream_rest(struct gateway *gw, const char *what, struct http_reply *ur,
                        struct response *resp)
{
    struct rest_source *rs = xcalloc(1, sizeof *rs);

    rs->src.proceed = rest_proceed;
    rs->src.stop = rest_stop;
    rs->src.stall_ms = ur->rest->timeout_ms;
    rs->st = ur->rest;
    ur->rest = NULL;
    rs->gw = gw;
    rs->what = what;
    response_stream(resp, &rs->src, http_body_stream_length(rs->st));
}

/* settle(), then the rest of an answer too large to hold, for the loop to stream. */
static void settle_and_stream(struct gateway *gw, const struct note *n, struct idem_call *call,
                              enum http_fetch_result res, struct http_reply *ur, const char *err,
                              struct response *resp)
{
    settle(gw, n, call, res, ur, err, resp);
    /* Unless the answer could not be passed on (relay() made it a 502), the rest follows. */
    if (ur->rest != NULL && resp->status == ur->status)
        stream_rest(gw, n->m.route->operation, ur, resp);
    http_reply_clear(ur);
}

static void forward_and_settle(struct gateway *gw, const struct request *rq, const struct note *n,
                               struct idem_call *call, struct response *resp)
{
    struct http_reply ur;
    char err[300];
    enum http_fetch_result res;

    res = exchange(gw, rq, n, rq->method, rq->target, FORWARD_REQUEST, 1, &ur, err, sizeof err);
    settle_and_stream(gw, n, call, res, &ur, err, resp);
}

/* ---- unknown outcomes --------------------------------------------------------------------- */

/*
 * The reconcile target: the route's template with {key} and its {params} substituted.  The
 * config checked that every placeholder is one of those.
 */
static void reconcile_target(const struct note *n, struct strbuf *out)
{
    const struct gw_route *r = n->m.route;
    const char *t = r->reconcile_path;

    while (*t) {
        const char *close = *t == '{' ? strchr(t, '}') : NULL;
        size_t len;
        if (!close) {
            strbuf_addch(out, *t++);
            continue;
        }
        len = (size_t)(close - t - 1);
        if (len == 3 && strncmp(t + 1, "key", 3) == 0) {
            strbuf_add_pct(out, n->key, strlen(n->key));
        } else {
            /* The k-th {name} of the route's path is params[k]. */
            const char *p = r->path;
            size_t k = 0;
            while ((p = strchr(p, '{')) != NULL) {
                const char *e = strchr(p, '}');
                if (e && (size_t)(e - p - 1) == len && strncmp(p + 1, t + 1, len) == 0)
                    break;
                k++;
                p = e ? e + 1 : p + 1;
            }
            if (p && k < n->m.nparams)
                strbuf_add_pct(out, n->m.params[k], strlen(n->m.params[k]));
        }
        t = close + 1;
    }
}

/*
 * A retry found the record of an earlier attempt whose outcome is unknown (its lease is now this
 * call's): the route's mode decides.
 */
static void run_unknown(struct gateway *gw, const struct request *rq, const struct note *n,
                        struct idem_call *call, struct response *resp)
{
    const struct gw_route *r = n->m.route;
    struct http_reply ur;
    struct strbuf target = STRBUF_INIT;
    enum http_fetch_result res;
    char err[300];

    switch (r->unknown) {
    case GW_UNKNOWN_RESEND:
        forward_and_settle(gw, rq, n, call, resp);
        return;
    case GW_UNKNOWN_RECONCILE:
        reconcile_target(n, &target);
        res = exchange(gw, rq, n, "GET", target.buf, FORWARD_LOOKUP, 0, &ur, err, sizeof err);
        strbuf_release(&target);
        if (res == HTTP_FETCH_OK && ur.status == 404) {
            /* It never happened: this attempt is the first to run. */
            http_reply_clear(&ur);
            forward_and_settle(gw, rq, n, call, resp);
            return;
        }
        if (res == HTTP_FETCH_OK && ur.status >= 200 && ur.status < 300) {
            settle(gw, n, call, res, &ur, err, resp);
            response_set_header(resp, "Idempotent-Replayed", "true");
            resp->outcome = "reconciled";
            http_reply_clear(&ur);
            return;
        }
        if (res == HTTP_FETCH_OK)
            snprintf(err, sizeof err, "the upstream answered the reconcile query with %d",
                     ur.status);
        http_reply_clear(&ur);
        mark_unknown(gw, call);
        {
            char detail[500];
            snprintf(detail, sizeof detail,
                     "An earlier attempt with this key reached the upstream and its outcome is "
                     "unknown; asking the upstream did not settle it (%s). Retry later.",
                     err);
            keyed_answer_outcome_unknown(resp, 503, detail);
        }
        return;
    case GW_UNKNOWN_HOLD:
        mark_unknown(gw, call);
        keyed_answer_outcome_unknown(
            resp, 503,
            "An earlier attempt with this key reached the upstream and its outcome is unknown. "
            "It is held, and not sent again, until an operator resolves it.");
        response_set_header(resp, "Retry-After", HOLD_RETRY_AFTER);
        return;
    }
}

/* ---- the hooks ---------------------------------------------------------------------------- */

/*
 * A header for the principal: only when sent exactly once (a second copy is someone's trick), and
 * without the white space around it (RFC 9110), whichever the source: `Bearer t ` is `Bearer t`.
 */
static const char *principal_header(void *arg, const char *name, size_t *len)
{
    const char *v = NULL;
    size_t l = 0;

    if (request_header_count(arg, name, &v, &l) != 1)
        return NULL;
    ascii_trim_ows(&v, &l);
    *len = l;
    return v;
}

static enum http_head_verdict proxy_on_head(void *ctx, struct request *rq, struct response *resp,
                                            int may_block)
{
    struct gateway *gw = ctx;
    const struct gw_config *cfg = gw->cfg;
    const struct gw_route *r;
    struct note *n = xcalloc(1, sizeof *n);
    const char *why = NULL, *hidden;
    const char *v = NULL;
    size_t vlen = 0;
    char detail[300];
    int count;

    (void)may_block; /* nothing here blocks */
    rq->note = n;
    rq->note_free = note_free;
    n->route_index = cfg->nroutes;
    if (!route_find(cfg, rq->method, rq->target, &n->m)) {
        /* A write that carries a key no route reads: said, counted, refused if so configured. */
        const char *key_header = unrouted_key_header(gw->unrouted, rq);
        if (key_header != NULL && unrouted_note(gw->unrouted, &gw->log, rq, key_header, resp))
            return HTTP_HEAD_ANSWER;
        return HTTP_HEAD_CONTINUE; /* proxied untouched */
    }
    r = n->m.route;
    n->route_index = (size_t)(r - cfg->routes);
    resp->operation = r->operation;

    /*
     * A header the gateway reads, named in Connection, would be dropped on the way (hop-by-hop):
     * the upstream would act on a request other than the one judged here -- another caller or
     * account, no override -- and its answer would be stored under this one's scope.
     */
    hidden = request_scope_hidden(rq, cfg, r);
    if (hidden != NULL) {
        snprintf(detail, sizeof detail,
                 "%s, which this gateway reads to keep idempotency records, is named in "
                 "Connection, so it would not reach the upstream. Do not list it there.",
                 hidden);
        response_problem(resp, 400, "bad-request", detail);
        resp->outcome = "refused";
        return HTTP_HEAD_ANSWER;
    }
    hidden = request_scope_twin(rq, cfg, r);
    if (hidden != NULL) {
        snprintf(detail, sizeof detail,
                 "The request sends %s also under a name with '_' for '-', which CGI, PHP and "
                 "Rack upstreams read as the same header. Send it once, as %s.",
                 hidden, hidden);
        response_problem(resp, 400, "bad-request", detail);
        resp->outcome = "refused";
        return HTTP_HEAD_ANSWER;
    }

    if (principal_of(gw->principals, principal_header, rq, (int64_t)time(NULL), n->principal,
                     &why) != 0) {
        char detail[200];
        snprintf(detail, sizeof detail,
                 "This route keeps idempotency records per caller, and the caller is not known: "
                 "%s.",
                 why ? why : "no principal");
        if (cfg->principal == GW_PRINCIPAL_JWT)
            response_set_header(resp, "WWW-Authenticate", "Bearer");
        response_problem(resp, 401, "unauthorized", detail);
        resp->outcome = "refused";
        return HTTP_HEAD_ANSWER;
    }
    n->caller_len = strlen(n->principal); /* the limits are the caller's, whatever its scope */
    if (request_scope_principal(rq, r, n->principal, detail, sizeof detail) != 0) {
        response_problem(resp, 400, "bad-request", detail);
        resp->outcome = "refused";
        return HTTP_HEAD_ANSWER;
    }
    if (r->key_source == GW_KEY_BODY) {
        n->key_in_body = 1;
        n->keyed = 1; /* decided once the body is in */
    } else {
        count = request_header_count(rq, r->key_header, &v, &vlen);
        if (count > 1) {
            response_problem(resp, 400, "idempotency-key-invalid",
                             "Send the idempotency key header once.");
            resp->outcome = "refused";
            return HTTP_HEAD_ANSWER;
        }
        if (count == 0 && r->key_required) {
            char detail[200];
            snprintf(detail, sizeof detail,
                     "%s %s needs an %s header: a unique value per intended operation, the "
                     "same on every retry.",
                     r->method, r->path, r->key_header);
            response_problem(resp, 400, "idempotency-key-missing", detail);
            resp->outcome = "refused";
            return HTTP_HEAD_ANSWER;
        }
        if (count == 1) {
            if (idem_key_parse(v, vlen, n->key, &why) != 0) {
                response_problem(resp, 400, "idempotency-key-invalid", why);
                resp->outcome = "refused";
                return HTTP_HEAD_ANSWER;
            }
            n->keyed = 1;
        }
    }
    return HTTP_HEAD_CONTINUE;
}

/*
 * Once the body is in: the key of a body-keyed route, and the fingerprint.  Returns 0, or -1 with
 * `resp` the refusal.
 */
static int prepare(const struct request *rq, struct note *n, struct response *resp)
{
    const struct gw_route *r = n->m.route;
    const char *why = NULL;

    if (n->prepared || !n->keyed)
        return 0;
    if (n->key_in_body) {
        int got = request_key_from_body(r, rq->body, rq->body_len, n->key, &why);
        if (got < 0) {
            response_problem(resp, 400, "idempotency-key-invalid", why);
            resp->outcome = "refused";
            return -1;
        }
        if (got == 0 && r->key_required) {
            char detail[300];
            snprintf(detail, sizeof detail,
                     "%s %s needs an idempotency key in its JSON body at %s: a unique value per "
                     "intended operation, the same on every retry.",
                     r->method, r->path, r->key_pointers[0]);
            response_problem(resp, 400, "idempotency-key-missing", detail);
            resp->outcome = "refused";
            return -1;
        }
        n->keyed = got == 1;
        if (!n->keyed)
            return 0;
    }
    if (request_fingerprint(&n->m, rq->method, rq->target, request_header(rq, "Content-Type"),
                            rq->body, rq->body_len, n->fp, &why) != 0) {
        response_problem(resp, 500, "internal-error", why);
        resp->outcome = "error";
        return -1;
    }
    n->prepared = 1;
    return 0;
}

/* The answer to a request passed through, by how its exchange ended. */
static void answer_passed(enum http_fetch_result res, struct http_reply *ur, const char *err,
                          struct response *resp)
{
    resp->outcome = "passed";
    switch (res) {
    case HTTP_FETCH_OK:
        relay(ur, resp);
        break;
    case HTTP_FETCH_NOT_SENT:
        answer_not_sent(resp, err);
        break;
    case HTTP_FETCH_UNKNOWN:
        if (ur->timed_out)
            response_problem(resp, 504, "upstream-timeout", err);
        else
            response_problem(resp, 502, "upstream-bad-reply", err);
        break;
    case HTTP_FETCH_BAD_REPLY:
        response_problem(resp, 502, "upstream-bad-reply", err);
        break;
    case HTTP_FETCH_TOO_LARGE:
        response_problem(resp, 502, "upstream-response-too-large", err);
        break;
    }
}

/* What a request parked on the event loop waits for. */
enum park_step {
    PARK_WATCH,    /* a duplicate: the first request of its key, woken by its watch */
    PARK_PASS,     /* a request passed through: its exchange with the upstream */
    PARK_CLAIM,    /* a fresh key: its claim's commit (the store's thread) */
    PARK_FORWARD,  /* a fresh key, claimed: its exchange with the upstream */
    PARK_COMPLETE, /* a fresh key, answered: the commit of its record's completion */
};

struct parked {
    struct gateway *gw;
    enum park_step step;
    struct idem_watch *watch; /* PARK_WATCH's */
    atomic_int fired;         /* PARK_WATCH: its watch called (watch_fired) */
    struct http_fetch *fetch; /* the exchange, until it ends */
    void *token;
    int ended; /* the exchange ended (on the loop) */
    enum http_fetch_result res;
    struct http_reply reply;
    char err[300];
    /* A fresh key's. */
    struct idem_call *call;
    int64_t since_ns;    /* the claim began (idem_gateway_store_seconds) */
    int64_t deadline_ms; /* PARK_FORWARD: when it gives up on the upstream (monotonic) */
    /*
     * The store's step ended: written by the store's thread, under gw->steps_mu, with the two
     * fields below and after its wake-up was sent (step_done).
     */
    atomic_int stored;
    int store_rc;
    enum idem_outcome outcome;
};

/* A duplicate's watch: the first request of its key left flight (any thread). */
static void watch_fired(void *arg)
{
    struct parked *pk = arg;

    atomic_store(&pk->fired, 1);
    http_server_unpark(pk->token);
}

/* The exchange of a request passed through ended (on its loop): wake the request. */
static void forwarded_done(void *arg, enum http_fetch_result res, struct http_reply *reply,
                           const char *err)
{
    struct parked *pk = arg;

    pk->fetch = NULL;
    pk->ended = 1;
    pk->res = res;
    if (res == HTTP_FETCH_OK || res == HTTP_FETCH_TOO_LARGE)
        gw_metrics_upstream(pk->gw->metrics, reply->seconds);
    pk->reply = *reply;
    memset(reply, 0, sizeof *reply); /* moved */
    snprintf(pk->err, sizeof pk->err, "%s", err);
    http_server_unpark(pk->token);
}

/* Parks the request (again) on `pk` for at most `timeout_ms`. */
static enum http_loop_verdict park_again(struct parked *pk, struct http_park *park, int timeout_ms)
{
    park->data = pk;
    park->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
    return HTTP_LOOP_PARKED;
}

/*
 * How long a request parked for its exchange waits at most: the exchange ends by itself within
 * the upstream's timeouts, so this is a backstop.  Sets pk->deadline_ms.
 */
static int upstream_backstop(const struct gateway *gw, struct parked *pk)
{
    int ms = gw->cfg->upstream_connect_timeout_ms + gw->cfg->upstream_timeout_ms + 5000;

    pk->deadline_ms = clock_mono_ns() / 1000000 + ms;
    return ms;
}

/* What is left of the backstop (ms; 0 or less once it passed). */
static int64_t backstop_left(const struct parked *pk)
{
    return pk->deadline_ms - clock_mono_ns() / 1000000;
}

/*
 * Passes a request through from the event loop, without a worker: parked until the upstream
 * answers.  The server always offers a park to on_loop, and on_loop runs on a loop thread, so
 * the exchange can always start there.
 */
static enum http_loop_verdict pass_on_loop(struct gateway *gw, const struct request *rq,
                                           const struct note *n, struct http_park *park,
                                           struct response *resp)
{
    struct parked *pk = xcalloc(1, sizeof *pk);
    struct forwarded f;
    int rc;

    pk->gw = gw;
    pk->step = PARK_PASS;
    pk->token = park->token;
    forwarded_build(gw, rq, n, rq->method, rq->target, FORWARD_REQUEST, &f);
    rc = upstream_start(gw->upstream, &f.urq, 0, forwarded_done, pk, &pk->fetch);
    forwarded_release(&f);
    if (rc != 0) {
        free(pk);
        response_problem(resp, 500, "internal-error", "The request could not be forwarded.");
        return HTTP_LOOP_ANSWERED;
    }
    /* The exchange ends by itself within its timeouts; this is only a backstop. */
    return park_again(pk, park, upstream_backstop(gw, pk));
}

/* ---- a fresh key on the event loop ------------------------------------------------------
 *
 * Where the store can claim without a thread waiting for it (both stores can), a fresh key never
 * takes a worker: the loop asks for the claim (idem_call_begin_async) and parks the request; the
 * store's thread wakes it once the claim is durable at "forwarded"; the loop forwards it
 * (upstream_start) and parks it again; once the answer is in, the loop asks for the completion
 * (idem_call_complete_async) and parks it a last time; the completion durable, it answers.  Every
 * other turn -- a claim that finds a record, an answer that is not stored whole, a completion
 * that fails -- hands the request and its call to a worker, which settles it the blocking way.
 */

/* Rechecks a parked fresh key's store step this long after it began: it always ends by itself. */
#define STEP_CHECK_MS 10000

/* A store step ended, on the store's thread: hand its result to the request's loop. */
static void step_done(struct parked *pk, struct idem_call *call, int rc, enum idem_outcome outcome)
{
    struct gateway *gw = pk->gw;

    pthread_mutex_lock(&gw->steps_mu);
    pk->call = call;
    pk->store_rc = rc;
    pk->outcome = outcome;
    /*
     * The wake-up is sent before `stored` is raised: once the loop reads it, the wake-up is
     * queued, so the connection is not freed while a wake-up is still on its way to it.  From
     * then on this thread touches `gw` only (which outlives the store's threads), never `pk`.
     */
    http_server_unpark(pk->token);
    atomic_store_explicit(&pk->stored, 1, memory_order_release);
    pthread_cond_broadcast(&gw->steps_cv);
    pthread_mutex_unlock(&gw->steps_mu);
}

static void claim_done(struct idem_call *call, int rc, enum idem_outcome outcome, void *arg)
{
    step_done(arg, call, rc, outcome);
}

static void complete_done(struct idem_call *call, int rc, void *arg)
{
    step_done(arg, call, rc, IDEM_OUTCOME_NONE);
}

/*
 * Whether the store step ended; with `wait`, once it has (a stop: nothing else runs).  A step
 * that ended is seen without the mutex: the loop, woken by step_done's wake-up, would otherwise
 * find the mutex still held by the store's thread that woke it (a futex sleep and wake-up each
 * time), and the store's thread ending a batch's steps one after the other holds it often.
 */
static int step_ended(struct gateway *gw, struct parked *pk, int wait)
{
    int ended;

    if (atomic_load_explicit(&pk->stored, memory_order_acquire))
        return 1;
    pthread_mutex_lock(&gw->steps_mu);
    while (wait && !atomic_load_explicit(&pk->stored, memory_order_acquire))
        pthread_cond_wait(&gw->steps_cv, &gw->steps_mu);
    ended = atomic_load_explicit(&pk->stored, memory_order_acquire);
    pthread_mutex_unlock(&gw->steps_mu);
    return ended;
}

/*
 * Hands a fresh key's request to a worker (proxy_handle) with its call and its exchange's end,
 * to settle there.
 */
static enum http_loop_verdict to_worker(struct note *n, struct parked *pk, int settled)
{
    n->call = pk->call;
    n->res = pk->res;
    n->reply = pk->reply;
    n->settled = settled;
    snprintf(n->err, sizeof n->err, "%s", pk->err);
    free(pk);
    /* It holds the record's lease: never refused. */
    return HTTP_LOOP_HANDOFF;
}

static enum http_loop_verdict fresh_on_loop(struct gateway *gw, struct idem_engine *eng,
                                            const struct note *n, const struct idem_operation *op,
                                            struct http_park *park, struct response *resp)
{
    struct parked *pk = xcalloc(1, sizeof *pk);
    int rc;

    pk->gw = gw;
    pk->step = PARK_CLAIM;
    pk->token = park->token;
    pk->since_ns = clock_mono_ns();
    rc = idem_call_begin_async(eng, op, n->principal, n->key, n->fp, claim_done, pk);
    if (rc == 1)
        return park_again(pk, park, STEP_CHECK_MS);
    free(pk);
    if (rc == 0)
        return HTTP_LOOP_WORKER; /* a record may exist, or the store cannot: the blocking way */
    gateway_store_failed(gw, rc);
    answer_no_claim(gw, op->name, idem_err_name(rc), resp);
    return HTTP_LOOP_ANSWERED;
}

/* The claim is durable: forward the request. */
static enum http_loop_verdict fresh_forward(struct gateway *gw, const struct request *rq,
                                            struct note *n, struct parked *pk,
                                            struct http_park *park)
{
    struct forwarded f;
    int rc;

    pk->step = PARK_FORWARD;
    forwarded_build(gw, rq, n, rq->method, rq->target, FORWARD_REQUEST, &f);
    /* As the blocking way does: an answer over the store's cap streams through. */
    rc = upstream_start(gw->upstream, &f.urq, n->m.route->max_stored_body, forwarded_done, pk,
                        &pk->fetch);
    forwarded_release(&f);
    if (rc != 0) { /* (only off a loop thread) nothing was sent: the worker releases the record */
        pk->res = HTTP_FETCH_NOT_SENT;
        snprintf(pk->err, sizeof pk->err, "%s", "the request could not be forwarded");
        return to_worker(n, pk, 0);
    }
    park->must_finish = 1; /* a stop lets the upstream answer, as a worker's exchange would */
    return park_again(pk, park, upstream_backstop(gw, pk));
}

/*
 * The answer is in: store it without a worker when it is stored whole, or when it is streamed
 * (the record then says "not stored" before the loop streams it); else settle on a worker.
 */
static enum http_loop_verdict fresh_settle(struct gateway *gw, struct note *n, struct parked *pk,
                                           struct http_park *park)
{
    const struct gw_route *r = n->m.route;
    struct idem_header *h, not_stored[2];
    struct response styled;
    int streamed = pk->res == HTTP_FETCH_OK && storable(r, &pk->reply) && pk->reply.rest != NULL;
    int rc;

    if (!streamed && !stores_whole(r, pk->res, &pk->reply))
        return to_worker(n, pk, 0);
    atomic_store_explicit(&pk->stored, 0, memory_order_relaxed); /* (no store step runs now) */
    pk->step = PARK_COMPLETE;
    if (streamed) {
        size_t nh = not_stored_answer(gw, r, http_body_stream_length(pk->reply.rest),
                                      r->max_stored_body, &styled, not_stored);
        rc = idem_call_complete_async(pk->call, styled.status, not_stored, nh, styled.body,
                                      styled.body_len, complete_done, pk);
        response_release(&styled);
    } else {
        h = reply_headers(&pk->reply);
        rc = idem_call_complete_async(pk->call, pk->reply.status, h, pk->reply.nheaders,
                                      pk->reply.body, pk->reply.body_len, complete_done, pk);
        free(h);
    }
    if (rc == 0)
        return park_again(pk, park, STEP_CHECK_MS);
    log_unsettled(gw, r, pk->reply.status, pk->call);
    return to_worker(n, pk, 1); /* the worker relays the answer and ends the call */
}

/* The request was woken (or timed out) at one of a fresh key's steps. */
static enum http_loop_verdict fresh_on_unpark(struct gateway *gw, const struct request *rq,
                                              struct note *n, struct parked *pk,
                                              struct http_park *park, struct response *resp)
{
    const struct gw_route *r = n->m.route;

    if ((pk->step == PARK_CLAIM || pk->step == PARK_COMPLETE) && !step_ended(gw, pk, !park))
        return park_again(pk, park, STEP_CHECK_MS); /* a wake-up from an earlier park */
    switch (pk->step) {
    case PARK_CLAIM:
        /* A claim that found a record is timed again by the blocking way's. */
        if (pk->store_rc < 0 || pk->outcome == IDEM_OUTCOME_EXECUTE)
            gw_metrics_store(gw->metrics, (double)(clock_mono_ns() - pk->since_ns) / 1e9);
        if (pk->store_rc < 0) {
            gateway_store_failed(gw, pk->store_rc);
            answer_no_claim(gw, r->operation, idem_call_errmsg(pk->call), resp);
            idem_call_end(pk->call);
            free(pk);
            return HTTP_LOOP_ANSWERED;
        }
        if (pk->outcome != IDEM_OUTCOME_EXECUTE || !park) {
            /* A record exists: the blocking way reads it.  At the stop: nothing was sent. */
            if (pk->outcome == IDEM_OUTCOME_EXECUTE)
                (void)idem_call_forget(pk->call);
            idem_call_end(pk->call);
            free(pk);
            return HTTP_LOOP_WORKER;
        }
        quota_new_key(n->quota, n->slot, clock_wall_ms());
        return fresh_forward(gw, rq, n, pk, park);
    case PARK_FORWARD:
        if (!pk->ended) {
            int64_t left = backstop_left(pk);
            if (park && left > 0) { /* a stop's turn, or an early wake-up */
                park->must_finish = 1;
                return park_again(pk, park, (int)left);
            }
            http_fetch_cancel(pk->fetch); /* no wake-up can come after this */
            pk->fetch = NULL;
            pk->res = HTTP_FETCH_UNKNOWN;
            pk->reply.timed_out = 1;
            snprintf(pk->err, sizeof pk->err, "%s", "the upstream did not answer in time");
        }
        if (!park) { /* the stop: settle it here, the blocking way */
            struct idem_call *call = pk->call;
            settle(gw, n, call, pk->res, &pk->reply, pk->err, resp);
            http_reply_clear(&pk->reply);
            idem_call_end(call);
            free(pk);
            return HTTP_LOOP_ANSWERED;
        }
        return fresh_settle(gw, n, pk, park);
    case PARK_COMPLETE:
        if (pk->store_rc < 0) {
            log_unsettled(gw, r, pk->reply.status, pk->call);
            return to_worker(n, pk, 1); /* ending a call that holds a lease may block */
        }
        count_stored(n, pk->reply.rest != NULL ? NOT_STORED_BYTES : reply_bytes(&pk->reply));
        resp->outcome = "executed";
        /* Settled: what is left of a large answer, the loop streams (no thread waits). */
        if (relay(&pk->reply, resp) == 0 && pk->reply.rest != NULL)
            stream_rest(gw, r->operation, &pk->reply, resp);
        http_reply_clear(&pk->reply);
        idem_call_end(pk->call);
        free(pk);
        return HTTP_LOOP_ANSWERED;
    default:
        break;
    }
    free(pk);
    response_problem(resp, 500, "internal-error", "A parked request was lost.");
    return HTTP_LOOP_ANSWERED;
}

/* Whether (method, the request's target) is on a route. */
static int routed(const struct gw_config *cfg, const char *method, const struct request *rq)
{
    struct route_match m;
    int found = route_find(cfg, method, rq->target, &m);

    route_match_clear(&m);
    return found;
}

/*
 * Whether a keyed route covers the request's path, for any method: there a method override (of
 * any source, method_override.c) could run a keyed handler unkeyed, or key a request as what it
 * is not.  Returns 1 with `resp` the refusal.
 */
static int refuse_method_override(const struct gateway *gw, const struct request *rq,
                                  const struct note *n, struct response *resp)
{
    const struct gw_config *cfg = gw->cfg;
    int covered = n && n->m.route;

    /* Nothing to read (no body, no query, no override header): no route lookups either. */
    if (!method_override_possible(rq, cfg->method_override_headers, cfg->nmethod_override_headers))
        return 0;
    for (size_t i = 0; i < cfg->nroutes && !covered; i++) {
        size_t j = 0;
        while (j < i && strcmp(cfg->routes[j].method, cfg->routes[i].method) != 0)
            j++;
        if (j == i) /* each method once */
            covered = routed(cfg, cfg->routes[i].method, rq);
    }
    if (!covered)
        return 0;
    return method_override_refuse(rq, cfg->method_override_headers, cfg->nmethod_override_headers,
                                  cfg->max_body, resp) != 0;
}

static enum http_loop_verdict proxy_on_loop(void *ctx, const struct request *rq,
                                            struct response *resp, struct http_park *park)
{
    struct gateway *gw = ctx;
    struct note *n = rq->note;
    const struct idem_operation *op;
    struct idem_engine *eng;
    struct idem_watch *watch = NULL;
    struct parked *pk;

    if (refuse_method_override(gw, rq, n, resp))
        return HTTP_LOOP_ANSWERED;
    if (!n || !n->m.route)
        return pass_on_loop(gw, rq, n, park, resp);
    if (prepare(rq, n, resp) != 0)
        return HTTP_LOOP_ANSWERED;
    if (!n->keyed)
        return pass_on_loop(gw, rq, n, park, resp);
    op = gateway_op(gw, n->m.route);
    eng = gateway_engine(gw, n->principal, 0);
    if (!eng)
        return HTTP_LOOP_WORKER; /* a shard's map to read again, or a move: the worker says */
    if (keyed_answer_lookup(eng, op, n->principal, n->key, n->fp, resp))
        return HTTP_LOOP_ANSWERED;
    /* The first request of this key is being forwarded here: wait for it holding no thread. */
    pk = xcalloc(1, sizeof *pk);
    pk->step = PARK_WATCH;
    pk->token = park->token;
    if (idem_watch_inflight(eng, op, n->principal, n->key, watch_fired, pk, &watch) == 1) {
        pk->watch = watch;
        return park_again(pk, park, (int)op->wait_ms);
    }
    free(pk);
    if (admit(gw, n, resp) != 0)
        return HTTP_LOOP_ANSWERED;
    return fresh_on_loop(gw, eng, n, op, park, resp);
}

/*
 * A parked request, woken or timed out (or the server stops).  A request passed through gets its
 * upstream's answer; a duplicate asks the cache, else goes to a worker, which waits what is left.
 */
static enum http_loop_verdict proxy_on_unpark(void *ctx, const struct request *rq,
                                              struct response *resp, void *data, int timed_out,
                                              struct http_park *park)
{
    struct gateway *gw = ctx;
    struct note *n = rq->note;
    struct parked *pk = data;
    struct idem_engine *eng;
    enum http_loop_verdict v = HTTP_LOOP_WORKER;

    switch (pk->step) {
    case PARK_CLAIM:
    case PARK_FORWARD:
    case PARK_COMPLETE:
        return fresh_on_unpark(gw, rq, n, pk, park, resp);
    case PARK_PASS:
        if (!pk->ended && park && backstop_left(pk) > 0)
            return park_again(pk, park, (int)backstop_left(pk));
        if (!pk->ended) {
            http_fetch_cancel(pk->fetch); /* no wake-up can come after this */
            resp->outcome = "passed";
            response_problem(resp, 504, "upstream-timeout", "The upstream did not answer in time.");
        } else if (pk->reply.rest != NULL && n != NULL && strcmp(rq->method, "GET") == 0 &&
                   http_stream_reserve(rq) != 0) {
            /*
             * Too many streams (this client's, or all clients'): each holds an upstream
             * connection and a buffer.  A GET may be asked again: 503, retry.  (Another method's
             * answer goes out whatever the count -- the upstream acted on it -- held to the
             * minimum rate like every stream.)
             */
            resp->outcome = "passed";
            response_set_header(resp, "Retry-After", "1");
            response_problem(resp, 503, "server-busy",
                             "Too many large answers are being streamed to this client (or to "
                             "all clients) right now. Retry.");
        } else if (pk->reply.rest != NULL && n != NULL) {
            /* Too large to hold: the loop streams it (the upstream acted: never refused). */
            resp->outcome = "passed";
            if (relay(&pk->reply, resp) == 0)
                stream_rest(gw, "a request passed through", &pk->reply, resp);
        } else {
            if (pk->res == HTTP_FETCH_NOT_SENT)
                log_tls_refusal(gw, "a request passed through", &pk->reply, pk->err);
            answer_passed(pk->res, &pk->reply, pk->err, resp);
        }
        http_reply_clear(&pk->reply);
        v = HTTP_LOOP_ANSWERED;
        break;
    case PARK_WATCH:
        if (!timed_out && park && !atomic_load(&pk->fired)) {
            /* A wake-up meant for an earlier request of this connection: wait on. */
            const struct idem_operation *op = gateway_op(gw, n->m.route);
            if (op->wait_ms > rq->parked_ms)
                return park_again(pk, park, (int)(op->wait_ms - rq->parked_ms));
        }
        n->watched_ms = rq->parked_ms;
        idem_watch_end(pk->watch);
        eng = gateway_engine(gw, n->principal, 0);
        if (eng && keyed_answer_lookup(eng, gateway_op(gw, n->m.route), n->principal, n->key, n->fp,
                                       resp)) {
            if (resp->outcome && strcmp(resp->outcome, "replayed") == 0)
                resp->outcome = "waited";
            v = HTTP_LOOP_ANSWERED;
        }
        break;
    }
    free(pk);
    return v;
}

static void proxy_handle(void *ctx, const struct request *rq, struct response *resp)
{
    struct gateway *gw = ctx;
    struct note *n = rq->note;
    struct idem_call *call = NULL;
    struct idem_engine *eng;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    const struct idem_operation *op;
    struct idem_operation parked;
    int64_t t0;
    int rc;

    if (n && n->call) {
        /* A fresh key the loop claimed and forwarded (fresh_on_unpark): settle it here. */
        call = n->call;
        n->call = NULL;
        if (n->settled) {
            resp->outcome = "executed";
            if (relay(&n->reply, resp) == 0 && n->reply.rest != NULL)
                stream_rest(gw, n->m.route->operation, &n->reply, resp);
            http_reply_clear(&n->reply);
        } else {
            settle_and_stream(gw, n, call, n->res, &n->reply, n->err, resp);
        }
        idem_call_end(call);
        return;
    }
    /* on_loop passed every other request through itself, and prepared this one. */
    if (!n || !n->m.route || !n->keyed || !n->prepared) {
        response_problem(resp, 500, "internal-error", "The request reached no handler.");
        return;
    }
    op = gateway_op(gw, n->m.route);
    if (n->watched_ms > 0) {
        /* A duplicate that already waited on the event loop waits only what is left. */
        parked = *op;
        parked.wait_ms = op->wait_ms > n->watched_ms ? op->wait_ms - n->watched_ms : 1;
        op = &parked;
    }
    if (admit(gw, n, resp) != 0)
        return;
    eng = gateway_engine(gw, n->principal, 1);
    if (!eng) {
        answer_no_claim(gw, op->name, "IDEM_EMOVED: the principal's bucket is moving", resp);
        return;
    }
    t0 = clock_mono_ns();
    rc = idem_call_begin(eng, op, n->principal, n->key, n->fp, &call, &outcome);
    gw_metrics_store(gw->metrics, (double)(clock_mono_ns() - t0) / 1e9);
    if (rc < 0) {
        char why[600];
        gateway_store_failed(gw, rc);
        snprintf(why, sizeof why, "%s: %s", idem_err_name(rc), idem_call_begin_error());
        answer_no_claim(gw, op->name, why, resp);
        return;
    }
    if (keyed_answer_settled(call, outcome, op, resp))
        goto out;
    if (outcome == IDEM_OUTCOME_EXECUTE) {
        /* The claim is durable at "forwarded" (the operation's claim_point). */
        quota_new_key(n->quota, n->slot, clock_wall_ms());
        forward_and_settle(gw, rq, n, call, resp);
    } else if (outcome == IDEM_OUTCOME_RESUME) {
        run_unknown(gw, rq, n, call, resp);
    } else {
        log_msg(&gw->log, "error", "%s: unexpected engine outcome %d", op->name, (int)outcome);
        keyed_answer_fail(resp, IDEM_ESTATE);
    }
out:
    idem_call_end(call);
}

static void proxy_answered(void *ctx, const struct request *rq, const struct response *resp,
                           double seconds)
{
    struct gateway *gw = ctx;
    const struct note *n = rq->note;
    size_t route = n ? n->route_index : gw->cfg->nroutes;
    const char *outcome = resp->outcome ? resp->outcome : "passed";

    gw_metrics_count(gw->metrics, route, gw_outcome_of(outcome));
    log_request(&gw->log, rq->method ? rq->method : "-", rq->path ? rq->path : "-", resp->status,
                outcome, seconds * 1000.0, n && n->principal[0] ? n->principal : NULL);
}

/* Every answer on its way out: the gateway's own errors in the configured format. */
static void proxy_before_send(void *ctx, const struct request *rq, struct response *resp)
{
    const struct gateway *gw = ctx;
    const struct note *n = rq ? rq->note : NULL;

    gw_errors_restyle(gw->cfg->error_format, n ? n->m.route : NULL, n && n->keyed,
                      rq ? rq->method : NULL, resp);
}

static void proxy_log(void *ctx, const char *line)
{
    struct gateway *gw = ctx;
    log_msg(&gw->log, "info", "%s", line);
}

void proxy_server_options(struct gateway *gw, struct http_server_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->handle = proxy_handle;
    opts->on_head = proxy_on_head;
    opts->on_loop = proxy_on_loop;
    opts->on_unpark = proxy_on_unpark;
    opts->before_send = proxy_before_send;
    opts->answered = proxy_answered;
    opts->before_wait = log_before_wait;
    opts->log = proxy_log;
    opts->ctx = gw;
    opts->ipv6 = 1;
    opts->stop_grace_s = 10;
    opts->max_body = gw->cfg->max_body;
    opts->limits = gw->cfg->limits;
}
