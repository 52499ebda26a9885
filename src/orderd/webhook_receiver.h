/* SPDX-License-Identifier: Apache-2.0 */
/*
 * webhook_receiver.h - POST /webhooks/provider: the provider's events (charge.succeeded,
 * refund.succeeded), delivered at least once.  Signed with HMAC-SHA256 over "<timestamp>.<body>"
 * in the Provider-Signature header ("t=<unix seconds>,v1=<hex>"); a bad signature or a timestamp
 * outside the window is 401 and nothing is recorded.  Each event id is recorded in an inbox table
 * in the same transaction that applies the event, so a duplicate finds its id and changes
 * nothing (2xx, so the provider stops retrying).
 */
#ifndef ORDERD_WEBHOOK_RECEIVER_H
#define ORDERD_WEBHOOK_RECEIVER_H

struct call_ctx;
struct response;

void webhooks_provider(const struct call_ctx *cx, struct response *resp);

#endif /* ORDERD_WEBHOOK_RECEIVER_H */
