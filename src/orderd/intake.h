/* SPDX-License-Identifier: Apache-2.0 */
/*
 * intake.h - orderd's face to HTTP: the request and server of src/http/http_server.h, served
 * through router_dispatch(), with each answered request recorded in the metrics and the log.
 */
#ifndef ORDERD_INTAKE_H
#define ORDERD_INTAKE_H

#include <stddef.h>

#include "http_server.h"

struct app;

/*
 * Starts listening on `listen` ("127.0.0.1:8080", "[::1]:0", "localhost:0") and serving
 * requests through router_dispatch() with `app` (borrowed: it must outlive the server).  Returns
 * 0 and *out, or -1 with a sentence in `err`.  Stop it with http_server_stop().
 */
int orderd_http_start(struct app *app, const char *listen, struct http_server **out, char *err,
                      size_t errlen);

/*
 * Starts the metrics listener of --metrics-listen: GET /metrics only (what the main listener then
 * no longer serves), with small limits.  Same returns as orderd_http_start.
 */
int orderd_metrics_start(struct app *app, const char *listen, struct http_server **out, char *err,
                         size_t errlen);

#endif /* ORDERD_INTAKE_H */
