/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_migrate.c - the rules of the one migration driver (lib/migrate.c), through
 * idem_store_migrate() on SQLite stores in files of a temporary directory: a component's steps
 * apply in the order given, each once, and `applied` counts what this call ran; a run after it
 * applies nothing, and one given more steps resumes at the first not applied.  A step that fails
 * rolls back whole (the statements of its script before the failing one too), leaves the version
 * where it was and stops the run, and its message names the component, the step's version and
 * name, and SQLite's own words; a step without SQLite text fails naming the dialect; versions
 * that do not ascend are refused before anything runs.  Store handles on one file migrating at
 * the same moment, from threads, apply each step exactly once between them: each re-reads the
 * version under the migration lock.  (tests/contract/store_contract.c runs migrations on both
 * stores beside the rest of the contract.)
 */
#include "idem/idem.h"
#include "t.h"
#include "t_store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/idem-unit-migrate-XXXXXX";

/* Each step logs its version, so the log shows which steps ran, how often and in which order. */
static const struct idem_migration log_steps[] = {
    {1, "log", "CREATE TABLE log (step INTEGER); INSERT INTO log VALUES (1)", NULL},
    {2, "two", "INSERT INTO log VALUES (2)", NULL},
    {5, "five", "INSERT INTO log VALUES (5)", NULL},
    {7, "seven", "INSERT INTO log VALUES (7)", NULL},
};
#define NLOG (sizeof log_steps / sizeof log_steps[0])

/* A new store on the file `name` of the temporary directory (or on the one there already). */
static struct idem_store *open_store(const char *name)
{
    struct idem_store_options o = {.pool_size = 2, .busy_timeout_ms = 30000};
    struct idem_store *st = NULL;
    char uri[256], *err = NULL;

    snprintf(uri, sizeof uri, "sqlite:%s/%s", dir, name);
    if (idem_store_open(uri, &o, &st, &err) < 0) {
        fprintf(stderr, "cannot open %s: %s\n", uri, err ? err : "?");
        exit(1);
    }
    return st;
}

/* The steps' log, in the order they wrote it: "1,2,5". */
static const char *log_of(struct idem_store *st, char *buf, size_t cap)
{
    return t_store_cell(st,
                        "SELECT group_concat(step, ',') FROM (SELECT step FROM log ORDER BY rowid)",
                        NULL, buf, cap);
}

/* Whether the table `name` exists: "1" or "0". */
static const char *table_exists(struct idem_store *st, const char *name, char *buf, size_t cap)
{
    return t_store_cell(st, "SELECT count(*) FROM sqlite_master WHERE name = $1", name, buf, cap);
}

static void test_steps_apply_in_order_each_once(void)
{
    struct idem_store *st = open_store("order.db");
    int applied = -1;
    char *err = NULL, buf[64];

    CHECK_INT(idem_store_migrate(st, "unit-order", log_steps, NLOG, &applied, &err), 0);
    CHECK(err == NULL);
    CHECK_INT(applied, 4);
    CHECK_STR(log_of(st, buf, sizeof buf), "1,2,5,7");
    idem_store_close(st);
}

static void test_a_second_run_applies_nothing(void)
{
    struct idem_store *st = open_store("again.db"), *other = NULL;
    int applied = -1;
    char buf[64];

    CHECK_INT(idem_store_migrate(st, "unit-again", log_steps, NLOG, &applied, NULL), 0);
    CHECK_INT(applied, 4);
    CHECK_INT(idem_store_migrate(st, "unit-again", log_steps, NLOG, &applied, NULL), 0);
    CHECK_INT(applied, 0);
    /* Another handle on the file (another process) reads the version the first recorded. */
    other = open_store("again.db");
    applied = -1;
    CHECK_INT(idem_store_migrate(other, "unit-again", log_steps, NLOG, &applied, NULL), 0);
    CHECK_INT(applied, 0);
    CHECK_STR(log_of(other, buf, sizeof buf), "1,2,5,7");
    idem_store_close(other);
    idem_store_close(st);
}

static void test_a_run_resumes_at_the_first_step_not_applied(void)
{
    struct idem_store *st = open_store("resume.db");
    int applied = -1;
    char buf[64];

    CHECK_INT(idem_store_migrate(st, "unit-resume", log_steps, 2, &applied, NULL), 0);
    CHECK_INT(applied, 2);
    CHECK_STR(log_of(st, buf, sizeof buf), "1,2");
    CHECK_INT(idem_store_migrate(st, "unit-resume", log_steps, NLOG, &applied, NULL), 0);
    CHECK_INT(applied, 2);
    CHECK_STR(log_of(st, buf, sizeof buf), "1,2,5,7");
    /* The version belongs to its component: another one starts from the beginning. */
    CHECK_INT(idem_store_migrate(st, "unit-resume-2", log_steps + 1, NLOG - 1, &applied, NULL), 0);
    CHECK_INT(applied, 3);
    CHECK_STR(log_of(st, buf, sizeof buf), "1,2,5,7,2,5,7");
    idem_store_close(st);
}

static void test_a_failed_step_rolls_back_whole_and_names_its_version(void)
{
    static const struct idem_migration broken[] = {
        {1, "base", "CREATE TABLE base (x)", NULL},
        {2, "half",
         "CREATE TABLE half (x); INSERT INTO half VALUES (1); INSERT INTO missing VALUES (1)",
         NULL},
        {3, "after", "CREATE TABLE after3 (x)", NULL},
    };
    static const struct idem_migration fixed[] = {
        {1, "base", "CREATE TABLE base (x)", NULL},
        {2, "half", "CREATE TABLE half (x); INSERT INTO half VALUES (1)", NULL},
        {3, "after", "CREATE TABLE after3 (x)", NULL},
    };
    struct idem_store *st = open_store("fail.db");
    int applied = -1;
    char *err = NULL, buf[64];

    CHECK_INT(idem_store_migrate(st, "unit-fail", broken, 3, &applied, &err), IDEM_EMIGRATE);
    CHECK_INT(applied, 1); /* the step before the failing one */
    CHECK(err && strstr(err, "unit-fail 2") && strstr(err, "half"));
    CHECK(err && strstr(err, "no such table: missing")); /* SQLite's words */
    idem_free(err);
    CHECK_STR(table_exists(st, "base", buf, sizeof buf), "1");
    CHECK_STR(table_exists(st, "half", buf, sizeof buf), "0");   /* its first statements undone */
    CHECK_STR(table_exists(st, "after3", buf, sizeof buf), "0"); /* the run stopped */

    /* The version stayed at 1: the step, mended, runs next (its table would exist otherwise). */
    err = NULL;
    CHECK_INT(idem_store_migrate(st, "unit-fail", fixed, 3, &applied, &err), 0);
    CHECK(err == NULL);
    CHECK_INT(applied, 2);
    CHECK_STR(t_store_cell(st, "SELECT count(*) FROM half", NULL, buf, sizeof buf), "1");
    CHECK_STR(table_exists(st, "after3", buf, sizeof buf), "1");
    idem_store_close(st);
}

static void test_a_step_without_sqlite_text_fails_naming_the_dialect(void)
{
    static const struct idem_migration pg_only[] = {
        {1, "first", "CREATE TABLE first_t (x)", "CREATE TABLE first_t (x)"},
        {2, "pg only", NULL, "CREATE TABLE pg_t (x)"},
    };
    static const struct idem_migration both[] = {
        {1, "first", "CREATE TABLE first_t (x)", "CREATE TABLE first_t (x)"},
        {2, "pg only", "CREATE TABLE pg_t (x)", "CREATE TABLE pg_t (x)"},
    };
    struct idem_store *st = open_store("dialect.db");
    int applied = -1;
    char *err = NULL, buf[64];

    CHECK_INT(idem_store_migrate(st, "unit-dialect", pg_only + 1, 1, &applied, &err),
              IDEM_EMIGRATE);
    CHECK_INT(applied, 0);
    CHECK(err && strstr(err, "SQLite") && strstr(err, "unit-dialect 2"));
    idem_free(err);
    err = NULL;

    /* The steps before it apply, counted; the version stops at the last of them. */
    CHECK_INT(idem_store_migrate(st, "unit-dialect", pg_only, 2, &applied, &err), IDEM_EMIGRATE);
    CHECK_INT(applied, 1);
    CHECK(err && strstr(err, "SQLite"));
    idem_free(err);
    CHECK_STR(table_exists(st, "first_t", buf, sizeof buf), "1");
    CHECK_INT(idem_store_migrate(st, "unit-dialect", both, 2, &applied, NULL), 0);
    CHECK_INT(applied, 1);
    CHECK_STR(table_exists(st, "pg_t", buf, sizeof buf), "1");
    idem_store_close(st);
}

static void test_versions_that_do_not_ascend_are_invalid(void)
{
    static const struct idem_migration same[] = {
        {1, "a", "CREATE TABLE same_a (x)", NULL},
        {1, "b", "CREATE TABLE same_b (x)", NULL},
    };
    static const struct idem_migration down[] = {
        {2, "a", "CREATE TABLE down_a (x)", NULL},
        {1, "b", "CREATE TABLE down_b (x)", NULL},
    };
    struct idem_store *st = open_store("ascend.db");
    int applied = -1;
    char *err = NULL, buf[64];

    CHECK_INT(idem_store_migrate(st, "unit-ascend", same, 2, &applied, &err), IDEM_EINVAL);
    CHECK_INT(applied, 0);
    CHECK(err && strstr(err, "ascend"));
    idem_free(err);
    err = NULL;
    CHECK_INT(idem_store_migrate(st, "unit-ascend", down, 2, &applied, &err), IDEM_EINVAL);
    CHECK(err && strstr(err, "ascend"));
    idem_free(err);
    /* Refused before anything ran: not even the first step. */
    CHECK_STR(table_exists(st, "same_a", buf, sizeof buf), "0");
    CHECK_STR(table_exists(st, "down_a", buf, sizeof buf), "0");

    CHECK_INT(idem_store_migrate(st, "unit-ascend", NULL, 1, &applied, NULL), IDEM_EINVAL);
    CHECK_INT(idem_store_migrate(NULL, "unit-ascend", same, 1, &applied, NULL), IDEM_EINVAL);
    CHECK_INT(idem_store_migrate(st, NULL, same, 1, &applied, NULL), IDEM_EINVAL);
    CHECK_INT(idem_store_migrate(st, "unit-ascend", NULL, 0, &applied, NULL), 0);
    CHECK_INT(applied, 0);
    idem_store_close(st);
}

/* ---- handles migrating at once ------------------------------------------------------------- */

enum { RACERS = 4, RACE_ROUNDS = 5 };

struct racer {
    struct idem_store *st;
    pthread_barrier_t *start;
    int rc, applied;
};

/* Migrates on its own handle once every racer is ready. */
static void *race_one(void *arg)
{
    struct racer *r = arg;

    pthread_barrier_wait(r->start);
    r->rc = idem_store_migrate(r->st, "unit-race", log_steps, NLOG, &r->applied, NULL);
    return NULL;
}

static void test_handles_migrating_at_once_apply_each_step_once(void)
{
    char file[32], buf[64];

    for (int round = 0; round < RACE_ROUNDS; round++) {
        pthread_barrier_t start;
        pthread_t th[RACERS];
        struct racer r[RACERS];
        int total = 0;

        /* A new file each round, every handle opened before any migrates. */
        snprintf(file, sizeof file, "race-%d.db", round);
        pthread_barrier_init(&start, NULL, RACERS);
        for (int i = 0; i < RACERS; i++)
            r[i] = (struct racer){open_store(file), &start, -1, -1};
        for (int i = 0; i < RACERS; i++)
            pthread_create(&th[i], NULL, race_one, &r[i]);
        for (int i = 0; i < RACERS; i++) {
            pthread_join(th[i], NULL);
            CHECK_INT(r[i].rc, 0);
            total += r[i].applied;
        }
        pthread_barrier_destroy(&start);
        CHECK_INT(total, NLOG);                                 /* each step by one of them */
        CHECK_STR(log_of(r[0].st, buf, sizeof buf), "1,2,5,7"); /* each once, in order */
        for (int i = 0; i < RACERS; i++)
            idem_store_close(r[i].st);
    }
}

int main(void)
{
    char cmd[64];

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_steps_apply_in_order_each_once();
    test_a_second_run_applies_nothing();
    test_a_run_resumes_at_the_first_step_not_applied();
    test_a_failed_step_rolls_back_whole_and_names_its_version();
    test_a_step_without_sqlite_text_fails_naming_the_dialect();
    test_versions_that_do_not_ascend_are_invalid();
    test_handles_migrating_at_once_apply_each_step_once();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
