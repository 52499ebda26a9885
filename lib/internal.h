/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h - what libidem's own files share and the public header does not show: the store
 * backend's tables (a store is a swappable backend, as SQLite's sqlite3_vfs with its
 * sqlite3_io_methods), the record as the engine and the stores exchange it, and small helpers.
 * Programs never include this file.
 */
#ifndef IDEM_INTERNAL_H
#define IDEM_INTERNAL_H

#include "idem/idem.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
/*
 * The headers that declare what banned.h bans come before it, so that a file including this one
 * first may still include them (their guards make the later includes no-ops).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "banned.h" /* common/banned.h, the one list every part of idem compiles with */

#define IDEM_ERRMSG_MAX 512

/* The clocks (the wall's is what SQLite leases are measured with) and the sleep: clock_*(). */
#include "clock.h" /* common/clock.h */
/* CLOCK_REALTIME `ms` from now: the deadline of a pthread_cond_timedwait on a default condvar. */
struct timespec idem__deadline_ms(int64_t ms);

/* snprintf into a fixed message buffer; never overflows, always NUL-terminates. */
void idem__fmt(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* malloc'd copy of `s`, or NULL when `s` is NULL or memory ran out. */
char *idem__strdup(const char *s);

/*
 * OpenSSL's SHA-256, fetched once (fingerprint.c): EVP_sha256() would be looked up again by name,
 * under a lock, on every digest.  An `EVP_MD *`, declared without OpenSSL's header.
 */
struct evp_md_st;
const struct evp_md_st *idem__sha256(void);

/* The directory's tables (shard_map.c), made by idem_shards_open(). */
int idem__shard_directory_migrate(struct idem_store *dir, char **errmsg);

/* ---- records -------------------------------------------------------------------------------- */

enum idem_record_status { IDEM_REC_PROCESSING = 0, IDEM_REC_COMPLETED = 1 };

/* The scope that names a record: its primary key. */
struct idem_scope {
    const char *principal;
    const char *operation;
    const char *key;
};

/*
 * One record as a store returns it.  Every pointer is owned by the record and freed by
 * idem__record_clear(); `headers` is "Name: value\n" lines of the allow-listed headers.
 */
struct idem_record {
    int found;
    enum idem_record_status status;
    unsigned char fp[IDEM_FP_LEN];
    char *recovery_point;     /* "" for a fresh claim */
    char *recovery_data;      /* NULL if none */
    char *lease_owner;        /* NULL once completed or released */
    int64_t lease_expires_ms; /* in the store's clock */
    int64_t store_now_ms;     /* the store's clock when the record was read */
    int64_t created_ms;       /* when the record was claimed (store's clock) */
    int64_t expires_ms;       /* when its retention ends (store's clock) */
    int response_status;
    char *response_headers;
    void *response_body;
    size_t response_body_len;
};

void idem__record_clear(struct idem_record *rec);

/*
 * Encodes the headers of `h` named in `allow` (`nallow` names, case-insensitive; NULL: the default
 * list, Content-Type and Location) as "Name: value\n" lines (new, free()).
 */
int idem__headers_encode(const struct idem_header *h, size_t n, const char *const *allow,
                         size_t nallow, char **out);
/* Splits `text` in place into headers; *out (new, free()) points into `text`. */
int idem__headers_decode(char *text, struct idem_header **out, size_t *n);
/* Splits `text` in place into `h` (room for one header per line); returns how many. */
size_t idem__headers_split(char *text, struct idem_header *h);

/* ---- the store backend tables ---------------------------------------------------------------- */

struct idem_conn; /* one connection of a backend; defined by each backend */

/* Told when an asynchronous commit is durable (rc 0) or failed (errmsg says why). */
typedef void (*idem__commit_done)(void *arg, int rc, const char *errmsg);

/*
 * A write transaction given whole to the store (idem__tx_run): its statements on `c`.  Returns 0
 * to commit, IDEM__TX_DISCARD to roll back with nothing wrong (e.g. a fenced update that changed
 * nothing: `arg` tells the caller), or a negative code (rolled back; the reason is in c's errmsg).
 */
typedef int (*idem__tx_fn)(struct idem_conn *c, void *arg);
#define IDEM__TX_DISCARD 1

/*
 * Where a store keeps a job given without a waiting thread (write_run_async, write_commit_async)
 * while it is in flight: the caller's memory, which must live until the job's `done` was told;
 * the store never touches it after that.  So a store allocates nothing per job, and nothing on
 * this path is allocated on the caller's thread (an event loop) only to be freed on the store's
 * (malloc would move it from one thread's arena to another's).  Each store checks that its
 * bookkeeping fits (a _Static_assert beside its own struct).
 */
struct idem__job_slot {
    _Alignas(max_align_t) unsigned char mem[1280];
};
/*
 * idem__tx_run()'s flag: `fn` writes with one statement at most, and asks for a rollback only
 * when that statement changed nothing -- so there is never anything of it to undo (a statement
 * that fails leaves nothing), and SQLite runs it without a savepoint of its own, which would
 * copy every page it touches into the statement journal first.
 */
#define IDEM__TX_ONE_STATEMENT 1u
/*
 * idem__tx_run_async()'s flag: `fn` may be run again from the start, any number of times, its
 * earlier writes undone (it keeps no state of a run that a later one would not reset), and it
 * asks for a rollback only before it wrote anything.  SQLite runs such jobs back to back under
 * one savepoint of them all instead of one each; one that fails rolls them all back, and the
 * others run again without it.
 */
#define IDEM__TX_RERUNNABLE 2u
/*
 * idem__tx_run_async()'s flag: `fn` is a claim -- its one statement a record_insert, which it
 * calls first, its writes nothing else -- so a batch may run it once more, before any of its
 * jobs, on a connection that only collects the claims (claims_collect); that run's answer means
 * nothing.
 */
#define IDEM__TX_CLAIM 4u
/*
 * What record_insert() leaves in *inserted for a claim of a batch's claim job (IDEM__TX_CLAIM)
 * that is answered by the batch's COMMIT: the claim went out with it, and the COMMIT writes 1
 * (won) or 0 there before the job is told -- 0 too whenever the batch did not commit.
 */
#define IDEM__CLAIM_AT_COMMIT (-1)

/*
 * The page of unfinished records (idem_store_records_unfinished() keeps only their scopes) with
 * the columns idem_record_inspect() shows of a processing record, so that a listing costs one
 * statement per page instead of one more per record.  Each store writes it in its dialect: the
 * fingerprint as hex, and "now" in the store's clock, the one its leases are measured in -- the
 * database's for PostgreSQL, this process's for SQLite (the $1 the page is read at).
 */
#define IDEM__UNFINISHED_SQL(fp_hex, now)                                                          \
    "SELECT operation, principal, idem_key, recovery_point, " fp_hex ", created_ms, expires_ms,"   \
    " lease_expires_ms, t.now FROM idem_records, (SELECT " now " AS now) t"                        \
    " WHERE status = 0 AND expires_ms > $1 AND ($2 = '' OR operation = $2)"                        \
    " AND (operation > $3 OR (operation = $3 AND (principal > $4"                                  \
    " OR (principal = $4 AND idem_key > $5))))"                                                    \
    " ORDER BY operation, principal, idem_key LIMIT $6"

/*
 * A store's capabilities that are policies rather than methods (struct idem_store_methods'
 * `flags`).  They are bits of their own, not parts of a version, because they are independent of
 * each other and of which methods a store has: a version orders what a table adds, while a store
 * of any version may claim first or not, speculate or not.
 *
 * IDEM__STORE_CLAIMS_FIRST: a request whose key the replay cache does not know tries its claim
 * before reading the record; without it, it reads first.  A claim that is not won is always
 * followed by a read; without a replay cache every store reads first.  Claiming first suits both
 * stores: most keys a cache does not know are new.  On SQLite a read costs a read transaction on
 * a pooled connection that re-reads from the WAL the pages the writer changed, while the claim
 * joins the writer's batch that runs anyway.  On PostgreSQL the claim's BEGIN goes out with it,
 * so a new key costs one round trip instead of two; a retry that another instance answered first
 * (a key this cache never saw) pays for it: the claim, its ROLLBACK, then the read.
 *
 * IDEM__STORE_SPECULATES: a one-phase call whose key the replay cache does not know skips the
 * read too: its phase runs at once, and the record's insert, sent with the COMMIT, meets an
 * existing key there (IDEM_ELEASE, the phase rolled back), after which the caller's next begin of
 * the key on that thread reads first and answers from the record.  A fresh key then costs the
 * phase's own round trips and no read, where a read is a round trip of its own (PostgreSQL); a
 * key this cache does not know yet exists pays the phase's work for nothing.
 */
#define IDEM__STORE_CLAIMS_FIRST 1u
#define IDEM__STORE_SPECULATES 2u

/*
 * The versions of struct idem_store_methods; each has every method of the ones before it.
 * IDEM__STORE_V_RUN_ASYNC: adds write_run_async.  IDEM__STORE_V_GROUP_COMMIT: adds the group
 * commit methods (write_begin, write_commit, write_rollback, write_commit_async, write_run).
 */
#define IDEM__STORE_V_BASE 1
#define IDEM__STORE_V_RUN_ASYNC 2
#define IDEM__STORE_V_GROUP_COMMIT 3
/*
 * The versions of struct idem_conn_methods.  IDEM__CONN_V_COMMIT_CHECKS: adds whole_tx and
 * batch_tx, for a connection that may leave a statement's check to the COMMIT.
 * IDEM__CONN_V_CLAIMS_AHEAD: adds claims_collect, for one that claims a batch's keys at once.
 * IDEM__CONN_V_EXEC_DEFERRED: adds exec_deferred, for one that can hold a statement back.
 */
#define IDEM__CONN_V_BASE 1
#define IDEM__CONN_V_COMMIT_CHECKS 2
#define IDEM__CONN_V_CLAIMS_AHEAD 3
#define IDEM__CONN_V_EXEC_DEFERRED 4

/*
 * What a store backend implements, in two tables as SQLite's sqlite3_vfs and sqlite3_io_methods:
 * the store's (below) opens connections and runs whole write transactions, the connection's
 * runs one transaction's statements and records on a connection the pool lent.  Each table
 * says its version; the engine calls a method only of a table whose version has it, so no
 * method is ever NULL and none depends on another being set.
 *
 * Record functions run inside the transaction the engine opened with `begin`, except
 * `record_get` which may run outside one.  On failure a function returns a negative IDEM_E* and
 * leaves a sentence in the connection's message buffer (`errmsg`).  Time is the store's own
 * clock: a lease expiry is computed and compared by the store, never by the caller.
 */
struct idem_conn_methods {
    int version; /* IDEM__CONN_V_* */

    /* ---- version 1 ---- */
    void (*conn_close)(struct idem_conn *c);
    const char *(*errmsg)(const struct idem_conn *c);
    /* Whether the connection is still usable after a failure (else the pool drops it). */
    int (*conn_ok)(struct idem_conn *c);

    int (*begin)(struct idem_conn *c, int write);
    int (*commit)(struct idem_conn *c);
    int (*rollback)(struct idem_conn *c);
    int (*exec)(struct idem_conn *c, const char *sql, int nparams, const char *const *params,
                struct idem_rows **rows);

    /*
     * INSERT ... ON CONFLICT DO NOTHING, processing at recovery point `point` ("": none yet);
     * *inserted says whether this call made the record.
     */
    int (*record_insert)(struct idem_conn *c, const struct idem_scope *s,
                         const unsigned char fp[IDEM_FP_LEN], const char *owner, int64_t lease_ms,
                         int64_t ttl_ms, const char *point, int *inserted);
    /*
     * record_insert() of a record already completed with its response (a one-phase operation's:
     * the claim and the completion in one statement, no lease).  *inserted = 0 when a record of
     * the scope that retention still keeps exists.  In a transaction a store may send it with
     * the COMMIT (*inserted = 1 then), which fails with IDEM_ELEASE if it inserted nothing.
     */
    int (*record_insert_completed)(struct idem_conn *c, const struct idem_scope *s,
                                   const unsigned char fp[IDEM_FP_LEN], int64_t ttl_ms, int status,
                                   const char *headers, const void *body, size_t body_len,
                                   int *inserted);
    /*
     * Reads the record (rec->found = 0 when there is none), with the store's current time.  A
     * record found is one whose commit is durable (a store that commits ahead of its fsync waits
     * here); an absence is not waited for, since a crash takes back only writes, and whoever acts
     * on an absence writes next, gated by its own commit.
     */
    int (*record_get)(struct idem_conn *c, const struct idem_scope *s, struct idem_record *rec);
    /*
     * Takes a processing record whose lease has expired and whose fingerprint is still `fp`
     * (the one the caller read: the record may have been swept and claimed by another request
     * since); *won = 1 if this owner got it.
     */
    int (*record_takeover)(struct idem_conn *c, const struct idem_scope *s,
                           const unsigned char fp[IDEM_FP_LEN], const char *owner, int64_t lease_ms,
                           int *won);
    /* Fenced on (owner, status processing): moves the recovery point and renews the lease. */
    int (*record_advance)(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                          const char *point, const char *data, int64_t lease_ms, int *ok);
    /*
     * Fenced on (owner, status processing): stores the response, status completed, no lease.
     * Commits with the transaction it runs in (idem_call_stage may run more statements after it).
     */
    int (*record_complete)(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                           int status, const char *headers, const void *body, size_t body_len,
                           int *ok);
    /* Fenced on owner: releases the lease, expired now, so the next request may resume at once. */
    int (*record_release)(struct idem_conn *c, const struct idem_scope *s, const char *owner);
    /*
     * Releases the leases of processing records whose owner's name starts with `prefix` and not
     * with `except` (idem_engine_release_leases): the live ones expire now; *released gets how
     * many.
     */
    int (*record_release_owned)(struct idem_conn *c, const char *prefix, const char *except,
                                int *released);
    /* Fenced on (owner, status processing): deletes the record; *ok = 1 if it was deleted. */
    int (*record_forget)(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                         int *ok);
    /* Lists up to `limit` processing records whose lease expired (operation NULL: all). */
    int (*record_stalled)(struct idem_conn *c, const char *operation, int limit,
                          struct idem_stalled **out, size_t *n);
    /* Deletes up to `limit` records past retention that no live lease protects. */
    int (*record_sweep)(struct idem_conn *c, int limit, int *deleted);

    /*
     * Migrations, in the store's dialect, for the one driver (migrate.c): `migrate_begin` opens
     * the write transaction that serialises the migrating processes (the version table made if
     * missing); `schema_version` reads a component's version, 0 when it has none (outside a
     * transaction too, before that table exists); `run_script` runs a step's text, which may hold
     * several statements; `schema_set` records a component's version in the open transaction.
     */
    int (*migrate_begin)(struct idem_conn *c);
    int (*schema_version)(struct idem_conn *c, const char *component, int *version);
    int (*run_script)(struct idem_conn *c, const char *sql);
    int (*schema_set)(struct idem_conn *c, const char *component, int version);

    /* ---- version 2 (IDEM__CONN_V_COMMIT_CHECKS), used by stores without group commit ---- */
    /*
     * Told that the transaction just begun on `c` is a whole one (idem__tx_run), whose statements
     * are followed by its COMMIT and nothing else.  A fenced statement may then be checked by the
     * COMMIT instead of by a round trip of its own: should its fence fail, the COMMIT fails with
     * IDEM_ELEASE and nothing of it stays.
     */
    void (*whole_tx)(struct idem_conn *c);
    /*
     * Told, after whole_tx, that the transaction just begun on `c` carries several jobs
     * (idem__batch_run_async).  Any failed statement may then doom the whole transaction -- the
     * batch rolls back and each job runs alone -- so a backend need not shield each statement
     * from the others' failures (PostgreSQL skips the savepoint, a subtransaction, around each
     * application statement).
     */
    void (*batch_tx)(struct idem_conn *c);

    /* ---- version 3 (IDEM__CONN_V_CLAIMS_AHEAD) ---- */
    /*
     * Between claims_collect(c, 1) and claims_collect(c, 0), after batch_tx, `record_insert`
     * only notes its claim (*inserted = 0, nothing sent): the batch's claim jobs (IDEM__TX_CLAIM)
     * run once so, before any job runs.  The first noted claim that then runs for real claims
     * every noted key in one statement, and each later one answers from it, as each would have
     * alone at that point of the transaction.  A backend may instead send that statement with the
     * COMMIT and answer each claim there (IDEM__CLAIM_AT_COMMIT).
     */
    void (*claims_collect)(struct idem_conn *c, int on);

    /* ---- version 4 (IDEM__CONN_V_EXEC_DEFERRED) ---- */
    /*
     * idem_tx_exec_deferred(): in a batch's transaction (batch_tx), holds `sql` back to go out
     * with the next statement or the COMMIT, whose failure it then is, and returns 1; anywhere
     * else returns 0 with nothing run.
     */
    int (*exec_deferred)(struct idem_conn *c, const char *sql, int nparams,
                         const char *const *params);
};

struct idem_store_methods {
    int version;    /* IDEM__STORE_V_* */
    unsigned flags; /* IDEM__STORE_CLAIMS_FIRST, IDEM__STORE_SPECULATES */
    const char *kind;
    /* IDEM__UNFINISHED_SQL in this store's dialect (run through idem_tx_exec). */
    const char *unfinished_sql;
    /* The table of every connection conn_open makes (kept in struct idem_store too). */
    const struct idem_conn_methods *conn;

    /* ---- version 1 ---- */
    /* Opens a connection and applies libidem's schema (idempotent; safe to race). */
    int (*conn_open)(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen);
    /* Frees the backend's per-store state (st->backend) in idem_store_close. */
    void (*store_close)(struct idem_store *st);
    /*
     * Blocks until the record of `s` may have changed in any process sharing the store, or
     * `timeout_ms` passed; a wake-up may be spurious.  Returns 0, or a negative code when the
     * store cannot wait (the engine then waits on its own condition variable and polls; SQLite
     * always answers so, having no way to hear another process's commit).
     */
    int (*wait_change)(struct idem_store *st, const struct idem_scope *s, int64_t timeout_ms);

    /* ---- version 2 (IDEM__STORE_V_RUN_ASYNC) ---- */
    /*
     * idem__tx_run() without a thread waiting (SQLite: its group commit's; PostgreSQL:
     * idem__batch_run_async, several jobs to a transaction).  `fn` runs on whichever thread
     * holds the writer (or the store's own runner thread), never on the caller's, and
     * `done(arg, rc, errmsg)` runs once: rc 0 once the batch holding `fn`'s writes is durable,
     * IDEM__TX_DISCARD when `fn` asked for a rollback, or a negative code -- the last two also
     * only once the batch `fn` ran in is durable (what `fn` read may come from it).  `done` runs
     * on a thread of the store's that holds nothing of it meanwhile (SQLite: its notifier;
     * PostgreSQL: the runner, its connection given back), so it may use the store, even block.
     * `arg` and `slot` must live until then.  A negative return: nothing was queued, `done` is
     * not called.
     */
    int (*write_run_async)(struct idem_store *st, struct idem__job_slot *slot, idem__tx_fn fn,
                           void *arg, unsigned flags, idem__commit_done done, void *done_arg,
                           char *err, size_t errlen);

    /* ---- version 3 (IDEM__STORE_V_GROUP_COMMIT): the group commit methods (SQLite) ---- */
    /*
     * Every write transaction runs through these instead of a pooled connection: `write_begin`
     * lends the store's one writer connection with the caller's work isolated in a savepoint;
     * `write_commit` releases the savepoint into the current batch and returns only once that
     * batch is durable (or failed: every member then fails; a member whose writes would fail the
     * batch's COMMIT, a foreign key left unresolved, fails alone before it joins);
     * `write_rollback` undoes the caller's savepoint alone, and returns once what the caller
     * could have read is durable (0), or can never be (IDEM_EUNAVAIL).  Errors go to `err`,
     * since the writer's own message buffer belongs to whoever holds it next.
     */
    int (*write_begin)(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen);
    int (*write_commit)(struct idem_store *st, struct idem_conn *c, char *err, size_t errlen);
    int (*write_rollback)(struct idem_store *st, struct idem_conn *c);
    /*
     * `write_commit` without the wait.  The savepoint is released into the current batch and
     * the call returns; `done(arg, rc, errmsg)` runs once the batch is durable (rc 0) or failed,
     * on the store's notifier thread (sqlite_commit.c), which holds nothing of the store's
     * meanwhile: `done` may use the store, even block.  A negative return means the release
     * itself failed (e.g. the caller's writes left a foreign key unresolved): the savepoint was
     * rolled back and `done` is never called.  The store counts it in st->write_commits once
     * durable.
     */
    int (*write_commit_async)(struct idem_store *st, struct idem_conn *c,
                              struct idem__job_slot *slot, idem__commit_done done, void *arg,
                              char *err, size_t errlen);
    /*
     * idem__tx_run() of a whole transaction.  `fn` runs in its own savepoint of the current
     * batch on whichever thread holds the writer when it comes free (the caller sleeps
     * meanwhile, instead of being handed the writer and running it itself), and the call returns
     * as write_commit does: once the batch is durable, or failed.  It and write_run_async count
     * what they commit in st->write_commits.
     */
    int (*write_run)(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags, char *err,
                     size_t errlen);
};

/* A store handle: the backend, its options and a bounded pool of connections. */
struct idem_store {
    const struct idem_store_methods *m;
    const struct idem_conn_methods *cm; /* m->conn, one load nearer the engine's record calls */
    char *target; /* backend-specific: the SQLite path, or the libpq conninfo */
    struct idem_store_options opts;
    void *backend; /* per-store state of the backend (PostgreSQL: listener, batcher), or NULL */

    _Atomic uint64_t write_commits;     /* idem_store_stats() */
    _Atomic uint64_t durable_commits;   /* counted by the backend when it groups commits */
    _Atomic uint64_t durable_commit_ns; /* the time those commits took, likewise */
    _Atomic uint64_t writer_busy_ns;    /* SQLite: the time its one writer was held */
    _Atomic uint64_t round_trips;       /* PostgreSQL: counted by the backend */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct idem_conn **idle; /* connections ready for use */
    int nidle;
    int nopen; /* idle + lent out */
};

/*
 * The pool's pair, get and put as Linux's: lends a connection, opening one if the pool has room,
 * waiting up to busy_timeout_ms.
 */
int idem__store_get(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen);
/* Gives a connection back; a broken one (`cm->conn_ok` false) is closed instead. */
void idem__store_put(struct idem_store *st, struct idem_conn *c);

/* The connection a transaction holds (record functions run on it inside the phase). */
struct idem_conn *idem__tx_conn(struct idem_tx *tx);
/*
 * A transaction handle over `c`, a connection a job runs on (idem__tx_fn): the application's
 * statements go through it, while the job's runner begins and ends the transaction.  Ending the
 * handle (idem_tx_rollback) only frees it; idem_tx_commit of it fails (IDEM_ESTATE).
 */
int idem__tx_lend(struct idem_store *st, struct idem_conn *c, struct idem_tx **out);
/*
 * Test hook (tests/unit/test_store_sqlite.c): when set, the SQLite store's next rollback of a
 * write transaction's savepoint fails as if SQLite had refused it, and the flag clears.
 */
extern _Atomic int idem__sq_fail_next_rollback;

/* How many ROLLBACK [TO] statements the application ran in `tx` (idem_tx_exec). */
unsigned idem__tx_rollbacks(const struct idem_tx *tx);

/* idem_tx_commit(), with the store's message of a failure in `err` (tx is freed either way). */
int idem__tx_commit_err(struct idem_tx *tx, char *err, size_t errlen);

/*
 * Commits `tx` (freed) without waiting for durability where the store can (group commit):
 * `done(arg, 0, NULL)` once durable, `done(arg, rc, msg)` if the batch failed.  Elsewhere it
 * commits as idem_tx_commit() and calls `done` before returning.  A negative return means the
 * commit failed at once (`done` is not called; the message is in `err`).
 */
int idem__tx_commit_async(struct idem_tx *tx, struct idem__job_slot *slot, idem__commit_done done,
                          void *arg, char *err, size_t errlen);

/*
 * Runs `fn` as one write transaction and commits it durably: through the store's write_run when
 * it has one (SQLite: no hand-over of the writer to this thread), else on a transaction of its
 * own.  Returns 0 once durable, IDEM__TX_DISCARD when `fn` asked for a rollback, or a negative
 * code with the store's message in `err`.
 */
int idem__tx_run(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags, char *err,
                 size_t errlen);

/*
 * idem__tx_run() without blocking, on a store that has write_run_async (idem__tx_runs_async):
 * `done(arg, rc, errmsg)` runs later on another thread, rc as idem__tx_run() returns.  A
 * negative return: nothing was queued, `done` is not called (the message is in `err`).
 */
int idem__tx_runs_async(const struct idem_store *st);
int idem__tx_run_async(struct idem_store *st, struct idem__job_slot *slot, idem__tx_fn fn,
                       void *arg, unsigned flags, idem__commit_done done, void *done_arg, char *err,
                       size_t errlen);

/*
 * Applies the steps of `component` newer than its recorded version, each in a transaction of its
 * own (migrate.c).  0, or a negative code with the reason in `err`; *applied (optional): how
 * many steps this call applied.
 */
int idem__migrate(const struct idem_store_methods *m, struct idem_conn *c, const char *component,
                  const struct idem_migration *steps, size_t n, int *applied, char *err,
                  size_t errlen);

/* Counts `ntx` transactions made durable by one commit that began at clock_mono_ns() `t0`. */
void idem__store_count_commit(struct idem_store *st, uint64_t ntx, int64_t t0);

extern const struct idem_store_methods idem__sqlite_methods;
extern const struct idem_store_methods idem__pg_methods;

/* ---- result rows, built by the backends ----------------------------------------------------- */

struct idem_rows {
    int nrows, ncols, cap;
    int64_t changed;
    char **names; /* ncols column names */
    char **cells; /* nrows * ncols values, NULL for SQL NULL */
};

/* New empty result with `ncols` named columns (names copied). */
int idem__rows_new(int ncols, const char *const *names, struct idem_rows **out);
/* Appends a row of `ncols` values (copied; NULL stays NULL, lens[i] bytes of each). */
int idem__rows_append(struct idem_rows *r, const char *const *vals, const size_t *lens);

#endif /* IDEM_INTERNAL_H */
