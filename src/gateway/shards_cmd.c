/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shards_cmd.c - `idem-gateway shards init|add|show|move`: what an operator runs to set a shard
 * set's directory up, to add a cluster to it, to see its map, and to move a bucket while the
 * instances run.  The work is libidem's (idem_shards_init, idem_shards_add, idem_shards_move,
 * idem_shard_map_read), so orderd or a tool of its own can do the same; this file is the command
 * line and what it prints.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

#include "options.h"
#include "shards_cmd.h"
#include "banned.h"

#define EXIT_USAGE 2
#define MAX_CLUSTERS IDEM_SHARDS_MAX

static const char usage_shards[] =
    "Usage: idem-gateway shards init --directory URI --cluster NAME=URI [--cluster ...]\n"
    "       idem-gateway shards add --directory URI NAME CLUSTER_URI\n"
    "       idem-gateway shards show --directory URI [--buckets]\n"
    "       idem-gateway shards move --directory URI BUCKETS --to NAME [--drain-timeout MS]\n"
    "\n"
    "A shard set (docs/shards.md): the directory, a PostgreSQL database (the URI of\n"
    "'store: shards:URI', with or without 'shards:'), maps each of 1024 buckets to a cluster.\n"
    "init names the clusters and spreads the buckets evenly over them in the order given, then\n"
    "gives each cluster its fence; run again, it finishes a set-up cut short, and it refuses a\n"
    "directory that holds another map.\n"
    "add names a new cluster in the directory, owning no bucket yet: it makes the cluster's\n"
    "records schema and fence first (the cluster must be reachable from here).  Move buckets to\n"
    "it with move; running instances open it when they next read the map, without a restart.\n"
    "show prints each cluster with its number of buckets, and the buckets being moved (a move\n"
    "cut short: run it again); --buckets lists every bucket, its cluster and epoch.\n"
    "move moves each bucket of BUCKETS (a number, a range 8-15, or a list of them: 1,8-15) to\n"
    "cluster NAME while the instances run, one after the other: a bucket's principals get 503\n"
    "with Retry-After while it moves.  It carries the bucket's records and its rows of the\n"
    "tables an application registered (idem_shard_table()), and reaches only the bucket's owner\n"
    "and NAME.  Each step is printed with the milliseconds since the start.  A bucket on NAME\n"
    "already is passed by.  A move cut short (killed) is finished by running it again; a move\n"
    "to the bucket's owner ends one cut short before its flip.  Exit status 1 when a move\n"
    "fails: the buckets before it have moved, the rest have not; run the same command again.\n"
    "\n"
    "Options:\n";

struct shards_args {
    const char *directory;
    struct idem_shard_cluster clusters[MAX_CLUSTERS];
    char *copies[MAX_CLUSTERS];
    size_t nclusters;
    const char *to;
    int buckets, drain_ms;
};

static int cluster_option(struct options *o, const struct option_row *row, const char *arg)
{
    struct shards_args *a = row->value;
    const char *eq = strchr(arg, '=');
    char *copy;

    if (!eq || eq == arg || !eq[1])
        return options_error(o, "--cluster is NAME=URI");
    if (a->nclusters == MAX_CLUSTERS)
        return options_error(o, "at most %d --cluster", MAX_CLUSTERS);
    copy = strdup(arg);
    if (!copy)
        return options_error(o, "out of memory");
    copy[eq - arg] = '\0';
    a->copies[a->nclusters] = copy;
    a->clusters[a->nclusters].name = copy;
    a->clusters[a->nclusters].uri = copy + (eq - arg) + 1;
    a->nclusters++;
    return OPTIONS_CONTINUE;
}

/* The directory's URI without the gateway config's "shards:" in front. */
static const char *directory_uri(const char *uri)
{
    return strncmp(uri, "shards:", 7) == 0 ? uri + 7 : uri;
}

static int shards_show(const struct shards_args *a)
{
    int rc, status = 1;
    struct idem_store *dir = NULL;
    struct idem_shard_map *map = NULL;
    size_t count[MAX_CLUSTERS + 1] = {0}, nmoving = 0, n;
    char *err = NULL;

    rc = idem_store_open(directory_uri(a->directory), NULL, &dir, &err);
    if (rc == 0)
        rc = idem_shard_map_read(dir, &map, &err);
    if (rc < 0) {
        fprintf(stderr, "idem-gateway shards: %s\n", err ? err : idem_strerror(rc));
        goto out;
    }
    n = idem_shard_map_clusters(map);
    for (unsigned b = 0; b < IDEM_SHARD_BUCKETS; b++) {
        size_t c = 0;
        nmoving += idem_shard_map_owner(map, b, &c, NULL) == IDEM_EMOVED;
        count[c < MAX_CLUSTERS ? c : MAX_CLUSTERS]++;
    }
    printf("%-16s %7s  %s\n", "cluster", "buckets", "uri");
    for (size_t i = 0; i < n; i++)
        printf("%-16s %7zu  %s\n", idem_shard_map_name(map, i), i < MAX_CLUSTERS ? count[i] : 0,
               idem_shard_map_uri(map, i));
    printf("moving: %zu\n", nmoving);
    for (unsigned b = 0; b < IDEM_SHARD_BUCKETS; b++) {
        size_t c = 0;
        int64_t epoch = 0;
        int moving = idem_shard_map_owner(map, b, &c, &epoch) == IDEM_EMOVED;

        if (moving)
            printf("  bucket %u: moving from %s (epoch %lld): run 'shards move' again to finish"
                   "\n",
                   b, idem_shard_map_name(map, c), (long long)epoch);
        if (a->buckets)
            printf("bucket %u %s %lld%s\n", b, idem_shard_map_name(map, c), (long long)epoch,
                   moving ? " moving" : "");
    }
    status = 0;
out:
    idem_free(err);
    idem_shard_map_free(map);
    idem_store_close(dir);
    return status;
}

static int shards_init(const struct shards_args *a)
{
    char *err = NULL;
    int rc = idem_shards_init(directory_uri(a->directory), a->clusters, a->nclusters, NULL, &err);

    if (rc < 0) {
        fprintf(stderr, "idem-gateway shards: %s\n", err ? err : idem_strerror(rc));
        idem_free(err);
        return 1;
    }
    printf("shards: %zu clusters, %d buckets\n", a->nclusters, IDEM_SHARD_BUCKETS);
    return 0;
}

static int shards_add(const struct shards_args *a, const char *name, const char *uri)
{
    char *err = NULL;
    int rc = idem_shards_add(directory_uri(a->directory), name, uri, NULL, &err);

    if (rc < 0) {
        fprintf(stderr, "idem-gateway shards: %s\n", err ? err : idem_strerror(rc));
        idem_free(err);
        return 1;
    }
    printf("shards: cluster %s added, no bucket yet (move buckets to it with 'shards move')\n",
           name);
    return 0;
}

static const char *const step_text[] = {
    [IDEM_SHARD_MOVE_FROZEN] = "frozen",   [IDEM_SHARD_MOVE_FENCED] = "fenced",
    [IDEM_SHARD_MOVE_DRAINED] = "drained", [IDEM_SHARD_MOVE_COPIED] = "copied",
    [IDEM_SHARD_MOVE_FLIPPED] = "flipped", [IDEM_SHARD_MOVE_OPENED] = "opened",
    [IDEM_SHARD_MOVE_CLEANED] = "cleaned",
};

/* What a move has done so far, for its last line. */
struct move_seen {
    unsigned bucket;
    int64_t frozen_ms, flipped_ms, records;
};

static int move_step(enum idem_shard_move_step step, int64_t elapsed_ms, int64_t records, void *arg)
{
    struct move_seen *seen = arg;

    if (step == IDEM_SHARD_MOVE_FROZEN)
        seen->frozen_ms = elapsed_ms;
    if (step == IDEM_SHARD_MOVE_FLIPPED)
        seen->flipped_ms = elapsed_ms;
    if (step == IDEM_SHARD_MOVE_COPIED) {
        seen->records = records;
        printf("bucket %u: %s %lld records (%lld ms)\n", seen->bucket, step_text[step],
               (long long)records, (long long)elapsed_ms);
    } else {
        printf("bucket %u: %s (%lld ms)\n", seen->bucket, step_text[step], (long long)elapsed_ms);
    }
    fflush(stdout); /* a watcher (or a test) sees each step as it ends */
    return 0;
}

/*
 * BUCKETS: numbers and ranges (8-15) separated by commas, each from 0 to 1023, into want[];
 * returns how many, or -1 when `arg` is not that.
 */
static int buckets_parse(const char *arg, unsigned char want[IDEM_SHARD_BUCKETS])
{
    const char *p = arg;
    int n = 0;

    memset(want, 0, IDEM_SHARD_BUCKETS);
    for (;;) {
        char *end = NULL;
        long lo, hi;

        if (*p < '0' || *p > '9')
            return -1;
        lo = hi = strtol(p, &end, 10);
        if (*end == '-') {
            p = end + 1;
            if (*p < '0' || *p > '9')
                return -1;
            hi = strtol(p, &end, 10);
        }
        if (lo < 0 || hi >= IDEM_SHARD_BUCKETS || lo > hi)
            return -1;
        for (long b = lo; b <= hi; b++) {
            n += !want[b];
            want[b] = 1;
        }
        if (*end == '\0')
            return n;
        if (*end != ',')
            return -1;
        p = end + 1;
    }
}

/* One bucket's move, its steps printed; 0, or 1 with the reason on stderr. */
static int move_one(const struct shards_args *a, unsigned bucket)
{
    char *err = NULL;
    struct move_seen seen = {.bucket = bucket, .frozen_ms = -1, .flipped_ms = -1};
    struct idem_shard_move_options mo = {
        .drain_timeout_ms = a->drain_ms, .on_step = move_step, .arg = &seen};
    int rc;

    rc = idem_shards_move(directory_uri(a->directory), bucket, a->to, &mo, &err);
    if (rc < 0) {
        fprintf(stderr, "idem-gateway shards: %s\n", err ? err : idem_strerror(rc));
        idem_free(err);
        return 1;
    }
    if (seen.flipped_ms >= 0)
        printf("bucket %u: on %s, frozen %lld ms, %lld records\n", bucket, a->to,
               (long long)(seen.flipped_ms - (seen.frozen_ms > 0 ? seen.frozen_ms : 0)),
               (long long)seen.records);
    else
        printf("bucket %u: on %s\n", bucket, a->to);
    return 0;
}

static int shards_move(const struct shards_args *a, const char *buckets_arg, struct options *o)
{
    unsigned char want[IDEM_SHARD_BUCKETS];
    int n = buckets_parse(buckets_arg, want), done = 0;

    if (n < 0)
        return options_error(o,
                             "BUCKETS is a bucket from 0 to %d, a range of them (8-15), or a "
                             "list (1,8-15)",
                             IDEM_SHARD_BUCKETS - 1);
    if (!a->to)
        return options_error(o, "--to NAME is required");
    for (unsigned b = 0; b < IDEM_SHARD_BUCKETS; b++) {
        if (!want[b])
            continue;
        if (move_one(a, b) != 0) {
            if (n > 1)
                fprintf(stderr,
                        "idem-gateway shards: %d of %d buckets moved before bucket %u; run the "
                        "same command again to finish\n",
                        done, n, b);
            return 1;
        }
        done++;
    }
    if (n > 1)
        printf("shards: %d buckets on %s\n", n, a->to);
    return 0;
}

int cmd_shards(int argc, char **argv)
{
    struct shards_args a = {0};
    const struct option_row rows[] = {
        OPT_STRING(0, "directory", &a.directory, "URI",
                   "the directory's PostgreSQL URI (shards:URI as in the config)"),
        OPT_CALLBACK(0, "cluster", &a, "NAME=URI", "init: a cluster, its store URI (repeatable)",
                     cluster_option),
        OPT_FLAG(0, "buckets", &a.buckets, "show: every bucket, its cluster and epoch"),
        OPT_STRING(0, "to", &a.to, "NAME", "move: the cluster the bucket goes to"),
        OPT_INT(0, "drain-timeout", &a.drain_ms, "MS", 1, 3600000,
                "move: how long to wait for keys in flight and for the\n"
                "transactions older than the fence (default 30000)"),
        OPT_HELP("show this help"),
        OPT_END(),
    };
    struct options o = {
        .prog = "idem-gateway shards", .usage = usage_shards, .rows = rows, .column = 24};
    int status, sub;

    if (argc < 2) {
        fputs(usage_shards, stderr);
        return EXIT_USAGE;
    }
    sub = strcmp(argv[1], "init") == 0   ? 1
          : strcmp(argv[1], "show") == 0 ? 2
          : strcmp(argv[1], "move") == 0 ? 3
          : strcmp(argv[1], "add") == 0  ? 4
                                         : 0;
    if (sub == 0 && argv[1][0] != '-')
        return options_error(&o, "the subcommand is 'init', 'add', 'show' or 'move'");
    status = sub ? options_parse(&o, argc - 1, argv + 1) : options_parse(&o, argc, argv);
    if (status >= 0)
        goto out;
    if (sub == 0) {
        status = options_error(&o, "the subcommand is 'init', 'add', 'show' or 'move'");
        goto out;
    }
    if (!a.directory) {
        status = options_error(&o, "--directory URI is required");
        goto out;
    }
    if (sub != 3 && sub != 4 && o.next < argc - 1) {
        status = options_error(&o, "unexpected argument '%s'", argv[1 + o.next]);
        goto out;
    }
    if (sub == 1 && a.nclusters == 0)
        status = options_error(&o, "init needs a --cluster NAME=URI for each cluster");
    else if (sub == 1)
        status = shards_init(&a);
    else if (sub == 2)
        status = shards_show(&a);
    else if (sub == 4 && o.next != argc - 3)
        status = options_error(&o, "add takes NAME and CLUSTER_URI");
    else if (sub == 4)
        status = shards_add(&a, argv[1 + o.next], argv[2 + o.next]);
    else if (o.next != argc - 2)
        status = options_error(&o, "move takes BUCKETS, one argument (1,8-15)");
    else
        status = shards_move(&a, argv[1 + o.next], &o);
out:
    for (size_t i = 0; i < a.nclusters; i++)
        free(a.copies[i]);
    return status;
}
