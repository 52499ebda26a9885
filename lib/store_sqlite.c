/*
 * store_sqlite.c - the SQLite store: one file, zero set-up, the embedded default.
 *
 * Durability is the point: WAL with synchronous=FULL, so a commit is on disk before anyone is told
 * it happened, and kill -9 at any moment leaves a consistent file.  Every write transaction of a
 * process runs on its one writer connection, as a savepoint inside a shared batch transaction
 * (group commit, below): concurrent requests share one fsync, and nobody is answered before the
 * batch holding their work is durable.  Claims run under the batch's write lock (BEGIN IMMEDIATE),
 * so two claimers never both read "absent" and the primary key, not a read, decides who owns a
 * key.  Reads run on pooled connections, each used by one thread at a time, and see committed
 * batches only.  Every connection keeps its prepared statements.  Leases are measured with this
 * machine's wall clock, which every process sharing the file shares too.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sched.h>
#include <stdatomic.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STMT_CACHE 48

struct cached_stmt {
    char *sql;
    sqlite3_stmt *stmt;
    int nmap;
    int *map; /* parameter slot -> index into the caller's params ($k -> k-1) */
    uint64_t used;
};

struct idem_conn {
    sqlite3 *db;
    char errmsg[IDEM_ERRMSG_MAX];
    int broken;
    uint64_t clock;
    struct cached_stmt cache[STMT_CACHE];
};

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
 * What SQLite's message leaves out of a failure to open, read or write a file, after `msg`:
 * the system's reason ("unable to open database file" says nothing of "Permission denied"),
 * and for a read-only database, that SQLite writes two files beside it.
 */
static void describe_failure(sqlite3 *db, const char *target, const char *msg, char *out,
                             size_t outlen)
{
    int primary = sqlite3_extended_errcode(db) & 0xff;
    int sys = sqlite3_system_errno(db);

    if (sys != 0 && (primary == SQLITE_CANTOPEN || primary == SQLITE_IOERR ||
                     primary == SQLITE_READONLY || primary == SQLITE_FULL))
        idem__fmt(out, outlen, "%s (%s)", msg, strerror(sys));
    else
        idem__fmt(out, outlen, "%s", msg);
    if (primary == SQLITE_READONLY || primary == SQLITE_CANTOPEN) {
        size_t n = strlen(out);
        idem__fmt(out + n, outlen - n,
                  "; SQLite needs to write %s, and %s-wal and %s-shm beside it, so their "
                  "directory must be writable too",
                  target, target, target);
    }
}

static int fail(struct idem_conn *c, int rc, const char *what)
{
    int code = sqlite3_extended_errcode(c->db);
    int primary = code & 0xff;
    char msg[IDEM_ERRMSG_MAX];

    idem__fmt(msg, sizeof(msg), "sqlite: %s: %s", what, sqlite3_errmsg(c->db));
    describe_failure(c->db, sqlite3_db_filename(c->db, "main"), msg, c->errmsg,
                     sizeof(c->errmsg));
    if (rc != IDEM_ESTORE)
        return rc;
    if (code == SQLITE_CONSTRAINT_UNIQUE || code == SQLITE_CONSTRAINT_PRIMARYKEY)
        return IDEM_ECONFLICT;
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
        return IDEM_EUNAVAIL;
    if (primary == SQLITE_NOMEM)
        return IDEM_ENOMEM;
    if (primary == SQLITE_IOERR || primary == SQLITE_CORRUPT || primary == SQLITE_CANTOPEN ||
        primary == SQLITE_FULL || primary == SQLITE_NOTADB) {
        c->broken = 1;
        return IDEM_EUNAVAIL;
    }
    return IDEM_ESTORE;
}

static void cache_entry_clear(struct cached_stmt *e)
{
    sqlite3_finalize(e->stmt);
    free(e->sql);
    free(e->map);
    memset(e, 0, sizeof(*e));
}

/*
 * Finds or prepares `sql`.  Parameters are written $1..$n for both stores; SQLite treats "$1" as
 * a named parameter, so each slot is mapped to the caller's index once, at prepare time.
 */
static int prepare(struct idem_conn *c, const char *sql, struct cached_stmt **out)
{
    struct cached_stmt *victim = &c->cache[0];
    struct cached_stmt fresh = {0};
    int rc = IDEM_ESTORE;

    for (int i = 0; i < STMT_CACHE; i++) {
        struct cached_stmt *e = &c->cache[i];
        if (e->sql && strcmp(e->sql, sql) == 0) {
            e->used = ++c->clock;
            sqlite3_reset(e->stmt);
            sqlite3_clear_bindings(e->stmt);
            *out = e;
            return 0;
        }
        if (e->used < victim->used)
            victim = e;
    }
    if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &fresh.stmt, NULL) !=
        SQLITE_OK) {
        rc = fail(c, IDEM_ESTORE, "prepare");
        goto out;
    }
    fresh.nmap = sqlite3_bind_parameter_count(fresh.stmt);
    if (fresh.nmap > 0) {
        fresh.map = calloc((size_t)fresh.nmap, sizeof(int));
        if (!fresh.map) {
            rc = IDEM_ENOMEM;
            goto out;
        }
    }
    for (int i = 0; i < fresh.nmap; i++) {
        const char *name = sqlite3_bind_parameter_name(fresh.stmt, i + 1);
        char *end = NULL;
        /* The store's own statements use ?N, which SQLite binds to slot N directly. */
        if (!name || name[0] == '?') {
            fresh.map[i] = i;
            continue;
        }
        long k = name && name[0] == '$' ? strtol(name + 1, &end, 10) : 0;
        if (k < 1 || !end || *end != '\0') {
            idem__fmt(c->errmsg, sizeof(c->errmsg),
                      "sqlite: parameters must be written $1, $2, ... (got %s)",
                      name ? name : "?");
            rc = IDEM_EINVAL;
            goto out;
        }
        fresh.map[i] = (int)k - 1;
    }
    fresh.sql = idem__strdup(sql);
    if (!fresh.sql) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    cache_entry_clear(victim);
    fresh.used = ++c->clock;
    *victim = fresh;
    memset(&fresh, 0, sizeof(fresh));
    *out = victim;
    rc = 0;
out:
    cache_entry_clear(&fresh);
    return rc;
}

/*
 * Runs `sql` without parameters or rows.  One statement (BEGIN, SAVEPOINT, RELEASE, COMMIT: the
 * ones every write runs) goes through the connection's statement cache, so it is not parsed
 * again each time; a script of several runs through sqlite3_exec().
 */
static int run_simple(struct idem_conn *c, const char *sql, const char *what)
{
    char *err = NULL;
    if (!strchr(sql, ';')) {
        struct cached_stmt *e = NULL;
        int rc = prepare(c, sql, &e);
        if (rc < 0)
            return rc;
        int step = sqlite3_step(e->stmt);
        while (step == SQLITE_ROW) /* a PRAGMA or a migration may answer rows nobody reads */
            step = sqlite3_step(e->stmt);
        if (step != SQLITE_DONE)
            rc = fail(c, IDEM_ESTORE, what);
        sqlite3_reset(e->stmt);
        return rc;
    }
    if (sqlite3_exec(c->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        int rc = fail(c, IDEM_ESTORE, what);
        if (err) {
            char msg[IDEM_ERRMSG_MAX];
            idem__fmt(msg, sizeof(msg), "sqlite: %s: %s", what, err);
            describe_failure(c->db, sqlite3_db_filename(c->db, "main"), msg, c->errmsg,
                             sizeof(c->errmsg));
        }
        sqlite3_free(err);
        return rc;
    }
    return 0;
}

static int sq_migrate(struct idem_conn *c, const char *component,
                      const struct idem_migration *steps, size_t n, int *applied);
static int group_get(struct idem_store *st);

static void sq_close(struct idem_conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < STMT_CACHE; i++)
        cache_entry_clear(&c->cache[i]);
    sqlite3_close_v2(c->db);
    free(c);
}

/*
 * A new database file is created readable by its owner only: it holds token hashes, emails and
 * stored responses.  SQLite gives its -wal and -shm files the database file's mode.  An existing
 * file keeps the mode it has.  Missing directories of its path are made (0755).  Returns 0, or
 * IDEM_EUNAVAIL with why in `err`.
 */
static int create_private(const char *path, char *err, size_t errlen)
{
    char dir[4096];
    int fd;

    if (path[0] == ':' || strncmp(path, "file:", 5) == 0)
        return 0;
    /* Its directories first, as mkdir -p: "sqlite:/var/lib/idem/gateway.db" works as written. */
    if (strlen(path) < sizeof dir) {
        idem__fmt(dir, sizeof dir, "%s", path);
        for (char *p = strchr(dir + 1, '/'); p != NULL; p = strchr(p + 1, '/')) {
            *p = '\0';
            if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                idem__fmt(err, errlen, "sqlite: cannot create the directory %s of %s: %s", dir,
                          path, strerror(errno));
                return IDEM_EUNAVAIL;
            }
            *p = '/';
        }
    }
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
    else if (errno != EEXIST) {
        /* Said here: SQLite would go on to try read-only and report only "unable to open". */
        idem__fmt(err, errlen, "sqlite: cannot create %s: %s", path, strerror(errno));
        return IDEM_EUNAVAIL;
    }
    return 0;
}

/*
 * fsync()s the database's -wal file, the database file and their directory, as far as they exist.
 * A process killed between writing a commit's WAL frames and their fsync leaves those frames in
 * the page cache only: the next process reads them like any commit, so without this it could
 * answer a replay from a record that a power loss would then take back -- and the retry after
 * that would run a second time.  Run when a process opens the store, before anyone reads; once
 * it returns, every commit any process made is durable or gone.  A failed fsync is not retried
 * (the kernel may have dropped the pages it could not write): the store does not open.
 */
static int sync_existing_files(const char *path, char *err, size_t errlen)
{
    static const char *const suffixes[] = {"-wal", ""};
    char name[4096], *slash;
    int fd;

    if (path[0] == ':' || strncmp(path, "file:", 5) == 0 || strlen(path) + 5 > sizeof name)
        return 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        idem__fmt(name, sizeof name, "%s%s", path, suffixes[i]);
        fd = open(name, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT)
            continue;
        if (fd < 0 || fsync(fd) != 0) {
            idem__fmt(err, errlen, "sqlite: cannot make %s durable: %s", name, strerror(errno));
            if (fd >= 0)
                close(fd);
            return IDEM_EUNAVAIL;
        }
        close(fd);
    }
    idem__fmt(name, sizeof name, "%s", path);
    slash = strrchr(name, '/');
    if (slash == name)
        slash[1] = '\0';
    else if (slash != NULL)
        *slash = '\0';
    else
        idem__fmt(name, sizeof name, ".");
    fd = open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && fsync(fd) != 0 && errno != EINVAL) {
        idem__fmt(err, errlen, "sqlite: cannot make the directory %s durable: %s", name,
                  strerror(errno));
        close(fd);
        return IDEM_EUNAVAIL;
    }
    if (fd >= 0)
        close(fd);
    return 0;
}

static int sq_open(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    int rc = IDEM_EUNAVAIL;
    struct idem_conn *c = NULL;
    char pragma[192];
    int first;

    *out = NULL;
    if (create_private(st->target, err, errlen) < 0)
        return IDEM_EUNAVAIL;
    first = group_get(st);
    if (first < 0)
        return IDEM_ENOMEM;
    if (first == 1 && st->opts.sync != IDEM_SYNC_NORMAL &&
        sync_existing_files(st->target, err, errlen) < 0)
        return IDEM_EUNAVAIL;
    c = calloc(1, sizeof(*c));
    if (!c)
        return IDEM_ENOMEM;
    if (sqlite3_open_v2(st->target, &c->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        char msg[IDEM_ERRMSG_MAX];
        idem__fmt(msg, sizeof(msg), "sqlite: cannot open %s: %s", st->target,
                  c->db ? sqlite3_errmsg(c->db) : "out of memory");
        if (c->db)
            describe_failure(c->db, st->target, msg, err, errlen);
        else
            idem__fmt(err, errlen, "%s", msg);
        goto out;
    }
    sqlite3_extended_result_codes(c->db, 1);
    sqlite3_busy_timeout(c->db, st->opts.busy_timeout_ms);
    /*
     * temp_store=MEMORY keeps the savepoint journals of group commit (the pages a savepoint
     * changed, kept so that it alone can roll back) in memory instead of a temporary file:
     * without it every page a transaction touches is written out once more.
     */
    idem__fmt(pragma, sizeof(pragma),
              "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s; PRAGMA foreign_keys=ON;"
              " PRAGMA temp_store=MEMORY;",
              st->opts.sync == IDEM_SYNC_NORMAL ? "NORMAL" : "FULL");
    rc = run_simple(c, pragma, "configure");
    if (rc < 0)
        goto fail_msg;
    rc = sq_migrate(c, "libidem", idem_schema, sizeof(idem_schema) / sizeof(idem_schema[0]),
                    NULL);
    if (rc < 0)
        goto fail_msg;
    *out = c;
    c = NULL;
    rc = 0;
    goto out;
fail_msg:
    idem__fmt(err, errlen, "%s (%s)", c->errmsg, st->target);
    if (rc != IDEM_ENOMEM)
        rc = IDEM_EUNAVAIL;
out:
    sq_close(c);
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
    return run_simple(c, "BEGIN", "begin");
}

static int sq_commit(struct idem_conn *c)
{
    return run_simple(c, "COMMIT", "commit");
}

static int sq_rollback(struct idem_conn *c)
{
    int rc = 0;
    if (!sqlite3_get_autocommit(c->db))
        rc = run_simple(c, "ROLLBACK", "rollback");
    return rc;
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
            return fail(c, IDEM_ESTORE, "bind");
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

    rc = prepare(c, sql, &e);
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
        rc = fail(c, IDEM_ESTORE, "step");
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
    int rc = prepare(c, sql, &e);
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(e->stmt, 1, s->principal, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(e->stmt, 2, s->operation, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(e->stmt, 3, s->key, -1, SQLITE_STATIC) != SQLITE_OK)
        return fail(c, IDEM_ESTORE, "bind");
    *out = e->stmt;
    return 0;
}

/* Steps a statement that returns no rows; *changes gets the rows it changed. */
static int step_done(struct idem_conn *c, sqlite3_stmt *stmt, const char *what, int *changes)
{
    int step = sqlite3_step(stmt);
    int rc = 0;
    if (step != SQLITE_DONE)
        rc = fail(c, IDEM_ESTORE, what);
    else if (changes)
        *changes = sqlite3_changes(c->db);
    sqlite3_reset(stmt);
    return rc;
}

#define SCOPE_WHERE "principal = ?1 AND operation = ?2 AND idem_key = ?3"

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
        " WHERE idem_records.expires_ms <= excluded.created_ms"
        " AND (idem_records.status = 1 OR idem_records.lease_expires_ms <= excluded.created_ms)";
    sqlite3_stmt *stmt = NULL;
    int64_t now = idem__now_ms();
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
        return fail(c, IDEM_ESTORE, "bind");
    rc = step_done(c, stmt, "claim", &changes);
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
    rec->store_now_ms = idem__now_ms();
    step = sqlite3_step(stmt);
    if (step == SQLITE_ROW) {
        const void *fp = sqlite3_column_blob(stmt, 1);
        int64_t expires = sqlite3_column_int64(stmt, 9);
        rec->status = sqlite3_column_int(stmt, 0) == 1 ? IDEM_REC_COMPLETED : IDEM_REC_PROCESSING;
        rec->lease_expires_ms = sqlite3_column_int64(stmt, 5);
        rec->expires_ms = expires;
        rec->created_ms = sqlite3_column_int64(stmt, 10);
        /* Past retention and unprotected, a record is as good as swept: the key is new. */
        rec->found = !(expires <= rec->store_now_ms &&
                       (rec->status == IDEM_REC_COMPLETED ||
                        rec->lease_expires_ms <= rec->store_now_ms));
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
        rc = fail(c, IDEM_ESTORE, "read record");
    }
    sqlite3_reset(stmt);
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
    int64_t now = idem__now_ms();
    int changes = 0;
    int rc = record_stmt(c, sql, s, &stmt);

    *won = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(stmt, 4, owner, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 5, now + lease_ms) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 6, now) != SQLITE_OK ||
        sqlite3_bind_blob(stmt, 7, fp, IDEM_FP_LEN, SQLITE_STATIC) != SQLITE_OK)
        return fail(c, IDEM_ESTORE, "bind");
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
        (data ? sqlite3_bind_text(stmt, 5, data, -1, SQLITE_STATIC)
              : sqlite3_bind_null(stmt, 5)) != SQLITE_OK ||
        sqlite3_bind_int64(stmt, 6, idem__now_ms() + lease_ms) != SQLITE_OK ||
        sqlite3_bind_text(stmt, 7, owner, -1, SQLITE_STATIC) != SQLITE_OK)
        return fail(c, IDEM_ESTORE, "bind");
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
        return fail(c, IDEM_ESTORE, "bind");
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
        return fail(c, IDEM_ESTORE, "bind");
    return step_done(c, stmt, "release lease", NULL);
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
        return fail(c, IDEM_ESTORE, "bind");
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
    int rc = prepare(c, sql, &e);

    *deleted = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_int64(e->stmt, 1, idem__now_ms()) != SQLITE_OK ||
        sqlite3_bind_int(e->stmt, 2, limit) != SQLITE_OK)
        return fail(c, IDEM_ESTORE, "bind");
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
    int rc = prepare(c, sql, &e);

    *out = NULL;
    *n = 0;
    if (rc < 0)
        return rc;
    if (limit <= 0)
        return 0;
    list = calloc((size_t)limit, sizeof(*list));
    if (!list)
        return IDEM_ENOMEM;
    if (sqlite3_bind_int64(e->stmt, 1, idem__now_ms()) != SQLITE_OK ||
        (operation ? sqlite3_bind_text(e->stmt, 2, operation, -1, SQLITE_STATIC)
                   : sqlite3_bind_null(e->stmt, 2)) != SQLITE_OK ||
        sqlite3_bind_int(e->stmt, 3, limit) != SQLITE_OK) {
        rc = fail(c, IDEM_ESTORE, "bind");
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
        rc = fail(c, IDEM_ESTORE, "list stalled records");
out:
    sqlite3_reset(e->stmt);
    if (rc < 0) {
        idem_stalled_free(list, count);
        return rc;
    }
    *out = list;
    *n = count;
    return 0;
}

/* ---- group commit ------------------------------------------------------------------------- */

/*
 * One fsync per transaction caps a durable store at the disk's fsync rate.  So every write
 * transaction of this process runs on one writer connection, as a savepoint inside a batch
 * transaction that many callers share: a caller's work is isolated by its savepoint (a failure
 * rolls back that savepoint only, never its neighbours'), and its commit releases the savepoint
 * into the batch and then waits until the batch is durable -- nobody is answered before the
 * COMMIT that holds their work has returned.  SQLite allows one writer per file at a time anyway,
 * so queueing the writers here costs no concurrency; it only replaces SQLite's sleeping busy
 * handler with a condition variable.
 *
 * Who commits: whoever ends a transaction while nobody waits for the writer (the queue drained),
 * or when the batch reached GROUP_MEMBERS_MAX members or GROUP_AGE_MAX_MS of age.  While one batch
 * is being fsync'd the next callers queue, and they form the next batch.  A member that finds the
 * writer free and its batch still open commits it itself, so a batch is never left waiting.
 */
#define GROUP_MEMBERS_MAX 256
#define GROUP_AGE_MAX_MS 20

/*
 * A transaction given whole (write_run) does not wait for the writer to be handed to it: it
 * queues as a job, and whoever holds the writer runs the queued jobs, each in its own savepoint,
 * before giving the writer up -- so the batch fills without a context switch per member, and
 * the job's thread wakes once, when its batch is durable.  A job whose thread finds the writer
 * free runs the queue itself.
 *
 * A job given without a thread to wait (write_run_async: an event loop's) carries a notice
 * instead, told when its batch ends or it is done.  When such a job heads the queue and the
 * writer is free, the group's runner thread (started on the first such job) takes the writer,
 * runs the queue and commits it: the caller never blocks, and never runs a job itself.
 */
enum sq_job_state {
    JOB_QUEUED,   /* in g->jobs */
    JOB_RUNNING,  /* taken off the queue by the writer's holder */
    JOB_IN_BATCH, /* released into `batch`: done when the batch is */
    JOB_DONE,     /* rolled back or failed: `rc` */
};

struct sq_job {
    struct sq_job *next; /* in g->jobs, then in its batch's jobs */
    idem__tx_fn fn;
    void *arg;
    enum sq_job_state state;
    int rc;
    struct sq_batch *batch;
    pthread_cond_t cv;        /* its thread sleeps on it, woken alone (job_wake_locked) */
    struct sq_job *wake_next; /* in g->wake_jobs */
    int wake_listed;
    _Atomic int wakes_unsent; /* listed wake-ups not yet sent: `cv` must live until they are */
    char errmsg[IDEM_ERRMSG_MAX];
    struct sq_notice *notice; /* write_run_async: told instead of a thread woken (no `cv`) */
    unsigned flags;           /* IDEM__TX_ONE_STATEMENT: no savepoint of its own */
};

/* A member that did not wait (write_commit_async, write_run_async): told when its batch ends. */
struct sq_notice {
    struct sq_notice *next;
    idem__commit_done done;
    void *arg;
    int rc;
    char errmsg[IDEM_ERRMSG_MAX];
};

struct sq_batch {
    int refs; /* members that have not read the outcome yet */
    int done;
    int rc;
    char errmsg[IDEM_ERRMSG_MAX];
    struct sq_notice *notices; /* members that did not wait */
    struct sq_job *jobs;       /* members that are jobs (write_run), each woken alone */
};

struct sq_group {
    struct idem_store *st;    /* the store it belongs to (its stats) */
    pthread_mutex_t mu;
    pthread_cond_t writer_cv; /* signalled (one waiter) when the writer comes free */
    pthread_cond_t batch_cv;  /* broadcast when a batch finished or may need its members (jobs
                                 have a condition variable each instead) */
    struct idem_conn *writer; /* opened on first use, reopened after it broke */
    int busy;                 /* a caller (or a batch commit) holds the writer */
    int waiting;              /* callers queued for the writer */
    int members;              /* savepoints released into the open batch */
    int64_t opened_ms;        /* when the open batch began */
    struct sq_batch *batch;   /* the open batch, NULL when no batch transaction is open */
    struct sq_job *jobs;      /* queued for the writer's holder to run (write_run) */
    struct sq_job **jobs_tail;
    /* Wake-ups decided under mu, sent by group_unlock() once mu is dropped. */
    int wake_writer;
    int wake_batch;
    struct sq_notice *notices; /* of finished batches, sent by group_unlock() likewise */
    struct sq_job *wake_jobs;  /* jobs to wake, likewise */
    int wake_runner;
    /* The runner: runs the queue and commits for jobs that have no thread (write_run_async). */
    pthread_cond_t runner_cv;
    pthread_t runner;
    int runner_started;
    int runner_stop;
};

/*
 * Drops g->mu, then sends the wake-ups decided while it was held.  A thread woken while the
 * waker still holds the mutex only blocks on it again: two context switches instead of one per
 * hand-over, and on a virtual machine a context switch is the dearest thing here.  Signalling
 * after the unlock loses nothing: every waiter re-checks its condition under the mutex.
 */
static void group_unlock(struct sq_group *g)
{
    const int writer = g->wake_writer;
    const int batch = g->wake_batch;
    const int runner = g->wake_runner;
    struct sq_notice *n = g->notices, *next;
    struct sq_job *jobs[32];
    size_t njobs = 0;

    g->wake_writer = 0;
    g->wake_batch = 0;
    g->wake_runner = 0;
    g->notices = NULL;
    /*
     * The jobs to wake are taken off the list here: once g->mu is dropped a job may be listed
     * again (its links are the list's), and once told, be gone.
     */
    while (g->wake_jobs && njobs < sizeof(jobs) / sizeof(jobs[0])) {
        struct sq_job *j = g->wake_jobs;
        g->wake_jobs = j->wake_next;
        j->wake_listed = 0;
        jobs[njobs++] = j;
    }
    pthread_mutex_unlock(&g->mu);
    if (batch)
        pthread_cond_broadcast(&g->batch_cv);
    if (writer)
        pthread_cond_signal(&g->writer_cv);
    if (runner)
        pthread_cond_signal(&g->runner_cv);
    for (size_t i = 0; i < njobs; i++) {
        pthread_cond_signal(&jobs[i]->cv);
        atomic_fetch_sub(&jobs[i]->wakes_unsent, 1); /* `jobs[i]` may be gone after this */
    }
    if (njobs == sizeof(jobs) / sizeof(jobs[0])) { /* more may wait: send them too */
        pthread_mutex_lock(&g->mu);
        group_unlock(g);
    }
    for (; n; n = next) {
        next = n->next;
        if (n->rc == 0) /* a whole transaction of its member's, durable */
            atomic_fetch_add(&g->st->write_commits, 1);
        n->done(n->arg, n->rc, n->rc < 0 ? n->errmsg : NULL);
        free(n);
    }
}

/*
 * Sends the wake-ups and notices decided so far (g->mu held, dropped and taken again) before the
 * caller sleeps: the woken may be the ones it waits for.  Returns 1 if there were any.
 */
static int group_flush_locked(struct sq_group *g)
{
    if (!g->wake_writer && !g->wake_batch && !g->wake_runner && !g->wake_jobs && !g->notices)
        return 0;
    group_unlock(g);
    pthread_mutex_lock(&g->mu);
    return 1;
}

/* Wakes job `j`'s thread once g->mu is dropped (g->mu held). */
static void job_wake_locked(struct sq_group *g, struct sq_job *j)
{
    if (j->wake_listed)
        return;
    j->wake_listed = 1;
    atomic_fetch_add(&j->wakes_unsent, 1);
    j->wake_next = g->wake_jobs;
    g->wake_jobs = j;
}

/* Wakes whoever runs the queue now that the writer is free: its first job's thread, or the runner.
 */
static void queue_wake_locked(struct sq_group *g)
{
    if (!g->jobs)
        return;
    if (g->jobs->notice)
        g->wake_runner = 1;
    else
        job_wake_locked(g, g->jobs);
}

/* Tells an async job's notice that it is done, once g->mu is dropped, and frees the job. */
static void job_notify_locked(struct sq_group *g, struct sq_job *j)
{
    struct sq_notice *n = j->notice;

    n->rc = j->rc;
    if (j->rc < 0)
        idem__fmt(n->errmsg, sizeof(n->errmsg), "%s", j->errmsg);
    n->next = g->notices;
    g->notices = n;
    free(j);
}

static void runner_stop(struct sq_group *g);

static void batch_commit_locked(struct sq_group *g);

static void group_free(struct idem_store *st)
{
    struct sq_group *g = st->backend;

    if (!g)
        return;
    runner_stop(g);
    pthread_mutex_lock(&g->mu);
    if (g->writer && g->batch) {
        g->busy = 1;
        batch_commit_locked(g); /* its members that did not wait are told */
    }
    group_unlock(g);
    if (g->writer) {
        if (!sqlite3_get_autocommit(g->writer->db))
            run_simple(g->writer, "COMMIT", "group commit at close");
        sq_close(g->writer);
    }
    free(g->batch);
    pthread_cond_destroy(&g->writer_cv);
    pthread_cond_destroy(&g->batch_cv);
    pthread_cond_destroy(&g->runner_cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
    st->backend = NULL;
}

/*
 * Made by the first connection (idem_store_open opens one before anyone else may write): 1 when
 * this call made it, 0 when it was there, or an IDEM_E* code.
 */
static int group_get(struct idem_store *st)
{
    int rc = 0;

    pthread_mutex_lock(&st->mu);
    if (!st->backend) {
        struct sq_group *g = calloc(1, sizeof(*g));
        if (!g || pthread_mutex_init(&g->mu, NULL) != 0) {
            free(g);
            rc = IDEM_ENOMEM;
        } else if (pthread_cond_init(&g->writer_cv, NULL) != 0) {
            pthread_mutex_destroy(&g->mu);
            free(g);
            rc = IDEM_ENOMEM;
        } else if (pthread_cond_init(&g->batch_cv, NULL) != 0) {
            pthread_cond_destroy(&g->writer_cv);
            pthread_mutex_destroy(&g->mu);
            free(g);
            rc = IDEM_ENOMEM;
        } else if (pthread_cond_init(&g->runner_cv, NULL) != 0) {
            pthread_cond_destroy(&g->batch_cv);
            pthread_cond_destroy(&g->writer_cv);
            pthread_mutex_destroy(&g->mu);
            free(g);
            rc = IDEM_ENOMEM;
        } else {
            g->st = st;
            g->jobs_tail = &g->jobs;
            st->backend = g;
            rc = 1;
        }
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Ends the open batch with `rc` and wakes its members (g->mu held). */
static void batch_finish_locked(struct sq_group *g, int rc, const char *msg)
{
    struct sq_batch *b = g->batch;

    g->batch = NULL;
    g->members = 0;
    b->done = 1;
    b->rc = rc;
    if (rc < 0)
        idem__fmt(b->errmsg, sizeof(b->errmsg), "%s", msg);
    for (struct sq_job *j = b->jobs; j; j = j->next)
        job_wake_locked(g, j);
    /* Members that did not wait are told once g->mu is dropped (group_unlock). */
    while (b->notices) {
        struct sq_notice *n = b->notices;
        b->notices = n->next;
        n->rc = rc;
        if (rc < 0)
            idem__fmt(n->errmsg, sizeof(n->errmsg), "%s", msg);
        n->next = g->notices;
        g->notices = n;
    }
    if (b->refs == 0)
        free(b);
    g->wake_batch = 1;
}

/* Commits the open batch: the caller holds the writer (busy) and g->mu, dropped during COMMIT. */
static void batch_commit_locked(struct sq_group *g)
{
    struct idem_conn *w = g->writer;
    char msg[IDEM_ERRMSG_MAX] = "";
    int64_t took;
    int rc;

    group_unlock(g);
    took = idem__mono_ns();
    rc = run_simple(w, "COMMIT", "group commit");
    took = idem__mono_ns() - took;
    if (rc < 0) {
        idem__fmt(msg, sizeof(msg), "%s", w->errmsg);
        /* A writer left inside a transaction it cannot end is closed, not reused. */
        if (!sqlite3_get_autocommit(w->db) &&
            (run_simple(w, "ROLLBACK", "rollback failed group commit") < 0 ||
             !sqlite3_get_autocommit(w->db)))
            w->broken = 1;
    }
    pthread_mutex_lock(&g->mu);
    if (rc == 0 && g->members > 0) { /* (a batch of rolled-back savepoints carried nothing) */
        atomic_fetch_add(&g->st->durable_commits, 1);
        atomic_fetch_add(&g->st->durable_commit_ns, (uint64_t)took);
    }
    batch_finish_locked(g, rc, msg);
}

/* With the writer held (g->busy) and g->mu not held: opens the writer and the batch if need be. */
static int writer_ready(struct sq_group *g, char *err, size_t errlen)
{
    int rc = 0;

    if (!g->writer)
        rc = sq_open(g->st, &g->writer, err, errlen);
    if (rc == 0 && !g->batch) {
        struct sq_batch *b = calloc(1, sizeof(*b));
        if (!b)
            rc = IDEM_ENOMEM;
        else if ((rc = run_simple(g->writer, "BEGIN IMMEDIATE", "begin group")) < 0)
            free(b);
        else {
            pthread_mutex_lock(&g->mu);
            g->batch = b;
            g->members = 0;
            g->opened_ms = idem__mono_ms();
            group_unlock(g);
        }
    }
    if (rc < 0 && g->writer && err[0] == '\0')
        idem__fmt(err, errlen, "%s", g->writer->errmsg);
    return rc;
}

/*
 * Runs one job in its own savepoint of the open batch on the writer `w` (held, g->mu not held);
 * a one-statement job (IDEM__TX_ONE_STATEMENT) without one: there is nothing of it to undo.
 */
static void job_run(struct idem_conn *w, struct sq_job *j)
{
    const int own_savepoint = !(j->flags & IDEM__TX_ONE_STATEMENT);
    int rc;

    if (sqlite3_get_autocommit(w->db)) {
        idem__fmt(j->errmsg, sizeof(j->errmsg), "%s",
                  "sqlite: the shared write transaction was rolled back");
        j->rc = IDEM_EUNAVAIL;
        return;
    }
    rc = own_savepoint ? run_simple(w, "SAVEPOINT idem_tx", "begin") : 0;
    if (rc < 0) { /* nothing of it was written */
        idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", w->errmsg);
        j->rc = rc;
        return;
    }
    rc = j->fn(w, j->arg);
    if (rc == 0 && sqlite3_get_autocommit(w->db)) {
        idem__fmt(j->errmsg, sizeof(j->errmsg),
                  "sqlite: the shared write transaction was rolled back: %s", w->errmsg);
        rc = IDEM_EUNAVAIL;
    } else if (rc == 0 && own_savepoint) {
        rc = run_simple(w, "RELEASE idem_tx", "commit");
    }
    if (rc < 0 && j->errmsg[0] == '\0')
        idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", w->errmsg);
    /* Its writes must not commit with the batch: a writer that cannot undo them is broken. */
    if (rc != 0 && own_savepoint && !sqlite3_get_autocommit(w->db) &&
        run_simple(w, "ROLLBACK TO idem_tx; RELEASE idem_tx", "rollback") < 0)
        w->broken = 1;
    j->rc = rc;
}

/*
 * Runs the queued jobs on the writer, which this thread holds (g->mu held, dropped while they
 * run), into the open batch (begun if need be): a job that kept its writes joins the batch, one
 * that rolled back or failed is done.
 */
static void jobs_run_locked(struct sq_group *g)
{
    while (g->jobs && g->members < GROUP_MEMBERS_MAX) {
        struct sq_job *list = g->jobs, *j, *next;
        char err[IDEM_ERRMSG_MAX] = "";
        int rc;

        for (j = list; j; j = j->next)
            j->state = JOB_RUNNING;
        g->jobs = NULL;
        g->jobs_tail = &g->jobs;
        group_unlock(g);
        rc = writer_ready(g, err, sizeof(err));
        for (j = list; j; j = j->next) {
            if (rc == 0 && !g->writer->broken) {
                job_run(g->writer, j);
            } else {
                j->rc = rc < 0 ? rc : IDEM_EUNAVAIL;
                idem__fmt(j->errmsg, sizeof(j->errmsg), "%s",
                          rc < 0 ? err : "sqlite: the writer connection broke");
            }
        }
        pthread_mutex_lock(&g->mu);
        for (j = list; j; j = next) {
            next = j->next;
            if (j->notice && j->rc == 0) {
                /* Its notice is told with the batch's; the job itself is spent. */
                j->notice->next = g->batch->notices;
                g->batch->notices = j->notice;
                g->members++;
                free(j);
            } else if (j->notice) {
                job_notify_locked(g, j);
            } else if (j->rc == 0) {
                j->state = JOB_IN_BATCH;
                j->batch = g->batch;
                j->next = g->batch->jobs;
                g->batch->jobs = j;
                g->batch->refs++;
                g->members++;
            } else {
                j->state = JOB_DONE;
                job_wake_locked(g, j);
            }
        }
        if (rc < 0 || g->writer->broken)
            break; /* the queue waits for the next holder (writer_free_locked wakes it) */
    }
}

/* Wakes a member of the open batch (g->mu held): it may have to commit the batch itself. */
static void batch_poke_locked(struct sq_group *g)
{
    if (g->batch->jobs)
        job_wake_locked(g, g->batch->jobs);
    if (g->batch->notices && g->runner_started)
        g->wake_runner = 1;
    g->wake_batch = 1;
}

/*
 * Marks the writer free (g->mu held) and wakes whoever is to take it next: a caller queued for
 * it, whoever runs the queue (queue_wake_locked), or if nobody queues a member of the open batch
 * (to commit it).
 */
static void writer_free_locked(struct sq_group *g)
{
    g->busy = 0;
    if (g->waiting > 0)
        g->wake_writer = 1;
    queue_wake_locked(g);
    if (g->waiting == 0 && g->batch)
        batch_poke_locked(g);
}

/*
 * Gives the writer up (g->mu held), after running the queued jobs into the batch: a batch that
 * SQLite rolled back by itself fails as a whole; otherwise the batch is committed if the queue
 * drained or it grew full or old.
 */
static void writer_release_locked(struct sq_group *g)
{
    struct idem_conn *w = g->writer;

    if (!w->broken && g->batch && !sqlite3_get_autocommit(w->db))
        jobs_run_locked(g);
    /*
     * A broken writer's batch is never committed (it may hold writes that were to be undone): it
     * fails below, before the writer is closed.
     */
    if (!w->broken && g->batch && sqlite3_get_autocommit(w->db)) {
        char msg[IDEM_ERRMSG_MAX];
        idem__fmt(msg, sizeof(msg), "sqlite: the shared write transaction was rolled back: %s",
                  w->errmsg);
        batch_finish_locked(g, IDEM_EUNAVAIL, msg);
    } else if (!w->broken && g->batch &&
               (g->waiting == 0 || g->members >= GROUP_MEMBERS_MAX ||
                idem__mono_ms() - g->opened_ms >= GROUP_AGE_MAX_MS)) {
        batch_commit_locked(g);
    }
    if (w->broken) {
        if (g->batch)
            batch_finish_locked(g, IDEM_EUNAVAIL, "sqlite: the writer connection broke");
        if (!sqlite3_get_autocommit(w->db))
            run_simple(w, "ROLLBACK", "rollback");
        sq_close(w);
        g->writer = NULL;
    }
    writer_free_locked(g);
}

/*
 * A turn with the free writer (g->mu held): runs the queued jobs when `run_queue`, then gives the
 * writer up, which commits the open batch unless someone queues for the writer.
 */
static void writer_turn_locked(struct sq_group *g, int run_queue)
{
    g->busy = 1;
    if (run_queue)
        jobs_run_locked(g);
    if (g->writer)
        writer_release_locked(g);
    else
        writer_free_locked(g);
}

static int sq_write_begin(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct timespec deadline;
    int rc = 0;

    *out = NULL;
    deadline = idem__deadline_ms(st->opts.busy_timeout_ms);
    pthread_mutex_lock(&g->mu);
    g->waiting++;
    while (g->busy) {
        if (pthread_cond_timedwait(&g->writer_cv, &g->mu, &deadline) == ETIMEDOUT && g->busy) {
            g->waiting--;
            if (g->batch) /* a member may have to commit its batch */
                batch_poke_locked(g);
            group_unlock(g);
            idem__fmt(err, errlen, "sqlite: the writer was not free within %d ms",
                      st->opts.busy_timeout_ms);
            return IDEM_EUNAVAIL;
        }
    }
    g->waiting--;
    g->busy = 1;
    group_unlock(g);

    /* The writer is ours: nobody else touches g->writer until we release it. */
    err[0] = '\0';
    rc = writer_ready(g, err, errlen);
    if (rc == 0)
        rc = run_simple(g->writer, "SAVEPOINT idem_tx", "begin");
    if (rc < 0) {
        if (g->writer && err[0] == '\0')
            idem__fmt(err, errlen, "%s", g->writer->errmsg);
        pthread_mutex_lock(&g->mu);
        if (g->writer)
            writer_release_locked(g);
        else
            writer_free_locked(g);
        group_unlock(g);
        return rc;
    }
    *out = g->writer;
    return 0;
}

_Atomic int idem__sq_fail_next_rollback;

static void sq_write_rollback(struct idem_store *st, struct idem_conn *c)
{
    struct sq_group *g = st->backend;
    int rc;

    if (!sqlite3_get_autocommit(c->db)) {
        rc = atomic_exchange(&idem__sq_fail_next_rollback, 0)
                 ? IDEM_ESTORE
                 : run_simple(c, "ROLLBACK TO idem_tx; RELEASE idem_tx", "rollback");
        /*
         * The caller's writes may still be in the shared batch: it must not commit with the next
         * member.  A broken writer fails its batch, rolls it back and is closed (below).
         */
        if (rc < 0)
            c->broken = 1;
    }
    pthread_mutex_lock(&g->mu);
    writer_release_locked(g);
    group_unlock(g);
}

/*
 * Releases the caller's savepoint into the open batch (both commits begin so).  On failure the
 * savepoint is rolled back, the writer given up, and the reason is in `err`.
 */
static int release_into_batch(struct idem_store *st, struct idem_conn *c, char *err,
                              size_t errlen)
{
    int rc;

    if (sqlite3_get_autocommit(c->db)) {
        idem__fmt(err, errlen, "sqlite: the shared write transaction was rolled back: %s",
                  c->errmsg);
        sq_write_rollback(st, c);
        return IDEM_EUNAVAIL;
    }
    rc = run_simple(c, "RELEASE idem_tx", "commit");
    if (rc < 0) {
        idem__fmt(err, errlen, "%s", c->errmsg);
        sq_write_rollback(st, c);
    }
    return rc;
}

static int sq_write_commit(struct idem_store *st, struct idem_conn *c, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct sq_batch *b;
    int rc;

    rc = release_into_batch(st, c, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&g->mu);
    b = g->batch;
    b->refs++;
    g->members++;
    writer_release_locked(g);
    while (!b->done) {
        if (!g->busy && g->waiting == 0 && g->batch == b) {
            /*
             * The writer is free and nobody queues for it: commit our batch ourselves (with the
             * jobs that queued meanwhile).
             */
            g->busy = 1;
            writer_release_locked(g);
            continue;
        }
        if (group_flush_locked(g))
            continue;
        pthread_cond_wait(&g->batch_cv, &g->mu);
    }
    rc = b->rc;
    if (rc < 0)
        idem__fmt(err, errlen, "%s", b->errmsg);
    if (--b->refs == 0)
        free(b);
    group_unlock(g);
    return rc;
}

/*
 * write_commit without the wait: the savepoint goes into the batch, and `done` is told when the
 * batch ends -- by this thread if the batch commits now (nobody queues for the writer), else by
 * whoever commits it.  The caller is then free to take other work into the next batch.
 */
static int sq_write_commit_async(struct idem_store *st, struct idem_conn *c, idem__commit_done done,
                                 void *arg, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct sq_notice *n;
    int rc;

    n = calloc(1, sizeof(*n));
    if (!n) {
        idem__fmt(err, errlen, "%s", idem_strerror(IDEM_ENOMEM));
        sq_write_rollback(st, c);
        return IDEM_ENOMEM;
    }
    n->done = done;
    n->arg = arg;
    rc = release_into_batch(st, c, err, errlen);
    if (rc < 0) {
        free(n);
        return rc;
    }
    pthread_mutex_lock(&g->mu);
    n->next = g->batch->notices;
    g->batch->notices = n;
    g->members++;
    writer_release_locked(g);
    group_unlock(g);
    return 0;
}

/* Takes a leaving job off the wake-up list (g->mu held): nothing is owed to it any more. */
static void job_forget_locked(struct sq_group *g, struct sq_job *j)
{
    if (!j->wake_listed)
        return;
    for (struct sq_job **pp = &g->wake_jobs; *pp; pp = &(*pp)->wake_next) {
        if (*pp == j) {
            *pp = j->wake_next;
            break;
        }
    }
    j->wake_listed = 0;
    atomic_fetch_sub(&j->wakes_unsent, 1);
}

/* The job's last step, g->mu dropped: waits out a wake-up still being sent to its `cv`. */
static void job_end(struct sq_job *j)
{
    while (atomic_load(&j->wakes_unsent) > 0)
        sched_yield();
    pthread_cond_destroy(&j->cv);
}

static int sq_write_run(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags, char *err,
                        size_t errlen)
{
    struct sq_group *g = st->backend;
    struct timespec deadline = idem__deadline_ms(st->opts.busy_timeout_ms);
    struct sq_job j;
    int rc;

    memset(&j, 0, sizeof(j));
    j.fn = fn;
    j.arg = arg;
    j.flags = flags;
    if (pthread_cond_init(&j.cv, NULL) != 0) {
        idem__fmt(err, errlen, "%s", idem_strerror(IDEM_ENOMEM));
        return IDEM_ENOMEM;
    }
    pthread_mutex_lock(&g->mu);
    *g->jobs_tail = &j;
    g->jobs_tail = &j.next;
    while (j.state != JOB_DONE && !(j.state == JOB_IN_BATCH && j.batch->done)) {
        if (!g->busy && (j.state == JOB_QUEUED ||
                         (j.state == JOB_IN_BATCH && g->waiting == 0 && g->batch == j.batch))) {
            /* The writer is free: run the queue (ours in it), or commit our batch, ourselves. */
            writer_turn_locked(g, j.state == JOB_QUEUED);
            continue;
        }
        if (group_flush_locked(g))
            continue;
        if (j.state != JOB_QUEUED) {
            pthread_cond_wait(&j.cv, &g->mu);
        } else if (pthread_cond_timedwait(&j.cv, &g->mu, &deadline) == ETIMEDOUT &&
                   j.state == JOB_QUEUED) {
            struct sq_job **pp = &g->jobs;
            while (*pp != &j)
                pp = &(*pp)->next;
            *pp = j.next;
            if (g->jobs_tail == &j.next)
                g->jobs_tail = pp;
            if (!g->busy) /* we may have been woken to run the queue: pass it on */
                queue_wake_locked(g);
            job_forget_locked(g, &j);
            group_unlock(g);
            job_end(&j);
            idem__fmt(err, errlen, "sqlite: the writer was not free within %d ms",
                      st->opts.busy_timeout_ms);
            return IDEM_EUNAVAIL;
        }
    }
    if (j.state == JOB_IN_BATCH) {
        rc = j.batch->rc;
        if (rc < 0)
            idem__fmt(err, errlen, "%s", j.batch->errmsg);
        if (--j.batch->refs == 0)
            free(j.batch);
    } else {
        rc = j.rc;
        if (rc < 0)
            idem__fmt(err, errlen, "%s", j.errmsg);
    }
    job_forget_locked(g, &j);
    group_unlock(g);
    job_end(&j);
    if (rc == 0)
        atomic_fetch_add(&st->write_commits, 1);
    return rc;
}

/*
 * The runner (write_run_async): while the writer is free, runs the queued jobs and commits the
 * open batch its notices wait for; otherwise sleeps until queue_wake_locked() or
 * batch_poke_locked() call it.  At the store's close it leaves once nothing is queued.
 */
static void *runner_main(void *arg)
{
    struct sq_group *g = arg;

    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (!g->busy && (g->jobs || (g->batch && g->batch->notices && g->waiting == 0))) {
            writer_turn_locked(g, g->jobs != NULL);
            continue;
        }
        if (group_flush_locked(g))
            continue;
        if (g->runner_stop && !g->jobs) /* (a holder may be about to hand the queue over) */
            break;
        pthread_cond_wait(&g->runner_cv, &g->mu);
    }
    group_unlock(g);
    return NULL;
}

static void runner_stop(struct sq_group *g)
{
    int started;

    pthread_mutex_lock(&g->mu);
    g->runner_stop = 1;
    started = g->runner_started;
    g->wake_runner = started;
    group_unlock(g);
    if (started)
        pthread_join(g->runner, NULL);
}

/*
 * write_run without a waiting thread: the job is queued with a notice, and `done` is told by
 * whoever ran it (the writer's holder, or the runner) once its batch ends, or at once when it
 * rolled back or failed -- never by this thread.
 */
static int sq_write_run_async(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags,
                              idem__commit_done done, void *done_arg, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct sq_job *j = calloc(1, sizeof(*j));
    struct sq_notice *n = calloc(1, sizeof(*n));
    const char *why = idem_strerror(IDEM_ENOMEM);
    int rc = IDEM_ENOMEM;

    if (!j || !n)
        goto fail;
    j->fn = fn;
    j->arg = arg;
    j->flags = flags;
    j->notice = n;
    n->done = done;
    n->arg = done_arg;
    pthread_mutex_lock(&g->mu);
    if (g->runner_stop) {
        rc = IDEM_EUNAVAIL;
        why = "sqlite: the store is closing";
        goto unlock_fail;
    }
    if (!g->runner_started) {
        if (pthread_create(&g->runner, NULL, runner_main, g) != 0) {
            why = "sqlite: cannot start the store's runner thread";
            goto unlock_fail;
        }
        g->runner_started = 1;
    }
    *g->jobs_tail = j;
    g->jobs_tail = &j->next;
    if (!g->busy && g->jobs == j) /* else the writer's holder, or whoever is woken, runs it */
        g->wake_runner = 1;
    group_unlock(g);
    return 0;
unlock_fail:
    pthread_mutex_unlock(&g->mu);
fail:
    free(j);
    free(n);
    idem__fmt(err, errlen, "%s", why);
    return rc;
}

/* ---- migrations --------------------------------------------------------------------------- */

static int schema_version(struct idem_conn *c, const char *component, int *version)
{
    static const char sql[] = "SELECT version FROM idem_schema WHERE component = ?1";
    struct cached_stmt *e = NULL;
    int rc = prepare(c, sql, &e);
    int step;

    *version = 0;
    if (rc < 0)
        return rc;
    if (sqlite3_bind_text(e->stmt, 1, component, -1, SQLITE_STATIC) != SQLITE_OK)
        return fail(c, IDEM_ESTORE, "bind");
    step = sqlite3_step(e->stmt);
    if (step == SQLITE_ROW)
        *version = sqlite3_column_int(e->stmt, 0);
    else if (step != SQLITE_DONE)
        rc = fail(c, IDEM_ESTORE, "read schema version");
    sqlite3_reset(e->stmt);
    return rc;
}

static int sq_migrate(struct idem_conn *c, const char *component,
                      const struct idem_migration *steps, size_t n, int *applied)
{
    static const char set_sql[] =
        "INSERT INTO idem_schema (component, version, applied_ms) VALUES (?1, ?2, ?3)"
        " ON CONFLICT (component) DO UPDATE SET version = excluded.version,"
        " applied_ms = excluded.applied_ms";
    int rc = 0;
    int count = 0;
    int version = 0;

    rc = run_simple(c,
                    "CREATE TABLE IF NOT EXISTS idem_schema (component TEXT PRIMARY KEY,"
                    " version INTEGER NOT NULL, applied_ms INTEGER NOT NULL)",
                    "create schema table");
    if (rc < 0)
        goto out;
    rc = schema_version(c, component, &version);
    if (rc < 0 || n == 0 || version >= steps[n - 1].version)
        goto out;

    for (size_t i = 0; i < n; i++) {
        struct cached_stmt *e = NULL;
        /* The write lock serialises processes starting at once; re-read under it. */
        rc = run_simple(c, "BEGIN IMMEDIATE", "begin migration");
        if (rc < 0)
            goto out;
        rc = schema_version(c, component, &version);
        if (rc < 0 || version >= steps[i].version) {
            sq_rollback(c);
            if (rc < 0)
                goto out;
            continue;
        }
        if (!steps[i].sqlite_sql) {
            idem__fmt(c->errmsg, sizeof(c->errmsg), "migration %s %d has no SQLite form",
                      component, steps[i].version);
            rc = IDEM_EMIGRATE;
        }
        if (rc == 0)
            rc = run_simple(c, steps[i].sqlite_sql, "migration");
        if (rc == 0)
            rc = prepare(c, set_sql, &e);
        if (rc == 0) {
            if (sqlite3_bind_text(e->stmt, 1, component, -1, SQLITE_STATIC) != SQLITE_OK ||
                sqlite3_bind_int(e->stmt, 2, steps[i].version) != SQLITE_OK ||
                sqlite3_bind_int64(e->stmt, 3, idem__now_ms()) != SQLITE_OK)
                rc = fail(c, IDEM_ESTORE, "bind");
        }
        if (rc == 0)
            rc = step_done(c, e->stmt, "record migration", NULL);
        if (rc == 0)
            rc = sq_commit(c);
        if (rc < 0) {
            char msg[IDEM_ERRMSG_MAX];
            idem__fmt(msg, sizeof(msg), "%s %d (%s): %s", component, steps[i].version,
                      steps[i].name ? steps[i].name : "", c->errmsg);
            idem__fmt(c->errmsg, sizeof(c->errmsg), "%s", msg);
            sq_rollback(c);
            rc = IDEM_EMIGRATE;
            goto out;
        }
        count++;
    }
out:
    if (applied)
        *applied = count;
    return rc;
}

const struct idem_store_vtab idem__sqlite_vtab = {
    .kind = "sqlite",
    .claim_before_read = 1,
    .conn_open = sq_open,
    .conn_close = sq_close,
    .errmsg = sq_errmsg,
    .conn_ok = sq_conn_ok,
    .begin = sq_begin,
    .commit = sq_commit,
    .rollback = sq_rollback,
    .exec = sq_exec,
    .record_insert = sq_record_insert,
    .record_get = sq_record_get,
    .record_takeover = sq_record_takeover,
    .record_advance = sq_record_advance,
    .record_complete = sq_record_complete,
    .record_release = sq_record_release,
    .record_forget = sq_record_forget,
    .record_sweep = sq_record_sweep,
    .record_stalled = sq_record_stalled,
    .migrate = sq_migrate,
    .write_begin = sq_write_begin,
    .write_commit = sq_write_commit,
    .write_rollback = sq_write_rollback,
    .write_commit_async = sq_write_commit_async,
    .write_run = sq_write_run,
    .write_run_async = sq_write_run_async,
    .store_close = group_free,
};
