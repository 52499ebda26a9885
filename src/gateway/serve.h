/* SPDX-License-Identifier: Apache-2.0 */
/*
 * serve.h - `idem-gateway serve`: open the store, make the engine, listen on the public and the
 * admin addresses, sweep expired records in the background, stop on SIGINT / SIGTERM.
 */
#ifndef IDEM_GATEWAY_SERVE_H
#define IDEM_GATEWAY_SERVE_H

#include "config.h"
#include "log.h"

struct serve_options {
    enum log_format log_format;
    int sweep_interval_s; /* 0: no sweeps */
    int replay_cache_mb;  /* 0: no replay cache */
    int db_pool;          /* store connections */
};

struct tls_ctx;

/*
 * The TLS context of an https upstream (cfg->upstream_tls): its CA file or the system's store,
 * the name to verify, the client certificate; every file read now.  Returns 0 with *out (new:
 * tls_ctx_free), or -1 with a sentence in `err`.  check-config and serve both make it.
 */
int serve_upstream_tls(const struct gw_config *cfg, struct tls_ctx **out, char *err, size_t errlen);

/* Runs until a stop signal; returns the process's exit status. */
int serve_run(const struct gw_config *cfg, const struct serve_options *so);

#endif /* IDEM_GATEWAY_SERVE_H */
