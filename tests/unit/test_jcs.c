/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_jcs.c - RFC 8785 canonicalisation (lib/jcs.c).  The fingerprint of every request rests on
 * this text being the same for the same JSON value and different for different ones, so the
 * RFC's own examples and its Appendix B number table are checked byte for byte, from the
 * data-driven files data/jcs.test and data/jcs_numbers.txt; limits (depth, size) and inputs that
 * cannot be written in a text file are built here.
 */
#include "idem/idem.h"
#include "t.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Canonicalises `in` and compares with `want`, or with the error name when `want` is "!NAME". */
static void expect(const char *in, size_t len, const char *want, int line)
{
    char *out = NULL;
    size_t out_len = 12345;
    const char *why = NULL;
    int rc = idem_jcs_canonicalize(in, len, &out, &out_len, &why);

    if (want[0] == '!') {
        CHECK_STR(idem_err_name(rc), want + 1);
        CHECK(out == NULL);
        CHECK_INT(out_len, 0);
        CHECK(why != NULL);
    } else {
        CHECK_INT(rc, 0);
        CHECK(why == NULL);
        CHECK_STR(out, want);
        if (out)
            CHECK_INT(out_len, strlen(out));
        if (rc == 0 && out && strcmp(out, want) != 0)
            fprintf(stderr, "  (case at line %d)\n", line);
    }
    idem_free(out);
}

static FILE *open_data(const char *name)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof path, "data/%s", name);
    f = fopen(path, "r");
    if (!f)
        fprintf(stderr, "cannot open %s (run from the tests directory)\n", path);
    return f;
}

static void chomp(char *s)
{
    size_t n = strlen(s);

    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

/* data/jcs.test: input line, expected line, blank line; '#' lines are comments. */
static void run_cases(void)
{
    FILE *f = open_data("jcs.test");
    char *in = NULL, *want = NULL;
    size_t incap = 0, wantcap = 0;
    int line = 0, cases = 0;

    CHECK(f != NULL);
    if (!f)
        return;
    while (getline(&in, &incap, f) > 0) {
        line++;
        chomp(in);
        if (in[0] == '#' || in[0] == '\0')
            continue;
        if (getline(&want, &wantcap, f) <= 0)
            break;
        line++;
        chomp(want);
        expect(in, strlen(in), want, line);
        cases++;
    }
    CHECK(cases >= 45);
    free(in);
    free(want);
    fclose(f);
}

/* data/jcs_numbers.txt: "0x<IEEE 754 bits> text" or "<JSON number> text". */
static void run_numbers(void)
{
    FILE *f = open_data("jcs_numbers.txt");
    char line[256], in[64], want[64], json[80];
    uint64_t bits;
    double d;
    int n = 0;

    CHECK(f != NULL);
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%63s %63s", in, want) != 2) {
            CHECK(!"malformed line in jcs_numbers.txt");
            continue;
        }
        if (strncmp(in, "0x", 2) == 0) {
            bits = strtoull(in + 2, NULL, 16);
            memcpy(&d, &bits, sizeof d);
            /* 17 significant digits read back as exactly this double. */
            snprintf(json, sizeof json, "%.17g", d);
        } else {
            snprintf(json, sizeof json, "%s", in);
        }
        expect(json, strlen(json), want, n);
        /* Inside an array and an object the number must print the same. */
        {
            char wrapped[160], wwant[160];
            snprintf(wrapped, sizeof wrapped, "[ %s ]", json);
            snprintf(wwant, sizeof wwant, "[%s]", want);
            expect(wrapped, strlen(wrapped), wwant, n);
            snprintf(wrapped, sizeof wrapped, "{\"n\": %s}", json);
            snprintf(wwant, sizeof wwant, "{\"n\":%s}", want);
            expect(wrapped, strlen(wrapped), wwant, n);
        }
        n++;
    }
    CHECK(n >= 24 + 20);
    fclose(f);
}

/* n nested arrays ("[[...]]"), or objects ({"a":{"a":...}}) when `objects` is set. */
static char *nested(int n, int objects)
{
    size_t cap = (size_t)n * 6 + 8, pos = 0;
    char *s = malloc(cap);
    int i;

    if (!s)
        return NULL;
    for (i = 0; i < n; i++) {
        if (objects) {
            memcpy(s + pos, "{\"a\":", 5);
            pos += 5;
        } else {
            s[pos++] = '[';
        }
    }
    s[pos++] = '1';
    for (i = 0; i < n; i++)
        s[pos++] = objects ? '}' : ']';
    s[pos] = '\0';
    return s;
}

static void test_depth(void)
{
    static const struct {
        int n, objects;
        const char *want_err; /* NULL: must succeed */
    } cases[] = {
        {1, 0, NULL},
        {63, 0, NULL},
        {IDEM_JSON_MAX_DEPTH, 0, NULL},
        {IDEM_JSON_MAX_DEPTH, 1, NULL},
        {IDEM_JSON_MAX_DEPTH + 1, 0, "IDEM_EDEPTH"},
        {IDEM_JSON_MAX_DEPTH + 1, 1, "IDEM_EDEPTH"},
        {1000, 0, "IDEM_EDEPTH"},
        /* deeper than jansson's own parser limit (2048): still EDEPTH, and no stack overflow */
        {5000, 0, "IDEM_EDEPTH"},
        {5000, 1, "IDEM_EDEPTH"},
        {200000, 0, "IDEM_EDEPTH"},
    };
    size_t i;

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *in = nested(cases[i].n, cases[i].objects);
        char *out = NULL;
        const char *why = NULL;
        int rc;

        CHECK(in != NULL);
        if (!in)
            continue;
        rc = idem_jcs_canonicalize(in, strlen(in), &out, NULL, &why);
        if (cases[i].want_err) {
            CHECK_STR(idem_err_name(rc), cases[i].want_err);
            CHECK(why != NULL);
        } else {
            /* Already canonical: the output is the input. */
            CHECK_INT(rc, 0);
            CHECK_STR(out, in);
        }
        idem_free(out);
        free(in);
    }

    /* The limit counts containers around a value, not the members beside it. */
    {
        char *at = nested(IDEM_JSON_MAX_DEPTH, 0), *below = nested(IDEM_JSON_MAX_DEPTH - 1, 0);
        char *in = NULL, *out = NULL;
        size_t n = at ? strlen(at) + 32 : 0;

        in = n ? malloc(n) : NULL;
        CHECK(in != NULL && below != NULL);
        if (in && below) {
            snprintf(in, n, "{\"a\":1,\"b\":%s}", at);
            CHECK_INT(idem_jcs_canonicalize(in, strlen(in), &out, NULL, NULL), IDEM_EDEPTH);
            idem_free(out);
            out = NULL;
            snprintf(in, n, "{\"a\":1,\"b\":%s}", below);
            CHECK_INT(idem_jcs_canonicalize(in, strlen(in), &out, NULL, NULL), 0);
            CHECK_STR(out, in);
            idem_free(out);
        }
        free(in);
        free(at);
        free(below);
    }
}

/* Inputs with raw bytes or lengths a text file cannot show. */
static void test_raw(void)
{
    static const struct {
        const char *in;
        size_t len;
        const char *want;
    } cases[] = {
        /* white space of every JSON kind, and member order, do not matter */
        {" \t\r\n{ \"b\" :\n1 ,\r\n\t\"a\" : [ 1 , 2 ] }\n ", 0, "{\"a\":[1,2],\"b\":1}"},
        {"{\"a\":[1,2],\"b\":1}", 0, "{\"a\":[1,2],\"b\":1}"},
        {"{\"b\":1.0,\"a\":[1E0,2e0]}", 0, "{\"a\":[1,2],\"b\":1}"},
        /* raw UTF-8, DEL and U+FFFF pass through unescaped */
        {"\"caf\xc3\xa9 \x7f \xef\xbf\xbf \xf0\x9f\x98\x80\"", 0,
         "\"caf\xc3\xa9 \x7f \xef\xbf\xbf \xf0\x9f\x98\x80\""},
        /* only `len` bytes are read: the rest of the buffer is not part of the body */
        {"[1,2]garbage", 5, "[1,2]"},
        /* a raw NUL byte is not allowed in JSON text, even inside a string */
        {"\"a\0b\"", 5, "!IDEM_EJSON"},
        /* invalid UTF-8: a lone continuation byte, an overlong form, a surrogate, a cut sequence */
        {"\"\x80\"", 0, "!IDEM_EJSON"},
        {"\"\xc0\xaf\"", 0, "!IDEM_EJSON"},
        {"\"\xed\xa0\x80\"", 0, "!IDEM_EJSON"},
        {"\"\xe2\x82\"", 0, "!IDEM_EJSON"},
        /* a raw control character inside a string is not JSON */
        {"\"a\tb\"", 0, "!IDEM_EJSON"},
        /* nothing at all, or only white space */
        {"", 0, "!IDEM_EJSON"},
        {" \n\t", 0, "!IDEM_EJSON"},
        /* a byte-order mark is not JSON white space */
        {"\xef\xbb\xbf{}", 0, "!IDEM_EJSON"},
    };
    size_t i;

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].in);
        expect(cases[i].in, len, cases[i].want, (int)i);
    }
}

/* Different spellings of one value give one canonical text, and different values do not. */
static void test_equivalence(void)
{
    static const char *const same[] = {
        "{\"id\":\"o-1\",\"items\":[{\"sku\":\"A\",\"qty\":2},{\"sku\":\"B\",\"qty\":1}],"
        "\"total\":19.99}",
        "{ \"total\" : 1999e-2, \"items\" : [ { \"qty\" : 2.0, \"sku\" : \"\\u0041\" }, "
        "{ \"qty\" : 1, \"sku\" : \"B\" } ], \"id\" : \"o\\u002d1\" }",
        "{\"items\":[{\"qty\":20e-1,\"sku\":\"A\"},{\"sku\":\"\\u0042\",\"qty\":0.1e1}],"
        "\"\\u0069d\":\"o-1\",\"total\":19.990}",
    };
    static const char *const differ[] = {
        /* array order is meaningful */
        "{\"id\":\"o-1\",\"items\":[{\"sku\":\"B\",\"qty\":1},{\"sku\":\"A\",\"qty\":2}],"
        "\"total\":19.99}",
        "{\"id\":\"o-1\",\"items\":[{\"sku\":\"A\",\"qty\":2},{\"sku\":\"B\",\"qty\":1}],"
        "\"total\":\"19.99\"}",
        "{\"id\":\"o-1\",\"items\":[{\"sku\":\"A\",\"qty\":2},{\"sku\":\"B\",\"qty\":1}],"
        "\"total\":19.99,\"note\":null}",
    };
    char *first = NULL, *out = NULL;
    size_t i;

    CHECK_INT(idem_jcs_canonicalize(same[0], strlen(same[0]), &first, NULL, NULL), 0);
    for (i = 1; first && i < sizeof same / sizeof same[0]; i++) {
        CHECK_INT(idem_jcs_canonicalize(same[i], strlen(same[i]), &out, NULL, NULL), 0);
        CHECK_STR(out, first);
        idem_free(out);
        out = NULL;
    }
    for (i = 0; first && i < sizeof differ / sizeof differ[0]; i++) {
        CHECK_INT(idem_jcs_canonicalize(differ[i], strlen(differ[i]), &out, NULL, NULL), 0);
        CHECK(out && strcmp(out, first) != 0);
        idem_free(out);
        out = NULL;
    }
    /* The canonical form is a fixed point. */
    if (first) {
        CHECK_INT(idem_jcs_canonicalize(first, strlen(first), &out, NULL, NULL), 0);
        CHECK_STR(out, first);
        idem_free(out);
    }
    idem_free(first);
}

static void test_limits_and_arguments(void)
{
    char *out = NULL, *big = NULL;
    size_t out_len = 7, n, i;
    const char *why = NULL;

    /* NULL text with a length, or nowhere to put the result */
    CHECK_INT(idem_jcs_canonicalize(NULL, 3, &out, &out_len, &why), IDEM_EINVAL);
    CHECK(out == NULL);
    CHECK(why != NULL);
    CHECK_INT(idem_jcs_canonicalize("{}", 2, NULL, &out_len, NULL), IDEM_EINVAL);
    /* NULL text of length 0 is simply not JSON */
    CHECK_INT(idem_jcs_canonicalize(NULL, 0, &out, NULL, NULL), IDEM_EJSON);

    /* A body over the 16 MiB cap is refused before it is parsed. */
    n = (size_t)16 * 1024 * 1024 + 2;
    big = malloc(n);
    CHECK(big != NULL);
    if (big) {
        memset(big, ' ', n);
        big[n - 1] = '1';
        why = NULL;
        CHECK_INT(idem_jcs_canonicalize(big, n, &out, NULL, &why), IDEM_ETOOBIG);
        CHECK(out == NULL);
        CHECK(why != NULL);
        free(big);
    }

    /* "1e15" grows to 16 bytes: 1 Mi of them would canonicalise past the cap. */
    n = (size_t)1024 * 1024 * 5 + 2;
    big = malloc(n);
    CHECK(big != NULL);
    if (big) {
        big[0] = '[';
        for (i = 0; i < 1024 * 1024; i++)
            memcpy(big + 1 + 5 * i, "1e15,", 5);
        big[n - 2] = ']';
        big[n - 1] = '\0';
        CHECK_INT(idem_jcs_canonicalize(big, n - 1, &out, NULL, NULL), IDEM_ETOOBIG);
        CHECK(out == NULL);
        free(big);
    }
}

/* The nesting scan that refuses deep input before jansson parses it. */
static void test_nesting_scan(void)
{
    static const char deep_string[] = "{\"a\":\"[[[[{{{{\\\"]]]\"}";
    CHECK_INT(idem_json_nesting("", 0), 0);
    CHECK_INT(idem_json_nesting("1", 1), 0);
    CHECK_INT(idem_json_nesting("[]", 2), 1);
    CHECK_INT(idem_json_nesting("{\"a\":[{\"b\":[1]}]}", strlen("{\"a\":[{\"b\":[1]}]}")), 4);
    /* Brackets inside strings, escaped quotes included, do not count. */
    CHECK_INT(idem_json_nesting(deep_string, sizeof deep_string - 1), 1);
    CHECK_INT(idem_json_nesting("[[]][[[]]]", 10), 3);
}

int main(void)
{
    test_nesting_scan();
    run_cases();
    run_numbers();
    test_depth();
    test_raw();
    test_equivalence();
    test_limits_and_arguments();
    return t_done();
}
