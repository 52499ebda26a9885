/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_pg.c - the PostgreSQL store: many service instances, one truth.
 *
 * SQLite serves one machine; a PostgreSQL store lets any number of service instances share the
 * records, so a retry that lands on another instance still finds the first request's record.  It
 * must behave exactly as store_sqlite.c does for the contract suite, and these choices make it so:
 *
 * - The primary key decides who owns a key: a claim is one INSERT ... ON CONFLICT DO UPDATE that
 *   only revives a record past retention and unprotected, never a read followed by an insert.
 * - Finishing a key changes no indexed column of its record, so PostgreSQL writes the completed
 *   version in place (HOT): the keys in flight, which recovery and retention look for, are rows
 *   of a table of their own (idem_inflight), which the statements that start or end a key write
 *   in the same statement as the record (docs/postgres.md, "The record layout").
 * - Time is the database's clock (clock_timestamp()), read inside the statements that set or
 *   compare leases and retention, so instances with skewed clocks still agree on who holds a lease.
 * - A statement that fails inside a transaction does not doom the transaction, as on SQLite: the
 *   application's statements run under a savepoint, sent in one pipelined round trip.
 * - Statements whose answers nobody waits for (BEGIN, savepoint statements, the completion of a
 *   record the transaction inserted) go out with the next one that needs its answer, in one
 *   pipeline (pg_pipeline.c; docs/postgres.md, "Round trips").
 * - Connection failures are IDEM_EUNAVAIL and mark the connection broken, so the pool drops it; a
 *   statement that is safe to repeat (the first of a transaction, or a read outside one) is retried
 *   after a reconnect, a serialization failure or a deadlock.
 * - Duplicates waiting for an owner are woken across processes by LISTEN/NOTIFY: one listener
 *   connection and thread per store, started by the first wait (pg_listen.c); a commit that
 *   completes or releases a record is followed by a notification naming (the hash of) its scope.
 *
 * Each pooled connection is used by one thread at a time (libpq allows that) and keeps its
 * prepared statements.  Passwords never reach a message: messages name the server by host, port,
 * database and user, and any password the connection string holds is scrubbed from libpq's text.
 *
 * Why ~1,600 lines: this is the store's two function tables, one function per entry of
 * struct idem_store_methods and struct idem_conn_methods with its SQL beside it, as store_sqlite.c
 * is SQLite's; the machinery under it has files of its own (pg_conn.c, pg_pipeline.c, pg_listen.c,
 * tx_batch.c, migrate.c).
 *
 * Layer: the top of the PostgreSQL store, over every file just named (store_pg.h lists the
 * layers); only store.c, which picks the backend, names it, through idem__pg_methods.
 */
#include "store_pg.h"
#include "tx_batch.h"
#include "ascii.h" /* common/ascii.h: ascii_ncaseeq for the savepoint keywords */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Serialises migrations of every process sharing the database ("idem_mig" as a bigint). */
#define MIGRATION_LOCK_KEY "7594306392080345447"

/* OIDs of the built-in types the store's own statements declare (catalog/pg_type.dat). */
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT4 23
#define OID_TEXT 25
#define OID_BYTEA_ARRAY 1001
#define OID_TEXT_ARRAY 1009

/*
 * Percent of a records page that inserts fill: the rest is for the completed versions of the
 * keys claimed on the page, which PostgreSQL writes in place (HOT) only while they fit.
 */
#define RECORDS_FILLFACTOR "40"

/* libidem's own schema, versioned like an application's (the SQLite one, in PostgreSQL types). */
static const struct idem_migration idem_schema[] = {
    {1, "records", NULL,
     "CREATE TABLE IF NOT EXISTS idem_records ("
     " principal text NOT NULL, operation text NOT NULL, idem_key text NOT NULL,"
     " fingerprint bytea NOT NULL,"
     " status smallint NOT NULL," /* 0 processing, 1 completed */
     " recovery_point text NOT NULL DEFAULT '', recovery_data text,"
     " lease_owner text, lease_expires_ms bigint NOT NULL DEFAULT 0,"
     " response_status integer, response_headers text, response_body bytea,"
     " created_ms bigint NOT NULL, expires_ms bigint NOT NULL,"
     " PRIMARY KEY (principal, operation, idem_key));"
     "CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_ms);"},
    /* Recovery workers list stalled records often; only processing ones are in this index. */
    {2, "stalled index", NULL,
     "CREATE INDEX IF NOT EXISTS idem_records_stalled ON idem_records (lease_expires_ms)"
     " WHERE status = 0"},
    /*
     * Completions in place (HOT): finishing a key must change no indexed column, so the keys in
     * flight are listed by a table of their own instead of an index whose predicate (status) and
     * key (lease_expires_ms) every completion changed; the records' pages keep room for the
     * completed version (docs/postgres.md, "The record layout").  The records are locked against
     * writers while the keys in flight are copied, so none is missed.
     */
    {3, "keys in flight apart", NULL,
     "LOCK TABLE idem_records IN SHARE MODE;"
     "CREATE TABLE IF NOT EXISTS idem_inflight ("
     " principal text NOT NULL, operation text NOT NULL, idem_key text NOT NULL,"
     " PRIMARY KEY (principal, operation, idem_key));"
     "INSERT INTO idem_inflight (principal, operation, idem_key)"
     " SELECT principal, operation, idem_key FROM idem_records WHERE status = 0"
     " ON CONFLICT DO NOTHING;"
     "DROP INDEX IF EXISTS idem_records_stalled;"
     "ALTER TABLE idem_records SET (fillfactor = 70);"},
    /*
     * Room on the page for the completion of every key claimed there, however many are in flight
     * at once: at 70, with 64 requests in flight, a third of the completions found none and were
     * not HOT (61-65%); at 40, 97-98% were, for about 15% more bytes per record (docs/postgres.md,
     * "The record layout").  It applies to the pages written from then on.
     */
    {4, "records fillfactor", NULL,
     "ALTER TABLE idem_records SET (fillfactor = " RECORDS_FILLFACTOR ");"},
};

/* ---- the store's own statements -------------------------------------------------------------- */

#define SCOPE_WHERE "r.principal = $1 AND r.operation = $2 AND r.idem_key = $3"
/* The same key in two tables: a record (r) and a key in flight (f); f and the rows written (u). */
#define R_IS_F "r.principal = f.principal AND r.operation = f.operation AND r.idem_key = f.idem_key"
#define F_IS_U "f.principal = u.principal AND f.operation = u.operation AND f.idem_key = u.idem_key"

/*
 * A statement that writes records (as r) and ends the keys in flight among those it returns: the
 * key leaves idem_inflight in the same statement that finishes or deletes its record, so the
 * table lists exactly the processing records.  `tail` answers from u, the rows written.
 */
#define INFLIGHT_ENDED(dml, tail)                                                                  \
    "WITH u AS (" dml " RETURNING r.principal, r.operation, r.idem_key),"                          \
    " d AS (DELETE FROM idem_inflight f USING u WHERE " F_IS_U ") " tail
/* The answers of such a statement: a row per record written, or the fence (see FENCED). */
#define ROWS_WRITTEN "SELECT 1 FROM u"
#define FENCE_WRITTEN "SELECT 1 / count(*)::int4 FROM u"

/* The fenced updates (owner, status processing), each written once for both of its forms. */
#define ADVANCE_SQL                                                                                \
    "UPDATE idem_records r SET recovery_point = $4, recovery_data = $5,"                           \
    " lease_expires_ms = t.now + $6 FROM (SELECT " DB_NOW_MS " AS now) t"                          \
    " WHERE " SCOPE_WHERE " AND r.status = 0 AND r.lease_owner = $7"
#define ADVANCE_TYPES                                                                              \
    {                                                                                              \
        OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_INT8, OID_TEXT                       \
    }
#define COMPLETE_SQL                                                                               \
    "UPDATE idem_records r SET status = 1, response_status = $4, response_headers = $5,"           \
    " response_body = $6, lease_owner = NULL, lease_expires_ms = 0"                                \
    " WHERE " SCOPE_WHERE " AND r.status = 0 AND r.lease_owner = $7"
#define COMPLETE_TYPES                                                                             \
    {                                                                                              \
        OID_TEXT, OID_TEXT, OID_TEXT, OID_INT4, OID_TEXT, OID_BYTEA, OID_TEXT                      \
    }
/*
 * The completions of several records at once (RS_COMPLETE_MANY): COMPLETE_SQL with each
 * parameter an array, a row each (the response's status as text).  The fence demands a record
 * changed for every row: a row fenced out, or a key twice, fails the statement.
 */
#define COMPLETE_MANY_SQL                                                                          \
    "UPDATE idem_records r SET status = 1, response_status = v.code::int4,"                        \
    " response_headers = v.headers, response_body = v.body, lease_owner = NULL,"                   \
    " lease_expires_ms = 0"                                                                        \
    " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[],"        \
    " $7::text[]) AS v(principal, operation, idem_key, code, headers, body, owner)"                \
    " WHERE r.principal = v.principal AND r.operation = v.operation AND r.idem_key = v.idem_key"   \
    " AND r.status = 0 AND r.lease_owner = v.owner"
#define FENCE_WRITTEN_ALL "SELECT 1 / (count(*) = cardinality($1::text[]))::int4 FROM u"
/*
 * The claims' condition for replacing a record of the scope that is there: its retention ended
 * and no live lease protects it (the key is new again).
 */
#define RETENTION_LET_GO                                                                           \
    "r.expires_ms <= excluded.created_ms"                                                          \
    " AND (r.status = 1 OR r.lease_expires_ms <= excluded.created_ms)"

/*
 * A claim: the primary key decides -- a new key is inserted, an existing one is left alone,
 * unless its retention ended and no live lease protects it, in which case the key is new again.
 * Under READ COMMITTED, a concurrent claimer of the same key waits here for the first one's
 * transaction, then sees its row (committed) and changes nothing, or inserts (rolled back).  The
 * keys won (c) are in flight, in the same statement; a revived processing record is already.
 */
#define CLAIM_INSERT                                                                               \
    "INSERT INTO idem_records AS r (principal, operation, idem_key, fingerprint, status,"          \
    " recovery_point, lease_owner, lease_expires_ms, created_ms, expires_ms)"
#define CLAIM_CONFLICT                                                                             \
    " ON CONFLICT (principal, operation, idem_key) DO UPDATE SET"                                  \
    " fingerprint = excluded.fingerprint, status = 0, recovery_point = excluded.recovery_point,"   \
    " recovery_data = NULL, lease_owner = excluded.lease_owner,"                                   \
    " lease_expires_ms = excluded.lease_expires_ms, response_status = NULL,"                       \
    " response_headers = NULL, response_body = NULL, created_ms = excluded.created_ms,"            \
    " expires_ms = excluded.expires_ms"                                                            \
    " WHERE " RETENTION_LET_GO " RETURNING r.principal, r.operation, r.idem_key"
#define CLAIM_INFLIGHT                                                                             \
    "f AS (INSERT INTO idem_inflight (principal, operation, idem_key)"                             \
    " SELECT principal, operation, idem_key FROM c ON CONFLICT DO NOTHING)"

/*
 * A one-phase operation's record, inserted already completed (the claim's conflict rule: only a
 * record that retention let go is replaced).
 */
#define INSERT_COMPLETED_SQL                                                                       \
    "WITH t AS (SELECT " DB_NOW_MS " AS now)"                                                      \
    " INSERT INTO idem_records AS r (principal, operation, idem_key, fingerprint, status,"         \
    " recovery_point, lease_owner, lease_expires_ms, response_status, response_headers,"           \
    " response_body, created_ms, expires_ms)"                                                      \
    " SELECT $1, $2, $3, $4, 1, '', NULL, 0, $5, $6, $7, t.now, t.now + $8 FROM t"                 \
    " ON CONFLICT (principal, operation, idem_key) DO UPDATE SET"                                  \
    " fingerprint = excluded.fingerprint, status = 1, recovery_point = '',"                        \
    " recovery_data = NULL, lease_owner = NULL, lease_expires_ms = 0,"                             \
    " response_status = excluded.response_status,"                                                 \
    " response_headers = excluded.response_headers, response_body = excluded.response_body,"       \
    " created_ms = excluded.created_ms, expires_ms = excluded.expires_ms"                          \
    " WHERE " RETENTION_LET_GO
#define INSERT_COMPLETED_TYPES                                                                     \
    {                                                                                              \
        OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA, OID_INT4, OID_TEXT, OID_BYTEA, OID_INT8           \
    }
/* An update whose answer is not read: it fails (division by zero) if it changed no row. */
#define FENCED(update) "WITH u AS (" update " RETURNING 1) SELECT 1 / count(*)::int4 FROM u"

/* The store's own statements: rec_sql[k] describes statement k, whose id is k. */
enum rec_stmt {
    RS_CLAIM,
    RS_CLAIM_MANY,
    RS_GET,
    RS_TAKEOVER,
    RS_ADVANCE,
    RS_COMPLETE,
    RS_ADVANCE_DEFERRED,
    RS_COMPLETE_DEFERRED,
    RS_INSERT_COMPLETED,
    RS_INSERT_COMPLETED_DEFERRED,
    RS_RELEASE,
    RS_RELEASE_OWNED,
    RS_FORGET,
    RS_SWEEP,
    RS_STALLED,
    RS_NOTIFY,
    RS_VERSION,
    RS_SET_VERSION,
    RS_COMPLETE_MANY,
    RS_PLAN_PROBES,
    RS_PLAN_RESTORE,
    RS_COUNT
};
_Static_assert(RS_COUNT <= 32, "a statement's id is its bit in c->prepared");

static const struct pg_stmt rec_sql[RS_COUNT] = {
    /* A claim (CLAIM_INSERT): one row if the key was won. */
    [RS_CLAIM] = {.id = RS_CLAIM,
                  .name = "idem_claim",
                  .sql =
                      "WITH t AS (SELECT " DB_NOW_MS " AS now),"
                      " c AS (" CLAIM_INSERT " SELECT $1, $2, $3, $4, 0, $8, $5, t.now + $6, t.now,"
                      " t.now + $7 FROM t" CLAIM_CONFLICT "), " CLAIM_INFLIGHT " SELECT 1 FROM c",
                  .nparams = 8,
                  .types = {OID_TEXT, OID_TEXT, OID_TEXT, OID_BYTEA, OID_TEXT, OID_INT8, OID_INT8,
                            OID_TEXT},
                  .fenced = 0},
    /*
     * The claims of a batch's jobs (noted ahead: claims_collect), one row of the arrays each,
     * the keys distinct (a key twice would fail the statement: an INSERT ... ON CONFLICT DO
     * UPDATE may not touch a row twice).  It answers with the keys won.  It needs no settings
     * of its plan: it joins nothing, and PostgreSQL settles on its generic plan after five runs
     * (a custom plan for the arrays' lengths costs the same to run, and more to make).
     */
    [RS_CLAIM_MANY] = {.id = RS_CLAIM_MANY,
                       .name = "idem_claim_many",
                       .sql =
                           "WITH t AS (SELECT " DB_NOW_MS " AS now),"
                           " c AS (" CLAIM_INSERT " SELECT v.principal, v.operation, v.idem_key,"
                           " v.fingerprint, 0, v.point, v.owner, t.now + v.lease::int8, t.now,"
                           " t.now + v.ttl::int8 FROM t, unnest($1::text[], $2::text[], $3::text[],"
                           " $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[])"
                           " AS v(principal, operation, idem_key, fingerprint, owner, lease, ttl, "
                           "point)" CLAIM_CONFLICT "), " CLAIM_INFLIGHT
                           " SELECT principal, operation, idem_key FROM c",
                       .nparams = 8,
                       .types = {OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_BYTEA_ARRAY,
                                 OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_TEXT_ARRAY},
                       .fenced = 0},
    /* One row always: the database's time, and the record's columns (NULL when there is none). */
    [RS_GET] =
        {.id = RS_GET,
         .name = "idem_get",
         .sql = "SELECT t.now, r.status::int4, r.fingerprint, r.recovery_point, r.recovery_data,"
                " r.lease_owner, r.lease_expires_ms, r.response_status, r.response_headers,"
                " r.response_body, r.expires_ms, r.created_ms"
                " FROM (SELECT " DB_NOW_MS " AS now) t LEFT JOIN idem_records r ON " SCOPE_WHERE,
         .nparams = 3,
         .types = {OID_TEXT, OID_TEXT, OID_TEXT},
         .fenced = 0},
    [RS_TAKEOVER] = {.id = RS_TAKEOVER,
                     .name = "idem_takeover",
                     .sql =
                         "UPDATE idem_records r SET lease_owner = $4, lease_expires_ms = t.now + $5"
                         " FROM (SELECT " DB_NOW_MS " AS now) t"
                         " WHERE " SCOPE_WHERE " AND r.status = 0 AND r.lease_expires_ms <= t.now"
                         " AND r.fingerprint = $6",
                     .nparams = 6,
                     .types = {OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT, OID_INT8, OID_BYTEA},
                     .fenced = 0},
    [RS_ADVANCE] = {.id = RS_ADVANCE,
                    .name = "idem_advance",
                    .sql = ADVANCE_SQL,
                    .nparams = 7,
                    .types = ADVANCE_TYPES,
                    .fenced = 0},
    [RS_COMPLETE] = {.id = RS_COMPLETE,
                     .name = "idem_complete",
                     .sql = INFLIGHT_ENDED(COMPLETE_SQL, ROWS_WRITTEN),
                     .nparams = 7,
                     .types = COMPLETE_TYPES,
                     .fenced = 0},
    /*
     * The two above sent without waiting for their answer (deferred): for the record this very
     * transaction inserted (the row is this transaction's until it ends, so the update must
     * change it), or, a completion, in a whole transaction (only the COMMIT follows).  Should the
     * update change nothing, the division by zero fails the statement, which aborts the
     * transaction and the COMMIT that follows in the same pipeline (IDEM_ELEASE): a record this
     * call does not hold is never changed, even unchecked.
     */
    [RS_ADVANCE_DEFERRED] = {.id = RS_ADVANCE_DEFERRED,
                             .name = "idem_advance_deferred",
                             .sql = FENCED(ADVANCE_SQL),
                             .nparams = 7,
                             .types = ADVANCE_TYPES,
                             .fenced = 1},
    [RS_COMPLETE_DEFERRED] = {.id = RS_COMPLETE_DEFERRED,
                              .name = "idem_complete_deferred",
                              .sql = INFLIGHT_ENDED(COMPLETE_SQL, FENCE_WRITTEN),
                              .nparams = 7,
                              .types = COMPLETE_TYPES,
                              .fenced = 1,
                              .many = &rec_sql[RS_COMPLETE_MANY]},
    /*
     * Completions deferred one after the other (a batch's: tx_batch.c) as one statement.  Should
     * one of them change nothing, the statement fails as the one above does, and the batch with
     * it: its jobs then run alone, each told its own outcome.
     */
    [RS_COMPLETE_MANY] = {.id = RS_COMPLETE_MANY,
                          .name = "idem_complete_many",
                          .sql = INFLIGHT_ENDED(COMPLETE_MANY_SQL, FENCE_WRITTEN_ALL),
                          .nparams = 7,
                          .types = {OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_TEXT_ARRAY, OID_TEXT_ARRAY,
                                    OID_TEXT_ARRAY, OID_BYTEA_ARRAY, OID_TEXT_ARRAY},
                          .fenced = 1,
                          .many = NULL,
                          .before = &rec_sql[RS_PLAN_PROBES],
                          .after = &rec_sql[RS_PLAN_RESTORE]},
    /*
     * The plan of a statement for several rows, set before it and undone after it (its `before`
     * and `after`): one plan for every count of rows (generic), each row probing the primary key.
     * Left to choose, PostgreSQL plans a short batch's statement anew each time -- a custom plan
     * knows the arrays' lengths, which makes it look cheaper than the generic one -- and the
     * planning costs more than the statement; and a generic plan made while the table is small
     * joins by hashing a scan of the whole table, and stays until the table's statistics change.
     * With hash and merge joins and sequential scans off, the one join left is a nested loop over
     * the rows, each an index scan of the primary key.  The values they had are kept in settings
     * of the store's own (idem.*) and put back, so the rest of the transaction is planned as ever;
     * a COMMIT right after ends them instead (pg_pipeline.c), a statement less per batch.
     */
    [RS_PLAN_PROBES] =
        {.id = RS_PLAN_PROBES,
         .name = "idem_plan_probes",
         .sql = "SELECT set_config('idem.pcm', current_setting('plan_cache_mode'), true),"
                " set_config('idem.hj', current_setting('enable_hashjoin'), true),"
                " set_config('idem.mj', current_setting('enable_mergejoin'), true),"
                " set_config('idem.ss', current_setting('enable_seqscan'), true),"
                " set_config('plan_cache_mode', 'force_generic_plan', true),"
                " set_config('enable_hashjoin', 'off', true),"
                " set_config('enable_mergejoin', 'off', true),"
                " set_config('enable_seqscan', 'off', true)",
         .nparams = 0,
         .types = {0},
         .fenced = 0},
    [RS_PLAN_RESTORE] =
        {.id = RS_PLAN_RESTORE,
         .name = "idem_plan_restore",
         .sql = "SELECT set_config('plan_cache_mode', current_setting('idem.pcm'), true),"
                " set_config('enable_hashjoin', current_setting('idem.hj'), true),"
                " set_config('enable_mergejoin', current_setting('idem.mj'), true),"
                " set_config('enable_seqscan', current_setting('idem.ss'), true)",
         .nparams = 0,
         .types = {0},
         .fenced = 0},
    /* Ends the key in flight too: the record it replaced may have been a processing one. */
    [RS_INSERT_COMPLETED] = {.id = RS_INSERT_COMPLETED,
                             .name = "idem_insert_completed",
                             .sql = INFLIGHT_ENDED(INSERT_COMPLETED_SQL, ROWS_WRITTEN),
                             .nparams = 8,
                             .types = INSERT_COMPLETED_TYPES,
                             .fenced = 0},
    /* Sent with the COMMIT: a key another caller holds fails it (IDEM_ELEASE), as above. */
    [RS_INSERT_COMPLETED_DEFERRED] = {.id = RS_INSERT_COMPLETED_DEFERRED,
                                      .name = "idem_insert_completed_deferred",
                                      .sql = INFLIGHT_ENDED(INSERT_COMPLETED_SQL, FENCE_WRITTEN),
                                      .nparams = 8,
                                      .types = INSERT_COMPLETED_TYPES,
                                      .fenced = 1},
    [RS_RELEASE] = {.id = RS_RELEASE,
                    .name = "idem_release",
                    .sql = "UPDATE idem_records r SET lease_expires_ms = 0"
                           " WHERE " SCOPE_WHERE " AND r.status = 0 AND r.lease_owner = $4",
                    .nparams = 4,
                    .types = {OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT},
                    .fenced = 0},
    [RS_RELEASE_OWNED] =
        {.id = RS_RELEASE_OWNED,
         .name = "idem_release_owned",
         .sql = "UPDATE idem_records r SET lease_expires_ms = 0 FROM idem_inflight f"
                " WHERE " R_IS_F " AND r.status = 0 AND r.lease_expires_ms > 0"
                " AND starts_with(r.lease_owner, $1) AND NOT starts_with(r.lease_owner, $2)",
         .nparams = 2,
         .types = {OID_TEXT, OID_TEXT},
         .fenced = 0},
    [RS_FORGET] = {.id = RS_FORGET,
                   .name = "idem_forget",
                   .sql = INFLIGHT_ENDED("DELETE FROM idem_records r"
                                         " WHERE " SCOPE_WHERE
                                         " AND r.status = 0 AND r.lease_owner = $4",
                                         ROWS_WRITTEN),
                   .nparams = 4,
                   .types = {OID_TEXT, OID_TEXT, OID_TEXT, OID_TEXT},
                   .fenced = 0},
    /*
     * "This record may have changed", sent once the phase committed (pg_commit), as a
     * transaction of its own.  Not inside the phase: PostgreSQL serialises every notifying commit
     * of the cluster on one lock that it holds until the commit record is flushed (async.c,
     * PreCommit_Notify), which would queue every phase's fsync behind every other's.  A
     * transaction that wrote nothing but a notification commits without waiting for a flush
     * (xact.c, RecordTransactionCommit), so it holds that lock only for a moment.  One
     * statement for all of a transaction's scopes (a batch's): an array of their hashes.
     */
    [RS_NOTIFY] = {.id = RS_NOTIFY,
                   .name = "idem_notify",
                   .sql = "SELECT pg_notify('" NOTIFY_CHANNEL "', p) FROM unnest($1::text[]) p",
                   .nparams = 1,
                   .types = {OID_TEXT_ARRAY},
                   .fenced = 0},
    /* SKIP LOCKED: sweepers of several instances, and claims reviving a key, never queue here. */
    [RS_SWEEP] = {.id = RS_SWEEP,
                  .name = "idem_sweep",
                  .sql = INFLIGHT_ENDED(
                      "DELETE FROM idem_records r WHERE (r.principal, r.operation, r.idem_key) IN"
                      " (SELECT principal, operation, idem_key"
                      "  FROM idem_records, (SELECT " DB_NOW_MS " AS now) t"
                      "  WHERE expires_ms <= t.now AND (status = 1 OR lease_expires_ms <= t.now)"
                      "  LIMIT $1 FOR UPDATE OF idem_records SKIP LOCKED)",
                      ROWS_WRITTEN),
                  .nparams = 1,
                  .types = {OID_INT4},
                  .fenced = 0},
    [RS_STALLED] = {.id = RS_STALLED,
                    .name = "idem_stalled",
                    .sql = "SELECT r.principal, r.operation, r.idem_key, r.recovery_point"
                           " FROM idem_inflight f JOIN idem_records r ON " R_IS_F ","
                           " (SELECT " DB_NOW_MS " AS now) t"
                           " WHERE r.status = 0 AND r.lease_expires_ms <= t.now"
                           " AND ($1::text IS NULL OR r.operation = $1)"
                           " ORDER BY r.lease_expires_ms LIMIT $2",
                    .nparams = 2,
                    .types = {OID_TEXT, OID_INT4},
                    .fenced = 0},
    [RS_VERSION] = {.id = RS_VERSION,
                    .name = "idem_schema_version",
                    .sql = "SELECT version FROM idem_schema WHERE component = $1",
                    .nparams = 1,
                    .types = {OID_TEXT},
                    .fenced = 0},
    [RS_SET_VERSION] = {.id = RS_SET_VERSION,
                        .name = "idem_schema_set",
                        .sql = "INSERT INTO idem_schema (component, version, applied_ms)"
                               " VALUES ($1, $2, " DB_NOW_MS ")"
                               " ON CONFLICT (component) DO UPDATE SET version = excluded.version,"
                               " applied_ms = excluded.applied_ms",
                        .nparams = 2,
                        .types = {OID_TEXT, OID_INT4},
                        .fenced = 0},
};

/*
 * IDEM__UNFINISHED_SQL (lib/internal.h) read through the keys in flight, so that a page of the
 * listing reads the processing records only, not every record: the same columns, order and
 * parameters.
 */
#define UNFINISHED_SQL                                                                             \
    "SELECT r.operation, r.principal, r.idem_key, r.recovery_point,"                               \
    " encode(r.fingerprint, 'hex'), r.created_ms, r.expires_ms, r.lease_expires_ms, t.now"         \
    " FROM idem_inflight f JOIN idem_records r ON " R_IS_F ", (SELECT " DB_NOW_MS " AS now) t"     \
    " WHERE r.status = 0 AND r.expires_ms > $1 AND ($2 = '' OR r.operation = $2)"                  \
    " AND (r.operation > $3 OR (r.operation = $3 AND (r.principal > $4"                            \
    " OR (r.principal = $4 AND r.idem_key > $5))))"                                                \
    " ORDER BY r.operation, r.principal, r.idem_key LIMIT $6"

/* Whether a failed statement may run again (rec_run): a lost connection, a transient conflict. */
static int retryable(const struct idem_conn *c)
{
    return c->broken || idem__pg_state_is(c->sqlstate, "40001") ||
           idem__pg_state_is(c->sqlstate, "40P01");
}

/* ---- connecting ------------------------------------------------------------------------------ */

/*
 * Parses the connection string once, to refuse a malformed one early, to learn the password that
 * messages must never show and the names they may show.  libpq's parse error is not repeated:
 * it may quote a fragment of the string, which may be the password.
 */
static int shared_new(const char *conninfo, int lock_timeout_ms, struct pg_shared **out, char *err,
                      size_t errlen)
{
    struct pg_shared *sh = NULL;
    PQconninfoOption *opts = NULL;
    char *perr = NULL;
    char display[256] = "";
    size_t used = 0;
    int n = 0;
    int rc = IDEM_ENOMEM;

    *out = NULL;
    opts = PQconninfoParse(conninfo, &perr);
    if (!opts) {
        idem__fmt(err, errlen,
                  "postgresql: the connection string is malformed (expected postgresql://... or "
                  "key=value pairs)");
        rc = perr ? IDEM_EURI : IDEM_ENOMEM;
        goto out;
    }
    sh = calloc(1, sizeof(*sh));
    if (!sh)
        goto out;
    sh->wake[0] = sh->wake[1] = -1;
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        static const char *const shown[] = {"host", "hostaddr", "port", "dbname", "user"};
        if (!o->val || !o->val[0])
            continue;
        if (strcmp(o->keyword, "password") == 0) {
            sh->secret = idem__strdup(o->val);
            if (!sh->secret)
                goto out;
            continue;
        }
        for (size_t i = 0; i < sizeof(shown) / sizeof(shown[0]); i++) {
            if (strcmp(o->keyword, shown[i]) == 0 && used < sizeof(display)) {
                int w = snprintf(display + used, sizeof(display) - used, "%s%s=%s", used ? " " : "",
                                 o->keyword, o->val);
                used += w > 0 ? (size_t)w : 0;
            }
        }
    }
    sh->conninfo = idem__strdup(conninfo);
    sh->display = idem__strdup(display[0] ? display : "the default server");
    if (!sh->conninfo || !sh->display)
        goto out;
    if (sh->secret)
        idem__pg_scrub(sh->display, sh->secret);
    /* Before "dbname" (the expanded user string), so any of them the user sets wins. */
    sh->keys[n] = "client_encoding";
    sh->vals[n++] = "UTF8";
    sh->keys[n] = "fallback_application_name";
    sh->vals[n++] = "libidem";
    if (!getenv("PGCONNECT_TIMEOUT")) {
        sh->keys[n] = "connect_timeout";
        sh->vals[n++] = CONNECT_TIMEOUT_S;
    }
    sh->keys[n] = "keepalives_idle";
    sh->vals[n++] = KEEPALIVES_IDLE_S;
    sh->keys[n] = "keepalives_interval";
    sh->vals[n++] = KEEPALIVES_INTERVAL_S;
    sh->keys[n] = "keepalives_count";
    sh->vals[n++] = KEEPALIVES_COUNT;
    sh->keys[n] = "tcp_user_timeout";
    sh->vals[n++] = TCP_USER_TIMEOUT_MS;
    sh->keys[n] = "dbname";
    sh->vals[n++] = sh->conninfo;
    sh->keys[n] = NULL;
    sh->vals[n] = NULL;
    sh->lock_timeout_ms = lock_timeout_ms;

    if (pthread_mutex_init(&sh->mu, NULL) != 0)
        goto out;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        pthread_mutex_destroy(&sh->mu);
        goto out;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&sh->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&sh->mu);
        goto out;
    }
    pthread_condattr_destroy(&ca);
    /* Without the pipe there is no listener; waits then poll, which is slower but correct. */
    if (pipe(sh->wake) == 0) {
        fcntl(sh->wake[0], F_SETFD, FD_CLOEXEC);
        fcntl(sh->wake[1], F_SETFD, FD_CLOEXEC);
    } else {
        sh->wake[0] = sh->wake[1] = -1;
    }
    *out = sh;
    sh = NULL;
    rc = 0;
out:
    if (sh) {
        free(sh->conninfo);
        free(sh->secret);
        free(sh->display);
        free(sh);
    }
    PQconninfoFree(opts);
    PQfreemem(perr);
    return rc;
}

/* The batcher's connections and commits: the store's pool and counters (pool.c). */
static int pool_get(void *st, struct idem_conn **out, char *err, size_t errlen)
{
    return idem__store_get(st, out, err, errlen);
}

static void pool_put(void *st, struct idem_conn *c)
{
    idem__store_put(st, c);
}

/* A claim its batch's COMMIT found taken wrote nothing: its job is no write commit. */
static void pool_committed(void *st, struct idem_conn *c, uint64_t ntx, int64_t t0)
{
    idem__store_count_commit(st, ntx - (uint64_t)c->ahead_taken, t0);
}

static void shared_free(struct pg_shared *sh);

/*
 * The store's shared state, made by the first connection (idem_store_open, before anyone else):
 * what connections need, the listener's state and the batcher.
 */
static int shared_get(struct idem_store *st, struct pg_shared **out, char *err, size_t errlen)
{
    const struct idem__batch_source pool = {.cm = idem__pg_methods.conn,
                                            .get = pool_get,
                                            .put = pool_put,
                                            .committed = pool_committed,
                                            .ctx = st};
    int rc = 0;

    pthread_mutex_lock(&st->mu);
    if (!st->backend) {
        struct pg_shared *sh = NULL;
        rc = shared_new(st->target, st->opts.busy_timeout_ms, &sh, err, errlen);
        if (rc == 0)
            rc = idem__batcher_open(&pool, &sh->batcher);
        if (rc == 0) {
            sh->round_trips = &st->round_trips;
            st->backend = sh;
        } else {
            shared_free(sh);
        }
    }
    *out = st->backend;
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void cache_reset(struct idem_conn *c)
{
    c->prepared = 0;
    for (int i = 0; i < STMT_CACHE; i++)
        c->cache[i].prepared = 0;
}

/* Reconnects a broken connection with the same parameters; the session starts afresh. */
static int reconnect(struct idem_conn *c)
{
    PQreset(c->pg);
    if (PQstatus(c->pg) != CONNECTION_OK) {
        c->broken = 1;
        idem__pg_set_msg(c, "reconnect", PQerrorMessage(c->pg), NULL);
        return IDEM_EUNAVAIL;
    }
    c->broken = 0;
    c->in_tx = 0;
    idem__pg_deferred_clear(c);
    idem__pg_ahead_clear(c);
    cache_reset(c);
    return idem__pg_session_setup(c);
}

static void pg_close(struct idem_conn *c)
{
    if (!c)
        return;
    for (int i = 0; i < STMT_CACHE; i++)
        free(c->cache[i].sql);
    idem__pg_deferred_clear(c);
    idem__pg_ahead_clear(c);
    PQfinish(c->pg);
    free(c);
}

static int pg_open(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    char why[IDEM_ERRMSG_MAX];
    int rc = 0;
    struct idem_conn *c = NULL;
    struct pg_shared *sh = NULL;

    *out = NULL;
    rc = shared_get(st, &sh, err, errlen);
    if (rc < 0)
        return rc;
    c = calloc(1, sizeof(*c));
    if (!c)
        return IDEM_ENOMEM;
    c->sh = sh;
    rc = idem__pg_connect(c);
    if (rc < 0 && !c->pg)
        goto out;
    if (rc < 0)
        goto fail_msg;
    rc = idem__migrate(&idem__pg_methods, c, "libidem", idem_schema,
                       sizeof(idem_schema) / sizeof(idem_schema[0]), NULL, why, sizeof(why));
    if (rc < 0) {
        idem__fmt(c->errmsg, sizeof(c->errmsg), "%s", why);
        goto fail_msg;
    }
    *out = c;
    c = NULL;
    goto out;
fail_msg:
    idem__fmt(err, errlen, "%s (%s)", c->errmsg, sh->display);
    if (rc != IDEM_ENOMEM)
        rc = IDEM_EUNAVAIL;
out:
    pg_close(c);
    return rc;
}

static const char *pg_errmsg(const struct idem_conn *c)
{
    return c->errmsg;
}

static int pg_conn_ok(struct idem_conn *c)
{
    /* A connection left inside a transaction (a failed rollback) must not be lent again. */
    return !c->broken && !c->in_tx && c->ndefer == 0 && PQstatus(c->pg) == CONNECTION_OK &&
           PQtransactionStatus(c->pg) == PQTRANS_IDLE;
}

/* ---- transactions ---------------------------------------------------------------------------- */

/*
 * Whether an idle connection is still open.  One the server closed while it was idle (a restart,
 * a failover) is seen when its end has arrived, and must be opened again before a transaction
 * begins on it: a batch's first round trip may be its COMMIT, which cannot be retried.  A live
 * idle connection has nothing to read, so one peek that does not wait tells (EAGAIN), the usual
 * case.  When bytes did arrive -- the server's last words (the error it ends a session with),
 * then its end -- libpq reads them, twice: once for the words, once for the end.
 */
static int pg_idle_alive(struct idem_conn *c)
{
    char b;
    ssize_t got = recv(PQsocket(c->pg), &b, 1, MSG_PEEK | MSG_DONTWAIT);

    if (got < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (got == 0)
        return 0;
    for (int i = 0; i < 2; i++)
        if (!PQconsumeInput(c->pg) || PQstatus(c->pg) != CONNECTION_OK)
            return 0;
    return 1;
}

/*
 * Every transaction is READ COMMITTED, whatever the server's default, and that is what claims
 * need.  INSERT ... ON CONFLICT under READ COMMITTED waits for a concurrent inserter of the same
 * key to finish, then acts on the row it committed even though that row is newer than the
 * statement's snapshot: the loser sees a conflict and changes nothing.  Under REPEATABLE READ or
 * SERIALIZABLE the same race ends in a serialization failure (40001) instead, which would turn an
 * ordinary duplicate into an error.  The fenced updates (advance, complete) likewise re-check
 * their WHERE against the latest row version after waiting for a lock.  `write` needs no
 * counterpart to SQLite's BEGIN IMMEDIATE: rows are locked by the statements that write them.
 */
static int pg_begin(struct idem_conn *c, int write)
{
    int rc = 0;

    (void)write;
    if (c->broken || c->in_tx || PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        /* An idle pooled connection the server dropped (a restart) is reopened below. */
        if (!c->broken && PQstatus(c->pg) == CONNECTION_OK) {
            idem__pg_set_msg(c, "begin", "a transaction is already open on this connection", NULL);
            return IDEM_ESTORE;
        }
        c->broken = 1;
    }
    if (!c->broken && !pg_idle_alive(c))
        c->broken = 1;
    if (c->broken) {
        rc = reconnect(c);
        if (rc < 0)
            return rc;
    }
    /* One the server closed without it being seen yet fails at the first statement, which is
     * retried on a new one (rec_run, pg_exec): nothing of the transaction had run. */
    c->ahead_taken = 0;
    idem__pg_defer_begin(c);
    return 0;
}

/*
 * COMMIT, after what is deferred and followed in the same round trip (one pipeline) by the
 * notifications that tell every listening process the records this transaction changed may be
 * read again, each a transaction of its own after the COMMIT.
 *
 * Notifying is best effort: a COMMIT that fails aborts the rest of the pipeline, so nothing is
 * announced; a lost notification only makes a waiter find the change at its next poll.  A
 * deferred statement that fails aborts the pipeline before the COMMIT: the transaction is rolled
 * back and the commit fails with that statement's message.
 */
static void ahead_answer(struct idem_conn *c, int committed);

static int pg_commit(struct idem_conn *c)
{
    struct pipe_q q[3];
    /* The hashes as a text array, "{h1,h2,...}": hex digits need no quoting. */
    char scopes[2 + sizeof(c->notify)];
    const char *vals[1] = {scopes};
    size_t used = 0;
    int n = 0, failed = -1, rc;

    if (c->broken) {
        idem__pg_set_msg(c, "commit", "the connection was lost; the transaction did not commit",
                         NULL);
        rc = IDEM_EUNAVAIL;
        goto out;
    }
    if (c->begin_deferred && c->ndefer == 0) {
        /* Nothing was sent: there is nothing to commit. */
        idem__pg_deferred_clear(c);
        rc = 0;
        goto out;
    }
    q[n] = idem__pg_q_simple("COMMIT", "commit");
    q[n++].ends_tx = 1;
    if (c->nnotify > 0 && !(c->prepared & (1u << RS_NOTIFY)))
        q[n++] = idem__pg_q_prepare(&rec_sql[RS_NOTIFY], "notify");
    if (c->nnotify > 0) {
        scopes[used++] = '{';
        for (int i = 0; i < c->nnotify; i++) {
            if (i > 0)
                scopes[used++] = ',';
            memcpy(scopes + used, c->notify[i], 16);
            used += 16;
        }
        scopes[used++] = '}';
        scopes[used] = '\0';
        q[n++] = idem__pg_q_exec(rec_sql[RS_NOTIFY].name, 1, vals, NULL, NULL, 0, "notify");
    }
    for (int i = 1; i < n; i++)
        q[i].optional = 1; /* the notifications (and their preparation): best effort */
    rc = idem__pg_pipe_run(c, q, n, &failed);
    ahead_answer(c, q[0].ok && strcmp(PQcmdStatus(q[0].res), "COMMIT") == 0);
    if (q[0].ok) {
        /* The COMMIT's answer came, so it stands, even if the connection failed after it. */
        rc = 0;
        /* COMMIT of a transaction an error had aborted "succeeds" as a ROLLBACK. */
        if (strcmp(PQcmdStatus(q[0].res), "COMMIT") != 0) {
            idem__pg_set_msg(c, "commit",
                             "an earlier statement failed, so the transaction was rolled back",
                             NULL);
            rc = IDEM_ESTORE;
        }
    } else if (rc < 0 && c->broken) {
        idem__pg_set_msg(c, "commit",
                         "the connection was lost during COMMIT; the outcome is unknown", NULL);
    } else if (rc < 0 && failed < 0 && PQtransactionStatus(c->pg) == PQTRANS_INERROR) {
        /* A deferred statement failed, so the COMMIT did not run: roll back, keep its message. */
        PGresult *res = PQexec(c->pg, "ROLLBACK");
        idem__pg_trip(c);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
            c->broken = 1;
        PQclear(res);
    }
    for (int i = 0; i < n; i++)
        PQclear(q[i].res);
out:
    ahead_answer(c, 0); /* (when it did not get as far as the COMMIT) */
    idem__pg_tx_forget(c);
    return rc;
}

static int pg_rollback(struct idem_conn *c)
{
    PGTransactionStatusType ts = PQtransactionStatus(c->pg);

    ahead_answer(c, 0);
    idem__pg_tx_forget(c); /* statements held back are simply never sent */
    if (c->broken || ts == PQTRANS_UNKNOWN || ts == PQTRANS_ACTIVE) {
        /* Closing the connection rolls the server's side back. */
        c->broken = 1;
        return IDEM_EUNAVAIL;
    }
    if (ts == PQTRANS_IDLE)
        return 0; /* the BEGIN was never sent, or the server ended it already */
    return idem__pg_run_simple(c, "ROLLBACK", "rollback");
}

/* ---- application SQL ------------------------------------------------------------------------- */

static int ident_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '$' || (unsigned char)ch >= 0x80;
}

/*
 * The highest $k a statement uses, so a call that gives too few parameters is refused as on
 * SQLite (IDEM_EINVAL) instead of failing on the server.  Skips string literals (with E'' escapes),
 * quoted identifiers, comments and dollar-quoted bodies, where "$1" is just text.
 */
static int max_param(const char *sql)
{
    int max = 0;
    const char *p = sql;

    while (*p) {
        if (*p == '\'') {
            int esc =
                p > sql && (p[-1] == 'E' || p[-1] == 'e') && (p - 1 == sql || !ident_char(p[-2]));
            for (p++; *p; p++) {
                if (esc && *p == '\\' && p[1]) {
                    p++;
                } else if (*p == '\'') {
                    if (p[1] != '\'')
                        break;
                    p++;
                }
            }
            if (*p)
                p++;
        } else if (*p == '"') {
            for (p++; *p && !(*p == '"' && p[1] != '"'); p++)
                if (*p == '"')
                    p++;
            if (*p)
                p++;
        } else if (p[0] == '-' && p[1] == '-') {
            while (*p && *p != '\n')
                p++;
        } else if (p[0] == '/' && p[1] == '*') {
            int depth = 1;
            for (p += 2; *p && depth > 0; p++) {
                if (p[0] == '/' && p[1] == '*') {
                    depth++;
                    p++;
                } else if (p[0] == '*' && p[1] == '/') {
                    depth--;
                    p++;
                }
            }
        } else if (*p == '$' && (p == sql || !ident_char(p[-1]))) {
            if (p[1] >= '0' && p[1] <= '9') {
                long k = 0;
                for (p++; *p >= '0' && *p <= '9'; p++)
                    if (k < 100000)
                        k = k * 10 + (*p - '0');
                if (k > max)
                    max = (int)k;
                continue;
            }
            /* A dollar quote: $$...$$ or $tag$...$tag$. */
            const char *tag = p;
            const char *q = p + 1;
            while (*q && *q != '$' && ident_char(*q))
                q++;
            if (*q != '$') {
                p++;
                continue;
            }
            size_t taglen = (size_t)(q - tag) + 1;
            const char *end = q + 1;
            while (*end && strncmp(end, tag, taglen) != 0)
                end++;
            p = *end ? end + taglen : end;
        } else if (ident_char(*p)) {
            while (*p && ident_char(*p))
                p++;
        } else {
            p++;
        }
    }
    return max;
}

/*
 * Finds `sql` in the connection's statement cache or makes an entry for it (not yet prepared).
 * When the least recently used entry is evicted while the server knows it, its name is left in
 * `evict` so the caller deallocates it.
 */
static int app_lookup(struct idem_conn *c, const char *sql, struct app_stmt **out, char *evict,
                      size_t evictlen)
{
    struct app_stmt *victim = &c->cache[0];
    char *copy = NULL;

    evict[0] = '\0';
    for (int i = 0; i < STMT_CACHE; i++) {
        struct app_stmt *e = &c->cache[i];
        if (e->sql && strcmp(e->sql, sql) == 0) {
            e->used = ++c->clock;
            *out = e;
            return 0;
        }
        if (e->used < victim->used)
            victim = e;
    }
    copy = idem__strdup(sql);
    if (!copy)
        return IDEM_ENOMEM;
    if (victim->prepared)
        idem__fmt(evict, evictlen, "%s", victim->name);
    free(victim->sql);
    memset(victim, 0, sizeof(*victim));
    victim->sql = copy;
    victim->nparams = max_param(sql);
    victim->used = ++c->clock;
    idem__fmt(victim->name, sizeof(victim->name), "idem_q%llu", (unsigned long long)++c->serial);
    *out = victim;
    return 0;
}

/*
 * app_lookup() of `sql` to be run with `nparams` parameters (IDEM_EINVAL if it uses more), with
 * the DEALLOCATE of the statement it evicted in `dealloc` ("" if none), for the caller to send.
 */
static int app_entry(struct idem_conn *c, const char *sql, int nparams, struct app_stmt **out,
                     char *dealloc, size_t dealloclen)
{
    char evict[64];
    int rc = app_lookup(c, sql, out, evict, sizeof(evict));

    dealloc[0] = '\0';
    if (rc < 0)
        return rc;
    if (evict[0])
        idem__fmt(dealloc, dealloclen, "DEALLOCATE %s", evict);
    if ((*out)->nparams > nparams) {
        idem__fmt(c->errmsg, sizeof(c->errmsg), "postgresql: statement uses $%d but %d given",
                  (*out)->nparams, nparams);
        return IDEM_EINVAL;
    }
    return 0;
}

/* Copies a result's rows, as text, into the shape both stores share. */
static int rows_from(const PGresult *res, struct idem_rows **out)
{
    int rc = 0;
    int ncols = PQnfields(res);
    const char **names = calloc((size_t)ncols + 1, sizeof(char *));
    const char **vals = calloc((size_t)ncols + 1, sizeof(char *));
    size_t *lens = calloc((size_t)ncols + 1, sizeof(size_t));
    struct idem_rows *r = NULL;
    const char *tag = PQcmdStatus((PGresult *)res);

    *out = NULL;
    if (!names || !vals || !lens) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    for (int i = 0; i < ncols; i++)
        names[i] = PQfname(res, i);
    rc = idem__rows_new(ncols, names, &r);
    if (rc < 0)
        goto out;
    for (int row = 0; row < PQntuples(res); row++) {
        for (int i = 0; i < ncols; i++) {
            int null = PQgetisnull(res, row, i);
            vals[i] = null ? NULL : PQgetvalue(res, row, i);
            lens[i] = null ? 0 : (size_t)PQgetlength(res, row, i);
        }
        rc = idem__rows_append(r, vals, lens);
        if (rc < 0)
            goto out;
    }
    /* A SELECT changes nothing, though libpq counts its rows too. */
    if (tag && strncmp(tag, "SELECT", 6) != 0) {
        const char *n = PQcmdTuples((PGresult *)res);
        r->changed = n && n[0] ? strtoll(n, NULL, 10) : 0;
    }
    *out = r;
    r = NULL;
out:
    idem_rows_free(r);
    free(names);
    free(vals);
    free(lens);
    return rc;
}

static const char *skip_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/*
 * When `p` starts with the keyword `kw` (upper case; any case matches) followed by no identifier
 * character: where the next word begins.  Otherwise NULL.
 */
static const char *after_keyword(const char *p, const char *kw)
{
    size_t n = strlen(kw);
    return ascii_ncaseeq(p, kw, n) && !ident_char(p[n]) ? skip_space(p + n) : NULL;
}

/*
 * Whether `sql` is a savepoint statement of the application's: SAVEPOINT, RELEASE [SAVEPOINT],
 * ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT].  These cannot run under pg_exec's own savepoint:
 * releasing that one would release the application's with it, and a ROLLBACK TO destroys it.
 */
static int is_savepoint_stmt(const char *sql)
{
    const char *p = skip_space(sql);
    const char *q;

    if (after_keyword(p, "SAVEPOINT") || after_keyword(p, "RELEASE"))
        return 1;
    p = after_keyword(p, "ROLLBACK");
    if (p == NULL)
        return 0;
    q = after_keyword(p, "WORK");
    if (q == NULL)
        q = after_keyword(p, "TRANSACTION");
    return after_keyword(q ? q : p, "TO") != NULL;
}

/*
 * Runs an application's savepoint statement as it is.  In a transaction its answer is not waited
 * for: it goes out with the next statement (deferred), so SAVEPOINT costs no round trip of its
 * own.  Unlike other statements, one that fails (a name that does not exist) leaves the
 * transaction aborted, as PostgreSQL does, and is reported by the next statement or the COMMIT; a
 * later ROLLBACK TO an existing savepoint repairs it.
 */
static int exec_savepoint_stmt(struct idem_conn *c, const char *sql, struct idem_rows **rows)
{
    PGresult *res = NULL;
    int rc;

    if (c->in_tx && !rows)
        return idem__pg_defer_simple(c, sql, "exec");
    rc = idem__pg_flush_deferred(c);
    if (rc == 0) {
        res = PQexecParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0);
        idem__pg_trip(c);
        rc = idem__pg_check(c, res, "exec");
    }
    if (c->in_tx)
        c->tx_stmts++;
    if (rc == 0 && rows)
        rc = rows_from(res, rows);
    PQclear(res);
    return rc;
}

/* The PREPARE of an application's statement under its name. */
static struct pipe_q q_prepare_app(const struct app_stmt *e)
{
    struct pipe_q q = idem__pg_q_simple(e->sql, "exec");

    q.name = e->name;
    q.prepare = 1;
    q.nparams = e->nparams;
    return q;
}

/*
 * Runs one application statement.  Inside a transaction it runs under a savepoint, so that a
 * failure (a unique violation above all) leaves the transaction usable, as SQLite does: what is
 * deferred, SAVEPOINT, [DEALLOCATE an evicted statement], [PREPARE], EXECUTE and RELEASE go out
 * in one pipeline, one round trip; a failure's ROLLBACK TO SAVEPOINT goes out with the next
 * statement.  The savepoint is a subtransaction: cheap, but a phase that writes in more than 64
 * statements overflows the server's per-backend subtransaction cache (docs/postgres.md).
 */
static int pg_exec(struct idem_conn *c, const char *sql, int nparams, const char *const *params,
                   struct idem_rows **rows)
{
    int rc = 0;
    struct app_stmt *e = NULL;
    char dealloc[96];

    if (rows)
        *rows = NULL;
    if (c->broken) {
        idem__pg_set_msg(c, "exec", "the connection was lost", NULL);
        return IDEM_EUNAVAIL;
    }
    if (is_savepoint_stmt(sql)) {
        if (max_param(sql) > 0) {
            idem__pg_set_msg(c, "exec", "a savepoint statement takes no parameters", NULL);
            return IDEM_EINVAL;
        }
        return exec_savepoint_stmt(c, sql, rows);
    }
    rc = app_entry(c, sql, nparams, &e, dealloc, sizeof(dealloc));
    if (rc < 0)
        return rc;
    for (int attempt = 0;; attempt++) {
        struct pipe_q q[5];
        int n = 0, ix, prep = -1, dx = -1, failed = -1;
        /* Under a savepoint when in a transaction that is not aborted (a deferred statement may
         * have yet to repair or begin it), unless the transaction is a batch's. */
        const int savepoint =
            c->in_tx && !c->batch &&
            (c->begin_deferred || c->ndefer > 0 || PQtransactionStatus(c->pg) == PQTRANS_INTRANS);
        const int first = c->in_tx && c->tx_stmts == 0 && c->begin_deferred;

        if (savepoint)
            q[n++] = idem__pg_q_simple("SAVEPOINT idem_stmt", "exec");
        if (dealloc[0]) {
            dx = n;
            q[n++] = idem__pg_q_simple(dealloc, "exec");
        }
        if (!e->prepared) {
            prep = n;
            q[n++] = q_prepare_app(e);
        }
        ix = n;
        q[n++] = idem__pg_q_exec(e->name, e->nparams, params, NULL, NULL, 0, "exec");
        if (savepoint)
            q[n++] = idem__pg_q_simple("RELEASE SAVEPOINT idem_stmt", "exec");
        if (c->in_tx)
            c->tx_stmts++;
        rc = idem__pg_pipe_run(c, q, n, &failed);
        if (prep >= 0 && q[prep].ok)
            e->prepared = 1;
        if (dx >= 0 && q[dx].ok)
            dealloc[0] = '\0';
        if (rc == 0 && rows)
            rc = rows_from(q[ix].res, rows);
        for (int i = 0; i < n; i++)
            PQclear(q[i].res);
        if (rc == 0)
            return 0;
        /* The statement failed after its savepoint was taken: undo it, in the next pipeline. */
        if (savepoint && failed > 0 && !c->broken &&
            (idem__pg_defer_simple(c, "ROLLBACK TO SAVEPOINT idem_stmt", "exec") < 0 ||
             idem__pg_defer_simple(c, "RELEASE SAVEPOINT idem_stmt", "exec") < 0))
            c->broken = 1; /* out of memory: the transaction cannot be repaired */
        /* The first statement of a transaction on a connection the server closed while it was
         * idle: nothing of the transaction ran, so it is begun again on a new connection. */
        if (!first || !c->broken || attempt > 0 || reconnect(c) < 0)
            return rc;
        idem__pg_defer_begin(c);
        dealloc[0] = '\0'; /* a new session knows none of the old one's statements */
    }
}

/*
 * An application's statement held back in a batch's transaction (struct idem_conn_methods,
 * exec_deferred): its EXECUTE goes out with the next pipeline, and its failure fails the batch.
 * The first time a session meets it, its PREPARE costs a round trip of its own.  Returns 1 when
 * held back, 0 when not (not a batch's transaction: nothing ran), or a negative code.
 */
static int pg_exec_deferred(struct idem_conn *c, const char *sql, int nparams,
                            const char *const *params)
{
    struct app_stmt *e = NULL;
    char dealloc[96];
    int rc;

    if (c->broken || !c->in_tx || !c->batch || is_savepoint_stmt(sql))
        return 0;
    rc = app_entry(c, sql, nparams, &e, dealloc, sizeof(dealloc));
    if (rc < 0)
        return rc;
    /* (After every EXECUTE of the evicted statement held back before it.) */
    if (dealloc[0]) {
        rc = idem__pg_defer_simple(c, dealloc, "exec");
        if (rc < 0)
            return rc;
    }
    if (!e->prepared) {
        struct pipe_q q = q_prepare_app(e);
        int failed = -1;
        rc = idem__pg_pipe_run(c, &q, 1, &failed);
        e->prepared = q.ok;
        PQclear(q.res);
        if (rc < 0)
            return rc;
    }
    rc = idem__pg_defer_app(c, e->name, e->nparams, params, "exec");
    return rc < 0 ? rc : 1;
}

/* ---- records --------------------------------------------------------------------------------- */

/*
 * Runs one of the store's own statements (prepared with it the first time on this session, in the
 * same round trip, after what is deferred) and hands its result out in *out (new, PQclear).
 * Retried, a bounded number of times, after a serialization failure, a deadlock or a lost
 * connection -- but only where a retry cannot repeat or lose anything: outside a transaction,
 * or when the failed statement was the first of its transaction, which is then begun again.
 */
static int rec_run(struct idem_conn *c, enum rec_stmt k, const char *const *vals, const int *lens,
                   const int *fmts, int binary, const char *what, PGresult **out)
{
    int rc = 0;
    int reconnected = 0;

    *out = NULL;
    for (int attempt = 1;; attempt++) {
        int in_tx = c->in_tx;
        int first = c->tx_stmts == 0;
        struct pipe_q q[6];
        int n = 0, failed;

        if (c->broken) {
            idem__pg_set_msg(c, what, "the connection was lost", NULL);
            rc = IDEM_EUNAVAIL;
        } else {
            const struct pg_stmt *before = rec_sql[k].before, *after = rec_sql[k].after;
            int at;
            if (before && !(c->prepared & (1u << before->id)))
                q[n++] = idem__pg_q_prepare(before, what);
            if (before)
                q[n++] = idem__pg_q_exec(before->name, 0, NULL, NULL, NULL, 0, what);
            if (!(c->prepared & (1u << k)))
                q[n++] = idem__pg_q_prepare(&rec_sql[k], what);
            at = n;
            q[n++] = idem__pg_q_exec(rec_sql[k].name, rec_sql[k].nparams, vals, lens, fmts, binary,
                                     what);
            if (after && !(c->prepared & (1u << after->id)))
                q[n++] = idem__pg_q_prepare(after, what);
            if (after)
                q[n++] = idem__pg_q_exec(after->name, 0, NULL, NULL, NULL, 0, what);
            rc = idem__pg_pipe_run(c, q, n, &failed);
            for (int i = 0; i < n; i++)
                if (i != at || rc != 0)
                    PQclear(q[i].res);
            if (rc == 0)
                *out = q[at].res;
        }
        if (in_tx)
            c->tx_stmts++;
        if (rc == 0)
            return 0;
        if (attempt >= RETRIES_MAX || !retryable(c) || (in_tx && !first) ||
            (c->broken && reconnected))
            return rc;
        if (c->broken) {
            if (reconnect(c) < 0)
                return rc;
            reconnected = 1;
        } else if (in_tx && idem__pg_run_simple(c, "ROLLBACK", "rollback") < 0) {
            return rc;
        }
        if (in_tx)
            idem__pg_defer_begin(c);
        clock_sleep_ms(attempt * 3);
    }
}

/* Rows an INSERT, UPDATE or DELETE changed (rows returned, for a SELECT). */
static int changed_of(const PGresult *res)
{
    const char *tag = PQcmdStatus((PGresult *)res);
    const char *n;

    if (tag && strncmp(tag, "SELECT", 6) == 0)
        return PQntuples(res);
    n = PQcmdTuples((PGresult *)res);
    return n && n[0] ? atoi(n) : 0;
}

/* Remembers that the record of `s` changed; pg_commit tells the listeners once it committed. */
static void notify_after_commit(struct idem_conn *c, const struct idem_scope *s)
{
    char payload[17];

    idem__fmt(payload, sizeof(payload), "%016llx", (unsigned long long)idem__pg_scope_hash(s));
    for (int i = 0; i < c->nnotify; i++)
        if (strcmp(c->notify[i], payload) == 0)
            return;
    /* A phase ends one call's record, a batch one each; more are only a wake-up lost, which
     * polling covers. */
    if (c->nnotify < (int)(sizeof(c->notify) / sizeof(c->notify[0])))
        memcpy(c->notify[c->nnotify++], payload, sizeof(payload));
}

/* What a claim noted ahead came to (struct claim_ahead). */
enum { AHEAD_NOTED, AHEAD_WON, AHEAD_TAKEN, AHEAD_TOLD };

/* The claim noted ahead that is exactly this one, not yet told; or -1. */
static int ahead_find(const struct idem_conn *c, const struct idem_scope *s,
                      const unsigned char fp[IDEM_FP_LEN], const char *owner, int64_t lease_ms,
                      int64_t ttl_ms, const char *point)
{
    for (int i = 0; i < c->nahead; i++) {
        const struct claim_ahead *a = &c->ahead[i];
        if (a->state != AHEAD_TOLD && strcmp(a->principal, s->principal) == 0 &&
            strcmp(a->operation, s->operation) == 0 && strcmp(a->key, s->key) == 0 &&
            strcmp(a->owner, owner) == 0 && strcmp(a->point, point) == 0 &&
            a->lease_ms == lease_ms && a->ttl_ms == ttl_ms && memcmp(a->fp, fp, IDEM_FP_LEN) == 0)
            return i;
    }
    return -1;
}

/*
 * Notes a claim while collecting (claims_collect).  A key noted already is not noted again: its
 * second claim runs as a statement of its own, after the first, as it would have alone.  Past
 * AHEAD_MAX, or out of memory, a claim is simply not noted and runs alone too.
 */
static void ahead_note(struct idem_conn *c, const struct idem_scope *s,
                       const unsigned char fp[IDEM_FP_LEN], const char *owner, int64_t lease_ms,
                       int64_t ttl_ms, const char *point)
{
    struct claim_ahead *a = &c->ahead[c->nahead];

    if (c->nahead == AHEAD_MAX)
        return;
    for (int i = 0; i < c->nahead; i++)
        if (strcmp(c->ahead[i].principal, s->principal) == 0 &&
            strcmp(c->ahead[i].operation, s->operation) == 0 &&
            strcmp(c->ahead[i].key, s->key) == 0)
            return;
    a->principal = idem__strdup(s->principal);
    a->operation = idem__strdup(s->operation);
    a->key = idem__strdup(s->key);
    a->owner = idem__strdup(owner);
    a->point = idem__strdup(point);
    if (!a->principal || !a->operation || !a->key || !a->owner || !a->point) {
        free(a->principal);
        free(a->operation);
        free(a->key);
        free(a->owner);
        free(a->point);
        memset(a, 0, sizeof(*a));
        return;
    }
    memcpy(a->fp, fp, IDEM_FP_LEN);
    a->lease_ms = lease_ms;
    a->ttl_ms = ttl_ms;
    a->state = AHEAD_NOTED;
    c->nahead++;
}

/* RS_CLAIM_MANY's parameters: the claims noted ahead, one array element each, all binary. */
struct claim_many {
    struct pg_array arr[8];
    const char *vals[8];
    int lens[8];
};

static const int claim_many_fmts[8] = {1, 1, 1, 1, 1, 1, 1, 1};

static void claim_many_free(struct claim_many *p)
{
    for (int k = 0; k < 8; k++)
        idem__pg_array_clear(&p->arr[k]);
}

/* Builds `p` (zeroed by the caller, freed with claim_many_free) from the claims noted ahead: 0,
 * or IDEM_ENOMEM. */
static int claim_many_build(struct idem_conn *c, struct claim_many *p)
{
    struct pg_array *arr = p->arr;

    for (int i = 0; i < c->nahead; i++) {
        const struct claim_ahead *a = &c->ahead[i];
        char lease[24], ttl[24];
        idem__fmt(lease, sizeof(lease), "%lld", (long long)a->lease_ms);
        idem__fmt(ttl, sizeof(ttl), "%lld", (long long)a->ttl_ms);
        if (idem__pg_array_add(&arr[0], a->principal, strlen(a->principal)) < 0 ||
            idem__pg_array_add(&arr[1], a->operation, strlen(a->operation)) < 0 ||
            idem__pg_array_add(&arr[2], a->key, strlen(a->key)) < 0 ||
            idem__pg_array_add(&arr[3], (const char *)a->fp, IDEM_FP_LEN) < 0 ||
            idem__pg_array_add(&arr[4], a->owner, strlen(a->owner)) < 0 ||
            idem__pg_array_add(&arr[5], lease, strlen(lease)) < 0 ||
            idem__pg_array_add(&arr[6], ttl, strlen(ttl)) < 0 ||
            idem__pg_array_add(&arr[7], a->point, strlen(a->point)) < 0) {
            idem__pg_set_msg(c, "claim", "out of memory", NULL);
            return IDEM_ENOMEM;
        }
    }
    for (int k = 0; k < 8; k++) {
        idem__pg_array_seal(&arr[k], k == 3);
        p->vals[k] = arr[k].buf;
        p->lens[k] = (int)arr[k].len;
    }
    return 0;
}

/*
 * Each claim noted ahead is won if RS_CLAIM_MANY's rows `res` name its key, else taken: its state,
 * or its caller's answer when it is to be answered at the COMMIT.
 */
static void ahead_settle(struct idem_conn *c, const PGresult *res)
{
    for (int i = 0; i < c->nahead; i++) {
        struct claim_ahead *a = &c->ahead[i];
        int won = 0;
        for (int row = 0; row < PQntuples(res) && !won; row++)
            won = strcmp(a->principal, PQgetvalue(res, row, 0)) == 0 &&
                  strcmp(a->operation, PQgetvalue(res, row, 1)) == 0 &&
                  strcmp(a->key, PQgetvalue(res, row, 2)) == 0;
        if (a->answer)
            *a->answer = won;
        else if (a->state != AHEAD_TOLD)
            a->state = won ? AHEAD_WON : AHEAD_TAKEN;
    }
}

/* Runs the claims noted ahead as one statement (RS_CLAIM_MANY); each one's state is its answer. */
static int ahead_run(struct idem_conn *c)
{
    struct claim_ahead kept[AHEAD_MAX];
    const int n = c->nahead;
    struct claim_many p = {0};
    PGresult *res = NULL;
    int rc = claim_many_build(c, &p);

    if (rc < 0)
        goto out;
    /* Kept aside while it runs: a retry begins the transaction again, which forgets them. */
    memcpy(kept, c->ahead, sizeof(kept[0]) * (size_t)n);
    c->nahead = 0;
    rc = rec_run(c, RS_CLAIM_MANY, p.vals, p.lens, claim_many_fmts, 0, "claim", &res);
    idem__pg_ahead_clear(c);
    memcpy(c->ahead, kept, sizeof(kept[0]) * (size_t)n);
    c->nahead = n;
    if (rc < 0)
        goto out;
    ahead_settle(c, res);
    c->ahead_ran = 1;
out:
    claim_many_free(&p);
    PQclear(res);
    return rc;
}

/*
 * A batch's claims noted ahead as one statement (RS_CLAIM_MANY) held back to go out with the next
 * one that needs an answer -- at the latest the COMMIT -- instead of a round trip of its own: its
 * rows are kept (c->ahead_res), and the COMMIT writes each claim's answer where its caller reads
 * it (pg_record_insert, IDEM__CLAIM_AT_COMMIT).  A batch's claim jobs need their answers only
 * once their batch committed: the claim is each one's only statement.
 */
static int ahead_defer(struct idem_conn *c)
{
    struct claim_many p = {0};
    int rc = claim_many_build(c, &p);

    if (rc == 0)
        rc = idem__pg_defer_stmt(c, &rec_sql[RS_CLAIM_MANY], p.vals, p.lens, claim_many_fmts,
                                 "claim");
    if (rc == 0) {
        c->defer[c->ndefer - 1].keep = &c->ahead_res;
        c->ahead_ran = 1;
        c->ahead_pending = 1;
    }
    claim_many_free(&p);
    return rc;
}

/*
 * Tells each claim answered at the COMMIT (ahead_defer) what it came to: won or taken when the
 * transaction `committed`, else nothing (0: the caller runs it again or fails).
 */
static void ahead_answer(struct idem_conn *c, int committed)
{
    if (!c->ahead_pending)
        return;
    c->ahead_taken = 0;
    for (int i = 0; i < c->nahead; i++)
        if (c->ahead[i].answer)
            *c->ahead[i].answer = 0;
    if (committed && c->ahead_res)
        ahead_settle(c, c->ahead_res);
    for (int i = 0; i < c->nahead; i++) {
        c->ahead_taken += committed && c->ahead[i].answer && !*c->ahead[i].answer;
        c->ahead[i].answer = NULL;
    }
    c->ahead_pending = 0;
}

static void pg_claims_collect(struct idem_conn *c, int on)
{
    c->collecting = on;
    /* One claim is cheaper as the statement for one. */
    if (!on && c->nahead < 2)
        idem__pg_ahead_clear(c);
}

static int pg_record_insert(struct idem_conn *c, const struct idem_scope *s,
                            const unsigned char fp[IDEM_FP_LEN], const char *owner,
                            int64_t lease_ms, int64_t ttl_ms, const char *point, int *inserted)
{
    char lease[24], ttl[24];
    const char *vals[8] = {s->principal, s->operation, s->key, (const char *)fp,
                           owner,        lease,        ttl,    point};
    const int lens[8] = {0, 0, 0, IDEM_FP_LEN, 0, 0, 0, 0};
    const int fmts[8] = {0, 0, 0, 1, 0, 0, 0, 0};
    PGresult *res = NULL;
    int ahead = -1;
    int rc = 0;

    *inserted = 0;
    if (c->collecting) {
        ahead_note(c, s, fp, owner, lease_ms, ttl_ms, point);
        return 0;
    }
    if (c->nahead > 0 && c->in_tx)
        ahead = ahead_find(c, s, fp, owner, lease_ms, ttl_ms, point);
    if (ahead >= 0) {
        /* The batch's claims, all at once when the first of them runs: in a batch's
         * transaction with the next statement that needs an answer, else now. */
        if (!c->ahead_ran)
            rc = c->batch ? ahead_defer(c) : ahead_run(c);
        if (rc < 0)
            return rc;
        if (c->ahead_pending) {
            c->ahead[ahead].state = AHEAD_TOLD;
            c->ahead[ahead].answer = inserted;
            *inserted = IDEM__CLAIM_AT_COMMIT;
            return 0;
        }
        *inserted = c->ahead[ahead].state == AHEAD_WON;
        c->ahead[ahead].state = AHEAD_TOLD;
    } else {
        idem__fmt(lease, sizeof(lease), "%lld", (long long)lease_ms);
        idem__fmt(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
        rc = rec_run(c, RS_CLAIM, vals, lens, fmts, 0, "claim", &res);
        if (rc == 0)
            *inserted = changed_of(res) == 1;
        PQclear(res);
    }
    if (*inserted && c->in_tx) {
        c->claimed = idem__pg_scope_hash(s);
        c->claimed_open = 1;
    }
    return rc;
}

/*
 * Writes a response into the record of `s` with `k_now` (its answer read: *ok whether it changed
 * the row) or, `defer`, `k_deferred` sent with the next statement (*ok = 1; its fence fails that
 * statement or the COMMIT instead); waiters hear of it once committed.  `body_len` is checked
 * against the protocol's cap and put in lens[body_col].
 */
static int write_response(struct idem_conn *c, const struct idem_scope *s, enum rec_stmt k_now,
                          enum rec_stmt k_deferred, int defer, const char *const *vals, int *lens,
                          const int *fmts, int body_col, size_t body_len, const char *what, int *ok)
{
    PGresult *res = NULL;
    int rc;

    *ok = 0;
    if (body_len > (size_t)INT_MAX) {
        idem__pg_set_msg(c, what, "response body too large", NULL);
        return IDEM_ETOOBIG;
    }
    lens[body_col] = (int)body_len;
    if (defer) {
        rc = idem__pg_defer_stmt(c, &rec_sql[k_deferred], vals, lens, fmts, what);
        if (rc == 0) {
            *ok = 1;
            notify_after_commit(c, s);
        }
        return rc;
    }
    rc = rec_run(c, k_now, vals, lens, fmts, 0, what, &res);
    if (rc == 0)
        *ok = changed_of(res) == 1;
    if (*ok)
        notify_after_commit(c, s);
    PQclear(res);
    return rc;
}

static int pg_record_insert_completed(struct idem_conn *c, const struct idem_scope *s,
                                      const unsigned char fp[IDEM_FP_LEN], int64_t ttl_ms,
                                      int status, const char *headers, const void *body,
                                      size_t body_len, int *inserted)
{
    char code[16], ttl[24];
    const char *bytes = body ? (const char *)body : "";
    const char *vals[8] = {s->principal, s->operation, s->key, (const char *)fp,
                           code,         headers,      bytes,  ttl};
    int lens[8] = {0, 0, 0, IDEM_FP_LEN, 0, 0, 0, 0};
    const int fmts[8] = {0, 0, 0, 1, 0, 0, 1, 0};

    idem__fmt(code, sizeof(code), "%d", status);
    idem__fmt(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    /* In a transaction, with the COMMIT, which fails (IDEM_ELEASE) if another caller holds it. */
    return write_response(c, s, RS_INSERT_COMPLETED, RS_INSERT_COMPLETED_DEFERRED, c->in_tx, vals,
                          lens, fmts, 6, body_len, "claim completed", inserted);
}

/* Binary result columns: network byte order integers, raw bytes for text and bytea. */
static int64_t col_int(const PGresult *res, int col)
{
    const unsigned char *p = (const unsigned char *)PQgetvalue(res, 0, col);
    int len = PQgetlength(res, 0, col);
    uint64_t v = 0;

    if (PQgetisnull(res, 0, col) || (len != 2 && len != 4 && len != 8))
        return 0;
    for (int i = 0; i < len; i++)
        v = (v << 8) | p[i];
    if (len < 8 && (p[0] & 0x80))
        v |= ~0ULL << (8 * len); /* sign-extend */
    return (int64_t)v;
}

static int col_bytes(const PGresult *res, int col, char **out, size_t *outlen)
{
    size_t len = (size_t)PQgetlength(res, 0, col);

    *out = NULL;
    if (outlen)
        *outlen = 0;
    if (PQgetisnull(res, 0, col))
        return 0;
    *out = malloc(len + 1);
    if (!*out)
        return IDEM_ENOMEM;
    memcpy(*out, PQgetvalue(res, 0, col), len);
    (*out)[len] = '\0';
    if (outlen)
        *outlen = len;
    return 0;
}

static int pg_record_get(struct idem_conn *c, const struct idem_scope *s, struct idem_record *rec)
{
    const char *vals[3] = {s->principal, s->operation, s->key};
    PGresult *res = NULL;
    char *body = NULL;
    int64_t expires;
    int rc;

    memset(rec, 0, sizeof(*rec));
    rc = rec_run(c, RS_GET, vals, NULL, NULL, 1, "read record", &res);
    if (rc < 0)
        return rc;
    if (PQntuples(res) != 1 || PQnfields(res) != 12) {
        idem__pg_set_msg(c, "read record", "unexpected result shape", NULL);
        rc = IDEM_ESTORE;
        goto out;
    }
    rec->store_now_ms = col_int(res, 0);
    if (PQgetisnull(res, 0, 1))
        goto out; /* no record */
    rec->status = col_int(res, 1) == 1 ? IDEM_REC_COMPLETED : IDEM_REC_PROCESSING;
    rec->lease_expires_ms = col_int(res, 6);
    expires = col_int(res, 10);
    rec->expires_ms = expires;
    rec->created_ms = col_int(res, 11);
    /* Past retention and unprotected, a record is as good as swept: the key is new. */
    rec->found = !(expires <= rec->store_now_ms && (rec->status == IDEM_REC_COMPLETED ||
                                                    rec->lease_expires_ms <= rec->store_now_ms));
    if (PQgetlength(res, 0, 2) == IDEM_FP_LEN)
        memcpy(rec->fp, PQgetvalue(res, 0, 2), IDEM_FP_LEN);
    rec->response_status = (int)col_int(res, 7);
    if (col_bytes(res, 3, &rec->recovery_point, NULL) < 0 ||
        col_bytes(res, 4, &rec->recovery_data, NULL) < 0 ||
        col_bytes(res, 5, &rec->lease_owner, NULL) < 0 ||
        col_bytes(res, 8, &rec->response_headers, NULL) < 0 ||
        col_bytes(res, 9, &body, &rec->response_body_len) < 0) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    if (!body) {
        body = malloc(1);
        if (body)
            body[0] = '\0';
    }
    rec->response_body = body;
    body = NULL;
    if (!rec->recovery_point || !rec->response_body)
        rc = IDEM_ENOMEM;
out:
    free(body);
    PQclear(res);
    if (rc < 0)
        idem__record_clear(rec);
    return rc;
}

static int pg_record_takeover(struct idem_conn *c, const struct idem_scope *s,
                              const unsigned char fp[IDEM_FP_LEN], const char *owner,
                              int64_t lease_ms, int *won)
{
    char lease[24];
    const char *vals[6] = {s->principal, s->operation, s->key, owner, lease, (const char *)fp};
    const int lens[6] = {0, 0, 0, 0, 0, IDEM_FP_LEN};
    const int fmts[6] = {0, 0, 0, 0, 0, 1};
    PGresult *res = NULL;
    int rc;

    *won = 0;
    idem__fmt(lease, sizeof(lease), "%lld", (long long)lease_ms);
    rc = rec_run(c, RS_TAKEOVER, vals, lens, fmts, 0, "take over lease", &res);
    if (rc == 0)
        *won = changed_of(res) == 1;
    PQclear(res);
    return rc;
}

static int pg_record_advance(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                             const char *point, const char *data, int64_t lease_ms, int *ok)
{
    char lease[24];
    const char *vals[7] = {s->principal, s->operation, s->key, point, data, lease, owner};
    PGresult *res = NULL;
    int rc;

    /* Waiters need not hear of it: the record is still processing, under a live lease. */
    *ok = 0;
    idem__fmt(lease, sizeof(lease), "%lld", (long long)lease_ms);
    if (c->in_tx && c->claimed_open && c->claimed == idem__pg_scope_hash(s)) {
        /*
         * The record this transaction inserted: ours until the transaction ends, and still
         * processing after this, so a later completion may be deferred too.
         */
        rc = idem__pg_defer_stmt(c, &rec_sql[RS_ADVANCE_DEFERRED], vals, NULL, NULL,
                                 "advance record");
        *ok = rc == 0;
        return rc;
    }
    rc = rec_run(c, RS_ADVANCE, vals, NULL, NULL, 0, "advance record", &res);
    if (rc == 0)
        *ok = changed_of(res) == 1;
    PQclear(res);
    return rc;
}

static int pg_record_complete(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                              int status, const char *headers, const void *body, size_t body_len,
                              int *ok)
{
    char code[16];
    const char *vals[7] = {
        s->principal, s->operation, s->key, code, headers, body ? (const char *)body : "", owner};
    int lens[7] = {0};
    const int fmts[7] = {0, 0, 0, 0, 0, 1, 0};
    /*
     * The record this transaction inserted: its row is ours until the transaction ends.  Or a
     * whole transaction: only the COMMIT follows, and it fails (IDEM_ELEASE) if the fenced update
     * changed nothing.
     */
    int defer = c->in_tx && ((c->claimed_open && c->claimed == idem__pg_scope_hash(s)) || c->whole);

    int rc;

    idem__fmt(code, sizeof(code), "%d", status);
    rc = write_response(c, s, RS_COMPLETE, RS_COMPLETE_DEFERRED, defer, vals, lens, fmts, 5,
                        body_len, "complete record", ok);
    if (defer && rc != IDEM_ETOOBIG)
        c->claimed_open = 0; /* once: completing it twice is refused, as ever (*ok = 0) */
    return rc;
}

static void pg_whole_tx(struct idem_conn *c)
{
    c->whole = 1;
}

/*
 * A batch's transaction waits for a row lock BATCH_LOCK_WAIT_MS at most: the store runs two
 * batches at once (tx_batch.c), and two batches whose jobs lock the same rows in opposite orders
 * wait for each other, which PostgreSQL breaks only after deadlock_timeout (1 s by default; only
 * a superuser may lower it).  The batch that gives up rolls back and its jobs run alone, each
 * with the store's own lock timeout.  The SET goes out with the BEGIN.
 */
#define BATCH_LOCK_WAIT_MS "100"

static void pg_batch_tx(struct idem_conn *c)
{
    int stmts = c->tx_stmts;

    c->batch = 1;
    if (idem__pg_defer_simple(c, "SET LOCAL lock_timeout = " BATCH_LOCK_WAIT_MS,
                              "batch lock timeout") < 0)
        c->batch = 0; /* (out of memory: without the SET, the savepoints stay too) */
    /* Still the first statement to come: on a connection the server closed while it was idle,
     * it is retried on a new one (which begins the transaction again, not as a batch's). */
    c->tx_stmts = stmts;
}

static int pg_record_release(struct idem_conn *c, const struct idem_scope *s, const char *owner)
{
    const char *vals[4] = {s->principal, s->operation, s->key, owner};
    PGresult *res = NULL;
    int rc;

    rc = rec_run(c, RS_RELEASE, vals, NULL, NULL, 0, "release lease", &res);
    if (rc == 0 && changed_of(res) == 1)
        notify_after_commit(c, s);
    PQclear(res);
    return rc;
}

static int pg_record_release_owned(struct idem_conn *c, const char *prefix, const char *except,
                                   int *released)
{
    const char *vals[2] = {prefix, except};
    PGresult *res = NULL;
    int rc = rec_run(c, RS_RELEASE_OWNED, vals, NULL, NULL, 0, "release leases", &res);

    *released = rc == 0 ? changed_of(res) : 0;
    PQclear(res);
    return rc;
}

static int pg_record_forget(struct idem_conn *c, const struct idem_scope *s, const char *owner,
                            int *ok)
{
    const char *vals[4] = {s->principal, s->operation, s->key, owner};
    PGresult *res = NULL;
    int rc;

    *ok = 0;
    rc = rec_run(c, RS_FORGET, vals, NULL, NULL, 0, "forget record", &res);
    if (rc == 0)
        *ok = changed_of(res) == 1;
    if (*ok)
        notify_after_commit(c, s);
    PQclear(res);
    return rc;
}

static int pg_record_sweep(struct idem_conn *c, int limit, int *deleted)
{
    char n[16];
    const char *vals[1] = {n};
    PGresult *res = NULL;
    int rc;

    *deleted = 0;
    idem__fmt(n, sizeof(n), "%d", limit);
    rc = rec_run(c, RS_SWEEP, vals, NULL, NULL, 0, "sweep", &res);
    if (rc == 0)
        *deleted = changed_of(res);
    PQclear(res);
    return rc;
}

static int pg_record_stalled(struct idem_conn *c, const char *operation, int limit,
                             struct idem_stalled **out, size_t *n)
{
    char lim[16];
    const char *vals[2] = {operation, lim};
    struct idem_stalled *list = NULL;
    PGresult *res = NULL;
    size_t count = 0;
    int rc;

    *out = NULL;
    *n = 0;
    if (limit <= 0)
        return 0;
    idem__fmt(lim, sizeof(lim), "%d", limit);
    rc = rec_run(c, RS_STALLED, vals, NULL, NULL, 0, "list stalled records", &res);
    if (rc < 0)
        return rc;
    if (PQntuples(res) > 0) {
        list = calloc((size_t)PQntuples(res), sizeof(*list));
        if (!list) {
            rc = IDEM_ENOMEM;
            goto out;
        }
    }
    for (int row = 0; row < PQntuples(res) && count < (size_t)limit; row++) {
        struct idem_stalled *it = &list[count++];
        it->principal = idem__strdup(PQgetvalue(res, row, 0));
        it->operation = idem__strdup(PQgetvalue(res, row, 1));
        it->key = idem__strdup(PQgetvalue(res, row, 2));
        it->recovery_point = idem__strdup(PQgetvalue(res, row, 3));
        if (!it->principal || !it->operation || !it->key || !it->recovery_point) {
            rc = IDEM_ENOMEM;
            goto out;
        }
    }
    *out = list;
    *n = count;
    list = NULL;
out:
    if (list)
        idem_stalled_free(list, count);
    PQclear(res);
    return rc;
}

/* ---- migrations ------------------------------------------------------------------------------ */

/* The recorded version of `component`; 0 when none, or when there is no schema table yet. */
static int pg_schema_version(struct idem_conn *c, const char *component, int *version)
{
    const char *vals[1] = {component};
    PGresult *res = NULL;
    int rc;

    *version = 0;
    if (!c->in_tx) {
        /* Outside a transaction a missing table costs nothing; there is no plan to prepare. */
        res = PQexecParams(c->pg, rec_sql[RS_VERSION].sql, 1, rec_sql[RS_VERSION].types, vals, NULL,
                           NULL, 0);
        idem__pg_trip(c);
        rc = idem__pg_check(c, res, "read schema version");
        if (rc < 0 && idem__pg_state_is(c->sqlstate, "42P01"))
            rc = 0; /* undefined_table: nothing was ever migrated */
    } else {
        rc = rec_run(c, RS_VERSION, vals, NULL, NULL, 0, "read schema version", &res);
    }
    if (rc == 0 && PQntuples(res) == 1)
        *version = atoi(PQgetvalue(res, 0, 0));
    PQclear(res);
    return rc;
}

/*
 * The write transaction of a migration step (migrate.c re-reads the version in it).  Processes
 * starting at once are serialised by a transaction-scoped advisory lock taken first (before even
 * the schema table is created, which two sessions could otherwise race on); COMMIT or ROLLBACK
 * releases it, so an idle connection never holds it.
 */
static int pg_migrate_begin(struct idem_conn *c)
{
    int rc = pg_begin(c, 1);

    if (rc == 0)
        rc = idem__pg_run_simple(
            c,
            "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK_KEY ");"
            "CREATE TABLE IF NOT EXISTS idem_schema (component text PRIMARY KEY,"
            " version integer NOT NULL, applied_ms bigint NOT NULL)",
            "lock schema");
    return rc;
}

/* The simple query protocol: a step may hold several statements separated by ';'. */
static int pg_run_script(struct idem_conn *c, const char *sql)
{
    return idem__pg_run_simple(c, sql, "migration");
}

static int pg_schema_set(struct idem_conn *c, const char *component, int version)
{
    char vtext[16];
    const char *vals[2] = {component, vtext};
    PGresult *res = NULL;
    int rc;

    idem__fmt(vtext, sizeof(vtext), "%d", version);
    rc = rec_run(c, RS_SET_VERSION, vals, NULL, NULL, 0, "record migration", &res);
    PQclear(res);
    return rc;
}

static void shared_free(struct pg_shared *sh)
{
    if (!sh)
        return;
    /* First: its jobs still use the store, its pool and its listener. */
    idem__batcher_close(sh->batcher);
    idem__pg_listener_stop(sh);
    if (sh->wake[0] >= 0)
        close(sh->wake[0]);
    if (sh->wake[1] >= 0)
        close(sh->wake[1]);
    pthread_cond_destroy(&sh->cv);
    pthread_mutex_destroy(&sh->mu);
    free(sh->conninfo);
    free(sh->secret);
    free(sh->display);
    free(sh);
}

/* write_run_async: the job joins the store's batcher (tx_batch.c). */
static int pg_write_run_async(struct idem_store *st, struct idem__job_slot *slot, idem__tx_fn fn,
                              void *arg, unsigned flags, idem__commit_done done, void *done_arg,
                              char *err, size_t errlen)
{
    struct pg_shared *sh = st->backend;

    return idem__batch_run_async(sh->batcher, slot, fn, arg, flags, done, done_arg, err, errlen);
}

static void pg_store_close(struct idem_store *st)
{
    shared_free(st->backend);
    st->backend = NULL;
}

static const struct idem_conn_methods pg_conn_methods = {
    .version = IDEM__CONN_V_EXEC_DEFERRED,
    .conn_close = pg_close,
    .errmsg = pg_errmsg,
    .conn_ok = pg_conn_ok,
    .begin = pg_begin,
    .commit = pg_commit,
    .rollback = pg_rollback,
    .exec = pg_exec,
    .record_insert = pg_record_insert,
    .record_insert_completed = pg_record_insert_completed,
    .record_get = pg_record_get,
    .record_takeover = pg_record_takeover,
    .record_advance = pg_record_advance,
    .record_complete = pg_record_complete,
    .record_release = pg_record_release,
    .record_release_owned = pg_record_release_owned,
    .record_forget = pg_record_forget,
    .record_stalled = pg_record_stalled,
    .record_sweep = pg_record_sweep,
    .migrate_begin = pg_migrate_begin,
    .schema_version = pg_schema_version,
    .run_script = pg_run_script,
    .schema_set = pg_schema_set,
    .whole_tx = pg_whole_tx,
    .batch_tx = pg_batch_tx,
    .claims_collect = pg_claims_collect,
    .exec_deferred = pg_exec_deferred,
};

const struct idem_store_methods idem__pg_methods = {
    .version = IDEM__STORE_V_RUN_ASYNC,
    .flags = IDEM__STORE_CLAIMS_FIRST | IDEM__STORE_SPECULATES,
    .kind = "postgresql",
    .unfinished_sql = UNFINISHED_SQL,
    .conn = &pg_conn_methods,
    .conn_open = pg_open,
    .store_close = pg_store_close,
    .wait_change = idem__pg_wait_change,
    .write_run_async = pg_write_run_async,
};
