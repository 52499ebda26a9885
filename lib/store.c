/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store.c - what every store shares: picking the backend from a URI, and the transaction handle
 * the application runs its own SQL through, over a connection of the store's bounded pool
 * (pool.c).
 *
 * Layer: the top of the stores, under the engine.  It names each backend's table
 * (idem__sqlite_methods, idem__pg_methods) and calls the pool below it; no backend names anything
 * of this file's, and it knows nothing of a backend's own machinery (the PostgreSQL store's batcher
 * is made and stopped by that store).
 */
#include "internal.h"
#include "ascii.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

struct idem_tx {
    struct idem_store *st;
    struct idem_conn *conn;
    int grouped; /* a savepoint on the store's writer (group commit), not a pooled connection */
    int lent;    /* over a job's connection (idem__tx_lend): its runner ends the transaction */
    int write;
    /* ROLLBACK TO statements the application ran: the engine asks whether a stage survived. */
    unsigned rollbacks;
    char errmsg[IDEM_ERRMSG_MAX];
};

static void set_errmsg(char **errmsg, const char *msg)
{
    if (errmsg)
        *errmsg = idem__strdup(msg);
}

/*
 * A PostgreSQL target: a postgresql:// or postgres:// URI, or a libpq key=value string, which
 * starts with a keyword and '=' ("host=db port=5432 dbname=x").  SQLite URIs were tried first.
 */
static int is_pg_target(const char *uri)
{
    const char *p = uri;

    if (strncmp(uri, "postgresql://", 13) == 0 || strncmp(uri, "postgres://", 11) == 0)
        return 1;
    while (*p == ' ' || *p == '\t')
        p++;
    if (!((*p >= 'a' && *p <= 'z') || *p == '_'))
        return 0;
    while ((*p >= 'a' && *p <= 'z') || *p == '_')
        p++;
    while (*p == ' ' || *p == '\t')
        p++;
    return *p == '=';
}

int idem_store_open(const char *uri, const struct idem_store_options *opts, struct idem_store **out,
                    char **errmsg)
{
    int rc = 0;
    struct idem_store *st = NULL;
    struct idem_conn *conn = NULL;
    char err[IDEM_ERRMSG_MAX] = "";

    if (errmsg)
        *errmsg = NULL;
    if (!out || !uri) {
        set_errmsg(errmsg, "store URI missing");
        return IDEM_EINVAL;
    }
    *out = NULL;
    st = calloc(1, sizeof(*st));
    if (!st) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    if (pthread_mutex_init(&st->mu, NULL) != 0 || pthread_cond_init(&st->cv, NULL) != 0) {
        free(st);
        st = NULL;
        rc = IDEM_ENOMEM;
        goto out;
    }
    if (opts)
        st->opts = *opts;
    if (st->opts.pool_size <= 0)
        st->opts.pool_size = 8;
    if (st->opts.busy_timeout_ms <= 0)
        st->opts.busy_timeout_ms = 5000;

    if (strncmp(uri, "sqlite:", 7) == 0) {
        const char *path = uri + 7;
        /* "sqlite:///abs/path" and "sqlite://rel" are accepted as well as "sqlite:path". */
        if (strncmp(path, "//", 2) == 0)
            path += 2;
        if (*path == '\0') {
            idem__fmt(err, sizeof(err), "store URI \"sqlite:\" names no file");
            rc = IDEM_EURI;
            goto out;
        }
        st->m = &idem__sqlite_methods;
        st->cm = idem__sqlite_methods.conn;
        st->target = idem__strdup(path);
    } else if (is_pg_target(uri)) {
        st->m = &idem__pg_methods;
        st->cm = idem__pg_methods.conn;
        st->target = idem__strdup(uri);
    } else {
        idem__fmt(err, sizeof(err),
                  "store URI must be \"sqlite:PATH\", \"postgresql://...\" or libpq"
                  " \"key=value ...\" (e.g. sqlite:./var/orderd.db)");
        rc = IDEM_EURI;
        goto out;
    }
    if (!st->target) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    st->idle = calloc((size_t)st->opts.pool_size, sizeof(*st->idle));
    if (!st->idle) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    /* The first connection proves the store answers and applies libidem's schema. */
    rc = st->m->conn_open(st, &conn, err, sizeof(err));
    if (rc < 0)
        goto out;
    st->idle[st->nidle++] = conn;
    st->nopen = 1;
    conn = NULL;
    *out = st;
    st = NULL;
out:
    if (rc < 0)
        set_errmsg(errmsg, err[0] ? err : idem_strerror(rc));
    idem_store_close(st);
    return rc;
}

void idem_store_close(struct idem_store *st)
{
    if (!st)
        return;
    if (st->m)
        st->m->store_close(st);
    for (int i = 0; i < st->nidle; i++)
        st->cm->conn_close(st->idle[i]);
    free(st->idle);
    free(st->target);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

const char *idem_store_kind(const struct idem_store *st)
{
    return st && st->m ? st->m->kind : "none";
}

const char *idem_store_sqlite_path(const struct idem_store *st)
{
    return st && st->m == &idem__sqlite_methods ? st->target : NULL;
}

void idem_store_stats(const struct idem_store *st, struct idem_store_stats *out)
{
    if (!out)
        return;
    out->write_commits = st ? atomic_load(&st->write_commits) : 0;
    out->durable_commits = st ? atomic_load(&st->durable_commits) : 0;
    out->durable_commit_ns = st ? atomic_load(&st->durable_commit_ns) : 0;
    out->writer_busy_ns = st ? atomic_load(&st->writer_busy_ns) : 0;
    out->round_trips = st ? atomic_load(&st->round_trips) : 0;
}

int idem_store_migrate(struct idem_store *st, const char *component,
                       const struct idem_migration *steps, size_t n, int *applied, char **errmsg)
{
    int rc = 0;
    int count = 0;
    struct idem_conn *conn = NULL;
    char err[IDEM_ERRMSG_MAX] = "";

    if (errmsg)
        *errmsg = NULL;
    if (applied)
        *applied = 0;
    if (!st || !component || (n > 0 && !steps))
        return IDEM_EINVAL;
    for (size_t i = 1; i < n; i++) {
        if (steps[i].version <= steps[i - 1].version) {
            set_errmsg(errmsg, "migration versions must ascend");
            return IDEM_EINVAL;
        }
    }
    rc = idem__store_get(st, &conn, err, sizeof(err));
    if (rc < 0)
        goto out;
    rc = idem__migrate(st->m, conn, component, steps, n, &count, err, sizeof(err));
out:
    idem__store_put(st, conn);
    if (applied)
        *applied = count;
    if (rc < 0)
        set_errmsg(errmsg, err[0] ? err : idem_strerror(rc));
    return rc;
}

/* ---- transactions ----------------------------------------------------------------------- */

int idem_tx_begin(struct idem_store *st, int write, struct idem_tx **out)
{
    int rc = 0;
    struct idem_tx *tx = NULL;

    if (!st || !out)
        return IDEM_EINVAL;
    *out = NULL;
    tx = calloc(1, sizeof(*tx));
    if (!tx)
        return IDEM_ENOMEM;
    tx->st = st;
    tx->write = write;
    if (write && st->m->version >= IDEM__STORE_V_GROUP_COMMIT) {
        rc = st->m->write_begin(st, &tx->conn, tx->errmsg, sizeof(tx->errmsg));
        if (rc < 0) {
            free(tx);
            return rc;
        }
        tx->grouped = 1;
        *out = tx;
        return 0;
    }
    rc = idem__store_get(st, &tx->conn, tx->errmsg, sizeof(tx->errmsg));
    if (rc < 0)
        goto out;
    rc = st->cm->begin(tx->conn, write);
    if (rc < 0)
        goto out;
    *out = tx;
    tx = NULL;
out:
    if (tx) {
        idem__store_put(st, tx->conn);
        free(tx);
    }
    return rc;
}

int idem__tx_lend(struct idem_store *st, struct idem_conn *c, struct idem_tx **out)
{
    struct idem_tx *tx = calloc(1, sizeof(*tx));

    *out = tx;
    if (!tx)
        return IDEM_ENOMEM;
    tx->st = st;
    tx->conn = c;
    tx->write = 1;
    tx->lent = 1;
    return 0;
}

int idem_tx_commit(struct idem_tx *tx)
{
    return idem__tx_commit_err(tx, NULL, 0);
}

int idem__tx_commit_err(struct idem_tx *tx, char *err, size_t errlen)
{
    int64_t t0;
    int rc;

    if (!tx)
        return IDEM_EINVAL;
    if (tx->lent) {
        idem__fmt(tx->errmsg, sizeof(tx->errmsg), "%s", "the store's job commits this transaction");
        if (err)
            idem__fmt(err, errlen, "%s", tx->errmsg);
        free(tx);
        return IDEM_ESTATE;
    }
    if (tx->grouped) {
        rc = tx->st->m->write_commit(tx->st, tx->conn, tx->errmsg, sizeof(tx->errmsg));
        if (rc == 0)
            atomic_fetch_add(&tx->st->write_commits, 1);
        else if (err)
            idem__fmt(err, errlen, "%s", tx->errmsg);
        free(tx);
        return rc;
    }
    t0 = tx->write ? clock_mono_ns() : 0;
    rc = tx->st->cm->commit(tx->conn);
    if (rc == 0 && tx->write)
        idem__store_count_commit(tx->st, 1, t0); /* its commit is its durable commit */
    if (rc < 0 && err)
        idem__fmt(err, errlen, "%s", tx->st->cm->errmsg(tx->conn));
    if (rc < 0)
        tx->st->cm->rollback(tx->conn);
    idem__store_put(tx->st, tx->conn);
    free(tx);
    return rc;
}

int idem__tx_commit_async(struct idem_tx *tx, struct idem__job_slot *slot, idem__commit_done done,
                          void *arg, char *err, size_t errlen)
{
    int rc;

    if (!tx || !done)
        return IDEM_EINVAL;
    if (tx->grouped) {
        /* (the store counts it in write_commits once it is durable) */
        rc = tx->st->m->write_commit_async(tx->st, tx->conn, slot, done, arg, err, errlen);
        free(tx);
        return rc;
    }
    rc = idem_tx_commit(tx);
    if (rc < 0) {
        idem__fmt(err, errlen, "%s", idem_strerror(rc));
        return rc;
    }
    done(arg, 0, NULL);
    return 0;
}

int idem__tx_run(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags, char *err,
                 size_t errlen)
{
    struct idem_tx *tx = NULL;
    int rc;

    if (st->m->version >= IDEM__STORE_V_GROUP_COMMIT)
        return st->m->write_run(st, fn, arg, flags, err, errlen);
    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0) {
        idem__fmt(err, errlen, "cannot begin a write transaction: %s", idem_strerror(rc));
        return rc;
    }
    if (st->cm->version >= IDEM__CONN_V_COMMIT_CHECKS)
        st->cm->whole_tx(tx->conn);
    rc = fn(tx->conn, arg);
    if (rc == 0)
        return idem__tx_commit_err(tx, err, errlen);
    if (rc < 0)
        idem__fmt(err, errlen, "%s", st->cm->errmsg(tx->conn));
    idem_tx_rollback(tx);
    return rc;
}

int idem__tx_runs_async(const struct idem_store *st)
{
    return st->m->version >= IDEM__STORE_V_RUN_ASYNC;
}

int idem__tx_run_async(struct idem_store *st, struct idem__job_slot *slot, idem__tx_fn fn,
                       void *arg, unsigned flags, idem__commit_done done, void *done_arg, char *err,
                       size_t errlen)
{
    if (!idem__tx_runs_async(st)) {
        idem__fmt(err, errlen, "%s", "this store cannot run a transaction without waiting");
        return IDEM_EINVAL;
    }
    return st->m->write_run_async(st, slot, fn, arg, flags, done, done_arg, err, errlen);
}

int idem_tx_rollback(struct idem_tx *tx)
{
    int rc = 0;

    if (!tx)
        return 0;
    if (tx->lent)
        ; /* the job's runner rolls back what the job wrote when it fails */
    else if (tx->grouped)
        rc = tx->st->m->write_rollback(tx->st, tx->conn);
    else {
        /* A read gate's IDEM_EUNAVAIL is the answer: what was read is not vouched for. */
        rc = tx->st->cm->rollback(tx->conn);
        idem__store_put(tx->st, tx->conn);
    }
    free(tx);
    return rc == IDEM_EUNAVAIL ? rc : 0;
}

/* Whether `sql` begins with the keyword ROLLBACK (inside a transaction: ROLLBACK TO ...). */
static int is_rollback(const char *sql)
{
    while (*sql == ' ' || *sql == '\t' || *sql == '\n' || *sql == '\r')
        sql++;
    return ascii_ncaseeq(sql, "ROLLBACK", 8) &&
           (sql[8] == '\0' || sql[8] == ' ' || sql[8] == '\t' || sql[8] == '\n' || sql[8] == '\r' ||
            sql[8] == ';');
}

/* Whether a statement's arguments are unusable (idem_tx_exec and idem_tx_exec_deferred). */
static int stmt_args_bad(const struct idem_tx *tx, const char *sql, int nparams,
                         const char *const *params)
{
    return !tx || !sql || nparams < 0 || (nparams > 0 && !params);
}

/* Keeps the connection's message of a failed statement in `tx` (idem_tx_errmsg); returns rc. */
static int stmt_ended(struct idem_tx *tx, int rc)
{
    if (rc < 0)
        idem__fmt(tx->errmsg, sizeof(tx->errmsg), "%s", tx->st->cm->errmsg(tx->conn));
    return rc;
}

int idem_tx_exec(struct idem_tx *tx, const char *sql, int nparams, const char *const *params,
                 struct idem_rows **rows)
{
    int rc;

    if (rows)
        *rows = NULL;
    if (stmt_args_bad(tx, sql, nparams, params))
        return IDEM_EINVAL;
    rc = stmt_ended(tx, tx->st->cm->exec(tx->conn, sql, nparams, params, rows));
    /* Counted whatever it returned: a failed one may still have undone something. */
    if (is_rollback(sql))
        tx->rollbacks++;
    return rc;
}

int idem_tx_exec_deferred(struct idem_tx *tx, const char *sql, int nparams,
                          const char *const *params)
{
    if (stmt_args_bad(tx, sql, nparams, params))
        return IDEM_EINVAL;
    if (tx->st->cm->version < IDEM__CONN_V_EXEC_DEFERRED)
        return 0;
    return stmt_ended(tx, tx->st->cm->exec_deferred(tx->conn, sql, nparams, params));
}

unsigned idem__tx_rollbacks(const struct idem_tx *tx)
{
    return tx->rollbacks;
}

const char *idem_tx_errmsg(const struct idem_tx *tx)
{
    return tx ? tx->errmsg : "no transaction";
}

/* The engine runs record functions on the connection of the phase's transaction. */
struct idem_conn *idem__tx_conn(struct idem_tx *tx)
{
    return tx->conn;
}

/* ---- operators' listings --------------------------------------------------------------------- */

/* A column of a listed record as a number (0 for NULL, as a missing value reads elsewhere). */
static int64_t col_i64(const struct idem_rows *rows, int row, int col)
{
    const char *v = idem_rows_get(rows, row, col);
    return v ? strtoll(v, NULL, 10) : 0;
}

int idem_store_records_unfinished(struct idem_store *st, const char *operation,
                                  const struct idem_record_id *after,
                                  struct idem_record_listed *out, int limit)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    char now[24], lim[16];
    const char *params[6];
    int rc, n = 0;

    if (!st || !out || limit < 1 || limit > 1000)
        return IDEM_EINVAL;
    idem__fmt(now, sizeof(now), "%lld", (long long)clock_wall_ms());
    idem__fmt(lim, sizeof(lim), "%d", limit);
    params[0] = now;
    params[1] = operation ? operation : "";
    params[2] = after ? after->operation : "";
    params[3] = after ? after->principal : "";
    params[4] = after ? after->key : "";
    params[5] = lim;
    rc = idem_tx_begin(st, 0, &tx);
    if (rc < 0)
        return rc;
    rc = idem_tx_exec(tx, st->m->unfinished_sql, 6, params, &rows);
    if (idem_tx_rollback(tx) < 0 && rc == 0)
        rc = IDEM_EUNAVAIL;
    if (rc < 0) {
        idem_rows_free(rows);
        return rc;
    }
    for (int i = 0; i < idem_rows_count(rows) && n < limit; i++) {
        const char *op = idem_rows_get(rows, i, 0), *pr = idem_rows_get(rows, i, 1);
        const char *k = idem_rows_get(rows, i, 2), *point = idem_rows_get(rows, i, 3);
        const char *fp = idem_rows_get(rows, i, 4);
        struct idem_record_listed *r = &out[n];

        if (!op || !pr || !k || strlen(op) > IDEM_SCOPE_PART_MAX ||
            strlen(pr) > IDEM_SCOPE_PART_MAX || strlen(k) > IDEM_SCOPE_PART_MAX)
            continue; /* no scope this long is ever made */
        memset(r, 0, sizeof(*r));
        idem__fmt(r->id.operation, sizeof(r->id.operation), "%s", op);
        idem__fmt(r->id.principal, sizeof(r->id.principal), "%s", pr);
        idem__fmt(r->id.key, sizeof(r->id.key), "%s", k);
        /* What idem_record_inspect() says of a processing record. */
        r->info.found = 1;
        idem__fmt(r->info.recovery_point, sizeof(r->info.recovery_point), "%s", point ? point : "");
        if (fp && strlen(fp) == 2 * IDEM_FP_LEN)
            memcpy(r->info.fingerprint_hex, fp, 2 * IDEM_FP_LEN + 1);
        else /* as inspecting a record without a whole fingerprint shows it: zeros */
            memset(r->info.fingerprint_hex, '0', 2 * IDEM_FP_LEN);
        r->info.created_ms = col_i64(rows, i, 5);
        r->info.expires_ms = col_i64(rows, i, 6);
        r->info.lease_expires_ms = col_i64(rows, i, 7);
        r->info.lease_live = r->info.lease_expires_ms > col_i64(rows, i, 8);
        n++;
    }
    idem_rows_free(rows);
    return n;
}
