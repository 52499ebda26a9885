/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_store.c - what every store shares (lib/store.c), on SQLite stores in a temporary
 * directory (its pool, lib/pool.c, is test_pool.c's).  The transaction handle counts the
 * application's ROLLBACK statements by their first keyword only (the engine asks whether a staged
 * response survived); rolling back no transaction is nothing; a read transaction sees what write
 * transactions committed and not what they rolled back; and the store's statistics count write
 * commits, not rollbacks or reads.  Stores opening one new file together all open.
 */
#include "internal.h"
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/idem-unit-store-XXXXXX";

#include "store_fixture.h"

/* ---- transactions --------------------------------------------------------------------------- */

static void test_tx_exec_counts_rollback_statements_only(void)
{
    struct idem_store *st = open_store("rollbacks.db", 2, 30000);
    struct idem_tx *tx = NULL;

    /* Inside a write transaction: the application's savepoints. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem__tx_rollbacks(tx), 0);
    CHECK_INT(idem_tx_exec(tx, "SAVEPOINT x", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, " rollback to x", 0, NULL, NULL), 0);
    CHECK_INT(idem__tx_rollbacks(tx), 1);
    CHECK_INT(idem_tx_exec(tx, "\n\tRollBack\tTO SAVEPOINT x", 0, NULL, NULL), 0);
    CHECK_INT(idem__tx_rollbacks(tx), 2);
    /* The word elsewhere, or a longer word, is no ROLLBACK (the failing statement changes nothing).
     */
    CHECK_INT(idem_tx_exec(tx, "SELECT 'ROLLBACK'", 0, NULL, NULL), 0);
    CHECK(idem_tx_exec(tx, "ROLLBACKS", 0, NULL, NULL) < 0);
    CHECK(idem_tx_exec(tx, "ROLLBACK_TO x", 0, NULL, NULL) < 0);
    CHECK_INT(idem_tx_exec(tx, "RELEASE x", 0, NULL, NULL), 0);
    CHECK_INT(idem__tx_rollbacks(tx), 2);
    CHECK_INT(idem_tx_commit(tx), 0);

    /* A whole ROLLBACK (a read transaction's), and one that fails still counts: it may undo. */
    CHECK_INT(idem_tx_begin(st, 0, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "ROLLBACK", 0, NULL, NULL), 0);
    CHECK_INT(idem__tx_rollbacks(tx), 1);
    CHECK(idem_tx_exec(tx, "rollback;", 0, NULL, NULL) < 0); /* no transaction is active now */
    CHECK_INT(idem__tx_rollbacks(tx), 2);
    CHECK_INT(idem_tx_rollback(tx), 0);
    idem_store_close(st);
}

static void test_no_transaction_rolls_back_as_nothing(void)
{
    CHECK_INT(idem_tx_rollback(NULL), 0);
    CHECK_INT(idem_tx_commit(NULL), IDEM_EINVAL);
    CHECK_INT(idem_tx_exec(NULL, "SELECT 1", 0, NULL, NULL), IDEM_EINVAL);
    CHECK_STR(idem_tx_errmsg(NULL), "no transaction");
}

static void test_a_read_transaction_sees_committed_rows(void)
{
    struct idem_store *st = open_store("read.db", 2, 30000);
    struct idem_tx *tx = NULL;
    const char *kept[] = {"kept"}, *undone[] = {"undone"};
    char buf[64];

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ($1)", 1, kept, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ($1)", 1, undone, NULL), 0);
    CHECK_INT(idem_tx_rollback(tx), 0);

    CHECK_STR(t_store_cell(st, "SELECT group_concat(id) FROM biz", NULL, buf, sizeof buf), "kept");
    idem_store_close(st);
}

static void test_stats_count_write_commits(void)
{
    struct idem_store *st = open_store("stats.db", 2, 30000);
    struct idem_store_stats before, after, none = {1, 1, 1, 1, 1};
    struct idem_tx *tx = NULL;

    idem_store_stats(st, &before);
    CHECK_INT(exec_committed(st, 1, "INSERT INTO biz (id) VALUES ('s1')"), 0);
    CHECK_INT(exec_committed(st, 1, "INSERT INTO biz (id) VALUES ('s2')"), 0);
    CHECK_INT(exec_committed(st, 1, "INSERT INTO biz (id) VALUES ('s3')"), 0);
    /* Neither a rolled back write nor a committed read is a write commit. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ('s4')", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_rollback(tx), 0);
    CHECK_INT(exec_committed(st, 0, "SELECT count(*) FROM biz"), 0);
    /* Nor a write whose statement failed: the first row again breaks the primary key. */
    CHECK(exec_committed(st, 1, "INSERT INTO biz (id) VALUES ('s1')") < 0);
    idem_store_stats(st, &after);
    CHECK_INT(after.write_commits - before.write_commits, 3);
    /* Each was made durable by a commit of its own or one it shared. */
    CHECK(after.durable_commits > before.durable_commits);
    CHECK(after.durable_commits - before.durable_commits <= 3);
    CHECK(after.round_trips == 0); /* SQLite has no server */

    idem_store_stats(NULL, &none);
    CHECK_INT(none.write_commits, 0);
    CHECK_INT(none.durable_commits, 0);
    CHECK(none.round_trips == 0);
    idem_store_stats(st, NULL);
    idem_store_close(st);
}

/*
 * Processes starting together on a store no one has opened yet: each opens the new file and
 * switches it to WAL, and SQLite refuses some of those switches at once, without its busy
 * handler.  Every open must still succeed within the busy timeout.
 */
struct opener {
    char uri[256];
    int rc;
    char *err;
};

static void *open_alone(void *arg)
{
    struct opener *o = arg;
    struct idem_store *st = NULL;

    o->rc = idem_store_open(o->uri, NULL, &st, &o->err);
    idem_store_close(st);
    return NULL;
}

static void test_stores_opening_a_new_file_together_all_open(void)
{
    enum { ROUNDS = 40, THREADS = 4 };
    int failed = 0;

    for (int round = 0; round < ROUNDS; round++) {
        struct opener o[THREADS];
        pthread_t th[THREADS];

        for (int i = 0; i < THREADS; i++) {
            o[i] = (struct opener){.rc = 0};
            snprintf(o[i].uri, sizeof o[i].uri, "sqlite:%s/new-%d.db", dir, round);
            pthread_create(&th[i], NULL, open_alone, &o[i]);
        }
        for (int i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            if (o[i].rc != 0) {
                failed++;
                fprintf(stderr, "round %d: %s\n", round, o[i].err ? o[i].err : "?");
            }
            idem_free(o[i].err);
        }
    }
    CHECK_INT(failed, 0);
}

int main(void)
{
    char cmd[64];

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_tx_exec_counts_rollback_statements_only();
    test_no_transaction_rolls_back_as_nothing();
    test_a_read_transaction_sees_committed_rows();
    test_stats_count_write_commits();
    test_stores_opening_a_new_file_together_all_open();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
