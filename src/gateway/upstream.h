/*
 * upstream.h - idem-gateway's client of the upstream API: one HTTP/1.1 exchange at a time per
 * calling thread (a worker of the HTTP layer), over keep-alive connections kept in a small pool,
 * answers read with http-parser in response mode under a size cap.
 *
 * What matters most here is telling the caller what the upstream may have seen, because that
 * decides whether a retry may run: a connection that could not be made means nothing was sent
 * (UPSTREAM_NOT_SENT, the record is released); once a byte of the request left, an exchange that
 * ends without a whole answer (timeout, reset, close) is UPSTREAM_UNKNOWN -- the upstream may have
 * acted.  To keep that second case for real failures, a pooled connection is reused only while it
 * is young and shows no sign of being closed by the upstream (docs/gateway.md).
 */
#ifndef IDEM_GATEWAY_UPSTREAM_H
#define IDEM_GATEWAY_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

struct upstream;

struct upstream_options {
    const char *host; /* numeric or a name resolved once at start ("127.0.0.1", "::1") */
    uint16_t port;
    int connect_timeout_ms;
    int timeout_ms;            /* from the first byte sent to the end of the answer */
    int max_idle;              /* connections kept open between exchanges */
    size_t max_response_bytes; /* a longer body ends the exchange as UPSTREAM_TOO_LARGE */
};

/* Returns 0 with *out, or -1 with a sentence in `err` (the host does not resolve). */
int upstream_new(const struct upstream_options *opts, struct upstream **out, char *err,
                 size_t errlen);
void upstream_free(struct upstream *up);

struct upstream_header {
    const char *name;
    const char *value;
};

/* What to send.  `headers` go as given (the caller drops the hop-by-hop ones). */
struct upstream_request {
    const char *method;
    const char *target; /* "/v1/payments?x=1" */
    const struct upstream_header *headers;
    size_t nheaders;
    const char *body;
    size_t body_len;
};

enum upstream_result {
    UPSTREAM_OK,        /* a whole answer: status, headers, body */
    UPSTREAM_NOT_SENT,  /* no connection could be made: the upstream saw nothing */
    UPSTREAM_UNKNOWN,   /* sent, then no whole answer: the upstream may or may not have acted */
    UPSTREAM_TOO_LARGE, /* an answer came but its body is over max_response_bytes */
    UPSTREAM_BAD_REPLY, /* an answer came that is not HTTP/1.x: it acted or not, unknown too */
};

/* The answer; its strings live until upstream_response_clear(). */
struct upstream_response {
    int status;
    struct upstream_header *headers;
    size_t nheaders;
    char *body; /* NUL-terminated, NULL when empty */
    size_t body_len;
    double seconds; /* first byte sent to the end of the answer */
    int timed_out;  /* UPSTREAM_UNKNOWN because timeout_ms passed (not a reset or a close) */

    char *store_; /* internal: the header bytes */
    size_t store_len_, store_cap_;
    size_t headers_cap_;
};

/*
 * One exchange.  Blocks the calling thread for at most connect_timeout_ms + timeout_ms.  Fills
 * `resp` (initialised by the call) on UPSTREAM_OK and UPSTREAM_TOO_LARGE (status and headers);
 * `err` receives a sentence on every other result.
 */
enum upstream_result upstream_exchange(struct upstream *up, const struct upstream_request *rq,
                                       struct upstream_response *resp, char *err, size_t errlen);

void upstream_response_clear(struct upstream_response *resp);

/* The first value of header `name` in the answer (case-insensitive), or NULL. */
const char *upstream_response_header(const struct upstream_response *resp, const char *name);

/* A static name of a result, for logs and metrics: "ok", "not-sent", "unknown"... */
const char *upstream_result_name(enum upstream_result r);

#endif /* IDEM_GATEWAY_UPSTREAM_H */
