/*
 * test_store_sqlite.c - what the SQLite store must refuse at its own level, below the engine's
 * public API, where a race would otherwise need luck to show: a takeover is fenced on the
 * fingerprint the caller read (issue 15, item 4), so a record swept and claimed afresh by another
 * request between that read and the takeover is never resumed as if it were the caller's; and a
 * savepoint rollback that fails breaks the writer, so the aborted transaction's writes are never
 * committed with the next member of the group commit (issue 15, item 2).
 */
#include "internal.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const struct idem_migration biz[] = {
    {1, "rows", "CREATE TABLE biz (id TEXT PRIMARY KEY)", "CREATE TABLE biz (id TEXT PRIMARY KEY)"},
};

static int biz_has(struct idem_store *st, const char *id)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    const char *p[] = {id};
    int n = -1;

    if (idem_tx_begin(st, 0, &tx) < 0)
        return -1;
    if (idem_tx_exec(tx, "SELECT count(*) FROM biz WHERE id = $1", 1, p, &r) == 0)
        n = atoi(idem_rows_get(r, 0, 0));
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return n;
}

static void failed_rollback_never_commits(struct idem_store *st)
{
    struct idem_tx *a = NULL, *b = NULL;
    const char *pa[] = {"aborted"}, *pb[] = {"next"};

    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    CHECK_INT(idem_tx_begin(st, 1, &a), 0);
    CHECK_INT(idem_tx_exec(a, "INSERT INTO biz (id) VALUES ($1)", 1, pa, NULL), 0);
    idem__sq_fail_next_rollback = 1;
    idem_tx_rollback(a); /* its ROLLBACK TO "fails": the row may still be in the batch */
    CHECK_INT(idem__sq_fail_next_rollback, 0);

    /* The next writer gets a fresh connection and batch; the aborted row is nowhere. */
    CHECK_INT(idem_tx_begin(st, 1, &b), 0);
    CHECK_INT(idem_tx_exec(b, "INSERT INTO biz (id) VALUES ($1)", 1, pb, NULL), 0);
    CHECK_INT(idem_tx_commit(b), 0);
    CHECK_INT(biz_has(st, "next"), 1);
    CHECK_INT(biz_has(st, "aborted"), 0);
}

int main(void)
{
    char dir[] = "/tmp/idem-unit-sq-XXXXXX";
    char uri[128];
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    struct idem_call *call = NULL;
    struct idem_tx *tx = NULL;
    enum idem_outcome oc;
    static const struct idem_operation op = {.name = "unit.takeover", .lease_ms = 50,
                                             .wait_ms = 10};
    struct idem_scope scope = {"alice", "unit.takeover", "k"};
    unsigned char fp1[IDEM_FP_LEN], fp2[IDEM_FP_LEN];
    int won = -1;

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(uri, sizeof uri, "sqlite:%s/unit.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(idem_engine_new(st, NULL, &eng), 0);
    CHECK_INT(idem_fingerprint("POST", "/t", NULL, 0, "{\"a\":1}", 7, fp1, NULL), 0);
    CHECK_INT(idem_fingerprint("POST", "/t", NULL, 0, "{\"a\":2}", 7, fp2, NULL), 0);

    /* A processing record of fp1 whose owner vanished: its lease runs out. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "k", fp1, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(call, "forwarded", NULL), 0);
    sleep_ms(120);

    /* A caller that read another fingerprint cannot take it over... */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(st->vt->record_takeover(idem__tx_conn(tx), &scope, fp2, "intruder", 1000, &won), 0);
    CHECK_INT(won, 0);
    idem_tx_rollback(tx);
    /* ...the one that read fp1 can. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(st->vt->record_takeover(idem__tx_conn(tx), &scope, fp1, "heir", 1000, &won), 0);
    CHECK_INT(won, 1);
    CHECK_INT(idem_tx_commit(tx), 0);

    idem_call_end(call); /* its release is fenced out: the heir holds the lease */
    failed_rollback_never_commits(st);
    idem_engine_free(eng);
    idem_store_close(st);
    {
        char cmd[160];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
    }
    return t_done();
}
