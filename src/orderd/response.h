/*
 * response.h - an HTTP response as orderd's handlers build it, before it meets libmicrohttpd:
 * status, a few headers, the body bytes, plus what the request log and the metrics want to know
 * (operation, idempotency outcome, principal).  Keeping it a plain struct lets the engine glue
 * copy a stored response into it byte for byte, and keeps MHD out of the business code.
 *
 * Every error is an RFC 9457 problem: {"type":"/problems/<code>","title","status","detail",
 * "code"} with Content-Type application/problem+json.
 */
#ifndef ORDERD_RESPONSE_H
#define ORDERD_RESPONSE_H

#include <stddef.h>

#include <jansson.h>

#define RESPONSE_MAX_HEADERS 8

struct response_header {
    char *name;
    char *value;
};

struct response {
    int status;
    char *body; /* malloc'd, may be NULL when body_len is 0 */
    size_t body_len;
    struct response_header headers[RESPONSE_MAX_HEADERS];
    size_t nheaders;

    /* For the log and the metrics, not sent. */
    const char *operation; /* static: "orders.create", "other"... */
    const char *outcome;   /* static; NULL: derived from the status when sent */
    char *principal;       /* the user id once authenticated; NULL before */
};

void response_init(struct response *r);
/* Frees the body, the headers and the principal; `r` may be initialised again. */
void response_clear(struct response *r);

/* Sets (replaces) a header; both strings are copied. */
void response_set_header(struct response *r, const char *name, const char *value);
/* The value of a header set on `r`, or NULL (borrowed). */
const char *response_header(const struct response *r, const char *name);
/* Replaces the body with a copy of `len` bytes. */
void response_set_body(struct response *r, const void *body, size_t len);

/* Status, Content-Type application/json and the compact serialisation of `doc` (borrowed). */
void response_json(struct response *r, int status, const json_t *doc);

/*
 * Status and a problem+json body for `code` (a stable code from docs/http-api.md; its title
 * comes from a table), with a sentence of `detail`.  Headers already set stay.
 */
void response_problem(struct response *r, int status, const char *code, const char *detail);

/* The same with the members of `extra` (borrowed, may be NULL) added: "state", "orderId"... */
void response_problem_ext(struct response *r, int status, const char *code, const char *detail,
                          const json_t *extra);

/* The compact bytes of a problem document (new, free with free()). */
char *problem_body(int status, const char *code, const char *detail, size_t *len);
/* The same with the members of `extra` (borrowed, may be NULL) added after "code". */
char *problem_body_ext(int status, const char *code, const char *detail, const json_t *extra,
                       size_t *len);

/* Compact JSON text of `doc` in insertion order (new, free with free()). */
char *json_text(const json_t *doc, size_t *len);

#define CONTENT_TYPE_JSON "application/json"
#define CONTENT_TYPE_PROBLEM "application/problem+json"

#endif /* ORDERD_RESPONSE_H */
