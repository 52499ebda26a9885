/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sqlite_conn.h - one connection to the SQLite store's file, the layer both of the store's upper
 * files stand on (sqlite_conn.c says why it is a layer of its own):
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
 * Nothing else in the library includes it; the engine sees the store only through its tables
 * (store_sqlite.c).
 */
#ifndef IDEM_SQLITE_CONN_H
#define IDEM_SQLITE_CONN_H

#include "internal.h"

#include <sqlite3.h>
#include <stdint.h>

#define STMT_CACHE 48

/* A prepared statement the connection keeps (idem__sq_prepare). */
struct cached_stmt {
    char *sql;
    sqlite3_stmt *stmt;
    int nmap;
    int *map; /* parameter slot -> index into the caller's params ($k -> k-1) */
    uint64_t used;
};

struct idem_conn {
    sqlite3 *db;
    struct idem_store *st; /* the store it belongs to */
    int writer;            /* the group's writer (its reads are gated by its batch) */
    char errmsg[IDEM_ERRMSG_MAX];
    int broken; /* a failure of the file or the disk: never lent again (idem__sq_fail) */
    /*
     * A pooled connection's read transaction: whether it has its snapshot yet, and the shared
     * `started` mark read once it had: the group commit's read gate (sqlite_commit.c) keeps them,
     * and the store clears snap_marked when such a transaction begins or ends.
     */
    int snap_marked;
    uint64_t snap_seen;
    uint64_t clock;
    struct cached_stmt cache[STMT_CACHE];
};

/*
 * Opens a new connection to st->target and configures it; closed with idem__sq_conn_close.  A
 * file that is missing is made readable by its owner only, with the directories of its path.  The
 * connection promises: extended result codes; st->opts.busy_timeout_ms as its busy timeout;
 * journal_mode=WAL; synchronous=FULL, or NORMAL when st->opts.sync is IDEM_SYNC_NORMAL;
 * foreign_keys=ON; temp_store=MEMORY; and a WAL kept when it closes (SQLITE_FCNTL_PERSIST_WAL, for
 * a plain file).  No schema is applied.  Returns 0, or IDEM_EUNAVAIL (IDEM_ENOMEM) with why in
 * `err`.
 */
int idem__sq_conn_open(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen);
/* Finalizes its statements and closes it; NULL is a no-op. */
void idem__sq_conn_close(struct idem_conn *c);

/*
 * Runs `sql` (no parameters, no rows read; one statement, or a script of several separated by
 * ';'): 0, or an IDEM_E* code (idem__sq_fail's) with why in c->errmsg.
 */
int idem__sq_run_simple(struct idem_conn *c, const char *sql, const char *what);

/*
 * Finds `sql` among the connection's statements, or prepares and keeps it: *out is borrowed,
 * reset and unbound, valid until the next idem__sq_prepare on `c`.  Parameters are written ?N
 * (bound by number) or $N (mapped to the caller's index N-1 in e->map); any other name is
 * IDEM_EINVAL.  Returns 0 or IDEM_E*, why in c->errmsg.
 */
int idem__sq_prepare(struct idem_conn *c, const char *sql, struct cached_stmt **out);

/*
 * Says why the last call on `c` failed, in c->errmsg ("sqlite: <what>: <SQLite's words>", and
 * the system's reason for a file that cannot be opened, read or written), and maps it to an
 * IDEM_E* code.  An `rc` other than IDEM_ESTORE is returned as it is.  For IDEM_ESTORE, SQLite's
 * code decides: a unique or primary key violation is IDEM_ECONFLICT; busy or locked is
 * IDEM_EUNAVAIL; out of memory is IDEM_ENOMEM; an I/O error, a corrupt file, a file that cannot
 * be opened, a full disk or a file that is not a database is IDEM_EUNAVAIL and marks the
 * connection broken; anything else stays IDEM_ESTORE.
 */
int idem__sq_fail(struct idem_conn *c, int rc, const char *what);

#endif /* IDEM_SQLITE_CONN_H */
