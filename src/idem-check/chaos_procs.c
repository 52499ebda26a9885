/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_procs.c - the processes of a chaos run: provider-sim, `orderd token create`, and the
 * orderd instances on one store, each started on 127.0.0.1 (port 0 the first time, read from its
 * "listening on" line, then kept, so a restart after kill -9 comes back where the proxy and the
 * provider's webhooks expect it).  Every child dies with the thread that forked it
 * (PR_SET_PDEATHSIG), so a checker killed mid-run leaves nothing behind; every wait is bounded.
 * With --attach nothing here runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "chaos.h"
#include "banned.h"

#define START_TIMEOUT_MS 15000

pid_t ck_spawn(char **envp, char *const argv[], const char *out_path, const char *err_path,
               int pass_fd, int as_fd)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int err = open(err_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (in < 0 || out < 0 || err < 0)
            _exit(127);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        /* dup2 makes a copy without close-on-exec; the same fd keeps its flag, so clear it. */
        if (pass_fd >= 0 &&
            (pass_fd == as_fd ? fcntl(pass_fd, F_SETFD, 0) < 0 : dup2(pass_fd, as_fd) < 0))
            _exit(127);
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        execve(argv[0], argv, envp);
        _exit(127);
    }
    return pid;
}

/* Waits for "<prog>: listening on http://127.0.0.1:PORT" in the file; the port, or -1. */
static int wait_listening(pid_t pid, const char *path, long timeout_ms)
{
    long long end = clock_mono_ms() + timeout_ms;
    while (clock_mono_ms() < end) {
        char buf[512];
        FILE *f = fopen(path, "r");
        int status;
        if (f) {
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            const char *p;
            fclose(f);
            buf[n] = '\0';
            p = strstr(buf, "listening on http://");
            if (p && strchr(p, '\n')) {
                const char *colon = strrchr(p, ':');
                long port = colon ? strtol(colon + 1, NULL, 10) : 0;
                if (port > 0 && port < 65536)
                    return (int)port;
            }
        }
        if (waitpid(pid, &status, WNOHANG) == pid)
            return -1;
        clock_sleep_ms(20);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* SIGTERM to all of `pids` (those > 0) at once, then up to 5 s for them, then SIGKILL. */
static void stop_all(pid_t *pids, int n)
{
    long long end = clock_mono_ms() + 5000;
    int i, left = 0;

    for (i = 0; i < n; i++)
        if (pids[i] > 0 && kill(pids[i], SIGTERM) == 0)
            left++;
    while (left > 0 && clock_mono_ms() < end) {
        clock_sleep_ms(50);
        for (i = 0; i < n; i++)
            if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
                pids[i] = -1;
                left--;
            }
    }
    for (i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
}

int ck_start_provider(struct chaos *cx)
{
    char db[PATH_MAX + 32], out[PATH_MAX + 32], err[PATH_MAX + 32], dup[16], hook_url[200];
    char *argv[20];
    int argc = 0, port;

    snprintf(db, sizeof(db), "sqlite:%s/provider.db", cx->workdir);
    snprintf(out, sizeof(out), "%s/provider-sim.stdout", cx->workdir);
    snprintf(err, sizeof(err), "%s/provider-sim.stderr", cx->workdir);
    argv[argc++] = (char *)cx->o.provider_bin;
    argv[argc++] = (char *)"--listen";
    argv[argc++] = (char *)"127.0.0.1:0";
    argv[argc++] = (char *)"--db";
    argv[argc++] = db;
    if (cx->webhooks) {
        /* The secret is in the environment (PROVIDER_SIM_WEBHOOK_SECRET), not in `ps`. */
        snprintf(hook_url, sizeof(hook_url), "%s/webhooks/provider", cx->hook_proxy_url);
        snprintf(dup, sizeof(dup), "%ld", cx->o.webhook_dup);
        argv[argc++] = (char *)"--webhook-url";
        argv[argc++] = hook_url;
        argv[argc++] = (char *)"--webhook-dup";
        argv[argc++] = dup;
        argv[argc++] = (char *)"--webhook-backoff-max-ms=500";
        argv[argc++] = (char *)"--webhook-timeout-ms=3000";
    }
    argv[argc] = NULL;
    cx->provider_pid = ck_spawn(cx->envp, argv, out, err, -1, -1);
    if (cx->provider_pid < 0)
        return -1;
    port = wait_listening(cx->provider_pid, out, START_TIMEOUT_MS);
    if (port < 0)
        return -1;
    snprintf(cx->provider_url, sizeof(cx->provider_url), "http://127.0.0.1:%d", port);
    return 0;
}

/* `orderd token create` processes at once: a thousand users one after the other took minutes. */
#define TOKEN_JOBS 8

/* Starts `orderd token create --user NAME`, its stdout to token.<slot>.stdout; the pid or -1. */
static pid_t spawn_token(struct chaos *cx, const char *user, int slot)
{
    char out[PATH_MAX + 48], err[PATH_MAX + 32];
    char *argv[] = {(char *)cx->o.orderd_bin, (char *)"token", (char *)"create", (char *)"--db",
                    cx->db, (char *)"--user", (char *)user,
                    /* On a shard set the users and tokens are the catalogue's. */
                    cx->o.catalogue ? (char *)"--catalogue" : NULL, (char *)cx->o.catalogue, NULL};

    snprintf(out, sizeof(out), "%s/token.%d.stdout", cx->workdir, slot);
    snprintf(err, sizeof(err), "%s/token.stderr", cx->workdir);
    return ck_spawn(cx->envp, argv, out, err, -1, -1);
}

/* Waits for the `token create` of `slot` and reads its token (alone on stdout) into `tok`.  0 or
 * -1. */
static int finish_token(struct chaos *cx, pid_t pid, int slot, char *tok, size_t cap)
{
    char out[PATH_MAX + 48];
    int status = 0;
    FILE *f;
    size_t n;

    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return -1;
    snprintf(out, sizeof(out), "%s/token.%d.stdout", cx->workdir, slot);
    f = fopen(out, "r");
    if (!f)
        return -1;
    n = fread(tok, 1, cap - 1, f);
    fclose(f);
    tok[n] = '\0';
    while (n > 0 && (tok[n - 1] == '\n' || tok[n - 1] == '\r'))
        tok[--n] = '\0';
    if (n == 0 || strchr(tok, '\n'))
        return -1;
    return 0;
}

int ck_create_tokens(struct chaos *cx)
{
    char *key = ck_random_key();
    pid_t pids[TOKEN_JOBS];
    int i, first = 0, rc = 0;

    /* Fresh users, one random prefix for the run: chaos-<12 hex> alone, or -1, -2, ... after it. */
    for (i = 0; i < cx->n_users; i++) {
        struct ck_user *u = &cx->users[i];
        if (cx->n_users == 1)
            snprintf(u->name, sizeof(u->name), "chaos-%.12s", key + strlen("idem-check-"));
        else
            snprintf(u->name, sizeof(u->name), "chaos-%.12s-%d", key + strlen("idem-check-"),
                     i + 1);
    }
    free(key);
    /* The first alone (it migrates a fresh store), then up to TOKEN_JOBS at once. */
    while (first < cx->n_users && rc == 0) {
        int n = first == 0                         ? 1
                : cx->n_users - first < TOKEN_JOBS ? cx->n_users - first
                                                   : TOKEN_JOBS;
        for (i = 0; i < n; i++)
            pids[i] = spawn_token(cx, cx->users[first + i].name, i);
        for (i = 0; i < n; i++) /* each waited for, also after a failure */
            if (finish_token(cx, pids[i], i, cx->users[first + i].token,
                             sizeof(cx->users[first + i].token)) < 0)
                rc = -1;
        first += n;
    }
    return rc;
}

int ck_start_orderd(struct chaos *cx, int i)
{
    struct ck_instance *in = &cx->inst[i];
    char listen[32], out[PATH_MAX + 48], err[PATH_MAX + 48];
    char *argv[40];
    int argc = 0;
    long long end = clock_mono_ms() + START_TIMEOUT_MS;
    int port = in->port;

    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    argv[argc++] = (char *)cx->o.orderd_bin;
    argv[argc++] = (char *)"serve";
    argv[argc++] = (char *)"--listen";
    argv[argc++] = listen;
    argv[argc++] = (char *)"--db";
    argv[argc++] = cx->db;
    argv[argc++] = (char *)"--provider";
    argv[argc++] = cx->provider_url;
    argv[argc++] = (char *)"--lease-ms=1500";
    argv[argc++] = (char *)"--wait-ms=1000";
    argv[argc++] = (char *)"--provider-timeout-ms=1000";
    argv[argc++] = (char *)"--completer-interval-ms=200";
    argv[argc++] = (char *)"--reconciler-interval-ms=200";
    argv[argc++] = (char *)"--reconcile-after-ms=500";
    argv[argc++] = (char *)"--outbox-interval-ms=100";
    argv[argc++] = (char *)"--outbox-max-attempts=1000";
    /* Several instances on one store: fewer connections each (a PostgreSQL has 100 by default). */
    argv[argc++] = cx->n_inst > 2 ? (char *)"--db-pool=8" : (char *)"--db-pool=16";
    if (cx->o.catalogue) { /* a shard set's products, users and tokens */
        argv[argc++] = (char *)"--catalogue";
        argv[argc++] = (char *)cx->o.catalogue;
    }
    argv[argc] = NULL;
    for (;;) {
        pid_t pid;
        int got;
        pthread_mutex_lock(&cx->lock);
        in->gen++;
        snprintf(out, sizeof(out), "%s/orderd.%d.%d.stdout", cx->workdir, i + 1, in->gen);
        pthread_mutex_unlock(&cx->lock);
        snprintf(err, sizeof(err), "%s/orderd.%d.stderr", cx->workdir, i + 1);
        pid = ck_spawn(cx->envp, argv, out, err, -1, -1);
        if (pid < 0)
            return -1;
        got = wait_listening(pid, out, START_TIMEOUT_MS);
        if (got > 0) {
            pthread_mutex_lock(&cx->lock);
            in->pid = pid;
            in->port = got;
            in->addr = htonl(0x7f000001u);
            snprintf(in->url, sizeof(in->url), "http://127.0.0.1:%d", got);
            pthread_mutex_unlock(&cx->lock);
            if (cx->proxy_on && !cx->o.haproxy_config) /* else HAProxy is its upstream */
                ck_proxy_set_upstream_port(&cx->proxy, i, got);
            if (cx->hook_proxy_on)
                ck_proxy_set_upstream_port(&cx->hook_proxy, i, got);
            return 0;
        }
        /* A fixed port may still be held for a moment by the process just killed.  While the
         * database fails over there may be no primary to open the store on: orderd exits, and
         * is tried again until the failover is over, then for a whole window of its own. */
        if (ck_schedule_running(cx, CK_FAILOVER))
            end = clock_mono_ms() + START_TIMEOUT_MS;
        else if (port == 0 || clock_mono_ms() > end)
            return -1;
        clock_sleep_ms(ck_schedule_running(cx, CK_FAILOVER) ? 500 : 100);
    }
}

int ck_kill_restart(struct chaos *cx, int i)
{
    pid_t pid;

    pthread_mutex_lock(&cx->lock);
    pid = cx->inst[i].pid;
    cx->inst[i].pid = -1;
    pthread_mutex_unlock(&cx->lock);
    if (pid <= 0)
        return -1;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    atomic_fetch_add(&cx->inst[i].kills, 1);
    atomic_fetch_add(&cx->kills, 1);
    return ck_start_orderd(cx, i);
}

void ck_stop_children(struct chaos *cx)
{
    pid_t pids[CK_MAX_INSTANCES + 2];
    int i, n = 0;

    pthread_mutex_lock(&cx->lock);
    for (i = 0; i < cx->n_inst; i++) {
        pids[n++] = cx->inst[i].pid;
        cx->inst[i].pid = -1;
    }
    pthread_mutex_unlock(&cx->lock);
    pids[n++] = cx->provider_pid;
    cx->provider_pid = -1;
    pids[n++] = cx->lb.pid; /* HAProxy (--haproxy-config), -1 when not started */
    cx->lb.pid = -1;
    stop_all(pids, n);
}

void ck_free_env(char **env)
{
    size_t i;
    for (i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}
