/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_shards.c - `idem-check chaos --shard-directory URI`: the run's errors per cluster of a
 * shard set (docs/shards.md).  At the start the directory's map is read (libidem's
 * idem_shard_map_read(), the read every instance of the set makes), and each user's bucket is
 * computed from its principal with idem_shard_bucket(), so each user belongs to the cluster that
 * owns its bucket then.  During the drive every client attempt is counted for its user's cluster:
 * the attempts that failed (no answer, or a 5xx) and, as chaos_schedule.c measures a failover, the
 * longest stretch from a failed attempt after a 2xx to the next 2xx, seen by that cluster's users
 * only.  So "one shard down, the other shards' users saw no error" is a figure of the verdict.
 *
 * orderd's principal is its user id ("usr_" and 32 hex digits), not the name `token create` was
 * given, and no API of orderd shows it: for the users it made, chaos reads the ids from orderd's
 * users table (in the catalogue on a shard set, else in --db); attached, --tokens FILE gives each
 * token's principal after it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <idem/idem.h>

#include "chaos.h"
#include "banned.h"

struct ck_cluster {
    char name[IDEM_SHARD_NAME_MAX + 1];
    long users;
    long ok, failed;      /* the drive's attempts: 2xx (not replayed), no answer or 5xx */
    long long fail_since; /* the first failed attempt since the last 2xx, 0: none */
    long long out_ms;     /* the longest stretch without a 2xx */
    int open;             /* that stretch had not ended when the drive did */
};

struct ck_shards {
    struct idem_shard_map *map;
    struct ck_cluster *c; /* one per cluster of the map, in its order */
    size_t n;
    pthread_mutex_t lock;
    int stopped; /* under lock: the drive is over, nothing more is counted */
};

/* The store at `uri` (new), or NULL with the reason in `why`. */
static struct idem_store *open_store(const char *what, const char *uri, char *why, size_t cap)
{
    struct idem_store_options so;
    struct idem_store *st = NULL;
    char *err = NULL;

    memset(&so, 0, sizeof(so));
    so.pool_size = 1;
    so.busy_timeout_ms = 5000;
    if (idem_store_open(uri, &so, &st, &err) < 0) {
        snprintf(why, cap, "cannot open %s: %s", what, err ? err : "unknown error");
        idem_free(err);
        return NULL;
    }
    return st;
}

int ck_shards_read_map(struct chaos *cx, char *why, size_t cap)
{
    struct ck_shards *sh = xmalloc(sizeof(*sh));
    struct idem_store *dir = NULL;
    char *err = NULL;
    size_t i;
    int rc = -1;

    memset(sh, 0, sizeof(*sh));
    pthread_mutex_init(&sh->lock, NULL);
    cx->shards = sh;
    dir = open_store("the shard directory", cx->o.shard_directory, why, cap);
    if (!dir)
        goto out;
    if (idem_shard_map_read(dir, &sh->map, &err) < 0) {
        snprintf(why, cap, "cannot read the shard directory's map: %s",
                 err ? err : "unknown error");
        goto out;
    }
    sh->n = idem_shard_map_clusters(sh->map);
    sh->c = xmalloc((sh->n ? sh->n : 1) * sizeof(*sh->c));
    memset(sh->c, 0, (sh->n ? sh->n : 1) * sizeof(*sh->c));
    for (i = 0; i < sh->n; i++)
        snprintf(sh->c[i].name, sizeof(sh->c[i].name), "%s", idem_shard_map_name(sh->map, i));
    rc = 0;
out:
    idem_free(err);
    idem_store_close(dir);
    return rc;
}

/* orderd's id of every user chaos made, from its users table: into users[].principal. */
static int read_principals(struct chaos *cx, char *why, size_t cap)
{
    const char *uri = cx->o.catalogue ? cx->o.catalogue : cx->db;
    struct idem_store *st = open_store("orderd's users table", uri, why, cap);
    struct idem_tx *tx = NULL;
    int i, rc = -1;

    if (!st)
        return -1;
    if (idem_tx_begin(st, 0, &tx) < 0) {
        snprintf(why, cap, "cannot read orderd's users table: no transaction");
        goto out;
    }
    for (i = 0; i < cx->n_users; i++) {
        struct idem_rows *rows = NULL;
        const char *params[1] = {cx->users[i].name};
        const char *id;
        if (idem_tx_exec(tx, "SELECT id FROM users WHERE name = $1", 1, params, &rows) < 0) {
            snprintf(why, cap, "cannot read orderd's users table: %s", idem_tx_errmsg(tx));
            goto out;
        }
        id = idem_rows_count(rows) == 1 ? idem_rows_get(rows, 0, 0) : NULL;
        if (id)
            snprintf(cx->users[i].principal, sizeof(cx->users[i].principal), "%s", id);
        idem_rows_free(rows);
        if (!id) {
            snprintf(why, cap, "orderd's users table has no user '%s'", cx->users[i].name);
            goto out;
        }
    }
    rc = 0;
out:
    idem_tx_rollback(tx);
    idem_store_close(st);
    return rc;
}

int ck_shards_place_users(struct chaos *cx, char *why, size_t cap)
{
    struct ck_shards *sh = cx->shards;
    int i;

    if (!cx->o.attach && read_principals(cx, why, cap) < 0)
        return -1;
    for (i = 0; i < cx->n_users; i++) {
        struct ck_user *u = &cx->users[i];
        size_t owner = 0;
        u->bucket = idem_shard_bucket(u->principal, strlen(u->principal));
        /* A bucket moving now still belongs to the cluster it is moving from. */
        if (idem_shard_map_owner(sh->map, u->bucket, &owner, NULL) == IDEM_EINVAL ||
            owner >= sh->n) {
            snprintf(why, cap, "the shard map has no owner for bucket %u", u->bucket);
            return -1;
        }
        u->cluster = (int)owner;
        sh->c[owner].users++;
    }
    return 0;
}

void ck_shards_attempt(struct chaos *cx, int user, int status, int replayed)
{
    struct ck_shards *sh = cx->shards;
    int ok = status >= 200 && status < 300 && !replayed, failed = status == 0 || status >= 500;
    struct ck_cluster *c;
    long long now;

    if (!sh || user < 0 || user >= cx->n_users || (!ok && !failed))
        return;
    c = &sh->c[cx->users[user].cluster];
    pthread_mutex_lock(&sh->lock);
    now = clock_mono_ms();
    if (sh->stopped) {
        pthread_mutex_unlock(&sh->lock);
        return;
    }
    if (ok) {
        c->ok++;
        if (c->fail_since && now - c->fail_since > c->out_ms) {
            c->out_ms = now - c->fail_since;
            c->open = 0;
        }
        c->fail_since = 0;
    } else {
        c->failed++;
        if (!c->fail_since)
            c->fail_since = now;
    }
    pthread_mutex_unlock(&sh->lock);
}

void ck_shards_stop(struct chaos *cx)
{
    struct ck_shards *sh = cx->shards;
    long long now = clock_mono_ms();
    size_t i;

    if (!sh)
        return;
    pthread_mutex_lock(&sh->lock);
    /* A stretch no 2xx ended before the drive did: "at least" its length. */
    for (i = 0; i < sh->n; i++)
        if (sh->c[i].fail_since && now - sh->c[i].fail_since > sh->c[i].out_ms) {
            sh->c[i].out_ms = now - sh->c[i].fail_since;
            sh->c[i].open = 1;
        }
    sh->stopped = 1;
    pthread_mutex_unlock(&sh->lock);
}

void ck_shards_free(struct chaos *cx)
{
    struct ck_shards *sh = cx->shards;

    if (!sh)
        return;
    idem_shard_map_free(sh->map);
    pthread_mutex_destroy(&sh->lock);
    free(sh->c);
    free(sh);
    cx->shards = NULL;
}

/* The intents started for the users of cluster `i` (the audit counted them per user). */
static long cluster_intents(const struct chaos *cx, size_t i)
{
    long n = 0;
    int u;

    for (u = 0; u < cx->n_users; u++)
        if ((size_t)cx->users[u].cluster == i)
            n += cx->users[u].intents;
    return n;
}

void ck_shards_print_table(const struct chaos *cx)
{
    const struct ck_shards *sh = cx->shards;
    size_t i;

    if (!sh)
        return;
    printf("%-34s %zu clusters in the directory's map, %d users placed by bucket\n",
           "shard clusters", sh->n, cx->n_users);
    for (i = 0; i < sh->n; i++) {
        const struct ck_cluster *c = &sh->c[i];
        char label[80];
        snprintf(label, sizeof(label), "  cluster %s", c->name);
        printf("%-34s %ld users, %ld intents, %ld attempts failed, %ld answered 2xx, longest "
               "without a 2xx %.1f s%s\n",
               label, c->users, cluster_intents(cx, i), c->failed, c->ok,
               (double)c->out_ms / 1000.0, c->open ? " (at least: none came before the end)" : "");
    }
}

json_t *ck_shards_json(const struct chaos *cx)
{
    const struct ck_shards *sh = cx->shards;
    json_t *list = json_array();
    size_t i;

    for (i = 0; sh && i < sh->n; i++) {
        const struct ck_cluster *c = &sh->c[i];
        json_array_append_new(list, json_pack("{s:s, s:I, s:I, s:I, s:I, s:f, s:b}", "name",
                                              c->name, "users", (json_int_t)c->users, "intents",
                                              (json_int_t)cluster_intents(cx, i), "answered2xx",
                                              (json_int_t)c->ok, "failedAttempts",
                                              (json_int_t)c->failed, "longestWithout2xxSeconds",
                                              (double)c->out_ms / 1000.0, "recovered", !c->open));
    }
    return json_pack("{s:o}", "clusters", list);
}
