/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_store_sqlite.c - what the SQLite store must refuse at its own level, below the engine's
 * public API, where a race would otherwise need luck to show: a takeover is fenced on the
 * fingerprint the caller read, so a record swept and claimed afresh by another
 * request between that read and the takeover is never resumed as if it were the caller's; and a
 * savepoint rollback that fails breaks the writer, so the aborted transaction's writes are never
 * committed with the next member of the group commit.  And whole transactions
 * run by the writer's holder (idem__tx_run): one that fails or asks for a rollback leaves nothing,
 * its neighbours in the same batch keep theirs, from many threads at once (half of them one
 * statement each, without a savepoint of their own); and the same without
 * a thread waiting for them (write_run_async), told by the store's own thread.  A job whose
 * writes would fail the batch's COMMIT (a deferred foreign key) fails alone.  A store whose fsync
 * failed answers no read, inside a read transaction either; and the syncer's fsync reaches the
 * WAL that is named -wal now, after the last connection to the file closed.
 */
#define _GNU_SOURCE /* syscall() */
#include "internal.h"
#include "sqlite_conn.h"
#include "t.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * The disk, as far as these tests need it: this program defines fdatasync() (which libidem's
 * syncer calls; an executable's definition interposes on the C library's), so a test can make it
 * fail, and see which file it was asked to flush.
 */
static _Atomic int fdatasync_fails;      /* while set, every fdatasync fails with EIO */
static _Atomic unsigned long synced_ino; /* the inode of the last file flushed */
static _Atomic unsigned long synced_dev; /* and its device */
static _Atomic int synced_unlinked;      /* flushes of a file no name points to any more */

int fdatasync(int fd)
{
    struct stat sb;

    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        atomic_store(&synced_ino, (unsigned long)sb.st_ino);
        atomic_store(&synced_dev, (unsigned long)sb.st_dev);
        if (sb.st_nlink == 0)
            atomic_fetch_add(&synced_unlinked, 1);
    }
    if (atomic_load(&fdatasync_fails)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fdatasync, fd);
}

static const struct idem_migration biz[] = {
    {1, "rows", "CREATE TABLE biz (id TEXT PRIMARY KEY)", "CREATE TABLE biz (id TEXT PRIMARY KEY)"},
};

/* Rows of biz whose id is `value` (`op` "=") or matches it (`op` "LIKE"), or -1. */
static int biz_count(struct idem_store *st, const char *op, const char *value)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *r = NULL;
    const char *p[] = {value};
    char sql[96];
    int n = -1;

    snprintf(sql, sizeof sql, "SELECT count(*) FROM biz WHERE id %s $1", op);
    if (idem_tx_begin(st, 0, &tx) < 0)
        return -1;
    if (idem_tx_exec(tx, sql, 1, p, &r) == 0)
        n = atoi(idem_rows_get(r, 0, 0));
    idem_rows_free(r);
    idem_tx_rollback(tx);
    return n;
}

static int biz_has(struct idem_store *st, const char *id)
{
    return biz_count(st, "=", id);
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

/* ---- whole transactions (idem__tx_run) ------------------------------------------------------ */

enum job_kind { JOB_KEEP, JOB_FAIL, JOB_DISCARD };

struct job_arg {
    struct idem_store *st;
    enum job_kind kind;
    char id[64];
    int one; /* run as IDEM__TX_ONE_STATEMENT: one statement, no savepoint of its own */
};

/*
 * Inserts its row; JOB_FAIL then inserts "seed" again (a conflict), JOB_DISCARD asks to undo.
 * As one statement: JOB_FAIL only inserts "seed" (which fails), JOB_DISCARD only inserts it OR
 * IGNOREs it (which changes nothing) -- the statement that one-statement jobs may run.
 */
static int job_fn(struct idem_conn *c, void *arg)
{
    struct job_arg *a = arg;
    const char *p[] = {a->id}, *seed[] = {"seed"};
    int rc;

    if (a->one && a->kind == JOB_FAIL)
        return a->st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, seed, NULL);
    if (a->one && a->kind == JOB_DISCARD) {
        rc = a->st->cm->exec(c, "INSERT OR IGNORE INTO biz (id) VALUES ($1)", 1, seed, NULL);
        return rc < 0 ? rc : IDEM__TX_DISCARD;
    }
    rc = a->st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, p, NULL);
    if (rc < 0)
        return rc;
    if (a->kind == JOB_FAIL)
        return a->st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, seed, NULL);
    return a->kind == JOB_DISCARD ? IDEM__TX_DISCARD : 0;
}

struct job_thread {
    struct idem_store *st;
    int id;
    int bad; /* a return other than the kind's */
};

enum { JOB_THREADS = 8, JOBS_EACH = 30 };

static void *job_thread_run(void *arg)
{
    struct job_thread *t = arg;

    for (int i = 0; i < JOBS_EACH; i++) {
        struct job_arg a = {t->st, (enum job_kind)(i % 3), "", (i / 3) % 2};
        char err[IDEM_ERRMSG_MAX] = "";
        int rc;

        snprintf(a.id, sizeof a.id, "job-%d-%d-%c", t->id, i, "kfd"[a.kind]);
        rc = idem__tx_run(t->st, job_fn, &a, a.one ? IDEM__TX_ONE_STATEMENT : 0, err, sizeof err);
        if ((a.kind == JOB_KEEP && rc != 0) || (a.kind == JOB_FAIL && rc >= 0) ||
            (a.kind == JOB_FAIL && strstr(err, "UNIQUE") == NULL) ||
            (a.kind == JOB_DISCARD && rc != IDEM__TX_DISCARD))
            t->bad++;
        /* Nobody is told before the batch is durable: a kept row is there for every reader. */
        if (a.kind == JOB_KEEP && biz_has(t->st, a.id) != 1)
            t->bad++;
    }
    return NULL;
}

/* The row "seed" that a failing job inserts again. */
static void seed_row(struct idem_store *st)
{
    struct idem_tx *tx = NULL;
    const char *seed[] = {"seed"};

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ($1)", 1, seed, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
}

/* JOB_THREADS threads of job_thread_run; job_threads_join() says how many returns were wrong. */
struct job_threads {
    pthread_t th[JOB_THREADS];
    struct job_thread t[JOB_THREADS];
};

static void job_threads_start(struct job_threads *jt, struct idem_store *st)
{
    for (int i = 0; i < JOB_THREADS; i++) {
        jt->t[i] = (struct job_thread){st, i, 0};
        pthread_create(&jt->th[i], NULL, job_thread_run, &jt->t[i]);
    }
}

static int job_threads_join(struct job_threads *jt)
{
    int bad = 0;

    for (int i = 0; i < JOB_THREADS; i++) {
        pthread_join(jt->th[i], NULL);
        bad += jt->t[i].bad;
    }
    return bad;
}

static void whole_transactions(struct idem_store *st)
{
    struct job_threads jt;
    struct idem_store_stats before, after;
    int bad;

    seed_row(st);
    idem_store_stats(st, &before);
    job_threads_start(&jt, st);
    bad = job_threads_join(&jt);
    idem_store_stats(st, &after);
    CHECK_INT(bad, 0);
    CHECK_INT(biz_count(st, "LIKE", "job-%-k"), JOB_THREADS * JOBS_EACH / 3);
    CHECK_INT(biz_count(st, "LIKE", "job-%-f"), 0); /* failed: its first row went with it */
    CHECK_INT(biz_count(st, "LIKE", "job-%-d"), 0); /* discarded */
    CHECK_INT((int)(after.write_commits - before.write_commits), JOB_THREADS * JOBS_EACH / 3);
    CHECK(after.durable_commits - before.durable_commits <
          after.write_commits - before.write_commits); /* jobs shared fsyncs */
    CHECK(after.durable_commit_ns > before.durable_commit_ns);
}

/*
 * A job that cannot get the writer within busy_timeout_ms (here: this very thread holds it) gives
 * up with IDEM_EUNAVAIL and leaves the queue, so the holder's release never runs it later.
 */
static void queued_job_times_out(const char *dir)
{
    struct idem_store_options o = {.busy_timeout_ms = 150};
    struct idem_store *st = NULL;
    struct idem_tx *holder = NULL;
    struct job_arg a;
    char uri[160], err[IDEM_ERRMSG_MAX] = "";

    snprintf(uri, sizeof uri, "sqlite:%s/timeout.db", dir);
    CHECK_INT(idem_store_open(uri, &o, &st, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    a = (struct job_arg){st, JOB_KEEP, "late", 0};
    CHECK_INT(idem_tx_begin(st, 1, &holder), 0);
    CHECK_INT(idem__tx_run(st, job_fn, &a, 0, err, sizeof err), IDEM_EUNAVAIL);
    CHECK(strstr(err, "not free within 150 ms") != NULL);
    CHECK_INT(idem_tx_commit(holder), 0);
    CHECK_INT(biz_has(st, "late"), 0);
    /* The writer is free again: the same job runs and is kept. */
    CHECK_INT(idem__tx_run(st, job_fn, &a, 0, err, sizeof err), 0);
    CHECK_INT(biz_has(st, "late"), 1);
    idem_store_close(st);
}

/* ---- whole transactions without a waiting thread (write_run_async) ------------------------ */

enum { ASYNC_JOBS = 90 };

struct async_job {
    struct job_arg a;
    struct idem__job_slot slot; /* the store's, until told */
    atomic_int told;            /* times its callback ran */
    int rc;
    int on_caller;   /* told on the thread that queued it */
    int row_visible; /* a kept row was readable when it was told */
    pthread_t caller;
};

static void async_job_done(void *arg, int rc, const char *errmsg)
{
    struct async_job *j = arg;

    (void)errmsg;
    j->rc = rc;
    j->on_caller = pthread_equal(pthread_self(), j->caller);
    if (rc == 0 && j->a.kind == JOB_KEEP)
        j->row_visible = biz_has(j->a.st, j->a.id) == 1;
    atomic_fetch_add(&j->told, 1);
}

static int async_queue(struct async_job *j, struct idem_store *st, enum job_kind kind,
                       const char *id)
{
    char err[IDEM_ERRMSG_MAX] = "";

    memset(j, 0, sizeof *j);
    j->a = (struct job_arg){st, kind, "", 0};
    snprintf(j->a.id, sizeof j->a.id, "%s", id);
    j->caller = pthread_self();
    return idem__tx_run_async(st, &j->slot, job_fn, &j->a, 0, async_job_done, j, err, sizeof err);
}

static int async_told(struct async_job *jobs, int n)
{
    int told = 0;
    for (int i = 0; i < n; i++)
        told += atomic_load(&jobs[i].told);
    return told;
}

/* Waits until each of the first `n` jobs was told (the store's thread tells them). */
static void async_wait_all(struct async_job *jobs, int n)
{
    T_WAIT_UNTIL(async_told(jobs, n) >= n, "the store's thread to tell every queued job");
}

/*
 * Queued from one thread while eight others run waiting jobs: each is told once, never on the
 * thread that queued it, with the outcome its kind asks for, and a kept row is readable when it
 * is told.  A job queued while another thread holds the writer runs only once it is released.
 * Closing the store runs what is still queued and tells it first.
 */
static void jobs_without_a_waiting_thread(const char *dir)
{
    static struct async_job jobs[ASYNC_JOBS];
    struct idem_store *st = NULL;
    struct idem_store_stats before, after;
    struct idem_tx *holder = NULL;
    struct job_threads jt;
    char uri[160], id[64];
    int bad;

    snprintf(uri, sizeof uri, "sqlite:%s/async.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    CHECK(idem__tx_runs_async(st));
    seed_row(st);

    idem_store_stats(st, &before);
    job_threads_start(&jt, st);
    for (int i = 0; i < ASYNC_JOBS; i++) {
        enum job_kind kind = (enum job_kind)(i % 3);
        snprintf(id, sizeof id, "async-%d-%c", i, "kfd"[kind]);
        CHECK_INT(async_queue(&jobs[i], st, kind, id), 0);
    }
    async_wait_all(jobs, ASYNC_JOBS);
    bad = job_threads_join(&jt);
    idem_store_stats(st, &after);
    CHECK_INT(bad, 0);
    for (int i = 0; i < ASYNC_JOBS; i++) {
        const struct async_job *j = &jobs[i];
        int want = j->a.kind == JOB_KEEP ? 0 : j->a.kind == JOB_DISCARD ? IDEM__TX_DISCARD : -1;
        if (atomic_load(&j->told) != 1 || j->on_caller || (want >= 0 && j->rc != want) ||
            (want < 0 && j->rc >= 0) || (j->a.kind == JOB_KEEP && !j->row_visible)) {
            fprintf(stderr, "  async job %s: told %d times, rc %d, on the caller %d\n", j->a.id,
                    atomic_load(&j->told), j->rc, j->on_caller);
            bad++;
        }
    }
    CHECK_INT(bad, 0);
    CHECK_INT(biz_count(st, "LIKE", "async-%-k"), ASYNC_JOBS / 3);
    CHECK_INT(biz_count(st, "LIKE", "async-%-f"), 0);
    CHECK_INT(biz_count(st, "LIKE", "async-%-d"), 0);
    CHECK_INT((int)(after.write_commits - before.write_commits),
              (JOB_THREADS * JOBS_EACH + ASYNC_JOBS) / 3);
    CHECK(after.durable_commits - before.durable_commits <
          after.write_commits - before.write_commits);

    /*
     * Held writer: the job waits for its release, then runs.  A job that ran meanwhile would
     * have written its row on the writer this thread holds, visible to this very transaction.
     */
    CHECK_INT(idem_tx_begin(st, 1, &holder), 0);
    CHECK_INT(async_queue(&jobs[0], st, JOB_KEEP, "after-holder-k"), 0);
    {
        const char *p[] = {"after-holder-k"};
        struct idem_rows *rows = NULL;
        CHECK_INT(idem_tx_exec(holder, "SELECT count(*) FROM biz WHERE id = $1", 1, p, &rows), 0);
        CHECK_STR(idem_rows_get(rows, 0, 0), "0");
        idem_rows_free(rows);
    }
    CHECK_INT(atomic_load(&jobs[0].told), 0);
    CHECK_INT(idem_tx_commit(holder), 0);
    async_wait_all(jobs, 1);
    CHECK_INT(atomic_load(&jobs[0].told), 1);
    CHECK_INT(jobs[0].rc, 0);
    CHECK_INT(biz_has(st, "after-holder-k"), 1);

    /* Close with jobs queued: each is run and told before the store is gone. */
    for (int i = 0; i < 20; i++) {
        snprintf(id, sizeof id, "at-close-%d", i);
        CHECK_INT(async_queue(&jobs[i], st, JOB_DISCARD, id), 0);
    }
    idem_store_close(st);
    for (int i = 0; i < 20; i++) {
        CHECK_INT(atomic_load(&jobs[i].told), 1);
        CHECK_INT(jobs[i].rc, IDEM__TX_DISCARD);
    }
}

/*
 * Once an fsync failed the store is stopped, and every read fails until it is opened again,
 * whichever way the read ends: also a statement inside a read transaction whose rows a caller
 * answers from before the transaction ends (orderd's GET /api/orders/{id}), which would otherwise
 * return a commit whose fsync failed -- one a power cut takes back.
 */
static void stopped_store_fails_every_read(const char *dir)
{
    struct idem_store *st = NULL;
    struct idem_tx *tx = NULL, *rd = NULL;
    struct idem_rows *r = NULL;
    const char *kept[] = {"kept"}, *lost[] = {"lost"};
    char uri[160];

    snprintf(uri, sizeof uri, "sqlite:%s/stop.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ($1)", 1, kept, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    /* A read transaction that read before the failure, and goes on reading after it. */
    CHECK_INT(idem_tx_begin(st, 0, &rd), 0);
    CHECK_INT(idem_tx_exec(rd, "SELECT id FROM biz WHERE id = $1", 1, kept, &r), 0);
    CHECK_INT(idem_rows_count(r), 1);
    idem_rows_free(r);
    r = NULL;
    /* Before it, a read's end vouches for what it read, in a write transaction too. */
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "SELECT id FROM biz WHERE id = $1", 1, kept, &r), 0);
    idem_rows_free(r);
    r = NULL;
    CHECK_INT(idem_tx_rollback(tx), 0);
    CHECK_INT(idem_tx_rollback(NULL), 0);

    atomic_store(&fdatasync_fails, 1);
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ($1)", 1, lost, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), IDEM_EUNAVAIL); /* its COMMIT ran, its fsync failed */
    atomic_store(&fdatasync_fails, 0);

    CHECK_INT(idem_tx_exec(rd, "SELECT id FROM biz WHERE id = $1", 1, kept, &r), IDEM_EUNAVAIL);
    CHECK(r == NULL);
    CHECK_INT(idem_tx_commit(rd), IDEM_EUNAVAIL);
    /* As orders_get reads: a read transaction, its statement, an answer from its rows. */
    CHECK_INT(idem_tx_begin(st, 0, &rd), 0);
    CHECK_INT(idem_tx_exec(rd, "SELECT id FROM biz WHERE id = $1", 1, lost, &r), IDEM_EUNAVAIL);
    CHECK(r == NULL);
    idem_rows_free(r);
    r = NULL;
    CHECK_INT(idem_tx_exec(rd, "SELECT id FROM biz WHERE id = $1", 1, kept, &r), IDEM_EUNAVAIL);
    idem_rows_free(r);
    r = NULL;
    /* However a read ends, it says its rows are not vouched for. */
    CHECK_INT(idem_tx_rollback(rd), IDEM_EUNAVAIL);
    CHECK_INT(biz_has(st, "kept"), -1); /* a statement of its own */
    CHECK_INT(biz_has(st, "lost"), -1);
    CHECK_INT(idem_tx_begin(st, 1, &tx), IDEM_EUNAVAIL); /* and nothing more is written */
    idem_store_close(st);

    /* Opened again: its first connection fsyncs the WAL, and the store vouches for it again. */
    st = NULL;
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(biz_has(st, "kept"), 1);
    idem_store_close(st);
}

/* ---- a member whose writes would fail the batch's COMMIT ---------------------------------- */

static const struct idem_migration fk_tables[] = {
    {1, "rows whose parent is checked at COMMIT",
     "CREATE TABLE fk_parent (id TEXT PRIMARY KEY);"
     " CREATE TABLE fk_child (id TEXT PRIMARY KEY,"
     " parent TEXT REFERENCES fk_parent (id) DEFERRABLE INITIALLY DEFERRED)",
     NULL},
};

struct fk_job {
    struct idem_store *st;
    const char *id;
    int orphan; /* also inserts a child of no parent: the COMMIT would refuse it */
    struct idem__job_slot slot;
    atomic_int told;
    int rc;
};

static int fk_job_fn(struct idem_conn *c, void *arg)
{
    struct fk_job *j = arg;
    const char *p[] = {j->id}, *child[] = {j->id, "no-such-parent"};
    int rc = j->st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, p, NULL);

    if (rc == 0 && j->orphan)
        rc =
            j->st->cm->exec(c, "INSERT INTO fk_child (id, parent) VALUES ($1, $2)", 2, child, NULL);
    return rc;
}

static void fk_job_done(void *arg, int rc, const char *errmsg)
{
    struct fk_job *j = arg;

    (void)errmsg;
    j->rc = rc;
    atomic_fetch_add(&j->told, 1);
}

static int fk_told(struct fk_job *jobs, int n)
{
    int told = 0;

    for (int i = 0; i < n; i++)
        told += atomic_load(&jobs[i].told);
    return told;
}

/*
 * Jobs queued while a thread holds the writer join its batch when it lets go: rerunnable ones
 * (sharing one savepoint) and ones with a savepoint each.  One of each leaves a foreign key
 * unresolved, which only the batch's COMMIT would find, failing every member: each fails alone
 * instead, as its own COMMIT would, and the others are durable.
 */
static void orphans_fail_alone(const char *dir)
{
    enum { N = 6 };
    static struct fk_job jobs[N];
    static const char *const ids[N] = {"r-keep-1", "r-orphan", "r-keep-2",
                                       "s-keep-1", "s-orphan", "s-keep-2"};
    struct idem_store *st = NULL;
    struct idem_tx *holder = NULL;
    const char *held[] = {"holder"};
    char uri[160], err[IDEM_ERRMSG_MAX];

    snprintf(uri, sizeof uri, "sqlite:%s/fk.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit-fk", fk_tables, 1, NULL, NULL), 0);
    CHECK_INT(idem_tx_begin(st, 1, &holder), 0);
    CHECK_INT(idem_tx_exec(holder, "INSERT INTO biz (id) VALUES ($1)", 1, held, NULL), 0);
    for (int i = 0; i < N; i++) {
        jobs[i] =
            (struct fk_job){.st = st, .id = ids[i], .orphan = strstr(ids[i], "orphan") != NULL};
        CHECK_INT(idem__tx_run_async(st, &jobs[i].slot, fk_job_fn, &jobs[i],
                                     i < N / 2 ? IDEM__TX_RERUNNABLE : 0, fk_job_done, &jobs[i],
                                     err, sizeof err),
                  0);
    }
    CHECK_INT(idem_tx_commit(holder), 0); /* the jobs run into its batch before it commits */
    T_WAIT_UNTIL(fk_told(jobs, N) == N, "every job told");
    for (int i = 0; i < N; i++) {
        CHECK_INT(jobs[i].rc, jobs[i].orphan ? IDEM_ESTORE : 0);
        CHECK_INT(biz_has(st, ids[i]), jobs[i].orphan ? 0 : 1);
    }
    CHECK_INT(biz_has(st, "holder"), 1);
    idem_store_close(st);
}

/* Closes every connection the store holds: the pooled ones as if each broke, then the writer. */
static void close_every_connection(struct idem_store *st)
{
    struct idem_tx *tx = NULL;
    char err[IDEM_ERRMSG_MAX];

    while (st->nidle > 0) {
        struct idem_conn *c = NULL;
        CHECK_INT(idem__store_get(st, &c, err, sizeof err), 0);
        c->broken = 1;
        idem__store_put(st, c); /* (a broken connection is closed, not pooled) */
    }
    CHECK_INT(st->nopen, 0);
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    idem__sq_fail_next_rollback = 1;
    idem_tx_rollback(tx); /* the writer breaks, and is closed */
}

/* Commits a row, and checks that the fsync that made it durable was of the WAL named now. */
static void commit_syncs_the_live_wal(struct idem_store *st, const char *wal, const char *id)
{
    struct idem_tx *tx = NULL;
    const char *p[] = {id};
    struct stat now;

    atomic_store(&synced_unlinked, 0);
    atomic_store(&synced_ino, 0);
    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "INSERT INTO biz (id) VALUES ($1)", 1, p, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
    CHECK_INT(stat(wal, &now), 0);
    CHECK_INT(atomic_load(&synced_unlinked), 0);
    CHECK_INT(atomic_load(&synced_ino), now.st_ino);
    CHECK_INT(atomic_load(&synced_dev), now.st_dev);
}

/*
 * When the last connection to the file closes, SQLite checkpoints the WAL and, unless told to
 * keep it, deletes it; the next connection makes a new one.  The syncer's fsync must then reach
 * the new WAL, not the deleted file its descriptor was opened on -- whether the last connection
 * was the store's own (every connection of the store keeps the WAL) or another program's.
 */
static void syncer_follows_the_wal(const char *dir)
{
    struct idem_store *st = NULL;
    sqlite3 *other = NULL;
    char uri[180], path[160], wal[170];
    struct stat sb;

    snprintf(path, sizeof path, "%s/wal.db", dir);
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(uri, sizeof uri, "sqlite:%s", path);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    commit_syncs_the_live_wal(st, wal, "first");

    /* The store's own connections close last: the WAL stays. */
    close_every_connection(st);
    CHECK_INT(stat(wal, &sb), 0);
    commit_syncs_the_live_wal(st, wal, "after-own-close");

    /* Another program's connection, which does not keep the WAL, closes last. */
    CHECK_INT(sqlite3_open_v2(path, &other, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    CHECK_INT(sqlite3_exec(other, "SELECT count(*) FROM biz", NULL, NULL, NULL), SQLITE_OK);
    close_every_connection(st);
    CHECK_INT(sqlite3_close(other), SQLITE_OK);
    CHECK(stat(wal, &sb) != 0); /* deleted */
    commit_syncs_the_live_wal(st, wal, "after-foreign-close");

    CHECK_INT(biz_has(st, "first") + biz_has(st, "after-own-close") +
                  biz_has(st, "after-foreign-close"),
              3);
    idem_store_close(st);
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
    static const struct idem_operation op = {
        .name = "unit.takeover", .lease_ms = 50, .wait_ms = 10};
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
    failed_rollback_never_commits(st);
    whole_transactions(st);
    queued_job_times_out(dir);
    jobs_without_a_waiting_thread(dir);
    stopped_store_fails_every_read(dir);
    syncer_follows_the_wal(dir);
    orphans_fail_alone(dir);
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
