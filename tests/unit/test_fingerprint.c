/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_fingerprint.c - request fingerprints (lib/fingerprint.c).  A fingerprint that changes for
 * the same request turns a retry into a 422; one that stays the same for different requests
 * replays the wrong response.  Both directions are checked, and known answers pin the encoding
 * (they were computed independently, with Python's hashlib over the documented framing), since
 * fingerprints are stored and must not change between releases.
 */
#include "idem/idem.h"
#include "t.h"

#include <string.h>

struct req {
    const char *method;
    const char *route;
    const char *params[3];
    size_t nparams;
    const char *body; /* NULL: no body */
};

static int fp_of(const struct req *r, unsigned char fp[IDEM_FP_LEN], const char **why)
{
    return idem_fingerprint(r->method, r->route, r->params, r->nparams, r->body,
                            r->body ? strlen(r->body) : 0, fp, why);
}

static void hex_of(const struct req *r, char hex[2 * IDEM_FP_LEN + 1])
{
    unsigned char fp[IDEM_FP_LEN];

    memset(hex, 0, 2 * IDEM_FP_LEN + 1);
    CHECK_INT(fp_of(r, fp, NULL), 0);
    idem_fingerprint_hex(fp, hex);
}

static const struct req base = {
    "POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":1,\"a\":[1,2]}"};

/* Each of these is the base request spelled differently: the fingerprint must not move. */
static const struct req same_as_base[] = {
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"a\":[1,2],\"b\":1}"},
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, " {\n \"b\" : 1 ,\t\"a\" : [ 1 , 2 ] } "},
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"\\u0062\":1.0,\"a\":[1E0,20e-1]}"},
};

/* Each of these differs from the base in one thing: the fingerprint must move. */
static const struct req differs_from_base[] = {
    {"PUT", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":1,\"a\":[1,2]}"},
    {"post", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":1,\"a\":[1,2]}"},
    {"POST", "/api/orders/{id}/refund", {"42"}, 1, "{\"b\":1,\"a\":[1,2]}"},
    {"POST", "/api/orders/{id}/cancel", {"43"}, 1, "{\"b\":1,\"a\":[1,2]}"},
    {"POST", "/api/orders/{id}/cancel", {"42", ""}, 2, "{\"b\":1,\"a\":[1,2]}"},
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":1,\"a\":[2,1]}"},
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":\"1\",\"a\":[1,2]}"},
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":1,\"a\":[1,2],\"c\":null}"},
    {"POST", "/api/orders/{id}/cancel", {"42"}, 1, NULL},
};

static void test_same_and_different(void)
{
    char want[2 * IDEM_FP_LEN + 1], got[2 * IDEM_FP_LEN + 1];
    size_t i;

    hex_of(&base, want);
    for (i = 0; i < sizeof same_as_base / sizeof same_as_base[0]; i++) {
        hex_of(&same_as_base[i], got);
        CHECK_STR(got, want);
    }
    for (i = 0; i < sizeof differs_from_base / sizeof differs_from_base[0]; i++) {
        hex_of(&differs_from_base[i], got);
        CHECK(strcmp(got, want) != 0);
    }
}

/* Pairs whose naive concatenation would be equal; the length prefixes keep them apart. */
static void test_framing(void)
{
    static const struct req pairs[][2] = {
        {{"POST", "/r", {"ab", "c"}, 2, NULL}, {"POST", "/r", {"a", "bc"}, 2, NULL}},
        {{"POST", "/r", {"a"}, 1, NULL}, {"POST", "/r", {"", "a"}, 2, NULL}},
        {{"POST", "/r", {0}, 0, NULL}, {"POST", "/r", {""}, 1, NULL}},
        {{"POS", "T/r", {0}, 0, NULL}, {"POST", "/r", {0}, 0, NULL}},
        {{"POST", "/r", {"x"}, 1, NULL}, {"POST", "/rx", {0}, 0, NULL}},
        /* no body is not the empty object, nor null, nor the empty string */
        {{"POST", "/r", {0}, 0, NULL}, {"POST", "/r", {0}, 0, "{}"}},
        {{"POST", "/r", {0}, 0, NULL}, {"POST", "/r", {0}, 0, "null"}},
        {{"POST", "/r", {0}, 0, NULL}, {"POST", "/r", {0}, 0, "\"\""}},
        {{"POST", "/r", {0}, 0, "{}"}, {"POST", "/r", {0}, 0, "[]"}},
    };
    char a[2 * IDEM_FP_LEN + 1], b[2 * IDEM_FP_LEN + 1];
    size_t i;

    for (i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        hex_of(&pairs[i][0], a);
        hex_of(&pairs[i][1], b);
        CHECK(strcmp(a, b) != 0);
    }
}

static const char order_body[] = "{\"total\":1999e-2,\"items\":[{\"sku\":\"A\",\"qty\":2}]}";

static void test_known_answers(void)
{
    static const struct {
        struct req r;
        const char *hex;
    } known[] = {
        {{"POST", "/api/orders/{id}/cancel", {"42"}, 1, "{\"b\":1,\"a\":[1,2]}"},
         "3021c666526e24e8f1f91b3b7cfcca80b9743fdc034cdb15aac94c205334aae9"},
        {{"GET", "/api/orders/{id}", {"7"}, 1, NULL},
         "5a04cd9273254851c6dca85864726ebde0b597235134a827be826b68a435b99f"},
        {{"POST", "/api/orders", {0}, 0, order_body},
         "c13f7bd4f0d90e54f40c0ccc4ba4257927dcca4d1b5515dedb8e4d08d793d031"},
    };
    char got[2 * IDEM_FP_LEN + 1];
    size_t i;

    for (i = 0; i < sizeof known / sizeof known[0]; i++) {
        hex_of(&known[i].r, got);
        CHECK_STR(got, known[i].hex);
    }
}

static void test_errors(void)
{
    static const char *const one[] = {"1"};
    static const char *const with_null[] = {"1", NULL};
    unsigned char fp[IDEM_FP_LEN];
    char deep[2 * (IDEM_JSON_MAX_DEPTH + 1)];
    const char *why = NULL;

    CHECK_INT(idem_fingerprint("POST", "/r", NULL, 0, "{\"a\":", 5, fp, &why), IDEM_EJSON);
    CHECK(why != NULL);
    why = NULL;
    CHECK_INT(idem_fingerprint("POST", "/r", NULL, 0, "{\"a\":1,\"a\":1}", 13, fp, &why),
              IDEM_EDUPKEY);
    CHECK(why != NULL);
    memset(deep, '[', IDEM_JSON_MAX_DEPTH + 1);
    memset(deep + IDEM_JSON_MAX_DEPTH + 1, ']', IDEM_JSON_MAX_DEPTH + 1);
    CHECK_INT(idem_fingerprint("POST", "/r", NULL, 0, deep, sizeof deep, fp, NULL), IDEM_EDEPTH);
    CHECK_INT(idem_fingerprint(NULL, "/r", NULL, 0, NULL, 0, fp, &why), IDEM_EINVAL);
    CHECK_INT(idem_fingerprint("POST", NULL, NULL, 0, NULL, 0, fp, &why), IDEM_EINVAL);
    CHECK_INT(idem_fingerprint("POST", "/r", NULL, 1, NULL, 0, fp, &why), IDEM_EINVAL);
    CHECK_INT(idem_fingerprint("POST", "/r", with_null, 2, NULL, 0, fp, &why), IDEM_EINVAL);
    CHECK_INT(idem_fingerprint("POST", "/r", one, 1, NULL, 3, fp, &why), IDEM_EINVAL);
    CHECK_INT(idem_fingerprint("POST", "/r", one, 1, NULL, 0, NULL, &why), IDEM_EINVAL);
    why = "untouched";
    CHECK_INT(idem_fingerprint("POST", "/r", one, 1, NULL, 0, fp, &why), 0);
    CHECK(why == NULL);
}

static void test_hex(void)
{
    unsigned char fp[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1];
    size_t i;

    for (i = 0; i < IDEM_FP_LEN; i++)
        fp[i] = (unsigned char)(i * 0x11 + 0x0f);
    memset(hex, 'X', sizeof hex);
    idem_fingerprint_hex(fp, hex);
    CHECK_STR(hex, "0f2031425364758697a8b9cadbecfd0e1f30415263748596a7b8c9daebfc0d1e");
    memset(fp, 0, sizeof fp);
    idem_fingerprint_hex(fp, hex);
    CHECK_STR(hex, "0000000000000000000000000000000000000000000000000000000000000000");
    memset(fp, 0xff, sizeof fp);
    idem_fingerprint_hex(fp, hex);
    CHECK_STR(hex, "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff");
}

int main(void)
{
    test_same_and_different();
    test_framing();
    test_known_answers();
    test_errors();
    test_hex();
    return t_done();
}
