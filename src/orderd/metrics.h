/*
 * metrics.h - what orderd counts for Prometheus: requests by (operation, outcome) and request
 * durations by operation.  One instance lives in the server context; every connection thread
 * records into it, so it is guarded by a mutex.
 */
#ifndef ORDERD_METRICS_H
#define ORDERD_METRICS_H

#include <stddef.h>

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

/* The Prometheus text exposition (version 0.0.4): new, free with free(). */
char *metrics_render(struct metrics *m, size_t *len);

#endif /* ORDERD_METRICS_H */
