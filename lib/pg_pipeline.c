/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pg_pipeline.c - the PostgreSQL store's round trips: several statements sent as one libpq
 * pipeline, and the statements nobody waits for held back to go out with the next one.
 *
 * A round trip is what a statement costs on a network, and a wake-up on both sides; most of a
 * transaction's statements need no answer before the next is sent.  pipe_run sends the deferred
 * statements, then the caller's, then one Sync, and reads every answer: the BEGIN goes out with
 * the first statement, the application's SAVEPOINT/RELEASE with the statement they wrap, and the
 * completion of a record this transaction inserted with the COMMIT.  A deferred statement that
 * fails is reported by the statement (or the COMMIT) it went out with, which then did not run:
 * PostgreSQL skips the rest of a pipeline after an error, up to its Sync.
 *
 * A statement held back right after another of the same joins it when its caller describes a
 * form for several rows (struct pg_stmt's `many`: a batch's completions): the rows go out as that
 * one statement, each parameter an array of their values, and the server runs its executor once
 * and not once a row.  Only neighbours join, so the statements still run in the
 * order they were held back.
 *
 * Layer: above pg_conn.c (a session's messages and error codes), below store_pg.c and nothing
 * else (store_pg.h lists the layers).  It runs what its caller describes -- a statement's text,
 * or a struct pg_stmt of the caller's own table -- and knows no statement of the store's.
 */
#include "store_pg.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct pipe_q idem__pg_q_simple(const char *sql, const char *what)
{
    struct pipe_q q = {.what = what, .sql = sql};
    return q;
}

struct pipe_q idem__pg_q_prepare(const struct pg_stmt *stmt, const char *what)
{
    struct pipe_q q = {.what = what,
                       .sql = stmt->sql,
                       .name = stmt->name,
                       .prepare = 1,
                       .nparams = stmt->nparams,
                       .types = stmt->types,
                       .mark = 1u << stmt->id};
    return q;
}

struct pipe_q idem__pg_q_exec(const char *name, int nparams, const char *const *vals,
                              const int *lens, const int *fmts, int binary, const char *what)
{
    struct pipe_q q = {.what = what,
                       .name = name,
                       .nparams = nparams,
                       .vals = vals,
                       .lens = lens,
                       .fmts = fmts,
                       .binary = binary};
    return q;
}

void idem__pg_deferred_clear(struct idem_conn *c)
{
    for (int i = 0; i < c->ndefer; i++) {
        struct deferred *d = &c->defer[i];
        free(d->sql);
        free(d->app_name);
        for (int j = 0; j < d->napp; j++)
            free(d->app_vals[j]);
        free(d->app_vals);
        for (int j = 0; j < DEFER_PARAMS; j++) {
            free(d->vals[j]);
            idem__pg_array_clear(&d->arr[j]);
        }
    }
    memset(c->defer, 0, sizeof(c->defer[0]) * (size_t)c->ndefer);
    c->ndefer = 0;
    c->begin_deferred = 0;
}

static int send_q(struct idem_conn *c, const struct pipe_q *q)
{
    if (q->prepare)
        return PQsendPrepare(c->pg, q->name, q->sql, q->nparams, q->types);
    if (q->name)
        return PQsendQueryPrepared(c->pg, q->name, q->nparams, q->nparams ? q->vals : NULL, q->lens,
                                   q->fmts, q->binary);
    return PQsendQueryParams(c->pg, q->sql, 0, NULL, NULL, NULL, NULL, q->binary);
}

/*
 * Binary arrays (PostgreSQL's array_recv): a header of five 4-byte integers -- dimensions (1),
 * flags (0), the element type, the length and the lower bound (1) -- then each element as its
 * 4-byte length (-1: NULL) and its bytes.  The bytes of a text or a bytea are the value itself.
 */
#define ARR_HEAD 20
#define OID_BYTEA 17
#define OID_TEXT 25

static void put_be32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
}

int idem__pg_array_add(struct pg_array *a, const char *val, size_t len)
{
    size_t need = 4 + (val ? len : 0);

    if (!a->buf || a->cap - a->len < need) {
        size_t cap = a->cap ? a->cap : 64;
        char *buf;
        while (cap - (a->buf ? a->len : ARR_HEAD) < need) {
            if (cap > (size_t)INT_MAX / 2)
                return IDEM_ENOMEM; /* (a parameter's length is an int) */
            cap *= 2;
        }
        buf = realloc(a->buf, cap);
        if (!buf)
            return IDEM_ENOMEM;
        if (!a->buf)
            a->len = ARR_HEAD; /* filled in by idem__pg_array_seal */
        a->buf = buf;
        a->cap = cap;
    }
    put_be32(a->buf + a->len, val ? (uint32_t)len : 0xffffffffu);
    if (val)
        memcpy(a->buf + a->len + 4, val, len);
    a->len += need;
    a->n++;
    return 0;
}

void idem__pg_array_seal(struct pg_array *a, int bytea)
{
    put_be32(a->buf, 1);
    put_be32(a->buf + 4, 0);
    put_be32(a->buf + 8, bytea ? OID_BYTEA : OID_TEXT);
    put_be32(a->buf + 12, (uint32_t)a->n);
    put_be32(a->buf + 16, 1);
}

void idem__pg_array_clear(struct pg_array *a)
{
    free(a->buf);
    memset(a, 0, sizeof(*a));
}

/* Parameter k's value of row `vals` (the caller's convention: bytes where lens[k] is set). */
static size_t val_len(const char *const *vals, const int *lens, int k)
{
    return vals[k] == NULL ? 0 : lens && lens[k] ? (size_t)lens[k] : strlen(vals[k]);
}

/*
 * Adds a row to `d`, held back already with the same statement and formats: the row becomes an
 * element of each of its arrays (the first row too, on the second).  0, or IDEM_ENOMEM with `d`
 * as it was.
 */
static int deferred_add_row(struct deferred *d, const char *const *vals, const int *lens)
{
    const int np = d->stmt->nparams;
    struct pg_array was[DEFER_PARAMS];
    int rc = 0;

    for (int k = 0; k < np; k++)
        was[k] = d->arr[k];
    for (int k = 0; k < np && rc == 0; k++) {
        if (d->rows == 1)
            rc = idem__pg_array_add(&d->arr[k], d->vals[k],
                                    val_len((const char *const *)d->vals, d->lens, k));
        if (rc == 0)
            rc = idem__pg_array_add(&d->arr[k], vals[k], val_len(vals, lens, k));
    }
    if (rc < 0) {
        for (int k = 0; k < np; k++)
            if (d->arr[k].buf) {
                d->arr[k].len = was[k].buf ? was[k].len : ARR_HEAD;
                d->arr[k].n = was[k].n;
            }
        return rc;
    }
    if (d->rows == 1)
        for (int k = 0; k < np; k++) {
            free(d->vals[k]);
            d->vals[k] = NULL;
        }
    d->rows++;
    return 0;
}

/* Whether a row of `stmt` with formats `fmts` may join `d`, the last statement held back. */
static int joins(const struct deferred *d, const struct pg_stmt *stmt, const int *fmts)
{
    if (d->sql || d->app_name || d->stmt != stmt || !stmt->many || d->rows >= DEFER_ROWS_MAX)
        return 0;
    for (int k = 0; k < stmt->nparams; k++)
        if (d->fmts[k] != (fmts ? fmts[k] : 0))
            return 0;
    return 1;
}

/*
 * Whether `stmt` is to be prepared in this pipeline: neither the session nor an earlier statement
 * of the pipeline (`*preparing`, which it then joins) knows it.
 */
static int to_prepare(const struct idem_conn *c, unsigned *preparing, const struct pg_stmt *stmt)
{
    const unsigned bit = 1u << stmt->id;

    if ((c->prepared | *preparing) & bit)
        return 0;
    *preparing |= bit;
    return 1;
}

/* Adds `stmt`, a statement without parameters, to all[nall] (prepared first if need be). */
static int add_plain(const struct idem_conn *c, unsigned *preparing, struct pipe_q *all, int nall,
                     const struct pg_stmt *stmt, const char *what)
{
    if (to_prepare(c, preparing, stmt))
        all[nall++] = idem__pg_q_prepare(stmt, what);
    all[nall++] = idem__pg_q_exec(stmt->name, 0, NULL, NULL, NULL, 0, what);
    return nall;
}

/*
 * Adds the deferred statement `d` to all[nall] (with its preparation and settings); returns the
 * new count.  mv, ml and mf hold a `many` form's parameters (the arrays).  `last`: the COMMIT
 * comes right after it, which undoes its settings for it.
 */
static int add_deferred(const struct idem_conn *c, struct deferred *d, unsigned *preparing,
                        struct pipe_q *all, int nall, const char **mv, int *ml, int *mf, int last)
{
    const struct pg_stmt *stmt;

    if (d->sql) {
        all[nall++] = idem__pg_q_simple(d->sql, d->what);
        return nall;
    }
    if (d->app_name) {
        all[nall++] = idem__pg_q_exec(d->app_name, d->napp, (const char *const *)d->app_vals, NULL,
                                      NULL, 0, d->what);
        return nall;
    }
    stmt = d->rows > 1 ? d->stmt->many : d->stmt;
    /* The settings it is planned under, before it, and their undoing after it (a form for
     * several rows: struct pg_stmt). */
    if (stmt->before)
        nall = add_plain(c, preparing, all, nall, stmt->before, d->what);
    if (to_prepare(c, preparing, stmt))
        all[nall++] = idem__pg_q_prepare(stmt, d->what);
    if (d->rows > 1) {
        for (int k = 0; k < stmt->nparams; k++) {
            idem__pg_array_seal(&d->arr[k], d->fmts[k]);
            mv[k] = d->arr[k].buf;
            ml[k] = (int)d->arr[k].len;
            mf[k] = 1;
        }
        all[nall] = idem__pg_q_exec(stmt->name, stmt->nparams, mv, ml, mf, 0, d->what);
    } else {
        all[nall] = idem__pg_q_exec(stmt->name, stmt->nparams, (const char *const *)d->vals,
                                    d->lens, d->fmts, 0, d->what);
    }
    all[nall].keep = d->keep;
    all[nall++].fenced = stmt->fenced;
    /* (Before the COMMIT, the transaction's end undoes the settings.) */
    if (stmt->after && !last)
        nall = add_plain(c, preparing, all, nall, stmt->after, d->what);
    return nall;
}

/*
 * Whether the application's writes held back go after the store's own statements held back among
 * them, not in the order they came.  Both kinds go out with the batch's next statement or its
 * COMMIT, nobody reads their answers, and they write other tables (an application's write held
 * back leaves the store's alone: idem_tx_exec_deferred), so any order gives the same rows and
 * any failure still fails the batch -- but a row that the writes lock is then locked for less of
 * the transaction: a batch of orders of one product holds that product's row from its first
 * order, and the records' inserts no longer run while it is held.  Not when a statement of the
 * application's own comes after one of its writes (its savepoints), whose order with them counts.
 */
static int apps_go_last(const struct idem_conn *c)
{
    int apps = 0;

    for (int i = 0; i < c->ndefer; i++) {
        if (c->defer[i].app_name)
            apps = 1;
        else if (c->defer[i].sql && apps)
            return 0;
    }
    return apps;
}

/*
 * Sends the deferred statements, then q[0..n), then a Sync, in one pipeline (one round trip), and
 * reads every answer.  Returns 0 when all succeeded (optional ones aside); else the first
 * failure's code and message, with its index in `q` in *failed (-1: a deferred statement, or the
 * connection).  After a failure in a transaction the rest of the pipeline did not run and the
 * transaction is aborted, as with a failed statement sent alone.  The deferred statements are
 * gone either way: they were sent.
 */
int idem__pg_pipe_run(struct idem_conn *c, struct pipe_q *q, int n, int *failed)
{
    struct pipe_q all[1 + DEFER_MAX * 6 + 8];
    /* The `many` forms' parameters: the arrays, sent as bytes */
    const char *mvals[DEFER_MAX][DEFER_PARAMS];
    int mlens[DEFER_MAX][DEFER_PARAMS], mfmts[DEFER_MAX][DEFER_PARAMS];
    const int ending = n > 0 && q[0].ends_tx;
    int nd = 0, nall = 0, synced = 0, bad = -1;
    unsigned preparing = 0; /* the store's statements this pipeline prepares (struct pg_stmt) */
    int apps_last;
    const char *what;
    PGresult *err = NULL;
    int rc = 0;

    *failed = -1;
    for (int i = 0; i < n; i++) {
        q[i].ok = 0;
        q[i].res = NULL;
    }
    /* The BEGIN, each deferred statement with its preparation (and its settings'), then q. */
    if (1 + 6 * c->ndefer + n > (int)(sizeof(all) / sizeof(all[0]))) {
        idem__pg_set_msg(c, "pipeline", "too many statements at once", NULL);
        return IDEM_EINVAL;
    }
    if (c->begin_deferred)
        all[nall++] = idem__pg_q_simple("BEGIN ISOLATION LEVEL READ COMMITTED", "begin");
    /* The store's statements held back, then the application's writes, or all as they came. */
    apps_last = apps_go_last(c);
    for (int pass = 0; pass < 1 + apps_last; pass++)
        for (int i = 0; i < c->ndefer; i++)
            if (!apps_last || (c->defer[i].app_name != NULL) == (pass == 1))
                nall = add_deferred(c, &c->defer[i], &preparing, all, nall, mvals[i], mlens[i],
                                    mfmts[i], ending && i == c->ndefer - 1 && !apps_last);
    nd = nall;
    for (int i = 0; i < n; i++)
        all[nall++] = q[i];

    if (!PQenterPipelineMode(c->pg))
        goto lost;
    for (int i = 0; i < nall; i++)
        if (!send_q(c, &all[i]))
            goto lost;
    if (!PQpipelineSync(c->pg))
        goto lost;
    idem__pg_trip(c);
    /* Each query's results end with a NULL; the Sync's result ends the pipeline. */
    for (int i = 0; i <= nall && !synced;) {
        PGresult *res = PQgetResult(c->pg);
        if (!res) {
            if (PQstatus(c->pg) != CONNECTION_OK)
                break;
            i++;
            continue;
        }
        switch (PQresultStatus(res)) {
        case PGRES_PIPELINE_SYNC:
            synced = 1;
            break;
        case PGRES_PIPELINE_ABORTED:
            break;
        case PGRES_COMMAND_OK:
        case PGRES_TUPLES_OK:
            if (i < nall && !all[i].ok) {
                all[i].ok = 1;
                c->prepared |= all[i].mark; /* known to the session from now */
                all[i].res = res;
                res = NULL;
            }
            break;
        default:
            if (i < nall && all[i].optional)
                break;
            if (!err) {
                /* i == nall: the connection failed after the last answer, before the Sync's */
                err = res;
                res = NULL;
                bad = i;
            }
            break;
        }
        PQclear(res);
    }
    for (int i = 0; i < nd; i++) {
        if (all[i].keep && all[i].ok) {
            PQclear(*all[i].keep);
            *all[i].keep = all[i].res;
        } else {
            PQclear(all[i].res);
        }
    }
    for (int i = 0; i < n; i++) {
        q[i].ok = all[nd + i].ok;
        q[i].res = all[nd + i].res;
    }
    idem__pg_deferred_clear(c);
    /* A failure past the last statement (bad == nall) leaves that one's outcome unknown. */
    what = bad < 0 || nall == 0 ? "pipeline" : all[bad < nall ? bad : nall - 1].what;
    if (!synced || !PQexitPipelineMode(c->pg)) {
        if (err)
            idem__pg_fail_res(c, err, what);
        else
            idem__pg_set_msg(c, "pipeline", PQerrorMessage(c->pg), NULL);
        c->broken = 1;
        PQclear(err);
        return IDEM_EUNAVAIL;
    }
    if (err) {
        rc = idem__pg_fail_res(c, err, what);
        if (bad < nall && all[bad].fenced && idem__pg_state_is(c->sqlstate, "22012")) {
            idem__pg_set_msg(c, what, "the record is no longer this call's", NULL);
            rc = IDEM_ELEASE;
        }
        *failed = bad >= nd && bad < nall ? bad - nd : -1;
        PQclear(err);
        return rc;
    }
    for (int i = 0; i < nall; i++)
        if (!all[i].ok && !all[i].optional) {
            idem__pg_set_msg(c, all[i].what, "the server sent no result", NULL);
            c->broken = 1;
            return IDEM_EUNAVAIL;
        }
    return 0;

lost:
    /* A message could not be sent: the connection is gone or unusable. */
    idem__pg_set_msg(c, nall > 0 ? all[0].what : "pipeline", PQerrorMessage(c->pg), NULL);
    idem__pg_deferred_clear(c);
    c->broken = 1;
    return IDEM_EUNAVAIL;
}

/* Sends what is deferred, alone (before a statement that cannot join a pipeline). */
int idem__pg_flush_deferred(struct idem_conn *c)
{
    int failed;
    return c->ndefer > 0 || c->begin_deferred ? idem__pg_pipe_run(c, NULL, 0, &failed) : 0;
}

/* Holds back the parameterless statement `sql` for the next pipeline; 0, or IDEM_ENOMEM. */
int idem__pg_defer_simple(struct idem_conn *c, const char *sql, const char *what)
{
    char *copy;
    int rc;

    if (c->ndefer == DEFER_MAX && (rc = idem__pg_flush_deferred(c)) < 0)
        return rc;
    copy = idem__strdup(sql);
    if (!copy)
        return IDEM_ENOMEM;
    c->defer[c->ndefer].what = what;
    c->defer[c->ndefer++].sql = copy;
    if (c->in_tx)
        c->tx_stmts++;
    return 0;
}

/* Holds back an EXECUTE of `name` with copies of `vals`; 0, or IDEM_ENOMEM. */
int idem__pg_defer_app(struct idem_conn *c, const char *name, int nparams, const char *const *vals,
                       const char *what)
{
    struct deferred *d;
    int rc;

    if (c->ndefer == DEFER_MAX && (rc = idem__pg_flush_deferred(c)) < 0)
        return rc;
    d = &c->defer[c->ndefer];
    memset(d, 0, sizeof(*d));
    d->what = what;
    d->app_name = idem__strdup(name);
    d->app_vals = calloc((size_t)nparams + 1, sizeof(char *));
    if (!d->app_name || !d->app_vals)
        goto nomem;
    for (; d->napp < nparams; d->napp++)
        if (vals[d->napp] && !(d->app_vals[d->napp] = idem__strdup(vals[d->napp])))
            goto nomem;
    c->ndefer++;
    if (c->in_tx)
        c->tx_stmts++;
    return 0;
nomem:
    for (int j = 0; j < d->napp; j++)
        free(d->app_vals[j]);
    free(d->app_vals);
    free(d->app_name);
    memset(d, 0, sizeof(*d));
    return IDEM_ENOMEM;
}

/*
 * Holds back `stmt` (borrowed: it must outlive the transaction) with a copy of its parameters
 * (texts, or bytes where lens[i] is set) for the next pipeline; 0, or IDEM_ENOMEM.
 */
int idem__pg_defer_stmt(struct idem_conn *c, const struct pg_stmt *stmt, const char *const *vals,
                        const int *lens, const int *fmts, const char *what)
{
    struct deferred *d;
    int rc;

    /* The row of a statement held back just before: one statement, its `many` form, runs both. */
    if (c->ndefer > 0 && joins(&c->defer[c->ndefer - 1], stmt, fmts)) {
        rc = deferred_add_row(&c->defer[c->ndefer - 1], vals, lens);
        if (rc == 0 && c->in_tx)
            c->tx_stmts++;
        return rc;
    }
    if (c->ndefer == DEFER_MAX && (rc = idem__pg_flush_deferred(c)) < 0)
        return rc;
    d = &c->defer[c->ndefer];
    memset(d, 0, sizeof(*d));
    for (int i = 0; i < stmt->nparams && i < DEFER_PARAMS; i++) {
        size_t len = val_len(vals, lens, i);
        d->fmts[i] = fmts ? fmts[i] : 0;
        if (vals[i] == NULL)
            continue;
        d->vals[i] = malloc(len + 1);
        if (!d->vals[i]) {
            for (int j = 0; j < i; j++)
                free(d->vals[j]);
            memset(d, 0, sizeof(*d));
            return IDEM_ENOMEM;
        }
        memcpy(d->vals[i], vals[i], len);
        d->vals[i][len] = '\0';
        d->lens[i] = lens ? lens[i] : 0;
    }
    d->stmt = stmt;
    d->what = what;
    d->rows = 1;
    c->ndefer++;
    if (c->in_tx)
        c->tx_stmts++;
    return 0;
}

/*
 * Begins a transaction without a round trip of its own: the BEGIN goes out with the first
 * statement.  A transaction that ends before any does (a claim refused before its INSERT, say)
 * never reaches the server.
 */
void idem__pg_defer_begin(struct idem_conn *c)
{
    idem__pg_tx_forget(c);
    c->in_tx = 1;
    c->tx_stmts = 0;
    c->begin_deferred = 1;
}

void idem__pg_ahead_clear(struct idem_conn *c)
{
    for (int i = 0; i < c->nahead; i++) {
        struct claim_ahead *a = &c->ahead[i];
        free(a->principal);
        free(a->operation);
        free(a->key);
        free(a->owner);
        free(a->point);
    }
    memset(c->ahead, 0, sizeof(c->ahead[0]) * (size_t)c->nahead);
    c->nahead = 0;
    c->collecting = 0;
    c->ahead_ran = 0;
    c->ahead_pending = 0;
    PQclear(c->ahead_res);
    c->ahead_res = NULL;
}

void idem__pg_tx_forget(struct idem_conn *c)
{
    idem__pg_deferred_clear(c);
    idem__pg_ahead_clear(c);
    c->in_tx = 0;
    c->nnotify = 0;
    c->claimed_open = 0;
    c->whole = 0;
    c->batch = 0;
}

/* Runs one parameterless statement of the store's own (no input in it), after what is deferred. */
int idem__pg_run_simple(struct idem_conn *c, const char *sql, const char *what)
{
    PGresult *res = NULL;
    int rc = idem__pg_flush_deferred(c);

    if (rc == 0) {
        /* The simple protocol: `sql` may hold several statements separated by ';'. */
        res = PQexec(c->pg, sql);
        idem__pg_trip(c);
        rc = idem__pg_check(c, res, what);
        PQclear(res);
    }
    if (c->in_tx)
        c->tx_stmts++;
    return rc;
}
