/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checkout.h - what happens to an order after phase 1 ("order_created") committed: the charge
 * through the provider, between phases, with the key derived from the order; then the last
 * phase, which settles the order (paid, or payment_failed with its stock released) and stores the
 * response in the same transaction.  The request, a client's retry, the completer and the
 * reconciler all come through here, so a resumed order is finished exactly as a fresh one.
 */
#ifndef ORDERD_CHECKOUT_H
#define ORDERD_CHECKOUT_H

#include "idem/idem.h"

struct app;
struct call_ctx;

/* The recovery point phase 1 of orders.create leaves, with the order id as its data. */
#define POINT_ORDER_CREATED "order_created"
/*
 * On a shard set, before it: the stock reserved on the catalogue (stock.h), its data the price
 * and the order's input (orders.c), from which a retry or the completer makes the order.  Data
 * of the first form, "PRICE CURRENCY", lacks the input: only the client's retry goes on there.
 */
#define POINT_STOCK_RESERVED "stock_reserved"
/*
 * On a shard set, before that: the record made durable with the order's input as its data,
 * before the catalogue's stock is touched, so that a reservation never outlives a record that
 * says what it was for: a retry or the completer reserves again (the same reservation, found by
 * its key) and goes on.
 */
#define POINT_STOCK_RESERVING "stock_reserving"

struct checkout_opts {
    int ask_first;             /* reconciler: look the charge up by key before charging */
    const struct call_ctx *cx; /* the HTTP request (test hooks), NULL for a worker */
};

/*
 * Finishes order `order_id` on `call` (resumed or fresh, no phase open).  Returns 0 with the call
 * completed; or 0 with *unknown = 1 when the provider's answer is unknown (the order is flagged
 * for the reconciler, nothing is stored, the caller aborts the call); or a negative IDEM_E*.
 */
int checkout_settle(struct app *app, struct idem_call *call, const char *order_id,
                    const struct checkout_opts *opts, int *unknown);

/*
 * Settles the payment of order `order_id` without its idempotency record (swept while the payment
 * was unknown): looks the charge up by the order's derived key and, when the provider has none,
 * charges now with that key -- the roll forward a retry would have made -- then marks the order
 * paid or declined; an outcome still unknown flags it for a later check.  *settled says whether
 * the order reached an end state.  Counted in orderd_orphan_payments_total.
 */
int checkout_settle_orphan(struct app *app, const char *order_id, int *settled);

#endif /* ORDERD_CHECKOUT_H */
