/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_power_loss.c - simulated power loss under the SQLite store, the way SQLite's own crash
 * tests do it: what a power cut keeps of a file is what was last fsync'd, plus any subset of the
 * sectors written since (torn and reordered writes), and of a directory the names it held at its
 * last fsync.  Every answer the store let a caller give must survive it, and no key may run twice.
 *
 * The disk model.  This program defines fsync() and fdatasync() itself, so libsqlite3 and
 * libidem call these (an executable's definition interposes on the C library's): for a file in
 * the test directory, a sync copies the file as it is to FILE.durable -- what a power cut keeps
 * from then on -- instead of asking the kernel; a WAL's sync takes 2 ms, as a disk's flush does,
 * and covers what the file held when it began; a sync of the directory lists the names it holds
 * and their inodes (dir.names).  A cut (power_cut) rebuilds each file from its durable copy,
 * taking each 512-byte sector written since with probability one half, and removes the -shm file
 * (memory, not disk), any file never synced and any file whose name the directory's last sync did
 * not hold for that very file (a WAL deleted at a close and made again since is gone).
 *
 * Each round forks processes that use one store through libidem's public API and report, on a
 * pipe, what a client or the outside world could have seen: an answer ("A key status body", once
 * the call that stored it returned or told its callback, or a replay), an external effect ("E key
 * nonce": a claim's upstream request, sent once the claim was durable), a business row read by a
 * GET ("R key nonce").  Every execution writes a nonce of its own into its response body and its
 * business row, so a second execution of a key shows as another body or a second row.  The
 * parent kills them with SIGKILL at a random moment while they work on fresh keys, cuts the
 * power, opens the store itself and checks that every answer replays with its status and body,
 * that every answered execution has exactly its one business row (the table has no key
 * constraint: every extra execution is counted), that no key was executed twice, that every
 * effect's claim and every row read is still there.  Each writer process runs the blocking calls
 * on threads (idem_call_begin, _complete, _commit_async) and the asynchronous ones on a libuv
 * event loop as orderd and idem-gateway do (idem_call_run_async; idem_call_begin_async at a claim
 * point, then the "upstream", then idem_call_complete_async), each callback handing its call back
 * to the loop.  Three kinds of rounds:
 *
 *   writers   two writer processes on the store, on fresh keys and retries of recent ones, both
 *             killed at once;
 *   reader    the writers die inside the fsync of a commit (its frames written, none durable),
 *             then a process opens the store and reads what it finds with reads only (no replay
 *             cache, so idem_call_begin reads first; a read transaction for the business rows) --
 *             a store that did not make the WAL durable at open answers from commits that the
 *             power cut then takes back;
 *   live      a reading process opened before the writers reads their newest keys while they
 *             commit; then the writers freeze (SIGSTOP) and it reads on, and all die at once: it
 *             reads commits the writers' syncers had not made durable yet (sqlite_commit.c: a
 *             read is gated on the shared marks).
 * Every fourth round starts a new database file (its creation must be durable too).
 *
 * First, once: a failed fsync of the WAL stops the store (the commit it was for, every later write
 * and every read fail until the store is opened again; an fsync is never retried).
 *
 *   test_power_loss [--rounds N] [--seed S] [--fail-fast] [--cuts-only]
 * (make test runs a short one, make power-loss a longer one; --fail-fast ends the run with the
 * first round that fails and --cuts-only leaves out the failed fsync, as tests/mutate/mutate.py
 * runs it to show what the power cuts alone catch)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include <idem/idem.h>

#include "clock.h" /* common/clock.h */

#define SECTOR 512
#define WRITER_PROCS 2
#define WRITER_THREADS 3
#define LOOP_INFLIGHT 8
#define MAX_PROCS (WRITER_PROCS + 1)
#define ACK_SLOTS (1 << 17) /* answers of one round, at most */
#define READ_MAX 600        /* keys of each kind a reader process reads after the crash */
#define WAL_SYNC_NS 2000000 /* what a sync of a WAL takes, as a disk's flush would */

static char dir[PATH_MAX];         /* files under it are modelled */
static char db[PATH_MAX + 16];     /* DIR/pN.db */
static int die_in_wal_sync;        /* a worker that dies inside a WAL sync, one time in this many */
static _Atomic int wal_sync_fails; /* every fsync of a -wal file fails with EIO */
static pthread_mutex_t model_mu = PTHREAD_MUTEX_INITIALIZER;
static int ack_fd = -1; /* a worker's end of the report pipe */

/*
 * The kinds of request, each an operation of its own (a key's letter says which) and each run
 * by one path first; a retry of any kind goes the blocking way (idem_call_begin).
 */
enum kind {
    K_TWO_PHASE, /* 't': idem_call_begin, the row, idem_call_complete (a worker thread) */
    K_DEFERRED,  /* 'd': one-phase, idem_call_begin, the row, stage, idem_call_commit_async */
    K_RUN,       /* 'r': one-phase, idem_call_run_async from the loop */
    K_CLAIM,     /* 'c': claim point, idem_call_begin_async, upstream, idem_call_complete_async */
    KINDS
};
static const char kind_letter[KINDS] = {'t', 'd', 'r', 'c'};
static const struct idem_operation ops[KINDS] = {
    {.name = "power.two"},
    {.name = "power.deferred", .one_phase = 1},
    {.name = "power.run", .one_phase = 1},
    {.name = "power.claim", .claim_point = "forwarded"},
};

/* The round's key counters, shared by the processes (mapped before they fork). */
struct shared {
    _Atomic uint64_t next[KINDS];
};
static struct shared *sh;

static const struct idem_migration schema[] = {
    {1, "effects",
     "CREATE TABLE effects (k TEXT NOT NULL, nonce TEXT NOT NULL DEFAULT '');"
     " CREATE INDEX effects_k ON effects (k)",
     "CREATE TABLE effects (k TEXT NOT NULL, nonce TEXT NOT NULL DEFAULT '')"},
};

static void die(const char *what)
{
    fprintf(stderr, "test_power_loss: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* ---- the disk model ------------------------------------------------------------------------ */

/*
 * Whether `fd` is the test directory (2), a file of it (1) or neither (0); its path into `path`.
 */
static int modelled(int fd, char *path, size_t n)
{
    char link[64];
    ssize_t len;
    size_t dl = strlen(dir);

    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    len = readlink(link, path, n - 1);
    if (len < 0)
        return 0;
    path[len] = '\0';
    if (strcmp(path, dir) == 0)
        return 2;
    return strncmp(path, dir, dl) == 0 && path[dl] == '/';
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

/*
 * Reads all of the file open as `fd` into a new buffer (*len bytes), through that descriptor: a
 * descriptor of our own on a database file, once closed, would drop every POSIX lock this process
 * holds on it (SQLite's), and another process could then take a live journal for a hot one.
 */
static unsigned char *slurp_fd(int fd, size_t *len)
{
    struct stat sb;
    unsigned char *buf;
    size_t have = 0;

    *len = 0;
    if (fstat(fd, &sb) != 0)
        return NULL;
    buf = malloc((size_t)sb.st_size + 1);
    if (!buf)
        die("malloc");
    while (have < (size_t)sb.st_size) {
        ssize_t r = pread(fd, buf + have, (size_t)sb.st_size - have, (off_t)have);
        if (r < 0)
            die("pread");
        if (r == 0)
            break;
        have += (size_t)r;
    }
    *len = have;
    return buf;
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

/* Whether `name` is one of the model's own files, not the store's. */
static int model_file(const char *name)
{
    size_t n = strlen(name);

    return strcmp(name, "model.lock") == 0 || strcmp(name, "dir.names") == 0 ||
           strcmp(name, "model.seq") == 0 || (n > 8 && strcmp(name + n - 8, ".durable") == 0) ||
           (n > 12 && strcmp(name + n - 12, ".durable.seq") == 0) ||
           (n > 4 && strcmp(name + n - 4, ".tmp") == 0);
}

/* Takes the model's lock: processes sync the same files (a live reader), one copy at a time. */
static int model_lock(void)
{
    char lock[PATH_MAX + 16];
    int lfd;

    snprintf(lock, sizeof lock, "%s/model.lock", dir);
    pthread_mutex_lock(&model_mu);
    lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0 || flock(lfd, LOCK_EX) != 0)
        die(lock);
    return lfd;
}

static void model_unlock(int lfd)
{
    close(lfd);
    pthread_mutex_unlock(&model_mu);
}

/* A small counter kept in file `path` (the model's lock held): its value, and with `set` stored. */
static uint64_t counter_file(const char *path, uint64_t set)
{
    size_t len;
    unsigned char *buf = slurp(path, &len);
    uint64_t v = 0;
    char text[32];

    if (buf && len > 0 && len < sizeof text) {
        memcpy(text, buf, len);
        text[len] = '\0';
        v = strtoull(text, NULL, 10);
    }
    free(buf);
    if (set) {
        int n = snprintf(text, sizeof text, "%llu", (unsigned long long)set);
        spill(path, (const unsigned char *)text, (size_t)n);
    }
    return v;
}

/*
 * A sync of `path`: all of it as it is now is what a power cut keeps once the sync returns.  A
 * WAL's sync takes `flush_ns` first, as a disk's flush does: a process killed meanwhile made
 * nothing durable, and what was written in the meantime is not covered.  Syncs of several
 * processes end in any order; the copy a later-begun sync took is never replaced by an older one.
 */
static void keep_durable(const char *path, int fd, long flush_ns)
{
    char durable[PATH_MAX + 16], seq_path[PATH_MAX + 16], model_seq[PATH_MAX + 16];
    unsigned char *buf;
    uint64_t seq;
    size_t len;
    int lfd;

    snprintf(durable, sizeof durable, "%s.durable", path);
    snprintf(seq_path, sizeof seq_path, "%s.durable.seq", path);
    snprintf(model_seq, sizeof model_seq, "%s/model.seq", dir);
    lfd = model_lock();
    seq = counter_file(model_seq, 0) + 1;
    counter_file(model_seq, seq);
    buf = slurp_fd(fd, &len);
    model_unlock(lfd);
    if (flush_ns > 0) {
        struct timespec flush = {0, flush_ns};
        while (nanosleep(&flush, &flush) != 0 && errno == EINTR)
            ;
    }
    lfd = model_lock();
    if (buf && counter_file(seq_path, 0) < seq) {
        spill(durable, buf, len);
        counter_file(seq_path, seq);
    }
    free(buf);
    model_unlock(lfd);
}

/* A sync of the directory: the names it holds now are what a power cut keeps. */
static void keep_names(void)
{
    char path[PATH_MAX + 16];
    char names[1 << 14];
    size_t len = 0;
    struct dirent *e;
    DIR *d;
    int lfd;

    lfd = model_lock();
    d = opendir(dir);
    if (!d)
        die(dir);
    while ((e = readdir(d)) != NULL) {
        char line[320];
        int n = snprintf(line, sizeof line, "%s %llu\n", e->d_name, (unsigned long long)e->d_ino);
        if (e->d_name[0] == '.' || model_file(e->d_name) || n < 0 || len + (size_t)n > sizeof names)
            continue;
        memcpy(names + len, line, (size_t)n);
        len += (size_t)n;
    }
    closedir(d);
    snprintf(path, sizeof path, "%s/dir.names", dir);
    spill(path, (const unsigned char *)names, len);
    model_unlock(lfd);
}

/*
 * Whether the directory's last sync held the name of `path`, for the file it names now (a file
 * deleted and made again since has a new inode: the name on the disk is still the old file's).
 */
static int name_durable(const char *path)
{
    char names_path[PATH_MAX + 16], want[320];
    const char *base = strrchr(path, '/') + 1;
    unsigned char *names;
    struct stat now;
    size_t len;
    int found = 0;

    if (stat(path, &now) != 0)
        return 0;
    snprintf(want, sizeof want, "%s %llu", base, (unsigned long long)now.st_ino);
    snprintf(names_path, sizeof names_path, "%s/dir.names", dir);
    names = slurp(names_path, &len);
    for (size_t at = 0, n = strlen(want); names && at < len && !found;) {
        const unsigned char *nl = memchr(names + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - names) : len;
        found = end - at == n && memcmp(names + at, want, n) == 0;
        at = end + 1;
    }
    free(names);
    return found;
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
    int what;
    size_t n;

    memcpy(&real, &sym, sizeof real); /* POSIX: dlsym's answer is the function's address */
    what = modelled(fd, path, sizeof path);
    if (what == 0)
        return real(fd);
    if (what == 2) {
        keep_names();
        return 0;
    }
    n = strlen(path);
    /* A worker killed between writing a commit's WAL frames and making them durable. */
    if (wal_sync_fails && n > 4 && strcmp(path + n - 4, "-wal") == 0) {
        errno = EIO; /* what the disk kept of it is unknown */
        return -1;
    }
    if (die_in_wal_sync > 0 && n > 4 && strcmp(path + n - 4, "-wal") == 0 &&
        grew_since_sync(fd, path) && rand() % die_in_wal_sync == 0)
        _exit(9);
    keep_durable(path, fd, n > 4 && strcmp(path + n - 4, "-wal") == 0 ? WAL_SYNC_NS : 0);
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
 * the copy) kept with probability one half; a file never synced, or whose name the directory
 * never made durable, is gone.  The result is durable.
 */
static void power_cut_file(const char *path)
{
    char durable[PATH_MAX + 48];
    unsigned char *now, *kept, *out;
    size_t now_len, kept_len, out_len;

    snprintf(durable, sizeof durable, "%s.durable", path);
    if (!name_durable(path)) {
        unlink(path);
        unlink(durable);
        return;
    }
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
    spill(durable, out, out_len); /* (its .seq stays: a later sync's copy is newer) */
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
    keep_names(); /* what is left is what the disk holds (the files rebuilt are new inodes) */
}

/* ---- the workers ------------------------------------------------------------------------------
 */

static void report_line(const char *line, size_t n)
{
    if (write(ack_fd, line, n) != (ssize_t)n) /* (a line is shorter than PIPE_BUF: one write) */
        _exit(3);
}

/* "A key status body": an answer a client got, executed or replayed. */
static void report_answer(const char *key, const struct idem_call *call)
{
    char line[512];
    size_t len = 0;
    const char *body = idem_call_response_body(call, &len);
    int n = snprintf(line, sizeof line, "A %s %d %.*s\n", key, idem_call_response_status(call),
                     (int)len, body ? body : "");

    if (n > 0 && (size_t)n < sizeof line)
        report_line(line, (size_t)n);
}

/* "E key nonce" (an upstream request sent) or "R key nonce" (a business row read). */
static void report_nonce(char what, const char *key, const char *nonce)
{
    char line[256];
    int n = snprintf(line, sizeof line, "%c %s %s\n", what, key, nonce);

    if (n > 0 && (size_t)n < sizeof line)
        report_line(line, (size_t)n);
}

static enum kind kind_of(const char *key)
{
    const char *dash = strchr(key, '-');

    for (int k = 0; dash && k < KINDS; k++)
        if (dash[1] == kind_letter[k])
            return (enum kind)k;
    return K_TWO_PHASE;
}

static void key_name(int round, enum kind k, uint64_t n, char *out, size_t len)
{
    snprintf(out, len, "r%d-%c%llu", round, kind_letter[k], (unsigned long long)n);
}

/* A fresh key of kind `k`, or now and then a retry of a recent one (perhaps still in flight). */
static void pick_key(int round, enum kind k, unsigned *seed, char *out, size_t len)
{
    uint64_t n = atomic_load(&sh->next[k]);

    if (n > 0 && rand_r(seed) % 4 == 0)
        n -= 1 + rand_r(seed) % (n < 8 ? n : 8);
    else
        n = atomic_fetch_add(&sh->next[k], 1);
    key_name(round, k, n, out, len);
}

/* What a client sends for `key` (the fingerprint's body): the same for every retry. */
static void request_fp(const char *key, unsigned char fp[IDEM_FP_LEN])
{
    char body[128];

    snprintf(body, sizeof body, "{\"key\":\"%s\"}", key);
    idem_fingerprint("POST", "/power", NULL, 0, body, strlen(body), fp, NULL);
}

/* A new nonce, this execution's alone; and the response body that carries it. */
static void new_nonce(char *out, size_t len)
{
    static _Atomic unsigned long seq;

    snprintf(out, len, "%ld.%lu", (long)getpid(), atomic_fetch_add(&seq, 1));
}

static void response_body(const char *key, const char *nonce, char *out, size_t len)
{
    snprintf(out, len, "{\"key\":\"%s\",\"nonce\":\"%s\"}", key, nonce);
}

static int status_of(enum kind k)
{
    return 200 + (int)k; /* the replay must carry it too */
}

/* The business row of one execution: no key constraint, so a second execution is a second row. */
static int write_effect(struct idem_call *call, const char *key, const char *nonce)
{
    const char *params[] = {key, nonce};

    return idem_tx_exec(idem_call_tx(call), "INSERT INTO effects (k, nonce) VALUES ($1, $2)", 2,
                        params, NULL);
}

/* ---- the event loop: the store's callbacks hand their calls back to it, as orderd's do ---- */

enum step { STEP_RUN, STEP_CLAIM, STEP_COMPLETE, STEP_DEFERRED };

struct req {
    struct req *next; /* in the loop's inbox */
    enum kind kind;
    enum step step;
    char key[64];
    char nonce[48];
    char body[192];
    struct idem_call *call;
    int rc;
    enum idem_outcome outcome;
    int slot; /* a loop's own request (refilled when done), or -1 (a worker's deferred commit) */
};

struct loop {
    uv_loop_t uv;
    uv_async_t wake;
    pthread_mutex_t mu;
    struct req *inbox;
    struct idem_engine *eng;
    int round;
    unsigned seed;
    struct req slots[LOOP_INFLIGHT];
};
static struct loop lp;

/* On the store's thread: hand the request back to the loop (neither blocking nor libidem). */
static void to_loop(struct req *r, struct idem_call *call, int rc, enum idem_outcome outcome)
{
    pthread_mutex_lock(&lp.mu);
    r->call = call;
    r->rc = rc;
    r->outcome = outcome;
    r->next = lp.inbox;
    lp.inbox = r;
    pthread_mutex_unlock(&lp.mu);
    uv_async_send(&lp.wake);
}

static void step_done(struct idem_call *call, int rc, void *arg)
{
    to_loop(arg, call, rc, IDEM_OUTCOME_NONE);
}

static void claim_begun(struct idem_call *call, int rc, enum idem_outcome outcome, void *arg)
{
    to_loop(arg, call, rc, outcome);
}

/* idem_call_run_async's phase, on the store's writer: it may run again, so all of it is redone. */
static int run_phase(struct idem_call *call, void *arg)
{
    struct req *r = arg;
    int rc;

    new_nonce(r->nonce, sizeof r->nonce);
    response_body(r->key, r->nonce, r->body, sizeof r->body);
    rc = write_effect(call, r->key, r->nonce);
    return rc < 0 ? rc : idem_call_stage(call, status_of(K_RUN), NULL, 0, r->body, strlen(r->body));
}

/* Starts the loop's request in `r` on a new key: a one-phase run or a claim, in turn. */
static void loop_start(struct req *r)
{
    for (int tries = 0; tries < 4; tries++) {
        unsigned char fp[IDEM_FP_LEN];
        int rc;

        r->kind = r->kind == K_RUN ? K_CLAIM : K_RUN;
        pick_key(lp.round, r->kind, &lp.seed, r->key, sizeof r->key);
        request_fp(r->key, fp);
        r->call = NULL;
        if (r->kind == K_RUN) {
            r->step = STEP_RUN;
            rc = idem_call_run_async(lp.eng, &ops[K_RUN], "tester", r->key, fp, run_phase,
                                     step_done, r);
        } else {
            r->step = STEP_CLAIM;
            rc = idem_call_begin_async(lp.eng, &ops[K_CLAIM], "tester", r->key, fp, claim_begun, r);
        }
        if (rc == 1)
            return;
        if (rc < 0)
            return; /* the store stopped: this slot rests */
        /* 0: a retry the cache knows or in flight here: a worker would take it; a new key. */
    }
}

/* A request handed back by the store's thread, on the loop. */
static void loop_step(struct req *r)
{
    struct idem_call *call = r->call;

    r->call = NULL;
    if (r->step == STEP_CLAIM && r->rc == 0 && r->outcome == IDEM_OUTCOME_EXECUTE) {
        /* The claim is durable: the upstream gets the request, then its answer is stored. */
        new_nonce(r->nonce, sizeof r->nonce);
        response_body(r->key, r->nonce, r->body, sizeof r->body);
        report_nonce('E', r->key, r->nonce);
        r->step = STEP_COMPLETE;
        r->call = call;
        if (idem_call_complete_async(call, status_of(K_CLAIM), NULL, 0, r->body, strlen(r->body),
                                     step_done, r) == 0)
            return;
        r->call = NULL;
    } else if ((r->step == STEP_RUN || r->step == STEP_COMPLETE || r->step == STEP_DEFERRED) &&
               r->rc == 0) {
        report_answer(r->key, call);
    }
    idem_call_end(call);
    if (r->slot < 0)
        free(r);
    else
        loop_start(r);
}

static void loop_woken(uv_async_t *h)
{
    struct req *list;

    (void)h;
    pthread_mutex_lock(&lp.mu);
    list = lp.inbox;
    lp.inbox = NULL;
    pthread_mutex_unlock(&lp.mu);
    while (list) {
        struct req *r = list;
        list = r->next;
        loop_step(r);
    }
}

/* ---- the worker threads: the blocking calls ---------------------------------------------- */

/* An execution of `key` whose call holds it (EXECUTE): its effect, then its answer. */
static void execute(struct idem_call *call, enum kind k, const char *key)
{
    char nonce[48], body[192];

    new_nonce(nonce, sizeof nonce);
    response_body(key, nonce, body, sizeof body);
    if (k == K_CLAIM) {
        report_nonce('E', key, nonce); /* the claim is durable: the upstream gets it */
    } else if (write_effect(call, key, nonce) != 0) {
        idem_call_end(call);
        return;
    }
    if (k == K_DEFERRED) {
        struct req *r = calloc(1, sizeof *r);
        if (!r)
            _exit(5);
        r->kind = k;
        r->step = STEP_DEFERRED;
        r->slot = -1;
        snprintf(r->key, sizeof r->key, "%s", key);
        if (idem_call_stage(call, status_of(k), NULL, 0, body, strlen(body)) == 0 &&
            idem_call_commit_async(call, step_done, r) == 0)
            return; /* the loop answers, and ends the call */
        free(r);
    } else if (idem_call_complete(call, status_of(k), NULL, 0, body, strlen(body)) == 0) {
        report_answer(key, call);
    }
    idem_call_end(call);
}

/* One request for `key` the blocking way: executed, replayed (reported), or anything else. */
static void one_blocking(struct idem_engine *eng, const char *key)
{
    enum kind k = kind_of(key);
    unsigned char fp[IDEM_FP_LEN];
    struct idem_call *call = NULL;
    enum idem_outcome outcome;

    request_fp(key, fp);
    if (idem_call_begin(eng, &ops[k], "tester", key, fp, &call, &outcome) != 0)
        return;
    if (outcome == IDEM_OUTCOME_EXECUTE) {
        execute(call, k, key);
        return;
    }
    if (outcome == IDEM_OUTCOME_REPLAY)
        report_answer(key, call);
    idem_call_end(call);
}

struct worker {
    struct idem_engine *eng;
    int round;
    unsigned seed;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    char key[64];

    for (;;) {
        /* Its own kinds fresh; a retry of any kind now and then (a replay, or a wait). */
        unsigned r = rand_r(&w->seed) % 8;
        enum kind k = r < 3 ? K_TWO_PHASE : r < 6 ? K_DEFERRED : (enum kind)(r - 4);

        if (k == K_RUN || k == K_CLAIM) {
            uint64_t n = atomic_load(&sh->next[k]);
            if (n == 0)
                continue;
            key_name(w->round, k, n - 1 - rand_r(&w->seed) % (n < 8 ? n : 8), key, sizeof key);
        } else {
            pick_key(w->round, k, &w->seed, key, sizeof key);
        }
        one_blocking(w->eng, key);
    }
    return NULL;
}

static struct idem_engine *open_engine(struct idem_store **st, int cache)
{
    struct idem_engine_options o = {0};
    struct idem_engine *eng = NULL;
    char *err = NULL;
    char uri[PATH_MAX + 32];

    o.replay_cache_bytes = cache ? 0 : IDEM_REPLAY_CACHE_OFF;
    snprintf(uri, sizeof uri, "sqlite:%s", db);
    if (idem_store_open(uri, NULL, st, &err) != 0 ||
        idem_store_migrate(*st, "power", schema, 1, NULL, &err) != 0 ||
        idem_engine_new(*st, &o, &eng) != 0) {
        fprintf(stderr, "test_power_loss: cannot open %s: %s\n", uri, err ? err : "?");
        _exit(4);
    }
    return eng;
}

/*
 * A writer process: worker threads on the blocking calls, and this thread an event loop on the
 * asynchronous ones, until it is killed (or dies in a WAL sync).
 */
static void writers_process(int round, unsigned seed)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st, 1);
    struct worker w[WRITER_THREADS];
    pthread_t t[WRITER_THREADS];

    srand(seed);
    if (uv_loop_init(&lp.uv) != 0 || uv_async_init(&lp.uv, &lp.wake, loop_woken) != 0 ||
        pthread_mutex_init(&lp.mu, NULL) != 0)
        _exit(6);
    lp.eng = eng;
    lp.round = round;
    lp.seed = seed * 7u + 1;
    for (int i = 0; i < WRITER_THREADS; i++) {
        w[i] = (struct worker){eng, round, seed * 31u + (unsigned)i};
        pthread_create(&t[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < LOOP_INFLIGHT; i++) {
        lp.slots[i].slot = i;
        lp.slots[i].kind = i % 2 ? K_RUN : K_CLAIM;
        loop_start(&lp.slots[i]);
    }
    uv_run(&lp.uv, UV_RUN_DEFAULT);
    for (;;)
        pause();
}

/*
 * Reads `key` as a server answers a retry or a GET, with reads only (no replay cache, so
 * idem_call_begin reads first): its stored answer when completed, and its business row.
 */
static void read_key(struct idem_engine *eng, struct idem_store *st, const char *key)
{
    enum kind k = kind_of(key);
    struct idem_record_info info;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[] = {key};

    if (idem_record_inspect(eng, "tester", ops[k].name, key, &info) == 0 && info.found &&
        info.completed) {
        unsigned char fp[IDEM_FP_LEN];
        struct idem_call *call = NULL;
        enum idem_outcome outcome;
        request_fp(key, fp);
        if (idem_call_begin(eng, &ops[k], "tester", key, fp, &call, &outcome) == 0 &&
            outcome == IDEM_OUTCOME_REPLAY)
            report_answer(key, call);
        idem_call_end(call);
    }
    if (k == K_CLAIM || idem_tx_begin(st, 0, &tx) != 0)
        return;
    if (idem_tx_exec(tx, "SELECT nonce FROM effects WHERE k = $1", 1, params, &rows) == 0 &&
        idem_rows_count(rows) > 0) {
        char nonce[48];
        snprintf(nonce, sizeof nonce, "%s", idem_rows_get(rows, 0, 0));
        idem_rows_free(rows);
        rows = NULL;
        if (idem_tx_commit(tx) == 0) /* (the read's end waits until what it saw is durable) */
            report_nonce('R', key, nonce);
        return;
    }
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

/* After the writers died: a new process reads every key of the round, then exits. */
static void reader_entry(int round, unsigned seed)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st, 0);
    char key[64];

    (void)seed;
    for (int k = 0; k < KINDS; k++) {
        uint64_t n = atomic_load(&sh->next[k]);
        for (uint64_t i = 0; i < n && i < READ_MAX; i++) {
            key_name(round, (enum kind)k, i, key, sizeof key);
            read_key(eng, st, key);
        }
    }
    _exit(0);
}

/*
 * A process that opened the store before the writers began and reads their newest keys while
 * they write, until it is killed: what it reads are other processes' commits, perhaps not yet
 * durable, so before it answers it must make them durable itself (the read gate).
 */
static void live_reader_entry(int round, unsigned seed)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st, 0);
    char key[64];

    for (;;) {
        enum kind k = (enum kind)(rand_r(&seed) % KINDS);
        uint64_t n = atomic_load(&sh->next[k]);
        if (n == 0)
            continue;
        key_name(round, k, n - 1 - rand_r(&seed) % (n < 16 ? n : 16), key, sizeof key);
        read_key(eng, st, key);
    }
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

/* ---- the checks ------------------------------------------------------------------------------ */

/* What the round's processes said of one key. */
struct ack {
    char key[40];
    int answered; /* an "A" came: status and body are the first answer's */
    int status;
    char body[160];
    int upstream;     /* "E" lines: how many times the upstream got the request */
    char e_nonce[40]; /* the first one's */
    char r_nonce[40]; /* a business row a GET read */
};

struct acks {
    struct ack *slot; /* ACK_SLOTS, open addressing */
    size_t n;
    int bad; /* failures seen while the round ran */
};

static struct ack *ack_of(struct acks *a, const char *key)
{
    uint64_t h = 1469598103934665603ull;

    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    for (size_t i = 0; i < ACK_SLOTS; i++) {
        struct ack *e = &a->slot[(h + i) % ACK_SLOTS];
        if (e->key[0] == '\0') {
            if (a->n + 1 >= ACK_SLOTS)
                die("too many keys in one round");
            snprintf(e->key, sizeof e->key, "%s", key);
            a->n++;
            return e;
        }
        if (strcmp(e->key, key) == 0)
            return e;
    }
    die("ack table full");
    return NULL;
}

/* The nonce a response body carries ("" if none). */
static void body_nonce(const char *body, char *out, size_t len)
{
    const char *at = strstr(body, "\"nonce\":\"");
    size_t n = 0;

    if (at) {
        at += 9;
        while (at[n] && at[n] != '"')
            n++;
    }
    snprintf(out, len, "%.*s", (int)n, at ? at : "");
}

static void take_line(struct acks *a, char *line)
{
    char *key = line + 2, *rest = strchr(key, ' ');
    struct ack *e;

    if (line[0] == '\0' || line[1] != ' ' || !rest) {
        fprintf(stderr, "test_power_loss: a garbled report: %s\n", line);
        a->bad++;
        return;
    }
    *rest++ = '\0';
    e = ack_of(a, key);
    if (line[0] == 'A') {
        int status = atoi(rest);
        const char *body = strchr(rest, ' ');
        body = body ? body + 1 : "";
        if (!e->answered) {
            e->answered = 1;
            e->status = status;
            snprintf(e->body, sizeof e->body, "%s", body);
        } else if (e->status != status || strcmp(e->body, body) != 0) {
            fprintf(stderr,
                    "test_power_loss: %s answered twice differently (executed twice?): %d %s, "
                    "then %d %s\n",
                    key, e->status, e->body, status, body);
            a->bad++;
        }
    } else if (line[0] == 'E') {
        if (++e->upstream == 1)
            snprintf(e->e_nonce, sizeof e->e_nonce, "%s", rest);
        else {
            fprintf(stderr,
                    "test_power_loss: %s reached the upstream %d times (executions %s and %s)\n",
                    key, e->upstream, e->e_nonce, rest);
            a->bad++;
        }
    } else if (line[0] == 'R') {
        if (e->r_nonce[0] && strcmp(e->r_nonce, rest) != 0) {
            fprintf(stderr, "test_power_loss: %s: GETs read two business rows, %s and %s\n", key,
                    e->r_nonce, rest);
            a->bad++;
        }
        snprintf(e->r_nonce, sizeof e->r_nonce, "%s", rest);
    }
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
            take_line(a, line);
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
    }
}

/* One query of the check, its first row's first column into `out`; -1 if it failed. */
static int query1(struct idem_store *st, const char *sql, const char *param, char *out, size_t n)
{
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[] = {param};
    int rc = idem_tx_begin(st, 0, &tx);

    out[0] = '\0';
    if (rc == 0)
        rc = idem_tx_exec(tx, sql, param ? 1 : 0, params, &rows);
    if (rc == 0 && idem_rows_count(rows) > 0)
        snprintf(out, n, "%s", idem_rows_get(rows, 0, 0) ? idem_rows_get(rows, 0, 0) : "");
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc < 0 ? -1 : 0;
}

/* After the cut, what key `e` was seen to do must still be there; the failures found. */
static int check_key(struct idem_engine *eng, struct idem_store *st, const struct ack *e)
{
    enum kind k = kind_of(e->key);
    char got[64], nonce[48];
    int bad = 0;

    if (e->answered) {
        unsigned char fp[IDEM_FP_LEN];
        struct idem_call *call = NULL;
        enum idem_outcome outcome = IDEM_OUTCOME_NONE;
        size_t len = 0;
        const char *body;

        request_fp(e->key, fp);
        if (idem_call_begin(eng, &ops[k], "tester", e->key, fp, &call, &outcome) != 0 ||
            outcome != IDEM_OUTCOME_REPLAY) {
            fprintf(stderr,
                    "test_power_loss: %s was answered, and after the power cut it does not "
                    "replay (outcome %d: 1 no record, 5 a claim not completed)\n",
                    e->key, (int)outcome);
            bad++;
        } else {
            body = idem_call_response_body(call, &len);
            if (idem_call_response_status(call) != e->status || len != strlen(e->body) ||
                memcmp(body, e->body, len) != 0) {
                fprintf(stderr, "test_power_loss: %s answered %d %s, replays %d %.*s\n", e->key,
                        e->status, e->body, idem_call_response_status(call), (int)len, body);
                bad++;
            }
        }
        idem_call_end(call);
        body_nonce(e->body, nonce, sizeof nonce);
        if (k == K_CLAIM && strcmp(nonce, e->e_nonce) != 0) {
            fprintf(stderr, "test_power_loss: %s answered execution %s, the upstream saw %s\n",
                    e->key, nonce, e->upstream ? e->e_nonce : "none");
            bad++;
        }
    }
    if (e->upstream > 0) {
        struct idem_record_info info;
        if (idem_record_inspect(eng, "tester", ops[k].name, e->key, &info) != 0 || !info.found) {
            fprintf(stderr,
                    "test_power_loss: %s reached the upstream, and after the power cut its claim "
                    "is gone (a retry would send it again)\n",
                    e->key);
            bad++;
        }
    }
    if (k != K_CLAIM && (e->answered || e->r_nonce[0])) {
        /* Its one business row, of the execution answered and read. */
        if (query1(st,
                   "SELECT count(*) || ' ' || coalesce(group_concat(nonce, ','), '') "
                   "FROM effects WHERE k = $1",
                   e->key, got, sizeof got) < 0) {
            fprintf(stderr, "test_power_loss: %s: its business rows cannot be read\n", e->key);
            bad++;
        } else {
            char want[64];
            if (e->answered)
                body_nonce(e->body, nonce, sizeof nonce);
            else
                snprintf(nonce, sizeof nonce, "%s", e->r_nonce);
            snprintf(want, sizeof want, "1 %s", nonce);
            if (strcmp(got, want) != 0) {
                fprintf(stderr,
                        "test_power_loss: %s: business rows \"%s\" (count, nonces) after the "
                        "power cut, want \"%s\"%s\n",
                        e->key, got, want, e->answered ? "" : " (read by a GET)");
                bad++;
            } else if (e->answered && e->r_nonce[0] && strcmp(e->r_nonce, nonce) != 0) {
                fprintf(stderr, "test_power_loss: %s: a GET read %s, the answer was %s\n", e->key,
                        e->r_nonce, nonce);
                bad++;
            }
        }
    }
    return bad;
}

/* Every answer, effect and read of the round against the store after the cut; the failures. */
static int check(const struct acks *a)
{
    struct idem_store *st = NULL;
    struct idem_engine *eng = open_engine(&st, 1);
    char got[64];
    int bad = 0;

    for (size_t i = 0; i < ACK_SLOTS; i++)
        if (a->slot[i].key[0])
            bad += check_key(eng, st, &a->slot[i]);
    /* No key executed twice, answered or not (a business row per execution). */
    {
        struct idem_tx *tx = NULL;
        struct idem_rows *rows = NULL;
        if (idem_tx_begin(st, 0, &tx) != 0 ||
            idem_tx_exec(tx,
                         "SELECT k, count(*), group_concat(nonce, ',') FROM effects GROUP BY k "
                         "HAVING count(*) > 1",
                         0, NULL, &rows) != 0) {
            fprintf(stderr, "test_power_loss: the business rows cannot be counted\n");
            bad++;
        } else {
            for (int r = 0; r < idem_rows_count(rows); r++) {
                fprintf(stderr, "test_power_loss: %s executed %s times (executions %s)\n",
                        idem_rows_get(rows, r, 0), idem_rows_get(rows, r, 1),
                        idem_rows_get(rows, r, 2));
                bad++;
            }
        }
        idem_rows_free(rows);
        idem_tx_rollback(tx);
    }
    /* Nothing completed without its business row (a record outlived what it answered for). */
    if (query1(st,
               "SELECT count(*) FROM idem_records r WHERE r.status = 1 AND r.operation <> "
               "'power.claim' AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.k = r.idem_key)",
               NULL, got, sizeof got) < 0 ||
        strcmp(got, "0") != 0) {
        fprintf(stderr, "test_power_loss: %s completed records without their business row\n",
                got[0] ? got : "(the query failed:)");
        bad++;
    }
    idem_engine_free(eng);
    idem_store_close(st);
    return bad;
}

/* Processes that could not open the store (exit status 4): said in the summary, not hidden. */
static int failed_opens;

static void dead(pid_t pid)
{
    int status = 0;

    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    failed_opens += WIFEXITED(status) && WEXITSTATUS(status) == 4;
}

/*
 * Lets the processes `pids` run for `ms` -- or, with `until_exit`, until all have exited, at most
 * `ms`; or, with `until_answers`, until that many keys were reported, at most `ms` -- reading
 * their reports as they come so that none blocks on a full pipe.  Woken by a report or by a
 * process's exit (its pidfd), never by a pause of its own.
 */
static void run_for(const pid_t *pids, int npids, int fd, struct acks *a, long ms, int until_exit,
                    size_t until_answers)
{
    const int64_t deadline = clock_mono_ms() + ms;
    struct pollfd fds[1 + MAX_PROCS];
    int left_running = npids;

    fds[0] = (struct pollfd){.fd = fd, .events = POLLIN};
    for (int i = 0; i < npids; i++) {
        fds[1 + i] = (struct pollfd){
            .fd = until_exit ? (int)syscall(SYS_pidfd_open, pids[i], 0) : -1, .events = POLLIN};
        if (until_exit && fds[1 + i].fd < 0)
            die("pidfd_open");
    }
    for (int64_t left = ms; left > 0; left = deadline - clock_mono_ms()) {
        if (poll(fds, 1 + (nfds_t)npids, (int)left) < 0 && errno != EINTR)
            die("poll");
        read_acks(fd, a);
        for (int i = 0; until_exit && i < npids; i++) {
            if (fds[1 + i].fd >= 0 && (fds[1 + i].revents & POLLIN)) {
                close(fds[1 + i].fd);
                fds[1 + i].fd = -1;
                left_running--;
            }
        }
        if ((until_exit && left_running == 0) || (until_answers && a->n >= until_answers)) {
            read_acks(fd, a); /* what they wrote before they exited */
            break;
        }
    }
    for (int i = 0; i < npids; i++)
        if (fds[1 + i].fd >= 0)
            close(fds[1 + i].fd);
}

/* One write transaction of one business row; its commit's return code. */
static int write_one(struct idem_store *st, const char *k)
{
    struct idem_tx *tx = NULL;
    const char *params[] = {k};
    int rc = idem_tx_begin(st, 1, &tx);

    if (rc != 0)
        return rc;
    rc = idem_tx_exec(tx, "INSERT INTO effects (k) VALUES ($1)", 1, params, NULL);
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
    struct idem_engine *eng = open_engine(&st, 1);
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
    eng = open_engine(&st, 1);
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
    int rounds = 12, bad = 0, fail_fast = 0, stop_check = 1;
    unsigned seed = (unsigned)time(NULL);
    size_t answered = 0, readers_answered = 0, by_kind[KINDS] = {0}, upstream = 0, reads = 0;
    struct acks a = {0};
    const int64_t began = clock_mono_ms();

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--fail-fast") == 0)
            fail_fast = 1;
        else if (strcmp(argv[i], "--cuts-only") == 0)
            stop_check = 0;
        else {
            fprintf(stderr, "usage: test_power_loss [--rounds N] [--seed S] [--fail-fast] "
                            "[--cuts-only]\n");
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
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    a.slot = calloc(ACK_SLOTS, sizeof *a.slot);
    if (sh == MAP_FAILED || !a.slot)
        die("memory");
    srand(seed);
    printf("test_power_loss: %d rounds, seed %u, in %s\n", rounds, seed, dir);
    fflush(stdout);
    snprintf(db, sizeof db, "%s/stop.db", dir);
    if (stop_check)
        bad += failed_fsync_stops_the_store();
    if (bad > 0 && fail_fast)
        rounds = 0;

    for (int round = 0; round < rounds; round++) {
        pid_t pids[MAX_PROCS];
        int p[2], np = 0, round_bad;
        int reader = round % 3 == 1, live = round % 3 == 2;

        if (round % 4 == 0) /* a new database: its creation is under test too */
            snprintf(db, sizeof db, "%s/p%d.db", dir, round);
        for (int k = 0; k < KINDS; k++)
            atomic_store(&sh->next[k], 0);
        memset(a.slot, 0, ACK_SLOTS * sizeof *a.slot);
        a.n = 0;
        a.bad = 0;
        if (pipe2(p, O_CLOEXEC) != 0)
            die("pipe");
        fcntl(p[0], F_SETFL, O_NONBLOCK);
        if (reader) {
            /* Writers that die inside some WAL sync, then a process that reads. */
            die_in_wal_sync = 2 + rand() % 6;
            for (; np < WRITER_PROCS; np++)
                pids[np] = spawn(p[1], writers_process, round, (unsigned)rand());
            die_in_wal_sync = 0;
            run_for(pids, np, p[0], &a, 3000, 1, 0);
            for (int i = 0; i < np; i++)
                dead(pids[i]);
            pids[0] = spawn(p[1], reader_entry, round, 0);
            run_for(pids, 1, p[0], &a, 60000, 1, 0);
            dead(pids[0]);
        } else {
            if (live)
                pids[np++] = spawn(p[1], live_reader_entry, round, (unsigned)rand());
            for (int i = 0; i < WRITER_PROCS; i++, np++)
                pids[np] = spawn(p[1], writers_process, round, (unsigned)rand());
            /* Killed while they work: some answers in, then a random moment. */
            run_for(pids, np, p[0], &a, 10000, 0, 1);
            run_for(pids, np, p[0], &a, 20 + rand() % 300, 0, 0);
            if (live) {
                /*
                 * The writers freeze (as a process the scheduler leaves aside, or one about to
                 * be killed), their last commits not yet made durable by their syncers, while the
                 * reader goes on reading their newest keys: it must make what it read durable
                 * before it answers.
                 */
                for (int i = 1; i < np; i++)
                    kill(pids[i], SIGSTOP);
                run_for(pids, 1, p[0], &a, 20 + rand() % 60, 0, 0);
            }
            for (int i = 0; i < np; i++) /* all at once, then reaped */
                kill(pids[i], SIGKILL);
            for (int i = 0; i < np; i++)
                dead(pids[i]);
        }
        close(p[1]);
        read_acks(p[0], &a);
        close(p[0]);
        power_cut();
        round_bad = a.bad + check(&a);
        bad += round_bad;
        {
            size_t n = 0;
            for (size_t i = 0; i < ACK_SLOTS; i++) {
                n += a.slot[i].answered;
                by_kind[kind_of(a.slot[i].key)] += a.slot[i].answered;
                upstream += a.slot[i].upstream > 0;
                reads += a.slot[i].r_nonce[0] != '\0';
            }
            answered += n;
            if (reader || live)
                readers_answered += n;
        }
        if (round_bad > 0 && fail_fast) {
            rounds = round + 1;
            break;
        }
    }
    printf("test_power_loss: %zu keys answered (%zu in rounds with a reading process), "
           "%d lost, doubled or wrong after %d power cuts, %.1f s\n",
           answered, readers_answered, bad, rounds, (double)(clock_mono_ms() - began) / 1000.0);
    printf("test_power_loss: answered by kind: %zu two-phase, %zu committed async, %zu run async, "
           "%zu claimed async; %zu sent upstream, %zu business rows read by a GET; %d processes "
           "could not open the store\n",
           by_kind[K_TWO_PHASE], by_kind[K_DEFERRED], by_kind[K_RUN], by_kind[K_CLAIM], upstream,
           reads, failed_opens);
    free(a.slot);
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
