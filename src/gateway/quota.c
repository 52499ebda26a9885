/* SPDX-License-Identifier: Apache-2.0 */
/*
 * quota.c - the per-caller accounting of quota.h: a hash table of principals with a list from the
 * one used most recently to the one used least, a token bucket per principal for its new keys,
 * and stored bytes in rings of buckets by expiry (one per principal, one for all).
 */
#include "quota.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "banned.h"

/*
 * Buckets of a ring: a record's bytes go to the bucket of its expiry, window / (RING - 2) wide,
 * so the buckets that can hold live bytes (from now to now + window) never share a place.  A
 * bucket counts until its end has passed, so a record is counted a bucket's width too long at
 * most, never too short.
 */
#define RING 16

struct ring {
    int64_t index[RING]; /* expiry / width of the bytes in each place */
    uint64_t bytes[RING];
};

struct quota_slot {
    char *principal;
    size_t len;
    uint64_t hash;
    struct quota_slot *chain;         /* in its hash bucket */
    struct quota_slot *newer, *older; /* in the list by last use */
    int in_flight;
    double tokens;
    int64_t refilled_ms;
    struct ring stored;
};

struct quota {
    struct quota_limits lim;
    int64_t width_ms;
    pthread_mutex_t mu;
    struct quota_slot **table;
    size_t nbuckets; /* a power of two */
    int nslots;
    struct quota_slot *newest, *oldest;
    struct ring total;
    atomic_uint_fast64_t refused[QUOTA_BUSY + 1];
};

static const char *const verdict_names[] = {"ok",           "keys_in_flight", "new_keys_rate",
                                            "stored_bytes", "store_budget",   "principals"};

const char *quota_verdict_name(enum quota_verdict v)
{
    return verdict_names[v];
}

struct quota *quota_new(const struct quota_limits *limits)
{
    struct quota *q = xcalloc(1, sizeof *q);

    q->lim = *limits;
    if (q->lim.tracked < 1)
        q->lim.tracked = 1;
    q->width_ms = q->lim.window_ms / (RING - 2) + 1;
    if (q->width_ms < 1000)
        q->width_ms = 1000;
    q->nbuckets = 16;
    while (q->nbuckets < (size_t)q->lim.tracked * 2)
        q->nbuckets *= 2;
    q->table = xcalloc(q->nbuckets, sizeof *q->table);
    pthread_mutex_init(&q->mu, NULL);
    return q;
}

void quota_free(struct quota *q)
{
    struct quota_slot *s, *next;

    if (!q)
        return;
    for (s = q->newest; s != NULL; s = next) {
        next = s->older;
        free(s->principal);
        free(s);
    }
    free(q->table);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* ---- rings ----------------------------------------------------------------------------------- */

static void ring_add(struct ring *r, int64_t width, uint64_t bytes, int64_t expires_ms)
{
    int64_t e = expires_ms / width;
    int i = (int)(e % RING);

    if (r->index[i] < e) { /* what was there expired: a place is reused a window later */
        r->index[i] = e;
        r->bytes[i] = 0;
    }
    r->bytes[i] += bytes;
}

/* The bytes not expired yet; *free_ms: when the earliest of them expire (0: none held). */
static uint64_t ring_sum(const struct ring *r, int64_t width, int64_t now_ms, int64_t *free_ms)
{
    int64_t now = now_ms / width, first = INT64_MAX;
    uint64_t sum = 0;

    for (int i = 0; i < RING; i++) {
        if (r->bytes[i] == 0 || r->index[i] < now)
            continue;
        sum += r->bytes[i];
        if (r->index[i] < first)
            first = r->index[i];
    }
    if (free_ms)
        *free_ms = first == INT64_MAX ? 0 : (first + 1) * width;
    return sum;
}

/* ---- the table ------------------------------------------------------------------------------- */

static uint64_t hash_of(const char *p, size_t len)
{
    uint64_t h = 14695981039346656037ULL; /* FNV-1a */

    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static void list_unlink(struct quota *q, struct quota_slot *s)
{
    if (s->newer)
        s->newer->older = s->older;
    else
        q->newest = s->older;
    if (s->older)
        s->older->newer = s->newer;
    else
        q->oldest = s->newer;
    s->newer = s->older = NULL;
}

static void list_push(struct quota *q, struct quota_slot *s)
{
    s->older = q->newest;
    s->newer = NULL;
    if (q->newest)
        q->newest->newer = s;
    q->newest = s;
    if (!q->oldest)
        q->oldest = s;
}

static void table_unlink(struct quota *q, struct quota_slot *s)
{
    struct quota_slot **pp = &q->table[s->hash & (q->nbuckets - 1)];

    while (*pp != s)
        pp = &(*pp)->chain;
    *pp = s->chain;
}

/*
 * The account of `principal`, made (a forgotten one's place taken: the least recently used with
 * nothing in flight) when it has none; NULL when every account has a request in flight.
 */
static struct quota_slot *slot_of(struct quota *q, const char *principal, size_t len,
                                  int64_t now_ms)
{
    uint64_t h = hash_of(principal, len);
    struct quota_slot *s = q->table[h & (q->nbuckets - 1)];

    while (s != NULL &&
           !(s->hash == h && s->len == len && memcmp(s->principal, principal, len) == 0))
        s = s->chain;
    if (s != NULL) {
        list_unlink(q, s);
        list_push(q, s);
        return s;
    }
    if (q->nslots < q->lim.tracked) {
        s = xcalloc(1, sizeof *s);
        q->nslots++;
    } else {
        for (s = q->oldest; s != NULL && s->in_flight > 0; s = s->newer)
            ;
        if (s == NULL)
            return NULL;
        list_unlink(q, s);
        table_unlink(q, s);
        free(s->principal);
        memset(s, 0, sizeof *s);
    }
    s->principal = xmalloc(len + 1);
    memcpy(s->principal, principal, len);
    s->principal[len] = '\0';
    s->len = len;
    s->hash = h;
    s->tokens = q->lim.new_keys_per_second;
    s->refilled_ms = now_ms;
    s->chain = q->table[h & (q->nbuckets - 1)];
    q->table[h & (q->nbuckets - 1)] = s;
    list_push(q, s);
    return s;
}

static void refill(const struct quota *q, struct quota_slot *s, int64_t now_ms)
{
    double rate = q->lim.new_keys_per_second;

    if (now_ms > s->refilled_ms) {
        s->tokens += rate * (double)(now_ms - s->refilled_ms) / 1000.0;
        if (s->tokens > rate)
            s->tokens = rate; /* a burst of one second's worth */
    }
    s->refilled_ms = now_ms;
}

/* Seconds from now to `at_ms`, 1 at least. */
static int seconds_until(int64_t now_ms, int64_t at_ms)
{
    int64_t s = (at_ms - now_ms + 999) / 1000;

    return s < 1 ? 1 : s > 86400 ? 86400 : (int)s;
}

/* ---- the calls ------------------------------------------------------------------------------- */

enum quota_verdict quota_admit(struct quota *q, const char *principal, size_t len, int64_t now_ms,
                               struct quota_slot **slot, int *retry_after_s)
{
    const struct quota_limits *l = &q->lim;
    enum quota_verdict v = QUOTA_OK;
    struct quota_slot *s;
    int64_t free_ms = 0;

    *slot = NULL;
    *retry_after_s = 1;
    pthread_mutex_lock(&q->mu);
    s = slot_of(q, principal, len, now_ms);
    if (s == NULL) {
        v = QUOTA_BUSY;
    } else if (l->keys_in_flight > 0 && s->in_flight >= l->keys_in_flight) {
        v = QUOTA_IN_FLIGHT;
    } else if (l->stored_bytes > 0 &&
               ring_sum(&s->stored, q->width_ms, now_ms, &free_ms) >= l->stored_bytes) {
        v = QUOTA_STORED;
        *retry_after_s = seconds_until(now_ms, free_ms);
    } else if (l->total_stored_bytes > 0 &&
               ring_sum(&q->total, q->width_ms, now_ms, &free_ms) >= l->total_stored_bytes) {
        v = QUOTA_TOTAL;
        *retry_after_s = seconds_until(now_ms, free_ms);
    } else if (l->new_keys_per_second > 0) {
        refill(q, s, now_ms);
        if (s->tokens < 1.0) {
            v = QUOTA_RATE;
            *retry_after_s = (int)((1.0 - s->tokens) / l->new_keys_per_second) + 1;
        }
    }
    if (v == QUOTA_OK) {
        s->in_flight++;
        *slot = s;
    }
    pthread_mutex_unlock(&q->mu);
    if (v != QUOTA_OK)
        atomic_fetch_add(&q->refused[v], 1);
    return v;
}

void quota_new_key(struct quota *q, struct quota_slot *slot, int64_t now_ms)
{
    if (!slot || q->lim.new_keys_per_second <= 0)
        return;
    pthread_mutex_lock(&q->mu);
    refill(q, slot, now_ms);
    /* Requests admitted together may overdraw it: they are paid back before the next one. */
    if (slot->tokens > -(double)q->lim.new_keys_per_second)
        slot->tokens -= 1.0;
    pthread_mutex_unlock(&q->mu);
}

void quota_stored(struct quota *q, struct quota_slot *slot, uint64_t bytes, int64_t expires_ms)
{
    pthread_mutex_lock(&q->mu);
    if (slot)
        ring_add(&slot->stored, q->width_ms, bytes, expires_ms);
    ring_add(&q->total, q->width_ms, bytes, expires_ms);
    pthread_mutex_unlock(&q->mu);
}

void quota_put(struct quota *q, struct quota_slot *slot)
{
    if (!q || !slot)
        return;
    pthread_mutex_lock(&q->mu);
    slot->in_flight--;
    pthread_mutex_unlock(&q->mu);
}

void quota_add_stored(struct quota *q, const char *principal, size_t len, uint64_t bytes,
                      int64_t expires_ms, int64_t now_ms)
{
    struct quota_slot *s;

    pthread_mutex_lock(&q->mu);
    s = principal ? slot_of(q, principal, len, now_ms) : NULL;
    if (s)
        ring_add(&s->stored, q->width_ms, bytes, expires_ms);
    ring_add(&q->total, q->width_ms, bytes, expires_ms);
    pthread_mutex_unlock(&q->mu);
}

int64_t quota_bucket_ms(const struct quota *q)
{
    return q->width_ms;
}

uint64_t quota_total_stored(struct quota *q, int64_t now_ms)
{
    uint64_t sum;

    pthread_mutex_lock(&q->mu);
    sum = ring_sum(&q->total, q->width_ms, now_ms, NULL);
    pthread_mutex_unlock(&q->mu);
    return sum;
}

void quota_render(struct quota *q, const char *prefix, int64_t now_ms, struct strbuf *out)
{
    int tracked;

    strbuf_addf(out,
                "# HELP %s_limited_total Keyed requests refused by a limit per caller or the "
                "stored-bytes budget.\n# TYPE %s_limited_total counter\n",
                prefix, prefix);
    for (int v = QUOTA_IN_FLIGHT; v <= QUOTA_BUSY; v++)
        strbuf_addf(out, "%s_limited_total{reason=\"%s\"} %llu\n", prefix, verdict_names[v],
                    (unsigned long long)atomic_load(&q->refused[v]));
    strbuf_addf(out,
                "# HELP %s_stored_bytes Bytes of stored answers the records hold, as counted.\n"
                "# TYPE %s_stored_bytes gauge\n%s_stored_bytes %llu\n",
                prefix, prefix, prefix, (unsigned long long)quota_total_stored(q, now_ms));
    strbuf_addf(out,
                "# HELP %s_stored_bytes_max The stored-bytes budget (0: none).\n"
                "# TYPE %s_stored_bytes_max gauge\n%s_stored_bytes_max %llu\n",
                prefix, prefix, prefix, (unsigned long long)q->lim.total_stored_bytes);
    pthread_mutex_lock(&q->mu);
    tracked = q->nslots;
    pthread_mutex_unlock(&q->mu);
    strbuf_addf(out,
                "# HELP %s_principals_tracked Callers whose limits are accounted now.\n"
                "# TYPE %s_principals_tracked gauge\n%s_principals_tracked %d\n",
                prefix, prefix, prefix, tracked);
}
