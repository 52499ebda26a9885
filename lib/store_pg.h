/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_pg.h - what the PostgreSQL store's files share, and nothing else includes.  Its layers,
 * bottom up, each file calling only those below it: pg_conn.c (a session: connecting, messages,
 * SQLSTATE -> IDEM_E*), pg_pipeline.c (one round trip for several statements; statements held
 * back for the next one), pg_listen.c (LISTEN/NOTIFY: waking the duplicates of every process),
 * tx_batch.c (several jobs to a transaction: tx_batch.h) and, on top, store_pg.c (the store's
 * function table: connections, transactions, the application's and the records' statements,
 * migrations).
 */
#ifndef IDEM_STORE_PG_H
#define IDEM_STORE_PG_H

#include "internal.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define STMT_CACHE 48
#define RETRIES_MAX 3
#define WAIT_BUCKETS 256
#define CONNECT_TIMEOUT_S "5"
/*
 * A server that vanishes without closing its connections (its host lost power, the network
 * between is cut) must not hold a statement -- and the pool's connection, and the request -- for
 * the kernel's own limits (about 15 minutes of retransmissions; 2 hours before a first keepalive).
 * Keepalives probe a connection idle for 5 s (a statement waiting for its answer), and
 * TCP_USER_TIMEOUT drops one whose sent bytes or probes stay unacknowledged for 10 s: a silent
 * server costs a statement 10 to 15 s.  A live server's kernel acknowledges both, however long
 * its statement runs.
 */
#define KEEPALIVES_IDLE_S "5"
#define KEEPALIVES_INTERVAL_S "2"
#define KEEPALIVES_COUNT "3"
#define TCP_USER_TIMEOUT_MS "10000"
#define LISTEN_BACKOFF_MAX_MS 5000

/* The channel that carries "a record changed"; the payload is the hash of its scope. */
#define NOTIFY_CHANNEL "idem_records"

/* The database's clock in milliseconds: leases and retention are measured with it, never ours. */
#define DB_NOW_MS "(extract(epoch from clock_timestamp()) * 1000)::bigint"

/* ---- per-store state: how to connect, the listener, the batcher ----------------------------- */

struct pg_shared {
    /* libpq keywords: our defaults come before the user's string, so the user's settings win. */
    const char *keys[10];
    const char *vals[10];
    char *conninfo;
    char *secret;  /* the password the connection string names, scrubbed from every message */
    char *display; /* "host=... port=... dbname=... user=...": how messages name the server */
    int lock_timeout_ms;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    int started;       /* the listener thread exists */
    int listening;     /* its LISTEN is in force: a wait will be woken */
    int stop;
    int wake[2]; /* self-pipe that interrupts the listener's poll() at close */
    pthread_t thread;
    uint64_t epoch; /* bumped when the listener (re)connects or loses its connection */
    uint64_t bucket[WAIT_BUCKETS]; /* notifications seen, by scope hash */

    /* write_run_async's runner threads (tx_batch.h): made with this, stopped at the store's close
     */
    struct idem__batcher *batcher;
    _Atomic uint64_t *round_trips; /* the store's count (idem_store_stats) */
};

/* ---- connections ----------------------------------------------------------------------------- */

struct app_stmt {
    char *sql;
    char name[32];
    int nparams;  /* the highest $k the statement uses */
    int prepared; /* the server knows it under `name` */
    uint64_t used;
};

/*
 * A statement of the store's own, prepared once per session under `name`.  Its caller hands the
 * pipeline this description (a static table of the caller's) and the pipeline runs what it says.
 */
#define STMT_PARAMS 8
struct pg_stmt {
    int id; /* 0 to 31, one per statement: its bit in c->prepared */
    const char *name;
    const char *sql;
    int nparams;
    Oid types[STMT_PARAMS];
    /* An update sent without waiting for its answer that fails (a division by zero) when it
     * changed nothing: its failure means the record is not this call's (IDEM_ELEASE). */
    int fenced;
    /*
     * Or NULL: the same statement for several rows at once, which the pipeline sends instead
     * when this one is held back several times in a row (struct deferred).  Its parameter k is
     * the array of parameter k's values, one a row: text[] where this one's value is sent as
     * text, bytea[] where it is sent as bytes.  Fenced, it fails unless every row changed one.
     */
    const struct pg_stmt *many;
    /*
     * Or NULL: statements without parameters that the pipeline runs right before this one and
     * right after it, in the same round trip -- the settings it is to be planned under, and
     * their undoing, so that they bind no other statement of the transaction.  The undoing is
     * left out when the transaction's COMMIT comes right after it (the settings are the
     * transaction's own, SET LOCAL, and end with it).
     */
    const struct pg_stmt *before, *after;
};

/*
 * A parameter that is an array (text[] or bytea[]) in PostgreSQL's binary form, built an element
 * at a time: a header -- dimensions, flags, the element type, the length, the lower bound --
 * then each element as its 4-byte length (-1: NULL) and its bytes.
 */
struct pg_array {
    char *buf; /* owned; the header is written by idem__pg_array_seal */
    size_t len, cap;
    int n; /* elements */
};

/*
 * A statement whose answer nobody waits for, held back to go out in the pipeline of the next one
 * that needs its answer (see "pipelines" below): the application's SAVEPOINT, RELEASE and
 * ROLLBACK TO, the completion of a record this transaction inserted, and in a batch the
 * application's statements it asked to hold back (the BEGIN is only a flag, begin_deferred).
 * Its failure is reported by that next statement (or the COMMIT, which then does not happen).
 * At most DEFER_MAX (a batch's 32 jobs, two each) before they go out on their own.
 */
#define DEFER_MAX 64
#define DEFER_PARAMS 8
/* Rows of one statement held back as one (its `many` form), at most. */
#define DEFER_ROWS_MAX 64
struct deferred {
    const char *what; /* names it in a message */
    char *sql;        /* a parameterless statement (owned), or NULL for: */
    /* an application's statement prepared under `app_name` (owned), with app_vals[0..napp)
     * (owned; NULL for a NULL), or NULL for: */
    char *app_name;
    char **app_vals;
    int napp;
    const struct pg_stmt
        *stmt; /* the statement (borrowed: static), with these parameters (owned) */
    char *vals[DEFER_PARAMS];
    int lens[DEFER_PARAMS];
    int fmts[DEFER_PARAMS];
    /*
     * Rows held back: from 2, the statement's `many` form runs them all, and arr[k] holds
     * parameter k's values as the elements of a binary array (each a 4-byte length, then its
     * bytes), vals[] is unused.
     */
    int rows;
    struct pg_array arr[DEFER_PARAMS];
    PGresult **keep; /* its result goes here (replacing what is there), or NULL: dropped */
};

/*
 * A claim noted ahead (claims_collect: a batch's claim jobs), answered by the batch's one claim
 * statement when the first of them runs -- or, in a batch, by the COMMIT that statement went out
 * with: `answer` is then where the claim's caller reads it (IDEM__CLAIM_AT_COMMIT).
 */
#define AHEAD_MAX 32
struct claim_ahead {
    char *principal, *operation, *key, *owner, *point; /* owned */
    unsigned char fp[IDEM_FP_LEN];
    int64_t lease_ms, ttl_ms;
    int state;   /* AHEAD_NOTED, then AHEAD_WON or AHEAD_TAKEN, then AHEAD_TOLD (store_pg.c) */
    int *answer; /* borrowed until the transaction ends, or NULL */
};

struct idem_conn {
    PGconn *pg;
    struct pg_shared *sh;
    char errmsg[IDEM_ERRMSG_MAX];
    char sqlstate[6]; /* of the last failure; "" for a client-side one */
    int broken;
    int in_tx;
    int tx_stmts; /* statements since BEGIN (deferred ones too): the first may be retried */
    struct deferred defer[DEFER_MAX];
    int ndefer;
    int begin_deferred; /* the transaction's BEGIN goes out first with the next pipeline */
    /* The scope this transaction inserted a record for (its hash), while its completion may be
     * deferred: no other transaction can change that row before this one ends. */
    uint64_t claimed;
    int claimed_open;
    int whole; /* a whole transaction (idem__tx_run): only its COMMIT follows its statements */
    int batch; /* a batch's transaction (tx_batch.c): a failed statement may doom it */
    /* This transaction's claims noted ahead, while `collecting` and then until it ends. */
    struct claim_ahead ahead[AHEAD_MAX];
    int nahead;
    int collecting;
    int ahead_ran;       /* their statement ran: each one's state is its answer */
    int ahead_pending;   /* their statement went out deferred: the COMMIT answers */
    PGresult *ahead_res; /* that statement's rows once it ran (the keys won) */
    int ahead_taken;     /* of those the last COMMIT answered, the claims it found taken */
    unsigned prepared;   /* bit k: the session knows the struct pg_stmt whose id is k */
    char notify[32][17]; /* scopes (hashes) to announce once the transaction commits */
    int nnotify;
    uint64_t clock;
    uint64_t serial;
    struct app_stmt cache[STMT_CACHE];
};

/* ---- a session: connecting, messages (pg_conn.c) --------------------------------------------- */

/* Connects c (its c->sh says where) and sets its session up; a failure's message is left in c. */
int idem__pg_connect(struct idem_conn *c);
/* The session's settings, applied after every (re)connect. */
int idem__pg_session_setup(struct idem_conn *c);
/* Leaves "what: detail" (the password scrubbed) and the SQLSTATE `state` (or "") in c. */
void idem__pg_set_msg(struct idem_conn *c, const char *what, const char *detail, const char *state);
/* Replaces `secret` in `buf` by asterisks, and line breaks by spaces (the text never grows). */
void idem__pg_scrub(char *buf, const char *secret);
/* Whether SQLSTATE `state` is `code`. */
int idem__pg_state_is(const char *state, const char *code);
/* The IDEM_E* of a failed result, with its message left in c (a lost connection marks c broken). */
int idem__pg_fail_res(struct idem_conn *c, const PGresult *res, const char *what);
/* 0 if `res` is a success, else idem__pg_fail_res().  Never frees `res`. */
int idem__pg_check(struct idem_conn *c, const PGresult *res, const char *what);
/* Counts a round trip of c's (idem_store_stats' round_trips). */
static inline void idem__pg_trip(const struct idem_conn *c)
{
    if (c->sh && c->sh->round_trips)
        atomic_fetch_add_explicit(c->sh->round_trips, 1, memory_order_relaxed);
}
/* libpq's notice processor for every connection of the store: notices are not errors. */
void idem__pg_notice_ignore(void *arg, const char *message);

/* ---- pipelines (pg_pipeline.c) --------------------------------------------------------------- */

/*
 * One query of a pipeline.  With `prepare`, the statement `sql` is prepared under `name`; else
 * with `name`, the prepared statement `name` runs with the parameters; else `sql` runs as one
 * parameterless statement.  After pipe_run: `ok` if it succeeded, and then its result in `res`
 * (the caller's, PQclear).
 */
struct pipe_q {
    const char *what; /* names it in a message */
    const char *sql;
    const char *name;
    int prepare;
    int nparams;
    const Oid *types;
    const char *const *vals;
    const int *lens;
    const int *fmts;
    int binary;      /* its result in binary */
    int optional;    /* its failure is not the pipeline's (best-effort notifications) */
    int ends_tx;     /* the COMMIT: what is deferred before it needs no settings undone */
    int fenced;      /* a division by zero means the record is not ours (struct pg_stmt) */
    unsigned mark;   /* with `prepare`: its bit in c->prepared once the session knows it, or 0 */
    PGresult **keep; /* a deferred statement's: where its result goes (struct deferred) */
    int ok;
    PGresult *res;
};

/* A parameterless statement; a statement's preparation; a prepared statement's run. */
struct pipe_q idem__pg_q_simple(const char *sql, const char *what);
struct pipe_q idem__pg_q_prepare(const struct pg_stmt *stmt, const char *what);
struct pipe_q idem__pg_q_exec(const char *name, int nparams, const char *const *vals,
                              const int *lens, const int *fmts, int binary, const char *what);
/* Sends what is deferred, then q[0..n), then a Sync, in one round trip (see pg_pipeline.c). */
int idem__pg_pipe_run(struct idem_conn *c, struct pipe_q *q, int n, int *failed);
/* Drops the statements held back (and the deferred BEGIN) unsent. */
void idem__pg_deferred_clear(struct idem_conn *c);
/* Sends what is deferred, alone. */
int idem__pg_flush_deferred(struct idem_conn *c);
/*
 * Hold back a parameterless statement, `stmt` (borrowed) with copies of its parameters, or the
 * application's statement the session prepared as `name` with copies of its text parameters.
 */
int idem__pg_defer_simple(struct idem_conn *c, const char *sql, const char *what);
int idem__pg_defer_stmt(struct idem_conn *c, const struct pg_stmt *stmt, const char *const *vals,
                        const int *lens, const int *fmts, const char *what);
int idem__pg_defer_app(struct idem_conn *c, const char *name, int nparams, const char *const *vals,
                       const char *what);
/* Appends an element (NULL when `val` is) to `a`: 0, or IDEM_ENOMEM with `a` unchanged. */
int idem__pg_array_add(struct pg_array *a, const char *val, size_t len);
/* Writes `a`'s header (its elements bytea, or text): a->buf and a->len are the parameter. */
void idem__pg_array_seal(struct pg_array *a, int bytea);
/* Frees `a`'s bytes; it is empty again. */
void idem__pg_array_clear(struct pg_array *a);
/* Begins a transaction whose BEGIN goes out with its first statement. */
void idem__pg_defer_begin(struct idem_conn *c);
/* Forgets the claims noted ahead (struct claim_ahead). */
void idem__pg_ahead_clear(struct idem_conn *c);
/* Forgets the connection's transaction (ended or abandoned): nothing held back, no notices. */
void idem__pg_tx_forget(struct idem_conn *c);
/* Runs one of the store's own parameterless statements, after what is deferred. */
int idem__pg_run_simple(struct idem_conn *c, const char *sql, const char *what);

/* ---- waiting for a change (pg_listen.c) ------------------------------------------------------ */

/* FNV-1a over the scope: the notification's payload, and the waiters' bucket. */
uint64_t idem__pg_scope_hash(const struct idem_scope *s);
/* The store table's wait_change: starts the store's listener thread on first use. */
int idem__pg_wait_change(struct idem_store *st, const struct idem_scope *s, int64_t timeout_ms);
/* Stops the listener thread, if it runs (the store's close). */
void idem__pg_listener_stop(struct pg_shared *sh);

#endif
