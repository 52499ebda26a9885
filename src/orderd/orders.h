/* SPDX-License-Identifier: Apache-2.0 */
/*
 * orders.h - the orders endpoints: create (idempotent, two phases), list, get, cancel
 * (idempotent state transition).
 */
#ifndef ORDERD_ORDERS_H
#define ORDERD_ORDERS_H

#include <jansson.h>

struct app;
struct call_ctx;
struct idem_call;
struct response;
struct create_async;

void orders_create(const struct call_ctx *cx, struct response *resp);
/*
 * The completer's turn at a record of orders.create left at "stock_reserving" or
 * "stock_reserved" (a shard set: the stock maybe or surely reserved on the catalogue, no order
 * yet), taken over with idem_call_recover() (`call`, no phase open): the stock reserved (found
 * again if it was), the order on the user's cluster, then its charge, as the client's retry
 * would go on, and the answer the client would have got stored for a late retry to replay.  Returns
 * 0 with the call completed; 0 with *unknown (the provider did not answer: the order is flagged,
 * nothing stored; end the call); 0 with *skipped when the point's data predates the order's
 * input ("PRICE CURRENCY") or cannot be read (logged): nothing done, only the client's retry
 * goes on; or a negative IDEM_E*.
 */
int orders_create_from_reserved(struct app *app, struct idem_call *call, const char *principal,
                                const char *key, int *unknown, int *skipped);
/*
 * POST /api/orders from the event loop, without a worker, where it can be (no provider, the
 * store runs its writer itself: SQLite): checks the body (`body`, parsed; taken), then hands the
 * order to the store's writer.  Returns 1 when under way: `wake(wake_arg)` runs on another
 * thread once it ended, then orders_create_finish() answers.  -1: a 400 is in `resp`.  0: let a
 * worker run orders_create().  Never blocks.
 */
int orders_create_start(const struct call_ctx *cx, json_t *body, void (*wake)(void *arg),
                        void *wake_arg, struct response *resp, struct create_async **out);
/* Whether the order started so has ended; with `wait`, once it has (a stop). */
int orders_create_ended(struct create_async *ca, int wait);
/* Its answer into `resp` (1), or 0: a worker must run orders_create().  Frees `ca`. */
int orders_create_finish(struct create_async *ca, struct response *resp);

void orders_list(const struct call_ctx *cx, struct response *resp);
void orders_get(const struct call_ctx *cx, struct response *resp);
void orders_cancel(const struct call_ctx *cx, struct response *resp);

#endif /* ORDERD_ORDERS_H */
