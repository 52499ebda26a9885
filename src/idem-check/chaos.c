/*
 * chaos.c - `idem-check chaos`: starts provider-sim and orderd on loopback, puts the
 * fault-injecting proxy (proxy.c) in front of orderd, turns on provider faults, drives N business
 * intents from M threads with libidem-client (each intent one fresh key, retried with that key
 * through the proxy; some sent twice at once), kills orderd with SIGKILL on a schedule and brings
 * it back on the same port and store, then audits that every intent took effect exactly once
 * (docs/chaos.md says how the audit decides).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <idem/client.h>
#include <jansson.h>
#include <openssl/rand.h>

#include "chaos.h"
#include "banned.h"

#define CHAOS_BODY "{\"productId\":\"p-1024\",\"quantity\":1}"
#define CHAOS_GRACE_MS 30000
#define CK_EXIT_SETUP 3

/* ---- random numbers ------------------------------------------------------------------------ */

void ck_rng_seed(struct ck_rng *r)
{
    uint64_t s = 0;
    if (RAND_bytes((unsigned char *)&s, (int)sizeof(s)) != 1)
        s = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    r->s = s ? s : 0x9E3779B97F4A7C15ull;
}

double ck_rng_double(struct ck_rng *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

/* ---- state ---------------------------------------------------------------------------------- */

struct chaos_opts {
    const char *orderd_bin, *provider_bin, *db;
    long intents, clients, max_time_s, kill_every_s;
    double drop_rate, reset_rate, dup_rate, lost_rate, fail_rate;
    int json;
};

struct seen {
    int status; /* final status this sender saw, 0 if none */
    char *body; /* its body when 2xx */
    size_t len;
};

struct intent {
    char *key;
    int started, dup;
    struct seen a, b; /* the sender, and the duplicate sender */
    char order_id[64];   /* from the audit's replay */
    int replay_status;
};

struct chaos {
    struct chaos_opts o;
    char workdir[PATH_MAX];
    char db[PATH_MAX + 64];
    char provider_url[64], orderd_url[64], proxy_url[96];
    char token[160], auth[200];
    int provider_port, orderd_port;
    pid_t provider_pid;
    pid_t orderd_pid; /* under lock */
    int orderd_gen;
    pthread_mutex_t lock;
    struct ck_proxy proxy;
    struct intent *in;
    atomic_long next, done, alive, retries, kills, dup_sends, restart_failures;
    atomic_int stop_drive, stop_kill, killer_idle, killer_release;
    long long deadline_ms;
};

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- child processes ------------------------------------------------------------------------ */

static pid_t spawn(char *const argv[], const char *out_path, const char *err_path)
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
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

/* Waits for "<prog>: listening on http://127.0.0.1:PORT" in the file; the port, or -1. */
static int wait_listening(pid_t pid, const char *path, long timeout_ms)
{
    long long end = now_ms() + timeout_ms;
    while (now_ms() < end) {
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
        ck_sleep_ms(20);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void stop_child(pid_t pid)
{
    int i;
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (i = 0; i < 100; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        ck_sleep_ms(50);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int start_provider(struct chaos *cx)
{
    char db[PATH_MAX + 32], out[PATH_MAX + 32], err[PATH_MAX + 32];
    char *argv[] = {(char *)cx->o.provider_bin, (char *)"--listen", (char *)"127.0.0.1:0",
                    (char *)"--db", db, NULL};
    snprintf(db, sizeof(db), "sqlite:%s/provider.db", cx->workdir);
    snprintf(out, sizeof(out), "%s/provider-sim.stdout", cx->workdir);
    snprintf(err, sizeof(err), "%s/provider-sim.stderr", cx->workdir);
    cx->provider_pid = spawn(argv, out, err);
    if (cx->provider_pid < 0)
        return -1;
    cx->provider_port = wait_listening(cx->provider_pid, out, 15000);
    if (cx->provider_port < 0)
        return -1;
    snprintf(cx->provider_url, sizeof(cx->provider_url), "http://127.0.0.1:%d",
             cx->provider_port);
    return 0;
}

/* `orderd token create`: the token alone on stdout. */
static int create_token(struct chaos *cx)
{
    char user[64], out[PATH_MAX + 32], err[PATH_MAX + 32];
    char *key = ck_random_key();
    char *argv[] = {(char *)cx->o.orderd_bin, (char *)"token", (char *)"create",
                    (char *)"--db", cx->db, (char *)"--user", user, NULL};
    pid_t pid;
    int status = 0;
    FILE *f;
    size_t n;

    snprintf(user, sizeof(user), "chaos-%.12s", key + strlen("idem-check-"));
    free(key);
    snprintf(out, sizeof(out), "%s/token.stdout", cx->workdir);
    snprintf(err, sizeof(err), "%s/token.stderr", cx->workdir);
    pid = spawn(argv, out, err);
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return -1;
    f = fopen(out, "r");
    if (!f)
        return -1;
    n = fread(cx->token, 1, sizeof(cx->token) - 1, f);
    fclose(f);
    cx->token[n] = '\0';
    while (n > 0 && (cx->token[n - 1] == '\n' || cx->token[n - 1] == '\r'))
        cx->token[--n] = '\0';
    if (n == 0 || strchr(cx->token, '\n'))
        return -1;
    snprintf(cx->auth, sizeof(cx->auth), "Authorization: Bearer %s", cx->token);
    return 0;
}

/* Starts orderd on `port` (0 the first time); retries while a fixed port is still busy. */
static int start_orderd(struct chaos *cx, int port)
{
    char listen[32], out[PATH_MAX + 32], err[PATH_MAX + 32];
    char *argv[40];
    int argc = 0;
    long long end = now_ms() + 15000;
    int sqlite = strncmp(cx->db, "sqlite:", 7) == 0;

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
    if (sqlite)
        argv[argc++] = (char *)"--sqlite-sync=normal";
    argv[argc] = NULL;
    for (;;) {
        pid_t pid;
        int got;
        pthread_mutex_lock(&cx->lock);
        cx->orderd_gen++;
        snprintf(out, sizeof(out), "%s/orderd.%d.stdout", cx->workdir, cx->orderd_gen);
        pthread_mutex_unlock(&cx->lock);
        snprintf(err, sizeof(err), "%s/orderd.stderr", cx->workdir);
        pid = spawn(argv, out, err);
        if (pid < 0)
            return -1;
        got = wait_listening(pid, out, 15000);
        if (got > 0) {
            pthread_mutex_lock(&cx->lock);
            cx->orderd_pid = pid;
            cx->orderd_port = got;
            pthread_mutex_unlock(&cx->lock);
            return 0;
        }
        if (port == 0 || now_ms() > end)
            return -1;
        ck_sleep_ms(100);
    }
}

/* ---- the clients ---------------------------------------------------------------------------- */

static void on_attempt(const struct idem_client_attempt *a, void *arg)
{
    struct chaos *cx = arg;
    if (a->outcome == IDEM_CLIENT_OUTCOME_NONE)
        atomic_fetch_add(&cx->retries, 1);
}

static struct idem_client *open_client(struct chaos *cx, int64_t max_time_ms, int count)
{
    struct idem_client_options co;
    struct idem_client *c = NULL;
    memset(&co, 0, sizeof(co));
    co.max_attempts = 1000;
    co.max_time_ms = max_time_ms;
    co.base_delay_ms = 50;
    co.max_delay_ms = 1000;
    co.connect_timeout_ms = 2000;
    co.attempt_timeout_ms = 10000;
    co.user_agent = "idem-check-chaos";
    if (count) {
        co.on_attempt = on_attempt;
        co.on_attempt_arg = cx;
    }
    if (idem_client_open(&co, &c) != 0)
        return NULL;
    return c;
}

/* Sends the intent's POST with its key to `base`; fills `s`. */
static void send_intent(struct idem_client *c, const char *base, const char *auth,
                        const char *key, struct seen *s)
{
    char url[160];
    /* One connection per attempt, so that the proxy's per-connection fate is per attempt. */
    const char *headers[2] = {auth, "Connection: close"};
    struct idem_client_request req;
    struct idem_client_response *resp = NULL;
    enum idem_client_outcome outcome;

    snprintf(url, sizeof(url), "%s/api/orders", base);
    memset(&req, 0, sizeof(req));
    req.method = "POST";
    req.url = url;
    req.headers = headers;
    req.nheaders = 2;
    req.body = CHAOS_BODY;
    req.body_len = strlen(CHAOS_BODY);
    req.key = key;
    s->status = 0;
    if (idem_client_send(c, &req, &resp, &outcome) != 0 || !resp)
        return;
    s->status = idem_client_response_status(resp);
    if (s->status >= 200 && s->status < 300) {
        size_t len = 0;
        const void *b = idem_client_response_body(resp, &len);
        s->body = ck_xmalloc(len + 1);
        memcpy(s->body, b, len);
        s->body[len] = '\0';
        s->len = len;
    }
    idem_client_response_free(resp);
}

struct dup_arg {
    struct chaos *cx;
    struct intent *it;
};

static void *dup_main(void *arg)
{
    struct dup_arg *d = arg;
    struct idem_client *c = open_client(d->cx, 30000, 1);
    if (c) {
        send_intent(c, d->cx->proxy_url, d->cx->auth, d->it->key, &d->it->b);
        idem_client_close(c);
    }
    return NULL;
}

static void *client_main(void *arg)
{
    struct chaos *cx = arg;
    struct idem_client *c = open_client(cx, 30000, 1);
    struct ck_rng rng;

    ck_rng_seed(&rng);
    if (!c) {
        atomic_fetch_sub(&cx->alive, 1);
        return NULL;
    }
    for (;;) {
        long i = atomic_fetch_add(&cx->next, 1);
        struct intent *it;
        pthread_t t;
        struct dup_arg d;
        int dup_started = 0;

        if (i >= cx->o.intents || atomic_load(&cx->stop_drive) || now_ms() >= cx->deadline_ms)
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
        send_intent(c, cx->proxy_url, cx->auth, it->key, &it->a);
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
    while (!atomic_load(&cx->stop_kill)) {
        long long wake = now_ms() + cx->o.kill_every_s * 1000;
        pid_t pid;
        while (now_ms() < wake && !atomic_load(&cx->stop_kill))
            ck_sleep_ms(50);
        if (atomic_load(&cx->stop_kill))
            break;
        pthread_mutex_lock(&cx->lock);
        pid = cx->orderd_pid;
        cx->orderd_pid = -1;
        pthread_mutex_unlock(&cx->lock);
        if (pid <= 0)
            break;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        atomic_fetch_add(&cx->kills, 1);
        if (start_orderd(cx, cx->orderd_port) < 0) {
            atomic_fetch_add(&cx->restart_failures, 1);
            break;
        }
    }
    /* PR_SET_PDEATHSIG fires when the *thread* that forked a child ends: this thread stays until
     * the orderd it started has been stopped. */
    atomic_store(&cx->killer_idle, 1);
    while (!atomic_load(&cx->killer_release))
        ck_sleep_ms(20);
    return NULL;
}

/* ---- progress ------------------------------------------------------------------------------- */

static void progress(struct chaos *cx, int final)
{
    long done = atomic_load(&cx->done), n = cx->o.intents;
    int filled = n ? (int)(done * 30 / n) : 30, i;
    char bar[31];
    for (i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : ' ';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %ld/%ld intents, %ld retries, %ld kills%s", bar, done, n,
            atomic_load(&cx->retries), atomic_load(&cx->kills), final ? "\n" : "");
    fflush(stderr);
}

/* ---- the audit ------------------------------------------------------------------------------ */

static json_t *get_json(const char *url, const char *token, long *status)
{
    struct ck_request rq;
    struct ck_response rs;
    json_t *doc = NULL;
    memset(&rq, 0, sizeof(rq));
    memset(&rs, 0, sizeof(rs));
    rq.method = "GET";
    rq.url = url;
    rq.token = token;
    ck_http_perform(&rq, &rs, 1, 10000);
    *status = rs.status;
    if (rs.status == 200 && rs.body.data)
        doc = json_loadb(rs.body.data, rs.body.len, 0, NULL);
    ck_response_release(&rs);
    return doc;
}

static void order_id_of(const char *body, size_t len, char *out, size_t cap)
{
    json_t *doc = json_loadb(body, len, 0, NULL);
    const char *id = doc ? json_string_value(json_object_get(doc, "orderId")) : NULL;
    snprintf(out, cap, "%s", id ? id : "");
    json_decref(doc);
}

struct order_row {
    char id[64];
    int pending, paid, matched;
};

struct audit {
    long started, finished_2xx, finished_in_audit, seen_2xx;
    long orders, paid, pending;
    long dup_orders, dup_mismatch, lost, not_durable, unsettled;
    long charges, emails, ledger_dups, extra_charges, extra_emails, missing_charges,
        missing_emails;
    long failed5xx, lost_responses;
    int ledger_clean, ledger_ok, list_ok;
    char note[512];
};

static int cmp_row(const void *a, const void *b)
{
    return strcmp(((const struct order_row *)a)->id, ((const struct order_row *)b)->id);
}

/* Every order of the user, sorted by id; NULL on failure. */
static struct order_row *list_orders(struct chaos *cx, size_t *n_out)
{
    struct order_row *rows = NULL;
    size_t n = 0, cap = 0;
    char cursor[256] = "";
    int pages = 0;
    for (;;) {
        char url[512];
        long st;
        json_t *doc, *arr, *o;
        const char *next;
        size_t i;
        snprintf(url, sizeof(url), "%s/api/orders?limit=100%s%s", cx->orderd_url,
                 cursor[0] ? "&cursor=" : "", cursor);
        doc = get_json(url, cx->token, &st);
        arr = doc ? json_object_get(doc, "orders") : NULL;
        if (!json_is_array(arr)) {
            json_decref(doc);
            free(rows);
            return NULL;
        }
        json_array_foreach(arr, i, o)
        {
            const char *id = json_string_value(json_object_get(o, "orderId"));
            const char *status = json_string_value(json_object_get(o, "status"));
            if (n == cap) {
                cap = cap ? cap * 2 : 256;
                rows = ck_xrealloc(rows, cap * sizeof(*rows));
            }
            memset(&rows[n], 0, sizeof(rows[n]));
            snprintf(rows[n].id, sizeof(rows[n].id), "%s", id ? id : "");
            rows[n].pending = status && strcmp(status, "pending_payment") == 0;
            rows[n].paid = status && strcmp(status, "paid") == 0;
            n++;
        }
        next = json_string_value(json_object_get(doc, "nextCursor"));
        if (!next || json_array_size(arr) == 0 || ++pages > 100000) {
            json_decref(doc);
            break;
        }
        snprintf(cursor, sizeof(cursor), "%s", next);
        json_decref(doc);
    }
    if (n)
        qsort(rows, n, sizeof(*rows), cmp_row);
    *n_out = n;
    return rows ? rows : ck_xmalloc(1);
}

static long json_int_at(json_t *doc, const char *a, const char *b)
{
    json_t *x = json_object_get(doc, a);
    return x ? (long)json_integer_value(json_object_get(x, b)) : 0;
}

/* Reads the ledger into `au`; 0 or -1. */
static int read_ledger(struct chaos *cx, struct audit *au)
{
    char url[128];
    long st;
    json_t *doc, *bt;
    snprintf(url, sizeof(url), "%s/v1/ledger?keys=0", cx->provider_url);
    doc = get_json(url, NULL, &st);
    if (!doc)
        return -1;
    au->charges = json_int_at(doc, "charges", "succeeded");
    bt = json_object_get(json_object_get(doc, "emails"), "byTemplate");
    au->emails = bt ? (long)json_integer_value(json_object_get(bt, "order_confirmation")) : 0;
    au->ledger_dups = (long)json_array_size(json_object_get(doc, "duplicates"));
    au->ledger_clean = json_is_true(json_object_get(doc, "clean"));
    au->failed5xx = json_int_at(doc, "requests", "failed5xx");
    au->lost_responses = json_int_at(doc, "requests", "lostResponses");
    json_decref(doc);
    return 0;
}

static int set_provider_faults(struct chaos *cx, double fail_rate, double lost_rate)
{
    char url[128], body[128];
    struct ck_request rq;
    struct ck_response rs;
    int ok;
    snprintf(url, sizeof(url), "%s/v1/faults", cx->provider_url);
    snprintf(body, sizeof(body), "{\"fail_rate\":%.4f,\"lost_rate\":%.4f}", fail_rate, lost_rate);
    memset(&rq, 0, sizeof(rq));
    memset(&rs, 0, sizeof(rs));
    rq.method = "POST";
    rq.url = url;
    rq.body = body;
    rq.body_len = strlen(body);
    rq.headers[0] = "Content-Type: application/json";
    rq.n_headers = 1;
    ck_http_perform(&rq, &rs, 1, 10000);
    ok = rs.status == 200;
    ck_response_release(&rs);
    return ok ? 0 : -1;
}

static int same_seen(const struct seen *s, int status, const char *body, size_t len)
{
    return s->status == status && s->len == len && memcmp(s->body, body, len) == 0;
}

static void audit(struct chaos *cx, struct audit *au)
{
    struct idem_client *c = open_client(cx, 60000, 0);
    struct order_row *rows = NULL;
    size_t n_rows = 0, i;
    long long grace_end;
    long k;

    /* 1. Replay every intent that was started, straight to orderd, with its key and body: the
     *    answer names the intent's one order, must be a 2xx, and must be byte-identical to every
     *    2xx a client saw (durability).  An intent no client saw finish is finished here. */
    for (k = 0; k < cx->o.intents; k++) {
        struct intent *it = &cx->in[k];
        struct seen r = {0, NULL, 0};
        int a2 = it->a.status >= 200 && it->a.status < 300;
        int b2 = it->b.status >= 200 && it->b.status < 300;
        if (!it->started)
            continue;
        au->started++;
        au->seen_2xx += a2 + b2;
        if (a2 || b2)
            au->finished_2xx++;
        if (c)
            send_intent(c, cx->orderd_url, cx->auth, it->key, &r);
        it->replay_status = r.status;
        if (r.status < 200 || r.status >= 300) {
            au->lost++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "intent %s: replay answered %d", it->key,
                         r.status);
            continue;
        }
        if (!a2 && !b2)
            au->finished_in_audit++;
        order_id_of(r.body, r.len, it->order_id, sizeof(it->order_id));
        if ((a2 && !same_seen(&it->a, r.status, r.body, r.len)) ||
            (b2 && !same_seen(&it->b, r.status, r.body, r.len))) {
            au->not_durable++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note),
                         "intent %s: a client saw a 2xx the replay does not repeat", it->key);
        }
        if (a2 && b2 && !same_seen(&it->a, it->b.status, it->b.body, it->b.len))
            au->dup_mismatch++;
        free(r.body);
    }
    idem_client_close(c);

    /* 2. The grace period: wait until no order is pending and the provider shows one charge
     *    and one confirmation per paid order (or the grace ends). */
    grace_end = now_ms() + CHAOS_GRACE_MS;
    for (;;) {
        free(rows);
        rows = list_orders(cx, &n_rows);
        au->ledger_ok = read_ledger(cx, au) == 0;
        au->list_ok = rows != NULL;
        au->paid = au->pending = 0;
        for (i = 0; rows && i < n_rows; i++) {
            au->paid += rows[i].paid;
            au->pending += rows[i].pending;
        }
        if (rows && au->ledger_ok && au->pending == 0 && au->charges >= au->paid &&
            au->emails >= au->paid)
            break;
        if (now_ms() > grace_end)
            break;
        ck_sleep_ms(250);
    }
    if (!rows) {
        au->lost = au->started;
        snprintf(au->note, sizeof(au->note), "GET /api/orders failed");
        return;
    }
    au->orders = (long)n_rows;

    /* 3. Match: each started intent's order must be listed, once; every listed order must
     *    belong to exactly one intent.  An order no intent names is a duplicate execution. */
    for (k = 0; k < cx->o.intents; k++) {
        struct intent *it = &cx->in[k];
        struct order_row key, *hit;
        if (!it->started || !it->order_id[0])
            continue;
        memset(&key, 0, sizeof(key));
        snprintf(key.id, sizeof(key.id), "%s", it->order_id);
        hit = bsearch(&key, rows, n_rows, sizeof(*rows), cmp_row);
        if (!hit) {
            au->lost++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "order %s is not listed", it->order_id);
        } else if (hit->matched++) {
            au->dup_orders++; /* two intents, one order: cannot happen with fresh keys */
        }
    }
    for (i = 0; i < n_rows; i++)
        if (!rows[i].matched) {
            au->dup_orders++;
            if (!au->note[0])
                snprintf(au->note, sizeof(au->note), "order %s belongs to no intent",
                         rows[i].id);
        }
    au->unsettled = au->pending;
    if (au->ledger_ok) {
        au->extra_charges = au->charges > au->paid ? au->charges - au->paid : 0;
        au->missing_charges = au->charges < au->paid ? au->paid - au->charges : 0;
        au->extra_emails = au->emails > au->paid ? au->emails - au->paid : 0;
        au->missing_emails = au->emails < au->paid ? au->paid - au->emails : 0;
        au->unsettled += au->missing_charges + au->missing_emails;
    } else {
        au->unsettled += au->paid;
        if (!au->note[0])
            snprintf(au->note, sizeof(au->note), "GET /v1/ledger failed");
    }
    free(rows);
}

/* ---- the verdict ---------------------------------------------------------------------------- */

struct verdict {
    long duplicates, lost, unsettled;
};

static void print_table(struct chaos *cx, const struct audit *au, const struct verdict *v,
                        double secs, int rc)
{
    const struct ck_proxy *p = &cx->proxy;
    printf("idem-check chaos: orderd %s (store %s), provider-sim %s, proxy %s\n", cx->orderd_url,
           cx->db, cx->provider_url, cx->proxy_url);
    printf("%-34s %ld of %ld (%ld answered 2xx to a client, %ld finished by the audit)\n",
           "intents started", au->started, cx->o.intents, au->finished_2xx,
           au->finished_in_audit);
    printf("%-34s %ld\n", "client retries", atomic_load(&cx->retries));
    printf("%-34s %ld\n", "duplicated sends", atomic_load(&cx->dup_sends));
    printf("%-34s %ld\n", "faults: proxy resets", atomic_load(&p->resets));
    printf("%-34s %ld\n", "faults: proxy dropped responses", atomic_load(&p->drops));
    printf("%-34s %ld\n", "faults: orderd down (refused)", atomic_load(&p->upstream_down));
    printf("%-34s %ld\n", "faults: provider 5xx", au->failed5xx);
    printf("%-34s %ld\n", "faults: provider lost responses", au->lost_responses);
    printf("%-34s %ld\n", "faults: orderd kill -9", atomic_load(&cx->kills));
    printf("%-34s %ld (%ld paid, %ld pending)\n", "orders", au->orders, au->paid, au->pending);
    printf("%-34s %ld charges, %ld confirmation emails, %s\n", "provider ledger", au->charges,
           au->emails, au->ledger_clean ? "clean" : "NOT clean");
    printf("%-34s %ld\n", "DUPLICATES found", v->duplicates);
    printf("%-34s %ld\n", "LOST found", v->lost);
    printf("%-34s %ld\n", "UNSETTLED", v->unsettled);
    if (au->note[0])
        printf("%-34s %s\n", "first problem", au->note);
    printf("%-34s %.1f s, logs in %s\n", "took", secs, cx->workdir);
    printf("verdict: %s\n", rc == 0 ? "CLEAN (every intent took effect exactly once)"
                                    : "FAILED");
}

static void print_json(struct chaos *cx, const struct audit *au, const struct verdict *v,
                       double secs, int rc)
{
    const struct ck_proxy *p = &cx->proxy;
    json_t *doc = json_pack(
        "{s:s, s:i, s:s, s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I},"
        " s:{s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:b}, s:I, s:I, s:I, s:s, s:f, s:s}",
        "mode", "chaos", "exitCode", rc, "verdict", rc == 0 ? "clean" : "failed",
        "intents", "requested", (json_int_t)cx->o.intents, "started", (json_int_t)au->started,
        "answered2xx", (json_int_t)au->finished_2xx, "finishedByAudit",
        (json_int_t)au->finished_in_audit, "retries", (json_int_t)atomic_load(&cx->retries),
        "duplicatedSends", (json_int_t)atomic_load(&cx->dup_sends), "faults", "proxyResets",
        (json_int_t)atomic_load(&p->resets), "proxyDrops", (json_int_t)atomic_load(&p->drops),
        "orderdDown", (json_int_t)atomic_load(&p->upstream_down), "provider5xx",
        (json_int_t)au->failed5xx, "providerLost", (json_int_t)au->lost_responses, "kills",
        (json_int_t)atomic_load(&cx->kills), "orders", "total", (json_int_t)au->orders, "paid",
        (json_int_t)au->paid, "pending", (json_int_t)au->pending, "ledger", "charges",
        (json_int_t)au->charges, "emails", (json_int_t)au->emails, "duplicatesFlagged",
        (json_int_t)au->ledger_dups, "clean", au->ledger_clean, "duplicates",
        (json_int_t)v->duplicates, "lost", (json_int_t)v->lost, "unsettled",
        (json_int_t)v->unsettled, "firstProblem", au->note, "seconds", secs, "workdir",
        cx->workdir);
    char *s = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    puts(s ? s : "{\"mode\":\"chaos\",\"error\":\"cannot build the report\"}");
    free(s);
    json_decref(doc);
}

/* ---- command line --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fputs("usage: idem-check chaos --orderd-bin PATH --provider-bin PATH [options]\n"
          "\n"
          "Starts provider-sim and orderd on 127.0.0.1, a fault-injecting proxy in front of\n"
          "orderd, and drives business intents (POST /api/orders, one fresh Idempotency-Key\n"
          "each) through it with libidem-client, under dropped responses, connection resets,\n"
          "duplicated sends, provider faults and kill -9 of orderd; then audits that every\n"
          "intent made exactly one order, one charge and one confirmation email (docs/chaos.md).\n"
          "\n"
          "options:\n"
          "  --orderd-bin PATH       the orderd program (required)\n"
          "  --provider-bin PATH     the provider-sim program (required)\n"
          "  --db URI                orderd's store (default: sqlite in a new temp dir)\n"
          "  --intents N             business intents (default 300)\n"
          "  --clients M             concurrent client threads (default 8)\n"
          "  --max-time S            stop starting intents after S seconds (default 60)\n"
          "  --drop-rate R           share of proxied connections whose response is dropped\n"
          "  --reset-rate R          share of proxied connections reset before forwarding\n"
          "  --dup-rate R            share of intents also sent by a second, concurrent sender\n"
          "  --provider-lost-rate R  provider-sim: effect done, response lost\n"
          "  --provider-5xx-rate R   provider-sim: 503 before anything runs\n"
          "  --kill-every S          kill -9 orderd every S seconds and restart it\n"
          "  --json                  one JSON object instead of the table\n"
          "  -h, --help              this help\n"
          "\n"
          "exit codes: 0 clean, 1 something duplicated, lost or unsettled, 2 bad usage,\n"
          "            3 the services could not be started\n",
          f);
}

static int bad(const char *fmt, const char *arg)
{
    fputs("idem-check chaos: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n(try: idem-check chaos --help)\n", stderr);
    return CK_EXIT_USAGE;
}

static int num(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int rate(const char *s, double *out)
{
    char *end = NULL;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0.0 && v <= 1.0))
        return -1;
    *out = v;
    return 0;
}

static int parse(int argc, char **argv, struct chaos_opts *o)
{
    enum { O_ORD = 256, O_PROV, O_DB, O_INT, O_CLI, O_MAX, O_DROP, O_RESET, O_DUP, O_LOST, O_5XX,
           O_KILL, O_JSON };
    static const struct option lo[] = {
        {"orderd-bin", required_argument, NULL, O_ORD},
        {"provider-bin", required_argument, NULL, O_PROV},
        {"db", required_argument, NULL, O_DB},
        {"intents", required_argument, NULL, O_INT},
        {"clients", required_argument, NULL, O_CLI},
        {"max-time", required_argument, NULL, O_MAX},
        {"drop-rate", required_argument, NULL, O_DROP},
        {"reset-rate", required_argument, NULL, O_RESET},
        {"dup-rate", required_argument, NULL, O_DUP},
        {"provider-lost-rate", required_argument, NULL, O_LOST},
        {"provider-5xx-rate", required_argument, NULL, O_5XX},
        {"kill-every", required_argument, NULL, O_KILL},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
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
        case O_INT:
            if (num(optarg, 1, 10000000, &o->intents) < 0)
                return bad("--intents wants a number from 1 to 10000000, not '%s'", optarg);
            break;
        case O_CLI:
            if (num(optarg, 1, 256, &o->clients) < 0)
                return bad("--clients wants a number from 1 to 256, not '%s'", optarg);
            break;
        case O_MAX:
            if (num(optarg, 1, 86400, &o->max_time_s) < 0)
                return bad("--max-time wants seconds from 1 to 86400, not '%s'", optarg);
            break;
        case O_KILL:
            if (num(optarg, 1, 86400, &o->kill_every_s) < 0)
                return bad("--kill-every wants seconds from 1 to 86400, not '%s'", optarg);
            break;
        case O_DROP:
        case O_RESET:
        case O_DUP:
        case O_LOST:
        case O_5XX: {
            double *d = c == O_DROP ? &o->drop_rate
                        : c == O_RESET ? &o->reset_rate
                        : c == O_DUP   ? &o->dup_rate
                        : c == O_LOST  ? &o->lost_rate
                                       : &o->fail_rate;
            if (rate(optarg, d) < 0)
                return bad("a rate is a number from 0 to 1, not '%s'", optarg);
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
    if (!o->orderd_bin || !o->provider_bin)
        return bad("%s", "--orderd-bin and --provider-bin are required");
    if (o->drop_rate + o->reset_rate > 0.9)
        return bad("%s", "--drop-rate and --reset-rate together must stay at or below 0.9");
    if (o->fail_rate + o->lost_rate > 0.9)
        return bad("%s", "the provider rates together must stay at or below 0.9");
    if (access(o->orderd_bin, X_OK) != 0)
        return bad("--orderd-bin '%s' is not an executable", o->orderd_bin);
    if (access(o->provider_bin, X_OK) != 0)
        return bad("--provider-bin '%s' is not an executable", o->provider_bin);
    return 0;
}

int ck_chaos_main(int argc, char **argv)
{
    struct chaos *cx = ck_xmalloc(sizeof(*cx));
    struct audit au;
    struct verdict v;
    pthread_t *th = NULL, killer;
    int rc, have_killer = 0;
    long k;
    long long t0 = now_ms();

    memset(cx, 0, sizeof(*cx));
    memset(&au, 0, sizeof(au));
    cx->o.intents = 300;
    cx->o.clients = 8;
    cx->o.max_time_s = 60;
    rc = parse(argc, argv, &cx->o);
    if (rc != 0) {
        free(cx);
        return rc < 0 ? CK_EXIT_OK : rc;
    }
    pthread_mutex_init(&cx->lock, NULL);
    cx->provider_pid = cx->orderd_pid = -1;
    {
        const char *tmp = getenv("TMPDIR");
        snprintf(cx->workdir, sizeof(cx->workdir), "%s/idem-chaos-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(cx->workdir)) {
            fprintf(stderr, "idem-check chaos: cannot make a work directory: %s\n",
                    strerror(errno));
            free(cx);
            return CK_EXIT_SETUP;
        }
    }
    if (cx->o.db)
        snprintf(cx->db, sizeof(cx->db), "%s", cx->o.db);
    else
        snprintf(cx->db, sizeof(cx->db), "sqlite:%s/orderd.db", cx->workdir);
    if (ck_http_global_init() < 0) {
        fputs("idem-check chaos: cannot initialise libcurl\n", stderr);
        free(cx);
        return CK_EXIT_SETUP;
    }

    rc = CK_EXIT_SETUP;
    if (start_provider(cx) < 0) {
        fprintf(stderr, "idem-check chaos: provider-sim did not start (see %s)\n", cx->workdir);
        goto out;
    }
    if (create_token(cx) < 0) {
        fprintf(stderr, "idem-check chaos: `orderd token create` failed (see %s)\n",
                cx->workdir);
        goto out;
    }
    if (start_orderd(cx, 0) < 0) {
        fprintf(stderr, "idem-check chaos: orderd did not start (see %s/orderd.stderr)\n",
                cx->workdir);
        goto out;
    }
    snprintf(cx->orderd_url, sizeof(cx->orderd_url), "http://127.0.0.1:%d", cx->orderd_port);
    if (ck_proxy_start(&cx->proxy, cx->orderd_port, cx->o.drop_rate, cx->o.reset_rate) < 0) {
        fprintf(stderr, "idem-check chaos: cannot start the proxy: %s\n", strerror(errno));
        goto out;
    }
    snprintf(cx->proxy_url, sizeof(cx->proxy_url), "http://127.0.0.1:%d", cx->proxy.port);
    if (set_provider_faults(cx, cx->o.fail_rate, cx->o.lost_rate) < 0) {
        fputs("idem-check chaos: POST /v1/faults to provider-sim failed\n", stderr);
        ck_proxy_stop(&cx->proxy);
        goto out;
    }

    /* Drive. */
    cx->in = ck_xmalloc((size_t)cx->o.intents * sizeof(*cx->in));
    memset(cx->in, 0, (size_t)cx->o.intents * sizeof(*cx->in));
    for (k = 0; k < cx->o.intents; k++)
        cx->in[k].key = ck_random_key();
    cx->deadline_ms = now_ms() + cx->o.max_time_s * 1000;
    if (cx->o.kill_every_s > 0)
        have_killer = pthread_create(&killer, NULL, killer_main, cx) == 0;
    th = ck_xmalloc((size_t)cx->o.clients * sizeof(*th));
    for (k = 0; k < cx->o.clients; k++) {
        atomic_fetch_add(&cx->alive, 1);
        if (pthread_create(&th[k], NULL, client_main, cx) != 0) {
            atomic_fetch_sub(&cx->alive, 1);
            th[k] = 0;
        }
    }
    while (atomic_load(&cx->alive) > 0) {
        progress(cx, 0);
        ck_sleep_ms(200);
    }
    for (k = 0; k < cx->o.clients; k++)
        if (th[k])
            pthread_join(th[k], NULL);
    progress(cx, 1);
    atomic_store(&cx->stop_kill, 1);
    while (have_killer && !atomic_load(&cx->killer_idle))
        ck_sleep_ms(20);
    ck_proxy_stop(&cx->proxy);
    if (atomic_load(&cx->restart_failures) > 0 || cx->orderd_pid <= 0) {
        fprintf(stderr, "idem-check chaos: orderd could not be restarted (see %s)\n",
                cx->workdir);
        rc = CK_EXIT_FAIL;
        goto out;
    }
    (void)set_provider_faults(cx, 0.0, 0.0);

    /* Audit. */
    audit(cx, &au);
    v.duplicates = au.dup_orders + au.dup_mismatch + au.ledger_dups + au.extra_charges +
                   au.extra_emails;
    v.lost = au.lost + au.not_durable;
    v.unsettled = au.unsettled;
    rc = (v.duplicates || v.lost || v.unsettled || !au.ledger_ok) ? CK_EXIT_FAIL : CK_EXIT_OK;
    if (cx->o.json)
        print_json(cx, &au, &v, (double)(now_ms() - t0) / 1000.0, rc);
    else
        print_table(cx, &au, &v, (double)(now_ms() - t0) / 1000.0, rc);
    fflush(stdout);

out:
    pthread_mutex_lock(&cx->lock);
    stop_child(cx->orderd_pid);
    cx->orderd_pid = -1;
    pthread_mutex_unlock(&cx->lock);
    stop_child(cx->provider_pid);
    atomic_store(&cx->killer_release, 1);
    if (have_killer)
        pthread_join(killer, NULL);
    if (cx->in)
        for (k = 0; k < cx->o.intents; k++) {
            free(cx->in[k].key);
            free(cx->in[k].a.body);
            free(cx->in[k].b.body);
        }
    free(cx->in);
    free(th);
    ck_http_global_cleanup();
    free(cx);
    return rc;
}
