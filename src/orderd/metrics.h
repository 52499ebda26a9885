/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.h - what orderd counts for Prometheus: requests by (operation, outcome) and request
 * durations by operation; the background workers (runs, items, failures, last run); calls to the
 * provider by outcome; webhooks by what became of them.  One instance lives in the server
 * context; every connection and worker thread records into it, so it is guarded by a mutex.
 */
#ifndef ORDERD_METRICS_H
#define ORDERD_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct metrics;

/* A new, empty set of counters (free with metrics_free). */
struct metrics *metrics_new(void);
void metrics_free(struct metrics *m);

/*
 * Records one finished request.  `operation` is one of the names of metrics.c ("orders.create",
 * "orders.list", "healthz", ...; anything else counts as "other"); `outcome` one of executed,
 * replayed, mismatch, waited, in_progress, none, rejected, error.
 */
void metrics_observe(struct metrics *m, const char *operation, const char *outcome, double seconds);

/* The background workers, each a bounded thread (worker.h). */
enum worker_id { WORKER_COMPLETER, WORKER_RECONCILER, WORKER_OUTBOX, WORKER_SWEEPER, WORKER_COUNT };

/* "completer", "reconciler", "outbox", "sweeper" (static). */
const char *worker_name(enum worker_id w);

/* Whether worker `w` runs, and every how many milliseconds. */
void metrics_worker_up(struct metrics *m, enum worker_id w, int up, int64_t interval_ms);

/* One run of worker `w`: `items` settled / sent / deleted, `failed` if it stopped on an error. */
void metrics_worker_run(struct metrics *m, enum worker_id w, uint64_t items, int failed);

enum provider_call { PCALL_CHARGE, PCALL_REFUND, PCALL_EMAIL, PCALL_LOOKUP, PCALL_COUNT };

/* One call to the provider; `outcome` is an enum provider_outcome (ok, refused, unknown). */
void metrics_provider(struct metrics *m, enum provider_call c, int outcome);

enum webhook_result {
    WEBHOOK_APPLIED,   /* changed something */
    WEBHOOK_IGNORED,   /* recorded, nothing to change (already applied another way) */
    WEBHOOK_DUPLICATE, /* its event id was seen before */
    WEBHOOK_REJECTED,  /* bad signature, stale timestamp or bad body: 401 / 400 */
    WEBHOOK_COUNT
};

void metrics_webhook(struct metrics *m, enum webhook_result r);

/*
 * Orders whose idempotency record was gone (swept) while their payment was still unknown, settled
 * by the reconciler from the order row: charged now with the order's derived key (or found
 * charged), declined, or still unknown (asked again later).
 */
enum orphan_result { ORPHAN_PAID, ORPHAN_DECLINED, ORPHAN_UNKNOWN, ORPHAN_COUNT };
void metrics_orphan_payment(struct metrics *m, enum orphan_result r);

/* The Prometheus text exposition (version 0.0.4): new, free with free(). */
char *metrics_render(struct metrics *m, size_t *len);

#endif /* ORDERD_METRICS_H */
