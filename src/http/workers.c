/* SPDX-License-Identifier: Apache-2.0 */
/*
 * workers.c - the worker pool: threads that run the handlers that may block (store statements,
 * a blocking upstream exchange), fed from one bounded queue for the server (--http-queue, 503
 * beyond it).  A worker never touches a socket: it hands the connection back to its loop
 * (loop_push), which writes the answer -- or streams it, when the handler left a source.
 */
#include "loop_internal.h"

#include <stdatomic.h>

#include "banned.h"

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

void *http__worker_main(void *arg)
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
            http__loop_push(c, DONE_JOB);
            continue;
        }
        /* Two references: this worker's, and a deferred answer's (http_server_complete). */
        atomic_store(&c->job_refs, 2);
        c->rp.rq.completion = c;
        o->handle(o->ctx, request_parser_request(&c->rp), &c->resp);
        /* Read once, before letting go: past the decrement the connection may be reused. */
        drop = c->resp.deferred ? 1 : 2;
        if (atomic_fetch_sub(&c->job_refs, drop) == drop)
            http__loop_push(c, DONE_JOB);
    }
    return NULL;
}

/*
 * Hands `c` to a worker; 0, or -1 when the queue is full (nothing changed).  `always`: past the
 * queue's cap (HTTP_LOOP_HANDOFF).
 */
int http__submit(struct conn *c, enum job job, int always)
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
        http__set_state(c, CONN_WORKING); /* reading goes on, bounded (got() in http_server.c) */
        pthread_cond_signal(&srv->qcond);
    } else {
        atomic_fetch_add(&srv->st_queue_full, 1);
    }
    return rc;
}
