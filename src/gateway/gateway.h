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
    struct idem_store *store;
    struct idem_engine *engine;
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

/* The operation of `route` (one of gw->cfg->routes). */
const struct idem_operation *gateway_op(const struct gateway *gw, const struct gw_route *route);

#endif /* IDEM_GATEWAY_GATEWAY_H */
