/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prom.c - Prometheus text for what libidem counts (prom.h).
 */
#include "prom.h"

#include <stdint.h>

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

void prom_replay_cache(struct strbuf *sb, const char *prefix, struct idem_engine *eng)
{
    struct idem_cache_stats st;

    idem_engine_cache_stats(eng, &st);
    family(sb, prefix, "replay_cache_lookups_total", "counter",
           "Lookups of the replay cache: hit (answered from memory), miss (the store was asked).");
    sample(sb, prefix, "replay_cache_lookups_total", "{result=\"hit\"}", st.hits);
    sample(sb, prefix, "replay_cache_lookups_total", "{result=\"miss\"}", st.misses);
    family(sb, prefix, "replay_cache_evictions_total", "counter",
           "Entries dropped from the replay cache to make room.");
    sample(sb, prefix, "replay_cache_evictions_total", "", st.evictions);
    family(sb, prefix, "replay_cache_bytes", "gauge", "Bytes the replay cache holds now.");
    sample(sb, prefix, "replay_cache_bytes", "", st.bytes);
    family(sb, prefix, "replay_cache_max_bytes", "gauge", "The replay cache's bound (0: off).");
    sample(sb, prefix, "replay_cache_max_bytes", "", st.max_bytes);
}

void prom_store(struct strbuf *sb, const char *prefix, const struct idem_store *st)
{
    struct idem_store_stats stats;

    idem_store_stats(st, &stats);
    family(sb, prefix, "store_write_commits_total", "counter",
           "Write transactions committed, each acknowledged once durable.");
    sample(sb, prefix, "store_write_commits_total", "", stats.write_commits);
    family(sb, prefix, "store_durable_commits_total", "counter",
           "Durable commits that carried them (SQLite group commit: one per batch).");
    sample(sb, prefix, "store_durable_commits_total", "", stats.durable_commits);
    family(sb, prefix, "store_durable_commit_seconds_total", "counter",
           "Time spent in those durable commits (SQLite: COMMIT with its fsync; PostgreSQL: the "
           "COMMIT round trip).");
    strbuf_addf(sb, "%s_store_durable_commit_seconds_total %.6f\n", prefix,
                (double)stats.durable_commit_ns / 1e9);
    family(sb, prefix, "store_writer_busy_seconds_total", "counter",
           "Time the store's one writer connection was held (SQLite: statements and COMMITs, the "
           "serial part of every write; 0 on PostgreSQL).");
    strbuf_addf(sb, "%s_store_writer_busy_seconds_total %.6f\n", prefix,
                (double)stats.writer_busy_ns / 1e9);
}
