/* SPDX-License-Identifier: Apache-2.0 */
/*
 * commit_rate.c - the raw durable commit rate of a store, the yardstick of the group-commit
 * target.  Every transaction inserts one small row and is made durable before the next one of
 * its thread starts: SQLite in WAL mode with synchronous=FULL (BEGIN IMMEDIATE; INSERT; COMMIT,
 * one fsync of the WAL per commit), PostgreSQL through libpq (one INSERT in autocommit, one WAL
 * flush per commit unless the server merges concurrent flushes).  Run with 1, 2 or 8 threads it
 * shows whether concurrency alone buys anything from the store: what an engine that commits
 * once per request can at best reach, and what group commit has to beat.
 *
 *   commit_rate sqlite:PATH | postgresql://... [--threads N] [--seconds S] [--sync full|normal]
 *
 * Prints one JSON object on stdout: store, threads, seconds, commits, errors, rate (commits/s),
 * p50_us and p99_us (latency of one transaction), and the durability settings in force.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <sqlite3.h>

#include "clock.h" /* common/clock.h */
#include "latency.h"
#include "banned.h"

#define THREADS_MAX 64
#define SAMPLES_MAX ((size_t)4 << 20)
#define PAYLOAD                                                                                    \
    "{\"productId\":\"p-1024\",\"quantity\":2,\"note\":\"one small row, about the size of an "     \
    "idempotency record\"}"

struct opts {
    const char *uri;
    const char *target; /* the path of sqlite:PATH, or the libpq URI */
    int pg;
    int threads;
    double seconds;
    int sync_full;
};

struct worker {
    pthread_t thread;
    int id;
    const struct opts *o;
    pthread_barrier_t *start;
    int64_t commits;
    int64_t errors;
    int64_t *lat_us; /* one sample per commit, capped at SAMPLES_MAX */
    size_t nlat;
    size_t cap;
    char err[256];
};

static void note_error(struct worker *w, const char *what, const char *detail)
{
    w->errors++;
    if (w->err[0] == '\0')
        snprintf(w->err, sizeof w->err, "%s: %s", what, detail ? detail : "");
}

static void keep_sample(struct worker *w, int64_t ns)
{
    int64_t *grown;
    size_t cap;

    if (w->nlat == w->cap) {
        if (w->cap >= SAMPLES_MAX)
            return;
        cap = w->cap ? w->cap * 2 : 4096;
        grown = realloc(w->lat_us, cap * sizeof *grown);
        if (grown == NULL)
            return;
        w->lat_us = grown;
        w->cap = cap;
    }
    w->lat_us[w->nlat++] = ns / 1000;
}

/* ---- SQLite ---------------------------------------------------------------------------------- */

static int sqlite_configure(sqlite3 *db, int sync_full, char *err, size_t errlen)
{
    char *msg = NULL;
    char sql[160];
    int rc = -1;

    sqlite3_busy_timeout(db, 5000);
    snprintf(sql, sizeof sql, "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s;",
             sync_full ? "FULL" : "NORMAL");
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "configure: %s", msg ? msg : sqlite3_errmsg(db));
        goto out;
    }
    rc = 0;
out:
    sqlite3_free(msg);
    return rc;
}

static void *sqlite_worker(void *arg)
{
    struct worker *w = arg;
    sqlite3 *db = NULL;
    sqlite3_stmt *begin = NULL, *insert = NULL, *commit = NULL, *rollback = NULL;
    int64_t seq = 0, t0, deadline;
    int step;

    if (sqlite3_open_v2(w->o->target, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
            SQLITE_OK ||
        sqlite_configure(db, w->o->sync_full, w->err, sizeof w->err) != 0 ||
        sqlite3_prepare_v2(db, "BEGIN IMMEDIATE", -1, &begin, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "INSERT INTO bench_commit (worker, seq, payload) VALUES (?1, ?2, ?3)",
                           -1, &insert, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "COMMIT", -1, &commit, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, "ROLLBACK", -1, &rollback, NULL) != SQLITE_OK) {
        if (w->err[0] == '\0')
            snprintf(w->err, sizeof w->err, "open: %s", db ? sqlite3_errmsg(db) : "no memory");
        w->errors++;
        pthread_barrier_wait(w->start);
        goto out;
    }
    pthread_barrier_wait(w->start);
    deadline = clock_mono_ns() + (int64_t)(w->o->seconds * 1e9);
    while (clock_mono_ns() < deadline) {
        t0 = clock_mono_ns();
        sqlite3_reset(begin);
        if (sqlite3_step(begin) != SQLITE_DONE) {
            note_error(w, "begin", sqlite3_errmsg(db));
            continue;
        }
        sqlite3_reset(insert);
        sqlite3_bind_int(insert, 1, w->id);
        sqlite3_bind_int64(insert, 2, ++seq);
        sqlite3_bind_text(insert, 3, PAYLOAD, -1, SQLITE_STATIC);
        step = sqlite3_step(insert);
        sqlite3_reset(commit);
        if (step != SQLITE_DONE || sqlite3_step(commit) != SQLITE_DONE) {
            note_error(w, step != SQLITE_DONE ? "insert" : "commit", sqlite3_errmsg(db));
            sqlite3_reset(rollback);
            sqlite3_step(rollback);
            continue;
        }
        w->commits++;
        keep_sample(w, clock_mono_ns() - t0);
    }
out:
    sqlite3_finalize(begin);
    sqlite3_finalize(insert);
    sqlite3_finalize(commit);
    sqlite3_finalize(rollback);
    sqlite3_close_v2(db);
    return NULL;
}

static int sqlite_setup(const struct opts *o, char *settings, size_t settings_len, char *err,
                        size_t errlen)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    char *msg = NULL;
    char mode[32] = "?";
    const char *sync_name = "other";
    int sync = -1;
    int rc = -1;

    if (sqlite3_open_v2(o->target, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "cannot open %s: %s", o->target, db ? sqlite3_errmsg(db) : "");
        goto out;
    }
    if (sqlite_configure(db, o->sync_full, err, errlen) != 0)
        goto out;
    if (sqlite3_exec(db,
                     "CREATE TABLE IF NOT EXISTS bench_commit (id INTEGER PRIMARY KEY, worker "
                     "INTEGER NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL)",
                     NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "create table: %s", msg ? msg : "");
        goto out;
    }
    /* Read the settings back: the report quotes what was in force, not what was asked. */
    if (sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        snprintf(mode, sizeof mode, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(db, "PRAGMA synchronous", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        sync = sqlite3_column_int(st, 0);
    if (sync == 2)
        sync_name = "FULL";
    else if (sync == 1)
        sync_name = "NORMAL";
    snprintf(settings, settings_len,
             "\"journal_mode\":\"%s\",\"synchronous\":\"%s\",\"sqlite_version\":\"%s\"", mode,
             sync_name, sqlite3_libversion());
    rc = 0;
out:
    sqlite3_finalize(st);
    sqlite3_free(msg);
    sqlite3_close_v2(db);
    return rc;
}

/* ---- PostgreSQL ------------------------------------------------------------------------------ */

static void *pg_worker(void *arg)
{
    struct worker *w = arg;
    PGconn *conn = PQconnectdb(w->o->target);
    PGresult *res = NULL;
    char idtext[16], seqtext[24];
    const char *params[3] = {idtext, seqtext, PAYLOAD};
    int64_t seq = 0, t0, deadline;
    int ok = 0;

    if (PQstatus(conn) != CONNECTION_OK) {
        note_error(w, "connect", PQerrorMessage(conn));
    } else {
        res = PQprepare(conn, "ins",
                        "INSERT INTO bench_commit (worker, seq, payload) VALUES "
                        "($1::int, $2::bigint, $3)",
                        3, NULL);
        ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            note_error(w, "prepare", PQerrorMessage(conn));
        PQclear(res);
        res = NULL;
    }
    snprintf(idtext, sizeof idtext, "%d", w->id);
    pthread_barrier_wait(w->start);
    deadline = clock_mono_ns() + (int64_t)(w->o->seconds * 1e9);
    while (ok && clock_mono_ns() < deadline) {
        t0 = clock_mono_ns();
        snprintf(seqtext, sizeof seqtext, "%lld", (long long)++seq);
        res = PQexecPrepared(conn, "ins", 3, params, NULL, NULL, 0);
        if (PQresultStatus(res) == PGRES_COMMAND_OK) {
            w->commits++;
            keep_sample(w, clock_mono_ns() - t0);
        } else {
            note_error(w, "insert", PQerrorMessage(conn));
            if (PQstatus(conn) != CONNECTION_OK)
                ok = 0;
        }
        PQclear(res);
        res = NULL;
    }
    PQfinish(conn);
    return NULL;
}

static int pg_show(PGconn *conn, const char *name, char *out, size_t outlen)
{
    char sql[64];
    PGresult *res;
    int rc = -1;

    snprintf(sql, sizeof sql, "SHOW %s", name);
    res = PQexec(conn, sql);
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
        snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
        rc = 0;
    }
    PQclear(res);
    return rc;
}

static int pg_setup(const struct opts *o, char *settings, size_t settings_len, char *err,
                    size_t errlen)
{
    PGconn *conn = PQconnectdb(o->target);
    PGresult *res = NULL;
    char fsync[16] = "?", sc[16] = "?", version[32] = "?";
    int rc = -1;

    if (PQstatus(conn) != CONNECTION_OK) {
        snprintf(err, errlen, "connect: %s", PQerrorMessage(conn));
        goto out;
    }
    res = PQexec(conn, "CREATE TABLE IF NOT EXISTS bench_commit (id bigserial PRIMARY KEY, worker "
                       "int NOT NULL, seq bigint NOT NULL, payload text NOT NULL)");
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        snprintf(err, errlen, "create table: %s", PQerrorMessage(conn));
        goto out;
    }
    pg_show(conn, "fsync", fsync, sizeof fsync);
    pg_show(conn, "synchronous_commit", sc, sizeof sc);
    pg_show(conn, "server_version", version, sizeof version);
    snprintf(settings, settings_len,
             "\"fsync\":\"%s\",\"synchronous_commit\":\"%s\",\"server_version\":\"%s\"", fsync, sc,
             version);
    rc = 0;
out:
    PQclear(res);
    PQfinish(conn);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int usage(void)
{
    fprintf(stderr, "usage: commit_rate sqlite:PATH | postgresql://... [--threads N] "
                    "[--seconds S] [--sync full|normal]\n");
    return 2;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    char *end = NULL;
    int i;

    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->seconds = 3.0;
    o->sync_full = 1;
    if (argc < 2)
        return -1;
    o->uri = argv[1];
    if (strncmp(o->uri, "sqlite:", 7) == 0) {
        o->target = o->uri + 7;
    } else if (strncmp(o->uri, "postgresql://", 13) == 0 ||
               strncmp(o->uri, "postgres://", 11) == 0) {
        o->target = o->uri;
        o->pg = 1;
    } else {
        return -1;
    }
    for (i = 2; i < argc; i++) {
        if (i + 1 >= argc)
            return -1;
        if (strcmp(argv[i], "--threads") == 0) {
            o->threads = (int)strtol(argv[++i], &end, 10);
            if (*end != '\0' || o->threads < 1 || o->threads > THREADS_MAX)
                return -1;
        } else if (strcmp(argv[i], "--seconds") == 0) {
            o->seconds = strtod(argv[++i], &end);
            if (*end != '\0' || !(o->seconds > 0.0 && o->seconds <= 600.0))
                return -1;
        } else if (strcmp(argv[i], "--sync") == 0) {
            i++;
            if (strcmp(argv[i], "full") == 0)
                o->sync_full = 1;
            else if (strcmp(argv[i], "normal") == 0)
                o->sync_full = 0;
            else
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct worker *w = NULL;
    pthread_barrier_t start;
    char settings[256] = "";
    char err[512] = "";
    int64_t *all = NULL;
    size_t nall = 0;
    int64_t commits = 0, errors = 0, t0, elapsed;
    const char *first_err = "";
    int barrier = 0;
    int rc = 1;
    int i;

    if (parse_args(argc, argv, &o) != 0)
        return usage();
    if ((o.pg ? pg_setup(&o, settings, sizeof settings, err, sizeof err)
              : sqlite_setup(&o, settings, sizeof settings, err, sizeof err)) != 0) {
        fprintf(stderr, "commit_rate: %s\n", err);
        goto out;
    }
    w = calloc((size_t)o.threads, sizeof *w);
    if (w == NULL || pthread_barrier_init(&start, NULL, (unsigned)o.threads + 1) != 0) {
        fprintf(stderr, "commit_rate: out of memory\n");
        goto out;
    }
    barrier = 1;
    for (i = 0; i < o.threads; i++) {
        w[i].id = i;
        w[i].o = &o;
        w[i].start = &start;
    }
    for (i = 0; i < o.threads; i++) {
        if (pthread_create(&w[i].thread, NULL, o.pg ? pg_worker : sqlite_worker, &w[i]) != 0) {
            fprintf(stderr, "commit_rate: cannot start thread %d: %s\n", i, strerror(errno));
            exit(1);
        }
    }
    /* Every connection is open before the clock starts (each thread times its own run from
     * the barrier): only commits are timed. */
    pthread_barrier_wait(&start);
    t0 = clock_mono_ns();
    for (i = 0; i < o.threads; i++)
        pthread_join(w[i].thread, NULL);
    elapsed = clock_mono_ns() - t0;

    for (i = 0; i < o.threads; i++) {
        commits += w[i].commits;
        errors += w[i].errors;
        nall += w[i].nlat;
        if (first_err[0] == '\0' && w[i].err[0] != '\0')
            first_err = w[i].err;
    }
    all = malloc((nall ? nall : 1) * sizeof *all);
    if (all == NULL) {
        fprintf(stderr, "commit_rate: out of memory\n");
        goto out;
    }
    nall = 0;
    for (i = 0; i < o.threads; i++) {
        memcpy(all + nall, w[i].lat_us, w[i].nlat * sizeof *all);
        nall += w[i].nlat;
    }
    latency_sort(all, nall);
    printf("{\"store\":\"%s\",\"threads\":%d,\"seconds\":%.3f,\"commits\":%lld,\"errors\":%lld,"
           "\"rate\":%.1f,\"p50_us\":%lld,\"p99_us\":%lld,%s}\n",
           o.pg ? "postgresql" : "sqlite", o.threads, (double)elapsed / 1e9, (long long)commits,
           (long long)errors, (double)commits / ((double)elapsed / 1e9),
           (long long)latency_at(all, nall, 0.50), (long long)latency_at(all, nall, 0.99),
           settings);
    if (first_err[0] != '\0')
        fprintf(stderr, "commit_rate: first error: %s\n", first_err);
    rc = commits > 0 ? 0 : 1;
out:
    if (w != NULL) {
        for (i = 0; i < o.threads; i++)
            free(w[i].lat_us);
    }
    if (barrier)
        pthread_barrier_destroy(&start);
    free(w);
    free(all);
    return rc;
}
