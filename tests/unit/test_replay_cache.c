/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_replay_cache.c - lib/replay_cache.c on its own (hits, replacement, the byte bound and LRU
 * eviction, lifetimes, references that outlive eviction, many threads at once), then the engine's
 * use of it over a SQLite store: replays and mismatches answered with the record gone from the
 * store, a record read by another engine cached too, and no entry that outlives its record.
 */
#include "replay_cache.h"
#include "t.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const unsigned char fp_a[IDEM_FP_LEN] = {0xa};
static const unsigned char fp_b[IDEM_FP_LEN] = {0xb};

static void test_basics(void)
{
    struct idem__rcache *c = NULL;
    struct idem__rcache_stats st;
    const struct idem__rentry *e, *e2;
    const struct idem_scope s = {"alice", "orders.create", "k1"};
    const struct idem_scope s_other_op = {"alice", "orders.cancel", "k1"};
    const struct idem_scope s_split1 = {"ab", "c", "k"};
    const struct idem_scope s_split2 = {"a", "bc", "k"};

    CHECK_INT(idem__rcache_new(4095, &c), IDEM_EINVAL);
    CHECK(c == NULL);
    CHECK_INT(idem__rcache_new(1 << 20, &c), 0);
    CHECK(idem__rcache_get(c, &s) == NULL);

    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 201,
                                  "Content-Type: application/json\nLocation: /api/orders/1\n",
                                  "{\"id\":1}", 8, 60000),
              0);
    e = idem__rcache_get(c, &s);
    CHECK(e != NULL);
    if (e) {
        CHECK_INT(e->status, 201);
        CHECK_INT(memcmp(e->fp, fp_a, IDEM_FP_LEN), 0);
        CHECK_INT(e->body_len, 8);
        CHECK_STR((const char *)e->body, "{\"id\":1}"); /* NUL-terminated too */
        CHECK_INT(e->nheaders, 2);
        if (e->nheaders == 2) {
            CHECK_STR(e->headers[0].name, "Content-Type");
            CHECK_STR(e->headers[0].value, "application/json");
            CHECK_STR(e->headers[1].name, "Location");
            CHECK_STR(e->headers[1].value, "/api/orders/1");
        }
    }
    /* Every part of the scope counts, and the parts cannot slide into each other. */
    CHECK(idem__rcache_get(c, &s_other_op) == NULL);
    CHECK_INT(idem__rcache_insert(c, &s_split1, fp_a, 200, NULL, "1", 1, 60000), 0);
    CHECK(idem__rcache_get(c, &s_split2) == NULL);

    /* A new put replaces the entry; a reference to the old one stays readable. */
    CHECK_INT(idem__rcache_insert(c, &s, fp_b, 200, NULL, "", 0, 60000), 0);
    e2 = idem__rcache_get(c, &s);
    CHECK(e2 != NULL && e2->status == 200 && e2->body_len == 0 && e2->nheaders == 0);
    CHECK(e2 && memcmp(e2->fp, fp_b, IDEM_FP_LEN) == 0);
    CHECK(e && e->status == 201 && strcmp((const char *)e->body, "{\"id\":1}") == 0);
    idem__rcache_put(e);
    idem__rcache_put(e2);
    idem__rcache_put(NULL);

    /* forget, and a put that is not kept (no lifetime) also drops the older entry. */
    idem__rcache_forget(c, &s);
    CHECK(idem__rcache_get(c, &s) == NULL);
    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 201, NULL, "x", 1, 60000), 0);
    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 201, NULL, "y", 1, 0), 0);
    CHECK(idem__rcache_get(c, &s) == NULL);

    idem__rcache_stats(c, &st);
    CHECK_INT(st.entries, 1); /* s_split1 */
    CHECK_INT(st.hits, 2);
    CHECK_INT(st.misses, 5);
    idem__rcache_free(c);
    idem__rcache_free(NULL);
}

static void test_lifetime(void)
{
    struct idem__rcache *c = NULL;
    struct idem__rcache_stats st;
    const struct idem_scope s = {"p", "op", "short"};
    const struct idem__rentry *e;

    /*
     * A second: the read right after the put must come within it even on a loaded machine.  Then
     * time must pass, past the lifetime by a margin.
     */
    CHECK_INT(idem__rcache_new(64 * 1024, &c), 0);
    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 200, NULL, "b", 1, 1000), 0);
    e = idem__rcache_get(c, &s);
    CHECK(e != NULL);
    t_sleep_ms(1100);
    /* Expired: a miss, and the entry is gone; a reference taken before stays valid. */
    CHECK(idem__rcache_get(c, &s) == NULL);
    CHECK(e && e->body_len == 1 && ((const char *)e->body)[0] == 'b');
    idem__rcache_put(e);
    idem__rcache_stats(c, &st);
    CHECK_INT(st.expired, 1);
    CHECK_INT(st.entries, 0);
    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 200, NULL, "b", 1, -5), 0);
    CHECK(idem__rcache_get(c, &s) == NULL);
    idem__rcache_free(c);
}

static void test_bound_and_lru(void)
{
    enum { MAX = 64 * 1024 };
    struct idem__rcache *c = NULL;
    struct idem__rcache_stats st;
    const struct idem__rentry *held;
    char body[1500];
    char key[32];
    struct idem_scope s = {"p", "op", key};

    memset(body, 'x', sizeof(body));
    CHECK_INT(idem__rcache_new(MAX, &c), 0);
    snprintf(key, sizeof(key), "k0");
    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 200, NULL, body, 1000, 60000), 0);
    held = idem__rcache_get(c, &s); /* k0: used, and referenced while it is evicted */
    snprintf(key, sizeof(key), "k1");
    CHECK_INT(idem__rcache_insert(c, &s, fp_a, 200, NULL, body, 1000, 60000), 0);

    /* 200 entries of ~1 KiB into 64 KiB: the least recently used go, the bound holds. */
    for (int i = 2; i < 200; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        CHECK_INT(idem__rcache_insert(c, &s, fp_a, 200, NULL, body, 1000, 60000), 0);
        idem__rcache_stats(c, &st);
        CHECK(st.bytes <= MAX);
        if (i < 20) {
            /* Touch k0 on every round so that it stays the most recently used. */
            const struct idem__rentry *e;
            snprintf(key, sizeof(key), "k0");
            e = idem__rcache_get(c, &s);
            CHECK(e != NULL);
            idem__rcache_put(e);
        }
    }
    idem__rcache_stats(c, &st);
    CHECK(st.evictions > 100);
    CHECK(st.entries > 30 && st.entries < 64);
    CHECK(st.bytes <= MAX && st.bytes > MAX / 2);
    snprintf(key, sizeof(key), "k1");
    CHECK(idem__rcache_get(c, &s) == NULL); /* never touched: evicted early */
    snprintf(key, sizeof(key), "k199");
    idem__rcache_put(idem__rcache_get(c, &s));
    CHECK(held != NULL && held->body_len == 1000 && ((const char *)held->body)[999] == 'x');
    idem__rcache_put(held);

    /* An entry over an eighth of the shard is not kept at all. */
    {
        char *big = calloc(1, MAX / 8);
        snprintf(key, sizeof(key), "big");
        CHECK(big != NULL);
        CHECK_INT(idem__rcache_insert(c, &s, fp_a, 200, NULL, big, MAX / 8, 60000), 0);
        CHECK(idem__rcache_get(c, &s) == NULL);
        free(big);
    }
    idem__rcache_free(c);
}

/* ---- many threads ---------------------------------------------------------------------------- */

enum { THREADS = 8, OPS = 20000, SCOPES = 400 };

struct worker {
    struct idem__rcache *c;
    unsigned seed;
    int bad;
};

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    char key[32], body[96];
    struct idem_scope s = {"user", "op", key};

    for (int i = 0; i < OPS; i++) {
        int n = (int)(rand_r(&w->seed) % SCOPES);
        const struct idem__rentry *e;
        snprintf(key, sizeof(key), "key-%d", n);
        e = idem__rcache_get(w->c, &s);
        if (e) {
            /* Whatever thread put it, an entry holds its own scope's body, whole. */
            int len = snprintf(body, sizeof(body), "body of key-%d", n);
            if (e->body_len < (size_t)len || memcmp(e->body, body, (size_t)len) != 0)
                w->bad++;
            idem__rcache_put(e);
        } else {
            int len = snprintf(body, sizeof(body), "body of key-%d %d", n, i);
            if (idem__rcache_insert(w->c, &s, fp_a, 200, "Content-Type: text/plain\n", body,
                                    (size_t)len, (i % 7) ? 60000 : 1) < 0)
                w->bad++;
        }
    }
    return NULL;
}

static void test_threads(void)
{
    struct idem__rcache *c = NULL;
    struct idem__rcache_stats st;
    pthread_t th[THREADS];
    struct worker w[THREADS];

    /* Small enough that entries are evicted all the time, big enough for two shards. */
    CHECK_INT(idem__rcache_new(512 * 1024 + 4096, &c), 0);
    for (int i = 0; i < THREADS; i++) {
        w[i].c = c;
        w[i].seed = (unsigned)i + 1;
        w[i].bad = 0;
        CHECK_INT(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_INT(w[i].bad, 0);
    }
    idem__rcache_stats(c, &st);
    CHECK(st.hits > 0);
    CHECK(st.bytes <= st.max_bytes);
    idem__rcache_free(c);
}

/* ---- the engine's use of the cache ----------------------------------------------------------- */

static void delete_record(struct idem_store *st, const char *key)
{
    struct idem_tx *tx = NULL;
    const char *p[1] = {key};

    CHECK_INT(idem_tx_begin(st, 1, &tx), 0);
    CHECK_INT(idem_tx_exec(tx, "DELETE FROM idem_records WHERE idem_key = $1", 1, p, NULL), 0);
    CHECK_INT(idem_tx_commit(tx), 0);
}

static void execute(struct idem_engine *eng, const struct idem_operation *op, const char *key,
                    const unsigned char *fp, const char *body)
{
    static const struct idem_header ct = {"Content-Type", "application/json"};
    struct idem_call *call = NULL;
    enum idem_outcome oc = IDEM_OUTCOME_NONE;

    CHECK_INT(idem_call_begin(eng, op, "alice", key, fp, &call, &oc), 0);
    CHECK_INT(oc, IDEM_OUTCOME_EXECUTE);
    CHECK_INT(idem_call_complete(call, 201, &ct, 1, body, strlen(body)), 0);
    idem_call_end(call);
}

/* The outcome of a request for `key`; a REPLAY's body must be `want_body`. */
static enum idem_outcome outcome_of(struct idem_engine *eng, const struct idem_operation *op,
                                    const char *key, const unsigned char *fp, const char *want_body)
{
    struct idem_call *call = NULL;
    enum idem_outcome oc = IDEM_OUTCOME_NONE;
    const struct idem_header *h;
    size_t len = 0;
    const char *body;

    CHECK_INT(idem_call_begin(eng, op, "alice", key, fp, &call, &oc), 0);
    if (oc == IDEM_OUTCOME_REPLAY) {
        body = idem_call_response_body(call, &len);
        CHECK_INT(idem_call_response_status(call), 201);
        CHECK(want_body && body && len == strlen(want_body) && memcmp(body, want_body, len) == 0);
        CHECK_INT(idem_call_response_header_count(call), 1);
        h = idem_call_response_header(call, 0);
        CHECK(h && strcmp(h->name, "Content-Type") == 0 &&
              strcmp(h->value, "application/json") == 0);
        CHECK(idem_call_response_header(call, 1) == NULL);
        CHECK_INT(idem_call_phase_begin(call), IDEM_ESTATE);
    }
    idem_call_end(call);
    return oc;
}

static void test_engine(const char *dir)
{
    static const struct idem_operation op = {.name = "cache.op", .wait_ms = 100};
    /* Retention long enough for a commit and two replays on a loaded machine. */
    static const struct idem_operation short_op = {
        .name = "cache.short", .ttl_ms = 1000, .wait_ms = 100};
    struct idem_engine_options off = {NULL, IDEM_REPLAY_CACHE_OFF};
    struct idem_engine_options tiny = {NULL, 100};
    struct idem_store *st = NULL;
    struct idem_engine *a = NULL, *b = NULL, *nocache = NULL, *bad = NULL;
    char uri[256];

    snprintf(uri, sizeof(uri), "sqlite:%s/cache.db", dir);
    CHECK_INT(idem_store_open(uri, NULL, &st, NULL), 0);
    if (!st)
        return;
    CHECK_INT(idem_engine_new(st, &tiny, &bad), IDEM_EINVAL);
    CHECK(bad == NULL);
    CHECK_INT(idem_engine_new(st, NULL, &a), 0);
    CHECK_INT(idem_engine_new(st, NULL, &b), 0);
    CHECK_INT(idem_engine_new(st, &off, &nocache), 0);

    /* Completed by engine a: a replays and refuses from memory once the record is gone. */
    execute(a, &op, "e1", fp_a, "{\"n\":1}");
    delete_record(st, "e1");
    CHECK_INT(outcome_of(a, &op, "e1", fp_a, "{\"n\":1}"), IDEM_OUTCOME_REPLAY);
    CHECK_INT(outcome_of(a, &op, "e1", fp_b, NULL), IDEM_OUTCOME_MISMATCH);
    {
        /* A refusal from memory owns no record: nothing can be written through it. */
        struct idem_call *call = NULL;
        enum idem_outcome oc = IDEM_OUTCOME_NONE;
        CHECK_INT(idem_call_begin(a, &op, "alice", "e1", fp_b, &call, &oc), 0);
        CHECK_INT(oc, IDEM_OUTCOME_MISMATCH);
        CHECK_INT(idem_call_phase_begin(call), IDEM_ESTATE);
        CHECK_INT(idem_call_complete(call, 200, NULL, 0, "x", 1), IDEM_ESTATE);
        CHECK(idem_call_tx(call) == NULL);
        idem_call_abort(call);
        idem_call_end(call);
    }
    /* Without a cache the store decides: the key is new. */
    CHECK_INT(outcome_of(nocache, &op, "e1", fp_b, NULL), IDEM_OUTCOME_EXECUTE);

    /* Engine b (another process, say) caches the completed record it reads. */
    execute(a, &op, "e2", fp_a, "{\"n\":2}");
    CHECK_INT(outcome_of(b, &op, "e2", fp_a, "{\"n\":2}"), IDEM_OUTCOME_REPLAY);
    delete_record(st, "e2");
    CHECK_INT(outcome_of(b, &op, "e2", fp_a, "{\"n\":2}"), IDEM_OUTCOME_REPLAY);
    CHECK_INT(outcome_of(b, &op, "e2", fp_b, NULL), IDEM_OUTCOME_MISMATCH);
    CHECK_INT(outcome_of(nocache, &op, "e2", fp_a, NULL), IDEM_OUTCOME_EXECUTE);

    /*
     * No entry outlives its record: past the retention of a second (time must pass, by a
     * margin), engine b sweeps the record and runs the key afresh with another response; engine
     * a, which completed (and cached) the first one, and engine b, which read it, both answer
     * with the new one.
     */
    execute(a, &short_op, "e3", fp_a, "{\"n\":3}");
    CHECK_INT(outcome_of(b, &short_op, "e3", fp_a, "{\"n\":3}"), IDEM_OUTCOME_REPLAY);
    CHECK_INT(outcome_of(a, &short_op, "e3", fp_a, "{\"n\":3}"), IDEM_OUTCOME_REPLAY);
    t_sleep_ms(1100);
    {
        int deleted = 0;
        CHECK_INT(idem_engine_sweep(b, 1000, &deleted), 0);
        CHECK(deleted >= 1);
    }
    execute(b, &short_op, "e3", fp_a, "{\"n\":33}");
    CHECK_INT(outcome_of(a, &short_op, "e3", fp_a, "{\"n\":33}"), IDEM_OUTCOME_REPLAY);
    CHECK_INT(outcome_of(b, &short_op, "e3", fp_a, "{\"n\":33}"), IDEM_OUTCOME_REPLAY);

    idem_engine_free(nocache);
    idem_engine_free(b);
    idem_engine_free(a);
    idem_store_close(st);
}

int main(void)
{
    char dir[] = "/tmp/idem-rcache-XXXXXX";
    char path[300];

    test_basics();
    test_lifetime();
    test_bound_and_lru();
    test_threads();
    if (mkdtemp(dir)) {
        test_engine(dir);
        snprintf(path, sizeof(path), "%s/cache.db", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/cache.db-wal", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/cache.db-shm", dir);
        unlink(path);
        rmdir(dir);
    } else {
        CHECK(!"mkdtemp");
    }
    return t_done();
}
