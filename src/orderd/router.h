/* SPDX-License-Identifier: Apache-2.0 */
/*
 * router.h - from a request to a handler: the route table of docs/http-api.md and the checks
 * every request passes, in the contract's order, before any business code runs: route (404,
 * 405) -> auth (401) -> content type (415) -> body size (413) -> Idempotency-Key (400) -> JSON
 * and fingerprint (400) -> then the handler validates its body (400) and calls the engine.
 */
#ifndef ORDERD_ROUTER_H
#define ORDERD_ROUTER_H

#include <stddef.h>

#include <jansson.h>

#include "idem/idem.h"

#include "http_server.h"

struct app;

#define ROUTE_MAX_PARAMS 2

/* What a handler receives once the common checks passed. */
struct call_ctx {
    struct app *app;
    const struct request *rq;
    const char *principal;                /* user id; NULL on routes without auth */
    const char *params[ROUTE_MAX_PARAMS]; /* path parameters, in template order */
    size_t nparams;
    const char *key;               /* parsed Idempotency-Key; NULL if none */
    unsigned char fp[IDEM_FP_LEN]; /* request fingerprint (routes with a body) */
    json_t *body;                  /* parsed body; NULL when there was none */
};

/* Answers one request into `resp` (always: every path ends in a response). */
void router_dispatch(struct app *app, const struct request *rq, struct response *resp);

/*
 * The checks a request's head allows (route, auth, content type), before any body byte is read:
 * the server's on_head (http_server.h).  With may_block 0 it asks only the token cache, and
 * answers HTTP_HEAD_BLOCKS for a token the store must confirm.
 */
enum http_head_verdict router_check_head(struct app *app, struct request *rq, struct response *resp,
                                         int may_block);

/*
 * The server's on_loop: answers a retry whose response the replay cache holds (or a key reused
 * with another body) on the event loop, with no hand-off and no store.  A duplicate of a request
 * that runs in this process now is parked (libidem's watch, no thread held) until that one
 * completes.  Everything else goes to a worker (router_dispatch).  `park` NULL: never parks.
 */
enum http_loop_verdict router_answer_on_loop(struct app *app, const struct request *rq,
                                             struct response *resp, struct http_park *park);

/*
 * The server's on_unpark.  A duplicate (parked once): ends the watch, then answers from the
 * replay cache, or hands the request to a worker, whose engine call waits only what is left of
 * wait_ms (rq->parked_ms).  A new order on the store's writer: its answer once it ended (parked
 * again until then; `park` NULL at a stop: waits for it), or a worker's turn.
 */
enum http_loop_verdict router_unpark(struct app *app, const struct request *rq,
                                     struct response *resp, void *data, int timed_out,
                                     struct http_park *park);

#endif /* ORDERD_ROUTER_H */
