/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_fixture.h - what the unit tests of the store's shared parts (test_pool.c, test_store.c)
 * do on a real SQLite store: open one on a file of the test's temporary directory `dir` (which
 * the including file defines) with a table `biz`, and run a statement in a transaction of its own.
 */
#ifndef IDEM_TEST_STORE_FIXTURE_H
#define IDEM_TEST_STORE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "t_store.h"

static const struct idem_migration biz[] = {
    {1, "rows", "CREATE TABLE biz (id TEXT PRIMARY KEY)", "CREATE TABLE biz (id TEXT PRIMARY KEY)"},
};

/* A new store on the file `name` of the temporary directory, with biz made. */
static struct idem_store *open_store(const char *name, int pool_size, int busy_timeout_ms)
{
    struct idem_store_options o = {.pool_size = pool_size, .busy_timeout_ms = busy_timeout_ms};
    struct idem_store *st = NULL;
    char uri[256], *err = NULL;

    snprintf(uri, sizeof uri, "sqlite:%s/%s", dir, name);
    if (idem_store_open(uri, &o, &st, &err) < 0 ||
        idem_store_migrate(st, "unit-store", biz, 1, NULL, &err) < 0) {
        fprintf(stderr, "cannot open %s: %s\n", uri, err ? err : "?");
        exit(1);
    }
    return st;
}

/* Runs `sql` (no parameters) in a transaction of its own and commits it; 0 or the failure. */
static int exec_committed(struct idem_store *st, int write, const char *sql)
{
    struct idem_tx *tx = NULL;
    int rc = idem_tx_begin(st, write, &tx);

    if (rc < 0)
        return rc;
    rc = idem_tx_exec(tx, sql, 0, NULL, NULL);
    if (rc < 0) {
        idem_tx_rollback(tx);
        return rc;
    }
    return idem_tx_commit(tx);
}

#endif /* IDEM_TEST_STORE_FIXTURE_H */
