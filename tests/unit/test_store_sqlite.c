/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_store_sqlite.c - what the SQLite store's tables (lib/store_sqlite.c) must refuse at their
 * own level, below the engine's public API, where a race would otherwise need luck to show: a
 * takeover is fenced on the fingerprint the caller read, so a record swept and claimed afresh by
 * another request between that read and the takeover is never resumed as if it were the caller's.
 * The group commit below it is test_sqlite_commit.c's.
 */
#include "internal.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>

static void takeover_is_fenced_on_the_fingerprint_read(struct idem_store *st)
{
    struct idem_engine *eng = NULL;
    struct idem_call *call = NULL;
    struct idem_tx *tx = NULL;
    enum idem_outcome oc;
    static const struct idem_operation op = {
        .name = "unit.takeover", .lease_ms = 50, .wait_ms = 10};
    struct idem_scope scope = {"alice", "unit.takeover", "k"};
    unsigned char fp1[IDEM_FP_LEN], fp2[IDEM_FP_LEN];
    int won = -1;

    CHECK_INT(idem_engine_new(st, NULL, &eng), 0);
    CHECK_INT(idem_fingerprint("POST", "/t", NULL, 0, "{\"a\":1}", 7, fp1, NULL), 0);
    CHECK_INT(idem_fingerprint("POST", "/t", NULL, 0, "{\"a\":2}", 7, fp2, NULL), 0);

    /*
     * A processing record of fp1 whose owner vanished: its lease runs out.  Time must pass: the
     * advance set the lease to end 50 ms after a moment before it returned, so 120 ms later it
     * has, however late this thread runs (the refusal below would otherwise prove nothing).
     */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "k", fp1, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(call, "forwarded", NULL), 0);
    t_sleep_ms(120);

    /* A caller that read another fingerprint cannot take it over... */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(st->cm->record_takeover(idem__tx_conn(tx), &scope, fp2, "intruder", 1000, &won), 0);
    CHECK_INT(won, 0);
    idem_tx_rollback(tx);
    /* ...the one that read fp1 can. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(st->cm->record_takeover(idem__tx_conn(tx), &scope, fp1, "heir", 1000, &won), 0);
    CHECK_INT(won, 1);
    CHECK_INT(idem_tx_commit(tx), 0);

    idem_call_end(call); /* its release is fenced out: the heir holds the lease */
    idem_engine_free(eng);
}

int main(void)
{
    char dir[] = "/tmp/idem-unit-sq-XXXXXX";
    char uri[128], cmd[160];
    struct idem_store *st = NULL;

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(uri, sizeof uri, "sqlite:%s/unit.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    takeover_is_fenced_on_the_fingerprint_read(st);
    idem_store_close(st);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
