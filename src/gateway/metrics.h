/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.h - idem-gateway's counters for Prometheus (GET /metrics on the admin listener): per
 * route and outcome, how requests ended; how long the upstream took; how long the store took to
 * claim a record.  Lock-free counters, so the request path pays an atomic add, and a scrape reads
 * them in O(routes), never the store.
 */
#ifndef IDEM_GATEWAY_METRICS_H
#define IDEM_GATEWAY_METRICS_H

#include <stddef.h>

#include "idem/idem.h"
#include "strbuf.h"

/* How a request through the gateway ended (docs/gateway.md, "Metrics"). */
#define GW_OUTCOMES(X)                                                                             \
    X(EXECUTED, "executed")       /* forwarded, the answer stored (or not storable) */             \
    X(REPLAYED, "replayed")       /* answered from the record, the upstream not asked */           \
    X(WAITED, "waited")           /* a duplicate that waited for the first, then replayed */       \
    X(MISMATCH, "mismatch")       /* the key reused with another request: 422 */                   \
    X(IN_PROGRESS, "in_progress") /* 409: the first attempt still runs */                          \
    X(UNKNOWN, "unknown")         /* the upstream may or may not have acted */                     \
    X(RELEASED, "released")       /* the record was deleted: nothing reached the upstream */       \
    X(RECONCILED, "reconciled")   /* an unknown outcome settled by asking the upstream */          \
    X(REFUSED, "refused")         /* 400/401/413 before anything was claimed */                    \
    X(ERROR, "error")             /* the store failed: 503/500 */                                  \
    X(PASSED, "passed")           /* no route, or no key on an optional one: proxied as is */

enum gw_outcome {
#define GW_OUTCOME_ENUM(e, name) GW_OUTCOME_##e,
    GW_OUTCOMES(GW_OUTCOME_ENUM)
#undef GW_OUTCOME_ENUM
        GW_OUTCOME_COUNT
};

/* The outcome named `name` (a resp->outcome string), GW_OUTCOME_PASSED when none matches. */
enum gw_outcome gw_outcome_of(const char *name);

struct gw_metrics;

/* Counters for `nroutes` routes (route index nroutes stands for "no route"). */
struct gw_metrics *gw_metrics_new(size_t nroutes);
void gw_metrics_free(struct gw_metrics *m);

void gw_metrics_count(struct gw_metrics *m, size_t route, enum gw_outcome o);
/* Seconds of one upstream exchange, and of one claim in the store. */
void gw_metrics_upstream(struct gw_metrics *m, double seconds);
void gw_metrics_store(struct gw_metrics *m, double seconds);

/*
 * The Prometheus text of every counter into `out`; `operations[i]` names route i (the label);
 * extra lines (the HTTP server's counters) are the caller's.
 */
void gw_metrics_render(const struct gw_metrics *m, const char *const *operations,
                       struct strbuf *out);

/* A request of cluster `shard` (its index in the set) answered 503: its bucket is moving. */
void gw_metrics_shard_moving(struct gw_metrics *m, size_t shard);
/*
 * The counters of each cluster of `sh`, labelled shard="NAME" (claims, answers, refusals), from
 * `engines` (the first `nengines` clusters'), and the set's map refreshes (docs/gateway.md).
 */
void gw_metrics_render_shards(const struct gw_metrics *m, struct idem_shards *sh,
                              struct idem_engine *const *engines, size_t nengines,
                              struct strbuf *out);

#endif /* IDEM_GATEWAY_METRICS_H */
