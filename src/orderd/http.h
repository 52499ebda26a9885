/*
 * http.h - orderd's face to libmicrohttpd: the listening server, and the request as handlers
 * see it.  Handlers never call MHD themselves; they read the request through these accessors
 * and fill a struct response (response.h), which http.c turns into MHD's response.
 */
#ifndef ORDERD_HTTP_H
#define ORDERD_HTTP_H

#include <stddef.h>
#include <stdint.h>

struct app;
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

struct http_server;

/*
 * Checks the syntax of a listen address and splits it: "HOST:PORT" or "[V6]:PORT", a non-empty
 * host and a port 0..65535.  Returns 0 with `host` (NUL-terminated) and *port, or -1 with a
 * sentence in `err`.  Nothing is resolved.
 */
int http_listen_split(const char *listen, char *host, size_t host_cap, uint16_t *port, char *err,
                      size_t errlen);

/*
 * Starts listening on `listen` ("127.0.0.1:8080", "[::1]:0", "localhost:0") and serving
 * requests through router_dispatch() with `app` (borrowed: it must outlive the server).  Returns
 * 0 and *out, or -1 with a sentence in `err`.
 */
int http_server_start(struct app *app, const char *listen, struct http_server **out, char *err,
                      size_t errlen);

/* The URL the server is reachable at, "http://127.0.0.1:PORT" (borrowed). */
const char *http_server_url(const struct http_server *srv);

/* Stops accepting, waits for the running requests to finish, frees. NULL is a no-op. */
void http_server_stop(struct http_server *srv);

#endif /* ORDERD_HTTP_H */
