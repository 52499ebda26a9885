/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_tx_batch.c - lib/tx_batch.c on a backend of its own: the batcher is handed everything it
 * runs on (tx_batch.h), so these tests give it an in-memory "database" whose transactions keep
 * their writes pending until COMMIT, and connections from a small pool of their own.  Each test
 * holds both runner threads in a job of their own while it queues the jobs it means to batch, so
 * what goes together is decided, not raced.
 */
#include "tx_batch.h"
#include "t.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the backend: a database of marks, with writes pending until COMMIT -----------------------
 */

#define MARKS 64
#define CONNS 3
#define PENDING 64

struct idem_conn {
    int in_tx;
    int broken;
    int batch; /* batch_tx was called for this transaction */
    int pending[PENDING];
    int npending;
    char errmsg[128];
};

static pthread_mutex_t db_mu = PTHREAD_MUTEX_INITIALIZER;
static int db[MARKS];     /* how many times each mark committed */
static int commits;       /* COMMITs that succeeded */
static int told_ntx[16];  /* the source's `committed` calls, in order */
static int ncommitted;    /* how many of those */
static int acquire_fails; /* the pool refuses the next acquire(s) */
static struct idem_conn conns[CONNS];
static int lent[CONNS];

static int fake_begin(struct idem_conn *c, int write)
{
    (void)write;
    c->in_tx = 1;
    c->batch = 0;
    c->npending = 0;
    return 0;
}

static int fake_commit(struct idem_conn *c)
{
    if (c->broken) {
        snprintf(c->errmsg, sizeof(c->errmsg), "connection lost");
        return IDEM_EUNAVAIL;
    }
    pthread_mutex_lock(&db_mu);
    for (int i = 0; i < c->npending; i++)
        db[c->pending[i]]++;
    commits++;
    pthread_mutex_unlock(&db_mu);
    c->npending = 0;
    c->in_tx = 0;
    return 0;
}

static int fake_rollback(struct idem_conn *c)
{
    c->npending = 0;
    c->in_tx = 0;
    return c->broken ? IDEM_EUNAVAIL : 0;
}

static const char *fake_errmsg(const struct idem_conn *c)
{
    return c->errmsg;
}

static int fake_conn_ok(struct idem_conn *c)
{
    return !c->broken && !c->in_tx;
}

static void fake_batch_tx(struct idem_conn *c)
{
    c->batch = 1;
}

/* A whole transaction changes nothing here: only a batch's is marked. */
static void fake_whole_tx(struct idem_conn *c)
{
    (void)c;
}

static const struct idem_conn_methods fake_cm = {
    .version = IDEM__CONN_V_COMMIT_CHECKS,
    .begin = fake_begin,
    .commit = fake_commit,
    .rollback = fake_rollback,
    .errmsg = fake_errmsg,
    .conn_ok = fake_conn_ok,
    .whole_tx = fake_whole_tx,
    .batch_tx = fake_batch_tx,
};

static int pool_get(void *ctx, struct idem_conn **out, char *err, size_t errlen)
{
    (void)ctx;
    *out = NULL;
    pthread_mutex_lock(&db_mu);
    if (acquire_fails > 0) {
        acquire_fails--;
        pthread_mutex_unlock(&db_mu);
        snprintf(err, errlen, "no connection free");
        return IDEM_EUNAVAIL;
    }
    for (int i = 0; i < CONNS; i++) {
        if (!lent[i]) {
            lent[i] = 1;
            *out = &conns[i];
            break;
        }
    }
    pthread_mutex_unlock(&db_mu);
    if (!*out) {
        snprintf(err, errlen, "pool empty");
        return IDEM_EUNAVAIL;
    }
    return 0;
}

static void pool_put(void *ctx, struct idem_conn *c)
{
    (void)ctx;
    pthread_mutex_lock(&db_mu);
    c->broken = 0; /* a broken one is "closed" and opened anew */
    c->in_tx = 0;
    lent[c - conns] = 0;
    pthread_mutex_unlock(&db_mu);
}

static void pool_committed(void *ctx, struct idem_conn *c, uint64_t ntx, int64_t t0)
{
    (void)ctx;
    (void)c;
    (void)t0;
    pthread_mutex_lock(&db_mu);
    if (ncommitted < (int)(sizeof(told_ntx) / sizeof(told_ntx[0])))
        told_ntx[ncommitted] = (int)ntx;
    ncommitted++;
    pthread_mutex_unlock(&db_mu);
}

static const struct idem__batch_source fake_source = {
    .cm = &fake_cm,
    .get = pool_get,
    .put = pool_put,
    .committed = pool_committed,
};

static void reset(void)
{
    pthread_mutex_lock(&db_mu);
    memset(db, 0, sizeof(db));
    memset(told_ntx, 0, sizeof(told_ntx));
    memset(conns, 0, sizeof(conns));
    memset(lent, 0, sizeof(lent));
    commits = ncommitted = acquire_fails = 0;
    pthread_mutex_unlock(&db_mu);
}

/* ---- jobs -------------------------------------------------------------------------------------
 */

enum job_kind {
    JOB_WRITE,   /* writes its mark */
    JOB_FAIL,    /* writes its mark, then fails (a statement's error) */
    JOB_DISCARD, /* writes nothing and asks for a rollback */
    JOB_LOSE,    /* its connection is lost mid-statement */
    JOB_HOLD,    /* writes its mark once the test opens the gate: holds a runner meanwhile */
};

struct job {
    struct idem__job_slot slot;
    enum job_kind kind;
    int mark;
    int runs;     /* times its fn ran */
    int in_batch; /* its last run was in a batch's transaction */
    _Atomic int told;
    int rc;
    char errmsg[128];
};

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open;
static int holding; /* JOB_HOLD jobs waiting at the gate */

static int job_fn(struct idem_conn *c, void *arg)
{
    struct job *j = arg;

    j->runs++;
    j->in_batch = c->batch;
    switch (j->kind) {
    case JOB_HOLD:
        pthread_mutex_lock(&gate_mu);
        holding++;
        pthread_cond_broadcast(&gate_cv);
        while (!gate_open)
            pthread_cond_wait(&gate_cv, &gate_mu);
        holding--;
        pthread_mutex_unlock(&gate_mu);
        c->pending[c->npending++] = j->mark;
        return 0;
    case JOB_WRITE:
        c->pending[c->npending++] = j->mark;
        return 0;
    case JOB_FAIL:
        c->pending[c->npending++] = j->mark;
        snprintf(c->errmsg, sizeof(c->errmsg), "job %d failed", j->mark);
        return IDEM_ESTORE;
    case JOB_DISCARD:
        return IDEM__TX_DISCARD;
    case JOB_LOSE:
        c->broken = 1;
        snprintf(c->errmsg, sizeof(c->errmsg), "server closed the connection");
        return IDEM_EUNAVAIL;
    }
    return IDEM_EINVAL;
}

static void job_done(void *arg, int rc, const char *errmsg)
{
    struct job *j = arg;

    j->rc = rc;
    snprintf(j->errmsg, sizeof(j->errmsg), "%s", errmsg ? errmsg : "");
    atomic_store(&j->told, 1);
}

static void give(struct idem__batcher *b, struct job *j, enum job_kind kind, int mark)
{
    char err[IDEM_ERRMSG_MAX] = "";

    memset(j, 0, sizeof(*j));
    j->kind = kind;
    j->mark = mark;
    CHECK_INT(idem__batch_run_async(b, &j->slot, job_fn, j, 0, job_done, j, err, sizeof(err)), 0);
}

static int all_told(struct job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        if (!atomic_load(&jobs[i].told))
            return 0;
    return 1;
}

static int holders(void)
{
    int n;
    pthread_mutex_lock(&gate_mu);
    n = holding;
    pthread_mutex_unlock(&gate_mu);
    return n;
}

/*
 * Holds both runners in a JOB_HOLD each (hold[0], hold[1]); what is given next queues behind
 * them, and release() lets the first runner free take it all as one batch.
 */
static void hold_runners(struct idem__batcher *b, struct job hold[2])
{
    pthread_mutex_lock(&gate_mu);
    gate_open = 0;
    pthread_mutex_unlock(&gate_mu);
    give(b, &hold[0], JOB_HOLD, 60);
    T_WAIT_UNTIL(holders() == 1, "the first runner in its job");
    give(b, &hold[1], JOB_HOLD, 61);
    T_WAIT_UNTIL(holders() == 2, "the second runner in its job");
}

static void release(void)
{
    pthread_mutex_lock(&gate_mu);
    gate_open = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static struct idem__batcher *batcher(void)
{
    struct idem__batcher *b = NULL;

    reset();
    CHECK_INT(idem__batcher_open(&fake_source, &b), 0);
    if (!b)
        exit(1);
    return b;
}

/* ---- the rules --------------------------------------------------------------------------------
 */

static void test_jobs_queued_meanwhile_share_one_commit(void)
{
    struct idem__batcher *b = batcher();
    struct job hold[2], jobs[5];

    hold_runners(b, hold);
    for (int i = 0; i < 5; i++)
        give(b, &jobs[i], JOB_WRITE, i);
    release();
    T_WAIT_UNTIL(all_told(jobs, 5) && all_told(hold, 2), "every job told");
    for (int i = 0; i < 5; i++) {
        CHECK_INT(jobs[i].rc, 0);
        CHECK_INT(jobs[i].runs, 1);
        CHECK_INT(jobs[i].in_batch, 1); /* the backend was told the transaction is a batch's */
        CHECK_INT(db[i], 1);
    }
    CHECK_INT(hold[0].in_batch, 0); /* a lone job runs in a transaction of its own */
    idem__batcher_close(b);
    /* Two lone holders, and the five in one COMMIT that counts them all. */
    CHECK_INT(commits, 3);
    CHECK_INT(ncommitted, 3);
    CHECK(told_ntx[0] + told_ntx[1] + told_ntx[2] == 7 &&
          (told_ntx[0] == 5 || told_ntx[1] == 5 || told_ntx[2] == 5));
}

static void test_a_batchs_failed_member_fails_alone(void)
{
    struct idem__batcher *b = batcher();
    struct job hold[2], jobs[3];

    hold_runners(b, hold);
    give(b, &jobs[0], JOB_WRITE, 0);
    give(b, &jobs[1], JOB_FAIL, 1);
    give(b, &jobs[2], JOB_WRITE, 2);
    release();
    T_WAIT_UNTIL(all_told(jobs, 3), "every job told");
    /* The batch rolled back, and each job ran again alone: only the failing one fails. */
    CHECK_INT(jobs[0].rc, 0);
    CHECK_INT(jobs[1].rc, IDEM_ESTORE);
    CHECK_STR(jobs[1].errmsg, "job 1 failed");
    CHECK_INT(jobs[2].rc, 0);
    CHECK_INT(jobs[0].runs, 2);
    CHECK_INT(jobs[0].in_batch, 0);
    /* What the batch wrote before its rollback is gone: each neighbour's write counts once. */
    CHECK_INT(db[0], 1);
    CHECK_INT(db[1], 0);
    CHECK_INT(db[2], 1);
    idem__batcher_close(b);
}

static void test_a_discarded_job_leaves_its_neighbours_committed(void)
{
    struct idem__batcher *b = batcher();
    struct job hold[2], jobs[3];

    hold_runners(b, hold);
    give(b, &jobs[0], JOB_WRITE, 0);
    give(b, &jobs[1], JOB_DISCARD, 1);
    give(b, &jobs[2], JOB_WRITE, 2);
    release();
    T_WAIT_UNTIL(all_told(jobs, 3), "every job told");
    CHECK_INT(jobs[0].rc, 0);
    CHECK_INT(jobs[1].rc, IDEM__TX_DISCARD);
    CHECK_INT(jobs[2].rc, 0);
    for (int i = 0; i < 3; i++)
        CHECK_INT(jobs[i].runs, 1); /* one batch, no rerun */
    CHECK_INT(db[0], 1);
    CHECK_INT(db[2], 1);
    idem__batcher_close(b);
    /* The batch's COMMIT counts the two it kept (beside the holders' one each). */
    CHECK_INT(ncommitted, 3);
    CHECK_INT(told_ntx[0] + told_ntx[1] + told_ntx[2], 4);
}

static void test_a_lost_connection_fails_the_batch_unavailable(void)
{
    struct idem__batcher *b = batcher();
    struct job hold[2], jobs[3];

    hold_runners(b, hold);
    give(b, &jobs[0], JOB_WRITE, 0);
    give(b, &jobs[1], JOB_LOSE, 1);
    give(b, &jobs[2], JOB_WRITE, 2);
    release();
    T_WAIT_UNTIL(all_told(jobs, 3), "every job told");
    /* Nothing reran: what a lost connection did is unknown, as for a transaction alone. */
    for (int i = 0; i < 3; i++)
        CHECK_INT(jobs[i].rc, IDEM_EUNAVAIL);
    CHECK_INT(jobs[0].runs, 1);
    CHECK_INT(jobs[2].runs, 0);
    CHECK_STR(jobs[0].errmsg, "server closed the connection");
    CHECK_INT(db[0], 0);
    idem__batcher_close(b);
}

static void test_no_connection_fails_each_job_with_the_sources_reason(void)
{
    struct idem__batcher *b = batcher();
    struct job hold[2], jobs[2];

    hold_runners(b, hold);
    give(b, &jobs[0], JOB_WRITE, 0);
    give(b, &jobs[1], JOB_WRITE, 1);
    pthread_mutex_lock(&db_mu);
    acquire_fails = 1;
    pthread_mutex_unlock(&db_mu);
    release();
    T_WAIT_UNTIL(all_told(jobs, 2), "every job told");
    CHECK_INT(jobs[0].rc, IDEM_EUNAVAIL);
    CHECK_STR(jobs[0].errmsg, "no connection free");
    CHECK_INT(jobs[1].rc, IDEM_EUNAVAIL);
    CHECK_INT(jobs[0].runs, 0);
    idem__batcher_close(b);
}

static void test_the_batcher_stops_once_every_queued_job_is_told(void)
{
    enum { N = 100 };
    struct idem__batcher *b = batcher();
    struct job *jobs = calloc(N, sizeof(*jobs));

    if (!jobs)
        exit(1);
    for (int i = 0; i < N; i++)
        give(b, &jobs[i], JOB_WRITE, i % MARKS);
    idem__batcher_close(b); /* at once: the queue is drained first */
    CHECK(all_told(jobs, N));
    for (int i = 0; i < N; i++)
        CHECK_INT(jobs[i].rc, 0);
    for (int i = 0; i < CONNS; i++)
        CHECK_INT(lent[i], 0); /* every connection given back */
    free(jobs);
}

static void test_a_batcher_never_used_starts_no_thread_and_closes(void)
{
    struct idem__batcher *b = batcher();

    idem__batcher_close(b);
    idem__batcher_close(NULL);
    CHECK_INT(commits, 0);
}

int main(void)
{
    test_jobs_queued_meanwhile_share_one_commit();
    test_a_batchs_failed_member_fails_alone();
    test_a_discarded_job_leaves_its_neighbours_committed();
    test_a_lost_connection_fails_the_batch_unavailable();
    test_no_connection_fails_each_job_with_the_sources_reason();
    test_the_batcher_stops_once_every_queued_job_is_told();
    test_a_batcher_never_used_starts_no_thread_and_closes();
    return t_done();
}
