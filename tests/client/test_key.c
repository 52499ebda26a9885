/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_key.c - the keys libidem-client sends (lib/client/key.c).  A generated key must be a
 * well-formed UUID version 4 (RFC 9562: version nibble 4, variant bits 10) with fresh random bits
 * each time; a caller's key must be one a server takes verbatim, which is checked against
 * libidem's own parser (idem_key_parse) so that the client and the server never disagree on what
 * the key is.
 */
#include "idem/client.h"
#include "idem/idem.h"
#include "t.h"

#include <stdlib.h>
#include <string.h>

#define N_KEYS 2000

static int is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static int cmp_keys(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static void test_uuid_format(void)
{
    static char keys[N_KEYS][IDEM_CLIENT_UUID_LEN + 1];
    char parsed[IDEM_KEY_MAX + 1];
    int i, k, bad_format = 0, bad_version = 0, bad_variant = 0, dups = 0;
    int seen_variant[4] = {0, 0, 0, 0};
    unsigned nibble_or = 0, nibble_and = 0xf;

    for (i = 0; i < N_KEYS; i++) {
        CHECK_INT(idem_client_key_new(keys[i]), 0);
        if (strlen(keys[i]) != IDEM_CLIENT_UUID_LEN)
            bad_format++;
        for (k = 0; k < IDEM_CLIENT_UUID_LEN; k++) {
            if (k == 8 || k == 13 || k == 18 || k == 23) {
                if (keys[i][k] != '-')
                    bad_format++;
            } else if (!is_lower_hex(keys[i][k])) {
                bad_format++;
            }
        }
        /* xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx with V in 8, 9, a, b */
        if (keys[i][14] != '4')
            bad_version++;
        switch (keys[i][19]) {
        case '8':
            seen_variant[0]++;
            break;
        case '9':
            seen_variant[1]++;
            break;
        case 'a':
            seen_variant[2]++;
            break;
        case 'b':
            seen_variant[3]++;
            break;
        default:
            bad_variant++;
        }
        /* A random nibble position takes both bit values over many keys. */
        {
            unsigned v = (unsigned)strtoul((char[]){keys[i][0], '\0'}, NULL, 16);
            nibble_or |= v;
            nibble_and &= v;
        }
        /* The server's parser takes the key as it is. */
        CHECK_INT(idem_key_parse(keys[i], strlen(keys[i]), parsed, NULL), 0);
        CHECK_STR(parsed, keys[i]);
        CHECK_INT(idem_client_key_check(keys[i], NULL), 0);
    }
    CHECK_INT(bad_format, 0);
    CHECK_INT(bad_version, 0);
    CHECK_INT(bad_variant, 0);
    /* The two random variant bits are random: every one of the four values shows up. */
    CHECK(seen_variant[0] > 0 && seen_variant[1] > 0 && seen_variant[2] > 0 && seen_variant[3] > 0);
    CHECK_INT(nibble_or, 0xf);
    CHECK_INT(nibble_and, 0);
    qsort(keys, N_KEYS, sizeof keys[0], cmp_keys);
    for (i = 1; i < N_KEYS; i++)
        dups += strcmp(keys[i - 1], keys[i]) == 0;
    CHECK_INT(dups, 0);
    CHECK_INT(idem_client_key_new(NULL), IDEM_CLIENT_EINVAL);
}

struct check_case {
    const char *key;
    const char *why; /* NULL: accepted */
};

static const struct check_case check_cases[] = {
    {"abc", NULL},
    {"order-2026-12-02-0001", NULL},
    {"8e03978e-40d5-43e8-bc93-6894a57f9324", NULL},
    {"!#$%&'()*+-./:;<=>?@[\\]^_`{|}~", NULL},
    {"a\"b", NULL},
    {"", "key is empty"},
    {"a b", "key contains a space, a control or a non-ASCII character"},
    {"a\tb", "key contains a space, a control or a non-ASCII character"},
    {"caf\xc3\xa9", "key contains a space, a control or a non-ASCII character"},
    {"a\x7f", "key contains a space, a control or a non-ASCII character"},
    {"a,b", "key contains a comma"},
    {"\"quoted\"", "key starts with a double quote"},
};

static void test_key_check(void)
{
    size_t i;
    const char *why;
    char parsed[IDEM_KEY_MAX + 1];
    char longkey[IDEM_CLIENT_KEY_MAX + 2];

    for (i = 0; i < sizeof check_cases / sizeof check_cases[0]; i++) {
        why = NULL;
        if (!check_cases[i].why) {
            CHECK_INT(idem_client_key_check(check_cases[i].key, &why), 0);
            /* Accepted by the client means taken verbatim by the server. */
            CHECK_INT(idem_key_parse(check_cases[i].key, strlen(check_cases[i].key), parsed, NULL),
                      0);
            CHECK_STR(parsed, check_cases[i].key);
        } else {
            CHECK_INT(idem_client_key_check(check_cases[i].key, &why), IDEM_CLIENT_EKEY);
            CHECK_STR(why, check_cases[i].why);
        }
    }
    memset(longkey, 'k', IDEM_CLIENT_KEY_MAX);
    longkey[IDEM_CLIENT_KEY_MAX] = '\0';
    CHECK_INT(idem_client_key_check(longkey, NULL), 0);
    CHECK_INT(idem_key_parse(longkey, strlen(longkey), parsed, NULL), 0);
    longkey[IDEM_CLIENT_KEY_MAX] = 'k';
    longkey[IDEM_CLIENT_KEY_MAX + 1] = '\0';
    why = NULL;
    CHECK_INT(idem_client_key_check(longkey, &why), IDEM_CLIENT_EKEY);
    CHECK_STR(why, "key is longer than 255 characters");
    CHECK_INT(idem_key_parse(longkey, strlen(longkey), parsed, NULL), IDEM_EKEY);
    CHECK_INT(idem_client_key_check(NULL, NULL), IDEM_CLIENT_EKEY);
}

static void test_errors(void)
{
    CHECK_STR(idem_client_strerror(0), "success");
    CHECK_STR(idem_client_err_name(IDEM_CLIENT_ECORRUPT), "IDEM_CLIENT_ECORRUPT");
    CHECK_STR(idem_client_strerror(IDEM_CLIENT_ENOMEM), "out of memory");
    CHECK_STR(idem_client_err_name(12345), "IDEM_CLIENT_UNKNOWN");
    CHECK_STR(idem_client_strerror(-12345), "unknown error");
}

int main(void)
{
    test_uuid_format();
    test_key_check();
    test_errors();
    return t_done();
}
