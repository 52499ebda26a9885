/*
 * http_server.h - the programs' face to libmicrohttpd: the listening server, and the request as
 * handlers see it.  Handlers never call MHD themselves; they read the request through these
 * accessors and fill a struct response (response.h), which http_server.c turns into MHD's
 * response.  orderd and provider-sim differ only in the options they start it with.
 */
#ifndef IDEM_COMMON_HTTP_SERVER_H
#define IDEM_COMMON_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "response.h"

struct MHD_Connection;

/* Request bodies above this many bytes are refused with 413 (docs/http-api.md). */
#define HTTP_BODY_MAX ((size_t)1 << 20)

struct request {
    struct MHD_Connection *conn;
    const char *method;
    const char *path; /* without the query string, percent-decoded by MHD */
    const char *body; /* NUL-terminated copy; NULL when empty */
    size_t body_len;
    int has_body;     /* bytes were announced or sent */
    int body_too_big; /* over HTTP_BODY_MAX: the body was not kept */
};

/* The first value of header `name` (case-insensitive), or NULL; borrowed for the request. */
const char *request_header(const struct request *rq, const char *name);

/*
 * How many times header `name` was sent.  *first / *first_len (may be NULL) receive the first
 * value, borrowed for the request.
 */
int request_header_count(const struct request *rq, const char *name, const char **first,
                         size_t *first_len);

/* The value of query argument `name`, or NULL when absent; borrowed for the request. */
const char *request_query(const struct request *rq, const char *name);

/*
 * Checks the syntax of a listen address and splits it: "HOST:PORT" or "[V6]:PORT", a non-empty
 * host and a port 0..65535.  Returns 0 with `host` (NUL-terminated) and *port, or -1 with a
 * sentence in `err`.  Nothing is resolved.
 */
int http_listen_split(const char *listen, char *host, size_t host_cap, uint16_t *port, char *err,
                      size_t errlen);

/* What a program serves, and the few ways orderd and provider-sim listen differently. */
struct http_server_options {
    /*
     * Answers one request into `resp` (response_init()ed; freed by the server).  Called on the
     * connection's thread once the body is in, or at once for a refused one (body_too_big).
     */
    void (*handle)(void *ctx, const struct request *rq, struct response *resp);
    /*
     * May be NULL.  Told of each response once it is queued, with the time since the request
     * began: the request log and the metrics.  Not called for a dropped response.
     */
    void (*answered)(void *ctx, const struct request *rq, const struct response *resp,
                     double seconds);
    /*
     * May be NULL.  One line of the server's own, without a newline: libmicrohttpd's messages,
     * a header that could not be added, requests a stop had to abandon.
     */
    void (*log)(void *ctx, const char *line);
    void *ctx; /* borrowed: it must outlive the server */

    int ipv6;          /* 1: IPv6 hosts and "[V6]:PORT" too; 0: IPv4 only */
    int reuse_address; /* 1: let the listening address be reused at once (SO_REUSEPORT) */
    /*
     * 1: a Content-Length over HTTP_BODY_MAX is answered (413) before its bytes are read, and
     * MHD then closes the connection; 0: the body is read and dropped, then answered.
     */
    int refuse_early;
    size_t drain_max; /* a body over the cap is read and dropped up to this much; 0: no limit */
    int stop_grace_s; /* how long a stop waits for the requests in flight */
};

struct http_server;

/*
 * Starts listening on `listen` ("127.0.0.1:8080", "[::1]:0", "localhost:0"; port 0: a free one)
 * with one thread per connection.  `opts` is copied.  Returns 0 and *out, or -1 with a sentence
 * in `err`.
 */
int http_server_start(const struct http_server_options *opts, const char *listen,
                      struct http_server **out, char *err, size_t errlen);

/* The URL the server is reachable at, "http://127.0.0.1:PORT" (borrowed). */
const char *http_server_url(const struct http_server *srv);

/* Stops accepting, waits for the running requests to finish, frees. NULL is a no-op. */
void http_server_stop(struct http_server *srv);

#endif /* IDEM_COMMON_HTTP_SERVER_H */
