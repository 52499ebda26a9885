/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fingerprint.c - the request fingerprint.  A retry must carry the same request as the first
 * attempt; a client that reuses a key for a different request is refused instead of being
 * answered with the first request's response.  "Same request" means the same method, the same
 * route and path parameters, and the same JSON value as body, so the hash covers the RFC 8785
 * form of the body rather than its bytes.
 *
 * Every field goes in as an 8-byte big-endian length followed by its bytes, after a version tag:
 * no two different requests can produce the same input to SHA-256 (params "ab","c" and "a","bc"
 * differ), and a future encoding can change the tag instead of colliding with this one.
 */
#include "internal.h"

#include <openssl/evp.h>

#include <pthread.h>
#include <string.h>

#include "ascii.h"

/* Names this encoding; change it if the encoding below ever changes. */
#define FP_DOMAIN "idem-fp-v1"

/*
 * SHA-256, fetched from OpenSSL's provider once.  EVP_sha256() would be looked up again by name
 * (under a lock) on every digest: over half the cost of hashing a small request.
 */
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void sha256_fetch(void)
{
    sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

const EVP_MD *idem__sha256(void)
{
    pthread_once(&sha256_once, sha256_fetch);
    return sha256_fetched ? sha256_fetched : EVP_sha256();
}

static int put_u64(EVP_MD_CTX *ctx, uint64_t v)
{
    unsigned char be[8];
    int i;

    for (i = 7; i >= 0; i--) {
        be[i] = (unsigned char)(v & 0xff);
        v >>= 8;
    }
    return EVP_DigestUpdate(ctx, be, sizeof be) == 1 ? 0 : IDEM_ENOMEM;
}

static int put_field(EVP_MD_CTX *ctx, const void *p, size_t n)
{
    int rc;

    rc = put_u64(ctx, (uint64_t)n);
    if (rc < 0 || n == 0)
        goto out;
    rc = EVP_DigestUpdate(ctx, p, n) == 1 ? 0 : IDEM_ENOMEM;
out:
    return rc;
}

int idem_fingerprint(const char *method, const char *route, const char *const *params,
                     size_t nparams, const void *body, size_t body_len,
                     unsigned char out[IDEM_FP_LEN], const char **why)
{
    int rc = IDEM_EINVAL;
    const char *reason = "NULL argument";
    EVP_MD_CTX *ctx = NULL;
    char *canon = NULL;
    size_t canon_len = 0, i;
    unsigned int mdlen = 0;

    if (!method || !route || !out || (nparams && !params) || (body_len && !body))
        goto out;
    for (i = 0; i < nparams; i++) {
        if (!params[i])
            goto out;
    }
    /* Canonicalise first: a bad body is the caller's most likely failure and needs no hashing. */
    if (body_len) {
        rc = idem_jcs_canonicalize(body, body_len, &canon, &canon_len, &reason);
        if (rc < 0)
            goto out;
    }
    /* OpenSSL failures here are allocation failures; libidem has no better code for them. */
    rc = IDEM_ENOMEM;
    reason = "out of memory";
    ctx = EVP_MD_CTX_new();
    if (!ctx)
        goto out;
    if (EVP_DigestInit_ex(ctx, idem__sha256(), NULL) != 1)
        goto out;
    rc = put_field(ctx, FP_DOMAIN, strlen(FP_DOMAIN));
    if (rc == 0)
        rc = put_field(ctx, method, strlen(method));
    if (rc == 0)
        rc = put_field(ctx, route, strlen(route));
    if (rc == 0)
        rc = put_u64(ctx, (uint64_t)nparams);
    for (i = 0; rc == 0 && i < nparams; i++)
        rc = put_field(ctx, params[i], strlen(params[i]));
    /*
     * No body is a zero-length field.  Canonical JSON is never empty (the shortest value is one
     * digit), so "no body" cannot be confused with any body, "{}" included.
     */
    if (rc == 0)
        rc = put_field(ctx, canon, canon_len);
    if (rc < 0)
        goto out;
    rc = IDEM_ENOMEM;
    if (EVP_DigestFinal_ex(ctx, out, &mdlen) != 1 || mdlen != IDEM_FP_LEN)
        goto out;
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    idem_free(canon);
    if (why)
        *why = rc < 0 ? reason : NULL;
    return rc;
}

void idem_fingerprint_hex(const unsigned char fp[IDEM_FP_LEN], char hex[2 * IDEM_FP_LEN + 1])
{
    if (!fp || !hex)
        return;
    hex_encode(fp, IDEM_FP_LEN, hex);
}
