/* SPDX-License-Identifier: Apache-2.0 */
/*
 * outbox.h - the transactional outbox.  An email is a row written in the same transaction as the
 * change that causes it (an order paid, a profile changed), so it exists exactly when the change
 * does; the relay, a background worker, delivers each row to the provider with the row's id as
 * the provider's Idempotency-Key, retries with exponential backoff and jitter, and parks a message
 * after --outbox-max-attempts failures for an operator (`orderd outbox list`, `orderd outbox
 * retry ID`).
 */
#ifndef ORDERD_OUTBOX_H
#define ORDERD_OUTBOX_H

#include <stdio.h>

#include <jansson.h>

#include "idem/idem.h"

struct app;

/*
 * Queues `email` (borrowed: {"to","subject","template","text","metadata"}) in `tx`, as a message
 * of the user `user_id` (the row's user_id: on a shard set, a move of the user's bucket carries
 * it).  With a `dedupe_key`, a second message of the same key is not queued (the first stays):
 * the confirmation of an order is one row however many paths settle the order.  NULL: always
 * queued.  Returns 0 or a negative IDEM_E*.
 */
int outbox_enqueue(const struct app *app, struct idem_tx *tx, const char *user_id,
                   const char *dedupe_key, const json_t *email);

/* One run of the relay (a worker_fn): delivers what is due, at most a batch; *items = sent. */
int outbox_relay_run(struct app *app, int *items);

/*
 * `orderd outbox list`: prints the messages (newest first, at most `limit`; only `status` if not
 * NULL) to `out`.  Returns 0 or a negative IDEM_E* (detail in `err`).
 */
int outbox_list(struct idem_store *st, const char *status, int limit, FILE *out, char *err,
                size_t errlen);

/*
 * `orderd outbox retry ID`: puts a parked (or pending) message back in the queue with its
 * attempts reset.  Returns 0, 1 when there is no such message, 2 when it was sent already, or a
 * negative IDEM_E*.
 */
int outbox_retry(struct idem_store *st, const char *id, char *err, size_t errlen);

#endif /* ORDERD_OUTBOX_H */
