/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_contract.c - the store contract suite: the behaviour every store must show, written once
 * and run against each store (`store_contract sqlite`; `store_contract postgresql` with
 * IDEM_TEST_PG_URI set, once that store exists).
 *
 * It drives the public engine API only, so what it proves is what a service sees: one owner per
 * key under a race, byte-identical replay, mismatch, lease expiry and takeover with fencing,
 * resume from a recovery point without re-running a finished phase, retention, and that a rolled
 * back phase leaves neither a record nor a business row.
 *
 * Why one file of ~2,000 lines: it is the contract, one check per rule, and a store must pass all
 * of it; one executable run per store keeps the list in one place.
 */
#include "idem/idem.h"
#include "t.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char store_uri[1024];
static const char *store_kind;

static const struct idem_migration biz_schema[] = {
    {1, "business rows", "CREATE TABLE biz (id TEXT PRIMARY KEY, note TEXT)",
     "CREATE TABLE biz (id TEXT PRIMARY KEY, note TEXT)"},
};

static struct idem_store *open_store(int pool)
{
    struct idem_store_options o = {.pool_size = pool, .busy_timeout_ms = 10000};
    struct idem_store *st = NULL;
    char *err = NULL;
    int rc = idem_store_open(store_uri, &o, &st, &err);
    if (rc < 0) {
        fprintf(stderr, "cannot open %s: %s\n", store_kind, err ? err : idem_strerror(rc));
        exit(1);
    }
    return st;
}

static void fp_of(const char *body, unsigned char fp[IDEM_FP_LEN])
{
    int rc = idem_fingerprint("POST", "/t", NULL, 0, body, strlen(body), fp, NULL);
    if (rc < 0) {
        fprintf(stderr, "fingerprint failed: %s\n", idem_strerror(rc));
        exit(1);
    }
}

static int biz_insert(struct idem_call *call, const char *id)
{
    const char *p[] = {id, "x"};
    return idem_tx_exec(idem_call_tx(call), "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, p,
                        NULL);
}

static int biz_count(struct idem_store *st, const char *prefix)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    const char *p[] = {prefix};
    int n = -1;
    if (idem_tx_begin(st, 0, &tx) < 0)
        return -1;
    if (idem_tx_exec(tx, "SELECT count(*) FROM biz WHERE id LIKE $1 || '%'", 1, p, &r) == 0)
        n = atoi(idem_rows_get(r, 0, 0));
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return n;
}

/*
 * Whether the store holds a processing record of the scope whose lease has run out, by the
 * store's own clock: what a takeover goes by.
 */
static int lease_over(struct idem_engine *eng, const char *principal, const char *operation,
                      const char *key)
{
    struct idem_record_info info;
    return idem_record_inspect(eng, principal, operation, key, &info) == 0 && info.found &&
           !info.completed && !info.lease_live;
}

/* Whether the store holds a record of the scope within its retention. */
static int record_kept(struct idem_engine *eng, const char *principal, const char *operation,
                       const char *key)
{
    struct idem_record_info info;
    return idem_record_inspect(eng, principal, operation, key, &info) == 0 && info.found;
}

/* ---- 1. many threads racing one claim ------------------------------------------------------ */

struct racer {
    struct idem_engine *eng;
    pthread_barrier_t *start;
    atomic_int *arrived; /* racers that reached their claim */
    int n;
    enum idem_outcome outcome;
    int rc;
    int status;
    char body[64];
};

/*
 * The duplicates wait for the owner in memory and are woken by its completion; lease and wait are
 * long only so that an owner slowed down by a loaded machine is neither taken over nor given up on.
 */
static const struct idem_operation race_op = {
    .name = "contract.race", .lease_ms = 60000, .wait_ms = 30000};

static void *race_one(void *arg)
{
    struct racer *r = arg;
    struct idem_call *call = NULL;
    unsigned char fp[IDEM_FP_LEN];
    fp_of("{\"n\":1}", fp);
    pthread_barrier_wait(r->start);
    atomic_fetch_add(r->arrived, 1);
    r->rc = idem_call_begin(r->eng, &race_op, "alice", "race-key", fp, &call, &r->outcome);
    if (r->rc == 0 && r->outcome == IDEM_OUTCOME_EXECUTE) {
        r->rc = biz_insert(call, "race-1");
        /* Hold the record until every other racer is at its claim: they must meet it. */
        T_WAIT_UNTIL(atomic_load(r->arrived) == r->n, "every racer at its claim");
        if (r->rc == 0)
            r->rc = idem_call_complete(call, 201, NULL, 0, "{\"id\":\"race-1\"}", 15);
    }
    if (r->rc == 0 && idem_call_response_status(call)) {
        size_t len = 0;
        const void *b = idem_call_response_body(call, &len);
        r->status = idem_call_response_status(call);
        snprintf(r->body, sizeof(r->body), "%.*s", (int)len, (const char *)b);
    }
    idem_call_end(call);
    return NULL;
}

static void test_race(struct idem_engine *eng, struct idem_store *st)
{
    enum { N = 24 };
    pthread_t th[N];
    struct racer r[N];
    pthread_barrier_t start;
    atomic_int arrived = 0;
    int executed = 0, replayed = 0, other = 0;

    pthread_barrier_init(&start, NULL, N);
    for (int i = 0; i < N; i++) {
        r[i] = (struct racer){.eng = eng, .start = &start, .arrived = &arrived, .n = N};
        pthread_create(&th[i], NULL, race_one, &r[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < N; i++) {
        CHECK_INT(r[i].rc, 0);
        if (r[i].outcome == IDEM_OUTCOME_EXECUTE)
            executed++;
        else if (r[i].outcome == IDEM_OUTCOME_REPLAY)
            replayed++;
        else
            other++;
        CHECK_INT(r[i].status, 201);
        CHECK_STR(r[i].body, "{\"id\":\"race-1\"}");
    }
    CHECK_INT(executed, 1);
    CHECK_INT(replayed, N - 1);
    CHECK_INT(other, 0);
    CHECK_INT(biz_count(st, "race-"), 1);
    fprintf(stderr, "race: %d threads, %d executed, %d replayed\n", N, executed, replayed);
}

/* ---- 2. replay, headers, mismatch, scope ---------------------------------------------------- */

static void test_replay_mismatch_scope(struct idem_engine *eng)
{
    static const struct idem_operation op = {.name = "contract.replay", .wait_ms = 100};
    static const char body[] = "{\"ok\":true}\0binary\xff";
    const size_t body_len = sizeof(body) - 1;
    struct idem_header h[] = {
        {"content-type", "application/json"}, {"Location", "/t/1"}, {"Set-Cookie", "secret=1"}};
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN], fp2[IDEM_FP_LEN];
    size_t len = 0;
    const char *b;

    fp_of("{\"a\":1,\"b\":2}", fp);
    fp_of("{\"a\":1,\"b\":3}", fp2);

    CHECK_INT(idem_call_begin(eng, &op, "alice", "k1", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_STR(idem_call_recovery_point(call), "");
    CHECK_INT(idem_call_complete(call, 201, h, 3, body, body_len), 0);
    idem_call_end(call);

    CHECK_INT(idem_call_begin(eng, &op, "alice", "k1", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_status(call), 201);
    b = idem_call_response_body(call, &len);
    CHECK_INT(len, body_len);
    CHECK(b && memcmp(b, body, body_len) == 0);
    CHECK_INT(idem_call_response_header_count(call), 2);
    if (idem_call_response_header_count(call) == 2) {
        CHECK_STR(idem_call_response_header(call, 0)->name, "Content-Type");
        CHECK_STR(idem_call_response_header(call, 0)->value, "application/json");
        CHECK_STR(idem_call_response_header(call, 1)->name, "Location");
        CHECK_STR(idem_call_response_header(call, 1)->value, "/t/1");
    }
    CHECK(!idem_call_waited(call));
    idem_call_end(call);

    CHECK_INT(idem_call_begin(eng, &op, "alice", "k1", fp2, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_MISMATCH);
    CHECK(idem_call_tx(call) == NULL);
    idem_call_end(call);

    /* Another principal, or another operation, is another scope. */
    CHECK_INT(idem_call_begin(eng, &op, "bob", "k1", fp2, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    idem_call_end(call);
    static const struct idem_operation other_op = {.name = "contract.other", .wait_ms = 100};
    CHECK_INT(idem_call_begin(eng, &other_op, "alice", "k1", fp2, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    idem_call_end(call);
}

/* Replays `key` from `eng` and checks the stored status and body. */
static void expect_replay(struct idem_engine *eng, const struct idem_operation *op, const char *key,
                          const unsigned char fp[IDEM_FP_LEN], int status, const char *body)
{
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    size_t len = 0;
    const void *b;

    CHECK_INT(idem_call_begin(eng, op, "alice", key, fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_status(call), status);
    b = idem_call_response_body(call, &len);
    CHECK_INT(len, strlen(body));
    CHECK(b && memcmp(b, body, strlen(body)) == 0);
    CHECK(idem_call_tx(call) == NULL); /* a replay opens no phase */
    idem_call_end(call);
}

/*
 * A key this engine's replay cache never saw, but the store holds: another engine (another
 * process, or this one before a restart) completed it, or still runs it.  Where the store claims
 * before it reads (SQLite), the claim cannot win and the read that follows decides; the answers
 * must be those of a read-first store.
 */
static void test_unseen_key(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {.name = "contract.unseen", .wait_ms = 150};
    struct idem_engine *other = NULL;
    struct idem_call *call = NULL, *held = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN], fp2[IDEM_FP_LEN];

    fp_of("{\"unseen\":1}", fp);
    fp_of("{\"unseen\":2}", fp2);
    CHECK_INT(idem_engine_new(st, NULL, &other), 0);
    if (!other)
        return;

    /* Completed by `eng`: `other` replays it, or refuses another body. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "u-done", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "{\"n\":1}", 7), 0);
    idem_call_end(call);
    expect_replay(other, &op, "u-done", fp, 201, "{\"n\":1}");
    CHECK_INT(idem_call_begin(other, &op, "alice", "u-done", fp2, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_MISMATCH);
    idem_call_end(call);

    /* Still running in `eng` (a live lease): `other` waits wait_ms, then hears in progress. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "u-busy", fp, &held, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(held, "half", NULL), 0);
    CHECK_INT(idem_call_begin(other, &op, "alice", "u-busy", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS);
    CHECK(idem_call_waited(call));
    idem_call_end(call);
    CHECK_INT(idem_call_complete(held, 200, NULL, 0, "{}", 2), 0);
    idem_call_end(held);
    expect_replay(other, &op, "u-busy", fp, 200, "{}");
    idem_engine_free(other);
}

/* ---- 3. a rolled-back phase leaves no record and no business row ---------------------------- */

static void test_rollback(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {.name = "contract.rollback", .wait_ms = 100};
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];

    fp_of("{}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "rb", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(call, "rb-1"), 0);
    idem_call_abort(call);
    idem_call_end(call);
    CHECK_INT(biz_count(st, "rb-"), 0);

    /* The retry runs afresh, and a unique violation is reported as such. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "rb", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(call, "rb-1"), 0);
    CHECK_INT(biz_insert(call, "rb-1"), IDEM_ECONFLICT);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "{}", 2), 0);
    idem_call_end(call);
    CHECK_INT(biz_count(st, "rb-"), 1);
}

/* ---- 4. lease expiry, takeover, fencing, resume from the recovery point --------------------- */

static void test_takeover(struct idem_engine *eng, struct idem_store *st)
{
    /*
     * The lease must outlive the advance's commit (its end is set before the fsync) and the
     * duplicate's wait below even on a loaded machine, so it is not much shorter than a second.
     */
    static const struct idem_operation op = {
        .name = "contract.lease", .lease_ms = 1000, .wait_ms = 50};
    struct idem_call *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    size_t len;

    fp_of("{\"lease\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "lease", fp, &a, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(a, "lease-1"), 0);
    CHECK_INT(idem_call_advance(a, "created", "lease-1"), 0);
    CHECK(idem_call_tx(a) == NULL);

    /* The lease is live: a duplicate waits wait_ms, then is told to come back. */
    int64_t t0 = clock_mono_ms();
    CHECK_INT(idem_call_begin(eng, &op, "alice", "lease", fp, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS);
    CHECK(idem_call_waited(b));
    CHECK(idem_call_retry_after_s(b) >= 1);
    CHECK(clock_mono_ms() - t0 >= 40);
    idem_call_end(b);

    /* Owner "a" goes silent past its lease; the next request takes over and resumes. */
    T_WAIT_UNTIL(lease_over(eng, "alice", op.name, "lease"), "the lease of \"a\" to run out");
    CHECK_INT(idem_call_begin(eng, &op, "alice", "lease", fp, &c, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_STR(idem_call_recovery_point(c), "created");
    CHECK_STR(idem_call_recovery_data(c), "lease-1");
    CHECK(idem_call_tx(c) == NULL);

    /* The old owner wakes up: its writes are fenced off and roll back. */
    CHECK_INT(idem_call_phase_begin(a), 0);
    CHECK_INT(biz_insert(a, "lease-stale"), 0);
    CHECK_INT(idem_call_complete(a, 500, NULL, 0, "stale", 5), IDEM_ELEASE);
    idem_call_end(a);
    CHECK_INT(biz_count(st, "lease-stale"), 0);

    /* The new owner finishes from the recovery point: phase 1 is not run again. */
    CHECK_INT(idem_call_phase_begin(c), 0);
    CHECK_INT(idem_call_complete(c, 201, NULL, 0, "done", 4), 0);
    idem_call_end(c);
    CHECK_INT(biz_count(st, "lease-"), 1);

    CHECK_INT(idem_call_begin(eng, &op, "alice", "lease", fp, &d, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_status(d), 201);
    CHECK(memcmp(idem_call_response_body(d, &len), "done", 4) == 0);
    idem_call_end(d);
}

/*
 * A program restarted after a crash frees the leases its earlier process left (owner names that
 * start alike), not another's nor its own: the next request of such a key resumes at once.
 */
static void test_release_leases(struct idem_store *st)
{
    static const struct idem_operation op = {
        .name = "contract.release", .lease_ms = 60000, .wait_ms = 10};
    const struct idem_engine_options old_o = {.owner = "inst-a:100:aa"},
                                     other_o = {.owner = "inst-ab:7:bb"},
                                     new_o = {.owner = "inst-a:200:cc"};
    struct idem_engine *old = NULL, *other = NULL, *now = NULL;
    struct idem_call *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    uint64_t released = 99;

    fp_of("{\"release\":1}", fp);
    if (idem_engine_new(st, &old_o, &old) < 0 || idem_engine_new(st, &other_o, &other) < 0 ||
        idem_engine_new(st, &new_o, &now) < 0)
        exit(1);
    /* The earlier process (a), another instance (b), and the new process's own call (c). */
    CHECK_INT(idem_call_begin(old, &op, "alice", "rel-1", fp, &a, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(a, "sent", NULL), 0);
    CHECK_INT(idem_call_begin(other, &op, "alice", "rel-2", fp, &b, &oc), 0);
    CHECK_INT(idem_call_advance(b, "sent", NULL), 0);
    CHECK_INT(idem_call_begin(now, &op, "alice", "rel-3", fp, &c, &oc), 0);
    CHECK_INT(idem_call_advance(c, "sent", NULL), 0);

    CHECK_INT(idem_call_begin(now, &op, "alice", "rel-1", fp, &d, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS); /* a's lease is live for a minute */
    idem_call_end(d);

    CHECK_INT(idem_engine_release_leases(now, "inst-a:", &released), 0);
    CHECK_INT(released, 1);
    CHECK_INT(idem_engine_release_leases(now, "inst-a:", NULL), 0); /* nothing left: fine */

    CHECK_INT(idem_call_begin(now, &op, "alice", "rel-1", fp, &d, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_STR(idem_call_recovery_point(d), "sent");
    CHECK_INT(idem_call_phase_begin(d), 0);
    CHECK_INT(idem_call_complete(d, 201, NULL, 0, "d", 1), 0);
    idem_call_end(d);
    CHECK_INT(idem_call_begin(now, &op, "alice", "rel-2", fp, &d, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS); /* "inst-ab:" is another instance */
    idem_call_end(d);

    /* The earlier process, had it lived on, is fenced off; the others finish as ever. */
    CHECK_INT(idem_call_phase_begin(a), 0);
    CHECK_INT(idem_call_complete(a, 201, NULL, 0, "a", 1), IDEM_ELEASE);
    idem_call_end(a);
    CHECK_INT(idem_call_phase_begin(b), 0);
    CHECK_INT(idem_call_complete(b, 201, NULL, 0, "b", 1), 0);
    idem_call_end(b);
    CHECK_INT(idem_call_phase_begin(c), 0);
    CHECK_INT(idem_call_complete(c, 201, NULL, 0, "c", 1), 0);
    idem_call_end(c);
    CHECK_INT(idem_engine_release_leases(NULL, "", NULL), IDEM_EINVAL);
    idem_engine_free(old);
    idem_engine_free(other);
    idem_engine_free(now);
}

/* A call that ends without completing releases its lease: the retry resumes at once. */
static void test_release_on_abort(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {
        .name = "contract.release", .lease_ms = 60000, .wait_ms = 2000};
    struct idem_call *a = NULL, *b = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];

    fp_of("{\"release\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "rel", fp, &a, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(a, "rel-1"), 0);
    CHECK_INT(idem_call_advance(a, "created", "rel-1"), 0);
    CHECK_INT(idem_call_phase_begin(a), 0);
    CHECK_INT(biz_insert(a, "rel-2"), 0); /* an unknown outcome: phase 2 gives up */
    idem_call_end(a);
    CHECK_INT(biz_count(st, "rel-"), 1);

    /* At once: the lease (a minute) was released, so the retry did not wait for its owner. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "rel", fp, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK(!idem_call_waited(b));
    CHECK_STR(idem_call_recovery_point(b), "created");
    CHECK_INT(idem_call_complete(b, 201, NULL, 0, "ok", 2), 0);
    idem_call_end(b);
}

/*
 * idem_call_forget: a durable record the lease holder knows never ran is deleted, so the same key
 * with another body executes afresh (no 422); a claim still in its first phase just vanishes; a
 * completed call or a call whose record was taken over cannot forget it.  And an operation's own
 * stored-header list decides what a replay carries.
 */
static void test_forget(struct idem_engine *eng)
{
    static const char *const keep[] = {"ETag"};
    static const struct idem_operation op = {.name = "contract.forget",
                                             .lease_ms = 60000,
                                             .wait_ms = 200,
                                             .stored_headers = keep,
                                             .nstored_headers = 1};
    struct idem_call *a = NULL, *b = NULL;
    enum idem_outcome oc;
    unsigned char fp1[IDEM_FP_LEN], fp2[IDEM_FP_LEN];
    const struct idem_header hs[] = {{"Content-Type", "text/plain"}, {"etag", "\"7\""}};

    fp_of("{\"forget\":1}", fp1);
    fp_of("{\"forget\":2}", fp2);
    struct idem_record_info info;
    CHECK_INT(idem_call_begin(eng, &op, "alice", "fg", fp1, &a, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(a, "forwarded", NULL), 0);
    /* What an operator sees of it: processing at "forwarded", leased, the request's fingerprint. */
    CHECK_INT(idem_record_inspect(eng, "alice", "contract.forget", "fg", &info), 0);
    CHECK_INT(info.found, 1);
    CHECK_INT(info.completed, 0);
    CHECK_STR(info.recovery_point, "forwarded");
    CHECK_INT(info.lease_live, 1);
    CHECK(info.expires_ms - info.created_ms > 23 * 3600 * 1000LL);
    {
        char hex[2 * IDEM_FP_LEN + 1];
        idem_fingerprint_hex(fp1, hex);
        CHECK_STR(info.fingerprint_hex, hex);
    }
    CHECK_INT(idem_call_forget(a), 0);
    CHECK_INT(idem_record_inspect(eng, "alice", "contract.forget", "fg", &info), 0);
    CHECK_INT(info.found, 0);
    CHECK_INT(idem_call_forget(a), IDEM_ESTATE); /* nothing left to forget */
    idem_call_end(a);

    /* Another body under the same key is a new request now, not a mismatch. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "fg", fp2, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_forget(b), 0); /* the uncommitted claim is rolled back */
    idem_call_end(b);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "fg", fp1, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(b, 200, hs, 2, "done", 4), 0);
    CHECK_INT(idem_call_forget(b), IDEM_ESTATE);
    idem_call_end(b);
    CHECK_INT(idem_record_inspect(eng, "alice", "contract.forget", "fg", &info), 0);
    CHECK(info.found == 1 && info.completed == 1);
    CHECK_INT(info.response_status, 200);
    CHECK_INT(info.response_body_len, 4);
    CHECK_INT(info.lease_live, 0);

    CHECK_INT(idem_call_begin(eng, &op, "alice", "fg", fp1, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_header_count(b), 1);
    if (idem_call_response_header_count(b) == 1) {
        CHECK_STR(idem_call_response_header(b, 0)->name, "ETag");
        CHECK_STR(idem_call_response_header(b, 0)->value, "\"7\"");
    }
    idem_call_end(b);

    /* A lease lost to a takeover: the old owner's forget is fenced out. */
    static const struct idem_operation short_op = {
        .name = "contract.forget-fence", .lease_ms = 100, .wait_ms = 50};
    CHECK_INT(idem_call_begin(eng, &short_op, "alice", "ff", fp1, &a, &oc), 0);
    CHECK_INT(idem_call_advance(a, "forwarded", NULL), 0);
    T_WAIT_UNTIL(lease_over(eng, "alice", short_op.name, "ff"), "the lease of \"a\" to run out");
    CHECK_INT(idem_call_begin(eng, &short_op, "alice", "ff", fp1, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_INT(idem_call_forget(a), IDEM_ELEASE);
    CHECK_INT(idem_call_forget(b), 0);
    idem_call_end(a);
    idem_call_end(b);
}

/* A recovery worker finds a stalled record, takes it over without the fingerprint, finishes it. */
static void test_recover(struct idem_engine *eng)
{
    /* Live through the checks that follow the advance, even on a loaded machine. */
    static const struct idem_operation op = {
        .name = "contract.recover", .lease_ms = 1000, .wait_ms = 50};
    struct idem_call *a = NULL, *w = NULL, *dup = NULL, *none = NULL;
    struct idem_stalled *list = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    size_t n = 0;
    int found;

    fp_of("{\"recover\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &op, "carol", "rec", fp, &a, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(a, "charged", "ch_1"), 0);

    /* Live lease: not stalled, and a worker does not take it. */
    CHECK_INT(idem_engine_stalled(eng, op.name, 10, &list, &n), 0);
    CHECK_INT(n, 0);
    idem_stalled_free(list, n);
    CHECK_INT(idem_call_recover(eng, &op, "carol", "rec", &w, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS);
    CHECK(!idem_call_recovering(w));
    idem_call_end(w);

    /* The owner died (it never comes back: its call is just freed later). */
    T_WAIT_UNTIL(lease_over(eng, "carol", op.name, "rec"),
                 "the lease of the dead owner to run out");
    CHECK_INT(idem_engine_stalled(eng, op.name, 10, &list, &n), 0);
    found = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i].key, "rec") == 0 && strcmp(list[i].principal, "carol") == 0) {
            found = 1;
            CHECK_STR(list[i].recovery_point, "charged");
            CHECK_STR(list[i].operation, op.name);
        }
    CHECK(found);
    idem_stalled_free(list, n);

    CHECK_INT(idem_call_recover(eng, &op, "carol", "rec", &w, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_STR(idem_call_recovery_point(w), "charged");
    CHECK_STR(idem_call_recovery_data(w), "ch_1");

    /* A client retry meanwhile is told the record is being recovered. */
    CHECK_INT(idem_call_begin(eng, &op, "carol", "rec", fp, &dup, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS);
    CHECK(idem_call_recovering(dup));
    idem_call_end(dup);

    CHECK_INT(idem_call_complete(w, 201, NULL, 0, "recovered", 9), 0);
    idem_call_end(w);
    CHECK_INT(idem_call_complete(a, 500, NULL, 0, "x", 1), IDEM_ELEASE);
    idem_call_end(a);

    CHECK_INT(idem_call_begin(eng, &op, "carol", "rec", fp, &dup, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    CHECK_INT(idem_call_response_status(dup), 201);
    idem_call_end(dup);
    CHECK_INT(idem_call_recover(eng, &op, "carol", "rec", &w, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    idem_call_end(w);
    CHECK_INT(idem_call_recover(eng, &op, "carol", "no-such-key", &none, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_NONE);
    idem_call_end(none);
}

/* ---- 5. a waiting duplicate is woken by the completion -------------------------------------- */

struct waiter {
    struct idem_engine *eng;
    char key[32];
    enum idem_outcome outcome;
    int waited;
    int64_t done_ms; /* when its idem_call_begin() returned */
};

/* A wait that would end far later than any wake-up takes, so that the two cannot be confused. */
static const struct idem_operation wake_op = {
    .name = "contract.wake", .lease_ms = 60000, .wait_ms = 30000};

static void *wait_one(void *arg)
{
    struct waiter *w = arg;
    struct idem_call *call = NULL;
    unsigned char fp[IDEM_FP_LEN];
    fp_of("{\"wake\":1}", fp);
    if (idem_call_begin(w->eng, &wake_op, "alice", w->key, fp, &call, &w->outcome) == 0)
        w->waited = idem_call_waited(call);
    w->done_ms = clock_mono_ms();
    idem_call_end(call);
    return NULL;
}

static uint64_t cache_misses(struct idem_engine *eng)
{
    struct idem_cache_stats cs;
    idem_engine_cache_stats(eng, &cs);
    return cs.misses;
}

/*
 * The owner completes while a duplicate in the same engine waits for it: the duplicate is woken
 * and replays, long before its wait would end.  The duplicate's first step is a replay cache
 * miss, which the test waits for; next it finds the scope in flight and waits for the owner, which
 * cannot be observed.  A duplicate held up between the two until the completion finds the response
 * without waiting (idem_call_waited() says so): that round proves nothing either way, so it runs
 * again with a fresh key rather than fail or pass.
 */
static void test_wake(struct idem_engine *eng)
{
    for (int round = 0; round < 5; round++) {
        struct idem_call *a = NULL;
        enum idem_outcome oc;
        unsigned char fp[IDEM_FP_LEN];
        pthread_t th;
        struct waiter w = {.eng = eng};
        uint64_t misses;
        int64_t t_complete;

        snprintf(w.key, sizeof(w.key), "wake-%d", round);
        fp_of("{\"wake\":1}", fp);
        CHECK_INT(idem_call_begin(eng, &wake_op, "alice", w.key, fp, &a, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        CHECK_INT(idem_call_advance(a, "created", NULL), 0);
        misses = cache_misses(eng);
        pthread_create(&th, NULL, wait_one, &w);
        T_WAIT_UNTIL(cache_misses(eng) > misses, "the duplicate to look in the replay cache");
        t_complete = clock_mono_ms();
        CHECK_INT(idem_call_complete(a, 201, NULL, 0, "woken", 5), 0);
        idem_call_end(a);
        pthread_join(th, NULL);
        CHECK_INT(w.outcome, IDEM_OUTCOME_REPLAY);
        if (w.waited) {
            CHECK(w.done_ms - t_complete < wake_op.wait_ms / 2); /* woken, not timed out */
            return;
        }
        fprintf(stderr, "wake: the duplicate came too late to wait (round %d), again\n", round);
    }
    CHECK(!"in 5 rounds the duplicate never waited for the owner");
}

/* ---- 6. retention ---------------------------------------------------------------------------- */

static void test_retention(struct idem_engine *eng)
{
    /* Retention long enough for a commit and a replay on a loaded machine. */
    static const struct idem_operation short_op = {
        .name = "contract.short", .ttl_ms = 1000, .wait_ms = 100};
    static const struct idem_operation long_op = {.name = "contract.long", .wait_ms = 100};
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN], fp2[IDEM_FP_LEN];
    char key[32];
    int deleted = -1;

    fp_of("{\"ttl\":1}", fp);
    fp_of("{\"ttl\":2}", fp2);
    /* Sweep whatever earlier runs of this suite left, then make a record and 5 short-lived ones. */
    while (idem_engine_sweep(eng, 1000, &deleted) == 0 && deleted > 0)
        ;
    CHECK_INT(idem_call_begin(eng, &long_op, "alice", "keep", fp, &call, &oc), 0);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "k", 1), 0);
    idem_call_end(call);
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "ttl-%d", i);
        CHECK_INT(idem_call_begin(eng, &short_op, "alice", key, fp, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        CHECK_INT(idem_call_complete(call, 200, NULL, 0, "a", 1), 0);
        idem_call_end(call);
    }

    /* Within retention (the last one was completed just now): a replay. */
    CHECK_INT(idem_call_begin(eng, &short_op, "alice", "ttl-4", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    idem_call_end(call);

    /* Time must pass: the last record past retention, the others were so before it. */
    T_WAIT_UNTIL(!record_kept(eng, "alice", short_op.name, "ttl-4"),
                 "the short-lived records to pass their retention");

    /* Past retention, even before the sweeper ran, the key is new (here with another body). */
    CHECK_INT(idem_call_begin(eng, &short_op, "alice", "ttl-0", fp2, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    idem_call_abort(call);
    idem_call_end(call);

    /* The sweeper deletes in bounded batches and spares live records. */
    CHECK_INT(idem_engine_sweep(eng, 2, &deleted), 0);
    CHECK_INT(deleted, 2);
    CHECK_INT(idem_engine_sweep(eng, 2, &deleted), 0);
    CHECK_INT(deleted, 2);
    CHECK_INT(idem_engine_sweep(eng, 2, &deleted), 0);
    CHECK_INT(deleted, 1);
    CHECK_INT(idem_engine_sweep(eng, 2, &deleted), 0);
    CHECK_INT(deleted, 0);
    CHECK_INT(idem_call_begin(eng, &long_op, "alice", "keep", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_REPLAY);
    idem_call_end(call);
}

/* ---- 6b. a response staged inside the phase, then the last statements, then the commit ------ */

static void never_done(struct idem_call *call, int rc, void *arg)
{
    (void)call;
    (void)rc;
    (void)arg;
    CHECK(!"idem_call_commit_async's done ran for a commit it refused");
}

static void test_stage(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {.name = "contract.stage", .wait_ms = 100};
    struct idem_header h[] = {{"Content-Type", "application/json"}, {"Location", "/t/2"}};
    struct idem_engine *nocache = NULL;
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    size_t len = 0;

    fp_of("{\"stage\":1}", fp);
    /* A second engine without a replay cache reads what the store holds. */
    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);

    /* Staged, then a business write, then committed: the staged response is the stored one. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "stage-1", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(call, "stage-1a"), 0);
    CHECK_INT(idem_call_stage(call, 201, h, 2, "staged", 6), 0);
    CHECK_INT(biz_insert(call, "stage-1b"), 0);    /* the last statement, after the stage */
    CHECK_INT(idem_call_response_status(call), 0); /* nothing is stored before the commit */
    CHECK_INT(idem_call_commit(call), 0);
    CHECK(idem_call_tx(call) == NULL);
    CHECK_INT(idem_call_response_status(call), 201);
    CHECK(memcmp(idem_call_response_body(call, &len), "staged", 6) == 0);
    CHECK_INT(len, 6);
    CHECK_INT(idem_call_response_header_count(call), 2);
    CHECK_INT(idem_call_commit(call), IDEM_ESTATE); /* completed */
    idem_call_end(call);
    CHECK_INT(biz_count(st, "stage-1"), 2);
    expect_replay(eng, &op, "stage-1", fp, 201, "staged");
    expect_replay(nocache, &op, "stage-1", fp, 201, "staged");

    /*
     * Staged, then rolled back to a savepoint taken before the stage: the record is processing
     * again in the transaction, and another response completes it.
     */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "stage-2", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "SAVEPOINT before_stage", 0, NULL, NULL), 0);
    CHECK_INT(biz_insert(call, "stage-2a"), 0);
    CHECK_INT(idem_call_stage(call, 201, h, 2, "first", 5), 0);
    CHECK_INT(biz_insert(call, "stage-2b"), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "ROLLBACK TO SAVEPOINT before_stage", 0, NULL, NULL),
              0);
    CHECK_INT(idem_call_complete(call, 409, NULL, 0, "second", 6), 0);
    CHECK_INT(idem_call_response_status(call), 409);
    CHECK_INT(idem_call_response_header_count(call), 0);
    idem_call_end(call);
    CHECK_INT(biz_count(st, "stage-2"), 0);
    expect_replay(eng, &op, "stage-2", fp, 409, "second");
    expect_replay(nocache, &op, "stage-2", fp, 409, "second");

    /* The same with a second stage and a commit: the last staged response is stored. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "stage-3", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "SAVEPOINT before_stage", 0, NULL, NULL), 0);
    CHECK_INT(idem_call_stage(call, 201, NULL, 0, "first", 5), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "ROLLBACK TO SAVEPOINT before_stage", 0, NULL, NULL),
              0);
    CHECK_INT(biz_insert(call, "stage-3a"), 0);
    CHECK_INT(idem_call_stage(call, 202, NULL, 0, "again", 5), 0);
    CHECK_INT(idem_call_commit(call), 0);
    idem_call_end(call);
    CHECK_INT(biz_count(st, "stage-3"), 1);
    expect_replay(nocache, &op, "stage-3", fp, 202, "again");

    /*
     * Staged, rolled back past the stage, then committed without staging again:
     * the commit fails (IDEM_ESTATE) instead of reporting a completed call; nothing is cached, and
     * the record is still processing in the open phase, which a new stage then completes.  A
     * rollback to a savepoint taken after the stage leaves the stage, and the commit, alone.
     */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "stage-5", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "SAVEPOINT before_stage", 0, NULL, NULL), 0);
    CHECK_INT(idem_call_stage(call, 201, NULL, 0, "gone", 4), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "ROLLBACK TO SAVEPOINT before_stage", 0, NULL, NULL),
              0);
    CHECK_INT(idem_call_commit(call), IDEM_ESTATE);
    CHECK_INT(idem_call_response_status(call), 0);
    CHECK(idem_call_tx(call) != NULL); /* still open */
    CHECK_INT(idem_call_stage(call, 203, NULL, 0, "kept", 4), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "SAVEPOINT after_stage", 0, NULL, NULL), 0);
    CHECK_INT(biz_insert(call, "stage-5a"), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "ROLLBACK TO SAVEPOINT after_stage", 0, NULL, NULL),
              0);
    CHECK_INT(idem_call_commit(call), 0);
    idem_call_end(call);
    CHECK_INT(biz_count(st, "stage-5"), 0);
    expect_replay(eng, &op, "stage-5", fp, 203, "kept");
    expect_replay(nocache, &op, "stage-5", fp, 203, "kept");

    /* The same through the asynchronous commit: refused at once, `done` never called. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "stage-6", fp, &call, &oc), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "SAVEPOINT s", 0, NULL, NULL), 0);
    CHECK_INT(idem_call_stage(call, 201, NULL, 0, "gone", 4), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(call), "rollback to s", 0, NULL, NULL), 0);
    CHECK_INT(idem_call_commit_async(call, never_done, NULL), IDEM_ESTATE);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(nocache, &op, "alice", "stage-6", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE); /* nothing was stored: the key is new */
    idem_call_end(call);

    /* A staged response that is never committed is gone with its phase, claim and all. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "stage-4", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(call, "stage-4a"), 0);
    CHECK_INT(idem_call_stage(call, 201, NULL, 0, "lost", 4), 0);
    idem_call_end(call);
    CHECK_INT(biz_count(st, "stage-4"), 0);
    CHECK_INT(idem_call_begin(nocache, &op, "alice", "stage-4", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    idem_call_end(call);

    /*
     * A later phase (after a takeover-free advance) stages too, and an owner whose lease was
     * taken over meanwhile is fenced off at the stage: its phase rolls back.
     */
    static const struct idem_operation lease_op = {
        .name = "contract.stage-lease", .lease_ms = 300, .wait_ms = 50};
    struct idem_call *a = NULL, *b = NULL;
    CHECK_INT(idem_call_begin(eng, &lease_op, "alice", "stage-5", fp, &a, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(a, "created", NULL), 0);
    T_WAIT_UNTIL(lease_over(eng, "alice", lease_op.name, "stage-5"),
                 "the lease of \"a\" to run out");
    CHECK_INT(idem_call_begin(eng, &lease_op, "alice", "stage-5", fp, &b, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_INT(idem_call_phase_begin(a), 0);
    CHECK_INT(biz_insert(a, "stage-5-stale"), 0);
    CHECK_INT(idem_call_stage(a, 500, NULL, 0, "stale", 5), IDEM_ELEASE);
    CHECK(idem_call_tx(a) == NULL);
    CHECK_INT(idem_call_commit(a), IDEM_ESTATE);
    idem_call_end(a);
    CHECK_INT(idem_call_phase_begin(b), 0);
    CHECK_INT(idem_call_stage(b, 201, NULL, 0, "resumed", 7), 0);
    CHECK_INT(biz_insert(b, "stage-5-new"), 0);
    CHECK_INT(idem_call_commit(b), 0);
    idem_call_end(b);
    CHECK_INT(biz_count(st, "stage-5-stale"), 0);
    CHECK_INT(biz_count(st, "stage-5-new"), 1);
    expect_replay(nocache, &lease_op, "stage-5", fp, 201, "resumed");

    idem_engine_free(nocache);
}

/* Savepoints of the application's own, in a plain write transaction, on every store. */
static void test_savepoints(struct idem_store *st)
{
    struct idem_tx *tx = NULL;
    const char *p[] = {"sp-1", "x"};
    const char *q[] = {"sp-2", "x"};

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, p, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "savepoint a", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, q, NULL), 0);
    /* A failing statement after the savepoint leaves the transaction and the savepoint usable. */
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, q, NULL),
              IDEM_ECONFLICT);
    CHECK_INT(idem_tx_exec(tx, "ROLLBACK TO a", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_exec(tx, "RELEASE SAVEPOINT a", 0, NULL, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(biz_count(st, "sp-1"), 1);
    CHECK_INT(biz_count(st, "sp-2"), 0);
}

/* ---- 7. SQL through the store, migrations -----------------------------------------------------
 */

static void test_sql_and_migrations(struct idem_store *st)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    int applied = -1;
    char *err = NULL;
    const char *p[] = {"b", "a"};

    CHECK_INT(idem_store_migrate(st, "contract", biz_schema, 1, &applied, &err), 0);
    CHECK_INT(applied, 0); /* applied once already at start-up */
    idem_free(err);

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    /* Parameters may appear out of order and repeat. */
    CHECK_INT(idem_tx_exec(tx, "SELECT $2 || $1 || $2 AS s, NULL AS n", 2, p, &r), 0);
    CHECK_INT(idem_rows_count(r), 1);
    CHECK_STR(idem_rows_get(r, 0, 0), "aba");
    CHECK(idem_rows_get(r, 0, 1) == NULL);
    CHECK_INT(idem_rows_column_index(r, "n"), 1);
    idem_rows_free(r);
    CHECK_INT(idem_tx_exec(tx, "SELECT $3", 2, p, NULL), IDEM_EINVAL);
    CHECK(strlen(idem_tx_errmsg(tx)) > 0);
    CHECK_INT(idem_tx_exec(tx, "SELEC nonsense", 0, NULL, NULL), IDEM_ESTORE);
    idem_tx_rollback(tx);

    static const struct idem_migration bad[] = {
        {1, "business rows", "CREATE TABLE biz (id TEXT PRIMARY KEY, note TEXT)", NULL},
        {2, "broken", "CREATE TABLE nope (", "CREATE TABLE nope ("},
    };
    CHECK_INT(idem_store_migrate(st, "contract", bad, 2, &applied, &err), IDEM_EMIGRATE);
    CHECK(err && strstr(err, "broken"));
    idem_free(err);
}

/*
 * Many writers at once (SQLite commits them in shared batches): every acknowledged commit is
 * visible to the very next read on another connection, a writer whose statement fails rolls
 * back alone, and its neighbours in the same batch keep their rows.
 */
struct writer {
    struct idem_store *st;
    int id;
    int committed, failed_as_meant, visible, errors;
};

enum { WRITERS = 12, WRITES_EACH = 40 };

static void *writer_run(void *arg)
{
    struct writer *w = arg;
    for (int i = 0; i < WRITES_EACH; i++) {
        struct idem_tx *tx = NULL;
        char id[64];
        const char *p[] = {id, "w"};
        const char *dup[] = {"gc-shared", "w"};
        int rc;

        snprintf(id, sizeof(id), "gc-%d-%d.", w->id, i);
        if (idem_tx_begin(w->st, 1, &tx) < 0) {
            w->errors++;
            continue;
        }
        rc = idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, p, NULL);
        if (rc == 0 && i % 5 == 4) {
            /* "gc-shared" exists: this statement fails and the whole transaction must go. */
            rc = idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, dup, NULL);
            if (rc == IDEM_ECONFLICT)
                w->failed_as_meant++;
            else
                w->errors++;
            idem_tx_rollback(tx);
            continue;
        }
        if (rc < 0 || idem_tx_commit(tx) < 0) {
            if (rc < 0)
                idem_tx_rollback(tx);
            w->errors++;
            continue;
        }
        w->committed++;
        if (biz_count(w->st, id) == 1)
            w->visible++;
    }
    return NULL;
}

static void test_concurrent_writers(struct idem_store *st)
{
    pthread_t th[WRITERS];
    struct writer w[WRITERS];
    struct idem_tx *tx = NULL;
    const char *seed[] = {"gc-shared", "seed"};
    int committed = 0, failed = 0, visible = 0, errors = 0;
    struct idem_store_stats before, after;
    int64_t t0;

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, seed, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    idem_store_stats(st, &before);
    t0 = clock_mono_ms();
    for (int i = 0; i < WRITERS; i++) {
        w[i] = (struct writer){.st = st, .id = i};
        pthread_create(&th[i], NULL, writer_run, &w[i]);
    }
    for (int i = 0; i < WRITERS; i++) {
        pthread_join(th[i], NULL);
        committed += w[i].committed;
        failed += w[i].failed_as_meant;
        visible += w[i].visible;
        errors += w[i].errors;
    }
    CHECK_INT(errors, 0);
    CHECK_INT(failed, WRITERS * WRITES_EACH / 5);
    CHECK_INT(committed, WRITERS * WRITES_EACH - failed);
    CHECK_INT(visible, committed);
    /* The rows of the failed transactions are gone, their neighbours' rows all there. */
    CHECK_INT(biz_count(st, "gc-"), committed + 1);
    idem_store_stats(st, &after);
    CHECK_INT((int)(after.write_commits - before.write_commits), committed);
    if (strcmp(store_kind, "sqlite") == 0)
        CHECK(after.durable_commits - before.durable_commits <
              after.write_commits - before.write_commits); /* shared fsyncs */
    else
        CHECK(after.durable_commits - before.durable_commits ==
              after.write_commits - before.write_commits);
    fprintf(stderr,
            "concurrent writers: %d threads, %d commits in %llu durable commits, %d rolled back,"
            " %lld ms\n",
            WRITERS, committed,
            (unsigned long long)(after.durable_commits - before.durable_commits), failed,
            (long long)(clock_mono_ms() - t0));
}

/* ---- 9b. commits that do not wait: idem_call_commit_async -------------------------------------
 */

#define ASYNC_THREADS 8
#define ASYNC_EACH 25

static const struct idem_operation async_op = {.name = "contract.async", .wait_ms = 100};
static atomic_int async_done_ok, async_done_failed, async_bad_state;

static void async_committed(struct idem_call *call, int rc, void *arg)
{
    size_t len = 0;
    const void *body;

    (void)arg;
    if (rc == 0) {
        body = idem_call_response_body(call, &len);
        /* Done means completed: the stored response is the call's, and it is durable. */
        if (idem_call_response_status(call) != 201 || len != 5 || memcmp(body, "async", 5) != 0)
            atomic_fetch_add(&async_bad_state, 1);
        atomic_fetch_add(&async_done_ok, 1);
    } else {
        atomic_fetch_add(&async_done_failed, 1);
    }
    idem_call_end(call);
}

struct async_writer {
    struct idem_engine *eng;
    int id;
    int errors;
};

static void *async_run(void *arg)
{
    struct async_writer *w = arg;
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    char key[64];

    fp_of("{\"async\":1}", fp);
    for (int i = 0; i < ASYNC_EACH; i++) {
        snprintf(key, sizeof(key), "async-%d-%d", w->id, i);
        if (idem_call_begin(w->eng, &async_op, "alice", key, fp, &call, &oc) != 0 ||
            oc != IDEM_OUTCOME_EXECUTE || biz_insert(call, key) != 0 ||
            idem_call_stage(call, 201, NULL, 0, "async", 5) != 0 ||
            idem_call_commit_async(call, async_committed, NULL) != 0) {
            w->errors++;
            idem_call_end(call);
        }
        call = NULL;
    }
    return NULL;
}

static void test_commit_async(struct idem_engine *eng, struct idem_store *st)
{
    pthread_t th[ASYNC_THREADS];
    struct async_writer w[ASYNC_THREADS];
    struct idem_store_stats before, after;
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    int errors = 0;

    /* Nothing staged: refused at once, and `done` is never called. */
    fp_of("{\"async\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &async_op, "alice", "async-unstaged", fp, &call, &oc), 0);
    CHECK_INT(idem_call_commit_async(call, async_committed, NULL), IDEM_ESTATE);
    CHECK_INT(idem_call_commit_async(call, NULL, NULL), IDEM_EINVAL);
    idem_call_end(call);
    CHECK_INT(atomic_load(&async_done_ok) + atomic_load(&async_done_failed), 0);

    idem_store_stats(st, &before);
    for (int i = 0; i < ASYNC_THREADS; i++) {
        w[i] = (struct async_writer){.eng = eng, .id = i};
        pthread_create(&th[i], NULL, async_run, &w[i]);
    }
    for (int i = 0; i < ASYNC_THREADS; i++) {
        pthread_join(th[i], NULL);
        errors += w[i].errors;
    }
    /*
     * Every commit was handed over: each is told once its batch is durable, on the store's
     * thread (the syncer's, with the SQLite pipeline), so possibly after the writers returned.
     */
    CHECK_INT(errors, 0);
    T_WAIT_UNTIL(atomic_load(&async_done_ok) + atomic_load(&async_done_failed) ==
                     ASYNC_THREADS * ASYNC_EACH,
                 "every async commit told");
    CHECK_INT(atomic_load(&async_done_ok), ASYNC_THREADS * ASYNC_EACH);
    CHECK_INT(atomic_load(&async_done_failed), 0);
    CHECK_INT(atomic_load(&async_bad_state), 0);
    CHECK_INT(biz_count(st, "async-"), ASYNC_THREADS * ASYNC_EACH);
    expect_replay(eng, &async_op, "async-3-7", fp, 201, "async");
    idem_store_stats(st, &after);
    if (strcmp(store_kind, "sqlite") == 0)
        CHECK(after.durable_commits - before.durable_commits <
              after.write_commits - before.write_commits); /* shared fsyncs */
    fprintf(stderr, "commit_async: %d calls in %llu durable commits\n", ASYNC_THREADS * ASYNC_EACH,
            (unsigned long long)(after.durable_commits - before.durable_commits));
}

/* Several handles migrating at once (as several processes starting together) all succeed. */
/* ---- 9c. claims committed at a recovery point, completions with no phase open -------------- */

/*
 * An operation with a claim_point (idem-gateway's: the claim is durable before the request goes
 * upstream) and the phase-less completion that follows: each is one whole transaction, which the
 * SQLite store runs on whichever thread holds its writer (write_run).  Under concurrency with
 * ordinary writers: one owner per key, every response stored, and fsyncs still shared.
 */
static const struct idem_operation point_op = {
    .name = "contract.point", .lease_ms = 10000, .wait_ms = 2000, .claim_point = "forwarded"};

#define POINT_THREADS 10
#define POINT_KEYS 30

struct point_worker {
    struct idem_engine *eng;
    struct idem_store *st;
    int id;
    int executed, replayed, committed, errors;
};

static void *point_run(void *arg)
{
    struct point_worker *w = arg;
    unsigned char fp[IDEM_FP_LEN];
    char key[64], body[96];

    fp_of("{\"point\":1}", fp);
    for (int i = 0; i < POINT_KEYS; i++) {
        struct idem_call *call = NULL;
        enum idem_outcome oc;
        struct idem_tx *tx = NULL;
        const char *p[2] = {key, "point"};

        /* Even threads share their keys with the next odd one: a race per key. */
        snprintf(key, sizeof(key), "point-%d-%d", w->id / 2, i);
        snprintf(body, sizeof(body), "done %s", key);
        if (idem_call_begin(w->eng, &point_op, "alice", key, fp, &call, &oc) != 0) {
            w->errors++;
        } else if (oc == IDEM_OUTCOME_EXECUTE) {
            /* Claimed durably at the point, no phase open: the work happens elsewhere. */
            if (idem_call_tx(call) != NULL ||
                strcmp(idem_call_recovery_point(call), "forwarded") != 0 ||
                idem_call_complete(call, 201, NULL, 0, body, strlen(body)) != 0)
                w->errors++;
            else
                w->executed++;
        } else if (oc == IDEM_OUTCOME_REPLAY) {
            size_t len = 0;
            const void *b = idem_call_response_body(call, &len);
            if (len != strlen(body) || memcmp(b, body, len) != 0)
                w->errors++;
            w->replayed++;
        } else {
            w->errors++;
        }
        idem_call_end(call);

        /* An ordinary writer in the same batches: its own savepoint, its own rows. */
        snprintf(key, sizeof(key), "pointrow-%d-%d", w->id, i);
        if (idem_tx_begin(w->st, 1, &tx) != 0 ||
            idem_tx_exec(tx, "INSERT INTO biz (id, note) VALUES ($1, $2)", 2, p, NULL) != 0 ||
            idem_tx_commit(tx) != 0) {
            if (tx)
                idem_tx_rollback(tx);
            w->errors++;
        } else {
            w->committed++;
        }
    }
    return NULL;
}

/*
 * `call` (alice's, of point_op) holds no phase, and the store -- read by `reader` -- has its
 * record at the point "forwarded", processing under a live lease.
 */
static void expect_claimed_at_point(struct idem_engine *reader, struct idem_call *call,
                                    const char *key)
{
    struct idem_record_info info;

    CHECK(idem_call_tx(call) == NULL);
    CHECK_STR(idem_call_recovery_point(call), "forwarded");
    CHECK_INT(idem_record_inspect(reader, "alice", "contract.point", key, &info), 0);
    CHECK_INT(info.found, 1);
    CHECK_INT(info.completed, 0);
    CHECK_STR(info.recovery_point, "forwarded");
    CHECK_INT(info.lease_live, 1);
}

/*
 * A one-phase operation (orderd's create): EXECUTE opens the phase without writing the record,
 * which goes in already completed with the phase's own rows -- one record statement.  A rollback
 * leaves nothing; a record that retention let go is replaced; a second completion of the same
 * key in one phase is refused (IDEM_ELEASE) with the phase rolled back; an advance writes the
 * record processing at its point, as a claim would have.  On PostgreSQL, where the completion
 * goes out with the COMMIT, a claim of another engine that came first fails that commit.
 */
static void expect_no_record(struct idem_engine *eng, const char *operation, const char *key)
{
    struct idem_record_info info;
    CHECK_INT(idem_record_inspect(eng, "alice", operation, key, &info), 0);
    CHECK_INT(info.found, 0);
}

/* The records of `key` that the call's open phase sees (its own writes included). */
static int rows_in_phase(struct idem_call *call, const char *key)
{
    struct idem_rows *r = NULL;
    const char *p[] = {key};
    int n = -1;

    if (idem_tx_exec(idem_call_tx(call), "SELECT count(*) FROM idem_records WHERE idem_key = $1", 1,
                     p, &r) == 0)
        n = atoi(idem_rows_get(r, 0, 0));
    idem_rows_free(r);
    return n;
}

static void test_one_phase(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {
        .name = "contract.onephase", .lease_ms = 10000, .wait_ms = 2000, .one_phase = 1};
    static const struct idem_operation brief = {
        .name = "contract.onephase", .ttl_ms = 1, .lease_ms = 10000, .one_phase = 1};
    static const struct idem_operation claimed = {/* the same scope, claimed the usual way */
                                                  .name = "contract.onephase",
                                                  .lease_ms = 10000};
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_engine *nocache = NULL;
    struct idem_record_info info;
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    int rc;

    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);
    fp_of("{\"one\":1}", fp);

    /* Fresh: a phase, no record yet; the completion stores record and rows together. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "op-fresh", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(rows_in_phase(call, "op-fresh"), 0); /* not even in its own transaction */
    CHECK_INT(biz_insert(call, "onephase-1"), 0);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "made", 4), 0);
    CHECK_INT(idem_call_response_status(call), 201);
    idem_call_end(call);
    expect_replay(nocache, &op, "op-fresh", fp, 201, "made");
    expect_replay(eng, &op, "op-fresh", fp, 201, "made");
    CHECK_INT(idem_record_inspect(nocache, "alice", op.name, "op-fresh", &info), 0);
    CHECK_INT(info.completed, 1);
    CHECK_INT(info.lease_expires_ms, 0);

    /* Aborted: neither record nor row, and the key runs afresh. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "op-abort", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(call, "onephase-2"), 0);
    idem_call_abort(call);
    idem_call_end(call);
    expect_no_record(nocache, op.name, "op-abort");
    CHECK_INT(biz_count(st, "onephase-2"), 0);
    CHECK_INT(idem_call_begin(eng, &op, "alice", "op-abort", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "second", 6), 0);
    idem_call_end(call);
    expect_replay(nocache, &op, "op-abort", fp, 200, "second");

    /* Past retention, a completed record is replaced by the next execution. */
    CHECK_INT(idem_call_begin(nocache, &brief, "alice", "op-old", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "old", 3), 0);
    idem_call_end(call);
    T_WAIT_UNTIL(!record_kept(nocache, "alice", op.name, "op-old"),
                 "the record's retention to end");
    CHECK_INT(idem_call_begin(nocache, &op, "alice", "op-old", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "new", 3), 0);
    idem_call_end(call);
    expect_replay(nocache, &op, "op-old", fp, 201, "new");

    /* Two completions of one key in one phase: refused, and the phase is gone whole. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "op-twice", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(biz_insert(call, "onephase-3"), 0);
    CHECK_INT(idem_call_stage(call, 201, NULL, 0, "a", 1), 0);
    rc = idem_call_stage(call, 201, NULL, 0, "b", 1);
    if (rc == 0) /* (sent with the COMMIT: the COMMIT fails) */
        rc = idem_call_commit(call);
    CHECK_INT(rc, IDEM_ELEASE);
    idem_call_end(call);
    expect_no_record(nocache, op.name, "op-twice");
    CHECK_INT(biz_count(st, "onephase-3"), 0);

    /* An advance writes the record processing at its point, leased, with the phase. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "op-advance", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(rows_in_phase(call, "op-advance"), 0);
    CHECK_INT(idem_call_advance(call, "charged", "ch_1"), 0);
    CHECK_INT(idem_record_inspect(nocache, "alice", op.name, "op-advance", &info), 0);
    CHECK_INT(info.found, 1);
    CHECK_INT(info.completed, 0);
    CHECK_STR(info.recovery_point, "charged");
    CHECK_INT(info.lease_live, 1);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "paid", 4), 0);
    idem_call_end(call);
    expect_replay(nocache, &op, "op-advance", fp, 201, "paid");

    /*
     * A key this engine's cache does not know, done by another engine.  SQLite reads first;
     * PostgreSQL runs the phase at once (no read: one round trip less for a fresh key) and its
     * COMMIT finds the key taken (IDEM_ELEASE, nothing of the run stays).  Either way the
     * caller's retry on this thread answers from the record: a replay, a mismatch, a wait.
     */
    {
        const int speculates = strcmp(store_kind, "postgresql") == 0;
        const char *keys[3] = {"op-known", "op-known", "op-busy"};
        unsigned char other_fp[IDEM_FP_LEN];
        struct idem_call *holder = NULL;
        size_t len = 0;

        fp_of("{\"one\":2}", other_fp);
        CHECK_INT(idem_call_begin(nocache, &op, "alice", "op-known", fp, &call, &oc), 0);
        CHECK_INT(idem_call_complete(call, 201, NULL, 0, "theirs", 6), 0);
        idem_call_end(call);
        CHECK_INT(idem_call_begin(nocache, &op, "alice", "op-busy", fp, &holder, &oc), 0);
        CHECK_INT(idem_call_advance(holder, "charged", NULL), 0); /* processing, lease live */
        for (int i = 0; i < 3; i++) {
            const unsigned char *f = i == 1 ? other_fp : fp;
            CHECK_INT(idem_call_begin(eng, &op, "alice", keys[i], f, &call, &oc), 0);
            /* (the second time, the record read by the first is in the replay cache) */
            CHECK_INT(oc == IDEM_OUTCOME_EXECUTE, speculates && i != 1);
            if (oc == IDEM_OUTCOME_EXECUTE) {
                CHECK_INT(biz_insert(call, "onephase-5"), 0);
                CHECK_INT(idem_call_complete(call, 201, NULL, 0, "mine", 4), IDEM_ELEASE);
                idem_call_end(call);
                CHECK_INT(idem_call_begin(eng, &op, "alice", keys[i], f, &call, &oc), 0);
            }
            CHECK_INT(oc, i == 0   ? IDEM_OUTCOME_REPLAY
                          : i == 1 ? IDEM_OUTCOME_MISMATCH
                                   : IDEM_OUTCOME_IN_PROGRESS);
            if (i == 0)
                CHECK(memcmp(idem_call_response_body(call, &len), "theirs", 6) == 0);
            idem_call_end(call);
        }
        CHECK_INT(biz_count(st, "onephase-5"), 0);
        CHECK_INT(idem_call_complete(holder, 201, NULL, 0, "held", 4), 0);
        idem_call_end(holder);
    }

    if (strcmp(store_kind, "postgresql") == 0) {
        /* Another engine's claim lands between this call's read and its commit. */
        struct idem_call *other = NULL;
        CHECK_INT(idem_call_begin(eng, &op, "alice", "op-race", fp, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        CHECK_INT(biz_insert(call, "onephase-4"), 0);
        CHECK_INT(idem_call_begin(nocache, &claimed, "alice", "op-race", fp, &other, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
        CHECK_INT(idem_call_complete(other, 201, NULL, 0, "other", 5), 0);
        idem_call_end(other);
        rc = idem_call_stage(call, 201, NULL, 0, "mine", 4);
        if (rc == 0)
            rc = idem_call_commit(call);
        CHECK_INT(rc, IDEM_ELEASE);
        idem_call_end(call);
        CHECK_INT(biz_count(st, "onephase-4"), 0);
    }
    idem_engine_free(nocache);
}

static void test_claim_point(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation short_op = {
        .name = "contract.point", .lease_ms = 50, .wait_ms = 10, .claim_point = "forwarded"};
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_engine *nocache = NULL;
    struct point_worker w[POINT_THREADS];
    pthread_t th[POINT_THREADS];
    struct idem_store_stats before, after;
    struct idem_record_info info;
    struct idem_call *call = NULL, *heir = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    int executed = 0, replayed = 0, committed = 0, errors = 0;

    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);
    fp_of("{\"point\":1}", fp);

    /* The claim is in the store, at the point, before idem_call_begin returns. */
    CHECK_INT(idem_call_begin(eng, &point_op, "alice", "point-one", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    expect_claimed_at_point(nocache, call, "point-one");
    /* A duplicate meanwhile is in progress, and nothing ran twice. */
    {
        struct idem_call *dup = NULL;
        CHECK_INT(idem_call_begin(nocache, &short_op, "alice", "point-one", fp, &dup, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS);
        idem_call_end(dup);
    }
    /* Completed with no phase open: stored, replayed by an engine that reads the store. */
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "one", 3), 0);
    CHECK_INT(idem_call_response_status(call), 201);
    idem_call_end(call);
    expect_replay(nocache, &point_op, "point-one", fp, 201, "one");

    /*
     * Fenced: a claim whose lease ran out and was taken over cannot complete the record any
     * more (IDEM_ELEASE); the heir's answer is the one stored.
     */
    CHECK_INT(idem_call_begin(eng, &short_op, "alice", "point-lost", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    T_WAIT_UNTIL(lease_over(eng, "alice", short_op.name, "point-lost"),
                 "the lease of the claim to run out");
    CHECK_INT(idem_call_begin(nocache, &short_op, "alice", "point-lost", fp, &heir, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_STR(idem_call_recovery_point(heir), "forwarded");
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "late", 4), IDEM_ELEASE);
    CHECK_INT(idem_call_complete(heir, 200, NULL, 0, "heir", 4), 0);
    idem_call_end(call);
    idem_call_end(heir);
    expect_replay(nocache, &short_op, "point-lost", fp, 200, "heir");

    /* Racing threads, alongside ordinary writers. */
    idem_store_stats(st, &before);
    for (int i = 0; i < POINT_THREADS; i++) {
        w[i] = (struct point_worker){.eng = eng, .st = st, .id = i};
        pthread_create(&th[i], NULL, point_run, &w[i]);
    }
    for (int i = 0; i < POINT_THREADS; i++) {
        pthread_join(th[i], NULL);
        executed += w[i].executed;
        replayed += w[i].replayed;
        committed += w[i].committed;
        errors += w[i].errors;
    }
    idem_store_stats(st, &after);
    CHECK_INT(errors, 0);
    CHECK_INT(executed, POINT_THREADS / 2 * POINT_KEYS); /* one owner per key */
    CHECK_INT(replayed, POINT_THREADS / 2 * POINT_KEYS);
    CHECK_INT(committed, POINT_THREADS * POINT_KEYS);
    CHECK_INT(biz_count(st, "pointrow-"), POINT_THREADS * POINT_KEYS);
    CHECK_INT(idem_record_inspect(nocache, "alice", "contract.point", "point-3-17", &info), 0);
    CHECK_INT(info.completed, 1);
    CHECK_INT(info.response_status, 201);
    if (strcmp(store_kind, "sqlite") == 0)
        CHECK(after.durable_commits - before.durable_commits <
              after.write_commits - before.write_commits); /* shared fsyncs */
    fprintf(stderr, "claim points: %d keys executed once each, %d writes in %llu durable commits\n",
            executed, (int)(after.write_commits - before.write_commits),
            (unsigned long long)(after.durable_commits - before.durable_commits));
    idem_engine_free(nocache);
}

/*
 * A fresh key claimed and completed without a waiting thread (idem_call_begin_async,
 * idem_call_complete_async: the gateway's event loop).  On SQLite each step runs on the store's
 * own thread and tells its callback once durable; duplicates see the claim in flight meanwhile;
 * an existing record sends the caller the blocking way; a completion after a takeover is fenced.
 * PostgreSQL cannot claim without a waiting thread: begin_async declines, and complete_async
 * completes before it returns.
 */
struct async_step {
    atomic_int done;
    struct idem_call *call;
    int rc;
    enum idem_outcome outcome;
    pthread_t thread;
};

static void async_begun(struct idem_call *call, int rc, enum idem_outcome outcome, void *arg)
{
    struct async_step *a = arg;
    a->call = call;
    a->rc = rc;
    a->outcome = outcome;
    a->thread = pthread_self();
    atomic_store(&a->done, 1);
}

static void async_completed(struct idem_call *call, int rc, void *arg)
{
    async_begun(call, rc, IDEM_OUTCOME_NONE, arg);
}

/* Waits for the step's callback (the store's thread runs it); returns whether it came. */
static int async_wait(struct async_step *a)
{
    T_WAIT_UNTIL(atomic_load(&a->done), "the store's thread to run the callback");
    return atomic_load(&a->done);
}

/*
 * A one-phase fresh request run whole by the store's writer (idem_call_run_async: orderd's event
 * loop).  The run and its commit happen on the store's thread (SQLite's group commit;
 * PostgreSQL's batches, tx_batch.c), and `done` comes once durable; a key with a record asks for
 * idem_call_begin(); a run that fails keeps nothing.
 */
struct run_step {
    const char *row;  /* the business row the run inserts */
    int fail;         /* the run fails after its insert */
    pthread_t thread; /* where the run ran */
    struct async_step a;
};

static int run_phase(struct idem_call *call, void *arg)
{
    struct run_step *r = arg;
    int rc;

    r->thread = pthread_self();
    rc = biz_insert(call, r->row);
    if (rc == 0 && r->fail)
        return IDEM_ESTORE;
    if (rc == 0)
        rc = idem_call_stage(call, 201, NULL, 0, r->row, strlen(r->row));
    return rc;
}

static void run_done(struct idem_call *call, int rc, void *arg)
{
    struct run_step *r = arg;
    async_completed(call, rc, &r->a);
}

static void test_run_async(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {
        .name = "contract.run", .lease_ms = 10000, .wait_ms = 2000, .one_phase = 1};
    static const struct idem_operation plain = {.name = "contract.run", .lease_ms = 10000};
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_engine *nocache = NULL;
    struct run_step r;
    struct idem_call *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    int rc;

    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);
    fp_of("{\"run\":1}", fp);
    /* Not for an operation that claims ahead. */
    CHECK_INT(idem_call_run_async(eng, &plain, "alice", "run-x", fp, run_phase, run_done, &r), 0);

    /* Fresh: run on the store's thread, durable when told, replayed by any engine. */
    r = (struct run_step){.row = "runrow-1"};
    CHECK_INT(idem_call_run_async(eng, &op, "alice", "run-1", fp, run_phase, run_done, &r), 1);
    CHECK(async_wait(&r.a));
    CHECK_INT(r.a.rc, 0);
    CHECK(!pthread_equal(r.thread, pthread_self()));
    CHECK_INT(idem_call_response_status(r.a.call), 201);
    idem_call_end(r.a.call);
    expect_replay(nocache, &op, "run-1", fp, 201, "runrow-1");
    CHECK_INT(biz_count(st, "runrow-1"), 1);

    /* The key has a record now: not run again, and the caller is sent to idem_call_begin. */
    CHECK_INT(idem_call_begin(nocache, &plain, "alice", "run-2", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "other", 5), 0);
    idem_call_end(call);
    r = (struct run_step){.row = "runrow-2"};
    CHECK_INT(idem_call_run_async(eng, &op, "alice", "run-2", fp, run_phase, run_done, &r), 1);
    CHECK(async_wait(&r.a));
    CHECK_INT(r.a.rc, IDEM_CALL_ASK_BEGIN);
    idem_call_end(r.a.call);
    CHECK_INT(biz_count(st, "runrow-2"), 0);
    expect_replay(eng, &op, "run-2", fp, 200, "other");

    /* A run that fails keeps nothing: no row, no record, and the key runs afresh. */
    r = (struct run_step){.row = "runrow-3", .fail = 1};
    CHECK_INT(idem_call_run_async(eng, &op, "alice", "run-3", fp, run_phase, run_done, &r), 1);
    CHECK(async_wait(&r.a));
    CHECK_INT(r.a.rc, IDEM_ESTORE);
    idem_call_end(r.a.call);
    CHECK_INT(biz_count(st, "runrow-3"), 0);
    CHECK_INT(record_kept(nocache, "alice", op.name, "run-3"), 0);

    /*
     * Many at once, every third failing: they run on the writer back to back, in one transaction
     * (or one savepoint) of them all, so each failure undoes its neighbours' writes too and they
     * run again.  What is left is exactly the rows and records of the runs that succeeded.
     */
    {
        enum { MANY = 30 };
        static struct run_step many[MANY];
        char row[MANY][32], key[MANY][32];
        int ok = 0;

        for (int i = 0; i < MANY; i++) {
            snprintf(row[i], sizeof(row[i]), "manyrow-%02d", i);
            snprintf(key[i], sizeof(key[i]), "run-many-%02d", i);
            many[i] = (struct run_step){.row = row[i], .fail = i % 3 == 0};
        }
        for (int i = 0; i < MANY; i++)
            CHECK_INT(
                idem_call_run_async(eng, &op, "alice", key[i], fp, run_phase, run_done, &many[i]),
                1);
        for (int i = 0; i < MANY; i++) {
            CHECK(async_wait(&many[i].a));
            CHECK_INT(many[i].a.rc, many[i].fail ? IDEM_ESTORE : 0);
            ok += many[i].a.rc == 0;
            idem_call_end(many[i].a.call);
            CHECK_INT(biz_count(st, row[i]), many[i].fail ? 0 : 1);
            CHECK_INT(record_kept(nocache, "alice", op.name, key[i]), !many[i].fail);
        }
        CHECK_INT(ok, MANY - MANY / 3);
    }

    /* A key in flight in this engine: declined (the caller waits the blocking way). */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "run-4", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    rc = idem_call_run_async(eng, &op, "alice", "run-4", fp, run_phase, run_done, &r);
    CHECK_INT(rc, 0);
    idem_call_abort(call);
    idem_call_end(call);
    idem_engine_free(nocache);
}

static void test_begin_async(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation short_op = {
        .name = "contract.point", .lease_ms = 50, .wait_ms = 10, .claim_point = "forwarded"};
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_engine *nocache = NULL, *fresh = NULL;
    struct idem_call *call = NULL, *heir = NULL, *dup = NULL;
    struct async_step a;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];

    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);
    CHECK_INT(idem_engine_new(st, NULL, &fresh), 0);
    fp_of("{\"async\":1}", fp);

    /* The claim: durable at the point when the callback runs, on the store's thread. */
    memset(&a, 0, sizeof a);
    CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", "async-one", fp, async_begun, &a), 1);
    /* In flight from the start: a second asynchronous claim declines, for the blocking way. */
    CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", "async-one", fp, async_begun, &a), 0);
    CHECK(async_wait(&a));
    CHECK(!pthread_equal(a.thread, pthread_self()));
    CHECK_INT(a.rc, 0);
    CHECK_INT(a.outcome, IDEM_OUTCOME_EXECUTE);
    call = a.call;
    expect_claimed_at_point(nocache, call, "async-one");
    CHECK_INT(idem_call_begin(nocache, &short_op, "alice", "async-one", fp, &dup, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_IN_PROGRESS);
    idem_call_end(dup);

    /* The completion: durable, and the call's response, when its callback runs. */
    memset(&a, 0, sizeof a);
    CHECK_INT(idem_call_complete_async(call, 201, NULL, 0, "one", 3, async_completed, &a), 0);
    CHECK(async_wait(&a));
    CHECK(!pthread_equal(a.thread, pthread_self()));
    CHECK_INT(a.rc, 0);
    CHECK_INT(idem_call_response_status(call), 201);
    CHECK_INT(idem_call_complete_async(call, 201, NULL, 0, "again", 5, async_completed, &a),
              IDEM_ESTATE);
    idem_call_end(call);
    expect_replay(nocache, &point_op, "async-one", fp, 201, "one");
    /* The engine that completed it answers from memory: nothing left to claim. */
    CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", "async-one", fp, async_begun, &a), 0);

    /* A record this engine does not know: the claim finds it, and the blocking way replays. */
    memset(&a, 0, sizeof a);
    CHECK_INT(idem_call_begin_async(fresh, &point_op, "alice", "async-one", fp, async_begun, &a),
              1);
    CHECK(async_wait(&a));
    CHECK_INT(a.rc, 0);
    CHECK_INT(a.outcome, IDEM_OUTCOME_NONE);
    idem_call_end(a.call);
    expect_replay(fresh, &point_op, "async-one", fp, 201, "one");

    /* Fenced: a completion after its lease was taken over stores nothing (IDEM_ELEASE). */
    memset(&a, 0, sizeof a);
    CHECK_INT(idem_call_begin_async(eng, &short_op, "alice", "async-lost", fp, async_begun, &a), 1);
    CHECK(async_wait(&a));
    CHECK_INT(a.outcome, IDEM_OUTCOME_EXECUTE);
    call = a.call;
    T_WAIT_UNTIL(lease_over(eng, "alice", short_op.name, "async-lost"),
                 "the lease of the claim to run out");
    CHECK_INT(idem_call_begin(nocache, &short_op, "alice", "async-lost", fp, &heir, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    memset(&a, 0, sizeof a);
    CHECK_INT(idem_call_complete_async(call, 201, NULL, 0, "late", 4, async_completed, &a), 0);
    CHECK(async_wait(&a));
    CHECK_INT(a.rc, IDEM_ELEASE);
    CHECK_INT(idem_call_complete(heir, 200, NULL, 0, "heir", 4), 0);
    idem_call_end(call);
    idem_call_end(heir);
    expect_replay(nocache, &short_op, "async-lost", fp, 200, "heir");
    idem_engine_free(fresh);
    idem_engine_free(nocache);
}

/*
 * Completions queued at once (PostgreSQL runs them several to a transaction, as one statement:
 * tx_batch.c, store_pg.c) each end as they would alone: one fenced out after a takeover fails
 * (IDEM_ELEASE) and stores nothing, and its neighbours complete.
 */
#define FA_CALLS 8

static void test_complete_async_fenced_alone(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation short_op = {
        .name = "contract.point", .lease_ms = 50, .wait_ms = 10, .claim_point = "forwarded"};
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_engine *nocache = NULL;
    struct async_step a[FA_CALLS];
    struct idem_call *heir[FA_CALLS] = {0};
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    char key[32], body[8];

    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);
    fp_of("{\"async\":2}", fp);
    for (int i = 0; i < FA_CALLS; i++) {
        memset(&a[i], 0, sizeof a[i]);
        snprintf(key, sizeof key, "fa-%d", i);
        CHECK_INT(idem_call_begin_async(eng, &short_op, "alice", key, fp, async_begun, &a[i]), 1);
    }
    for (int i = 0; i < FA_CALLS; i++) {
        CHECK(async_wait(&a[i]));
        CHECK_INT(a[i].outcome, IDEM_OUTCOME_EXECUTE);
    }
    /* Two of them lose their record to an heir once their leases ran out. */
    for (int i = 2; i < FA_CALLS; i += 3) {
        snprintf(key, sizeof key, "fa-%d", i);
        T_WAIT_UNTIL(lease_over(eng, "alice", short_op.name, key), "the claim's lease to run out");
        CHECK_INT(idem_call_begin(nocache, &short_op, "alice", key, fp, &heir[i], &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    }
    for (int i = 0; i < FA_CALLS; i++) {
        struct idem_call *call = a[i].call;
        memset(&a[i], 0, sizeof a[i]);
        snprintf(body, sizeof body, "b%d", i);
        CHECK_INT(idem_call_complete_async(call, 201, NULL, 0, body, strlen(body), async_completed,
                                           &a[i]),
                  0);
    }
    for (int i = 0; i < FA_CALLS; i++) {
        CHECK(async_wait(&a[i]));
        CHECK_INT(a[i].rc, heir[i] ? IDEM_ELEASE : 0);
        idem_call_end(a[i].call);
        snprintf(key, sizeof key, "fa-%d", i);
        snprintf(body, sizeof body, "b%d", i);
        if (heir[i]) {
            CHECK_INT(idem_call_complete(heir[i], 200, NULL, 0, "heir", 4), 0);
            idem_call_end(heir[i]);
            expect_replay(nocache, &short_op, key, fp, 200, "heir");
        } else {
            expect_replay(nocache, &short_op, key, fp, 201, body);
        }
    }
    idem_engine_free(nocache);
}

/*
 * Claims queued at once (PostgreSQL claims a batch's keys in one statement: tx_batch.c,
 * store_pg.c) each end as they would alone: fresh keys and a key whose retention ended are won,
 * a completed key, one held under a live lease and a stalled one (its lease ran out, its
 * retention did not) are taken, and of one key claimed by two engines at once exactly one wins.
 */
#define CA_FRESH 4

static void test_claims_async_each_alone(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation short_op = {
        .name = "contract.point", .lease_ms = 50, .wait_ms = 10, .claim_point = "forwarded"};
    static const struct idem_operation brief_op = {
        .name = "contract.point", .ttl_ms = 1, .lease_ms = 50, .claim_point = "forwarded"};
    static const char *const taken[] = {"ca-done", "ca-held", "ca-stalled"};
    struct idem_engine_options o = {.replay_cache_bytes = IDEM_REPLAY_CACHE_OFF};
    struct idem_engine *nocache = NULL, *other = NULL;
    struct async_step fresh[CA_FRESH], old[3], gone, twice[2];
    struct idem_call *held = NULL, *call = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    char key[32];
    int won = 0;

    CHECK_INT(idem_engine_new(st, &o, &nocache), 0);
    CHECK_INT(idem_engine_new(st, NULL, &other), 0);
    fp_of("{\"async\":3}", fp);
    /* Completed; held under a live lease; stalled; and a record whose retention ended. */
    CHECK_INT(idem_call_begin(nocache, &point_op, "alice", "ca-done", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, NULL, 0, "done", 4), 0);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(nocache, &point_op, "alice", "ca-held", fp, &held, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_begin(nocache, &short_op, "alice", "ca-stalled", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    idem_call_end(call);
    CHECK_INT(idem_call_begin(nocache, &brief_op, "alice", "ca-gone", fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    idem_call_end(call);
    T_WAIT_UNTIL(lease_over(nocache, "alice", short_op.name, "ca-stalled") &&
                     !record_kept(nocache, "alice", brief_op.name, "ca-gone"),
                 "the lease and the retention to run out");

    /* All queued back to back: the store's runner takes them as one batch, or a few. */
    memset(fresh, 0, sizeof fresh);
    memset(old, 0, sizeof old);
    memset(&gone, 0, sizeof gone);
    memset(twice, 0, sizeof twice);
    for (int i = 0; i < CA_FRESH; i++) {
        snprintf(key, sizeof key, "ca-fresh-%d", i);
        CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", key, fp, async_begun, &fresh[i]),
                  1);
        if (i == 1) {
            CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", "ca-twice", fp, async_begun,
                                            &twice[0]),
                      1);
            CHECK_INT(idem_call_begin_async(other, &point_op, "alice", "ca-twice", fp, async_begun,
                                            &twice[1]),
                      1);
        }
        if (i < 3)
            CHECK_INT(idem_call_begin_async(other, &point_op, "alice", taken[i], fp, async_begun,
                                            &old[i]),
                      1);
    }
    CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", "ca-gone", fp, async_begun, &gone), 1);

    for (int i = 0; i < CA_FRESH; i++) {
        CHECK(async_wait(&fresh[i]));
        CHECK_INT(fresh[i].rc, 0);
        CHECK_INT(fresh[i].outcome, IDEM_OUTCOME_EXECUTE);
        snprintf(key, sizeof key, "ca-fresh-%d", i);
        expect_claimed_at_point(nocache, fresh[i].call, key);
    }
    for (int i = 0; i < 3; i++) {
        CHECK(async_wait(&old[i]));
        CHECK_INT(old[i].rc, 0);
        CHECK_INT(old[i].outcome, IDEM_OUTCOME_NONE);
        idem_call_end(old[i].call);
    }
    CHECK(async_wait(&gone));
    CHECK_INT(gone.rc, 0);
    CHECK_INT(gone.outcome, IDEM_OUTCOME_EXECUTE);
    expect_claimed_at_point(nocache, gone.call, "ca-gone");
    for (int i = 0; i < 2; i++) {
        CHECK(async_wait(&twice[i]));
        CHECK_INT(twice[i].rc, 0);
        CHECK(twice[i].outcome == IDEM_OUTCOME_EXECUTE || twice[i].outcome == IDEM_OUTCOME_NONE);
        won += twice[i].outcome == IDEM_OUTCOME_EXECUTE;
    }
    CHECK_INT(won, 1);

    /* What each holds is what it would hold alone: the winners complete, the rest were left. */
    for (int i = 0; i < CA_FRESH; i++) {
        CHECK_INT(idem_call_complete(fresh[i].call, 201, NULL, 0, "fresh", 5), 0);
        idem_call_end(fresh[i].call);
        snprintf(key, sizeof key, "ca-fresh-%d", i);
        expect_replay(nocache, &point_op, key, fp, 201, "fresh");
    }
    CHECK_INT(idem_call_complete(gone.call, 201, NULL, 0, "again", 5), 0);
    idem_call_end(gone.call);
    expect_replay(nocache, &point_op, "ca-gone", fp, 201, "again");
    for (int i = 0; i < 2; i++) {
        if (twice[i].outcome == IDEM_OUTCOME_EXECUTE)
            CHECK_INT(idem_call_complete(twice[i].call, 201, NULL, 0, "twice", 5), 0);
        idem_call_end(twice[i].call);
    }
    expect_replay(nocache, &point_op, "ca-twice", fp, 201, "twice");
    expect_replay(nocache, &point_op, "ca-done", fp, 201, "done");
    CHECK_INT(idem_call_complete(held, 200, NULL, 0, "held", 4), 0);
    idem_call_end(held);
    expect_replay(nocache, &point_op, "ca-held", fp, 200, "held");
    idem_engine_free(other);
    idem_engine_free(nocache);
}

/* ---- 9e. callbacks that block, and a commit that fails alone ------------------------------- */

/*
 * A callback of the asynchronous calls runs on a thread of the store's, and may use libidem like
 * any other thread: end its call (which releases a durable record that did not complete, a
 * blocking write) or another one.  It must never wait for the thread it runs on: a deadlock
 * there would hang every later write of the process, so a watchdog ends the run instead.
 */
static const struct idem_operation phased_op = {
    .name = "contract.phased", .lease_ms = 60000, .wait_ms = 100};

static const struct idem_migration fk_schema[] = {
    {1, "rows whose parent is checked at COMMIT",
     "CREATE TABLE fk_parent (id TEXT PRIMARY KEY);"
     " CREATE TABLE fk_child (id TEXT PRIMARY KEY,"
     " parent TEXT REFERENCES fk_parent (id) DEFERRABLE INITIALLY DEFERRED)",
     "CREATE TABLE fk_parent (id TEXT PRIMARY KEY);"
     " CREATE TABLE fk_child (id TEXT PRIMARY KEY,"
     " parent TEXT REFERENCES fk_parent (id) DEFERRABLE INITIALLY DEFERRED)"},
};

static void watchdog_fired(int sig)
{
    static const char msg[] = "store_contract: a callback deadlocked the store (watchdog)\n";

    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) {
        /* (nothing more to say) */
    }
    _exit(1);
}

struct ending {
    struct idem_call *other; /* ended by the callback too, before its own call (NULL: none) */
    int rc;
    atomic_int told;
};

static void end_in_callback(struct idem_call *call, int rc, void *arg)
{
    struct ending *e = arg;

    e->rc = rc;
    idem_call_end(e->other);
    idem_call_end(call);
    atomic_store(&e->told, 1);
}

/* Begins `key` of phased_op and moves it to "created": a durable record, not completed. */
static struct idem_call *phased_created(struct idem_engine *eng, const char *key)
{
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome oc;

    fp_of("{\"phased\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &phased_op, "alice", key, fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(call, "created", NULL), 0);
    return call;
}

/* The record of `key` was released: the next request resumes it at once, at "created". */
static void expect_released(struct idem_engine *eng, const char *key)
{
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome oc = IDEM_OUTCOME_NONE;

    fp_of("{\"phased\":1}", fp);
    CHECK_INT(idem_call_begin(eng, &phased_op, "alice", key, fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_RESUME);
    CHECK_STR(idem_call_recovery_point(call), "created");
    CHECK_INT(idem_call_complete(call, 200, NULL, 0, "resumed", 7), 0);
    idem_call_end(call);
}

static int fk_rows(struct idem_store *st)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    int n = -1;

    if (idem_tx_begin(st, 0, &tx) < 0)
        return -1;
    if (idem_tx_exec(tx, "SELECT count(*) FROM fk_child", 0, NULL, &r) == 0)
        n = atoi(idem_rows_get(r, 0, 0));
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return n;
}

/* Ends the run if a callback deadlocked the store, instead of hanging it: armed for `s`. */
static void watchdog_arm(struct sigaction *old, unsigned s)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = watchdog_fired;
    sigaction(SIGALRM, &sa, old);
    alarm(s);
}

static void watchdog_disarm(const struct sigaction *old)
{
    alarm(0);
    sigaction(SIGALRM, old, NULL);
}

static void test_callbacks_may_block(struct idem_engine *eng)
{
    struct sigaction old;
    struct ending ended = {0};
    struct idem_call *x, *y;
    unsigned char fp[IDEM_FP_LEN];

    watchdog_arm(&old, 60);
    /*
     * A callback that ends another call holding a durable, unfinished record: the release is a
     * blocking write, made from the store's thread.
     */
    x = phased_created(eng, "cb-x");
    y = phased_created(eng, "cb-y");
    CHECK_INT(idem_call_phase_begin(y), 0);
    CHECK_INT(idem_call_stage(y, 201, NULL, 0, "y", 1), 0);
    ended.other = x;
    CHECK_INT(idem_call_commit_async(y, end_in_callback, &ended), 0);
    T_WAIT_UNTIL(atomic_load(&ended.told), "the commit's callback to end both calls");
    CHECK_INT(ended.rc, 0);
    expect_released(eng, "cb-x");
    fp_of("{\"phased\":1}", fp);
    expect_replay(eng, &phased_op, "cb-y", fp, 201, "y");
    /* Nothing of the store is stuck: a write of a thread of our own still commits. */
    x = phased_created(eng, "cb-after");
    CHECK_INT(idem_call_complete(x, 200, NULL, 0, "after", 5), 0);
    idem_call_end(x);
    watchdog_disarm(&old);
}

/*
 * A phase whose COMMIT would fail (a foreign key checked only then), with claims queued behind
 * it meanwhile (on SQLite they join its batch), and a callback that ends it: the phase fails
 * alone, as it would in a transaction of its own, its record is released, and the claims are
 * durable -- one member's failure is not its batch's.
 */
#define FK_NEIGHBOURS 4

static void test_commit_fails_alone(struct idem_engine *eng, struct idem_store *st)
{
    struct sigaction old;
    struct ending failed = {0};
    struct async_step nb[FK_NEIGHBOURS];
    struct idem_call *z;
    unsigned char fp[IDEM_FP_LEN];
    const char *child[] = {"orphan", "no-such-parent"};
    char key[32];
    int rc;

    watchdog_arm(&old, 60);
    CHECK_INT(idem_store_migrate(st, "contract-fk", fk_schema, 1, NULL, NULL), 0);
    z = phased_created(eng, "cb-z");
    CHECK_INT(idem_call_phase_begin(z), 0);
    CHECK_INT(idem_tx_exec(idem_call_tx(z), "INSERT INTO fk_child (id, parent) VALUES ($1, $2)", 2,
                           child, NULL),
              0);
    CHECK_INT(idem_call_stage(z, 201, NULL, 0, "z", 1), 0);
    fp_of("{\"async\":1}", fp);
    for (int i = 0; i < FK_NEIGHBOURS; i++) {
        memset(&nb[i], 0, sizeof nb[i]);
        snprintf(key, sizeof key, "cb-nb-%d", i);
        CHECK_INT(idem_call_begin_async(eng, &point_op, "alice", key, fp, async_begun, &nb[i]), 1);
    }
    rc = idem_call_commit_async(z, end_in_callback, &failed);
    if (rc == 0) {
        T_WAIT_UNTIL(atomic_load(&failed.told), "the failed commit's callback to end its call");
        rc = failed.rc;
    } else {
        idem_call_end(z); /* (refused at once: the call is ours to end) */
    }
    CHECK(rc < 0);
    for (int i = 0; i < FK_NEIGHBOURS; i++) {
        CHECK(async_wait(&nb[i]));
        CHECK_INT(nb[i].rc, 0);
        CHECK_INT(nb[i].outcome, IDEM_OUTCOME_EXECUTE);
        if (nb[i].rc == 0)
            CHECK_INT(idem_call_complete(nb[i].call, 200, NULL, 0, "nb", 2), 0);
        idem_call_end(nb[i].call);
    }
    for (int i = 0; i < FK_NEIGHBOURS; i++) {
        snprintf(key, sizeof key, "cb-nb-%d", i);
        expect_replay(eng, &point_op, key, fp, 200, "nb");
    }
    CHECK_INT(fk_rows(st), 0);
    expect_released(eng, "cb-z");
    watchdog_disarm(&old);
}

static void *migrate_one(void *arg)
{
    int *rc = arg;
    struct idem_store *st = open_store(2);
    static const struct idem_migration steps[] = {
        {1, "a", "CREATE TABLE mig_a (x TEXT)", "CREATE TABLE mig_a (x TEXT)"},
        {2, "b", "CREATE TABLE mig_b (x TEXT)", "CREATE TABLE mig_b (x TEXT)"},
    };
    int applied = 0;
    *rc = idem_store_migrate(st, "contract-race", steps, 2, &applied, NULL);
    if (*rc == 0)
        *rc = applied; /* how many this handle applied */
    idem_store_close(st);
    return NULL;
}

static void test_migrate_race(void)
{
    enum { N = 4 };
    pthread_t th[N];
    int rc[N];
    int total = 0;
    for (int i = 0; i < N; i++)
        pthread_create(&th[i], NULL, migrate_one, &rc[i]);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECK(rc[i] >= 0);
        total += rc[i] > 0 ? rc[i] : 0;
    }
    CHECK_INT(total, 2); /* each step ran exactly once among them */
}

/*
 * idem_store_records_unfinished: the page idem_records_unfinished() lists, in its order and with
 * its cursor, each record as idem_record_inspect() reads it -- a live lease (in flight), a lease
 * released by an abort and one run out (outcome unknown) -- and no completed record.
 */
static int same_info(const struct idem_record_info *a, const struct idem_record_info *b)
{
    return a->found == b->found && a->completed == b->completed &&
           strcmp(a->recovery_point, b->recovery_point) == 0 &&
           strcmp(a->fingerprint_hex, b->fingerprint_hex) == 0 && a->created_ms == b->created_ms &&
           a->expires_ms == b->expires_ms && a->lease_expires_ms == b->lease_expires_ms &&
           a->lease_live == b->lease_live && a->response_status == b->response_status &&
           a->response_body_len == b->response_body_len;
}

static void test_unfinished_listing(struct idem_engine *eng, struct idem_store *st)
{
    static const struct idem_operation op = {
        .name = "contract.list", .lease_ms = 60000, .wait_ms = 2000};
    static const struct idem_operation short_op = {
        .name = "contract.list", .lease_ms = 20, .wait_ms = 2000};
    static const struct idem_operation other = {
        .name = "contract.list2", .lease_ms = 60000, .wait_ms = 2000};
    static const char *const keys[] = {"l-expired", "l-held", "l-live"};
    struct idem_record_listed page[8];
    struct idem_record_id ids[8];
    struct idem_call *live = NULL, *expired = NULL, *pending = NULL, *c = NULL;
    enum idem_outcome oc;
    unsigned char fp[IDEM_FP_LEN];
    int n;

    fp_of("{\"list\":1}", fp);
    /* In flight: phase 1 committed, its owner still holds the lease. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "l-live", fp, &live, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_advance(live, "created", "x"), 0);
    /* Held: phase 2 gave up, the lease is released (0). */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "l-held", fp, &c, &oc), 0);
    CHECK_INT(idem_call_advance(c, "sent", NULL), 0);
    CHECK_INT(idem_call_phase_begin(c), 0);
    idem_call_end(c);
    /* Held: its owner died, its lease ran out. */
    CHECK_INT(idem_call_begin(eng, &short_op, "alice", "l-expired", fp, &expired, &oc), 0);
    CHECK_INT(idem_call_advance(expired, "sent", NULL), 0);
    T_WAIT_UNTIL(lease_over(eng, "alice", short_op.name, "l-expired"), "a 20 ms lease to run out");
    /* Completed, and of another operation: not on the page of contract.list. */
    CHECK_INT(idem_call_begin(eng, &op, "alice", "l-done", fp, &c, &oc), 0);
    CHECK_INT(idem_call_complete(c, 201, NULL, 0, "ok", 2), 0);
    idem_call_end(c);
    CHECK_INT(idem_call_begin(eng, &other, "alice", "l-other", fp, &pending, &oc), 0);
    CHECK_INT(idem_call_advance(pending, "sent", NULL), 0);

    n = idem_store_records_unfinished(st, op.name, NULL, page, 8);
    CHECK_INT(n, 3);
    CHECK_INT(idem_records_unfinished(eng, op.name, NULL, ids, 8), 3);
    for (int i = 0; i < n && i < 3; i++) {
        struct idem_record_info info;
        CHECK_STR(page[i].id.operation, op.name);
        CHECK_STR(page[i].id.principal, "alice");
        CHECK_STR(page[i].id.key, keys[i]);
        CHECK(strcmp(page[i].id.operation, ids[i].operation) == 0 &&
              strcmp(page[i].id.principal, ids[i].principal) == 0 &&
              strcmp(page[i].id.key, ids[i].key) == 0);
        CHECK_INT(idem_record_inspect(eng, "alice", op.name, keys[i], &info), 0);
        CHECK(same_info(&page[i].info, &info));
        CHECK_INT(page[i].info.lease_live, i == 2);
    }
    CHECK_STR(page[1].info.recovery_point, "sent");
    CHECK_INT(page[1].info.lease_expires_ms, 0);
    CHECK(page[0].info.lease_expires_ms > 0 && page[2].info.lease_expires_ms > 0);

    /* A page at a time, after the last one's id. */
    CHECK_INT(idem_store_records_unfinished(st, op.name, NULL, page, 1), 1);
    CHECK_STR(page[0].id.key, "l-expired");
    ids[0] = page[0].id;
    CHECK_INT(idem_store_records_unfinished(st, op.name, &ids[0], page, 2), 2);
    CHECK_STR(page[0].id.key, "l-held");
    CHECK_STR(page[1].id.key, "l-live");
    ids[0] = page[1].id;
    CHECK_INT(idem_store_records_unfinished(st, op.name, &ids[0], page, 2), 0);
    /* Every operation: contract.list2's record comes right after contract.list's last. */
    CHECK_INT(idem_store_records_unfinished(st, NULL, &ids[0], page, 1), 1);
    CHECK_STR(page[0].id.operation, other.name);
    CHECK_STR(page[0].id.key, "l-other");
    CHECK_INT(idem_store_records_unfinished(st, op.name, NULL, page, 0), IDEM_EINVAL);
    CHECK_INT(idem_store_records_unfinished(st, op.name, NULL, page, 1001), IDEM_EINVAL);
    CHECK_INT(idem_store_records_unfinished(NULL, op.name, NULL, page, 1), IDEM_EINVAL);

    CHECK_INT(idem_call_complete(live, 201, NULL, 0, "ok", 2), 0);
    idem_call_end(live);
    CHECK_INT(idem_call_complete(pending, 201, NULL, 0, "ok", 2), 0);
    idem_call_end(pending);
    idem_call_end(expired);
}

int main(int argc, char **argv)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = NULL;
    char dir[] = "/tmp/idem-contract-XXXXXX";

    if (argc != 2) {
        fprintf(stderr, "usage: store_contract sqlite|postgresql\n");
        return 2;
    }
    store_kind = argv[1];
    if (strcmp(store_kind, "sqlite") == 0) {
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            return 1;
        }
        snprintf(store_uri, sizeof(store_uri), "sqlite:%s/contract.db", dir);
    } else if (strcmp(store_kind, "postgresql") == 0) {
        const char *uri = getenv("IDEM_TEST_PG_URI");
        if (!uri) {
            fprintf(stderr, "IDEM_TEST_PG_URI is not set\n");
            return 1;
        }
        snprintf(store_uri, sizeof(store_uri), "%s", uri);
    } else {
        fprintf(stderr, "unknown store kind %s\n", store_kind);
        return 2;
    }

    st = open_store(8);
    if (idem_store_migrate(st, "contract", biz_schema, 1, NULL, NULL) < 0 ||
        idem_engine_new(st, NULL, &eng) < 0) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    test_race(eng, st);
    test_replay_mismatch_scope(eng);
    test_unseen_key(eng, st);
    test_rollback(eng, st);
    test_takeover(eng, st);
    test_release_on_abort(eng, st);
    test_release_leases(st);
    test_forget(eng);
    test_recover(eng);
    test_wake(eng);
    test_retention(eng);
    test_stage(eng, st);
    test_savepoints(st);
    test_sql_and_migrations(st);
    test_concurrent_writers(st);
    test_commit_async(eng, st);
    test_claim_point(eng, st);
    test_one_phase(eng, st);
    test_begin_async(eng, st);
    test_complete_async_fenced_alone(eng, st);
    test_claims_async_each_alone(eng, st);
    test_run_async(eng, st);
    test_callbacks_may_block(eng);
    test_commit_fails_alone(eng, st);
    test_unfinished_listing(eng, st);
    test_migrate_race();

    idem_engine_free(eng);
    idem_store_close(st);
    if (strcmp(store_kind, "sqlite") == 0) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
    }
    return t_done();
}
