/* SPDX-License-Identifier: Apache-2.0 */
/*
 * key_rule.h - how long an Idempotency-Key may be, and the sentences that refuse one that is not,
 * for both ends: libidem's parser of the header field (lib/key.c) and libidem-client's check of
 * a key it is handed (lib/client/key.c), so a client never sends a key the server would refuse
 * for its length.  Static inline for the reason clock.h gives.
 */
#ifndef IDEM_COMMON_KEY_RULE_H
#define IDEM_COMMON_KEY_RULE_H

#include <stddef.h>

#define KEY_RULE_MAX 255 /* IDEM_KEY_MAX and IDEM_CLIENT_KEY_MAX are asserted to be this */

/* Why a key of `n` characters is refused, or NULL when its length is fine. */
static inline const char *key_length_problem(size_t n)
{
    if (n == 0)
        return "key is empty";
    if (n > KEY_RULE_MAX)
        return "key is longer than 255 characters";
    return NULL;
}

#endif
