/* SPDX-License-Identifier: Apache-2.0 */
/*
 * t_store.h - what a C test reads from a store to check it: the first cell of one statement.
 * Beside t.h, for the tests that open a store (unit, orderd's schema).
 */
#ifndef IDEM_TEST_T_STORE_H
#define IDEM_TEST_T_STORE_H

#include <stdio.h>

#include "idem/idem.h"

/*
 * The first column of the first row `sql` answers (its $1 `param`, if not NULL), read in a
 * transaction of its own, into buf: "(null)" for NULL or no row, "(error)" when it failed.
 */
static inline const char *t_store_cell(struct idem_store *st, const char *sql, const char *param,
                                       char *buf, size_t cap)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    const char *v;

    snprintf(buf, cap, "(error)");
    if (idem_tx_begin(st, 0, &tx) < 0)
        return buf;
    if (idem_tx_exec(tx, sql, param ? 1 : 0, param ? &param : NULL, &r) == 0) {
        v = idem_rows_get(r, 0, 0);
        snprintf(buf, cap, "%s", v ? v : "(null)");
    }
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return buf;
}

#endif /* IDEM_TEST_T_STORE_H */
