/* SPDX-License-Identifier: Apache-2.0 */
/*
 * router.c - the route table and the checks every request passes before its handler runs, in
 * the order docs/http-api.md fixes: route -> auth -> content type -> body size -> key -> JSON.
 * Doing them here, once, keeps every endpoint answering the same problem for the same mistake,
 * and keeps the handlers about business rules only.  Nothing here is stored: a request refused
 * at this stage never reached the engine, so its retry (fixed or not) runs afresh.
 */
#include "router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "auth.h"
#include "health.h"
#include "intake.h"
#include "idemcall.h"
#include "orders.h"
#include "profile.h"
#include "response.h"
#include "util.h"
#include "webhook_receiver.h"
#include "jdoc.h"
#include "banned.h"

enum key_policy { KEY_IGNORED, KEY_OPTIONAL, KEY_REQUIRED };
/* BODY_RAW: the handler reads the bytes itself (a signed webhook is verified before parsing). */
enum body_policy { BODY_NONE, BODY_OPTIONAL, BODY_REQUIRED, BODY_RAW };

struct route {
    const char *method;
    const char *tmpl;      /* also the route of the fingerprint */
    const char *operation; /* metrics label */
    int auth;
    enum key_policy key;
    enum body_policy body;
    void (*handler)(const struct call_ctx *cx, struct response *resp);
};

static const struct route routes[] = {
    {"POST", "/api/orders", "orders.create", 1, KEY_REQUIRED, BODY_REQUIRED, orders_create},
    {"GET", "/api/orders", "orders.list", 1, KEY_IGNORED, BODY_NONE, orders_list},
    {"GET", "/api/orders/{id}", "orders.get", 1, KEY_IGNORED, BODY_NONE, orders_get},
    {"POST", "/api/orders/{id}/cancel", "orders.cancel", 1, KEY_REQUIRED, BODY_OPTIONAL,
     orders_cancel},
    {"PUT", "/api/me/profile", "profile.update", 1, KEY_OPTIONAL, BODY_REQUIRED, profile_update},
    {"POST", "/webhooks/provider", "webhooks.provider", 0, KEY_IGNORED, BODY_RAW,
     webhooks_provider},
    {"GET", "/healthz", "healthz", 0, KEY_IGNORED, BODY_NONE, health_check},
    {"GET", "/metrics", "metrics", 0, KEY_IGNORED, BODY_NONE, health_metrics},
};
#define NROUTES (sizeof routes / sizeof routes[0])

static void free_params(char **params, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        free(params[i]);
        params[i] = NULL;
    }
}

/*
 * Whether `path` fits template `tmpl`, where "{name}" matches one non-empty segment.  With
 * `params` not NULL, the segments are copied out (new) in order.
 */
static int match_template(const char *tmpl, const char *path, char **params, size_t *nparams)
{
    const char *t = tmpl;
    const char *p = path;
    const char *seg_end;
    size_t n = 0;
    int ok = 0;

    while (*t != '\0' && *p != '\0') {
        if (*t == '{') {
            seg_end = p;
            while (*seg_end != '\0' && *seg_end != '/')
                seg_end++;
            if (seg_end == p || n == ROUTE_MAX_PARAMS)
                goto out;
            if (params != NULL)
                params[n] = xstrndup(p, (size_t)(seg_end - p));
            n++;
            t = strchr(t, '}');
            if (t == NULL)
                goto out;
            t++;
            p = seg_end;
        } else if (*t == *p) {
            t++;
            p++;
        } else {
            goto out;
        }
    }
    ok = *t == '\0' && *p == '\0';
out:
    if (!ok && params != NULL)
        free_params(params, n);
    if (ok && nparams != NULL)
        *nparams = n;
    return ok;
}

/* HEAD is served by the GET route (the server drops the body). */
static int method_matches(const char *route_method, const char *method)
{
    if (strcmp(route_method, method) == 0)
        return 1;
    return strcmp(route_method, "GET") == 0 && strcmp(method, "HEAD") == 0;
}

/* "application/json", in any case, optionally followed by parameters. */
static int is_json_media_type(const char *ct)
{
    static const char want[] = "application/json";
    const char *p = ct;
    int ok = 0;

    while (*p == ' ' || *p == '\t')
        p++;
    if (strlen(p) >= sizeof want - 1 && ascii_ncaseeq(p, want, sizeof want - 1)) {
        p += sizeof want - 1;
        while (*p == ' ' || *p == '\t')
            p++;
        ok = *p == '\0' || *p == ';';
    }
    return ok;
}

static void not_allowed(const struct request *rq, struct response *resp)
{
    char allow[64] = "";
    size_t i, used = 0;
    int n;

    for (i = 0; i < NROUTES; i++) {
        if (!match_template(routes[i].tmpl, rq->path, NULL, NULL))
            continue;
        n = snprintf(allow + used, sizeof allow - used, "%s%s%s", used ? ", " : "",
                     routes[i].method, strcmp(routes[i].method, "GET") == 0 ? ", HEAD" : "");
        if (n > 0 && (size_t)n < sizeof allow - used)
            used += (size_t)n;
    }
    response_set_header(resp, "Allow", allow);
    response_problem(resp, 405, "method-not-allowed",
                     "This method is not allowed on this path; see the Allow header.");
}

/*
 * Route -> handler, or a 404/405 answer (then NULL).  With --metrics-listen, /metrics is served
 * there and not here.
 */
static const struct route *find_route(const struct app *app, const struct request *rq,
                                      char **params, size_t *nparams, struct response *resp)
{
    const struct route *found = NULL;
    size_t i;
    int path_known = 0;

    for (i = 0; i < NROUTES && found == NULL; i++) {
        if (!match_template(routes[i].tmpl, rq->path, NULL, NULL))
            continue;
        path_known = 1;
        if (method_matches(routes[i].method, rq->method)) {
            match_template(routes[i].tmpl, rq->path, params, nparams);
            found = &routes[i];
        }
    }
    if (found != NULL && found->handler == health_metrics && app->cfg->metrics_listen != NULL) {
        response_problem(resp, 404, "not-found",
                         "The metrics are served on the metrics listener (--metrics-listen).");
        return NULL;
    }
    if (found == NULL && path_known)
        not_allowed(rq, resp);
    else if (found == NULL)
        response_problem(resp, 404, "not-found", "There is nothing at this path.");
    return found;
}

/*
 * What the event loop learned of a request for the worker that runs it (rq->note): the user of
 * the checked token (router_check_head) and the body's fingerprint (router_answer_on_loop), so
 * neither is worked out twice.
 */
struct loop_note {
    char *principal;
    int has_fp;
    unsigned char fp[IDEM_FP_LEN];
};

static void loop_note_free(void *note)
{
    struct loop_note *n = note;

    free(n->principal);
    free(n);
}

/*
 * The principal of the request, or a 401/503 answer (then -1).  With may_block 0 only the token
 * cache is asked: a token it does not know gives 1 (ask again where blocking is allowed).
 */
static int check_auth(struct call_ctx *cx, struct response *resp, int may_block)
{
    char *user = NULL;
    int rc;

    if (cx->rq->note != NULL) {
        /* Checked when the head arrived (router_check_head). */
        user = xstrdup(((const struct loop_note *)cx->rq->note)->principal);
        rc = 0;
    } else {
        rc = auth_principal(cx->app->tokens, may_block ? cx->app->catalogue : NULL,
                            request_header(cx->rq, "Authorization"), &user);
    }
    if (rc == 0 && cx->app->shards != NULL) {
        /* On a shard set the rest of the request runs on its user's cluster. */
        rc = app_route(cx->app, user, may_block, &cx->app);
        if (rc != 0) {
            free(user);
            user = NULL;
        }
        if (rc == 1)
            return 1; /* the map is read again where blocking is allowed */
        if (rc < 0) {
            keyed_answer_fail(resp, rc); /* moving: 503, Retry-After */
            goto out;
        }
    }
    if (rc == AUTH_ASK_STORE)
        return 1;
    if (rc == AUTH_BUSY) {
        response_set_header(resp, "Retry-After", "1");
        response_problem(resp, 503, "server-busy",
                         "Too many unknown tokens are being checked at once; retry.");
        goto out;
    }
    if (rc < 0) {
        log_msg(&cx->app->log, "error", "token lookup failed: %s", idem_err_name(rc));
        keyed_answer_unavailable(resp, "The store cannot be reached; nothing was done. Retry.");
        goto out;
    }
    if (rc > 0) {
        response_set_header(resp, "WWW-Authenticate", "Bearer");
        response_problem(resp, 401, "unauthorized",
                         "Send Authorization: Bearer <token>, a token made by `orderd token "
                         "create`.");
        goto out;
    }
    /* The response owns the user id: the log line names the principal. */
    resp->principal = user;
    cx->principal = user;
out:
    return rc == 0 ? 0 : -1;
}

/*
 * What can be checked from the head alone, in the contract's order after the route: auth (401),
 * then the content type of a body (415).  0 to go on, -1 answered, 1 needs the store.
 */
static int check_head(struct call_ctx *cx, const struct route *rt, struct response *resp,
                      int may_block)
{
    const char *ct;
    int rc = 0;

    if (rt->auth) {
        rc = check_auth(cx, resp, may_block);
        if (rc != 0)
            return rc;
    }
    if (rt->body != BODY_NONE && rt->body != BODY_RAW && cx->rq->has_body) {
        ct = request_header(cx->rq, "Content-Type");
        if (ct == NULL || !is_json_media_type(ct)) {
            response_problem(resp, 415, "unsupported-media-type",
                             "Send the body as Content-Type: application/json.");
            return -1;
        }
    }
    return 0;
}

static int check_key(struct call_ctx *cx, enum key_policy policy, char *key, struct response *resp)
{
    const char *value = NULL;
    const char *why = NULL;
    char detail[256];
    size_t len = 0;
    int count;
    int rc = -1;

    if (policy == KEY_IGNORED) {
        rc = 0;
        goto out;
    }
    count = request_header_count(cx->rq, "Idempotency-Key", &value, &len);
    if (count > 1) {
        response_problem(resp, 400, "idempotency-key-invalid",
                         "Idempotency-Key was sent more than once; send exactly one.");
        goto out;
    }
    if (count == 0 && policy == KEY_REQUIRED) {
        response_problem(resp, 400, "idempotency-key-missing",
                         "This operation needs an Idempotency-Key header: one new key per "
                         "intent, reused for every retry of it.");
        goto out;
    }
    if (count == 1 && idem_key_parse(value, len, key, &why) != 0) {
        snprintf(detail, sizeof detail,
                 "Idempotency-Key must be 1 to 255 visible ASCII characters, as a token or a "
                 "quoted string: %s.",
                 why ? why : "invalid");
        response_problem(resp, 400, "idempotency-key-invalid", detail);
        goto out;
    }
    if (count == 1)
        cx->key = key;
    rc = 0;
out:
    return rc;
}

/*
 * The body is JSON and its fingerprint is cx->fp; with `keep`, the parsed body is cx->body for
 * the handler (a replay on the loop needs only the fingerprint: one parse fewer).  The event
 * loop's fingerprint goes to the worker in the request's note, which takes it as it is.
 */
static int check_json(struct call_ctx *cx, const struct route *rt, struct response *resp, int keep)
{
    const struct request *rq = cx->rq;
    struct loop_note *note = rq->note;
    json_error_t jerr;
    const char *why = NULL;
    char detail[320];
    int rc = -1;
    int fprc;

    if (rq->body_len == 0 && rt->body == BODY_REQUIRED) {
        response_problem(resp, 400, "invalid-json", "A JSON body is required.");
        goto out;
    }
    if (note != NULL && note->has_fp) {
        memcpy(cx->fp, note->fp, IDEM_FP_LEN); /* the loop's: the same bytes, the same route */
        fprc = 0;
    } else {
        fprc = idem_fingerprint(rq->method, rt->tmpl, cx->params, cx->nparams, rq->body,
                                rq->body_len, cx->fp, &why);
    }
    if (fprc == 0 && note != NULL && !keep) {
        memcpy(note->fp, cx->fp, IDEM_FP_LEN);
        note->has_fp = 1;
    }
    if (fprc == IDEM_ENOMEM)
        die("out of memory");
    if (fprc < 0) {
        snprintf(detail, sizeof detail, "The body must be JSON: %s.",
                 why ? why : idem_strerror(fprc));
        response_problem(resp, 400, "invalid-json", detail);
        goto out;
    }
    if (keep && rq->body_len > 0) {
        /* Numbers as doubles, as JCS reads them: 2 and 2.0 are the same quantity. */
        cx->body =
            jdoc_load(rq->body, rq->body_len,
                      JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &jerr);
        if (cx->body == NULL) {
            snprintf(detail, sizeof detail, "The body must be JSON: %s.", jerr.text);
            response_problem(resp, 400, "invalid-json", detail);
            goto out;
        }
    }
    rc = 0;
out:
    return rc;
}

/*
 * Every check of the contract after the route, in its order: auth, content type, key, JSON and
 * fingerprint.  0 when all pass, -1 when one answered into `resp`, 1 when the token needs the
 * store.  A worker (`worker` 1) may ask the store and gets the body parsed for its handler; the
 * event loop asks the token cache only and needs only the fingerprint.
 */
static int run_checks(struct call_ctx *cx, const struct route *rt, char *key, struct response *resp,
                      int worker)
{
    int rc = check_head(cx, rt, resp, worker);

    if (rc != 0)
        return rc;
    if (check_key(cx, rt->key, key, resp) != 0)
        return -1;
    if (rt->body != BODY_NONE && rt->body != BODY_RAW && check_json(cx, rt, resp, worker) != 0)
        return -1;
    return 0;
}

void router_dispatch(struct app *app, const struct request *rq, struct response *resp)
{
    const struct route *rt;
    struct call_ctx cx;
    char *params[ROUTE_MAX_PARAMS] = {NULL};
    char key[IDEM_KEY_MAX + 1];
    size_t i;

    memset(&cx, 0, sizeof cx);
    cx.app = app;
    cx.rq = rq;

    rt = find_route(app, rq, params, &cx.nparams, resp);
    if (rt == NULL)
        goto out;
    resp->operation = rt->operation;
    for (i = 0; i < cx.nparams; i++)
        cx.params[i] = params[i];

    if (run_checks(&cx, rt, key, resp, 1) != 0)
        goto out;
    rt->handler(&cx, resp);
out:
    json_decref(cx.body);
    free_params(params, ROUTE_MAX_PARAMS);
}

enum http_head_verdict router_check_head(struct app *app, struct request *rq, struct response *resp,
                                         int may_block)
{
    const struct route *rt;
    struct call_ctx cx;
    int rc;

    memset(&cx, 0, sizeof cx);
    cx.app = app;
    cx.rq = rq;
    rt = find_route(app, rq, NULL, NULL, resp); /* the head's checks need no path parameter */
    if (rt == NULL)
        return HTTP_HEAD_ANSWER;
    resp->operation = rt->operation;
    rc = check_head(&cx, rt, resp, may_block);
    if (rc == 0 && cx.principal != NULL && rq->note == NULL) {
        /* The token is checked: the later steps of this request take its user from here. */
        struct loop_note *note = xcalloc(1, sizeof *note);
        note->principal = xstrdup(cx.principal);
        rq->note = note;
        rq->note_free = loop_note_free;
    }
    return rc == 0 ? HTTP_HEAD_CONTINUE : rc > 0 ? HTTP_HEAD_BLOCKS : HTTP_HEAD_ANSWER;
}

/* The idempotent operation behind a route, or NULL for a route that stores nothing. */
static const struct idem_operation *operation_of(const struct app *app, const struct route *rt)
{
    const struct idem_operation *ops[] = {&app->op_orders_create, &app->op_orders_cancel,
                                          &app->op_profile_update};
    size_t i;

    for (i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (strcmp(ops[i]->name, rt->operation) == 0)
            return ops[i];
    }
    return NULL;
}

/*
 * A request parked on the loop: a duplicate with its watch, and what its checks found, for the
 * wake-up; or a new order under way on the store's writer (`create`).
 */
struct parked_call {
    struct create_async *create;
    struct idem_watch *watch;
    const struct idem_operation *op;
    const char *operation;
    char *principal;
    char key[IDEM_KEY_MAX + 1];
    unsigned char fp[IDEM_FP_LEN];
};

/* How long a new order on the store's writer stays parked before it is looked at again. */
#define CREATE_CHECK_MS 10000

/* Parks a new order's request (again) until its order ends: it ends by itself, with its batch. */
static enum http_loop_verdict park_create(struct parked_call *pc, struct http_park *park)
{
    park->data = pc;
    park->timeout_ms = CREATE_CHECK_MS;
    park->must_finish = 1;
    return HTTP_LOOP_PARKED;
}

/*
 * A parked request's end: answered (its principal goes to the response, for the log line, which
 * frees it), or handed to a worker.  Frees `pc`.
 */
static enum http_loop_verdict parked_end(struct parked_call *pc, struct response *resp,
                                         int answered)
{
    if (answered) {
        resp->principal = pc->principal;
        pc->principal = NULL;
    }
    free(pc->principal);
    free(pc);
    return answered ? HTTP_LOOP_ANSWERED : HTTP_LOOP_WORKER;
}

/*
 * A new order without a worker (orders_create_start): parked until the store's writer has run
 * it and made it durable.  HTTP_LOOP_WORKER when it cannot be done so.
 */
static enum http_loop_verdict create_on_loop(struct call_ctx *cx, const struct route *rt,
                                             struct response *resp, struct http_park *park)
{
    struct create_async *ca = NULL;
    struct parked_call *pc;
    int rc;

    if (check_json(cx, rt, resp, 1) != 0) /* (the fingerprint is the one just computed) */
        return HTTP_LOOP_WORKER;
    rc = orders_create_start(cx, cx->body, http_server_unpark, park->token, resp, &ca);
    cx->body = NULL; /* taken */
    if (rc <= 0)
        return rc < 0 ? HTTP_LOOP_ANSWERED : HTTP_LOOP_WORKER;
    pc = xcalloc(1, sizeof *pc);
    pc->create = ca;
    pc->operation = rt->operation;
    pc->principal = xstrdup(cx->principal);
    return park_create(pc, park);
}

/* The wake-up of a new order parked by create_on_loop(): its answer, or a worker's turn. */
static enum http_loop_verdict create_unparked(struct parked_call *pc, struct response *resp,
                                              struct http_park *park)
{
    if (!orders_create_ended(pc->create, park == NULL))
        return park_create(pc, park);
    resp->operation = pc->operation;
    return parked_end(pc, resp, orders_create_finish(pc->create, resp));
}

enum http_loop_verdict router_answer_on_loop(struct app *app, const struct request *rq,
                                             struct response *resp, struct http_park *park)
{
    struct parked_call *pc = NULL;
    const struct route *rt;
    const struct idem_operation *op;
    struct idem_watch *watch = NULL;
    struct call_ctx cx;
    char *params[ROUTE_MAX_PARAMS] = {NULL};
    char key[IDEM_KEY_MAX + 1];
    size_t i;
    enum http_loop_verdict v = HTTP_LOOP_WORKER;

    memset(&cx, 0, sizeof cx);
    cx.app = app;
    cx.rq = rq;
    rt = find_route(app, rq, params, &cx.nparams, resp);
    if (rt == NULL || rt->key == KEY_IGNORED || rt->body == BODY_RAW ||
        (op = operation_of(app, rt)) == NULL ||
        (op == &app->op_orders_create && app->cfg->idempotency_off))
        goto out;
    resp->operation = rt->operation;
    for (i = 0; i < cx.nparams; i++)
        cx.params[i] = params[i];
    /* Any refusal is left to the worker, which answers it the same way. */
    if (run_checks(&cx, rt, key, resp, 0) != 0 || cx.key == NULL)
        goto out;
    if (idemcall_lookup(&cx, op, resp)) {
        v = HTTP_LOOP_ANSWERED;
        goto out;
    }
    if (op == &app->op_orders_create && park != NULL &&
        (v = create_on_loop(&cx, rt, resp, park)) != HTTP_LOOP_WORKER)
        goto out;
    /* The first request of this key runs here now: wait for it without holding a thread. */
    if (park != NULL && idem_watch_inflight(cx.app->engine, op, cx.principal, cx.key,
                                            http_server_unpark, park->token, &watch) == 1) {
        /* What the checks found goes along, so the wake-up only asks the cache. */
        pc = xcalloc(1, sizeof *pc);
        pc->watch = watch;
        pc->op = op;
        pc->operation = rt->operation;
        pc->principal = xstrdup(cx.principal);
        memcpy(pc->key, cx.key, strlen(cx.key) + 1);
        memcpy(pc->fp, cx.fp, IDEM_FP_LEN);
        park->data = pc;
        park->timeout_ms = (int)op->wait_ms;
        v = HTTP_LOOP_PARKED;
    }
out:
    json_decref(cx.body);
    free_params(params, ROUTE_MAX_PARAMS);
    return v;
}

enum http_loop_verdict router_unpark(struct app *app, const struct request *rq,
                                     struct response *resp, void *data, int timed_out,
                                     struct http_park *park)
{
    struct parked_call *pc = data;
    struct call_ctx cx;
    int answered;

    if (pc->create != NULL)
        return create_unparked(pc, resp, park);
    /* Either way (woken or timed out): the cache, else a worker, which waits what is left. */
    (void)timed_out;
    idem_watch_end(pc->watch);
    memset(&cx, 0, sizeof cx);
    cx.app = app;
    cx.rq = rq;
    cx.principal = pc->principal;
    cx.key = pc->key;
    memcpy(cx.fp, pc->fp, IDEM_FP_LEN);
    resp->operation = pc->operation;
    /* The replay cache of the principal's cluster (a shard set's map unread: a worker's turn). */
    answered = app_route(app, pc->principal, 0, &cx.app) == 0 && idemcall_lookup(&cx, pc->op, resp);
    if (answered && resp->outcome != NULL && strcmp(resp->outcome, "replayed") == 0)
        resp->outcome = "waited";
    return parked_end(pc, resp, answered);
}
