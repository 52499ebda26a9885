/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prom.h - Prometheus text for what libidem counts, written alike by orderd and idem-gateway
 * under their own metric prefix.  Part of idem_http (src/http/).
 */
#ifndef IDEM_HTTP_PROM_H
#define IDEM_HTTP_PROM_H

#include <stddef.h>

struct idem_engine;
struct idem_store;
struct strbuf;

/*
 * The engine's replay cache (idem_engine_cache_stats): PREFIX_replay_cache_lookups_total{result=
 * "hit"|"miss"}, PREFIX_replay_cache_evictions_total, PREFIX_replay_cache_bytes and
 * PREFIX_replay_cache_max_bytes (0 when the cache is off).
 */
void prom_replay_cache(struct strbuf *sb, const char *prefix, struct idem_engine *eng);

/*
 * The store's commits (idem_store_stats): PREFIX_store_write_commits_total,
 * PREFIX_store_durable_commits_total and PREFIX_store_durable_commit_seconds_total (their rate
 * ratio is the mean time a durable commit takes: what every write waits at least), and
 * PREFIX_store_writer_busy_seconds_total (SQLite's one writer held: the serial part of writes).
 */
void prom_store(struct strbuf *sb, const char *prefix, const struct idem_store *st);

/* The most clusters the *_shards calls below render (more are left out). */
#define PROM_SHARDS_MAX 64

/*
 * The same for the `n` clusters of a shard set: each sample labelled shard="NAME" (shards[i],
 * borrowed), each family's HELP and TYPE once.
 */
void prom_replay_cache_shards(struct strbuf *sb, const char *prefix, size_t n,
                              const char *const *shards, struct idem_engine *const *engines);
void prom_store_shards(struct strbuf *sb, const char *prefix, size_t n, const char *const *shards,
                       const struct idem_store *const *st);

#endif /* IDEM_HTTP_PROM_H */
