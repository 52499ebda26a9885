/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature.c - the provider's webhook signature (signature.h).
 */
#include "signature.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "util.h"
#include "banned.h"

#define MAC_LEN 32
#define MAX_V1 4

struct signature {
    int64_t t;
    int nv1;
    unsigned char v1[MAX_V1][MAC_LEN];
};

/*
 * "t=<digits>,v1=<64 hex>[,v1=...]" in any order; unknown members are ignored, a second t is
 * refused.
 */
static int parse_signature(const char *value, struct signature *sig)
{
    char buf[512];
    char *item, *save = NULL;
    size_t len = 0;
    int have_t = 0;

    memset(sig, 0, sizeof *sig);
    if (value == NULL || strlen(value) >= sizeof buf)
        return -1;
    snprintf(buf, sizeof buf, "%s", value);
    for (item = strtok_r(buf, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        while (*item == ' ')
            item++;
        if (strncmp(item, "t=", 2) == 0) {
            /* One timestamp: with two, which one was signed would be a guess. */
            if (have_t || parse_int64(item + 2, 0, INT64_MAX / 1000, &sig->t) != 0)
                return -1;
            have_t = 1;
        } else if (strncmp(item, "v1=", 3) == 0 && sig->nv1 < MAX_V1) {
            if (hex_decode(item + 3, sig->v1[sig->nv1], MAC_LEN, &len) != 0 || len != MAC_LEN)
                return -1;
            sig->nv1++;
        }
    }
    return have_t && sig->nv1 > 0 ? 0 : -1;
}

const char *webhook_signature_check(const char *secret, const char *header, const char *body,
                                    size_t body_len, int64_t now_s, int64_t tolerance_s)
{
    struct signature sig;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    unsigned char *msg = NULL;
    char prefix[32];
    int64_t age;
    const char *why = "no signature matches";
    int plen, i;

    if (header == NULL || parse_signature(header, &sig) != 0)
        return "send one Provider-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>";
    age = now_s - sig.t;
    if (age > tolerance_s || -age > tolerance_s)
        return "the signature's timestamp is outside the accepted window";
    plen = snprintf(prefix, sizeof prefix, "%" PRId64 ".", sig.t);
    msg = xmalloc((size_t)plen + body_len);
    memcpy(msg, prefix, (size_t)plen);
    if (body_len > 0)
        memcpy(msg + plen, body, body_len);
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, (size_t)plen + body_len, mac,
             &mac_len) == NULL ||
        mac_len != MAC_LEN) {
        why = "cannot compute HMAC-SHA256";
        goto out;
    }
    for (i = 0; i < sig.nv1; i++)
        if (CRYPTO_memcmp(mac, sig.v1[i], MAC_LEN) == 0)
            why = NULL;
out:
    free(msg);
    return why;
}
