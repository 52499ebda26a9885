/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger_query.c - the query arguments of GET /v1/ledger/references (ledger_query.h).  They come
 * from anyone who can reach the port, so every one is checked before it reaches the store: the
 * kind against its two names, the limit as a whole number in range, and `after` for length and
 * UTF-8 (PostgreSQL refuses a parameter that is not valid UTF-8 with an error, which would look
 * like a store failure instead of the client's mistake).
 */
#include "ledger_query.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "util.h"
#include "banned.h"

/* Whether `s` (`len` bytes) is valid UTF-8: jansson's own check, which every string it makes
 * goes through. */
static int valid_utf8(const char *s, size_t len)
{
    json_t *v = json_stringn(s, len);

    json_decref(v);
    return v != NULL;
}

int ledger_query_parse(const char *kind, const char *after, const char *limit,
                       struct ledger_query *q, char *detail, size_t cap)
{
    int64_t n = LEDGER_PAGE_DEFAULT;
    size_t len;

    if (kind != NULL && strcmp(kind, "charges") == 0) {
        q->kind = LEDGER_CHARGES;
    } else if (kind != NULL && strcmp(kind, "emails") == 0) {
        q->kind = LEDGER_EMAILS;
    } else {
        snprintf(detail, cap, "kind must be \"charges\" or \"emails\".");
        return -1;
    }
    if (limit != NULL && parse_int64(limit, 1, LEDGER_PAGE_MAX, &n) != 0) {
        snprintf(detail, cap, "limit must be a whole number from 1 to %d.", LEDGER_PAGE_MAX);
        return -1;
    }
    len = after != NULL ? strlen(after) : 0;
    if (after != NULL && (len > LEDGER_AFTER_MAX || !valid_utf8(after, len))) {
        snprintf(detail, cap, "after must be a reference of at most %d bytes of UTF-8.",
                 LEDGER_AFTER_MAX);
        return -1;
    }
    q->after = after;
    q->limit = (int)n;
    return 0;
}
