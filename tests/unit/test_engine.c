/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_engine.c - the engine's edges that the store contract suite does not walk: bad arguments,
 * calls in the wrong state, policy defaults, and a store URI that names nothing.  (The state
 * machine itself is proven per store by tests/contract/store_contract.c.)
 */
#include "idem/idem.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void count_wake(void *arg)
{
    (*(int *)arg)++;
}

int main(void)
{
    char dir[] = "/tmp/idem-engine-XXXXXX";
    char uri[128];
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    struct idem_call *call = NULL;
    enum idem_outcome oc = IDEM_OUTCOME_NONE;
    unsigned char fp[IDEM_FP_LEN] = {1};
    const struct idem_operation op = {.name = "unit.op"};
    const struct idem_operation nameless = {.name = NULL};
    char *err = NULL;

    if (!mkdtemp(dir))
        return 1;

    /* URIs that name no store are refused with a sentence, and no handle. */
    CHECK_INT(idem_store_open("mysql://x", NULL, &st, &err), IDEM_EURI);
    CHECK(st == NULL);
    CHECK(err && strstr(err, "sqlite:"));
    idem_free(err);
    CHECK_INT(idem_store_open("sqlite:", NULL, &st, &err), IDEM_EURI);
    idem_free(err);
    /* Missing directories are made; under a file they cannot be. */
    CHECK_INT(idem_store_open("sqlite:/dev/null/x/y.db", NULL, &st, &err), IDEM_EUNAVAIL);
    CHECK(err && strstr(err, "/dev/null/x/y.db") && strstr(err, "Not a directory"));
    idem_free(err);

    snprintf(uri, sizeof(uri), "sqlite:%s/e.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    {
        /* Token hashes, emails, stored responses: the files are the owner's alone. */
        char path[160];
        struct stat sb;
        snprintf(path, sizeof(path), "%s/e.db", dir);
        CHECK_INT(stat(path, &sb), 0);
        CHECK_INT((int)(sb.st_mode & 0777), 0600);
        snprintf(path, sizeof(path), "%s/e.db-wal", dir);
        CHECK_INT(stat(path, &sb), 0);
        CHECK_INT((int)(sb.st_mode & 0777), 0600);
    }
    CHECK_STR(idem_store_kind(st), "sqlite");
    CHECK_INT(idem_engine_new(st, NULL, &eng), 0);
    CHECK(strchr(idem_engine_owner(eng), ':') != NULL);

    /* Bad arguments are errors, never outcomes. */
    CHECK_INT(idem_call_begin(eng, &nameless, "p", "k", fp, &call, &oc), IDEM_EINVAL);
    CHECK_INT(idem_call_begin(eng, &op, NULL, "k", fp, &call, &oc), IDEM_EINVAL);
    CHECK_INT(idem_call_begin(NULL, &op, "p", "k", fp, &call, &oc), IDEM_EINVAL);
    CHECK(call == NULL);
    CHECK_INT(oc, IDEM_OUTCOME_NONE);

    /* A fresh call has its first phase open; a second one cannot be opened on top. */
    CHECK_INT(idem_call_begin(eng, &op, "p", "k", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK(idem_call_tx(call) != NULL);
    CHECK_INT(idem_call_phase_begin(call), IDEM_ESTATE);
    CHECK(strstr(idem_call_errmsg(call), "already open") != NULL);
    CHECK_INT(idem_call_complete(call, 42, NULL, 0, NULL, 0), IDEM_EINVAL);
    CHECK_INT(idem_call_advance(call, "one", NULL), 0);
    CHECK_INT(idem_call_advance(call, "two", NULL), IDEM_ESTATE);  /* no phase open */
    CHECK_INT(idem_call_complete(call, 204, NULL, 0, NULL, 0), 0); /* opens its own phase */
    CHECK_INT(idem_call_complete(call, 204, NULL, 0, NULL, 0), IDEM_ESTATE);
    CHECK_INT(idem_call_phase_begin(call), IDEM_ESTATE);
    CHECK_INT(idem_call_response_status(call), 204);
    idem_call_end(call);
    call = NULL;

    /*
     * Staging needs an open phase, committing needs a staged response; both say so.  A second
     * stage with the first still in place fails the fence, and its phase (the claim) is gone.
     */
    CHECK_INT(idem_call_begin(eng, &op, "p", "stage", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_commit(call), IDEM_ESTATE);
    CHECK(strstr(idem_call_errmsg(call), "no response is staged") != NULL);
    CHECK_INT(idem_call_stage(call, 42, NULL, 0, NULL, 0), IDEM_EINVAL);
    CHECK_INT(idem_call_stage(call, 200, NULL, 0, NULL, 3), IDEM_EINVAL);
    CHECK_INT(idem_call_advance(call, "one", NULL), 0);
    CHECK_INT(idem_call_stage(call, 200, NULL, 0, NULL, 0), IDEM_ESTATE);
    CHECK(strstr(idem_call_errmsg(call), "no phase is open") != NULL);
    CHECK_INT(idem_call_commit(call), IDEM_ESTATE);
    CHECK(strstr(idem_call_errmsg(call), "no phase is open") != NULL);
    CHECK_INT(idem_call_phase_begin(call), 0);
    CHECK_INT(idem_call_stage(call, 200, NULL, 0, "a", 1), 0);
    CHECK_INT(idem_call_stage(call, 200, NULL, 0, "b", 1), IDEM_ELEASE);
    CHECK(strstr(idem_call_errmsg(call), "staged") != NULL);
    CHECK(idem_call_tx(call) == NULL);
    CHECK_INT(idem_call_commit(call), IDEM_ESTATE);
    CHECK_INT(idem_call_phase_begin(call), 0);
    CHECK_INT(idem_call_stage(call, 200, NULL, 0, "c", 1), 0);
    CHECK_INT(idem_call_commit(call), 0);
    CHECK_INT(idem_call_stage(call, 200, NULL, 0, "d", 1), IDEM_ESTATE);
    CHECK(strstr(idem_call_errmsg(call), "completed") != NULL);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "d", 1), IDEM_ESTATE);
    CHECK_INT(idem_call_response_status(call), 200);
    idem_call_end(call);
    call = NULL;
    CHECK_INT(idem_call_stage(NULL, 200, NULL, 0, NULL, 0), IDEM_EINVAL);
    CHECK_INT(idem_call_commit(NULL), IDEM_EINVAL);

    /* An empty body is stored and replayed as empty. */
    CHECK_INT(idem_call_begin(eng, &op, "p", "k", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    size_t len = 99;
    CHECK(idem_call_response_body(call, &len) != NULL);
    CHECK_INT(len, 0);
    CHECK_INT(idem_call_retry_after_s(call), 1);
    idem_call_end(call);

    /*
     * Watches: none on a scope not in flight; one on a scope in flight fires once when its call
     * completes, after which the cache answers; a watch ended before that never fires.
     */
    struct idem_watch *w = NULL, *w2 = NULL;
    int woken = 0, woken2 = 0;
    CHECK_INT(idem_watch_inflight(eng, &op, "p", "watched", count_wake, &woken, &w), 0);
    CHECK(w == NULL);
    CHECK_INT(idem_watch_inflight(eng, &op, "p", "k", NULL, &woken, &w), IDEM_EINVAL);
    CHECK_INT(idem_call_begin(eng, &op, "p", "watched", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_watch_inflight(eng, &op, "p", "watched", count_wake, &woken, &w), 1);
    CHECK_INT(idem_watch_inflight(eng, &op, "q", "watched", count_wake, &woken, &w2), 0);
    CHECK(w2 == NULL);
    CHECK_INT(idem_watch_inflight(eng, &op, "p", "watched", count_wake, &woken2, &w2), 1);
    idem_watch_end(w2); /* ended before the call completes: never called */
    CHECK_INT(woken, 0);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "w", 1), 0);
    CHECK_INT(woken, 1);
    CHECK_INT(woken2, 0);
    struct idem_call *cached = NULL;
    CHECK_INT(idem_call_lookup(eng, &op, "p", "watched", fp, &cached, &oc), 0);
    CHECK(cached != NULL);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    idem_call_end(cached);
    idem_call_end(call);
    call = NULL;
    CHECK_INT(woken, 1); /* fired once */
    idem_watch_end(w);
    idem_watch_end(NULL);
    CHECK_INT(idem_call_lookup(eng, &op, "p", "never", fp, &cached, &oc), 0);
    CHECK(cached == NULL);
    CHECK_INT(oc, IDEM_OUTCOME_NONE);

    /* A begin that fails says why, in the store's words, for the caller's log. */
    {
        struct idem_tx *tx = NULL;
        CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
        CHECK_INT(idem_tx_exec(tx, "DROP TABLE idem_records", 0, NULL, NULL), 0);
        CHECK_INT(idem_tx_commit(tx), 0);
        CHECK(idem_call_begin(eng, &op, "p", "gone", fp, &call, &oc) < 0);
        CHECK(call == NULL);
        CHECK(strstr(idem_call_begin_error(), "idem_records") != NULL);
    }

    idem_call_end(NULL);
    idem_call_abort(NULL);
    idem_engine_free(eng);
    idem_store_close(st);
    idem_store_close(NULL);
    CHECK_STR(idem_strerror(IDEM_ELEASE), "lease lost to another owner");
    CHECK_STR(idem_err_name(IDEM_EUNAVAIL), "IDEM_EUNAVAIL");

    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return t_done();
}
