/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.h - what the parts of idem-check share: idem_util's allocators and buffers,
 * the raw HTTP exchange over libcurl (raw_http.c), the verdicts and their report (report.c), and
 * the conformance checklist (conformance.c).  idem-check judges an API from the outside, so nothing
 * here knows orderd: only URLs, bodies, bearer tokens and what came back on the wire.
 */
#ifndef IDEM_CHECK_H
#define IDEM_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

/* Exit codes, documented in --help and docs/idem-check.md. */
enum {
    CK_EXIT_OK = 0,          /* no check failed */
    CK_EXIT_FAIL = 1,        /* at least one check failed */
    CK_EXIT_USAGE = 2,       /* bad command line */
    CK_EXIT_UNREACHABLE = 3, /* the API did not answer at all */
};

/*
 * Memory: idem_util's allocators (util.h: xmalloc(), xstrdup(), ...), which die with
 * "idem-check: fatal: out of memory" and exit 1: a checker that cannot allocate has nothing
 * useful left to say.  Growable buffers are idem_util's strbuf.
 */
#include "strbuf.h"
#include "util.h"

/* `s` as a decimal integer from `lo` to `hi` into *out (0), or -1: util.h's parse_int64(). */
int ck_parse_long(const char *s, long lo, long hi, long *out);
/* A new random key "idem-check-<32 hex>" from the OpenSSL CSPRNG; the caller frees it. */
char *ck_random_key(void);
/* The clocks and the sleep: common/clock.h's clock_mono_ms(), clock_sleep_ms()... */
#include "clock.h"

/* A growable byte buffer with a cap: bodies and headers come from strangers (curl's dynbuf). */
struct ck_buf {
    struct strbuf sb; /* sb.buf NUL-terminated, NULL while empty */
    size_t limit;     /* bytes kept at most; the rest is counted in `dropped` */
    size_t dropped;
};

void ck_buf_add(struct ck_buf *b, const void *p, size_t n);
void ck_buf_release(struct ck_buf *b);

/* ---- HTTP (raw_http.c) ------------------------------------------------------------------------
 */

/* One request, described by borrowed strings that must live until the exchange returns. */
struct ck_request {
    const char *method; /* "GET", "POST", ... */
    const char *url;    /* absolute */
    const char *who;  /* the header line that says who calls ("Authorization: Bearer T"), or NULL */
    const char *body; /* NULL: no body */
    size_t body_len;
    const char *headers[4]; /* extra header lines as curl takes them ("Name: v", "Name;" = empty) */
    size_t n_headers;
};

/* What came back.  `status` is 0 when no HTTP answer arrived; `error` then says why. */
struct ck_response {
    long status;
    int transport_failed; /* no answer: refused, reset, timed out, ... */
    int unreachable;      /* the connection could not even be opened */
    char error[CURL_ERROR_SIZE + 128];
    struct ck_buf body;
    struct ck_buf head; /* the header block of the final response, raw lines */
};

int ck_http_global_init(void);
void ck_http_global_cleanup(void);

/*
 * Sends the `n` requests at once (one connection each, driven by one curl multi handle) and fills
 * `out[i]` for `reqs[i]`; each request is bounded by `timeout_ms`.  n == 1 is a plain exchange.
 * Dies only on allocation failure.  Release every response with ck_response_release().
 */
void ck_http_perform(const struct ck_request *reqs, struct ck_response *out, size_t n,
                     long timeout_ms);
void ck_response_release(struct ck_response *r);

/*
 * The value of the first header `name` (case-insensitive) of `r`, trimmed, copied into `buf`
 * (truncated to `cap`).  Returns 1 if present, 0 if not (then buf is "").
 */
int ck_response_header(const struct ck_response *r, const char *name, char *buf, size_t cap);
/* Whether `r` carries "Idempotent-Replayed: true". */
int ck_response_replayed(const struct ck_response *r);
/* Whether `a` and `b` have the same status and byte-identical bodies. */
int ck_response_same(const struct ck_response *a, const struct ck_response *b);
/*
 * One line of evidence about `r` into `buf`: status, the headers that matter here
 * (Content-Type, Location, Idempotent-Replayed, Retry-After) and at most 120 bytes of body with
 * control characters shown as '.'.
 */
void ck_response_describe(const struct ck_response *r, char *buf, size_t cap);
/* The largest body an exchange keeps (1 MiB); the rest is counted in body.dropped. */
size_t ck_body_limit(void);
/*
 * `s` percent-encoded for a query argument (every byte but A-Z a-z 0-9 - . _ ~) into `out`.
 * Returns 0, or -1 when it does not fit in `cap` (3 * strlen(s) + 1 always does).
 */
int ck_url_escape(const char *s, char *out, size_t cap);

/* ---- the report (report.c) --------------------------------------------------------------------
 */

enum ck_verdict { CK_PASS, CK_FAIL, CK_WARN, CK_SKIP };

struct ck_result {
    const char *id;    /* stable machine name, e.g. "replay" */
    const char *title; /* what is checked, with the expectation */
    enum ck_verdict verdict;
    char evidence[1024];
};

struct ck_report {
    struct ck_result results[24];
    size_t n;
};

const char *ck_verdict_name(enum ck_verdict v);
/* Adds a result; `fmt` formats its evidence.  Returns it so a caller may amend it. */
struct ck_result *ck_report_add(struct ck_report *rep, const char *id, const char *title,
                                enum ck_verdict v, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int ck_report_failed(const struct ck_report *rep);
void ck_report_print_table(const struct ck_report *rep, const char *target);
void ck_report_print_json(const struct ck_report *rep, const char *target, int exit_code);

/* ---- conformance (conformance.c) --------------------------------------------------------------
 */

struct ck_conformance_options {
    const char *url;  /* base URL, e.g. http://127.0.0.1:8080 */
    const char *path; /* the write endpoint under test, default /api/orders */
    const char *who;  /* user 1: the header line that names the caller */
    const char *who2; /* user 2, another scope: "Authorization: Bearer T2", "X-Consumer-Id: b" */
    const char *body; /* a valid JSON body for the endpoint */
    const char *invalid_body; /* a body the API rejects before executing, default {} */
    const char *count_url;    /* optional GET that counts effects (see docs/idem-check.md) */
    long timeout_ms;          /* per request */
    int storm;                /* parallel same-key requests */
};

/*
 * Runs the checklist against the API, filling `rep`.  Returns CK_EXIT_UNREACHABLE if the API
 * did not answer the first request at all (`why` then says why), else 0.
 */
int ck_conformance_run(const struct ck_conformance_options *opt, struct ck_report *rep, char *why,
                       size_t why_cap);

/* ---- random numbers (util.c) ----------------------------------------------------------------
 */

/* xorshift64*: not for secrets, only for deciding which fault hits what. */
struct ck_rng {
    uint64_t s;
};
void ck_rng_seed(struct ck_rng *r);
/* Uniform in [0, 1). */
double ck_rng_double(struct ck_rng *r);

#endif /* IDEM_CHECK_H */
