/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos.c - `idem-check chaos`: the run, from the options main.c parsed.  It starts provider-sim
 * and one or more orderd instances on one store (or attaches to running ones), puts the
 * fault-injecting proxy (fault_proxy.c) in front of orderd (and, with webhooks on, a second one
 * between provider-sim's webhooks and orderd), turns on provider faults, drives N business intents
 * from M threads with libidem-client (each intent one fresh key, retried with that key through the
 * proxy; some sent twice at once), kills a random orderd with SIGKILL on a schedule and brings it
 * back on the same port and store (and, with --failover-every, fails the database over, and with
 * --move-every moves buckets of a shard set: chaos_schedule.c), then has chaos_audit.c audit that
 * every intent took effect exactly once and chaos_report.c print the verdict.  docs/chaos.md is the
 * user's side.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/resource.h>

#include <idem/client.h>

#include "chaos.h"
#include "clock.h"
#include "banned.h"

extern char **environ;

/* ---- the clients ---------------------------------------------------------------------------- */

struct dup_arg {
    struct chaos *cx;
    struct ck_intent *it;
};

static void *dup_main(void *arg)
{
    struct dup_arg *d = arg;
    struct ck_sender sender = {d->cx, d->it->user};
    struct idem_client *c = ck_open_client(d->cx, &sender, 30000);
    if (c) {
        ck_send_intent(c, d->cx->proxy_url, d->cx->users[d->it->user].auth, d->it->key, &d->it->b,
                       NULL, 0);
        idem_client_close(c);
    }
    return NULL;
}

static void *client_main(void *arg)
{
    struct chaos *cx = arg;
    struct ck_sender sender = {cx, -1};
    struct idem_client *c = ck_open_client(cx, &sender, 30000);
    struct ck_rng rng;

    ck_rng_seed(&rng);
    if (!c) {
        atomic_fetch_sub(&cx->alive, 1);
        return NULL;
    }
    for (;;) {
        long i = atomic_fetch_add(&cx->next, 1);
        struct ck_intent *it;
        pthread_t t;
        struct dup_arg d;
        int dup_started = 0;

        /* Past --max-time a failover or a move still running is driven through: its
         * unavailability is measured only while clients send. */
        if (i >= cx->o.intents || atomic_load(&cx->stop_drive) ||
            (clock_mono_ms() >= cx->deadline_ms && !ck_schedule_running(cx, -1)))
            break;
        it = &cx->in[i];
        it->started = 1;
        sender.user = it->user; /* whose attempts these are */
        if (cx->o.dup_rate > 0 && ck_rng_double(&rng) < cx->o.dup_rate) {
            d.cx = cx;
            d.it = it;
            it->dup = 1;
            atomic_fetch_add(&cx->dup_sends, 1);
            dup_started = pthread_create(&t, NULL, dup_main, &d) == 0;
        }
        ck_send_intent(c, cx->proxy_url, cx->users[it->user].auth, it->key, &it->a, NULL, 0);
        if (dup_started)
            pthread_join(t, NULL);
        atomic_fetch_add(&cx->done, 1);
    }
    idem_client_close(c);
    atomic_fetch_sub(&cx->alive, 1);
    return NULL;
}

/* ---- kill -9 and restart -------------------------------------------------------------------- */

static void *killer_main(void *arg)
{
    struct chaos *cx = arg;
    struct ck_rng rng;

    ck_rng_seed(&rng);
    while (!atomic_load(&cx->stop_kill)) {
        long long wake = clock_mono_ms() + cx->o.kill_every_s * 1000;
        int i;
        while (clock_mono_ms() < wake && !atomic_load(&cx->stop_kill))
            clock_sleep_ms(50);
        if (atomic_load(&cx->stop_kill))
            break;
        i = (int)(ck_rng_double(&rng) * cx->n_inst);
        if (i >= cx->n_inst)
            i = cx->n_inst - 1;
        if (ck_kill_restart(cx, i) < 0) {
            atomic_fetch_add(&cx->restart_failures, 1);
            break;
        }
    }
    /* PR_SET_PDEATHSIG fires when the *thread* that forked a child ends: this thread stays until
     * the orderd processes it started have been stopped. */
    atomic_store(&cx->killer_idle, 1);
    while (!atomic_load(&cx->killer_release))
        clock_sleep_ms(20);
    return NULL;
}

/* ---- progress ------------------------------------------------------------------------------- */

#define PROGRESS_LINE_MS 10000

/*
 * The drive's progress on stderr: on a terminal a bar redrawn in place (every call, 5 a second);
 * elsewhere (a pipe, a log file) a plain line every PROGRESS_LINE_MS and a last one, so a log
 * gets a line every few seconds rather than thousands of bar frames.
 */
static void progress(struct chaos *cx, int final)
{
    long done = atomic_load(&cx->done), n = cx->o.intents;
    long long now = clock_mono_ms();
    int filled = n ? (int)(done * 30 / n) : 30, i;
    char bar[31];

    if (!cx->tty) {
        if (!final && cx->progress_line_ms && now - cx->progress_line_ms < PROGRESS_LINE_MS)
            return;
        if (!cx->progress_line_ms)
            cx->progress_started_ms = now;
        cx->progress_line_ms = now;
        fprintf(stderr, "chaos: %ld/%ld intents, %ld retries, %ld kills (%lld s)\n", done, n,
                atomic_load(&cx->retries), atomic_load(&cx->kills),
                (now - cx->progress_started_ms) / 1000);
        return;
    }
    for (i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : ' ';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %ld/%ld intents, %ld retries, %ld kills%s", bar, done, n,
            atomic_load(&cx->retries), atomic_load(&cx->kills), final ? "\n" : "");
    fflush(stderr);
}

/* ---- the run -------------------------------------------------------------------------------- */

/* The children's environment: ours, with the webhook secret for orderd and provider-sim (an
 * environment variable keeps it out of `ps`). */
static char **child_env(const char *secret)
{
    static const char *const names[2] = {"ORDERD_WEBHOOK_SECRET=", "PROVIDER_SIM_WEBHOOK_SECRET="};
    size_t n = 0, k = 0, i;
    char **env;

    while (environ && environ[n])
        n++;
    env = xmalloc((n + 3) * sizeof(*env));
    for (i = 0; i < n; i++)
        if (strncmp(environ[i], names[0], strlen(names[0])) != 0 &&
            strncmp(environ[i], names[1], strlen(names[1])) != 0)
            env[k++] = xstrdup(environ[i]);
    for (i = 0; i < 2 && secret; i++) {
        size_t len = strlen(names[i]) + strlen(secret) + 1;
        env[k] = xmalloc(len);
        snprintf(env[k], len, "%s%s", names[i], secret);
        k++;
    }
    env[k] = NULL;
    return env;
}

/* Starts (or, attached, reaches) everything the drive needs; 0 or an exit code. */
static int set_up(struct chaos *cx)
{
    uint32_t addr[CK_MAX_INSTANCES];
    int port[CK_MAX_INSTANCES], i;
    char why[512] = "";

    /* The map first: a directory that cannot be read stops the run before anything starts. */
    if (cx->o.shard_directory && ck_shards_read_map(cx, why, sizeof(why)) < 0) {
        fprintf(stderr, "idem-check chaos: --shard-directory: %s\n", why);
        return CK_EXIT_SETUP;
    }
    for (i = 0; i < cx->n_inst; i++) {
        addr[i] = cx->o.attach ? cx->inst[i].addr : htonl(0x7f000001u);
        port[i] = cx->o.attach ? cx->inst[i].port : 0;
        if (!cx->o.attach)
            cx->inst[i].pid = -1;
    }
    /* With HAProxy the proxy has one upstream, HAProxy, whose port is known once it runs. */
    if (ck_proxy_start(&cx->proxy, cx->o.haproxy_config ? 1 : cx->n_inst, addr, port,
                       (enum ck_balance)cx->o.balance) < 0) {
        fprintf(stderr, "idem-check chaos: cannot start the proxy: %s\n", strerror(errno));
        return CK_EXIT_SETUP;
    }
    cx->proxy_on = 1;
    snprintf(cx->proxy_url, sizeof(cx->proxy_url), "http://127.0.0.1:%d", cx->proxy.port);

    if (!cx->o.attach) {
        if (cx->webhooks) {
            if (ck_proxy_start(&cx->hook_proxy, cx->n_inst, addr, port,
                               (enum ck_balance)cx->o.balance) < 0) {
                fprintf(stderr, "idem-check chaos: cannot start the webhook proxy: %s\n",
                        strerror(errno));
                return CK_EXIT_SETUP;
            }
            cx->hook_proxy_on = 1;
            snprintf(cx->hook_proxy_url, sizeof(cx->hook_proxy_url), "http://127.0.0.1:%d",
                     cx->hook_proxy.port);
        }
        if (ck_start_provider(cx) < 0) {
            fprintf(stderr, "idem-check chaos: provider-sim did not start (see %s)\n", cx->workdir);
            return CK_EXIT_SETUP;
        }
        if (ck_create_tokens(cx) < 0) {
            fprintf(stderr, "idem-check chaos: `orderd token create` failed (see %s)\n",
                    cx->workdir);
            return CK_EXIT_SETUP;
        }
        for (i = 0; i < cx->n_inst; i++)
            if (ck_start_orderd(cx, i) < 0) {
                fprintf(stderr, "idem-check chaos: orderd %d did not start (see %s/orderd.%d.*)\n",
                        i + 1, cx->workdir, i + 1);
                return CK_EXIT_SETUP;
            }
        if (cx->o.haproxy_config && ck_haproxy_start(cx) < 0)
            return CK_EXIT_SETUP;
    }
    for (i = 0; i < cx->n_users; i++)
        snprintf(cx->users[i].auth, sizeof(cx->users[i].auth), "Authorization: Bearer %s",
                 cx->users[i].token);
    if (cx->shards && ck_shards_place_users(cx, why, sizeof(why)) < 0) {
        fprintf(stderr, "idem-check chaos: --shard-directory: %s\n", why);
        return CK_EXIT_SETUP;
    }
    if (ck_audit_before(cx, why, sizeof(why)) < 0) {
        fprintf(stderr, "idem-check chaos: %s\n", why);
        return CK_EXIT_SETUP;
    }
    if (cx->provider_url[0] &&
        (!cx->o.attach || cx->o.fail_set || cx->o.lost_set || cx->o.webhook_dup_set) &&
        ck_provider_faults(cx, !cx->o.attach || cx->o.fail_set ? cx->o.fail_rate : -1,
                           !cx->o.attach || cx->o.lost_set ? cx->o.lost_rate : -1,
                           cx->o.attach && cx->o.webhook_dup_set ? cx->o.webhook_dup : 0) < 0) {
        fputs("idem-check chaos: POST /v1/faults to provider-sim failed\n", stderr);
        return CK_EXIT_SETUP;
    }
    return 0;
}

/* Runs the clients (and the killer) until every intent is done or --max-time is up. */
static void drive(struct chaos *cx, pthread_t *killer, int *have_killer)
{
    pthread_t *th;
    long k;

    ck_proxy_set_faults(&cx->proxy, cx->o.drop_rate, cx->o.reset_rate, cx->o.cut_rate);
    if (cx->hook_proxy_on)
        ck_proxy_set_faults(&cx->hook_proxy, cx->o.drop_rate, cx->o.reset_rate, cx->o.cut_rate);
    cx->deadline_ms = clock_mono_ms() + cx->o.max_time_s * 1000;
    /* Failovers first: the killer reads cx->sched (ck_schedule_running) from its own thread. */
    if (cx->o.failover_every_s > 0 && ck_schedule_start(cx, CK_FAILOVER) < 0)
        atomic_store(&cx->stop_drive, 1);
    if (cx->o.move_every_s > 0 && ck_schedule_start(cx, CK_MOVE) < 0)
        atomic_store(&cx->stop_drive, 1);
    if (cx->o.kill_every_s > 0)
        *have_killer = pthread_create(killer, NULL, killer_main, cx) == 0;
    th = xmalloc((size_t)cx->o.clients * sizeof(*th));
    for (k = 0; k < cx->o.clients; k++) {
        atomic_fetch_add(&cx->alive, 1);
        if (pthread_create(&th[k], NULL, client_main, cx) != 0) {
            atomic_fetch_sub(&cx->alive, 1);
            th[k] = 0;
        }
    }
    while (atomic_load(&cx->alive) > 0) {
        progress(cx, 0);
        clock_sleep_ms(200);
    }
    for (k = 0; k < cx->o.clients; k++)
        if (th[k])
            pthread_join(th[k], NULL);
    free(th);
    progress(cx, 1);
    atomic_store(&cx->stop_kill, 1);
    /* No new failover or move; one running is waited for: the audit needs a primary, and the
     * buckets open. */
    ck_schedule_stop(cx);
    ck_shards_stop(cx);
    while (*have_killer && !atomic_load(&cx->killer_idle))
        clock_sleep_ms(20);
}

static int make_workdir(struct chaos *cx)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(cx->workdir, sizeof(cx->workdir), "%s/idem-chaos-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(cx->workdir)) {
        fprintf(stderr, "idem-check chaos: cannot make a work directory: %s\n", strerror(errno));
        cx->workdir[0] = '\0';
        return -1;
    }
    return 0;
}

struct chaos *ck_chaos_new(void)
{
    struct chaos *cx = xmalloc(sizeof(*cx));

    memset(cx, 0, sizeof(*cx));
    cx->provider_pid = -1;
    cx->lb.pid = -1;
    cx->tty = isatty(STDERR_FILENO);
    pthread_mutex_init(&cx->lock, NULL);
    return cx;
}

void ck_chaos_free(struct chaos *cx)
{
    free(cx->users);
    pthread_mutex_destroy(&cx->lock);
    free(cx);
}

int ck_chaos_run(struct chaos *cx)
{
    struct ck_audit au;
    struct ck_chaos_verdict v;
    pthread_t killer;
    int rc, have_killer = 0, curl_on = 0;
    long k;
    long long t0 = clock_mono_ms();
    char schedule_why[PATH_MAX + 1200];

    memset(&au, 0, sizeof(au));
    memset(&v, 0, sizeof(v));
    rc = CK_EXIT_SETUP;
    if (!cx->o.attach) {
        char *secret = NULL;
        if (make_workdir(cx) < 0)
            goto out;
        snprintf(cx->db, sizeof(cx->db), "%s", cx->o.db ? cx->o.db : "");
        if (!cx->o.db)
            snprintf(cx->db, sizeof(cx->db), "sqlite:%s/orderd.db", cx->workdir);
        cx->webhooks = !cx->o.no_webhooks;
        if (cx->webhooks)
            secret = ck_random_key();
        cx->envp = child_env(secret);
        free(secret);
    }
    /* Attached, nothing else is kept: a work directory only for the commands' logs. */
    if (cx->o.attach && (cx->o.failover_cmd || cx->o.move_cmd) && make_workdir(cx) < 0)
        goto out;
    if (ck_http_global_init() < 0) {
        fputs("idem-check chaos: cannot initialise libcurl\n", stderr);
        goto out;
    }
    curl_on = 1;
    rc = set_up(cx);
    if (rc != 0)
        goto out;

    cx->in = xmalloc((size_t)cx->o.intents * sizeof(*cx->in));
    memset(cx->in, 0, (size_t)cx->o.intents * sizeof(*cx->in));
    for (k = 0; k < cx->o.intents; k++) {
        cx->in[k].key = ck_random_key();
        cx->in[k].user = (int)(k % cx->n_users);
    }
    drive(cx, &killer, &have_killer);
    ck_haproxy_read_stats(cx); /* what HAProxy re-sent during the drive */

    /* Faults off, then the audit: straight to orderd, no proxy in between. */
    ck_proxy_stop(&cx->proxy);
    cx->proxy_on = 0;
    if (cx->hook_proxy_on)
        ck_proxy_set_faults(&cx->hook_proxy, 0.0, 0.0, 0.0);
    /* A failed failover (or move) first: it is why an orderd restart after it fails too. */
    if (ck_schedule_problem(cx, schedule_why, sizeof(schedule_why))) {
        fprintf(stderr, "idem-check chaos: %s\n", schedule_why);
        rc = CK_EXIT_FAIL;
        goto out;
    }
    if (atomic_load(&cx->restart_failures) > 0) {
        fprintf(stderr, "idem-check chaos: orderd could not be restarted (see %s)\n", cx->workdir);
        rc = CK_EXIT_FAIL;
        goto out;
    }
    if (cx->provider_url[0])
        (void)ck_provider_faults(cx, 0.0, 0.0, 0);
    ck_audit(cx, &au);
    ck_verdict_of(cx, &au, &v);
    rc = (v.duplicates || v.lost || v.unsettled || v.webhooks || au.problem[0] ||
          (cx->provider_url[0] && !au.ledger_ok))
             ? CK_EXIT_FAIL
             : CK_EXIT_OK;
    if (cx->o.json)
        ck_print_json(cx, &au, &v, (double)(clock_mono_ms() - t0) / 1000.0, rc);
    else
        ck_print_table(cx, &au, &v, (double)(clock_mono_ms() - t0) / 1000.0, rc);
    fflush(stdout);

out:
    if (cx->o.attach && cx->saved_ok)
        (void)ck_provider_faults(cx, cx->saved_fail, cx->saved_lost,
                                 cx->o.webhook_dup_set ? cx->saved_dup : 0);
    if (cx->proxy_on)
        ck_proxy_stop(&cx->proxy);
    if (cx->hook_proxy_on)
        ck_proxy_stop(&cx->hook_proxy);
    if (!cx->o.attach)
        ck_stop_children(cx);
    atomic_store(&cx->killer_release, 1);
    if (have_killer)
        pthread_join(killer, NULL);
    ck_schedule_free(cx);
    ck_shards_free(cx);
    if (cx->in)
        for (k = 0; k < cx->o.intents; k++)
            free(cx->in[k].key);
    free(cx->in);
    free(cx->before_ids);
    ck_free_env(cx->envp);
    if (curl_on)
        ck_http_global_cleanup();
    ck_chaos_free(cx);
    return rc;
}
