/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_principal.c - src/gateway/principal.c: the three principal sources, and JWTs made here with
 * OpenSSL (an HS256 secret, an RSA-2048 key generated for the run) so that every check of the
 * verifier meets a real token: the good ones pass, and each forgery or broken token is refused
 * with its reason -- wrong key, altered claims, "none", the HS256-with-the-public-key confusion,
 * exp / nbf at and past the leeway, iss / aud, sub, strict base64url, the part count and the cap.
 */
#include "principal.h"
#include "ascii.h"

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

#include "strbuf.h"
#include "util.h"
#include "t.h"
#include "banned.h"

const char program_name[] = "test_principal";

#define NOW 1700000000LL

/* ---- a request's headers --------------------------------------------------------------------- */

struct headers {
    const char *name[4];
    const char *value[4];
    size_t len[4];
    size_t n;
    char *copy; /* the value handed out: exactly len bytes, no NUL, so an overread shows in ASan */
};

static const char *lookup(void *arg, const char *name, size_t *value_len)
{
    struct headers *h = arg;
    size_t i;

    for (i = 0; i < h->n; i++) {
        if (!ascii_caseeq(h->name[i], name))
            continue;
        free(h->copy);
        h->copy = xmalloc(h->len[i] ? h->len[i] : 1);
        memcpy(h->copy, h->value[i], h->len[i]);
        *value_len = h->len[i];
        return h->copy;
    }
    *value_len = 0;
    return NULL;
}

static char out[PRINCIPAL_MAX + 1];
static const char *why;

/* principal_of with one header (none when `name` is NULL) of `len` bytes at `value`. */
static int run_n(const struct principal_verifier *v, const char *name, const char *value,
                 size_t len, int64_t now)
{
    struct headers h = {{name, "Content-Type"}, {value, "application/json"}, {len, 16}, 2, NULL};
    int rc;

    if (name == NULL) {
        h.name[0] = "X-Other";
        h.value[0] = "x";
        h.len[0] = 1;
    }
    why = NULL;
    memset(out, 'Z', sizeof out);
    rc = principal_of(v, lookup, &h, now, out, &why);
    free(h.copy);
    if (rc != 0) {
        CHECK(why != NULL && why[0] != '\0');
        CHECK_STR(out, "");
    } else {
        CHECK(strlen(out) <= PRINCIPAL_MAX);
    }
    return rc;
}

static int run(const struct principal_verifier *v, const char *name, const char *value)
{
    return run_n(v, name, value, value ? strlen(value) : 0, NOW);
}

/* Authorization: Bearer <token> at time `now`. */
static int bearer_at(const struct principal_verifier *v, const char *token, int64_t now)
{
    struct strbuf sb = STRBUF_INIT;
    int rc;

    strbuf_adds(&sb, "Bearer ");
    strbuf_adds(&sb, token);
    rc = run_n(v, "Authorization", sb.buf, sb.len, now);
    strbuf_release(&sb);
    return rc;
}

static int bearer(const struct principal_verifier *v, const char *token)
{
    return bearer_at(v, token, NOW);
}

/* ---- making tokens --------------------------------------------------------------------------- */

static void b64url(struct strbuf *sb, const void *data, size_t n)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const unsigned char *p = data;
    size_t i;

    for (i = 0; i + 2 < n; i += 3) {
        strbuf_addch(sb, abc[p[i] >> 2]);
        strbuf_addch(sb, abc[(p[i] & 3) << 4 | p[i + 1] >> 4]);
        strbuf_addch(sb, abc[(p[i + 1] & 15) << 2 | p[i + 2] >> 6]);
        strbuf_addch(sb, abc[p[i + 2] & 63]);
    }
    if (n - i == 1) {
        strbuf_addch(sb, abc[p[i] >> 2]);
        strbuf_addch(sb, abc[(p[i] & 3) << 4]);
    } else if (n - i == 2) {
        strbuf_addch(sb, abc[p[i] >> 2]);
        strbuf_addch(sb, abc[(p[i] & 3) << 4 | p[i + 1] >> 4]);
        strbuf_addch(sb, abc[(p[i + 1] & 15) << 2]);
    }
}

static char *b64url_str(const char *s)
{
    struct strbuf sb = STRBUF_INIT;

    b64url(&sb, s, strlen(s));
    if (sb.buf == NULL)
        strbuf_adds(&sb, "");
    return strbuf_detach(&sb, NULL);
}

/* How a token is signed: HMAC-SHA256 with `key`, RSA PKCS#1 v1.5 with `pkey`, or not at all. */
struct signer {
    const void *key;
    size_t key_len;
    EVP_PKEY *pkey;
};

static void sign_into(struct strbuf *sb, const struct signer *s, const char *input, size_t n)
{
    unsigned char sig[1024];
    size_t sig_len = 0;

    if (s->key != NULL) {
        unsigned int mac_len = 0;

        if (HMAC(EVP_sha256(), s->key, (int)s->key_len, (const unsigned char *)input, n, sig,
                 &mac_len) == NULL)
            die("HMAC failed");
        sig_len = mac_len;
    } else if (s->pkey != NULL) {
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();

        sig_len = sizeof sig;
        if (ctx == NULL || EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, s->pkey) != 1 ||
            EVP_DigestSign(ctx, sig, &sig_len, (const unsigned char *)input, n) != 1)
            die("RSA sign failed");
        EVP_MD_CTX_free(ctx);
    }
    b64url(sb, sig, sig_len);
}

/* "<seg1>.<seg2>.<signature over seg1.seg2>", the segments taken as given (already encoded). */
static char *make_raw(const char *seg1, const char *seg2, const struct signer *s)
{
    struct strbuf sb = STRBUF_INIT;

    strbuf_adds(&sb, seg1);
    strbuf_addch(&sb, '.');
    strbuf_adds(&sb, seg2);
    strbuf_addch(&sb, '.');
    sign_into(&sb, s, sb.buf, sb.len - 1);
    return strbuf_detach(&sb, NULL);
}

/* A signed compact JWS of the header and claims JSON texts. */
static char *make_jws(const char *hdr, const char *claims, const struct signer *s)
{
    char *h = b64url_str(hdr), *c = b64url_str(claims), *tok = make_raw(h, c, s);

    free(h);
    free(c);
    return tok;
}

static char *claims_fmt(const char *fmt, long long a)
{
    struct strbuf sb = STRBUF_INIT;

    strbuf_addf(&sb, fmt, a);
    return strbuf_detach(&sb, NULL);
}

/* Signs `claims` with header `hdr`, presents it at NOW and returns principal_of's result. */
static int try_claims(const struct principal_verifier *v, const char *hdr, const char *claims,
                      const struct signer *s)
{
    char *tok = make_jws(hdr, claims, s);
    int rc = bearer(v, tok);

    free(tok);
    return rc;
}

/* A copy of `tok` with the segment `idx` (0-2) replaced by `seg`. */
static char *replace_segment(const char *tok, int idx, const char *seg)
{
    struct strbuf sb = STRBUF_INIT;
    const char *d1 = strchr(tok, '.'), *d2 = strchr(d1 + 1, '.');

    if (idx == 0) {
        strbuf_adds(&sb, seg);
        strbuf_adds(&sb, d1);
    } else if (idx == 1) {
        strbuf_add(&sb, tok, (size_t)(d1 + 1 - tok));
        strbuf_adds(&sb, seg);
        strbuf_adds(&sb, d2);
    } else {
        strbuf_add(&sb, tok, (size_t)(d2 + 1 - tok));
        strbuf_adds(&sb, seg);
    }
    return strbuf_detach(&sb, NULL);
}

/* A copy of `tok` with its signature a few bytes short (still a valid base64url length). */
static char *cut_signature(const char *tok)
{
    char *t = xstrdup(tok);
    size_t n = strlen(t), sig = n - (size_t)(strrchr(t, '.') + 1 - t);

    do {
        n--;
        sig--;
    } while (sig % 4 != 0);
    t[n] = '\0';
    return t;
}

/* ---- the sources ----------------------------------------------------------------------------- */

static void test_header_source(void)
{
    struct gw_config cfg;
    struct principal_verifier *v = NULL;
    char err[256] = "";
    char big[PRINCIPAL_MAX + 2];

    memset(&cfg, 0, sizeof cfg);
    cfg.principal = GW_PRINCIPAL_HEADER;
    CHECK_INT(principal_verifier_new(&cfg, &v, err, sizeof err), -1);
    CHECK(v == NULL && err[0] != '\0');

    cfg.principal_header = xstrdup("X-Consumer-Id");
    CHECK_INT(principal_verifier_new(&cfg, &v, err, sizeof err), 0);
    /* The verifier keeps its own copy of the name. */
    memset(cfg.principal_header, 'Q', strlen(cfg.principal_header));
    free(cfg.principal_header);

    CHECK_INT(run(v, "X-Consumer-Id", "acme-42"), 0);
    CHECK_STR(out, "acme-42");
    CHECK_INT(run(v, "x-consumer-id", "Acme Corp/EU"), 0); /* names match in any case */
    CHECK_STR(out, "Acme Corp/EU");

    CHECK_INT(run(v, NULL, NULL), -1);
    CHECK_STR(why, "no X-Consumer-Id header");
    CHECK_INT(run(v, "X-Consumer-Id", ""), -1);
    CHECK_STR(why, "no X-Consumer-Id header");
    /* Another source's header is not this one. */
    CHECK_INT(run(v, "Authorization", "Bearer abc"), -1);
    CHECK_STR(why, "no X-Consumer-Id header");

    memset(big, 'a', sizeof big);
    big[PRINCIPAL_MAX] = '\0';
    CHECK_INT(run(v, "X-Consumer-Id", big), 0);
    CHECK_INT(strlen(out), PRINCIPAL_MAX);
    big[PRINCIPAL_MAX] = 'a';
    big[PRINCIPAL_MAX + 1] = '\0';
    CHECK_INT(run(v, "X-Consumer-Id", big), -1);
    CHECK_STR(why, "X-Consumer-Id header too long");

    CHECK_INT(run(v, "X-Consumer-Id", "a\001b"), -1);
    CHECK_STR(why, "X-Consumer-Id header has characters other than visible ASCII");
    CHECK_INT(run(v, "X-Consumer-Id", "a\tb"), -1);
    CHECK_INT(run(v, "X-Consumer-Id", "a\x7f"), -1);
    CHECK_INT(run(v, "X-Consumer-Id", "caf\xc3\xa9"), -1);
    CHECK_INT(run(v, "X-Consumer-Id", "a\r\nX-Evil: 1"), -1);
    CHECK_INT(run_n(v, "X-Consumer-Id", "a\0b", 3, NOW), -1);
    CHECK_STR(why, "X-Consumer-Id header has characters other than visible ASCII");
    /* White space around the value is not part of it: one caller, one principal. */
    CHECK_INT(run(v, "X-Consumer-Id", " \tacme-42 \t"), 0);
    CHECK_STR(out, "acme-42");
    CHECK_INT(run(v, "X-Consumer-Id", "  \t "), -1);
    CHECK_STR(why, "no X-Consumer-Id header");
    /* The other sources' principals cannot be claimed through a header. */
    CHECK_INT(run(v, "X-Consumer-Id", "jwt:bob"), -1);
    CHECK(why != NULL && strstr(why, "starts with jwt: or sha256:") != NULL);
    CHECK_INT(run(v, "X-Consumer-Id", " sha256:c355dce96c1612880d11940ffdd9014d"), -1);
    CHECK_INT(run(v, "X-Consumer-Id", "JWT:bob"), 0); /* the prefixes are lower case */
    principal_verifier_free(v);
    principal_verifier_free(NULL);
}

static void test_authorization_source(void)
{
    struct gw_config cfg;
    struct principal_verifier *v = NULL;
    char err[256] = "";

    memset(&cfg, 0, sizeof cfg);
    cfg.principal = GW_PRINCIPAL_AUTHORIZATION;
    CHECK_INT(principal_verifier_new(&cfg, &v, err, sizeof err), 0);

    /* printf %s 'Bearer abc' | sha256sum */
    CHECK_INT(run(v, "Authorization", "Bearer abc"), 0);
    CHECK_STR(out, "sha256:c355dce96c1612880d11940ffdd9014d386c253e0c3652a6cd06a7226f7bd2b6");
    CHECK_INT(run(v, "authorization", "Bearer abd"), 0);
    CHECK(strncmp(out, "sha256:", 7) == 0 && strlen(out) == 7 + 64);
    CHECK(strcmp(out, "sha256:c355dce96c1612880d11940ffdd9014d386c253e0c3652a6cd06a7226f7bd2b6") !=
          0);
    CHECK_INT(run(v, NULL, NULL), -1);
    CHECK_STR(why, "no Authorization header");
    CHECK_INT(run(v, "Authorization", ""), -1);
    CHECK_STR(why, "no Authorization header");
    /* The scheme in any case and any number of spaces: the digest of "Bearer abc" every time. */
    CHECK_INT(run(v, "Authorization", "bearer abc"), 0);
    CHECK_STR(out, "sha256:c355dce96c1612880d11940ffdd9014d386c253e0c3652a6cd06a7226f7bd2b6");
    CHECK_INT(run(v, "Authorization", "BEARER   abc"), 0);
    CHECK_STR(out, "sha256:c355dce96c1612880d11940ffdd9014d386c253e0c3652a6cd06a7226f7bd2b6");
    /* printf %s 'Basic dTpw' | sha256sum */
    CHECK_INT(run(v, "Authorization", "basic  dTpw"), 0);
    CHECK_STR(out, "sha256:2123f28b8c31d940102abb65b49c444d30215f89379965a58ba413b092e5d9fc");
    /* Other schemes are hashed as sent. */
    CHECK_INT(run(v, "Authorization", "Token abc"), 0);
    CHECK_INT(run(v, "Authorization", "token abc"), 0);
    CHECK(strcmp(out, "sha256:c355dce96c1612880d11940ffdd9014d386c253e0c3652a6cd06a7226f7bd2b6") !=
          0);
    principal_verifier_free(v);
}

/* ---- HS256 ----------------------------------------------------------------------------------- */

static const char HS[] = "{\"alg\":\"HS256\",\"typ\":\"JWT\"}";

static struct principal_verifier *hs_verifier_exp(const unsigned char *secret, size_t n,
                                                  const char *iss, const char *aud, int require_exp)
{
    struct gw_config cfg;
    struct principal_verifier *v = NULL;
    char err[256] = "";

    memset(&cfg, 0, sizeof cfg);
    cfg.principal = GW_PRINCIPAL_JWT;
    cfg.jwt_alg = GW_JWT_HS256;
    cfg.jwt_key = xmalloc(n);
    memcpy(cfg.jwt_key, secret, n);
    cfg.jwt_key_len = n;
    cfg.jwt_issuer = iss ? xstrdup(iss) : NULL;
    cfg.jwt_audience = aud ? xstrdup(aud) : NULL;
    cfg.jwt_require_exp = require_exp;
    if (principal_verifier_new(&cfg, &v, err, sizeof err) != 0) {
        fprintf(stderr, "hs_verifier: %s\n", err);
        v = NULL;
    }
    /* Scribbled over and freed: a verifier that kept a pointer into cfg would read garbage. */
    memset(cfg.jwt_key, 0x55, n);
    free(cfg.jwt_key);
    if (cfg.jwt_issuer)
        memset(cfg.jwt_issuer, 'Q', strlen(cfg.jwt_issuer));
    if (cfg.jwt_audience)
        memset(cfg.jwt_audience, 'Q', strlen(cfg.jwt_audience));
    free(cfg.jwt_issuer);
    free(cfg.jwt_audience);
    return v;
}

/* A verifier for `secret`; exp is not required, as most claims here leave it out. */
static struct principal_verifier *hs_verifier(const unsigned char *secret, size_t n,
                                              const char *iss, const char *aud)
{
    return hs_verifier_exp(secret, n, iss, aud, 0);
}

static void test_hs256(const unsigned char secret[32], const struct signer *hs)
{
    unsigned char other[32];
    const struct signer wrong = {other, sizeof other, NULL};
    const struct signer none = {NULL, 0, NULL};
    struct principal_verifier *v = hs_verifier(secret, 32, NULL, NULL);
    struct gw_config cfg;
    char err[256] = "";
    char *tok, *tok2, *seg, *claims;

    CHECK(v != NULL);
    if (v == NULL)
        return;
    memcpy(other, secret, sizeof other);
    other[31] ^= 1;

    /* A short secret is refused (RFC 7518 3.2), and so is none at all. */
    memset(&cfg, 0, sizeof cfg);
    cfg.principal = GW_PRINCIPAL_JWT;
    cfg.jwt_alg = GW_JWT_HS256;
    cfg.jwt_key = (char *)secret;
    cfg.jwt_key_len = 31;
    {
        struct principal_verifier *w = NULL;

        CHECK_INT(principal_verifier_new(&cfg, &w, err, sizeof err), -1);
        CHECK(w == NULL && strstr(err, "32") != NULL);
        cfg.jwt_key = NULL;
        cfg.jwt_key_len = 0;
        CHECK_INT(principal_verifier_new(&cfg, &w, err, sizeof err), -1);
    }

    /* The good token. */
    tok = make_jws(HS, "{\"sub\":\"user-1\",\"exp\":1700000300}", hs);
    CHECK_INT(bearer(v, tok), 0);
    CHECK_STR(out, "jwt:user-1");

    /* The scheme in any case, several spaces. */
    {
        struct strbuf sb = STRBUF_INIT;

        strbuf_addf(&sb, "bEARER    %s", tok);
        CHECK_INT(run(v, "Authorization", sb.buf), 0);
        CHECK_STR(out, "jwt:user-1");
        strbuf_release(&sb);
        strbuf_addf(&sb, "Bearer\t%s", tok);
        CHECK_INT(run(v, "Authorization", sb.buf), -1);
        CHECK_STR(why, "Authorization is not a Bearer token");
        strbuf_release(&sb);
        strbuf_addf(&sb, "Bearer%s", tok);
        CHECK_INT(run(v, "Authorization", sb.buf), -1);
        CHECK_STR(why, "Authorization is not a Bearer token");
        strbuf_release(&sb);
        strbuf_addf(&sb, "Bearer %s ", tok);
        CHECK_INT(run(v, "Authorization", sb.buf), -1);
        CHECK_STR(why, "token is not base64url");
        strbuf_release(&sb);
    }
    CHECK_INT(run(v, "Authorization", "Basic dXNlcjpwYXNz"), -1);
    CHECK_STR(why, "Authorization is not a Bearer token");
    CHECK_INT(run(v, "Authorization", "Bearer"), -1);
    CHECK_STR(why, "Authorization is not a Bearer token");
    CHECK_INT(run(v, "Authorization", "Bearer   "), -1);
    CHECK_STR(why, "Bearer token missing");
    CHECK_INT(run(v, NULL, NULL), -1);
    CHECK_STR(why, "no Authorization header");
    CHECK_INT(run(v, "Authorization", ""), -1);
    CHECK_STR(why, "no Authorization header");

    /* Signed with another secret. */
    tok2 = make_jws(HS, "{\"sub\":\"user-1\",\"exp\":1700000300}", &wrong);
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);

    /* Claims swapped for others under the first token's signature. */
    seg = b64url_str("{\"sub\":\"admin\",\"exp\":1700000300}");
    tok2 = replace_segment(tok, 1, seg);
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);
    free(seg);

    /* A signature changed, cut short, lengthened, empty. */
    tok2 = xstrdup(tok);
    tok2[strlen(tok2) - 2] = tok2[strlen(tok2) - 2] == 'A' ? 'B' : 'A';
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);
    tok2 = cut_signature(tok);
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);
    tok2 = replace_segment(tok, 2, "");
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);

    /* alg: none, other names and spellings, missing, not a string. */
    tok2 = make_jws("{\"alg\":\"none\",\"typ\":\"JWT\"}", "{\"sub\":\"user-1\"}", &none);
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token algorithm not accepted");
    free(tok2);
    CHECK_INT(try_claims(v, "{\"alg\":\"none\"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"hs256\"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS512\"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"RS256\"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"typ\":\"JWT\"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":[\"HS256\"]}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256 \"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    /* A header naming alg twice: which one would be meant? */
    CHECK_INT(try_claims(v, "{\"alg\":\"none\",\"alg\":\"HS256\"}", "{\"sub\":\"user-1\"}", hs),
              -1);
    CHECK_STR(why, "token header is not a JSON object");

    /* typ: JWT in any case, or absent; crit never. */
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\"}", "{\"sub\":\"user-1\"}", hs), 0);
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\",\"typ\":\"jwt\"}", "{\"sub\":\"user-1\"}", hs), 0);
    CHECK_STR(out, "jwt:user-1");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\",\"typ\":\"JWS\"}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token type not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\",\"typ\":1}", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token type not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\",\"crit\":[\"exp\"],\"exp\":1}",
                         "{\"sub\":\"user-1\"}", hs),
              -1);
    CHECK_STR(why, "token has critical extensions");

    /* Headers and claims that are not JSON objects. */
    CHECK_INT(try_claims(v, "[\"HS256\"]", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token header is not a JSON object");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\"", "{\"sub\":\"user-1\"}", hs), -1);
    CHECK_STR(why, "token header is not a JSON object");
    CHECK_INT(try_claims(v, HS, "\"user-1\"", hs), -1);
    CHECK_STR(why, "token claims are not a JSON object");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"user-1\"} x", hs), -1);
    CHECK_STR(why, "token claims are not a JSON object");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"user-1\",\"sub\":\"admin\"}", hs), -1);
    CHECK_STR(why, "token claims are not a JSON object");
    CHECK_INT(bearer(v, ".."), -1);
    CHECK_STR(why, "token header is not a JSON object");

    /* exp: at the leeway's edge and past it; fractional; not a number; absent. */
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld}", NOW - 60);
    CHECK_INT(try_claims(v, HS, claims, hs), 0);
    free(claims);
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld}", NOW - 61);
    CHECK_INT(try_claims(v, HS, claims, hs), -1);
    CHECK_STR(why, "token expired");
    free(claims);
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld.5}", NOW - 61);
    CHECK_INT(try_claims(v, HS, claims, hs), -1);
    CHECK_STR(why, "token expired");
    free(claims);
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld.0}", NOW - 60);
    CHECK_INT(try_claims(v, HS, claims, hs), 0);
    free(claims);
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld}", NOW - 1000000);
    CHECK_INT(try_claims(v, HS, claims, hs), -1);
    CHECK_STR(why, "token expired");
    free(claims);
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"exp\":\"1800000000\"}", hs), -1);
    CHECK_STR(why, "token exp is not a number");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"exp\":null}", hs), -1);
    CHECK_STR(why, "token exp is not a number");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"exp\":-9223372036854775808}", hs), -1);
    CHECK_STR(why, "token expired");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"exp\":9223372036854775807}", hs), 0);
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"exp\":1e300}", hs), 0);
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\"}", hs), 0);
    /* The same token, presented as time passes. */
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld}", NOW);
    tok2 = make_jws(HS, claims, hs);
    CHECK_INT(bearer_at(v, tok2, NOW + 60), 0);
    CHECK_INT(bearer_at(v, tok2, NOW + 61), -1);
    CHECK_STR(why, "token expired");
    CHECK_INT(bearer_at(v, tok2, INT64_MAX), -1);
    CHECK_INT(bearer_at(v, tok2, INT64_MIN), 0);
    free(tok2);
    free(claims);

    /* nbf: at the leeway's edge and past it. */
    claims = claims_fmt("{\"sub\":\"u\",\"nbf\":%lld}", NOW + 60);
    CHECK_INT(try_claims(v, HS, claims, hs), 0);
    free(claims);
    claims = claims_fmt("{\"sub\":\"u\",\"nbf\":%lld}", NOW + 61);
    CHECK_INT(try_claims(v, HS, claims, hs), -1);
    CHECK_STR(why, "token not yet valid");
    free(claims);
    claims = claims_fmt("{\"sub\":\"u\",\"nbf\":%lld.5}", NOW + 60);
    CHECK_INT(try_claims(v, HS, claims, hs), -1);
    CHECK_STR(why, "token not yet valid");
    free(claims);
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"nbf\":true}", hs), -1);
    CHECK_STR(why, "token nbf is not a number");
    claims = claims_fmt("{\"sub\":\"u\",\"nbf\":%lld,\"exp\":1700000300}", NOW - 10);
    CHECK_INT(try_claims(v, HS, claims, hs), 0);
    free(claims);

    /* sub: required, a string, non-empty, short enough, no control characters. */
    CHECK_INT(try_claims(v, HS, "{\"exp\":1700000300}", hs), -1);
    CHECK_STR(why, "token has no sub");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"\"}", hs), -1);
    CHECK_STR(why, "token sub is empty");
    CHECK_INT(try_claims(v, HS, "{\"sub\":42}", hs), -1);
    CHECK_STR(why, "token sub is not a string");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"a\\u0001b\"}", hs), -1);
    CHECK_STR(why, "token sub has control characters");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"a\\nb\"}", hs), -1);
    CHECK_STR(why, "token sub has control characters");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"a\\u0085b\"}", hs), -1);
    CHECK_STR(why, "token sub has control characters");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"a\\u0000b\"}", hs), -1);
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"caf\\u00e9 \\u20ac\"}", hs), 0);
    CHECK_STR(out, "jwt:caf\xc3\xa9 \xe2\x82\xac");
    {
        char sub[PRINCIPAL_MAX];
        struct strbuf sb = STRBUF_INIT;

        memset(sub, 's', sizeof sub);
        sub[PRINCIPAL_MAX - 4] = '\0';
        strbuf_addf(&sb, "{\"sub\":\"%s\"}", sub);
        CHECK_INT(try_claims(v, HS, sb.buf, hs), 0);
        CHECK_INT(strlen(out), PRINCIPAL_MAX);
        CHECK(strncmp(out, "jwt:sss", 7) == 0);
        strbuf_release(&sb);
        sub[PRINCIPAL_MAX - 4] = 's';
        sub[PRINCIPAL_MAX - 3] = '\0';
        strbuf_addf(&sb, "{\"sub\":\"%s\"}", sub);
        CHECK_INT(try_claims(v, HS, sb.buf, hs), -1);
        CHECK_STR(why, "token sub too long");
        strbuf_release(&sb);
    }

    /* Strict base64url: no padding, no '+' or '/', no stray bits, no white space. */
    {
        struct strbuf sb = STRBUF_INIT;
        char *t3;

        strbuf_adds(&sb, tok);
        strbuf_addch(&sb, '='); /* 32 bytes: 43 characters, 44 with the padding */
        CHECK_INT(bearer(v, sb.buf), -1);
        CHECK_STR(why, "token is not base64url");
        strbuf_release(&sb);

        /* Claims whose encoding a padding character would complete, signed as sent. */
        {
            char *h = b64url_str(HS);
            const char *s2 = "{\"sub\":\"user-12\"}"; /* 17 bytes: 23 characters, 24 padded */
            char *c = b64url_str(s2);
            struct strbuf pc = STRBUF_INIT;

            strbuf_adds(&pc, c);
            strbuf_addch(&pc, '=');
            t3 = make_raw(h, c, hs);
            CHECK_INT(bearer(v, t3), 0);
            CHECK_STR(out, "jwt:user-12");
            free(t3);
            t3 = make_raw(h, pc.buf, hs);
            CHECK_INT(bearer(v, t3), -1);
            CHECK_STR(why, "token is not base64url");
            free(t3);
            /* The last character of c carries 2 unused bits: set one. */
            strbuf_release(&pc);
            strbuf_adds(&pc, c);
            pc.buf[pc.len - 1] = (char)(pc.buf[pc.len - 1] == 'Q' ? 'R' : pc.buf[pc.len - 1] + 1);
            t3 = make_raw(h, pc.buf, hs);
            CHECK_INT(bearer(v, t3), -1);
            CHECK_STR(why, "token is not base64url");
            free(t3);
            strbuf_release(&pc);
            /* Standard base64's characters. */
            strbuf_adds(&pc, c);
            pc.buf[3] = '+';
            t3 = make_raw(h, pc.buf, hs);
            CHECK_INT(bearer(v, t3), -1);
            CHECK_STR(why, "token is not base64url");
            free(t3);
            pc.buf[3] = '/';
            t3 = make_raw(h, pc.buf, hs);
            CHECK_INT(bearer(v, t3), -1);
            free(t3);
            pc.buf[3] = ' ';
            t3 = make_raw(h, pc.buf, hs);
            CHECK_INT(bearer(v, t3), -1);
            CHECK_STR(why, "token is not base64url");
            free(t3);
            strbuf_release(&pc);
            /* A length no base64 has (4n + 1). */
            strbuf_adds(&pc, c);
            strbuf_adds(&pc, "AA");
            t3 = make_raw(h, pc.buf, hs);
            CHECK_INT(bearer(v, t3), -1);
            CHECK_STR(why, "token is not base64url");
            free(t3);
            strbuf_release(&pc);
            free(h);
            free(c);
        }
    }

    /* Not three parts. */
    {
        struct strbuf sb = STRBUF_INIT;

        strbuf_addf(&sb, "%s.%s", tok, "abcd");
        CHECK_INT(bearer(v, sb.buf), -1);
        CHECK_STR(why, "token is not a compact JWS");
        strbuf_release(&sb);
        strbuf_addf(&sb, "%s.", tok);
        CHECK_INT(bearer(v, sb.buf), -1);
        CHECK_STR(why, "token is not a compact JWS");
        strbuf_release(&sb);
        strbuf_addf(&sb, "%s...", tok);
        CHECK_INT(bearer(v, sb.buf), -1);
        CHECK_STR(why, "token is not a compact JWS");
        strbuf_release(&sb);
        CHECK_INT(bearer(v, "abc.def"), -1);
        CHECK_STR(why, "token is not a compact JWS");
        CHECK_INT(bearer(v, "abcdef"), -1);
        CHECK_STR(why, "token is not a compact JWS");
    }

    /* The 8 KiB cap: a valid token of exactly 8192 characters passes, one more is refused. */
    {
        struct strbuf sb = STRBUF_INIT;
        char *pad = xmalloc(8192);
        size_t n, k;
        int found = 0;

        for (n = 6000; n < 6200 && !found; n++) {
            for (k = 0; k < 3 && !found; k++) {
                memset(pad, 'p', n);
                pad[n] = '\0';
                strbuf_release(&sb);
                strbuf_addf(&sb, "{\"alg\":\"HS256\",\"kid\":\"%.*s\"}", (int)k, "kkk");
                claims = claims_fmt("{\"sub\":\"big\",\"exp\":%lld,\"pad\":\"", NOW);
                {
                    struct strbuf cb = STRBUF_INIT;

                    strbuf_adds(&cb, claims);
                    strbuf_adds(&cb, pad);
                    strbuf_adds(&cb, "\"}");
                    tok2 = make_jws(sb.buf, cb.buf, hs);
                    strbuf_release(&cb);
                }
                free(claims);
                if (strlen(tok2) == 8192)
                    found = 1;
                else
                    free(tok2);
            }
        }
        CHECK(found);
        if (found) {
            CHECK_INT(bearer(v, tok2), 0);
            CHECK_STR(out, "jwt:big");
            free(tok2);
        }
        /* One character more, in a signature that would otherwise be checked. */
        strbuf_release(&sb);
        strbuf_addf(&sb, "%s", tok);
        while (sb.len < 8193)
            strbuf_addch(&sb, 'A');
        CHECK_INT(bearer(v, sb.buf), -1);
        CHECK_STR(why, "token too long");
        strbuf_release(&sb);
        free(pad);
    }

    free(tok);
    principal_verifier_free(v);
}

static void test_hs256_iss_aud(const unsigned char secret[32], const struct signer *hs)
{
    struct principal_verifier *v = hs_verifier(secret, 32, "https://issuer.example", "idem-gw");
    struct principal_verifier *only_aud = hs_verifier(secret, 32, NULL, "idem-gw");

    CHECK(v != NULL && only_aud != NULL);
    if (v == NULL || only_aud == NULL)
        goto out;
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":\"https://issuer.example\",\"aud\":\"idem-gw\"}",
                         hs),
              0);
    CHECK_STR(out, "jwt:u");
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":\"https://issuer.example\",\"aud\":[\"other\","
                         "\"idem-gw\"]}",
                         hs),
              0);
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":\"https://evil.example\",\"aud\":\"idem-gw\"}",
                         hs),
              -1);
    CHECK_STR(why, "token issuer not accepted");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"aud\":\"idem-gw\"}", hs), -1);
    CHECK_STR(why, "token issuer not accepted");
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":[\"https://issuer.example\"],"
                         "\"aud\":\"idem-gw\"}",
                         hs),
              -1);
    CHECK_STR(why, "token issuer not accepted");
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":\"https://issuer.example\",\"aud\":\"other\"}",
                         hs),
              -1);
    CHECK_STR(why, "token audience not accepted");
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":\"https://issuer.example\",\"aud\":[\"other\","
                         "\"idem-gw-2\"]}",
                         hs),
              -1);
    CHECK_STR(why, "token audience not accepted");
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\",\"iss\":\"https://issuer.example\"}", hs), -1);
    CHECK_STR(why, "token audience not accepted");
    CHECK_INT(
        try_claims(v, HS, "{\"sub\":\"u\",\"iss\":\"https://issuer.example\",\"aud\":[]}", hs), -1);
    CHECK_STR(why, "token audience not accepted");
    CHECK_INT(try_claims(v, HS,
                         "{\"sub\":\"u\",\"iss\":\"https://issuer.example\",\"aud\":\"IDEM-GW\"}",
                         hs),
              -1);
    CHECK_STR(why, "token audience not accepted");

    /* Unconfigured: iss is not looked at. */
    CHECK_INT(try_claims(only_aud, HS, "{\"sub\":\"u\",\"iss\":7,\"aud\":[\"idem-gw\"]}", hs), 0);
    CHECK_STR(out, "jwt:u");
    /* Unconfigured: aud is not looked at. */
    {
        struct principal_verifier *plain = hs_verifier(secret, 32, NULL, NULL);

        CHECK_INT(try_claims(plain, HS, "{\"sub\":\"u\",\"aud\":\"anyone\"}", hs), 0);
        principal_verifier_free(plain);
    }
out:
    principal_verifier_free(v);
    principal_verifier_free(only_aud);
}

/* ---- RS256 ----------------------------------------------------------------------------------- */

static char *public_pem(EVP_PKEY *pkey, size_t *len)
{
    BIO *bio = BIO_new(BIO_s_mem());
    char *data = NULL, *copy;
    long n;

    if (bio == NULL || PEM_write_bio_PUBKEY(bio, pkey) != 1)
        die("PEM_write_bio_PUBKEY failed");
    n = BIO_get_mem_data(bio, &data);
    copy = xmalloc((size_t)n + 1);
    memcpy(copy, data, (size_t)n);
    copy[n] = '\0';
    *len = (size_t)n;
    BIO_free(bio);
    return copy;
}

static int rs_verifier_new(const char *pem, size_t len, struct principal_verifier **v, char *err,
                           size_t errlen)
{
    struct gw_config cfg;
    int rc;

    memset(&cfg, 0, sizeof cfg);
    cfg.principal = GW_PRINCIPAL_JWT;
    cfg.jwt_alg = GW_JWT_RS256;
    cfg.jwt_key = pem ? xmalloc(len + 1) : NULL;
    if (pem)
        memcpy(cfg.jwt_key, pem, len + 1);
    cfg.jwt_key_len = len;
    rc = principal_verifier_new(&cfg, v, err, errlen);
    if (cfg.jwt_key)
        memset(cfg.jwt_key, 'Q', len);
    free(cfg.jwt_key);
    return rc;
}

static void test_rs256(const unsigned char secret[32])
{
    static const char RS[] = "{\"alg\":\"RS256\",\"typ\":\"JWT\"}";
    EVP_PKEY *key = EVP_RSA_gen(2048), *other = EVP_RSA_gen(2048), *small = EVP_RSA_gen(1024);
    EVP_PKEY *ec = EVP_EC_gen("P-256");
    struct principal_verifier *v = NULL, *w = NULL;
    struct signer rs, rs_other, pem_hmac, hs_signer = {secret, 32, NULL};
    char err[256] = "";
    char *pem = NULL, *pem2 = NULL, *tok = NULL, *tok2, *seg;
    size_t pem_len = 0, pem2_len = 0;

    CHECK(key != NULL && other != NULL && small != NULL && ec != NULL);
    if (key == NULL || other == NULL || small == NULL || ec == NULL)
        goto out;
    rs = (struct signer){NULL, 0, key};
    rs_other = (struct signer){NULL, 0, other};

    /* Keys that will not do: garbage, none, too small, not RSA. */
    CHECK_INT(rs_verifier_new("not a key", 9, &w, err, sizeof err), -1);
    CHECK(w == NULL && strstr(err, "PEM") != NULL);
    CHECK(ERR_peek_error() == 0);
    CHECK_INT(rs_verifier_new(NULL, 0, &w, err, sizeof err), -1);
    pem2 = public_pem(small, &pem2_len);
    CHECK_INT(rs_verifier_new(pem2, pem2_len, &w, err, sizeof err), -1);
    CHECK(strstr(err, "1024") != NULL);
    free(pem2);
    pem2 = public_pem(ec, &pem2_len);
    CHECK_INT(rs_verifier_new(pem2, pem2_len, &w, err, sizeof err), -1);
    CHECK(strstr(err, "RSA") != NULL);
    free(pem2);
    pem2 = NULL;

    pem = public_pem(key, &pem_len);
    CHECK_INT(rs_verifier_new(pem, pem_len, &v, err, sizeof err), 0);
    if (v == NULL)
        goto out;

    tok = make_jws(RS, "{\"sub\":\"user-rs\",\"exp\":1700000300}", &rs);
    CHECK_INT(bearer(v, tok), 0);
    CHECK_STR(out, "jwt:user-rs");
    CHECK(ERR_peek_error() == 0);

    /* Another key's signature, altered claims, a signature of the wrong length. */
    CHECK_INT(try_claims(v, RS, "{\"sub\":\"user-rs\"}", &rs_other), -1);
    CHECK_STR(why, "token signature invalid");
    CHECK(ERR_peek_error() == 0);
    seg = b64url_str("{\"sub\":\"admin\",\"exp\":1700000300}");
    tok2 = replace_segment(tok, 1, seg);
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);
    free(seg);
    tok2 = cut_signature(tok);
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);
    tok2 = replace_segment(tok, 2, "");
    CHECK_INT(bearer(v, tok2), -1);
    CHECK_STR(why, "token signature invalid");
    free(tok2);

    /*
     * Key confusion: an HS256 token whose HMAC secret is the public key's PEM text would pass a
     * verifier that let the token pick the algorithm.
     */
    pem_hmac = (struct signer){pem, pem_len, NULL};
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"admin\"}", &pem_hmac), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"HS256\"}", "{\"sub\":\"admin\"}", &pem_hmac), -1);
    CHECK_STR(why, "token algorithm not accepted");
    /* And the other way round: an RS256 token to the HS256 verifier. */
    {
        struct principal_verifier *hv = hs_verifier(secret, 32, NULL, NULL);

        CHECK_INT(bearer(hv, tok), -1);
        CHECK_STR(why, "token algorithm not accepted");
        CHECK_INT(try_claims(hv, HS, "{\"sub\":\"user-1\"}", &hs_signer), 0);
        principal_verifier_free(hv);
    }
    CHECK_INT(try_claims(v, "{\"alg\":\"PS256\"}", "{\"sub\":\"u\"}", &rs), -1);
    CHECK_STR(why, "token algorithm not accepted");
    CHECK_INT(try_claims(v, "{\"alg\":\"none\"}", "{\"sub\":\"u\"}", &rs), -1);
    CHECK_STR(why, "token algorithm not accepted");

    /* The claims are checked the same way as with HS256. */
    CHECK_INT(try_claims(v, RS, "{\"sub\":\"u\",\"exp\":1699999939}", &rs), -1);
    CHECK_STR(why, "token expired");
    CHECK_INT(try_claims(v, RS, "{\"sub\":\"u\",\"exp\":1699999940}", &rs), 0);
    CHECK_INT(try_claims(v, RS, "{\"sub\":\"u\",\"nbf\":1700000061}", &rs), -1);
    CHECK_STR(why, "token not yet valid");
    CHECK_INT(try_claims(v, RS, "{\"exp\":1700000300}", &rs), -1);
    CHECK_STR(why, "token has no sub");
    CHECK(ERR_peek_error() == 0);

out:
    free(tok);
    free(pem);
    principal_verifier_free(v);
    EVP_PKEY_free(key);
    EVP_PKEY_free(other);
    EVP_PKEY_free(small);
    EVP_PKEY_free(ec);
}

/* principal.jwt.require_exp (the default): a token without exp names no one. */
static void test_exp_required(const unsigned char secret[32], const struct signer *hs)
{
    struct principal_verifier *v = hs_verifier_exp(secret, 32, NULL, NULL, 1);
    char *claims;

    CHECK(v != NULL);
    if (v == NULL)
        return;
    CHECK_INT(try_claims(v, HS, "{\"sub\":\"u\"}", hs), -1);
    CHECK_STR(why, "token has no exp");
    claims = claims_fmt("{\"sub\":\"u\",\"exp\":%lld}", NOW + 300);
    CHECK_INT(try_claims(v, HS, claims, hs), 0);
    CHECK_STR(out, "jwt:u");
    free(claims);
    principal_verifier_free(v);
}

int main(void)
{
    unsigned char secret[32];
    struct signer hs;
    size_t i;

    /* A NUL among the secret's bytes: its length, not strlen, is what counts. */
    for (i = 0; i < sizeof secret; i++)
        secret[i] = (unsigned char)(i * 37 + 11);
    secret[5] = 0;
    hs = (struct signer){secret, sizeof secret, NULL};

    test_header_source();
    test_authorization_source();
    test_hs256(secret, &hs);
    test_hs256_iss_aud(secret, &hs);
    test_exp_required(secret, &hs);
    test_rs256(secret);
    return t_done();
}
