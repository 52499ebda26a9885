/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_store_pg_layout.c - the PostgreSQL store's record layout, against a real server (run it
 * through tests/pg/with_pg.sh).  Two things only a real database shows:
 *
 * - The migration from the previous layout (schema version 2: the keys in flight found through a
 *   partial index of idem_records) keeps every record's meaning.  The test writes that schema by
 *   hand, with records in every state -- processing under a live lease, processing with its lease
 *   run out, completed, past retention completed, past retention processing with and without a
 *   live lease -- opens the store (which migrates), and checks that each one reads, replays, is
 *   listed as stalled and recovered, has its lease released, or is swept as before.
 * - Completions are written in place (HOT): pg_stat_user_tables counts the updates of
 *   idem_records over a run of fresh keys by several writers at once, and at least 90% of them
 *   must be HOT.
 */
#include "idem/idem.h"
#include "t.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *pg_uri;

/* The schema as versions 1 and 2 of lib/store_pg.c wrote it, word for word. */
static const char *const previous_schema =
    "CREATE TABLE idem_schema (component text PRIMARY KEY,"
    " version integer NOT NULL, applied_ms bigint NOT NULL);"
    "CREATE TABLE IF NOT EXISTS idem_records ("
    " principal text NOT NULL, operation text NOT NULL, idem_key text NOT NULL,"
    " fingerprint bytea NOT NULL,"
    " status smallint NOT NULL,"
    " recovery_point text NOT NULL DEFAULT '', recovery_data text,"
    " lease_owner text, lease_expires_ms bigint NOT NULL DEFAULT 0,"
    " response_status integer, response_headers text, response_body bytea,"
    " created_ms bigint NOT NULL, expires_ms bigint NOT NULL,"
    " PRIMARY KEY (principal, operation, idem_key));"
    "CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_ms);"
    "CREATE INDEX IF NOT EXISTS idem_records_stalled ON idem_records (lease_expires_ms)"
    " WHERE status = 0;"
    "INSERT INTO idem_schema VALUES ('libidem', 2, 0);";

static const struct idem_operation mig_op = {
    .name = "mig", .ttl_ms = 3600000, .lease_ms = 60000, .wait_ms = 1};

static PGconn *db_connect(void)
{
    char uri[1200];
    PGconn *db;

    snprintf(uri, sizeof(uri), "%s%capplication_name=layout-test", pg_uri,
             strchr(pg_uri, '?') ? '&' : '?');
    db = PQconnectdb(uri);
    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect: %s", PQerrorMessage(db));
        exit(1);
    }
    return db;
}

static void db_run(PGconn *db, const char *sql)
{
    PGresult *res = PQexec(db, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(db));
        exit(1);
    }
    PQclear(res);
}

/* The first cell of a query's answer as a number (-1 for none or NULL). */
static long long db_int(PGconn *db, const char *sql)
{
    PGresult *res = PQexec(db, sql);
    long long v = -1;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0 && !PQgetisnull(res, 0, 0))
        v = atoll(PQgetvalue(res, 0, 0));
    else if (PQresultStatus(res) != PGRES_TUPLES_OK)
        fprintf(stderr, "%s: %s", sql, PQerrorMessage(db));
    PQclear(res);
    return v;
}

/* Waits until the store's sessions ended, so the statistics they kept are flushed. */
static void sessions_gone(PGconn *db)
{
    T_WAIT_UNTIL(db_int(db, "SELECT count(*) FROM pg_stat_activity"
                            " WHERE application_name = 'libidem'") == 0,
                 "the store's sessions to end");
}

static struct idem_store *open_store(void)
{
    struct idem_store_options o = {.pool_size = 4, .busy_timeout_ms = 10000};
    struct idem_store *st = NULL;
    char *err = NULL;

    if (idem_store_open(pg_uri, &o, &st, &err) < 0) {
        fprintf(stderr, "cannot open the store: %s\n", err ? err : "");
        exit(1);
    }
    return st;
}

/* The fingerprint of a request whose JSON body is {"v": "<what>"}. */
static void fp_of(const char *what, unsigned char fp[IDEM_FP_LEN])
{
    char body[128];
    int n = snprintf(body, sizeof(body), "{\"v\":\"%s\"}", what);

    if (idem_fingerprint("POST", "/mig", NULL, 0, body, (size_t)n, fp, NULL) < 0) {
        fprintf(stderr, "cannot fingerprint %s\n", body);
        exit(1);
    }
}

/*
 * Records in every state, written as the previous version wrote them: (key, status, lease
 * owner, lease and retention relative to now, recovery point, response).
 */
static void write_old_records(PGconn *db)
{
    unsigned char fp[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1], sql[2048];

    fp_of("same", fp);
    idem_fingerprint_hex(fp, hex);
    snprintf(sql, sizeof(sql),
             "WITH t AS (SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint AS now)"
             " INSERT INTO idem_records (principal, operation, idem_key, fingerprint, status,"
             " recovery_point, lease_owner, lease_expires_ms, response_status, response_headers,"
             " response_body, created_ms, expires_ms)"
             " SELECT 'alice', 'mig', v.k, decode('%s', 'hex'), v.st, v.rp, v.owner,"
             " CASE WHEN v.lease IS NULL THEN 0 ELSE t.now + v.lease END, v.code, v.hdrs,"
             " v.body, t.now - 5000, t.now + v.ttl"
             " FROM t, (VALUES"
             " ('live', 0::smallint, '', 'old:1', 60000, NULL::int, NULL, NULL::bytea, 3600000),"
             " ('stalled', 0::smallint, 'charged', 'old:2', -1000, NULL, NULL, NULL, 3600000),"
             " ('done', 1::smallint, '', NULL, NULL, 201, 'Content-Type: text/plain\n',"
             "  'made'::bytea, 3600000),"
             " ('gone', 1::smallint, '', NULL, NULL, 201, '', 'old'::bytea, -1000),"
             " ('lost', 0::smallint, 'charged', 'old:3', -1000, NULL, NULL, NULL, -1000),"
             " ('kept', 0::smallint, '', 'old:4', 60000, NULL, NULL, NULL, -1000)"
             ") v(k, st, rp, owner, lease, code, hdrs, body, ttl)",
             hex);
    db_run(db, sql);
}

/* Whether the keys in flight are exactly the processing records. */
static long long inflight_mismatches(PGconn *db)
{
    return db_int(db, "SELECT count(*) FROM idem_inflight f FULL JOIN"
                      " (SELECT * FROM idem_records WHERE status = 0) r"
                      " USING (principal, operation, idem_key)"
                      " WHERE f.principal IS NULL OR r.principal IS NULL");
}

static int stalled_has(struct idem_engine *eng, const char *key)
{
    struct idem_stalled *list = NULL;
    size_t n = 0;
    int found = 0;

    CHECK_INT(idem_engine_stalled(eng, "mig", 100, &list, &n), 0);
    for (size_t i = 0; i < n; i++)
        found += strcmp(list[i].key, key) == 0;
    idem_stalled_free(list, n);
    return found;
}

static enum idem_outcome begin(struct idem_engine *eng, const char *key, const char *body,
                               struct idem_call **call)
{
    unsigned char fp[IDEM_FP_LEN];
    enum idem_outcome oc = IDEM_OUTCOME_NONE;

    fp_of(body, fp);
    *call = NULL;
    CHECK_INT(idem_call_begin(eng, &mig_op, "alice", key, fp, call, &oc), 0);
    return oc;
}

static void test_migration(PGconn *db)
{
    struct idem_engine_options eo = {.owner = "new:1", .replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    struct idem_call *call = NULL;
    struct idem_record_info info;
    struct idem_record_listed listed[16];
    const void *body;
    size_t len = 0;
    uint64_t released = 0;
    int deleted = -1;

    db_run(db, previous_schema);
    write_old_records(db);

    st = open_store();
    CHECK_INT(idem_engine_new(st, &eo, &eng), 0);
    CHECK_INT(db_int(db, "SELECT version FROM idem_schema WHERE component = 'libidem'"), 4);
    CHECK_INT(
        db_int(db, "SELECT count(*) FROM pg_indexes WHERE indexname = 'idem_records_stalled'"), 0);
    CHECK_INT(db_int(db, "SELECT count(*) FROM pg_class WHERE relname = 'idem_records'"
                         " AND 'fillfactor=40' = ANY (reloptions)"),
              1);
    /* Every processing record, past retention or not, is in flight. */
    CHECK_INT(db_int(db, "SELECT count(*) FROM idem_inflight"), 4);
    CHECK_INT(inflight_mismatches(db), 0);

    /* Read as before: the past-retention ones as gone, unless a live lease protects them. */
    CHECK_INT(idem_record_inspect(eng, "alice", "mig", "live", &info), 0);
    CHECK(info.found && !info.completed && info.lease_live);
    CHECK_INT(idem_record_inspect(eng, "alice", "mig", "stalled", &info), 0);
    CHECK(info.found && !info.completed && !info.lease_live);
    CHECK_STR(info.recovery_point, "charged");
    CHECK_INT(idem_record_inspect(eng, "alice", "mig", "done", &info), 0);
    CHECK(info.found && info.completed && info.response_status == 201);
    CHECK_INT(idem_record_inspect(eng, "alice", "mig", "gone", &info), 0);
    CHECK(!info.found);
    CHECK_INT(idem_record_inspect(eng, "alice", "mig", "lost", &info), 0);
    CHECK(!info.found);
    CHECK_INT(idem_record_inspect(eng, "alice", "mig", "kept", &info), 0);
    CHECK(info.found && !info.completed && info.lease_live);

    /* The unfinished listing: the processing records within their retention. */
    CHECK_INT(idem_store_records_unfinished(st, "mig", NULL, listed, 16), 2);
    CHECK_STR(listed[0].id.key, "live");
    CHECK_STR(listed[1].id.key, "stalled");

    /* The completed record replays, and refuses another body. */
    CHECK_INT(begin(eng, "done", "same", &call), IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_status(call), 201);
    body = idem_call_response_body(call, &len);
    CHECK(len == 4 && memcmp(body, "made", 4) == 0);
    idem_call_end(call);
    CHECK_INT(begin(eng, "done", "other", &call), IDEM_OUTCOME_MISMATCH);
    idem_call_end(call);
    /* A live lease of the old version still holds its key. */
    CHECK_INT(begin(eng, "live", "same", &call), IDEM_OUTCOME_IN_PROGRESS);
    idem_call_end(call);

    /* Retention: the two past it and unprotected go, their keys in flight with them. */
    CHECK_INT(idem_engine_sweep(eng, 100, &deleted), 0);
    CHECK_INT(deleted, 2);
    CHECK_INT(db_int(db, "SELECT count(*) FROM idem_records"), 4);
    CHECK_INT(inflight_mismatches(db), 0);
    CHECK_INT(begin(eng, "gone", "fresh", &call), IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "new", 3), 0);
    idem_call_end(call);

    /* Recovery: the stalled record is listed and resumed where it stopped, then finished. */
    CHECK(stalled_has(eng, "stalled"));
    CHECK(!stalled_has(eng, "live"));
    CHECK_INT(idem_call_recover(eng, &mig_op, "alice", "stalled", &call, &(enum idem_outcome){0}),
              0);
    CHECK_STR(idem_call_recovery_point(call), "charged");
    CHECK_INT(idem_call_phase_begin(call), 0);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "late", 4), 0);
    idem_call_end(call);
    CHECK(!stalled_has(eng, "stalled"));
    CHECK_INT(begin(eng, "stalled", "same", &call), IDEM_OUTCOME_REPLAY);
    idem_call_end(call);

    /* Releasing the dead owner's leases makes its record stalled at once, and resumable. */
    CHECK_INT(idem_engine_release_leases(eng, "old:", &released), 0);
    CHECK_INT(released, 2); /* live and kept */
    CHECK(stalled_has(eng, "live"));
    CHECK_INT(begin(eng, "live", "same", &call), IDEM_OUTCOME_RESUME);
    CHECK_INT(idem_call_phase_begin(call), 0);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "ok", 2), 0);
    idem_call_end(call);
    CHECK_INT(inflight_mismatches(db), 0);
    CHECK_INT(db_int(db, "SELECT count(*) FROM idem_inflight"), 1); /* kept */

    idem_engine_free(eng);
    idem_store_close(st);
}

enum { KEYS = 1000, WRITERS = 8 };

/* One of the writers: its share of the fresh keys, each claimed then completed. */
struct writer {
    pthread_t tid;
    struct idem_engine *eng;
    int first;
    int failed;
};

static void *writer_run(void *arg)
{
    struct writer *w = arg;
    unsigned char fp[IDEM_FP_LEN];
    char key[32];

    fp_of("hot", fp);
    for (int i = w->first; i < KEYS; i += WRITERS) {
        struct idem_call *call = NULL;
        enum idem_outcome oc = IDEM_OUTCOME_NONE;

        snprintf(key, sizeof(key), "hot-%d", i);
        if (idem_call_begin(w->eng, &mig_op, "alice", key, fp, &call, &oc) < 0 ||
            oc != IDEM_OUTCOME_EXECUTE ||
            idem_call_complete(call, 201, NULL, 0, "{\"id\":\"a-typical-response-body\"}", 31) < 0)
            w->failed++;
        idem_call_end(call);
    }
    return NULL;
}

/*
 * Fresh keys, claimed then completed by writers at once (so that the completions of keys
 * claimed on one page race for its room): the completions must be HOT updates.
 */
static void test_completions_are_hot(PGconn *db)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    struct writer w[WRITERS];
    long long ins, upd, hot;

    sessions_gone(db);
    db_run(db, "SELECT pg_stat_reset_single_table_counters('idem_records'::regclass)");
    st = open_store();
    CHECK_INT(idem_engine_new(st, NULL, &eng), 0);
    for (int i = 0; i < WRITERS; i++) {
        w[i] = (struct writer){.eng = eng, .first = i};
        CHECK_INT(pthread_create(&w[i].tid, NULL, writer_run, &w[i]), 0);
    }
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(w[i].tid, NULL);
        CHECK_INT(w[i].failed, 0);
    }
    idem_engine_free(eng);
    idem_store_close(st);
    sessions_gone(db);
    T_WAIT_UNTIL(db_int(db, "SELECT n_tup_ins FROM pg_stat_user_tables"
                            " WHERE relname = 'idem_records'") >= KEYS,
                 "the statistics of the run");
    ins = db_int(db, "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'idem_records'");
    upd = db_int(db, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'idem_records'");
    hot =
        db_int(db, "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'idem_records'");
    fprintf(stderr, "%d fresh keys: %lld inserts, %lld updates, %lld of them HOT\n", KEYS, ins, upd,
            hot);
    CHECK(ins >= KEYS); /* (the test's own inserts above may be counted after the reset) */
    CHECK_INT(upd, KEYS);
    CHECK(hot * 10 >= upd * 9);
    CHECK_INT(db_int(db, "SELECT count(*) FROM idem_inflight"), 1); /* still only kept */
}

int main(void)
{
    PGconn *db;

    pg_uri = getenv("IDEM_TEST_PG_URI");
    if (!pg_uri) {
        fprintf(stderr, "run me through tests/pg/with_pg.sh (IDEM_TEST_PG_URI is not set)\n");
        return 1;
    }
    db = db_connect();
    test_migration(db);
    test_completions_are_hot(db);
    PQfinish(db);
    return t_done();
}
