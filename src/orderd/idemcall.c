/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idemcall.c - the one place that maps libidem's outcomes to HTTP (see idemcall.h).  Keeping it
 * apart from the handlers means orders and profiles cannot drift in how they replay, refuse or
 * ask a client to retry, and a new phase (payment) changes only its operation's run function.
 */
#include "idemcall.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app.h"
#include "keyed_answer.h"
#include "response.h"
#include "router.h"
#include "util.h"
#include "jdoc.h"
#include "banned.h"

/* `doc` as the stored response: staged in the open phase, or completed (staged and committed). */
static int store_json(struct idem_call *call, int status, const json_t *doc, const char *location,
                      int commit)
{
    struct idem_header hdrs[2] = {{"Content-Type", CONTENT_TYPE_JSON}, {"Location", location}};
    size_t len = 0;
    char *body = jdoc_text(doc, &len);
    int rc;

    if (commit)
        rc = idem_call_complete(call, status, hdrs, location ? 2 : 1, body, len);
    else
        rc = idem_call_stage(call, status, hdrs, location ? 2 : 1, body, len);
    free(body);
    return rc;
}

int idemcall_complete_json(struct idem_call *call, int status, const json_t *doc,
                           const char *location)
{
    return store_json(call, status, doc, location, 1);
}

int idemcall_stage_json(struct idem_call *call, int status, const json_t *doc, const char *location)
{
    return store_json(call, status, doc, location, 0);
}

int idemcall_complete_problem(struct idem_call *call, int status, const char *code,
                              const char *detail)
{
    return idemcall_complete_problem_ext(call, status, code, detail, NULL);
}

int idemcall_outcome_unknown(struct response *resp, const char *detail)
{
    keyed_answer_outcome_unknown(resp, 503, detail);
    return IDEMCALL_ANSWERED;
}

/* A problem as the stored response: staged in the open phase, or completed. */
static int store_problem(struct idem_call *call, int status, const char *code, const char *detail,
                         const json_t *extra, int commit)
{
    struct idem_header hdrs[1] = {{"Content-Type", CONTENT_TYPE_PROBLEM}};
    size_t len = 0;
    char *body = problem_body_ext(status, code, detail, extra, &len);
    int rc;

    if (commit)
        rc = idem_call_complete(call, status, hdrs, 1, body, len);
    else
        rc = idem_call_stage(call, status, hdrs, 1, body, len);
    free(body);
    return rc;
}

int idemcall_complete_problem_ext(struct idem_call *call, int status, const char *code,
                                  const char *detail, const json_t *extra)
{
    return store_problem(call, status, code, detail, extra, 1);
}

int idemcall_stage_problem(struct idem_call *call, int status, const char *code, const char *detail)
{
    return store_problem(call, status, code, detail, NULL, 0);
}

int idemcall_lookup(const struct call_ctx *cx, const struct idem_operation *op,
                    struct response *resp)
{
    return keyed_answer_lookup(cx->app->engine, op, cx->principal, cx->key, cx->fp, resp);
}

/* Where a deferred commit's answer goes. */
struct deferred_answer {
    struct app *app;
    struct response *resp;
    void *completion;
    const char *operation;
    /*
     * DEFERRED_PENDING until idemcall_commit_deferred() returns (DEFERRED_AWAY) or the commit
     * ends first: answered (DEFERRED_ANSWERED), or, on this thread, having lost the key
     * (DEFERRED_HANDED_BACK: the caller answers).  Whichever of the two comes last frees it.
     */
    atomic_int state;
};

enum { DEFERRED_PENDING, DEFERRED_AWAY, DEFERRED_HANDED_BACK, DEFERRED_ANSWERED };

static void deferred_committed(struct idem_call *call, int rc, void *arg)
{
    struct deferred_answer *d = arg;
    int pending = DEFERRED_PENDING;

    /*
     * A store that commits before idem_call_commit_async() returns (PostgreSQL) may find the key
     * taken at the COMMIT (a one-phase call that ran before reading): the caller's next begin
     * answers it, from the record the engine read meanwhile.
     */
    if (rc == IDEM_ELEASE &&
        atomic_compare_exchange_strong(&d->state, &pending, DEFERRED_HANDED_BACK))
        return;
    app_store_failed(d->app, rc);
    if (rc == 0) {
        keyed_answer_stored(call, d->resp);
    } else {
        log_msg(&d->app->log, "error", "%s: %s: %s", d->operation, idem_err_name(rc),
                idem_call_errmsg(call) ? idem_call_errmsg(call) : "");
        keyed_answer_fail(d->resp, rc);
    }
    idem_call_end(call);
    http_server_complete(d->completion);
    if (atomic_exchange(&d->state, DEFERRED_ANSWERED) == DEFERRED_AWAY)
        free(d); /* else idemcall_commit_deferred() has yet to look at it, and frees it */
}

int idemcall_commit_deferred(const struct call_ctx *cx, struct idem_call *call,
                             struct response *resp)
{
    struct deferred_answer *d;
    int rc;

    if (cx->rq == NULL || cx->rq->completion == NULL)
        return idem_call_commit(call);
    d = xcalloc(1, sizeof *d);
    d->app = cx->app;
    d->resp = resp;
    d->completion = cx->rq->completion;
    d->operation = resp->operation;
    /* Before the commit: its answer may come from another thread before this call returns. */
    resp->deferred = 1;
    atomic_init(&d->state, DEFERRED_PENDING);
    rc = idem_call_commit_async(call, deferred_committed, d);
    if (rc == 0) {
        int pending = DEFERRED_PENDING;
        if (atomic_compare_exchange_strong(&d->state, &pending, DEFERRED_AWAY))
            return IDEMCALL_DEFERRED; /* deferred_committed() answers, and frees it */
        free(d);
        if (pending == DEFERRED_ANSWERED)
            return IDEMCALL_DEFERRED; /* answered on this thread already */
        rc = IDEM_ELEASE;             /* handed back: the call is ours again */
    } else {
        free(d);
    }
    resp->deferred = 0;
    return rc;
}

/*
 * After a refusal as moved (IDEM_EMOVED): the map read again and *moved made a copy of `cx` on
 * the view of the principal's cluster now.  Returns 0, or IDEM_EMOVED while the bucket moves.
 */
static int reroute(const struct call_ctx *cx, struct call_ctx *moved)
{
    struct app *view = NULL;
    int rc;

    app_store_failed(cx->app, IDEM_EMOVED);
    rc = app_route(cx->app, cx->principal, 1, &view);
    if (rc != 0)
        return IDEM_EMOVED;
    *moved = *cx;
    moved->app = view;
    return 0;
}

/*
 * A request's first refusal as moved: ends `*call` and points *cx (a copy in `moved`) and *app at
 * the principal's cluster now.  Returns 0 to try there, or -1 with the 503 answered.
 */
static int try_on_owner(struct idem_call **call, const struct call_ctx **cx, struct app **app,
                        struct call_ctx *moved, struct response *resp)
{
    idem_call_end(*call);
    *call = NULL;
    if (reroute(*cx, moved) < 0) {
        keyed_answer_fail(resp, IDEM_EMOVED);
        return -1;
    }
    *cx = moved;
    *app = moved->app;
    return 0;
}

void idemcall_handle(const struct call_ctx *cx, const struct idem_operation *op,
                     idemcall_run_fn run, void *arg, struct response *resp)
{
    struct app *app = cx->app;
    struct idem_call *call = NULL;
    struct idem_operation parked;
    struct call_ctx moved;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    int attempt, rerouted = 0;
    int rc;

    if (cx->rq->parked_ms > 0) {
        /* A duplicate that already waited on the event loop waits only what is left. */
        parked = *op;
        parked.wait_ms = op->wait_ms > cx->rq->parked_ms ? op->wait_ms - cx->rq->parked_ms : 1;
        op = &parked;
    }

    /* A second attempt only follows a lost lease: another owner finished or holds the record. */
    for (attempt = 0; attempt < 2; attempt++) {
        rc = idem_call_begin(app->engine, op, cx->principal, cx->key, cx->fp, &call, &outcome);
        if (rc == IDEM_EMOVED && !rerouted) {
            /* Refused by a cluster that no longer owns the bucket: once more, on the owner. */
            rerouted = 1;
            if (try_on_owner(&call, &cx, &app, &moved, resp) < 0)
                goto out;
            attempt--;
            continue;
        }
        if (rc == IDEM_EMOVED) {
            app_store_failed(app, rc);
            keyed_answer_fail(resp, rc);
            goto out;
        }
        if (rc < 0) {
            log_msg(&app->log, "error", "%s: cannot begin: %s", op->name, idem_err_name(rc));
            keyed_answer_unavailable(resp, "The idempotency store cannot be reached; nothing was "
                                           "done. Retry.");
            goto out;
        }
        if (keyed_answer_settled(call, outcome, op, resp))
            goto out;
        switch (outcome) {
        case IDEM_OUTCOME_EXECUTE:
        case IDEM_OUTCOME_RESUME:
            resp->outcome = "executed";
            rc = run(cx, call, outcome, arg, resp);
            if (rc == 0) {
                keyed_answer_stored(call, resp);
                goto out;
            }
            if (rc == IDEMCALL_ANSWERED) {
                idem_call_abort(call);
                goto out;
            }
            if (rc == IDEMCALL_DEFERRED) {
                call = NULL; /* the commit's thread answers and ends it */
                goto out;
            }
            if (rc == IDEM_EMOVED && !rerouted) {
                /* A one-phase call's record is written at its commit, and refused there. */
                idem_call_abort(call);
                rerouted = 1;
                if (try_on_owner(&call, &cx, &app, &moved, resp) < 0)
                    goto out;
                attempt--;
                continue;
            }
            app_store_failed(app, rc);
            /* A lost key is no fault: the next begin answers from its record. */
            if (rc != IDEM_ELEASE)
                log_msg(&app->log, "error", "%s: %s: %s", op->name, idem_err_name(rc),
                        idem_call_errmsg(call) ? idem_call_errmsg(call) : "");
            idem_call_abort(call);
            if (rc != IDEM_ELEASE) {
                keyed_answer_fail(resp, rc);
                goto out;
            }
            idem_call_end(call);
            call = NULL;
            break;
        case IDEM_OUTCOME_NONE:
        default:
            log_msg(&app->log, "error", "%s: unexpected engine outcome %d", op->name, (int)outcome);
            keyed_answer_fail(resp, IDEM_ESTATE);
            goto out;
        }
    }
    /* Lost the lease twice: someone else is working on it. */
    keyed_answer_in_progress(resp, 1, 0);
out:
    idem_call_end(call);
}
