/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gateway.h - what one idem-gateway process holds while it serves: the config, the store and the
 * engine over it, the upstream client, the principal verifier, one libidem operation per route,
 * the log and the metrics.  Made by serve.c, read by every request (proxy.c) and by the admin
 * listener (admin.c); nothing in it changes while requests run (steps_mu guards only what a
 * request's store step hands back).
 */
#ifndef IDEM_GATEWAY_GATEWAY_H
#define IDEM_GATEWAY_GATEWAY_H

#include <pthread.h>
#include <stdatomic.h>

#include "idem/idem.h"

#include "config.h"
#include "http_server.h"
#include "log.h"
#include "metrics.h"
#include "principal.h"
#include "quota.h"
#include "upstream.h"

/*
 * Recovery points of a gateway record (docs/gateway.md, "Records"): a claim is committed at
 * `forwarded` before a byte goes upstream; `unknown` once the forward ended without an answer.
 */
#define GW_POINT_FORWARDED "forwarded"
#define GW_POINT_UNKNOWN "unknown"

struct gateway {
    const struct gw_config *cfg;
    struct idem_store *store;   /* with shards: the first cluster's */
    struct idem_engine *engine; /* engines[0] */
    /*
     * A store of "shards:URI" is a shard set (docs/shards.md): an engine per cluster, each
     * record on the cluster of its principal.  One store: no set, and engines[0] is `engine`.
     * A cluster the set opens while the gateway runs gets its engine in the next slot, made
     * whole before nengines grows past it (under engines_mu), so readers take no lock.
     */
    struct idem_shards *shards;
    struct idem_engine **engines; /* IDEM_SHARDS_MAX slots with shards, else one */
    struct idem_store **stores;   /* stores[i] is engines[i]'s */
    _Atomic size_t nengines;
    _Atomic int map_stale;      /* a write was refused (IDEM_EMOVED): the map is read again */
    pthread_mutex_t engines_mu; /* one grower of engines at a time */
    struct idem_engine_options engine_opts; /* what makes a new cluster's engine */
    struct upstream *upstream;
    struct principal_verifier *principals;
    struct idem_operation *ops; /* ops[i] is cfg->routes[i]'s operation */
    struct logger log;
    struct gw_metrics *metrics;
    struct unrouted *unrouted; /* requests with a key on no route: warned, counted, refused */
    struct quota *quota;       /* what each caller may make it keep (principal_limits) */
    struct http_server *public_server; /* the proxy's listener, for its counters in /metrics */
    /*
     * A fresh key's store steps run on the store's thread (proxy.c, "a fresh key on the event
     * loop"); they hand their result to the request's loop under steps_mu, and steps_cv wakes
     * a stop that waits for one.
     */
    pthread_mutex_t steps_mu;
    pthread_cond_t steps_cv;
};

/*
 * One libidem operation per route of `cfg`, its policy (retention, lease, wait, stored headers)
 * from the config, which must outlive them; each claims at GW_POINT_FORWARDED.  New: free().
 */
struct idem_operation *gateway_ops_new(const struct gw_config *cfg);

/*
 * The engine of the cluster that holds the records of `principal` (the record's: the caller's
 * with its route's scope headers): gw->engine with one store.  NULL when the principal's bucket
 * is moving (answer 503), or when the map is known to be stale and `may_block` is 0 (an event
 * loop: hand the request to a worker, whose call reads the map again first).
 */
struct idem_engine *gateway_engine(struct gateway *gw, const char *principal, int may_block);

/*
 * Opens the store the config names (`uri`, cfg->store), or the shard set of a "shards:URI"
 * store, with an engine on each (`eo`): sets gw->store, engine, shards, engines and nengines.
 * Returns 0, or -1 with `err` saying why.  gateway_stores_close() undoes it, also a half-open.
 */
int gateway_stores_open(struct gateway *gw, const char *uri, const struct idem_store_options *so,
                        const struct idem_engine_options *eo, char *err, size_t errlen);
void gateway_stores_close(struct gateway *gw);

/* After a store call of a record failed with `rc`: IDEM_EMOVED marks the map stale. */
void gateway_store_failed(struct gateway *gw, int rc);

/* The operation of `route` (one of gw->cfg->routes). */
const struct idem_operation *gateway_op(const struct gateway *gw, const struct gw_route *route);

#endif /* IDEM_GATEWAY_GATEWAY_H */
