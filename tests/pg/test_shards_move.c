/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_shards_move.c - idem_shards_init() and idem_shards_move() (lib/shards.c) against a real
 * server (run it through tests/pg/with_pg.sh): three databases of the throw-away cluster stand
 * for a directory and two clusters.  init spreads the buckets evenly, gives each cluster its
 * fence rows, is idempotent, finishes a set-up cut short and refuses another map.  A move takes
 * a bucket's records (completed ones, which replay at the new owner with the same answer, and
 * keys in flight) to the new owner and leaves none at the old one; a move stopped after each of
 * its steps, as a kill -9 would leave it, never has two clusters holding the bucket's fence row,
 * and is finished by running it again -- or, before its flip, ended by a move to the owner.  A
 * transaction that wrote past the fence before the move is waited for (the drain), so its record
 * is copied and not lost; a drain that times out leaves the bucket frozen.  A key in flight when
 * the move begins completes at the old owner (its live lease lets it past the fence), the move
 * waiting for it, and replays at the new owner; a new claim there is refused.  The tables an
 * application registered move with the bucket, fenced like the records.
 */
#include "internal.h"
#include "t.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *pg_uri;
static char dir_uri[512], c_uri[2][512];

static void uri_of(const char *db, char *out, size_t cap)
{
    const char *slash = strrchr(pg_uri, '/');

    snprintf(out, cap, "%.*s/%s", (int)(slash - pg_uri), pg_uri, db);
}

static PGconn *connect_to(const char *uri)
{
    PGconn *pg = PQconnectdb(uri);

    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "%s", PQerrorMessage(pg));
        exit(1);
    }
    return pg;
}

static void admin_exec(PGconn *pg, const char *sql)
{
    PGresult *res = PQexec(pg, sql);

    if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(pg));
        exit(1);
    }
    PQclear(res);
}

/* The first value of `sql` (one parameter, may be NULL) on database `uri`, as an integer. */
static long long sql_int(const char *uri, const char *sql, const char *a)
{
    PGconn *pg = connect_to(uri);
    PGresult *res = PQexecParams(pg, sql, a ? 1 : 0, NULL, &a, NULL, NULL, 0);
    long long v = -1;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
        v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    else if (PQresultStatus(res) != PGRES_TUPLES_OK)
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(pg));
    PQclear(res);
    PQfinish(pg);
    return v;
}

static const struct idem_shard_cluster clusters[2] = {{"c1", c_uri[0]}, {"c2", c_uri[1]}};

static void setup(void)
{
    PGconn *admin = connect_to(pg_uri);

    admin_exec(admin, "CREATE DATABASE move_dir");
    admin_exec(admin, "CREATE DATABASE move_c1");
    admin_exec(admin, "CREATE DATABASE move_c2");
    PQfinish(admin);
    uri_of("move_dir", dir_uri, sizeof dir_uri);
    uri_of("move_c1", c_uri[0], sizeof c_uri[0]);
    uri_of("move_c2", c_uri[1], sizeof c_uri[1]);
}

/* The owner (0, 1) the directory names for `bucket`, -1 if none; *moving its flag. */
static int owner_of(unsigned bucket, int *moving, long long *epoch)
{
    char b[16];

    snprintf(b, sizeof b, "%u", bucket);
    *moving = (int)sql_int(dir_uri, "SELECT moving FROM idem_shard_buckets WHERE bucket = $1", b);
    *epoch = sql_int(dir_uri, "SELECT epoch FROM idem_shard_buckets WHERE bucket = $1", b);
    return (int)sql_int(dir_uri,
                        "SELECT CASE cluster WHEN 'c1' THEN 0 WHEN 'c2' THEN 1 END"
                        " FROM idem_shard_buckets WHERE bucket = $1",
                        b);
}

static long long fence_rows(int c, unsigned bucket)
{
    char b[16];

    snprintf(b, sizeof b, "%u", bucket);
    return sql_int(c_uri[c], "SELECT count(*) FROM idem_buckets WHERE bucket = $1::int", b);
}

/* The rows of `table` on cluster c whose `column` is a principal of `bucket`. */
static long long rows_of(int c, const char *table, const char *column, unsigned bucket)
{
    char b[16], sql[160];

    snprintf(b, sizeof b, "%u", bucket);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE idem_bucket_of(%s) = $1::int", table,
             column);
    return sql_int(c_uri[c], sql, b);
}

static long long bucket_rows(int c, const char *table, unsigned bucket)
{
    return rows_of(c, table, "principal", bucket);
}

/* Runs `sql` with one parameter on database `uri`; the SQLSTATE of its failure, "" on success. */
static const char *sql_state(const char *uri, const char *sql, const char *a)
{
    static char state[8];
    PGconn *pg = connect_to(uri);
    PGresult *res = PQexecParams(pg, sql, a ? 1 : 0, NULL, &a, NULL, NULL, 0);
    const char *s = PQresultErrorField(res, PG_DIAG_SQLSTATE);

    snprintf(state, sizeof state, "%s",
             PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK ? ""
             : s                                                                               ? s
                 : "?");
    PQclear(res);
    PQfinish(pg);
    return state;
}

/* Rows of the application's table `table` whose user is of `bucket`, on cluster c. */
static long long app_rows(int c, const char *table, unsigned bucket)
{
    return rows_of(c, table, "user_id", bucket);
}

/* An application's tables on cluster c: orders and their lines (a child by foreign key). */
static void app_tables(int c, int registered)
{
    PGconn *pg = connect_to(c_uri[c]);

    admin_exec(pg, "CREATE TABLE IF NOT EXISTS app_orders (id text PRIMARY KEY, user_id text,"
                   " amount bigint NOT NULL)");
    admin_exec(pg, "CREATE TABLE IF NOT EXISTS \"App Lines\" (order_id text NOT NULL"
                   " REFERENCES app_orders (id), \"User\" text, n int NOT NULL)");
    if (registered) {
        admin_exec(pg, "SELECT idem_shard_table('app_orders', 'user_id')");
        admin_exec(pg, "SELECT idem_shard_table('\"App Lines\"', 'User')");
    }
    PQfinish(pg);
}

static void test_init_spreads_the_buckets_and_is_idempotent(void)
{
    const struct idem_shard_cluster other[2] = {{"c1", c_uri[0]}, {"c3", c_uri[1]}};
    const struct idem_shard_cluster moved[2] = {{"c1", c_uri[0]}, {"c2", c_uri[0]}};
    char *err = NULL;

    CHECK_INT(idem_shards_init(dir_uri, clusters, 2, NULL, &err), 0);
    CHECK(err == NULL);
    CHECK_INT(
        sql_int(dir_uri, "SELECT count(*) FROM idem_shard_buckets WHERE cluster = 'c1'", NULL),
        512);
    CHECK_INT(
        sql_int(dir_uri, "SELECT max(bucket) FROM idem_shard_buckets WHERE cluster = 'c1'", NULL),
        511);
    CHECK_INT(sql_int(c_uri[0], "SELECT count(*) FROM idem_buckets WHERE bucket < 512", NULL), 512);
    CHECK_INT(sql_int(c_uri[1], "SELECT count(*) FROM idem_buckets WHERE bucket >= 512", NULL),
              512);
    CHECK_INT(sql_int(c_uri[1], "SELECT count(*) FROM idem_buckets", NULL), 512);
    /* Again: nothing changes.  A set-up cut short before c2's rows: they are written. */
    CHECK_INT(idem_shards_init(dir_uri, clusters, 2, NULL, NULL), 0);
    {
        PGconn *pg = connect_to(c_uri[1]);
        admin_exec(pg, "DELETE FROM idem_buckets");
        PQfinish(pg);
    }
    CHECK_INT(idem_shards_init(dir_uri, clusters, 2, NULL, NULL), 0);
    CHECK_INT(sql_int(c_uri[1], "SELECT count(*) FROM idem_buckets", NULL), 512);
    CHECK_INT(sql_int(c_uri[0], "SELECT count(*) FROM idem_buckets", NULL), 512);
    /* Another map is refused and the directory left as it is. */
    CHECK_INT(idem_shards_init(dir_uri, other, 2, NULL, &err), IDEM_ESTATE);
    CHECK(err && strstr(err, "another map"));
    idem_free(err);
    err = NULL;
    CHECK_INT(idem_shards_init(dir_uri, moved, 2, NULL, NULL), IDEM_ESTATE);
    CHECK_INT(idem_shards_init(dir_uri, clusters, 1, NULL, NULL), IDEM_ESTATE);
    CHECK_INT(sql_int(dir_uri, "SELECT count(*) FROM idem_shard_clusters", NULL), 2);
}

static const struct idem_operation op = {.name = "move.test"};

/* One call of (principal, key): its outcome (REPLAY checks the stored answer), or the code. */
static int call(struct idem_engine *eng, const char *principal, const char *key, int complete)
{
    unsigned char fp[IDEM_FP_LEN] = {7};
    struct idem_call *c = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    size_t len = 0;
    const char *body;
    int rc = idem_call_begin(eng, &op, principal, key, fp, &c, &outcome);

    if (rc == 0 && outcome == IDEM_OUTCOME_EXECUTE && complete)
        rc = idem_call_complete(c, 201, NULL, 0, key, strlen(key));
    if (rc == 0 && outcome == IDEM_OUTCOME_REPLAY) {
        body = idem_call_response_body(c, &len);
        if (idem_call_response_status(c) != 201 || len != strlen(key) || memcmp(body, key, len))
            rc = IDEM_ESTATE;
    }
    idem_call_end(c);
    return rc < 0 ? rc : (int)outcome;
}

/* Principals of `bucket`: found by trying names, `n` of them into p[]. */
static void principals_of(unsigned bucket, char p[][32], int n)
{
    for (int i = 0, k = 0; k < n; i++) {
        snprintf(p[k], 32, "p%u-%d", bucket, i);
        if (idem_shard_bucket(p[k], strlen(p[k])) == bucket)
            k++;
    }
}

/* Writes `n` completed keys of the principals of `bucket` through a fresh set; 0 on success. */
static int write_keys(unsigned bucket, char p[][32], int n, int complete)
{
    struct idem_shards *sh = NULL;
    struct idem_engine *eng = NULL;
    size_t at = 0;
    int rc = idem_shards_open(dir_uri, NULL, &sh, NULL);

    if (rc == 0)
        rc = idem_shards_route(sh, p[0], &at);
    if (rc == 0)
        rc = idem_engine_new(idem_shards_store(sh, at), NULL, &eng);
    for (int i = 0; rc == 0 && i < n; i++) {
        char key[48];
        snprintf(key, sizeof key, "k-%s", p[i]);
        rc = call(eng, p[i], key, complete) == IDEM_OUTCOME_EXECUTE ? 0 : IDEM_ESTATE;
    }
    idem_engine_free(eng);
    idem_shards_close(sh);
    (void)bucket;
    return rc;
}

/* Every key of write_keys() replays its answer at the owner the directory names now. */
static int replays(char p[][32], int n)
{
    struct idem_shards *sh = NULL;
    struct idem_engine *eng = NULL;
    size_t at = 0;
    int rc = idem_shards_open(dir_uri, NULL, &sh, NULL), bad = 0;

    if (rc == 0)
        rc = idem_shards_route(sh, p[0], &at);
    if (rc == 0)
        rc = idem_engine_new(idem_shards_store(sh, at), NULL, &eng);
    for (int i = 0; rc == 0 && i < n; i++) {
        char key[48];
        snprintf(key, sizeof key, "k-%s", p[i]);
        bad += call(eng, p[i], key, 1) != IDEM_OUTCOME_REPLAY;
    }
    idem_engine_free(eng);
    idem_shards_close(sh);
    return rc < 0 ? rc : bad;
}

static int steps_seen[8];
static int64_t step_ms[8];
static int stop_at;

static int on_step(enum idem_shard_move_step step, int64_t elapsed_ms, int64_t records, void *arg)
{
    (void)records;
    (void)arg;
    steps_seen[step]++;
    step_ms[step] = elapsed_ms;
    return (int)step == stop_at;
}

static int move(unsigned bucket, const char *to, int stop, int drain_ms)
{
    struct idem_shard_move_options mo = {.on_step = on_step, .drain_timeout_ms = drain_ms};
    char *err = NULL;
    int rc;

    stop_at = stop;
    memset(steps_seen, 0, sizeof steps_seen);
    rc = idem_shards_move(dir_uri, bucket, to, &mo, &err);
    if (rc < 0 && stop == 0 && drain_ms == 0)
        fprintf(stderr, "move %u to %s: %s\n", bucket, to, err ? err : "?");
    idem_free(err);
    return rc;
}

static void test_a_move_takes_the_records_and_keys_in_flight(void)
{
    unsigned bucket = 100; /* on c1 */
    char p[6][32];
    int moving;
    long long epoch;

    principals_of(bucket, p, 6);
    CHECK_INT(write_keys(bucket, p, 5, 1), 0);
    {
        /* A key in flight at c1 (the owner): a processing record and its idem_inflight row. */
        PGconn *pg = connect_to(c_uri[0]);
        const char *params[1] = {p[5]};
        PGresult *res = PQexecParams(
            pg,
            "WITH r AS (INSERT INTO idem_records (principal, operation, idem_key, fingerprint,"
            " status, lease_owner, lease_expires_ms, created_ms, expires_ms) VALUES ($1,"
            " 'move.test', 'held', '\\x07', 0, 'x', 1, 0, 9000000000000) RETURNING 1)"
            " INSERT INTO idem_inflight VALUES ($1, 'move.test', 'held')",
            1, NULL, params, NULL, NULL, 0);
        CHECK_INT(PQresultStatus(res), PGRES_COMMAND_OK);
        PQclear(res);
        PQfinish(pg);
    }
    CHECK_INT(bucket_rows(0, "idem_records", bucket), 6);
    CHECK_INT(bucket_rows(0, "idem_inflight", bucket), 1);

    CHECK_INT(move(bucket, "c2", 0, 0), 0);
    for (int s = IDEM_SHARD_MOVE_FROZEN; s <= IDEM_SHARD_MOVE_CLEANED; s++)
        CHECK_INT(steps_seen[s], 1);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 1);
    CHECK_INT(moving, 0);
    CHECK_INT(epoch, 2);
    CHECK_INT(fence_rows(0, bucket), 0);
    CHECK_INT(fence_rows(1, bucket), 1);
    CHECK_INT(sql_int(c_uri[1], "SELECT epoch FROM idem_buckets WHERE bucket = 100", NULL), 2);
    CHECK_INT(bucket_rows(0, "idem_records", bucket), 0);
    CHECK_INT(bucket_rows(0, "idem_inflight", bucket), 0);
    CHECK_INT(bucket_rows(1, "idem_records", bucket), 6);
    CHECK_INT(bucket_rows(1, "idem_inflight", bucket), 1);
    CHECK_INT(replays(p, 5), 0);
    /* Other buckets of c1 never moved. */
    CHECK_INT(sql_int(c_uri[0], "SELECT count(*) FROM idem_buckets", NULL), 511);
    /* And back: a move to where it is already does nothing but check. */
    CHECK_INT(move(bucket, "c1", 0, 0), 0);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 0);
    CHECK_INT(epoch, 3);
    CHECK_INT(replays(p, 5), 0);
    CHECK_INT(move(bucket, "c1", 0, 0), 0);
    CHECK_INT(steps_seen[IDEM_SHARD_MOVE_FROZEN], 0);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 0);
    CHECK_INT(epoch, 3);
}

/* A move stopped after `stop`, then run again (or, `abort`, ended by a move to the owner). */
static void interrupted_then_rerun(unsigned bucket, int stop, int abort)
{
    char p[4][32];
    int moving, from, owner;
    long long epoch0, epoch;
    const char *names[2] = {"c1", "c2"};

    principals_of(bucket, p, 4);
    CHECK_INT(write_keys(bucket, p, 4, 1), 0);
    from = owner_of(bucket, &moving, &epoch0);
    CHECK_INT(move(bucket, names[1 - from], stop, 0), IDEM_ESTATE);
    CHECK_INT(steps_seen[stop], 1);
    /* Never two fence rows; while frozen, none at the new owner and none at the old. */
    CHECK(fence_rows(0, bucket) + fence_rows(1, bucket) <= 1);
    owner = owner_of(bucket, &moving, &epoch);
    if (stop < IDEM_SHARD_MOVE_FLIPPED) {
        CHECK_INT(owner, from);
        CHECK_INT(moving, 1);
        if (stop >= IDEM_SHARD_MOVE_FENCED)
            CHECK_INT(fence_rows(from, bucket), 0);
        CHECK_INT(bucket_rows(from, "idem_records", bucket), 4);
    } else {
        CHECK_INT(owner, 1 - from);
        CHECK_INT(moving, 0);
        CHECK_INT(fence_rows(from, bucket), 0);
        CHECK_INT(bucket_rows(1 - from, "idem_records", bucket), 4);
    }
    if (abort && stop < IDEM_SHARD_MOVE_FLIPPED) {
        CHECK_INT(move(bucket, names[from], 0, 0), 0);
        CHECK_INT(owner_of(bucket, &moving, &epoch), from);
        CHECK_INT(fence_rows(from, bucket), 1);
        CHECK_INT(bucket_rows(1 - from, "idem_records", bucket), 0);
        CHECK_INT(bucket_rows(from, "idem_records", bucket), 4);
    } else {
        CHECK_INT(move(bucket, names[1 - from], 0, 0), 0);
        CHECK_INT(owner_of(bucket, &moving, &epoch), 1 - from);
        CHECK_INT(epoch, epoch0 + 1);
        CHECK_INT(fence_rows(1 - from, bucket), 1);
        CHECK_INT(fence_rows(from, bucket), 0);
        CHECK_INT(bucket_rows(from, "idem_records", bucket), 0);
        CHECK_INT(bucket_rows(1 - from, "idem_records", bucket), 4);
    }
    CHECK_INT(moving, 0);
    CHECK_INT(replays(p, 4), 0);
}

static void test_a_move_cut_short_at_each_step_is_finished_by_running_it_again(void)
{
    for (int s = IDEM_SHARD_MOVE_FROZEN; s <= IDEM_SHARD_MOVE_CLEANED; s++)
        interrupted_then_rerun(200 + (unsigned)s, s, 0);
    for (int s = IDEM_SHARD_MOVE_FROZEN; s < IDEM_SHARD_MOVE_FLIPPED; s++)
        interrupted_then_rerun(300 + (unsigned)s, s, 1);
}

/*
 * A transaction wrote a record of the bucket at its owner (past the fence, before the move) and
 * is still open: the drain waits for it; timed out, the bucket stays frozen; once it committed,
 * the move runs again and its record is at the new owner.
 */
static void test_the_drain_waits_for_a_writer_older_than_the_fence(void)
{
    unsigned bucket = 400; /* on c1 */
    char p[1][32];
    PGconn *writer = connect_to(c_uri[0]);
    const char *params[1];
    PGresult *res;
    int moving;
    long long epoch;

    principals_of(bucket, p, 1);
    params[0] = p[0];
    admin_exec(writer, "BEGIN");
    res = PQexecParams(writer,
                       "INSERT INTO idem_records (principal, operation, idem_key, fingerprint,"
                       " status, created_ms, expires_ms) VALUES ($1, 'move.test', 'late',"
                       " '\\x00', 1, 0, 9000000000000)",
                       1, NULL, params, NULL, NULL, 0);
    CHECK_INT(PQresultStatus(res), PGRES_COMMAND_OK);
    PQclear(res);
    CHECK_INT(move(bucket, "c2", 0, 300), IDEM_ESTATE);
    CHECK_INT(steps_seen[IDEM_SHARD_MOVE_FENCED], 1);
    CHECK_INT(steps_seen[IDEM_SHARD_MOVE_DRAINED], 0);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 0);
    CHECK_INT(moving, 1);
    admin_exec(writer, "COMMIT");
    PQfinish(writer);
    CHECK_INT(move(bucket, "c2", 0, 5000), 0);
    CHECK_INT(bucket_rows(1, "idem_records", bucket), 1);
    CHECK_INT(bucket_rows(0, "idem_records", bucket), 0);
}

/*
 * An application's registered tables move with the bucket: its rows (a parent and a child by
 * foreign key, a quoted name and column) are at the new owner and gone from the old one; a row
 * of no user stays.  The fence keeps a stale writer out of the moved rows at the old owner,
 * checked at commit; a move is refused before it freezes anything when the new owner has not
 * registered a table.
 */
static void test_a_move_carries_the_registered_tables(void)
{
    unsigned bucket = 500; /* on c1 */
    char p[3][32];
    PGconn *pg;
    int moving;
    long long epoch;

    principals_of(bucket, p, 3);
    app_tables(0, 1);
    app_tables(1, 0);
    pg = connect_to(c_uri[0]);
    for (int i = 0; i < 3; i++) {
        const char *params[1] = {p[i]};
        PGresult *res = PQexecParams(
            pg,
            "WITH o AS (INSERT INTO app_orders VALUES ('o-' || $1, $1, 100) RETURNING id)"
            " INSERT INTO \"App Lines\" SELECT id, $1, n FROM o, generate_series(1, 2) n",
            1, NULL, params, NULL, NULL, 0);
        CHECK_INT(PQresultStatus(res), PGRES_COMMAND_OK);
        PQclear(res);
    }
    admin_exec(pg, "INSERT INTO app_orders VALUES ('nobody', NULL, 1)");
    PQfinish(pg);
    /* c1 refuses a row of a bucket it does not own (700 is c2's), at commit. */
    CHECK_STR(sql_state(c_uri[0],
                        "INSERT INTO app_orders SELECT 'x' || n, 'x' || n, 1 FROM"
                        " generate_series(1, 5000) n WHERE idem_bucket_of('x' || n) = 700",
                        NULL),
              "IDM01");

    /* c2 has not registered the tables: nothing frozen. */
    CHECK_INT(move(bucket, "c2", 0, 0), IDEM_ESTATE);
    CHECK_INT(steps_seen[IDEM_SHARD_MOVE_FROZEN], 0);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 0);
    CHECK_INT(moving, 0);
    CHECK_INT(fence_rows(0, bucket), 1);

    app_tables(1, 1);
    CHECK_INT(move(bucket, "c2", 0, 0), 0);
    CHECK_INT(app_rows(1, "app_orders", bucket), 3);
    CHECK_INT(app_rows(0, "app_orders", bucket), 0);
    CHECK_INT(sql_int(c_uri[1],
                      "SELECT count(*) FROM \"App Lines\" WHERE idem_bucket_of(\"User\") = 500",
                      NULL),
              6);
    CHECK_INT(sql_int(c_uri[0], "SELECT count(*) FROM \"App Lines\"", NULL), 0);
    CHECK_INT(sql_int(c_uri[0], "SELECT count(*) FROM app_orders WHERE id = 'nobody'", NULL), 1);
    CHECK_INT(sql_int(c_uri[1], "SELECT count(*) FROM app_orders WHERE id = 'nobody'", NULL), 0);

    /* The move found the rows by the bucket's index, on every moved table. */
    CHECK_INT(sql_int(c_uri[1],
                      "SELECT count(*) FROM pg_indexes WHERE indexname IN ('idem_records_bucket',"
                      " 'idem_inflight_bucket', 'app_orders_idem_bucket', 'App Lines_idem_bucket')",
                      NULL),
              4);
    {
        /* The move's queries can take them (as they are written in lib/shards.c). */
        PGconn *pg = connect_to(c_uri[1]);
        admin_exec(pg, "CREATE FUNCTION plan_of(q text) RETURNS text LANGUAGE plpgsql AS $$"
                       " DECLARE r text; o text := ''; BEGIN SET LOCAL enable_seqscan = off;"
                       " FOR r IN EXECUTE 'EXPLAIN ' || q LOOP o := o || r; END LOOP;"
                       " RETURN o; END $$");
        PQfinish(pg);
    }
    CHECK_INT(sql_int(c_uri[1],
                      "SELECT (position('app_orders_idem_bucket' IN plan_of('SELECT row_to_json(t)"
                      "::text FROM app_orders t WHERE idem_bucket_of(t.user_id) = CAST(''500'' AS"
                      " integer)')) > 0 AND position('idem_records_bucket' IN plan_of('DELETE FROM"
                      " idem_records WHERE idem_bucket_of(principal) = 500')) > 0)::int",
                      NULL),
              1);
    /* A writer with a stale map: c1 refuses it, c2 takes it. */
    CHECK_STR(sql_state(c_uri[0], "INSERT INTO app_orders VALUES ('late', $1, 1)", p[0]), "IDM01");
    CHECK_STR(sql_state(c_uri[1], "INSERT INTO app_orders VALUES ('late', $1, 1)", p[0]), "");
    /* And back, rows and all. */
    CHECK_INT(move(bucket, "c1", 0, 0), 0);
    CHECK_INT(app_rows(0, "app_orders", bucket), 4);
    CHECK_INT(app_rows(1, "app_orders", bucket), 0);
    CHECK_INT(sql_int(c_uri[0], "SELECT count(*) FROM \"App Lines\"", NULL), 6);
}

static void *move_thread(void *arg)
{
    static int rc;

    rc = move(*(unsigned *)arg, "c2", 0, 0);
    return &rc;
}

static void test_a_key_in_flight_completes_during_the_move(void)
{
    unsigned bucket = 420; /* on c1 */
    char p[2][32];
    struct idem_shards *sh = NULL;
    struct idem_engine *eng = NULL;
    struct idem_call *c = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    unsigned char fp[IDEM_FP_LEN] = {7};
    pthread_t t;
    void *ret = NULL;
    int moving;
    long long epoch;

    principals_of(bucket, p, 2);
    CHECK_INT(idem_shards_open(dir_uri, NULL, &sh, NULL), 0);
    CHECK_INT(idem_engine_new(idem_shards_store(sh, 0), NULL, &eng), 0);
    CHECK_INT(idem_call_begin(eng, &op, p[0], "k-flight", fp, &c, &outcome), 0);
    CHECK_INT(outcome, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(pthread_create(&t, NULL, move_thread, &bucket), 0);
    T_WAIT_UNTIL(fence_rows(0, bucket) == 0, "the fence row's delete");
    t_sleep_ms(200);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 0);
    CHECK_INT(moving, 1); /* waiting for the lease */
    CHECK_INT(call(eng, p[1], "k-new", 1), IDEM_EMOVED);
    {
        /* Its application row, written before the record's completion in its transaction. */
        const char *params[1] = {p[0]};
        CHECK_INT(idem_tx_exec(idem_call_tx(c), "INSERT INTO app_orders VALUES ('flight', $1, 1)",
                               1, params, NULL),
                  0);
    }
    CHECK_INT(idem_call_complete(c, 201, NULL, 0, "k-flight", 8), 0);
    idem_call_end(c);
    CHECK_INT(pthread_join(t, &ret), 0);
    CHECK_INT(*(int *)ret, 0);
    CHECK_INT(owner_of(bucket, &moving, &epoch), 1);
    {
        char q[1][32];
        snprintf(q[0], sizeof q[0], "%s", p[0]);
        /* replays() keys are "k-<principal>": check this one by hand at c2. */
        struct idem_engine *eng2 = NULL;
        CHECK_INT(idem_engine_new(idem_shards_store(sh, 1), NULL, &eng2), 0);
        CHECK_INT(call(eng2, q[0], "k-flight", 1), IDEM_OUTCOME_REPLAY);
        idem_engine_free(eng2);
    }
    CHECK_INT(bucket_rows(0, "idem_records", bucket), 0);
    CHECK_INT(app_rows(1, "app_orders", bucket), 1);
    CHECK_INT(app_rows(0, "app_orders", bucket), 0);
    idem_engine_free(eng);
    idem_shards_close(sh);
}

/* The mover's setting lets its transaction past the fence; nothing else does. */
static void test_the_movers_setting_passes_the_fence(void)
{
    PGconn *pg = connect_to(c_uri[0]);
    PGresult *res;

    /* Bucket 700 is c2's: c1 refuses its writes... */
    res = PQexec(pg, "INSERT INTO idem_records (principal, operation, idem_key, fingerprint,"
                     " status, created_ms, expires_ms) SELECT 'x' || n, 'o', 'k', '\\x00', 1, 0, 1"
                     " FROM generate_series(1, 5000) n WHERE idem_bucket_of('x' || n) = 700");
    CHECK_INT(PQresultStatus(res), PGRES_FATAL_ERROR);
    CHECK_STR(PQresultErrorField(res, PG_DIAG_SQLSTATE), "IDM01");
    PQclear(res);
    /* ... but for the mover. */
    admin_exec(pg, "BEGIN");
    admin_exec(pg, "SELECT set_config('idem.mover', 'on', true)");
    admin_exec(pg, "INSERT INTO idem_records (principal, operation, idem_key, fingerprint,"
                   " status, created_ms, expires_ms) SELECT 'x' || n, 'o', 'k', '\\x00', 1, 0, 1"
                   " FROM generate_series(1, 5000) n WHERE idem_bucket_of('x' || n) = 700");
    admin_exec(pg, "COMMIT");
    CHECK(bucket_rows(0, "idem_records", 700) > 0);
    admin_exec(pg, "DELETE FROM idem_records WHERE idem_bucket_of(principal) = 700");
    CHECK(bucket_rows(0, "idem_records", 700) > 0); /* skipped */
    admin_exec(pg, "BEGIN");
    admin_exec(pg, "SELECT set_config('idem.mover', 'on', true)");
    admin_exec(pg, "DELETE FROM idem_records WHERE idem_bucket_of(principal) = 700");
    admin_exec(pg, "COMMIT");
    CHECK_INT(bucket_rows(0, "idem_records", 700), 0);
    PQfinish(pg);
}

/*
 * A move reaches the bucket's owner and new owner only: a third cluster the directory names that
 * does not answer (here, a port nothing listens on) neither stops nor slows it.
 */
static void test_a_move_needs_only_its_two_clusters(void)
{
    PGconn *dir = connect_to(dir_uri);
    char p[2][32];
    int moving;
    long long epoch;

    admin_exec(dir, "INSERT INTO idem_shard_clusters VALUES ('c9',"
                    " 'postgresql://127.0.0.1:1/nowhere?connect_timeout=2')");
    principals_of(610, p, 2);                           /* on c2 */
    CHECK_INT(write_keys(610, p, 2, 1), IDEM_EUNAVAIL); /* an instance opens every cluster */
    CHECK_INT(move(610, "c1", 0, 0), 0);
    CHECK_INT(owner_of(610, &moving, &epoch), 0);
    CHECK_INT(fence_rows(0, 610), 1);
    CHECK_INT(move(610, "c9", 0, 0), IDEM_EUNAVAIL);
    CHECK_INT(steps_seen[IDEM_SHARD_MOVE_FROZEN], 0);
    admin_exec(dir, "DELETE FROM idem_shard_clusters WHERE name = 'c9'");
    PQfinish(dir);
    CHECK_INT(owner_of(610, &moving, &epoch), 0);
    CHECK_INT(moving, 0);
}

/* What a move costs: the milliseconds frozen for `n` records (printed, for docs/shards.md). */
static void measure(unsigned bucket, int n)
{
    char(*p)[32] = calloc((size_t)n, 32);
    int moving;
    long long epoch;

    principals_of(bucket, p, n);
    CHECK_INT(write_keys(bucket, p, n, 1), 0);
    CHECK_INT(move(bucket, owner_of(bucket, &moving, &epoch) == 0 ? "c2" : "c1", 0, 0), 0);
    printf("# move of %d records: frozen %lld ms (drain %lld, copy %lld), %lld ms in all\n", n,
           (long long)(step_ms[IDEM_SHARD_MOVE_FLIPPED] - step_ms[IDEM_SHARD_MOVE_FROZEN]),
           (long long)(step_ms[IDEM_SHARD_MOVE_DRAINED] - step_ms[IDEM_SHARD_MOVE_FENCED]),
           (long long)(step_ms[IDEM_SHARD_MOVE_COPIED] - step_ms[IDEM_SHARD_MOVE_DRAINED]),
           (long long)step_ms[IDEM_SHARD_MOVE_CLEANED]);
    free(p);
}

int main(void)
{
    pg_uri = getenv("IDEM_TEST_PG_URI");
    if (!pg_uri || !strrchr(pg_uri, '/')) {
        fprintf(stderr, "IDEM_TEST_PG_URI not set: run through tests/pg/with_pg.sh\n");
        return 1;
    }
    setup();
    test_init_spreads_the_buckets_and_is_idempotent();
    test_a_move_takes_the_records_and_keys_in_flight();
    test_a_move_cut_short_at_each_step_is_finished_by_running_it_again();
    test_the_drain_waits_for_a_writer_older_than_the_fence();
    test_the_movers_setting_passes_the_fence();
    test_a_move_carries_the_registered_tables();
    test_a_key_in_flight_completes_during_the_move();
    test_a_move_needs_only_its_two_clusters();
    measure(450, 1000);
    return t_done();
}
