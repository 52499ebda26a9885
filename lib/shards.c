/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shards.c - a shard set: the directory, the map read from it, and one store per cluster, so a
 * program picks the store of a principal above the stores instead of the stores knowing of each
 * other.  Nothing here reaches into a store's machinery: the fence each cluster keeps is a table,
 * an SQL function and a trigger, installed as a migration and checked by PostgreSQL inside every
 * writing transaction, whichever of the store's paths (a pipeline, a batch) sends the write.
 *
 * The map is held whole and swapped whole: a route reads one bucket's owner under a read lock,
 * and a refresh replaces the map under the write lock after reading the directory outside it.
 * A stale map is harmless by construction: the cluster, not the map, decides whether a write
 * lands (docs/shards.md).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

struct idem_shards {
    struct idem_store *dir;
    size_t n;
    char **names;               /* the clusters, in the map's (name) order */
    struct idem_store **stores; /* one per cluster, index as names */

    pthread_rwlock_t lock; /* guards `map` */
    struct idem_shard_map *map;

    pthread_mutex_t refresh_mu; /* one refresh at a time */
    int64_t refreshed_ms;       /* monotonic time of the last read of the directory */
};

/* Re-reads of the directory are at most this often, however many writes are refused. */
#define REFRESH_MIN_MS 100

/*
 * Each cluster's fence.  idem_buckets holds a row for each bucket the cluster owns, at the epoch
 * the map gave it; idem_bucket_of() is idem_shard_bucket() in SQL (bytes 6 and 7 of the digest
 * are the low 16 bits of its first 8, read big-endian, so their low 10 bits are that mod 1024).
 * The trigger refuses an insert or update of a record whose bucket has no row here; a delete of
 * one is skipped instead, so a sweep passes by rows a move has yet to remove.  It reads the row
 * without locking it, so writers never contend on idem_buckets: a move that deletes a bucket's
 * row must then wait for the transactions older than its delete (docs/shards.md).
 */
#define FENCE_SQL                                                                                  \
    "CREATE TABLE IF NOT EXISTS idem_buckets ("                                                    \
    " bucket integer PRIMARY KEY CHECK (bucket >= 0 AND bucket < 1024),"                           \
    " epoch bigint NOT NULL CHECK (epoch >= 1));"                                                  \
    "CREATE OR REPLACE FUNCTION idem_bucket_of(p text) RETURNS integer"                            \
    " LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $f$"                                          \
    " SELECT ((get_byte(h, 6) & 3) << 8) | get_byte(h, 7)"                                         \
    " FROM (SELECT sha256(convert_to(p, 'UTF8')) AS h) d $f$;"                                     \
    "CREATE OR REPLACE FUNCTION idem_bucket_owned(p text) RETURNS boolean"                         \
    " LANGUAGE sql STABLE AS $f$"                                                                  \
    " SELECT EXISTS (SELECT 1 FROM idem_buckets WHERE bucket = idem_bucket_of(p)) $f$;"            \
    "CREATE OR REPLACE FUNCTION idem_records_fence() RETURNS trigger LANGUAGE plpgsql AS $f$"      \
    " BEGIN"                                                                                       \
    "  IF TG_OP = 'DELETE' THEN"                                                                   \
    "   IF idem_bucket_owned(OLD.principal) THEN RETURN OLD; END IF;"                              \
    "   RETURN NULL;"                                                                              \
    "  END IF;"                                                                                    \
    "  IF idem_bucket_owned(NEW.principal) THEN RETURN NEW; END IF;"                               \
    "  RAISE EXCEPTION 'bucket % is not on this cluster (moved or moving)',"                       \
    "   idem_bucket_of(NEW.principal) USING ERRCODE = 'IDM01';"                                    \
    " END $f$;"                                                                                    \
    "DROP TRIGGER IF EXISTS idem_records_fence ON idem_records;"                                   \
    "CREATE TRIGGER idem_records_fence BEFORE INSERT OR UPDATE OR DELETE ON idem_records"          \
    " FOR EACH ROW EXECUTE FUNCTION idem_records_fence();"

static const struct idem_migration fence_schema[] = {
    {1, "shard fence", NULL, FENCE_SQL},
};

static int set_err(char **errmsg, int rc, const char *msg)
{
    if (errmsg && !*errmsg)
        *errmsg = idem__strdup(msg && msg[0] ? msg : idem_strerror(rc));
    return rc;
}

void idem_shards_close(struct idem_shards *sh)
{
    if (!sh)
        return;
    for (size_t i = 0; i < sh->n; i++) {
        idem_store_close(sh->stores[i]);
        free(sh->names[i]);
    }
    free(sh->stores);
    free(sh->names);
    idem_shard_map_free(sh->map);
    idem_store_close(sh->dir);
    pthread_rwlock_destroy(&sh->lock);
    pthread_mutex_destroy(&sh->refresh_mu);
    free(sh);
}

/* Opens cluster i of the map as a PostgreSQL store and installs its fence. */
static int open_cluster(struct idem_shards *sh, size_t i, const struct idem_store_options *opts,
                        char **errmsg)
{
    int rc = 0;
    char *why = NULL;
    char msg[IDEM_ERRMSG_MAX];
    const char *name = idem_shard_map_name(sh->map, i);

    sh->names[i] = idem__strdup(name);
    if (!sh->names[i])
        return IDEM_ENOMEM;
    rc = idem_store_open(idem_shard_map_uri(sh->map, i), opts, &sh->stores[i], &why);
    if (rc == 0 && strcmp(idem_store_kind(sh->stores[i]), "postgresql") != 0) {
        idem__fmt(msg, sizeof(msg), "shard cluster %s: a cluster must be PostgreSQL", name);
        return set_err(errmsg, IDEM_EURI, msg);
    }
    if (rc == 0)
        rc = idem_store_migrate(sh->stores[i], "idem_shard_fence", fence_schema,
                                sizeof(fence_schema) / sizeof(fence_schema[0]), NULL, &why);
    if (rc < 0) {
        idem__fmt(msg, sizeof(msg), "shard cluster %s: %s", name, why ? why : idem_strerror(rc));
        set_err(errmsg, rc, msg);
    }
    idem_free(why);
    return rc;
}

int idem_shards_open(const char *directory_uri, const struct idem_store_options *opts,
                     struct idem_shards **out, char **errmsg)
{
    int rc = 0;
    struct idem_shards *sh = NULL;

    if (errmsg)
        *errmsg = NULL;
    if (!directory_uri || !out)
        return set_err(errmsg, IDEM_EINVAL, "shard directory URI missing");
    *out = NULL;
    sh = calloc(1, sizeof(*sh));
    if (!sh)
        return IDEM_ENOMEM;
    if (pthread_rwlock_init(&sh->lock, NULL) != 0) {
        free(sh);
        return IDEM_ENOMEM;
    }
    if (pthread_mutex_init(&sh->refresh_mu, NULL) != 0) {
        pthread_rwlock_destroy(&sh->lock);
        free(sh);
        return IDEM_ENOMEM;
    }
    rc = idem_store_open(directory_uri, opts, &sh->dir, errmsg);
    if (rc < 0)
        goto out;
    rc = idem__shard_directory_migrate(sh->dir, errmsg);
    if (rc < 0)
        goto out;
    rc = idem_shard_map_read(sh->dir, &sh->map, errmsg);
    if (rc < 0)
        goto out;
    sh->refreshed_ms = clock_mono_ms();
    sh->names = calloc(idem_shard_map_clusters(sh->map), sizeof(*sh->names));
    sh->stores = calloc(idem_shard_map_clusters(sh->map), sizeof(*sh->stores));
    if (!sh->names || !sh->stores) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    sh->n = idem_shard_map_clusters(sh->map); /* what idem_shards_close() walks */
    for (size_t i = 0; i < sh->n && rc == 0; i++)
        rc = open_cluster(sh, i, opts, errmsg);
    if (rc < 0)
        goto out;
    *out = sh;
    sh = NULL;
out:
    if (rc < 0)
        set_err(errmsg, rc, NULL);
    idem_shards_close(sh);
    return rc;
}

size_t idem_shards_count(const struct idem_shards *sh)
{
    return sh ? sh->n : 0;
}

const char *idem_shards_name(const struct idem_shards *sh, size_t i)
{
    return sh && i < sh->n ? sh->names[i] : NULL;
}

struct idem_store *idem_shards_store(const struct idem_shards *sh, size_t i)
{
    return sh && i < sh->n ? sh->stores[i] : NULL;
}

/* Routes `bucket` by the map held now. */
static int route_bucket(struct idem_shards *sh, unsigned bucket, size_t *index)
{
    int rc;

    pthread_rwlock_rdlock(&sh->lock);
    rc = idem_shard_map_owner(sh->map, bucket, index, NULL);
    pthread_rwlock_unlock(&sh->lock);
    return rc;
}

int idem_shards_route(struct idem_shards *sh, const char *principal, size_t *index)
{
    if (!sh || !principal || !index)
        return IDEM_EINVAL;
    return route_bucket(sh, idem_shard_bucket(principal, strlen(principal)), index);
}

/* Whether `m` names exactly the clusters the set opened, in the same order. */
static int same_clusters(const struct idem_shards *sh, const struct idem_shard_map *m)
{
    if (idem_shard_map_clusters(m) != sh->n)
        return 0;
    for (size_t i = 0; i < sh->n; i++) {
        if (strcmp(idem_shard_map_name(m, i), sh->names[i]) != 0)
            return 0;
    }
    return 1;
}

int idem_shards_refresh(struct idem_shards *sh)
{
    int rc = 0;
    struct idem_shard_map *m = NULL, *old = NULL;

    if (!sh)
        return IDEM_EINVAL;
    /* A refresh under way will bring what this one would: do not queue behind it. */
    if (pthread_mutex_trylock(&sh->refresh_mu) != 0)
        return 0;
    if (clock_mono_ms() - sh->refreshed_ms < REFRESH_MIN_MS)
        goto out;
    rc = idem_shard_map_read(sh->dir, &m, NULL);
    if (rc < 0)
        goto out;
    sh->refreshed_ms = clock_mono_ms();
    if (!same_clusters(sh, m)) {
        rc = IDEM_ESTATE; /* a cluster joined or left: a restart opens its store */
        goto out;
    }
    pthread_rwlock_wrlock(&sh->lock);
    old = sh->map;
    sh->map = m;
    m = NULL;
    pthread_rwlock_unlock(&sh->lock);
out:
    pthread_mutex_unlock(&sh->refresh_mu);
    idem_shard_map_free(m);
    idem_shard_map_free(old);
    return rc;
}

int idem_shards_tx_begin(struct idem_shards *sh, const char *principal, int write,
                         struct idem_tx **out)
{
    int rc = 0;
    size_t index = 0;
    unsigned bucket;
    char text[16];
    const char *params[1] = {text};
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;

    if (!sh || !principal || !out)
        return IDEM_EINVAL;
    *out = NULL;
    bucket = idem_shard_bucket(principal, strlen(principal));
    rc = route_bucket(sh, bucket, &index);
    if (rc < 0)
        goto out;
    rc = idem_tx_begin(sh->stores[index], write, &tx);
    if (rc < 0 || !write)
        goto out;
    idem__fmt(text, sizeof(text), "%u", bucket);
    rc = idem_tx_exec(tx, "SELECT 1 FROM idem_buckets WHERE bucket = $1", 1, params, &rows);
    if (rc == 0 && idem_rows_count(rows) != 1)
        rc = IDEM_EMOVED;
out:
    idem_rows_free(rows);
    if (rc == IDEM_EMOVED)
        idem_shards_refresh(sh); /* the caller begins again with what the directory says now */
    if (rc < 0) {
        idem_tx_rollback(tx);
        return rc;
    }
    *out = tx;
    return 0;
}
