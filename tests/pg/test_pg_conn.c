/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_pg_conn.c - lib/pg_conn.c, one session of a real server (run it through
 * tests/pg/with_pg.sh, which exports IDEM_TEST_PG_URI), below the store: a session connects and
 * is set up with synchronous_commit forced to on unless the role, database or connection asked
 * for on or remote_apply, and the store's lock_timeout unless one was set; a server that refuses
 * the connection is IDEM_EUNAVAIL with libpq's words and never the password; every message is
 * one line without the password; each SQLSTATE maps to its IDEM_E* code (unique violation a
 * conflict, the transient classes unavailable, the connection's own classes unavailable and the
 * session marked broken, the rest a store error with the session kept), a "permission denied"
 * naming the GRANT that fixes it; and the server's notices never reach stderr.
 */
#include "store_pg.h"
#include "t.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *uri;

/* A session on the test database, with `opt` as its libpq `options` when not NULL. */
static struct idem_conn *session_with(struct pg_shared *sh, const char *opt, int *rc)
{
    struct idem_conn *c = calloc(1, sizeof(*c));

    if (!c)
        exit(1);
    memset(sh, 0, sizeof(*sh));
    sh->keys[0] = "dbname";
    sh->vals[0] = uri;
    if (opt) {
        sh->keys[1] = "options";
        sh->vals[1] = opt;
    }
    sh->lock_timeout_ms = 4321;
    c->sh = sh;
    *rc = idem__pg_connect(c);
    return c;
}

static void session_end(struct idem_conn *c)
{
    PQfinish(c->pg);
    free(c);
}

/* The value of `SHOW name` on c, in `buf`. */
static const char *show(struct idem_conn *c, const char *name, char *buf, size_t cap)
{
    char sql[96];
    PGresult *res;

    snprintf(sql, sizeof sql, "SHOW %s", name);
    res = PQexec(c->pg, sql);
    snprintf(buf, cap, "%s",
             PQresultStatus(res) == PGRES_TUPLES_OK ? PQgetvalue(res, 0, 0) : "(error)");
    PQclear(res);
    return buf;
}

static void test_synchronous_commit_is_forced_on_unless_on_or_remote_apply(void)
{
    static const struct {
        const char *asked, *got;
    } cases[] = {
        {NULL, "on"},           {"off", "on"}, {"local", "on"},
        {"remote_write", "on"}, {"on", "on"},  {"remote_apply", "remote_apply"},
    };
    struct pg_shared sh;
    char opt[64], buf[64];
    int rc;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct idem_conn *c;
        if (cases[i].asked)
            snprintf(opt, sizeof opt, "-c synchronous_commit=%s", cases[i].asked);
        c = session_with(&sh, cases[i].asked ? opt : NULL, &rc);
        CHECK_INT(rc, 0);
        CHECK_STR(show(c, "synchronous_commit", buf, sizeof buf), cases[i].got);
        session_end(c);
    }
    /* Set on the role, as an operator would: forced all the same. */
    {
        struct idem_conn *c = session_with(&sh, NULL, &rc);
        PGresult *res = PQexec(c->pg, "ALTER ROLE CURRENT_USER SET synchronous_commit = 'off'");
        CHECK_INT(PQresultStatus(res), PGRES_COMMAND_OK);
        PQclear(res);
        session_end(c);
        c = session_with(&sh, NULL, &rc);
        CHECK_INT(rc, 0);
        CHECK_STR(show(c, "synchronous_commit", buf, sizeof buf), "on");
        res = PQexec(c->pg, "ALTER ROLE CURRENT_USER RESET synchronous_commit");
        CHECK_INT(PQresultStatus(res), PGRES_COMMAND_OK);
        PQclear(res);
        session_end(c);
    }
}

static void test_lock_timeout_is_the_stores_unless_one_was_set(void)
{
    struct pg_shared sh;
    struct idem_conn *c;
    char buf[64];
    int rc;

    c = session_with(&sh, NULL, &rc);
    CHECK_INT(rc, 0);
    CHECK_STR(show(c, "lock_timeout", buf, sizeof buf), "4321ms");
    session_end(c);
    c = session_with(&sh, "-c lock_timeout=77", &rc);
    CHECK_INT(rc, 0);
    CHECK_STR(show(c, "lock_timeout", buf, sizeof buf), "77ms");
    session_end(c);
}

/*
 * A refused connection: IDEM_EUNAVAIL, "postgresql: cannot connect: " and the server's words on
 * one line -- here naming a database whose name is the password, which the message must not
 * show.
 */
static void test_a_refused_connection_is_unavailable_without_the_password(void)
{
    struct pg_shared sh;
    struct idem_conn *c = calloc(1, sizeof(*c));
    char secret[] = "hunter2-not-shown";

    memset(&sh, 0, sizeof sh);
    sh.keys[0] = "dbname";
    sh.vals[0] = uri;
    sh.keys[1] = "dbname";
    sh.vals[1] = secret;
    sh.secret = secret;
    c->sh = &sh;
    CHECK_INT(idem__pg_connect(c), IDEM_EUNAVAIL);
    CHECK(strncmp(c->errmsg, "postgresql: cannot connect: ", 28) == 0);
    CHECK(strstr(c->errmsg, "does not exist") != NULL);
    CHECK(strstr(c->errmsg, "hunter2") == NULL);
    CHECK(strstr(c->errmsg, "\"***\"") != NULL);
    CHECK(strchr(c->errmsg, '\n') == NULL);
    session_end(c);
}

static void test_a_message_is_one_line_without_the_password(void)
{
    char buf[128], secret[] = "s3cr3t";
    struct idem_conn c;
    struct pg_shared sh;

    snprintf(buf, sizeof buf, "FATAL:\tpassword pw1 for pw1x\nfailed\r\n  ");
    idem__pg_scrub(buf, "pw1");
    CHECK_STR(buf, "FATAL: password *** for ***x failed");
    snprintf(buf, sizeof buf, "a=ab b");
    idem__pg_scrub(buf, "ab"); /* a shorter secret: as many stars, so the text never grows */
    CHECK_STR(buf, "a=** b");
    snprintf(buf, sizeof buf, "nothing secret\n");
    idem__pg_scrub(buf, NULL);
    CHECK_STR(buf, "nothing secret");

    memset(&c, 0, sizeof c);
    memset(&sh, 0, sizeof sh);
    sh.secret = secret;
    c.sh = &sh;
    idem__pg_set_msg(&c, "insert", "key s3cr3t\nexists", "23505");
    CHECK_STR(c.errmsg, "postgresql: insert: key *** exists (SQLSTATE 23505)");
    idem__pg_set_msg(&c, "connect", NULL, NULL);
    CHECK_STR(c.errmsg, "postgresql: connect: failed");
}

/* Raises SQLSTATE `state` on c with `msg`, and returns what idem__pg_check made of it. */
static int raise_state(struct idem_conn *c, const char *state, const char *msg)
{
    char sql[256];
    PGresult *res;
    int rc;

    snprintf(sql, sizeof sql, "DO $$ BEGIN RAISE EXCEPTION '%s' USING ERRCODE = '%s'; END $$", msg,
             state);
    res = PQexec(c->pg, sql);
    c->broken = 0;
    rc = idem__pg_check(c, res, "raise");
    PQclear(res);
    return rc;
}

static void test_each_sqlstate_maps_to_its_code(void)
{
    static const struct {
        const char *state;
        int rc;
        int broken;
    } cases[] = {
        {"23505", IDEM_ECONFLICT, 0}, /* unique violation: the key is taken */
        {"40001", IDEM_EUNAVAIL, 0},  /* serialization failure */
        {"40P01", IDEM_EUNAVAIL, 0},  /* deadlock */
        {"55P03", IDEM_EUNAVAIL, 0},  /* lock not available (lock_timeout) */
        {"57014", IDEM_EUNAVAIL, 0},  /* query canceled (statement_timeout) */
        {"53100", IDEM_EUNAVAIL, 0},  /* disk full: class 53, resources */
        {"58030", IDEM_EUNAVAIL, 0},  /* io error: class 58, system */
        {"08006", IDEM_EUNAVAIL, 1},  /* connection failure: class 08 */
        {"57P01", IDEM_EUNAVAIL, 1},  /* admin shutdown */
        {"57P02", IDEM_EUNAVAIL, 1},  /* crash shutdown */
        {"57P03", IDEM_EUNAVAIL, 1},  /* cannot connect now */
        {"22012", IDEM_ESTORE, 0},    /* division by zero: the statement's own fault */
        {"23503", IDEM_ESTORE, 0},    /* foreign key violation */
        {"42P01", IDEM_ESTORE, 0},    /* undefined table */
    };
    struct pg_shared sh;
    char want[32];
    int rc;
    struct idem_conn *c = session_with(&sh, NULL, &rc);

    CHECK_INT(rc, 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = raise_state(c, cases[i].state, "raised");
        if (got != cases[i].rc || c->broken != cases[i].broken)
            fprintf(stderr, "  SQLSTATE %s: %d (broken %d), expected %d (broken %d)\n",
                    cases[i].state, got, c->broken, cases[i].rc, cases[i].broken);
        CHECK_INT(got, cases[i].rc);
        CHECK_INT(c->broken, cases[i].broken);
        CHECK_STR(c->sqlstate, cases[i].state);
        snprintf(want, sizeof want, "(SQLSTATE %s)", cases[i].state);
        CHECK(strstr(c->errmsg, want) != NULL);
    }
    /* "permission denied" says which GRANT fixes it, for the role the store logs in as. */
    CHECK_INT(raise_state(c, "42501", "permission denied for table idem_records"), IDEM_ESTORE);
    CHECK(strstr(c->errmsg, "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE idem_records TO "
                            "postgres") != NULL);
    session_end(c);
}

/* A session the server ended: no SQLSTATE of a statement, or 57P01; either way broken. */
static void test_a_terminated_session_is_broken(void)
{
    struct pg_shared sh, sh2;
    int rc;
    struct idem_conn *c = session_with(&sh, NULL, &rc);
    struct idem_conn *killer = session_with(&sh2, NULL, &rc);
    char sql[96];
    PGresult *res;

    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d)", PQbackendPID(c->pg));
    res = PQexec(killer->pg, sql);
    CHECK_INT(PQresultStatus(res), PGRES_TUPLES_OK);
    PQclear(res);
    res = PQexec(c->pg, "SELECT 1");
    CHECK_INT(idem__pg_check(c, res, "after terminate"), IDEM_EUNAVAIL);
    CHECK_INT(c->broken, 1);
    PQclear(res);
    session_end(killer);
    session_end(c);
}

/* The server's notices ("relation already exists, skipping") never reach stderr. */
static void test_notices_do_not_reach_stderr(void)
{
    struct pg_shared sh;
    char path[] = "/tmp/idem-pg-conn-stderr-XXXXXX", buf[4096] = "";
    int rc, fd = mkstemp(path), saved = dup(2);
    struct idem_conn *c = session_with(&sh, NULL, &rc);
    PGresult *res;
    ssize_t n;

    CHECK_INT(rc, 0);
    CHECK(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, 2);
    res = PQexec(c->pg, "DO $$ BEGIN RAISE NOTICE 'idem-notice-marker'; END $$");
    PQclear(res);
    res = PQexec(c->pg, "CREATE TEMP TABLE IF NOT EXISTS n (v int)");
    PQclear(res);
    res = PQexec(c->pg, "CREATE TEMP TABLE IF NOT EXISTS n (v int)");
    PQclear(res);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    n = pread(fd, buf, sizeof buf - 1, 0);
    CHECK_INT(n, 0);
    close(fd);
    unlink(path);
    session_end(c);
}

int main(void)
{
    uri = getenv("IDEM_TEST_PG_URI");
    if (!uri) {
        fprintf(stderr, "IDEM_TEST_PG_URI is not set: run me through tests/pg/with_pg.sh\n");
        return 1;
    }
    test_synchronous_commit_is_forced_on_unless_on_or_remote_apply();
    test_lock_timeout_is_the_stores_unless_one_was_set();
    test_a_refused_connection_is_unavailable_without_the_password();
    test_a_message_is_one_line_without_the_password();
    test_each_sqlstate_maps_to_its_code();
    test_a_terminated_session_is_broken();
    test_notices_do_not_reach_stderr();
    return t_done();
}
