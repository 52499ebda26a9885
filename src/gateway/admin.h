/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.h - idem-gateway's admin listener (loopback by default, `admin_listen`): GET /healthz
 * (the process answers), GET /readyz (the store answers too), GET /metrics (Prometheus text),
 * GET /records?principal=&operation=&key= (one record) and POST /records/resolve (say what
 * happened to a request whose outcome is unknown; records.h).  Web pages are refused (an Origin, a
 * Host that is not loopback on a loopback listener), a resolution must be JSON, and with
 * admin_token_file every request but /healthz needs the bearer token (admin.c, admin_on_head).
 * Kept off the public listener so that a scrape or a probe never competes with, or is reachable
 * by, the callers of the API.
 */
#ifndef IDEM_GATEWAY_ADMIN_H
#define IDEM_GATEWAY_ADMIN_H

#include <stdio.h>

#include "gateway.h"
#include "http_server.h"

/* The admin hooks, with `ctx` the struct gateway (gw->public_server set before it starts). */
void admin_server_options(struct gateway *gw, struct http_server_options *opts);

/* Whether admin_listen is a loopback address (else serve and check-config warn). */
int admin_on_loopback(const struct gw_config *cfg);

/* The warning of an admin listener off loopback (with or without a token), on `to`; or nothing. */
void admin_warn(const struct gw_config *cfg, FILE *to);

#endif /* IDEM_GATEWAY_ADMIN_H */
