/* SPDX-License-Identifier: Apache-2.0 */
/*
 * webhook_sender.h - events and their at-least-once delivery.  An effect records its event (and one
 * delivery per copy the duplication fault asks for) in the same transaction as the effect; sender
 * threads POST due deliveries to the configured URL, signed, and retry with backoff until the
 * receiver answers 2xx.  Duplicates share the event id: that is what a receiver dedupes on.
 */
#ifndef SIM_WEBHOOK_SENDER_H
#define SIM_WEBHOOK_SENDER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "idem/idem.h"

struct sim;
struct webhooks;

#define WEBHOOK_SIGNATURE_HEADER "Provider-Signature"
/* "t=<unix seconds>,v1=<64 hex>" */
#define WEBHOOK_SIGNATURE_MAX 192

/*
 * Starts the sender threads for `url`, signing with `secret` (both borrowed: they must outlive
 * the senders).  Returns 0 and *out, or -1.
 */
int webhooks_start(struct sim *sim, const char *url, const char *secret, struct webhooks **out);

/* Stops the senders (a delivery in flight ends within its timeout) and frees.  NULL is a no-op. */
void webhooks_stop(struct webhooks *wh);

/*
 * Records event `type` ("charge.succeeded") about `object` (borrowed) in `tx`, and queues its
 * deliveries when a URL is configured: webhook_dup copies, the first after webhook_delay_ms.
 */
int webhooks_enqueue(struct sim *sim, struct idem_tx *tx, const char *type, const json_t *object);

/* Wakes the senders once the enqueuing transaction committed.  NULL is a no-op. */
void webhooks_notify(struct webhooks *wh);

/*
 * The signature header value: "t=<t>,v1=<hex of HMAC-SHA256(secret, "<t>." body)>".  Returns 0,
 * or -1 if OpenSSL failed.
 */
int webhooks_sign(const char *secret, int64_t t, const void *body, size_t len,
                  char out[WEBHOOK_SIGNATURE_MAX]);

#endif /* SIM_WEBHOOK_SENDER_H */
