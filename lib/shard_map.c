/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shard_map.c - which cluster holds a principal: the bucket hash and the map read from the
 * directory.  The hash must give every version of every program on every platform the same
 * bucket for the same principal, and an operator (or the clusters' SQL, idem_bucket_of) must be
 * able to compute it without idem: so it is SHA-256, which PostgreSQL, OpenSSL and every language
 * have, read big-endian, rather than a fast hash whose seed, width or byte order could differ.
 *
 * The map is read by one statement, so it is one snapshot of the directory: a move that flips a
 * bucket while it is read is seen whole or not at all.  The directory is any store, reached
 * through the public transaction calls like an application's tables (docs/shards.md).
 */
#include "internal.h"

#include <openssl/evp.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct idem_shard_map {
    size_t nclusters;
    char **names;
    char **uris;
    uint16_t owner[IDEM_SHARD_BUCKETS];
    int64_t epoch[IDEM_SHARD_BUCKETS]; /* 0: no owner (the map is refused) */
    unsigned char moving[IDEM_SHARD_BUCKETS];
};

_Static_assert(IDEM_SHARD_BUCKETS <= 65536, "owner indexes are 16 bits");

/* The directory's tables, written for both stores' dialects alike. */
#define DIRECTORY_SQL                                                                              \
    "CREATE TABLE IF NOT EXISTS idem_shard_clusters ("                                             \
    " name text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 63),"                                \
    " uri text NOT NULL);"                                                                         \
    "CREATE TABLE IF NOT EXISTS idem_shard_buckets ("                                              \
    " bucket integer PRIMARY KEY CHECK (bucket >= 0 AND bucket < 1024),"                           \
    " cluster text NOT NULL REFERENCES idem_shard_clusters (name),"                                \
    " epoch bigint NOT NULL CHECK (epoch >= 1),"                                                   \
    " moving integer NOT NULL DEFAULT 0 CHECK (moving IN (0, 1)));"

_Static_assert(IDEM_SHARD_BUCKETS == 1024 && IDEM_SHARD_NAME_MAX == 63,
               "the directory's CHECKs name these numbers");

static const struct idem_migration directory_schema[] = {
    {1, "shard directory", DIRECTORY_SQL, DIRECTORY_SQL},
};

int idem__shard_directory_migrate(struct idem_store *dir, char **errmsg)
{
    return idem_store_migrate(dir, "idem_shard_directory", directory_schema,
                              sizeof(directory_schema) / sizeof(directory_schema[0]), NULL, errmsg);
}

unsigned idem_shard_bucket(const void *principal, size_t len)
{
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned hlen = 0;
    uint64_t v = 0;

    /* SHA-256 of a few bytes cannot fail short of a broken OpenSSL; bucket 0 is then an answer. */
    if (!EVP_Digest(principal ? principal : "", principal ? len : 0, h, &hlen, idem__sha256(),
                    NULL) ||
        hlen < 8)
        return 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | h[i];
    return (unsigned)(v % IDEM_SHARD_BUCKETS);
}

void idem_shard_map_free(struct idem_shard_map *map)
{
    if (!map)
        return;
    for (size_t i = 0; i < map->nclusters; i++) {
        free(map->names[i]);
        free(map->uris[i]);
    }
    free(map->names);
    free(map->uris);
    free(map);
}

/* A decimal integer in [lo, hi] that is the whole of `s`. */
static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    long long v;

    if (!s || !*s)
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Appends cluster (name, uri) to the map; the rows come in name order, each name once. */
static int add_cluster(struct idem_shard_map *m, const char *name, const char *uri)
{
    char **names = NULL, **uris = NULL;

    names = realloc(m->names, (m->nclusters + 1) * sizeof(*names));
    if (!names)
        return IDEM_ENOMEM;
    m->names = names;
    uris = realloc(m->uris, (m->nclusters + 1) * sizeof(*uris));
    if (!uris)
        return IDEM_ENOMEM;
    m->uris = uris;
    m->names[m->nclusters] = idem__strdup(name);
    m->uris[m->nclusters] = idem__strdup(uri);
    m->nclusters++;
    if (!m->names[m->nclusters - 1] || !m->uris[m->nclusters - 1])
        return IDEM_ENOMEM;
    return 0;
}

/* Fills `m` from the rows (name, uri, bucket, epoch, moving); `err` says what is wrong. */
static int fill_map(struct idem_shard_map *m, const struct idem_rows *rows, char *err, size_t cap)
{
    int rc = 0;
    size_t unowned = 0;

    for (int r = 0; r < idem_rows_count(rows); r++) {
        const char *name = idem_rows_get(rows, r, 0), *uri = idem_rows_get(rows, r, 1);
        int64_t bucket = 0, epoch = 0, moving = 0;

        if (!name || !uri || strlen(name) > IDEM_SHARD_NAME_MAX) {
            idem__fmt(err, cap, "shard directory: a cluster has no name or URI");
            return IDEM_ESTORE;
        }
        if (m->nclusters == 0 || strcmp(m->names[m->nclusters - 1], name) != 0) {
            if (m->nclusters == 65535) {
                idem__fmt(err, cap, "shard directory: more clusters than buckets");
                return IDEM_ESTORE;
            }
            rc = add_cluster(m, name, uri);
            if (rc < 0)
                return rc;
        }
        if (!idem_rows_get(rows, r, 2))
            continue; /* a cluster that owns no bucket (yet) */
        if (parse_int(idem_rows_get(rows, r, 2), 0, IDEM_SHARD_BUCKETS - 1, &bucket) < 0 ||
            parse_int(idem_rows_get(rows, r, 3), 1, INT64_MAX, &epoch) < 0 ||
            parse_int(idem_rows_get(rows, r, 4), 0, 1, &moving) < 0 || m->epoch[bucket] != 0) {
            idem__fmt(err, cap, "shard directory: cluster %s has a malformed bucket row", name);
            return IDEM_ESTORE;
        }
        m->owner[bucket] = (uint16_t)(m->nclusters - 1);
        m->epoch[bucket] = epoch;
        m->moving[bucket] = (unsigned char)moving;
    }
    for (size_t b = 0; b < IDEM_SHARD_BUCKETS; b++)
        unowned += m->epoch[b] == 0;
    if (unowned > 0) {
        idem__fmt(err, cap, "shard directory: %zu of %d buckets have no cluster", unowned,
                  IDEM_SHARD_BUCKETS);
        return IDEM_ESTORE;
    }
    return 0;
}

int idem_shard_map_read(struct idem_store *directory, struct idem_shard_map **out, char **errmsg)
{
    int rc = 0;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    struct idem_shard_map *m = NULL;
    char err[IDEM_ERRMSG_MAX] = "";

    if (errmsg)
        *errmsg = NULL;
    if (!directory || !out)
        return IDEM_EINVAL;
    *out = NULL;
    m = calloc(1, sizeof(*m));
    if (!m) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    rc = idem_tx_begin(directory, 0, &tx);
    if (rc < 0) {
        idem__fmt(err, sizeof(err), "shard directory: %s", idem_strerror(rc));
        goto out;
    }
    /* One statement, one snapshot; every cluster, buckets or none, in name order. */
    rc = idem_tx_exec(tx,
                      "SELECT c.name, c.uri, b.bucket, b.epoch, b.moving"
                      " FROM idem_shard_clusters c"
                      " LEFT JOIN idem_shard_buckets b ON b.cluster = c.name"
                      " ORDER BY c.name, b.bucket",
                      0, NULL, &rows);
    if (rc < 0) {
        idem__fmt(err, sizeof(err), "shard directory: %s", idem_tx_errmsg(tx));
        goto out;
    }
    rc = fill_map(m, rows, err, sizeof(err));
    if (rc < 0)
        goto out;
    *out = m;
    m = NULL;
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    idem_shard_map_free(m);
    if (rc < 0 && errmsg)
        *errmsg = idem__strdup(err[0] ? err : idem_strerror(rc));
    return rc;
}

size_t idem_shard_map_clusters(const struct idem_shard_map *map)
{
    return map ? map->nclusters : 0;
}

const char *idem_shard_map_name(const struct idem_shard_map *map, size_t i)
{
    return map && i < map->nclusters ? map->names[i] : NULL;
}

const char *idem_shard_map_uri(const struct idem_shard_map *map, size_t i)
{
    return map && i < map->nclusters ? map->uris[i] : NULL;
}

int idem_shard_map_owner(const struct idem_shard_map *map, unsigned bucket, size_t *cluster,
                         int64_t *epoch)
{
    if (!map || !cluster || bucket >= IDEM_SHARD_BUCKETS)
        return IDEM_EINVAL;
    *cluster = map->owner[bucket];
    if (epoch)
        *epoch = map->epoch[bucket];
    return map->moving[bucket] ? IDEM_EMOVED : 0;
}
