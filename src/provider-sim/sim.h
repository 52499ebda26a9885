/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim.h - provider-sim's configuration and its context: what the command line said, and what every
 * request handler may use (the store, the idempotency engine, the fault settings, the webhook
 * sender, the counters of the ledger).  Built once by main.c and passed down explicitly.
 */
#ifndef SIM_SIM_H
#define SIM_SIM_H

#include <stdatomic.h>
#include <stdint.h>

#include "idem/idem.h"

#include "faults.h"
#include "http_server.h"

#define SIM_DEFAULT_LISTEN "127.0.0.1:8090"
#define SIM_DEFAULT_DB "sqlite:./var/provider-sim.db"
/* The simulator has one merchant account: every Idempotency-Key is scoped to it. */
#define SIM_PRINCIPAL "acct_sim"

struct sim_config {
    const char *listen;
    const char *db;
    const char *webhook_url;    /* NULL: events are recorded, not delivered */
    const char *webhook_secret; /* signs deliveries; required with webhook_url */
    int64_t webhook_backoff_max_ms;
    int64_t webhook_timeout_ms;
    struct fault_settings faults;
    /*
     * Who may read or change the faults at run time (/v1/faults): "loopback" (the default: any
     * 127.0.0.0/8 or ::1 client), "any", or a comma-separated list of client addresses.
     */
    const char *faults_from;
    struct http_limits http; /* --max-connections, --head-timeout-ms...; 0: the default */
};

/* What the ledger reports about requests since start (the effects are in the database). */
struct sim_counters {
    atomic_ullong posts;     /* POSTs to /v1/charges, /v1/refunds, /v1/emails */
    atomic_ullong executed;  /* of which ran their effect now */
    atomic_ullong replayed;  /* answered from the stored response */
    atomic_ullong failed;    /* answered 503 by the fail_rate fault, nothing run */
    atomic_ullong lost;      /* effect committed (or replayed), then the connection closed */
    atomic_ullong declined;  /* tok_declined charges */
    atomic_ullong conflicts; /* 409 in progress and 422 key reused */
};

struct webhooks;

struct sim {
    const struct sim_config *cfg;
    struct idem_store *store;
    struct idem_engine *engine;
    struct faults faults;
    struct webhooks *webhooks; /* NULL without --webhook-url */
    struct sim_counters counters;

    struct idem_operation op_charges;
    struct idem_operation op_refunds;
    struct idem_operation op_emails;
};

#endif /* SIM_SIM_H */
