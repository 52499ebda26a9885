/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gateway.c - the routes' libidem operations (gateway.h), for the proxy, the admin listener and
 * the command line alike, and the engine of a record's principal when the store is a shard set.
 */
#include "gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "banned.h"

struct idem_operation *gateway_ops_new(const struct gw_config *cfg)
{
    struct idem_operation *ops = xcalloc(cfg->nroutes + 1, sizeof *ops);

    for (size_t i = 0; i < cfg->nroutes; i++) {
        const struct gw_route *r = &cfg->routes[i];
        ops[i].name = r->operation;
        ops[i].ttl_ms = r->retention_ms;
        ops[i].lease_ms = r->lease_ms;
        /* 0 would mean "the default" to the engine; the config's minimum is 1 ms. */
        ops[i].wait_ms = r->wait_ms > 0 ? r->wait_ms : 1;
        ops[i].stored_headers = (const char *const *)r->store_headers;
        ops[i].nstored_headers = r->nstore_headers;
        /* Durable before a byte goes upstream: a crash from then on leaves "forwarded". */
        ops[i].claim_point = GW_POINT_FORWARDED;
    }
    return ops;
}

const struct idem_operation *gateway_op(const struct gateway *gw, const struct gw_route *route)
{
    return &gw->ops[route - gw->cfg->routes];
}

/*
 * Makes an engine for each cluster the set opened since the last call (a map that named a new
 * one): off the hot path, which only compares a cluster's index with nengines.
 */
static void engines_grow(struct gateway *gw)
{
    size_t n;

    pthread_mutex_lock(&gw->engines_mu);
    n = atomic_load(&gw->nengines);
    while (n < idem_shards_count(gw->shards) && n < IDEM_SHARDS_MAX) {
        struct idem_store *st = idem_shards_store(gw->shards, n);
        if (idem_engine_new(st, &gw->engine_opts, &gw->engines[n]) < 0)
            break; /* out of memory: the next request of the cluster tries again */
        gw->stores[n] = st;
        atomic_store(&gw->nengines, ++n); /* the slot is whole */
    }
    pthread_mutex_unlock(&gw->engines_mu);
}

struct idem_engine *gateway_engine(struct gateway *gw, const char *principal, int may_block)
{
    size_t i = 0;
    int rc;

    if (!gw->shards)
        return gw->engine;
    if (atomic_load(&gw->map_stale)) {
        if (!may_block)
            return NULL;
        /* Cleared first: a refusal after this read marks it again. */
        atomic_store(&gw->map_stale, 0);
        if (idem_shards_refresh(gw->shards) < 0)
            atomic_store(&gw->map_stale, 1);
        engines_grow(gw);
    }
    rc = idem_shards_route(gw->shards, principal, &i);
    /* The hot path: one load (acquire: the engine below the count is whole). */
    if (rc == 0 && i < atomic_load_explicit(&gw->nengines, memory_order_acquire))
        return gw->engines[i];
    if (rc == 0)
        engines_grow(gw); /* a cluster another call's refresh opened */
    if (rc < 0 || i >= atomic_load(&gw->nengines)) {
        if (rc == IDEM_EMOVED && may_block)
            gw_metrics_shard_moving(gw->metrics, i); /* the caller answers 503 */
        gateway_store_failed(gw, rc); /* moving: read the map until the move has ended */
        return NULL;
    }
    return gw->engines[i];
}

void gateway_store_failed(struct gateway *gw, int rc)
{
    if (gw->shards && rc == IDEM_EMOVED)
        atomic_store(&gw->map_stale, 1);
}

int gateway_stores_open(struct gateway *gw, const char *uri, const struct idem_store_options *so,
                        const struct idem_engine_options *eo, char *err, size_t errlen)
{
    char *errmsg = NULL;
    size_t slots = 1;
    int rc;

    pthread_mutex_init(&gw->engines_mu, NULL);
    if (eo)
        gw->engine_opts = *eo;
    if (strncmp(uri, "shards:", 7) == 0) {
        rc = idem_shards_open(uri + 7, so, &gw->shards, &errmsg);
        if (rc == 0)
            gw->nengines = idem_shards_count(gw->shards);
        slots = IDEM_SHARDS_MAX; /* clusters added later take the free ones */
    } else {
        rc = idem_store_open(uri, so, &gw->store, &errmsg);
        gw->nengines = 1;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s", errmsg ? errmsg : idem_strerror(rc));
        idem_free(errmsg);
        gw->nengines = 0;
        return -1;
    }
    gw->engines = xcalloc(slots, sizeof *gw->engines);
    gw->stores = xcalloc(slots, sizeof *gw->stores);
    for (size_t i = 0; i < gw->nengines; i++) {
        struct idem_store *st = gw->shards ? idem_shards_store(gw->shards, i) : gw->store;
        gw->stores[i] = st;
        rc = idem_engine_new(st, eo, &gw->engines[i]);
        if (rc < 0) {
            snprintf(err, errlen, "cannot make the engine: %s", idem_strerror(rc));
            return -1;
        }
    }
    if (gw->shards)
        gw->store = idem_shards_store(gw->shards, 0);
    gw->engine = gw->engines[0];
    return 0;
}

void gateway_stores_close(struct gateway *gw)
{
    for (size_t i = 0; gw->engines && i < gw->nengines; i++)
        idem_engine_free(gw->engines[i]);
    free(gw->engines);
    free(gw->stores);
    gw->stores = NULL;
    if (gw->shards)
        idem_shards_close(gw->shards);
    else
        idem_store_close(gw->store);
    gw->engines = NULL;
    gw->nengines = 0;
    gw->shards = NULL;
    gw->store = NULL;
    gw->engine = NULL;
    pthread_mutex_destroy(&gw->engines_mu);
}
