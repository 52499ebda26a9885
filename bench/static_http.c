/*
 * static_http.c - the HTTP ceiling of issue 7's replay target: a libmicrohttpd server in exactly
 * orderd's threading mode (src/common/http_server.c: one thread per connection, an internal polling
 * thread with poll(), 256 KiB stacks, 1024 connections, 60 s idle timeout) that reads the
 * request, body included, and answers a fixed small JSON with no work in between.  A replay
 * cannot be faster than this on the same machine with the same server library, so replays are
 * reported as a share of it.
 *
 *   static_http [--listen 127.0.0.1:0] [--conn-memory BYTES]
 *
 * --conn-memory sets libmicrohttpd's per-connection memory pool
 * (MHD_OPTION_CONNECTION_MEMORY_LIMIT, default 32 KiB as in orderd): the RSS profile of
 * docs/bench.md runs it both ways to show what the pools weigh with a thousand connections.
 *
 * Prints "static_http: listening on http://127.0.0.1:PORT" on stdout once it listens; SIGINT or
 * SIGTERM stops it.  IPv4 loopback addresses only: it is a benchmark fixture, not a server.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "banned.h"

/* The same limits as orderd's http.c, so the two servers differ only in the work they do. */
#define CONNECTION_LIMIT 1024
#define THREAD_STACK_SIZE ((size_t)256 * 1024)
#define CONNECTION_TIMEOUT_S 60

/* About the size of a stored order response (orderd's 201 body is ~230 bytes). */
static const char body[] =
    "{\"orderId\":\"ord_00000000000000000000000000000000\",\"status\":\"created\","
    "\"productId\":\"p-1024\",\"quantity\":1,\"unitPrice\":1999,\"amount\":1999,"
    "\"currency\":\"EUR\",\"createdAt\":\"2026-12-02T13:00:00.000Z\"}";

/* A marker for "the headers were seen": MHD calls again for the body and once more at its end. */
static int seen_headers;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct MHD_Response *resp = cls;

    (void)url;
    (void)method;
    (void)version;
    (void)upload_data;
    if (*req_cls == NULL) {
        *req_cls = &seen_headers;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        *upload_data_size = 0; /* read and dropped: only the bytes on the wire matter here */
        return MHD_YES;
    }
    return MHD_queue_response(conn, MHD_HTTP_CREATED, resp);
}

static int parse_listen(const char *text, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(text, ':');
    char *end = NULL;
    long port;
    size_t hlen;

    if (colon == NULL)
        return -1;
    hlen = (size_t)(colon - text);
    if (hlen == 0 || hlen >= sizeof host)
        return -1;
    memcpy(host, text, hlen);
    host[hlen] = '\0';
    port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || port < 0 || port > 65535)
        return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((unsigned short)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *listen = "127.0.0.1:0";
    struct MHD_Daemon *daemon = NULL;
    struct MHD_Response *resp = NULL;
    const union MHD_DaemonInfo *info;
    struct sockaddr_in sa;
    char host[INET_ADDRSTRLEN];
    size_t conn_memory = 32 * 1024; /* libmicrohttpd's default, which orderd keeps */
    char *end = NULL;
    unsigned int flags;
    sigset_t set;
    int i;
    int sig = 0;
    int rc = 1;

    for (i = 1; i < argc; i += 2) {
        if (i + 1 < argc && strcmp(argv[i], "--listen") == 0) {
            listen = argv[i + 1];
        } else if (i + 1 < argc && strcmp(argv[i], "--conn-memory") == 0) {
            conn_memory = strtoul(argv[i + 1], &end, 10);
            if (*end != '\0' || conn_memory < 1024 || conn_memory > ((size_t)16 << 20)) {
                fprintf(stderr, "static_http: --conn-memory must be 1024..16777216\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: static_http [--listen 127.0.0.1:PORT] [--conn-memory BYTES]\n");
            return 2;
        }
    }
    if (parse_listen(listen, &sa) != 0) {
        fprintf(stderr, "static_http: bad listen address '%s' (IPv4 HOST:PORT)\n", listen);
        return 2;
    }
    /* Signals are taken by sigwait() below, never by a connection thread. */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    resp = MHD_create_response_from_buffer(sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    if (resp == NULL ||
        MHD_add_response_header(resp, "Content-Type", "application/json") != MHD_YES)
        goto out;
    flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
            MHD_USE_ITC;
    if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES)
        flags |= MHD_USE_POLL;
    daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, resp, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)CONNECTION_LIMIT, MHD_OPTION_THREAD_STACK_SIZE,
        THREAD_STACK_SIZE, MHD_OPTION_CONNECTION_MEMORY_LIMIT, conn_memory,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT_S, MHD_OPTION_END);
    if (daemon == NULL) {
        fprintf(stderr, "static_http: cannot listen on %s\n", listen);
        goto out;
    }
    info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    if (info == NULL || info->port == 0) {
        fprintf(stderr, "static_http: cannot learn the bound port\n");
        goto out;
    }
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof host);
    printf("static_http: listening on http://%s:%u\n", host, (unsigned)info->port);
    fflush(stdout);
    sigwait(&set, &sig);
    rc = 0;
out:
    if (daemon != NULL)
        MHD_stop_daemon(daemon);
    if (resp != NULL)
        MHD_destroy_response(resp);
    return rc;
}
