/* SPDX-License-Identifier: Apache-2.0 */
/*
 * limits.c - struct http_limits (http_server.h): the defaults the figures of docs/http-server.md
 * give, `serve --help`'s lines for them, and the flags that set them.  Apart from the server, as
 * a program's config reader uses them too (idem-gateway's `limits:`).
 */
#include "loop_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"
#include "banned.h"

void http_limits_resolve(struct http_limits *l)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (l->max_connections <= 0)
        l->max_connections = HTTP_DEFAULT_MAX_CONNECTIONS;
    if (l->max_connections_per_ip == 0)
        l->max_connections_per_ip = HTTP_DEFAULT_MAX_CONNECTIONS_PER_IP;
    if (l->head_timeout_ms <= 0)
        l->head_timeout_ms = HTTP_DEFAULT_HEAD_TIMEOUT_MS;
    if (l->body_timeout_ms <= 0)
        l->body_timeout_ms = HTTP_DEFAULT_BODY_TIMEOUT_MS;
    if (l->idle_timeout_ms <= 0)
        l->idle_timeout_ms = HTTP_DEFAULT_IDLE_TIMEOUT_MS;
    if (l->write_timeout_ms <= 0)
        l->write_timeout_ms = HTTP_DEFAULT_WRITE_TIMEOUT_MS;
    if (l->max_header_bytes <= 0)
        l->max_header_bytes = HTTP_DEFAULT_MAX_HEADER_BYTES;
    if (l->loops <= 0)
        l->loops = cpus < 1 ? 1 : cpus > LOOPS_MAX ? LOOPS_MAX : (int)cpus;
    if (l->workers <= 0)
        l->workers = HTTP_DEFAULT_WORKERS;
    if (l->queue <= 0)
        l->queue = HTTP_DEFAULT_QUEUE;
    if (l->stream_min_rate == 0)
        l->stream_min_rate = HTTP_DEFAULT_STREAM_MIN_RATE;
    if (l->streams_per_ip == 0)
        l->streams_per_ip = HTTP_DEFAULT_STREAMS_PER_IP;
    if (l->max_streams == 0)
        l->max_streams = HTTP_DEFAULT_MAX_STREAMS;
}

const char http_limits_help[] =
    "HTTP limits (per server; a client over them gets a problem+json, then the connection "
    "closes):\n"
    "  --max-connections N      open connections in all (default 10000)\n"
    "  --max-connections-per-ip N   open connections from one client address, -1 for no cap\n"
    "                           (default 256)\n"
    "  --head-timeout-ms N      first byte of a request to the end of its headers, and a new\n"
    "                           connection's wait for its first byte (default 10000)\n"
    "  --body-timeout-ms N      end of the headers to the end of the body (default 30000)\n"
    "  --idle-timeout-ms N      a keep-alive connection with no request (default 60000)\n"
    "  --write-timeout-ms N     a response the client does not read (default 30000)\n"
    "  --max-header-bytes N     request line + headers, over it 431 (default 8192)\n"
    "  --http-threads N         event-loop threads (default: the number of CPUs, at most 8)\n"
    "  --http-workers N         threads that run handlers which may block (default 64)\n"
    "  --http-queue N           requests waiting for a worker before 503 (default 4096)\n"
    "  --stream-min-rate N      bytes/s a client must take a streamed answer at once the server\n"
    "                           has waited 10 s for it, or it is cut; -1 for none (default 16384)\n"
    "  --streams-per-ip N       streamed answers one client address may read at once, 503\n"
    "                           beyond; -1 for no cap (default 4)\n"
    "  --max-streams N          streamed answers all clients may read at once, 503 beyond; -1\n"
    "                           for no cap (default 1024)\n";

int http_limits_flag(struct http_limits *l, const char *name, const char *value, char *err,
                     size_t errlen)
{
#define HTTP_LIMIT_ROW(n, field, lo, hi) {n, offsetof(struct http_limits, field), lo, hi},
    static const struct {
        const char *name;
        size_t offset;
        int64_t min, max;
    } flags[] = {HTTP_LIMITS_FLAGS(HTTP_LIMIT_ROW)};
#undef HTTP_LIMIT_ROW
    size_t i;
    int64_t v = 0;

    if (strncmp(name, "--", 2) == 0)
        name += 2;
    for (i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (strcmp(name, flags[i].name) != 0)
            continue;
        if (value == NULL || parse_int64(value, flags[i].min, flags[i].max, &v) != 0 ||
            (v == 0 && flags[i].min < 0)) {
            snprintf(err, errlen, "--%s must be an integer from %lld to %lld%s, not '%s'",
                     flags[i].name, (long long)flags[i].min, (long long)flags[i].max,
                     flags[i].min < 0 ? " other than 0" : "", value ? value : "");
            return -1;
        }
        *(int *)(void *)((char *)l + flags[i].offset) = (int)v;
        return 1;
    }
    return 0;
}
