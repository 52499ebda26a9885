/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_sqlite_commit.c - the SQLite store's group commit (lib/sqlite_commit.c) at its interface
 * (sqlite_commit.h, and idem__tx_run below the public API), on real files in a temporary
 * directory.  Members committed while an fsync is in flight share the next COMMIT and fsync; a
 * member that does not wait is told on the notifier thread -- neither its caller's nor the
 * syncer's -- and only once the fsync covering its batch returned; a member whose release would
 * leave a deferred foreign key unresolved fails alone and its neighbours in the batch commit; a
 * member that rolls back leaves nothing, its neighbours keep theirs; a savepoint rollback made to
 * fail (a test hook) breaks the writer, so the aborted writes never commit with the next member.
 * Whole transactions run by the writer's holder (idem__tx_run): one that fails or asks for a
 * rollback leaves nothing, its neighbours in the same batch keep theirs, from many threads at once
 * (half of them one statement each, without a savepoint of their own); and the same without a
 * thread waiting for them (write_run_async), told by the store's own thread; a queued job that
 * cannot get the writer in time gives up.  A job whose writes would fail the batch's COMMIT (a
 * deferred foreign key) fails alone.  A group whose fsync failed answers no read, inside a read
 * transaction either, and refuses every write with IDEM_EUNAVAIL; and the syncer's fsync reaches
 * the WAL that is named -wal now, after the last connection to the file closed.
 */
#define _GNU_SOURCE /* syscall() */
#include "internal.h"
#include "sqlite_commit.h"
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
 * fail, hold it until it lets go (an fsync in flight for as long as the test needs), count the
 * calls that returned, see which thread called, and which file it was asked to flush.
 */
static _Atomic int fdatasync_fails;      /* while set, every fdatasync fails with EIO */
static _Atomic unsigned long synced_ino; /* the inode of the last file flushed */
static _Atomic unsigned long synced_dev; /* and its device */
static _Atomic int synced_unlinked;      /* flushes of a file no name points to any more */
static _Atomic int fdatasync_returned;   /* calls that returned */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static int hold;              /* while set, fdatasync waits (hold_mu) */
static int held;              /* calls waiting now (hold_mu) */
static pthread_t syncer_seen; /* the thread of the last call (hold_mu) */

int fdatasync(int fd)
{
    struct stat sb;
    int rc;

    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        atomic_store(&synced_ino, (unsigned long)sb.st_ino);
        atomic_store(&synced_dev, (unsigned long)sb.st_dev);
        if (sb.st_nlink == 0)
            atomic_fetch_add(&synced_unlinked, 1);
    }
    pthread_mutex_lock(&hold_mu);
    syncer_seen = pthread_self();
    held++;
    while (hold)
        pthread_cond_wait(&hold_cv, &hold_mu);
    held--;
    pthread_mutex_unlock(&hold_mu);
    if (atomic_load(&fdatasync_fails)) {
        errno = EIO;
        rc = -1;
    } else {
        rc = (int)syscall(SYS_fdatasync, fd);
    }
    atomic_fetch_add(&fdatasync_returned, 1);
    return rc;
}

/* Holds every fdatasync from now (1) or lets them go (0). */
static void fdatasync_hold(int on)
{
    pthread_mutex_lock(&hold_mu);
    hold = on;
    pthread_mutex_unlock(&hold_mu);
    if (!on)
        pthread_cond_broadcast(&hold_cv);
}

static int fdatasync_held(void)
{
    int n;

    pthread_mutex_lock(&hold_mu);
    n = held;
    pthread_mutex_unlock(&hold_mu);
    return n;
}

static pthread_t fdatasync_caller(void)
{
    pthread_t t;

    pthread_mutex_lock(&hold_mu);
    t = syncer_seen;
    pthread_mutex_unlock(&hold_mu);
    return t;
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

/* ---- the group at its interface (sqlite_commit.h) ----------------------------------------- */

/* A member that did not wait (write_commit_async): how, where and when it was told. */
struct member {
    struct idem__job_slot slot; /* the group's, until told */
    atomic_int told;
    int rc;
    pthread_t on;      /* the thread it was told on */
    int fsyncs_before; /* fdatasync calls that had returned when it was told */
};

static void member_done(void *arg, int rc, const char *errmsg)
{
    struct member *m = arg;

    (void)errmsg;
    m->rc = rc;
    m->on = pthread_self();
    m->fsyncs_before = atomic_load(&fdatasync_returned);
    atomic_fetch_add(&m->told, 1);
}

/* A store of its own on the file `name` of `dir`, with biz and the foreign-key tables made. */
static struct idem_store *group_store(const char *dir, const char *name)
{
    struct idem_store *st = NULL;
    char uri[200];

    snprintf(uri, sizeof uri, "sqlite:%s/%s", dir, name);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit", biz, 1, NULL, NULL), 0);
    CHECK_INT(idem_store_migrate(st, "unit-fk", fk_tables, 1, NULL, NULL), 0);
    return st;
}

/* Takes the writer, inserts `id` into biz and commits without waiting: 0 or the failure. */
static int member_commit_async(struct idem_store *st, struct member *m, const char *id)
{
    struct idem_conn *c = NULL;
    const char *p[] = {id};
    char err[IDEM_ERRMSG_MAX] = "";
    int rc;

    memset(m, 0, sizeof *m);
    rc = idem__sq_write_begin(st, &c, err, sizeof err);
    if (rc < 0)
        return rc;
    rc = st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, p, NULL);
    if (rc < 0) {
        idem__sq_write_rollback(st, c);
        return rc;
    }
    return idem__sq_write_commit_async(st, c, &m->slot, member_done, m, err, sizeof err);
}

static int members_told(struct member *m, int n)
{
    int told = 0;

    for (int i = 0; i < n; i++)
        told += atomic_load(&m[i].told);
    return told;
}

/*
 * With the syncer's fsync held, one member's batch waits for it; the members committed meanwhile
 * (members one after another, a transaction that holds the writer and the jobs queued behind it)
 * all go into the next batch, which commits when the fsync returns: two COMMITs and two fsyncs
 * for all of them, each member told once, all on one thread.
 */
static void members_committed_meanwhile_share_one_fsync(const char *dir)
{
    enum { N = 12 };
    static struct async_job jobs[N];
    static struct member members[N];
    struct member first, holder;
    struct idem_store *st = group_store(dir, "share.db");
    struct idem_store_stats before, after;
    struct idem_conn *c = NULL;
    const char *held[] = {"share-holder"};
    char err[IDEM_ERRMSG_MAX] = "", id[64];
    int fsyncs, not_told = 0, elsewhere = 0;

    idem_store_stats(st, &before);
    fsyncs = atomic_load(&fdatasync_returned);
    fdatasync_hold(1);
    CHECK_INT(member_commit_async(st, &first, "share-first"), 0);
    T_WAIT_UNTIL(fdatasync_held() == 1, "the syncer's fsync of the first batch");

    /* Members one after another, each taking the writer and committing without waiting. */
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "share-member-%d", i);
        CHECK_INT(member_commit_async(st, &members[i], id), 0);
    }

    /* The writer, then jobs queued behind it, then the writer's own commit. */
    memset(&holder, 0, sizeof holder);
    CHECK_INT(idem__sq_write_begin(st, &c, err, sizeof err), 0);
    CHECK_INT(st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, held, NULL), 0);
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "share-job-%d", i);
        CHECK_INT(async_queue(&jobs[i], st, JOB_KEEP, id), 0);
    }
    CHECK_INT(
        idem__sq_write_commit_async(st, c, &holder.slot, member_done, &holder, err, sizeof err), 0);
    /* Nobody is told while the first batch's fsync is in flight. */
    t_sleep_ms(50); /* (a quiet period: nothing may be told in it) */
    CHECK_INT(atomic_load(&first.told) + atomic_load(&holder.told) + async_told(jobs, N) +
                  members_told(members, N),
              0);
    fdatasync_hold(0);

    T_WAIT_UNTIL(atomic_load(&first.told) && atomic_load(&holder.told) &&
                     async_told(jobs, N) == N && members_told(members, N) == N,
                 "every member told");
    idem_store_stats(st, &after);
    CHECK_INT(first.rc, 0);
    CHECK_INT(holder.rc, 0);
    for (int i = 0; i < N; i++) {
        not_told += atomic_load(&jobs[i].told) != 1 || jobs[i].rc != 0;
        elsewhere += jobs[i].on_caller;
        not_told += atomic_load(&members[i].told) != 1 || members[i].rc != 0;
        elsewhere += !pthread_equal(members[i].on, first.on);
    }
    CHECK_INT(not_told, 0);
    CHECK_INT(elsewhere, 0);
    CHECK(pthread_equal(first.on, holder.on)); /* one notifier */
    CHECK_INT(after.write_commits - before.write_commits, 2 * N + 2);
    /*
     * The first batch, and the one they all joined: two COMMITs, two fsyncs.  (A batch older than
     * 20 ms commits at its next release, to bound a member's wait: a thread of this test stalled
     * that long on a loaded machine may close one early, whence a third.)
     */
    CHECK(after.durable_commits - before.durable_commits >= 2);
    CHECK(after.durable_commits - before.durable_commits <= 3);
    CHECK_INT(atomic_load(&fdatasync_returned) - fsyncs,
              after.durable_commits - before.durable_commits);
    CHECK_INT(biz_count(st, "LIKE", "share-%"), 2 * N + 2);
    idem_store_close(st);
}

/*
 * A member that did not wait is told on the notifier thread: not on the thread that committed it,
 * not on the syncer (a callback may write and wait for the syncer), and only once the fsync that
 * covers its batch returned -- while that fsync is held, it is not told.
 */
static void an_async_member_is_told_on_the_notifier_after_its_fsync(const char *dir)
{
    struct idem_store *st = group_store(dir, "notify.db");
    struct member m;
    pthread_t syncer;
    int fsyncs = atomic_load(&fdatasync_returned);

    fdatasync_hold(1);
    CHECK_INT(member_commit_async(st, &m, "notified"), 0);
    T_WAIT_UNTIL(fdatasync_held() == 1, "the syncer's fsync");
    syncer = fdatasync_caller();
    t_sleep_ms(50); /* (a quiet period: the member may not be told in it) */
    CHECK_INT(atomic_load(&m.told), 0);
    fdatasync_hold(0);
    T_WAIT_UNTIL(atomic_load(&m.told) == 1, "the member told");
    CHECK_INT(m.rc, 0);
    CHECK(!pthread_equal(m.on, pthread_self()));
    CHECK(!pthread_equal(m.on, syncer));
    CHECK(m.fsyncs_before > fsyncs); /* told after the fsync returned */
    CHECK_INT(biz_has(st, "notified"), 1);
    idem_store_close(st);
}

/* member_commit_async() on a thread of its own. */
struct member_thread {
    struct idem_store *st;
    const char *id;
    struct member m;
    atomic_int returned;
    int rc;
};

static void *member_thread(void *arg)
{
    struct member_thread *t = arg;

    t->rc = member_commit_async(t->st, &t->m, t->id);
    atomic_store(&t->returned, 1);
    return NULL;
}

/* A member on a thread of its own: it inserts "lone" and either an orphan (then commits) or not
 * (then rolls back). */
struct lone {
    struct idem_store *st;
    int orphan;
    atomic_int begun, done;
    int rc;
    char err[IDEM_ERRMSG_MAX];
};

static void *lone_member(void *arg)
{
    struct lone *l = arg;
    struct idem_conn *c = NULL;
    const char *p[] = {"lone"}, *child[] = {"lone", "no-such-parent"};

    l->rc = idem__sq_write_begin(l->st, &c, l->err, sizeof l->err);
    if (l->rc == 0)
        l->rc = l->st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, p, NULL);
    if (l->rc == 0 && l->orphan)
        l->rc =
            l->st->cm->exec(c, "INSERT INTO fk_child (id, parent) VALUES ($1, $2)", 2, child, NULL);
    atomic_store(&l->begun, 1);
    if (c && (l->rc < 0 || !l->orphan))
        l->rc = l->rc < 0 ? l->rc : idem__sq_write_rollback(l->st, c);
    else if (c)
        l->rc = idem__sq_write_commit(l->st, c, l->err, sizeof l->err);
    atomic_store(&l->done, 1);
    return NULL;
}

/*
 * One member between two others in a batch held open by an fsync in flight (the first batch's):
 * with `orphan` its release leaves a deferred foreign key unresolved and fails alone
 * (IDEM_ESTORE, as its own COMMIT would); without, it rolls back.  Either way nothing of it is
 * left, and its neighbours commit.
 */
static void lone_member_between_neighbours(const char *dir, const char *file, int orphan)
{
    struct idem_store *st = group_store(dir, file);
    struct member first, before;
    struct member_thread next = {.st = st, .id = "after"};
    struct lone l = {.st = st, .orphan = orphan};
    pthread_t th, th2;

    fdatasync_hold(1);
    CHECK_INT(member_commit_async(st, &first, "first"), 0);
    T_WAIT_UNTIL(fdatasync_held() == 1, "the syncer's fsync of the first batch");
    CHECK_INT(member_commit_async(st, &before, "before"), 0);
    pthread_create(&th, NULL, lone_member, &l);
    T_WAIT_UNTIL(atomic_load(&l.begun), "the lone member's writes");
    /*
     * The next member takes the writer once the lone one let it go.  On a thread of its own: were
     * its commit to wait (its release failing for writes the lone one left behind), this thread
     * would still let the fsync go and report it.
     */
    pthread_create(&th2, NULL, member_thread, &next);
    T_WAIT_UNTIL(atomic_load(&next.returned), "the next member's commit to return");
    CHECK_INT(next.rc, 0);
    CHECK_INT(atomic_load(&before.told) + atomic_load(&next.m.told), 0);
    fdatasync_hold(0);
    pthread_join(th, NULL);
    pthread_join(th2, NULL);
    T_WAIT_UNTIL(atomic_load(&first.told) && atomic_load(&before.told) && atomic_load(&next.m.told),
                 "the neighbours told");
    if (orphan) {
        CHECK_INT(l.rc, IDEM_ESTORE);
        CHECK(strstr(l.err, "FOREIGN KEY") != NULL);
    } else {
        CHECK_INT(l.rc, 0);
    }
    CHECK_INT(first.rc, 0);
    CHECK_INT(before.rc, 0);
    CHECK_INT(next.m.rc, 0);
    CHECK_INT(biz_has(st, "lone"), 0);
    CHECK_INT(biz_has(st, "first") + biz_has(st, "before") + biz_has(st, "after"), 3);
    {
        struct idem_tx *tx = NULL;
        struct idem_rows *r = NULL;
        CHECK_INT(idem_tx_begin(st, 0, &tx), 0);
        CHECK_INT(idem_tx_exec(tx, "SELECT count(*) FROM fk_child", 0, NULL, &r), 0);
        CHECK_STR(idem_rows_get(r, 0, 0), "0");
        idem_rows_free(r);
        idem_tx_rollback(tx);
    }
    idem_store_close(st);
}

static void a_member_whose_release_fails_fails_alone(const char *dir)
{
    lone_member_between_neighbours(dir, "lone-fk.db", 1);
}

static void a_rolled_back_member_leaves_nothing(const char *dir)
{
    lone_member_between_neighbours(dir, "lone-rb.db", 0);
}

/*
 * Once an fsync failed, the group takes no more writes, however given: a transaction is not
 * begun, a whole one (idem__tx_run) and one without a waiting thread fail with IDEM_EUNAVAIL,
 * and none of them left anything when the file is opened again.
 */
static void a_stopped_group_refuses_every_write(const char *dir)
{
    struct idem_store *st = group_store(dir, "refuse.db");
    struct idem_conn *c = NULL;
    struct async_job aj;
    struct job_arg a;
    const char *lost[] = {"lost"};
    char err[IDEM_ERRMSG_MAX] = "", uri[200];
    int rc;

    atomic_store(&fdatasync_fails, 1);
    CHECK_INT(idem__sq_write_begin(st, &c, err, sizeof err), 0);
    CHECK_INT(st->cm->exec(c, "INSERT INTO biz (id) VALUES ($1)", 1, lost, NULL), 0);
    CHECK_INT(idem__sq_write_commit(st, c, err, sizeof err), IDEM_EUNAVAIL);
    atomic_store(&fdatasync_fails, 0);

    c = NULL;
    err[0] = '\0';
    CHECK_INT(idem__sq_write_begin(st, &c, err, sizeof err), IDEM_EUNAVAIL);
    CHECK(c == NULL);
    CHECK(strstr(err, "the store stopped") != NULL);
    a = (struct job_arg){st, JOB_KEEP, "refused-run", 0};
    CHECK_INT(idem__tx_run(st, job_fn, &a, 0, err, sizeof err), IDEM_EUNAVAIL);
    rc = async_queue(&aj, st, JOB_KEEP, "refused-async");
    if (rc == 0) {
        async_wait_all(&aj, 1);
        rc = aj.rc;
    }
    CHECK_INT(rc, IDEM_EUNAVAIL);
    idem_store_close(st);

    snprintf(uri, sizeof uri, "sqlite:%s/refuse.db", dir);
    st = NULL;
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    CHECK_INT(biz_has(st, "refused-run") + biz_has(st, "refused-async"), 0);
    idem_store_close(st);
}

int main(void)
{
    char dir[] = "/tmp/idem-unit-sqc-XXXXXX";
    char uri[128], cmd[160];
    struct idem_store *st = NULL;

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(uri, sizeof uri, "sqlite:%s/unit.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    failed_rollback_never_commits(st);
    whole_transactions(st);
    idem_store_close(st);
    members_committed_meanwhile_share_one_fsync(dir);
    an_async_member_is_told_on_the_notifier_after_its_fsync(dir);
    a_member_whose_release_fails_fails_alone(dir);
    a_rolled_back_member_leaves_nothing(dir);
    queued_job_times_out(dir);
    jobs_without_a_waiting_thread(dir);
    stopped_store_fails_every_read(dir);
    a_stopped_group_refuses_every_write(dir);
    syncer_follows_the_wal(dir);
    orphans_fail_alone(dir);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
