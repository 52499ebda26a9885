/* SPDX-License-Identifier: Apache-2.0 */
/*
 * key.c - the keys a client sends.  A generated key is a UUID version 4 from the kernel's CSPRNG:
 * 122 random bits make a collision with another client's key (the server scopes keys by user,
 * but one user may run many machines) far less likely than a disk failure.  A caller's own key
 * is checked against the shape every server accepts verbatim as a bare token, the same rule as
 * libidem's idem_key_parse, so what the journal records is exactly what the server stores.
 */
#include "client_internal.h"

#include <string.h>

#include "key_rule.h"
#include "banned.h"

_Static_assert(IDEM_CLIENT_KEY_MAX == KEY_RULE_MAX,
               "one length rule for both ends (common/key_rule.h)");

int idem_client_key_new(char out[IDEM_CLIENT_UUID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[16];
    int rc;
    size_t i, o = 0;

    if (!out)
        return IDEM_CLIENT_EINVAL;
    rc = idem_client__random_bytes(b, sizeof b);
    if (rc < 0)
        return rc;
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* variant 10xx (RFC 9562) */
    for (i = 0; i < sizeof b; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[b[i] >> 4];
        out[o++] = hex[b[i] & 0x0f];
    }
    out[o] = '\0';
    return 0;
}

int idem_client_key_check(const char *key, const char **why)
{
    const char *reason = NULL;
    size_t i, n;

    if (!key) {
        reason = "no key";
        goto out;
    }
    n = strlen(key);
    reason = key_length_problem(n);
    if (reason != NULL)
        goto out;
    if (key[0] == '"') {
        reason = "key starts with a double quote";
        goto out;
    }
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c < 0x21 || c > 0x7e) {
            reason = "key contains a space, a control or a non-ASCII character";
            goto out;
        }
        if (c == ',') {
            reason = "key contains a comma";
            goto out;
        }
    }
out:
    if (reason && why)
        *why = reason;
    return reason ? IDEM_CLIENT_EKEY : 0;
}
