/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_shard_map.c - lib/shard_map.c: the bucket hash is the documented one (the first 8 bytes
 * of SHA-256 of the principal, big-endian, mod 1024; vectors computed with Python's hashlib) and
 * spreads principals evenly; a map read from a directory (an SQLite store here; the PostgreSQL
 * one in tests/pg/test_shards.c) lists every cluster in name order with its URI, also one that
 * owns no bucket, gives each bucket its owner and epoch and a moving bucket IDEM_EMOVED, and is
 * refused whole when a bucket has no owner.
 */
#include "internal.h"
#include "t.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/idem-unit-shard-map-XXXXXX";

static void test_the_bucket_is_sha256_big_endian_mod_1024(void)
{
    static const struct {
        const char *principal;
        unsigned bucket;
    } cases[] = {
        {"", 20},         {"alice", 175}, {"bob", 730},
        {"user-42", 329}, {"é", 851},     {"tenant:acme/user:7", 899},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_INT(idem_shard_bucket(cases[i].principal, strlen(cases[i].principal)),
                  cases[i].bucket);
    CHECK_INT(idem_shard_bucket(NULL, 0), 20);
}

static void test_buckets_are_even(void)
{
    static unsigned count[IDEM_SHARD_BUCKETS];
    unsigned lo = ~0u, hi = 0;
    char p[32];

    /* 102,400 principals, 100 a bucket on average: every bucket within 50..150. */
    for (int i = 0; i < 100 * IDEM_SHARD_BUCKETS; i++) {
        snprintf(p, sizeof p, "user-%d", i);
        count[idem_shard_bucket(p, strlen(p))]++;
    }
    for (int b = 0; b < IDEM_SHARD_BUCKETS; b++) {
        lo = count[b] < lo ? count[b] : lo;
        hi = count[b] > hi ? count[b] : hi;
    }
    CHECK(lo >= 50);
    CHECK(hi <= 150);
}

static struct idem_store *open_directory(const char *name)
{
    struct idem_store *st = NULL;
    char uri[256], *err = NULL;

    snprintf(uri, sizeof uri, "sqlite:%s/%s", dir, name);
    if (idem_store_open(uri, NULL, &st, &err) < 0 || idem__shard_directory_migrate(st, &err) < 0) {
        fprintf(stderr, "cannot open %s: %s\n", uri, err ? err : "?");
        exit(1);
    }
    return st;
}

/* Runs `sql` with up to three parameters in a write transaction of its own. */
static int run(struct idem_store *st, const char *sql, const char *a, const char *b, const char *c)
{
    const char *params[3] = {a, b, c};
    struct idem_tx *tx = NULL;
    int n = c ? 3 : b ? 2 : a ? 1 : 0;
    int rc = idem_tx_begin(st, 1, &tx);

    if (rc == 0)
        rc = idem_tx_exec(tx, sql, n, params, NULL);
    if (rc == 0)
        return idem_tx_commit(tx);
    idem_tx_rollback(tx);
    return rc;
}

/* Buckets [from, to) to `cluster` at `epoch`. */
static void assign(struct idem_store *st, int from, int to, const char *cluster, const char *epoch)
{
    char b[16];

    for (int i = from; i < to; i++) {
        snprintf(b, sizeof b, "%d", i);
        CHECK_INT(run(st,
                      "INSERT INTO idem_shard_buckets (bucket, cluster, epoch) VALUES ($1, $2, $3)",
                      b, cluster, epoch),
                  0);
    }
}

static void test_a_map_gives_each_bucket_its_owner(void)
{
    struct idem_store *st = open_directory("two.db");
    struct idem_shard_map *m = NULL;
    size_t owner = 99;
    int64_t epoch = 0;
    char *err = NULL;

    /* Inserted out of name order: the map lists them in name order. */
    CHECK_INT(run(st, "INSERT INTO idem_shard_clusters VALUES ($1, $2)", "zeta",
                  "postgresql://z/db", NULL),
              0);
    CHECK_INT(run(st, "INSERT INTO idem_shard_clusters VALUES ($1, $2)", "alpha",
                  "postgresql://a/db", NULL),
              0);
    CHECK_INT(run(st, "INSERT INTO idem_shard_clusters VALUES ($1, $2)", "idle",
                  "postgresql://i/db", NULL),
              0);
    assign(st, 0, 512, "zeta", "1");
    assign(st, 512, 1024, "alpha", "3");
    CHECK_INT(
        run(st, "UPDATE idem_shard_buckets SET moving = 1 WHERE bucket = 7", NULL, NULL, NULL), 0);

    CHECK_INT(idem_shard_map_read(st, &m, &err), 0);
    CHECK(err == NULL);
    CHECK_INT(idem_shard_map_clusters(m), 3);
    CHECK_STR(idem_shard_map_name(m, 0), "alpha");
    CHECK_STR(idem_shard_map_uri(m, 0), "postgresql://a/db");
    CHECK_STR(idem_shard_map_name(m, 1), "idle");
    CHECK_STR(idem_shard_map_name(m, 2), "zeta");
    CHECK_STR(idem_shard_map_uri(m, 2), "postgresql://z/db");
    CHECK(idem_shard_map_name(m, 3) == NULL);

    CHECK_INT(idem_shard_map_owner(m, 0, &owner, &epoch), 0);
    CHECK_INT(owner, 2);
    CHECK_INT(epoch, 1);
    CHECK_INT(idem_shard_map_owner(m, 1023, &owner, &epoch), 0);
    CHECK_INT(owner, 0);
    CHECK_INT(epoch, 3);
    CHECK_INT(idem_shard_map_owner(m, 7, &owner, NULL), IDEM_EMOVED);
    CHECK_INT(owner, 2); /* the owner it is moving from */
    CHECK_INT(idem_shard_map_owner(m, IDEM_SHARD_BUCKETS, &owner, NULL), IDEM_EINVAL);
    idem_shard_map_free(m);
    idem_store_close(st);
}

static void test_a_map_with_a_bucket_unowned_is_refused(void)
{
    struct idem_store *st = open_directory("holes.db");
    struct idem_shard_map *m = NULL;
    char *err = NULL;

    CHECK_INT(idem_shard_map_read(st, &m, &err), IDEM_ESTORE);
    CHECK(m == NULL);
    CHECK(err && strstr(err, "1024 of 1024 buckets have no cluster"));
    idem_free(err);
    err = NULL;

    CHECK_INT(
        run(st, "INSERT INTO idem_shard_clusters VALUES ($1, $2)", "one", "postgresql://o/x", NULL),
        0);
    assign(st, 0, 1023, "one", "1");
    CHECK_INT(idem_shard_map_read(st, &m, &err), IDEM_ESTORE);
    CHECK(err && strstr(err, "1 of 1024 buckets have no cluster"));
    idem_free(err);
    err = NULL;

    assign(st, 1023, 1024, "one", "1");
    CHECK_INT(idem_shard_map_read(st, &m, &err), 0);
    CHECK_INT(idem_shard_map_clusters(m), 1);
    idem_shard_map_free(m);
    idem_store_close(st);
}

int main(void)
{
    char cmd[128];

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_the_bucket_is_sha256_big_endian_mod_1024();
    test_buckets_are_even();
    test_a_map_gives_each_bucket_its_owner();
    test_a_map_with_a_bucket_unowned_is_refused();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
