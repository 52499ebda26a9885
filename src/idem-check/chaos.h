/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos.h - what the parts of `idem-check chaos` share: a small random generator (rand() is
 * banned; this one is seeded from the OpenSSL CSPRNG), the fault-injecting TCP proxy
 * (fault_proxy.c), the state of one run, and the entry points of its parts: the command line and
 * the drive (chaos.c), the processes it starts and kills (chaos_procs.c), the exactly-once audit
 * (chaos_audit.c), what the audit reads, in pages (chaos_read.c), the database failovers and
 * bucket moves during the drive (chaos_schedule.c), and the verdict (chaos_report.c). docs/chaos.md
 * is the user's side of it.
 */
#ifndef IDEM_CHECK_CHAOS_H
#define IDEM_CHECK_CHAOS_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "check.h"

#define CK_MAX_INSTANCES 8
#define CK_EXIT_SETUP 3  /* the services could not be started (or reached, with --attach) */
#define CK_DIGEST_LEN 32 /* SHA-256 */
/* References per page of provider-sim's ledger (its maximum); orderd's pages hold at most 100. */
#define CK_PAGE_SIZE_MAX 1000
#define CK_ORDERS_PAGE_MAX 100
/* --users, and tokens given with --attach: one bucket of a shard set each, so a set wants many. */
#define CK_USERS_MAX 1000

/* ---- the proxy (fault_proxy.c) ---------------------------------------------------------------
 */

enum ck_balance { CK_BALANCE_RR, CK_BALANCE_RANDOM };

/* One server the proxy forwards to; its port may change (0: not listening yet). */
struct ck_upstream {
    uint32_t addr; /* IPv4, network byte order */
    atomic_int port;
    atomic_long connections; /* connections given to it */
    atomic_long down;        /* of those, the ones it did not accept (refused: killed, starting) */
};

struct ck_proxy {
    int listen_fd;
    int port; /* where clients connect (127.0.0.1) */
    struct ck_upstream up[CK_MAX_INSTANCES];
    int n_up;
    enum ck_balance balance;
    atomic_uint next_up; /* round robin */
    atomic_int stopping;
    atomic_int active; /* connection threads not finished yet */
    pthread_mutex_t rng_lock;
    struct ck_rng rng;                      /* under rng_lock */
    double drop_rate, reset_rate, cut_rate; /* under rng_lock */
    pthread_t thread;
    atomic_long connections, requests, resets, drops, cuts, upstream_down;
};

/*
 * Prepares `p` to forward to `n` upstreams (addr[i] in network byte order, port[i], 0 when not
 * known yet), listens on 127.0.0.1:0 and starts accepting.  0, or -1 with errno.
 */
int ck_proxy_start(struct ck_proxy *p, int n, const uint32_t *addr, const int *port,
                   enum ck_balance balance);
/* A listening TCP socket on 127.0.0.1, the port the kernel picked in *port; the fd
 * (close-on-exec), or -1 with errno. */
int ck_listen_loopback(int *port);
void ck_proxy_set_upstream_port(struct ck_proxy *p, int i, int port);
void ck_proxy_set_faults(struct ck_proxy *p, double drop_rate, double reset_rate, double cut_rate);
/* Stops accepting and waits (at most a few seconds) for the connections in flight to end. */
void ck_proxy_stop(struct ck_proxy *p);

/* ---- one run ---------------------------------------------------------------------------------
 */

struct chaos_opts {
    const char *orderd_bin, *provider_bin, *db;
    const char *catalogue; /* --catalogue: given to every orderd and `orderd token create` */
    const char
        *shard_directory; /* --shard-directory: the shard set's map, for per-cluster figures */
    const char *orderd_urls, *provider_url; /* --attach */
    const char *tokens[CK_USERS_MAX];       /* --attach: each --token, in order */
    long n_tokens;
    const char *tokens_file; /* --attach: --tokens FILE, one token a line */
    long users;              /* --users: users (and tokens) made with `orderd token create` */
    long intents, clients, max_time_s, kill_every_s, instances, webhook_dup, grace_s;
    long page_size; /* --audit-page-size: ledger references (and orders, up to 100) per page */
    long failover_every_s;    /* --failover-every: 0 off */
    long min_failovers;       /* --min-failovers: the drive outlasts --max-time until as many ran */
    const char *failover_cmd; /* --failover-cmd, run as `/bin/sh -c 'CMD "$1"' sh KIND` */
    long move_every_s;        /* --move-every: 0 off */
    long min_moves;           /* --min-moves */
    const char *move_cmd;     /* --move-cmd, run as `/bin/sh -c 'CMD "$1"' sh N` */
    double drop_rate, reset_rate, cut_rate, dup_rate, lost_rate, fail_rate;
    int attach, json, no_webhooks, balance;
    int instances_set, webhook_dup_set, lost_set, fail_set; /* given on the command line */
    /* --haproxy-config, --haproxy-bin */
    const char *haproxy_config, *haproxy_bin;
};

/* What one sender saw at the end: the status, and of a 2xx body only what the audit compares
 * (its length and SHA-256), so that 100,000 intents do not keep 100,000 order documents. */
struct ck_seen {
    int status; /* final status this sender saw, 0 if none */
    size_t len;
    unsigned char digest[CK_DIGEST_LEN];
};

struct ck_intent {
    char *key;
    int user; /* index into chaos.users: whose token sends it */
    int started, dup;
    struct ck_seen a, b; /* the sender, and the duplicate sender */
    struct ck_seen r;    /* the audit's replay */
    char order_id[64];   /* from the replay's body */
};

/* One order of the run's user as the audit keeps it: its id and status from orderd, and what the
 * ledger holds for it (filled by ck_read_refs). */
struct ck_order {
    char id[64];
    int pending, paid, failed;
    int user;             /* whose list it is in (index into chaos.users) */
    int before;           /* listed before the run */
    int matched;          /* intents naming it */
    long charges, emails; /* successful charges, order_confirmation emails */
};

/* One orderd: started (and killed) by the run, or attached to. */
struct ck_instance {
    char url[96]; /* http://HOST:PORT, for the audit's direct requests */
    uint32_t addr;
    int port;
    pid_t pid; /* under chaos.lock; -1 while down, or when attached */
    int gen;   /* processes started for this slot (names the stdout files) */
    atomic_long kills;
};

/* What the provider's ledger and the user's orders said (before the run, and after it). */
struct ck_ledger {
    long charges, emails, dups, failed5xx, lost_responses;
    long events, delivered, pending, abandoned;
    int webhooks_configured;
};

/*
 * orderd's orderd_webhook_inbox_events gauge (one scrape): the inbox rows by type
 * (charge.succeeded, refund.succeeded, other) and result (applied, ignored, other).  Read from
 * orderd's store, so it survives kills and is the same on every instance of one store.
 */
#define CK_INBOX_TYPES 3
#define CK_INBOX_RESULTS 3
struct ck_inbox {
    int ok; /* the gauge was on the page */
    long n[CK_INBOX_TYPES][CK_INBOX_RESULTS];
};

struct ck_audit {
    long started, finished_2xx, finished_in_audit, seen_2xx;
    long orders, paid, pending, preexisting;
    long paid_delta; /* paid orders of the user now, minus before the run */
    long dup_orders, dup_mismatch, lost, not_durable, unsettled;
    struct ck_ledger now;   /* the ledger after the grace */
    struct ck_ledger delta; /* now - before */
    long charges, emails;   /* of this run's orders, from the ledger's per-reference counts */
    long ledger_dups, extra_charges, extra_emails, missing_charges, missing_emails, charged_unpaid;
    long hook_copies, hooks_expected, hooks_problems;
    long hook_results[4]; /* orderd_webhooks_total: applied, ignored, duplicate, rejected */
    int hook_results_ok;
    /* The direct webhook audit: the inbox gauge's growth over the run (after - before). */
    int inbox_direct;    /* read before and after the run; else only the indirect checks ran */
    char inbox_why[160]; /* why not, when !inbox_direct */
    long inbox_entries, inbox_charge_events, inbox_applied, inbox_ignored, inbox_undecided;
    long inbox_charge_applied;
    long inbox_problems;
    int ledger_ok, refs_ok, list_ok;
    char note[512];
    /* A read the audit needed and could not make (the last one, after the grace): which request,
     * what came back, how large.  The verdict then fails as incomplete, counting nothing. */
    char problem[512];
};

struct ck_chaos_verdict {
    long duplicates, lost, unsettled, webhooks;
};

/*
 * HAProxy between the fault proxy and the instances (--haproxy-config, chaos_haproxy.c): its
 * process, where it listens, and what its stats said after the drive (`show stat` on its admin
 * socket): retries and redispatches in all, and per instance the sessions it was given, the
 * connections to it that failed and how often its health check took it out.
 */
struct ck_haproxy {
    char bin[PATH_MAX];  /* --haproxy-bin, found in PATH */
    char sock[108];      /* its admin socket, in the work directory (IDEM_LB_STATS) */
    pid_t pid;           /* -1 when not running */
    int port;            /* 127.0.0.1:port, a socket idem-check made (IDEM_LB_BIND=fd@N) */
    int stats_ok;        /* the numbers below were read */
    char stats_why[200]; /* why not, when !stats_ok */
    long retries, redispatches, conn_errors, resp_errors, answered_5xx;
    long sessions[CK_MAX_INSTANCES], failed[CK_MAX_INSTANCES], downs[CK_MAX_INSTANCES];
};

/*
 * One user of the run: its bearer token and what the audit found of it.  The intents go to the
 * users in turn (intent k to user k mod N), so each has its share.
 */
struct ck_user {
    char name[64]; /* the name `orderd token create --user` was given; "" when attached */
    char token[256];
    char auth[300];       /* "Authorization: Bearer <token>" */
    long intents, orders; /* intents started for it, new orders listed for it */
    long problems;        /* its intents lost, its orders duplicated */
    /* --shard-directory: orderd's id of the user (its principal), its bucket and the cluster
     * that owned the bucket at the start (an index into the map's clusters) */
    char principal[80];
    unsigned bucket;
    int cluster;
};

/* The disruptions run on a schedule during the drive (chaos_schedule.c). */
enum ck_disruption { CK_FAILOVER, CK_MOVE, CK_DISRUPTIONS };

struct chaos {
    struct chaos_opts o;
    char workdir[PATH_MAX];
    char db[PATH_MAX + 64];
    char provider_url[128], proxy_url[96], hook_proxy_url[160];
    struct ck_user *users; /* n_users of them, --users or the tokens given */
    int n_users;
    char **envp;  /* the children's environment: ours plus the webhook secret */
    int webhooks; /* provider-sim delivers webhooks during the run (and the audit checks them) */
    struct ck_instance inst[CK_MAX_INSTANCES];
    int n_inst;
    pid_t provider_pid;
    pthread_mutex_t lock;
    struct ck_proxy proxy, hook_proxy;
    int proxy_on, hook_proxy_on;
    struct ck_intent *in;
    atomic_long next, done, alive, retries, kills, dup_sends, restart_failures;
    atomic_int stop_drive, stop_kill, killer_idle, killer_release;
    long long deadline_ms;
    /* before the run: the user's orders (sorted ids), the ledger, the provider's faults */
    char (*before_ids)[64];
    size_t n_before;
    long paid_before;
    struct ck_ledger ledger_before;
    int ledger_before_ok;
    /* orderd's inbox before the run, and how far it may be off the ledger read with it: events
     * made while it was read (may be in it already), deliveries pending then (may add to it) */
    struct ck_inbox inbox_before;
    char inbox_before_why[160];
    long inbox_slack_low, inbox_slack_high;
    double saved_fail, saved_lost;
    long saved_dup;
    int saved_ok;
    /* what the audit read (chaos_read.c), for the report */
    long order_pages, ledger_pages;
    size_t largest_answer; /* bytes */
    long long audit_ms;    /* how long the audit took, replay and grace included */
    /* the audit's progress line (chaos.c), on a terminal only */
    int tty, progress_shown;
    long long progress_ms;
    /* the drive's progress off a terminal: when the last line was printed, and the first */
    long long progress_line_ms, progress_started_ms;
    /* --failover-every, --move-every (chaos_schedule.c), NULL when off */
    struct ck_schedule *sched[CK_DISRUPTIONS];
    struct ck_haproxy lb;     /* --haproxy-config (chaos_haproxy.c) */
    struct ck_shards *shards; /* --shard-directory (chaos_shards.c), NULL when off */
};

/* chaos_procs.c: a NULL-terminated array of malloc'd strings (an environment), freed. */
void ck_free_env(char **env);

/*
 * fork + execve of argv with stdin from /dev/null and stdout/stderr to the files, dying with the
 * thread that forked it (PR_SET_PDEATHSIG); with pass_fd >= 0 that descriptor is the child's
 * as_fd.  The pid, or -1.
 */
pid_t ck_spawn(char **envp, char *const argv[], const char *out_path, const char *err_path,
               int pass_fd, int as_fd);

/* chaos_procs.c: the children.  Each returns 0, or -1 (see the logs in the work directory). */
int ck_start_provider(struct chaos *cx);
/* `orderd token create` for each of cx->users (names made here, tokens read back). */
int ck_create_tokens(struct chaos *cx);
/* Starts instance `i` on its port (0 the first time: the kernel picks, and it is kept). */
int ck_start_orderd(struct chaos *cx, int i);
/* kill -9 of instance `i` and a restart on the same port and store. */
int ck_kill_restart(struct chaos *cx, int i);
void ck_stop_children(struct chaos *cx);

/* chaos_report.c: the audit's progress line on stderr, when it is a terminal, at most 5 times a
 * second; ck_audit_progress_end() ends it with a last line. */
void ck_audit_progress(struct chaos *cx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void ck_audit_progress_end(struct chaos *cx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* chaos_read.c: what the audit reads, each answer a bounded page */
/*
 * GET `url` (bearer `token`, may be NULL) for a JSON object, tried up to 3 times while no answer
 * comes or a 5xx does.  Returns the object (new), or NULL with the problem in `why`: the request,
 * and what came back (no answer and why, a status with the answer's size and start, an answer
 * over idem-check's body limit with its size, or one that is not a JSON object).
 */
json_t *ck_get_json(struct chaos *cx, const char *url, const char *token, char *why, size_t cap);
/*
 * Every order of the run's users (orderd's pages of each, from the first instance), sorted by
 * id, each with its user, those listed before the run marked.  Returns the array (new, free()) and
 * *n, or NULL with `why`.
 */
struct ck_order *ck_list_orders(struct chaos *cx, size_t *n, char *why, size_t cap);
/* GET /v1/ledger?keys=0 (its totals) into `l`; 0, or -1 with `why`. */
int ck_read_ledger(struct chaos *cx, struct ck_ledger *l, char *why, size_t cap);
/*
 * Reads provider-sim's per-reference counts page by page (GET /v1/ledger/references) into the
 * orders they name, found in `rows` (`n`, sorted by id): successful charges into .charges, and
 * order_confirmation emails into .emails.  0, or -1 with `why`.
 */
int ck_read_refs(struct chaos *cx, struct ck_order *rows, size_t n, char *why, size_t cap);
/* The order with id `id` in `rows` (sorted by id), or NULL. */
struct ck_order *ck_find_order(struct ck_order *rows, size_t n, const char *id);

/* chaos_audit.c */
/*
 * One POST of the intent `key` to `base` with libidem-client; fills `s`, and with `order_id`
 * (may be NULL) the orderId of a 2xx answer (cap bytes, "" if none).
 */
struct idem_client;
void ck_send_intent(struct idem_client *c, const char *base, const char *auth, const char *key,
                    struct ck_seen *s, char *order_id, size_t cap);
/* A drive client's attempts are counted (retries, failovers, clusters) for the user it names:
 * the sender sets `user` before each intent. */
struct ck_sender {
    struct chaos *cx;
    int user;
};
/* A client of libidem-client; with `sender` its attempts are counted (the drive's clients). */
struct idem_client *ck_open_client(struct chaos *cx, struct ck_sender *sender, int64_t max_time_ms);
/* Reads what is there before the run: the user's orders, the ledger, the provider's faults. */
int ck_audit_before(struct chaos *cx, char *why, size_t cap);
/* POST /v1/faults with the given members (negative: leave it as it is).  0 or -1. */
int ck_provider_faults(struct chaos *cx, double fail_rate, double lost_rate, long webhook_dup);
void ck_audit(struct chaos *cx, struct ck_audit *au);
void ck_verdict_of(const struct chaos *cx, const struct ck_audit *au, struct ck_chaos_verdict *v);

/*
 * chaos_schedule.c: --failover-every and --move-every.  A thread per kind runs its command every S
 * seconds of the drive (a failover: switchover, kill, switchover, ...; a move: 1, 2, 3, ...), and
 * the drive's clients report every attempt, from which the unavailability each one caused is
 * measured.  ck_schedule_start() makes cx->sched[d] (0, or -1 when the thread could not start);
 * ck_schedule_stop() starts no further command and waits for those running (bounded);
 * ck_schedule_problem() says whether a command failed (1, with the sentence in `why`);
 * ck_schedule_running(cx, d) is 1 while a command of kind d (any, d < 0) runs, and past
 * --max-time while fewer than --min-failovers (--min-moves) have run (the drive goes on for them).
 */
int ck_schedule_start(struct chaos *cx, enum ck_disruption d);
void ck_schedule_stop(struct chaos *cx);
void ck_schedule_free(struct chaos *cx);
/* One attempt of a drive client: its status (0 without an answer) and whether the answer said it
 * was a replay (libidem-client's `replayed`). */
void ck_schedule_attempt(struct chaos *cx, int status, int replayed);
int ck_schedule_running(struct chaos *cx, int d);
int ck_schedule_problem(struct chaos *cx, char *why, size_t cap);
void ck_schedule_print_table(struct chaos *cx);
/* {"every","command","count","list":[...]}, {"every":0,"count":0,"list":[]} when off (new). */
json_t *ck_schedule_json(struct chaos *cx, enum ck_disruption d);

/*
 * chaos_haproxy.c: --haproxy-config.  ck_haproxy_find_bin() finds --haproxy-bin in PATH (0, or -1
 * with the reason in `why`).  ck_haproxy_start() starts HAProxy on the started instances (their
 * addresses and its listening socket in its environment), waits until it forwards a request, and
 * points the fault proxy at it; 0, or -1 with the reason on stderr.  ck_haproxy_read_stats()
 * fills cx->lb's counters.  ck_instance_counts() is what the verdict shows per instance: the
 * fault proxy's connections and refusals, or with HAProxy its sessions and failed connections.
 */
int ck_haproxy_find_bin(struct chaos *cx, char *why, size_t cap);
int ck_haproxy_start(struct chaos *cx);
void ck_haproxy_read_stats(struct chaos *cx);
void ck_instance_counts(const struct chaos *cx, int i, long *connections, long *refused);
void ck_haproxy_print_table(const struct chaos *cx);
json_t *ck_haproxy_json(const struct chaos *cx);

/*
 * chaos_shards.c: --shard-directory.  ck_shards_read_map() reads the directory's map into
 * cx->shards (0, or -1 with `why`); ck_shards_place_users() gives each user its bucket and
 * cluster, reading the principals of the users chaos made from orderd's users table (attached,
 * they were given); ck_shards_attempt() counts one attempt of a drive client for its user's
 * cluster, until ck_shards_stop() at the end of the drive.
 */
int ck_shards_read_map(struct chaos *cx, char *why, size_t cap);
int ck_shards_place_users(struct chaos *cx, char *why, size_t cap);
void ck_shards_attempt(struct chaos *cx, int user, int status, int replayed);
void ck_shards_stop(struct chaos *cx);
void ck_shards_free(struct chaos *cx);
void ck_shards_print_table(const struct chaos *cx);
/* {"clusters":[{"name","users","intents","answered2xx","failedAttempts",
 * "longestWithout2xxSeconds","recovered"}...]} (new). */
json_t *ck_shards_json(const struct chaos *cx);

/* chaos_report.c */
void ck_print_table(struct chaos *cx, const struct ck_audit *au, const struct ck_chaos_verdict *v,
                    double secs, int rc);
void ck_print_json(struct chaos *cx, const struct ck_audit *au, const struct ck_chaos_verdict *v,
                   double secs, int rc);

/* chaos.c */
/* A run with nothing set, for main.c to fill from the command line (new). */
struct chaos *ck_chaos_new(void);
/* Frees a run that is not going to be started. */
void ck_chaos_free(struct chaos *cx);
/* Runs the chaos check `cx` describes, prints the verdict, frees `cx`; returns the exit code. */
int ck_chaos_run(struct chaos *cx);

#endif /* IDEM_CHECK_CHAOS_H */
