/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sqlite_commit.c - the SQLite store's commit pipeline: every write transaction of a process runs
 * on its one writer connection, as a savepoint of a batch that concurrent callers share; batches
 * commit back to back, and a syncer thread makes them durable with one fsync of the WAL for all
 * the batches that committed while the previous fsync ran.  The callbacks of members that did not
 * wait run on a notifier thread that holds nothing of the store (notifier_main), so a callback
 * may write and wait for the syncer like any thread.
 *
 * Why the writer never waits for the disk.  With synchronous=FULL, SQLite fsyncs the WAL inside
 * COMMIT, so the writer is held across the fsync and a batch costs (its statements) + (fsync).
 * Here the writer commits with synchronous=NORMAL -- COMMIT writes the batch's frames to the WAL
 * and returns -- and the batch goes to the syncer, while the writer begins the next batch at once:
 * batch N+1's statements run while batch N's fsync is in flight (flush pipelining, as in Silo's
 * epoch group commit).  Nobody is told of a batch before the fsync that covers it has returned.
 *
 * Why one fsync of the WAL makes a batch durable.  SQLite appends a commit's frames to the WAL and
 * only then marks them committed in the wal-index (-shm); the WAL is one file, so an fsync of it
 * that begins after COMMIT returned covers every frame of that commit and of all earlier ones.
 * The WAL is rewritten from its start only after a checkpoint copied all of it into the database
 * file, and in NORMAL mode SQLite itself fsyncs the WAL before a checkpoint, the database file
 * after it, and the new WAL header before the first frame written over old ones: frames not yet
 * fsync'd are only ever the newest, and a power cut that tears them loses whole transactions
 * (their checksums fail), never an older one.  The fsync goes through a file descriptor of the
 * syncer's own on the -wal file (the same inode SQLite writes: an fsync flushes the file, not a
 * descriptor), and the first one also fsyncs the directory, which holds the WAL's name.  An fsync
 * that fails stops the store: the kernel may have dropped the pages it could not write, so no
 * later fsync could vouch for them; every waiting and later write and gated read fails.
 *
 * Why nobody answers from state a crash could take back.  Three marks, shared by every process
 * that opens the file (a small mapped file beside it, -idemsync), order the commits: `started`
 * is raised before a batch's COMMIT (while the batch holds SQLite's write lock, so processes
 * take turns), `committed` once its COMMIT returned, and `durable` by an fsync to the `committed`
 * it read before it began.  Every answer is gated:
 *   - a member of a batch (write_commit, write_run, write_run_async) is told when its batch is
 *     durable; so is a member that rolled back or failed (it read the batch's earlier members and
 *     everything committed before), and write_rollback waits likewise for the batch it was in;
 *   - every statement on a pooled connection (idem__sq_read_gate), in a read transaction or not,
 *     ends by reading `started` -- any commit it could see had raised it before its COMMIT made
 *     its frames visible; in a transaction, the value read once its snapshot was taken -- and
 *     waits until `durable` reaches it: for this process's syncer, or it fsyncs the WAL itself
 *     (the commit may be another process's, or of one that died before its fsync).  Its rows
 *     are handed over only then, since a caller may answer from them before the transaction
 *     ends, and once the store stopped every statement fails, the writer's too.
 * The marks themselves need no durability: at open, the first connection fsyncs the WAL, the
 * database file and the directory, and marks everything committed before as durable.
 *
 * Where it stands among the store's files (an arrow is a call, and none points up):
 *
 *     store_sqlite.c       the store's tables: records, migrations, reads on pooled connections
 *        |       |
 *        |       v
 *        |    sqlite_commit.c    the group commit: the writer, batches, syncer, read gate
 *        |       |
 *        v       v
 *     sqlite_conn.c        a connection: opened and configured, its statements, its errors
 *
 * The group opens its writer as any connection (sqlite_conn.c) and runs only its own SQL on it:
 * SAVEPOINT, RELEASE, ROLLBACK TO, BEGIN IMMEDIATE, COMMIT.  What a member writes is the store's
 * business, run through the idem__tx_fn it was given.
 */
#define _GNU_SOURCE /* F_OFD_SETLK: a lock of an open file description, not of the process */
#include "sqlite_conn.h"
#include "sqlite_commit.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- group commit ------------------------------------------------------------------------- */

/*
 * One fsync per transaction caps a durable store at the disk's fsync rate.  So every write
 * transaction of this process runs on one writer connection, as a savepoint inside a batch
 * transaction that many callers share: a caller's work is isolated by its savepoint (a failure
 * rolls back that savepoint only, never its neighbours'), and its commit releases the savepoint
 * into the batch and then waits until the batch is durable -- nobody is answered before the
 * COMMIT that holds their work has returned.  SQLite allows one writer per file at a time anyway,
 * so queueing the writers here costs no concurrency; it only replaces SQLite's sleeping busy
 * handler with a condition variable.
 *
 * Who commits: whoever ends a transaction while nobody waits for the writer (the queue drained),
 * or when the batch reached GROUP_MEMBERS_MAX members or GROUP_AGE_MAX_MS of age.  The COMMIT
 * hands the batch to the syncer (above) and the writer is free again; the batches that commit
 * while one fsync runs share the next.  A member that finds the writer free and its batch still
 * open commits it itself, so a batch is never left waiting.  Without the pipeline (a store opened
 * with IDEM_SYNC_NORMAL, or not a plain file) the COMMIT is all there is and its committer tells
 * the batch's members.
 */
#define GROUP_MEMBERS_MAX 256
#define GROUP_AGE_MAX_MS 20

/*
 * A transaction given whole (write_run) does not wait for the writer to be handed to it: it
 * queues as a job, and whoever holds the writer runs the queued jobs, each in its own savepoint,
 * before giving the writer up -- so the batch fills without a context switch per member, and
 * the job's thread wakes once, when its batch is durable.  A job whose thread finds the writer
 * free runs the queue itself.  Jobs that may run again from the start (IDEM__TX_RERUNNABLE)
 * share one savepoint instead: one that fails undoes them all, and the others run again
 * (jobs_run_rerunnable).
 *
 * A job given without a thread to wait (write_run_async: an event loop's) carries a notice
 * instead, told when its batch ends or it is done.  When such a job heads the queue and the
 * writer is free, the group's runner thread (started on the first such job) takes the writer,
 * runs the queue and commits it: the caller never blocks, and never runs a job itself.
 */
enum sq_job_state {
    JOB_QUEUED,   /* in g->jobs */
    JOB_RUNNING,  /* taken off the queue by the writer's holder */
    JOB_IN_BATCH, /* released into `batch`: done when the batch is */
    JOB_DONE,     /* rolled back or failed: `rc` */
};

struct sq_job {
    struct sq_job *next; /* in g->jobs, then in its batch's jobs */
    idem__tx_fn fn;
    void *arg;
    enum sq_job_state state;
    int rc;
    struct sq_batch *batch;
    pthread_cond_t cv;        /* its thread sleeps on it, woken alone (job_wake_locked) */
    struct sq_job *wake_next; /* in g->wake_jobs */
    int wake_listed;
    _Atomic int wakes_unsent; /* listed wake-ups not yet sent: `cv` must live until they are */
    char errmsg[IDEM_ERRMSG_MAX];
    struct sq_notice *notice; /* write_run_async: told instead of a thread woken (no `cv`) */
    unsigned flags;           /* IDEM__TX_ONE_STATEMENT: no savepoint of its own */
    int failed;               /* IDEM__TX_RERUNNABLE: it failed; not run again */
};

/* A member that did not wait (write_commit_async, write_run_async): told when its batch ends. */
struct sq_notice {
    struct sq_notice *next;
    idem__commit_done done;
    void *arg;
    int rc;
    char errmsg[IDEM_ERRMSG_MAX];
};

/*
 * A job given without a waiting thread, in its caller's slot (struct idem__job_slot): the store
 * allocates nothing for it and lets go of it once its notice is told.  A commit given so
 * (write_commit_async) uses the notice alone.
 */
struct sq_async {
    struct sq_job job;
    struct sq_notice notice;
};
_Static_assert(sizeof(struct sq_async) <= sizeof(struct idem__job_slot),
               "struct idem__job_slot is too small for the SQLite store's job");

/*
 * A batch's members are told its outcome: 0 once durable, or its failure.  A member that rolled
 * back or failed rides the batch too (its own rc kept unless the batch failed): what it read may
 * have come from the batch's earlier members or from batches not yet durable.
 */
struct sq_batch {
    int refs; /* members that have not read the outcome yet */
    int done;
    int rc;
    int wrote;                  /* some member kept its writes */
    int64_t commit_ns;          /* what its COMMIT took */
    struct sq_batch *sync_next; /* committed, in g->sync_head's list */
    char errmsg[IDEM_ERRMSG_MAX];
    struct sq_notice *notices; /* members that did not wait */
    struct sq_job *jobs;       /* members that are jobs (write_run), each woken alone */
};

/* The marks every process on the file shares (the -idemsync file, mapped): see the top. */
struct sq_marks {
    _Atomic uint64_t started;   /* raised before a batch's COMMIT */
    _Atomic uint64_t committed; /* raised once that COMMIT returned */
    _Atomic uint64_t durable;   /* raised by an fsync of the WAL to the `committed` before it */
};

struct sq_group {
    struct idem_store *st; /* the store it belongs to (its stats) */
    pthread_mutex_t mu;
    pthread_cond_t writer_cv; /* signalled (one waiter) when the writer comes free */
    pthread_cond_t batch_cv;  /* broadcast when a batch finished or may need its members (jobs
                                 have a condition variable each instead) */
    struct idem_conn *writer; /* opened on first use, reopened after it broke */
    int busy;                 /* a caller (or a batch commit) holds the writer */
    int64_t busy_since_ns;    /* when it was taken (monotonic) */
    int waiting;              /* callers queued for the writer */
    int members;              /* savepoints released into the open batch */
    int64_t opened_ms;        /* when the open batch began */
    struct sq_batch *batch;   /* the open batch, NULL when no batch transaction is open */
    struct sq_job *jobs;      /* queued for the writer's holder to run (write_run) */
    struct sq_job **jobs_tail;
    /* Wake-ups decided under mu, sent by group_unlock() once mu is dropped. */
    int wake_writer;
    int wake_batch;
    struct sq_notice *notices; /* of finished batches, handed to the notifier likewise */
    struct sq_job *wake_jobs;  /* jobs to wake, likewise */
    int wake_runner;
    /*
     * The notifier: the one thread that runs the callbacks of members that did not wait
     * (write_commit_async, write_run_async), in the order their batches ended.
     */
    struct sq_notice *told_head; /* handed over by group_unlock(), not yet run */
    struct sq_notice **told_tail;
    int notifying; /* it runs callbacks now, g->mu dropped */
    int wake_notifier;
    pthread_cond_t notifier_cv;
    pthread_t notifier;
    int notifier_started;
    int notifier_stop;
    /* The runner: runs the queue and commits for jobs that have no thread (write_run_async). */
    pthread_cond_t runner_cv;
    pthread_t runner;
    int runner_started;
    int runner_stop;
    /* The pipeline (NULL marks: none, each COMMIT is as durable as its synchronous setting). */
    struct sq_marks *marks;
    int marks_fd;           /* holds an OFD read lock while the store is open */
    pthread_mutex_t wal_mu; /* held by whoever checks, reopens or fsyncs wal_fd */
    int wal_fd;             /* our own descriptor on the -wal file, for fsync */
    int wal_known;          /* wal_dev and wal_ino are wal_fd's (read once per descriptor) */
    dev_t wal_dev;          /* wal_fd's file (wal_follow) */
    ino_t wal_ino;
    int dir_fd;                 /* the directory holding it */
    int committing;             /* a COMMIT runs whose batch is not yet in the syncer's list */
    struct sq_batch *sync_head; /* committed, waiting for the syncer's next fsync */
    struct sq_batch **sync_tail;
    int syncing; /* the syncer's fsync is in flight */
    pthread_cond_t syncer_cv;
    pthread_t syncer;
    int syncer_started;
    int syncer_stop;
    int wake_syncer;
    pthread_cond_t durable_cv; /* broadcast after a round of the syncer if reads wait */
    int durable_waiters;
    int wake_durable;
    _Atomic int stopped; /* an fsync failed: nothing more is written or vouched for */
    char stop_msg[IDEM_ERRMSG_MAX];
};

/* Marks the writer held (g->mu held), from now: idem_store_stats' writer_busy_ns counts it. */
static void writer_take_locked(struct sq_group *g)
{
    g->busy = 1;
    g->busy_since_ns = clock_mono_ns();
}

/*
 * Drops g->mu, then sends the wake-ups decided while it was held.  A thread woken while the
 * waker still holds the mutex only blocks on it again: two context switches instead of one per
 * hand-over, and on a virtual machine a context switch is the dearest thing here.  Signalling
 * after the unlock loses nothing: every waiter re-checks its condition under the mutex.
 */
static void group_unlock(struct sq_group *g)
{
    const int writer = g->wake_writer;
    const int batch = g->wake_batch;
    const int runner = g->wake_runner;
    struct sq_job *jobs[32];
    size_t njobs = 0;

    const int syncer = g->wake_syncer;
    const int durable = g->wake_durable;
    int notifier;

    /* The notices of ended batches go to the notifier (see notifier_main for why). */
    while (g->notices) {
        struct sq_notice *n = g->notices;
        g->notices = n->next;
        n->next = NULL;
        *g->told_tail = n;
        g->told_tail = &n->next;
        g->wake_notifier = 1;
    }
    notifier = g->wake_notifier;
    g->wake_writer = 0;
    g->wake_batch = 0;
    g->wake_runner = 0;
    g->wake_syncer = 0;
    g->wake_durable = 0;
    g->wake_notifier = 0;
    /*
     * The jobs to wake are taken off the list here: once g->mu is dropped a job may be listed
     * again (its links are the list's), and once told, be gone.
     */
    while (g->wake_jobs && njobs < sizeof(jobs) / sizeof(jobs[0])) {
        struct sq_job *j = g->wake_jobs;
        g->wake_jobs = j->wake_next;
        j->wake_listed = 0;
        jobs[njobs++] = j;
    }
    pthread_mutex_unlock(&g->mu);
    if (batch)
        pthread_cond_broadcast(&g->batch_cv);
    if (writer)
        pthread_cond_signal(&g->writer_cv);
    if (runner)
        pthread_cond_signal(&g->runner_cv);
    if (syncer)
        pthread_cond_signal(&g->syncer_cv);
    if (durable)
        pthread_cond_broadcast(&g->durable_cv);
    if (notifier)
        pthread_cond_signal(&g->notifier_cv);
    for (size_t i = 0; i < njobs; i++) {
        pthread_cond_signal(&jobs[i]->cv);
        atomic_fetch_sub(&jobs[i]->wakes_unsent, 1); /* `jobs[i]` may be gone after this */
    }
    if (njobs == sizeof(jobs) / sizeof(jobs[0])) { /* more may wait: send them too */
        pthread_mutex_lock(&g->mu);
        group_unlock(g);
    }
}

/*
 * Sends the wake-ups and notices decided so far (g->mu held, dropped and taken again) before the
 * caller sleeps: the woken may be the ones it waits for.  Returns 1 if there were any.
 */
static int group_flush_locked(struct sq_group *g)
{
    if (!g->wake_writer && !g->wake_batch && !g->wake_runner && !g->wake_jobs && !g->notices &&
        !g->wake_syncer && !g->wake_durable && !g->wake_notifier)
        return 0;
    group_unlock(g);
    pthread_mutex_lock(&g->mu);
    return 1;
}

/* Wakes job `j`'s thread once g->mu is dropped (g->mu held). */
static void job_wake_locked(struct sq_group *g, struct sq_job *j)
{
    if (j->wake_listed)
        return;
    j->wake_listed = 1;
    atomic_fetch_add(&j->wakes_unsent, 1);
    j->wake_next = g->wake_jobs;
    g->wake_jobs = j;
}

/* Wakes whoever runs the queue now that the writer is free: its first job's thread, or the runner.
 */
static void queue_wake_locked(struct sq_group *g)
{
    if (!g->jobs)
        return;
    if (g->jobs->notice)
        g->wake_runner = 1;
    else
        job_wake_locked(g, g->jobs);
}

/* Tells an async job's notice that it is done, once g->mu is dropped; the job is spent. */
static void job_notify_locked(struct sq_group *g, struct sq_job *j)
{
    struct sq_notice *n = j->notice;

    n->rc = j->rc;
    if (j->rc < 0)
        idem__fmt(n->errmsg, sizeof(n->errmsg), "%s", j->errmsg);
    n->next = g->notices;
    g->notices = n;
}

static void runner_stop(struct sq_group *g);
static void syncer_stop(struct sq_group *g);
static void notifier_stop(struct sq_group *g);
static void writer_release_locked(struct sq_group *g);
static void writer_free_locked(struct sq_group *g);

static void batch_commit_locked(struct sq_group *g);

void idem__sq_group_free(struct idem_store *st)
{
    struct sq_group *g = st->backend;

    if (!g)
        return;
    runner_stop(g);
    pthread_mutex_lock(&g->mu);
    /* (a callback may hold the writer: it may write like any thread) */
    g->waiting++;
    while (g->busy)
        pthread_cond_wait(&g->writer_cv, &g->mu);
    g->waiting--;
    writer_take_locked(g);
    if (g->writer && g->batch)
        batch_commit_locked(g); /* its members that did not wait are told */
    writer_free_locked(g);
    group_unlock(g);
    /*
     * The syncer leaves once it made every committed batch durable and the notifier ran every
     * callback (a callback may write, and wait for a round of the syncer); then the notifier.
     */
    syncer_stop(g);
    notifier_stop(g);
    if (g->writer) {
        if (!sqlite3_get_autocommit(g->writer->db))
            idem__sq_run_simple(g->writer, "COMMIT", "group commit at close");
        idem__sq_conn_close(g->writer);
    }
    free(g->batch);
    if (g->marks)
        munmap(g->marks, sizeof(*g->marks));
    if (g->marks_fd >= 0)
        close(g->marks_fd);
    if (g->wal_fd >= 0)
        close(g->wal_fd);
    if (g->dir_fd >= 0)
        close(g->dir_fd);
    pthread_cond_destroy(&g->writer_cv);
    pthread_cond_destroy(&g->batch_cv);
    pthread_cond_destroy(&g->runner_cv);
    pthread_cond_destroy(&g->syncer_cv);
    pthread_cond_destroy(&g->durable_cv);
    pthread_cond_destroy(&g->notifier_cv);
    pthread_mutex_destroy(&g->wal_mu);
    pthread_mutex_destroy(&g->mu);
    free(g);
    st->backend = NULL;
}

/* The directory holding the file `path` ("." for a bare name) into `out`. */
static void dir_of(const char *path, char *out, size_t n)
{
    char *slash;

    idem__fmt(out, n, "%s", path);
    slash = strrchr(out, '/');
    if (slash == out)
        slash[1] = '\0';
    else if (slash != NULL)
        *slash = '\0';
    else
        idem__fmt(out, n, ".");
}

/*
 * fsync()s the database's -wal file, the database file and their directory, as far as they exist.
 * A process killed between writing a commit's WAL frames and their fsync leaves those frames in
 * the page cache only: the next process reads them like any commit, so without this it could
 * answer a replay from a record that a power loss would then take back -- and the retry after
 * that would run a second time.  Run when a process opens the store, before anyone reads; once
 * it returns, every commit any process made is durable or gone.  A failed fsync is not retried
 * (the kernel may have dropped the pages it could not write): the store does not open.
 */
static int sync_existing_files(const char *path, char *err, size_t errlen)
{
    static const char *const suffixes[] = {"-wal", ""};
    char name[4096];
    int fd;

    if (path[0] == ':' || strncmp(path, "file:", 5) == 0 || strlen(path) + 5 > sizeof name)
        return 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        idem__fmt(name, sizeof name, "%s%s", path, suffixes[i]);
        fd = open(name, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT)
            continue;
        if (fd < 0 || fsync(fd) != 0) {
            idem__fmt(err, errlen, "sqlite: cannot make %s durable: %s", name, strerror(errno));
            if (fd >= 0)
                close(fd);
            return IDEM_EUNAVAIL;
        }
        close(fd);
    }
    dir_of(path, name, sizeof name);
    fd = open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && fsync(fd) != 0 && errno != EINVAL) {
        idem__fmt(err, errlen, "sqlite: cannot make the directory %s durable: %s", name,
                  strerror(errno));
        close(fd);
        return IDEM_EUNAVAIL;
    }
    if (fd >= 0)
        close(fd);
    return 0;
}

/* Makes the store's group if it has none: 1 when this call made it, 0, or IDEM_ENOMEM. */
static int group_get(struct idem_store *st)
{
    int rc = 0;

    pthread_mutex_lock(&st->mu);
    if (!st->backend) {
        struct sq_group *g = calloc(1, sizeof(*g));
        pthread_cond_t *cvs[6];
        int ncv = 0;

        if (!g || pthread_mutex_init(&g->mu, NULL) != 0) {
            free(g);
            rc = IDEM_ENOMEM;
        } else if (pthread_mutex_init(&g->wal_mu, NULL) != 0) {
            pthread_mutex_destroy(&g->mu);
            free(g);
            rc = IDEM_ENOMEM;
        } else {
            cvs[0] = &g->writer_cv;
            cvs[1] = &g->batch_cv;
            cvs[2] = &g->runner_cv;
            cvs[3] = &g->syncer_cv;
            cvs[4] = &g->durable_cv;
            cvs[5] = &g->notifier_cv;
            while (ncv < 6 && pthread_cond_init(cvs[ncv], NULL) == 0)
                ncv++;
            if (ncv < 6) {
                while (ncv > 0)
                    pthread_cond_destroy(cvs[--ncv]);
                pthread_mutex_destroy(&g->wal_mu);
                pthread_mutex_destroy(&g->mu);
                free(g);
                rc = IDEM_ENOMEM;
            } else {
                g->st = st;
                g->jobs_tail = &g->jobs;
                g->sync_tail = &g->sync_head;
                g->told_tail = &g->told_head;
                g->marks_fd = g->wal_fd = g->dir_fd = -1;
                st->backend = g;
                rc = 1;
            }
        }
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int idem__sq_group_open(struct idem_store *st, char *err, size_t errlen)
{
    int made = group_get(st);

    if (made == 1 && st->opts.sync != IDEM_SYNC_NORMAL &&
        sync_existing_files(st->target, err, errlen) < 0)
        return IDEM_EUNAVAIL;
    return made;
}

/*
 * Whether a batch that nobody else queues for may commit now (g->mu held): not while the syncer
 * has an fsync in flight or batches waiting for one.  The open batch goes on filling meanwhile --
 * its statements run during the fsync -- and the syncer pokes it when its round ends, so one
 * commit and one fsync carry what arrived during the last fsync (without this, every turn of the
 * writer would commit a batch of its own, each rewriting the same hot pages into the WAL).
 */
static int disk_idle_locked(const struct sq_group *g)
{
    return !g->marks || (!g->syncing && !g->sync_head);
}

/* Takes the open batch off the writer (g->mu held): the next member begins a new one. */
static struct sq_batch *batch_detach_locked(struct sq_group *g)
{
    struct sq_batch *b = g->batch;

    b->wrote = g->members > 0;
    g->batch = NULL;
    g->members = 0;
    return b;
}

/*
 * Ends batch `b` with `rc` and wakes its members (g->mu held): each is told `rc` if the batch
 * failed, else its own outcome (0 for a member whose writes the batch carried).
 */
static void batch_finish_locked(struct sq_group *g, struct sq_batch *b, int rc, const char *msg)
{
    b->done = 1;
    b->rc = rc;
    if (rc < 0)
        idem__fmt(b->errmsg, sizeof(b->errmsg), "%s", msg);
    for (struct sq_job *j = b->jobs; j; j = j->next)
        job_wake_locked(g, j);
    /* Members that did not wait are told once g->mu is dropped (group_unlock). */
    while (b->notices) {
        struct sq_notice *n = b->notices;
        b->notices = n->next;
        if (rc < 0) {
            n->rc = rc;
            idem__fmt(n->errmsg, sizeof(n->errmsg), "%s", msg);
        }
        n->next = g->notices;
        g->notices = n;
    }
    if (rc == 0 && b->wrote) {
        atomic_fetch_add(&g->st->durable_commits, 1);
        atomic_fetch_add(&g->st->durable_commit_ns, (uint64_t)b->commit_ns);
    }
    if (b->refs == 0)
        free(b);
    g->wake_batch = 1;
}

/* Raises the shared mark `m` to `v` (never lowers it). */
static void mark_raise(_Atomic uint64_t *m, uint64_t v)
{
    uint64_t cur = atomic_load(m);

    while (cur < v && !atomic_compare_exchange_weak(m, &cur, v))
        ;
}

/*
 * Commits the open batch: the caller holds the writer (busy) and g->mu, dropped during COMMIT.
 * With the pipeline the batch then waits for the syncer; without, it is done.
 */
static void batch_commit_locked(struct sq_group *g)
{
    struct idem_conn *w = g->writer;
    struct sq_batch *b = batch_detach_locked(g);
    char msg[IDEM_ERRMSG_MAX] = "";
    uint64_t seq = 0;
    int64_t took;
    int rc;

    g->committing += g->marks != NULL;
    group_unlock(g);
    took = clock_mono_ns();
    if (g->marks)
        seq = atomic_fetch_add(&g->marks->started, 1) + 1;
    rc = idem__sq_run_simple(w, "COMMIT", "group commit");
    if (rc == 0 && g->marks)
        mark_raise(&g->marks->committed, seq);
    took = clock_mono_ns() - took;
    if (rc < 0) {
        idem__fmt(msg, sizeof(msg), "%s", w->errmsg);
        /* A writer left inside a transaction it cannot end is closed, not reused. */
        if (!sqlite3_get_autocommit(w->db) &&
            (idem__sq_run_simple(w, "ROLLBACK", "rollback failed group commit") < 0 ||
             !sqlite3_get_autocommit(w->db)))
            w->broken = 1;
    }
    pthread_mutex_lock(&g->mu);
    b->commit_ns = took;
    if (!g->marks) {
        batch_finish_locked(g, b, rc, msg);
        return;
    }
    /* (a failed one too: its riders may have read batches that are not durable yet) */
    b->rc = rc;
    idem__fmt(b->errmsg, sizeof(b->errmsg), "%s", msg);
    b->sync_next = NULL;
    *g->sync_tail = b;
    g->sync_tail = &b->sync_next;
    g->committing--;
    if (!g->syncing)
        g->wake_syncer = 1;
}

/* Stops the store for good after a failed fsync (g->mu held). */
static void store_stop_locked(struct sq_group *g, const char *msg)
{
    if (atomic_load(&g->stopped))
        return;
    idem__fmt(g->stop_msg, sizeof(g->stop_msg),
              "sqlite: the store stopped: %s; nothing written since the last good fsync can be "
              "vouched for, so the process must restart (the store does not retry an fsync)",
              msg);
    atomic_store(&g->stopped, 1);
    g->wake_durable = 1;
}

/*
 * Makes g->wal_fd the file that is named -wal now (g->wal_mu held).  Every connection of the
 * store keeps the WAL (SQLITE_FCNTL_PERSIST_WAL, sqlite_conn.c), but a connection of another
 * program on the file may not: when the last connection to the file closes, SQLite checkpoints
 * the WAL into the database file and deletes it, and the next one makes a new WAL -- a new inode,
 * which an fsync through the old descriptor would never reach.  So before each fsync the
 * descriptor's inode is compared with the name's (a deleted file's inode is never reused while
 * the descriptor holds it), and when they differ the new WAL is opened and, once, fsync'd with
 * the database file (what the checkpoint copied there; SQLite syncs it too, unless that program
 * ran with synchronous=OFF) and the directory (the new WAL's name).  A WAL replaced between this
 * check and the fsync that follows held only commits that its checkpoint copied into the
 * database file.  Returns 0, or -1 with why in `msg`.
 */
static int wal_follow(struct sq_group *g, char *msg, size_t msglen)
{
    const char *path = g->st->target;
    char name[4096];
    struct stat held, now;
    int fd, db;

    idem__fmt(name, sizeof name, "%s-wal", path);
    if (!g->wal_known) { /* (a descriptor's inode never changes: read once, not every round) */
        if (fstat(g->wal_fd, &held) != 0)
            goto sys_fail;
        g->wal_dev = held.st_dev;
        g->wal_ino = held.st_ino;
        g->wal_known = 1;
    }
    if (stat(name, &now) == 0 && now.st_dev == g->wal_dev && now.st_ino == g->wal_ino)
        return 0;
    fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT)
        goto sys_fail;
    db = open(path, O_RDONLY | O_CLOEXEC);
    if (db < 0 || fsync(db) != 0) {
        idem__fmt(name, sizeof name, "%s", path);
        if (db >= 0)
            close(db);
        if (fd >= 0)
            close(fd);
        goto sys_fail;
    }
    close(db);
    if (fd >= 0) { /* (else none now: the next one is checked at the next fsync) */
        close(g->wal_fd);
        g->wal_fd = fd;
        g->wal_known = 0;
    }
    if (fsync(g->dir_fd) != 0 && errno != EINVAL) {
        dir_of(path, name, sizeof name);
        goto sys_fail;
    }
    return 0;
sys_fail:
    idem__fmt(msg, msglen, "fsync of %s failed: %s", name, strerror(errno));
    return -1;
}

/*
 * fdatasync()s the WAL through our own descriptor (g->mu not held), once it is the file named
 * -wal (wal_follow), and raises `durable` to the `committed` read before it began.  Returns 0, or
 * -1 with why in `msg`.
 */
static int wal_sync(struct sq_group *g, char *msg, size_t msglen)
{
    uint64_t upto = atomic_load(&g->marks->committed);
    int rc;

    pthread_mutex_lock(&g->wal_mu);
    rc = wal_follow(g, msg, msglen);
    if (rc == 0 && fdatasync(g->wal_fd) != 0) {
        idem__fmt(msg, msglen, "fsync of %s-wal failed: %s", g->st->target, strerror(errno));
        rc = -1;
    }
    pthread_mutex_unlock(&g->wal_mu);
    if (rc == 0)
        mark_raise(&g->marks->durable, upto);
    return rc;
}

/*
 * The syncer: while batches wait in its list, one fsync of the WAL for all of them, then their
 * members are told (threads woken; notices handed to the notifier, which runs their callbacks).
 * At the store's close it leaves once the list is empty and the notifier has run every callback.
 */
static void *syncer_main(void *arg)
{
    struct sq_group *g = arg;

    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->sync_head) {
            struct sq_batch *list = g->sync_head, *b, *next;
            char msg[IDEM_ERRMSG_MAX] = "";
            int64_t took = clock_mono_ns();
            int rc = 0;

            g->sync_head = NULL;
            g->sync_tail = &g->sync_head;
            g->syncing = 1;
            pthread_mutex_unlock(&g->mu);
            if (!atomic_load(&g->stopped) &&
                atomic_load(&g->marks->durable) < atomic_load(&g->marks->committed))
                rc = wal_sync(g, msg, sizeof(msg));
            took = clock_mono_ns() - took;
            pthread_mutex_lock(&g->mu);
            g->syncing = 0;
            if (rc < 0)
                store_stop_locked(g, msg);
            for (b = list; b; b = next) {
                next = b->sync_next;
                b->commit_ns += b == list ? took : 0; /* one fsync for the round */
                if (atomic_load(&g->stopped))
                    batch_finish_locked(g, b, IDEM_EUNAVAIL, g->stop_msg);
                else
                    batch_finish_locked(g, b, b->rc, b->errmsg);
            }
            if (g->durable_waiters > 0)
                g->wake_durable = 1;
            /*
             * The batch that filled during this fsync commits now, by this thread if the writer
             * is free (members that did not wait have no thread of their own to do it); its
             * fsync is the next round.
             */
            if (g->batch && !g->busy && g->waiting == 0 && disk_idle_locked(g)) {
                writer_take_locked(g);
                writer_release_locked(g);
            }
            group_unlock(g);
            pthread_mutex_lock(&g->mu);
            continue;
        }
        /* (a callback still to run, or running, may write: its batch needs a round) */
        if (g->syncer_stop && !g->committing && !g->told_head && !g->notifying)
            break;
        pthread_cond_wait(&g->syncer_cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/*
 * Tells one of the group's threads (the runner, the syncer) to leave once its work is done, wakes
 * it and joins it, if it was started.
 */
static void group_thread_stop(struct sq_group *g, int *stop, const int *started, int *wake,
                              pthread_t *thread)
{
    int was;

    pthread_mutex_lock(&g->mu);
    *stop = 1;
    was = *started;
    *wake = was;
    group_unlock(g);
    if (was)
        pthread_join(*thread, NULL);
}

static void syncer_stop(struct sq_group *g)
{
    group_thread_stop(g, &g->syncer_stop, &g->syncer_started, &g->wake_syncer, &g->syncer);
}

/*
 * The notifier: runs the callbacks of the members that did not wait, once their batch ended.
 *
 * Why a thread of their own.  A callback may use libidem like any other thread -- orderd's ends
 * its call, and ending a call whose record is durable but unfinished releases it, a blocking
 * write that waits for a round of the syncer.  Run on the syncer, that write would wait for the
 * thread it runs on; run by the writer's holder, for the writer it holds.  Nothing of the store
 * waits for this thread: it holds no lock and no writer while a callback runs, and is told only
 * through its queue.  So a callback that blocks delays the callbacks queued behind it, and never
 * the store.  The answer a callback gives was made durable by the fsync of the syncer's round
 * that ended its batch, before its notice was queued here.
 */
static void *notifier_main(void *arg)
{
    struct sq_group *g = arg;

    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->told_head) {
            struct sq_notice *n = g->told_head, *next;

            g->told_head = NULL;
            g->told_tail = &g->told_head;
            g->notifying = 1;
            pthread_mutex_unlock(&g->mu);
            for (; n; n = next) {
                next = n->next;
                if (n->rc == 0) /* a whole transaction of its member's, durable */
                    atomic_fetch_add(&g->st->write_commits, 1);
                n->done(n->arg, n->rc, n->rc < 0 ? n->errmsg : NULL); /* (then gone) */
            }
            pthread_mutex_lock(&g->mu);
            g->notifying = 0;
            if (g->syncer_stop) /* it may be waiting for the callbacks to end */
                g->wake_syncer = 1;
            group_unlock(g);
            pthread_mutex_lock(&g->mu);
            continue;
        }
        if (g->notifier_stop)
            break;
        pthread_cond_wait(&g->notifier_cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Starts the notifier if it is not running (g->mu held): 0, or IDEM_ENOMEM with why in `err`. */
static int notifier_start_locked(struct sq_group *g, char *err, size_t errlen)
{
    if (g->notifier_started)
        return 0;
    if (pthread_create(&g->notifier, NULL, notifier_main, g) != 0) {
        idem__fmt(err, errlen, "%s", "sqlite: cannot start the store's notifier thread");
        return IDEM_ENOMEM;
    }
    g->notifier_started = 1;
    return 0;
}

static void notifier_stop(struct sq_group *g)
{
    group_thread_stop(g, &g->notifier_stop, &g->notifier_started, &g->wake_notifier, &g->notifier);
}

/*
 * Waits until every commit a caller may have seen is durable (g->mu held): until `durable`
 * reaches `seen`, the `started` read after the caller's reads.  While this process has a commit
 * on its way to the syncer, its round will do; otherwise the commit is another process's (or of
 * one that died before its fsync) and this thread fsyncs the WAL itself -- which covers every
 * commit it could have seen, whatever the marks say.  Returns 0, or IDEM_EUNAVAIL (the store
 * stopped) with why in `err`.
 */
static int durable_wait_locked(struct sq_group *g, uint64_t seen, char *err, size_t errlen)
{
    for (;;) {
        if (atomic_load(&g->stopped)) {
            idem__fmt(err, errlen, "%s", g->stop_msg);
            return IDEM_EUNAVAIL;
        }
        if (atomic_load(&g->marks->durable) >= seen)
            return 0;
        if (group_flush_locked(g)) /* (the wake-up of the syncer, perhaps) */
            continue;
        /* (the syncer, running jobs with the writer after its round, cannot wait for itself) */
        if ((g->committing || g->sync_head || g->syncing) &&
            !(g->syncer_started && pthread_equal(pthread_self(), g->syncer))) {
            g->durable_waiters++;
            pthread_cond_wait(&g->durable_cv, &g->mu);
            g->durable_waiters--;
            continue;
        }
        char msg[IDEM_ERRMSG_MAX] = "";
        pthread_mutex_unlock(&g->mu);
        int rc = wal_sync(g, msg, sizeof(msg));
        pthread_mutex_lock(&g->mu);
        if (rc < 0)
            store_stop_locked(g, msg);
        else
            return 0;
    }
}

int idem__sq_read_gate(struct idem_conn *c)
{
    struct sq_group *g;
    uint64_t seen;
    int rc;

    if (!c->st || !(g = c->st->backend) || !g->marks)
        return 0;
    if (atomic_load(&g->stopped)) {
        /* Whatever it read: a stopped store vouches for nothing until it is opened again. */
        idem__fmt(c->errmsg, sizeof(c->errmsg), "%s", g->stop_msg);
        return IDEM_EUNAVAIL;
    }
    if (c->writer)
        return 0; /* (what the writer reads is told with its batch, once durable) */
    if (sqlite3_get_autocommit(c->db)) {
        seen = atomic_load(&g->marks->started);
    } else {
        /*
         * Inside a read transaction every statement reads the snapshot its first read of the
         * database took: the `started` read once that snapshot exists covers every commit in it
         * (each raised `started` before its COMMIT made its frames visible), and later statements
         * see nothing newer.  So each statement is gated -- an answer may be given from its rows
         * before the transaction ends, and a rollback's word is lost (idem_tx_rollback) -- and a
         * later one waits for nothing the first did not.
         */
        if (!c->snap_marked && sqlite3_txn_state(c->db, "main") != SQLITE_TXN_NONE) {
            c->snap_seen = atomic_load(&g->marks->started);
            c->snap_marked = 1;
        }
        if (!c->snap_marked)
            return 0; /* (nothing of the database read yet) */
        seen = c->snap_seen;
    }
    if (atomic_load(&g->marks->durable) >= seen && !atomic_load(&g->stopped))
        return 0;
    pthread_mutex_lock(&g->mu);
    rc = durable_wait_locked(g, seen, c->errmsg, sizeof(c->errmsg));
    group_unlock(g);
    return rc;
}

/*
 * Opens the pipeline of a store whose first connection just opened: maps the shared marks, opens
 * our descriptors on the -wal file and its directory, fsyncs them, and marks every commit made
 * before as durable.  A store that is not a plain file has none (each COMMIT stays FULL).
 */
int idem__sq_pipeline_open(struct idem_store *st, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    const char *path = st->target;
    char name[4096];
    struct flock lk;
    struct sq_marks *m;
    uint64_t upto;
    int fd, alone;

    if (st->opts.sync == IDEM_SYNC_NORMAL)
        return 0;
    if (path[0] == ':' || strncmp(path, "file:", 5) == 0 || strlen(path) + 10 > sizeof name)
        return 0;
    idem__fmt(name, sizeof name, "%s-idemsync", path);
    fd = open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        goto sys_fail;
    g->marks_fd = fd;
    /*
     * An open file description's lock: write-locking succeeds only if no other open store holds
     * it, and then no other process can be mid-commit -- marks left by one that died are reset.
     */
    memset(&lk, 0, sizeof lk);
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    lk.l_len = 1;
    alone = fcntl(fd, F_OFD_SETLK, &lk) == 0;
    if (ftruncate(fd, sizeof(*m)) != 0 && errno != EINVAL)
        goto sys_fail;
    m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        goto sys_fail;
    g->marks = m;
    idem__fmt(name, sizeof name, "%s-wal", path);
    g->wal_fd = open(name, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
    if (g->wal_fd < 0)
        goto sys_fail;
    dir_of(path, name, sizeof name);
    g->dir_fd = open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (g->dir_fd < 0)
        goto sys_fail;
    upto = atomic_load(&m->committed);
    idem__fmt(name, sizeof name, "%s-wal", path);
    if (fdatasync(g->wal_fd) != 0 || (fsync(g->dir_fd) != 0 && errno != EINVAL))
        goto sys_fail;
    if (alone) {
        /*
         * Nobody else is mid-commit: the three marks become one, the largest (the file is never
         * fsync'd, so after a power cut it may hold anything, even `durable` above `started`).
         */
        uint64_t top = atomic_load(&m->started);
        if (atomic_load(&m->committed) > top)
            top = atomic_load(&m->committed);
        if (atomic_load(&m->durable) > top)
            top = atomic_load(&m->durable);
        atomic_store(&m->started, top);
        atomic_store(&m->committed, top);
        atomic_store(&m->durable, top);
    } else {
        mark_raise(&m->durable, upto);
    }
    lk.l_type = F_RDLCK;
    if (fcntl(fd, alone ? F_OFD_SETLK : F_OFD_SETLKW, &lk) != 0)
        goto sys_fail;
    if (pthread_create(&g->syncer, NULL, syncer_main, g) != 0) {
        idem__fmt(err, errlen, "%s", "sqlite: cannot start the store's syncer thread");
        goto fail;
    }
    g->syncer_started = 1;
    return 0;
sys_fail:
    idem__fmt(err, errlen, "sqlite: cannot set up the commit pipeline at %s: %s", name,
              strerror(errno));
fail:
    if (g->marks)
        munmap(g->marks, sizeof(*g->marks));
    g->marks = NULL; /* (the descriptors are closed with the group) */
    return IDEM_EUNAVAIL;
}

/* With the writer held (g->busy) and g->mu not held: opens the writer and the batch if need be. */
static int writer_ready(struct sq_group *g, char *err, size_t errlen)
{
    int rc = 0;

    if (atomic_load(&g->stopped)) {
        idem__fmt(err, errlen, "%s", g->stop_msg);
        return IDEM_EUNAVAIL;
    }
    if (!g->writer) {
        /*
         * A connection like the pool's, without their migration: the store's first connection
         * applied libidem's schema before the store opened, so before anyone could write.
         */
        rc = idem__sq_conn_open(g->st, &g->writer, err, errlen);
        if (rc == 0)
            g->writer->writer = 1;
        /* The syncer makes its commits durable: COMMIT only writes the WAL. */
        if (rc == 0 && g->marks)
            rc = idem__sq_run_simple(g->writer, "PRAGMA synchronous=NORMAL", "configure writer");
    }
    if (rc == 0 && !g->batch) {
        struct sq_batch *b = calloc(1, sizeof(*b));
        if (!b)
            rc = IDEM_ENOMEM;
        else if ((rc = idem__sq_run_simple(g->writer, "BEGIN IMMEDIATE", "begin group")) < 0)
            free(b);
        else {
            pthread_mutex_lock(&g->mu);
            g->batch = b;
            g->members = 0;
            g->opened_ms = clock_mono_ms();
            group_unlock(g);
        }
    }
    if (rc < 0 && g->writer && err[0] == '\0')
        idem__fmt(err, errlen, "%s", g->writer->errmsg);
    return rc;
}

/*
 * Whether the member that just ran on the writer `w` left a foreign key unresolved: one declared
 * DEFERRABLE INITIALLY DEFERRED (or any, under PRAGMA defer_foreign_keys) is checked only by the
 * COMMIT, which would then fail for the whole batch -- every member's writes lost for one
 * member's.  Every member is checked before its writes join the batch, so the batch holds none
 * and a count above zero is this member's own: it fails as the COMMIT of a transaction of its own
 * would, and its savepoint is rolled back like that of a statement that failed.  Returns 0, or
 * IDEM_ESTORE with why in `msg`.
 */
static int member_keys_check(struct idem_conn *w, char *msg, size_t msglen)
{
    int now = 0, high = 0;

    if (sqlite3_db_status(w->db, SQLITE_DBSTATUS_DEFERRED_FKS, &now, &high, 0) != SQLITE_OK ||
        now == 0)
        return 0;
    idem__fmt(msg, msglen, "%s", "sqlite: commit: FOREIGN KEY constraint failed");
    return IDEM_ESTORE;
}

/*
 * Runs one job in its own savepoint of the open batch on the writer `w` (held, g->mu not held);
 * a one-statement job (IDEM__TX_ONE_STATEMENT) without one: there is nothing of it to undo.
 */
static void job_run(struct idem_conn *w, struct sq_job *j)
{
    const int own_savepoint = !(j->flags & IDEM__TX_ONE_STATEMENT);
    int rc;

    if (sqlite3_get_autocommit(w->db)) {
        idem__fmt(j->errmsg, sizeof(j->errmsg), "%s",
                  "sqlite: the shared write transaction was rolled back");
        j->rc = IDEM_EUNAVAIL;
        return;
    }
    rc = own_savepoint ? idem__sq_run_simple(w, "SAVEPOINT idem_tx", "begin") : 0;
    if (rc < 0) { /* nothing of it was written */
        idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", w->errmsg);
        j->rc = rc;
        return;
    }
    rc = j->fn(w, j->arg);
    if (rc == 0 && sqlite3_get_autocommit(w->db)) {
        idem__fmt(j->errmsg, sizeof(j->errmsg),
                  "sqlite: the shared write transaction was rolled back: %s", w->errmsg);
        rc = IDEM_EUNAVAIL;
    } else if (rc == 0 && (rc = member_keys_check(w, j->errmsg, sizeof(j->errmsg))) < 0) {
        if (!own_savepoint) /* (nothing undoes it: the batch must not commit) */
            w->broken = 1;
    } else if (rc == 0 && own_savepoint) {
        rc = idem__sq_run_simple(w, "RELEASE idem_tx", "commit");
    }
    if (rc < 0 && j->errmsg[0] == '\0')
        idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", w->errmsg);
    /* Its writes must not commit with the batch: a writer that cannot undo them is broken. */
    if (rc != 0 && own_savepoint && !sqlite3_get_autocommit(w->db) &&
        idem__sq_run_simple(w, "ROLLBACK TO idem_tx; RELEASE idem_tx", "rollback") < 0)
        w->broken = 1;
    j->rc = rc;
}

/*
 * Runs the rerunnable jobs of `list` (IDEM__TX_RERUNNABLE) on the writer `w` (held, g->mu not
 * held) back to back under one savepoint of them all, not one each: a savepoint costs two
 * statements and a copy of every page its job touches that the batch had changed already.  One
 * that fails rolls that savepoint back -- every job's writes -- and the others run again without
 * it, so a failure costs its neighbours a second run, never their writes.  A job that asks for
 * a rollback (IDEM__TX_DISCARD) wrote nothing, by the flag's contract: it is not undone.
 */
static void jobs_run_rerunnable(struct idem_conn *w, struct sq_job *list)
{
    for (;;) {
        struct sq_job *failed = NULL, *j;
        int rc = 0, begun = 0;

        if (sqlite3_get_autocommit(w->db)) {
            rc = IDEM_EUNAVAIL;
            idem__fmt(w->errmsg, sizeof(w->errmsg), "%s",
                      "sqlite: the shared write transaction was rolled back");
        } else {
            rc = idem__sq_run_simple(w, "SAVEPOINT idem_jobs", "begin");
            begun = rc == 0;
        }
        for (j = list; j && rc == 0; j = j->next) {
            if (!(j->flags & IDEM__TX_RERUNNABLE) || j->failed)
                continue;
            j->errmsg[0] = '\0';
            j->rc = j->fn(w, j->arg);
            if (j->rc == 0 && sqlite3_get_autocommit(w->db)) {
                idem__fmt(j->errmsg, sizeof(j->errmsg),
                          "sqlite: the shared write transaction was rolled back: %s", w->errmsg);
                j->rc = IDEM_EUNAVAIL;
            } else if (j->rc == 0) {
                j->rc = member_keys_check(w, j->errmsg, sizeof(j->errmsg));
            }
            if (j->rc < 0) {
                if (j->errmsg[0] == '\0')
                    idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", w->errmsg);
                failed = j;
                break;
            }
        }
        if (rc == 0 && !failed && idem__sq_run_simple(w, "RELEASE idem_jobs", "commit") == 0)
            return;
        /* Undo every job's writes; the failed one is done, the others run again. */
        if (begun && !sqlite3_get_autocommit(w->db) &&
            idem__sq_run_simple(w, "ROLLBACK TO idem_jobs; RELEASE idem_jobs", "rollback") < 0)
            w->broken = 1;
        if (failed && !w->broken && !sqlite3_get_autocommit(w->db)) {
            failed->failed = 1;
            continue;
        }
        /* Nothing can run on this writer now: every job not yet failed fails with it. */
        for (j = list; j; j = j->next) {
            if (!(j->flags & IDEM__TX_RERUNNABLE) || j->failed)
                continue;
            if (j != failed) {
                j->rc = IDEM_EUNAVAIL;
                idem__fmt(j->errmsg, sizeof(j->errmsg), "%s", w->errmsg);
            }
        }
        return;
    }
}

/*
 * Runs the queued jobs on the writer, which this thread holds (g->mu held, dropped while they
 * run), into the open batch (begun if need be): a job that kept its writes joins the batch, one
 * that rolled back or failed is done.
 */
static void jobs_run_locked(struct sq_group *g)
{
    while (g->jobs && g->members < GROUP_MEMBERS_MAX) {
        struct sq_job *list = g->jobs, *j, *next;
        char err[IDEM_ERRMSG_MAX] = "";
        int rc;

        for (j = list; j; j = j->next)
            j->state = JOB_RUNNING;
        g->jobs = NULL;
        g->jobs_tail = &g->jobs;
        group_unlock(g);
        rc = writer_ready(g, err, sizeof(err));
        if (rc == 0 && !g->writer->broken)
            jobs_run_rerunnable(g->writer, list);
        for (j = list; j; j = j->next) {
            if (j->flags & IDEM__TX_RERUNNABLE && rc == 0 && !g->writer->broken) {
                continue; /* (run above) */
            } else if (rc == 0 && !g->writer->broken) {
                job_run(g->writer, j);
            } else {
                j->rc = rc < 0 ? rc : IDEM_EUNAVAIL;
                idem__fmt(j->errmsg, sizeof(j->errmsg), "%s",
                          rc < 0 ? err : "sqlite: the writer connection broke");
            }
        }
        pthread_mutex_lock(&g->mu);
        for (j = list; j; j = next) {
            next = j->next;
            if (j->notice && j->rc == 0) {
                /* Its notice is told with the batch's; the job itself is spent. */
                j->notice->next = g->batch->notices;
                g->batch->notices = j->notice;
                g->members++;
            } else if (j->notice && g->marks && g->batch) {
                /* Rolled back or failed: told with the batch, its own outcome kept. */
                struct sq_notice *n = j->notice;
                n->rc = j->rc;
                idem__fmt(n->errmsg, sizeof(n->errmsg), "%s", j->errmsg);
                n->next = g->batch->notices;
                g->batch->notices = n;
            } else if (j->notice) {
                job_notify_locked(g, j);
            } else if (j->rc == 0 || (g->marks && g->batch)) {
                j->state = JOB_IN_BATCH; /* (rolled back or failed: a rider, its rc kept) */
                j->batch = g->batch;
                j->next = g->batch->jobs;
                g->batch->jobs = j;
                g->batch->refs++;
                g->members += j->rc == 0;
            } else {
                j->state = JOB_DONE;
                job_wake_locked(g, j);
            }
        }
        if (rc < 0 || g->writer->broken)
            break; /* the queue waits for the next holder (writer_free_locked wakes it) */
    }
}

/* Wakes a member of the open batch (g->mu held): it may have to commit the batch itself. */
static void batch_poke_locked(struct sq_group *g)
{
    if (g->batch->jobs)
        job_wake_locked(g, g->batch->jobs);
    if (g->batch->notices && g->runner_started)
        g->wake_runner = 1;
    g->wake_batch = 1;
}

/*
 * Marks the writer free (g->mu held) and wakes whoever is to take it next: a caller queued for
 * it, whoever runs the queue (queue_wake_locked), or if nobody queues a member of the open batch
 * (to commit it).
 */
static void writer_free_locked(struct sq_group *g)
{
    g->busy = 0;
    atomic_fetch_add(&g->st->writer_busy_ns, (uint64_t)(clock_mono_ns() - g->busy_since_ns));
    if (g->waiting > 0)
        g->wake_writer = 1;
    queue_wake_locked(g);
    if (g->waiting == 0 && g->batch && disk_idle_locked(g))
        batch_poke_locked(g);
}

/*
 * Gives the writer up (g->mu held), after running the queued jobs into the batch: a batch that
 * SQLite rolled back by itself fails as a whole; otherwise the batch is committed if the queue
 * drained or it grew full or old.
 */
static void writer_release_locked(struct sq_group *g)
{
    struct idem_conn *w = g->writer;

    if (!w->broken && g->batch && !sqlite3_get_autocommit(w->db))
        jobs_run_locked(g);
    /*
     * A broken writer's batch is never committed (it may hold writes that were to be undone): it
     * fails below, before the writer is closed.
     */
    if (!w->broken && g->batch && sqlite3_get_autocommit(w->db)) {
        char msg[IDEM_ERRMSG_MAX];
        idem__fmt(msg, sizeof(msg), "sqlite: the shared write transaction was rolled back: %s",
                  w->errmsg);
        batch_finish_locked(g, batch_detach_locked(g), IDEM_EUNAVAIL, msg);
    } else if (!w->broken && g->batch &&
               ((g->waiting == 0 && disk_idle_locked(g)) || g->members >= GROUP_MEMBERS_MAX ||
                clock_mono_ms() - g->opened_ms >= GROUP_AGE_MAX_MS)) {
        batch_commit_locked(g);
    }
    if (w->broken) {
        if (g->batch)
            batch_finish_locked(g, batch_detach_locked(g), IDEM_EUNAVAIL,
                                "sqlite: the writer connection broke");
        if (!sqlite3_get_autocommit(w->db))
            idem__sq_run_simple(w, "ROLLBACK", "rollback");
        idem__sq_conn_close(w);
        g->writer = NULL;
    }
    writer_free_locked(g);
}

/*
 * A turn with the free writer (g->mu held): runs the queued jobs when `run_queue`, then gives the
 * writer up, which commits the open batch unless someone queues for the writer.
 */
static void writer_turn_locked(struct sq_group *g, int run_queue)
{
    writer_take_locked(g);
    if (run_queue)
        jobs_run_locked(g);
    if (g->writer)
        writer_release_locked(g);
    else
        writer_free_locked(g);
}

int idem__sq_write_begin(struct idem_store *st, struct idem_conn **out, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct timespec deadline;
    int rc = 0;

    *out = NULL;
    deadline = idem__deadline_ms(st->opts.busy_timeout_ms);
    pthread_mutex_lock(&g->mu);
    g->waiting++;
    while (g->busy) {
        if (pthread_cond_timedwait(&g->writer_cv, &g->mu, &deadline) == ETIMEDOUT && g->busy) {
            g->waiting--;
            if (g->batch) /* a member may have to commit its batch */
                batch_poke_locked(g);
            group_unlock(g);
            idem__fmt(err, errlen, "sqlite: the writer was not free within %d ms",
                      st->opts.busy_timeout_ms);
            return IDEM_EUNAVAIL;
        }
    }
    g->waiting--;
    writer_take_locked(g);
    group_unlock(g);

    /* The writer is ours: nobody else touches g->writer until we release it. */
    err[0] = '\0';
    rc = writer_ready(g, err, errlen);
    if (rc == 0)
        rc = idem__sq_run_simple(g->writer, "SAVEPOINT idem_tx", "begin");
    if (rc < 0) {
        if (g->writer && err[0] == '\0')
            idem__fmt(err, errlen, "%s", g->writer->errmsg);
        pthread_mutex_lock(&g->mu);
        if (g->writer)
            writer_release_locked(g);
        else
            writer_free_locked(g);
        group_unlock(g);
        return rc;
    }
    *out = g->writer;
    return 0;
}

/* Waits until batch `b` is done (g->mu held), committing it itself if nobody else would. */
static void batch_wait_locked(struct sq_group *g, struct sq_batch *b)
{
    while (!b->done) {
        if (!g->busy && g->waiting == 0 && g->batch == b && disk_idle_locked(g)) {
            /*
             * The writer is free and nobody queues for it: commit our batch ourselves (with the
             * jobs that queued meanwhile).
             */
            writer_take_locked(g);
            writer_release_locked(g);
            continue;
        }
        if (group_flush_locked(g))
            continue;
        pthread_cond_wait(&g->batch_cv, &g->mu);
    }
}

_Atomic int idem__sq_fail_next_rollback;

int idem__sq_write_rollback(struct idem_store *st, struct idem_conn *c)
{
    struct sq_group *g = st->backend;
    struct sq_batch *b;
    int rc, vouched = 0;

    if (!sqlite3_get_autocommit(c->db)) {
        rc = atomic_exchange(&idem__sq_fail_next_rollback, 0)
                 ? IDEM_ESTORE
                 : idem__sq_run_simple(c, "ROLLBACK TO idem_tx; RELEASE idem_tx", "rollback");
        /*
         * The caller's writes may still be in the shared batch: it must not commit with the next
         * member.  A broken writer fails its batch, rolls it back and is closed (below).
         */
        if (rc < 0)
            c->broken = 1;
    }
    pthread_mutex_lock(&g->mu);
    /*
     * What the caller read may come from the batch's earlier members, or from batches not yet
     * durable: it returns once they are (with the pipeline), as a member would.
     */
    b = g->marks && g->members > 0 ? g->batch : NULL;
    if (b)
        b->refs++;
    writer_release_locked(g);
    if (b) {
        /* Its batch durable: what the caller read of its earlier members is too. */
        batch_wait_locked(g, b);
        vouched = b->rc;
        if (--b->refs == 0)
            free(b);
    } else if (g->marks) {
        char err[IDEM_ERRMSG_MAX];
        vouched = durable_wait_locked(g, atomic_load(&g->marks->started), err, sizeof(err));
    }
    if (atomic_load(&g->stopped))
        vouched = IDEM_EUNAVAIL;
    group_unlock(g);
    return vouched < 0 ? IDEM_EUNAVAIL : 0;
}

/*
 * Releases the caller's savepoint into the open batch (both commits begin so).  On failure the
 * savepoint is rolled back, the writer given up, and the reason is in `err`.
 */
static int release_into_batch(struct idem_store *st, struct idem_conn *c, char *err, size_t errlen)
{
    int rc;

    if (sqlite3_get_autocommit(c->db)) {
        idem__fmt(err, errlen, "sqlite: the shared write transaction was rolled back: %s",
                  c->errmsg);
        idem__sq_write_rollback(st, c);
        return IDEM_EUNAVAIL;
    }
    rc = member_keys_check(c, err, errlen);
    if (rc < 0) {
        idem__sq_write_rollback(st, c);
        return rc;
    }
    rc = idem__sq_run_simple(c, "RELEASE idem_tx", "commit");
    if (rc < 0) {
        idem__fmt(err, errlen, "%s", c->errmsg);
        idem__sq_write_rollback(st, c);
    }
    return rc;
}

int idem__sq_write_commit(struct idem_store *st, struct idem_conn *c, char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct sq_batch *b;
    int rc;

    rc = release_into_batch(st, c, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&g->mu);
    b = g->batch;
    b->refs++;
    g->members++;
    writer_release_locked(g);
    batch_wait_locked(g, b);
    rc = b->rc;
    if (rc < 0)
        idem__fmt(err, errlen, "%s", b->errmsg);
    if (--b->refs == 0)
        free(b);
    group_unlock(g);
    return rc;
}

/*
 * write_commit without the wait: the savepoint goes into the batch, and `done` is told when the
 * batch ends -- by this thread if the batch commits now (nobody queues for the writer), else by
 * whoever commits it.  The caller is then free to take other work into the next batch.
 */
int idem__sq_write_commit_async(struct idem_store *st, struct idem_conn *c,
                                struct idem__job_slot *slot, idem__commit_done done, void *arg,
                                char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct sq_notice *n = &((struct sq_async *)slot->mem)->notice;
    int rc;

    memset(n, 0, sizeof(*n));
    n->done = done;
    n->arg = arg;
    pthread_mutex_lock(&g->mu);
    rc = notifier_start_locked(g, err, errlen);
    pthread_mutex_unlock(&g->mu);
    if (rc < 0) {
        idem__sq_write_rollback(st, c);
        return rc;
    }
    rc = release_into_batch(st, c, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&g->mu);
    n->next = g->batch->notices;
    g->batch->notices = n;
    g->members++;
    writer_release_locked(g);
    group_unlock(g);
    return 0;
}

/* Takes a leaving job off the wake-up list (g->mu held): nothing is owed to it any more. */
static void job_forget_locked(struct sq_group *g, struct sq_job *j)
{
    if (!j->wake_listed)
        return;
    for (struct sq_job **pp = &g->wake_jobs; *pp; pp = &(*pp)->wake_next) {
        if (*pp == j) {
            *pp = j->wake_next;
            break;
        }
    }
    j->wake_listed = 0;
    atomic_fetch_sub(&j->wakes_unsent, 1);
}

/* The job's last step, g->mu dropped: waits out a wake-up still being sent to its `cv`. */
static void job_end(struct sq_job *j)
{
    while (atomic_load(&j->wakes_unsent) > 0)
        sched_yield();
    pthread_cond_destroy(&j->cv);
}

int idem__sq_write_run(struct idem_store *st, idem__tx_fn fn, void *arg, unsigned flags, char *err,
                       size_t errlen)
{
    struct sq_group *g = st->backend;
    struct timespec deadline = idem__deadline_ms(st->opts.busy_timeout_ms);
    struct sq_job j;
    int rc;

    memset(&j, 0, sizeof(j));
    j.fn = fn;
    j.arg = arg;
    j.flags = flags;
    if (pthread_cond_init(&j.cv, NULL) != 0) {
        idem__fmt(err, errlen, "%s", idem_strerror(IDEM_ENOMEM));
        return IDEM_ENOMEM;
    }
    pthread_mutex_lock(&g->mu);
    *g->jobs_tail = &j;
    g->jobs_tail = &j.next;
    while (j.state != JOB_DONE && !(j.state == JOB_IN_BATCH && j.batch->done)) {
        if (!g->busy && (j.state == JOB_QUEUED || (j.state == JOB_IN_BATCH && g->waiting == 0 &&
                                                   g->batch == j.batch && disk_idle_locked(g)))) {
            /* The writer is free: run the queue (ours in it), or commit our batch, ourselves. */
            writer_turn_locked(g, j.state == JOB_QUEUED);
            continue;
        }
        if (group_flush_locked(g))
            continue;
        if (j.state != JOB_QUEUED) {
            pthread_cond_wait(&j.cv, &g->mu);
        } else if (pthread_cond_timedwait(&j.cv, &g->mu, &deadline) == ETIMEDOUT &&
                   j.state == JOB_QUEUED) {
            struct sq_job **pp = &g->jobs;
            while (*pp != &j)
                pp = &(*pp)->next;
            *pp = j.next;
            if (g->jobs_tail == &j.next)
                g->jobs_tail = pp;
            if (!g->busy) /* we may have been woken to run the queue: pass it on */
                queue_wake_locked(g);
            job_forget_locked(g, &j);
            group_unlock(g);
            job_end(&j);
            idem__fmt(err, errlen, "sqlite: the writer was not free within %d ms",
                      st->opts.busy_timeout_ms);
            return IDEM_EUNAVAIL;
        }
    }
    if (j.state == JOB_IN_BATCH) {
        /* (its own outcome, unless the batch failed: a rider's rc is its own) */
        rc = j.batch->rc < 0 ? j.batch->rc : j.rc;
        if (j.batch->rc < 0)
            idem__fmt(err, errlen, "%s", j.batch->errmsg);
        else if (rc < 0)
            idem__fmt(err, errlen, "%s", j.errmsg);
        if (--j.batch->refs == 0)
            free(j.batch);
    } else {
        rc = j.rc;
        if (rc < 0)
            idem__fmt(err, errlen, "%s", j.errmsg);
    }
    job_forget_locked(g, &j);
    group_unlock(g);
    job_end(&j);
    if (rc == 0)
        atomic_fetch_add(&st->write_commits, 1);
    return rc;
}

/*
 * The runner (write_run_async): while the writer is free, runs the queued jobs and commits the
 * open batch its notices wait for; otherwise sleeps until queue_wake_locked() or
 * batch_poke_locked() call it.  At the store's close it leaves once nothing is queued.
 */
static void *runner_main(void *arg)
{
    struct sq_group *g = arg;

    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (!g->busy && (g->jobs || (g->batch && g->batch->notices && g->waiting == 0 &&
                                     disk_idle_locked(g)))) {
            writer_turn_locked(g, g->jobs != NULL);
            continue;
        }
        if (group_flush_locked(g))
            continue;
        if (g->runner_stop && !g->jobs) /* (a holder may be about to hand the queue over) */
            break;
        pthread_cond_wait(&g->runner_cv, &g->mu);
    }
    group_unlock(g);
    return NULL;
}

static void runner_stop(struct sq_group *g)
{
    group_thread_stop(g, &g->runner_stop, &g->runner_started, &g->wake_runner, &g->runner);
}

/*
 * write_run without a waiting thread: the job is queued with a notice, both in the caller's
 * `slot`, and `done` is told by whoever ran it (the writer's holder, or the runner) once its batch
 * ends, or at once when it rolled back or failed -- never by this thread.
 */
int idem__sq_write_run_async(struct idem_store *st, struct idem__job_slot *slot, idem__tx_fn fn,
                             void *arg, unsigned flags, idem__commit_done done, void *done_arg,
                             char *err, size_t errlen)
{
    struct sq_group *g = st->backend;
    struct sq_async *a = (struct sq_async *)slot->mem;
    struct sq_job *j = &a->job;
    struct sq_notice *n = &a->notice;

    memset(j, 0, sizeof(*j));
    memset(n, 0, sizeof(*n));
    j->fn = fn;
    j->arg = arg;
    j->flags = flags;
    j->notice = n;
    n->done = done;
    n->arg = done_arg;
    pthread_mutex_lock(&g->mu);
    if (g->runner_stop) {
        pthread_mutex_unlock(&g->mu);
        idem__fmt(err, errlen, "%s", "sqlite: the store is closing");
        return IDEM_EUNAVAIL;
    }
    if (!g->runner_started) {
        if (pthread_create(&g->runner, NULL, runner_main, g) != 0) {
            pthread_mutex_unlock(&g->mu);
            idem__fmt(err, errlen, "%s", "sqlite: cannot start the store's runner thread");
            return IDEM_ENOMEM;
        }
        g->runner_started = 1;
    }
    if (notifier_start_locked(g, err, errlen) < 0) {
        pthread_mutex_unlock(&g->mu);
        return IDEM_ENOMEM;
    }
    *g->jobs_tail = j;
    g->jobs_tail = &j->next;
    if (!g->busy && g->jobs == j) /* else the writer's holder, or whoever is woken, runs it */
        g->wake_runner = 1;
    group_unlock(g);
    return 0;
}
