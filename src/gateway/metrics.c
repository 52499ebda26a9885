/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c - idem-gateway's counters (metrics.h): a table of atomics per route and outcome, and
 * two latency histograms with the same buckets, rendered in the Prometheus text format; with a
 * shard set, the counters of each cluster, most of them its engine's (idem_engine_stats).
 */
#include "metrics.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "banned.h"

/* Upper bounds of the histogram buckets, in seconds (a loopback upstream to a slow one). */
static const double buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                 0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define NBUCKETS (sizeof buckets / sizeof buckets[0])

struct histogram {
    atomic_uint_fast64_t count[NBUCKETS + 1]; /* the last one is +Inf */
    atomic_uint_fast64_t sum_us;
};

struct gw_metrics {
    size_t nroutes;
    atomic_uint_fast64_t *counts; /* [(nroutes + 1) * GW_OUTCOME_COUNT] */
    struct histogram upstream, store;
    atomic_uint_fast64_t moving[IDEM_SHARDS_MAX]; /* 503s of a bucket moving, by cluster index */
};

static const char *const outcome_names[] = {
#define GW_OUTCOME_NAME(e, name) name,
    GW_OUTCOMES(GW_OUTCOME_NAME)
#undef GW_OUTCOME_NAME
};

enum gw_outcome gw_outcome_of(const char *name)
{
    for (int i = 0; name && i < GW_OUTCOME_COUNT; i++)
        if (strcmp(outcome_names[i], name) == 0)
            return (enum gw_outcome)i;
    return GW_OUTCOME_PASSED;
}

struct gw_metrics *gw_metrics_new(size_t nroutes)
{
    struct gw_metrics *m = xcalloc(1, sizeof *m);

    m->nroutes = nroutes;
    m->counts = xcalloc((nroutes + 1) * GW_OUTCOME_COUNT, sizeof *m->counts);
    return m;
}

void gw_metrics_free(struct gw_metrics *m)
{
    if (!m)
        return;
    free(m->counts);
    free(m);
}

void gw_metrics_count(struct gw_metrics *m, size_t route, enum gw_outcome o)
{
    if (route > m->nroutes)
        route = m->nroutes;
    atomic_fetch_add(&m->counts[route * GW_OUTCOME_COUNT + o], 1);
}

void gw_metrics_shard_moving(struct gw_metrics *m, size_t shard)
{
    if (m && shard < IDEM_SHARDS_MAX)
        atomic_fetch_add_explicit(&m->moving[shard], 1, memory_order_relaxed);
}

static void observe(struct histogram *h, double seconds)
{
    size_t i = 0;

    while (i < NBUCKETS && seconds > buckets[i])
        i++;
    atomic_fetch_add(&h->count[i], 1);
    atomic_fetch_add(&h->sum_us, (uint_fast64_t)(seconds * 1e6));
}

void gw_metrics_upstream(struct gw_metrics *m, double seconds)
{
    observe(&m->upstream, seconds);
}

void gw_metrics_store(struct gw_metrics *m, double seconds)
{
    observe(&m->store, seconds);
}

static void render_histogram(const struct histogram *h, const char *name, const char *help,
                             struct strbuf *out)
{
    uint64_t cum = 0;

    strbuf_addf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i <= NBUCKETS; i++) {
        cum += atomic_load(&h->count[i]);
        if (i < NBUCKETS)
            strbuf_addf(out, "%s_bucket{le=\"%g\"} %llu\n", name, buckets[i],
                        (unsigned long long)cum);
        else
            strbuf_addf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    strbuf_addf(out, "%s_sum %.6f\n%s_count %llu\n", name, (double)atomic_load(&h->sum_us) / 1e6,
                name, (unsigned long long)cum);
}

void gw_metrics_render(const struct gw_metrics *m, const char *const *operations,
                       struct strbuf *out)
{
    strbuf_adds(out, "# HELP idem_gateway_requests_total Requests by route operation and how "
                     "they ended.\n# TYPE idem_gateway_requests_total counter\n");
    for (size_t r = 0; r <= m->nroutes; r++) {
        const char *op = r < m->nroutes ? operations[r] : "";
        for (int o = 0; o < GW_OUTCOME_COUNT; o++) {
            uint64_t v = atomic_load(&m->counts[r * GW_OUTCOME_COUNT + (size_t)o]);
            /* Every (route, outcome) pair is listed, zeros too: rate() needs the series. */
            strbuf_addf(out, "idem_gateway_requests_total{operation=\"%s\",outcome=\"%s\"} %llu\n",
                        op, outcome_names[o], (unsigned long long)v);
        }
    }
    render_histogram(&m->upstream, "idem_gateway_upstream_seconds",
                     "Time from the first byte sent upstream to the end of its answer.", out);
    render_histogram(&m->store, "idem_gateway_store_seconds",
                     "Time to claim or look up a record in the store.", out);
}

/* One counter per cluster: `value(i)` of each, labelled with its name. */
static void render_per_shard(struct strbuf *out, const char *name, const char *help,
                             struct idem_shards *sh, const uint64_t *values)
{
    strbuf_addf(out, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (size_t i = 0; i < idem_shards_count(sh) && i < IDEM_SHARDS_MAX; i++)
        strbuf_addf(out, "%s{shard=\"%s\"} %llu\n", name, idem_shards_name(sh, i),
                    (unsigned long long)values[i]);
}

void gw_metrics_render_shards(const struct gw_metrics *m, struct idem_shards *sh,
                              struct idem_engine *const *engines, size_t nengines,
                              struct strbuf *out)
{
    uint64_t claims[IDEM_SHARDS_MAX] = {0}, answers[IDEM_SHARDS_MAX] = {0};
    uint64_t moved[IDEM_SHARDS_MAX] = {0};
    size_t n = idem_shards_count(sh);
    struct idem_shards_stats ss;

    /* A cluster the set opened that has no engine yet has done nothing here: zeros. */
    for (size_t i = 0; i < nengines && i < n && i < IDEM_SHARDS_MAX; i++) {
        struct idem_engine_stats es;
        idem_engine_stats(engines[i], &es);
        claims[i] = es.claims;
        answers[i] = es.answers;
        moved[i] = es.moved;
    }
    render_per_shard(out, "idem_gateway_shard_claims_total",
                     "Records claimed on each cluster (new keys, expired leases taken over).", sh,
                     claims);
    render_per_shard(out, "idem_gateway_shard_answers_total", "Answers stored on each cluster.", sh,
                     answers);
    strbuf_adds(out, "# HELP idem_gateway_shard_refused_total Requests answered 503 because their "
                     "bucket moved away from the cluster (moved: the cluster refused the write) "
                     "or is moving (moving: the map says so).\n"
                     "# TYPE idem_gateway_shard_refused_total counter\n");
    for (size_t i = 0; i < n && i < IDEM_SHARDS_MAX; i++) {
        const char *name = idem_shards_name(sh, i);
        strbuf_addf(out, "idem_gateway_shard_refused_total{shard=\"%s\",reason=\"moved\"} %llu\n",
                    name, (unsigned long long)moved[i]);
        strbuf_addf(out, "idem_gateway_shard_refused_total{shard=\"%s\",reason=\"moving\"} %llu\n",
                    name, (unsigned long long)atomic_load(&m->moving[i]));
    }
    idem_shards_stats(sh, &ss);
    strbuf_addf(out,
                "# HELP idem_gateway_shard_map_refreshes_total Maps read again from the shard "
                "directory and taken.\n# TYPE idem_gateway_shard_map_refreshes_total counter\n"
                "idem_gateway_shard_map_refreshes_total %llu\n"
                "# HELP idem_gateway_shard_map_refresh_errors_total Reads of the map that failed "
                "(the old map is kept).\n"
                "# TYPE idem_gateway_shard_map_refresh_errors_total counter\n"
                "idem_gateway_shard_map_refresh_errors_total %llu\n"
                "# HELP idem_gateway_shard_clusters Clusters of the shard set open.\n"
                "# TYPE idem_gateway_shard_clusters gauge\nidem_gateway_shard_clusters %llu\n",
                (unsigned long long)ss.refreshes, (unsigned long long)ss.refresh_errors,
                (unsigned long long)ss.clusters);
}
