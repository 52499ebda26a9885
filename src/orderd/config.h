/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.h - everything `orderd serve` can be told on its command line, in one struct that is
 * filled once by main.c and then passed down read-only.  Keeping it explicit (no global server
 * struct) means every function shows in its signature what configuration it depends on.
 */
#ifndef ORDERD_CONFIG_H
#define ORDERD_CONFIG_H

#include <stdint.h>

#include "idem/idem.h"
#include "http_server.h"
#include "log.h"

#define ORDERD_DEFAULT_LISTEN "127.0.0.1:8080"
#define ORDERD_DEFAULT_DB "sqlite:./var/orderd.db"
#define ORDERD_DEFAULT_POOL 16
#define ORDERD_DEFAULT_TTL_MS (24LL * 3600 * 1000)
#define ORDERD_DEFAULT_LEASE_MS 10000
#define ORDERD_DEFAULT_WAIT_MS 2000
#define ORDERD_DEFAULT_SWEEP_S 60
#define ORDERD_DEFAULT_REPLAY_CACHE_MB 8
#define ORDERD_DEFAULT_PROVIDER_TIMEOUT_MS 5000
#define ORDERD_DEFAULT_WEBHOOK_TOLERANCE_S 300
#define ORDERD_DEFAULT_COMPLETER_MS 1000
#define ORDERD_DEFAULT_RECONCILER_MS 1000
#define ORDERD_DEFAULT_RECONCILE_AFTER_MS 2000
#define ORDERD_DEFAULT_OUTBOX_MS 250
#define ORDERD_DEFAULT_OUTBOX_ATTEMPTS 10
#define ORDERD_DEFAULT_OUTBOX_BACKOFF_MAX_MS 60000
#define ORDERD_DEFAULT_OUTBOX_RETENTION_S (7LL * 86400)
#define ORDERD_DEFAULT_INBOX_RETENTION_S (30LL * 86400)
#define ORDERD_MIN_INBOX_RETENTION_S 3600

struct orderd_config {
    const char *listen;         /* "HOST:PORT", "[V6]:PORT"; port 0 picks a free one */
    const char *metrics_listen; /* GET /metrics on its own listener; NULL: on `listen` */
    const char *db;             /* store URI: "sqlite:PATH", "postgresql://...", "shards:URI" */
    const char *catalogue;      /* with shards: the store of users, tokens and products */
    int db_pool;                /* store connections */
    enum idem_sync sync;        /* SQLite durability */
    enum log_format log_format;
    int64_t lease_ms;     /* lease of every operation */
    int64_t wait_ms;      /* how long a duplicate waits for the first request */
    int sweep_interval_s; /* pause between retention sweeps; 0 disables the sweeper */
    int replay_cache_mb;  /* libidem's replay cache (MiB); 0 disables it */
    int test_hooks;       /* ORDERD_TEST_HOOKS=1 at start: X-Test-* headers are honoured */
    /* --idempotency off: POST /api/orders without libidem's record, the baseline of
     * docs/bench.md.  A benchmark knob only: retries are then NOT safe. */
    int idempotency_off;

    /* Payments (docs/orderd.md): without a provider, orders are not charged ("created"). */
    const char *provider;          /* base URL of the provider; NULL: no payments */
    const char *provider_ca;       /* PEM CAs of an https:// provider; NULL: the system's */
    int64_t provider_timeout_ms;   /* one provider call, connect included */
    const char *webhook_secret;    /* HMAC key of provider webhooks; NULL: all refused (401) */
    int64_t webhook_tolerance_s;   /* accepted age of a webhook's signature timestamp */
    int64_t completer_interval_ms; /* background workers: pause between runs, 0 disables */
    int64_t reconciler_interval_ms;
    int64_t reconcile_after_ms; /* an unknown outcome waits this long for the client's retry */
    int64_t outbox_interval_ms;
    int outbox_max_attempts;       /* a message is parked after this many failed deliveries */
    int64_t outbox_backoff_max_ms; /* the cap of the relay's exponential backoff */
    int64_t outbox_retention_s;    /* sent messages are swept this long after sending; 0: kept */
    int64_t inbox_retention_s;     /* inbox entries (the dedupe of provider events); 0: kept */

    struct http_limits http; /* --max-connections, --head-timeout-ms...; 0: the default */
};

#endif /* ORDERD_CONFIG_H */
