/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_store.c - what every store shares (lib/store.c), on SQLite stores in a temporary
 * directory.  The pool lends a released connection again instead of opening another (a mark left
 * on the connection is there on the next loan); with every connection lent, a caller waits and
 * gets the one another thread releases, or after busy_timeout_ms IDEM_EUNAVAIL with a message
 * that names the pool's size.  The transaction handle counts the application's ROLLBACK
 * statements by their first keyword only (the engine asks whether a staged response survived);
 * rolling back no transaction is nothing; a read transaction sees what write transactions
 * committed and not what they rolled back; and the store's statistics count write commits, not
 * rollbacks or reads.  Stores opening one new file together all open.
 */
#include "internal.h"
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/idem-unit-store-XXXXXX";

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

/* The first cell `sql` answers in a read transaction, or "(error)". */
static const char *read_one(struct idem_store *st, const char *sql, char *buf, size_t cap)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    const char *v;

    snprintf(buf, cap, "(error)");
    if (idem_tx_begin(st, 0, &tx) < 0)
        return buf;
    if (idem_tx_exec(tx, sql, 0, NULL, &r) == 0) {
        v = idem_rows_get(r, 0, 0);
        snprintf(buf, cap, "%s", v ? v : "(null)");
    }
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return buf;
}

/* ---- the pool ------------------------------------------------------------------------------- */

/*
 * A temporary table lives on one connection only: the next read transaction finds the one the
 * last made, so it ran on the same connection, not on one opened since.
 */
static void test_a_released_connection_is_lent_again(void)
{
    struct idem_store *st = open_store("lend.db", 4, 30000);
    struct idem_conn *a = NULL, *b = NULL, *c = NULL;
    char buf[32], err[IDEM_ERRMSG_MAX] = "";

    CHECK_INT(exec_committed(st, 0, "CREATE TEMP TABLE lent_mark (x)"), 0);
    CHECK_STR(read_one(st, "SELECT count(*) FROM temp.sqlite_master WHERE name = 'lent_mark'", buf,
                       sizeof buf),
              "1");

    /* The same through the pool's own calls: released, then lent again. */
    CHECK_INT(idem__store_get(st, &a, err, sizeof err), 0);
    idem__store_put(st, a);
    CHECK_INT(idem__store_get(st, &b, err, sizeof err), 0);
    CHECK(b == a);
    /* While one is lent, the next caller gets another. */
    CHECK_INT(idem__store_get(st, &c, err, sizeof err), 0);
    CHECK(c != NULL && c != b);
    idem__store_put(st, c);
    idem__store_put(st, b);
    idem_store_close(st);
}

struct waiter {
    struct idem_store *st;
    atomic_int started, done;
    int rc;
    struct idem_conn *got;
    char err[IDEM_ERRMSG_MAX];
};

static void *acquire_one(void *arg)
{
    struct waiter *w = arg;

    atomic_store(&w->started, 1);
    w->rc = idem__store_get(w->st, &w->got, w->err, sizeof w->err);
    atomic_store(&w->done, 1);
    return NULL;
}

static void test_an_exhausted_pool_waits_for_a_release(void)
{
    struct idem_store *st = open_store("wait.db", 2, 2 * T_WAIT_MS);
    struct idem_conn *a = NULL, *b = NULL;
    struct waiter w = {.st = st, .rc = 1};
    char err[IDEM_ERRMSG_MAX] = "";
    pthread_t th;

    CHECK_INT(idem__store_get(st, &a, err, sizeof err), 0);
    CHECK_INT(idem__store_get(st, &b, err, sizeof err), 0);
    pthread_create(&th, NULL, acquire_one, &w);
    T_WAIT_UNTIL(atomic_load(&w.started), "the third caller to ask for a connection");
    /* A quiet period: with both connections lent, nothing may come back to the third caller. */
    t_sleep_ms(100);
    CHECK_INT(atomic_load(&w.done), 0);

    idem__store_put(st, a);
    T_WAIT_UNTIL(atomic_load(&w.done), "the waiting caller to get the released connection");
    pthread_join(th, NULL);
    CHECK_INT(w.rc, 0);
    CHECK(w.got == a); /* the one released: the pool is full, none was opened */
    idem__store_put(st, w.got);
    idem__store_put(st, b);
    idem_store_close(st);
}

static void test_an_exhausted_pool_times_out_naming_its_size(void)
{
    enum { BUSY_MS = 300 };
    struct idem_store *st = open_store("timeout.db", 1, BUSY_MS);
    struct idem_conn *a = NULL, *b = NULL;
    struct idem_tx *tx = NULL;
    char err[IDEM_ERRMSG_MAX] = "";
    int64_t t0, waited;

    CHECK_INT(idem__store_get(st, &a, err, sizeof err), 0);
    t0 = clock_mono_ms();
    CHECK_INT(idem__store_get(st, &b, err, sizeof err), IDEM_EUNAVAIL);
    waited = clock_mono_ms() - t0;
    CHECK(b == NULL);
    CHECK(strstr(err, "pool of 1") != NULL);
    CHECK(strstr(err, "300 ms") != NULL);
    /* It waited the busy timeout (less a clock tick: the deadline is on the wall clock). */
    CHECK(waited >= BUSY_MS - 20);
    CHECK(waited < 20000);
    /* A read transaction, which needs a pooled connection, is refused the same way. */
    CHECK_INT(idem_tx_begin(st, 0, &tx), IDEM_EUNAVAIL);
    CHECK(tx == NULL);

    idem__store_put(st, a);
    CHECK_INT(idem__store_get(st, &b, err, sizeof err), 0);
    CHECK(b == a);
    idem__store_put(st, b);
    idem_store_close(st);
}

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

    CHECK_STR(read_one(st, "SELECT group_concat(id) FROM biz", buf, sizeof buf), "kept");
    idem_store_close(st);
}

static void test_stats_count_write_commits(void)
{
    struct idem_store *st = open_store("stats.db", 2, 30000);
    struct idem_store_stats before, after, none = {1, 1, 1, 1};
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

    idem_store_stats(NULL, &none);
    CHECK_INT(none.write_commits, 0);
    CHECK_INT(none.durable_commits, 0);
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
    test_a_released_connection_is_lent_again();
    test_an_exhausted_pool_waits_for_a_release();
    test_an_exhausted_pool_times_out_naming_its_size();
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
