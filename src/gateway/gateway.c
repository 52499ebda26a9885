/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gateway.c - the routes' libidem operations (gateway.h), for the proxy, the admin listener and
 * the command line alike.
 */
#include "gateway.h"

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
