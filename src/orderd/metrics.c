/*
 * metrics.c - the counters behind GET /metrics.  The label values are a fixed, small set
 * (operations and outcomes named in docs/http-api.md), so the series live in plain arrays and a
 * request never allocates to be counted; an unknown name falls into "other" / "error" instead
 * of growing the label space with whatever a client sent.  Every series is exposed from the
 * start, zeros included, so a scraper (or a test) can take a difference without guessing.
 */
#include "metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"
#include "util.h"
#include "banned.h"

static const char *const operations[] = {
    "orders.create", "orders.cancel", "profile.update", "orders.list",
    "orders.get",    "healthz",       "metrics",        "other",
};
#define NOPS (sizeof operations / sizeof operations[0])
#define OP_OTHER (NOPS - 1)

static const char *const outcomes[] = {
    "executed", "replayed", "mismatch", "waited", "in_progress", "none", "rejected", "error",
};
#define NOUTCOMES (sizeof outcomes / sizeof outcomes[0])
#define OUTCOME_ERROR (NOUTCOMES - 1)

static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                 0.25,  0.5,    1,     2.5,  5,     10};
static const char *const bucket_labels[] = {"0.001", "0.0025", "0.005", "0.01", "0.025",
                                            "0.05",  "0.1",    "0.25",  "0.5",  "1",
                                            "2.5",   "5",      "10"};
#define NBUCKETS (sizeof buckets / sizeof buckets[0])

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[NOPS][NOUTCOMES];
    uint64_t bucket_counts[NOPS][NBUCKETS]; /* not cumulative; summed when rendered */
    uint64_t count[NOPS];
    double sum[NOPS];
};

struct metrics *metrics_new(void)
{
    struct metrics *m = xcalloc(1, sizeof *m);

    if (pthread_mutex_init(&m->mu, NULL) != 0)
        die("pthread_mutex_init failed");
    return m;
}

void metrics_free(struct metrics *m)
{
    if (m == NULL)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static size_t index_of(const char *const *names, size_t n, const char *name, size_t fallback)
{
    size_t i;

    for (i = 0; name != NULL && i < n; i++) {
        if (strcmp(names[i], name) == 0)
            return i;
    }
    return fallback;
}

void metrics_observe(struct metrics *m, const char *operation, const char *outcome, double seconds)
{
    size_t op = index_of(operations, NOPS, operation, OP_OTHER);
    size_t oc = index_of(outcomes, NOUTCOMES, outcome, OUTCOME_ERROR);
    size_t b;

    pthread_mutex_lock(&m->mu);
    m->requests[op][oc]++;
    for (b = 0; b < NBUCKETS; b++) {
        if (seconds <= buckets[b]) {
            m->bucket_counts[op][b]++;
            break;
        }
    }
    m->count[op]++;
    m->sum[op] += seconds;
    pthread_mutex_unlock(&m->mu);
}

char *metrics_render(struct metrics *m, size_t *len)
{
    struct strbuf sb = STRBUF_INIT;
    struct metrics snap;
    size_t op, oc, b;
    uint64_t cumulative;

    /* Copy under the lock, format outside it: a slow scrape must not stall requests. */
    pthread_mutex_lock(&m->mu);
    memcpy(snap.requests, m->requests, sizeof snap.requests);
    memcpy(snap.bucket_counts, m->bucket_counts, sizeof snap.bucket_counts);
    memcpy(snap.count, m->count, sizeof snap.count);
    memcpy(snap.sum, m->sum, sizeof snap.sum);
    pthread_mutex_unlock(&m->mu);

    strbuf_adds(&sb, "# HELP orderd_requests_total HTTP requests by operation and idempotency "
                     "outcome.\n# TYPE orderd_requests_total counter\n");
    for (op = 0; op < NOPS; op++) {
        for (oc = 0; oc < NOUTCOMES; oc++) {
            strbuf_addf(&sb, "orderd_requests_total{operation=\"%s\",outcome=\"%s\"} %llu\n",
                        operations[op], outcomes[oc], (unsigned long long)snap.requests[op][oc]);
        }
    }
    strbuf_adds(&sb, "# HELP orderd_request_duration_seconds Time from the first byte of a "
                     "request to its response being queued.\n"
                     "# TYPE orderd_request_duration_seconds histogram\n");
    for (op = 0; op < NOPS; op++) {
        cumulative = 0;
        for (b = 0; b < NBUCKETS; b++) {
            cumulative += snap.bucket_counts[op][b];
            strbuf_addf(&sb,
                        "orderd_request_duration_seconds_bucket{operation=\"%s\",le=\"%s\"} "
                        "%llu\n",
                        operations[op], bucket_labels[b], (unsigned long long)cumulative);
        }
        strbuf_addf(&sb,
                    "orderd_request_duration_seconds_bucket{operation=\"%s\",le=\"+Inf\"} %llu\n",
                    operations[op], (unsigned long long)snap.count[op]);
        strbuf_addf(&sb, "orderd_request_duration_seconds_sum{operation=\"%s\"} %.6f\n",
                    operations[op], snap.sum[op]);
        strbuf_addf(&sb, "orderd_request_duration_seconds_count{operation=\"%s\"} %llu\n",
                    operations[op], (unsigned long long)snap.count[op]);
    }
    return strbuf_detach(&sb, len);
}
