/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_shards.c - lib/shards.c and lib/shard_map.c against a real server (run it through
 * tests/pg/with_pg.sh): four databases of the throw-away cluster stand for a directory and three
 * clusters.  The clusters' idem_bucket_of() computes the bucket idem_shard_bucket() does; calls
 * routed by the map land in the owning cluster's idem_records only, and replay there; a write
 * transaction of a principal runs on its cluster.  The fence: after a bucket moves (the directory
 * flipped, the old owner's idem_buckets row deleted, the new owner's inserted), an instance still
 * holding the old map is refused there -- an engine's claim and a write transaction alike, with
 * IDEM_EMOVED, also when the store's own threads send the write (a one-phase call the runner
 * commits in a batch, a claim committed at its claim point) -- and, having re-read the map, writes
 * at the new owner; a delete of a record whose bucket the cluster does not own passes it by.  A
 * bucket marked moving routes to IDEM_EMOVED.  idem_shards_add() names a new cluster only once
 * its schema and empty fence are in, and refuses a bad name, a name or URI taken, a cluster it
 * cannot reach and one that holds buckets already.
 */
#include "internal.h"
#include "t.h"

#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *pg_uri;
static char dir_uri[512];
static const char *const cluster_names[3] = {"c1", "c2", "c3"};

/* The test server's URI with database `db`. */
static void uri_of(const char *db, char *out, size_t cap)
{
    const char *slash = strrchr(pg_uri, '/');

    snprintf(out, cap, "%.*s/%s", (int)(slash - pg_uri), pg_uri, db);
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

/* Runs `sql` (parameters a, b) in a write transaction of its own on `st`; rows changed or < 0. */
static int64_t run(struct idem_store *st, const char *sql, const char *a, const char *b)
{
    const char *params[2] = {a, b};
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    int64_t changed;
    int rc = idem_tx_begin(st, 1, &tx);

    if (rc == 0)
        rc = idem_tx_exec(tx, sql, b ? 2 : a ? 1 : 0, params, &rows);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", sql, tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
        idem_tx_rollback(tx);
        return rc;
    }
    changed = idem_rows_changed(rows);
    idem_rows_free(rows);
    rc = idem_tx_commit(tx);
    return rc < 0 ? rc : changed;
}

/* The first value `sql` (parameter a) answers on `st`, as an integer; -1 on failure. */
static int64_t query_int(struct idem_store *st, const char *sql, const char *a)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    int64_t v = -1;

    if (idem_tx_begin(st, 0, &tx) == 0 && idem_tx_exec(tx, sql, a ? 1 : 0, &a, &rows) == 0 &&
        idem_rows_get(rows, 0, 0))
        v = strtoll(idem_rows_get(rows, 0, 0), NULL, 10);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return v;
}

/*
 * Makes the databases and the directory: buckets [0, 342) on c1, [342, 683) on c2, the rest on
 * c3, at epoch 1.  The clusters' own rows are written once their fence exists (assign_clusters).
 */
static void setup(void)
{
    PGconn *admin = PQconnectdb(pg_uri);
    struct idem_store *dir = NULL;
    char *err = NULL, uri[512], b[16];

    if (PQstatus(admin) != CONNECTION_OK) {
        fprintf(stderr, "%s", PQerrorMessage(admin));
        exit(1);
    }
    admin_exec(admin, "CREATE DATABASE shard_dir");
    admin_exec(admin, "CREATE DATABASE shard_c1");
    admin_exec(admin, "CREATE DATABASE shard_c2");
    admin_exec(admin, "CREATE DATABASE shard_c3");
    PQfinish(admin);

    uri_of("shard_dir", dir_uri, sizeof dir_uri);
    if (idem_store_open(dir_uri, NULL, &dir, &err) < 0 ||
        idem__shard_directory_migrate(dir, &err) < 0) {
        fprintf(stderr, "directory: %s\n", err ? err : "?");
        exit(1);
    }
    for (int i = 0; i < 3; i++) {
        char db[32];
        snprintf(db, sizeof db, "shard_%s", cluster_names[i]);
        uri_of(db, uri, sizeof uri);
        CHECK_INT(
            run(dir, "INSERT INTO idem_shard_clusters VALUES ($1, $2)", cluster_names[i], uri), 1);
    }
    for (int bucket = 0; bucket < IDEM_SHARD_BUCKETS; bucket++) {
        snprintf(b, sizeof b, "%d", bucket);
        CHECK_INT(run(dir,
                      "INSERT INTO idem_shard_buckets (bucket, cluster, epoch) VALUES ($1, $2, 1)",
                      b,
                      cluster_names[bucket < 342   ? 0
                                    : bucket < 683 ? 1
                                                   : 2]),
                  1);
    }
    idem_store_close(dir);
}

/* Each cluster's idem_buckets as the directory says, through the set's stores. */
static void assign_clusters(struct idem_shards *sh)
{
    static const char *const ranges[3][2] = {{"0", "342"}, {"342", "683"}, {"683", "1024"}};

    for (size_t i = 0; i < 3; i++) {
        CHECK_STR(idem_shards_name(sh, i), cluster_names[i]);
        CHECK_INT(run(idem_shards_store(sh, i),
                      "INSERT INTO idem_buckets (bucket, epoch)"
                      " SELECT b, 1 FROM generate_series($1::int, $2::int - 1) b",
                      ranges[i][0], ranges[i][1]),
                  atoi(ranges[i][1]) - atoi(ranges[i][0]));
    }
}

static struct idem_shards *open_set(void)
{
    struct idem_shards *sh = NULL;
    char *err = NULL;

    if (idem_shards_open(dir_uri, NULL, &sh, &err) < 0) {
        fprintf(stderr, "idem_shards_open: %s\n", err ? err : "?");
        exit(1);
    }
    return sh;
}

static void test_sql_and_c_agree_on_buckets(struct idem_shards *sh)
{
    static const char *const principals[] = {"", "alice", "bob", "user-42", "é", "tenant:acme/7"};

    for (size_t i = 0; i < sizeof principals / sizeof principals[0]; i++) {
        const char *p = principals[i];
        CHECK_INT(query_int(idem_shards_store(sh, 0), "SELECT idem_bucket_of($1)", p),
                  idem_shard_bucket(p, strlen(p)));
    }
    for (int i = 0, bad = 0; i < 2000; i++) {
        char p[32];
        snprintf(p, sizeof p, "user-%d", i);
        bad += query_int(idem_shards_store(sh, 0), "SELECT idem_bucket_of($1)", p) !=
               (long long)idem_shard_bucket(p, strlen(p));
        if (i == 1999)
            CHECK_INT(bad, 0);
    }
}

static const struct idem_operation op = {.name = "shard.test"};

/* One call of (principal, key) on `eng`: its outcome, or the negative code. */
static int call(struct idem_engine *eng, const char *principal, const char *key)
{
    unsigned char fp[IDEM_FP_LEN] = {1};
    struct idem_call *c = NULL;
    enum idem_outcome outcome = IDEM_OUTCOME_NONE;
    int rc = idem_call_begin(eng, &op, principal, key, fp, &c, &outcome);

    if (rc == 0 && outcome == IDEM_OUTCOME_EXECUTE)
        rc = idem_call_complete(c, 201, NULL, 0, "{}", 2);
    idem_call_end(c);
    return rc < 0 ? rc : (int)outcome;
}

static const struct idem_operation one_phase_op = {.name = "shard.one", .one_phase = 1};
static const struct idem_operation claim_op = {.name = "shard.claim", .claim_point = "sent"};

static _Atomic int async_rc = 2;             /* 2: not told yet */
static struct idem_call *_Atomic async_call; /* the caller's to end, once told */

static int run_stage(struct idem_call *c, void *arg)
{
    (void)arg;
    return idem_call_stage(c, 201, NULL, 0, "{}", 2);
}

static void run_done(struct idem_call *c, int rc, void *arg)
{
    (void)arg;
    atomic_store(&async_call, c);
    atomic_store(&async_rc, rc);
}

static void claim_begun(struct idem_call *c, int rc, enum idem_outcome outcome, void *arg)
{
    (void)arg;
    atomic_store(&async_call, c);
    atomic_store(&async_rc, rc < 0 ? rc : (int)outcome);
}

/*
 * The store's own threads send the write: a one-phase call run whole by the PostgreSQL runner
 * (its record inserted with the batch's COMMIT), and a claim committed at its claim point.  The
 * rc each is told, or 2 when none came.
 */
static int run_async(struct idem_engine *eng, const char *principal, const char *key)
{
    unsigned char fp[IDEM_FP_LEN] = {2};
    int rc;

    atomic_store(&async_rc, 2);
    rc = idem_call_run_async(eng, &one_phase_op, principal, key, fp, run_stage, run_done, NULL);
    if (rc != 1)
        return rc < 0 ? rc : 3;
    T_WAIT_UNTIL(atomic_load(&async_rc) != 2, "the run's done callback");
    idem_call_end(atomic_exchange(&async_call, NULL));
    return atomic_load(&async_rc);
}

static int claim_async(struct idem_engine *eng, const char *principal, const char *key)
{
    unsigned char fp[IDEM_FP_LEN] = {3};
    int rc;

    atomic_store(&async_rc, 2);
    rc = idem_call_begin_async(eng, &claim_op, principal, key, fp, claim_begun, NULL);
    if (rc != 1)
        return rc < 0 ? rc : 3;
    T_WAIT_UNTIL(atomic_load(&async_rc) != 2, "the claim's begun callback");
    idem_call_end(atomic_exchange(&async_call, NULL));
    return atomic_load(&async_rc);
}

static struct idem_engine **engines_of(struct idem_shards *sh)
{
    struct idem_engine **engs = calloc(idem_shards_count(sh), sizeof(*engs));

    for (size_t i = 0; engs && i < idem_shards_count(sh); i++) {
        if (idem_engine_new(idem_shards_store(sh, i), NULL, &engs[i]) < 0)
            exit(1);
    }
    return engs;
}

static void engines_free(struct idem_shards *sh, struct idem_engine **engs)
{
    for (size_t i = 0; i < idem_shards_count(sh); i++)
        idem_engine_free(engs[i]);
    free(engs);
}

static int64_t records_of(struct idem_shards *sh, size_t i, const char *principal)
{
    return query_int(idem_shards_store(sh, i),
                     "SELECT count(*) FROM idem_records WHERE principal = $1", principal);
}

static void test_records_land_in_the_owning_cluster_only(struct idem_shards *sh)
{
    struct idem_engine **engs = engines_of(sh);
    int seen[3] = {0, 0, 0};
    char p[32];

    for (int n = 0; n < 30; n++) {
        size_t at = 99;
        unsigned b;
        snprintf(p, sizeof p, "user-%d", n);
        b = idem_shard_bucket(p, strlen(p));
        CHECK_INT(idem_shards_route(sh, p, &at), 0);
        CHECK_INT(at, b < 342 ? 0 : b < 683 ? 1 : 2);
        if (at > 2)
            continue;
        seen[at]++;
        CHECK_INT(call(engs[at], p, "k1"), IDEM_OUTCOME_EXECUTE);
        CHECK_INT(call(engs[at], p, "k1"), IDEM_OUTCOME_REPLAY);
        for (size_t i = 0; i < 3; i++)
            CHECK_INT(records_of(sh, i, p), i == at ? 1 : 0);
    }
    /* 30 principals over three thirds of the buckets: each cluster got some. */
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] > 0);
    engines_free(sh, engs);
}

/* A principal whose bucket is on c1 (index 0), and its bucket. */
static const char *principal_on_c1(unsigned *bucket)
{
    static char p[32];

    for (int n = 0;; n++) {
        snprintf(p, sizeof p, "mover-%d", n);
        *bucket = idem_shard_bucket(p, strlen(p));
        if (*bucket < 342)
            return p;
    }
}

static void test_a_transaction_runs_on_the_principals_cluster(struct idem_shards *sh)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    unsigned bucket;
    const char *p = principal_on_c1(&bucket);

    CHECK_INT(idem_shards_tx_begin(sh, p, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "SELECT current_database()", 0, NULL, &rows), 0);
    CHECK_STR(idem_rows_get(rows, 0, 0), "shard_c1");
    idem_rows_free(rows);
    CHECK_INT(idem_tx_commit(tx), 0);
    /* A read transaction too, without the fence's statement. */
    CHECK_INT(idem_shards_tx_begin(sh, p, 0, &tx), 0);
    CHECK_INT(idem_tx_rollback(tx), 0);
}

/* Moves `bucket` from c1 to c2 as a move would leave it, with the epoch raised to 2. */
static void move_bucket(struct idem_shards *sh, unsigned bucket)
{
    struct idem_store *dir = NULL;
    char b[16];

    snprintf(b, sizeof b, "%u", bucket);
    CHECK_INT(run(idem_shards_store(sh, 0), "DELETE FROM idem_buckets WHERE bucket = $1", b, NULL),
              1);
    CHECK_INT(run(idem_shards_store(sh, 1), "INSERT INTO idem_buckets VALUES ($1, 2)", b, NULL), 1);
    CHECK_INT(idem_store_open(dir_uri, NULL, &dir, NULL), 0);
    CHECK_INT(run(dir, "UPDATE idem_shard_buckets SET cluster = 'c2', epoch = 2 WHERE bucket = $1",
                  b, NULL),
              1);
    idem_store_close(dir);
}

static void test_a_stale_instance_is_refused_at_the_old_owner(void)
{
    struct idem_shards *stale = open_set();
    struct idem_engine **engs = engines_of(stale);
    struct idem_engine_stats es;
    struct idem_tx *tx = NULL;
    unsigned bucket;
    const char *p = principal_on_c1(&bucket);
    size_t at = 99;
    char b[16];

    snprintf(b, sizeof b, "%u", bucket);
    CHECK_INT(call(engs[0], p, "before"), IDEM_OUTCOME_EXECUTE);
    move_bucket(stale, bucket);

    /* The stale map still routes to c1, which refuses the claim and the transaction. */
    CHECK_INT(idem_shards_route(stale, p, &at), 0);
    CHECK_INT(at, 0);
    CHECK_INT(call(engs[0], p, "after"), IDEM_EMOVED);
    CHECK_INT(run_async(engs[0], p, "after-run"), IDEM_EMOVED);
    CHECK_INT(claim_async(engs[0], p, "after-claim"), IDEM_EMOVED);
    CHECK_INT(records_of(stale, 0, p), 1);
    idem_engine_stats(engs[0], &es);
    CHECK_INT(es.claims, 1); /* "before": the refused ones claimed nothing */
    CHECK_INT(es.answers, 1);
    CHECK(es.moved >= 2); /* the claims; the one-phase run's refusal comes with its commit */
    /* Refused again until a refusal comes past the refresh's pause since the set was opened. */
    T_WAIT_UNTIL(idem_shards_tx_begin(stale, p, 1, &tx) == IDEM_EMOVED && tx == NULL &&
                     idem_shards_route(stale, p, &at) == 0 && at == 1,
                 "a refused transaction to re-read the map");
    CHECK(tx == NULL);

    /* That refusal re-read the map: the principal routes to c2, where writes are taken. */
    CHECK_INT(idem_shards_route(stale, p, &at), 0);
    CHECK_INT(at, 1);
    CHECK_INT(call(engs[1], p, "after"), IDEM_OUTCOME_EXECUTE);
    CHECK_INT(run_async(engs[1], p, "after-run"), 0);
    CHECK_INT(claim_async(engs[1], p, "after-claim"), IDEM_OUTCOME_EXECUTE);
    CHECK_INT(records_of(stale, 1, p), 3);
    CHECK_INT(idem_shards_tx_begin(stale, p, 1, &tx), 0);
    CHECK_INT(idem_tx_commit(tx), 0);

    /* The old owner's leftover record: a delete passes it by (a move removes it). */
    CHECK_INT(
        run(idem_shards_store(stale, 0), "DELETE FROM idem_records WHERE principal = $1", p, NULL),
        0);
    CHECK_INT(records_of(stale, 0, p), 1);
    engines_free(stale, engs);
    idem_shards_close(stale);
}

static void test_a_moving_bucket_routes_to_emoved(struct idem_shards *sh)
{
    struct idem_store *dir = NULL;
    unsigned bucket;
    const char *p = principal_on_c1(&bucket);
    size_t at = 99;
    char b[16];

    snprintf(b, sizeof b, "%u", bucket);
    CHECK_INT(idem_store_open(dir_uri, NULL, &dir, NULL), 0);
    CHECK_INT(run(dir, "UPDATE idem_shard_buckets SET moving = 1 WHERE bucket = $1", b, NULL), 1);
    T_WAIT_UNTIL(idem_shards_refresh(sh) == 0 && idem_shards_route(sh, p, &at) == IDEM_EMOVED,
                 "a refresh to see the bucket moving");
    CHECK_INT(idem_shards_route(sh, p, &at), IDEM_EMOVED);
    CHECK_INT(run(dir, "UPDATE idem_shard_buckets SET moving = 0 WHERE bucket = $1", b, NULL), 1);
    T_WAIT_UNTIL(idem_shards_refresh(sh) == 0 && idem_shards_route(sh, p, &at) == 0,
                 "a refresh to see the bucket open again");
    CHECK_INT(idem_shards_route(sh, p, &at), 0);
    idem_store_close(dir);
}

/*
 * A cluster added while `sh` is open (c0, which sorts first, so the map's order of the clusters
 * is no longer the set's): a refresh opens it as the set's fourth, leaving the others where
 * they were, and once a bucket is moved to it, its principal's calls run there.
 */
static void test_a_new_cluster_is_taken(struct idem_shards *sh)
{
    struct idem_engine *eng = NULL;
    struct idem_shard_move_options mo = {.drain_timeout_ms = 10000};
    unsigned bucket;
    const char *p = principal_on_c1(&bucket);
    char *err = NULL;
    size_t at = 99;
    struct idem_shards_stats ss;
    struct idem_engine_stats es;

    CHECK_INT(idem_shards_count(sh), 3);
    idem_shards_stats(sh, &ss);
    CHECK_INT(ss.clusters, 3);
    CHECK_INT(idem_shards_move(dir_uri, bucket, "c0", &mo, &err), 0);
    if (err)
        fprintf(stderr, "move: %s\n", err);
    idem_free(err);
    T_WAIT_UNTIL(idem_shards_refresh(sh) == 0 && idem_shards_count(sh) == 4,
                 "a refresh to open the new cluster");
    CHECK_STR(idem_shards_name(sh, 3), "c0");
    for (size_t i = 0; i < 3; i++)
        CHECK_STR(idem_shards_name(sh, i), cluster_names[i]);
    CHECK(idem_shards_store(sh, 3) != NULL);
    CHECK(idem_shards_store(sh, 4) == NULL);
    CHECK_INT(idem_shards_route(sh, p, &at), 0);
    CHECK_INT(at, 3);
    CHECK_INT(idem_shards_route(sh, "alice", &at), 0); /* bucket 175, on c1 still */
    CHECK_INT(at, bucket == 175 ? 3 : 0);
    CHECK_INT(idem_engine_new(idem_shards_store(sh, 3), NULL, &eng), 0);
    CHECK_INT(call(eng, p, "on-c0"), IDEM_OUTCOME_EXECUTE);
    CHECK_INT(call(eng, p, "on-c0"), IDEM_OUTCOME_REPLAY);
    idem_engine_stats(eng, &es);
    CHECK_INT(es.claims, 1);
    CHECK_INT(es.answers, 1);
    CHECK_INT(es.moved, 0);
    idem_shards_stats(sh, &ss);
    CHECK_INT(ss.clusters, 4);
    CHECK(ss.refreshes >= 1);
    /* The three the bucket took with it from c2, and this one; c1's leftover was cleaned. */
    CHECK_INT(records_of(sh, 3, p), 4);
    for (size_t i = 0; i < 3; i++)
        CHECK_INT(records_of(sh, i, p), 0);
    idem_engine_free(eng);
}

/* idem_shards_add(): its rc, and whether *errmsg holds `says`. */
static int add(const char *name, const char *uri, const char *says)
{
    char *err = NULL;
    int rc = idem_shards_add(dir_uri, name, uri, NULL, &err);

    if (says && (!err || !strstr(err, says))) {
        fprintf(stderr, "idem_shards_add(%s): '%s' does not say '%s'\n", name, err ? err : "",
                says);
        rc = 1;
    }
    idem_free(err);
    return rc;
}

static void test_add_a_cluster(void)
{
    PGconn *admin = PQconnectdb(pg_uri);
    struct idem_store *dir = NULL, *c4 = NULL;
    char uri[512], c1[512], c1_other[600];

    admin_exec(admin, "CREATE DATABASE shard_c0");
    PQfinish(admin);
    uri_of("shard_c0", uri, sizeof uri);
    uri_of("shard_c1", c1, sizeof c1);
    snprintf(c1_other, sizeof c1_other, "%s?application_name=other", c1);
    CHECK_INT(idem_store_open(dir_uri, NULL, &dir, NULL), 0);

    CHECK_INT(add("", uri, "name"), IDEM_EINVAL);
    CHECK_INT(add("c 4", uri, "name"), IDEM_EINVAL);
    CHECK_INT(add("c4\";", uri, "name"), IDEM_EINVAL);
    CHECK_INT(add("c1", uri, "the name 'c1' is taken"), IDEM_ECONFLICT);
    CHECK_INT(add("c9", c1, "cluster 'c1' has that URI"), IDEM_ECONFLICT);
    /* A database that holds buckets (of this set, or of another) would take their writes. */
    CHECK_INT(add("c9", c1_other, "its idem_buckets holds"), IDEM_ESTATE);
    CHECK(add("c9", "postgresql://127.0.0.1:1/nowhere?connect_timeout=2", "shard cluster c9") < 0);
    CHECK(add("c9", "sqlite:/tmp/idem-shard-c9.db", "must be PostgreSQL") < 0);
    CHECK_INT(query_int(dir, "SELECT count(*) FROM idem_shard_clusters WHERE name = 'c9'", NULL),
              0);

    CHECK_INT(add("c0", uri, NULL), 0);
    CHECK_INT(query_int(dir, "SELECT count(*) FROM idem_shard_clusters WHERE name = 'c0'", NULL),
              1);
    CHECK_INT(query_int(dir, "SELECT count(*) FROM idem_shard_buckets WHERE cluster = 'c0'", NULL),
              0);
    CHECK_INT(idem_store_open(uri, NULL, &c4, NULL), 0);
    CHECK_INT(query_int(c4, "SELECT count(*) FROM idem_buckets", NULL), 0);
    CHECK_INT(query_int(c4, "SELECT count(*) FROM idem_records", NULL), 0);
    CHECK_INT(query_int(c4, "SELECT idem_bucket_of('alice')", NULL), 175);
    CHECK_INT(add("c0", uri, "the name 'c0' is taken"), IDEM_ECONFLICT);
    idem_store_close(c4);
    idem_store_close(dir);
    unlink("/tmp/idem-shard-c9.db");
}

int main(void)
{
    struct idem_shards *sh = NULL;

    pg_uri = getenv("IDEM_TEST_PG_URI");
    if (!pg_uri || !strrchr(pg_uri, '/')) {
        fprintf(stderr, "IDEM_TEST_PG_URI not set: run through tests/pg/with_pg.sh\n");
        return 1;
    }
    setup();
    sh = open_set();
    assign_clusters(sh);
    test_sql_and_c_agree_on_buckets(sh);
    test_records_land_in_the_owning_cluster_only(sh);
    test_a_transaction_runs_on_the_principals_cluster(sh);
    test_a_moving_bucket_routes_to_emoved(sh);
    test_a_stale_instance_is_refused_at_the_old_owner();
    test_add_a_cluster();
    test_a_new_cluster_is_taken(sh);
    idem_shards_close(sh);
    return t_done();
}
