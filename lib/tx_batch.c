/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tx_batch.c - whole transactions of callers that do not wait, several to one database
 * transaction, on a thread of the store's: write_run_async for a store without a group commit
 * of its own (PostgreSQL).
 *
 * An event loop must not wait for a round trip or a commit, and a worker thread parked on each
 * request's round trips costs two thread switches per round trip.  idem_call_begin_async(),
 * idem_call_complete_async() and idem_call_run_async() give the store a job (idem__tx_fn) and a
 * notice instead.  Each of this file's runner threads (two) takes every job queued while it was
 * busy as one batch, runs the jobs back to back in one transaction on one connection, commits
 * once, gives the connection back and then tells each job's notice: one COMMIT -- one WAL flush
 * on the server -- per batch instead of one per request, and no thread of the caller's waiting.
 * A notice's callback runs on the runner while it holds nothing of the store's, so it may use
 * libidem as any thread may (a blocking call only delays that runner's next batch).  Measured on
 * orderd's create (docs/postgres.md, "Batches"): about half the server's CPU per order and half
 * orderd's.  Before its jobs run, a batch tells its connection the claims among them
 * (IDEM__TX_CLAIM: idem-gateway's fresh keys; collect_claims), and the backend claims them all
 * in one statement when the first of them runs: a round trip for the batch's claims, not one each.
 *
 * Why no answer can come from a write a crash could take back:
 * - A job's notice is told only once the batch's COMMIT was acknowledged.  The server
 *   acknowledges a COMMIT only after its WAL is flushed (every session of the store runs with
 *   synchronous_commit on: pg_conn.c, idem__pg_session_setup) and makes a transaction visible
 *   to other sessions only then, so nobody, here or in another process, reads a job's writes
 *   before they are durable; and the caller answers only from the notice.
 * - A job that fails (a negative code: a statement's error, a fence or a key another process
 *   holds found by a later statement or the COMMIT) rolls the whole batch back.  Each job of the
 *   batch then runs again alone, in a transaction of its own, and is told its own outcome.  Jobs
 *   allow that: each is one statement (claims, completions) or rerunnable (IDEM__TX_RERUNNABLE),
 *   and both ask for a rollback (IDEM__TX_DISCARD) only when they wrote nothing, so a discarded
 *   job leaves its neighbours' writes alone.
 * - A COMMIT whose answer was lost (the connection died) may or may not have committed: every job
 *   of the batch is told so (IDEM_EUNAVAIL) and none runs again, as a transaction of its own would
 *   be told.  A connection lost before the COMMIT fails the batch the same way, and the jobs that
 *   queued meanwhile too: a server gone silent holds a connection for its timeout (10-15 s), and
 *   a request must not wait out one such timeout per batch ahead of it.
 * - Two batches whose jobs lock the same rows in opposite orders would wait for each other until
 *   PostgreSQL's deadlock_timeout (1 s).  A backend bounds a batch's lock waits far below that
 *   (batch_tx: store_pg.c, 100 ms): the batch that gives up rolls back and its jobs run alone,
 *   as above, so a cycle costs 100 ms and not a second.  Nothing else changes with two: each
 *   batch is a transaction like any other, and the server orders them.
 *
 * Layer: the PostgreSQL store's own (store_pg.h lists its layers).  store_pg.c makes the batcher
 * when the store opens and stops it when the store closes, and hands it all it runs on: the
 * backend's functions, a source of connections (the store's pool) and whom to tell of a commit.
 * So this file calls no other file of libidem's but through what it was handed, and a unit test
 * runs it on a backend of its own (tests/unit/test_tx_batch.c).
 */
#include "tx_batch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/*
 * Jobs of one batch at most: a batch holds its rows' locks until its one COMMIT, and each
 * application statement of a job is a subtransaction (store_pg.c runs it under a savepoint);
 * past 64 of them a backend overflows its subtransaction cache, which slows every snapshot of
 * the cluster while the transaction lasts.
 */
#define BATCH_MAX 32

/*
 * Runner threads, each with a batch of its own: while one waits for its round trips or its
 * COMMIT, the other's statements run, so the server's CPUs are not left to one backend.
 */
#define RUNNERS 2

struct batch_job {
    struct batch_job *next;
    idem__tx_fn fn;
    void *arg;
    idem__commit_done done;
    void *done_arg;
    unsigned flags;               /* IDEM__TX_CLAIM: its claim is collected ahead */
    int rc;                       /* fn's word in the batch: 0 or IDEM__TX_DISCARD; then its end */
    char errmsg[IDEM_ERRMSG_MAX]; /* why it failed, kept until it is told */
};
/* (in its caller's slot: nothing is allocated per job, and the job is gone once told) */
_Static_assert(sizeof(struct batch_job) <= sizeof(struct idem__job_slot),
               "struct idem__job_slot is too small for a batch's job");

struct idem__batcher {
    struct idem__batch_source src; /* where its jobs run (borrowed pieces) */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the runner waits here for jobs */
    struct batch_job *head, **tail;
    int started; /* runner threads */
    int stop;
    pthread_t thread[RUNNERS];
};

/*
 * Notes how job `j` ended and moves it to `*told`, the jobs whose callbacks run_batch() calls once
 * it gave its connection back: a callback may use libidem like any thread, e.g. end its call with a
 * write of its own, and must not wait for a connection of the pool that this runner still holds.
 */
static void tell(struct batch_job ***told, struct batch_job *j, int rc, const char *errmsg)
{
    j->rc = rc;
    idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", errmsg ? errmsg : "");
    j->next = NULL;
    **told = j;
    *told = &j->next;
}

static void tell_all(struct batch_job ***told, struct batch_job *jobs, int rc, const char *errmsg)
{
    while (jobs) {
        struct batch_job *next = jobs->next;
        tell(told, jobs, rc, errmsg);
        jobs = next;
    }
}

/* Runs the callbacks of the jobs told (`j` and its list); each job may be gone after its own. */
static void told_run(struct batch_job *j)
{
    while (j) {
        struct batch_job *next = j->next;
        j->done(j->done_arg, j->rc, j->rc < 0 ? j->errmsg : NULL);
        j = next;
    }
}

/*
 * Runs job `j` in a transaction of its own on `c` and tells it how it ended.  Returns whether
 * the connection was lost.
 */
static int run_alone(const struct idem__batch_source *src, struct idem_conn *c, struct batch_job *j,
                     struct batch_job ***told)
{
    const struct idem_conn_methods *cm = src->cm;
    char err[IDEM_ERRMSG_MAX] = "";
    int64_t t0;
    int rc = cm->begin(c, 1);

    if (rc < 0) {
        idem__fmt(err, sizeof(err), "cannot begin a write transaction: %s", cm->errmsg(c));
        tell(told, j, rc, err);
        return !cm->conn_ok(c);
    }
    if (cm->version >= IDEM__CONN_V_COMMIT_CHECKS)
        cm->whole_tx(c);
    rc = j->fn(c, j->arg);
    if (rc == 0) {
        t0 = clock_mono_ns();
        rc = cm->commit(c);
        if (rc == 0)
            src->committed(src->ctx, c, 1, t0);
    }
    if (rc < 0)
        idem__fmt(err, sizeof(err), "%s", cm->errmsg(c));
    if (rc != 0)
        cm->rollback(c);
    tell(told, j, rc, rc < 0 ? err : NULL);
    return !cm->conn_ok(c);
}

/*
 * The claims of a batch's claim jobs, told to `c` before any job runs, when there are two or
 * more: the backend claims them all in one statement when the first of them runs (struct
 * idem_conn_methods, claims_collect).  What each job's run says here is not its answer.
 */
static void collect_claims(const struct idem_conn_methods *cm, struct idem_conn *c,
                           struct batch_job *jobs)
{
    int n = 0;

    for (struct batch_job *j = jobs; j && n < 2; j = j->next)
        n += (j->flags & IDEM__TX_CLAIM) != 0;
    if (n < 2)
        return;
    cm->claims_collect(c, 1);
    for (struct batch_job *j = jobs; j; j = j->next)
        if (j->flags & IDEM__TX_CLAIM)
            (void)j->fn(c, j->arg);
    cm->claims_collect(c, 0);
}

/*
 * Runs `jobs` (two or more) in one transaction on `c`.  Returns 1 once it told each job that the
 * batch committed, 2 once it told each that the connection was lost (`err` says why), or 0 when
 * the batch rolled back with nothing of it committed and the connection still good: run each
 * alone.
 */
static int run_together(const struct idem__batch_source *src, struct idem_conn *c,
                        struct batch_job *jobs, struct batch_job ***told, char *err, size_t errlen)
{
    const struct idem_conn_methods *cm = src->cm;
    uint64_t kept = 0;
    int64_t t0;
    int rc = cm->begin(c, 1);

    if (rc == 0) {
        /* Only each job's COMMIT follows its statements, or the statements of the jobs after
         * it: a fence that fails there fails the batch, whose jobs then run alone. */
        if (cm->version >= IDEM__CONN_V_COMMIT_CHECKS) {
            cm->whole_tx(c);
            cm->batch_tx(c);
        }
        if (cm->version >= IDEM__CONN_V_CLAIMS_AHEAD)
            collect_claims(cm, c, jobs);
        for (struct batch_job *j = jobs; j && rc == 0; j = j->next) {
            j->rc = j->fn(c, j->arg);
            if (j->rc < 0)
                rc = j->rc;
            kept += j->rc == 0;
        }
    }
    if (rc == 0) {
        t0 = clock_mono_ns();
        rc = cm->commit(c);
        if (rc == 0) {
            src->committed(src->ctx, c, kept, t0);
            while (jobs) {
                struct batch_job *next = jobs->next;
                tell(told, jobs, jobs->rc, NULL);
                jobs = next;
            }
            return 1;
        }
    }
    idem__fmt(err, errlen, "%s", cm->errmsg(c));
    cm->rollback(c);
    if (cm->conn_ok(c))
        return 0;
    /* Lost: nothing of the batch committed, or -- the COMMIT's answer lost -- maybe all of it. */
    tell_all(told, jobs, rc == IDEM_ENOMEM ? rc : IDEM_EUNAVAIL, err);
    return 2;
}

/*
 * Runs one batch and tells each of its jobs, once its connection is back in the pool.  Returns
 * whether the store's connection was lost (`err` says why): the jobs queued meanwhile waited as
 * long as a request of their own would have.
 */
static int run_batch(const struct idem__batch_source *src, struct batch_job *jobs, char *err,
                     size_t errlen)
{
    struct batch_job *told = NULL, **told_tail = &told;
    struct idem_conn *c = NULL;
    int lost = 0, ended = 0;
    int rc = src->get(src->ctx, &c, err, errlen);

    if (rc < 0) {
        tell_all(&told_tail, jobs, rc, err);
        told_run(told);
        return rc == IDEM_EUNAVAIL;
    }
    if (jobs->next && (ended = run_together(src, c, jobs, &told_tail, err, errlen)) != 0) {
        lost = ended == 2;
        jobs = NULL;
    }
    while (jobs && !lost) {
        struct batch_job *next = jobs->next;
        jobs->next = NULL;
        lost = run_alone(src, c, jobs, &told_tail);
        jobs = next;
        if (lost)
            idem__fmt(err, errlen, "%s", src->cm->errmsg(c));
    }
    tell_all(&told_tail, jobs, IDEM_EUNAVAIL, err);
    src->put(src->ctx, c);
    told_run(told);
    return lost;
}

/* The runner: takes what was queued as one batch, runs it, and again; at close, drains. */
static void *runner_main(void *arg)
{
    struct idem__batcher *b = arg;

    pthread_mutex_lock(&b->mu);
    for (;;) {
        char err[IDEM_ERRMSG_MAX] = "";
        struct batch_job *jobs, **cut, *told, **told_tail;
        int n = 0, lost;

        while (!b->head && !b->stop)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->head)
            break;
        jobs = b->head;
        for (cut = &b->head; *cut && n < BATCH_MAX; cut = &(*cut)->next)
            n++;
        b->head = *cut;
        *cut = NULL;
        if (!b->head)
            b->tail = &b->head;
        pthread_mutex_unlock(&b->mu);
        lost = run_batch(&b->src, jobs, err, sizeof(err));
        pthread_mutex_lock(&b->mu);
        if (lost) {
            /* What queued meanwhile waited as long as a lone transaction's failure takes. */
            jobs = b->head;
            b->head = NULL;
            b->tail = &b->head;
            pthread_mutex_unlock(&b->mu);
            told = NULL;
            told_tail = &told;
            tell_all(&told_tail, jobs, IDEM_EUNAVAIL, err);
            told_run(told);
            pthread_mutex_lock(&b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int idem__batcher_open(const struct idem__batch_source *src, struct idem__batcher **out)
{
    struct idem__batcher *b = calloc(1, sizeof(*b));

    *out = NULL;
    if (!b)
        return IDEM_ENOMEM;
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        free(b);
        return IDEM_ENOMEM;
    }
    if (pthread_cond_init(&b->cv, NULL) != 0) {
        pthread_mutex_destroy(&b->mu);
        free(b);
        return IDEM_ENOMEM;
    }
    b->src = *src;
    b->tail = &b->head;
    *out = b;
    return 0;
}

int idem__batch_run_async(struct idem__batcher *b, struct idem__job_slot *slot, idem__tx_fn fn,
                          void *arg, unsigned flags, idem__commit_done done, void *done_arg,
                          char *err, size_t errlen)
{
    struct batch_job *j = (struct batch_job *)slot->mem;
    const char *why = idem_strerror(IDEM_ENOMEM);
    int rc = IDEM_ENOMEM;

    /* (Every job may run again alone, whatever its flags: see the top of this file.) */
    j->next = NULL;
    j->flags = flags;
    j->fn = fn;
    j->arg = arg;
    j->done = done;
    j->done_arg = done_arg;
    j->rc = 0;
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        rc = IDEM_EUNAVAIL;
        why = "the store is closing";
        goto unlock_fail;
    }
    while (b->started < RUNNERS &&
           pthread_create(&b->thread[b->started], NULL, runner_main, b) == 0)
        b->started++;
    if (b->started == 0) {
        why = "cannot start the store's runner thread";
        goto unlock_fail;
    }
    *b->tail = j;
    b->tail = &j->next;
    pthread_mutex_unlock(&b->mu);
    pthread_cond_signal(&b->cv);
    return 0;
unlock_fail:
    pthread_mutex_unlock(&b->mu);
    idem__fmt(err, errlen, "%s", why);
    return rc;
}

void idem__batcher_close(struct idem__batcher *b)
{
    int started;

    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    started = b->started;
    pthread_mutex_unlock(&b->mu);
    pthread_cond_broadcast(&b->cv);
    for (int i = 0; i < started; i++)
        pthread_join(b->thread[i], NULL); /* each leaves once the queue is empty */
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
