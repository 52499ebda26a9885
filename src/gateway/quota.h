/* SPDX-License-Identifier: Apache-2.0 */
/*
 * quota.h - how much one caller may make idem-gateway keep: keyed requests of one principal run
 * at once, new keys it starts a second, and the bytes of answers its records hold, plus a budget
 * for the stored answers of every principal together (docs/gateway.md, "Limits per caller").
 * Without them one caller over one connection fills the disk with records kept for their whole
 * retention.
 *
 * The accounting lives in memory and is bounded: at most `tracked` principals, the one used least
 * recently forgotten first when a new one comes (never one with a request in flight).  Stored
 * bytes are kept per principal in buckets by when their records expire, so they fall as records
 * expire, without asking the store; at start they are read from the store (quota_add_stored per
 * principal and expiry), so a restart keeps them.  A forgotten principal starts again from zero:
 * the global budget still counts its bytes.  Thread-safe (one mutex).
 */
#ifndef IDEM_GATEWAY_QUOTA_H
#define IDEM_GATEWAY_QUOTA_H

#include <stddef.h>
#include <stdint.h>

#include "strbuf.h"

struct quota_limits {
    int keys_in_flight;          /* keyed requests of one principal at once; 0: no limit */
    int new_keys_per_second;     /* records one principal starts a second; 0: no limit */
    uint64_t stored_bytes;       /* of one principal's records; 0: no limit */
    uint64_t total_stored_bytes; /* of every principal's records; 0: no limit */
    int tracked;                 /* principals accounted at once */
    int64_t window_ms;           /* the longest retention: no record is kept longer */
};

/* Why a request is refused. */
enum quota_verdict {
    QUOTA_OK,
    QUOTA_IN_FLIGHT, /* 429: keys_in_flight of this principal are running */
    QUOTA_RATE,      /* 429: new_keys_per_second spent */
    QUOTA_STORED,    /* 429: this principal's records hold stored_bytes */
    QUOTA_TOTAL,     /* 507: every principal's records hold total_stored_bytes */
    QUOTA_BUSY,      /* 503: `tracked` principals all have requests in flight */
};

struct quota;
struct quota_slot; /* one principal's account, valid while it holds a request in flight */

/* New: free with quota_free(). */
struct quota *quota_new(const struct quota_limits *limits);
void quota_free(struct quota *q);

/*
 * Before a keyed request of `principal` (`len` bytes) claims its record: QUOTA_OK with *slot, the
 * request now counted in flight until quota_put(), or why it may not, with *retry_after_s
 * (1 at least): when it may succeed.
 */
enum quota_verdict quota_admit(struct quota *q, const char *principal, size_t len, int64_t now_ms,
                               struct quota_slot **slot, int *retry_after_s);

/* The request admitted with `slot` claimed a new record: one new key spent. */
void quota_new_key(struct quota *q, struct quota_slot *slot, int64_t now_ms);

/* The request admitted with `slot` stored `bytes`, kept until `expires_ms`. */
void quota_stored(struct quota *q, struct quota_slot *slot, uint64_t bytes, int64_t expires_ms);

/* The request admitted with `slot` ended.  NULL is a no-op. */
void quota_put(struct quota *q, struct quota_slot *slot);

/*
 * What a record costs the store besides its answer's bytes (its key, scope, fingerprint, times,
 * the index), as counted: a flood of tiny answers fills a disk too.
 */
#define QUOTA_RECORD_OVERHEAD 256

/*
 * At start: `bytes` of records of `principal` (NULL: a caller no route names now, counted in the
 * total only) the store holds until `expires_ms`.
 */
void quota_add_stored(struct quota *q, const char *principal, size_t len, uint64_t bytes,
                      int64_t expires_ms, int64_t now_ms);

/* How finely stored bytes are told apart by expiry (ms): quota_add_stored's grain. */
int64_t quota_bucket_ms(const struct quota *q);

/* The bytes every principal's records hold now, as counted. */
uint64_t quota_total_stored(struct quota *q, int64_t now_ms);

/* The Prometheus text of the counters (`prefix`_limited_total{reason}, stored bytes). */
void quota_render(struct quota *q, const char *prefix, int64_t now_ms, struct strbuf *out);

/* The name of a refusal for logs and the metrics' `reason` label. */
const char *quota_verdict_name(enum quota_verdict v);

#endif /* IDEM_GATEWAY_QUOTA_H */
