/* SPDX-License-Identifier: Apache-2.0 */
/*
 * principal.c - who is calling (principal.h): the value of a header an auth layer in front sets,
 * the SHA-256 of the Authorization header, or the `sub` of a JWT verified here with OpenSSL 3
 * (HS256 or RS256) and read with jansson.
 *
 * A JWT is read in the order that keeps a stranger's bytes furthest from anything trusted: the
 * size cap, then the shape (three strict base64url parts), then the header (`alg` exactly the
 * configured one, so neither "none" nor the HS256-with-the-public-key confusion can pass), then
 * the signature, and only then the claims.  Every refusal is a short static sentence for the 401's
 * detail; none says more about the key than "signature invalid".
 */
#include "principal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>

#include "util.h"
#include "jdoc.h"
#include "banned.h"

/* The longest token read at all: checked before any decoding, so nothing larger costs work. */
#define JWT_TOKEN_MAX 8192
/* exp and nbf are checked with this much slack for clocks that disagree (principal.h). */
#define JWT_LEEWAY_S 60
#define SHA256_LEN 32
/* RFC 7518 3.2: an HS256 key must be at least as long as the hash output. */
#define HS256_KEY_MIN SHA256_LEN
#define RSA_BITS_MIN 2048

#define AUTH_PREFIX "sha256:"
#define JWT_PREFIX "jwt:"
#define JWT_SUB_MAX (PRINCIPAL_MAX - (sizeof JWT_PREFIX - 1))

struct principal_verifier {
    enum gw_principal_source source;

    /* GW_PRINCIPAL_HEADER: the header's name and the three refusals that name it. */
    char *header;
    char *why_missing;
    char *why_long;
    char *why_chars;
    char *why_prefix;

    /* GW_PRINCIPAL_JWT */
    enum gw_jwt_alg alg;
    unsigned char *secret; /* HS256; cleansed before it is freed */
    size_t secret_len;
    EVP_PKEY *pkey; /* RS256 */
    char *issuer;   /* NULL: not checked */
    char *audience; /* NULL: not checked */
    int require_exp;

    /* Fetched once: an implicit fetch per request costs a lock and a lookup in the provider. */
    EVP_MD *sha256;
};

static char *format_reason(const char *fmt, const char *name)
{
    size_t n = strlen(fmt) + strlen(name) + 1;
    char *s = xmalloc(n);

    snprintf(s, n, fmt, name);
    return s;
}

/* Parses the PEM public key once; RS256 is RSASSA-PKCS1-v1_5, so only a plain RSA key will do. */
static int load_rsa_key(struct principal_verifier *v, const struct gw_config *cfg, char *err,
                        size_t errlen)
{
    BIO *bio = NULL;
    EVP_PKEY *pkey = NULL;
    int bits, rc = -1;

    if (cfg->jwt_key == NULL || cfg->jwt_key_len == 0) {
        snprintf(err, errlen, "principal.jwt: RS256 needs a PEM public key");
        goto out;
    }
    if (cfg->jwt_key_len > INT_MAX) {
        snprintf(err, errlen, "principal.jwt: the public key is too large");
        goto out;
    }
    bio = BIO_new_mem_buf(cfg->jwt_key, (int)cfg->jwt_key_len);
    if (bio == NULL)
        die("out of memory");
    pkey = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    if (pkey == NULL) {
        snprintf(err, errlen,
                 "principal.jwt: the key is not a PEM public key (-----BEGIN PUBLIC KEY-----)");
        goto out;
    }
    /* The base id, not EVP_PKEY_is_a(): an RSA-PSS key cannot verify PKCS#1 v1.5 signatures. */
    if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_RSA) {
        snprintf(err, errlen, "principal.jwt: RS256 needs an RSA public key");
        goto out;
    }
    bits = EVP_PKEY_get_bits(pkey);
    if (bits < RSA_BITS_MIN) {
        snprintf(err, errlen, "principal.jwt: the RSA key has %d bits, at least %d are needed",
                 bits, RSA_BITS_MIN);
        goto out;
    }
    v->pkey = pkey;
    pkey = NULL;
    rc = 0;
out:
    EVP_PKEY_free(pkey);
    BIO_free(bio);
    /* What OpenSSL queued about a bad key must not surface on a later, unrelated call. */
    ERR_clear_error();
    return rc;
}

int principal_verifier_new(const struct gw_config *cfg, struct principal_verifier **out, char *err,
                           size_t errlen)
{
    struct principal_verifier *v = xcalloc(1, sizeof *v);

    *out = NULL;
    v->source = cfg->principal;
    v->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (v->sha256 == NULL) {
        snprintf(err, errlen, "principal: OpenSSL has no SHA-256");
        goto fail;
    }
    switch (cfg->principal) {
    case GW_PRINCIPAL_HEADER:
        if (cfg->principal_header == NULL || cfg->principal_header[0] == '\0') {
            snprintf(err, errlen, "principal.header: no header named");
            goto fail;
        }
        v->header = xstrdup(cfg->principal_header);
        v->why_missing = format_reason("no %s header", v->header);
        v->why_long = format_reason("%s header too long", v->header);
        v->why_chars =
            format_reason("%s header has characters other than visible ASCII", v->header);
        v->why_prefix = format_reason("%s header starts with jwt: or sha256:, which name the "
                                      "callers of other principal sources",
                                      v->header);
        break;
    case GW_PRINCIPAL_AUTHORIZATION:
        break;
    case GW_PRINCIPAL_JWT:
        v->alg = cfg->jwt_alg;
        if (cfg->jwt_alg == GW_JWT_HS256) {
            if (cfg->jwt_key == NULL || cfg->jwt_key_len < HS256_KEY_MIN) {
                snprintf(err, errlen, "principal.jwt: an HS256 secret needs at least %d bytes",
                         HS256_KEY_MIN);
                goto fail;
            }
            if (cfg->jwt_key_len > INT_MAX) {
                snprintf(err, errlen, "principal.jwt: the secret is too large");
                goto fail;
            }
            v->secret = xmalloc(cfg->jwt_key_len);
            memcpy(v->secret, cfg->jwt_key, cfg->jwt_key_len);
            v->secret_len = cfg->jwt_key_len;
        } else if (cfg->jwt_alg == GW_JWT_RS256) {
            if (load_rsa_key(v, cfg, err, errlen) != 0)
                goto fail;
        } else {
            snprintf(err, errlen, "principal.jwt: unknown algorithm");
            goto fail;
        }
        if (cfg->jwt_issuer != NULL)
            v->issuer = xstrdup(cfg->jwt_issuer);
        if (cfg->jwt_audience != NULL)
            v->audience = xstrdup(cfg->jwt_audience);
        v->require_exp = cfg->jwt_require_exp;
        break;
    default:
        snprintf(err, errlen, "principal: unknown source");
        goto fail;
    }
    *out = v;
    return 0;
fail:
    principal_verifier_free(v);
    return -1;
}

void principal_verifier_free(struct principal_verifier *v)
{
    if (v == NULL)
        return;
    free(v->header);
    free(v->why_missing);
    free(v->why_long);
    free(v->why_chars);
    free(v->why_prefix);
    if (v->secret != NULL)
        OPENSSL_cleanse(v->secret, v->secret_len);
    free(v->secret);
    EVP_PKEY_free(v->pkey);
    free(v->issuer);
    free(v->audience);
    EVP_MD_free(v->sha256);
    free(v);
}

/* ---- header and Authorization ---------------------------------------------------------------- */

/*
 * An HTTP field value's characters (RFC 9110 5.5) less obs-text and HTAB: visible ASCII with
 * spaces between.  The principal is stored and logged; bytes a terminal or a log reader would
 * act on have no place in it.
 */
static int principal_from_header(const struct principal_verifier *v, principal_header_fn header,
                                 void *arg, char out[PRINCIPAL_MAX + 1], const char **why)
{
    size_t len = 0, i;
    const char *val = header(arg, v->header, &len);

    /* Optional white space around a field value is not part of it (RFC 9110 5.5). */
    while (val != NULL && len > 0 && (val[0] == ' ' || val[0] == '\t')) {
        val++;
        len--;
    }
    while (val != NULL && len > 0 && (val[len - 1] == ' ' || val[len - 1] == '\t'))
        len--;
    if (val == NULL || len == 0) {
        *why = v->why_missing;
        return -1;
    }
    /* The other sources' spaces ("jwt:bob", "sha256:..."): a header value cannot enter them. */
    if ((len >= sizeof JWT_PREFIX - 1 && memcmp(val, JWT_PREFIX, sizeof JWT_PREFIX - 1) == 0) ||
        (len >= sizeof AUTH_PREFIX - 1 && memcmp(val, AUTH_PREFIX, sizeof AUTH_PREFIX - 1) == 0)) {
        *why = v->why_prefix;
        return -1;
    }
    if (len > PRINCIPAL_MAX) {
        *why = v->why_long;
        return -1;
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)val[i];

        if (c < 0x20 || c > 0x7e) {
            *why = v->why_chars;
            return -1;
        }
    }
    memcpy(out, val, len);
    out[len] = '\0';
    return 0;
}

/*
 * The SHA-256 of an Authorization value, one caller one digest however the scheme is written: the
 * scheme is case-insensitive and may be followed by several spaces (RFC 9110 11.4), so "bearer  t"
 * is hashed as "Bearer t" -- for Bearer and Basic, whose usual spelling keeps the digests of what
 * clients already sent; any other scheme as sent.
 */
static int authorization_digest(const struct principal_verifier *v, const char *val, size_t len,
                                unsigned char *md, unsigned int *mdlen)
{
    static const char *const schemes[] = {"Bearer", "Basic"};
    EVP_MD_CTX *ctx;
    int ok;

    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t n = strlen(schemes[i]), at = n;
        if (len <= n || val[n] != ' ' || !ascii_ncaseeq(val, schemes[i], n))
            continue;
        while (at < len && val[at] == ' ')
            at++;
        ctx = EVP_MD_CTX_new();
        ok = ctx != NULL && EVP_DigestInit_ex(ctx, v->sha256, NULL) == 1 &&
             EVP_DigestUpdate(ctx, schemes[i], n) == 1 && EVP_DigestUpdate(ctx, " ", 1) == 1 &&
             EVP_DigestUpdate(ctx, val + at, len - at) == 1 &&
             EVP_DigestFinal_ex(ctx, md, mdlen) == 1;
        EVP_MD_CTX_free(ctx);
        return ok ? 0 : -1;
    }
    return EVP_Digest(val, len, md, mdlen, v->sha256, NULL) == 1 ? 0 : -1;
}

static int principal_from_authorization(const struct principal_verifier *v,
                                        principal_header_fn header, void *arg,
                                        char out[PRINCIPAL_MAX + 1], const char **why)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    size_t len = 0;
    const char *val = header(arg, "Authorization", &len);

    if (val == NULL || len == 0) {
        *why = "no Authorization header";
        return -1;
    }
    if (authorization_digest(v, val, len, md, &mdlen) != 0 || mdlen != SHA256_LEN) {
        ERR_clear_error();
        *why = "Authorization could not be hashed";
        return -1;
    }
    memcpy(out, AUTH_PREFIX, sizeof AUTH_PREFIX - 1);
    hex_encode(md, SHA256_LEN, out + sizeof AUTH_PREFIX - 1);
    return 0;
}

/* ---- JWT ------------------------------------------------------------------------------------- */

/* The base64url alphabet (RFC 4648 5) and nothing else: no '+', '/', '=' or white space. */
static int b64url_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

/*
 * Decodes `n` base64url characters into `out` (room for n / 4 * 3 + 2 bytes).  Strict, as RFC 7515
 * 2 asks: no padding, and the bits a short last group leaves over must be zero, so each byte
 * string has exactly one encoding and a token cannot be altered without changing its meaning.
 */
static int b64url_decode(const char *in, size_t n, unsigned char *out, size_t *out_len)
{
    uint32_t acc = 0;
    unsigned bits = 0;
    size_t i, o = 0;

    if (n % 4 == 1)
        return -1;
    for (i = 0; i < n; i++) {
        int d = b64url_value((unsigned char)in[i]);

        if (d < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)d;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0)
        return -1;
    *out_len = o;
    return 0;
}

/* A JSON object of the decoded bytes, duplicate names refused (which `sub` would be meant?). */
static json_t *parse_object(const unsigned char *buf, size_t len)
{
    json_error_t jerr;
    json_t *doc = jdoc_load((const char *)buf, len, JSON_REJECT_DUPLICATES, &jerr);

    if (doc != NULL && !json_is_object(doc)) {
        json_decref(doc);
        doc = NULL;
    }
    return doc;
}

static const char *check_header(const struct principal_verifier *v, const json_t *hdr)
{
    const char *want = v->alg == GW_JWT_RS256 ? "RS256" : "HS256";
    const json_t *alg = json_object_get(hdr, "alg");
    const json_t *typ = json_object_get(hdr, "typ");

    /* Exactly the configured algorithm, so the token cannot choose how it is checked. */
    if (!json_is_string(alg) || strcmp(json_string_value(alg), want) != 0 ||
        json_string_length(alg) != strlen(want))
        return "token algorithm not accepted";
    if (typ != NULL && (!json_is_string(typ) || json_string_length(typ) != 3 ||
                        !ascii_ncaseeq(json_string_value(typ), "JWT", 3)))
        return "token type not accepted";
    /* RFC 7515 4.1.11: extensions we do not know of that the issuer says must be understood. */
    if (json_object_get(hdr, "crit") != NULL)
        return "token has critical extensions";
    return NULL;
}

static const char *check_signature(const struct principal_verifier *v, const char *input,
                                   size_t input_len, const unsigned char *sig, size_t sig_len)
{
    const char *why = "token signature invalid";

    if (v->alg == GW_JWT_HS256) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int mac_len = 0;

        if (HMAC(v->sha256, v->secret, (int)v->secret_len, (const unsigned char *)input, input_len,
                 mac, &mac_len) == NULL) {
            why = "token signature could not be checked";
            goto out;
        }
        /* The length is public; the bytes are compared in constant time. */
        if (mac_len == SHA256_LEN && sig_len == SHA256_LEN &&
            CRYPTO_memcmp(mac, sig, SHA256_LEN) == 0)
            why = NULL;
        OPENSSL_cleanse(mac, sizeof mac);
    } else {
        EVP_MD_CTX *ctx = NULL;
        EVP_PKEY_CTX *pctx = NULL;

        if (sig_len != (size_t)EVP_PKEY_get_size(v->pkey))
            goto out;
        ctx = EVP_MD_CTX_new();
        if (ctx == NULL || EVP_DigestVerifyInit(ctx, &pctx, v->sha256, NULL, v->pkey) != 1 ||
            EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PADDING) != 1) {
            why = "token signature could not be checked";
        } else if (EVP_DigestVerify(ctx, sig, sig_len, (const unsigned char *)input, input_len) ==
                   1) {
            why = NULL;
        }
        EVP_MD_CTX_free(ctx);
    }
out:
    /* A failed verify queues errors on this thread; the next request must not see them. */
    ERR_clear_error();
    return why;
}

/*
 * Compares the NumericDate `claim` (RFC 7519 2: seconds, possibly fractional) with `limit`: -1,
 * 0 or 1 as it is below, at or above it; 2 when it is not a number.
 */
static int compare_date(const json_t *claim, int64_t limit)
{
    if (json_is_integer(claim)) {
        json_int_t n = json_integer_value(claim);

        return n < limit ? -1 : n > limit;
    }
    if (json_is_real(claim)) {
        double d = json_real_value(claim);

        if (!isfinite(d))
            return 2;
        return d < (double)limit ? -1 : d > (double)limit;
    }
    return 2;
}

/* U+0000-U+001F, U+007F and U+0080-U+009F (C2 80 - C2 9F in UTF-8, which jansson has checked). */
static int has_control(const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c < 0x20 || c == 0x7f)
            return 1;
        if (c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] >= 0x80 &&
            (unsigned char)s[i + 1] <= 0x9f)
            return 1;
    }
    return 0;
}

static int audience_matches(const json_t *aud, const char *want)
{
    size_t i;
    const json_t *item;

    if (json_is_string(aud))
        return strcmp(json_string_value(aud), want) == 0 && json_string_length(aud) == strlen(want);
    if (json_is_array(aud)) {
        json_array_foreach(aud, i, item)
        {
            if (json_is_string(item) && strcmp(json_string_value(item), want) == 0 &&
                json_string_length(item) == strlen(want))
                return 1;
        }
    }
    return 0;
}

static const char *check_claims(const struct principal_verifier *v, const json_t *claims,
                                int64_t now_s, char out[PRINCIPAL_MAX + 1])
{
    const json_t *sub = json_object_get(claims, "sub");
    const json_t *exp = json_object_get(claims, "exp");
    const json_t *nbf = json_object_get(claims, "nbf");
    /* Clamped so that a clock at either end of int64_t cannot overflow the leeway. */
    int64_t exp_limit = now_s < INT64_MIN + JWT_LEEWAY_S ? INT64_MIN : now_s - JWT_LEEWAY_S;
    int64_t nbf_limit = now_s > INT64_MAX - JWT_LEEWAY_S ? INT64_MAX : now_s + JWT_LEEWAY_S;
    size_t sub_len;
    int r;

    /* A token without an expiry would be a principal for ever, however it leaked. */
    if (exp == NULL && v->require_exp)
        return "token has no exp";
    /* Expired when now > exp + leeway, that is exp < now - leeway. */
    if (exp != NULL) {
        r = compare_date(exp, exp_limit);
        if (r == 2)
            return "token exp is not a number";
        if (r < 0)
            return "token expired";
    }
    /* Not yet valid when now + leeway < nbf. */
    if (nbf != NULL) {
        r = compare_date(nbf, nbf_limit);
        if (r == 2)
            return "token nbf is not a number";
        if (r > 0)
            return "token not yet valid";
    }
    if (v->issuer != NULL) {
        const json_t *iss = json_object_get(claims, "iss");

        if (!json_is_string(iss) || strcmp(json_string_value(iss), v->issuer) != 0 ||
            json_string_length(iss) != strlen(v->issuer))
            return "token issuer not accepted";
    }
    if (v->audience != NULL && !audience_matches(json_object_get(claims, "aud"), v->audience))
        return "token audience not accepted";
    if (sub == NULL)
        return "token has no sub";
    if (!json_is_string(sub))
        return "token sub is not a string";
    sub_len = json_string_length(sub);
    if (sub_len == 0)
        return "token sub is empty";
    if (sub_len > JWT_SUB_MAX)
        return "token sub too long";
    if (has_control(json_string_value(sub), sub_len))
        return "token sub has control characters";
    memcpy(out, JWT_PREFIX, sizeof JWT_PREFIX - 1);
    memcpy(out + sizeof JWT_PREFIX - 1, json_string_value(sub), sub_len);
    out[sizeof JWT_PREFIX - 1 + sub_len] = '\0';
    return NULL;
}

/*
 * The token of "Authorization: Bearer <token>": the scheme in any case (RFC 9110 11.1), one space
 * or more.  Returns NULL with the token's start and length, or a reason.
 */
static const char *bearer_token(const char *val, size_t len, const char **tok, size_t *tok_len)
{
    static const char scheme[] = "Bearer";
    const size_t slen = sizeof scheme - 1;
    size_t i;

    if (len < slen + 1 || !ascii_ncaseeq(val, scheme, slen) || val[slen] != ' ')
        return "Authorization is not a Bearer token";
    i = slen;
    while (i < len && val[i] == ' ')
        i++;
    if (i == len)
        return "Bearer token missing";
    *tok = val + i;
    *tok_len = len - i;
    return NULL;
}

static int principal_from_jwt(const struct principal_verifier *v, principal_header_fn header,
                              void *arg, int64_t now_s, char out[PRINCIPAL_MAX + 1],
                              const char **why)
{
    /* Every decoded part together is at most 3/4 of the capped token: one buffer holds them. */
    unsigned char dec[JWT_TOKEN_MAX / 4 * 3 + 4];
    const unsigned char *hdr_bytes, *claim_bytes, *sig;
    size_t len = 0, tok_len = 0, dot1, dot2, i, hdr_len, claim_len, sig_len, used;
    const char *val = header(arg, "Authorization", &len), *tok = NULL;
    json_t *hdr = NULL, *claims = NULL;
    int rc = -1;

    *why = NULL;
    if (val == NULL || len == 0) {
        *why = "no Authorization header";
        goto out;
    }
    *why = bearer_token(val, len, &tok, &tok_len);
    if (*why != NULL)
        goto out;
    if (tok_len > JWT_TOKEN_MAX) {
        *why = "token too long";
        goto out;
    }

    /* header "." claims "." signature, nothing more (a JWE has five parts). */
    dot1 = dot2 = tok_len;
    for (i = 0; i < tok_len; i++) {
        if (tok[i] != '.')
            continue;
        if (dot1 == tok_len) {
            dot1 = i;
        } else if (dot2 == tok_len) {
            dot2 = i;
        } else {
            dot2 = tok_len;
            break;
        }
    }
    if (dot1 == tok_len || dot2 == tok_len) {
        *why = "token is not a compact JWS";
        goto out;
    }
    used = 0;
    hdr_bytes = dec;
    if (b64url_decode(tok, dot1, dec, &hdr_len) != 0)
        goto not_b64;
    used += hdr_len;
    claim_bytes = dec + used;
    if (b64url_decode(tok + dot1 + 1, dot2 - dot1 - 1, dec + used, &claim_len) != 0)
        goto not_b64;
    used += claim_len;
    sig = dec + used;
    if (b64url_decode(tok + dot2 + 1, tok_len - dot2 - 1, dec + used, &sig_len) != 0)
        goto not_b64;

    /* Each step runs only if every one before it passed: the claims are read once signed. */
    hdr = parse_object(hdr_bytes, hdr_len);
    *why = hdr == NULL ? "token header is not a JSON object" : check_header(v, hdr);
    /* The signing input is the encoded header and claims as sent, dot included. */
    if (*why == NULL)
        *why = check_signature(v, tok, dot2, sig, sig_len);
    if (*why == NULL && (claims = parse_object(claim_bytes, claim_len)) == NULL)
        *why = "token claims are not a JSON object";
    if (*why == NULL)
        *why = check_claims(v, claims, now_s, out);
    rc = *why == NULL ? 0 : -1;
    goto out;
not_b64:
    *why = "token is not base64url";
out:
    json_decref(hdr);
    json_decref(claims);
    return rc;
}

int principal_of(const struct principal_verifier *v, principal_header_fn header, void *arg,
                 int64_t now_s, char out[PRINCIPAL_MAX + 1], const char **why)
{
    const char *reason = NULL;
    int rc;

    out[0] = '\0';
    switch (v->source) {
    case GW_PRINCIPAL_HEADER:
        rc = principal_from_header(v, header, arg, out, &reason);
        break;
    case GW_PRINCIPAL_AUTHORIZATION:
        rc = principal_from_authorization(v, header, arg, out, &reason);
        break;
    case GW_PRINCIPAL_JWT:
        rc = principal_from_jwt(v, header, arg, now_s, out, &reason);
        break;
    default:
        rc = -1;
        reason = "no principal source";
        break;
    }
    if (rc != 0) {
        out[0] = '\0';
        *why = reason;
    }
    return rc;
}
