/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cancel.h - POST /api/orders/{id}/cancel, an idempotent state transition with a compensation:
 * cancelling a paid order refunds it through the provider, with a key derived from the order
 * ("order-<id>-refund"), so however many cancel requests (any keys) and recovery workers drive
 * the refund, the provider makes one.  The refund has its own states: requested -> refunded |
 * refund_failed.
 *
 *   phase 1 (""):                 order cancelled, refund requested -> "refund_requested"
 *   between phases:               POST /v1/refunds
 *   phase 2 ("refund_requested"): refund refunded | refund_failed, 200 stored
 */
#ifndef ORDERD_CANCEL_H
#define ORDERD_CANCEL_H

#include "idem/idem.h"

struct app;

#define POINT_REFUND_REQUESTED "refund_requested"

/*
 * Drives the refund of order `order_id` on `call` (no phase open) and completes the call with the
 * order (200).  `principal` / `key` name the call's record, for the reconciler should the outcome
 * be unknown.  Returns 0 (completed), 0 with *unknown = 1 (nothing stored; the caller aborts), or
 * a negative IDEM_E*.
 */
int cancel_refund_settle(struct app *app, struct idem_call *call, const char *order_id,
                         const char *principal, const char *key, int ask_first, int *unknown);

#endif /* ORDERD_CANCEL_H */
