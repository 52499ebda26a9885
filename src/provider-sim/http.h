/*
 * http.h - provider-sim's face to libmicrohttpd.  A handler reads a struct sim_request and fills
 * a struct sim_response; `drop` asks the server to close the connection without answering, which
 * is how the "lost response" fault looks to a client: the effect happened, no answer came.
 */
#ifndef SIM_HTTP_H
#define SIM_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct sim;
struct MHD_Connection;

#define SIM_BODY_MAX ((size_t)1 << 20)
#define SIM_RESPONSE_MAX_HEADERS 4

struct sim_request {
    struct MHD_Connection *conn;
    const char *method;
    const char *path;
    const char *body; /* NUL-terminated; NULL when empty */
    size_t body_len;
    int body_too_big;
};

struct sim_response {
    int status;
    char *body; /* malloc'd */
    size_t body_len;
    const char *content_type; /* static */
    struct {
        char *name;
        char *value;
    } headers[SIM_RESPONSE_MAX_HEADERS];
    size_t nheaders;
    int drop; /* close the connection instead of answering */
};

const char *request_header(const struct sim_request *rq, const char *name);
int request_header_count(const struct sim_request *rq, const char *name, const char **first,
                         size_t *first_len);
const char *request_query(const struct sim_request *rq, const char *name);

void response_set_header(struct sim_response *r, const char *name, const char *value);
/* Status and the compact text of `doc` (borrowed) as application/json. */
void response_json(struct sim_response *r, int status, const json_t *doc);
/* Status and a copy of `len` bytes with `content_type` (static). */
void response_bytes(struct sim_response *r, int status, const char *content_type, const void *body,
                    size_t len);
/* An RFC 9457 problem: {"type":"/problems/<code>","title","status","detail","code"}. */
void response_problem(struct sim_response *r, int status, const char *code, const char *detail);
/* The bytes of such a problem, with the members of `extra` (borrowed, may be NULL) added. */
char *problem_text(int status, const char *code, const char *detail, const json_t *extra,
                   size_t *len);

struct sim_server;

/* Listens on "HOST:PORT" (port 0: a free one).  Returns 0 and *out, or -1 with `err`. */
int sim_server_start(struct sim *sim, const char *listen, struct sim_server **out, char *err,
                     size_t errlen);
const char *sim_server_url(const struct sim_server *srv);
/* Stops accepting, lets requests in flight end (up to a few seconds), frees. NULL is a no-op. */
void sim_server_stop(struct sim_server *srv);

/* Answers one request (api.c). */
void api_dispatch(struct sim *sim, const struct sim_request *rq, struct sim_response *resp);

#endif /* SIM_HTTP_H */
