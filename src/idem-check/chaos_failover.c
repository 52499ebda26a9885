/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_failover.c - `idem-check chaos --failover-every S --failover-cmd CMD`: the database fails
 * over during the drive.  A thread waits S seconds, runs CMD through /bin/sh with one argument,
 * `switchover` the first time, `kill` the next, and so on, waits for it (at most
 * FAILOVER_TIMEOUT_MS; CMD returns once the database takes writes again), then waits S seconds
 * again.  Its output goes to failover.log in the work directory.  A command that fails or does
 * not finish stops the drive and fails the run, as an orderd that cannot be restarted does.
 *
 * How long each failover made the service unavailable is measured from the clients' side: every
 * attempt a drive client makes (libidem-client's attempt callback) is reported here with its
 * status.  Only the state of the current stretch of failures is kept (when the first failed
 * attempt since the last 2xx came), and per failover its longest stretch, so memory does not grow
 * with the attempts.  A stretch of failures runs from the first failed attempt (no answer, or a
 * 5xx) after a 2xx to the next 2xx, seen by any client; it belongs to the failover whose command
 * was running when it began.  A replayed 2xx (Idempotent-Replayed: true) neither ends nor begins
 * one: orderd answers a retry of a finished intent from its in-memory replay cache without its
 * store, so such a 2xx comes while the database has no primary and says nothing of it.  A
 * failover still running at --max-time keeps the clients sending until its command returns
 * (chaos.c): a primary killed after they stopped would leave no trace in the figure.  The proxy's
 * own faults also fail attempts, now and then, so a failover's figure is its longest stretch, not
 * its first: without other faults the two are the same, the first failure after the command started
 * to the first success after it.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chaos.h"
#include "banned.h"

extern char **environ;

/* A failover (a kill above all) takes Patroni a ttl and a restarted node's rejoin; 3 minutes is
 * well beyond what a working cluster needs and bounds a stuck command. */
#define FAILOVER_TIMEOUT_MS 180000
#define FAILOVER_KINDS 2

static const char *const kind_names[FAILOVER_KINDS] = {"switchover", "kill"};

struct ck_failover {
    int kind;           /* index into kind_names */
    long long start_ms; /* when the command started (monotonic) */
    long long end_ms;   /* when it returned, 0 while it runs */
    int status;         /* its exit status, -1 when it did not exit by itself */
    long long fail_ms;  /* start of the longest stretch of failures it caused, 0: none failed */
    long long out_ms;   /* that stretch's length */
    int open;           /* no 2xx came after that stretch before the drive ended */
};

struct ck_failovers {
    pthread_mutex_t lock;
    pthread_t thread;
    int have_thread;
    atomic_int stop, running;
    atomic_int done;       /* failovers whose command returned 0 */
    long long t0;          /* the drive's start */
    struct ck_failover *f; /* under lock, n of cap */
    size_t n, cap;
    long long fail_since; /* under lock: the first failed attempt since the last 2xx, 0: none */
    char problem[PATH_MAX + 1024]; /* a command that failed, "" while none did */
    char log[PATH_MAX + 16];
};

static double secs(long long ms)
{
    return (double)ms / 1000.0;
}

/* ---- the clients' attempts ------------------------------------------------------------------ */

/*
 * A stretch of failures from `from` to `to` (ms) is over: it counts for the failover whose
 * command was running at `from`, if any, when it is the longest one seen for it.  Under lock.
 */
static void stretch_over(struct ck_failovers *fo, long long from, long long to, int open)
{
    size_t i;

    for (i = fo->n; i-- > 0;) {
        struct ck_failover *f = &fo->f[i];
        if (f->start_ms > from)
            continue;
        if (f->end_ms && from > f->end_ms)
            return; /* began between two failovers: not one of theirs */
        if (!f->fail_ms || to - from > f->out_ms) {
            f->fail_ms = from;
            f->out_ms = to - from;
            f->open = open;
        }
        return;
    }
}

void ck_failover_attempt(struct chaos *cx, int status, int replayed)
{
    struct ck_failovers *fo = cx->fo;
    int ok = status >= 200 && status < 300 && !replayed, failed = status == 0 || status >= 500;
    long long now;

    /* A 409 in progress, a 429: the service is there.  A replayed 2xx may have needed no store.
     * After the drive nothing is measured. */
    if (!fo || (!ok && !failed) || atomic_load(&fo->stop))
        return;
    pthread_mutex_lock(&fo->lock);
    /* Taken under the lock: the attempts of all clients are judged in the order of their times. */
    now = clock_mono_ms();
    if (failed && !fo->fail_since)
        fo->fail_since = now;
    else if (ok && fo->fail_since) {
        stretch_over(fo, fo->fail_since, now, 0);
        fo->fail_since = 0;
    }
    pthread_mutex_unlock(&fo->lock);
}

/* ---- running the command -------------------------------------------------------------------- */

/*
 * fork + execve of /bin/sh -c 'CMD "$1"' idem-check-failover KIND, in a process group of its own
 * (a timeout kills the whole group), stdin from /dev/null, stdout and stderr appended to `log_fd`.
 * Everything is prepared before the fork: the child only calls async-signal-safe functions.
 */
static pid_t spawn_cmd(char *script, const char *kind, int log_fd, int null_fd)
{
    char *argv[] = {(char *)"/bin/sh", (char *)"-c", script, (char *)"idem-check-failover",
                    (char *)kind,      NULL};
    pid_t pid = fork();

    if (pid == 0) {
        (void)setpgid(0, 0);
        if (dup2(null_fd, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
            _exit(127);
        /* The command dies with this thread; what it starts in the background (a restarted
         * database node) does not, and is the cluster's to stop. */
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        execve(argv[0], argv, environ);
        _exit(127);
    }
    if (pid > 0)
        (void)setpgid(pid, pid); /* also from here: no race with a timeout right after the fork */
    return pid;
}

/* Waits for `pid` until `timeout_ms`, then kills its group.  Its exit status, or -1 (*timed_out
 * set when it was killed for the time). */
static int wait_cmd(pid_t pid, long long timeout_ms, int *signo, int *timed_out)
{
    long long end = clock_mono_ms() + timeout_ms;
    int st = 0;

    *signo = 0;
    *timed_out = 0;
    for (;;) {
        pid_t got = waitpid(pid, &st, WNOHANG);
        if (got == pid)
            break;
        if (got < 0 && errno != EINTR)
            return -1;
        if (clock_mono_ms() >= end) {
            *timed_out = 1;
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        clock_sleep_ms(100);
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        *signo = WTERMSIG(st);
    return -1;
}

/* One line in failover.log between the command's own output. */
static void log_line(struct ck_failovers *fo, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void log_line(struct ck_failovers *fo, const char *fmt, ...)
{
    FILE *f = fopen(fo->log, "a");
    va_list ap;

    if (!f)
        return;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

/* A line on stderr, over the drive's progress bar when stderr is a terminal. */
static void say(struct chaos *cx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct chaos *cx, const char *fmt, ...)
{
    char line[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, cx->tty ? "\r%-79s\n" : "%s\n", line);
}

/* Notes a new failover of `kind` starting now; its index, and its start in *start. */
static size_t begin_failover(struct ck_failovers *fo, int kind, long long *start)
{
    size_t i;

    pthread_mutex_lock(&fo->lock);
    if (fo->n == fo->cap) {
        fo->cap = fo->cap ? fo->cap * 2 : 8;
        fo->f = xrealloc(fo->f, fo->cap * sizeof(*fo->f));
    }
    i = fo->n++;
    memset(&fo->f[i], 0, sizeof(fo->f[i]));
    fo->f[i].kind = kind;
    fo->f[i].start_ms = clock_mono_ms();
    fo->f[i].status = -1;
    *start = fo->f[i].start_ms;
    pthread_mutex_unlock(&fo->lock);
    return i;
}

/* Why the command of failover `i` failed, into fo->problem. */
static void note_failure(struct chaos *cx, size_t i, int kind, long long took, int signo,
                         int timed_out, int status)
{
    struct ck_failovers *fo = cx->fo;
    char what[96];

    if (timed_out)
        snprintf(what, sizeof(what), "did not finish within %d s and was killed",
                 FAILOVER_TIMEOUT_MS / 1000);
    else if (signo)
        snprintf(what, sizeof(what), "was killed by signal %d after %.1f s", signo, secs(took));
    else if (status >= 0)
        snprintf(what, sizeof(what), "exited with status %d after %.1f s", status, secs(took));
    else
        snprintf(what, sizeof(what), "could not be run");
    snprintf(fo->problem, sizeof(fo->problem),
             "failover %zu, `%s %s`, %s; the database may not have a primary (its output is in "
             "%s)",
             i + 1, cx->o.failover_cmd, kind_names[kind], what, fo->log);
}

/* Runs one failover of `kind`; 0, or -1 when the command failed (fo->problem says how). */
static int run_failover(struct chaos *cx, int kind)
{
    struct ck_failovers *fo = cx->fo;
    size_t len = strlen(cx->o.failover_cmd) + sizeof(" \"$1\"");
    char *script = xmalloc(len);
    int log_fd, null_fd, signo = 0, timed_out = 0, status = -1;
    long long start, took;
    size_t i = begin_failover(fo, kind, &start);
    pid_t pid = -1;

    /* The kind is the command's last argument, "$1", quoted however CMD is written. */
    snprintf(script, len, "%s \"$1\"", cx->o.failover_cmd);
    atomic_store(&fo->running, 1);
    say(cx, "chaos: failover %zu (%s) at %.1f s: %s %s", i + 1, kind_names[kind],
        secs(start - fo->t0), cx->o.failover_cmd, kind_names[kind]);
    log_line(fo, "== failover %zu: %s, %.1f s into the drive: %s %s\n", i + 1, kind_names[kind],
             secs(start - fo->t0), cx->o.failover_cmd, kind_names[kind]);
    log_fd = open(fo->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd >= 0 && null_fd >= 0)
        pid = spawn_cmd(script, kind_names[kind], log_fd, null_fd);
    if (log_fd >= 0)
        close(log_fd);
    if (null_fd >= 0)
        close(null_fd);
    free(script);
    if (pid > 0)
        status = wait_cmd(pid, FAILOVER_TIMEOUT_MS, &signo, &timed_out);
    took = clock_mono_ms() - start;
    pthread_mutex_lock(&fo->lock);
    fo->f[i].end_ms = start + took;
    fo->f[i].status = status;
    pthread_mutex_unlock(&fo->lock);
    atomic_store(&fo->running, 0);
    log_line(fo, "== failover %zu: exit status %d after %.1f s\n", i + 1, status, secs(took));
    if (status == 0) {
        say(cx, "chaos: failover %zu (%s) done in %.1f s", i + 1, kind_names[kind], secs(took));
        return 0;
    }
    note_failure(cx, i, kind, took, signo, timed_out, pid > 0 ? status : -1);
    say(cx, "chaos: %s", fo->problem);
    return -1;
}

static void *failover_main(void *arg)
{
    struct chaos *cx = arg;
    struct ck_failovers *fo = cx->fo;
    int kind = 0;

    for (;;) {
        long long wake = clock_mono_ms() + cx->o.failover_every_s * 1000;
        while (clock_mono_ms() < wake && !atomic_load(&fo->stop))
            clock_sleep_ms(50);
        /* Marked running before the deadline is read: a client past the deadline drives on while
         * a failover runs, so the clients never stop under one that starts now. */
        atomic_store(&fo->running, 1);
        /* None after the drive's last intent started: the audit needs the database settled. */
        if (atomic_load(&fo->stop) ||
            (clock_mono_ms() >= cx->deadline_ms && atomic_load(&fo->done) >= cx->o.min_failovers)) {
            atomic_store(&fo->running, 0);
            break;
        }
        if (run_failover(cx, kind) < 0) {
            /* Without a primary every intent would retry until its time is up: end the drive. */
            atomic_store(&cx->stop_drive, 1);
            break;
        }
        atomic_fetch_add(&fo->done, 1);
        kind = (kind + 1) % FAILOVER_KINDS;
    }
    return NULL;
}

/* ---- the run's side ------------------------------------------------------------------------- */

int ck_failover_start(struct chaos *cx)
{
    struct ck_failovers *fo = xmalloc(sizeof(*fo));

    memset(fo, 0, sizeof(*fo));
    pthread_mutex_init(&fo->lock, NULL);
    fo->t0 = clock_mono_ms();
    snprintf(fo->log, sizeof(fo->log), "%s/failover.log", cx->workdir);
    cx->fo = fo;
    fo->have_thread = pthread_create(&fo->thread, NULL, failover_main, cx) == 0;
    if (!fo->have_thread)
        snprintf(fo->problem, sizeof(fo->problem), "the failover thread could not start");
    return fo->have_thread ? 0 : -1;
}

void ck_failover_stop(struct chaos *cx)
{
    struct ck_failovers *fo = cx->fo;

    if (!fo)
        return;
    /* The clients are done: a stretch of failures still open ends with the drive, unrecovered. */
    pthread_mutex_lock(&fo->lock);
    if (fo->fail_since)
        stretch_over(fo, fo->fail_since, clock_mono_ms(), 1);
    fo->fail_since = 0;
    pthread_mutex_unlock(&fo->lock);
    atomic_store(&fo->stop, 1);
    if (fo->have_thread)
        pthread_join(fo->thread, NULL);
    fo->have_thread = 0;
}

void ck_failover_free(struct chaos *cx)
{
    if (!cx->fo)
        return;
    ck_failover_stop(cx);
    pthread_mutex_destroy(&cx->fo->lock);
    free(cx->fo->f);
    free(cx->fo);
    cx->fo = NULL;
}

int ck_failover_running(struct chaos *cx)
{
    struct ck_failovers *fo = cx->fo;

    /* A failover still owed keeps the drive going: its thread starts it once its wait is over. */
    return fo && (atomic_load(&fo->running) ||
                  (!atomic_load(&fo->stop) && atomic_load(&fo->done) < cx->o.min_failovers));
}

int ck_failover_problem(struct chaos *cx, char *why, size_t cap)
{
    if (!cx->fo || !cx->fo->problem[0])
        return 0;
    snprintf(why, cap, "%s", cx->fo->problem);
    return 1;
}

/* ---- the report ----------------------------------------------------------------------------- */

/* "unavailable 1.4 s", "none failed", "at least 3.0 s (...)": the stretch of failover `f`. */
static void unavailable_text(const struct ck_failover *f, char *out, size_t cap)
{
    if (!f->fail_ms)
        snprintf(out, cap, "none failed");
    else if (f->open)
        snprintf(out, cap, "unavailable at least %.1f s (no 2xx before the drive ended)",
                 secs(f->out_ms));
    else
        snprintf(out, cap, "unavailable %.1f s", secs(f->out_ms));
}

void ck_failover_print_table(struct chaos *cx)
{
    struct ck_failovers *fo = cx->fo;
    size_t i;

    if (!fo)
        return;
    printf("%-34s %zu, every %ld s: %s\n", "faults: database failovers", fo->n,
           cx->o.failover_every_s, cx->o.failover_cmd);
    for (i = 0; i < fo->n; i++) {
        const struct ck_failover *f = &fo->f[i];
        char label[48], un[96];
        snprintf(label, sizeof(label), "  failover %zu %s", i + 1, kind_names[f->kind]);
        unavailable_text(f, un, sizeof(un));
        printf("%-34s at %.1f s, command %.1f s, %s\n", label, secs(f->start_ms - fo->t0),
               secs(f->end_ms - f->start_ms), un);
    }
}

json_t *ck_failover_json(struct chaos *cx)
{
    struct ck_failovers *fo = cx->fo;
    json_t *list = json_array();
    size_t i;

    if (!fo)
        return json_pack("{s:I, s:I, s:o}", "every", (json_int_t)0, "count", (json_int_t)0, "list",
                         list);
    for (i = 0; i < fo->n; i++) {
        const struct ck_failover *f = &fo->f[i];
        json_t *one = json_pack(
            "{s:I, s:s, s:f, s:f, s:i, s:f, s:b, s:b}", "n", (json_int_t)(i + 1), "kind",
            kind_names[f->kind], "startedAt", secs(f->start_ms - fo->t0), "commandSeconds",
            secs(f->end_ms - f->start_ms), "exitStatus", f->status, "unavailableSeconds",
            secs(f->out_ms), "noneFailed", !f->fail_ms, "recovered", !f->open);
        if (one)
            json_object_set_new(one, "failedAt",
                                f->fail_ms ? json_real(secs(f->fail_ms - fo->t0)) : json_null());
        json_array_append_new(list, one);
    }
    return json_pack("{s:I, s:s, s:I, s:o}", "every", (json_int_t)cx->o.failover_every_s, "command",
                     cx->o.failover_cmd, "count", (json_int_t)fo->n, "list", list);
}
