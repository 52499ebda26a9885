/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_gateway_jwt.c - libFuzzer harness for idem-gateway's principal (src/gateway/principal.c),
 * whose JWT reader is the gateway's first code to decode a stranger's bytes.  The input is the
 * Authorization header value, handed over as an exact-length copy with no NUL after it (a read
 * past the value shows as a heap overflow), to an HS256 verifier, an HS256 verifier that checks
 * iss and aud, an RS256 verifier (an RSA-2048 key made once at start), and the Authorization-hash
 * and header sources.
 *
 * Few mutations of a token keep its signature valid, so a second pass reaches the claims: when the
 * input holds a NUL, the bytes before it are taken as the header JSON and those after as the
 * claims JSON, and the harness encodes and signs them with the HS256 secret itself.
 *
 * Besides memory errors it checks: a result is 0 or -1; a refusal gives a reason and an empty
 * principal; an accepted principal fits PRINCIPAL_MAX and has its source's form ("jwt:" and a sub
 * with no control character, "sha256:" and 64 hex digits, the header value as sent less the white
 * space around it and never starting "jwt:" or "sha256:"); an accepted raw HS256 token's last
 * part is the base64url HMAC of what precedes it, computed here independently; no raw input ever
 * passes the RS256 verifier (the private key never leaves the harness); nothing is left on
 * OpenSSL's error queue.
 */
#include "principal.h"
#include "ascii.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);

/* What die() (src/util) calls this program, as every program linking idem_util defines it. */
const char program_name[] = "fuzz_gateway_jwt";

/* The seeds in fuzz/seeds/fuzz_gateway_jwt are signed with this secret (its 32 ASCII bytes). */
static const char SECRET[] = "idem-fuzz-gateway-jwt-secret-32b";
#define NOW 1700000000LL

static struct principal_verifier *hs, *hs_claims, *rs, *auth_hash, *by_header;

/* The request's one header value, as principal_of's lookup hands it out. */
struct value {
    const char *bytes;
    size_t len;
};

static const char *lookup(void *arg, const char *name, size_t *value_len)
{
    const struct value *val = arg;

    if (!ascii_caseeq(name, "Authorization") && !ascii_caseeq(name, "X-Consumer-Id")) {
        *value_len = 0;
        return NULL;
    }
    *value_len = val->len;
    return val->bytes;
}

static void b64url(const unsigned char *p, size_t n, char *out, size_t *out_len)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t i, o = 0;

    for (i = 0; i + 2 < n; i += 3) {
        out[o++] = abc[p[i] >> 2];
        out[o++] = abc[(p[i] & 3) << 4 | p[i + 1] >> 4];
        out[o++] = abc[(p[i + 1] & 15) << 2 | p[i + 2] >> 6];
        out[o++] = abc[p[i + 2] & 63];
    }
    if (n - i == 1) {
        out[o++] = abc[p[i] >> 2];
        out[o++] = abc[(p[i] & 3) << 4];
    } else if (n - i == 2) {
        out[o++] = abc[p[i] >> 2];
        out[o++] = abc[(p[i] & 3) << 4 | p[i + 1] >> 4];
        out[o++] = abc[(p[i + 1] & 15) << 2];
    }
    *out_len = o;
}

/* The base64url HMAC-SHA256 of `n` bytes with the secret, into `out` (44 bytes). */
static size_t hmac_b64(const char *input, size_t n, char *out)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    size_t len = 0;

    CHECK(HMAC(EVP_sha256(), SECRET, (int)(sizeof SECRET - 1), (const unsigned char *)input, n, mac,
               &mac_len) != NULL &&
              mac_len == 32,
          "HMAC");
    b64url(mac, mac_len, out, &len);
    return len;
}

static struct principal_verifier *verifier(enum gw_principal_source src, enum gw_jwt_alg alg,
                                           const char *key, size_t key_len, const char *iss,
                                           const char *aud)
{
    struct gw_config cfg;
    struct principal_verifier *v = NULL;
    char err[256];

    memset(&cfg, 0, sizeof cfg);
    cfg.principal = src;
    cfg.principal_header = (char *)"X-Consumer-Id";
    cfg.jwt_alg = alg;
    cfg.jwt_key = (char *)key;
    cfg.jwt_key_len = key_len;
    cfg.jwt_issuer = (char *)iss;
    cfg.jwt_audience = (char *)aud;
    if (principal_verifier_new(&cfg, &v, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_gateway_jwt: %s\n", err);
        abort();
    }
    return v;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    EVP_PKEY *key = EVP_RSA_gen(2048);
    BIO *bio = BIO_new(BIO_s_mem());
    char *pem = NULL;
    long pem_len;

    (void)argc;
    (void)argv;
    CHECK(key != NULL && bio != NULL && PEM_write_bio_PUBKEY(bio, key) == 1, "RSA key");
    pem_len = BIO_get_mem_data(bio, &pem);
    hs = verifier(GW_PRINCIPAL_JWT, GW_JWT_HS256, SECRET, sizeof SECRET - 1, NULL, NULL);
    hs_claims = verifier(GW_PRINCIPAL_JWT, GW_JWT_HS256, SECRET, sizeof SECRET - 1,
                         "https://issuer.example", "idem-gw");
    rs = verifier(GW_PRINCIPAL_JWT, GW_JWT_RS256, pem, (size_t)pem_len, NULL, NULL);
    auth_hash = verifier(GW_PRINCIPAL_AUTHORIZATION, GW_JWT_HS256, NULL, 0, NULL, NULL);
    by_header = verifier(GW_PRINCIPAL_HEADER, GW_JWT_HS256, NULL, 0, NULL, NULL);
    BIO_free(bio);
    EVP_PKEY_free(key);
    return 0;
}

/* Runs one verifier and checks what holds of every answer; returns its result. */
static int check_one(const struct principal_verifier *v, const struct value *val)
{
    char out[PRINCIPAL_MAX + 2];
    const char *why = NULL;
    size_t n, i;
    int rc;

    /* A sentinel past the documented buffer shows a write beyond it. */
    memset(out, 0x5a, sizeof out);
    rc = principal_of(v, lookup, (void *)val, NOW, out, &why);
    CHECK(out[PRINCIPAL_MAX + 1] == 0x5a, "nothing written past PRINCIPAL_MAX + 1");
    CHECK(ERR_peek_error() == 0, "OpenSSL's error queue is left empty");
    CHECK(rc == 0 || rc == -1, "0 or -1");
    if (rc != 0) {
        CHECK(why != NULL && why[0] != '\0', "a refusal says why");
        CHECK(out[0] == '\0', "a refusal leaves no principal");
        return rc;
    }
    n = strnlen(out, PRINCIPAL_MAX + 1);
    CHECK(n >= 1 && n <= PRINCIPAL_MAX, "a principal fits PRINCIPAL_MAX");
    if (v == auth_hash) {
        CHECK(n == 7 + 64 && memcmp(out, "sha256:", 7) == 0, "sha256: and 64 characters");
        for (i = 7; i < n; i++)
            CHECK((out[i] >= '0' && out[i] <= '9') || (out[i] >= 'a' && out[i] <= 'f'),
                  "lowercase hex");
    } else if (v == by_header) {
        size_t from = 0, to = val->len;
        while (from < to && (val->bytes[from] == ' ' || val->bytes[from] == '\t'))
            from++;
        while (to > from && (val->bytes[to - 1] == ' ' || val->bytes[to - 1] == '\t'))
            to--;
        CHECK(n == to - from && memcmp(out, val->bytes + from, n) == 0,
              "the header value as sent, without the white space around it");
        CHECK(strncmp(out, "jwt:", 4) != 0 && strncmp(out, "sha256:", 7) != 0,
              "never in another source's space");
        CHECK(out[0] != ' ' && out[n - 1] != ' ', "no space at either end");
        for (i = 0; i < n; i++)
            CHECK(out[i] >= 0x20 && out[i] <= 0x7e, "visible ASCII and spaces");
    } else {
        CHECK(n > 4 && memcmp(out, "jwt:", 4) == 0, "jwt: and a non-empty sub");
        for (i = 4; i < n; i++)
            CHECK((unsigned char)out[i] >= 0x20 && out[i] != 0x7f, "no control character");
    }
    return rc;
}

/*
 * An HS256 token that passed: the text after its last '.' must be the HMAC of the text before,
 * and the text before starts after "Bearer" and its spaces.
 */
static void check_hmac(const struct value *val)
{
    char mac[48];
    size_t start = 6, dot, n;

    CHECK(val->len > 6 && ascii_ncaseeq(val->bytes, "Bearer", 6), "a Bearer token");
    while (start < val->len && val->bytes[start] == ' ')
        start++;
    for (dot = val->len; dot > start && val->bytes[dot - 1] != '.'; dot--)
        continue;
    CHECK(dot > start, "a signature part");
    n = hmac_b64(val->bytes + start, dot - 1 - start, mac);
    CHECK(val->len - dot == n && memcmp(val->bytes + dot, mac, n) == 0,
          "an accepted HS256 token carries the HMAC of its header and claims");
}

/* "Bearer " b64url(header) "." b64url(claims) "." HMAC: the claims reach the checks. */
static void signed_pass(const uint8_t *hdr, size_t hdr_len, const uint8_t *claims,
                        size_t claims_len)
{
    size_t cap = 7 + (hdr_len + claims_len) / 3 * 4 + 8 + 2 + 44, n = 7, k;
    char *tok = malloc(cap);
    struct value val;

    CHECK(tok != NULL, "malloc");
    memcpy(tok, "Bearer ", 7);
    b64url(hdr, hdr_len, tok + n, &k);
    n += k;
    tok[n++] = '.';
    b64url(claims, claims_len, tok + n, &k);
    n += k;
    k = hmac_b64(tok + 7, n - 7, tok + n + 1);
    tok[n++] = '.';
    n += k;
    CHECK(n <= cap, "token buffer");
    val.bytes = tok;
    val.len = n;
    check_one(hs, &val);
    check_one(hs_claims, &val);
    free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    const uint8_t *nul;
    struct value val;

    CHECK(copy != NULL, "malloc");
    memcpy(copy, data, size);
    val.bytes = copy;
    val.len = size;

    if (check_one(hs, &val) == 0)
        check_hmac(&val);
    if (check_one(hs_claims, &val) == 0)
        check_hmac(&val);
    CHECK(check_one(rs, &val) != 0, "no RS256 token passes without the private key");
    check_one(auth_hash, &val);
    check_one(by_header, &val);
    free(copy);

    nul = memchr(data, '\0', size);
    if (nul != NULL)
        signed_pass(data, (size_t)(nul - data), nul + 1, size - (size_t)(nul - data) - 1);
    return 0;
}
