/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger_query.h - what a request for one page of GET /v1/ledger/references asks: which
 * per-reference counts (charges or emails), from after which reference, how many.  Kept apart
 * from ledger.c, which runs the page against the store, so that the reading of these untrusted
 * query arguments can be fuzzed on its own (fuzz/fuzz_ledger_query.c).
 */
#ifndef SIM_LEDGER_QUERY_H
#define SIM_LEDGER_QUERY_H

#include <stddef.h>

#define LEDGER_PAGE_DEFAULT 100 /* references per page without ?limit */
#define LEDGER_PAGE_MAX 1000    /* at most, so a page stays well under any client's body limit */
#define LEDGER_AFTER_MAX 1024   /* bytes of ?after= (orderd's references are about 40) */

enum ledger_kind {
    LEDGER_CHARGES, /* charges per metadata.orderId / metadata.reference */
    LEDGER_EMAILS,  /* emails per "<template>:<orderId>" */
};

struct ledger_query {
    enum ledger_kind kind;
    const char *after; /* borrowed from the request; NULL: from the first reference */
    int limit;         /* 1..LEDGER_PAGE_MAX */
};

/*
 * Reads the query arguments `kind` (required: "charges" or "emails"), `after` (optional: valid
 * UTF-8 of at most LEDGER_AFTER_MAX bytes; present but empty still means "after the empty
 * reference") and `limit` (optional: 1..LEDGER_PAGE_MAX), each NULL when absent, into *q, which
 * borrows `after`.  Returns 0, or -1 with a sentence for a 400 in `detail`.
 */
int ledger_query_parse(const char *kind, const char *after, const char *limit,
                       struct ledger_query *q, char *detail, size_t cap);

#endif /* SIM_LEDGER_QUERY_H */
