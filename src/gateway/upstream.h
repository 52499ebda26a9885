/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upstream.h - idem-gateway's client of the upstream API: one HTTP/1.1 exchange, either blocking
 * a worker of the HTTP layer (keyed requests, whose record is claimed and settled around it) or
 * started from an event loop without blocking it (requests passed through), over keep-alive
 * connections, answers read by the HTTP layer's reader (http_client.h) under a size cap.
 *
 * What matters most here is telling the caller what the upstream may have seen, because that
 * decides whether a retry may run: a connection that could not be made means nothing was sent
 * (HTTP_FETCH_NOT_SENT, the record is released); once a byte of the request left, an exchange
 * that ends without a whole answer (timeout, reset, close) is HTTP_FETCH_UNKNOWN -- the upstream
 * may have acted.  To keep that second case for real failures, a pooled connection is reused only
 * while it is young and shows no sign of being closed by the upstream (docs/gateway.md).
 */
#ifndef IDEM_GATEWAY_UPSTREAM_H
#define IDEM_GATEWAY_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "http_client.h"

struct upstream;

/*
 * The upstream `opts` names (its host resolved once, here), for both kinds of exchange: its
 * limits hold for a worker's exchanges as for a loop's (max_idle: kept per loop, and once more
 * for the workers).  Returns 0 with *out, or -1 with a sentence in `err` (no such host).
 */
int upstream_new(const struct http_client_options *opts, struct upstream **out, char *err,
                 size_t errlen);
void upstream_free(struct upstream *up);

/*
 * Every request carries `Host: host` (copied) instead of the caller's: for an API reached over
 * the public network, which knows itself by its own name, not by the gateway's.
 */
void upstream_set_host(struct upstream *up, const char *host);

struct upstream_header {
    const char *name;
    const char *value;
};

/* What to send.  `headers` go as given (the caller drops the hop-by-hop ones). */
struct upstream_request {
    const char *method;
    const char *target; /* "/v1/payments?x=1" */
    const struct upstream_header *headers;
    size_t nheaders;
    const char *body;
    size_t body_len;
    int fresh_connection; /* on a new connection, closed after the answer
                             (upstream.keyed_connections) */
};

/*
 * One exchange on the calling (worker) thread, blocking it for at most connect_timeout_ms +
 * timeout_ms.  Fills `resp` (initialised by the call; http_reply_clear() it) on HTTP_FETCH_OK and
 * HTTP_FETCH_TOO_LARGE (status and headers); `err` receives a sentence on every other result.
 * A body over `hold_max` bytes (0: the upstream's max_response_bytes) is TOO_LARGE -- unless
 * `may_stream`: then the answer is HTTP_FETCH_OK with the head and the body's first bytes in
 * `resp`, and the rest in resp->rest (read by the event loop: http_body_stream_step()).
 */
enum http_fetch_result upstream_exchange(struct upstream *up, const struct upstream_request *rq,
                                         size_t hold_max, int may_stream, struct http_reply *resp,
                                         char *err, size_t errlen);

/*
 * The same exchange started from an event-loop thread without blocking it (http_fetch_start):
 * `done` runs on that loop when it ends.  An answer over `hold_max` bytes (0: the upstream's
 * max_response_bytes) comes with reply->rest, for a worker to stream.  Returns 0 with *fetch,
 * or -1 off a loop thread.
 */
int upstream_start(struct upstream *up, const struct upstream_request *rq, size_t hold_max,
                   http_fetch_done done, void *arg, struct http_fetch **fetch);

#endif /* IDEM_GATEWAY_UPSTREAM_H */
