/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_sqlite_conn.c - what the SQLite store's bottom layer (lib/sqlite_conn.c) promises both
 * layers above it, checked on connections opened alone, without a store's group or schema: the
 * pragmas every connection runs with, the file it makes, the statements it keeps, and which
 * IDEM_E* code each kind of SQLite failure becomes -- the codes the engine acts on (a conflict
 * decides who owns a key; an unavailable store is retried; a broken connection is never lent
 * again).
 */
#include "internal.h"
#include "sqlite_conn.h"
#include "t.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/idem-unit-sqconn-XXXXXX";

/* A store as the connection layer reads it: its file and its options, nothing else. */
static void store_init(struct idem_store *st, char *path, size_t n, const char *name,
                       enum idem_sync sync, int busy_timeout_ms)
{
    memset(st, 0, sizeof(*st));
    snprintf(path, n, "%s/%s", dir, name);
    st->target = path;
    st->opts.pool_size = 1;
    st->opts.busy_timeout_ms = busy_timeout_ms;
    st->opts.sync = sync;
}

/* The first column of the first row `sql` answers, as an integer (-1 when there is none). */
static long long one_int(struct idem_conn *c, const char *sql)
{
    sqlite3_stmt *stmt = NULL;
    long long v = -1;

    if (sqlite3_prepare_v2(c->db, sql, -1, &stmt, NULL) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW)
        v = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return v;
}

/* The same, as text copied into `out`. */
static const char *one_text(struct idem_conn *c, const char *sql, char *out, size_t n)
{
    sqlite3_stmt *stmt = NULL;

    snprintf(out, n, "%s", "(none)");
    if (sqlite3_prepare_v2(c->db, sql, -1, &stmt, NULL) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0))
        snprintf(out, n, "%s", (const char *)sqlite3_column_text(stmt, 0));
    sqlite3_finalize(stmt);
    return out;
}

static void open_applies_wal_synchronous_full_foreign_keys_and_memory_temp_store(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "", text[64];

    store_init(&st, path, sizeof path, "pragmas.db", IDEM_SYNC_FULL, 1234);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    CHECK(c->st == &st);
    CHECK_STR(one_text(c, "PRAGMA journal_mode", text, sizeof text), "wal");
    CHECK_INT(one_int(c, "PRAGMA synchronous"), 2); /* FULL */
    CHECK_INT(one_int(c, "PRAGMA foreign_keys"), 1);
    CHECK_INT(one_int(c, "PRAGMA temp_store"), 2); /* MEMORY */
    CHECK_INT(one_int(c, "PRAGMA busy_timeout"), 1234);
    /* Extended result codes: a primary key violation is told apart from other constraints. */
    CHECK_INT(idem__sq_run_simple(c, "CREATE TABLE t (k INTEGER PRIMARY KEY)", "create"), 0);
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO t VALUES (1)", "insert"), 0);
    CHECK(idem__sq_run_simple(c, "INSERT INTO t VALUES (1)", "insert") < 0);
    CHECK_INT(sqlite3_extended_errcode(c->db), SQLITE_CONSTRAINT_PRIMARYKEY);
    idem__sq_conn_close(c);
}

static void open_with_sync_normal_runs_synchronous_normal(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "", text[64];

    store_init(&st, path, sizeof path, "normal.db", IDEM_SYNC_NORMAL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    CHECK_STR(one_text(c, "PRAGMA journal_mode", text, sizeof text), "wal");
    CHECK_INT(one_int(c, "PRAGMA synchronous"), 1); /* NORMAL */
    idem__sq_conn_close(c);
}

static void open_applies_no_schema(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "bare.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    CHECK_INT(one_int(c, "SELECT count(*) FROM sqlite_master"), 0);
    idem__sq_conn_close(c);
}

static void a_missing_file_is_made_owner_only_with_its_directories(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "", sub[256];
    struct stat sb;

    store_init(&st, path, sizeof path, "made/deeper/new.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    idem__sq_conn_close(c);
    CHECK_INT(stat(path, &sb), 0);
    CHECK_INT(sb.st_mode & 0777, 0600);
    snprintf(sub, sizeof sub, "%s/made/deeper", dir);
    CHECK_INT(stat(sub, &sb), 0);
    CHECK(S_ISDIR(sb.st_mode));
}

static void an_existing_file_keeps_its_mode(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";
    struct stat sb;
    int fd;

    store_init(&st, path, sizeof path, "shared.db", IDEM_SYNC_FULL, 100);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0640);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    CHECK_INT(chmod(path, 0640), 0);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    idem__sq_conn_close(c);
    CHECK_INT(stat(path, &sb), 0);
    CHECK_INT(sb.st_mode & 0777, 0640);
}

static void the_wal_is_kept_when_the_last_connection_closes(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], wal[300], err[IDEM_ERRMSG_MAX] = "";
    struct stat sb;

    store_init(&st, path, sizeof path, "keep.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    CHECK_INT(idem__sq_run_simple(c, "CREATE TABLE t (x); INSERT INTO t VALUES (1)", "write"), 0);
    idem__sq_conn_close(c);
    snprintf(wal, sizeof wal, "%s-wal", path);
    CHECK_INT(stat(wal, &sb), 0); /* the syncer's descriptor on it stays the file named -wal */
}

static void a_file_that_cannot_be_made_is_eunavail_and_says_why(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "", blocker[256];
    int fd;

    /* A directory of the path is a regular file: mkdir fails with ENOTDIR. */
    snprintf(blocker, sizeof blocker, "%s/plainfile", dir);
    fd = open(blocker, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    store_init(&st, path, sizeof path, "plainfile/sub/x.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), IDEM_EUNAVAIL);
    CHECK(c == NULL);
    CHECK(strstr(err, "cannot create the directory") != NULL);
    CHECK(strstr(err, "Not a directory") != NULL);
}

static void a_file_that_is_not_a_database_is_eunavail_and_says_so(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";
    static const char junk[] = "this is not an SQLite database, not even its header: 0123456789"
                               "0123456789012345678901234567890123456789";
    FILE *f;

    store_init(&st, path, sizeof path, "junk.db", IDEM_SYNC_FULL, 100);
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fwrite(junk, 1, sizeof junk, f);
        fclose(f);
    }
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), IDEM_EUNAVAIL);
    CHECK(c == NULL);
    CHECK(strstr(err, "sqlite: configure: file is not a database") != NULL);
    CHECK(strstr(err, path) != NULL); /* which file */
}

static void busy_and_locked_map_to_eunavail_and_leave_the_connection_usable(void)
{
    struct idem_store st;
    struct idem_conn *a = NULL, *b = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "busy.db", IDEM_SYNC_FULL, 10);
    CHECK_INT(idem__sq_conn_open(&st, &a, err, sizeof err), 0);
    CHECK_INT(idem__sq_conn_open(&st, &b, err, sizeof err), 0);
    if (!a || !b)
        goto out;
    CHECK_INT(idem__sq_run_simple(a, "BEGIN IMMEDIATE", "begin"), 0);
    CHECK_INT(idem__sq_run_simple(b, "BEGIN IMMEDIATE", "begin"), IDEM_EUNAVAIL);
    CHECK_INT(sqlite3_extended_errcode(b->db) & 0xff, SQLITE_BUSY);
    CHECK(strstr(b->errmsg, "sqlite: begin: database is locked") != NULL);
    CHECK_INT(b->broken, 0);
    CHECK_INT(idem__sq_run_simple(a, "COMMIT", "commit"), 0);
    CHECK_INT(idem__sq_run_simple(b, "BEGIN IMMEDIATE", "begin"), 0);
    CHECK_INT(idem__sq_run_simple(b, "COMMIT", "commit"), 0);
out:
    idem__sq_conn_close(a);
    idem__sq_conn_close(b);
}

static void unique_and_primary_key_violations_map_to_econflict(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "conflict.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    CHECK_INT(idem__sq_run_simple(c,
                                  "CREATE TABLE p (k TEXT PRIMARY KEY) WITHOUT ROWID;"
                                  " CREATE TABLE u (v TEXT UNIQUE); INSERT INTO p VALUES ('a');"
                                  " INSERT INTO u VALUES ('a')",
                                  "create"),
              0);
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO p VALUES ('a')", "claim"), IDEM_ECONFLICT);
    CHECK(strstr(c->errmsg, "sqlite: claim: UNIQUE constraint failed") != NULL);
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO u VALUES ('a')", "insert"), IDEM_ECONFLICT);
    CHECK_INT(c->broken, 0);
    idem__sq_conn_close(c);
}

static void other_failures_stay_estore_and_leave_the_connection_usable(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "other.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    /* A syntax error (in prepare), a CHECK constraint, a foreign key (enforced: foreign_keys=ON).
     */
    CHECK_INT(idem__sq_run_simple(c, "SELEC 1", "select"), IDEM_ESTORE);
    CHECK(strstr(c->errmsg, "sqlite: prepare: near \"SELEC\"") != NULL);
    CHECK_INT(idem__sq_run_simple(c,
                                  "CREATE TABLE k (n INTEGER CHECK (n > 0));"
                                  " CREATE TABLE parent (id INTEGER PRIMARY KEY);"
                                  " CREATE TABLE child (pid INTEGER REFERENCES parent (id))",
                                  "create"),
              0);
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO k VALUES (-1)", "insert"), IDEM_ESTORE);
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO child VALUES (7)", "insert"), IDEM_ESTORE);
    CHECK(strstr(c->errmsg, "FOREIGN KEY constraint failed") != NULL);
    CHECK_INT(c->broken, 0);
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO k VALUES (1)", "insert"), 0);
    idem__sq_conn_close(c);
}

static void a_file_that_stops_being_a_database_maps_to_eunavail_and_breaks_the_connection(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    struct cached_stmt *e = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "", junk[300];
    FILE *f;
    int rc;

    snprintf(junk, sizeof junk, "%s/attached-junk", dir);
    f = fopen(junk, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("not a database at all, and long enough to have been a header of one ......"
              "..........................................................................",
              f);
        fclose(f);
    }
    store_init(&st, path, sizeof path, "notadb.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    /*
     * A file the connection reads turns out not to be a database (SQLITE_NOTADB): the connection
     * is done for, whichever statement found out.
     */
    CHECK_INT(idem__sq_prepare(c, "ATTACH ?1 AS j", &e), 0);
    if (!e)
        goto out;
    CHECK_INT(sqlite3_bind_text(e->stmt, 1, junk, -1, SQLITE_STATIC), SQLITE_OK);
    rc = sqlite3_step(e->stmt) == SQLITE_DONE ? 0 : idem__sq_fail(c, IDEM_ESTORE, "attach");
    sqlite3_reset(e->stmt);
    if (rc == 0)
        rc = idem__sq_run_simple(c, "SELECT count(*) FROM j.sqlite_master", "read");
    CHECK_INT(rc, IDEM_EUNAVAIL);
    CHECK_INT(sqlite3_extended_errcode(c->db) & 0xff, SQLITE_NOTADB);
    CHECK_INT(c->broken, 1);
    CHECK(strstr(c->errmsg, "file is not a database") != NULL);
out:
    idem__sq_conn_close(c);
}

static void fail_returns_a_code_other_than_estore_as_it_is_and_says_why(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "passthrough.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    /* (a busy file would be IDEM_EUNAVAIL, but the caller's code stands) */
    CHECK(idem__sq_run_simple(c, "SELEC 1", "select") < 0);
    CHECK_INT(idem__sq_fail(c, IDEM_EINVAL, "bind"), IDEM_EINVAL);
    CHECK(strncmp(c->errmsg, "sqlite: bind: ", 14) == 0);
    CHECK_INT(c->broken, 0);
    idem__sq_conn_close(c);
}

static void prepare_keeps_each_statement_and_hands_it_back_reset_and_unbound(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    struct cached_stmt *e = NULL, *again = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "cache.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    CHECK_INT(idem__sq_prepare(c, "SELECT ?1", &e), 0);
    if (!e)
        goto out;
    CHECK_INT(sqlite3_bind_int(e->stmt, 1, 42), SQLITE_OK);
    CHECK_INT(sqlite3_step(e->stmt), SQLITE_ROW);
    CHECK_INT(sqlite3_column_int(e->stmt, 0), 42);
    /* Left mid-step and bound: the next prepare of the same text gives it back clean. */
    CHECK_INT(idem__sq_prepare(c, "SELECT ?1", &again), 0);
    CHECK(again == e);
    if (!again)
        goto out;
    CHECK_INT(sqlite3_stmt_busy(again->stmt), 0);
    CHECK_INT(sqlite3_step(again->stmt), SQLITE_ROW);
    CHECK_INT(sqlite3_column_type(again->stmt, 0), SQLITE_NULL);
    sqlite3_reset(again->stmt);
out:
    idem__sq_conn_close(c);
}

static void prepare_maps_dollar_parameters_to_the_callers_index(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    struct cached_stmt *e = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    store_init(&st, path, sizeof path, "params.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    /* $k is the caller's k-th parameter, whatever slot SQLite gave it. */
    CHECK_INT(idem__sq_prepare(c, "SELECT $2, $1, $2", &e), 0);
    if (e) {
        CHECK_INT(e->nmap, 2);
        CHECK_INT(e->map[0], 1);
        CHECK_INT(e->map[1], 0);
    }
    /* ?N is bound by number: slot i is index i. */
    CHECK_INT(idem__sq_prepare(c, "SELECT ?1, ?2", &e), 0);
    if (e) {
        CHECK_INT(e->nmap, 2);
        CHECK_INT(e->map[0], 0);
        CHECK_INT(e->map[1], 1);
    }
    /* Any other name is refused, and nothing is kept of it. */
    CHECK_INT(idem__sq_prepare(c, "SELECT :name", &e), IDEM_EINVAL);
    CHECK(strstr(c->errmsg, "parameters must be written $1, $2, ... (got :name)") != NULL);
    CHECK_INT(idem__sq_prepare(c, "SELECT $0", &e), IDEM_EINVAL);
    for (int i = 0; i < STMT_CACHE; i++)
        CHECK(!c->cache[i].sql || strcmp(c->cache[i].sql, "SELECT :name") != 0);
    idem__sq_conn_close(c);
}

static void prepare_keeps_at_most_stmt_cache_statements_and_drops_the_least_recently_used(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    struct cached_stmt *e = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "", sql[64];
    int kept_first = 0, kept_second = 0, held = 0;

    store_init(&st, path, sizeof path, "lru.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    for (int i = 0; i < STMT_CACHE; i++) {
        snprintf(sql, sizeof sql, "SELECT %d", i);
        CHECK_INT(idem__sq_prepare(c, sql, &e), 0);
    }
    CHECK_INT(idem__sq_prepare(c, "SELECT 0", &e), 0); /* used again: now the newest */
    CHECK_INT(idem__sq_prepare(c, "SELECT 'one more'", &e), 0);
    for (int i = 0; i < STMT_CACHE; i++) {
        held += c->cache[i].sql != NULL;
        kept_first += c->cache[i].sql && strcmp(c->cache[i].sql, "SELECT 0") == 0;
        kept_second += c->cache[i].sql && strcmp(c->cache[i].sql, "SELECT 1") == 0;
    }
    CHECK_INT(held, STMT_CACHE);
    CHECK_INT(kept_first, 1);
    CHECK_INT(kept_second, 0); /* the one used longest ago made room */
    idem__sq_conn_close(c);
}

static void run_simple_runs_one_statement_from_the_cache_and_a_script_whole(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";
    int cached = 0;

    store_init(&st, path, sizeof path, "simple.db", IDEM_SYNC_FULL, 100);
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0);
    if (!c)
        return;
    /* A script of several statements runs whole, and is not kept. */
    CHECK_INT(idem__sq_run_simple(c, "CREATE TABLE a (x); CREATE TABLE b (y)", "script"), 0);
    CHECK_INT(one_int(c, "SELECT count(*) FROM sqlite_master WHERE type = 'table'"), 2);
    /* One statement is kept; one that answers rows (a PRAGMA) runs to its end. */
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO a VALUES (1)", "insert"), 0);
    CHECK_INT(idem__sq_run_simple(c, "PRAGMA table_info(a)", "pragma"), 0);
    for (int i = 0; i < STMT_CACHE; i++) {
        cached += c->cache[i].sql && strcmp(c->cache[i].sql, "INSERT INTO a VALUES (1)") == 0;
        CHECK(!c->cache[i].sql || strchr(c->cache[i].sql, ';') == NULL);
    }
    CHECK_INT(cached, 1);
    CHECK_INT(one_int(c, "SELECT count(*) FROM a"), 1);
    /* A failing script says which statement's words, under the caller's `what`. */
    CHECK_INT(idem__sq_run_simple(c, "INSERT INTO a VALUES (2); INSERT INTO nowhere VALUES (3)",
                                  "migration"),
              IDEM_ESTORE);
    CHECK(strstr(c->errmsg, "sqlite: migration: no such table: nowhere") != NULL);
    idem__sq_conn_close(c);
}

static void an_in_memory_database_opens_without_a_file(void)
{
    struct idem_store st;
    struct idem_conn *c = NULL;
    char path[256], err[IDEM_ERRMSG_MAX] = "";

    memset(&st, 0, sizeof st);
    snprintf(path, sizeof path, "%s", ":memory:");
    st.target = path;
    st.opts.busy_timeout_ms = 100;
    st.opts.sync = IDEM_SYNC_FULL;
    CHECK_INT(idem__sq_conn_open(&st, &c, err, sizeof err), 0); /* (no WAL to keep) */
    if (c)
        CHECK_INT(idem__sq_run_simple(c, "CREATE TABLE t (x)", "create"), 0);
    idem__sq_conn_close(c);
}

static void closing_null_is_a_no_op(void)
{
    idem__sq_conn_close(NULL);
    CHECK(1);
}

#define RUN(test) (fprintf(stderr, "%s\n", #test), test())

int main(void)
{
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(open_applies_wal_synchronous_full_foreign_keys_and_memory_temp_store);
    RUN(open_with_sync_normal_runs_synchronous_normal);
    RUN(open_applies_no_schema);
    RUN(a_missing_file_is_made_owner_only_with_its_directories);
    RUN(an_existing_file_keeps_its_mode);
    RUN(the_wal_is_kept_when_the_last_connection_closes);
    RUN(a_file_that_cannot_be_made_is_eunavail_and_says_why);
    RUN(a_file_that_is_not_a_database_is_eunavail_and_says_so);
    RUN(busy_and_locked_map_to_eunavail_and_leave_the_connection_usable);
    RUN(unique_and_primary_key_violations_map_to_econflict);
    RUN(other_failures_stay_estore_and_leave_the_connection_usable);
    RUN(a_file_that_stops_being_a_database_maps_to_eunavail_and_breaks_the_connection);
    RUN(fail_returns_a_code_other_than_estore_as_it_is_and_says_why);
    RUN(prepare_keeps_each_statement_and_hands_it_back_reset_and_unbound);
    RUN(prepare_maps_dollar_parameters_to_the_callers_index);
    RUN(prepare_keeps_at_most_stmt_cache_statements_and_drops_the_least_recently_used);
    RUN(run_simple_runs_one_statement_from_the_cache_and_a_script_whole);
    RUN(an_in_memory_database_opens_without_a_file);
    RUN(closing_null_is_a_no_op);
    return t_done();
}
