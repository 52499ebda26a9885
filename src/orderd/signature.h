/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature.h - the provider's webhook signature: "Provider-Signature: t=<unix seconds>,
 * v1=<hex HMAC-SHA256 of "<t>.<raw body>">" (several v1 while the provider rotates its secret).
 * Pure, so it is fuzzed on its own (fuzz/fuzz_webhook_signature.c).
 */
#ifndef ORDERD_SIGNATURE_H
#define ORDERD_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#define WEBHOOK_SIGNATURE_HEADER "Provider-Signature"

/*
 * Checks `header` (the one Provider-Signature value) against `body` with `secret`, at `now_s`
 * with `tolerance_s` seconds of accepted age either way.  Returns NULL when authentic, else why
 * not (a static sentence).  Compares in constant time.
 */
const char *webhook_signature_check(const char *secret, const char *header, const char *body,
                                    size_t body_len, int64_t now_s, int64_t tolerance_s);

#endif /* ORDERD_SIGNATURE_H */
