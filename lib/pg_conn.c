/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pg_conn.c - one PostgreSQL session of the store: connecting it, setting it up, and saying what
 * went wrong on it -- a sentence without the password, and the SQLSTATE mapped to an IDEM_E* code.
 *
 * Layers of the PostgreSQL store, bottom up; a file calls only the files below it:
 *   pg_conn.c      a session: connect, session settings, messages, SQLSTATE -> IDEM_E*  (this file)
 *   pg_pipeline.c  round trips: statements pipelined, those nobody waits for held back
 *   pg_listen.c    LISTEN/NOTIFY: the listener thread that wakes waiting duplicates
 *   tx_batch.c     several jobs to a transaction, on connections from a source it is given
 *   store_pg.c     the store's function table: records, transactions, application SQL
 * Under them all only internal.h and libpq; above them store.c, which picks the backend.
 */
#include "store_pg.h"

#include <string.h>

/* ---- messages -------------------------------------------------------------------------------- */

/*
 * Replaces every occurrence of `secret` in `buf` by asterisks ("***", or as many as the secret has
 * characters when it is shorter, so the text never grows), and line breaks by spaces.
 */
void idem__pg_scrub(char *buf, const char *secret)
{
    size_t n = secret ? strlen(secret) : 0;
    size_t stars = n < 3 ? n : 3;
    char *p;

    for (p = buf; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = ' ';
    while (p > buf && p[-1] == ' ')
        *--p = '\0';
    if (n == 0)
        return;
    p = buf;
    while ((p = strstr(p, secret)) != NULL) {
        memmove(p + stars, p + n, strlen(p + n) + 1);
        memset(p, '*', stars);
        p += stars;
    }
}

/* Leaves "postgresql: <what>: <libpq's words>" in c->errmsg, without the password. */
void idem__pg_set_msg(struct idem_conn *c, const char *what, const char *detail, const char *state)
{
    if (state && state[0])
        idem__fmt(c->errmsg, sizeof(c->errmsg), "postgresql: %s: %s (SQLSTATE %s)", what,
                  detail && detail[0] ? detail : "failed", state);
    else
        idem__fmt(c->errmsg, sizeof(c->errmsg), "postgresql: %s: %s", what,
                  detail && detail[0] ? detail : "failed");
    idem__pg_scrub(c->errmsg, c->sh ? c->sh->secret : NULL);
}

int idem__pg_state_is(const char *state, const char *code)
{
    return strcmp(state, code) == 0;
}

static int state_class(const char *state, const char *cls)
{
    return strncmp(state, cls, 2) == 0;
}

/*
 * After a "permission denied" (42501), the statement that fixes it, for the role this store logs
 * in as: "permission denied for schema public" becomes "...; as the owner or a superuser: GRANT
 * CREATE ON SCHEMA public TO idem_gateway".  The object's name comes from the server's message.
 */
static void add_grant_hint(struct idem_conn *c, const char *primary)
{
    static const struct {
        const char *object; /* as the server's message names it */
        const char *grant;  /* what the store's statements need on it */
    } kinds[] = {
        {"for schema ", "GRANT USAGE, CREATE ON SCHEMA"},
        {"for table ", "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE"},
        {"for sequence ", "GRANT USAGE ON SEQUENCE"},
        {"for database ", "GRANT CONNECT, CREATE ON DATABASE"},
        {"for function ", "GRANT EXECUTE ON FUNCTION"},
    };
    const char *user = PQuser(c->pg);
    size_t len = strlen(c->errmsg);

    for (size_t i = 0; primary && i < sizeof kinds / sizeof kinds[0]; i++) {
        const char *at = strstr(primary, kinds[i].object);
        size_t n;
        if (at == NULL)
            continue;
        at += strlen(kinds[i].object);
        n = strcspn(at, " \t\r\n");
        idem__fmt(c->errmsg + len, sizeof(c->errmsg) - len,
                  "; as the object's owner or a superuser: %s %.*s TO %s", kinds[i].grant, (int)n,
                  at, user && user[0] ? user : "<the store's role>");
        return;
    }
    idem__fmt(c->errmsg + len, sizeof(c->errmsg) - len,
              "; grant the role %s the privilege named above (GRANT ... TO %s)",
              user && user[0] ? user : "<the store's role>", user && user[0] ? user : "...");
}

/*
 * Turns a failed result into an IDEM_E* code and a message.  Connection failures (no SQLSTATE,
 * class 08, administrator or crash shutdown) mark the connection broken so the pool drops it.
 */
int idem__pg_fail_res(struct idem_conn *c, const PGresult *res, const char *what)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;

    idem__fmt(c->sqlstate, sizeof(c->sqlstate), "%s", state ? state : "");
    if (!primary && res)
        primary = PQresultErrorMessage(res);
    idem__pg_set_msg(c, what, primary && primary[0] ? primary : PQerrorMessage(c->pg), state);
    if (state && idem__pg_state_is(state, "42501"))
        add_grant_hint(c, primary);
    if (!state || PQstatus(c->pg) != CONNECTION_OK || state_class(state, "08") ||
        idem__pg_state_is(state, "57P01") || idem__pg_state_is(state, "57P02") ||
        idem__pg_state_is(state, "57P03")) {
        c->broken = 1;
        return IDEM_EUNAVAIL;
    }
    if (idem__pg_state_is(state, "23505"))
        return IDEM_ECONFLICT;
    /* The shard fence's refusal (idem_bucket_of's bucket not owned here; lib/shards.c). */
    if (idem__pg_state_is(state, "IDM01"))
        return IDEM_EMOVED;
    /* Transient: serialization failure, deadlock, lock or statement timeout, resources. */
    if (idem__pg_state_is(state, "40001") || idem__pg_state_is(state, "40P01") ||
        idem__pg_state_is(state, "55P03") || idem__pg_state_is(state, "57014") ||
        state_class(state, "53") || state_class(state, "58"))
        return IDEM_EUNAVAIL;
    return IDEM_ESTORE;
}

/* 0 if `res` is a success, else idem__pg_fail_res().  Never frees `res`. */
int idem__pg_check(struct idem_conn *c, const PGresult *res, const char *what)
{
    ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;

    if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK)
        return 0;
    return idem__pg_fail_res(c, res, what);
}

/* ---- connecting ------------------------------------------------------------------------------ */

void idem__pg_notice_ignore(void *arg, const char *message)
{
    (void)arg;
    (void)message; /* "relation already exists, skipping" and friends must not reach stderr */
}

/*
 * Settings of the session, applied after every (re)connect.  A lock wait is bounded by the
 * store's busy timeout, as sqlite3_busy_timeout bounds SQLite's: a claim stuck behind a hung
 * transaction gives up (IDEM_EUNAVAIL, a 503) instead of holding a request forever.  A
 * lock_timeout the user configured for the role or in `options` is left alone.
 */
int idem__pg_session_setup(struct idem_conn *c)
{
    char ms[32];
    const char *params[1] = {ms};
    PGresult *res = NULL;
    int rc;

    PQsetNoticeProcessor(c->pg, idem__pg_notice_ignore, NULL);
    idem__fmt(ms, sizeof(ms), "%d", c->sh->lock_timeout_ms);
    /*
     * A commit must be on disk before it is acknowledged: orderd charges a card after phase 1's
     * commit, and a phase 1 lost in a crash would be run again with a new order id, so a new
     * charge.  Only `on` (the WAL flushed here, and on the synchronous standbys when there are
     * any) and the stronger `remote_apply` say so.  `off` acknowledges before the local flush;
     * `local` and `remote_write` flush here but not on a synchronous standby (remote_write waits
     * only for the standby's write to its OS), so after a failover to that standby an
     * acknowledged commit may be gone and its key would run again.  A server, database or role
     * set to any of those three gets `on` for this session.  A missing lock_timeout gets the
     * store's.
     */
    res = PQexecParams(c->pg,
                       "SELECT CASE WHEN current_setting('synchronous_commit')"
                       " NOT IN ('on', 'remote_apply')"
                       " THEN set_config('synchronous_commit', 'on', false) END,"
                       " CASE WHEN current_setting('lock_timeout') = '0'"
                       " THEN set_config('lock_timeout', $1, false) END",
                       1, NULL, params, NULL, NULL, 0);
    idem__pg_trip(c);
    rc = idem__pg_check(c, res, "configure session");
    PQclear(res);
    return rc;
}

/* Connects c (c->sh says where) and sets its session up; a failure's message is left in c. */
int idem__pg_connect(struct idem_conn *c)
{
    c->pg = PQconnectdbParams(c->sh->keys, c->sh->vals, 1);
    if (!c->pg)
        return IDEM_ENOMEM;
    if (PQstatus(c->pg) != CONNECTION_OK) {
        idem__pg_set_msg(c, "cannot connect", PQerrorMessage(c->pg), NULL);
        return IDEM_EUNAVAIL;
    }
    return idem__pg_session_setup(c);
}
