/* SPDX-License-Identifier: Apache-2.0 */
/*
 * db.c - thin helpers over libidem's store calls (see db.h).  Opening creates the directory of
 * an SQLite file, so `orderd serve` works on a fresh checkout; values come back as text from
 * every store, so the conversions live here once.
 */
#include "db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "app.h"
#include "log.h"
#include "util.h"
#include "banned.h"

int db_open(const char *uri, int pool, enum idem_sync sync, struct idem_store **out, char *err,
            size_t errlen)
{
    struct idem_store_options opts;
    char *msg = NULL;
    int rc;

    *out = NULL;
    memset(&opts, 0, sizeof opts);
    opts.pool_size = pool;
    opts.sync = sync;
    rc = idem_store_open(uri, &opts, out, &msg);
    if (rc < 0) /* Not the URI: a PostgreSQL one may carry a password. */
        snprintf(err, errlen, "cannot open the store: %s", msg ? msg : idem_strerror(rc));
    idem_free(msg);
    return rc;
}

int db_exec(const struct app *app, struct idem_tx *tx, const char *sql, int nparams,
            const char *const *params, struct idem_rows **rows)
{
    int rc = idem_tx_exec(tx, sql, nparams, params, rows);

    if (rc < 0 && rc != IDEM_ECONFLICT)
        log_msg(&app->log, "error", "SQL failed (%s: %s): %.120s", idem_err_name(rc),
                idem_tx_errmsg(tx) ? idem_tx_errmsg(tx) : "", sql);
    return rc;
}

int db_read(const struct app *app, struct idem_tx *tx, const char *sql, int nparams,
            const char *const *params, struct idem_rows **rows)
{
    struct idem_tx *own = NULL;
    int rc;

    if (tx != NULL)
        return db_exec(app, tx, sql, nparams, params, rows);
    rc = idem_tx_begin(app->store, 0, &own);
    if (rc < 0) {
        log_msg(&app->log, "error", "cannot begin a read (%s): %.120s", idem_err_name(rc), sql);
        return rc;
    }
    rc = db_exec(app, own, sql, nparams, params, rows);
    if (idem_tx_rollback(own) < 0 && rc >= 0) {
        /* What it read may not be durable: nothing may be answered from it. */
        if (rows) {
            idem_rows_free(*rows);
            *rows = NULL;
        }
        rc = IDEM_EUNAVAIL;
    }
    return rc;
}

/* Replaces text[from, to) by at most three asterisks. */
static void mask_span(char *text, size_t from, size_t to)
{
    size_t stars = to - from < 3 ? to - from : 3;

    memset(text + from, '*', stars);
    memmove(text + from + stars, text + to, strlen(text + to) + 1);
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

void db_redact_secrets(char *text)
{
    char *p = text;
    char *colon, *at, *end, *q;

    /* URIs: the user info ends at the last '@' of the word (a raw '@' may be in the password). */
    while ((p = strstr(p, "://")) != NULL) {
        p += 3;
        for (end = p; *end != '\0' && !is_space(*end); end++)
            ;
        at = NULL;
        for (q = p; q < end; q++)
            if (*q == '@')
                at = q;
        colon = at ? memchr(p, ':', (size_t)(at - p)) : NULL;
        if (colon != NULL && at > colon + 1)
            mask_span(text, (size_t)(colon + 1 - text), (size_t)(at - text));
    }
    /* password=VALUE, password = 'VALUE', ?password=VALUE&... (over-masking is fine). */
    for (p = text; *p != '\0'; p++) {
        if (!ascii_ncaseeq(p, "password", 8) || (p > text && is_word(p[-1])))
            continue;
        q = p + 8;
        while (is_space(*q))
            q++;
        if (*q != '=')
            continue;
        q++;
        while (is_space(*q))
            q++;
        end = q;
        if (*end == '\'') {
            for (end++; *end != '\0' && *end != '\''; end++)
                if (*end == '\\' && end[1] != '\0')
                    end++;
            if (*end == '\'')
                end++;
        } else {
            while (*end != '\0' && !is_space(*end))
                end++;
        }
        if (end > q)
            mask_span(text, (size_t)(q - text), (size_t)(end - text));
        p = q;
    }
}

const char *db_text(const struct idem_rows *rows, int row, int col)
{
    const char *v = idem_rows_get(rows, row, col);

    return v ? v : "";
}

int64_t db_int(const struct idem_rows *rows, int row, int col)
{
    int64_t v = 0;

    if (parse_int64(db_text(rows, row, col), INT64_MIN, INT64_MAX, &v) != 0)
        return 0;
    return v;
}
