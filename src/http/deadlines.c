/* SPDX-License-Identifier: Apache-2.0 */
/*
 * deadlines.c - a connection's state and its deadline.  No timer per connection: a connection
 * sits in the deadline list of its state (enum deadline_list), appended when it enters it, so a
 * list whose entries share a timeout is in deadline order and the loop's tick (every TICK_MS)
 * only looks at its heads; the lists whose deadlines differ per connection (parked requests,
 * streams) are looked at whole.
 */
#include "loop_internal.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "banned.h"

/* The deadline list each state puts a connection in. */
static const enum deadline_list state_list[CONN_NSTATES] = {
    [CONN_IDLE] = LIST_IDLE,           [CONN_HEAD] = LIST_HEAD,
    [CONN_BODY] = LIST_BODY,           [CONN_WORKING] = LIST_NONE,
    [CONN_WRITING] = LIST_WRITE,       [CONN_LINGER] = LIST_LINGER,
    [CONN_CLOSING] = LIST_NONE,        [CONN_NEW] = LIST_NONE,
    [CONN_PARKED] = LIST_PARKED,       [CONN_FRESH] = LIST_FRESH,
    [CONN_STREAMING] = LIST_STREAMING,
};

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

void http__set_state(struct conn *c, enum conn_state st)
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

/* ---- the tick -------------------------------------------------------------------------------- */

static void expire(struct http_loop *lp, struct conn *c)
{
    struct http_server *srv = lp->srv;

    switch (c->state) {
    case CONN_HEAD:
    case CONN_BODY:
        atomic_fetch_add(&srv->st_timeouts, 1);
        http__send_problem(c, http__current_request(c), 408, "request-timeout",
                           c->state == CONN_HEAD ? "The request headers did not arrive in time."
                                                 : "The request body did not arrive in time.",
                           0);
        break;
    case CONN_WRITING:
        atomic_fetch_add(&srv->st_timeouts, 1);
        http__conn_close(c);
        break;
    default:
        http__conn_close(c);
        break;
    }
}

void http__on_tick(uv_timer_t *t)
{
    struct http_loop *lp = t->data;
    uint64_t now = uv_now(&lp->uv);
    struct conn *c, *next;
    enum deadline_list l;
    enum conn_state st;

    for (c = lp->head[LIST_PARKED]; c != NULL; c = next) {
        next = c->next;
        if (c->park_deadline <= now)
            http__unpark(c, 1);
    }
    for (c = lp->head[LIST_STREAMING]; c != NULL; c = next) {
        next = c->next;
        http__stream_check(c, now);
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
        http__begin_stop(lp);
}
