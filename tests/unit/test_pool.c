/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pool.c - a store's bounded pool of connections (lib/pool.c), on SQLite stores in a
 * temporary directory.  The pool lends a released connection again instead of opening another (a
 * mark left on the connection is there on the next loan); with every connection lent, a caller
 * waits and gets the one another thread releases, or after busy_timeout_ms IDEM_EUNAVAIL with a
 * message that names the pool's size; a broken connection given back is closed, not lent again,
 * and its place is free for a new one; the commit counters add a batch's transactions and count
 * one durable commit for it.
 */
#include "internal.h"
#include "sqlite_conn.h" /* struct idem_conn: a connection marked broken */
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[] = "/tmp/idem-unit-pool-XXXXXX";

#include "store_fixture.h"

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
    CHECK_STR(t_store_cell(st, "SELECT count(*) FROM temp.sqlite_master WHERE name = 'lent_mark'",
                           NULL, buf, sizeof buf),
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

/*
 * A connection given back broken is closed, not pooled: the pool's count of open connections
 * drops, the next caller gets a new one, and a pool of one is not left full of a dead connection.
 */
static void test_a_broken_connection_is_closed_not_lent(void)
{
    struct idem_store *st = open_store("broken.db", 1, 300);
    struct idem_conn *a = NULL, *b = NULL;
    char err[IDEM_ERRMSG_MAX] = "";

    CHECK_INT(idem__store_get(st, &a, err, sizeof err), 0);
    CHECK_INT(st->nopen, 1);
    a->broken = 1;
    idem__store_put(st, a);
    CHECK_INT(st->nopen, 0);
    CHECK_INT(st->nidle, 0);
    /* The pool of one has room again: a new connection, at once (no busy timeout waited). */
    CHECK_INT(idem__store_get(st, &b, err, sizeof err), 0);
    CHECK(b != NULL);
    CHECK_INT(st->nopen, 1);
    idem__store_put(st, b);
    CHECK_INT(st->nidle, 1);
    idem__store_put(st, NULL); /* nothing to give back is nothing */
    CHECK_INT(st->nidle, 1);
    idem_store_close(st);
}

/* A batch of `ntx` transactions is `ntx` write commits and one durable commit, with its time. */
static void test_a_counted_batch_is_one_durable_commit(void)
{
    struct idem_store *st = open_store("count.db", 1, 300);
    struct idem_store_stats before, after;

    idem_store_stats(st, &before);
    idem__store_count_commit(st, 5, clock_mono_ns() - 1000000);
    idem__store_count_commit(st, 1, clock_mono_ns());
    idem_store_stats(st, &after);
    CHECK_INT(after.write_commits - before.write_commits, 6);
    CHECK_INT(after.durable_commits - before.durable_commits, 2);
    CHECK(after.durable_commit_ns - before.durable_commit_ns >= 1000000);
    idem_store_close(st);
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
    test_a_broken_connection_is_closed_not_lent();
    test_a_counted_batch_is_one_durable_commit();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
