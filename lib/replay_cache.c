/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_cache.c - a bounded, sharded, thread-safe LRU of completed records' responses (see
 * replay_cache.h for what it is for and why it is safe).
 *
 * Many connection threads replay at once, so the cache is split into shards, each with its own
 * mutex, hash index and LRU list; a lookup holds one shard's lock for a hash walk and a list move,
 * never across an allocation or a copy.  An entry is one allocation (scope, headers, body) that is
 * immutable once published and reference-counted: a replay keeps reading it after the lock is
 * dropped, even if the entry is evicted meanwhile, and the last reference frees it.  The bound is
 * in bytes, so a few large responses cannot hold more memory than many small ones.  Keys come
 * from clients, so the index hashes with SipHash-1-3 under a random key: nobody can aim their
 * keys at one chain.
 */
#include "replay_cache.h"

#include <openssl/rand.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SHARD_MIN_BYTES ((size_t)256 * 1024)
#define SHARDS_MAX 16
#define BYTES_PER_BUCKET 512 /* the index is sized for entries of about this much */
#define MIN_BYTES ((size_t)4096)

struct node {
    struct idem__rentry pub;
    struct node *hnext;       /* hash chain */
    struct node *prev, *next; /* LRU list: the shard's sentinel's next is the most recent */
    uint64_t hash;
    atomic_uint refs; /* one for the cache while linked, one per idem__rcache_get */
    int64_t end_mono, end_wall;
    size_t cost;
    const char *principal, *operation, *key;
};

struct shard {
    alignas(64) pthread_mutex_t mu;
    struct node **buckets;
    size_t mask;
    struct node lru; /* sentinel of a circular list */
    size_t bytes, cap, entries;
    uint64_t hits, misses, evictions, expired;
};

struct idem__rcache {
    struct shard *shards;
    size_t nshards; /* a power of two */
    size_t max_bytes;
    uint64_t k0, k1; /* SipHash key */
};

/* ---- SipHash-1-3 over the scope -------------------------------------------------------------- */

struct sip {
    uint64_t v0, v1, v2, v3;
    uint64_t tail;
    size_t ntail, len;
};

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void sip_round(struct sip *s)
{
    s->v0 += s->v1;
    s->v1 = ROTL(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = ROTL(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = ROTL(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = ROTL(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = ROTL(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = ROTL(s->v2, 32);
}

static void sip_block(struct sip *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s);
    s->v0 ^= m;
}

static void sip_add_byte(struct sip *s, unsigned char b)
{
    s->tail |= (uint64_t)b << (8 * s->ntail);
    if (++s->ntail == 8) {
        sip_block(s, s->tail);
        s->tail = 0;
        s->ntail = 0;
    }
}

/* Adds a string and its NUL: no two different scopes feed the same bytes. */
static void sip_add_str(struct sip *s, const char *str)
{
    const unsigned char *p = (const unsigned char *)str;
    size_t n = strlen(str) + 1;

    s->len += n;
    for (; n > 0 && s->ntail != 0; p++, n--)
        sip_add_byte(s, *p);
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t m = 0;
        for (int i = 0; i < 8; i++)
            m |= (uint64_t)p[i] << (8 * i);
        sip_block(s, m);
    }
    for (; n > 0; p++, n--)
        sip_add_byte(s, *p);
}

static uint64_t scope_hash(const struct idem__rcache *c, const struct idem_scope *sc)
{
    struct sip s;
    uint64_t b;

    memset(&s, 0, sizeof(s));
    s.v0 = c->k0 ^ 0x736f6d6570736575ULL;
    s.v1 = c->k1 ^ 0x646f72616e646f6dULL;
    s.v2 = c->k0 ^ 0x6c7967656e657261ULL;
    s.v3 = c->k1 ^ 0x7465646279746573ULL;

    sip_add_str(&s, sc->principal);
    sip_add_str(&s, sc->operation);
    sip_add_str(&s, sc->key);
    b = ((uint64_t)s.len << 56) | s.tail;
    sip_block(&s, b);
    s.v2 ^= 0xff;
    sip_round(&s);
    sip_round(&s);
    sip_round(&s);
    return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

/* ---- entries --------------------------------------------------------------------------------- */

static void node_unref(struct node *n)
{
    if (atomic_fetch_sub_explicit(&n->refs, 1, memory_order_acq_rel) == 1)
        free(n);
}

void idem__rcache_put(const struct idem__rentry *e)
{
    /* pub is the first member: the entry is the node. */
    if (e)
        node_unref((struct node *)(uintptr_t)e);
}

static int scope_eq(const struct node *n, uint64_t h, const struct idem_scope *s)
{
    return n->hash == h && strcmp(n->key, s->key) == 0 && strcmp(n->principal, s->principal) == 0 &&
           strcmp(n->operation, s->operation) == 0;
}

static struct shard *shard_of(struct idem__rcache *c, uint64_t h)
{
    /* The top bits pick the shard, the low bits the bucket: the two choices stay independent. */
    return &c->shards[(size_t)(h >> 56) & (c->nshards - 1)];
}

static void lru_unlink(struct node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
}

static void lru_push_front(struct shard *sh, struct node *n)
{
    n->prev = &sh->lru;
    n->next = sh->lru.next;
    sh->lru.next->prev = n;
    sh->lru.next = n;
}

/* Unlinks `n` from its shard (the lock is held) and drops the cache's reference. */
static void shard_drop(struct shard *sh, struct node *n)
{
    struct node **pp = &sh->buckets[n->hash & sh->mask];

    while (*pp != n)
        pp = &(*pp)->hnext;
    *pp = n->hnext;
    lru_unlink(n);
    sh->bytes -= n->cost;
    sh->entries--;
    node_unref(n);
}

static struct node *shard_find(struct shard *sh, uint64_t h, const struct idem_scope *s)
{
    struct node *n = sh->buckets[h & sh->mask];

    while (n && !scope_eq(n, h, s))
        n = n->hnext;
    return n;
}

/* ---- the cache ------------------------------------------------------------------------------- */

int idem__rcache_new(size_t max_bytes, struct idem__rcache **out)
{
    struct idem__rcache *c = NULL;
    size_t n = 1, per, nb;
    unsigned char key[16];
    int rc = IDEM_ENOMEM;

    *out = NULL;
    if (max_bytes < MIN_BYTES)
        return IDEM_EINVAL;
    while (n < SHARDS_MAX && max_bytes / (n * 2) >= SHARD_MIN_BYTES)
        n *= 2;
    per = max_bytes / n;
    nb = 8;
    while (nb < per / BYTES_PER_BUCKET)
        nb *= 2;

    c = calloc(1, sizeof(*c));
    if (!c)
        goto out;
    c->shards = aligned_alloc(alignof(struct shard), n * sizeof(struct shard));
    if (!c->shards)
        goto out;
    memset(c->shards, 0, n * sizeof(struct shard));
    for (size_t i = 0; i < n; i++) {
        struct shard *sh = &c->shards[i];
        sh->buckets = calloc(nb, sizeof(*sh->buckets));
        if (!sh->buckets || pthread_mutex_init(&sh->mu, NULL) != 0) {
            free(sh->buckets);
            sh->buckets = NULL;
            break;
        }
        sh->mask = nb - 1;
        sh->lru.next = sh->lru.prev = &sh->lru;
        sh->cap = per;
        sh->bytes = nb * sizeof(*sh->buckets);
        c->nshards = i + 1;
    }
    if (c->nshards != n)
        goto out;
    c->max_bytes = max_bytes;
    if (RAND_bytes(key, sizeof(key)) != 1) {
        /* Without randomness the index still works; only its resistance to aimed keys is lost. */
        uint64_t t = (uint64_t)clock_mono_ms() ^ (uint64_t)(uintptr_t)c;
        memcpy(key, &t, 8);
        memcpy(key + 8, &t, 8);
    }
    memcpy(&c->k0, key, 8);
    memcpy(&c->k1, key + 8, 8);
    *out = c;
    c = NULL;
    rc = 0;
out:
    idem__rcache_free(c);
    return rc;
}

void idem__rcache_free(struct idem__rcache *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->shards && i < c->nshards; i++) {
        struct shard *sh = &c->shards[i];
        while (sh->lru.next != &sh->lru)
            shard_drop(sh, sh->lru.next);
        free(sh->buckets);
        pthread_mutex_destroy(&sh->mu);
    }
    free(c->shards);
    free(c);
}

const struct idem__rentry *idem__rcache_get(struct idem__rcache *c, const struct idem_scope *s)
{
    const int64_t now_mono = clock_mono_ms();
    const int64_t now_wall = clock_wall_ms();
    const uint64_t h = scope_hash(c, s);
    struct shard *sh = shard_of(c, h);
    struct node *n;

    pthread_mutex_lock(&sh->mu);
    n = shard_find(sh, h, s);
    if (n && (now_mono >= n->end_mono || now_wall >= n->end_wall)) {
        shard_drop(sh, n);
        sh->expired++;
        n = NULL;
    }
    if (n) {
        lru_unlink(n);
        lru_push_front(sh, n);
        atomic_fetch_add_explicit(&n->refs, 1, memory_order_relaxed);
        sh->hits++;
    } else {
        sh->misses++;
    }
    pthread_mutex_unlock(&sh->mu);
    return n ? &n->pub : NULL;
}

void idem__rcache_forget(struct idem__rcache *c, const struct idem_scope *s)
{
    const uint64_t h = scope_hash(c, s);
    struct shard *sh = shard_of(c, h);
    struct node *n;

    pthread_mutex_lock(&sh->mu);
    n = shard_find(sh, h, s);
    if (n)
        shard_drop(sh, n);
    pthread_mutex_unlock(&sh->mu);
}

size_t idem__rcache_max_entry(const struct idem__rcache *c)
{
    /* Every shard has the same capacity. */
    return c->shards[0].cap / 8;
}

int idem__rcache_insert(struct idem__rcache *c, const struct idem_scope *s,
                        const unsigned char fp[IDEM_FP_LEN], int status, const char *headers,
                        const void *body, size_t body_len, int64_t lifetime_ms)
{
    const size_t plen = strlen(s->principal), olen = strlen(s->operation), klen = strlen(s->key);
    const size_t hlen = headers ? strlen(headers) : 0;
    const uint64_t h = scope_hash(c, s);
    struct shard *sh = shard_of(c, h);
    struct idem_header *harr;
    struct node *n, *old;
    size_t nh = 0, cost;
    char *p;

    for (size_t i = 0; i < hlen; i++)
        nh += headers[i] == '\n';
    cost = sizeof(*n) + nh * sizeof(*harr) + plen + olen + klen + hlen + body_len + 5;
    if (lifetime_ms <= 0 || cost > idem__rcache_max_entry(c)) {
        /* Not kept; and an older entry of the scope must not answer in its place. */
        idem__rcache_forget(c, s);
        return 0;
    }
    n = malloc(cost);
    if (!n)
        return IDEM_ENOMEM;
    memset(n, 0, sizeof(*n));
    harr = (struct idem_header *)(n + 1);
    p = (char *)(harr + nh);
    n->principal = memcpy(p, s->principal, plen + 1);
    p += plen + 1;
    n->operation = memcpy(p, s->operation, olen + 1);
    p += olen + 1;
    n->key = memcpy(p, s->key, klen + 1);
    p += klen + 1;
    memcpy(p, headers ? headers : "", hlen + 1);
    n->pub.headers = harr;
    n->pub.nheaders = idem__headers_split(p, harr);
    p += hlen + 1;
    if (body_len)
        memcpy(p, body, body_len);
    p[body_len] = '\0';
    n->pub.body = p;
    n->pub.body_len = body_len;
    n->pub.status = status;
    memcpy(n->pub.fp, fp, IDEM_FP_LEN);
    n->hash = h;
    n->cost = cost;
    n->end_mono = clock_mono_ms() + lifetime_ms;
    n->end_wall = clock_wall_ms() + lifetime_ms;
    atomic_init(&n->refs, 1);

    pthread_mutex_lock(&sh->mu);
    old = shard_find(sh, h, s);
    if (old)
        shard_drop(sh, old);
    while (sh->bytes + cost > sh->cap && sh->lru.prev != &sh->lru) {
        shard_drop(sh, sh->lru.prev);
        sh->evictions++;
    }
    n->hnext = sh->buckets[h & sh->mask];
    sh->buckets[h & sh->mask] = n;
    lru_push_front(sh, n);
    sh->bytes += cost;
    sh->entries++;
    pthread_mutex_unlock(&sh->mu);
    return 0;
}

void idem__rcache_stats(struct idem__rcache *c, struct idem__rcache_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->max_bytes = c->max_bytes;
    for (size_t i = 0; i < c->nshards; i++) {
        struct shard *sh = &c->shards[i];
        pthread_mutex_lock(&sh->mu);
        out->entries += sh->entries;
        out->bytes += sh->bytes;
        out->hits += sh->hits;
        out->misses += sh->misses;
        out->evictions += sh->evictions;
        out->expired += sh->expired;
        pthread_mutex_unlock(&sh->mu);
    }
}
