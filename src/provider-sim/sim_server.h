/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sim_server.h - provider-sim's face to HTTP: the request, response and server of src/http/
 * (http_server.h, response.h), served through api_dispatch().  A handler may set `drop` on its
 * response to close the connection without answering, which is how the "lost response" fault
 * looks to a client: the effect happened, no answer came.
 */
#ifndef SIM_SERVER_H
#define SIM_SERVER_H

#include <stddef.h>

#include "http_server.h"
#include "response.h"

struct sim;

/*
 * Listens on "HOST:PORT" (IPv4; port 0: a free one) and serves requests through api_dispatch()
 * with `sim` (borrowed: it must outlive the server).  Returns 0 and *out, or -1 with `err`.
 * Stop it with http_server_stop() (requests in flight get a few seconds).
 */
int sim_http_start(struct sim *sim, const char *listen, struct http_server **out, char *err,
                   size_t errlen);

/* Answers one request (api.c). */
void api_dispatch(struct sim *sim, const struct request *rq, struct response *resp);

#endif /* SIM_SERVER_H */
