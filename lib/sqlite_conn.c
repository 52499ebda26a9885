/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sqlite_conn.c - one connection to the SQLite store's file: opened and configured, its prepared
 * statements, and its failures said and mapped to IDEM_E* codes.
 *
 *     store_sqlite.c       the store's tables: records, migrations, reads on pooled connections
 *        |       |
 *        |       v
 *        |    sqlite_commit.c    the group commit: the writer, batches, syncer, read gate
 *        |       |
 *        v       v
 *     sqlite_conn.c        a connection: opened and configured, its statements, its errors
 *        |
 *        v
 *     libsqlite3           (which the two above call too, for what is SQLite's alone to say)
 *
 * The bottom layer, as SQLite's pager sits under its b-tree: the store's pooled connections and
 * the group commit's writer are both connections like this one, so what makes a connection lives
 * here, below both, and calls neither.  It knows no table of the store's and no transaction of
 * the group's: the SQL it runs is what its caller hands it, and the pragmas that make every
 * connection alike.
 */
#include "sqlite_conn.h"
#include "clock.h" /* common/clock.h: the pauses of configure() */

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int idem__sq_fail(struct idem_conn *c, int rc, const char *what)
{
    int code = sqlite3_extended_errcode(c->db);
    int primary = code & 0xff;
    char msg[IDEM_ERRMSG_MAX];

    idem__fmt(msg, sizeof(msg), "sqlite: %s: %s", what, sqlite3_errmsg(c->db));
    describe_failure(c->db, sqlite3_db_filename(c->db, "main"), msg, c->errmsg, sizeof(c->errmsg));
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
int idem__sq_prepare(struct idem_conn *c, const char *sql, struct cached_stmt **out)
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
        rc = idem__sq_fail(c, IDEM_ESTORE, "prepare");
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
                      "sqlite: parameters must be written $1, $2, ... (got %s)", name ? name : "?");
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
int idem__sq_run_simple(struct idem_conn *c, const char *sql, const char *what)
{
    char *err = NULL;
    if (!strchr(sql, ';')) {
        struct cached_stmt *e = NULL;
        int rc = idem__sq_prepare(c, sql, &e);
        if (rc < 0)
            return rc;
        int step = sqlite3_step(e->stmt);
        while (step == SQLITE_ROW) /* a PRAGMA or a migration may answer rows nobody reads */
            step = sqlite3_step(e->stmt);
        if (step != SQLITE_DONE)
            rc = idem__sq_fail(c, IDEM_ESTORE, what);
        sqlite3_reset(e->stmt);
        return rc;
    }
    if (sqlite3_exec(c->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        int rc = idem__sq_fail(c, IDEM_ESTORE, what);
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

void idem__sq_conn_close(struct idem_conn *c)
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
 * Runs the pragmas a connection opens with.  Switching a new file to WAL takes its exclusive
 * lock, and when connections of several processes switch it together SQLite refuses some of them
 * at once rather than call the busy handler (waiting could deadlock them); so a busy refusal is
 * tried again, with growing pauses, until the store's busy timeout.
 */
static int configure(struct idem_conn *c, const char *pragma, int timeout_ms)
{
    int64_t deadline = clock_mono_ms() + timeout_ms;
    int64_t pause_ms = 1;
    int rc;

    while ((rc = idem__sq_run_simple(c, pragma, "configure")) < 0 &&
           (sqlite3_extended_errcode(c->db) & 0xff) == SQLITE_BUSY &&
           clock_mono_ms() + pause_ms < deadline) {
        clock_sleep_ms(pause_ms);
        pause_ms = pause_ms < 32 ? pause_ms * 2 : pause_ms;
    }
    return rc;
}

int idem__sq_conn_open(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    int rc = IDEM_EUNAVAIL;
    struct idem_conn *c = NULL;
    char pragma[192];
    int persist = 1;

    *out = NULL;
    if (create_private(st->target, err, errlen) < 0)
        return IDEM_EUNAVAIL;
    c = calloc(1, sizeof(*c));
    if (!c)
        return IDEM_ENOMEM;
    c->st = st;
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
    rc = configure(c, pragma, st->opts.busy_timeout_ms);
    if (rc < 0)
        goto fail_msg;
    /*
     * The WAL stays when the last connection closes (it is checkpointed and truncated, not
     * deleted): the syncer fsyncs it through a descriptor of its own, which a new WAL, a new
     * inode, would leave behind (sqlite_commit.c, wal_follow, checks it anyway).
     */
    if (sqlite3_file_control(c->db, "main", SQLITE_FCNTL_PERSIST_WAL, &persist) != SQLITE_OK &&
        st->target[0] != ':' && strncmp(st->target, "file:", 5) != 0) {
        rc = IDEM_ESTORE;
        idem__fmt(c->errmsg, sizeof(c->errmsg), "%s", "sqlite: cannot keep the WAL file");
        goto fail_msg;
    }
    *out = c;
    c = NULL;
    rc = 0;
    goto out;
fail_msg:
    idem__fmt(err, errlen, "%s (%s)", c->errmsg, st->target);
    if (rc != IDEM_ENOMEM)
        rc = IDEM_EUNAVAIL;
out:
    idem__sq_conn_close(c);
    return rc;
}
