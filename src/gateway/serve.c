/* SPDX-License-Identifier: Apache-2.0 */
/*
 * serve.c - `idem-gateway serve` (serve.h).  As in orderd, nothing is served before it can be
 * answered truthfully: the store is open and migrated and the engine made before the listeners
 * start, and the "listening" line comes last.  Stop signals are taken by the main thread with
 * sigwait(); the stop unwinds in reverse, letting requests in flight finish.
 */
#define _GNU_SOURCE /* F_OFD_SETLK: a lock of an open file description, not of the process */
#include "serve.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idem/idem.h"

#include "admin.h"
#include "gateway.h"
#include "periodic.h"
#include "proxy.h"
#include "signals.h"
#include "unrouted.h"
#include "util.h"
#include "banned.h"

/* Records deleted per sweep transaction. */
#define SWEEP_BATCH 500

/*
 * Deletes the expired records, SWEEP_BATCH per transaction, until none is left (of every cluster
 * of a shard set).
 */
static void sweep(struct periodic *p, void *ctx)
{
    struct gateway *gw = ctx;
    int total = 0, deleted = SWEEP_BATCH, rc;

    for (size_t i = 0; i < gw->nengines; i++) {
        deleted = SWEEP_BATCH;
        while (deleted == SWEEP_BATCH && !periodic_stopping(p)) {
            deleted = 0;
            rc = idem_engine_sweep(gw->engines[i], SWEEP_BATCH, &deleted);
            if (rc < 0) {
                log_msg(&gw->log, "warn", "sweep: %s", idem_strerror(rc));
                break;
            }
            total += deleted;
        }
    }
    if (total > 0)
        log_msg(&gw->log, "info", "sweep: %d expired records deleted", total);
}

/*
 * The lease owner this process writes: "<instance>:<pid>:<start, ms>", the instance being the
 * config's `instance` or the host's name.  Returns the length of "<instance>:".
 */
static size_t owner_name(const struct gw_config *cfg, char *out, size_t cap)
{
    char host[128] = "localhost";
    struct timespec ts;
    int n;

    if (cfg->instance == NULL && gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(out, cap, "%s:", cfg->instance ? cfg->instance : host);
    snprintf(out + n, cap - (size_t)n, "%ld:%llx", (long)getpid(),
             (unsigned long long)ts.tv_sec * 1000ULL + (unsigned long long)ts.tv_nsec / 1000000ULL);
    return (size_t)n;
}

/*
 * On SQLite one gateway serves a store (docs/gateway.md): its start frees every earlier process's
 * records, which must not include a live gateway's.  So `serve` holds, for its life, an open file
 * description's lock on "<db>-serving" beside the database; a second `serve` of the same file
 * is refused.  (The `keys` commands and other readers do not take it.)  Returns the lock's file
 * descriptor, -1 with a sentence in `err` when another gateway holds it, or -2 when the lock
 * could not be tried (then serving goes on: the file system may not lock).
 */
static int hold_sqlite_store(const char *path, char *err, size_t errlen)
{
    struct flock lk;
    char name[4096];
    int fd;

    if (path[0] == ':' || strncmp(path, "file:", 5) == 0 ||
        (size_t)snprintf(name, sizeof name, "%s-serving", path) >= sizeof name)
        return -2; /* in memory, or a URI: nothing to share */
    fd = open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -2;
    memset(&lk, 0, sizeof lk);
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    lk.l_len = 1;
    if (fcntl(fd, F_OFD_SETLK, &lk) == 0)
        return fd;
    close(fd);
    snprintf(err, errlen,
             "another idem-gateway serves %.150s (it holds %.160s-serving): one gateway per "
             "SQLite store; give this one a store of its own, or share PostgreSQL",
             path, path);
    return -1;
}

/*
 * A restart: this instance's earlier process is gone, and with it every forward it was making,
 * so the records it left processing are released at once -- the next request of each key meets
 * its route's on_unknown now, instead of after the lease.  On SQLite, which one gateway serves,
 * that is every earlier process of this host; on PostgreSQL only an instance with a name of its
 * own (`instance`) knows which records are its, so without one they wait for their lease.
 */
static void release_earlier_process(struct gateway *gw, const char *prefix)
{
    uint64_t released = 0, one;
    int rc = 0;

    if (strcmp(idem_store_kind(gw->store), "sqlite") != 0 && gw->cfg->instance == NULL)
        return;
    for (size_t i = 0; i < gw->nengines && rc == 0; i++) {
        one = 0;
        rc = idem_engine_release_leases(gw->engines[i], prefix, &one);
        released += one;
    }
    if (rc < 0)
        log_msg(&gw->log, "warn", "cannot release an earlier process's records: %s",
                idem_strerror(rc));
    else if (released > 0)
        log_msg(&gw->log, "info",
                "%llu record%s left processing by an earlier process of %.*s released: the next "
                "request of each key meets its route's on_unknown",
                (unsigned long long)released, released == 1 ? "" : "s", (int)strlen(prefix) - 1,
                prefix);
}

/* quota_from_store()'s count of one store `st`: the bytes its records hold, into `q`. */
static void count_stored(struct gateway *gw, struct quota *q, struct idem_store *st, int64_t now_ms)
{
    const struct gw_config *cfg = gw->cfg;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    char width[24], now[24], overhead[24];
    const char *params[3] = {width, now, overhead};
    int rc;

    snprintf(width, sizeof width, "%lld", (long long)quota_bucket_ms(q));
    snprintf(now, sizeof now, "%lld", (long long)now_ms);
    snprintf(overhead, sizeof overhead, "%d", QUOTA_RECORD_OVERHEAD);
    rc = idem_tx_begin(st, 0, &tx);
    if (rc == 0)
        rc = idem_tx_exec(tx,
                          "SELECT principal, operation, expires_ms / CAST($1 AS BIGINT) AS b,"
                          " SUM(COALESCE(LENGTH(response_body), 0) +"
                          " COALESCE(LENGTH(response_headers), 0) + LENGTH(idem_key) +"
                          " LENGTH(principal) + CAST($3 AS BIGINT))"
                          " FROM idem_records WHERE expires_ms > CAST($2 AS BIGINT)"
                          " GROUP BY principal, operation, b",
                          3, params, &rows);
    if (rc < 0)
        log_msg(&gw->log, "warn",
                "cannot count the bytes the store's records hold (%s): the callers' limits "
                "count from zero",
                tx ? idem_tx_errmsg(tx) : idem_strerror(rc));
    for (int i = 0; rc == 0 && i < idem_rows_count(rows); i++) {
        const char *principal = idem_rows_get(rows, i, 0);
        const char *operation = idem_rows_get(rows, i, 1);
        const char *bucket = idem_rows_get(rows, i, 2);
        const char *bytes = idem_rows_get(rows, i, 3);
        const struct gw_route *r = NULL;
        size_t len;

        if (!principal || !operation || !bucket || !bytes)
            continue;
        for (size_t j = 0; j < cfg->nroutes && r == NULL; j++)
            if (strcmp(cfg->routes[j].operation, operation) == 0)
                r = &cfg->routes[j];
        len = strlen(principal);
        for (size_t k = 0; r != NULL && k < r->nscope_headers; k++)
            while (len > 0 && principal[--len] != ';')
                ;
        quota_add_stored(q, r ? principal : NULL, len, strtoull(bytes, NULL, 10),
                         (strtoll(bucket, NULL, 10) + 1) * quota_bucket_ms(q) - 1, now_ms);
    }
    idem_rows_free(rows);
    idem_tx_rollback(tx);
}

/*
 * The callers' limits (quota.h), with the bytes the store's records hold now counted in, per
 * principal and expiry, so a restart keeps what each caller stored: one statement at start.  A
 * record's principal is the caller's with its route's scope headers appended (";Name=value",
 * values percent-encoded): they are taken off, since the limits are the caller's.
 */
static struct quota *quota_from_store(struct gateway *gw)
{
    const struct gw_config *cfg = gw->cfg;
    struct quota_limits ql = {
        .keys_in_flight = cfg->limit_keys_in_flight,
        .new_keys_per_second = cfg->limit_new_keys_per_second,
        .stored_bytes = cfg->limit_stored_bytes,
        .total_stored_bytes = cfg->max_stored_bytes,
        .tracked = cfg->limit_tracked,
    };
    struct quota *q;
    int64_t now_ms = clock_wall_ms();

    for (size_t i = 0; i < cfg->nroutes; i++)
        if (cfg->routes[i].retention_ms > ql.window_ms)
            ql.window_ms = cfg->routes[i].retention_ms;
    q = quota_new(&ql);
    for (size_t i = 0; i < gw->nengines; i++)
        count_stored(gw, q, gw->stores[i], now_ms);
    return q;
}

/* SIGHUP: each TLS listener's certificate and key read again for new connections. */
struct reload_arg {
    struct gateway *gw;
    struct tls_ctx *tls, *admin_tls; /* NULL: that listener is plain */
};

static void reload_one(const struct gateway *gw, struct tls_ctx *tls, const char *listener,
                       const char *key)
{
    char err[512];

    if (tls == NULL)
        return;
    if (tls_ctx_server_reload(tls, err, sizeof err) == 0)
        log_msg(&gw->log, "info", "SIGHUP: the %s's certificate was read again", listener);
    else
        log_msg(&gw->log, "error", "SIGHUP: %s kept its certificate: %s", key, err);
}

static void reload_listeners(void *arg)
{
    struct reload_arg *ra = arg;

    reload_one(ra->gw, ra->tls, "listener", "listen_tls");
    reload_one(ra->gw, ra->admin_tls, "admin listener", "admin_listen_tls");
}

/* A listener's TLS context from its config (`key` names it in the log), or none when plain. */
static int listener_tls(const struct gateway *gw, const struct gw_listen_tls *lt, const char *key,
                        struct tls_ctx **out)
{
    struct tls_server_options to = {.cert_file = lt->cert_file, .key_file = lt->key_file};
    char err[512];

    *out = NULL;
    if (lt->cert_file == NULL)
        return 0;
    if (tls_ctx_server_new(&to, out, err, sizeof err) != 0) {
        log_msg(&gw->log, "error", "%s: %s", key, err);
        return -1;
    }
    return 0;
}

int serve_upstream_tls(const struct gw_config *cfg, struct tls_ctx **out, char *err, size_t errlen)
{
    struct tls_client_options to = {
        .server_name =
            cfg->upstream_tls_server_name ? cfg->upstream_tls_server_name : cfg->upstream_host,
        .ca_file = cfg->upstream_tls_ca_file,
        .cert_file = cfg->upstream_tls_cert_file,
        .key_file = cfg->upstream_tls_key_file,
    };
    char why[400];

    if (tls_ctx_client_new(&to, out, why, sizeof why) != 0) {
        snprintf(err, errlen, "upstream.tls: %s", why);
        return -1;
    }
    return 0;
}

int serve_run(const struct gw_config *cfg, const struct serve_options *so)
{
    struct gateway gw = {0};
    struct periodic sweeper = {0};
    struct http_server_options popts, aopts;
    struct http_server *pub = NULL, *adm = NULL;
    struct idem_store_options store_opts = {.pool_size = so->db_pool};
    struct idem_engine_options eng_opts = {
        .replay_cache_bytes =
            so->replay_cache_mb > 0 ? (int64_t)so->replay_cache_mb << 20 : IDEM_REPLAY_CACHE_OFF,
    };
    struct http_client_options uo = {
        .host = cfg->upstream_host,
        .port = cfg->upstream_port,
        .connect_timeout_ms = cfg->upstream_connect_timeout_ms,
        .timeout_ms = cfg->upstream_timeout_ms,
        .max_idle = cfg->upstream_max_connections,
        .max_response_bytes = cfg->max_response_bytes,
    };
    struct tls_ctx *upstream_tls = NULL, *listen_tls = NULL, *admin_tls = NULL;
    char owner[256];
    size_t owner_prefix;
    int serving_fd = -2;
    sigset_t stop_signals;
    char err[512];
    int status = 1;

    pthread_mutex_init(&gw.steps_mu, NULL);
    pthread_cond_init(&gw.steps_cv, NULL);
    stop_signals_block(&stop_signals); /* before any thread, so every thread inherits it */
    /* SIGHUP re-reads the listeners' certificates: taken by the main thread, as the stops. */
    if (cfg->listen_tls.cert_file != NULL || cfg->admin_listen_tls.cert_file != NULL)
        reload_signal_block(&stop_signals);
    gw.cfg = cfg;
    gw.log.format = so->log_format;
    gw.metrics = gw_metrics_new(cfg->nroutes);
    gw.unrouted = unrouted_new(cfg);
    gw.ops = gateway_ops_new(cfg);

    /* Only routes ask who is calling: a gateway with none passes everything through. */
    if (cfg->nroutes > 0 && principal_verifier_new(cfg, &gw.principals, err, sizeof err) != 0) {
        log_msg(&gw.log, "error", "%s", err);
        goto out;
    }
    if (cfg->upstream_tls) {
        if (serve_upstream_tls(cfg, &upstream_tls, err, sizeof err) != 0) {
            log_msg(&gw.log, "error", "%s", err);
            goto out;
        }
        uo.tls = upstream_tls;
    }
    if (upstream_new(&uo, &gw.upstream, err, sizeof err) != 0) {
        log_msg(&gw.log, "error", "%s", err);
        goto out;
    }
    if (cfg->upstream_tls) {
        /* An API on the public network knows itself by its name: the one its certificate has. */
        const char *name =
            cfg->upstream_tls_server_name ? cfg->upstream_tls_server_name : cfg->upstream_host;
        char host[300];
        if (cfg->upstream_port == 443)
            snprintf(host, sizeof host, strchr(name, ':') ? "[%s]" : "%s", name);
        else
            snprintf(host, sizeof host, strchr(name, ':') ? "[%s]:%u" : "%s:%u", name,
                     (unsigned)cfg->upstream_port);
        upstream_set_host(gw.upstream, host);
    }
    owner_prefix = owner_name(cfg, owner, sizeof owner);
    eng_opts.owner = owner;
    if (gateway_stores_open(&gw, cfg->store, &store_opts, &eng_opts, err, sizeof err) != 0) {
        log_msg(&gw.log, "error", "cannot open the store: %s", err);
        goto out;
    }
    owner[owner_prefix] = '\0'; /* "<instance>:" */
    gw.quota = quota_from_store(&gw);

    proxy_server_options(&gw, &popts);
    if (listener_tls(&gw, &cfg->listen_tls, "listen_tls", &listen_tls) != 0)
        goto out;
    popts.tls = listen_tls;
    if (http_server_start(&popts, cfg->listen, &pub, err, sizeof err) != 0) {
        log_msg(&gw.log, "error", "listen %s: %s", cfg->listen, err);
        goto out;
    }
    gw.public_server = pub;
    admin_warn(cfg, stderr);
    admin_server_options(&gw, &aopts);
    if (listener_tls(&gw, &cfg->admin_listen_tls, "admin_listen_tls", &admin_tls) != 0)
        goto out;
    aopts.tls = admin_tls;
    if (http_server_start(&aopts, cfg->admin_listen, &adm, err, sizeof err) != 0) {
        log_msg(&gw.log, "error", "admin listen %s: %s", cfg->admin_listen, err);
        goto out;
    }
    /*
     * Once the addresses are this process's (the same config started twice is told so), and
     * before "listening" is said: the store is this gateway's alone, then its earlier processes'
     * forwards are freed.  A request that comes meanwhile meets their lease, as without it.
     */
    if (idem_store_sqlite_path(gw.store) != NULL) {
        serving_fd = hold_sqlite_store(idem_store_sqlite_path(gw.store), err, sizeof err);
        if (serving_fd == -1) {
            log_msg(&gw.log, "error", "%s", err);
            goto out;
        }
    }
    release_earlier_process(&gw, owner);
    if (so->sweep_interval_s > 0 &&
        periodic_start(&sweeper, (int64_t)so->sweep_interval_s * 1000, sweep, &gw) != 0) {
        log_msg(&gw.log, "error", "cannot start the sweeper");
        goto out;
    }

    printf("idem-gateway: listening on %s (admin %s)\n", http_server_url(pub),
           http_server_url(adm));
    fflush(stdout);
    log_msg(&gw.log, "info", "serving %s on %s to upstream %s (store %s, %zu route%s)",
            IDEM_VERSION_STRING, http_server_url(pub), cfg->upstream_url, idem_store_kind(gw.store),
            cfg->nroutes, cfg->nroutes == 1 ? "" : "s");
    {
        struct reload_arg ra = {.gw = &gw, .tls = listen_tls, .admin_tls = admin_tls};
        log_msg(&gw.log, "info", "stopping on %s",
                stop_signals_wait_reloading(&stop_signals, reload_listeners, &ra));
    }
    status = 0;
out:
    http_server_stop(pub);
    http_server_stop(adm);
    periodic_stop(&sweeper);
    gateway_stores_close(&gw);
    if (serving_fd >= 0)
        close(serving_fd);
    upstream_free(gw.upstream);
    tls_ctx_free(upstream_tls);
    tls_ctx_free(listen_tls);
    tls_ctx_free(admin_tls);
    principal_verifier_free(gw.principals);
    gw_metrics_free(gw.metrics);
    unrouted_free(gw.unrouted);
    quota_free(gw.quota);
    free(gw.ops);
    pthread_cond_destroy(&gw.steps_cv);
    pthread_mutex_destroy(&gw.steps_mu);
    if (status == 0)
        log_msg(&gw.log, "info", "stopped");
    return status;
}
