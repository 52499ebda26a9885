/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idem.h - the one public header of libidem, the idempotency engine.
 *
 * A retry must never become a second order, a second charge or a second email.  libidem gives a
 * C service the pieces to keep that promise: Idempotency-Key parsing, request fingerprints over
 * the RFC 8785 canonical form of the body, and durable records with leases and recovery points,
 * kept in a store (SQLite or PostgreSQL) inside the same transaction as the service's own writes.
 *
 * Conventions (docs/libidem.md): 0 is success and a negative IDEM_E* code is a failure;
 * business outcomes (execute, replay, mismatch, in progress) come back through an
 * enum idem_outcome out-parameter.  Every result says whether it is new (caller frees it with the
 * named function), or borrowed (valid until the named event).  The library never aborts.
 */
#ifndef IDEM_IDEM_H
#define IDEM_IDEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(IDEM_BUILDING) && defined(__GNUC__)
#define IDEM_API __attribute__((visibility("default")))
#else
#define IDEM_API
#endif

#define IDEM_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/* One list makes the enum, idem_strerror() and idem_err_name() (libuv's UV_ERRNO_MAP). */
#define IDEM_ERRNO_MAP(XX)                                                                         \
    XX(ENOMEM, -1, "out of memory")                                                                \
    XX(EINVAL, -2, "invalid argument")                                                             \
    XX(EKEY, -3, "idempotency key invalid")                                                        \
    XX(EJSON, -4, "body is not valid JSON")                                                        \
    XX(EDUPKEY, -5, "duplicate member name in a JSON object")                                      \
    XX(EDEPTH, -6, "JSON nested too deeply")                                                       \
    XX(ETOOBIG, -7, "value exceeds its size cap")                                                  \
    XX(ESTORE, -8, "store error")                                                                  \
    XX(EUNAVAIL, -9, "store unavailable")                                                          \
    XX(ECONFLICT, -10, "unique constraint violated")                                               \
    XX(ELEASE, -11, "lease lost to another owner")                                                 \
    XX(ESTATE, -12, "call not in a state that allows this")                                        \
    XX(EURI, -13, "store URI not recognised")                                                      \
    XX(EMIGRATE, -14, "schema migration failed")                                                   \
    XX(EMOVED, -15, "the principal's bucket is not on this cluster (moved or moving)")

enum idem_errno {
#define IDEM__ERR_ENUM(name, code, text) IDEM_##name = (code),
    IDEM_OK = 0,
    IDEM_ERRNO_MAP(IDEM__ERR_ENUM)
#undef IDEM__ERR_ENUM
};

/* Returns a static English sentence for an error code ("out of memory"; "success" for 0). */
IDEM_API const char *idem_strerror(int err);
/* Returns the static name of an error code ("IDEM_ENOMEM", "IDEM_OK" for 0), or "IDEM_UNKNOWN". */
IDEM_API const char *idem_err_name(int err);

/* Frees memory the library handed out as new bytes (canonical JSON, hex strings); NULL: no-op. */
IDEM_API void idem_free(void *p);

/* ---------------------------------------------------------------------------------------------
 * Idempotency-Key parsing
 * ------------------------------------------------------------------------------------------- */

#define IDEM_KEY_MAX 255

/*
 * Parses one Idempotency-Key field value of `len` bytes: an RFC 8941 sf-string ("abc", with \"
 * and \\ escapes) or a bare token of visible ASCII (0x21-0x7E, no comma, not starting with a
 * quote).  Optional white space (SP / HTAB) around the value is ignored.  The key must be 1 to
 * IDEM_KEY_MAX characters once unquoted, with no control characters.
 *
 * On success writes the NUL-terminated key into `out` and returns 0.  On failure returns
 * IDEM_EKEY (or IDEM_EINVAL for NULL arguments) and, if `why` is not NULL, sets *why to a static
 * sentence saying what is wrong ("key is empty", "key is longer than 255 characters", ...).
 */
IDEM_API int idem_key_parse(const char *value, size_t len, char out[IDEM_KEY_MAX + 1],
                            const char **why);

/* ---------------------------------------------------------------------------------------------
 * RFC 8785 canonical JSON and request fingerprints
 * ------------------------------------------------------------------------------------------- */

#define IDEM_JSON_MAX_DEPTH 64
#define IDEM_FP_LEN 32

/*
 * Canonicalises the JSON text `json` (`len` bytes, UTF-8) by RFC 8785 (JCS): object members
 * sorted by the UTF-16 code units of their names, numbers in ECMAScript's shortest form, strings
 * with minimal escaping, no white space.  Every number is an IEEE 754 double, as JCS demands.
 *
 * Returns 0 and hands out *out (new, NUL-terminated, free with idem_free) and *out_len; or
 * IDEM_EJSON (not JSON, or a number that is not finite as a double; also a member name holding
 * U+0000, which jansson cannot represent), IDEM_EDUPKEY (an object names a member twice),
 * IDEM_EDEPTH (nested deeper than IDEM_JSON_MAX_DEPTH), IDEM_ETOOBIG (input or output over
 * 16 MiB), IDEM_ENOMEM.
 * If `why` is not NULL it receives a static sentence on failure.
 */
IDEM_API int idem_jcs_canonicalize(const void *json, size_t len, char **out, size_t *out_len,
                                   const char **why);

/*
 * The deepest nesting of arrays and objects in the JSON text `json` (`len` bytes), found by a scan
 * that skips strings and parses nothing: for refusing a body nested deeper than
 * IDEM_JSON_MAX_DEPTH before a recursive parser (jansson goes 2048 levels deep) spends its stack
 * on it.  Text that is not JSON gives some number; the parser refuses it afterwards.
 */
IDEM_API size_t idem_json_nesting(const void *json, size_t len);

/*
 * Computes the request fingerprint: SHA-256 over the method, the route template (e.g.
 * "/api/orders/{id}/cancel"), its `nparams` path parameter values in order, and the JCS form of
 * the body.  Every field is length-prefixed, so no two different requests share an encoding.
 * The method is taken as given (pass it upper-case, as HTTP sends it).
 * An empty body (len 0) is fingerprinted as "no body"; a non-empty body must be JSON.
 *
 * Returns 0 and fills `out`; or the errors of idem_jcs_canonicalize() for a bad body.
 */
IDEM_API int idem_fingerprint(const char *method, const char *route, const char *const *params,
                              size_t nparams, const void *body, size_t body_len,
                              unsigned char out[IDEM_FP_LEN], const char **why);

/* Writes the 64 lowercase hex digits of a fingerprint and a NUL into `hex`. */
IDEM_API void idem_fingerprint_hex(const unsigned char fp[IDEM_FP_LEN],
                                   char hex[2 * IDEM_FP_LEN + 1]);

/* ---------------------------------------------------------------------------------------------
 * Stores
 * ------------------------------------------------------------------------------------------- */

struct idem_store;

enum idem_sync {
    IDEM_SYNC_FULL = 0,  /* default: every commit is fsync'd before it is acknowledged */
    IDEM_SYNC_NORMAL = 1 /* SQLite WAL "NORMAL": a power loss may drop the last commits */
};

struct idem_store_options {
    int pool_size;       /* connections kept by the store; 0 means 8 */
    int busy_timeout_ms; /* how long a writer waits for a lock or a pooled connection; 0: 5000 */
    enum idem_sync sync; /* SQLite durability; ignored by stores that are always durable */
};

/*
 * Opens the store named by `uri`: "sqlite:PATH" (PATH may be relative; the file and any missing
 * directory of its path are created), or
 * PostgreSQL as a libpq URI ("postgresql://..." / "postgres://...") or key=value string
 * ("host=127.0.0.1 dbname=app").  Applies libidem's own schema migrations.  NULL `opts` means
 * defaults.
 *
 * Returns 0 and *out (new, close with idem_store_close).  On failure returns a negative code;
 * *out is then NULL and, if `errmsg` is not NULL, *errmsg receives a new sentence (free with
 * idem_free) that never contains a password.
 */
IDEM_API int idem_store_open(const char *uri, const struct idem_store_options *opts,
                             struct idem_store **out, char **errmsg);

/* Closes every pooled connection. NULL is a no-op.  No call on the store may be running. */
IDEM_API void idem_store_close(struct idem_store *st);

/* The store's kind: "sqlite" or "postgresql" (static). */
IDEM_API const char *idem_store_kind(const struct idem_store *st);
/* The file an SQLite store opened, as its URI named it ("sqlite:" taken off); NULL otherwise. */
IDEM_API const char *idem_store_sqlite_path(const struct idem_store *st);

/*
 * Counters of a store handle since it was opened, for monitoring.  On SQLite many write
 * transactions share one durable commit (group commit), so `write_commits` / `durable_commits`
 * is the mean batch; on PostgreSQL every transaction is its own commit and the two are equal.
 * `durable_commit_ns` / `durable_commits` is the mean time a durable commit takes (SQLite: the
 * batch's COMMIT with its fsync; PostgreSQL: the COMMIT's round trip with the server's WAL
 * flush): a request that waits for a commit waits at least that long.
 */
struct idem_store_stats {
    uint64_t write_commits;     /* write transactions committed (each acknowledged durable) */
    uint64_t durable_commits;   /* commits made durable on disk that carried them */
    uint64_t durable_commit_ns; /* time spent in those commits, in nanoseconds */
    /*
     * SQLite: the time its one writer connection was held, by anyone (statements, COMMITs), in
     * nanoseconds: the serial part of every write.  0 on PostgreSQL, which has no such writer.
     */
    uint64_t writer_busy_ns;
    /*
     * PostgreSQL: round trips to the servers (each a message sent and its answers awaited,
     * however many statements it carried), by every connection of the store but the listener's.
     * 0 on SQLite, which has no server.
     */
    uint64_t round_trips;
};

/* Fills *out (zeros for NULL st). */
IDEM_API void idem_store_stats(const struct idem_store *st, struct idem_store_stats *out);

/*
 * A versioned schema step of the application.  Each store runs its own dialect: `sqlite_sql` or
 * `postgres_sql` (several statements separated by ';' are allowed).  Versions of one component
 * must be given in ascending order.
 */
struct idem_migration {
    int version;
    const char *name;
    const char *sqlite_sql;
    const char *postgres_sql;
};

/*
 * Applies, in one transaction each, every migration of `component` whose version is newer than
 * the one recorded in the store's schema table.  Safe when several processes start at once: the
 * table is locked while it is read and written.  *applied (may be NULL) receives how many ran.
 * Returns 0, or IDEM_EMIGRATE with detail in *errmsg (new, free with idem_free).
 */
IDEM_API int idem_store_migrate(struct idem_store *st, const char *component,
                                const struct idem_migration *steps, size_t n, int *applied,
                                char **errmsg);

/* ---------------------------------------------------------------------------------------------
 * Transactions and SQL for the application's own writes
 *
 * SQL is written once for both stores: parameters are $1, $2, ... and travel as text (a NULL
 * pointer is SQL NULL); results come back as text.  A transaction holds one pooled connection.
 * ------------------------------------------------------------------------------------------- */

struct idem_tx;
struct idem_rows;

/*
 * Begins a transaction.  `write` non-zero takes the write lock at once (SQLite BEGIN IMMEDIATE),
 * so a later write cannot fail with a lock upgrade.  Returns 0 and *out (new: end it with
 * idem_tx_commit or idem_tx_rollback), or IDEM_EUNAVAIL when no connection could be had within
 * the busy timeout or the store cannot be reached.
 */
IDEM_API int idem_tx_begin(struct idem_store *st, int write, struct idem_tx **out);

/* Commits durably and frees the handle (also on failure).  A failed commit rolled back. */
IDEM_API int idem_tx_commit(struct idem_tx *tx);

/*
 * Rolls back and frees the handle (also on failure).  NULL is a no-op (0).  Returns 0 once what
 * the transaction read is durable, so an answer may be made from it; IDEM_EUNAVAIL when it may
 * not be: the store stopped (an fsync failed) or the batch whose writes it read failed its
 * COMMIT.  An answer made from the transaction's reads must then not be given (answer 503).
 */
IDEM_API int idem_tx_rollback(struct idem_tx *tx);

/*
 * Runs one statement with `nparams` text parameters.  `rows` may be NULL when no result is
 * wanted; otherwise *rows is new (free with idem_rows_free) and holds every result row.
 * Returns 0, IDEM_ECONFLICT for a unique or primary key violation (the transaction stays usable
 * on every store: PostgreSQL runs each statement under a savepoint), IDEM_EUNAVAIL when the
 * store went away, or IDEM_ESTORE with detail in idem_tx_errmsg().
 *
 * The application's own savepoints work on every store, inside a transaction:
 * "SAVEPOINT name", "ROLLBACK TO [SAVEPOINT] name", "RELEASE [SAVEPOINT] name", no parameters.
 * On PostgreSQL one of these that fails (a name that does not exist) leaves the transaction
 * aborted until a ROLLBACK TO an existing savepoint.
 */
IDEM_API int idem_tx_exec(struct idem_tx *tx, const char *sql, int nparams,
                          const char *const *params, struct idem_rows **rows);

/*
 * idem_tx_exec() of a write whose answer the caller does not need, without waiting for it where
 * that is safe: in the transaction idem_call_run_async() shares among several requests on
 * PostgreSQL, the statement is held back to go out with the transaction's next statement or
 * its COMMIT, and returns 1.  A write held back cannot say that it changed nothing, so one whose
 * condition may fail must fail itself (divide by zero when it changed no row, say): its error
 * fails the whole shared transaction, which is rolled back, and each request's run goes again
 * alone -- where this returns 0.  It must leave libidem's own tables alone: it may go out after
 * statements of the store's that were held back after it (never after a savepoint statement of
 * yours that came after it).
 *
 * Returns 1 when held back, 0 when it was not (elsewhere, or on SQLite): nothing ran, run the
 * statement with idem_tx_exec() and read its answer.  A negative code as idem_tx_exec().
 */
IDEM_API int idem_tx_exec_deferred(struct idem_tx *tx, const char *sql, int nparams,
                                   const char *const *params);

/* The last failure's detail, borrowed until the next call on `tx`. */
IDEM_API const char *idem_tx_errmsg(const struct idem_tx *tx);

IDEM_API int idem_rows_count(const struct idem_rows *r);
IDEM_API int idem_rows_columns(const struct idem_rows *r);
/* Rows changed by the statement (INSERT / UPDATE / DELETE). */
IDEM_API int64_t idem_rows_changed(const struct idem_rows *r);
/* Value of (row, col) as text, borrowed until idem_rows_free; NULL for SQL NULL or out of range. */
IDEM_API const char *idem_rows_get(const struct idem_rows *r, int row, int col);
/* Index of the column named `name`, or -1. */
IDEM_API int idem_rows_column_index(const struct idem_rows *r, const char *name);
IDEM_API void idem_rows_free(struct idem_rows *r);

/* ---------------------------------------------------------------------------------------------
 * The engine: records, leases, phases, replay
 * ------------------------------------------------------------------------------------------- */

struct idem_engine;
struct idem_call;

/* An operation's published policy. Zero fields take the defaults in brackets. */
struct idem_operation {
    const char *name; /* stable name, part of the scope: "orders.create" */
    int64_t ttl_ms;   /* retention of its records [24 h] */
    int64_t lease_ms; /* how long an owner may hold a processing record unrenewed [10 s] */
    int64_t wait_ms;  /* how long a duplicate waits for the first to finish [2 s] */
    /*
     * The response headers kept with a stored response, by name (case-insensitive; stored with
     * this spelling) [NULL: Content-Type and Location].  Borrowed: the list must outlive every
     * call made with the operation.
     */
    const char *const *stored_headers;
    size_t nstored_headers;
    /*
     * NULL: a fresh claim is left in an open phase (EXECUTE, below).  Set: the claim commits at
     * once, durably, with this recovery point, and EXECUTE returns with no phase open -- for a
     * caller whose next step happens outside the store (a proxy forwarding the request), where
     * it replaces idem_call_advance() right after the claim.  Borrowed, like stored_headers.
     */
    const char *claim_point;
    /*
     * 0: a fresh key is claimed (its record inserted as processing) before the phase's writes.
     * 1: a one-phase operation, whose first phase runs nothing outside the store before its
     * completion: EXECUTE opens the phase without writing the record, and the record is written
     * by the phase's first record write -- inserted already completed by idem_call_stage() or
     * idem_call_complete(), or as processing at its point by idem_call_advance() -- in the same
     * transaction as the application's rows.  A new key then costs one record statement instead
     * of three.  Duplicates of this engine wait for the call as ever; a claim of another process
     * that wins the race makes that first record write fail with IDEM_ELEASE (the phase rolled
     * back whole: begin again), or, where the store sends it with the COMMIT (PostgreSQL), the
     * commit.  Ignored with claim_point.
     */
    int one_phase;
};

/* Zero fields take the defaults in brackets; a zeroed struct is the same as NULL options. */
struct idem_engine_options {
    const char *owner; /* lease owner name of this process; NULL: "host:pid:random" */
    /*
     * Memory for the replay cache, in bytes [8 MiB]; IDEM_REPLAY_CACHE_OFF (any negative value):
     * no cache; at least 4096 otherwise.  The cache keeps the responses of completed records
     * (scope, fingerprint, status, stored headers, body) so that idem_call_begin() answers REPLAY
     * and MISMATCH for them without touching the store.  An entry is made when this engine
     * completes a call it claimed, or reads a completed record; least recently used entries make
     * room; a response over an eighth of a cache shard (64 KiB with the default) is not kept.
     * An entry never outlives its record: it dies a little (up to a second) before the record's
     * retention ends, measured from the record's creation in the store's clock, so a record that
     * another process sweeps and runs afresh is never answered from a stale copy.  The store must
     * therefore be changed only through libidem: an edit made behind its back (a record's expiry
     * moved by hand) is seen once the entry dies or is evicted.
     */
    int64_t replay_cache_bytes;
};

#define IDEM_REPLAY_CACHE_OFF ((int64_t)-1)

/*
 * Makes an engine over an open store (borrowed: it must outlive the engine).  NULL `opts` means
 * defaults.  Returns 0 and *out (new, free with idem_engine_free), IDEM_EINVAL for a replay cache
 * of 1 to 4095 bytes, or IDEM_ENOMEM.
 */
IDEM_API int idem_engine_new(struct idem_store *st, const struct idem_engine_options *opts,
                             struct idem_engine **out);
IDEM_API void idem_engine_free(struct idem_engine *eng);
/* The owner name written into leases (borrowed until idem_engine_free). */
IDEM_API const char *idem_engine_owner(const struct idem_engine *eng);

/* Counters of an engine since it was made, for monitoring (a shard set: one engine a cluster). */
struct idem_engine_stats {
    /* Records this engine claimed: new ones (a one-phase call's once its answer is durable,
     * as its record lands with it), and expired leases taken over. */
    uint64_t claims;
    uint64_t answers; /* answers it stored (a completion or a one-phase run, made durable) */
    uint64_t moved;   /* claims and completions the store refused with IDEM_EMOVED */
};
/* Fills *out (zeros for a NULL engine). */
IDEM_API void idem_engine_stats(const struct idem_engine *eng, struct idem_engine_stats *out);

enum idem_outcome {
    IDEM_OUTCOME_NONE = 0,
    IDEM_OUTCOME_EXECUTE,     /* new record claimed: run from the first phase, which is open */
    IDEM_OUTCOME_RESUME,      /* an expired lease was taken over: go on from the recovery point */
    IDEM_OUTCOME_REPLAY,      /* completed with the same fingerprint: send the stored response */
    IDEM_OUTCOME_MISMATCH,    /* same scope, another fingerprint: refuse (422), run nothing */
    IDEM_OUTCOME_IN_PROGRESS, /* another owner holds a live lease past wait_ms: 409 */
};

/* A stored response header.  Only the operation's allow-listed names are kept (stored_headers). */
struct idem_header {
    const char *name;
    const char *value;
};

/*
 * Looks up or claims the record of scope (principal, op->name, key) for a request with
 * fingerprint `fp`.  The store's unique key decides who owns a new record: the claim is an
 * insert that does nothing on conflict, never a read followed by an insert.  (Whether a key the
 * replay cache does not know is read before its claim is the store's choice, docs/libidem.md; a
 * claim that is not won is always followed by a read.)
 *
 * - EXECUTE: the record was inserted as `processing` with this engine's lease, inside an open
 *   transaction (the first phase).  Run the first phase's writes with idem_call_tx(), then
 *   idem_call_advance() or idem_call_complete().  If the phase is rolled back, the claim goes
 *   with it.  With op->claim_point set, the claim is committed at that recovery point instead,
 *   and no phase is open.  With op->one_phase set, the phase is open but the record is not
 *   written yet (see struct idem_operation).
 * - RESUME: a processing record whose lease had expired is now leased to this engine; no phase is
 *   open.  idem_call_recovery_point() says where to go on.
 * - REPLAY: idem_call_response*() give the stored response.
 * - MISMATCH / IN_PROGRESS: nothing was run.  idem_call_retry_after_s() suggests a Retry-After.
 *
 * REPLAY and MISMATCH of a completed record are answered from the engine's replay cache when it
 * holds the record (see struct idem_engine_options), without any store access.
 *
 * A duplicate that finds a live lease waits up to op->wait_ms, woken when the record changes in
 * this process and otherwise polling the store with growing pauses, and idem_call_waited() is
 * then true.
 *
 * Returns 0 with *call (new, end with idem_call_end) and *outcome, or a negative code
 * (IDEM_EUNAVAIL: answer 503, nothing ran).
 */
IDEM_API int idem_call_begin(struct idem_engine *eng, const struct idem_operation *op,
                             const char *principal, const char *key,
                             const unsigned char fp[IDEM_FP_LEN], struct idem_call **call,
                             enum idem_outcome *outcome);

/*
 * Why the last idem_call_begin() of the calling thread failed, for a log line: the store's own
 * words ("claim: connection to server ... failed: Connection refused"); "" if none has.  Valid
 * until that thread's next idem_call_begin().
 */
IDEM_API const char *idem_call_begin_error(void);

/*
 * The callbacks of the asynchronous calls (idem_call_begin_async, idem_call_run_async,
 * idem_call_commit_async, idem_call_complete_async) run on a thread of the store's, never on the
 * caller's, once the step is durable (or failed): on SQLite the store's notifier thread, after
 * the fsync that covers the step; on PostgreSQL the runner thread whose COMMIT was acknowledged
 * (idem_call_commit_async: the calling thread, before it returns).  That thread holds no lock,
 * connection or writer of the store while a callback runs, and the store never waits for it, so
 * a callback may call any libidem function, blocking ones too: end its call (which releases a
 * record that did not complete, a write), end another call, begin one.  While it runs, though,
 * the callbacks behind it wait (SQLite: every callback of the store; PostgreSQL: the next batch
 * of that runner), so hand the work back to your own thread and return; and never wait in a
 * callback for what only another callback of the store would bring.
 */

/* Told by idem_call_begin_async() how the claim ended. */
typedef void (*idem_call_begun)(struct idem_call *call, int rc, enum idem_outcome outcome,
                                void *arg);

/*
 * idem_call_begin() of a fresh key without blocking the calling thread (an event loop's), where
 * that can be done: an operation with a claim_point, the replay cache on, and a store that runs
 * a whole transaction without a thread waiting for it (both stores: SQLite's group commit,
 * PostgreSQL's runner, which puts the claims and completions queued meanwhile in one transaction).
 *
 * Returns 1 when the claim is under way: `begun(call, rc, outcome, arg)` then runs once, on a
 * thread of the store's (the callback rule, above): hand the call back to your own thread.
 * outcome EXECUTE: the claim is
 * durable at op->claim_point, exactly as after idem_call_begin(); outcome NONE with rc 0: a
 * record of the scope exists already, so end the call and ask idem_call_begin() what it is;
 * rc < 0: the claim failed (idem_call_errmsg() says why; answer 503, nothing ran).  The call is
 * the caller's in every case, to end with idem_call_end().  Until `begun` runs, duplicates of
 * this engine wait for the call as for any call in flight.
 *
 * Returns 0 when it cannot be done without blocking (the store or the operation does not allow
 * it, the replay cache knows the key, or another call of this engine has it in flight): ask
 * idem_call_begin().  IDEM_EINVAL, IDEM_ENOMEM, or a store failure otherwise (nothing ran).
 */
IDEM_API int idem_call_begin_async(struct idem_engine *eng, const struct idem_operation *op,
                                   const char *principal, const char *key,
                                   const unsigned char fp[IDEM_FP_LEN], idem_call_begun begun,
                                   void *arg);

/*
 * What the replay cache alone says of scope (principal, op->name, key) with fingerprint `fp`,
 * without the store and without waiting: for an event-loop thread, which must not block.
 * Returns 0 with *call (new, end with idem_call_end) and *outcome REPLAY or MISMATCH when the
 * cache holds the completed record (as idem_call_begin() would answer), or 0 with *call NULL and
 * *outcome NONE when it does not: then idem_call_begin(), which may block, decides.  IDEM_ENOMEM,
 * IDEM_EINVAL otherwise.
 */
IDEM_API int idem_call_lookup(struct idem_engine *eng, const struct idem_operation *op,
                              const char *principal, const char *key,
                              const unsigned char fp[IDEM_FP_LEN], struct idem_call **call,
                              enum idem_outcome *outcome);

/*
 * A wait for a duplicate that holds no thread (an event loop parks the request instead).  When
 * a call of this engine has scope (principal, op->name, key) in flight (claimed and executing in
 * this process), registers `changed(arg)` to be called once, from the thread where the scope
 * leaves flight (its call completed, failed or was released), and returns 1 with *watch (new,
 * end with idem_watch_end).  The replay cache holds a completed response before `changed` runs.
 * Returns 0 with *watch NULL when the scope is not in flight here (it may be in another process:
 * then idem_call_begin() waits as usual), or IDEM_EINVAL / IDEM_ENOMEM.  `changed` must not block.
 */
struct idem_watch;
IDEM_API int idem_watch_inflight(struct idem_engine *eng, const struct idem_operation *op,
                                 const char *principal, const char *key, void (*changed)(void *arg),
                                 void *arg, struct idem_watch **watch);

/*
 * Ends a watch, fired or not: once it returns, `changed` is not running and will not be called
 * for it.  NULL is a no-op.
 */
IDEM_API void idem_watch_end(struct idem_watch *watch);

/*
 * Opens the next phase: a write transaction on the store.  Not needed after EXECUTE (the first
 * phase is open).  Returns 0, IDEM_ESTATE if a phase is already open, or IDEM_EUNAVAIL.
 */
IDEM_API int idem_call_phase_begin(struct idem_call *call);

/* The open phase's transaction, borrowed until the phase ends; NULL when no phase is open. */
IDEM_API struct idem_tx *idem_call_tx(struct idem_call *call);

/*
 * Ends the open phase: moves the record's recovery point to `point` (with optional `data`, text
 * the next phase needs, e.g. the order id), renews the lease and commits, all in the phase's
 * transaction.  The update is fenced: if another owner took the lease over, nothing commits and
 * IDEM_ELEASE is returned.
 */
IDEM_API int idem_call_advance(struct idem_call *call, const char *point, const char *data);

/* Told by idem_call_commit_async() how the commit ended: `rc` as idem_call_commit() returns. */
typedef void (*idem_call_done)(struct idem_call *call, int rc, void *arg);

/*
 * The first phase of a one-phase call, run by idem_call_run_async() on the store's writer: the
 * application's writes through idem_call_tx(call), then idem_call_stage() of the response.
 * Returns 0 (the engine commits), or a negative code (everything it wrote is rolled back).  It
 * may run more than once: runs of several requests share one savepoint, and when another one
 * fails, every write is undone and the others run again from the start -- so it must keep no
 * state of an earlier run that the next would not redo (a new order id is fine).
 */
typedef int (*idem_call_run)(struct idem_call *call, void *arg);

/* idem_call_run_async()'s `done` with this rc: nothing was stored; ask idem_call_begin(). */
#define IDEM_CALL_ASK_BEGIN 1

/*
 * A fresh request of a one-phase operation (op->one_phase) run whole without a thread of the
 * caller waiting for the store (an event loop's), where that can be done: a store that runs
 * transactions on a thread of its own (both: SQLite's writer, PostgreSQL's runner), a key the
 * replay cache does not hold, and no other call of this engine with the key in flight.
 *
 * Returns 1 when under way.  The store's thread, in its shared batch, reads the record (a store
 * that speculates, PostgreSQL, first tries without the read: a record there fails the batch's
 * COMMIT, and the run goes again alone, reading); when there is none it runs `run(call, arg)`
 * with the phase open, as after EXECUTE, and commits what `run` staged.  Then `done(call, rc, arg)`
 * runs once, on a thread of the store's (the callback rule, above): rc 0 once the response is
 * durable, the call completed as after idem_call_commit(); IDEM_CALL_ASK_BEGIN when a record of the
 * key was there (or another process's claim came first): nothing of `run` was kept -- end the call
 * and ask idem_call_begin(); a negative code when `run` or the commit failed (nothing was stored).
 * `run` runs on the store's thread too, and must neither block on anything but the store's
 * statements nor begin another transaction. The call is the caller's to end with idem_call_end()
 * after `done`; until then duplicates of this engine wait for it as for any call in flight.
 *
 * Returns 0 when it cannot be done so: ask idem_call_begin().  IDEM_EINVAL, IDEM_ENOMEM, or a
 * store failure otherwise (nothing ran).
 */
IDEM_API int idem_call_run_async(struct idem_engine *eng, const struct idem_operation *op,
                                 const char *principal, const char *key,
                                 const unsigned char fp[IDEM_FP_LEN], idem_call_run run,
                                 idem_call_done done, void *arg);

/*
 * idem_call_commit() without waiting for durability where the store can (SQLite's group commit:
 * the phase joins the current batch and the call returns).  `done(call, rc, arg)` runs once the
 * batch is durable (rc 0: the call is completed and its response readable, exactly as after
 * idem_call_commit()) or failed (rc < 0), on a thread of the store's or, on a store without
 * group commit, on this one before idem_call_commit_async() returns (the callback rule, above);
 * ending the call there is fine.  Until
 * `done` runs the call belongs to the engine: do not use or end it.  Duplicates stay waiting
 * and nothing is answered from the replay cache before the commit is durable.  Returns 0 when
 * `done` will run (or ran), or a negative code when the commit failed at once (then `done` is not
 * called and the call is as after a failed idem_call_commit(); on SQLite so does a phase whose
 * writes leave a foreign key unresolved, which would fail the COMMIT of the batch it joins). Stores
 * without group commit commit synchronously and call `done` before returning.
 */
IDEM_API int idem_call_commit_async(struct idem_call *call, idem_call_done done, void *arg);

/*
 * Stores the final response and marks the record completed, in the open phase's transaction
 * (one is opened if none is), then commits: idem_call_stage() and idem_call_commit() in one.
 * Headers not on the allow list are not stored.  Afterwards idem_call_response*() return what
 * was stored.  Fenced like idem_call_advance().
 */
IDEM_API int idem_call_complete(struct idem_call *call, int status,
                                const struct idem_header *headers, size_t nheaders,
                                const void *body, size_t body_len);

/*
 * idem_call_complete() of a call with no phase open (a claim at op->claim_point, a resumed
 * record) without blocking the calling thread: the completion is one whole transaction, which
 * the store runs on a thread of its own.  `done(call, rc, arg)` runs once, on a thread of the
 * store's (the callback rule, above), with rc as idem_call_complete() would return (0: durable,
 * the response readable; IDEM_ELEASE: another owner took the lease over, nothing stored).  Until
 * then the call belongs to the engine.  Returns
 * 0 when `done` will run, or a negative code when nothing was done (IDEM_ESTATE with a phase open,
 * or once completed; `done` is not called).
 */
IDEM_API int idem_call_complete_async(struct idem_call *call, int status,
                                      const struct idem_header *headers, size_t nheaders,
                                      const void *body, size_t body_len, idem_call_done done,
                                      void *arg);

/*
 * Writes the final response into the open phase's transaction and marks the record completed
 * there, without committing, so the application can run its last statements after it (e.g. the
 * update of a contended row, whose lock is then held only until the commit), then call
 * idem_call_commit().  Fenced like idem_call_advance(): if another owner took the lease over, the
 * phase is rolled back and IDEM_ELEASE returned.  Nothing is visible outside the transaction
 * until the commit; idem_call_response*() answer only after it.
 *
 * To take the stage back, roll back to a savepoint taken before it (idem_tx_exec() of
 * "SAVEPOINT name", then "ROLLBACK TO SAVEPOINT name", on idem_call_tx()): the record is then
 * processing again in the transaction, and idem_call_stage() or idem_call_complete() stores
 * another response.  Staging twice without that rollback fails the fence: IDEM_ELEASE, and the
 * phase is rolled back.  After such a rollback, stage again before idem_call_commit(), which
 * commits what the transaction holds.
 *
 * Returns 0, IDEM_EINVAL (bad arguments, as idem_call_complete), IDEM_ESTATE when no phase is
 * open or the call is completed, IDEM_ELEASE, or a store error (the phase stays open: abort it).
 */
IDEM_API int idem_call_stage(struct idem_call *call, int status, const struct idem_header *headers,
                             size_t nheaders, const void *body, size_t body_len);

/*
 * Commits the phase holding the response idem_call_stage() wrote.  On success the call is
 * completed exactly as by idem_call_complete(): the record is durable, the replay cache holds the
 * response, duplicates waiting in this process are woken, and idem_call_response*() return what
 * was stored.  Returns 0, IDEM_ESTATE when no response is staged in an open phase (or the call is
 * completed, or the application rolled the stage back with ROLLBACK TO a savepoint taken before
 * it: nothing is committed, the phase stays open to stage again or abort), or the commit's error
 * (nothing was stored; end or abort the call).
 */
IDEM_API int idem_call_commit(struct idem_call *call);

/*
 * Gives up the open phase: rolls back its transaction.  A claim made in that transaction
 * disappears with it (a retry runs afresh); a record that had already advanced keeps its recovery
 * point and its lease is released at once, so a retry may resume it without waiting.
 */
IDEM_API void idem_call_abort(struct idem_call *call);

/*
 * Deletes the call's record because the request is known not to have run (a proxy could not reach
 * its upstream, or an operator decided so): a retry then executes afresh, like a new key.  For a
 * call that holds the record's lease (EXECUTE, RESUME); an open phase is rolled back first (a claim
 * that never committed simply vanishes), then the delete commits in a transaction of its own,
 * fenced like idem_call_advance().  Returns 0, IDEM_ESTATE for a completed call or one that holds
 * no lease, IDEM_ELEASE when another owner took the record over, or a store error.
 */
IDEM_API int idem_call_forget(struct idem_call *call);

/* Ends the call: aborts an open phase (see idem_call_abort) and frees it.  NULL is a no-op. */
IDEM_API void idem_call_end(struct idem_call *call);

/* The recovery point ("" for a new record) and its data (NULL if none); borrowed until the next
 * call on `call`. */
IDEM_API const char *idem_call_recovery_point(const struct idem_call *call);
IDEM_API const char *idem_call_recovery_data(const struct idem_call *call);

/* Whether this call waited for another owner before its outcome. */
IDEM_API int idem_call_waited(const struct idem_call *call);

/* Seconds a client should wait before retrying an IN_PROGRESS outcome (>= 1). */
IDEM_API int idem_call_retry_after_s(const struct idem_call *call);

/* The stored response of a REPLAY or of a completed call; borrowed until idem_call_end. */
IDEM_API int idem_call_response_status(const struct idem_call *call);
IDEM_API const void *idem_call_response_body(const struct idem_call *call, size_t *len);
IDEM_API size_t idem_call_response_header_count(const struct idem_call *call);
IDEM_API const struct idem_header *idem_call_response_header(const struct idem_call *call,
                                                             size_t i);

/* Detail of the last failure on `call`, borrowed until the next call on it. */
IDEM_API const char *idem_call_errmsg(const struct idem_call *call);

/* ---------------------------------------------------------------------------------------------
 * Recovery by background workers (a completer, a reconciler)
 * ------------------------------------------------------------------------------------------- */

/* A processing record whose lease has expired: nobody is working on it. */
struct idem_stalled {
    char *principal;
    char *operation;
    char *key;
    char *recovery_point;
};

/*
 * Lists up to `limit` stalled records of `operation` (NULL: of every operation), oldest first.
 * Returns 0 with *out (new, free with idem_stalled_free) and *n.
 */
IDEM_API int idem_engine_stalled(struct idem_engine *eng, const char *operation, int limit,
                                 struct idem_stalled **out, size_t *n);
IDEM_API void idem_stalled_free(struct idem_stalled *list, size_t n);

/*
 * Ends now the leases of processing records whose lease owner's name starts with `owner_prefix`
 * ("" for every owner), but not this engine's own: for a program that knows those owners are
 * gone -- its own earlier process, restarted after a crash, whose engine owner names started
 * alike.  Each record stays as it was, recovery point and all; the next request of its key takes
 * it over at once (IDEM_OUTCOME_RESUME) instead of waiting for the lease to run out.  Releasing
 * the lease of an owner still alive lets a retry resume beside it: call this only for owners
 * known to be dead.  Returns 0 with *released (may be NULL) the number released.
 */
IDEM_API int idem_engine_release_leases(struct idem_engine *eng, const char *owner_prefix,
                                        uint64_t *released);

/*
 * Takes over a stalled record as a recovery worker, without the request's fingerprint: the
 * worker finishes what the request started.  Outcomes: RESUME (the lease is this worker's now; go
 * on from the recovery point), REPLAY (it completed meanwhile), IN_PROGRESS (someone holds a live
 * lease; no waiting), NONE (there is no such record).  While a worker holds the lease, a client's
 * duplicate that gets IN_PROGRESS sees idem_call_recovering() true.
 */
IDEM_API int idem_call_recover(struct idem_engine *eng, const struct idem_operation *op,
                               const char *principal, const char *key, struct idem_call **call,
                               enum idem_outcome *outcome);

/* For an IN_PROGRESS outcome: whether the lease holder is a recovery worker (idem_call_recover). */
IDEM_API int idem_call_recovering(const struct idem_call *call);

/* What a record holds, for operators and tools (idem-gateway keys show). */
struct idem_record_info {
    int found;                /* 0: no record (or one past its retention) */
    int completed;            /* 1: completed, a response is stored; 0: processing */
    char recovery_point[128]; /* where a processing record is ("" for a fresh claim) */
    char fingerprint_hex[2 * IDEM_FP_LEN + 1];
    int64_t created_ms;       /* Unix milliseconds, in the store's clock */
    int64_t expires_ms;       /* when its retention ends */
    int64_t lease_expires_ms; /* a processing record's lease (0: none) */
    int lease_live;           /* the lease had not expired when the record was read */
    int response_status;      /* completed: the stored status */
    size_t response_body_len; /* completed: the stored body's size */
};

/*
 * Reads the record of scope (principal, operation, key) from the store, not the replay cache.
 * Returns 0 with *out filled (out->found 0 when there is none), or a store error.
 */
IDEM_API int idem_record_inspect(struct idem_engine *eng, const char *principal,
                                 const char *operation, const char *key,
                                 struct idem_record_info *out);

/* A record's scope, as idem_records_unfinished() lists it. */
#define IDEM_SCOPE_PART_MAX 512
struct idem_record_id {
    char operation[IDEM_SCOPE_PART_MAX + 1];
    char principal[IDEM_SCOPE_PART_MAX + 1];
    char key[IDEM_SCOPE_PART_MAX + 1];
};

/*
 * For operators: the records not completed (in flight, or held with their outcome unknown) within
 * their retention, of `operation` (NULL: of every operation), in (operation, principal, key)
 * order after `after` (NULL: from the first), at most `limit` (1..1000) into out[].  Returns how
 * many (fewer than `limit`: that was the last page), or a store error.  idem_record_inspect()
 * tells each one's state.
 */
IDEM_API int idem_records_unfinished(struct idem_engine *eng, const char *operation,
                                     const struct idem_record_id *after, struct idem_record_id *out,
                                     int limit);

/* A record idem_store_records_unfinished() lists: its scope and what inspecting it tells. */
struct idem_record_listed {
    struct idem_record_id id;
    struct idem_record_info info; /* as idem_record_inspect() fills it for this record */
};

/*
 * idem_records_unfinished() with idem_record_inspect() of each record, read by one statement per
 * page instead of one more per record: the same records, order, `after` cursor and `limit`, from
 * the store `st` (the engine's).  Every one listed is processing (info.found 1, info.completed
 * 0); info.lease_live says whether a holder's lease was live when the page was read (in flight)
 * or not (its outcome unknown).  Returns how many (fewer than `limit`: the last page), or a
 * store error.
 */
IDEM_API int idem_store_records_unfinished(struct idem_store *st, const char *operation,
                                           const struct idem_record_id *after,
                                           struct idem_record_listed *out, int limit);

/*
 * Retention: deletes at most `limit` records whose retention has ended (and that no live lease
 * protects), in one short transaction.  *deleted (may be NULL) receives the count.  A sweeper
 * calls it repeatedly until fewer than `limit` come back.
 */
IDEM_API int idem_engine_sweep(struct idem_engine *eng, int limit, int *deleted);

/*
 * The engine's replay cache since the engine was made, for monitoring (all zeros when the cache
 * is off).  A lookup is a request whose record the cache was asked for before the store: a hit
 * answered it from memory (a replay, or 422 for another fingerprint), a miss went on to the store
 * (a first request, or a record not held).
 */
struct idem_cache_stats {
    uint64_t hits, misses;
    uint64_t evictions; /* entries dropped to make room for newer ones */
    uint64_t expired;   /* entries found past their record's retention */
    uint64_t entries;   /* held now */
    uint64_t bytes;     /* charged against the bound now */
    uint64_t max_bytes; /* the bound */
};
IDEM_API void idem_engine_cache_stats(struct idem_engine *eng, struct idem_cache_stats *out);

/* ---------------------------------------------------------------------------------------------
 * Shards: principals spread over several PostgreSQL clusters (docs/shards.md)
 *
 * A principal maps to one of IDEM_SHARD_BUCKETS buckets by idem_shard_bucket(); a map kept in a
 * directory store says which cluster owns each bucket.  Every record and application row of a
 * principal lives in the cluster that owns its bucket, and each cluster refuses writes for a
 * bucket it does not own (IDEM_EMOVED), inside the writing transaction.
 * ------------------------------------------------------------------------------------------- */

#define IDEM_SHARD_BUCKETS 1024
/* The longest cluster name a directory may hold. */
#define IDEM_SHARD_NAME_MAX 63
/* The most clusters a set holds (idem_shards_open(), idem_shards_add()). */
#define IDEM_SHARDS_MAX 64

/*
 * The bucket of a principal (`len` bytes, UTF-8 as it is stored): the first 8 bytes of
 * SHA-256(principal) read as an unsigned big-endian 64-bit integer, modulo IDEM_SHARD_BUCKETS.
 * Stable across versions and platforms; PostgreSQL computes the same with the clusters' SQL
 * function idem_bucket_of(text).
 */
IDEM_API unsigned idem_shard_bucket(const void *principal, size_t len);

struct idem_shard_map;

/*
 * Reads the map from `directory`, a store holding the directory's tables (idem_shards_open()
 * creates them): every cluster's name and URI, and each bucket's owner, epoch and whether it is
 * moving, in one read-only transaction.  A map that leaves a bucket without an owner, or names a
 * cluster the directory does not list, is refused (IDEM_ESTORE).  Returns 0 and *out (new, free
 * with idem_shard_map_free), or a negative code with *errmsg (new, free with idem_free; may be
 * NULL).
 */
IDEM_API int idem_shard_map_read(struct idem_store *directory, struct idem_shard_map **out,
                                 char **errmsg);
IDEM_API void idem_shard_map_free(struct idem_shard_map *map);

/* How many clusters the map names, and the i-th one's name and URI (borrowed until the free). */
IDEM_API size_t idem_shard_map_clusters(const struct idem_shard_map *map);
IDEM_API const char *idem_shard_map_name(const struct idem_shard_map *map, size_t i);
IDEM_API const char *idem_shard_map_uri(const struct idem_shard_map *map, size_t i);

/*
 * The owner of `bucket`: *cluster its index, *epoch (may be NULL) the bucket's epoch, which a
 * move raises.  Returns 0, IDEM_EMOVED when the bucket is moving (*cluster is then the owner it
 * is moving from), or IDEM_EINVAL.
 */
IDEM_API int idem_shard_map_owner(const struct idem_shard_map *map, unsigned bucket,
                                  size_t *cluster, int64_t *epoch);

struct idem_shards;

/*
 * Opens a shard set: the directory store named by `directory_uri` (any store URI) with the
 * directory's tables, its map, and a store for each cluster the map names (PostgreSQL only,
 * each opened with `opts`, which may be NULL).  Each cluster gets the fence: its table
 * idem_buckets(bucket, epoch), which holds a row for every bucket it owns, the function
 * idem_bucket_of(text), and a trigger that refuses a write of idem_records for a principal whose
 * bucket has no row there.  Returns 0 and *out (new, close with idem_shards_close), or a
 * negative code with *errmsg (new, free with idem_free; may be NULL).
 */
IDEM_API int idem_shards_open(const char *directory_uri, const struct idem_store_options *opts,
                              struct idem_shards **out, char **errmsg);
/* Closes every cluster's store and the directory.  NULL is a no-op.  No call may be running. */
IDEM_API void idem_shards_close(struct idem_shards *sh);

/*
 * The clusters: their count, and the i-th one's name and store (borrowed until
 * idem_shards_close; a program makes its engine for each store).  Opened in the map's (name)
 * order; a cluster the map names later (idem_shards_add()) is opened by idem_shards_refresh()
 * and takes the next index.  The count only grows, at most to IDEM_SHARDS_MAX, and an index
 * never changes: a program compares the count with how many engines it has, after a refresh
 * or when idem_shards_route() gives an index it has none for, and makes the missing ones.
 * Safe to call while another thread refreshes: an entry below the count is whole.
 */
IDEM_API size_t idem_shards_count(const struct idem_shards *sh);
IDEM_API const char *idem_shards_name(const struct idem_shards *sh, size_t i);
IDEM_API struct idem_store *idem_shards_store(const struct idem_shards *sh, size_t i);

/*
 * Where the calls of `principal` go, by the map this set holds: *index the cluster (for
 * idem_shards_store()).  Returns 0, IDEM_EMOVED when the principal's bucket is moving (answer
 * 503 with a Retry-After: nothing may be written for it meanwhile), or IDEM_EINVAL.  Takes no
 * lock a writer holds and reads no store.
 */
IDEM_API int idem_shards_route(struct idem_shards *sh, const char *principal, size_t *index);

/*
 * Reads the map from the directory again and keeps it if it is whole.  A cluster it names that
 * the set does not hold is opened first (with the set's store options, its fence installed),
 * as the next index (idem_shards_count()); one it cannot open keeps the old map, and the next
 * refresh tries again.  A map that leaves out a cluster of the set is not taken (IDEM_ESTATE):
 * removing a cluster takes a restart.  Reads happen at most every 100 ms however often it is
 * called (a call in between returns 0 at once): a program calls it after every IDEM_EMOVED.
 * Returns 0, IDEM_ESTATE, or the directory's or the new cluster's error.
 */
IDEM_API int idem_shards_refresh(struct idem_shards *sh);

/* Counters of a set since it was opened, for monitoring. */
struct idem_shards_stats {
    uint64_t refreshes;      /* maps read from the directory by idem_shards_refresh() and taken */
    uint64_t refresh_errors; /* refreshes that failed: directory, new cluster, or IDEM_ESTATE */
    uint64_t clusters;       /* idem_shards_count() now */
};
/* Fills *out (zeros for a NULL set). */
IDEM_API void idem_shards_stats(const struct idem_shards *sh, struct idem_shards_stats *out);

/*
 * idem_tx_begin() on the cluster that owns `principal`'s bucket.  The transaction first reads
 * that bucket's row of the cluster's idem_buckets (without locking it): a bucket the cluster does
 * not own, or no longer does, is IDEM_EMOVED (the map is re-read: begin again).  A move of the
 * bucket waits for a transaction that saw the row to end (idem_shards_move()) before it copies and
 * removes the bucket's rows: so everything a write transaction writes is fenced, and a read
 * transaction never reads an old owner's emptied copy.  Returns what idem_tx_begin() returns, or
 * IDEM_EMOVED.
 */
IDEM_API int idem_shards_tx_begin(struct idem_shards *sh, const char *principal, int write,
                                  struct idem_tx **out);

/* A cluster of a shard set being set up: its name (1 to IDEM_SHARD_NAME_MAX characters) and
 * its store URI (PostgreSQL, no password in it). */
struct idem_shard_cluster {
    const char *name;
    const char *uri;
};

/*
 * Sets a directory up: names the `n` clusters and spreads the IDEM_SHARD_BUCKETS buckets over
 * them evenly in the order given (contiguous ranges, epoch 1), in one directory transaction;
 * then installs each cluster's fence (idem_shards_open()) and gives it the idem_buckets rows of
 * the buckets it owns.  Idempotent: a directory that names exactly these clusters and URIs is
 * kept as it is (its buckets may have moved since) and only the fence rows of a cluster that has
 * none yet are written, so a set-up cut short is finished by running it again.  A directory that
 * names other clusters or URIs is refused with IDEM_ESTATE and left alone.  Run it while no move
 * runs.  `opts` (may be NULL) opens every store.  Returns 0, or a negative code with *errmsg
 * (new, free with idem_free; may be NULL).
 */
IDEM_API int idem_shards_init(const char *directory_uri, const struct idem_shard_cluster *clusters,
                              size_t n, const struct idem_store_options *opts, char **errmsg);

/*
 * Adds a cluster to a set's directory: `name` (1 to IDEM_SHARD_NAME_MAX letters, digits, '.',
 * '-' or '_') and `uri` (its PostgreSQL store URI, no password in it).  Opens the cluster, which
 * makes its idem records schema, installs its fence with no bucket, and only then names it in
 * the directory, owning no bucket: idem_shards_move() then moves buckets to it, and the
 * instances open it when their map names it (idem_shards_refresh()).  Returns 0; IDEM_EINVAL for
 * a bad name; IDEM_ECONFLICT when the directory names a cluster `name` already, or one with that
 * URI; IDEM_ESTATE when the set holds IDEM_SHARDS_MAX clusters, or when the cluster's
 * idem_buckets holds rows (a cluster of another set); the store's error (IDEM_EUNAVAIL when it
 * cannot be reached, IDEM_EURI when it is not PostgreSQL); *errmsg (new, free with idem_free;
 * may be NULL) says which.  Safe to run again after a failure: nothing is named until the end.
 */
IDEM_API int idem_shards_add(const char *directory_uri, const char *name, const char *uri,
                             const struct idem_store_options *opts, char **errmsg);

/* The steps of a move, in order, as idem_shards_move() reports them. */
enum idem_shard_move_step {
    IDEM_SHARD_MOVE_FROZEN = 1, /* the directory marks the bucket moving */
    IDEM_SHARD_MOVE_FENCED,     /* no cluster holds the bucket's idem_buckets row */
    IDEM_SHARD_MOVE_DRAINED,    /* every transaction older than that has ended */
    IDEM_SHARD_MOVE_COPIED,     /* the new owner holds the bucket's records */
    IDEM_SHARD_MOVE_FLIPPED,    /* the directory names the new owner, epoch + 1, not moving */
    IDEM_SHARD_MOVE_OPENED,     /* the new owner's idem_buckets row: it takes writes */
    IDEM_SHARD_MOVE_CLEANED,    /* the other clusters' copies of the records are removed */
};

struct idem_shard_move_options {
    const struct idem_store_options *store; /* opens every store; NULL: defaults */
    /* How long each wait (keys in flight, older transactions) may take (0: 30,000 ms). */
    int drain_timeout_ms;
    /*
     * Called after each step (may be NULL) with the milliseconds since the move began and, for
     * COPIED, the number of records copied (else 0).  A non-zero return stops the move there
     * with IDEM_ESTATE, as a crash would: running the move again finishes it.
     */
    int (*on_step)(enum idem_shard_move_step step, int64_t elapsed_ms, int64_t records, void *arg);
    void *arg;
};

/*
 * Moves `bucket` to the cluster named `to` while instances run (docs/shards.md, "Moving a bucket"):
 * freezes it in the directory (instances answer its principals 503), deletes its idem_buckets row
 * on every cluster, waits until the bucket's keys in flight at the owner hold no live lease (their
 * holders may still complete them there: the fence lets them) and every transaction that began
 * before that has ended, copies its records, keys in flight and rows of the tables registered with
 * the SQL function idem_shard_table(table, principal_column) from the owner to `to` in one
 * transaction, flips the map (owner `to`, epoch + 1, not moving) in one directory transaction,
 * gives `to` its idem_buckets row, and removes the bucket's rows from every other cluster.  A move
 * is refused before it freezes anything when `to` has not registered every table the owner has.
 * Each step is safe to cut short (kill -9): run the move again, with the same `to`, to finish it; a
 * move to the bucket's current owner ends a move cut short before its flip without moving anything.
 * No two clusters take writes for the bucket at once, and no record is lost.  `opts` may be NULL.
 * Returns 0, IDEM_EINVAL (a bucket out of range, a cluster the directory does not name),
 * IDEM_ESTATE (the bucket changed under the move, a wait timed out, or on_step stopped it, or `to`
 * lacks a registered table), or the stores' error; *errmsg (new, free with idem_free; may be NULL)
 * says which.
 */
IDEM_API int idem_shards_move(const char *directory_uri, unsigned bucket, const char *to,
                              const struct idem_shard_move_options *opts, char **errmsg);

#ifdef __cplusplus
}
#endif
#endif /* IDEM_IDEM_H */
