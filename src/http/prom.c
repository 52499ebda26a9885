/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prom.c - Prometheus text for what libidem counts (prom.h).
 */
#include "prom.h"

#include <stdint.h>
#include <stdio.h>

#include "idem/idem.h"

#include "strbuf.h"
#include "banned.h"

/* A family's HELP and TYPE lines. */
static void family(struct strbuf *sb, const char *prefix, const char *name, const char *type,
                   const char *help)
{
    strbuf_addf(sb, "# HELP %s_%s %s\n# TYPE %s_%s %s\n", prefix, name, help, prefix, name, type);
}

/* One sample of `name`, with `labels` ("" or "{...}"). */
static void sample(struct strbuf *sb, const char *prefix, const char *name, const char *labels,
                   uint64_t value)
{
    strbuf_addf(sb, "%s_%s%s %llu\n", prefix, name, labels, (unsigned long long)value);
}

/*
 * The labels of sample i: `shard="NAME"` when there are shard names, then `more` ("" or
 * `result="hit"`), as "" or "{...}".
 */
static void labels(char *out, size_t cap, const char *const *shards, size_t i, const char *more)
{
    const char *sep = shards != NULL && more[0] != '\0' ? "," : "";

    if (shards == NULL && more[0] == '\0')
        snprintf(out, cap, "%s", "");
    else if (shards == NULL)
        snprintf(out, cap, "{%s}", more);
    else
        snprintf(out, cap, "{shard=\"%s\"%s%s}", shards[i], sep, more);
}

static void replay_caches(struct strbuf *sb, const char *prefix, size_t n,
                          const char *const *shards, struct idem_engine *const *engines)
{
    struct idem_cache_stats st[PROM_SHARDS_MAX];
    char l[128];
    size_t i;

    if (n > PROM_SHARDS_MAX)
        n = PROM_SHARDS_MAX;
    for (i = 0; i < n; i++)
        idem_engine_cache_stats(engines[i], &st[i]);
    family(sb, prefix, "replay_cache_lookups_total", "counter",
           "Lookups of the replay cache: hit (answered from memory), miss (the store was asked).");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "result=\"hit\"");
        sample(sb, prefix, "replay_cache_lookups_total", l, st[i].hits);
        labels(l, sizeof l, shards, i, "result=\"miss\"");
        sample(sb, prefix, "replay_cache_lookups_total", l, st[i].misses);
    }
    family(sb, prefix, "replay_cache_evictions_total", "counter",
           "Entries dropped from the replay cache to make room.");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        sample(sb, prefix, "replay_cache_evictions_total", l, st[i].evictions);
    }
    family(sb, prefix, "replay_cache_bytes", "gauge", "Bytes the replay cache holds now.");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        sample(sb, prefix, "replay_cache_bytes", l, st[i].bytes);
    }
    family(sb, prefix, "replay_cache_max_bytes", "gauge", "The replay cache's bound (0: off).");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        sample(sb, prefix, "replay_cache_max_bytes", l, st[i].max_bytes);
    }
}

void prom_replay_cache(struct strbuf *sb, const char *prefix, struct idem_engine *eng)
{
    replay_caches(sb, prefix, 1, NULL, &eng);
}

void prom_replay_cache_shards(struct strbuf *sb, const char *prefix, size_t n,
                              const char *const *shards, struct idem_engine *const *engines)
{
    replay_caches(sb, prefix, n, shards, engines);
}

static void stores(struct strbuf *sb, const char *prefix, size_t n, const char *const *shards,
                   const struct idem_store *const *st)
{
    struct idem_store_stats stats[PROM_SHARDS_MAX];
    char l[128];
    size_t i;

    if (n > PROM_SHARDS_MAX)
        n = PROM_SHARDS_MAX;
    for (i = 0; i < n; i++)
        idem_store_stats(st[i], &stats[i]);
    family(sb, prefix, "store_write_commits_total", "counter",
           "Write transactions committed, each acknowledged once durable.");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        sample(sb, prefix, "store_write_commits_total", l, stats[i].write_commits);
    }
    family(sb, prefix, "store_durable_commits_total", "counter",
           "Durable commits that carried them (SQLite group commit: one per batch).");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        sample(sb, prefix, "store_durable_commits_total", l, stats[i].durable_commits);
    }
    family(sb, prefix, "store_durable_commit_seconds_total", "counter",
           "Time spent in those durable commits (SQLite: COMMIT with its fsync; PostgreSQL: the "
           "COMMIT round trip).");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        strbuf_addf(sb, "%s_store_durable_commit_seconds_total%s %.6f\n", prefix, l,
                    (double)stats[i].durable_commit_ns / 1e9);
    }
    family(sb, prefix, "store_writer_busy_seconds_total", "counter",
           "Time the store's one writer connection was held (SQLite: statements and COMMITs, the "
           "serial part of every write; 0 on PostgreSQL).");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        strbuf_addf(sb, "%s_store_writer_busy_seconds_total%s %.6f\n", prefix, l,
                    (double)stats[i].writer_busy_ns / 1e9);
    }
    family(sb, prefix, "store_round_trips_total", "counter",
           "Round trips to the database server, each any number of statements (PostgreSQL; 0 on "
           "SQLite).");
    for (i = 0; i < n; i++) {
        labels(l, sizeof l, shards, i, "");
        sample(sb, prefix, "store_round_trips_total", l, stats[i].round_trips);
    }
}

void prom_store(struct strbuf *sb, const char *prefix, const struct idem_store *st)
{
    stores(sb, prefix, 1, NULL, &st);
}

void prom_store_shards(struct strbuf *sb, const char *prefix, size_t n, const char *const *shards,
                       const struct idem_store *const *st)
{
    stores(sb, prefix, n, shards, st);
}
