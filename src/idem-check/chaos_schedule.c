/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_schedule.c - the scheduled disruptions of `idem-check chaos`: commands run every S seconds
 * of the drive, on top of every other fault, whose effect on the clients is measured.  Two kinds
 * share this one runner:
 *
 *   --failover-every S --failover-cmd CMD  the database fails over: CMD's one argument is
 *                                          `switchover` the first time, `kill` the next, in turn;
 *   --move-every S --move-cmd CMD          a bucket of a shard set moves: CMD's argument is the
 *                                          move's number, 1, 2, ... (the command picks which
 *                                          bucket and where).
 *
 * For each kind a thread waits S seconds, runs CMD through /bin/sh with that argument, waits for it
 * (at most COMMAND_TIMEOUT_MS; CMD returns once the service can take writes again), then waits S
 * seconds again.  Its output goes to failover.log (move.log) in the work directory.  A command
 * that fails or does not finish stops the drive and fails the run, as an orderd that cannot be
 * restarted does.
 *
 * How long each disruption made the service unavailable is measured from the clients' side: every
 * attempt a drive client makes (libidem-client's attempt callback) is reported here with its
 * status.  Only the state of the current stretch of failures is kept (when the first failed
 * attempt since the last 2xx came), and per disruption its longest stretch, so memory does not
 * grow with the attempts.  A stretch of failures runs from the first failed attempt (no answer, or
 * a 5xx) after a 2xx to the next 2xx, seen by any client; it belongs to the disruption whose
 * command was running when it began.  A replayed 2xx (Idempotent-Replayed: true) neither ends nor
 * begins one: orderd answers a retry of a finished intent from its in-memory replay cache without
 * its store, so such a 2xx comes while the database has no primary and says nothing of it.  A
 * disruption still running at --max-time keeps the clients sending until its command returns
 * (chaos.c): a primary killed after they stopped would leave no trace in the figure.  The proxy's
 * own faults also fail attempts, now and then, so a disruption's figure is its longest stretch,
 * not its first: without other faults the two are the same, the first failure after the command
 * started to the first success after it.
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
 * well beyond what a working cluster needs, or a move's drain and copy, and bounds a stuck
 * command. */
#define COMMAND_TIMEOUT_MS 180000
#define FAILOVER_KINDS 2

static const char *const failover_kinds[FAILOVER_KINDS] = {"switchover", "kill"};

/* What tells the two kinds apart: names, files, sentences, and the command's argument. */
struct kind_spec {
    const char *what;       /* "failover": the table's rows, the log's lines */
    const char *failed;     /* the sentence a failed command's problem starts with */
    const char *header;     /* the table's first row */
    const char *log_name;   /* in the work directory */
    const char *arg0;       /* the command's $0 */
    const char *afterwards; /* what a failed command may have left */
    int numbered;           /* the argument is the number (1, 2, ...), else failover_kinds */
};

static const struct kind_spec specs[CK_DISRUPTIONS] = {
    [CK_FAILOVER] = {"failover", "the database failover failed", "faults: database failovers",
                     "failover.log", "idem-check-failover", "the database may not have a primary",
                     0},
    [CK_MOVE] = {"move", "the bucket move failed", "faults: bucket moves", "move.log",
                 "idem-check-move",
                 "the bucket may be left frozen (`idem-gateway shards show` lists it; run the "
                 "move again to finish it)",
                 1},
};

struct ck_event {
    int n;              /* 1, 2, ... */
    char arg[16];       /* the command's argument: a failover's kind, a move's number */
    long long start_ms; /* when the command started (monotonic) */
    long long end_ms;   /* when it returned, 0 while it runs */
    int status;         /* its exit status, -1 when it did not exit by itself */
    long long fail_ms;  /* start of the longest stretch of failures it caused, 0: none failed */
    long long out_ms;   /* that stretch's length */
    int open;           /* no 2xx came after that stretch before the drive ended */
};

struct ck_schedule {
    enum ck_disruption kind;
    const struct kind_spec *spec;
    long every_s, min_done;
    const char *cmd;
    pthread_mutex_t lock;
    pthread_t thread;
    int have_thread;
    atomic_int stop, running;
    atomic_int done;     /* commands that returned 0 */
    long long t0;        /* the drive's start */
    struct ck_event *ev; /* under lock, n of cap */
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
 * A stretch of failures from `from` to `to` (ms) is over: it counts for the disruption whose
 * command was running at `from`, if any, when it is the longest one seen for it.  Under lock.
 */
static void stretch_over(struct ck_schedule *s, long long from, long long to, int open)
{
    size_t i;

    for (i = s->n; i-- > 0;) {
        struct ck_event *e = &s->ev[i];
        if (e->start_ms > from)
            continue;
        if (e->end_ms && from > e->end_ms)
            return; /* began between two disruptions: not one of theirs */
        if (!e->fail_ms || to - from > e->out_ms) {
            e->fail_ms = from;
            e->out_ms = to - from;
            e->open = open;
        }
        return;
    }
}

void ck_schedule_attempt(struct chaos *cx, int status, int replayed)
{
    int ok = status >= 200 && status < 300 && !replayed, failed = status == 0 || status >= 500;
    int d;

    /* A 409 in progress, a 429: the service is there.  A replayed 2xx may have needed no store. */
    if (!ok && !failed)
        return;
    for (d = 0; d < CK_DISRUPTIONS; d++) {
        struct ck_schedule *s = cx->sched[d];
        long long now;
        if (!s || atomic_load(&s->stop)) /* after the drive nothing is measured */
            continue;
        pthread_mutex_lock(&s->lock);
        /* Taken under the lock: the attempts of all clients are judged in the order of their
         * times. */
        now = clock_mono_ms();
        if (failed && !s->fail_since)
            s->fail_since = now;
        else if (ok && s->fail_since) {
            stretch_over(s, s->fail_since, now, 0);
            s->fail_since = 0;
        }
        pthread_mutex_unlock(&s->lock);
    }
}

/* ---- running the command -------------------------------------------------------------------- */

/*
 * fork + execve of /bin/sh -c 'CMD "$1"' ARG0 ARG, in a process group of its own (a timeout kills
 * the whole group), stdin from /dev/null, stdout and stderr appended to `log_fd`.  Everything is
 * prepared before the fork: the child only calls async-signal-safe functions.
 */
static pid_t spawn_cmd(char *script, const char *arg0, const char *arg, int log_fd, int null_fd)
{
    char *argv[] = {(char *)"/bin/sh", (char *)"-c", script, (char *)arg0, (char *)arg, NULL};
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

/* One line in the log between the commands' own output. */
static void log_line(struct ck_schedule *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void log_line(struct ck_schedule *s, const char *fmt, ...)
{
    FILE *f = fopen(s->log, "a");
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

/* "failover 2 (kill)" or "move 2": event `e` for people. */
static void event_name(const struct ck_schedule *s, const struct ck_event *e, char *out, size_t cap)
{
    if (s->spec->numbered)
        snprintf(out, cap, "%s %d", s->spec->what, e->n);
    else
        snprintf(out, cap, "%s %d (%s)", s->spec->what, e->n, e->arg);
}

/* Notes a new disruption starting now with argument `arg`; its index, and its start in *start. */
static size_t begin_event(struct ck_schedule *s, const char *arg, long long *start)
{
    size_t i;

    pthread_mutex_lock(&s->lock);
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->ev = xrealloc(s->ev, s->cap * sizeof(*s->ev));
    }
    i = s->n++;
    memset(&s->ev[i], 0, sizeof(s->ev[i]));
    s->ev[i].n = (int)i + 1;
    snprintf(s->ev[i].arg, sizeof(s->ev[i].arg), "%s", arg);
    s->ev[i].start_ms = clock_mono_ms();
    s->ev[i].status = -1;
    *start = s->ev[i].start_ms;
    pthread_mutex_unlock(&s->lock);
    return i;
}

/* Why the command of event `i` failed, into s->problem. */
static void note_failure(struct ck_schedule *s, size_t i, long long took, int signo, int timed_out,
                         int status)
{
    char what[96];

    if (timed_out)
        snprintf(what, sizeof(what), "did not finish within %d s and was killed",
                 COMMAND_TIMEOUT_MS / 1000);
    else if (signo)
        snprintf(what, sizeof(what), "was killed by signal %d after %.1f s", signo, secs(took));
    else if (status >= 0)
        snprintf(what, sizeof(what), "exited with status %d after %.1f s", status, secs(took));
    else
        snprintf(what, sizeof(what), "could not be run");
    snprintf(s->problem, sizeof(s->problem), "%s: %s %zu, `%s %s`, %s; %s (its output is in %s)",
             s->spec->failed, s->spec->what, i + 1, s->cmd, s->ev[i].arg, what, s->spec->afterwards,
             s->log);
}

/* Runs one disruption with argument `arg`; 0, or -1 when the command failed (s->problem). */
static int run_event(struct chaos *cx, struct ck_schedule *s, const char *arg)
{
    size_t len = strlen(s->cmd) + sizeof(" \"$1\"");
    char *script = xmalloc(len);
    char name[64];
    int log_fd, null_fd, signo = 0, timed_out = 0, status = -1;
    long long start, took;
    size_t i = begin_event(s, arg, &start);
    pid_t pid = -1;

    /* The argument is the command's last, "$1", quoted however CMD is written. */
    snprintf(script, len, "%s \"$1\"", s->cmd);
    atomic_store(&s->running, 1);
    event_name(s, &s->ev[i], name, sizeof(name));
    say(cx, "chaos: %s at %.1f s: %s %s", name, secs(start - s->t0), s->cmd, arg);
    if (s->spec->numbered)
        log_line(s, "== %s %zu, %.1f s into the drive: %s %s\n", s->spec->what, i + 1,
                 secs(start - s->t0), s->cmd, arg);
    else
        log_line(s, "== %s %zu: %s, %.1f s into the drive: %s %s\n", s->spec->what, i + 1, arg,
                 secs(start - s->t0), s->cmd, arg);
    log_fd = open(s->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd >= 0 && null_fd >= 0)
        pid = spawn_cmd(script, s->spec->arg0, arg, log_fd, null_fd);
    if (log_fd >= 0)
        close(log_fd);
    if (null_fd >= 0)
        close(null_fd);
    free(script);
    if (pid > 0)
        status = wait_cmd(pid, COMMAND_TIMEOUT_MS, &signo, &timed_out);
    took = clock_mono_ms() - start;
    pthread_mutex_lock(&s->lock);
    s->ev[i].end_ms = start + took;
    s->ev[i].status = status;
    pthread_mutex_unlock(&s->lock);
    atomic_store(&s->running, 0);
    log_line(s, "== %s %zu: exit status %d after %.1f s\n", s->spec->what, i + 1, status,
             secs(took));
    if (status == 0) {
        say(cx, "chaos: %s done in %.1f s", name, secs(took));
        return 0;
    }
    note_failure(s, i, took, signo, timed_out, pid > 0 ? status : -1);
    say(cx, "chaos: %s", s->problem);
    return -1;
}

struct thread_arg {
    struct chaos *cx;
    struct ck_schedule *s;
};

static void *schedule_main(void *arg)
{
    struct thread_arg *ta = arg;
    struct chaos *cx = ta->cx;
    struct ck_schedule *s = ta->s;
    unsigned n = 0;

    free(ta);
    for (;;) {
        long long wake = clock_mono_ms() + s->every_s * 1000;
        char argbuf[16];
        while (clock_mono_ms() < wake && !atomic_load(&s->stop))
            clock_sleep_ms(50);
        /* Marked running before the deadline is read: a client past the deadline drives on while
         * a command runs, so the clients never stop under one that starts now. */
        atomic_store(&s->running, 1);
        /* None after the drive's last intent started: the audit needs the service settled. */
        if (atomic_load(&s->stop) ||
            (clock_mono_ms() >= cx->deadline_ms && atomic_load(&s->done) >= s->min_done)) {
            atomic_store(&s->running, 0);
            break;
        }
        if (s->spec->numbered)
            snprintf(argbuf, sizeof(argbuf), "%u", n + 1);
        else
            snprintf(argbuf, sizeof(argbuf), "%s", failover_kinds[n % FAILOVER_KINDS]);
        if (run_event(cx, s, argbuf) < 0) {
            /* Without a primary (or with a bucket frozen) intents would retry until their time
             * is up: end the drive. */
            atomic_store(&cx->stop_drive, 1);
            break;
        }
        atomic_fetch_add(&s->done, 1);
        n++;
    }
    return NULL;
}

/* ---- the run's side ------------------------------------------------------------------------- */

int ck_schedule_start(struct chaos *cx, enum ck_disruption d)
{
    struct ck_schedule *s = xmalloc(sizeof(*s));
    struct thread_arg *ta = xmalloc(sizeof(*ta));

    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
    s->kind = d;
    s->spec = &specs[d];
    s->every_s = d == CK_MOVE ? cx->o.move_every_s : cx->o.failover_every_s;
    s->min_done = d == CK_MOVE ? cx->o.min_moves : cx->o.min_failovers;
    s->cmd = d == CK_MOVE ? cx->o.move_cmd : cx->o.failover_cmd;
    s->t0 = clock_mono_ms();
    snprintf(s->log, sizeof(s->log), "%s/%s", cx->workdir, s->spec->log_name);
    cx->sched[d] = s;
    ta->cx = cx;
    ta->s = s;
    s->have_thread = pthread_create(&s->thread, NULL, schedule_main, ta) == 0;
    if (!s->have_thread) {
        free(ta);
        snprintf(s->problem, sizeof(s->problem), "%s: the %s thread could not start",
                 s->spec->failed, s->spec->what);
    }
    return s->have_thread ? 0 : -1;
}

void ck_schedule_stop(struct chaos *cx)
{
    int d;

    for (d = 0; d < CK_DISRUPTIONS; d++) {
        struct ck_schedule *s = cx->sched[d];
        if (!s)
            continue;
        /* The clients are done: a stretch of failures still open ends with the drive,
         * unrecovered. */
        pthread_mutex_lock(&s->lock);
        if (s->fail_since)
            stretch_over(s, s->fail_since, clock_mono_ms(), 1);
        s->fail_since = 0;
        pthread_mutex_unlock(&s->lock);
        atomic_store(&s->stop, 1);
    }
    for (d = 0; d < CK_DISRUPTIONS; d++) {
        struct ck_schedule *s = cx->sched[d];
        if (s && s->have_thread)
            pthread_join(s->thread, NULL);
        if (s)
            s->have_thread = 0;
    }
}

void ck_schedule_free(struct chaos *cx)
{
    int d;

    ck_schedule_stop(cx);
    for (d = 0; d < CK_DISRUPTIONS; d++) {
        struct ck_schedule *s = cx->sched[d];
        if (!s)
            continue;
        pthread_mutex_destroy(&s->lock);
        free(s->ev);
        free(s);
        cx->sched[d] = NULL;
    }
}

int ck_schedule_running(struct chaos *cx, int d)
{
    int k;

    for (k = 0; k < CK_DISRUPTIONS; k++) {
        struct ck_schedule *s = cx->sched[k];
        if ((d >= 0 && k != d) || !s)
            continue;
        /* One still owed keeps the drive going: its thread starts it once its wait is over. */
        if (atomic_load(&s->running) ||
            (!atomic_load(&s->stop) && atomic_load(&s->done) < s->min_done))
            return 1;
    }
    return 0;
}

int ck_schedule_problem(struct chaos *cx, char *why, size_t cap)
{
    int d;

    for (d = 0; d < CK_DISRUPTIONS; d++)
        if (cx->sched[d] && cx->sched[d]->problem[0]) {
            snprintf(why, cap, "%s", cx->sched[d]->problem);
            return 1;
        }
    return 0;
}

/* ---- the report ----------------------------------------------------------------------------- */

/* "unavailable 1.4 s", "none failed", "at least 3.0 s (...)": the stretch of event `e`. */
static void unavailable_text(const struct ck_event *e, char *out, size_t cap)
{
    if (!e->fail_ms)
        snprintf(out, cap, "none failed");
    else if (e->open)
        snprintf(out, cap, "unavailable at least %.1f s (no 2xx before the drive ended)",
                 secs(e->out_ms));
    else
        snprintf(out, cap, "unavailable %.1f s", secs(e->out_ms));
}

void ck_schedule_print_table(struct chaos *cx)
{
    int d;

    for (d = 0; d < CK_DISRUPTIONS; d++) {
        const struct ck_schedule *s = cx->sched[d];
        size_t i;
        if (!s)
            continue;
        printf("%-34s %zu, every %ld s: %s\n", s->spec->header, s->n, s->every_s, s->cmd);
        for (i = 0; i < s->n; i++) {
            const struct ck_event *e = &s->ev[i];
            char label[48], un[96];
            if (s->spec->numbered)
                snprintf(label, sizeof(label), "  %s %d", s->spec->what, e->n);
            else
                snprintf(label, sizeof(label), "  %s %d %s", s->spec->what, e->n, e->arg);
            unavailable_text(e, un, sizeof(un));
            printf("%-34s at %.1f s, command %.1f s, %s\n", label, secs(e->start_ms - s->t0),
                   secs(e->end_ms - e->start_ms), un);
        }
    }
}

json_t *ck_schedule_json(struct chaos *cx, enum ck_disruption d)
{
    const struct ck_schedule *s = cx->sched[d];
    json_t *list = json_array();
    size_t i;

    if (!s)
        return json_pack("{s:I, s:I, s:o}", "every", (json_int_t)0, "count", (json_int_t)0, "list",
                         list);
    for (i = 0; i < s->n; i++) {
        const struct ck_event *e = &s->ev[i];
        json_t *one =
            json_pack("{s:I, s:f, s:f, s:i, s:f, s:b, s:b}", "n", (json_int_t)e->n, "startedAt",
                      secs(e->start_ms - s->t0), "commandSeconds", secs(e->end_ms - e->start_ms),
                      "exitStatus", e->status, "unavailableSeconds", secs(e->out_ms), "noneFailed",
                      !e->fail_ms, "recovered", !e->open);
        if (one) {
            if (!s->spec->numbered)
                json_object_set_new(one, "kind", json_string(e->arg));
            json_object_set_new(one, "failedAt",
                                e->fail_ms ? json_real(secs(e->fail_ms - s->t0)) : json_null());
        }
        json_array_append_new(list, one);
    }
    return json_pack("{s:I, s:s, s:I, s:o}", "every", (json_int_t)s->every_s, "command", s->cmd,
                     "count", (json_int_t)s->n, "list", list);
}
