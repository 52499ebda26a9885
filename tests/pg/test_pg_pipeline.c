/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pg_pipeline.c - lib/pg_pipeline.c on one session of a real server (run it through
 * tests/pg/with_pg.sh, which exports IDEM_TEST_PG_URI), below the store: statements sent as one
 * pipeline answer in order; one that fails stops those after it; statements held back go out with
 * the next one, which reports their failure; a fenced one that changes nothing is IDEM_ELEASE; a
 * statement the caller describes is prepared once per session; a BEGIN held back never reaches
 * the server when nothing follows it; rows of one statement held back in a row go out as one
 * statement, which fails whole when one row is fenced out.
 */
#include "store_pg.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct pg_shared sh;

static struct idem_conn *session(void)
{
    struct idem_conn *c = calloc(1, sizeof(*c));

    if (!c)
        exit(1);
    c->sh = &sh;
    if (idem__pg_connect(c) < 0) {
        fprintf(stderr, "cannot connect: %s\n", c->errmsg);
        exit(1);
    }
    return c;
}

static void session_end(struct idem_conn *c)
{
    idem__pg_deferred_clear(c);
    PQfinish(c->pg);
    free(c);
}

static int int_of(const struct pipe_q *q)
{
    return q->ok && q->res && PQntuples(q->res) == 1 ? atoi(PQgetvalue(q->res, 0, 0)) : -1;
}

static void clear(struct pipe_q *q, int n)
{
    for (int i = 0; i < n; i++)
        PQclear(q[i].res);
}

static void test_a_pipelines_statements_answer_in_order(void)
{
    struct idem_conn *c = session();
    struct pipe_q q[3] = {idem__pg_q_simple("SELECT 1", "one"),
                          idem__pg_q_simple("SELECT 2", "two"),
                          idem__pg_q_simple("SELECT 3", "three")};
    int failed = 7;

    CHECK_INT(idem__pg_pipe_run(c, q, 3, &failed), 0);
    CHECK_INT(failed, -1);
    CHECK_INT(int_of(&q[0]), 1);
    CHECK_INT(int_of(&q[1]), 2);
    CHECK_INT(int_of(&q[2]), 3);
    clear(q, 3);
    session_end(c);
}

static void test_a_failed_statement_stops_the_ones_after_it(void)
{
    struct idem_conn *c = session();
    struct pipe_q q[3] = {idem__pg_q_simple("SELECT 1", "one"),
                          idem__pg_q_simple("SELECT 1 / 0", "divide"),
                          idem__pg_q_simple("SELECT 3", "three")};
    int failed = -1;

    idem__pg_defer_begin(c);
    CHECK_INT(idem__pg_pipe_run(c, q, 3, &failed), IDEM_ESTORE);
    CHECK_INT(failed, 1);
    CHECK_INT(q[0].ok, 1);
    CHECK_INT(q[1].ok, 0);
    CHECK_INT(q[2].ok, 0);
    CHECK(strstr(c->errmsg, "divide:") != NULL && strstr(c->errmsg, "22012") != NULL);
    CHECK_INT(c->broken, 0);
    CHECK_INT(PQtransactionStatus(c->pg), PQTRANS_INERROR);
    clear(q, 3);
    CHECK_INT(idem__pg_run_simple(c, "ROLLBACK", "rollback"), 0);
    idem__pg_tx_forget(c);
    session_end(c);
}

static void test_a_held_back_statement_goes_out_with_the_next(void)
{
    struct idem_conn *c = session();
    struct pipe_q q[1] = {idem__pg_q_simple("SELECT count(*) FROM pg_temp.held", "count")};
    int failed;

    /* Nothing reaches the server until a statement needs an answer. */
    idem__pg_defer_begin(c);
    CHECK_INT(idem__pg_defer_simple(c, "CREATE TEMP TABLE held (v int)", "create"), 0);
    CHECK_INT(idem__pg_defer_simple(c, "INSERT INTO held VALUES (1), (2)", "insert"), 0);
    CHECK_INT(PQtransactionStatus(c->pg), PQTRANS_IDLE);
    CHECK_INT(c->ndefer, 2);
    /* Then the BEGIN and both go out first, in the same round trip, in the order given. */
    CHECK_INT(idem__pg_pipe_run(c, q, 1, &failed), 0);
    CHECK_INT(int_of(&q[0]), 2);
    CHECK_INT(c->ndefer, 0);
    CHECK_INT(c->begin_deferred, 0);
    CHECK_INT(PQtransactionStatus(c->pg), PQTRANS_INTRANS);
    clear(q, 1);
    CHECK_INT(idem__pg_run_simple(c, "ROLLBACK", "rollback"), 0);
    idem__pg_tx_forget(c);
    session_end(c);
}

static void test_a_held_back_failure_is_reported_by_the_next_statement(void)
{
    struct idem_conn *c = session();
    struct pipe_q q[1] = {idem__pg_q_simple("SELECT 1", "next")};
    int failed = 7;

    idem__pg_defer_begin(c);
    CHECK_INT(idem__pg_defer_simple(c, "SELECT * FROM no_such_table", "held"), 0);
    CHECK_INT(idem__pg_pipe_run(c, q, 1, &failed), IDEM_ESTORE);
    CHECK_INT(failed, -1); /* not one of the caller's: the held one */
    CHECK_INT(q[0].ok, 0); /* it did not run */
    CHECK(strstr(c->errmsg, "held:") != NULL && strstr(c->errmsg, "42P01") != NULL);
    CHECK_INT(c->ndefer, 0); /* sent, so gone */
    clear(q, 1);
    CHECK_INT(idem__pg_run_simple(c, "ROLLBACK", "rollback"), 0);
    idem__pg_tx_forget(c);
    session_end(c);
}

/* A statement of the test's own, as store_pg.c describes its: it fails unless $1 is 7. */
static const struct pg_stmt only_seven = {
    .id = 5,
    .name = "test_only_seven",
    .sql = "SELECT 1 / (($1::int4 = 7)::int4)",
    .nparams = 1,
    .types = {23},
    .fenced = 1,
};

static void test_a_described_statement_is_prepared_once_and_fenced(void)
{
    struct idem_conn *c = session();
    char v[8] = "7";
    const char *vals[1] = {v};
    int failed;

    idem__pg_defer_begin(c);
    CHECK_INT(idem__pg_defer_stmt(c, &only_seven, vals, NULL, NULL, "seven"), 0);
    v[0] = '8'; /* the pipeline holds a copy of the parameters */
    CHECK_INT(idem__pg_flush_deferred(c), 0);
    CHECK_INT(c->prepared, 1u << 5);
    /* Again: not prepared a second time (the server would refuse: 42P05). */
    vals[0] = "7";
    CHECK_INT(idem__pg_defer_stmt(c, &only_seven, vals, NULL, NULL, "seven"), 0);
    CHECK_INT(idem__pg_flush_deferred(c), 0);
    /* Fenced: a division by zero means the record is not this call's. */
    vals[0] = "8";
    CHECK_INT(idem__pg_defer_stmt(c, &only_seven, vals, NULL, NULL, "seven"), 0);
    CHECK_INT(idem__pg_pipe_run(c, NULL, 0, &failed), IDEM_ELEASE);
    CHECK(strstr(c->errmsg, "no longer this call's") != NULL);
    CHECK_INT(idem__pg_run_simple(c, "ROLLBACK", "rollback"), 0);
    idem__pg_tx_forget(c);
    session_end(c);
}

/*
 * A fenced update of the test's own with a form for several rows (as the store's completions):
 * it sets v and b of key k, if v is still 0.
 */
/* Its plan's settings, before it and after it: the store's kind (store_pg.c, RS_PLAN_PROBES). */
static const struct pg_stmt plan_generic = {
    .id = 8,
    .name = "test_plan_generic",
    .sql = "SELECT set_config('test.pcm', current_setting('plan_cache_mode'), true),"
           " set_config('plan_cache_mode', 'force_generic_plan', true)",
};
static const struct pg_stmt plan_restore = {
    .id = 9,
    .name = "test_plan_restore",
    .sql = "SELECT set_config('plan_cache_mode', current_setting('test.pcm'), true)",
};
static const struct pg_stmt set_many = {
    .id = 7,
    .name = "test_set_many",
    .sql = "WITH u AS (UPDATE pg_temp.held_rows r SET v = x.v::int4, b = x.b"
           " FROM unnest($1::text[], $2::text[], $3::bytea[]) AS x(k, v, b)"
           " WHERE r.k = x.k AND r.v = 0 RETURNING 1)"
           " SELECT 1 / (count(*) = cardinality($1::text[]))::int4 FROM u",
    .nparams = 3,
    .types = {1009, 1009, 1001},
    .fenced = 1,
    .before = &plan_generic,
    .after = &plan_restore,
};
static const struct pg_stmt set_one = {
    .id = 6,
    .name = "test_set_one",
    .sql =
        "WITH u AS (UPDATE pg_temp.held_rows SET v = $2, b = $3 WHERE k = $1 AND v = 0 RETURNING 1)"
        " SELECT 1 / count(*)::int4 FROM u",
    .nparams = 3,
    .types = {25, 23, 17},
    .fenced = 1,
    .many = &set_many,
};

/* Defers set_one of key `k` to `v`, with bytes of `v` (a NUL among them) or NULL for b. */
static int defer_set(struct idem_conn *c, const char *k, const char *v, int null_b)
{
    char bytes[3] = {v[0], '\0', v[0]};
    const char *vals[3] = {k, v, null_b ? NULL : bytes};
    const int lens[3] = {0, 0, 3};
    const int fmts[3] = {0, 0, 1};

    return idem__pg_defer_stmt(c, &set_one, vals, lens, fmts, "set");
}

/* "k:v:b-as-hex" of every row, in key order. */
static void rows_are(struct idem_conn *c, const char *want)
{
    struct pipe_q q[1] = {idem__pg_q_simple(
        "SELECT string_agg(k || ':' || v || ':' || coalesce(encode(b, 'hex'), '-'), ' ' ORDER BY k)"
        " FROM pg_temp.held_rows",
        "rows")};
    int failed;

    CHECK_INT(idem__pg_pipe_run(c, q, 1, &failed), 0);
    CHECK(q[0].ok && PQntuples(q[0].res) == 1);
    if (q[0].ok && PQntuples(q[0].res) == 1 && strcmp(PQgetvalue(q[0].res, 0, 0), want) != 0) {
        fprintf(stderr, "rows: %s, want %s\n", PQgetvalue(q[0].res, 0, 0), want);
        CHECK(0);
    }
    clear(q, 1);
}

/* "generic custom plan_cache_mode" of the statement for several rows. */
static void plans_are(struct idem_conn *c, const char *want)
{
    struct pipe_q q[1] = {idem__pg_q_simple(
        "SELECT generic_plans || ' ' || custom_plans || ' ' || current_setting('plan_cache_mode')"
        " FROM pg_prepared_statements WHERE name = 'test_set_many'",
        "plans")};
    int failed;

    CHECK_INT(idem__pg_pipe_run(c, q, 1, &failed), 0);
    CHECK(q[0].ok && PQntuples(q[0].res) == 1);
    if (q[0].ok && PQntuples(q[0].res) == 1 && strcmp(PQgetvalue(q[0].res, 0, 0), want) != 0) {
        fprintf(stderr, "plans: %s, want %s\n", PQgetvalue(q[0].res, 0, 0), want);
        CHECK(0);
    }
    clear(q, 1);
}

static void test_rows_held_back_in_a_row_go_out_as_one_statement(void)
{
    struct idem_conn *c = session();
    int failed;

    CHECK_INT(
        idem__pg_run_simple(c,
                            "CREATE TEMP TABLE held_rows (k text PRIMARY KEY, v int4, b bytea);"
                            "INSERT INTO held_rows VALUES ('a', 0, NULL), ('b', 0, NULL),"
                            " ('c', 0, NULL), ('d', 0, NULL), ('e', 0, NULL)",
                            "create"),
        0);
    /* Three in a row are one statement, its form for several rows; each row's values kept. */
    idem__pg_defer_begin(c);
    CHECK_INT(defer_set(c, "a", "1", 0), 0);
    CHECK_INT(defer_set(c, "b", "2", 1), 0);
    CHECK_INT(defer_set(c, "c", "3", 0), 0);
    CHECK_INT(c->ndefer, 1);
    CHECK_INT(c->defer[0].rows, 3);
    /* Another statement between: not merged across it (the order stays the one given). */
    CHECK_INT(idem__pg_defer_simple(c, "SELECT 1", "between"), 0);
    CHECK_INT(defer_set(c, "d", "4", 0), 0);
    CHECK_INT(c->ndefer, 3);
    CHECK_INT(idem__pg_flush_deferred(c), 0);
    CHECK_INT(c->prepared, (1u << 6) | (1u << 7) | (1u << 8) | (1u << 9));
    rows_are(c, "a:1:310031 b:2:- c:3:330033 d:4:340034 e:0:-");
    /* Planned once (generic), not for each count of rows; the session's setting left alone. */
    plans_are(c, "1 0 auto");
    CHECK_INT(idem__pg_run_simple(c, "COMMIT", "commit"), 0);
    idem__pg_tx_forget(c);

    /* One row fenced out (a is set already) fails the whole statement: nothing of it stays. */
    idem__pg_defer_begin(c);
    CHECK_INT(defer_set(c, "e", "5", 0), 0);
    CHECK_INT(defer_set(c, "a", "6", 0), 0);
    CHECK_INT(c->defer[0].rows, 2);
    CHECK_INT(idem__pg_pipe_run(c, NULL, 0, &failed), IDEM_ELEASE);
    CHECK(strstr(c->errmsg, "no longer this call's") != NULL);
    CHECK_INT(idem__pg_run_simple(c, "ROLLBACK", "rollback"), 0);
    idem__pg_tx_forget(c);
    /* As does a key twice: its second row changes nothing. */
    idem__pg_defer_begin(c);
    CHECK_INT(defer_set(c, "e", "5", 0), 0);
    CHECK_INT(defer_set(c, "e", "7", 0), 0);
    CHECK_INT(idem__pg_pipe_run(c, NULL, 0, &failed), IDEM_ELEASE);
    CHECK_INT(idem__pg_run_simple(c, "ROLLBACK", "rollback"), 0);
    idem__pg_tx_forget(c);
    rows_are(c, "a:1:310031 b:2:- c:3:330033 d:4:340034 e:0:-");
    session_end(c);
}

/* pg_commit's COMMIT, after what is deferred. */
static int commit_deferred(struct idem_conn *c)
{
    struct pipe_q q[1] = {idem__pg_q_simple("COMMIT", "commit")};
    int failed, rc;

    q[0].ends_tx = 1;
    rc = idem__pg_pipe_run(c, q, 1, &failed);
    clear(q, 1);
    idem__pg_tx_forget(c);
    return rc;
}

/*
 * The undoing of a statement's settings is left to a COMMIT right after it (they are the
 * transaction's own); before anything else, it runs.
 */
static void test_settings_right_before_a_commit_are_left_to_it(void)
{
    struct idem_conn *c = session();

    CHECK_INT(
        idem__pg_run_simple(c,
                            "CREATE TEMP TABLE held_rows (k text PRIMARY KEY, v int4, b bytea);"
                            "INSERT INTO held_rows VALUES ('a', 0, NULL), ('b', 0, NULL),"
                            " ('c', 0, NULL), ('d', 0, NULL)",
                            "create"),
        0);
    idem__pg_defer_begin(c);
    CHECK_INT(defer_set(c, "a", "1", 0), 0);
    CHECK_INT(defer_set(c, "b", "2", 1), 0);
    CHECK_INT(commit_deferred(c), 0);
    /* The statement for several and its settings ran; their undoing did not. */
    CHECK_INT(c->prepared, (1u << 7) | (1u << 8));
    rows_are(c, "a:1:310031 b:2:- c:0:- d:0:-");
    plans_are(c, "1 0 auto");
    /* Another statement between them and the COMMIT: undone before it. */
    idem__pg_defer_begin(c);
    CHECK_INT(defer_set(c, "c", "3", 0), 0);
    CHECK_INT(defer_set(c, "d", "4", 0), 0);
    CHECK_INT(idem__pg_defer_simple(c, "SELECT 1", "between"), 0);
    CHECK_INT(commit_deferred(c), 0);
    CHECK_INT(c->prepared, (1u << 7) | (1u << 8) | (1u << 9));
    rows_are(c, "a:1:310031 b:2:- c:3:330033 d:4:340034");
    session_end(c);
}

static void test_a_begin_with_nothing_after_it_never_reaches_the_server(void)
{
    struct idem_conn *c = session();

    idem__pg_defer_begin(c);
    CHECK_INT(c->in_tx, 1);
    idem__pg_tx_forget(c);
    CHECK_INT(c->in_tx, 0);
    CHECK_INT(idem__pg_flush_deferred(c), 0);
    CHECK_INT(PQtransactionStatus(c->pg), PQTRANS_IDLE);
    session_end(c);
}

int main(void)
{
    const char *uri = getenv("IDEM_TEST_PG_URI");

    if (!uri) {
        fprintf(stderr, "run through tests/pg/with_pg.sh (IDEM_TEST_PG_URI is not set)\n");
        return 1;
    }
    sh.keys[0] = "dbname";
    sh.vals[0] = uri;
    sh.lock_timeout_ms = 5000;
    test_a_pipelines_statements_answer_in_order();
    test_a_failed_statement_stops_the_ones_after_it();
    test_a_held_back_statement_goes_out_with_the_next();
    test_a_held_back_failure_is_reported_by_the_next_statement();
    test_a_described_statement_is_prepared_once_and_fenced();
    test_a_begin_with_nothing_after_it_never_reaches_the_server();
    test_rows_held_back_in_a_row_go_out_as_one_statement();
    test_settings_right_before_a_commit_are_left_to_it();
    return t_done();
}
