/* SPDX-License-Identifier: Apache-2.0 */
/*
 * route.h - which configured route a request is on: its method, and its path split into segments
 * against the route's template ("/v1/orders/{id}/refunds"), a {name} segment taking any one
 * non-empty segment as the value of that path parameter.  The path is read as lenient upstream
 * routers read it (route.c lists how), so that no request an upstream runs as a keyed route's
 * handler passes through unkeyed.  Pure; the unit test, the fuzzer and the proxy share it.
 */
#ifndef IDEM_GATEWAY_ROUTE_H
#define IDEM_GATEWAY_ROUTE_H

#include <stddef.h>

#include "config.h"

/* Path parameters per route, at most. */
#define ROUTE_MAX_PARAMS 16

struct route_match {
    const struct gw_route *route; /* NULL: no route; the request is passed through untouched */
    const char *params[ROUTE_MAX_PARAMS]; /* values in template order, into `buf` */
    size_t nparams;
    char *buf; /* new: free with route_match_clear() */
};

/*
 * Finds the route of (method, target): `target` as the client sent it (percent-encoded, the query
 * and anything after '?' or '#' ignored).  The first route, in file order, that one reading of
 * the path fits wins (route.c).  Returns 1 with *m filled (path values decoded; one may hold a
 * '/' sent as %2F), or 0 with m->route NULL.
 */
int route_find(const struct gw_config *cfg, const char *method, const char *target,
               struct route_match *m);

void route_match_clear(struct route_match *m);

#endif /* IDEM_GATEWAY_ROUTE_H */
