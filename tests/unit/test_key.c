/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_key.c - Idempotency-Key parsing (lib/key.c).  The key becomes part of a primary key and
 * shows up in logs, so the table below pins both sides: every shape a client may legitimately
 * send, and every malformed one with the sentence that explains the refusal.
 */
#include "idem/idem.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

struct key_case {
    const char *value;
    size_t len;      /* 0: strlen(value) */
    const char *key; /* expected key, or NULL for a refusal */
    const char *why; /* expected sentence of a refusal */
};

static const struct key_case cases[] = {
    /* bare tokens */
    {"abc", 0, "abc", NULL},
    {"8e03978e-40d5-43e8-bc93-6894a57f9324", 0, "8e03978e-40d5-43e8-bc93-6894a57f9324", NULL},
    {"a", 0, "a", NULL},
    {"!#$%&'()*+-./:;<=>?@[\\]^_`{|}~", 0, "!#$%&'()*+-./:;<=>?@[\\]^_`{|}~", NULL},
    {"a\"b", 0, "a\"b", NULL},
    /* optional white space around the value */
    {"  abc", 0, "abc", NULL},
    {"abc \t ", 0, "abc", NULL},
    {"\t abc\t", 0, "abc", NULL},
    /* sf-strings */
    {"\"abc\"", 0, "abc", NULL},
    {" \"abc\" ", 0, "abc", NULL},
    {"\"a b c\"", 0, "a b c", NULL},
    {"\" \"", 0, " ", NULL},
    {"\"a,b\"", 0, "a,b", NULL},
    {"\"a\\\"b\"", 0, "a\"b", NULL},
    {"\"a\\\\b\"", 0, "a\\b", NULL},
    {"\"\\\\\"", 0, "\\", NULL},
    {"\"\\\"\"", 0, "\"", NULL},
    /* only `len` bytes count */
    {"abcdef", 3, "abc", NULL},
    {"\"abc\"trailing", 5, "abc", NULL},
    /* empty */
    {"", 0, NULL, "key is empty"},
    {"   ", 0, NULL, "key is empty"},
    {" \t", 0, NULL, "key is empty"},
    {"\"\"", 0, NULL, "key is empty"},
    {" \"\" ", 0, NULL, "key is empty"},
    /* quoting errors */
    {"\"abc", 0, NULL, "unterminated quoted string"},
    {"\"", 0, NULL, "unterminated quoted string"},
    {"\"abc\\", 0, NULL, "unterminated quoted string"},
    {"\"abc\\\"", 0, NULL, "unterminated quoted string"},
    {"\"a\\nb\"", 0, NULL, "bad escape in quoted string"},
    {"\"a\\u0041\"", 0, NULL, "bad escape in quoted string"},
    {"\"a\\'\"", 0, NULL, "bad escape in quoted string"},
    {"\"abc\"x", 0, NULL, "text after the closing quote"},
    {"\"abc\" x", 0, NULL, "text after the closing quote"},
    {"\"abc\"\"def\"", 0, NULL, "text after the closing quote"},
    {"\"abc\";q=1", 0, NULL, "text after the closing quote"},
    /* two keys */
    {"abc,def", 0, NULL, "key contains a comma (two keys?)"},
    {"abc, def", 0, NULL, "key contains a comma (two keys?)"},
    {",", 0, NULL, "key contains a comma (two keys?)"},
    {"\"abc\",\"def\"", 0, NULL, "key contains a comma (two keys?)"},
    {"\"abc\" , \"def\"", 0, NULL, "key contains a comma (two keys?)"},
    /* white space inside a bare token */
    {"a b", 0, NULL, "key contains white space (quote it as \"...\")"},
    {"a\tb", 0, NULL, "key contains white space (quote it as \"...\")"},
    /* control and non-ASCII bytes, quoted or not */
    {"a\001b", 0, NULL, "key contains a control or non-ASCII character"},
    {"a\rb", 0, NULL, "key contains a control or non-ASCII character"},
    {"abc\r\n", 0, NULL, "key contains a control or non-ASCII character"},
    {"a\x7f", 0, NULL, "key contains a control or non-ASCII character"},
    {"caf\xc3\xa9", 0, NULL, "key contains a control or non-ASCII character"},
    {"\xff", 0, NULL, "key contains a control or non-ASCII character"},
    {"\"a\001b\"", 0, NULL, "key contains a control or non-ASCII character"},
    {"\"a\tb\"", 0, NULL, "key contains a control or non-ASCII character"},
    {"\"a\nb\"", 0, NULL, "key contains a control or non-ASCII character"},
    {"\"caf\xc3\xa9\"", 0, NULL, "key contains a control or non-ASCII character"},
    {"\"a\x7f\"", 0, NULL, "key contains a control or non-ASCII character"},
    /* a NUL byte inside the given length is a control character, not the end of the value */
    {"ab\0cd", 5, NULL, "key contains a control or non-ASCII character"},
    {"\"ab\0cd\"", 7, NULL, "key contains a control or non-ASCII character"},
    {"\0", 1, NULL, "key contains a control or non-ASCII character"},
};

static void run_table(void)
{
    size_t i;

    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct key_case *c = &cases[i];
        char out[IDEM_KEY_MAX + 1];
        const char *why = "untouched";
        size_t len = c->len ? c->len : strlen(c->value);
        int rc;

        memset(out, 'X', sizeof out);
        rc = idem_key_parse(c->value, len, out, &why);
        if (c->key) {
            CHECK_INT(rc, 0);
            CHECK_STR(out, c->key);
            CHECK(why == NULL);
        } else {
            CHECK_INT(rc, IDEM_EKEY);
            CHECK_STR(why, c->why);
            CHECK_STR(out, "");
        }
        if ((rc == 0) != (c->key != NULL))
            fprintf(stderr, "  (case %zu: \"%s\")\n", i, c->value);
        /* A NULL `why` is allowed and changes nothing else. */
        CHECK_INT(idem_key_parse(c->value, len, out, NULL), rc);
    }
}

/* Builds a key of n 'k' characters, bare or quoted, and checks the 255-character limit. */
static void check_length(size_t n, int quoted, int want_ok)
{
    char *value = malloc(n + 3), out[IDEM_KEY_MAX + 1];
    const char *why = NULL;
    size_t len = 0;
    int rc;

    CHECK(value != NULL);
    if (!value)
        return;
    if (quoted)
        value[len++] = '"';
    memset(value + len, 'k', n);
    len += n;
    if (quoted)
        value[len++] = '"';
    rc = idem_key_parse(value, len, out, &why);
    if (want_ok) {
        CHECK_INT(rc, 0);
        CHECK_INT(strlen(out), n);
    } else {
        CHECK_INT(rc, IDEM_EKEY);
        CHECK_STR(why, "key is longer than 255 characters");
        CHECK_STR(out, "");
    }
    free(value);
}

static void test_lengths(void)
{
    char value[600], out[IDEM_KEY_MAX + 1];
    const char *why = NULL;
    size_t len = 0;

    check_length(1, 0, 1);
    check_length(254, 0, 1);
    check_length(IDEM_KEY_MAX, 0, 1);
    check_length(IDEM_KEY_MAX, 1, 1);
    check_length(IDEM_KEY_MAX + 1, 0, 0);
    check_length(IDEM_KEY_MAX + 1, 1, 0);
    check_length(100000, 0, 0);
    check_length(100000, 1, 0);

    /* The limit counts unquoted characters: 254 plus one escape is 255, and fits. */
    value[len++] = '"';
    memset(value + len, 'q', 254);
    len += 254;
    value[len++] = '\\';
    value[len++] = '"';
    value[len++] = '"';
    CHECK_INT(idem_key_parse(value, len, out, &why), 0);
    CHECK_INT(strlen(out), IDEM_KEY_MAX);
    CHECK(out[254] == '"');
    /* Surrounding white space does not count. */
    memset(value, ' ', 100);
    memset(value + 100, 'w', IDEM_KEY_MAX);
    memset(value + 100 + IDEM_KEY_MAX, '\t', 100);
    CHECK_INT(idem_key_parse(value, 200 + IDEM_KEY_MAX, out, &why), 0);
    CHECK_INT(strlen(out), IDEM_KEY_MAX);
    /* A long value that is also malformed is reported as malformed. */
    memset(value, 'z', 400);
    value[399] = '\x01';
    CHECK_INT(idem_key_parse(value, 400, out, &why), IDEM_EKEY);
    CHECK_STR(why, "key contains a control or non-ASCII character");
}

static void test_arguments(void)
{
    char out[IDEM_KEY_MAX + 1];
    const char *why = NULL;

    CHECK_INT(idem_key_parse(NULL, 3, out, &why), IDEM_EINVAL);
    CHECK(why != NULL);
    CHECK_INT(idem_key_parse("abc", 3, NULL, &why), IDEM_EINVAL);
    CHECK_INT(idem_key_parse("abc", 3, NULL, NULL), IDEM_EINVAL);
}

int main(void)
{
    run_table();
    test_lengths();
    test_arguments();
    return t_done();
}
