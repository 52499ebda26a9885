/* SPDX-License-Identifier: Apache-2.0 */
/*
 * payments.h - the business state of money, as transitions on orders, payments and refunds rows.
 * Four paths may settle the same order: the request itself, a client's retry, a recovery worker,
 * and the provider's webhook.  So every transition is conditional on the state it leaves
 * (UPDATE ... WHERE status = 'pending_payment'): whichever path comes first does it, the others
 * find it done and change nothing - no second payment row, no second email, no second stock
 * release.  The keys sent to the provider are derived from the order, never random, so every
 * path asks the provider about the same charge.
 */
#ifndef ORDERD_PAYMENTS_H
#define ORDERD_PAYMENTS_H

#include <stddef.h>
#include <stdint.h>

#include "idem/idem.h"

struct app;

#define PAYMENT_KEY_MAX 96

/* "order-<id>-charge": the provider's Idempotency-Key of the order's charge. */
void payments_charge_key(const char *order_id, char out[PAYMENT_KEY_MAX]);
/* "order-<id>-refund": the key of its refund. */
void payments_refund_key(const char *order_id, char out[PAYMENT_KEY_MAX]);

/* What the payment paths need of an order. */
struct order_pay {
    int found;
    char id[64];
    char user_id[64];
    char idem_key[IDEM_KEY_MAX + 1];
    char status[32];
    char product_id[256];
    char currency[16];
    char source[32];
    char charge_id[96];
    char refund_status[32];
    int64_t quantity;
    int64_t amount;
};

/* Reads order `order_id` in `tx` (NULL: in a read transaction of its own). */
int payments_load(const struct app *app, struct idem_tx *tx, const char *order_id,
                  struct order_pay *o);

/*
 * pending_payment -> paid with `charge_id`: the payment row and the confirmation email (outbox)
 * in the same transaction.  *changed (may be NULL) says whether this call made the change.
 */
int payments_mark_paid(const struct app *app, struct idem_tx *tx, const struct order_pay *o,
                       const char *charge_id, int *changed);

/* pending_payment -> payment_failed, and the reserved stock goes back, once. */
int payments_mark_declined(const struct app *app, struct idem_tx *tx, const struct order_pay *o,
                           int *changed);

/*
 * The charge's outcome is unknown: hands the order to the reconciler, which asks the provider
 * after --reconcile-after-ms (doubling with every further unknown, up to a minute).  Own
 * transaction.
 */
int payments_flag_unknown(const struct app *app, const char *order_id);

/* A refund as refunds.c and the workers see it. */
struct refund_row {
    int found;
    char status[32];
    char charge_id[96];
    char currency[16];
    int64_t amount;
};

int refunds_load(const struct app *app, struct idem_tx *tx, const char *order_id,
                 struct refund_row *r);

/* paid -> cancelled with a refund "requested" (its row, with the derived key). */
int refunds_request(const struct app *app, struct idem_tx *tx, const struct order_pay *o);

/* requested -> refunded (`refund_id`) or refund_failed (`detail`), once. */
int refunds_mark_done(const struct app *app, struct idem_tx *tx, const char *order_id, int ok,
                      const char *refund_id, const char *detail, int *changed);

/*
 * The refund's outcome is unknown: the reconciler takes it from here, through the record of the
 * cancel request (principal, key) that met the unknown.  Own transaction.
 */
int refunds_flag_unknown(const struct app *app, const char *order_id, const char *principal,
                         const char *key);

#endif /* ORDERD_PAYMENTS_H */
