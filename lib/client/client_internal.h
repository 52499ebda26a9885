/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h - what libidem-client's own files share and client.h does not show: the jitter
 * generator, the retry policy's pure functions (so the unit tests in tests/client/ can pin them
 * without a network), the journal's checksum, and small helpers.  Internal non-static symbols
 * are named idem_client__*, so that a program may link libidem and libidem-client statically
 * together without two idem__strdup.  Programs never include this file.
 */
#ifndef IDEM_CLIENT_INTERNAL_H
#define IDEM_CLIENT_INTERNAL_H

#include "idem/client.h"

#include <stdarg.h>
#include <time.h>

#define IDEM_CLIENT_ERRMSG_MAX 512

/* ---- helpers (error.c) ------------------------------------------------------------------------
 */

/* The clocks (monotonic for pauses and deadlines, the wall for journal timestamps) and the
 * sleep are common/clock.h's clock_*(). */
#include "capped_buf.h"
#include "clock.h"
/* snprintf into a fixed message buffer; never overflows, always NUL-terminates. */
void idem_client__fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* malloc'd copy of `s` (NULL when `s` is NULL or memory ran out). */
char *idem_client__strdup(const char *s);
/* malloc'd copy of `n` bytes of `s` plus a NUL (NULL when memory ran out). */
char *idem_client__strndup(const char *s, size_t n);
/* ASCII case-insensitive comparison of `n` bytes. */
int idem_client__strncaseeq(const char *a, const char *b, size_t n);

/* ---- the jitter generator (rng.c) -------------------------------------------------------------
 */

/* xoshiro256** state: fast, seedable, and private to its handle; not for secrets. */
struct idem_client__rng {
    uint64_t s[4];
};

/* Seeds the generator from one 64-bit value (expanded with splitmix64; any seed, 0 included). */
void idem_client__rng_seed(struct idem_client__rng *r, uint64_t seed);
uint64_t idem_client__rng_next(struct idem_client__rng *r);
/* A uniform integer in [0, n] (inclusive), without modulo bias. */
uint64_t idem_client__rng_upto(struct idem_client__rng *r, uint64_t n);
/* Fills `buf` from the kernel's CSPRNG (getrandom).  Returns 0 or IDEM_CLIENT_ERANDOM. */
int idem_client__random_bytes(void *buf, size_t len);

/* ---- the retry policy (policy.c) --------------------------------------------------------------
 */

enum idem_client__verdict {
    IDEM_CLIENT__FINAL = 0, /* stop: a final answer or a failure no retry can fix */
    IDEM_CLIENT__RETRY = 1, /* transient: try again after a pause */
};

/*
 * Classifies an HTTP answer.  `has_retry_after` says whether the answer carried a Retry-After;
 * `body` is looked at only for a 409 (an in-progress problem).  *reason (may be NULL) receives a
 * static sentence for the -v output.
 */
enum idem_client__verdict idem_client__classify_status(int status, int has_retry_after,
                                                       const char *body, size_t body_len,
                                                       const char **reason);

/* Classifies a libcurl result code (CURLcode as int; 0 is not a transport error). */
enum idem_client__verdict idem_client__classify_transport(int curl_code, const char **reason);

/*
 * The backoff ceiling after attempt `n` (1-based): min(max_delay, base * 2^(n-1)), overflow-safe.
 */
int64_t idem_client__backoff_ceiling_ms(int n, int64_t base_ms, int64_t max_ms);

/* The full-jitter pause after attempt `n`: uniform in [0, ceiling]. */
int64_t idem_client__backoff_ms(struct idem_client__rng *r, int n, int64_t base_ms, int64_t max_ms);

/*
 * Parses a Retry-After field value (RFC 9110 §10.2.3): delay-seconds (1*DIGIT) or an HTTP-date,
 * read relative to `now` (Unix seconds).  A date in the past is a delay of 0; seconds beyond a
 * day are capped at a day.  Returns 0 and *delay_ms, or -1 for anything else (garbage,
 * negative, fractional, empty), which the caller then ignores.
 */
int idem_client__retry_after_parse(const char *value, time_t now, int64_t *delay_ms);

/* ---- the journal (journal.c) ------------------------------------------------------------------
 */

/* CRC-32 (IEEE 802.3, the one of zlib and PNG) of `len` bytes, continuing from `crc` (0 first). */
uint32_t idem_client__crc32(uint32_t crc, const void *buf, size_t len);

/* Test hook: replaces fsync() for this journal (counting or failing calls); NULL restores it. */
void idem_client__journal_set_fsync(struct idem_client_journal *j, int (*fsync_fn)(int fd));
/* Tests: the size past which an append compacts the journal (0: never). */
void idem_client__journal_set_compact_bytes(struct idem_client_journal *j, size_t bytes);

/* ---- responses (response.c) -------------------------------------------------------------------
 */

/* Adds to a response's body (common/capped_buf.h): 0, IDEM_CLIENT_ETOOBIG or _ENOMEM. */
int idem_client__body_add(struct idem_client_response *r, const void *p, size_t len);

struct idem_client_response {
    int status;
    char *status_line;
    struct capped_buf body; /* capped at the options' max_response_bytes */
    char **header_lines;
    size_t nheaders;
    size_t headers_cap;
    int attempts;
    int64_t elapsed_ms;
    char *key;
    char *reason;
    char *error;
    char *journal_error;
};

/* A fresh, empty response with a body cap of `limit` bytes, or NULL when memory ran out. */
struct idem_client_response *idem_client__response_new(size_t limit);
/* Forgets what the previous attempt received. */
void idem_client__response_reset(struct idem_client_response *r);
/*
 * Takes one raw header line from libcurl (with its CRLF).  A status line starts a new header
 * block (so 1xx interim answers are forgotten); the blank line is skipped.  Returns 0 or a
 * negative code.
 */
int idem_client__response_add_header(struct idem_client_response *r, const char *line, size_t len);
/* Sets *slot to a copy of the formatted sentence (best effort: left NULL when memory ran out). */
void idem_client__set_text(char **slot, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* IDEM_CLIENT_INTERNAL_H */
