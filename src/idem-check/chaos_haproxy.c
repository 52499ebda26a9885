/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chaos_haproxy.c - `idem-check chaos --haproxy-config FILE`: a real load balancer between the
 * fault proxy and the orderd instances, so that the chain is clients -> fault proxy (drops,
 * resets, cuts) -> HAProxy (retry-on, redispatch: it re-sends POSTs that may have run) -> orderd
 * x N (kill -9).  HAProxy runs in the foreground (`haproxy -db -f FILE`) as a plain child that dies
 * with the thread that forked it, like the others (chaos_procs.c).  Its configuration is the
 * user's (docs/ops/haproxy.cfg is the shipped one) and learns everything from its environment:
 * IDEM_ORDERD_1..8 the instances' addresses (beyond --instances they repeat them), IDEM_LB_BIND
 * a listening socket idem-check made and passes as fd@3 (no port to race for), IDEM_LB_STATS its
 * admin socket in the work directory, IDEM_LB_LOG=stdout, IDEM_LB_KEEP_USER (no chroot, no
 * switch of user: that would also clear the parent-death signal).  After the drive the admin
 * socket's `show stat` says how often HAProxy re-sent a request (wretr) and to another instance
 * (wredis).  Webhooks do not go through it: provider-sim keeps its own fault proxy straight to
 * the instances (docs/chaos.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "chaos.h"
#include "banned.h"

#define LB_FD 3 /* the listening socket, in HAProxy: IDEM_LB_BIND=fd@3 */
#define LB_START_TIMEOUT_MS 15000
#define LB_STATS_MAX (1024 * 1024)
#define LB_STATS_TIMEOUT_S 3

/* Where --haproxy-bin is looked for after PATH: Debian puts haproxy in /usr/sbin, which the PATH
 * of a user who is not root does not name. */
static const char *const sbin_dirs = "/usr/local/sbin:/usr/sbin:/sbin";

/* `name` in the ':'-separated `dirs` into cx->lb.bin; 0, or -1. */
static int find_in(struct chaos *cx, const char *dirs, const char *name)
{
    const char *p = dirs;

    for (;;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (len > 0 &&
            snprintf(cx->lb.bin, sizeof(cx->lb.bin), "%.*s/%s", (int)len, p, name) <
                (int)sizeof(cx->lb.bin) &&
            access(cx->lb.bin, X_OK) == 0)
            return 0;
        if (!colon)
            break;
        p = colon + 1;
    }
    cx->lb.bin[0] = '\0';
    return -1;
}

int ck_haproxy_find_bin(struct chaos *cx, char *why, size_t cap)
{
    const char *name = cx->o.haproxy_bin ? cx->o.haproxy_bin : "haproxy";
    const char *path = getenv("PATH");

    if (strchr(name, '/')) {
        if (access(name, X_OK) != 0 || strlen(name) >= sizeof(cx->lb.bin)) {
            snprintf(why, cap, "--haproxy-bin '%s' is not an executable", name);
            return -1;
        }
        snprintf(cx->lb.bin, sizeof(cx->lb.bin), "%s", name);
        return 0;
    }
    if ((path && find_in(cx, path, name) == 0) || find_in(cx, sbin_dirs, name) == 0)
        return 0;
    snprintf(why, cap,
             "--haproxy-config needs HAProxy: '%s' is neither in PATH nor in %s (install the "
             "haproxy package, scripts/deps.sh does; or give --haproxy-bin PATH)",
             name, sbin_dirs);
    return -1;
}

/* "NAME=value" from a format, new. */
static char *env_var(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *env_var(const char *fmt, ...)
{
    char buf[PATH_MAX + 64];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return xstrdup(buf);
}

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/*
 * HAProxy's environment: the children's, without the webhook secrets (none of its business) and
 * without any IDEM_LB_* or IDEM_ORDERD_* of ours, plus the ones its configuration reads.
 * IDEM_ORDERD_k for k beyond the instances names instance ((k-1) mod N)+1, so that a
 * configuration with three servers also runs against one instance.
 */
static char **lb_env(const struct chaos *cx)
{
    size_t n = 0, k = 0, i;
    char **env;

    while (cx->envp && cx->envp[n])
        n++;
    env = xmalloc((n + CK_MAX_INSTANCES + 5) * sizeof(*env));
    for (i = 0; i < n; i++)
        if (!has_prefix(cx->envp[i], "IDEM_LB_") && !has_prefix(cx->envp[i], "IDEM_ORDERD_") &&
            !has_prefix(cx->envp[i], "ORDERD_WEBHOOK_SECRET=") &&
            !has_prefix(cx->envp[i], "PROVIDER_SIM_WEBHOOK_SECRET="))
            env[k++] = xstrdup(cx->envp[i]);
    for (i = 0; i < CK_MAX_INSTANCES; i++) {
        const struct ck_instance *in = &cx->inst[i % (size_t)cx->n_inst];
        char host[INET_ADDRSTRLEN];
        struct in_addr a;
        a.s_addr = in->addr;
        if (!inet_ntop(AF_INET, &a, host, sizeof(host)))
            snprintf(host, sizeof(host), "127.0.0.1");
        env[k++] = env_var("IDEM_ORDERD_%zu=%s:%d", i + 1, host, in->port);
    }
    env[k++] = env_var("IDEM_LB_BIND=fd@%d", LB_FD);
    env[k++] = env_var("IDEM_LB_STATS=%s", cx->lb.sock);
    env[k++] = xstrdup("IDEM_LB_LOG=stdout");
    env[k++] = xstrdup("IDEM_LB_KEEP_USER=1");
    env[k] = NULL;
    return env;
}

/* haproxy -db -f CONFIG, its output in the work directory, the listening socket `lfd` as LB_FD;
 * the pid, or -1. */
static pid_t spawn_lb(const struct chaos *cx, char **envp, int lfd)
{
    char out_path[PATH_MAX + 32], err_path[PATH_MAX + 32];
    char *argv[] = {(char *)cx->lb.bin, (char *)"-db", (char *)"-f", (char *)cx->o.haproxy_config,
                    NULL};

    snprintf(out_path, sizeof(out_path), "%s/haproxy.stdout", cx->workdir);
    snprintf(err_path, sizeof(err_path), "%s/haproxy.stderr", cx->workdir);
    return ck_spawn(envp, argv, out_path, err_path, lfd, LB_FD);
}

/* Until GET /healthz through HAProxy answers 200 (it runs, and forwards to an instance); 0, or -1
 * with why. */
static int wait_forwarding(struct chaos *cx, char *why, size_t cap)
{
    long long end = clock_mono_ms() + LB_START_TIMEOUT_MS;
    char url[64], last[300] = "no attempt";
    struct ck_request rq;

    snprintf(url, sizeof(url), "http://127.0.0.1:%d/healthz", cx->lb.port);
    memset(&rq, 0, sizeof(rq));
    rq.method = "GET";
    rq.url = url;
    for (;;) {
        struct ck_response rs;
        long status;
        int ws;

        ck_http_perform(&rq, &rs, 1, 2000);
        status = rs.status;
        if (status)
            ck_response_describe(&rs, last, sizeof(last));
        else
            snprintf(last, sizeof(last), "%.200s", rs.error);
        ck_response_release(&rs);
        if (status == 200)
            return 0;
        if (waitpid(cx->lb.pid, &ws, WNOHANG) == cx->lb.pid) {
            cx->lb.pid = -1;
            snprintf(why, cap, "haproxy exited (%s %d): see %.300s/haproxy.stderr",
                     WIFEXITED(ws) ? "status" : "signal",
                     WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws), cx->workdir);
            return -1;
        }
        if (clock_mono_ms() >= end) {
            snprintf(why, cap, "GET %s through haproxy did not answer 200 in %d s (last: %s)", url,
                     LB_START_TIMEOUT_MS / 1000, last);
            return -1;
        }
        clock_sleep_ms(100);
    }
}

int ck_haproxy_start(struct chaos *cx)
{
    char why[512];
    char **env;
    int lfd;

    if (snprintf(cx->lb.sock, sizeof(cx->lb.sock), "%s/haproxy.sock", cx->workdir) >=
        (int)sizeof(cx->lb.sock)) {
        fprintf(stderr,
                "idem-check chaos: the work directory %s is too long for HAProxy's admin "
                "socket (a shorter TMPDIR)\n",
                cx->workdir);
        return -1;
    }
    lfd = ck_listen_loopback(&cx->lb.port);
    if (lfd < 0) {
        fprintf(stderr, "idem-check chaos: cannot listen for haproxy: %s\n", strerror(errno));
        return -1;
    }
    env = lb_env(cx);
    cx->lb.pid = spawn_lb(cx, env, lfd);
    close(lfd); /* HAProxy has its copy; if it dies, clients are refused, not left waiting */
    ck_free_env(env);
    if (cx->lb.pid < 0) {
        fprintf(stderr, "idem-check chaos: cannot start haproxy: %s\n", strerror(errno));
        return -1;
    }
    if (wait_forwarding(cx, why, sizeof(why)) < 0) {
        fprintf(stderr, "idem-check chaos: haproxy (%s -db -f %s) did not start: %s\n", cx->lb.bin,
                cx->o.haproxy_config, why);
        return -1;
    }
    ck_proxy_set_upstream_port(&cx->proxy, 0, cx->lb.port);
    return 0;
}

/* ---- its stats ------------------------------------------------------------------------------ */

/* One command on the admin socket, its whole answer into `out` (HAProxy closes after it). */
static int lb_command(const char *sock, const char *cmd, struct ck_buf *out, char *why, size_t cap)
{
    struct sockaddr_un a;
    struct timeval tv = {LB_STATS_TIMEOUT_S, 0};
    char buf[8192];
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    size_t len = strlen(cmd), sent = 0;

    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
        connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        snprintf(why, cap, "cannot reach haproxy's admin socket %s: %s", sock, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    while (sent < len) {
        ssize_t w = send(fd, cmd + sent, len - sent, MSG_NOSIGNAL);
        if (w <= 0) {
            snprintf(why, cap, "`%.20s` to %s: %s", cmd, sock, strerror(errno));
            close(fd);
            return -1;
        }
        sent += (size_t)w;
    }
    out->limit = LB_STATS_MAX;
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r == 0)
            break;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            snprintf(why, cap, "reading `%.20s` from %s: %s", cmd, sock, strerror(errno));
            close(fd);
            return -1;
        }
        ck_buf_add(out, buf, (size_t)r);
    }
    close(fd);
    if (out->dropped) {
        snprintf(why, cap, "`%.20s` answered more than %d bytes", cmd, LB_STATS_MAX);
        return -1;
    }
    return 0;
}

#define LB_FIELDS 128

/* The fields of one CSV line (changed in place: "" quoting undone, NULs between fields); their
 * number. */
static int csv_split(char *line, char **f, int max)
{
    int n = 0;
    char *p = line;

    while (n < max) {
        char *w = p;
        int more;
        f[n++] = p;
        if (*p == '"') {
            for (p++; *p; p++) {
                if (*p == '"' && p[1] != '"') {
                    p++;
                    break;
                }
                if (*p == '"')
                    p++;
                *w++ = *p;
            }
            while (*p && *p != ',')
                p++;
        } else {
            while (*p && *p != ',')
                p++;
            w = p;
        }
        more = *p == ',';
        *w = '\0';
        if (!more)
            break;
        p++;
    }
    return n;
}

/* The columns of `show stat` the verdict uses. */
enum { C_TYPE, C_STOT, C_ECON, C_ERESP, C_WRETR, C_WREDIS, C_CHKDOWN, C_5XX, C_ADDR, C_N };
static const char *const col_names[C_N] = {"type",   "stot",    "econ",     "eresp", "wretr",
                                           "wredis", "chkdown", "hrsp_5xx", "addr"};

static long col_num(char **f, int n, int col)
{
    return col >= 0 && col < n ? strtol(f[col], NULL, 10) : 0;
}

void ck_haproxy_read_stats(struct chaos *cx)
{
    struct ck_haproxy *lb = &cx->lb;
    struct ck_buf out;
    char *line, *next, *f[LB_FIELDS];
    int col[C_N], n, c, i, header = 0;

    if (lb->pid <= 0)
        return;
    memset(&out, 0, sizeof(out));
    lb->stats_ok = 0;
    if (lb_command(lb->sock, "show stat\n", &out, lb->stats_why, sizeof(lb->stats_why)) < 0) {
        ck_buf_release(&out);
        return;
    }
    for (c = 0; c < C_N; c++)
        col[c] = -1;
    lb->retries = lb->redispatches = lb->conn_errors = lb->resp_errors = lb->answered_5xx = 0;
    memset(lb->sessions, 0, sizeof(lb->sessions));
    memset(lb->failed, 0, sizeof(lb->failed));
    memset(lb->downs, 0, sizeof(lb->downs));
    for (line = out.sb.buf; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (strncmp(line, "# ", 2) == 0) {
            n = csv_split(line + 2, f, LB_FIELDS);
            for (c = 0; c < C_N; c++)
                for (i = 0; i < n; i++)
                    if (strcmp(f[i], col_names[c]) == 0)
                        col[c] = i;
            header = 1;
            continue;
        }
        if (!header || !*line)
            continue;
        n = csv_split(line, f, LB_FIELDS);
        switch (col_num(f, n, col[C_TYPE])) {
        case 0: /* a frontend: what the clients got */
            lb->answered_5xx += col_num(f, n, col[C_5XX]);
            break;
        case 1: /* a backend: its retries and redispatches */
            lb->retries += col_num(f, n, col[C_WRETR]);
            lb->redispatches += col_num(f, n, col[C_WREDIS]);
            lb->conn_errors += col_num(f, n, col[C_ECON]);
            lb->resp_errors += col_num(f, n, col[C_ERESP]);
            break;
        case 2: /* a server: one of the instances, by its address */
            for (i = 0; i < cx->n_inst && col[C_ADDR] >= 0 && col[C_ADDR] < n; i++) {
                char addr[64];
                snprintf(addr, sizeof(addr), "127.0.0.1:%d", cx->inst[i].port);
                if (strcmp(f[col[C_ADDR]], addr) == 0) {
                    lb->sessions[i] += col_num(f, n, col[C_STOT]);
                    lb->failed[i] += col_num(f, n, col[C_ECON]);
                    lb->downs[i] += col_num(f, n, col[C_CHKDOWN]);
                }
            }
            break;
        default:
            break;
        }
    }
    ck_buf_release(&out);
    for (c = 0; c < C_N; c++)
        if (col[c] < 0) {
            snprintf(lb->stats_why, sizeof(lb->stats_why), "`show stat` on %s has no column %s",
                     lb->sock, col_names[c]);
            return;
        }
    lb->stats_ok = 1;
}

/* ---- the verdict's part --------------------------------------------------------------------- */

void ck_instance_counts(const struct chaos *cx, int i, long *connections, long *refused)
{
    if (cx->o.haproxy_config) {
        *connections = cx->lb.sessions[i];
        *refused = cx->lb.failed[i];
    } else {
        *connections = atomic_load(&cx->proxy.up[i].connections);
        *refused = atomic_load(&cx->proxy.up[i].down);
    }
}

void ck_haproxy_print_table(const struct chaos *cx)
{
    const struct ck_haproxy *lb = &cx->lb;
    int i;

    if (!cx->o.haproxy_config)
        return;
    printf("%-34s http://127.0.0.1:%d (%s), between the proxy and the instances\n", "haproxy",
           lb->port, cx->o.haproxy_config);
    if (!lb->stats_ok) {
        printf("%-34s not read (%s)\n", "haproxy stats", lb->stats_why);
        return;
    }
    printf("%-34s %ld retries, %ld redispatches to another instance; %ld connections and %ld "
           "answers failed; %ld 5xx to clients\n",
           "haproxy re-sent (retry-on)", lb->retries, lb->redispatches, lb->conn_errors,
           lb->resp_errors, lb->answered_5xx);
    printf("%-34s", "haproxy health checks took out");
    for (i = 0; i < cx->n_inst; i++)
        printf("%s orderd %d %ld time%s", i ? "," : "", i + 1, lb->downs[i],
               lb->downs[i] == 1 ? "" : "s");
    putchar('\n');
}

json_t *ck_haproxy_json(const struct chaos *cx)
{
    const struct ck_haproxy *lb = &cx->lb;
    json_t *inst, *doc;
    char addr[64];
    int i;

    if (!cx->o.haproxy_config)
        return json_pack("{s:b}", "enabled", 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", lb->port);
    doc = json_pack("{s:b, s:s, s:s, s:b}", "enabled", 1, "config", cx->o.haproxy_config, "address",
                    addr, "stats", lb->stats_ok);
    if (!doc)
        return NULL;
    if (!lb->stats_ok) {
        json_object_set_new(doc, "statsProblem", json_string(lb->stats_why));
        return doc;
    }
    inst = json_array();
    for (i = 0; i < cx->n_inst; i++)
        json_array_append_new(inst,
                              json_pack("{s:I, s:I, s:I}", "sessions", (json_int_t)lb->sessions[i],
                                        "failedConnections", (json_int_t)lb->failed[i],
                                        "checkDowns", (json_int_t)lb->downs[i]));
    json_object_set_new(doc, "retries", json_integer(lb->retries));
    json_object_set_new(doc, "redispatches", json_integer(lb->redispatches));
    json_object_set_new(doc, "connectionErrors", json_integer(lb->conn_errors));
    json_object_set_new(doc, "responseErrors", json_integer(lb->resp_errors));
    json_object_set_new(doc, "answered5xx", json_integer(lb->answered_5xx));
    json_object_set_new(doc, "instances", inst);
    return doc;
}
