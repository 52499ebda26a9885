/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_cache.h - the engine's in-memory copy of completed records' responses, so that a replay
 * touches no store.  A completed record never changes until retention deletes it, so its response
 * may be kept and answered from memory as long as the entry dies no later than the record: the
 * engine works out that lifetime (engine.c) and the cache only enforces it.  Internal to libidem.
 */
#ifndef IDEM_REPLAY_CACHE_H
#define IDEM_REPLAY_CACHE_H

#include "internal.h"

struct idem__rcache;

/* One cached response: immutable once published; what a reference lets the engine read. */
struct idem__rentry {
    unsigned char fp[IDEM_FP_LEN];
    int status;
    const void *body; /* body_len bytes and a NUL */
    size_t body_len;
    const struct idem_header *headers;
    size_t nheaders;
};

struct idem__rcache_stats {
    size_t entries;
    size_t bytes; /* charged against the bound: entries and the hash index */
    size_t max_bytes;
    uint64_t hits, misses, evictions, expired;
};

/*
 * Makes a cache bounded to `max_bytes` (entries, their copies and the index all count).  Returns
 * 0 and *out (new, free with idem__rcache_free); IDEM_EINVAL for a bound too small to hold the
 * index (under 4 KiB); IDEM_ENOMEM.
 */
int idem__rcache_new(size_t max_bytes, struct idem__rcache **out);
/* Frees the cache.  References still held stay valid until released.  NULL is a no-op. */
void idem__rcache_free(struct idem__rcache *c);

/*
 * The entry of scope `s` if there is one whose lifetime has not ended: a new reference (release
 * it with idem__rcache_put), or NULL.  A hit makes the entry the most recently used.
 */
const struct idem__rentry *idem__rcache_get(struct idem__rcache *c, const struct idem_scope *s);

/* Drops a reference from idem__rcache_get.  NULL is a no-op. */
void idem__rcache_put(const struct idem__rentry *e);

/*
 * Copies a completed record's response in, replacing any entry of the same scope, to answer for
 * at most `lifetime_ms` from now (by both the monotonic and the wall clock, whichever ends it
 * first).  `headers` is the stored "Name: value\n" text (may be NULL).  Nothing is kept when the
 * lifetime is not positive or the entry would take more than an eighth of its shard; least
 * recently used entries make room.  Returns 0 (also when nothing was kept) or IDEM_ENOMEM.
 */
int idem__rcache_insert(struct idem__rcache *c, const struct idem_scope *s,
                        const unsigned char fp[IDEM_FP_LEN], int status, const char *headers,
                        const void *body, size_t body_len, int64_t lifetime_ms);

/* The largest entry a put may keep, in bytes (scope, headers and body copies included). */
size_t idem__rcache_max_entry(const struct idem__rcache *c);

/* Drops the entry of scope `s`, if any. */
void idem__rcache_forget(struct idem__rcache *c, const struct idem_scope *s);

/* Counters summed over every shard (a snapshot, each shard read under its lock). */
void idem__rcache_stats(struct idem__rcache *c, struct idem__rcache_stats *out);

#endif /* IDEM_REPLAY_CACHE_H */
