/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proxy.h - idem-gateway's request path, as the HTTP layer's hooks (http_server.h):
 *
 *   on_head   (event loop)  route, principal and key from the head alone: 401 / 400 / 413 before
 *                           any body byte is kept;
 *   on_loop   (event loop)  the key's replay or mismatch from the engine's memory, no thread;
 *   handle    (worker)      claim the record, make the claim durable, forward, store the answer
 *                           per the route's policy, reply -- or, for a request on no route,
 *                           forward it untouched;
 *   answered  (event loop)  the log line and the metrics.
 *
 * docs/gateway.md describes the flow and every answer; the unknown-outcome modes are in
 * proxy.c's run_unknown().
 */
#ifndef IDEM_GATEWAY_PROXY_H
#define IDEM_GATEWAY_PROXY_H

#include "gateway.h"
#include "http_server.h"

/* The hooks above, with `ctx` the struct gateway, for http_server_start(). */
void proxy_server_options(struct gateway *gw, struct http_server_options *opts);

#endif /* IDEM_GATEWAY_PROXY_H */
