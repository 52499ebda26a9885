/* SPDX-License-Identifier: Apache-2.0 */
/*
 * error_format.h - the errors idem-gateway answers itself, in the format its clients read
 * (`error_format` in the config, docs/gateway.md).
 *
 * Every error starts as an RFC 9457 problem (response_problem, resp->problem its code), the
 * default format.  With `error_format: stripe` it is rewritten, just before it is sent, into
 * Stripe's envelope {"error": {"type", "code", "message"}} with the status Stripe would use for
 * it and a `Stripe-Should-Retry` header that tells Stripe's SDKs whether a retry can succeed:
 * a reused key is 400 idempotency_error (the SDKs' StripeIdempotencyError), a key in progress is
 * 409 idempotency_key_in_use with "true", an outcome held for an operator is 503 with "false".
 * The upstream's own answers are never touched.
 */
#ifndef IDEM_GATEWAY_ERROR_FORMAT_H
#define IDEM_GATEWAY_ERROR_FORMAT_H

#include "config.h"
#include "response.h"

/*
 * Restyles `resp`, a problem the gateway wrote (resp->problem set; anything else is left alone),
 * in `fmt`.  `r` is the request's route (NULL: none), `keyed` whether a record keeps it (a retry
 * with its key cannot run twice), `method` its method (NULL: unknown): they decide whether a
 * retry is safe and useful.
 */
void gw_errors_restyle(enum gw_error_format fmt, const struct gw_route *r, int keyed,
                       const char *method, struct response *resp);

#endif /* IDEM_GATEWAY_ERROR_FORMAT_H */
