/* SPDX-License-Identifier: Apache-2.0 */
/*
 * order_doc.h - an order as the API shows it.  The create, get, list and cancel endpoints, the
 * payment phases and the recovery workers all answer with the same shape, so it is built in one
 * place from one column list.
 */
#ifndef ORDERD_ORDER_DOC_H
#define ORDERD_ORDER_DOC_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "idem/idem.h"

struct app;

/* The columns order_json() reads, in its order; queries may select more after them. */
#define ORDER_COLS                                                                                 \
    "id, status, product_id, quantity, unit_price, amount, currency, created_at, charge_id, "      \
    "refund_status"
#define ORDER_NCOLS 10

/*
 * The public shape of the order in row `row` of a result selected with ORDER_COLS (new):
 * orderId, status, productId, quantity, unitPrice, amount, currency, createdAt, and chargeId /
 * refundStatus once there is a payment / refund.
 */
json_t *order_json(const struct idem_rows *rows, int row);

/* The same shape of a new order from its values (no payment, no refund yet) (new). */
json_t *order_json_new(const char *id, const char *status, const char *product, int64_t quantity,
                       int64_t unit_price, int64_t amount, const char *currency,
                       const char *created_at);

/* "/api/orders/<id>" into `buf`. */
void order_location(const char *id, char *buf, size_t cap);

/*
 * Reads order `id` in `tx` as order_json() shows it.  Returns 0 with *doc (new; NULL when there
 * is no such order), or a negative IDEM_E*.
 */
int order_read(const struct app *app, struct idem_tx *tx, const char *id, json_t **doc);

/*
 * Completes `call` with order `id` as it is now, read in the call's phase (begun here if it is
 * not yet): 201 with its Location when `created`, else 200.  An order the record names but the
 * table lacks is logged and answered IDEM_ESTATE.  Returns 0 or a negative IDEM_E*.
 */
int order_complete_call(struct app *app, struct idem_call *call, const char *id, int created);

#endif /* ORDERD_ORDER_DOC_H */
