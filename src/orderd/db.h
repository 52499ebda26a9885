/* SPDX-License-Identifier: Apache-2.0 */
/*
 * db.h - the store as orderd uses it: opening it, and running the handlers' SQL through one
 * wrapper that logs a failed statement with the store's own detail, so a 500 in the request log
 * always has its cause a few lines above it.
 */
#ifndef ORDERD_DB_H
#define ORDERD_DB_H

#include <stddef.h>
#include <stdint.h>

#include "idem/idem.h"

struct app;

/*
 * Opens the store at `uri` with `pool` connections and SQLite durability `sync`.  For an
 * "sqlite:PATH" URI the parent directory of PATH is created first.  Returns 0 and *out, or a
 * negative IDEM_E* with a sentence in `err`.
 */
int db_open(const char *uri, int pool, enum idem_sync sync, struct idem_store **out, char *err,
            size_t errlen);

/* idem_tx_exec(), logging any failure but IDEM_ECONFLICT (which callers expect and handle). */
int db_exec(const struct app *app, struct idem_tx *tx, const char *sql, int nparams,
            const char *const *params, struct idem_rows **rows);

/*
 * One read in `tx`, or, when `tx` is NULL, in a read transaction of its own (the background
 * threads' lists of what is due; a lookup made outside a call): db_exec() between
 * idem_tx_begin(store, 0) and its rollback, logging a failure of either.
 */
int db_read(const struct app *app, struct idem_tx *tx, const char *sql, int nparams,
            const char *const *params, struct idem_rows **rows);

/*
 * Masks, in place, whatever in `text` may be a password: the password of every URI's user info
 * ("scheme://user:PASSWORD@host") and the value of every "password=" (libpq key=value strings and
 * URI query parameters; quoted or not).  For messages that echo a command-line argument, which
 * may be a connection string.  The text never grows.
 */
void db_redact_secrets(char *text);

/* Value of (row, col) as text; "" for SQL NULL (borrowed until idem_rows_free). */
const char *db_text(const struct idem_rows *rows, int row, int col);

/* Value of (row, col) as an integer; 0 when it is not one. */
int64_t db_int(const struct idem_rows *rows, int row, int col);

#endif /* ORDERD_DB_H */
