/* SPDX-License-Identifier: Apache-2.0 */
/*
 * webhook_sender.c - at-least-once event delivery (see webhook_sender.h).  Deliveries are rows, so
 * a restart of the simulator resumes them; each of WEBHOOK_SHARDS sender threads owns the rows of
 * its shard, so the copies of one event (spread over shards at random) really do arrive
 * concurrently, which is the case a receiver's dedupe must survive.  Every attempt is signed afresh
 * with the time it is sent at, as real providers do, so a receiver's timestamp window only ever
 * sees fresh signatures from us.
 */
#include "webhook_sender.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "sim.h"
#include "clock.h"
#include "periodic.h"
#include "sim_util.h"
#include "jdoc.h"
#include "banned.h"

#define WEBHOOK_SHARDS 4
#define WEBHOOK_BATCH 16
#define WEBHOOK_IDLE_MS 25
#define WEBHOOK_BACKOFF_FIRST_MS 100
#define WEBHOOK_MAX_ATTEMPTS 1000
#define WEBHOOK_DUP_SPREAD_MS 10

struct sender {
    struct webhooks *wh;
    int shard;
    pthread_t thread;
    int running;
};

struct webhooks {
    struct sim *sim;
    const char *url;
    const char *secret;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int stop; /* set under mu, with a broadcast; read anywhere */
    uint64_t wakeups;
    struct sender senders[WEBHOOK_SHARDS];
};

int webhooks_sign(const char *secret, int64_t t, const void *body, size_t len,
                  char out[WEBHOOK_SIGNATURE_MAX])
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    char prefix[32];
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    unsigned char *msg = NULL;
    int plen;
    int rc = -1;

    plen = snprintf(prefix, sizeof prefix, "%" PRId64 ".", t);
    if (plen <= 0 || (size_t)plen >= sizeof prefix)
        goto out;
    msg = xmalloc((size_t)plen + len);
    memcpy(msg, prefix, (size_t)plen);
    if (len > 0)
        memcpy(msg + plen, body, len);
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, (size_t)plen + len, mac, &mac_len) ==
        NULL)
        goto out;
    hex_encode(mac, mac_len, hex);
    snprintf(out, WEBHOOK_SIGNATURE_MAX, "t=%" PRId64 ",v1=%s", t, hex);
    rc = 0;
out:
    free(msg);
    return rc;
}

int webhooks_enqueue(struct sim *sim, struct idem_tx *tx, const char *type, const json_t *object)
{
    struct fault_settings fs;
    json_t *event = NULL;
    char event_id[40], delivery_id[40];
    char created[24], due[24], shard[8];
    const char *params[6];
    char *payload = NULL;
    int64_t now = clock_wall_ms();
    int i, rc;

    new_id("evt_", event_id, sizeof event_id);
    event = xcheck(json_pack("{s:s, s:s, s:I, s:{s:O}}", "id", event_id, "type", type, "created",
                             (json_int_t)(now / 1000), "data", "object", object));
    payload = jdoc_text(event, NULL);
    snprintf(created, sizeof created, "%" PRId64, now);
    params[0] = event_id;
    params[1] = type;
    params[2] = payload;
    params[3] = created;
    rc = idem_tx_exec(tx,
                      "INSERT INTO events (id, type, payload, created_ms) VALUES ($1, $2, $3, "
                      "CAST($4 AS BIGINT))",
                      4, params, NULL);
    if (rc < 0 || sim->webhooks == NULL)
        goto out;
    faults_get(&sim->faults, &fs);
    for (i = 0; i < fs.webhook_dup && rc == 0; i++) {
        new_id("dlv_", delivery_id, sizeof delivery_id);
        snprintf(due, sizeof due, "%" PRId64,
                 now + fs.webhook_delay_ms + i * WEBHOOK_DUP_SPREAD_MS);
        snprintf(shard, sizeof shard, "%d", (int)(random_unit() * WEBHOOK_SHARDS) % WEBHOOK_SHARDS);
        params[0] = delivery_id;
        params[1] = event_id;
        params[2] = shard;
        params[3] = due;
        rc = idem_tx_exec(tx,
                          "INSERT INTO deliveries (id, event_id, shard, status, attempts, due_ms) "
                          "VALUES ($1, $2, CAST($3 AS BIGINT), 'pending', 0, CAST($4 AS BIGINT))",
                          4, params, NULL);
    }
out:
    if (rc < 0)
        log_msg(&sim_log, "error", "cannot record event %s: %s", type, idem_tx_errmsg(tx));
    free(payload);
    json_decref(event);
    return rc;
}

void webhooks_notify(struct webhooks *wh)
{
    if (wh == NULL)
        return;
    pthread_mutex_lock(&wh->mu);
    wh->wakeups++;
    pthread_cond_broadcast(&wh->cv);
    pthread_mutex_unlock(&wh->mu);
}

static size_t discard_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    (void)ptr;
    (void)userdata;
    return size * nmemb;
}

/* One POST of `payload`; returns the HTTP status, or 0 with `err` for a transport failure. */
static long post_event(struct webhooks *wh, CURL *curl, const char *payload, char *err,
                       size_t errlen)
{
    struct curl_slist *hdrs = NULL;
    char sig[WEBHOOK_SIGNATURE_MAX];
    char line[WEBHOOK_SIGNATURE_MAX + 32];
    char curl_err[CURL_ERROR_SIZE];
    long status = 0;
    CURLcode cc;

    if (webhooks_sign(wh->secret, clock_wall_ms() / 1000, payload, strlen(payload), sig) != 0) {
        snprintf(err, errlen, "cannot sign");
        return 0;
    }
    snprintf(line, sizeof line, "%s: %s", WEBHOOK_SIGNATURE_HEADER, sig);
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, line);
    hdrs = curl_slist_append(hdrs, "Expect:");
    curl_easy_reset(curl);
    curl_err[0] = '\0';
    curl_easy_setopt(curl, CURLOPT_URL, wh->url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, payload);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(payload));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)wh->sim->cfg->webhook_timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard_body);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_err);
    cc = curl_easy_perform(curl);
    if (cc == CURLE_OK)
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(err, errlen, "%s", curl_err[0] ? curl_err : curl_easy_strerror(cc));
    curl_slist_free_all(hdrs);
    return status;
}

static int64_t backoff_ms(const struct webhooks *wh, int64_t attempts)
{
    int64_t cap = wh->sim->cfg->webhook_backoff_max_ms;
    int64_t ms = WEBHOOK_BACKOFF_FIRST_MS;

    while (attempts-- > 1 && ms < cap)
        ms *= 2;
    if (ms > cap)
        ms = cap;
    /* +-25% so that retries of many deliveries do not arrive in lock step. */
    return ms * 3 / 4 + (int64_t)(random_unit() * (double)(ms / 2 + 1));
}

static void record_attempt(struct webhooks *wh, const char *id, int64_t attempts, long status,
                           const char *err)
{
    struct idem_tx *tx = NULL;
    const char *params[6];
    char att[24], st[24], when[24];
    int64_t now = clock_wall_ms();
    int ok = status >= 200 && status < 300;
    int rc;

    snprintf(att, sizeof att, "%" PRId64, attempts);
    snprintf(st, sizeof st, "%ld", status);
    params[0] = id;
    params[1] = att;
    params[2] = st;
    if (ok) {
        snprintf(when, sizeof when, "%" PRId64, now);
        params[3] = when;
    } else {
        snprintf(when, sizeof when, "%" PRId64, now + backoff_ms(wh, attempts));
        params[3] = when;
        params[4] = attempts >= WEBHOOK_MAX_ATTEMPTS ? "abandoned" : "pending";
        params[5] = err;
    }
    rc = idem_tx_begin(wh->sim->store, 1, &tx);
    if (rc == 0 && ok)
        rc = idem_tx_exec(tx,
                          "UPDATE deliveries SET status = 'delivered', attempts = CAST($2 AS "
                          "BIGINT), last_status = CAST($3 AS BIGINT), last_error = NULL, "
                          "delivered_ms = CAST($4 AS BIGINT) WHERE id = $1",
                          4, params, NULL);
    else if (rc == 0)
        rc = idem_tx_exec(tx,
                          "UPDATE deliveries SET status = $5, attempts = CAST($2 AS BIGINT), "
                          "last_status = CAST($3 AS BIGINT), last_error = $6, due_ms = CAST($4 AS "
                          "BIGINT) WHERE id = $1",
                          6, params, NULL);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
    if (rc < 0)
        log_msg(&sim_log, "warn", "cannot record the delivery attempt of %s: %s", id,
                idem_strerror(rc));
    idem_tx_rollback(tx);
}

/* Delivers what is due in this shard, at most a batch; returns how many were attempted. */
static int deliver_due(struct sender *s, CURL *curl)
{
    struct webhooks *wh = s->wh;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[2];
    char shard[8], now[24];
    char err[CURL_ERROR_SIZE + 32];
    int i, n = 0;
    int rc;

    snprintf(shard, sizeof shard, "%d", s->shard);
    snprintf(now, sizeof now, "%" PRId64, clock_wall_ms());
    params[0] = shard;
    params[1] = now;
    rc = idem_tx_begin(wh->sim->store, 0, &tx);
    if (rc == 0)
        rc =
            idem_tx_exec(tx,
                         "SELECT d.id, d.attempts, e.payload, e.id FROM deliveries d JOIN events e "
                         "ON e.id = d.event_id WHERE d.status = 'pending' AND d.shard = CAST($1 "
                         "AS BIGINT) AND d.due_ms <= CAST($2 AS BIGINT) ORDER BY d.due_ms LIMIT 16",
                         2, params, &rows);
    idem_tx_rollback(tx);
    if (rc < 0) {
        log_msg(&sim_log, "warn", "cannot read due deliveries: %s", idem_strerror(rc));
        goto out;
    }
    n = idem_rows_count(rows);
    for (i = 0; i < n; i++) {
        const char *id = idem_rows_get(rows, i, 0);
        const char *payload = idem_rows_get(rows, i, 2);
        int64_t attempts = 0;
        long status;

        if (id == NULL || payload == NULL)
            continue;
        parse_int64(idem_rows_get(rows, i, 1), 0, INT64_MAX, &attempts);
        err[0] = '\0';
        status = post_event(wh, curl, payload, err, sizeof err);
        if (status < 200 || status >= 300) {
            if (status != 0)
                snprintf(err, sizeof err, "HTTP %ld", status);
            log_msg(&sim_log, "info", "webhook %s (event %s) attempt %" PRId64 " failed: %s", id,
                    idem_rows_get(rows, i, 3), attempts + 1, err);
        }
        record_attempt(wh, id, attempts + 1, status, err);
    }
out:
    idem_rows_free(rows);
    return n;
}

static void *sender_loop(void *arg)
{
    struct sender *s = arg;
    struct webhooks *wh = s->wh;
    struct timespec deadline;
    CURL *curl = curl_easy_init();
    uint64_t seen;

    if (curl == NULL) {
        log_msg(&sim_log, "error", "webhook sender %d: curl_easy_init failed", s->shard);
        return NULL;
    }
    while (!atomic_load(&wh->stop)) {
        if (deliver_due(s, curl) > 0)
            continue;
        deadline = clock_deadline(CLOCK_MONOTONIC, WEBHOOK_IDLE_MS);
        pthread_mutex_lock(&wh->mu);
        seen = wh->wakeups;
        while (!atomic_load(&wh->stop) && wh->wakeups == seen)
            if (pthread_cond_timedwait(&wh->cv, &wh->mu, &deadline) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&wh->mu);
    }
    curl_easy_cleanup(curl);
    return NULL;
}

int webhooks_start(struct sim *sim, const char *url, const char *secret, struct webhooks **out)
{
    struct webhooks *wh = xcheck(calloc(1, sizeof *wh));
    int i;

    *out = NULL;
    wh->sim = sim;
    wh->url = url;
    wh->secret = secret;
    if (pthread_mutex_init(&wh->mu, NULL) != 0 || cond_init_monotonic(&wh->cv) != 0)
        die("cannot initialise a mutex or a condition variable");
    for (i = 0; i < WEBHOOK_SHARDS; i++) {
        wh->senders[i].wh = wh;
        wh->senders[i].shard = i;
        if (pthread_create(&wh->senders[i].thread, NULL, sender_loop, &wh->senders[i]) != 0) {
            webhooks_stop(wh);
            return -1;
        }
        wh->senders[i].running = 1;
    }
    *out = wh;
    return 0;
}

void webhooks_stop(struct webhooks *wh)
{
    int i;

    if (wh == NULL)
        return;
    pthread_mutex_lock(&wh->mu);
    atomic_store(&wh->stop, 1);
    pthread_cond_broadcast(&wh->cv);
    pthread_mutex_unlock(&wh->mu);
    for (i = 0; i < WEBHOOK_SHARDS; i++)
        if (wh->senders[i].running)
            pthread_join(wh->senders[i].thread, NULL);
    pthread_cond_destroy(&wh->cv);
    pthread_mutex_destroy(&wh->mu);
    free(wh);
}
