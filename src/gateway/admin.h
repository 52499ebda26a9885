/*
 * admin.h - idem-gateway's admin listener (loopback by default, `admin_listen`): GET /healthz
 * (the process answers), GET /readyz (the store answers too), GET /metrics (Prometheus text),
 * GET /records?principal=&operation=&key= (one record) and POST /records/resolve (say what
 * happened to a request whose outcome is unknown; records.h).  Anyone who reaches it can resolve
 * records: it must stay on loopback or behind the operator's own access control.
 * Kept off the public listener so that a scrape or a probe never competes with, or is reachable
 * by, the callers of the API.
 */
#ifndef IDEM_GATEWAY_ADMIN_H
#define IDEM_GATEWAY_ADMIN_H

#include "gateway.h"
#include "http_server.h"

/* The admin hooks, with `ctx` the struct gateway (gw->public_server set before it starts). */
void admin_server_options(struct gateway *gw, struct http_server_options *opts);

#endif /* IDEM_GATEWAY_ADMIN_H */
