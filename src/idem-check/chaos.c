/*
 * chaos.c - `idem-check chaos`: the command line and the run.  It starts provider-sim and one or
 * more orderd instances on one store (or attaches to running ones), puts the fault-injecting
 * proxy (fault_proxy.c) in front of orderd (and, with webhooks on, a second one between
 * provider-sim's webhooks and orderd), turns on provider faults, drives N business intents from M
 * threads with libidem-client (each intent one fresh key, retried with that key through the proxy;
 * some sent twice at once), kills a random orderd with SIGKILL on a schedule and brings it back on
 * the same port and store (and, with --failover-every, fails the database over: chaos_failover.c),
 * then has chaos_audit.c audit that every intent took effect exactly once and chaos_report.c print
 * the verdict.  docs/chaos.md is the user's side.
 */
#include <errno.h>
#include <getopt.h>
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
    struct idem_client *c = ck_open_client(d->cx, 30000, 1);
    if (c) {
        ck_send_intent(c, d->cx->proxy_url, d->cx->auth, d->it->key, &d->it->b, NULL, 0);
        idem_client_close(c);
    }
    return NULL;
}

static void *client_main(void *arg)
{
    struct chaos *cx = arg;
    struct idem_client *c = ck_open_client(cx, 30000, 1);
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

        if (i >= cx->o.intents || atomic_load(&cx->stop_drive) ||
            clock_mono_ms() >= cx->deadline_ms)
            break;
        it = &cx->in[i];
        it->started = 1;
        if (cx->o.dup_rate > 0 && ck_rng_double(&rng) < cx->o.dup_rate) {
            d.cx = cx;
            d.it = it;
            it->dup = 1;
            atomic_fetch_add(&cx->dup_sends, 1);
            dup_started = pthread_create(&t, NULL, dup_main, &d) == 0;
        }
        ck_send_intent(c, cx->proxy_url, cx->auth, it->key, &it->a, NULL, 0);
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

/* ---- command line --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fputs("usage: idem-check chaos --orderd-bin PATH --provider-bin PATH [options]\n"
          "       idem-check chaos --attach --orderd-url URL[,URL...] --token T\n"
          "                        [--provider-url URL] [options]\n"
          "\n"
          "Starts provider-sim and N orderd instances on one store on 127.0.0.1 (or, with\n"
          "--attach, uses running ones), a fault-injecting proxy in front of orderd, and drives\n"
          "business intents (POST /api/orders, one fresh Idempotency-Key each) through it with\n"
          "libidem-client, under dropped responses, connection resets, requests cut mid-body,\n"
          "duplicated sends, provider faults, duplicated webhooks and kill -9 of orderd; then\n"
          "audits that every intent made exactly one order, one charge and one confirmation\n"
          "email, and that every webhook event was accepted (docs/chaos.md).\n"
          "\n"
          "what runs:\n"
          "  --orderd-bin PATH       the orderd program (required unless --attach)\n"
          "  --provider-bin PATH     the provider-sim program (required unless --attach)\n"
          "  --db URI                orderd's store, sqlite:PATH or postgresql://...\n"
          "                          (default: sqlite in a new temp dir)\n"
          "  --instances N           orderd processes on that one store, 1..8 (default 1)\n"
          "  --balance rr|random     how the proxy spreads connections over them (default rr)\n"
          "  --no-webhooks           provider-sim sends no webhooks (default: on, through a\n"
          "                          second fault proxy to the instances)\n"
          "  --webhook-dup N         deliver every webhook event N times, 1..10 (default 2)\n"
          "  --haproxy-config FILE   start HAProxy with FILE (docs/ops/haproxy.cfg) between\n"
          "                          the proxy and the instances: its retry-on re-sends what\n"
          "                          failed on one instance to another (addresses in\n"
          "                          IDEM_ORDERD_1..8, IDEM_LB_BIND, IDEM_LB_STATS)\n"
          "  --haproxy-bin PATH      the haproxy program (default: haproxy, in PATH or in\n"
          "                          /usr/sbin)\n"
          "attaching to running services (nothing is started or killed):\n"
          "  --attach                use running services instead of starting them\n"
          "  --orderd-url URL[,URL]  orderd instance(s) of one service, http://IPv4:PORT\n"
          "  --token T               bearer token of a user nothing else uses during the run\n"
          "  --provider-url URL      provider-sim: its faults and ledger (optional; without\n"
          "                          it no provider fault and no ledger audit)\n"
          "load:\n"
          "  --intents N             business intents (default 300)\n"
          "  --clients M             concurrent client threads (default 8)\n"
          "  --max-time S            stop starting intents after S seconds (default 60)\n"
          "  --grace S               after the drive, how long the audit waits for the\n"
          "                          service to settle what is pending (default 30)\n",
          f);
    /* Two strings: one would pass the 4095 characters C99 compilers must support. */
    fputs("faults (rates are 0..1):\n"
          "  --drop-rate R           share of proxied requests whose response is dropped\n"
          "  --reset-rate R          share of proxied requests reset before forwarding\n"
          "  --cut-rate R            share of proxied requests cut mid-body: headers and part\n"
          "                          of the body forwarded, then both sides reset\n"
          "  --dup-rate R            share of intents also sent by a second, concurrent sender\n"
          "  --provider-lost-rate R  provider-sim: effect done, response lost\n"
          "  --provider-5xx-rate R   provider-sim: 503 before anything runs\n"
          "  --kill-every S          kill -9 a random orderd every S seconds and restart it\n"
          "  --failover-every S      every S seconds of the drive, fail the database over\n"
          "                          with --failover-cmd: switchover, kill, switchover, ...\n"
          "  --failover-cmd CMD      run as /bin/sh -c 'CMD \"$1\"' with $1 switchover or\n"
          "                          kill; returns once the database takes writes again\n"
          "                          (at most 180 s; its output in the work dir's\n"
          "                          failover.log)\n"
          "audit:\n"
          "  --audit-page-size N     references per page of provider-sim's ledger, 1..1000\n"
          "                          (default 1000), and orders per page of orderd's list\n"
          "                          (at most 100); small values are for tests\n"
          "output:\n"
          "  --json                  one JSON object instead of the table\n"
          "  -h, --help              this help\n"
          "\n"
          "exit codes: 0 clean, 1 something duplicated, lost or unsettled (or a webhook not\n"
          "            accepted, or orderd could not be restarted, or a failover command\n"
          "            failed), 2 bad usage,\n"
          "            3 the services could not be started (or reached, with --attach)\n",
          f);
}

static int bad(const char *fmt, const char *arg)
{
    fputs("idem-check chaos: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n(try: idem-check chaos --help)\n", stderr);
    return CK_EXIT_USAGE;
}

/*
 * "http://HOST:PORT" with an optional "/" at the end; HOST an IPv4 address or "localhost" (the
 * proxy speaks plain TCP to it).  Fills the normalised URL, the address and the port; 0 or -1.
 */
static int parse_url(const char *s, size_t len, char *url, size_t cap, uint32_t *addr, int *port)
{
    char host[64], portbuf[8];
    const char *colon;
    struct in_addr in;
    long p;

    if (len < 8 || strncmp(s, "http://", 7) != 0)
        return -1;
    s += 7;
    len -= 7;
    if (len > 0 && s[len - 1] == '/')
        len--;
    colon = memchr(s, ':', len);
    if (!colon || (size_t)(colon - s) >= sizeof(host) || colon == s ||
        len - (size_t)(colon - s) - 1 >= sizeof(portbuf) || len - (size_t)(colon - s) - 1 == 0)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    memcpy(portbuf, colon + 1, len - (size_t)(colon - s) - 1);
    portbuf[len - (size_t)(colon - s) - 1] = '\0';
    if (ck_parse_long(portbuf, 1, 65535, &p) < 0)
        return -1;
    if (strcmp(host, "localhost") == 0)
        in.s_addr = htonl(0x7f000001u);
    else if (inet_pton(AF_INET, host, &in) != 1)
        return -1;
    *addr = in.s_addr;
    *port = (int)p;
    snprintf(url, cap, "http://%s:%d", host, *port);
    return 0;
}

/* The comma-separated --orderd-url list into cx->inst; 0 or a usage error. */
static int parse_orderd_urls(struct chaos *cx, const char *list)
{
    const char *p = list;
    cx->n_inst = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        struct ck_instance *in;
        if (cx->n_inst == CK_MAX_INSTANCES)
            return bad("--orderd-url takes at most 8 URLs, not '%s'", list);
        in = &cx->inst[cx->n_inst];
        if (parse_url(p, len, in->url, sizeof(in->url), &in->addr, &in->port) < 0)
            return bad("--orderd-url wants http://IPv4:PORT[,http://IPv4:PORT...], not '%s'", list);
        in->pid = -1;
        cx->n_inst++;
        p += len;
        if (*p == ',')
            p++;
    }
    return cx->n_inst > 0 ? 0 : bad("--orderd-url is empty%s", "");
}

static int parse(int argc, char **argv, struct chaos *cx)
{
    enum {
        O_ORD = 256,
        O_PROV,
        O_DB,
        O_INT,
        O_CLI,
        O_MAX,
        O_DROP,
        O_RESET,
        O_CUT,
        O_DUP,
        O_LOST,
        O_5XX,
        O_KILL,
        O_JSON,
        O_INST,
        O_BAL,
        O_NOHOOK,
        O_HOOKDUP,
        O_ATTACH,
        O_OURL,
        O_PURL,
        O_TOKEN,
        O_GRACE,
        O_PAGE,
        O_LBCFG,
        O_LBBIN,
        O_FOEVERY,
        O_FOCMD
    };
    static const struct option lo[] = {
        {"orderd-bin", required_argument, NULL, O_ORD},
        {"provider-bin", required_argument, NULL, O_PROV},
        {"db", required_argument, NULL, O_DB},
        {"instances", required_argument, NULL, O_INST},
        {"balance", required_argument, NULL, O_BAL},
        {"no-webhooks", no_argument, NULL, O_NOHOOK},
        {"webhook-dup", required_argument, NULL, O_HOOKDUP},
        {"haproxy-config", required_argument, NULL, O_LBCFG},
        {"haproxy-bin", required_argument, NULL, O_LBBIN},
        {"attach", no_argument, NULL, O_ATTACH},
        {"orderd-url", required_argument, NULL, O_OURL},
        {"provider-url", required_argument, NULL, O_PURL},
        {"token", required_argument, NULL, O_TOKEN},
        {"intents", required_argument, NULL, O_INT},
        {"clients", required_argument, NULL, O_CLI},
        {"max-time", required_argument, NULL, O_MAX},
        {"grace", required_argument, NULL, O_GRACE},
        {"drop-rate", required_argument, NULL, O_DROP},
        {"reset-rate", required_argument, NULL, O_RESET},
        {"cut-rate", required_argument, NULL, O_CUT},
        {"dup-rate", required_argument, NULL, O_DUP},
        {"provider-lost-rate", required_argument, NULL, O_LOST},
        {"provider-5xx-rate", required_argument, NULL, O_5XX},
        {"kill-every", required_argument, NULL, O_KILL},
        {"failover-every", required_argument, NULL, O_FOEVERY},
        {"failover-cmd", required_argument, NULL, O_FOCMD},
        {"audit-page-size", required_argument, NULL, O_PAGE},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct chaos_opts *o = &cx->o;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (c) {
        case O_ORD:
            o->orderd_bin = optarg;
            break;
        case O_PROV:
            o->provider_bin = optarg;
            break;
        case O_DB:
            o->db = optarg;
            break;
        case O_INST:
            if (ck_parse_long(optarg, 1, CK_MAX_INSTANCES, &o->instances) < 0)
                return bad("--instances wants a number from 1 to 8, not '%s'", optarg);
            o->instances_set = 1;
            break;
        case O_BAL:
            if (strcmp(optarg, "rr") == 0)
                o->balance = CK_BALANCE_RR;
            else if (strcmp(optarg, "random") == 0)
                o->balance = CK_BALANCE_RANDOM;
            else
                return bad("--balance is rr or random, not '%s'", optarg);
            break;
        case O_NOHOOK:
            o->no_webhooks = 1;
            break;
        case O_HOOKDUP:
            if (ck_parse_long(optarg, 1, 10, &o->webhook_dup) < 0)
                return bad("--webhook-dup wants a number from 1 to 10, not '%s'", optarg);
            o->webhook_dup_set = 1;
            break;
        case O_ATTACH:
            o->attach = 1;
            break;
        case O_LBCFG:
            o->haproxy_config = optarg;
            break;
        case O_LBBIN:
            o->haproxy_bin = optarg;
            break;
        case O_OURL:
            o->orderd_urls = optarg;
            break;
        case O_PURL:
            o->provider_url = optarg;
            break;
        case O_TOKEN:
            o->token = optarg;
            break;
        case O_INT:
            if (ck_parse_long(optarg, 1, 10000000, &o->intents) < 0)
                return bad("--intents wants a number from 1 to 10000000, not '%s'", optarg);
            break;
        case O_CLI:
            if (ck_parse_long(optarg, 1, 256, &o->clients) < 0)
                return bad("--clients wants a number from 1 to 256, not '%s'", optarg);
            break;
        case O_MAX:
            if (ck_parse_long(optarg, 1, 86400, &o->max_time_s) < 0)
                return bad("--max-time wants seconds from 1 to 86400, not '%s'", optarg);
            break;
        case O_GRACE:
            if (ck_parse_long(optarg, 1, 3600, &o->grace_s) < 0)
                return bad("--grace wants seconds from 1 to 3600, not '%s'", optarg);
            break;
        case O_KILL:
            if (ck_parse_long(optarg, 1, 86400, &o->kill_every_s) < 0)
                return bad("--kill-every wants seconds from 1 to 86400, not '%s'", optarg);
            break;
        case O_FOEVERY:
            if (ck_parse_long(optarg, 1, 86400, &o->failover_every_s) < 0)
                return bad("--failover-every wants seconds from 1 to 86400, not '%s'", optarg);
            break;
        case O_FOCMD:
            if (!optarg[0] || strspn(optarg, " \t") == strlen(optarg))
                return bad("--failover-cmd wants a command, not '%s'", optarg);
            o->failover_cmd = optarg;
            break;
        case O_PAGE:
            if (ck_parse_long(optarg, 1, CK_PAGE_SIZE_MAX, &o->page_size) < 0)
                return bad("--audit-page-size wants a number from 1 to 1000, not '%s'", optarg);
            break;
        case O_DROP:
        case O_RESET:
        case O_CUT:
        case O_DUP:
        case O_LOST:
        case O_5XX: {
            double *d = c == O_DROP    ? &o->drop_rate
                        : c == O_RESET ? &o->reset_rate
                        : c == O_CUT   ? &o->cut_rate
                        : c == O_DUP   ? &o->dup_rate
                        : c == O_LOST  ? &o->lost_rate
                                       : &o->fail_rate;
            const struct option *f = lo;
            char msg[300];

            if (parse_double(optarg, 0.0, 1.0, d) < 0) {
                while (f->name != NULL && f->val != c)
                    f++;
                snprintf(msg, sizeof msg, "--%s must be a number from 0 to 1, not '%s'",
                         f->name ? f->name : "rate", optarg);
                return bad("%s", msg);
            }
            o->lost_set |= c == O_LOST;
            o->fail_set |= c == O_5XX;
            break;
        }
        case O_JSON:
            o->json = 1;
            break;
        case 'h':
            usage(stdout);
            return -1;
        case ':':
            return bad("%s needs a value", argv[optind - 1]);
        default:
            return bad("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad("unexpected argument '%s'", argv[optind]);
    if (o->drop_rate + o->reset_rate + o->cut_rate > 0.9)
        return bad("%s", "--drop-rate, --reset-rate and --cut-rate together must stay at or "
                         "below 0.9");
    if (o->fail_rate + o->lost_rate > 0.9)
        return bad("%s", "the provider rates together must stay at or below 0.9");
    if (o->no_webhooks && o->webhook_dup_set)
        return bad("%s", "--webhook-dup and --no-webhooks contradict each other");
    /* A failover is the database's: the same with --attach as with services started here. */
    if (o->failover_every_s && !o->failover_cmd)
        return bad("%s", "--failover-every needs --failover-cmd, the command that fails the "
                         "database over");
    if (o->failover_cmd && !o->failover_every_s)
        return bad("%s", "--failover-cmd needs --failover-every, how often to run it");
    if (o->attach) {
        /* Nothing is started or killed: the flags that would do so are mistakes. */
        if (o->kill_every_s)
            return bad("%s", "--kill-every needs processes idem-check started; with --attach "
                             "nothing is started or killed");
        if (o->instances_set)
            return bad("%s", "--instances starts orderd processes; with --attach, list the "
                             "running instances in --orderd-url");
        if (o->orderd_bin || o->provider_bin || o->db)
            return bad("%s", "--orderd-bin, --provider-bin and --db start services; with "
                             "--attach nothing is started");
        if (o->no_webhooks)
            return bad("%s", "--no-webhooks configures a provider-sim idem-check starts; with "
                             "--attach webhooks are as provider-sim was started");
        if (o->haproxy_config || o->haproxy_bin)
            return bad("%s", "--haproxy-config starts HAProxy on the orderd instances "
                             "idem-check starts; with --attach nothing is started");
        if (!o->orderd_urls || !o->token)
            return bad("%s", "--attach needs --orderd-url and --token");
        if (!o->token[0] || strpbrk(o->token, " \r\n"))
            return bad("%s", "--token must be one non-empty bearer token");
        if (!o->provider_url && (o->lost_set || o->fail_set || o->webhook_dup_set))
            return bad("%s", "provider faults and --webhook-dup need --provider-url");
        if (parse_orderd_urls(cx, o->orderd_urls) != 0)
            return CK_EXIT_USAGE;
        if (o->provider_url) {
            uint32_t a;
            int p;
            if (parse_url(o->provider_url, strlen(o->provider_url), cx->provider_url,
                          sizeof(cx->provider_url), &a, &p) < 0)
                return bad("--provider-url wants http://IPv4:PORT, not '%s'", o->provider_url);
        }
        snprintf(cx->token, sizeof(cx->token), "%s", o->token);
        return 0;
    }
    if (o->orderd_urls || o->provider_url || o->token)
        return bad("%s", "--orderd-url, --provider-url and --token are for --attach");
    if (!o->orderd_bin || !o->provider_bin)
        return bad("%s", "--orderd-bin and --provider-bin are required (or --attach)");
    if (access(o->orderd_bin, X_OK) != 0)
        return bad("--orderd-bin '%s' is not an executable", o->orderd_bin);
    if (access(o->provider_bin, X_OK) != 0)
        return bad("--provider-bin '%s' is not an executable", o->provider_bin);
    if (o->db && strncmp(o->db, "sqlite:", 7) != 0 && strncmp(o->db, "postgres", 8) != 0)
        return bad("--db wants sqlite:PATH or postgresql://..., not '%s'", o->db);
    if (o->haproxy_bin && !o->haproxy_config)
        return bad("%s", "--haproxy-bin needs --haproxy-config");
    if (o->haproxy_config) {
        char why[PATH_MAX + 200];
        if (access(o->haproxy_config, R_OK) != 0)
            return bad("--haproxy-config '%s' is not a readable file", o->haproxy_config);
        if (ck_haproxy_find_bin(cx, why, sizeof(why)) < 0)
            return bad("%s", why);
    }
    cx->n_inst = (int)o->instances;
    return 0;
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
        if (ck_create_token(cx) < 0) {
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
    snprintf(cx->auth, sizeof(cx->auth), "Authorization: Bearer %s", cx->token);
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
    /* Failovers first: the killer reads cx->fo (ck_failover_running) from its own thread. */
    if (cx->o.failover_every_s > 0 && ck_failover_start(cx) < 0)
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
    /* No new failover; one running is waited for: the audit needs a primary. */
    ck_failover_stop(cx);
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

int ck_chaos_main(int argc, char **argv)
{
    struct chaos *cx = xmalloc(sizeof(*cx));
    struct ck_audit au;
    struct ck_chaos_verdict v;
    pthread_t killer;
    int rc, have_killer = 0, curl_on = 0;
    long k;
    long long t0 = clock_mono_ms();
    char failover_why[PATH_MAX + 1024];

    memset(cx, 0, sizeof(*cx));
    memset(&au, 0, sizeof(au));
    memset(&v, 0, sizeof(v));
    cx->o.intents = 300;
    cx->o.clients = 8;
    cx->o.max_time_s = 60;
    cx->o.grace_s = 30;
    cx->o.instances = 1;
    cx->o.webhook_dup = 2;
    cx->o.page_size = CK_PAGE_SIZE_MAX;
    cx->provider_pid = -1;
    cx->lb.pid = -1;
    cx->tty = isatty(STDERR_FILENO);
    pthread_mutex_init(&cx->lock, NULL);
    rc = parse(argc, argv, cx);
    if (rc != 0) {
        pthread_mutex_destroy(&cx->lock);
        free(cx);
        return rc < 0 ? CK_EXIT_OK : rc;
    }
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
    /* Attached, nothing else is kept: a work directory only for the failover command's log. */
    if (cx->o.attach && cx->o.failover_cmd && make_workdir(cx) < 0)
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
    for (k = 0; k < cx->o.intents; k++)
        cx->in[k].key = ck_random_key();
    drive(cx, &killer, &have_killer);
    ck_haproxy_read_stats(cx); /* what HAProxy re-sent during the drive */

    /* Faults off, then the audit: straight to orderd, no proxy in between. */
    ck_proxy_stop(&cx->proxy);
    cx->proxy_on = 0;
    if (cx->hook_proxy_on)
        ck_proxy_set_faults(&cx->hook_proxy, 0.0, 0.0, 0.0);
    /* A failed failover first: it is why an orderd restart after it fails too. */
    if (ck_failover_problem(cx, failover_why, sizeof(failover_why))) {
        fprintf(stderr, "idem-check chaos: the database failover failed: %s\n", failover_why);
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
    ck_failover_free(cx);
    if (cx->in)
        for (k = 0; k < cx->o.intents; k++)
            free(cx->in[k].key);
    free(cx->in);
    free(cx->before_ids);
    ck_free_env(cx->envp);
    if (curl_on)
        ck_http_global_cleanup();
    pthread_mutex_destroy(&cx->lock);
    free(cx);
    return rc;
}
