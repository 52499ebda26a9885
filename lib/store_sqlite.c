/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_sqlite.c - the SQLite store: one file, zero set-up, the embedded default.
 *
 * Durability is the point: WAL, and a commit is on disk before anyone is told it happened, and
 * kill -9 at any moment leaves a consistent file.  Every write transaction of a process runs on
 * its one writer connection, as a savepoint inside a shared batch transaction (group commit,
 * sqlite_commit.c): concurrent requests share one fsync, and nobody is answered before the batch
 * holding their work is durable.  Claims run under the batch's write lock (BEGIN IMMEDIATE), so
 * two claimers never both read "absent" and the primary key, not a read, decides who owns a
 * key.  Reads run on pooled connections, each used by one thread at a time, and see committed
 * batches only.  Every connection keeps its prepared statements.  Leases are measured with this
 * machine's wall clock, which every process sharing the file shares too.
 *
 * The top of the store's three layers (an arrow is a call, and none points up):
 *
 *     store_sqlite.c       the store's tables: records, migrations, reads on pooled connections
 *        |       |
 *        |       v
 *        |    sqlite_commit.c    the group commit: the writer, batches, syncer, read gate
 *        |       |
 *        v       v
 *     sqlite_conn.c        a connection: opened and configured, its statements, its errors
 *
 * This file holds the store's SQL (the record_* statements, the schema and its migrations) and
 * the pooled connections' transactions; every write goes through the group commit's write_*
 * calls, which its store table hands to the engine as they are.
 */
#include "sqlite_conn.h"
#include "sqlite_commit.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* libidem's own schema, versioned like an application's. */
static const struct idem_migration idem_schema[] = {
    {1, "records",
     "CREATE TABLE IF NOT EXISTS idem_records ("
     " principal TEXT NOT NULL, operation TEXT NOT NULL, idem_key TEXT NOT NULL,"
     " fingerprint BLOB NOT NULL,"
     " status INTEGER NOT NULL," /* 0 processing, 1 completed */
     " recovery_point TEXT NOT NULL DEFAULT '', recovery_data TEXT,"
     " lease_owner TEXT, lease_expires_ms INTEGER NOT NULL DEFAULT 0,"
     " response_status INTEGER, response_headers TEXT, response_body BLOB,"
     " created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,"
     " PRIMARY KEY (principal, operation, idem_key)) WITHOUT ROWID;"
     "CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_ms);",
     NULL},
};

/*
 * The store table's conn_open: a connection of the pool (sqlite_conn.c), opened once the group is
 * there (sqlite_commit.c), with libidem's schema applied.  The store's first one starts the group's
 * commit pipeline.
 */
static int sq_conn_open(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    struct idem_conn *c = NULL;
    char why[IDEM_ERRMSG_MAX];
    int first, rc;

    *out = NULL;
    first = idem__sq_group_open(st, err, errlen);
    if (first < 0)
        return first;
    rc = idem__sq_conn_open(st, &c, err, errlen);
    if (rc < 0)
        return rc;
    rc = idem__migrate(&idem__sqlite_methods, c, "libidem", idem_schema,
                       sizeof(idem_schema) / sizeof(idem_schema[0]), NULL, why, sizeof(why));
    if (rc < 0) {
        idem__fmt(err, errlen, "%s (%s)", why, st->target);
        if (rc != IDEM_ENOMEM)
            rc = IDEM_EUNAVAIL;
        goto out;
    }
    if (first == 1 && (rc = idem__sq_pipeline_open(st, err, errlen)) < 0)
        goto out;
    *out = c;
    c = NULL;
    rc = 0;
out:
    idem__sq_conn_close(c);
    return rc;
}

static const char *sq_errmsg(const struct idem_conn *c)
{
    return c->errmsg;
}

static int sq_conn_ok(struct idem_conn *c)
{
    /* A connection left inside a transaction (a failed rollback) must not be lent again. */
    return !c->broken && sqlite3_get_autocommit(c->db);
}

/* Pooled connections only read: every write transaction goes through the writer (group commit). */
static int sq_begin(struct idem_conn *c, int write)
{
    (void)write;
    c->snap_marked = 0;
    return idem__sq_run_simple(c, "BEGIN", "begin");
}

/*
 * Ends a pooled connection's transaction with `sql` once what it read is durable: gated on its
 * snapshot (idem__sq_read_gate) before the end lets go of it, so commits made since are not
 * waited for.  Every statement was gated already; this adds the stopped store's refusal for a
 * transaction that ends with a COMMIT, which then rolls back instead.
 */
static int sq_end(struct idem_conn *c, const char *sql, const char *what)
{
    int gate = idem__sq_read_gate(c);
    int rc = 0;

    if (!sqlite3_get_autocommit(c->db))
        rc = idem__sq_run_simple(c, gate < 0 ? "ROLLBACK" : sql, what);
    c->snap_marked = 0;
    return rc < 0 ? rc : gate;
}

static int sq_commit(struct idem_conn *c)
{
    return sq_end(c, "COMMIT", "commit");
}

static int sq_rollback(struct idem_conn *c)
{
    return sq_end(c, "ROLLBACK", "rollback");
}

/* Binds the caller's text parameters through the statement's $k map. */
static int bind_params(struct idem_conn *c, struct cached_stmt *e, int nparams,
                       const char *const *params)
{
    for (int i = 0; i < e->nmap; i++) {
        int k = e->map[i];
        int src;
        if (k >= nparams) {
            idem__fmt(c->errmsg, sizeof(c->errmsg), "sqlite: statement uses $%d but %d given",
                      k + 1, nparams);
            return IDEM_EINVAL;
        }
        src = params[k] ? sqlite3_bind_text(e->stmt, i + 1, params[k], -1, SQLITE_STATIC)
                        : sqlite3_bind_null(e->stmt, i + 1);
        if (src != SQLITE_OK)
            return idem__sq_fail(c, IDEM_ESTORE, "bind");
    }
    return 0;
}

static int sq_exec(struct idem_conn *c, const char *sql, int nparams, const char *const *params,
                   struct idem_rows **rows)
{
    int rc = 0;
    struct cached_stmt *e = NULL;
    struct idem_rows *r = NULL;
    const char **vals = NULL;
    size_t *lens = NULL;
    int step;

    rc = idem__sq_prepare(c, sql, &e);
    if (rc < 0)
        goto out;
    rc = bind_params(c, e, nparams, params);
    if (rc < 0)
        goto out;
    if (rows) {
        int ncols = sqlite3_column_count(e->stmt);
        const char **names = calloc((size_t)ncols + 1, sizeof(char *));
        vals = calloc((size_t)ncols + 1, sizeof(char *));
        lens = calloc((size_t)ncols + 1, sizeof(size_t));
        if (!names || !vals || !lens) {
            free(names);
            rc = IDEM_ENOMEM;
            goto out;
        }
        for (int i = 0; i < ncols; i++)
            names[i] = sqlite3_column_name(e->stmt, i);
        rc = idem__rows_new(ncols, names, &r);
        free(names);
        if (rc < 0)
            goto out;
    }
    while ((step = sqlite3_step(e->stmt)) == SQLITE_ROW) {
        if (!r)
            continue;
        for (int i = 0; i < r->ncols; i++) {
            vals[i] = (const char *)sqlite3_column_text(e->stmt, i);
            lens[i] = (size_t)sqlite3_column_bytes(e->stmt, i);
        }
        rc = idem__rows_append(r, vals, lens);
        if (rc < 0)
            goto out;
    }
    if (step != SQLITE_DONE) {
        rc = idem__sq_fail(c, IDEM_ESTORE, "step");
        goto out;
    }
    if (r)
        r->changed = sqlite3_changes64(c->db);
    if (rows) {
        *rows = r;
        r = NULL;
    }
out:
    if (e)
        sqlite3_reset(e->stmt);
    if (rc == 0 && (rc = idem__sq_read_gate(c)) < 0 && rows) {
        r = *rows;
        *rows = NULL;
    }
    idem_rows_free(r);
    free(vals);
    free(lens);
    return rc;
}

/* ---- records ------------------------------------------------------------------------------ */

/* Prepares one of the store's own statements (written with ?N) and binds the scope to ?1-?3. */
static int record_stmt(struct idem_conn *c, const char *sql, const struct idem_scope *s,
                       sqlite3_stmt **out)
{
    struct cached_stmt *e = NULL;
    int rc = idem__sq_prepare(c, sql, &e);
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(e->stmt, 1, s->principal, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(e->stmt, 2, s->operation, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(e->stmt, 3, s->key, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    *out = e->stmt;
    return 0;
}

/* Steps a statement that returns no rows; *changes gets the rows it changed. */
static int step_done(struct idem_conn *c, sqlite3_stmt *stmt, const char *what, int *changes)
{
    int step = sqlite3_step(stmt);
    int rc = 0;
    if (step != SQLITE_DONE)
        rc = idem__sq_fail(c, IDEM_ESTORE, what);
    else if (changes)
        *changes = sqlite3_changes(c->db);
    sqlite3_reset(stmt);
    return rc;
}

#define SCOPE_WHERE "principal = ?1 AND operation = ?2 AND idem_key = ?3"

/*
 * The upsert's condition for replacing a record of the scope that is there: its retention ended
 * and no live lease protects it (the key is new again).  Claims of both kinds share it.
 */
#define RETENTION_LET_GO                                                                           \
    "idem_records.expires_ms <= excluded.created_ms"                                               \
    " AND (idem_records.status = 1 OR idem_records.lease_expires_ms <= excluded.created_ms)"

static int sq_record_insert(struct idem_conn *c, const struct idem_scope *s,
                            const unsigned char fp[IDEM_FP_LEN], const char *owner,
                            int64_t lease_ms, int64_t ttl_ms, const char *point, int *inserted)
{
    /*
     * The primary key decides: a new key is inserted, an existing one is left alone -- unless
     * its retention ended and no live lease protects it, in which case the key is new again.
     */
    static const char sql[] =
        "INSERT INTO idem_records (principal, operation, idem_key, fingerprint, status,"
        " recovery_point, lease_owner, lease_expires_ms, created_ms, expires_ms)"
        " VALUES (?1, ?2, ?3, ?4, 0, ?9, ?5, ?6, ?7, ?8)"
        " ON CONFLICT (principal, operation, idem_key) DO UPDATE SET"
        " fingerprint = excluded.fingerprint, status = 0,"
        " recovery_point = excluded.recovery_point,"
        " recovery_data = NULL, lease_owner = excluded.lease_owner,"
        " lease_expires_ms = excluded.lease_expires_ms, response_status = NULL,"
        " response_headers = NULL, response_body = NULL, created_ms = excluded.created_ms,"
        " expires_ms = excluded.expires_ms"
        " WHERE " RETENTION_LET_GO;
    sqlite3_stmt *stmt = NULL;
    int64_t now = clock_wall_ms();
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *inserted = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_blob(stmt, 4, fp, IDEM_FP_LEN, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 5, owner, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 6, now + lease_ms) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 7, now) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 8, now + ttl_ms) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 9, point, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "claim", &changes);
    *inserted = changes == 1;
    return rc;
}

static int sq_record_insert_completed(struct idem_conn *c, const struct idem_scope *s,
                                      const unsigned char fp[IDEM_FP_LEN], int64_t ttl_ms,
                                      int status, const char *headers, const void *body,
                                      size_t body_len, int *inserted)
{
    static const char sql[] =
        "INSERT INTO idem_records (principal, operation, idem_key, fingerprint, status,"
        " recovery_point, lease_owner, lease_expires_ms, response_status, response_headers,"
        " response_body, created_ms, expires_ms)"
        " VALUES (?1, ?2, ?3, ?4, 1, '', NULL, 0, ?5, ?6, ?7, ?8, ?9)"
        " ON CONFLICT (principal, operation, idem_key) DO UPDATE SET"
        " fingerprint = excluded.fingerprint, status = 1, recovery_point = '',"
        " recovery_data = NULL, lease_owner = NULL, lease_expires_ms = 0,"
        " response_status = excluded.response_status,"
        " response_headers = excluded.response_headers, response_body = excluded.response_body,"
        " created_ms = excluded.created_ms, expires_ms = excluded.expires_ms"
        " WHERE " RETENTION_LET_GO;
    sqlite3_stmt *stmt = NULL;
    int64_t now = clock_wall_ms();
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *inserted = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_blob(stmt, 4, fp, IDEM_FP_LEN, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(stmt, 5, status) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 6, headers, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_blob64(stmt, 7, body ? body : "", body_len, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 8, now) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 9, now + ttl_ms) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "claim completed", &changes);
    *inserted = changes == 1;
    return rc;
}

static char *column_dup(sqlite3_stmt *stmt, int col)
{
    const unsigned char *t = sqlite3_column_text(stmt, col);
    return t ? idem__strdup((const char *)t) : NULL;
}

static int sq_record_get(struct idem_conn *c, const struct idem_scope *s, struct idem_record *rec)
{
    static const char sql[] =
        "SELECT status, fingerprint, recovery_point, recovery_data, lease_owner,"
        " lease_expires_ms, response_status, response_headers, response_body, expires_ms,"
        " created_ms FROM idem_records WHERE " SCOPE_WHERE;
    sqlite3_stmt *stmt = NULL;
    int rc = record_stmt(c, sql, s, &stmt);
    int step;

    memset(rec, 0, sizeof(*rec));
    if (rc < 0)
        return rc;
    rec->store_now_ms = clock_wall_ms();
    step = sqlite3_step(stmt);
    if (step == SQLITE_ROW) {
        const void *fp = sqlite3_column_blob(stmt, 1);
        int64_t expires = sqlite3_column_int64(stmt, 9);
        rec->status = sqlite3_column_int(stmt, 0) == 1 ? IDEM_REC_COMPLETED : IDEM_REC_PROCESSING;
        rec->lease_expires_ms = sqlite3_column_int64(stmt, 5);
        rec->expires_ms = expires;
        rec->created_ms = sqlite3_column_int64(stmt, 10);
        /* Past retention and unprotected, a record is as good as swept: the key is new. */
        rec->found =
            !(expires <= rec->store_now_ms &&
              (rec->status == IDEM_REC_COMPLETED || rec->lease_expires_ms <= rec->store_now_ms));
        if (fp && sqlite3_column_bytes(stmt, 1) == IDEM_FP_LEN)
            memcpy(rec->fp, fp, IDEM_FP_LEN);
        rec->recovery_point = column_dup(stmt, 2);
        rec->recovery_data = column_dup(stmt, 3);
        rec->lease_owner = column_dup(stmt, 4);
        rec->response_status = sqlite3_column_int(stmt, 6);
        rec->response_headers = column_dup(stmt, 7);
        rec->response_body_len = (size_t)sqlite3_column_bytes(stmt, 8);
        rec->response_body = malloc(rec->response_body_len + 1);
        if (rec->response_body) {
            const void *b = sqlite3_column_blob(stmt, 8);
            if (b)
                memcpy(rec->response_body, b, rec->response_body_len);
            ((char *)rec->response_body)[rec->response_body_len] = '\0';
        }
        if (!rec->recovery_point || !rec->response_body)
            rc = IDEM_ENOMEM;
    } else if (step != SQLITE_DONE) {
        rc = idem__sq_fail(c, IDEM_ESTORE, "read record");
    }
    sqlite3_reset(stmt);
    if (rc == 0 && rec->found) /* (an absence needs no gate: see record_get in internal.h) */
        rc = idem__sq_read_gate(c);
    if (rc < 0)
        idem__record_clear(rec);
    return rc;
}

static int sq_record_takeover(struct idem_conn *c, const struct idem_scope *s,
                              const unsigned char fp[IDEM_FP_LEN], const char *owner,
                              int64_t lease_ms, int *won)
{
    static const char sql[] = "UPDATE idem_records SET lease_owner = ?4, lease_expires_ms = ?5"
                              " WHERE " SCOPE_WHERE " AND status = 0 AND lease_expires_ms <= ?6"
                              " AND fingerprint = ?7";
    sqlite3_stmt *stmt = NULL;
    int64_t now = clock_wall_ms();
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *won = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(stmt, 4, owner, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 5, now + lease_ms) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 6, now) != SQLITE_OK ||
        sqlite3_bind_blob(stmt, 7, fp, IDEM_FP_LEN, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "take over lease", &changes);
    *won = changes == 1;
    return rc;
}

static int sq_record_advance(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                             const char *point, const char *data, int64_t lease_ms, int *ok)
{
    static const char sql[] =
        "UPDATE idem_records SET recovery_point = ?4, recovery_data = ?5, lease_expires_ms = ?6"
        " WHERE " SCOPE_WHERE " AND status = 0 AND lease_owner = ?7";
    sqlite3_stmt *stmt = NULL;
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *ok = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(stmt, 4, point, -1, SQLITE_STATIC) != SQLITE_OK ||
        (data ? sqlite3_bind_text(stmt, 5, data, -1, SQLITE_STATIC) : sqlite3_bind_null(stmt, 5)) !=
            SQLITE_OK ||
        sqlite3_bind_int64(stmt, 6, clock_wall_ms() + lease_ms) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 7, owner, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "advance record", &changes);
    *ok = changes == 1;
    return rc;
}

static int sq_record_complete(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                              int status, const char *headers, const void *body, size_t body_len,
                              int *ok)
{
    static const char sql[] =
        "UPDATE idem_records SET status = 1, response_status = ?4, response_headers = ?5,"
        " response_body = ?6, lease_owner = NULL, lease_expires_ms = 0"
        " WHERE " SCOPE_WHERE " AND status = 0 AND lease_owner = ?7";
    sqlite3_stmt *stmt = NULL;
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *ok = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_int(stmt, 4, status) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 5, headers, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_blob64(stmt, 6, body ? body : "", body_len, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 7, owner, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "complete record", &changes);
    *ok = changes == 1;
    return rc;
}

static int sq_record_release(struct idem_conn *c, const struct idem_scope *s, const char *owner)
{
    static const char sql[] = "UPDATE idem_records SET lease_expires_ms = 0"
                              " WHERE " SCOPE_WHERE " AND status = 0 AND lease_owner = ?4";
    sqlite3_stmt *stmt = NULL;
    int rc = record_stmt(c, sql, s, &stmt);

    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(stmt, 4, owner, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    return step_done(c, stmt, "release lease", NULL);
}

static int sq_record_release_owned(struct idem_conn *c, const char *prefix, const char *except,
                                   int *released)
{
    static const char sql[] = "UPDATE idem_records SET lease_expires_ms = 0"
                              " WHERE status = 0 AND lease_expires_ms > 0"
                              " AND substr(lease_owner, 1, length(?1)) = ?1"
                              " AND substr(lease_owner, 1, length(?2)) <> ?2";
    struct cached_stmt *e = NULL;
    int rc = idem__sq_prepare(c, sql, &e);

    *released = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(e->stmt, 1, prefix, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(e->stmt, 2, except, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    return step_done(c, e->stmt, "release leases", released);
}

static int sq_record_forget(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                            int *ok)
{
    static const char sql[] = "DELETE FROM idem_records"
                              " WHERE " SCOPE_WHERE " AND status = 0 AND lease_owner = ?4";
    sqlite3_stmt *stmt = NULL;
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *ok = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(stmt, 4, owner, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "forget record", &changes);
    *ok = rc == 0 && changes == 1;
    return rc;
}

static int sq_record_sweep(struct idem_conn *c, int limit, int *deleted)
{
    static const char sql[] =
        "DELETE FROM idem_records WHERE (principal, operation, idem_key) IN"
        " (SELECT principal, operation, idem_key FROM idem_records"
        "  WHERE expires_ms <= ?1 AND (status = 1 OR lease_expires_ms <= ?1) LIMIT ?2)";
    struct cached_stmt *e = NULL;
    int rc = idem__sq_prepare(c, sql, &e);

    *deleted = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_int64(e->stmt, 1, clock_wall_ms()) != SQLITE_OK ||
        sqlite3_bind_int(e->stmt, 2, limit) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    return step_done(c, e->stmt, "sweep", deleted);
}

static int sq_record_stalled(struct idem_conn *c, const char *operation, int limit,
                             struct idem_stalled **out, size_t *n)
{
    static const char sql[] =
        "SELECT principal, operation, idem_key, recovery_point FROM idem_records"
        " WHERE status = 0 AND lease_expires_ms <= ?1 AND (?2 IS NULL OR operation = ?2)"
        " ORDER BY lease_expires_ms LIMIT ?3";
    struct cached_stmt *e = NULL;
    struct idem_stalled *list = NULL;
    size_t count = 0;
    int step;
    int rc = idem__sq_prepare(c, sql, &e);

    *out = NULL;
    *n = 0;
    if (rc < 0)
        return rc;
    if (limit <= 0)
        return 0;
    list = calloc((size_t)limit, sizeof(*list));
    if (!list)
        return IDEM_ENOMEM;
    if (sqlite3_bind_int64(e->stmt, 1, clock_wall_ms()) != SQLITE_OK ||
        (operation ? sqlite3_bind_text(e->stmt, 2, operation, -1, SQLITE_STATIC)
                   : sqlite3_bind_null(e->stmt, 2)) != SQLITE_OK ||
        sqlite3_bind_int(e->stmt, 3, limit) != SQLITE_OK) {
        rc = idem__sq_fail(c, IDEM_ESTORE, "bind");
        goto out;
    }
    while ((step = sqlite3_step(e->stmt)) == SQLITE_ROW && count < (size_t)limit) {
        struct idem_stalled *it = &list[count++];
        it->principal = column_dup(e->stmt, 0);
        it->operation = column_dup(e->stmt, 1);
        it->key = column_dup(e->stmt, 2);
        it->recovery_point = column_dup(e->stmt, 3);
        if (!it->principal || !it->operation || !it->key || !it->recovery_point) {
            rc = IDEM_ENOMEM;
            goto out;
        }
    }
    if (step != SQLITE_DONE && step != SQLITE_ROW)
        rc = idem__sq_fail(c, IDEM_ESTORE, "list stalled records");
out:
    sqlite3_reset(e->stmt);
    if (rc == 0)
        rc = idem__sq_read_gate(c);
    if (rc < 0) {
        idem_stalled_free(list, count);
        return rc;
    }
    *out = list;
    *n = count;
    return 0;
}

/* ---- migrations --------------------------------------------------------------------------- */

static int sq_schema_version(struct idem_conn *c, const char *component, int *version)
{
    static const char sql[] = "SELECT version FROM idem_schema WHERE component = ?1";
    struct cached_stmt *e = NULL;
    int rc, step;

    *version = 0;
    /* Before the first migration there is no table: nothing was migrated. */
    if (sqlite3_table_column_metadata(c->db, "main", "idem_schema", "version", NULL, NULL, NULL,
                                      NULL, NULL) != SQLITE_OK)
        return 0;
    rc = idem__sq_prepare(c, sql, &e);
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(e->stmt, 1, component, -1, SQLITE_STATIC) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    step = sqlite3_step(e->stmt);
    if (step == SQLITE_ROW)
        *version = sqlite3_column_int(e->stmt, 0);
    else if (step != SQLITE_DONE)
        rc = idem__sq_fail(c, IDEM_ESTORE, "read schema version");
    sqlite3_reset(e->stmt);
    return rc;
}

/* The version table made if missing, then the write lock: other migrators wait for our COMMIT. */
static int sq_migrate_begin(struct idem_conn *c)
{
    int rc =
        idem__sq_run_simple(c,
                            "CREATE TABLE IF NOT EXISTS idem_schema (component TEXT PRIMARY KEY,"
                            " version INTEGER NOT NULL, applied_ms INTEGER NOT NULL)",
                            "create schema table");

    return rc < 0 ? rc : idem__sq_run_simple(c, "BEGIN IMMEDIATE", "begin migration");
}

static int sq_run_script(struct idem_conn *c, const char *sql)
{
    return idem__sq_run_simple(c, sql, "migration");
}

static int sq_schema_set(struct idem_conn *c, const char *component, int version)
{
    static const char sql[] =
        "INSERT INTO idem_schema (component, version, applied_ms) VALUES (?1, ?2, ?3)"
        " ON CONFLICT (component) DO UPDATE SET version = excluded.version,"
        " applied_ms = excluded.applied_ms";
    struct cached_stmt *e = NULL;
    int rc = idem__sq_prepare(c, sql, &e);

    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(e->stmt, 1, component, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(e->stmt, 2, version) != SQLITE_OK ||
        sqlite3_bind_int64(e->stmt, 3, clock_wall_ms()) != SQLITE_OK)
        return idem__sq_fail(c, IDEM_ESTORE, "bind");
    return step_done(c, e->stmt, "record migration", NULL);
}

/* Another process's commit cannot be heard here: the engine waits on its own and polls. */
static int sq_wait_change(struct idem_store *st, const struct idem_scope *s, int64_t timeout_ms)
{
    (void)st;
    (void)s;
    (void)timeout_ms;
    return IDEM_EUNAVAIL;
}

static const struct idem_conn_methods sq_conn_methods = {
    .version = IDEM__CONN_V_BASE,
    .conn_close = idem__sq_conn_close,
    .errmsg = sq_errmsg,
    .conn_ok = sq_conn_ok,
    .begin = sq_begin,
    .commit = sq_commit,
    .rollback = sq_rollback,
    .exec = sq_exec,
    .record_insert = sq_record_insert,
    .record_insert_completed = sq_record_insert_completed,
    .record_get = sq_record_get,
    .record_takeover = sq_record_takeover,
    .record_advance = sq_record_advance,
    .record_complete = sq_record_complete,
    .record_release = sq_record_release,
    .record_release_owned = sq_record_release_owned,
    .record_forget = sq_record_forget,
    .record_stalled = sq_record_stalled,
    .record_sweep = sq_record_sweep,
    .migrate_begin = sq_migrate_begin,
    .schema_version = sq_schema_version,
    .run_script = sq_run_script,
    .schema_set = sq_schema_set,
};

const struct idem_store_methods idem__sqlite_methods = {
    .version = IDEM__STORE_V_GROUP_COMMIT,
    .flags = IDEM__STORE_CLAIMS_FIRST,
    .kind = "sqlite",
    .unfinished_sql = IDEM__UNFINISHED_SQL("lower(hex(fingerprint))", "CAST($1 AS INTEGER)"),
    .conn = &sq_conn_methods,
    .conn_open = sq_conn_open,
    .store_close = idem__sq_group_free,
    .wait_change = sq_wait_change,
    .write_run_async = idem__sq_write_run_async,
    .write_begin = idem__sq_write_begin,
    .write_commit = idem__sq_write_commit,
    .write_rollback = idem__sq_write_rollback,
    .write_commit_async = idem__sq_write_commit_async,
    .write_run = idem__sq_write_run,
};
