/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inflight.h - the scopes in flight in this process, and the wake-up when a record changes here.
 *
 * A storm of duplicates in one process would otherwise all read the store, all try to claim and
 * lose, and all poll.  Instead the first call of a scope enters it in the engine's registry;
 * later calls of the same scope wait until it leaves (completed, released, or found it had
 * nothing to execute), then find the response in the replay cache -- or, if it is not there, go
 * the normal way through the store.  The wait is bounded by a deadline the engine gives, after
 * which they too go the normal way.  A waiter that holds no thread (an event loop's) registers a
 * watch instead, called once when the scope leaves.  Internal to libidem: the engine (engine.c)
 * is its one user.
 */
#ifndef IDEM_INFLIGHT_H
#define IDEM_INFLIGHT_H

#include "internal.h"

struct idem__inflight;

/*
 * What enters the registry, embedded in its owner (an engine's call): the scope is borrowed and
 * must stay valid while the entry is in flight.  Zeroed, it is out of flight.
 */
struct idem__inflight_entry {
    const struct idem_scope *scope;
    struct idem__inflight_entry *next; /* (the registry's) */
    unsigned bucket;                   /* (the registry's) */
    int in;                            /* in flight; read and changed only by the entry's owner */
};

/* Makes an empty registry.  Returns 0 and *out (new, free with idem__inflight_free), IDEM_ENOMEM.
 */
int idem__inflight_new(struct idem__inflight **out);
/* Frees the registry; nothing may be in flight or watched any more.  NULL is a no-op. */
void idem__inflight_free(struct idem__inflight *r);

/*
 * Enters `e`'s scope in flight, first waiting (until `deadline`, monotonic milliseconds) while
 * another entry has it.  *waited says whether it waited; past the deadline `e` goes on without
 * entering (e->in stays 0).
 */
void idem__inflight_enter(struct idem__inflight *r, struct idem__inflight_entry *e,
                          int64_t deadline, int *waited);
/* idem__inflight_enter() without the wait: returns whether `e` entered (nobody had its scope). */
int idem__inflight_try_enter(struct idem__inflight *r, struct idem__inflight_entry *e);

/*
 * A record changed in this process: wakes every waiter.  `leaving`, if not NULL, leaves flight at
 * the same moment (if it was in), and the watches of its scope are called on this thread, after
 * the registry's lock is released.
 */
void idem__inflight_changed(struct idem__inflight *r, struct idem__inflight_entry *leaving);

/* Sleeps up to `ms`, or less when idem__inflight_changed() is called meanwhile. */
void idem__inflight_wait_change(struct idem__inflight *r, int64_t ms);

/*
 * When an entry has scope `s` in flight, registers `changed(arg)` to be called once, when the
 * scope leaves, and returns 1 with *out (new, end with idem__inflight_watch_end).  Returns 0 with
 * *out NULL when the scope is not in flight, or IDEM_ENOMEM.  `changed` must not block.
 */
int idem__inflight_watch(struct idem__inflight *r, const struct idem_scope *s,
                         void (*changed)(void *arg), void *arg, struct idem_watch **out);
/*
 * Ends a watch, fired or not: once it returns, its callback is not running and will not be
 * called.  NULL is a no-op.
 */
void idem__inflight_watch_end(struct idem_watch *w);

#endif
