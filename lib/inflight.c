/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inflight.c - the registry of scopes in flight in this process, their watches, and the wake-up
 * when a record changes here (see inflight.h for why it exists).
 *
 * One mutex guards it all, and one condition variable tells every change: a waiter for a scope
 * and a waiter for any change (idem__inflight_wait_change) sleep on the same one, so a change
 * wakes both.  A watch holds no thread: it is taken out of the table when its scope leaves and
 * its callback runs on the leaving thread, outside the mutex; idem__inflight_watch_end() waits
 * for a callback that is running, so a watch's owner may free what `arg` points to once it
 * returns.
 */
#include "inflight.h"

#include <errno.h>

/* Buckets of the table, for the scopes in flight and the watches alike. */
#define INFLIGHT_BUCKETS 256

struct idem__inflight {
    pthread_mutex_t mu;
    pthread_cond_t changed;
    uint64_t epoch; /* counts changes (mu) */
    /* Entries in flight, chained by hash of the scope (mu). */
    struct idem__inflight_entry *entries[INFLIGHT_BUCKETS];
    /* Watches of scopes in flight, chained by the same hash (mu). */
    struct idem_watch *watches[INFLIGHT_BUCKETS];
};

/* A waiter that holds no thread: told by callback when its scope leaves flight. */
enum watch_state { WATCH_WAITING, WATCH_FIRING, WATCH_DONE };

struct idem_watch {
    struct idem__inflight *r; /* NULL: never entered, nothing to unlink */
    struct idem_watch *next;
    char *principal, *operation, *key;
    struct idem_scope scope;
    unsigned bucket;
    enum watch_state state;
    void (*changed)(void *arg);
    void *arg;
};

int idem__inflight_new(struct idem__inflight **out)
{
    struct idem__inflight *r = calloc(1, sizeof(*r));

    *out = NULL;
    if (!r)
        return IDEM_ENOMEM;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        return IDEM_ENOMEM;
    }
    if (pthread_cond_init(&r->changed, NULL) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return IDEM_ENOMEM;
    }
    *out = r;
    return 0;
}

void idem__inflight_free(struct idem__inflight *r)
{
    if (!r)
        return;
    pthread_cond_destroy(&r->changed);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static unsigned scope_bucket(const struct idem_scope *s)
{
    uint32_t h = 2166136261u; /* FNV-1a over the three parts, each with its NUL */
    const char *parts[3] = {s->principal, s->operation, s->key};

    for (int i = 0; i < 3; i++) {
        const unsigned char *p = (const unsigned char *)parts[i];
        do {
            h = (h ^ *p) * 16777619u;
        } while (*p++);
    }
    return h % INFLIGHT_BUCKETS;
}

static int same_scope(const struct idem_scope *a, const struct idem_scope *b)
{
    return strcmp(a->key, b->key) == 0 && strcmp(a->principal, b->principal) == 0 &&
           strcmp(a->operation, b->operation) == 0;
}

/* Whether an entry has the scope in flight (r->mu held). */
static int busy(const struct idem__inflight *r, const struct idem_scope *s, unsigned b)
{
    for (const struct idem__inflight_entry *e = r->entries[b]; e; e = e->next)
        if (same_scope(e->scope, s))
            return 1;
    return 0;
}

static void add_locked(struct idem__inflight *r, struct idem__inflight_entry *e, unsigned b)
{
    e->in = 1;
    e->bucket = b;
    e->next = r->entries[b];
    r->entries[b] = e;
}

/* Takes the entry's scope out of flight, if it is in (r->mu held). */
static void unlink_locked(struct idem__inflight *r, struct idem__inflight_entry *e)
{
    if (!e->in)
        return;
    for (struct idem__inflight_entry **pp = &r->entries[e->bucket]; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    e->in = 0;
}

void idem__inflight_enter(struct idem__inflight *r, struct idem__inflight_entry *e,
                          int64_t deadline, int *waited)
{
    unsigned b = scope_bucket(e->scope);

    *waited = 0;
    pthread_mutex_lock(&r->mu);
    while (busy(r, e->scope, b)) {
        int64_t left = deadline - clock_mono_ms();
        struct timespec ts;
        if (left <= 0)
            break;
        *waited = 1;
        ts = idem__deadline_ms(left);
        pthread_cond_timedwait(&r->changed, &r->mu, &ts);
    }
    if (!busy(r, e->scope, b))
        add_locked(r, e, b);
    pthread_mutex_unlock(&r->mu);
}

int idem__inflight_try_enter(struct idem__inflight *r, struct idem__inflight_entry *e)
{
    unsigned b = scope_bucket(e->scope);
    int entered;

    pthread_mutex_lock(&r->mu);
    entered = !busy(r, e->scope, b);
    if (entered)
        add_locked(r, e, b);
    pthread_mutex_unlock(&r->mu);
    return entered;
}

/*
 * Takes the watches of `leaving`'s scope out of the table, as a list to fire (r->mu held).  A
 * watch taken here is FIRING: idem__inflight_watch_end() waits for its callback to return.
 */
static struct idem_watch *watches_take(struct idem__inflight *r,
                                       const struct idem__inflight_entry *leaving)
{
    struct idem_watch **pp = &r->watches[leaving->bucket];
    struct idem_watch *fire = NULL, *w;

    while ((w = *pp) != NULL) {
        if (same_scope(&w->scope, leaving->scope)) {
            *pp = w->next;
            w->state = WATCH_FIRING;
            w->next = fire;
            fire = w;
        } else {
            pp = &w->next;
        }
    }
    return fire;
}

void idem__inflight_changed(struct idem__inflight *r, struct idem__inflight_entry *leaving)
{
    struct idem_watch *fire = NULL, *w, *next;

    pthread_mutex_lock(&r->mu);
    if (leaving && leaving->in)
        fire = watches_take(r, leaving);
    if (leaving)
        unlink_locked(r, leaving);
    r->epoch++;
    pthread_mutex_unlock(&r->mu);
    /* After the unlock: waiters woken under the mutex would only block on it again. */
    pthread_cond_broadcast(&r->changed);
    for (w = fire; w; w = next) {
        next = w->next;
        w->changed(w->arg);
        pthread_mutex_lock(&r->mu);
        w->state = WATCH_DONE;
        pthread_mutex_unlock(&r->mu);
    }
    if (fire)
        pthread_cond_broadcast(&r->changed); /* an idem__inflight_watch_end() may wait for one */
}

void idem__inflight_wait_change(struct idem__inflight *r, int64_t ms)
{
    struct timespec ts = idem__deadline_ms(ms);
    uint64_t seen;

    pthread_mutex_lock(&r->mu);
    seen = r->epoch;
    while (r->epoch == seen)
        if (pthread_cond_timedwait(&r->changed, &r->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&r->mu);
}

int idem__inflight_watch(struct idem__inflight *r, const struct idem_scope *s,
                         void (*changed)(void *arg), void *arg, struct idem_watch **out)
{
    struct idem_watch *w;
    int is_busy;

    *out = NULL;
    w = calloc(1, sizeof(*w));
    if (!w)
        return IDEM_ENOMEM;
    w->principal = idem__strdup(s->principal);
    w->operation = idem__strdup(s->operation);
    w->key = idem__strdup(s->key);
    if (!w->principal || !w->operation || !w->key) {
        idem__inflight_watch_end(w);
        return IDEM_ENOMEM;
    }
    w->scope.principal = w->principal;
    w->scope.operation = w->operation;
    w->scope.key = w->key;
    w->bucket = scope_bucket(&w->scope);
    w->changed = changed;
    w->arg = arg;
    pthread_mutex_lock(&r->mu);
    is_busy = busy(r, &w->scope, w->bucket);
    if (is_busy) {
        w->r = r;
        w->next = r->watches[w->bucket];
        r->watches[w->bucket] = w;
    }
    pthread_mutex_unlock(&r->mu);
    if (!is_busy) {
        idem__inflight_watch_end(w); /* never entered: nothing to unlink */
        return 0;
    }
    *out = w;
    return 1;
}

void idem__inflight_watch_end(struct idem_watch *w)
{
    struct idem__inflight *r;

    if (!w)
        return;
    r = w->r;
    if (r) {
        pthread_mutex_lock(&r->mu);
        if (w->state == WATCH_WAITING) {
            for (struct idem_watch **pp = &r->watches[w->bucket]; *pp; pp = &(*pp)->next) {
                if (*pp == w) {
                    *pp = w->next;
                    break;
                }
            }
            w->state = WATCH_DONE;
        }
        while (w->state == WATCH_FIRING)
            pthread_cond_wait(&r->changed, &r->mu);
        pthread_mutex_unlock(&r->mu);
    }
    free(w->principal);
    free(w->operation);
    free(w->key);
    free(w);
}
