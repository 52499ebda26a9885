/* SPDX-License-Identifier: Apache-2.0 */
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
    "orders.create", "orders.cancel",     "profile.update", "orders.list", "orders.get",
    "healthz",       "webhooks.provider", "metrics",        "other",
};
#define NOPS (sizeof operations / sizeof operations[0])
#define OP_OTHER (NOPS - 1)

static const char *const outcomes[] = {
    "executed", "replayed", "mismatch", "waited", "in_progress",
    "unknown",  "none",     "rejected", "error",
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

    int worker_up[WORKER_COUNT];
    int64_t worker_interval_ms[WORKER_COUNT];
    uint64_t worker_runs[WORKER_COUNT];
    uint64_t worker_items[WORKER_COUNT];
    uint64_t worker_failures[WORKER_COUNT];
    int64_t worker_last_ms[WORKER_COUNT];
    uint64_t provider_calls[PCALL_COUNT][3];
    uint64_t webhooks[WEBHOOK_COUNT];
    uint64_t orphans[ORPHAN_COUNT];
};

static const char *const worker_names[WORKER_COUNT] = {"completer", "reconciler", "outbox",
                                                       "sweeper"};
static const char *const pcall_names[PCALL_COUNT] = {"charge", "refund", "email", "lookup"};
static const char *const presult_names[3] = {"ok", "refused", "unknown"};
static const char *const webhook_names[WEBHOOK_COUNT] = {"applied", "ignored", "duplicate",
                                                         "rejected"};
static const char *const orphan_names[ORPHAN_COUNT] = {"paid", "declined", "unknown"};

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

const char *worker_name(enum worker_id w)
{
    return (unsigned)w < WORKER_COUNT ? worker_names[w] : "other";
}

void metrics_worker_up(struct metrics *m, enum worker_id w, int up, int64_t interval_ms)
{
    if ((unsigned)w >= WORKER_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->worker_up[w] = up;
    m->worker_interval_ms[w] = interval_ms;
    pthread_mutex_unlock(&m->mu);
}

void metrics_worker_run(struct metrics *m, enum worker_id w, uint64_t items, int failed)
{
    if ((unsigned)w >= WORKER_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->worker_runs[w]++;
    m->worker_items[w] += items;
    if (failed)
        m->worker_failures[w]++;
    m->worker_last_ms[w] = clock_wall_ms();
    pthread_mutex_unlock(&m->mu);
}

void metrics_provider(struct metrics *m, enum provider_call c, int outcome)
{
    if ((unsigned)c >= PCALL_COUNT || outcome < 0 || outcome > 2)
        return;
    pthread_mutex_lock(&m->mu);
    m->provider_calls[c][outcome]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_webhook(struct metrics *m, enum webhook_result r)
{
    if ((unsigned)r >= WEBHOOK_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->webhooks[r]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_orphan_payment(struct metrics *m, enum orphan_result r)
{
    if ((unsigned)r >= ORPHAN_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->orphans[r]++;
    pthread_mutex_unlock(&m->mu);
}

/* A counter family with one label: `name`{`label`="names[i]"} values[i], for i < n. */
static void counters(struct strbuf *sb, const char *name, const char *help, const char *label,
                     const char *const *names, const uint64_t *values, size_t n)
{
    strbuf_addf(sb, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (size_t i = 0; i < n; i++)
        strbuf_addf(sb, "%s{%s=\"%s\"} %llu\n", name, label, names[i],
                    (unsigned long long)values[i]);
}

/* The worker, provider and webhook series of a snapshot. */
static void render_background(struct strbuf *sb, const struct metrics *snap)
{
    size_t w, c, r;

    strbuf_adds(sb, "# HELP orderd_worker_up Whether the background worker runs (1) or is "
                    "disabled (0).\n# TYPE orderd_worker_up gauge\n");
    for (w = 0; w < WORKER_COUNT; w++)
        strbuf_addf(sb, "orderd_worker_up{worker=\"%s\"} %d\n", worker_names[w],
                    snap->worker_up[w]);
    strbuf_adds(sb, "# HELP orderd_worker_interval_seconds Pause between runs of the worker.\n"
                    "# TYPE orderd_worker_interval_seconds gauge\n");
    for (w = 0; w < WORKER_COUNT; w++)
        strbuf_addf(sb, "orderd_worker_interval_seconds{worker=\"%s\"} %.3f\n", worker_names[w],
                    (double)snap->worker_interval_ms[w] / 1000.0);
    counters(sb, "orderd_worker_runs_total", "Runs of the worker (one bounded batch each).",
             "worker", worker_names, snap->worker_runs, WORKER_COUNT);
    counters(sb, "orderd_worker_items_total",
             "Records settled (completer, reconciler), messages sent (outbox), records deleted "
             "(sweeper).",
             "worker", worker_names, snap->worker_items, WORKER_COUNT);
    counters(sb, "orderd_worker_failures_total", "Runs that stopped on an error.", "worker",
             worker_names, snap->worker_failures, WORKER_COUNT);
    strbuf_adds(sb, "# HELP orderd_worker_last_run_timestamp_seconds When the worker last ran "
                    "(0: never).\n# TYPE orderd_worker_last_run_timestamp_seconds gauge\n");
    for (w = 0; w < WORKER_COUNT; w++)
        strbuf_addf(sb, "orderd_worker_last_run_timestamp_seconds{worker=\"%s\"} %.3f\n",
                    worker_names[w], (double)snap->worker_last_ms[w] / 1000.0);
    strbuf_adds(sb, "# HELP orderd_provider_calls_total Calls to the payment and email provider "
                    "by outcome.\n# TYPE orderd_provider_calls_total counter\n");
    for (c = 0; c < PCALL_COUNT; c++)
        for (r = 0; r < 3; r++)
            strbuf_addf(sb, "orderd_provider_calls_total{call=\"%s\",outcome=\"%s\"} %llu\n",
                        pcall_names[c], presult_names[r],
                        (unsigned long long)snap->provider_calls[c][r]);
    counters(sb, "orderd_webhooks_total", "Provider webhooks by what became of them.", "result",
             webhook_names, snap->webhooks, WEBHOOK_COUNT);
    counters(sb, "orderd_orphan_payments_total",
             "Orders whose record was swept while their payment was unknown, settled from the "
             "order row by the reconciler.",
             "result", orphan_names, snap->orphans, ORPHAN_COUNT);
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
    memcpy(snap.worker_up, m->worker_up, sizeof snap.worker_up);
    memcpy(snap.worker_interval_ms, m->worker_interval_ms, sizeof snap.worker_interval_ms);
    memcpy(snap.worker_runs, m->worker_runs, sizeof snap.worker_runs);
    memcpy(snap.worker_items, m->worker_items, sizeof snap.worker_items);
    memcpy(snap.worker_failures, m->worker_failures, sizeof snap.worker_failures);
    memcpy(snap.worker_last_ms, m->worker_last_ms, sizeof snap.worker_last_ms);
    memcpy(snap.provider_calls, m->provider_calls, sizeof snap.provider_calls);
    memcpy(snap.webhooks, m->webhooks, sizeof snap.webhooks);
    memcpy(snap.orphans, m->orphans, sizeof snap.orphans);
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
    render_background(&sb, &snap);
    return strbuf_detach(&sb, len);
}
