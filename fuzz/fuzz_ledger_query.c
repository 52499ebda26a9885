/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_ledger_query.c - libFuzzer harness for provider-sim's reading of the query arguments of
 * GET /v1/ledger/references (src/provider-sim/ledger_query.c): `kind`, `after` and `limit` come
 * from anyone who can reach the port, and `after` goes to the store as a parameter.  The first
 * byte says which arguments are present (bit 0 kind, bit 1 after, bit 2 limit); the rest is their
 * decoded text, separated by NUL bytes (a decoded query argument never holds one).
 *
 * Besides memory errors and leaks it checks, against an independent reading: a query is accepted
 * exactly when the kind is "charges" or "emails" and `after`, if present, is at most
 * LEDGER_AFTER_MAX bytes of valid UTF-8 (RFC 3629: no overlong form, no surrogate, nothing past
 * U+10FFFF); an accepted one has its kind, a limit in 1..LEDGER_PAGE_MAX (the default without
 * one) and the very `after` it was given; a refused one says why.
 */
#include "ledger_query.h"
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char program_name[] = "fuzz_ledger_query";

/* RFC 3629 UTF-8, written apart from the code under test. */
static int utf8_ok(const unsigned char *s, size_t len)
{
    size_t i = 0;

    while (i < len) {
        unsigned char c = s[i];
        uint32_t cp;
        size_t n, k;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, cp = c & 0x07;
        else
            return 0;
        if (len - i - 1 < n) /* the sequence runs past the end */
            return 0;
        for (k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += n + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text, *part[3] = {NULL, NULL, NULL};
    const char *kind, *after, *limit;
    struct ledger_query q;
    char detail[160];
    size_t at = 0;
    int i, rc, want;

    if (size < 1)
        return 0;
    text = malloc(size);
    CHECK(text != NULL, "malloc");
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    for (i = 0; i < 3 && at <= size - 1; i++) { /* up to three NUL-separated strings */
        part[i] = text + at;
        at += strlen(text + at) + 1;
    }
    kind = (data[0] & 1) ? part[0] : NULL;
    after = (data[0] & 2) && part[1] ? part[1] : NULL;
    limit = (data[0] & 4) && part[2] ? part[2] : NULL;

    memset(&q, 0xA5, sizeof q);
    detail[0] = '\0';
    rc = ledger_query_parse(kind, after, limit, &q, detail, sizeof detail);
    want = kind != NULL && (strcmp(kind, "charges") == 0 || strcmp(kind, "emails") == 0) &&
           (after == NULL || (strlen(after) <= LEDGER_AFTER_MAX &&
                              utf8_ok((const unsigned char *)after, strlen(after))));
    if (rc == 0) {
        CHECK(want, "accepted only a known kind and an after of bounded UTF-8");
        CHECK(q.kind == (strcmp(kind, "charges") == 0 ? LEDGER_CHARGES : LEDGER_EMAILS),
              "the kind it was given");
        CHECK(q.limit >= 1 && q.limit <= LEDGER_PAGE_MAX, "a limit in range");
        CHECK(limit != NULL || q.limit == LEDGER_PAGE_DEFAULT, "the default limit");
        CHECK(q.after == after, "the after it was given");
    } else {
        CHECK(rc == -1, "-1 on refusal");
        CHECK(!want || limit != NULL, "only a bad limit refuses a good kind and after");
        CHECK(detail[0] != '\0', "a refusal says why");
    }
    free(text);
    return 0;
}
