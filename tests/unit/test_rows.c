/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_rows.c - the result rows of lib/rows.c, the one shape both stores copy a statement's
 * result into.  A value is kept with its length (bytes after a NUL inside it too) and outlives
 * the buffers it was copied from; SQL NULL reads as NULL, and so does any cell out of range, so
 * an application's loop never reads past the result; a column is found by its exact name (the
 * first of two alike), -1 when there is none; every reader answers NULL rows as empty, and
 * freeing NULL does nothing.
 */
#include "internal.h"
#include "t.h"

#include <stdio.h>
#include <string.h>

static void test_values_are_kept_with_their_lengths(void)
{
    static const char *const names[] = {"id", "body"};
    struct idem_rows *r = NULL;
    char id[] = "order-1-and-more", body[] = {'a', '\0', 'b'};
    const char *vals[] = {id, body};
    const size_t lens[] = {7, sizeof body};
    const char *v;

    CHECK_INT(idem__rows_new(2, names, &r), 0);
    CHECK_INT(idem__rows_append(r, vals, lens), 0);
    /* Copies: what the store's buffers held may change once the row is appended. */
    memset(id, 'x', sizeof id - 1);
    memset(body, 'x', sizeof body);

    CHECK_INT(idem_rows_count(r), 1);
    CHECK_INT(idem_rows_columns(r), 2);
    CHECK_STR(idem_rows_get(r, 0, 0), "order-1"); /* lens[0] bytes, no more */
    v = idem_rows_get(r, 0, 1);
    CHECK(v != NULL && memcmp(v, "a\0b", 4) == 0); /* the NUL inside kept, one after it added */
    idem_rows_free(r);
}

static void test_sql_null_reads_as_null_and_empty_as_empty(void)
{
    static const char *const names[] = {"a", "b", "c"};
    struct idem_rows *r = NULL;
    const char *vals[] = {NULL, "", "z"};
    const size_t lens[] = {0, 0, 1};

    CHECK_INT(idem__rows_new(3, names, &r), 0);
    CHECK_INT(idem__rows_append(r, vals, lens), 0);
    CHECK(idem_rows_get(r, 0, 0) == NULL);
    CHECK_STR(idem_rows_get(r, 0, 1), "");
    CHECK_STR(idem_rows_get(r, 0, 2), "z");
    idem_rows_free(r);
}

static void test_a_cell_out_of_range_reads_as_null(void)
{
    static const char *const names[] = {"a", "b"};
    struct idem_rows *r = NULL;
    const char *vals[] = {"1", "2"};
    const size_t lens[] = {1, 1};

    CHECK_INT(idem__rows_new(2, names, &r), 0);
    CHECK_INT(idem__rows_append(r, vals, lens), 0);
    CHECK_STR(idem_rows_get(r, 0, 1), "2");
    CHECK(idem_rows_get(r, -1, 0) == NULL);
    CHECK(idem_rows_get(r, 1, 0) == NULL); /* the row after the last */
    /* Rows fill the cells allocated so far: the row after them is past the allocation. */
    for (int i = 1; i < 4; i++)
        CHECK_INT(idem__rows_append(r, vals, lens), 0);
    CHECK_INT(idem_rows_count(r), 4);
    CHECK_STR(idem_rows_get(r, 3, 0), "1");
    CHECK(idem_rows_get(r, 4, 0) == NULL);
    CHECK(idem_rows_get(r, 4, 1) == NULL);
    CHECK(idem_rows_get(r, 0, -1) == NULL);
    CHECK(idem_rows_get(r, 0, 2) == NULL); /* the column after the last */
    CHECK(idem_rows_get(r, 1000000, 1000000) == NULL);
    CHECK(idem_rows_get(NULL, 0, 0) == NULL);
    idem_rows_free(r);
}

/* Many rows, so the cells grow past their first allocation: every value stays in its place. */
static void test_rows_keep_their_values_as_the_result_grows(void)
{
    enum { ROWS = 1000 };
    static const char *const names[] = {"n", "square"};
    struct idem_rows *r = NULL;
    char n[16], sq[24];
    const char *vals[] = {n, sq};
    size_t lens[2];
    int bad = 0;

    CHECK_INT(idem__rows_new(2, names, &r), 0);
    for (int i = 0; i < ROWS; i++) {
        lens[0] = (size_t)snprintf(n, sizeof n, "%d", i);
        lens[1] = (size_t)snprintf(sq, sizeof sq, "%d", i * i);
        CHECK_INT(idem__rows_append(r, vals, lens), 0);
    }
    CHECK_INT(idem_rows_count(r), ROWS);
    for (int i = 0; i < ROWS; i++) {
        snprintf(n, sizeof n, "%d", i);
        snprintf(sq, sizeof sq, "%d", i * i);
        if (!idem_rows_get(r, i, 0) || strcmp(idem_rows_get(r, i, 0), n) != 0 ||
            !idem_rows_get(r, i, 1) || strcmp(idem_rows_get(r, i, 1), sq) != 0)
            bad++;
    }
    CHECK_INT(bad, 0);
    idem_rows_free(r);
}

/* A statement without columns (an UPDATE): no cell is ever read, and no name found. */
static void test_a_result_without_columns_has_no_cells(void)
{
    struct idem_rows *r = NULL;

    CHECK_INT(idem__rows_new(0, NULL, &r), 0);
    CHECK_INT(idem_rows_count(r), 0);
    CHECK_INT(idem_rows_columns(r), 0);
    CHECK(idem_rows_get(r, 0, 0) == NULL);
    CHECK_INT(idem_rows_column_index(r, ""), -1);
    idem_rows_free(r);
}

/* PostgreSQL answers rows without columns (SELECT FROM t): counted, and no cell to read. */
static void test_rows_without_columns_are_counted(void)
{
    struct idem_rows *r = NULL;

    CHECK_INT(idem__rows_new(0, NULL, &r), 0);
    for (int i = 0; i < 9; i++)
        CHECK_INT(idem__rows_append(r, NULL, NULL), 0);
    CHECK_INT(idem_rows_count(r), 9);
    CHECK(idem_rows_get(r, 8, 0) == NULL);
    idem_rows_free(r);
}

static void test_a_column_is_found_by_its_exact_name(void)
{
    char first[] = "id";
    const char *names[] = {first, "Note", "id", NULL};
    struct idem_rows *r = NULL;

    CHECK_INT(idem__rows_new(4, names, &r), 0);
    first[0] = 'x';                                /* the names were copied */
    CHECK_INT(idem_rows_column_index(r, "id"), 0); /* the first of two alike */
    CHECK_INT(idem_rows_column_index(r, "Note"), 1);
    CHECK_INT(idem_rows_column_index(r, "note"), -1); /* case counts */
    CHECK_INT(idem_rows_column_index(r, "xd"), -1);
    CHECK_INT(idem_rows_column_index(r, "i"), -1); /* no prefix matches */
    CHECK_INT(idem_rows_column_index(r, ""), 3);   /* a NULL name is kept as "" */
    CHECK_INT(idem_rows_column_index(r, NULL), -1);
    CHECK_INT(idem_rows_column_index(NULL, "id"), -1);
    idem_rows_free(r);
}

/* The count a store leaves in the result is what the application reads; a new result says 0. */
static void test_changed_counts_what_the_store_left(void)
{
    struct idem_rows *r = NULL;

    CHECK_INT(idem__rows_new(0, NULL, &r), 0);
    CHECK_INT(idem_rows_changed(r), 0);
    r->changed = INT64_C(5000000000); /* more than an int holds */
    CHECK_INT(idem_rows_changed(r), INT64_C(5000000000));
    CHECK_INT(idem_rows_count(r), 0); /* changed rows are not result rows */
    idem_rows_free(r);
}

static void test_no_rows_read_as_empty_and_free_as_nothing(void)
{
    CHECK_INT(idem_rows_count(NULL), 0);
    CHECK_INT(idem_rows_columns(NULL), 0);
    CHECK_INT(idem_rows_changed(NULL), 0);
    CHECK(idem_rows_get(NULL, 0, 0) == NULL);
    CHECK_INT(idem_rows_column_index(NULL, "a"), -1);
    idem_rows_free(NULL);
    CHECK(1);
}

int main(void)
{
    test_values_are_kept_with_their_lengths();
    test_sql_null_reads_as_null_and_empty_as_empty();
    test_a_cell_out_of_range_reads_as_null();
    test_rows_keep_their_values_as_the_result_grows();
    test_a_result_without_columns_has_no_cells();
    test_rows_without_columns_are_counted();
    test_a_column_is_found_by_its_exact_name();
    test_changed_counts_what_the_store_left();
    test_no_rows_read_as_empty_and_free_as_nothing();
    return t_done();
}
