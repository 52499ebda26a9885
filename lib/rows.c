/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rows.c - the result of one statement, as text, the same for every store.
 *
 * Both backends copy their results into this one shape so the application's code reads rows the
 * same way on SQLite and PostgreSQL, and so a result outlives the statement and the connection it
 * came from (the connection goes back to the pool at commit).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

int idem__rows_new(int ncols, const char *const *names, struct idem_rows **out)
{
    int rc = IDEM_ENOMEM;
    struct idem_rows *r = NULL;

    *out = NULL;
    r = calloc(1, sizeof(*r));
    if (!r)
        goto out;
    r->ncols = ncols;
    if (ncols > 0) {
        r->names = calloc((size_t)ncols, sizeof(char *));
        if (!r->names)
            goto out;
        for (int i = 0; i < ncols; i++) {
            r->names[i] = idem__strdup(names[i] ? names[i] : "");
            if (!r->names[i])
                goto out;
        }
    }
    *out = r;
    r = NULL;
    rc = 0;
out:
    idem_rows_free(r);
    return rc;
}

int idem__rows_append(struct idem_rows *r, const char *const *vals, const size_t *lens)
{
    if (r->ncols == 0) { /* a row without columns (PostgreSQL's SELECT FROM t): counted only */
        r->nrows++;
        return 0;
    }
    if (r->nrows == r->cap) {
        int cap = r->cap ? r->cap * 2 : 4;
        char **cells = realloc(r->cells, (size_t)cap * (size_t)r->ncols * sizeof(char *));
        if (!cells)
            return IDEM_ENOMEM;
        r->cells = cells;
        r->cap = cap;
    }
    char **row = r->cells + (size_t)r->nrows * (size_t)r->ncols;
    for (int i = 0; i < r->ncols; i++) {
        row[i] = NULL;
        if (!vals[i])
            continue;
        row[i] = malloc(lens[i] + 1);
        if (!row[i]) {
            for (int j = 0; j < i; j++)
                free(row[j]);
            return IDEM_ENOMEM;
        }
        memcpy(row[i], vals[i], lens[i]);
        row[i][lens[i]] = '\0';
    }
    r->nrows++;
    return 0;
}

int idem_rows_count(const struct idem_rows *r)
{
    return r ? r->nrows : 0;
}

int idem_rows_columns(const struct idem_rows *r)
{
    return r ? r->ncols : 0;
}

int64_t idem_rows_changed(const struct idem_rows *r)
{
    return r ? r->changed : 0;
}

const char *idem_rows_get(const struct idem_rows *r, int row, int col)
{
    if (!r || row < 0 || row >= r->nrows || col < 0 || col >= r->ncols)
        return NULL;
    return r->cells[(size_t)row * (size_t)r->ncols + (size_t)col];
}

int idem_rows_column_index(const struct idem_rows *r, const char *name)
{
    if (!r || !name)
        return -1;
    for (int i = 0; i < r->ncols; i++)
        if (strcmp(r->names[i], name) == 0)
            return i;
    return -1;
}

void idem_rows_free(struct idem_rows *r)
{
    if (!r)
        return;
    if (r->cells)
        for (size_t i = 0; i < (size_t)r->nrows * (size_t)r->ncols; i++)
            free(r->cells[i]);
    if (r->names)
        for (int i = 0; i < r->ncols; i++)
            free(r->names[i]);
    free(r->cells);
    free(r->names);
    free(r);
}
