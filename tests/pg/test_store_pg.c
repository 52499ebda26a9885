/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_store_pg.c - what only the PostgreSQL store has, against a real server (run it through
 * tests/pg/with_pg.sh, which exports IDEM_TEST_PG_*).  The behaviour both stores share is proven
 * by tests/contract/store_contract.c; this file walks the rest: the connection string forms, that
 * no message shows a password, several store handles (as several service instances) racing one
 * key, a waiting duplicate woken by another instance's commit through LISTEN/NOTIFY, SQLSTATEs
 * mapped to IDEM_E* codes, statements sent together with the next one (deferred) failing as if
 * sent alone, pooled connections the server closed, a connection lost after a pipeline's last
 * answer (its COMMIT done, its end not seen), a server restart that the pool and the listener
 * survive, and the store's batcher, which its close stops once every job given to it was told.
 */
#include "idem/idem.h"
#include "internal.h" /* lib/: idem__tx_run_async, to give the batcher jobs of the test's own */
#include "t.h"

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *pg_uri;

static struct idem_store *open_uri(const char *uri, int pool)
{
    struct idem_store_options o = {.pool_size = pool, .busy_timeout_ms = 10000};
    struct idem_store *st = NULL;
    char *err = NULL;
    int rc = idem_store_open(uri, &o, &st, &err);
    if (rc < 0) {
        fprintf(stderr, "cannot open the store: %s\n", err ? err : idem_strerror(rc));
        exit(1);
    }
    return st;
}

/* A store whose sessions pg_stat_activity shows as `app`, its listener's among them. */
static struct idem_store *open_named(const char *app, int pool)
{
    char uri[1200];
    snprintf(uri, sizeof(uri), "%s%capplication_name=%s", pg_uri, strchr(pg_uri, '?') ? '&' : '?',
             app);
    return open_uri(uri, pool);
}

static void fp_of(const char *body, unsigned char fp[IDEM_FP_LEN])
{
    if (idem_fingerprint("POST", "/pg", NULL, 0, body, strlen(body), fp, NULL) < 0)
        exit(1);
}

/* Runs one statement in its own transaction; returns the first cell as an int, or -1. */
static int query_int(struct idem_store *st, const char *sql)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    int n = -1;
    if (idem_tx_begin(st, 0, &tx) < 0)
        return -1;
    if (idem_tx_exec(tx, sql, 0, NULL, &r) == 0 && idem_rows_get(r, 0, 0))
        n = atoi(idem_rows_get(r, 0, 0));
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return n;
}

/* Whether alice's record of (operation, key) is processing with its lease run out. */
static int lease_over(struct idem_engine *eng, const char *operation, const char *key)
{
    struct idem_record_info info;
    return idem_record_inspect(eng, "alice", operation, key, &info) == 0 && info.found &&
           !info.completed && !info.lease_live;
}

/* ---- connection strings and messages --------------------------------------------------------- */

static void test_dsn_forms(void)
{
    const char *port = getenv("IDEM_TEST_PG_PORT");
    char kv[256], uri2[256];
    struct idem_store *st = NULL;
    char *err = NULL;

    snprintf(kv, sizeof(kv), "host=127.0.0.1 port=%s dbname=idemtest user=postgres", port);
    CHECK_INT(idem_store_open(kv, NULL, &st, &err), 0);
    CHECK_STR(idem_store_kind(st), "postgresql");
    /* The session is named after the library unless the user names it. */
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_stat_activity"
                            " WHERE pid = pg_backend_pid() AND application_name = 'libidem'"),
              1);
    idem_store_close(st);
    st = NULL;

    snprintf(kv, sizeof(kv),
             "host=127.0.0.1 port=%s dbname=idemtest user=postgres application_name=mine", port);
    CHECK_INT(idem_store_open(kv, NULL, &st, &err), 0);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_stat_activity"
                            " WHERE pid = pg_backend_pid() AND application_name = 'mine'"),
              1);
    idem_store_close(st);
    st = NULL;

    snprintf(uri2, sizeof(uri2), "postgres://postgres@127.0.0.1:%s/idemtest", port);
    CHECK_INT(idem_store_open(uri2, NULL, &st, &err), 0);
    idem_store_close(st);
    st = NULL;
}

static void test_no_password_in_messages(void)
{
    static const char *const bad[] = {
        "postgresql://postgres:S3cretPw@127.0.0.1:1/idemtest",
        "postgresql://postgres@127.0.0.1:1/idemtest?password=S3cretPw",
        "host=127.0.0.1 port=1 dbname=idemtest password=S3cretPw",
        "host=127.0.0.1 password=S3cretPw bogus",
        "host=127.0.0.1 password='S3cretPw",
        "postgresql://postgres:S3cretPw@127.0.0.1:1/idemtest?nonsense=1",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct idem_store *st = NULL;
        char *err = NULL;
        int rc = idem_store_open(bad[i], NULL, &st, &err);
        CHECK(rc == IDEM_EUNAVAIL || rc == IDEM_EURI);
        CHECK(st == NULL);
        CHECK(err && err[0]);
        CHECK(err && !strstr(err, "S3cretPw"));
        fprintf(stderr, "refused (%s): %s\n", idem_err_name(rc), err ? err : "");
        idem_free(err);
    }
}

/* ---- many instances, one truth --------------------------------------------------------------- */

struct racer {
    struct idem_engine *eng;
    pthread_barrier_t *start;
    atomic_int *arrived; /* racers that reached their claim */
    int n;
    enum idem_outcome outcome;
    int rc;
    int status;
};

/*
 * Long lease and wait: an owner slowed down by a loaded machine is neither taken over nor given
 * up on.
 */
static const struct idem_operation race_op = {
    .name = "pg.race", .lease_ms = 60000, .wait_ms = 30000};

static void *race_one(void *arg)
{
    struct racer *r = arg;
    struct idem_call *call = NULL;
    unsigned char fp[IDEM_FP_LEN];
    fp_of("{\"race\":1}", fp);
    pthread_barrier_wait(r->start);
    atomic_fetch_add(r->arrived, 1);
    r->rc = idem_call_begin(r->eng, &race_op, "alice", "multi", fp, &call, &r->outcome);
    if (r->rc == 0 && r->outcome == IDEM_OUTCOME_EXECUTE) {
        const char *p[] = {"multi-1"};
        r->rc = idem_tx_exec(idem_call_tx(call), "INSERT INTO pg_biz (id) VALUES ($1)", 1, p, NULL);
        /* Hold the record until every other racer is at its claim: they must meet it. */
        T_WAIT_UNTIL(atomic_load(r->arrived) == r->n, "every racer at its claim");
        if (r->rc == 0)
            r->rc = idem_call_complete(call, 201, NULL, 0, "made", 4);
    }
    if (r->rc == 0)
        r->status = idem_call_response_status(call);
    idem_call_end(call);
    return NULL;
}

static void test_instances_race(struct idem_store *main_st)
{
    enum { STORES = 4, PER = 6, N = STORES * PER };
    struct idem_store *st[STORES];
    struct idem_engine *eng[STORES];
    pthread_t th[N];
    struct racer r[N];
    pthread_barrier_t start;
    atomic_int arrived = 0;
    int executed = 0;

    for (int i = 0; i < STORES; i++) {
        st[i] = open_uri(pg_uri, 3);
        if (idem_engine_new(st[i], NULL, &eng[i]) < 0)
            exit(1);
    }
    pthread_barrier_init(&start, NULL, N);
    for (int i = 0; i < N; i++) {
        r[i] = (struct racer){.eng = eng[i % STORES], .start = &start, .arrived = &arrived, .n = N};
        pthread_create(&th[i], NULL, race_one, &r[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < N; i++) {
        CHECK_INT(r[i].rc, 0);
        CHECK_INT(r[i].status, 201);
        executed += r[i].outcome == IDEM_OUTCOME_EXECUTE;
    }
    CHECK_INT(executed, 1);
    CHECK_INT(query_int(main_st, "SELECT count(*) FROM pg_biz WHERE id = 'multi-1'"), 1);
    for (int i = 0; i < STORES; i++) {
        idem_engine_free(eng[i]);
        idem_store_close(st[i]);
    }
}

/* ---- waits woken by another instance's commit ------------------------------------------------ */

struct waiter {
    struct idem_engine *eng;
    const char *key;
    enum idem_outcome outcome;
    int waited;
    int64_t done_ms;
};

/* A wait that would end far later than any wake-up takes, so that the two cannot be confused. */
static const struct idem_operation wake_op = {
    .name = "pg.wake", .lease_ms = 60000, .wait_ms = 30000};

static void *wait_one(void *arg)
{
    struct waiter *w = arg;
    struct idem_call *call = NULL;
    unsigned char fp[IDEM_FP_LEN];
    fp_of("{\"wake\":1}", fp);
    if (idem_call_begin(w->eng, &wake_op, "alice", w->key, fp, &call, &w->outcome) < 0)
        w->outcome = IDEM_OUTCOME_NONE;
    w->waited = idem_call_waited(call);
    w->done_ms = clock_mono_ms();
    idem_call_end(call);
    return NULL;
}

static uint64_t cache_misses(struct idem_engine *eng)
{
    struct idem_cache_stats cs;
    idem_engine_cache_stats(eng, &cs);
    return cs.misses;
}

/* How many sessions named `app` are connected and LISTENing (a store's listener is one). */
static int listener_count(struct idem_store *st, const char *app)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'"
             " AND query = 'LISTEN idem_records'",
             app);
    return query_int(st, sql);
}

/*
 * Instance A owns the key; instance B (whose sessions are named `b_app`) has a duplicate wait;
 * returns how late B saw A's commit.  B's duplicate is seen to start by its replay cache miss;
 * then it reads the record and waits, which cannot be observed.  If it was held up in between
 * until the commit, it finds the response without waiting: that round proves nothing either way,
 * so it runs again with a fresh key rather than fail or pass.
 */
static int64_t wake_round(struct idem_store *main_st, struct idem_engine *a, struct idem_engine *b,
                          const char *b_app, const char *key)
{
    char k[96];

    for (int round = 0; round < 5; round++) {
        struct idem_call *call = NULL;
        enum idem_outcome oc;
        unsigned char fp[IDEM_FP_LEN];
        struct waiter w = {.eng = b, .key = k};
        pthread_t th;
        uint64_t misses;
        int64_t t_done;

        if (round == 0)
            snprintf(k, sizeof(k), "%s", key);
        else
            snprintf(k, sizeof(k), "%s-again-%d", key, round);
        fp_of("{\"wake\":1}", fp);
        CHECK_INT(idem_call_begin(a, &wake_op, "alice", k, fp, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        CHECK_INT(idem_call_advance(call, "started", NULL), 0);
        misses = cache_misses(b);
        pthread_create(&th, NULL, wait_one, &w);
        T_WAIT_UNTIL(cache_misses(b) > misses, "B's duplicate to look in its replay cache");
        /* B's first wait starts its listener; until that listens, B polls the store. */
        T_WAIT_UNTIL(listener_count(main_st, b_app) >= 1, "B's listener to LISTEN");
        /*
         * The duplicate's pauses double from 2 ms up to their cap of 100 ms, each round looking in
         * the replay cache first: after 9 more looks its pause is at the cap, so that polling
         * alone would find the commit up to 100 ms late, and it is back waiting on the listener.
         */
        T_WAIT_UNTIL(cache_misses(b) >= misses + 10, "B's duplicate's pauses to reach their cap");
        CHECK_INT(idem_call_complete(call, 200, NULL, 0, "ok", 2), 0);
        t_done = clock_mono_ms();
        idem_call_end(call);
        pthread_join(th, NULL);
        CHECK_INT(w.outcome, IDEM_OUTCOME_REPLAY);
        if (w.waited)
            return w.done_ms - t_done;
        fprintf(stderr, "wake: B's duplicate came too late to wait (%s), again\n", k);
    }
    CHECK(!"in 5 rounds B's duplicate never waited for A");
    return 0;
}

static void test_cross_instance_wake(struct idem_store *main_st, const char *tag)
{
    char app[64], key[64];
    struct idem_store *sa, *sb;
    struct idem_engine *a = NULL, *b = NULL;
    int fast = 0;
    enum { ROUNDS = 6 };

    snprintf(app, sizeof(app), "idem-wake-%s", tag);
    sa = open_uri(pg_uri, 2);
    sb = open_named(app, 2);
    if (idem_engine_new(sa, NULL, &a) < 0 || idem_engine_new(sb, NULL, &b) < 0)
        exit(1);
    for (int i = 0; i < ROUNDS; i++) {
        snprintf(key, sizeof(key), "wake-%s-%d", tag, i);
        int64_t late = wake_round(main_st, a, b, app, key);
        fprintf(stderr, "wake (%s): the waiter saw the commit after %lld ms\n", tag,
                (long long)late);
        /*
         * Polling alone finds it up to 100 ms late, on average 50; a notification in a few.  One
         * round may be slow all the same: a loaded machine can hold up any thread that long.
         */
        fast += late < 50;
    }
    CHECK(fast >= ROUNDS - 1);
    idem_engine_free(a);
    idem_engine_free(b);
    idem_store_close(sa);
    idem_store_close(sb);
}

/* The notification itself: channel idem_records, sent at commit, once per phase end. */
static void test_notify_payload(struct idem_engine *eng)
{
    PGconn *pg = PQconnectdb(pg_uri);
    PGresult *res = NULL;
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    PGnotify *nt = NULL;
    int got = 0;

    CHECK(PQstatus(pg) == CONNECTION_OK);
    res = PQexec(pg, "LISTEN idem_records");
    CHECK(PQresultStatus(res) == PGRES_COMMAND_OK);
    PQclear(res);

    fp_of("{}", fp);
    CHECK_INT(idem_call_begin(eng, &wake_op, "alice", "notify-1", fp, &call, &oc), 0);
    /* A phase that rolls back notifies nobody. */
    idem_call_abort(call);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(eng, &wake_op, "alice", "notify-1", fp, &call, &oc), 0);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "n", 1), 0);
    idem_call_end(call);

    /*
     * A marker sent after all of that: PostgreSQL delivers notifications in commit order, so
     * every notification the calls above sent (a rollback's, a second for the phase end) comes
     * before it, and the count is complete once the marker arrives.
     */
    res = PQexec(pg, "NOTIFY idem_records, 'test-marker'");
    CHECK(PQresultStatus(res) == PGRES_COMMAND_OK);
    PQclear(res);
    int marked = 0;
    int64_t deadline = clock_mono_ms() + T_WAIT_MS;
    while (!marked && clock_mono_ms() < deadline) {
        struct pollfd p = {.fd = PQsocket(pg), .events = POLLIN};
        poll(&p, 1, 100);
        PQconsumeInput(pg);
        while ((nt = PQnotifies(pg)) != NULL) {
            CHECK_STR(nt->relname, "idem_records");
            if (strcmp(nt->extra, "test-marker") == 0) {
                marked = 1;
            } else {
                CHECK_INT(strlen(nt->extra), 16); /* the scope's hash, never the key itself */
                CHECK(!strstr(nt->extra, "alice"));
                got++;
            }
            PQfreemem(nt);
        }
    }
    CHECK(marked);
    CHECK_INT(got, 1);
    PQfinish(pg);
}

/* ---- SQLSTATEs ------------------------------------------------------------------------------- */

struct locker {
    struct idem_store *st;
    const char *first, *second;
    pthread_barrier_t *both;
    int rc;
};

static void *lock_two(void *arg)
{
    struct locker *l = arg;
    struct idem_tx *tx = NULL;
    const char *p1[] = {l->first}, *p2[] = {l->second};
    l->rc = idem_tx_begin(l->st, 1, &tx);
    if (l->rc == 0)
        l->rc = idem_tx_exec(tx, "UPDATE pg_biz SET n = n + 1 WHERE id = $1", 1, p1, NULL);
    pthread_barrier_wait(l->both);
    if (l->rc == 0)
        l->rc = idem_tx_exec(tx, "UPDATE pg_biz SET n = n + 1 WHERE id = $1", 1, p2, NULL);
    if (l->rc == 0)
        l->rc = idem_tx_commit(tx);
    else
        idem_tx_rollback(tx);
    return NULL;
}

static void test_sqlstates(struct idem_store *st)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    const char *a[] = {"dup-a"}, *b[] = {"dup-b"}, *nul[] = {NULL};

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, a, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, a, NULL), IDEM_ECONFLICT);
    CHECK(strstr(idem_tx_errmsg(tx), "23505") != NULL);
    /* Any failed statement leaves the transaction usable, as on SQLite. */
    CHECK_INT(idem_tx_exec(tx, "SELECT 1/0", 0, NULL, NULL), IDEM_ESTORE);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, b, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "UPDATE pg_biz SET n = 7 WHERE id LIKE 'dup-%'", 0, NULL, &r), 0);
    CHECK_INT(idem_rows_changed(r), 2);
    idem_rows_free(r);
    CHECK_INT(
        idem_tx_exec(tx, "SELECT id FROM pg_biz WHERE id LIKE 'dup-%' ORDER BY id", 0, NULL, &r),
        0);
    CHECK_INT(idem_rows_count(r), 2);
    CHECK_INT(idem_rows_changed(r), 0);
    idem_rows_free(r);
    CHECK_INT(idem_tx_exec(tx, "SELECT $1::text IS NULL, '$2' AS \"$3\" -- $4", 1, nul, &r), 0);
    CHECK_STR(idem_rows_get(r, 0, 0), "t");
    CHECK_STR(idem_rows_get(r, 0, 1), "$2");
    idem_rows_free(r);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_biz WHERE id LIKE 'dup-%' AND n = 7"), 2);

    /* Many different statements: the per-connection statement cache evicts and still works. */
    CHECK_INT(idem_tx_begin(st, 0, &tx), 0);
    for (int i = 0; i < 120; i++) {
        char sql[64];
        snprintf(sql, sizeof(sql), "SELECT %d + $1::int", i);
        const char *one[] = {"1"};
        CHECK_INT(idem_tx_exec(tx, sql, 1, one, &r), 0);
        CHECK_INT(atoi(idem_rows_get(r, 0, 0) ? idem_rows_get(r, 0, 0) : "-1"), i + 1);
        idem_rows_free(r);
    }
    idem_tx_rollback(tx);

    /* A deadlock is the server's to break; the victim hears IDEM_EUNAVAIL (retry later). */
    pthread_barrier_t both;
    pthread_t t1, t2;
    struct locker l1 = {st, "dup-a", "dup-b", &both, 0}, l2 = {st, "dup-b", "dup-a", &both, 0};
    pthread_barrier_init(&both, NULL, 2);
    pthread_create(&t1, NULL, lock_two, &l1);
    pthread_create(&t2, NULL, lock_two, &l2);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_barrier_destroy(&both);
    CHECK((l1.rc == 0 && l2.rc == IDEM_EUNAVAIL) || (l1.rc == IDEM_EUNAVAIL && l2.rc == 0));
}

/* ---- statements sent together: the deferred ones ------------------------------------------- */

/*
 * BEGIN, the application's SAVEPOINT / RELEASE / ROLLBACK TO and the completion of a record the
 * transaction itself inserted go out with the next statement instead of alone (one round trip
 * fewer each).  What a caller sees must not change: a failure of one of them is reported by the
 * next statement or by the COMMIT, which then does not happen.
 */
static void test_deferred_statements(struct idem_store *st, struct idem_engine *eng)
{
    static const struct idem_operation op = {.name = "pg.deferred"};
    struct idem_tx *tx = NULL;
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    const char *one[] = {"defer-1"}, *two[] = {"defer-2"}, *three[] = {"defer-3"};
    int rc;

    /* Transactions that end before any statement: nothing to do, and the pool is fine. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    idem_tx_rollback(tx);

    /* A savepoint statement that fails aborts the transaction; the next statement says so... */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, one, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "SAVEPOINT s1", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "RELEASE SAVEPOINT no_such", 0, NULL, NULL), 0);
    rc = idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, two, NULL);
    CHECK_INT(rc, IDEM_ESTORE);
    CHECK(strstr(idem_tx_errmsg(tx), "no_such") != NULL);
    /* ...a ROLLBACK TO an existing savepoint repairs it, as on a server without pipelining... */
    CHECK_INT(idem_tx_exec(tx, "ROLLBACK TO SAVEPOINT s1", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, three, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_biz WHERE id IN ('defer-1', 'defer-3')"), 2);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_biz WHERE id = 'defer-2'"), 0);
    /* ...and without the repair the COMMIT fails and nothing of it stays. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, two, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "ROLLBACK TO SAVEPOINT no_such", 0, NULL, NULL), 0);
    CHECK(idem_tx_commit(tx) < 0);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_biz WHERE id = 'defer-2'"), 0);

    /* The completion of a claimed record, sent with the COMMIT, commits with it. */
    fp_of("{\"deferred\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "defer-ok", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "made", 4), 0);
    idem_call_end(call);
    CHECK_INT(query_int(st, "SELECT response_status FROM idem_records WHERE idem_key = 'defer-ok'"
                            " AND status = 1 AND response_body = 'made'"),
              201);
    /* Even unchecked, a completion that finds the record gone is no success: the division by
     * zero of the fenced statement aborts the transaction, and the COMMIT with it. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "defer-gone", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_tx_exec(idem_call_tx(call),
                           "DELETE FROM idem_records WHERE idem_key = 'defer-gone'", 0, NULL, NULL),
              0);
    CHECK(idem_call_complete(call, 201, NULL, 0, "made", 4) < 0);
    CHECK(strstr(idem_call_errmsg(call), "no longer this call's") != NULL);
    idem_call_end(call);
    CHECK_INT(query_int(st, "SELECT count(*) FROM idem_records WHERE idem_key = 'defer-gone'"), 0);

    /* The advance of a claimed record goes out with the COMMIT too, fenced alike. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "defer-advance", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(call, "charged", "ch-1"), 0);
    CHECK_STR(idem_call_recovery_point(call), "charged");
    CHECK_INT(query_int(st, "SELECT count(*) FROM idem_records WHERE idem_key = 'defer-advance'"
                            " AND status = 0 AND recovery_point = 'charged'"
                            " AND recovery_data = 'ch-1'"),
              1);
    CHECK_INT(idem_call_phase_begin(call), 0); /* not inserted by this phase: answered at once */
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "made", 4), 0);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "defer-advance-gone", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_tx_exec(idem_call_tx(call),
                           "DELETE FROM idem_records WHERE idem_key = 'defer-advance-gone'", 0,
                           NULL, NULL),
              0);
    CHECK(idem_call_advance(call, "charged", NULL) < 0);
    CHECK(strstr(idem_call_errmsg(call), "no longer this call's") != NULL);
    idem_call_end(call);
    CHECK_INT(query_int(st, "SELECT count(*) FROM idem_records"
                            " WHERE idem_key = 'defer-advance-gone'"),
              0);

    /* A claim at a claim_point (insert, then its advance) commits whole. */
    {
        static const struct idem_operation at = {.name = "pg.deferred", .claim_point = "forwarded"};
        CHECK_INT(idem_call_begin(eng, &at, "alice", "defer-point", fp, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        CHECK(idem_call_tx(call) == NULL);
        CHECK_INT(query_int(st, "SELECT count(*) FROM idem_records WHERE idem_key = 'defer-point'"
                                " AND status = 0 AND recovery_point = 'forwarded'"),
                  1);
        CHECK_INT(idem_call_complete(call, 200, NULL, 0, "ok", 2), 0);
        idem_call_end(call);
    }

    /*
     * A completion with no phase open is a whole transaction: BEGIN, the fenced update and the
     * COMMIT go out together, and a fence that fails (the lease was taken over) fails the COMMIT
     * with IDEM_ELEASE; the heir's answer is the one stored.
     */
    {
        static const struct idem_operation brief = {
            .name = "pg.deferred", .lease_ms = 50, .wait_ms = 10, .claim_point = "forwarded"};
        struct idem_call *heir = NULL;
        CHECK_INT(idem_call_begin(eng, &brief, "alice", "defer-whole", fp, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        T_WAIT_UNTIL(lease_over(eng, brief.name, "defer-whole"),
                     "the lease of the claim to run out");
        CHECK_INT(idem_call_recover(eng, &brief, "alice", "defer-whole", &heir, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_RESUME);
        CHECK_INT(idem_call_complete(call, 201, NULL, 0, "late", 4), IDEM_ELEASE);
        CHECK(strstr(idem_call_errmsg(call), "no longer this call's") != NULL);
        CHECK_INT(idem_call_complete(heir, 200, NULL, 0, "heir", 4), 0);
        idem_call_end(call);
        idem_call_end(heir);
        CHECK_INT(query_int(st, "SELECT response_status FROM idem_records"
                                " WHERE idem_key = 'defer-whole' AND response_body = 'heir'"),
                  200);
    }
}

/*
 * Connections the server closed while they sat idle in the pool (an administrator, a failover):
 * one whose end has arrived is opened again as a transaction begins on it; a transaction whose
 * first statement meets one is begun again on a new connection, since nothing of it ran.  The
 * caller sees no failure.
 */
static void test_idle_connections_closed(void)
{
    struct idem_store *st = open_uri(pg_uri, 2);
    struct idem_tx *tx[2] = {NULL, NULL};
    struct idem_rows *r = NULL;
    PGconn *admin = PQconnectdb(pg_uri);
    PGresult *res = NULL;

    /* Two pooled connections, both used once, then both idle. */
    CHECK_INT(idem_tx_begin(st, 0, &tx[0]), 0);
    CHECK_INT(idem_tx_begin(st, 0, &tx[1]), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_INT(idem_tx_exec(tx[i], "SELECT 1", 0, NULL, NULL), 0);
        CHECK_INT(idem_tx_commit(tx[i]), 0);
    }
    CHECK(PQstatus(admin) == CONNECTION_OK);
    /*
     * With a timeout, pg_terminate_backend() returns once the backend is gone (false if it is
     * not within the timeout): the pool's connections are closed before the test goes on.
     */
    res = PQexec(admin, "SELECT count(*) FILTER (WHERE NOT pg_terminate_backend(pid, 30000))"
                        " FROM pg_stat_activity WHERE application_name = 'libidem'"
                        " AND pid <> pg_backend_pid() AND query NOT LIKE 'LISTEN%'");
    CHECK(PQresultStatus(res) == PGRES_TUPLES_OK);
    CHECK_STR(PQgetvalue(res, 0, 0), "0");
    PQclear(res);
    PQfinish(admin);
    /* A transaction whose first round trip is its COMMIT (its one statement, a savepoint, held
     * back to go with it, as a batch's statements are) cannot be begun again once sent: the
     * closed connection is seen as the transaction begins instead, and it commits on a new one. */
    CHECK_INT(idem_tx_begin(st, 1, &tx[0]), 0);
    CHECK_INT(idem_tx_exec(tx[0], "SAVEPOINT first", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_commit(tx[0]), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_INT(idem_tx_begin(st, 1, &tx[0]), 0);
        CHECK_INT(idem_tx_exec(tx[0], "SELECT 41 + 1", 0, NULL, &r), 0);
        CHECK_STR(idem_rows_get(r, 0, 0), "42");
        idem_rows_free(r);
        r = NULL;
        CHECK_INT(idem_tx_commit(tx[0]), 0);
    }
    idem_store_close(st);
}

/* ---- a server restart ------------------------------------------------------------------------ */

static int restart_server(void)
{
    const char *bin = getenv("IDEM_TEST_PG_BIN");
    const char *data = getenv("IDEM_TEST_PG_DATA");
    const char *user = getenv("IDEM_TEST_PG_OS_USER");
    char cmd[1024];

    if (!bin || !data)
        return -1;
    snprintf(cmd, sizeof(cmd), "%s%s%s '%s/pg_ctl' -D '%s' -m fast -w restart >/dev/null 2>&1",
             user && user[0] ? "runuser -u " : "", user && user[0] ? user : "",
             user && user[0] ? " --" : "", bin, data);
    return system(cmd);
}

static void test_restart(struct idem_store *st, struct idem_engine *eng)
{
    static const struct idem_operation op = {.name = "pg.restart", .wait_ms = 100};
    struct idem_call *call = NULL;
    struct idem_engine *other = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];

    /* A first wait on this store starts its listener, which must outlive the restart. */
    if (idem_engine_new(st, NULL, &other) < 0)
        exit(1);
    wake_round(st, eng, other, "libidem", "pre-restart");
    idem_engine_free(other);
    /* Only this store's sessions are named libidem now (a closed store's may linger a moment). */
    T_WAIT_UNTIL(listener_count(st, "libidem") == 1, "one listener of this store");

    fp_of("{\"restart\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "before", fp, &call, &oc), 0);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "b", 1), 0);
    idem_call_end(call);

    CHECK_INT(restart_server(), 0);

    /* Every pooled connection died with the server: each is reopened where that is safe. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "before", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "after", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "a", 1), 0);
    idem_call_end(call);

    /* The listener reconnects by itself. */
    T_WAIT_UNTIL(listener_count(st, "libidem") >= 1, "the listener to reconnect and LISTEN");
}

/* ---- a connection lost between a pipeline's last answer and its end ------------------------- */

/*
 * A loopback TCP proxy in front of the server that, once armed, cuts the next connection about to
 * receive a ReadyForQuery message ('Z', the end of a pipeline): every answer before it reaches
 * the client, the end never does.  Armed only while its connections are idle, so the next byte
 * the server sends starts a message.
 */
#define CUT_PAIRS 8

struct cut_proxy {
    int lfd, port;
    atomic_int armed, cuts, stop;
    atomic_int pass_z; /* ReadyForQuery messages to let through first, once armed */
    pthread_t thread;
};

struct cut_pair {
    int cfd, sfd;
    int armed; /* the arming this pair's parse began at */
    int have;  /* bytes of the current message's header (type, length) seen */
    unsigned char hdr[5];
    uint32_t skip; /* bytes of the current message's body still to pass */
};

static int cut_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("cut proxy: connect to the server");
        exit(1);
    }
    return fd;
}

static void cut_close(struct cut_pair *p)
{
    close(p->cfd);
    close(p->sfd);
    p->cfd = p->sfd = -1;
}

/* Passes n bytes from the server on; 0, or -1 when the pair was cut before a ReadyForQuery. */
static int cut_pass(struct cut_proxy *px, struct cut_pair *p, const unsigned char *b, size_t n)
{
    int armed = atomic_load(&px->armed);
    size_t i = 0;

    if (armed != p->armed) { /* armed while idle: a message starts here */
        p->armed = armed;
        p->have = 0;
        p->skip = 0;
    }
    while (armed && i < n) {
        if (p->skip > 0) {
            size_t take = n - i < p->skip ? n - i : p->skip;
            i += take;
            p->skip -= (uint32_t)take;
            continue;
        }
        if (p->have == 0 && b[i] == 'Z' && atomic_load(&px->pass_z) > 0) {
            atomic_fetch_sub(&px->pass_z, 1); /* this one passes: parsed as any message */
        } else if (p->have == 0 && b[i] == 'Z') {
            if (i > 0 && write(p->cfd, b, i) != (ssize_t)i)
                return -1;
            atomic_store(&px->armed, 0);
            atomic_fetch_add(&px->cuts, 1);
            return -1;
        }
        p->hdr[p->have++] = b[i++];
        if (p->have == 5) {
            uint32_t len = (uint32_t)p->hdr[1] << 24 | (uint32_t)p->hdr[2] << 16 |
                           (uint32_t)p->hdr[3] << 8 | p->hdr[4];
            p->skip = len - 4; /* the length counts itself */
            p->have = 0;
        }
    }
    return write(p->cfd, b, n) == (ssize_t)n ? 0 : -1;
}

static void *cut_proxy_run(void *arg)
{
    struct cut_proxy *px = arg;
    const int server_port = atoi(getenv("IDEM_TEST_PG_PORT"));
    struct cut_pair pairs[CUT_PAIRS];
    int npairs = 0;

    while (!atomic_load(&px->stop)) {
        struct pollfd fds[1 + 2 * CUT_PAIRS];
        int nfds = 0;
        fds[nfds++] = (struct pollfd){.fd = px->lfd, .events = POLLIN};
        for (int i = 0; i < npairs; i++) {
            fds[nfds++] = (struct pollfd){.fd = pairs[i].cfd, .events = POLLIN};
            fds[nfds++] = (struct pollfd){.fd = pairs[i].sfd, .events = POLLIN};
        }
        if (poll(fds, (nfds_t)nfds, 50) <= 0)
            continue;
        if ((fds[0].revents & POLLIN) && npairs < CUT_PAIRS) {
            int cfd = accept(px->lfd, NULL, NULL);
            if (cfd >= 0)
                pairs[npairs++] = (struct cut_pair){cfd, cut_connect(server_port), 0, 0, {0}, 0};
        }
        for (int i = 0, f = 1; i < npairs; i++, f += 2) {
            unsigned char b[16384];
            ssize_t n;
            if (f + 1 >= nfds)
                break; /* accepted in this round: polled from the next */
            if (fds[f].revents) {
                n = read(pairs[i].cfd, b, sizeof(b));
                if (n <= 0 || write(pairs[i].sfd, b, (size_t)n) != n)
                    cut_close(&pairs[i]);
            }
            if (pairs[i].cfd >= 0 && fds[f + 1].revents) {
                n = read(pairs[i].sfd, b, sizeof(b));
                if (n <= 0 || cut_pass(px, &pairs[i], b, (size_t)n) < 0)
                    cut_close(&pairs[i]);
            }
        }
        for (int i = 0; i < npairs;) /* closed pairs go */
            if (pairs[i].cfd < 0)
                pairs[i] = pairs[--npairs];
            else
                i++;
    }
    for (int i = 0; i < npairs; i++)
        cut_close(&pairs[i]);
    return NULL;
}

static void cut_proxy_start(struct cut_proxy *px)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (px->lfd < 0 || bind(px->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(px->lfd, 16) < 0 || getsockname(px->lfd, (struct sockaddr *)&a, &len) < 0) {
        perror("cut proxy");
        exit(1);
    }
    px->port = ntohs(a.sin_port);
    if (pthread_create(&px->thread, NULL, cut_proxy_run, px) != 0)
        exit(1);
}

static void cut_proxy_stop(struct cut_proxy *px)
{
    atomic_store(&px->stop, 1);
    pthread_join(px->thread, NULL);
    close(px->lfd);
}

/* Starts the proxy and opens a store of `pool` connections through it. */
static struct idem_store *open_through(struct cut_proxy *px, int pool)
{
    char uri[256];

    cut_proxy_start(px);
    snprintf(uri, sizeof(uri),
             "host=127.0.0.1 port=%d dbname=idemtest user=postgres sslmode=disable "
             "gssencmode=disable",
             px->port);
    return open_uri(uri, pool);
}

/*
 * The server did a pipeline's COMMIT and sent its answer, then the connection died before the
 * pipeline's end: the COMMIT's answer came, so the commit stands (0), the store reconnects, and a
 * retry of the key replays the committed response.
 */
static void test_lost_after_last_answer(void)
{
    static const struct idem_operation op = {.name = "pg.cut", .one_phase = 1};
    struct cut_proxy px = {0};
    struct idem_store *st;
    struct idem_engine *eng = NULL;
    struct idem_tx *tx = NULL;
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    const char *id[] = {"cut-1"};

    st = open_through(&px, 1);
    if (idem_engine_new(st, NULL, &eng) < 0)
        exit(1);

    /* A transaction of the caller's: its COMMIT ran, its Sync's answer never came. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id) VALUES ($1)", 1, id, NULL), 0);
    atomic_store(&px.armed, 1);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(atomic_load(&px.cuts), 1);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_biz WHERE id = 'cut-1'"), 1);

    /* A one-phase call: its record and response go in with the COMMIT, in one pipeline. */
    fp_of("{\"cut\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "cut", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    atomic_store(&px.armed, 2);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "cut", 3), 0);
    CHECK_INT(atomic_load(&px.cuts), 2);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "cut", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_status(call), 201);
    idem_call_end(call);

    idem_engine_free(eng);
    idem_store_close(st);
    cut_proxy_stop(&px);
}

/*
 * Event-loop jobs run in batches (lib/tx_batch.c) while the connection under them is cut at the
 * end of a pipeline that is not a transaction's first (a first one is retried on a new connection,
 * unseen): every job is told exactly once; what was told 0 is there, durable, and replays; what
 * was told IDEM_EUNAVAIL left nothing (the cut came before its COMMIT's answer) and is not run
 * again by the store; and the store goes on with a new connection.
 */
enum { BATCH_JOBS = 12 };

struct batch_job_seen {
    char id[32];
    atomic_int told;
    atomic_int rc;
    struct idem_call *call;
};

static int batch_run(struct idem_call *call, void *arg)
{
    struct batch_job_seen *j = arg;
    const char *id[] = {j->id};
    int rc = idem_tx_exec(idem_call_tx(call), "INSERT INTO pg_biz (id) VALUES ($1)", 1, id, NULL);

    return rc < 0 ? rc : idem_call_stage(call, 201, NULL, 0, j->id, strlen(j->id));
}

static void batch_done(struct idem_call *call, int rc, void *arg)
{
    struct batch_job_seen *j = arg;

    j->call = call;
    atomic_store(&j->rc, rc);
    atomic_fetch_add(&j->told, 1);
}

static void test_batch_connection_cut(void)
{
    static const struct idem_operation op = {.name = "pg.batch", .one_phase = 1, .wait_ms = 100};
    static const struct idem_operation reader = {.name = "pg.batch", .wait_ms = 100};
    static struct batch_job_seen jobs[BATCH_JOBS + 1];
    struct cut_proxy px = {0};
    struct idem_store *st;
    struct idem_engine *eng = NULL, *other = NULL;
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    char sql[128];
    int ok = 0, lost = 0;

    st = open_through(&px, 4);
    if (idem_engine_new(st, NULL, &eng) < 0 || idem_engine_new(st, NULL, &other) < 0)
        exit(1);
    fp_of("{\"batch\":1}", fp);
    atomic_store(&px.pass_z, 1);
    atomic_store(&px.armed, 1); /* (the pool's one connection is idle) */
    for (int i = 0; i < BATCH_JOBS; i++) {
        snprintf(jobs[i].id, sizeof(jobs[i].id), "batch-%02d", i);
        CHECK_INT(
            idem_call_run_async(eng, &op, "alice", jobs[i].id, fp, batch_run, batch_done, &jobs[i]),
            1);
    }
    for (int i = 0; i < BATCH_JOBS; i++) {
        T_WAIT_UNTIL(atomic_load(&jobs[i].told) > 0, "every job to be told");
        CHECK_INT(atomic_load(&jobs[i].told), 1);
        idem_call_end(jobs[i].call);
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM pg_biz WHERE id = '%.31s'", jobs[i].id);
        if (atomic_load(&jobs[i].rc) == IDEM_EUNAVAIL) {
            lost++;
            CHECK_INT(query_int(st, sql), 0);
            continue;
        }
        CHECK_INT(atomic_load(&jobs[i].rc), 0);
        ok++;
        CHECK_INT(query_int(st, sql), 1);
        CHECK_INT(idem_call_begin(other, &reader, "alice", jobs[i].id, fp, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
        CHECK_INT(idem_call_response_status(call), 201);
        idem_call_end(call);
    }
    CHECK_INT(atomic_load(&px.cuts), 1);
    CHECK_INT(ok + lost, BATCH_JOBS);
    printf("batches through a cut connection: %d jobs durable, %d told unavailable\n", ok, lost);
    /* The store goes on: a new job runs on a new connection. */
    snprintf(jobs[BATCH_JOBS].id, sizeof(jobs[BATCH_JOBS].id), "batch-after");
    CHECK_INT(idem_call_run_async(eng, &op, "alice", jobs[BATCH_JOBS].id, fp, batch_run, batch_done,
                                  &jobs[BATCH_JOBS]),
              1);
    T_WAIT_UNTIL(atomic_load(&jobs[BATCH_JOBS].told) > 0, "the job after the cut to be told");
    CHECK_INT(atomic_load(&jobs[BATCH_JOBS].rc), 0);
    idem_call_end(jobs[BATCH_JOBS].call);
    CHECK_INT(query_int(st, "SELECT count(*) FROM pg_biz WHERE id = 'batch-after'"), 1);

    idem_engine_free(other);
    idem_engine_free(eng);
    idem_store_close(st);
    cut_proxy_stop(&px);
}

/*
 * A batch's claims go out with its COMMIT (store_pg.c, ahead_defer): a batch of claims is one
 * round trip, where a claim alone is two (its statement, then its COMMIT), and each claim is still
 * answered as it would be alone.  The pool's one connection is held while the claims are queued,
 * so that the store's two runners take at most one batch each before the rest are all queued:
 * some batch has two claims or more.
 */
struct claim_seen {
    struct idem_call *call;
    atomic_int rc, outcome, told;
};

static void claim_begun(struct idem_call *call, int rc, enum idem_outcome outcome, void *arg)
{
    struct claim_seen *c = arg;

    c->call = call;
    atomic_store(&c->rc, rc);
    atomic_store(&c->outcome, (int)outcome);
    atomic_store(&c->told, 1);
}

#define CLAIMS 8

static void test_batch_claims_one_round_trip(void)
{
    static const struct idem_operation op = {
        .name = "pg.claims", .lease_ms = 60000, .claim_point = "forwarded"};
    static struct claim_seen seen[CLAIMS];
    struct idem_store *st = open_uri(pg_uri, 1);
    struct idem_engine *eng = NULL;
    struct idem_store_stats before, after;
    struct idem_tx *hold = NULL;
    unsigned char fp[IDEM_FP_LEN];
    char key[32], sql[160];
    uint64_t trips, commits;

    if (idem_engine_new(st, NULL, &eng) < 0)
        exit(1);
    fp_of("{\"claims\":1}", fp);
    /* Fresh keys only: a claim found taken and run alone costs two round trips and no commit
     * (its ROLLBACK), which the count below could not tell from a batch's. The contract suite
     * has taken keys in batches. */
    idem_store_stats(st, &before);
    CHECK_INT(idem_tx_begin(st, 1, &hold), 0);
    for (int i = 0; i < CLAIMS; i++) {
        memset(&seen[i], 0, sizeof seen[i]);
        snprintf(key, sizeof key, "rt-%d", i);
        CHECK_INT(idem_call_begin_async(eng, &op, "alice", key, fp, claim_begun, &seen[i]), 1);
    }
    idem_tx_rollback(hold);
    for (int i = 0; i < CLAIMS; i++) {
        T_WAIT_UNTIL(atomic_load(&seen[i].told), "every claim to be answered");
        CHECK_INT(atomic_load(&seen[i].rc), 0);
        CHECK_INT(atomic_load(&seen[i].outcome), IDEM_OUTCOME_EXECUTE);
    }
    idem_store_stats(st, &after);
    trips = after.round_trips - before.round_trips;
    commits = after.durable_commits - before.durable_commits;
    printf("%d claims: %llu commits, %llu round trips\n", CLAIMS, (unsigned long long)commits,
           (unsigned long long)trips);
    /* A claim alone is two round trips and a commit; a batch of two or more, one and one. */
    CHECK(commits >= 1 && trips >= commits);
    CHECK(trips < 2 * commits);
    /* Each claim holds its record at its point, and completes. */
    for (int i = 0; i < CLAIMS; i++) {
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM idem_records WHERE idem_key = 'rt-%d' AND status = 0"
                 " AND recovery_point = 'forwarded'",
                 i);
        CHECK_INT(query_int(st, sql), 1);
        CHECK_INT(idem_call_complete(seen[i].call, 201, NULL, 0, "made", 4), 0);
        idem_call_end(seen[i].call);
    }
    CHECK_INT(query_int(st, "SELECT count(*) FROM idem_records WHERE idem_key LIKE 'rt-%'"
                            " AND status = 1"),
              CLAIMS);

    /* Again, every other key one of those: a claim its batch's COMMIT found taken wrote
     * nothing (its caller is told NONE: ask idem_call_begin()), so only the fresh ones are write
     * commits, batched or alone.  (A new engine: the
     * last one's replay cache would answer the taken ones without the store.) */
    idem_engine_free(eng);
    if (idem_engine_new(st, NULL, &eng) < 0)
        exit(1);
    idem_store_stats(st, &before);
    CHECK_INT(idem_tx_begin(st, 1, &hold), 0);
    for (int i = 0; i < CLAIMS; i++) {
        memset(&seen[i], 0, sizeof seen[i]);
        snprintf(key, sizeof key, i % 2 ? "rt-%d" : "rt2-%d", i);
        CHECK_INT(idem_call_begin_async(eng, &op, "alice", key, fp, claim_begun, &seen[i]), 1);
    }
    idem_tx_rollback(hold);
    for (int i = 0; i < CLAIMS; i++) {
        T_WAIT_UNTIL(atomic_load(&seen[i].told), "every claim to be answered");
        CHECK_INT(atomic_load(&seen[i].rc), 0);
        CHECK_INT(atomic_load(&seen[i].outcome), i % 2 ? IDEM_OUTCOME_NONE : IDEM_OUTCOME_EXECUTE);
    }
    idem_store_stats(st, &after);
    printf("%d claims, half taken: %llu write commits in %llu commits\n", CLAIMS,
           (unsigned long long)(after.write_commits - before.write_commits),
           (unsigned long long)(after.durable_commits - before.durable_commits));
    CHECK(after.durable_commits - before.durable_commits < CLAIMS / 2);
    CHECK_INT((int)(after.write_commits - before.write_commits), CLAIMS / 2);
    for (int i = 0; i < CLAIMS; i++)
        idem_call_end(seen[i].call);
    idem_engine_free(eng);
    idem_store_close(st);
}

/*
 * A statement held back in a batch (idem_tx_exec_deferred) goes out with the batch's COMMIT, so
 * a batch of them is no round trip each; and when one of them fails -- its own guard, here a
 * division by zero when no stock was left -- the whole batch rolls back and each job runs again
 * alone, where nothing is held back and the job reads the answer.  A stock of 5 row and 8 jobs
 * in a batch: exactly 5 sell, 3 are refused, the stock ends at 0, and no sale is lost or doubled.
 */
#define HELD_JOBS 8
#define SQL_TAKE_ONE "UPDATE pg_biz SET n = n - 1 WHERE id = 'held-stock' AND n > 0"
#define SQL_TAKE_ONE_HELD                                                                          \
    "WITH u AS (" SQL_TAKE_ONE " RETURNING 1) SELECT 1 / (SELECT count(*) FROM u)"

struct held_job {
    char key[32];
    atomic_int runs, held, told, rc;
    struct idem_call *call;
};

static int held_run(struct idem_call *call, void *arg)
{
    struct held_job *j = arg;
    struct idem_rows *rows = NULL;
    int rc = idem_tx_exec_deferred(idem_call_tx(call), SQL_TAKE_ONE_HELD, 0, NULL);
    int sold = rc == 1;

    atomic_fetch_add(&j->runs, 1);
    atomic_store(&j->held, rc == 1);
    if (rc == 0) {
        rc = idem_tx_exec(idem_call_tx(call), SQL_TAKE_ONE, 0, NULL, &rows);
        sold = rc == 0 && idem_rows_changed(rows) == 1;
        idem_rows_free(rows);
    }
    if (rc < 0)
        return rc;
    return sold ? idem_call_stage(call, 201, NULL, 0, "sold", 4)
                : idem_call_stage(call, 409, NULL, 0, "none", 4);
}

static void held_done(struct idem_call *call, int rc, void *arg)
{
    struct held_job *j = arg;

    j->call = call;
    atomic_store(&j->rc, rc);
    atomic_store(&j->told, 1);
}

/*
 * A write held back between a savepoint of the application's and its ROLLBACK TO: it must run
 * between them, so it is undone, though held-back writes otherwise go after the store's own
 * statements (pg_pipeline.c, apps_go_last).
 */
static int held_undone_run(struct idem_call *call, void *arg)
{
    struct held_job *j = arg;
    struct idem_tx *tx = idem_call_tx(call);
    const char *sql = "UPDATE pg_biz SET n = n + 1 WHERE id = 'held-stock'";
    int rc = idem_tx_exec(tx, "SAVEPOINT undone", 0, NULL, NULL);

    atomic_fetch_add(&j->runs, 1);
    if (rc == 0)
        rc = idem_tx_exec_deferred(tx, sql, 0, NULL);
    atomic_store(&j->held, rc == 1);
    if (rc == 0)
        rc = idem_tx_exec(tx, sql, 0, NULL, NULL);
    if (rc >= 0)
        rc = idem_tx_exec(tx, "ROLLBACK TO SAVEPOINT undone", 0, NULL, NULL);
    return rc < 0 ? rc : idem_call_stage(call, 201, NULL, 0, "undone", 6);
}

/* Runs HELD_JOBS jobs queued while the pool's one connection is held (so they batch). */
static void held_round(struct idem_store *st, struct idem_engine *eng, int round, int stock,
                       idem_call_run run, struct held_job *jobs, uint64_t *trips)
{
    static const struct idem_operation op = {.name = "pg.held", .one_phase = 1, .wait_ms = 100};
    struct idem_store_stats before, after;
    struct idem_tx *hold = NULL;
    unsigned char fp[IDEM_FP_LEN];
    char sql[96];

    fp_of("{\"held\":1}", fp);
    snprintf(sql, sizeof sql, "UPDATE pg_biz SET n = %d WHERE id = 'held-stock'", stock);
    CHECK_INT(idem_tx_begin(st, 1, &hold), 0);
    CHECK_INT(idem_tx_exec(hold, sql, 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_commit(hold), 0);
    idem_store_stats(st, &before);
    CHECK_INT(idem_tx_begin(st, 1, &hold), 0);
    for (int i = 0; i < HELD_JOBS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        snprintf(jobs[i].key, sizeof jobs[i].key, "held-%d-%d", round, i);
        CHECK_INT(idem_call_run_async(eng, &op, "alice", jobs[i].key, fp, run, held_done, &jobs[i]),
                  1);
    }
    idem_tx_rollback(hold);
    for (int i = 0; i < HELD_JOBS; i++) {
        T_WAIT_UNTIL(atomic_load(&jobs[i].told), "every held-back job to be told");
        CHECK_INT(atomic_load(&jobs[i].rc), 0);
    }
    idem_store_stats(st, &after);
    *trips = after.round_trips - before.round_trips;
}

static void test_batch_held_back_statements(void)
{
    static struct held_job jobs[HELD_JOBS];
    struct idem_store *st = open_uri(pg_uri, 1);
    struct idem_engine *eng = NULL;
    struct idem_tx *tx = NULL;
    uint64_t trips = 0;
    int held = 0, sold = 0, again = 0;
    const char *id[] = {"held-stock"};

    if (idem_engine_new(st, NULL, &eng) < 0)
        exit(1);
    /* Outside a batch nothing is held back: the caller is told to run it. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO pg_biz (id, n) VALUES ($1, 0)", 1, id, NULL), 0);
    CHECK_INT(idem_tx_exec_deferred(tx, SQL_TAKE_ONE_HELD, 0, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);

    /* Stock enough: the batch's jobs are held back, one pipeline for all of them. */
    held_round(st, eng, 1, 100, held_run, jobs, &trips);
    for (int i = 0; i < HELD_JOBS; i++) {
        held += atomic_load(&jobs[i].held);
        CHECK_INT(idem_call_response_status(jobs[i].call), 201);
        idem_call_end(jobs[i].call);
    }
    printf("%d held-back jobs: %d held back, %llu round trips\n", HELD_JOBS, held,
           (unsigned long long)trips);
    CHECK(held >= 2);
    CHECK(trips < HELD_JOBS);
    CHECK_INT(query_int(st, "SELECT n FROM pg_biz WHERE id = 'held-stock'"), 100 - HELD_JOBS);

    /* Stock for 5: a held-back batch fails its guard, and its jobs run again alone. */
    held_round(st, eng, 2, 5, held_run, jobs, &trips);
    for (int i = 0; i < HELD_JOBS; i++) {
        sold += idem_call_response_status(jobs[i].call) == 201;
        again += atomic_load(&jobs[i].runs) > 1;
        idem_call_end(jobs[i].call);
    }
    printf("%d jobs on a stock of 5: %d sold, %d ran again alone\n", HELD_JOBS, sold, again);
    CHECK_INT(sold, 5);
    CHECK(again >= 2);
    CHECK_INT(query_int(st, "SELECT n FROM pg_biz WHERE id = 'held-stock'"), 0);
    CHECK_INT(query_int(st, "SELECT count(*) FROM idem_records WHERE operation = 'pg.held'"
                            " AND idem_key LIKE 'held-2-%' AND status = 1"),
              HELD_JOBS);

    /* Between a savepoint and its ROLLBACK TO, a held-back write is undone. */
    held_round(st, eng, 3, 0, held_undone_run, jobs, &trips);
    held = 0;
    for (int i = 0; i < HELD_JOBS; i++) {
        held += atomic_load(&jobs[i].held);
        CHECK_INT(idem_call_response_status(jobs[i].call), 201);
        idem_call_end(jobs[i].call);
    }
    printf("%d jobs undoing their writes: %d held back\n", HELD_JOBS, held);
    CHECK(held >= 2);
    CHECK_INT(query_int(st, "SELECT n FROM pg_biz WHERE id = 'held-stock'"), 0);
    idem_engine_free(eng);
    idem_store_close(st);
}

static const struct idem_migration schema[] = {
    {1, "pg test rows", "CREATE TABLE pg_biz (id TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)",
     "CREATE TABLE pg_biz (id TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)"},
};

/*
 * A role or database (or server) set to a synchronous_commit weaker than `on` must not make the
 * store acknowledge commits before they are flushed on every node a failover may promote: every
 * session of the store turns `off`, `local` and `remote_write` back to `on`, and keeps the
 * stronger `remote_apply`.
 */
static void test_synchronous_commit(void)
{
    static const struct {
        const char *where; /* ROLE or DATABASE */
        const char *value;
        const char *session; /* what the store's sessions must run with */
    } cases[] = {
        {"ROLE", "off", "on"},          {"ROLE", "local", "on"},
        {"ROLE", "remote_write", "on"}, {"ROLE", "remote_apply", "remote_apply"},
        {"DATABASE", "local", "on"},    {"DATABASE", "remote_write", "on"},
    };
    struct idem_store *st = open_uri(pg_uri, 2), *st2 = NULL;
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    char sql[256], want[64];

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* (DDL takes no parameters: the database's name comes in through format()) */
        snprintf(sql, sizeof sql,
                 "DO $$BEGIN EXECUTE format('ALTER %s %%I SET synchronous_commit = %s', %s);"
                 " END$$",
                 cases[i].where, cases[i].value,
                 strcmp(cases[i].where, "ROLE") == 0 ? "current_user" : "current_database()");
        CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
        CHECK_INT(idem_tx_exec(tx, sql, 0, NULL, NULL), 0);
        CHECK_INT(idem_tx_commit(tx), 0);
        st2 = open_uri(pg_uri, 2); /* new sessions: the setting applies to them */
        for (int write = 0; write < 2; write++) {
            CHECK_INT(idem_tx_begin(st2, write, &tx), 0);
            CHECK_INT(idem_tx_exec(tx, "SHOW synchronous_commit", 0, NULL, &r), 0);
            CHECK_STR(idem_rows_get(r, 0, 0), cases[i].session);
            idem_rows_free(r);
            r = NULL;
            /* The role or database really says so: the catalogue holds it. */
            CHECK_INT(idem_tx_exec(tx,
                                   "SELECT setting FROM pg_db_role_setting s, unnest(s.setconfig) "
                                   "setting WHERE s.setrole = (SELECT oid FROM pg_roles WHERE "
                                   "rolname = current_user) OR s.setdatabase = (SELECT oid FROM "
                                   "pg_database WHERE datname = current_database())",
                                   0, NULL, &r),
                      0);
            CHECK_INT(idem_rows_count(r), 1);
            snprintf(want, sizeof want, "synchronous_commit=%s", cases[i].value);
            CHECK_STR(idem_rows_get(r, 0, 0), want);
            idem_rows_free(r);
            r = NULL;
            idem_tx_rollback(tx);
        }
        idem_store_close(st2);
        snprintf(sql, sizeof sql,
                 "DO $$BEGIN EXECUTE format('ALTER %s %%I RESET synchronous_commit', %s); END$$",
                 cases[i].where,
                 strcmp(cases[i].where, "ROLE") == 0 ? "current_user" : "current_database()");
        CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
        CHECK_INT(idem_tx_exec(tx, sql, 0, NULL, NULL), 0);
        CHECK_INT(idem_tx_commit(tx), 0);
    }
    idem_store_close(st);
}

/* Runs `sql` (DDL) on `st` in a transaction of its own. */
static void exec_ddl(struct idem_store *st, const char *sql)
{
    struct idem_tx *tx = NULL;

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, sql, 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
}

/*
 * A role short of a privilege gets the GRANT that gives it, for the object PostgreSQL named: on
 * PostgreSQL 15 a role that does not own the database may not create in `public`, and a role that
 * did not make libidem's tables may not use them until granted.
 */
static void test_permission_hint(void)
{
    const char *port = getenv("IDEM_TEST_PG_PORT");
    struct idem_store *su = open_uri(pg_uri, 1), *st = NULL;
    char uri[256];
    char *err = NULL;

    exec_ddl(su, "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_nopriv')"
                 " THEN CREATE ROLE idem_nopriv LOGIN; END IF; END$$");
    snprintf(uri, sizeof uri, "postgresql://idem_nopriv@127.0.0.1:%s/idemtest", port);
    /* libidem's tables, made by another role, in `public` where this one may look. */
    CHECK(idem_store_open(uri, NULL, &st, &err) < 0);
    CHECK(err != NULL && strstr(err, "permission denied for table idem_") != NULL &&
          strstr(err, "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE idem_") != NULL &&
          strstr(err, " TO idem_nopriv") != NULL);
    if (err)
        fprintf(stderr, "  (as told: %s)\n", err);
    idem_free(err);
    err = NULL;
    /* A schema of its own it may not create in, as `public` is on PostgreSQL 15. */
    exec_ddl(su, "CREATE SCHEMA IF NOT EXISTS nopriv_s");
    exec_ddl(su, "GRANT USAGE ON SCHEMA nopriv_s TO idem_nopriv");
    exec_ddl(su, "ALTER ROLE idem_nopriv SET search_path = nopriv_s");
    CHECK(idem_store_open(uri, NULL, &st, &err) < 0);
    CHECK(err != NULL && strstr(err, "permission denied for schema nopriv_s") != NULL &&
          strstr(err, "GRANT USAGE, CREATE ON SCHEMA nopriv_s TO idem_nopriv") != NULL);
    if (err)
        fprintf(stderr, "  (as told: %s)\n", err);
    idem_free(err);
    err = NULL;
    /* And the GRANT it names is the one that was missing. */
    exec_ddl(su, "GRANT USAGE, CREATE ON SCHEMA nopriv_s TO idem_nopriv");
    CHECK_INT(idem_store_open(uri, NULL, &st, &err), 0);
    idem_store_close(st);
    exec_ddl(su, "DROP SCHEMA nopriv_s CASCADE");
    exec_ddl(su, "DROP OWNED BY idem_nopriv");
    exec_ddl(su, "DROP ROLE idem_nopriv");
    idem_store_close(su);
}

/* ---- the store's batcher ------------------------------------------------------------------ */

struct close_job {
    struct idem__job_slot slot;
    _Atomic int told;
    _Atomic int rc;
};

static int close_job_run(struct idem_conn *c, void *arg)
{
    (void)arg;
    return idem__pg_methods.conn->exec(c, "SELECT 1", 0, NULL, NULL);
}

static void close_job_done(void *arg, int rc, const char *errmsg)
{
    struct close_job *j = arg;

    (void)errmsg;
    atomic_store(&j->rc, rc);
    atomic_fetch_add(&j->told, 1);
}

static void test_the_batcher_stops_with_the_store(void)
{
    enum { N = 40 };
    static struct close_job jobs[N];
    struct idem_store *st = open_uri(pg_uri, 2);
    char err[IDEM_ERRMSG_MAX] = "";

    for (int i = 0; i < N; i++)
        CHECK_INT(idem__tx_run_async(st, &jobs[i].slot, close_job_run, &jobs[i], 0, close_job_done,
                                     &jobs[i], err, sizeof(err)),
                  0);
    /* At once: the close waits for the queue to drain, and each job is told exactly once. */
    idem_store_close(st);
    for (int i = 0; i < N; i++) {
        CHECK_INT(atomic_load(&jobs[i].told), 1);
        CHECK_INT(atomic_load(&jobs[i].rc), 0);
    }
}

int main(void)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    char *err = NULL;

    pg_uri = getenv("IDEM_TEST_PG_URI");
    if (!pg_uri || !getenv("IDEM_TEST_PG_PORT")) {
        fprintf(stderr, "run me through tests/pg/with_pg.sh (IDEM_TEST_PG_URI is not set)\n");
        return 1;
    }
    st = open_uri(pg_uri, 8);
    if (idem_store_migrate(st, "pg-test", schema, 1, NULL, &err) < 0 ||
        idem_engine_new(st, NULL, &eng) < 0) {
        fprintf(stderr, "set-up failed: %s\n", err ? err : "");
        return 1;
    }
    test_dsn_forms();
    test_no_password_in_messages();
    test_instances_race(st);
    test_notify_payload(eng);
    test_sqlstates(st);
    test_synchronous_commit();
    test_permission_hint();
    test_deferred_statements(st, eng);
    test_idle_connections_closed();
    test_lost_after_last_answer();
    test_batch_connection_cut();
    test_batch_claims_one_round_trip();
    test_batch_held_back_statements();
    test_cross_instance_wake(st, "first");
    test_restart(st, eng);
    test_cross_instance_wake(st, "after-restart");
    test_the_batcher_stops_with_the_store();

    idem_engine_free(eng);
    idem_store_close(st);
    return t_done();
}
