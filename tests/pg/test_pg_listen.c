/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pg_listen.c - lib/pg_listen.c on a real server (run it through tests/pg/with_pg.sh, which
 * exports IDEM_TEST_PG_URI): the listener thread, started by the first wait, LISTENs on a
 * connection of its own (a wait is IDEM_EUNAVAIL, the caller polling, until it does); a
 * notification of a scope sent from another connection wakes its waiter, one of another scope
 * does not, and a waiter that hears nothing returns at its timeout; the listener's connection
 * ended by pg_terminate_backend wakes every waiter (a change may have slipped by), the listener
 * reconnects on a new session, and a notification wakes a waiter again.
 */
#include "store_pg.h"
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *uri;
static PGconn *other; /* another session: it notifies, and ends the listener's */

static const struct idem_scope scope = {"alice", "unit.listen", "k1"};
/*
 * A scope nobody notifies, in another bucket: its waiters hear nothing of the notifications of
 * `scope`, some of which may still be on their way (a_notify_wakes_the_waiter sends until woken).
 */
static const struct idem_scope quiet = {"carol", "unit.listen", "k3"};

/* Sends the notification the store sends when `s`'s record changed. */
static int notify(const struct idem_scope *s)
{
    char payload[32];
    const char *p[1] = {payload};
    PGresult *res;
    int ok;

    snprintf(payload, sizeof payload, "%016llx", (unsigned long long)idem__pg_scope_hash(s));
    res = PQexecParams(other, "SELECT pg_notify('" NOTIFY_CHANNEL "', $1)", 1, NULL, p, NULL, NULL,
                       0);
    ok = PQresultStatus(res) == PGRES_TUPLES_OK;
    PQclear(res);
    return ok;
}

/* The pid of the session that LISTENs on the channel, or 0. */
static int listener_pid(void)
{
    PGresult *res =
        PQexec(other, "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN " NOTIFY_CHANNEL
                      "' AND pid <> pg_backend_pid()");
    int pid = 0;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        pid = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return pid;
}

struct waiter {
    struct idem_store *st;
    const struct idem_scope *s;
    int64_t timeout_ms;
    atomic_int done;
    int rc;
    int64_t took_ms;
};

static void *wait_thread(void *arg)
{
    struct waiter *w = arg;
    int64_t t0 = clock_mono_ms();

    w->rc = idem__pg_wait_change(w->st, w->s, w->timeout_ms);
    w->took_ms = clock_mono_ms() - t0;
    atomic_store(&w->done, 1);
    return NULL;
}

/* Waits until a wait is no longer refused: the listener's LISTEN is in force. */
static void listening(struct idem_store *st)
{
    T_WAIT_UNTIL(idem__pg_wait_change(st, &scope, 1) == 0, "the listener's LISTEN");
}

/*
 * A waiter on `s` with a long timeout, and notifications of `s` until it returns (one sent before
 * it began to wait would be missed: that is what the record's own re-read is for).
 */
static void a_notify_wakes_the_waiter(struct idem_store *st, const struct idem_scope *s)
{
    struct waiter w = {.st = st, .s = s, .timeout_ms = 3 * T_WAIT_MS};
    pthread_t th;

    pthread_create(&th, NULL, wait_thread, &w);
    T_WAIT_UNTIL(notify(s) && atomic_load(&w.done), "the waiter woken by a notification");
    pthread_join(th, NULL);
    CHECK_INT(w.rc, 0);
    CHECK(w.took_ms < T_WAIT_MS);
}

static void test_the_first_wait_starts_the_listener(struct idem_store *st)
{
    struct pg_shared *sh = st->backend;

    CHECK_INT(listener_pid(), 0);
    CHECK_INT(sh->started, 0);
    listening(st);
    CHECK(sh->started);
    CHECK(listener_pid() > 0);
}

static void test_a_notify_from_another_connection_wakes_a_waiter(struct idem_store *st)
{
    a_notify_wakes_the_waiter(st, &scope);
}

static void test_a_waiter_times_out_when_nothing_comes(struct idem_store *st)
{
    /* Another scope, in another bucket: its notification wakes nobody here. */
    static const struct idem_scope elsewhere = {"bob", "unit.listen", "k2"};
    struct waiter w = {.st = st, .s = &quiet, .timeout_ms = 400};
    pthread_t th;

    CHECK(idem__pg_scope_hash(&elsewhere) % WAIT_BUCKETS !=
          idem__pg_scope_hash(&quiet) % WAIT_BUCKETS);
    CHECK(idem__pg_scope_hash(&scope) % WAIT_BUCKETS != idem__pg_scope_hash(&quiet) % WAIT_BUCKETS);
    pthread_create(&th, NULL, wait_thread, &w);
    CHECK(notify(&elsewhere));
    pthread_join(th, NULL);
    CHECK_INT(w.rc, 0);
    CHECK(w.took_ms >= 390); /* the whole timeout (less a clock tick) */
    CHECK(w.took_ms < T_WAIT_MS);
}

static void test_the_listener_reconnects_after_its_connection_is_killed(struct idem_store *st)
{
    struct pg_shared *sh = st->backend;
    struct waiter w = {.st = st, .s = &quiet, .timeout_ms = 3 * T_WAIT_MS};
    pthread_t th;
    char sql[64];
    PGresult *res;
    int pid = listener_pid(), pid2 = 0;
    uint64_t epoch;

    CHECK(pid > 0);
    /* A waiter in place before the kill: woken by the loss, since a change may slip by then. */
    pthread_mutex_lock(&sh->mu);
    epoch = sh->epoch;
    pthread_mutex_unlock(&sh->mu);
    pthread_create(&th, NULL, wait_thread, &w);
    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d)", pid);
    res = PQexec(other, sql);
    CHECK_INT(PQresultStatus(res), PGRES_TUPLES_OK);
    PQclear(res);
    T_WAIT_UNTIL(atomic_load(&w.done), "the waiter woken by the listener's loss");
    pthread_join(th, NULL);
    CHECK_INT(w.rc, 0);
    pthread_mutex_lock(&sh->mu);
    CHECK(sh->epoch != epoch);
    pthread_mutex_unlock(&sh->mu);

    /* It reconnects, on a new session, and LISTENs again; then a notification wakes a waiter. */
    T_WAIT_UNTIL((pid2 = listener_pid()) > 0 && pid2 != pid, "the listener's new session");
    listening(st);
    a_notify_wakes_the_waiter(st, &scope);
}

int main(void)
{
    struct idem_store *st = NULL;
    char *err = NULL;

    uri = getenv("IDEM_TEST_PG_URI");
    if (!uri) {
        fprintf(stderr, "IDEM_TEST_PG_URI is not set: run me through tests/pg/with_pg.sh\n");
        return 1;
    }
    other = PQconnectdb(uri);
    if (PQstatus(other) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect: %s\n", PQerrorMessage(other));
        return 1;
    }
    if (idem_store_open(uri, NULL, &st, &err) < 0) {
        fprintf(stderr, "cannot open the store: %s\n", err ? err : "?");
        return 1;
    }
    test_the_first_wait_starts_the_listener(st);
    test_a_notify_from_another_connection_wakes_a_waiter(st);
    test_a_waiter_times_out_when_nothing_comes(st);
    test_the_listener_reconnects_after_its_connection_is_killed(st);
    idem_store_close(st);
    PQfinish(other);
    return t_done();
}
