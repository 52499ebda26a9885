/*
 * prom.h - Prometheus text for what libidem counts, written alike by orderd and idem-gateway
 * under their own metric prefix.  Part of idem_util (src/util/).
 */
#ifndef IDEM_UTIL_PROM_H
#define IDEM_UTIL_PROM_H

struct idem_engine;
struct strbuf;

/*
 * The engine's replay cache (idem_engine_cache_stats): PREFIX_replay_cache_lookups_total{result=
 * "hit"|"miss"}, PREFIX_replay_cache_evictions_total, PREFIX_replay_cache_bytes and
 * PREFIX_replay_cache_max_bytes (0 when the cache is off).
 */
void prom_replay_cache(struct strbuf *sb, const char *prefix, struct idem_engine *eng);

#endif /* IDEM_UTIL_PROM_H */
