/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_power_loss.c - simulated power loss under the SQLite store, the way SQLite's own crash
 * tests do it: what a power cut keeps of a file is what was last fsync'd, plus any subset of the
 * sectors written since (torn and reordered writes).  Every answer the store let a caller give
 * must survive it.
 *
 * The disk model.  This program defines fsync() and fdatasync() itself, so libsqlite3 and
 * libidem call these (an executable's definition interposes on the C library's): for a file in
 * the test directory, a sync copies the file as it is to FILE.durable -- what a power cut keeps
 * from then on -- instead of asking the kernel.  A cut (power_cut) rebuilds each file from its
 * durable copy, taking each 512-byte sector written since with probability one half, and removes
 * the -shm file (memory, not disk) and any file never synced.
 *
 * Each round forks workers that use the store through libidem's public API and report, on a pipe,
 * every answer they could give: "A key" once idem_call_complete() returned (durable, libidem
 * says), or when idem_call_begin() replayed a record.  The parent kills them with SIGKILL at a
 * random moment, cuts the power, opens the store itself and checks that every reported key
 * replays its own response and has exactly one business row.  Two kinds of rounds:
 *
 *   writers   4 threads claim, write a business row and complete, over a key space with repeats
 *             (keys ending in an even digit first go whole to the store's writer, one-phase:
 *             idem_call_run_async);
 *   reader    a writer process dies inside the fsync of a commit (its frames written, none
 *             durable), then a second process opens the store and replays what it finds -- the
 *             case where a store that did not make the WAL durable at open answered from a
 *             commit that the power cut then took back (store_sqlite.c, sync_existing_files);
 *   live      a process that has the store open replays while a writer process commits, and
 *             both die at once: it reads commits the writer's syncer may not have made durable
 *             yet (sqlite_commit.c: a read is gated on the shared marks).
 *
 * First, once: a failed fsync of the WAL stops the store (the commit it was for, every later write
 * and every read fail until the store is opened again; an fsync is never retried).
 *
 *   test_power_loss [--rounds N] [--seed S]     (make test runs a short one; make power-loss
 * longer)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <idem/idem.h>

#include "clock.h" /* common/clock.h */

#define SECTOR 512
#define KEYS_PER_ROUND 120
#define WRITER_THREADS 4

static char dir[PATH_MAX];         /* files under it are modelled */
static char db[PATH_MAX + 16];     /* DIR/p.db */
static int die_in_wal_sync;        /* a worker that dies inside a WAL sync, one time in this many */
static _Atomic int wal_sync_fails; /* every fsync of a -wal file fails with EIO */
static pthread_mutex_t model_mu = PTHREAD_MUTEX_INITIALIZER;
static int ack_fd = -1; /* a worker's end of the report pipe */

static const struct idem_migration schema[] = {
    {1, "effects", "CREATE TABLE effects (k TEXT PRIMARY KEY)", "CREATE TABLE effects (k TEXT)"},
};
static const struct idem_operation op = {.name = "power.create"};
/* The same operation one-phase, run whole on the store's writer (orderd's event loops). */
static const struct idem_operation op_on_writer = {.name = "power.create", .one_phase = 1};

static void die(const char *what)
{
    fprintf(stderr, "test_power_loss: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* ---- the disk model ------------------------------------------------------------------------ */

/* Whether `fd` is a file of the test directory; its path into `path`. */
static int modelled(int fd, char *path, size_t n)
{
    char link[64];
    ssize_t len;

    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    len = readlink(link, path, n - 1);
    if (len < 0)
        return 0;
    path[len] = '\0';
    return strncmp(path, dir, strlen(dir)) == 0 && path[strlen(dir)] == '/';
}

/* Reads all of `path` into a new buffer (*len bytes); NULL when it does not exist. */
static unsigned char *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    unsigned char *buf = NULL;
    size_t cap = 0;
    ssize_t r;

    *len = 0;
    if (fd < 0)
        return NULL;
    for (;;) {
        if (*len == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            buf = realloc(buf, cap);
            if (!buf)
                die("realloc");
        }
        r = read(fd, buf + *len, cap - *len);
        if (r < 0)
            die("read");
        if (r == 0)
            break;
        *len += (size_t)r;
    }
    close(fd);
    return buf ? buf : malloc(1);
}

static void spill(const char *path, const unsigned char *buf, size_t len)
{
    char tmp[PATH_MAX + 64];
    int fd;

    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        die(tmp);
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w <= 0)
            die("write");
        off += (size_t)w;
    }
    close(fd);
    if (rename(tmp, path) != 0)
        die("rename");
}

/* A sync of `path`: all of it is what a power cut keeps now. */
static void keep_durable(const char *path)
{
    char durable[PATH_MAX + 16];
    unsigned char *buf;
    size_t len;

    char lock[PATH_MAX + 16];
    int lfd;

    snprintf(durable, sizeof durable, "%s.durable", path);
    snprintf(lock, sizeof lock, "%s/model.lock", dir);
    /* Processes sync the same file too (a live reader): one copy at a time, across them. */
    pthread_mutex_lock(&model_mu);
    lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0 || flock(lfd, LOCK_EX) != 0)
        die(lock);
    buf = slurp(path, &len);
    if (buf) {
        spill(durable, buf, len);
        free(buf);
    }
    close(lfd);
    pthread_mutex_unlock(&model_mu);
}

/* Whether `path` (open as `fd`) is longer than its durable copy: frames a cut would lose. */
static int grew_since_sync(int fd, const char *path)
{
    char durable[PATH_MAX + 16];
    struct stat now, kept;

    snprintf(durable, sizeof durable, "%s.durable", path);
    if (fstat(fd, &now) != 0)
        return 0;
    return stat(durable, &kept) != 0 ? now.st_size > 0 : now.st_size > kept.st_size;
}

static int modelled_sync(int fd, const char *name)
{
    char path[PATH_MAX];
    void *sym = dlsym(RTLD_NEXT, name);
    int (*real)(int);
    size_t n;

    memcpy(&real, &sym, sizeof real); /* POSIX: dlsym's answer is the function's address */
    if (!modelled(fd, path, sizeof path))
        return real(fd);
    n = strlen(path);
    /* A worker killed between writing a commit's WAL frames and making them durable. */
    if (wal_sync_fails && n > 4 && strcmp(path + n - 4, "-wal") == 0) {
        errno = EIO; /* what the disk kept of it is unknown */
        return -1;
    }
    if (die_in_wal_sync > 0 && n > 4 && strcmp(path + n - 4, "-wal") == 0 &&
        grew_since_sync(fd, path) && rand() % die_in_wal_sync == 0)
        _exit(9);
    keep_durable(path);
    return 0;
}

int fsync(int fd)
{
    return modelled_sync(fd, "fsync");
}

int fdatasync(int fd)
{
    return modelled_sync(fd, "fdatasync");
}

/*
 * The power goes: `path` becomes its durable copy with each sector written since (different from
 * the copy) kept with probability one half; a file never synced is gone.  The result is durable.
 */
static void power_cut_file(const char *path)
{
    char durable[PATH_MAX + 48];
    unsigned char *now, *kept, *out;
    size_t now_len, kept_len, out_len;

    snprintf(durable, sizeof durable, "%s.durable", path);
    now = slurp(path, &now_len);
    kept = slurp(durable, &kept_len);
    if (!kept) {
        unlink(path);
        free(now);
        return;
    }
    out_len = kept_len;
    for (size_t s = 0; now && s < now_len; s += SECTOR)
        if (s + SECTOR > kept_len && rand() % 2 == 0 && s + SECTOR > out_len)
            out_len = s + SECTOR < now_len ? s + SECTOR : now_len;
    out = calloc(out_len + 1, 1);
    if (!out)
        die("calloc");
    memcpy(out, kept, kept_len < out_len ? kept_len : out_len);
    for (size_t s = 0; now && s < now_len && s < out_len; s += SECTOR) {
        size_t n = s + SECTOR <= now_len ? SECTOR : now_len - s;
        if (n > out_len - s)
            n = out_len - s;
        if ((s >= kept_len || memcmp(now + s, kept + s, n) != 0) && rand() % 2 == 0)
            memcpy(out + s, now + s, n);
    }
    spill(path, out, out_len);
    spill(durable, out, out_len);
    free(now);
    free(kept);
    free(out);
}

static void power_cut(void)
{
    char path[PATH_MAX + 32];

    power_cut_file(db);
    snprintf(path, sizeof path, "%s-wal", db);
    power_cut_file(path);
    snprintf(path, sizeof path, "%s-shm", db);
    unlink(path);
}

/* ---- the workers ------------------------------------------------------------------------------
 */

static void report(char kind, const char *key)
{
    char line[128];
    int n = snprintf(line, sizeof line, "%c %s\n", kind, key);
    if (write(ack_fd, line, (size_t)n) != n)
        _exit(3);
}

static void expected_body(const char *key, char *out, size_t n)
{
    snprintf(out, n, "{\"key\":\"%s\"}", key);
}

/* A request handed to the store's writer (idem_call_run_async), and its end. */
struct on_writer {
    const char *key;
    const char *body;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ended;
    int rc;
    struct idem_call *call;
};

static int run_on_writer(struct idem_call *call, void *arg)
{
    struct on_writer *r = arg;
    const char *params[] = {r->key};
    int rc = idem_tx_exec(idem_call_tx(call), "INSERT INTO effects VALUES ($1)", 1, params, NULL);

    return rc < 0 ? rc : idem_call_stage(call, 201, NULL, 0, r->body, strlen(r->body));
}

static void ran_on_writer(struct idem_call *call, int rc, void *arg)
{
    struct on_writer *r = arg;

    pthread_mutex_lock(&r->mu);
    r->call = call;
    r->rc = rc;
    r->ended = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/*
 * `key` run whole on the store's writer: 1 when it was (reported once durable), 0 when the
 * caller must ask idem_call_begin() (the key has a record, or it cannot be done so).
 */
static int one_on_writer(struct idem_engine *eng, const char *key, const char *body,
                         const unsigned char fp[IDEM_FP_LEN])
{
    struct on_writer r = {key, body, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0,
                          0,   NULL};
    int rc = idem_call_run_async(eng, &op_on_writer, "tester", key, fp, run_on_writer,
                                 ran_on_writer, &r);

    if (rc != 1)
        return 0;
    pthread_mutex_lock(&r.mu);
    while (!r.ended)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    if (r.rc == 0)
        report('A', key);
    idem_call_end(r.call);
    return r.rc != IDEM_CALL_ASK_BEGIN;
}

/*
 * One request for `key`: executed or replayed (reported), or anything else (not).  Every other
 * key goes to the store's writer whole first.
 */
static void one(struct idem_engine *eng, const char *key, int may_write)
{
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome outcome;
    char body[128];
    const char *stored;
    size_t len = 0;

    expected_body(key, body, sizeof body);
    if (idem_fingerprint("POST", "/power", NULL, 0, body, strlen(body), fp, NULL) != 0)
        goto out;
    if (may_write && key[strlen(key) - 1] % 2 == 0 && one_on_writer(eng, key, body, fp))
        goto out;
    if (idem_call_begin(eng, &op, "tester", key, fp, &call, &outcome) != 0)
        goto out;
    if (outcome == IDEM_OUTCOME_EXECUTE && may_write) {
        const char *params[] = {key};
        if (idem_tx_exec(idem_call_tx(call), "INSERT INTO effects VALUES ($1)", 1, params, NULL) ==
                0 &&
            idem_call_complete(call, 201, NULL, 0, body, strlen(body)) == 0)
            report('A', key);
    } else if (outcome == IDEM_OUTCOME_REPLAY) {
        stored = idem_call_response_body(call, &len);
        report(len == strlen(body) && memcmp(stored, body, len) == 0 ? 'A' : 'X', key);
    }
out:
    idem_call_end(call);
}

struct writer {
    struct idem_engine *eng;
    int round;
    unsigned seed;
};

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    char key[64];

    for (;;) {
        snprintf(key, sizeof key, "r%d-k%d", w->round, (int)(rand_r(&w->seed) % KEYS_PER_ROUND));
        one(w->eng, key, 1);
    }
    return NULL;
}

static struct idem_engine *open_engine(struct idem_store **st)
{
    struct idem_engine *eng = NULL;
    char *err = NULL;
    char uri[PATH_MAX + 32];

    snprintf(uri, sizeof uri, "sqlite:%s", db);
    if (idem_store_open(uri, NULL, st, &err) != 0 ||
        idem_store_migrate(*st, "power", schema, 1, NULL, &err) != 0 ||
        idem_engine_new(*st, NULL, &eng) != 0) {
        fprintf(stderr, "test_power_loss: cannot open %s: %s\n", uri, err ? err : "?");
        _exit(4);
    }
    return eng;
}

/* A process of writer threads that runs until it is killed (or dies in a WAL sync). */
static void writers_process(int round, unsigned seed)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st);
    struct writer w[WRITER_THREADS];
    pthread_t t[WRITER_THREADS];

    srand(seed);
    for (int i = 0; i < WRITER_THREADS; i++) {
        w[i] = (struct writer){eng, round, seed * 31u + (unsigned)i};
        pthread_create(&t[i], NULL, writer_main, &w[i]);
    }
    for (;;)
        pause();
}

/*
 * A process that replays what it finds of the round's keys, then exits.  It writes nothing, as a
 * server just restarted answers the retries of its last requests first: a write of its own would
 * make the WAL durable, with the dead writer's frames in it, before it answered.
 */
static void reader_process(int round)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st);
    struct idem_record_info info;
    char key[64];

    for (int k = 0; k < KEYS_PER_ROUND; k++) {
        snprintf(key, sizeof key, "r%d-k%d", round, k);
        if (idem_record_inspect(eng, "tester", op.name, key, &info) == 0 && info.found &&
            info.completed)
            one(eng, key, 0); /* a replay */
    }
    _exit(0);
}

/* Forks `fn`'s process with the report pipe; returns its pid. */
static pid_t spawn(int pipe_w, void (*fn)(int, unsigned), int round, unsigned seed)
{
    pid_t pid = fork();

    if (pid < 0)
        die("fork");
    if (pid == 0) {
        ack_fd = pipe_w;
        fn(round, seed);
        _exit(0);
    }
    return pid;
}

static void reader_entry(int round, unsigned seed)
{
    (void)seed;
    reader_process(round);
}

/*
 * A process that opened the store before the writers began and replays the round's keys while
 * they write, until it is killed: what it reads are another process's commits, perhaps not yet
 * durable, so before it answers it must make them durable itself (store_sqlite.c's read gate and
 * sqlite_commit.c's riders).
 */
static void live_reader_entry(int round, unsigned seed)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st);
    char key[64];

    for (unsigned k = seed;; k++) {
        snprintf(key, sizeof key, "r%d-k%d", round, (int)(k % KEYS_PER_ROUND));
        one(eng, key, 0); /* a replay, when the writers completed it */
    }
}

/* ---- the checks ------------------------------------------------------------------------------ */

struct acks {
    char (*keys)[64];
    size_t n, cap;
    int corrupt;
};

/* Whether `key` is among the answered ones (a round answers each of its keys many times). */
static int already(const struct acks *a, const char *key)
{
    for (size_t i = a->n; i-- > 0;)
        if (strcmp(a->keys[i], key) == 0)
            return 1;
    return 0;
}

static void read_acks(int fd, struct acks *a)
{
    static char buf[1 << 16];
    static size_t have;
    ssize_t r;

    while ((r = read(fd, buf + have, sizeof buf - have - 1)) > 0) {
        char *line = buf, *nl;
        have += (size_t)r;
        buf[have] = '\0';
        while ((nl = memchr(line, '\n', have - (size_t)(line - buf))) != NULL) {
            *nl = '\0';
            if (line[0] == 'X') {
                fprintf(stderr, "test_power_loss: %s replayed another response\n", line + 2);
                a->corrupt++;
            } else if (line[0] == 'A' && !already(a, line + 2)) {
                if (a->n == a->cap) {
                    a->cap = a->cap ? a->cap * 2 : 1024;
                    a->keys = realloc(a->keys, a->cap * sizeof *a->keys);
                    if (!a->keys)
                        die("realloc");
                }
                snprintf(a->keys[a->n++], sizeof a->keys[0], "%s", line + 2);
            }
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
    }
}

/* Every answered key replays its own response and has one business row; the failures found. */
static int check(const struct acks *a)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st);
    int bad = 0;

    for (size_t i = 0; i < a->n; i++) {
        const char *key = a->keys[i];
        unsigned char fp[IDEM_FP_LEN];
        struct idem_call *call = NULL;
        enum idem_outcome outcome = IDEM_OUTCOME_NONE;
        struct idem_tx *tx = NULL;
        struct idem_rows *rows = NULL;
        const char *params[] = {key};
        char body[128];
        const char *stored;
        size_t len = 0;

        expected_body(key, body, sizeof body);
        idem_fingerprint("POST", "/power", NULL, 0, body, strlen(body), fp, NULL);
        if (idem_call_begin(eng, &op, "tester", key, fp, &call, &outcome) != 0 ||
            outcome != IDEM_OUTCOME_REPLAY) {
            fprintf(stderr,
                    "test_power_loss: %s was answered, and after the power cut its record "
                    "is gone (outcome %d)\n",
                    key, (int)outcome);
            bad++;
        } else {
            stored = idem_call_response_body(call, &len);
            if (len != strlen(body) || memcmp(stored, body, len) != 0) {
                fprintf(stderr, "test_power_loss: %s replays another response\n", key);
                bad++;
            }
        }
        idem_call_end(call);
        if (idem_tx_begin(st, 0, &tx) != 0 ||
            idem_tx_exec(tx, "SELECT count(*) FROM effects WHERE k = $1", 1, params, &rows) != 0 ||
            strcmp(idem_rows_get(rows, 0, 0), "1") != 0) {
            fprintf(stderr, "test_power_loss: %s has %s business rows\n", key,
                    rows ? idem_rows_get(rows, 0, 0) : "no answer about its");
            bad++;
        }
        idem_rows_free(rows);
        idem_tx_rollback(tx);
    }
    /* Nothing committed without its business row (a record outlived what it answered for). */
    {
        struct idem_tx *tx = NULL;
        struct idem_rows *rows = NULL;
        if (idem_tx_begin(st, 0, &tx) != 0 ||
            idem_tx_exec(tx,
                         "SELECT count(*) FROM idem_records r WHERE r.status = 1 AND NOT EXISTS "
                         "(SELECT 1 FROM effects e WHERE e.k = r.idem_key)",
                         0, NULL, &rows) != 0 ||
            strcmp(idem_rows_get(rows, 0, 0), "0") != 0) {
            fprintf(stderr, "test_power_loss: %s completed records without their business row\n",
                    rows ? idem_rows_get(rows, 0, 0) : "(the query failed:)");
            bad++;
        }
        idem_rows_free(rows);
        idem_tx_rollback(tx);
    }
    idem_engine_free(eng);
    idem_store_close(st);
    return bad;
}

static void dead(pid_t pid)
{
    int status;

    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
}

/*
 * Lets `pid` run for `ms` (or, with `until_exit`, until it exits, at most `ms`), reading its
 * reports as they come so that it never blocks on a full pipe.  Woken by a report or by the
 * process's exit (its pidfd), never by a pause of its own.
 */
static void run_for(pid_t pid, int fd, struct acks *a, long ms, int until_exit)
{
    const int64_t deadline = clock_mono_ms() + ms;
    int pidfd = until_exit ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
    struct pollfd fds[2] = {{.fd = fd, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};

    if (until_exit && pidfd < 0)
        die("pidfd_open");
    for (int64_t left = ms; left > 0; left = deadline - clock_mono_ms()) {
        if (poll(fds, until_exit ? 2 : 1, (int)left) < 0 && errno != EINTR)
            die("poll");
        read_acks(fd, a);
        if (until_exit && (fds[1].revents & POLLIN)) {
            read_acks(fd, a); /* what it wrote before it exited */
            break;
        }
    }
    if (pidfd >= 0)
        close(pidfd);
}

/* One write transaction of one business row; its commit's return code. */
static int write_one(struct idem_store *st, const char *k)
{
    struct idem_tx *tx = NULL;
    const char *params[] = {k};
    int rc = idem_tx_begin(st, 1, &tx);

    if (rc != 0)
        return rc;
    rc = idem_tx_exec(tx, "INSERT INTO effects VALUES ($1)", 1, params, NULL);
    if (rc != 0) {
        idem_tx_rollback(tx);
        return rc;
    }
    return idem_tx_commit(tx);
}

/*
 * A failed fsync of the WAL stops the store: the commit it was for fails, and so does every later
 * write and read -- the kernel may have dropped the pages it could not write, so no later fsync
 * could vouch for them -- until the store is opened again.  Returns the failures found.
 */
static int failed_fsync_stops_the_store(void)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st);
    struct idem_tx *tx = NULL;
    int bad = 0, rc;

    if ((rc = write_one(st, "before")) != 0) {
        fprintf(stderr, "test_power_loss: a write before the failure: %d\n", rc);
        bad++;
    }
    wal_sync_fails = 1;
    if ((rc = write_one(st, "failed")) != IDEM_EUNAVAIL) {
        fprintf(stderr, "test_power_loss: a write whose fsync failed returned %d\n", rc);
        bad++;
    }
    wal_sync_fails = 0;
    if ((rc = write_one(st, "after")) != IDEM_EUNAVAIL) {
        fprintf(stderr,
                "test_power_loss: a write after a failed fsync returned %d, not "
                "IDEM_EUNAVAIL (the store must stop, never retry an fsync)\n",
                rc);
        bad++;
    }
    rc = idem_tx_begin(st, 0, &tx);
    if (rc == 0 && (rc = idem_tx_exec(tx, "SELECT count(*) FROM effects", 0, NULL, NULL)) == 0)
        rc = idem_tx_commit(tx);
    else
        idem_tx_rollback(tx);
    if (rc != IDEM_EUNAVAIL) {
        fprintf(stderr, "test_power_loss: a read after a failed fsync returned %d\n", rc);
        bad++;
    }
    idem_engine_free(eng);
    idem_store_close(st);
    /* A new process (here: the store opened again) fsyncs at open and goes on. */
    eng = open_engine(&st);
    if ((rc = write_one(st, "reopened")) != 0) {
        fprintf(stderr, "test_power_loss: a write after reopening: %d\n", rc);
        bad++;
    }
    idem_engine_free(eng);
    idem_store_close(st);
    return bad;
}

int main(int argc, char **argv)
{
    int rounds = 12, bad = 0;
    unsigned seed = (unsigned)time(NULL);
    size_t answered = 0, readers_answered = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = (unsigned)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: test_power_loss [--rounds N] [--seed S]\n");
            return 2;
        }
    }
    if (rounds < 1) {
        fprintf(stderr, "test_power_loss: --rounds must be at least 1\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s/idem-power-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        die("mkdtemp");
    srand(seed);
    printf("test_power_loss: %d rounds, seed %u, in %s\n", rounds, seed, dir);
    fflush(stdout);
    snprintf(db, sizeof db, "%s/stop.db", dir);
    bad += failed_fsync_stops_the_store();
    snprintf(db, sizeof db, "%s/p.db", dir);

    for (int round = 0; round < rounds; round++) {
        struct acks a = {0};
        int p[2];
        int reader = round % 3 == 1, live = round % 3 == 2;
        pid_t pid, rpid;

        if (pipe2(p, O_CLOEXEC) != 0)
            die("pipe");
        fcntl(p[0], F_SETFL, O_NONBLOCK);
        if (reader) {
            /* A writer that dies inside some WAL sync, then a process that replays. */
            die_in_wal_sync = 2 + rand() % 6;
            pid = spawn(p[1], writers_process, round, (unsigned)rand());
            die_in_wal_sync = 0;
            run_for(pid, p[0], &a, 3000, 1);
            dead(pid);
            pid = spawn(p[1], reader_entry, round, 0);
            run_for(pid, p[0], &a, 60000, 1);
            dead(pid);
        } else if (live) {
            rpid = spawn(p[1], live_reader_entry, round, (unsigned)rand());
            pid = spawn(p[1], writers_process, round, (unsigned)rand());
            run_for(pid, p[0], &a, 50 + rand() % 400, 0);
            kill(rpid, SIGKILL); /* both at once, then reaped */
            dead(pid);
            dead(rpid);
        } else {
            pid = spawn(p[1], writers_process, round, (unsigned)rand());
            run_for(pid, p[0], &a, 20 + rand() % 300, 0);
            dead(pid);
        }
        close(p[1]);
        read_acks(p[0], &a);
        close(p[0]);
        power_cut();
        bad += a.corrupt + check(&a);
        answered += a.n;
        if (reader || live)
            readers_answered += a.n;
        free(a.keys);
    }
    printf("test_power_loss: %zu keys answered (%zu in rounds with a reading process), "
           "%d lost or wrong after %d power cuts\n",
           answered, readers_answered, bad, rounds);
    if (bad == 0) {
        char cmd[PATH_MAX + 32];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "test_power_loss: could not remove %s\n", dir);
    } else {
        fprintf(stderr, "test_power_loss: FAILED (seed %u; files kept in %s)\n", seed, dir);
    }
    return bad == 0 && answered > 0 ? 0 : 1;
}
