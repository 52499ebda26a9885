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
 *
 * The clusters only grow while the set is open: a refresh whose map names a new cluster opens
 * its store into the next slot of fixed arrays and then publishes the count, so a reader that
 * loads the count sees whole entries only and takes no lock for them.  A set's index of a
 * cluster never changes; the map's (name order) may, so the set keeps where each of the map's
 * clusters is, swapped with the map.
 */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct idem_shards {
    struct idem_store *dir;
    struct idem_store_options opts; /* what opens a cluster's store */
    int has_opts;
    /* Slots [0, n) are whole; slot n is written (by a refresh only) before n grows past it. */
    _Atomic size_t n;
    char *names[IDEM_SHARDS_MAX];               /* as opened: the map's order, then as added */
    struct idem_store *stores[IDEM_SHARDS_MAX]; /* one per cluster, index as names */
    /* A mover's set (lazy) opens a cluster only once it needs it, from its URI. */
    int lazy;
    char *uris[IDEM_SHARDS_MAX];

    pthread_rwlock_t lock; /* guards `map` and `at` */
    struct idem_shard_map *map;
    size_t at[IDEM_SHARDS_MAX]; /* the map's cluster i is the set's at[i] */

    pthread_mutex_t refresh_mu;              /* one refresh at a time */
    int64_t refreshed_ms;                    /* monotonic time of the last read of the directory */
    atomic_ullong refreshes, refresh_errors; /* idem_shards_stats() */
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

/*
 * Two ways past the fence, both read only on the refused path (an owned bucket's write pays
 * nothing for them).  The mover's: a transaction that has set idem.mover to 'on' (set_config(...,
 * true), so it ends with the transaction) may write and delete the records of a bucket its
 * cluster does not own -- the copy into a new owner before it takes writes, and the removal of
 * what the old owner keeps.  And a key in flight's: the holder of a live lease may still update
 * its record (renew, advance, complete) once the bucket's row is gone, so an answer the upstream
 * gave during a move is kept; the move waits for those leases before it copies (docs/shards.md).
 * A new claim, or a takeover of an expired lease, is refused.  `LEASED` is what the trigger runs
 * as it lets a live lease's holder through, before it returns the row: a later step marks the
 * transaction with the bucket there, for the rows' fence below.
 */
#define RECORDS_FENCE_SQL(LEASED)                                                                  \
    "CREATE OR REPLACE FUNCTION idem_records_fence() RETURNS trigger LANGUAGE plpgsql AS $f$"      \
    " BEGIN"                                                                                       \
    "  IF TG_OP = 'DELETE' THEN"                                                                   \
    "   IF idem_bucket_owned(OLD.principal) THEN RETURN OLD; END IF;"                              \
    "   IF current_setting('idem.mover', true) = 'on' THEN RETURN OLD; END IF;"                    \
    "   RETURN NULL;"                                                                              \
    "  END IF;"                                                                                    \
    "  IF idem_bucket_owned(NEW.principal) THEN RETURN NEW; END IF;"                               \
    "  IF current_setting('idem.mover', true) = 'on' THEN RETURN NEW; END IF;"                     \
    "  IF TG_OP = 'UPDATE' AND OLD.status = 0"                                                     \
    "   AND (NEW.lease_owner IS NULL OR NEW.lease_owner = OLD.lease_owner)"                        \
    "   AND OLD.lease_expires_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint "        \
    "THEN" LEASED "   RETURN NEW;"                                                                 \
    "  END IF;"                                                                                    \
    "  RAISE EXCEPTION 'bucket % is not on this cluster (moved or moving)',"                       \
    "   idem_bucket_of(NEW.principal) USING ERRCODE = 'IDM01';"                                    \
    " END $f$;"
#define FENCE_MOVER_SQL RECORDS_FENCE_SQL("")

/*
 * An application's rows move with their bucket too, once it registers their table with
 * idem_shard_table(table, column): `column` holds the principal the rows belong to (a NULL one
 * belongs to no bucket and stays).  Registering records the table in idem_shard_tables (in the
 * order tables are registered: parents first, as a move inserts in that order and deletes in the
 * reverse) and gives it the rows' fence, a constraint trigger checked at commit: a transaction
 * may write a row of a bucket its cluster owns, or of one a move is carrying (the mover's
 * setting), or of the bucket whose key in flight it completes past the fence (the record's
 * trigger names that bucket in idem.leased, as it lets the update through, whichever statement
 * of the transaction came first).  Anything else -- a worker's update, a sweep's delete, a write
 * with a stale map -- is refused at commit with IDM01, as a record's write is.  Checked at commit,
 * the fence row is read inside a transaction that had begun by then, which is all the drain needs.
 */
#define FENCE_ROWS_SQL                                                                             \
    "CREATE TABLE IF NOT EXISTS idem_shard_tables ("                                               \
    " name text PRIMARY KEY,"                                                                      \
    " principal_column text NOT NULL,"                                                             \
    " position bigserial NOT NULL);"                                                               \
    "CREATE OR REPLACE FUNCTION idem_rows_fence() RETURNS trigger LANGUAGE plpgsql AS $f$"         \
    " DECLARE p text; b integer;"                                                                  \
    " BEGIN"                                                                                       \
    "  IF TG_OP = 'DELETE' THEN p := to_jsonb(OLD) ->> TG_ARGV[0];"                                \
    "  ELSE p := to_jsonb(NEW) ->> TG_ARGV[0]; END IF;"                                            \
    "  IF p IS NULL THEN RETURN NULL; END IF;"                                                     \
    "  b := idem_bucket_of(p);"                                                                    \
    "  IF EXISTS (SELECT 1 FROM idem_buckets WHERE bucket = b)"                                    \
    "   OR current_setting('idem.mover', true) = 'on'"                                             \
    "   OR current_setting('idem.leased', true) = b::text THEN RETURN NULL; END IF;"               \
    "  RAISE EXCEPTION 'bucket % is not on this cluster (moved or moving)', b"                     \
    "   USING ERRCODE = 'IDM01';"                                                                  \
    " END $f$;"                                                                                    \
    "CREATE OR REPLACE FUNCTION idem_shard_table(t regclass, col text) RETURNS void"               \
    " LANGUAGE plpgsql AS $f$"                                                                     \
    " BEGIN"                                                                                       \
    "  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = t AND attname = col"             \
    "   AND attnum > 0 AND NOT attisdropped) THEN"                                                 \
    "   RAISE EXCEPTION 'table % has no column %', t, col USING ERRCODE = '42703';"                \
    "  END IF;"                                                                                    \
    "  INSERT INTO idem_shard_tables (name, principal_column) VALUES (t::text, quote_ident(col))"  \
    "   ON CONFLICT (name) DO UPDATE SET principal_column = EXCLUDED.principal_column;"            \
    "  EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %s (idem_bucket_of(%I))',"                 \
    "   (SELECT relname FROM pg_class WHERE oid = t) || '_idem_bucket', t, col);"                  \
    "  EXECUTE format('DROP TRIGGER IF EXISTS idem_rows_fence ON %s', t);"                         \
    "  EXECUTE format('CREATE CONSTRAINT TRIGGER idem_rows_fence'"                                 \
    "   || ' AFTER INSERT OR UPDATE OR DELETE ON %s DEFERRABLE INITIALLY DEFERRED'"                \
    "   || ' FOR EACH ROW EXECUTE FUNCTION idem_rows_fence(%L)', t, col);"                         \
    " END $f$;"
#define FENCE_LEASED_SQL                                                                           \
    RECORDS_FENCE_SQL("   PERFORM set_config('idem.leased', idem_bucket_of(NEW.principal)::text, " \
                      "true);")

/*
 * A move finds a bucket's rows by an index on the bucket, so its scans grow with the bucket, not
 * the table: the records', the keys in flight's, and each registered table's (made as it is
 * registered).  idem_bucket_of() becomes one expression, the same bucket computed without a
 * subquery, so that PostgreSQL inlines it into the index, the fence and the move's queries alike.
 * On a large existing table, make the index first with CREATE INDEX CONCURRENTLY under the same
 * name (docs/shards.md): the migration then finds it and does not hold the table's writes.
 */
#define FENCE_INDEX_SQL                                                                            \
    "CREATE OR REPLACE FUNCTION idem_bucket_of(p text) RETURNS integer"                            \
    " LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $f$"                                          \
    " SELECT (('x' || encode(substring(sha256(convert_to(p, 'UTF8')) FROM 7 FOR 2), 'hex'))"       \
    "  ::bit(16)::integer) & 1023 $f$;"                                                            \
    "CREATE INDEX IF NOT EXISTS idem_records_bucket ON idem_records (idem_bucket_of(principal));"  \
    "CREATE INDEX IF NOT EXISTS idem_inflight_bucket ON idem_inflight"                             \
    " (idem_bucket_of(principal));"

static const struct idem_migration fence_schema[] = {
    {1, "shard fence", NULL, FENCE_SQL},
    {2, "shard fence: the mover", NULL, FENCE_MOVER_SQL},
    {3, "shard fence: an index on the bucket, an application's rows", NULL,
     FENCE_INDEX_SQL FENCE_ROWS_SQL FENCE_LEASED_SQL},
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
    for (size_t i = 0; i < IDEM_SHARDS_MAX; i++) {
        idem_store_close(sh->stores[i]);
        free(sh->names[i]);
        free(sh->uris[i]);
    }
    idem_shard_map_free(sh->map);
    idem_store_close(sh->dir);
    pthread_rwlock_destroy(&sh->lock);
    pthread_mutex_destroy(&sh->refresh_mu);
    free(sh);
}

/*
 * Installs the fence on `st`, the store of cluster `name`, which must be PostgreSQL (opening it
 * made its idem records schema already).
 */
static int install_fence(struct idem_store *st, const char *name, char **errmsg)
{
    int rc = 0;
    char *why = NULL;
    char msg[IDEM_ERRMSG_MAX];

    if (strcmp(idem_store_kind(st), "postgresql") != 0) {
        idem__fmt(msg, sizeof(msg), "shard cluster %s: a cluster must be PostgreSQL", name);
        return set_err(errmsg, IDEM_EURI, msg);
    }
    rc = idem_store_migrate(st, "idem_shard_fence", fence_schema,
                            sizeof(fence_schema) / sizeof(fence_schema[0]), NULL, &why);
    if (rc < 0) {
        idem__fmt(msg, sizeof(msg), "shard cluster %s: %s", name, why ? why : idem_strerror(rc));
        set_err(errmsg, rc, msg);
    }
    idem_free(why);
    return rc;
}

/*
 * Opens cluster `name` at `uri` as a PostgreSQL store with its fence, into slot i (the next one,
 * not yet published); on failure the slot is left empty, for a later refresh to try again.
 */
static int open_cluster(struct idem_shards *sh, size_t i, const char *name, const char *uri,
                        char **errmsg)
{
    int rc = 0;
    char *why = NULL;
    char msg[IDEM_ERRMSG_MAX];

    sh->names[i] = idem__strdup(name);
    if (!sh->names[i])
        return IDEM_ENOMEM;
    rc = idem_store_open(uri, sh->has_opts ? &sh->opts : NULL, &sh->stores[i], &why);
    if (rc < 0) {
        idem__fmt(msg, sizeof(msg), "shard cluster %s: %s", name, why ? why : idem_strerror(rc));
        set_err(errmsg, rc, msg);
    }
    idem_free(why);
    if (rc == 0)
        rc = install_fence(sh->stores[i], name, errmsg);
    if (rc < 0) {
        idem_store_close(sh->stores[i]);
        free(sh->names[i]);
        sh->stores[i] = NULL;
        sh->names[i] = NULL;
    }
    return rc;
}

/*
 * Takes map `m` (stolen on success): opens the clusters it names that the set does not hold yet,
 * each published whole before the next, then swaps it in with where its clusters are in the set.
 * A map that leaves out a cluster of the set is refused (removing one takes a restart).
 */
static int take_map(struct idem_shards *sh, struct idem_shard_map *m, char **errmsg)
{
    int rc = 0;
    size_t at[IDEM_SHARDS_MAX], n = atomic_load(&sh->n), mn = idem_shard_map_clusters(m);
    struct idem_shard_map *old = NULL;
    char msg[IDEM_ERRMSG_MAX];

    if (mn > IDEM_SHARDS_MAX) {
        idem__fmt(msg, sizeof msg, "shard directory: %zu clusters; a set holds at most %d", mn,
                  IDEM_SHARDS_MAX);
        return set_err(errmsg, IDEM_ESTATE, msg);
    }
    for (size_t j = 0; j < mn; j++) {
        const char *name = idem_shard_map_name(m, j);
        size_t i = 0;

        while (i < n && strcmp(sh->names[i], name) != 0)
            i++;
        if (i == n) {
            if (sh->lazy) {
                sh->names[n] = idem__strdup(name);
                sh->uris[n] = idem__strdup(idem_shard_map_uri(m, j));
                rc = sh->names[n] && sh->uris[n] ? 0 : IDEM_ENOMEM;
            } else {
                rc = open_cluster(sh, n, name, idem_shard_map_uri(m, j), errmsg);
            }
            if (rc < 0)
                return rc;
            atomic_store(&sh->n, ++n); /* the slot is whole: readers may use it */
        }
        at[j] = i;
    }
    if (mn != n) {
        /* Every name of the map is in the set, once: the set holds one the map does not. */
        idem__fmt(msg, sizeof msg,
                  "shard directory: a cluster of this set is gone from the map; removing a "
                  "cluster takes a restart");
        return set_err(errmsg, IDEM_ESTATE, msg);
    }
    pthread_rwlock_wrlock(&sh->lock);
    old = sh->map;
    sh->map = m;
    memcpy(sh->at, at, mn * sizeof at[0]);
    pthread_rwlock_unlock(&sh->lock);
    idem_shard_map_free(old);
    return 0;
}

/* The set's index of the owner of `bucket` by the map held now, as idem_shard_map_owner(). */
static int owner_of(struct idem_shards *sh, unsigned bucket, size_t *index, int64_t *epoch)
{
    int rc;
    size_t j = 0;

    pthread_rwlock_rdlock(&sh->lock);
    rc = idem_shard_map_owner(sh->map, bucket, &j, epoch);
    if (rc >= 0 || rc == IDEM_EMOVED)
        *index = sh->at[j];
    pthread_rwlock_unlock(&sh->lock);
    return rc;
}

/* idem_shards_open(), or with `lazy` a set whose clusters are named but not opened yet. */
static int shards_open(const char *directory_uri, const struct idem_store_options *opts, int lazy,
                       struct idem_shards **out, char **errmsg)
{
    int rc = 0;
    struct idem_shards *sh = NULL;
    struct idem_shard_map *m = NULL;

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
    if (opts) {
        sh->opts = *opts;
        sh->has_opts = 1;
    }
    sh->lazy = lazy;
    rc = idem_store_open(directory_uri, opts, &sh->dir, errmsg);
    if (rc < 0)
        goto out;
    rc = idem__shard_directory_migrate(sh->dir, errmsg);
    if (rc < 0)
        goto out;
    rc = idem_shard_map_read(sh->dir, &m, errmsg);
    if (rc < 0)
        goto out;
    sh->refreshed_ms = clock_mono_ms();
    rc = take_map(sh, m, errmsg); /* opens every cluster, in the map's order */
    if (rc < 0)
        goto out;
    m = NULL;
    *out = sh;
    sh = NULL;
out:
    if (rc < 0)
        set_err(errmsg, rc, NULL);
    idem_shard_map_free(m);
    idem_shards_close(sh);
    return rc;
}

int idem_shards_open(const char *directory_uri, const struct idem_store_options *opts,
                     struct idem_shards **out, char **errmsg)
{
    return shards_open(directory_uri, opts, 0, out, errmsg);
}

size_t idem_shards_count(const struct idem_shards *sh)
{
    return sh ? atomic_load(&((struct idem_shards *)sh)->n) : 0;
}

const char *idem_shards_name(const struct idem_shards *sh, size_t i)
{
    return i < idem_shards_count(sh) ? sh->names[i] : NULL;
}

struct idem_store *idem_shards_store(const struct idem_shards *sh, size_t i)
{
    return i < idem_shards_count(sh) ? sh->stores[i] : NULL;
}

/* Routes `bucket` by the map held now. */
static int route_bucket(struct idem_shards *sh, unsigned bucket, size_t *index)
{
    return owner_of(sh, bucket, index, NULL);
}

int idem_shards_route(struct idem_shards *sh, const char *principal, size_t *index)
{
    if (!sh || !principal || !index)
        return IDEM_EINVAL;
    return route_bucket(sh, idem_shard_bucket(principal, strlen(principal)), index);
}

int idem_shards_refresh(struct idem_shards *sh)
{
    int rc = 0;
    struct idem_shard_map *m = NULL;

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
    rc = take_map(sh, m, NULL); /* a cluster the map names first opens here */
    if (rc == 0) {
        m = NULL;
        atomic_fetch_add(&sh->refreshes, 1);
    }
out:
    if (rc < 0)
        atomic_fetch_add(&sh->refresh_errors, 1);
    pthread_mutex_unlock(&sh->refresh_mu);
    idem_shard_map_free(m);
    return rc;
}

void idem_shards_stats(const struct idem_shards *sh, struct idem_shards_stats *out)
{
    struct idem_shards *s = (struct idem_shards *)sh; /* C11's atomic_load takes no const */

    if (!out)
        return;
    *out = (struct idem_shards_stats){0};
    if (!s)
        return;
    out->refreshes = atomic_load(&s->refreshes);
    out->refresh_errors = atomic_load(&s->refresh_errors);
    out->clusters = idem_shards_count(sh);
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
    if (rc < 0)
        goto out;
    /*
     * A read is fenced too: once it saw the row, a move's drain waits for it to end before the
     * bucket's rows are copied and removed here, so it never reads an emptied old owner.
     */
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

/* ---- setting a directory up, moving a bucket ------------------------------------------------ */

/* Runs one statement in `tx`; a failure says `what` and the store's detail in `err`. */
static int tx_run(struct idem_tx *tx, const char *what, const char *sql, int nparams,
                  const char *const *params, struct idem_rows **rows, char *err, size_t cap)
{
    int rc = idem_tx_exec(tx, sql, nparams, params, rows);

    if (rc < 0)
        idem__fmt(err, cap, "%s: %s", what, idem_tx_errmsg(tx));
    return rc;
}

/* The integer in (0, 0) of `rows`, or -1. */
static int64_t rows_int(const struct idem_rows *rows)
{
    const char *v = idem_rows_get(rows, 0, 0);

    return v ? strtoll(v, NULL, 10) : -1;
}

/* Whether the clusters `c` (n of them) are exactly those of `rows` (name, uri). */
static int same_cluster_list(const struct idem_rows *rows, const struct idem_shard_cluster *c,
                             size_t n)
{
    if ((size_t)idem_rows_count(rows) != n)
        return 0;
    for (int r = 0; r < idem_rows_count(rows); r++) {
        size_t i = 0;

        while (i < n && strcmp(c[i].name, idem_rows_get(rows, r, 0)) != 0)
            i++;
        if (i == n || strcmp(c[i].uri, idem_rows_get(rows, r, 1)) != 0)
            return 0;
    }
    return 1;
}

/* The directory's half of idem_shards_init(): the clusters and the buckets, or a check of them. */
static int init_directory(struct idem_store *dir, const struct idem_shard_cluster *c, size_t n,
                          char *err, size_t cap)
{
    int rc = 0;
    struct idem_tx *tx = NULL;
    struct idem_rows *names = NULL, *count = NULL;
    char lo[16], hi[16];

    rc = idem_tx_begin(dir, 1, &tx);
    if (rc < 0) {
        idem__fmt(err, cap, "shard directory: %s", idem_strerror(rc));
        goto out;
    }
    rc = tx_run(tx, "shard directory", "SELECT name, uri FROM idem_shard_clusters ORDER BY name", 0,
                NULL, &names, err, cap);
    if (rc == 0)
        rc = tx_run(tx, "shard directory", "SELECT count(*) FROM idem_shard_buckets", 0, NULL,
                    &count, err, cap);
    if (rc < 0)
        goto out;
    if (idem_rows_count(names) > 0 || rows_int(count) != 0) {
        if (!same_cluster_list(names, c, n) || rows_int(count) != IDEM_SHARD_BUCKETS) {
            idem__fmt(err, cap,
                      "shard directory: it holds another map (%d clusters, %lld buckets); "
                      "left as it is",
                      idem_rows_count(names), (long long)rows_int(count));
            rc = IDEM_ESTATE;
        }
        goto out; /* set up already: kept as it is */
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *cp[2] = {c[i].name, c[i].uri};
        rc = tx_run(tx, "shard directory", "INSERT INTO idem_shard_clusters VALUES ($1, $2)", 2, cp,
                    NULL, err, cap);
    }
    /* Cluster i owns [i * 1024 / n, (i + 1) * 1024 / n): even, contiguous, in the order given. */
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *bp[3] = {lo, hi, c[i].name};
        idem__fmt(lo, sizeof lo, "%zu", i * IDEM_SHARD_BUCKETS / n);
        idem__fmt(hi, sizeof hi, "%zu", (i + 1) * IDEM_SHARD_BUCKETS / n);
        rc = tx_run(tx, "shard directory",
                    "WITH RECURSIVE s(b) AS (SELECT CAST($1 AS integer)"
                    " UNION ALL SELECT b + 1 FROM s WHERE b + 1 < CAST($2 AS integer))"
                    " INSERT INTO idem_shard_buckets (bucket, cluster, epoch, moving)"
                    " SELECT b, $3, 1, 0 FROM s",
                    3, bp, NULL, err, cap);
    }
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
        if (rc < 0)
            idem__fmt(err, cap, "shard directory: commit: %s", idem_strerror(rc));
    }
out:
    idem_rows_free(names);
    idem_rows_free(count);
    idem_tx_rollback(tx);
    return rc;
}

/* Cluster i's idem_buckets rows, when it has none yet: the buckets the map gives it, not moving. */
static int init_fence_rows(struct idem_shards *sh, size_t i, char *err, size_t cap)
{
    int rc = 0;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    char *buckets = NULL, *epochs = NULL;
    const char *params[2];
    size_t blen = 0, elen = 0, bcap = IDEM_SHARD_BUCKETS * 6 + 3,
           ecap = IDEM_SHARD_BUCKETS * 21 + 3;

    buckets = malloc(bcap);
    epochs = malloc(ecap);
    if (!buckets || !epochs) {
        rc = IDEM_ENOMEM;
        goto out;
    }
    rc = idem_tx_begin(sh->stores[i], 1, &tx);
    if (rc < 0) {
        idem__fmt(err, cap, "shard cluster %s: %s", sh->names[i], idem_strerror(rc));
        goto out;
    }
    rc = tx_run(tx, sh->names[i], "SELECT count(*) FROM idem_buckets", 0, NULL, &rows, err, cap);
    if (rc < 0 || rows_int(rows) != 0)
        goto out; /* given its rows already (a move keeps them since) */
    buckets[blen++] = '{';
    epochs[elen++] = '{';
    for (unsigned b = 0; b < IDEM_SHARD_BUCKETS; b++) {
        size_t owner = 0;
        int64_t epoch = 0;

        if (owner_of(sh, b, &owner, &epoch) != 0 || owner != i)
            continue;
        blen += (size_t)snprintf(buckets + blen, bcap - blen, "%s%u", blen > 1 ? "," : "", b);
        elen += (size_t)snprintf(epochs + elen, ecap - elen, "%s%lld", elen > 1 ? "," : "",
                                 (long long)epoch);
    }
    buckets[blen++] = '}';
    buckets[blen] = '\0';
    epochs[elen++] = '}';
    epochs[elen] = '\0';
    params[0] = buckets;
    params[1] = epochs;
    rc = tx_run(tx, sh->names[i],
                "INSERT INTO idem_buckets (bucket, epoch)"
                " SELECT * FROM unnest(CAST($1 AS integer[]), CAST($2 AS bigint[]))",
                2, params, NULL, err, cap);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
        if (rc < 0)
            idem__fmt(err, cap, "shard cluster %s: commit: %s", sh->names[i], idem_strerror(rc));
    }
out:
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    free(buckets);
    free(epochs);
    return rc;
}

int idem_shards_init(const char *directory_uri, const struct idem_shard_cluster *clusters, size_t n,
                     const struct idem_store_options *opts, char **errmsg)
{
    int rc = 0;
    struct idem_store *dir = NULL;
    struct idem_shards *sh = NULL;
    char err[IDEM_ERRMSG_MAX] = "";

    if (errmsg)
        *errmsg = NULL;
    if (!directory_uri || !clusters || n == 0 || n > IDEM_SHARD_BUCKETS)
        return set_err(errmsg, IDEM_EINVAL, "from 1 to 1024 clusters, and a directory");
    for (size_t i = 0; i < n; i++) {
        if (!clusters[i].name || !clusters[i].uri || !clusters[i].name[0] ||
            strlen(clusters[i].name) > IDEM_SHARD_NAME_MAX)
            return set_err(errmsg, IDEM_EINVAL,
                           "a cluster needs a name (1 to 63 characters)"
                           " and a URI");
        for (size_t j = 0; j < i; j++) {
            if (strcmp(clusters[i].name, clusters[j].name) == 0)
                return set_err(errmsg, IDEM_EINVAL, "a cluster is named twice");
        }
    }
    rc = idem_store_open(directory_uri, opts, &dir, errmsg);
    if (rc == 0)
        rc = idem__shard_directory_migrate(dir, errmsg);
    if (rc == 0)
        rc = init_directory(dir, clusters, n, err, sizeof err);
    if (rc < 0)
        goto out;
    rc = idem_shards_open(directory_uri, opts, &sh, errmsg);
    for (size_t i = 0; rc == 0 && i < sh->n; i++)
        rc = init_fence_rows(sh, i, err, sizeof err);
out:
    if (rc < 0)
        set_err(errmsg, rc, err);
    idem_shards_close(sh);
    idem_store_close(dir);
    return rc;
}

/* Whether `name` may name a cluster: 1 to IDEM_SHARD_NAME_MAX of [A-Za-z0-9._-]. */
static int cluster_name_ok(const char *name)
{
    size_t len = name ? strlen(name) : 0;

    if (len == 0 || len > IDEM_SHARD_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* Refuses a name or URI the directory holds already, and a set that is full. */
static int add_check_directory(struct idem_store *dir, const char *name, const char *uri, char *err,
                               size_t cap)
{
    int rc;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;

    rc = idem_tx_begin(dir, 0, &tx);
    if (rc < 0) {
        idem__fmt(err, cap, "shard directory: %s", idem_strerror(rc));
        return rc;
    }
    rc = tx_run(tx, "shard directory", "SELECT name, uri FROM idem_shard_clusters ORDER BY name", 0,
                NULL, &rows, err, cap);
    for (int r = 0; rc == 0 && r < idem_rows_count(rows); r++) {
        const char *n = idem_rows_get(rows, r, 0), *u = idem_rows_get(rows, r, 1);
        if (strcmp(n, name) == 0) {
            idem__fmt(err, cap, "shard directory: the name '%s' is taken (%s)", name, u);
            rc = IDEM_ECONFLICT;
        } else if (strcmp(u, uri) == 0) {
            idem__fmt(err, cap, "shard directory: cluster '%s' has that URI already", n);
            rc = IDEM_ECONFLICT;
        }
    }
    if (rc == 0 && idem_rows_count(rows) >= IDEM_SHARDS_MAX) {
        idem__fmt(err, cap, "shard directory: a set holds at most %d clusters", IDEM_SHARDS_MAX);
        rc = IDEM_ESTATE;
    }
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

int idem_shards_add(const char *directory_uri, const char *name, const char *uri,
                    const struct idem_store_options *opts, char **errmsg)
{
    int rc = 0;
    struct idem_store *dir = NULL, *st = NULL;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    char *why = NULL;
    char err[IDEM_ERRMSG_MAX] = "";
    const char *params[2] = {name, uri};

    if (errmsg)
        *errmsg = NULL;
    if (!directory_uri || !uri || !uri[0])
        return set_err(errmsg, IDEM_EINVAL, "a cluster needs a store URI, and a directory");
    if (!cluster_name_ok(name))
        return set_err(errmsg, IDEM_EINVAL,
                       "a cluster's name is 1 to 63 letters, digits, '.', '-' or '_'");
    rc = idem_store_open(directory_uri, opts, &dir, errmsg);
    if (rc == 0)
        rc = idem__shard_directory_migrate(dir, errmsg);
    if (rc == 0)
        rc = add_check_directory(dir, name, uri, err, sizeof err);
    if (rc < 0)
        goto out;
    /* The cluster first: the directory names it only once it can take a bucket. */
    rc = idem_store_open(uri, opts, &st, &why);
    if (rc < 0) {
        idem__fmt(err, sizeof err, "shard cluster %s: %s", name, why ? why : idem_strerror(rc));
        goto out;
    }
    rc = install_fence(st, name, errmsg);
    if (rc == 0)
        rc = idem_tx_begin(st, 0, &tx);
    if (rc == 0)
        rc = tx_run(tx, name, "SELECT count(*) FROM idem_buckets", 0, NULL, &rows, err, sizeof err);
    if (rc == 0 && rows_int(rows) != 0) {
        /* It would take writes for buckets the map gives another cluster. */
        idem__fmt(err, sizeof err,
                  "shard cluster %s: its idem_buckets holds %lld buckets already (a cluster of "
                  "another set?)",
                  name, (long long)rows_int(rows));
        rc = IDEM_ESTATE;
    }
    idem_rows_free(rows);
    rows = NULL;
    idem_tx_rollback(tx);
    tx = NULL;
    if (rc < 0)
        goto out;
    rc = idem_tx_begin(dir, 1, &tx);
    if (rc == 0)
        rc = tx_run(tx, "shard directory", "INSERT INTO idem_shard_clusters VALUES ($1, $2)", 2,
                    params, NULL, err, sizeof err);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
    }
    if (rc == IDEM_ECONFLICT)
        idem__fmt(err, sizeof err, "shard directory: the name '%s' is taken", name);
out:
    if (rc < 0)
        set_err(errmsg, rc, err);
    idem_free(why);
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    idem_store_close(st);
    idem_store_close(dir);
    return rc;
}

/* One move of one bucket: the set it runs on and what the directory said of the bucket. */
struct move {
    struct idem_shards *sh;
    const struct idem_shard_move_options *mo;
    char bucket[16];
    size_t from, to;
    int64_t epoch, t0;
    char err[IDEM_ERRMSG_MAX];
};

/*
 * Cluster i's store, opened with its fence the first time the move needs it: a move reaches the
 * bucket's owner and its new owner, and the other clusters only to clean, where they answer.
 */
static int reach(struct move *mv, size_t i)
{
    int rc;
    char *why = NULL;
    struct idem_shards *sh = mv->sh;

    if (sh->stores[i])
        return 0;
    rc = idem_store_open(sh->uris[i], sh->has_opts ? &sh->opts : NULL, &sh->stores[i], &why);
    if (rc < 0)
        idem__fmt(mv->err, sizeof mv->err, "shard cluster %s: %s", sh->names[i],
                  why ? why : idem_strerror(rc));
    if (rc == 0 && (rc = install_fence(sh->stores[i], sh->names[i], &why)) < 0)
        idem__fmt(mv->err, sizeof mv->err, "%s", why ? why : idem_strerror(rc));
    if (rc < 0) {
        idem_store_close(sh->stores[i]);
        sh->stores[i] = NULL;
    }
    idem_free(why);
    return rc;
}

static const char *const step_name[] = {
    [IDEM_SHARD_MOVE_FROZEN] = "frozen",   [IDEM_SHARD_MOVE_FENCED] = "fenced",
    [IDEM_SHARD_MOVE_DRAINED] = "drained", [IDEM_SHARD_MOVE_COPIED] = "copied",
    [IDEM_SHARD_MOVE_FLIPPED] = "flipped", [IDEM_SHARD_MOVE_OPENED] = "opened",
    [IDEM_SHARD_MOVE_CLEANED] = "cleaned",
};

static int step_done(struct move *mv, enum idem_shard_move_step step, int64_t records)
{
    if (!mv->mo || !mv->mo->on_step)
        return 0;
    if (mv->mo->on_step(step, clock_mono_ms() - mv->t0, records, mv->mo->arg) == 0)
        return 0;
    idem__fmt(mv->err, sizeof mv->err, "bucket %s: the move was stopped once %s; run it again",
              mv->bucket, step_name[step]);
    return IDEM_ESTATE;
}

/*
 * Runs `sql` (`np` parameters) in a write transaction of its own on `st`; *changed (may be NULL)
 * the rows it changed.
 */
static int move_exec(struct move *mv, struct idem_store *st, const char *where, const char *sql,
                     int np, const char *const *params, int64_t *changed)
{
    int rc;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;

    rc = idem_tx_begin(st, 1, &tx);
    if (rc < 0) {
        idem__fmt(mv->err, sizeof mv->err, "%s: %s", where, idem_strerror(rc));
        return rc;
    }
    rc = tx_run(tx, where, sql, np, params, &rows, mv->err, sizeof mv->err);
    if (rc == 0 && changed)
        *changed = idem_rows_changed(rows);
    idem_rows_free(rows);
    if (rc < 0) {
        idem_tx_rollback(tx);
        return rc;
    }
    rc = idem_tx_commit(tx);
    if (rc < 0)
        idem__fmt(mv->err, sizeof mv->err, "%s: commit: %s", where, idem_strerror(rc));
    return rc;
}

/* The first value of `sql` (no parameters) on `st`, read in a transaction of its own. */
static int move_query(struct move *mv, struct idem_store *st, const char *where, const char *sql,
                      const char *a, char *out, size_t cap)
{
    int rc;
    struct idem_tx *tx = NULL;
    struct idem_rows *rows = NULL;
    const char *params[1] = {a};

    rc = idem_tx_begin(st, 0, &tx);
    if (rc < 0) {
        idem__fmt(mv->err, sizeof mv->err, "%s: %s", where, idem_strerror(rc));
        return rc;
    }
    rc = tx_run(tx, where, sql, a ? 1 : 0, params, &rows, mv->err, sizeof mv->err);
    if (rc == 0)
        idem__fmt(out, cap, "%s", idem_rows_get(rows, 0, 0) ? idem_rows_get(rows, 0, 0) : "");
    idem_rows_free(rows);
    idem_tx_rollback(tx);
    return rc;
}

/*
 * The drain: waits until no session of the cluster's database is in a transaction that began
 * before `since`, the cluster's clock read after the fence row's delete committed.  A writer
 * that read the fence row before the delete did so inside a transaction that had begun by then,
 * whatever its isolation and however its statements took their snapshots, so once no such
 * transaction is open none can commit a write of the bucket (docs/shards.md).  Sessions of other
 * roles are seen only with pg_read_all_stats: without it the drain could miss them, so it is
 * required.
 */
static int drain(struct move *mv, size_t i, const char *since)
{
    int rc;
    char seen[512];
    int64_t deadline = clock_mono_ms() +
                       (mv->mo && mv->mo->drain_timeout_ms > 0 ? mv->mo->drain_timeout_ms : 30000);

    rc = move_query(mv, mv->sh->stores[i], mv->sh->names[i],
                    "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')", NULL, seen,
                    sizeof seen);
    if (rc == 0 && strcmp(seen, "t") != 0) {
        idem__fmt(mv->err, sizeof mv->err,
                  "%s: the mover's role must see every session (pg_read_all_stats)",
                  mv->sh->names[i]);
        return IDEM_ESTATE;
    }
    for (; rc == 0;) {
        rc = move_query(mv, mv->sh->stores[i], mv->sh->names[i],
                        "SELECT coalesce(string_agg(pid || ' (' || coalesce(state, '?') || ': '"
                        " || left(query, 40) || ')', ', '), '') FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        " AND backend_type = 'client backend'"
                        " AND xact_start < CAST($1 AS timestamptz)",
                        since, seen, sizeof seen);
        if (rc < 0 || seen[0] == '\0')
            break;
        if (clock_mono_ms() > deadline) {
            idem__fmt(mv->err, sizeof mv->err,
                      "%s: transactions older than the fence still open (pids %s); the bucket "
                      "stays frozen: run the move again",
                      mv->sh->names[i], seen);
            return IDEM_ESTATE;
        }
        clock_sleep_ms(10);
    }
    return rc;
}

/*
 * At the owner, once its row is gone: waits until no key of the bucket in flight has a live
 * lease, for its holder may still complete it there (the fence lets it), and then reads the
 * clock again into *since, so the drain also waits for the transaction of the last such write.
 * Expired leases stay as they are (held keys, copied as such): nobody can update them now.
 */
static int wait_leases(struct move *mv, char **since)
{
    int rc = 0;
    char live[32], now[64];
    int64_t deadline = clock_mono_ms() +
                       (mv->mo && mv->mo->drain_timeout_ms > 0 ? mv->mo->drain_timeout_ms : 30000);

    for (;;) {
        rc = move_query(mv, mv->sh->stores[mv->from], mv->sh->names[mv->from],
                        "SELECT count(*) FROM idem_inflight f JOIN idem_records r"
                        " ON r.principal = f.principal AND r.operation = f.operation"
                        " AND r.idem_key = f.idem_key"
                        " WHERE idem_bucket_of(f.principal) = CAST($1 AS integer)"
                        " AND r.lease_expires_ms > (extract(epoch from clock_timestamp()) * 1000)"
                        "::bigint",
                        mv->bucket, live, sizeof live);
        if (rc < 0 || strcmp(live, "0") == 0)
            break;
        if (clock_mono_ms() > deadline) {
            idem__fmt(mv->err, sizeof mv->err,
                      "%s: %s keys of bucket %s still in flight; the bucket stays frozen: run "
                      "the move again",
                      mv->sh->names[mv->from], live, mv->bucket);
            return IDEM_ESTATE;
        }
        clock_sleep_ms(10);
    }
    if (rc == 0)
        rc = move_query(mv, mv->sh->stores[mv->from], mv->sh->names[mv->from],
                        "SELECT clock_timestamp()::text", NULL, now, sizeof now);
    if (rc == 0) {
        free(*since);
        *since = idem__strdup(now);
        if (!*since)
            rc = IDEM_ENOMEM;
    }
    return rc;
}

/*
 * The tables whose rows move with a bucket, on cluster i, parents first: the records, the keys
 * in flight, then those applications registered (idem_shard_table()), in the order they were.
 * Each row of *out is (table, principal column), both as SQL names.
 */
static int moved_tables(struct move *mv, size_t i, struct idem_rows **out)
{
    int rc;
    struct idem_tx *tx = NULL;

    rc = idem_tx_begin(mv->sh->stores[i], 0, &tx);
    if (rc < 0) {
        idem__fmt(mv->err, sizeof mv->err, "%s: %s", mv->sh->names[i], idem_strerror(rc));
        return rc;
    }
    rc = tx_run(tx, mv->sh->names[i],
                "SELECT name, principal_column FROM (SELECT 'idem_records', 'principal', -2"
                " UNION ALL SELECT 'idem_inflight', 'principal', -1"
                " UNION ALL SELECT name, principal_column, position FROM idem_shard_tables)"
                " t (name, principal_column, position) ORDER BY position",
                0, NULL, out, mv->err, sizeof mv->err);
    idem_tx_rollback(tx);
    return rc;
}

/*
 * Before a bucket is frozen: the new owner must hold every table the owner moves rows of, or the
 * copy would fail with the bucket frozen.  An application registers its tables on a cluster by
 * migrating it (orderd does as it opens one).
 */
static int check_tables(struct move *mv)
{
    int rc;
    struct idem_rows *from = NULL, *to = NULL;

    rc = moved_tables(mv, mv->from, &from);
    if (rc == 0)
        rc = moved_tables(mv, mv->to, &to);
    for (int r = 0; rc == 0 && r < idem_rows_count(from); r++) {
        int found = 0;

        for (int q = 0; q < idem_rows_count(to) && !found; q++)
            found = strcmp(idem_rows_get(from, r, 0), idem_rows_get(to, q, 0)) == 0 &&
                    strcmp(idem_rows_get(from, r, 1), idem_rows_get(to, q, 1)) == 0;
        if (!found) {
            idem__fmt(mv->err, sizeof mv->err,
                      "bucket %s: %s moves the rows of table %s (by %s), which %s has not "
                      "registered: migrate the application there first",
                      mv->bucket, mv->sh->names[mv->from], idem_rows_get(from, r, 0),
                      idem_rows_get(from, r, 1), mv->sh->names[mv->to]);
            rc = IDEM_ESTATE;
        }
    }
    idem_rows_free(from);
    idem_rows_free(to);
    return rc;
}

/* Rows of a copy page: at most this many go in one INSERT. */
#define COPY_PAGE 500

/* Inserts rows [from, to) of `rows` (each a row as JSON) into `table` in `tx`. */
static int copy_page(struct move *mv, struct idem_tx *tx, const char *table,
                     const struct idem_rows *rows, int from, int to)
{
    int rc;
    size_t len = 3, at = 0;
    char *json = NULL, sql[2 * IDEM_ERRMSG_MAX];
    const char *params[1];

    for (int r = from; r < to; r++)
        len += strlen(idem_rows_get(rows, r, 0)) + 1;
    json = malloc(len);
    if (!json)
        return IDEM_ENOMEM;
    json[at++] = '[';
    for (int r = from; r < to; r++) {
        size_t n = strlen(idem_rows_get(rows, r, 0));
        if (r > from)
            json[at++] = ',';
        memcpy(json + at, idem_rows_get(rows, r, 0), n);
        at += n;
    }
    json[at++] = ']';
    json[at] = '\0';
    params[0] = json;
    idem__fmt(sql, sizeof sql,
              "INSERT INTO %s SELECT * FROM json_populate_recordset(NULL::%s, CAST($1 AS json))",
              table, table);
    rc = tx_run(tx, mv->sh->names[mv->to], sql, 1, params, NULL, mv->err, sizeof mv->err);
    free(json);
    return rc;
}

/* Copies the bucket's rows of `table` (by `column`) read in `src` into `dst`; *rows how many. */
static int copy_table(struct move *mv, struct idem_tx *src, struct idem_tx *dst, const char *table,
                      const char *column, int64_t *count)
{
    int rc;
    char sql[2 * IDEM_ERRMSG_MAX];
    const char *params[1] = {mv->bucket};
    struct idem_rows *rows = NULL;

    idem__fmt(sql, sizeof sql,
              "SELECT row_to_json(t)::text FROM %s t WHERE idem_bucket_of(t.%s) = CAST($1 AS "
              "integer)",
              table, column);
    rc = tx_run(src, mv->sh->names[mv->from], sql, 1, params, &rows, mv->err, sizeof mv->err);
    for (int r = 0; rc == 0 && r < idem_rows_count(rows); r += COPY_PAGE)
        rc = copy_page(mv, dst, table, rows, r,
                       r + COPY_PAGE < idem_rows_count(rows) ? r + COPY_PAGE
                                                             : idem_rows_count(rows));
    *count = idem_rows_count(rows);
    idem_rows_free(rows);
    return rc;
}

/*
 * Deletes the bucket's rows of every table of `tables` (children first) in `tx`, which has the
 * mover's setting; with `unowned`, only while the cluster holds no fence row for the bucket.
 */
static int delete_bucket(struct move *mv, struct idem_tx *tx, size_t i,
                         const struct idem_rows *tables, int unowned)
{
    int rc = 0;
    char sql[2 * IDEM_ERRMSG_MAX];
    const char *params[1] = {mv->bucket};

    for (int r = idem_rows_count(tables) - 1; rc == 0 && r >= 0; r--) {
        idem__fmt(sql, sizeof sql,
                  "DELETE FROM %s WHERE idem_bucket_of(%s) = CAST($1 AS integer)%s",
                  idem_rows_get(tables, r, 0), idem_rows_get(tables, r, 1),
                  unowned ? " AND NOT EXISTS (SELECT 1 FROM idem_buckets"
                            " WHERE bucket = CAST($1 AS integer))"
                          : "");
        rc = tx_run(tx, mv->sh->names[i], sql, 1, params, NULL, mv->err, sizeof mv->err);
    }
    return rc;
}

/*
 * The copy: the bucket's rows of every moved table, read from the owner in one snapshot, written
 * at the new owner in one transaction that first removes whatever an earlier, cut-short move left
 * there.  The new owner holds no idem_buckets row for the bucket yet: the mover's setting lets
 * these writes past its fence, and nobody else's.  The bucket's rows are read whole (one scan of
 * each table, as the function of the principal has no index): the mover holds a table's rows in
 * memory at a time.  *copied is the number of records.
 */
static int copy_bucket(struct move *mv, int64_t *copied)
{
    int rc;
    int64_t count = 0;
    struct idem_tx *src = NULL, *dst = NULL;
    struct idem_rows *tables = NULL;
    const char *from = mv->sh->names[mv->from], *to = mv->sh->names[mv->to];

    rc = moved_tables(mv, mv->from, &tables);
    if (rc < 0)
        goto out;
    rc = idem_tx_begin(mv->sh->stores[mv->from], 0, &src);
    if (rc < 0) {
        idem__fmt(mv->err, sizeof mv->err, "%s: %s", from, idem_strerror(rc));
        goto out;
    }
    rc = idem_tx_begin(mv->sh->stores[mv->to], 1, &dst);
    if (rc < 0) {
        idem__fmt(mv->err, sizeof mv->err, "%s: %s", to, idem_strerror(rc));
        goto out;
    }
    rc = tx_run(dst, to, "SELECT set_config('idem.mover', 'on', true)", 0, NULL, NULL, mv->err,
                sizeof mv->err);
    if (rc == 0)
        rc = delete_bucket(mv, dst, mv->to, tables, 0);
    for (int r = 0; rc == 0 && r < idem_rows_count(tables); r++) {
        rc = copy_table(mv, src, dst, idem_rows_get(tables, r, 0), idem_rows_get(tables, r, 1),
                        &count);
        if (r == 0)
            *copied = count;
    }
    if (rc < 0)
        goto out;
    rc = idem_tx_commit(dst);
    dst = NULL;
    if (rc < 0)
        idem__fmt(mv->err, sizeof mv->err, "%s: commit: %s", to, idem_strerror(rc));
out:
    idem_rows_free(tables);
    idem_tx_rollback(dst);
    idem_tx_rollback(src);
    return rc;
}

/* Freeze, fence, drain, copy and flip: the steps that end with the directory naming mv->to. */
static int move_over(struct move *mv, int moving)
{
    int rc = 0;
    int64_t changed = 0, copied = 0;
    char epoch[24], next[24], since[64];
    char **sinces = NULL;
    const char *freeze[3] = {mv->bucket, mv->sh->names[mv->from], epoch};
    const char *flip[5] = {mv->bucket, mv->sh->names[mv->to], next, mv->sh->names[mv->from], epoch};

    idem__fmt(epoch, sizeof epoch, "%lld", (long long)mv->epoch);
    idem__fmt(next, sizeof next, "%lld", (long long)mv->epoch + 1);
    if (mv->from != mv->to)
        rc = check_tables(mv);
    if (rc == 0 && !moving) {
        rc = move_exec(mv, mv->sh->dir, "shard directory",
                       "UPDATE idem_shard_buckets SET moving = 1 WHERE bucket = CAST($1 AS "
                       "integer) AND cluster = $2 AND epoch = CAST($3 AS bigint) AND moving = 0",
                       3, freeze, &changed);
        if (rc == 0 && changed != 1) {
            idem__fmt(mv->err, sizeof mv->err, "bucket %s changed under the move", mv->bucket);
            rc = IDEM_ESTATE;
        }
    }
    if (rc == 0)
        rc = step_done(mv, IDEM_SHARD_MOVE_FROZEN, 0);
    if (rc < 0)
        return rc;

    /*
     * The owner, and the new owner too: one an earlier move cut short may hold a row.  No other
     * cluster can: a cluster gets the row only once the directory names it the owner.
     */
    sinces = calloc(mv->sh->n, sizeof(*sinces));
    if (!sinces)
        return IDEM_ENOMEM;
    for (size_t i = 0; rc == 0 && i < mv->sh->n; i++) {
        if (i != mv->from && i != mv->to)
            continue;
        rc = move_exec(mv, mv->sh->stores[i], mv->sh->names[i],
                       "DELETE FROM idem_buckets WHERE bucket = CAST($1 AS integer)", 1, freeze,
                       NULL);
        if (rc == 0)
            rc = move_query(mv, mv->sh->stores[i], mv->sh->names[i],
                            "SELECT clock_timestamp()::text", NULL, since, sizeof since);
        if (rc == 0) {
            sinces[i] = idem__strdup(since);
            if (!sinces[i])
                rc = IDEM_ENOMEM;
        }
    }
    if (rc == 0)
        rc = step_done(mv, IDEM_SHARD_MOVE_FENCED, 0);
    if (rc == 0)
        rc = wait_leases(mv, &sinces[mv->from]);
    for (size_t i = 0; rc == 0 && i < mv->sh->n; i++) {
        if (sinces[i])
            rc = drain(mv, i, sinces[i]);
    }
    if (rc == 0)
        rc = step_done(mv, IDEM_SHARD_MOVE_DRAINED, 0);
    if (rc == 0 && mv->from != mv->to)
        rc = copy_bucket(mv, &copied);
    if (rc == 0)
        rc = step_done(mv, IDEM_SHARD_MOVE_COPIED, copied);
    if (rc == 0) {
        rc = move_exec(mv, mv->sh->dir, "shard directory",
                       "UPDATE idem_shard_buckets SET cluster = $2, epoch = CAST($3 AS bigint),"
                       " moving = 0 WHERE bucket = CAST($1 AS integer) AND cluster = $4"
                       " AND epoch = CAST($5 AS bigint) AND moving = 1",
                       5, flip, &changed);
        if (rc == 0 && changed != 1) {
            idem__fmt(mv->err, sizeof mv->err, "bucket %s changed under the move", mv->bucket);
            rc = IDEM_ESTATE;
        }
        if (rc == 0) {
            mv->epoch++;
            rc = step_done(mv, IDEM_SHARD_MOVE_FLIPPED, 0);
        }
    }
    for (size_t i = 0; sinces && i < mv->sh->n; i++)
        free(sinces[i]);
    free(sinces);
    return rc;
}

/* Removes cluster i's copies of the bucket's rows, in a transaction of its own. */
static int clean_cluster(struct move *mv, size_t i)
{
    int rc;
    struct idem_tx *tx = NULL;
    struct idem_rows *tables = NULL;

    rc = moved_tables(mv, i, &tables);
    if (rc == 0) {
        rc = idem_tx_begin(mv->sh->stores[i], 1, &tx);
        if (rc < 0)
            idem__fmt(mv->err, sizeof mv->err, "%s: %s", mv->sh->names[i], idem_strerror(rc));
    }
    if (rc == 0)
        rc = tx_run(tx, mv->sh->names[i], "SELECT set_config('idem.mover', 'on', true)", 0, NULL,
                    NULL, mv->err, sizeof mv->err);
    if (rc == 0)
        rc = delete_bucket(mv, tx, i, tables, 1);
    if (rc == 0) {
        rc = idem_tx_commit(tx);
        tx = NULL;
        if (rc < 0)
            idem__fmt(mv->err, sizeof mv->err, "%s: commit: %s", mv->sh->names[i],
                      idem_strerror(rc));
    }
    idem_tx_rollback(tx);
    idem_rows_free(tables);
    return rc;
}

/*
 * The end of a move, which also finishes one cut short after its flip: the owner the directory
 * names gets its idem_buckets row (at the map's epoch), then every other cluster, which holds no
 * such row, loses its copies of the bucket's records.
 */
static int move_finish(struct move *mv)
{
    int rc;
    char epoch[24];
    const char *open[2] = {mv->bucket, epoch};

    idem__fmt(epoch, sizeof epoch, "%lld", (long long)mv->epoch);
    rc = move_exec(mv, mv->sh->stores[mv->to], mv->sh->names[mv->to],
                   "INSERT INTO idem_buckets (bucket, epoch) VALUES (CAST($1 AS integer),"
                   " CAST($2 AS bigint)) ON CONFLICT (bucket) DO UPDATE SET epoch = EXCLUDED.epoch",
                   2, open, NULL);
    if (rc == 0)
        rc = step_done(mv, IDEM_SHARD_MOVE_OPENED, 0);
    for (size_t i = 0; rc == 0 && i < mv->sh->n; i++) {
        if (i == mv->from && i != mv->to)
            rc = clean_cluster(mv, i);
        else if (i != mv->to && reach(mv, i) == 0)
            (void)clean_cluster(mv, i); /* a move cut short and re-aimed may have left a copy */
    }
    if (rc == 0)
        rc = step_done(mv, IDEM_SHARD_MOVE_CLEANED, 0);
    return rc;
}

int idem_shards_move(const char *directory_uri, unsigned bucket, const char *to,
                     const struct idem_shard_move_options *opts, char **errmsg)
{
    int rc = 0, moving;
    struct move mv = {.mo = opts, .t0 = clock_mono_ms()};

    if (errmsg)
        *errmsg = NULL;
    if (!directory_uri || !to || bucket >= IDEM_SHARD_BUCKETS)
        return set_err(errmsg, IDEM_EINVAL, "a bucket from 0 to 1023, a cluster, a directory");
    idem__fmt(mv.bucket, sizeof mv.bucket, "%u", bucket);
    rc = shards_open(directory_uri, opts ? opts->store : NULL, 1, &mv.sh, errmsg);
    if (rc < 0)
        goto out;
    mv.to = mv.sh->n;
    for (size_t i = 0; i < mv.sh->n; i++) {
        if (strcmp(mv.sh->names[i], to) == 0)
            mv.to = i;
    }
    if (mv.to == mv.sh->n) {
        idem__fmt(mv.err, sizeof mv.err, "the directory names no cluster '%s'", to);
        rc = IDEM_EINVAL;
        goto out;
    }
    /* The set read the map as it opened: where the bucket is, and whether a move has it. */
    moving = owner_of(mv.sh, bucket, &mv.from, &mv.epoch) == IDEM_EMOVED;
    rc = reach(&mv, mv.from);
    if (rc == 0)
        rc = reach(&mv, mv.to);
    if (rc == 0 && (moving || mv.from != mv.to))
        rc = move_over(&mv, moving);
    if (rc == 0)
        rc = move_finish(&mv);
out:
    if (rc < 0)
        set_err(errmsg, rc, mv.err);
    idem_shards_close(mv.sh);
    return rc;
}
