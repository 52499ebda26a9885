/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stock.h - the stock of an order on a shard set (docs/shards.md, "orderd on a shard set"):
 * products are shared by every user, so they live in the catalogue, while the order lives in its
 * user's cluster.  No transaction spans the two: the stock is taken in a catalogue transaction
 * of its own, as a reservation row whose key is the request's (user, operation, Idempotency-Key),
 * so that a retry after a crash finds the row and takes nothing again, and given back the same
 * way, the row marked released with the increment.
 */
#ifndef ORDERD_STOCK_H
#define ORDERD_STOCK_H

#include <stdint.h>

struct app;

/* What a reservation found: the price it was made at, and whether an earlier attempt made it. */
struct stock_reservation {
    int earlier;
    int64_t unit_price;
    char currency[16];
};

/* Why no stock was reserved. */
enum stock_refusal {
    STOCK_OK = 0,
    STOCK_UNKNOWN_PRODUCT,
    STOCK_OUT,
};

/*
 * Reserves `quantity` (decimal) of `product` on the catalogue for (user, operation, key), in one
 * catalogue transaction: the reservation row and the decrement together, or, when the row is
 * there already, nothing but reading it.  Returns 0 with *refused (STOCK_OK and *res filled, or
 * why not: nothing was written), or a negative IDEM_E*.
 */
int stock_reserve(const struct app *app, const char *user, const char *operation, const char *key,
                  const char *product, const char *quantity, struct stock_reservation *res,
                  enum stock_refusal *refused);

/*
 * Gives back what (user, operation, key) reserved, once: the row marked released and the stock
 * incremented in one catalogue transaction; a row released already, or none, changes nothing.
 * Returns 0 (*released: whether this call gave stock back; may be NULL) or a negative IDEM_E*.
 */
int stock_release(const struct app *app, const char *user, const char *operation, const char *key,
                  int *released);

#endif /* ORDERD_STOCK_H */
