/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client.h - the one public header of libidem-client, the client half of idem.
 *
 * A retry is only safe when it carries the key of the first attempt.  libidem-client sends an
 * HTTP request with an Idempotency-Key and retries it under a policy (exponential backoff with
 * full jitter, caps on attempts and on total time, Retry-After honoured), reusing the same key
 * and the same bytes for every attempt.  An intent journal, a small append-only file, maps a
 * business intent ("buy-ticket-42") to its key before the first byte is sent, so a process that
 * dies and runs again retries the same intent instead of starting a new one.
 *
 * The library stands alone: it needs libcurl, not libidem.  Conventions follow include/idem/idem.h
 * (docs/client.md): 0 is success and a negative IDEM_CLIENT_E* code is a failure; business
 * outcomes (a final answer, retries exhausted) come back through an enum out-parameter; every
 * result says whether it is new (the caller frees it with the named function) or borrowed (valid
 * until the named event).  The library never aborts and keeps no global mutable state of its own
 * (libcurl's global initialisation is reference-counted by libcurl).
 */
#ifndef IDEM_CLIENT_H
#define IDEM_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(IDEM_CLIENT_BUILDING) && defined(__GNUC__)
#define IDEM_CLIENT_API __attribute__((visibility("default")))
#else
#define IDEM_CLIENT_API
#endif

#define IDEM_CLIENT_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/* One list makes the enum, idem_client_strerror() and idem_client_err_name(). */
#define IDEM_CLIENT_ERRNO_MAP(XX)                                                                  \
    XX(ENOMEM, -1, "out of memory")                                                                \
    XX(EINVAL, -2, "invalid argument")                                                             \
    XX(EKEY, -3, "idempotency key invalid")                                                        \
    XX(ERANDOM, -4, "the operating system gave no random bytes")                                   \
    XX(ECURL, -5, "libcurl could not be set up")                                                   \
    XX(EJOURNAL, -6, "intent journal cannot be read or written")                                   \
    XX(ECORRUPT, -7, "intent journal holds a corrupt or truncated record")                         \
    XX(EINTENT, -8, "intent already journaled with another key")                                   \
    XX(ETOOBIG, -9, "value exceeds its size cap")

enum idem_client_errno {
#define IDEM_CLIENT__ERR_ENUM(name, code, text) IDEM_CLIENT_##name = (code),
    IDEM_CLIENT_OK = 0,
    IDEM_CLIENT_ERRNO_MAP(IDEM_CLIENT__ERR_ENUM)
#undef IDEM_CLIENT__ERR_ENUM
};

/* Returns a static English sentence for an error code ("out of memory"; "success" for 0). */
IDEM_CLIENT_API const char *idem_client_strerror(int err);
/* Returns the static name of a code ("IDEM_CLIENT_ENOMEM"; "IDEM_CLIENT_OK" for 0), or
 * "IDEM_CLIENT_UNKNOWN". */
IDEM_CLIENT_API const char *idem_client_err_name(int err);

/* Frees memory the library handed out as new bytes (error messages).  NULL is a no-op. */
IDEM_CLIENT_API void idem_client_free(void *p);

/* ---------------------------------------------------------------------------------------------
 * Keys
 * ------------------------------------------------------------------------------------------- */

#define IDEM_CLIENT_KEY_MAX 255
#define IDEM_CLIENT_UUID_LEN 36

/*
 * Writes a new random UUID version 4 (RFC 9562), lowercase, 36 characters and a NUL, into `out`.
 * The 122 random bits come from the kernel's CSPRNG (getrandom), never from rand().
 * Returns 0, or IDEM_CLIENT_ERANDOM when the kernel gave no random bytes.
 */
IDEM_CLIENT_API int idem_client_key_new(char out[IDEM_CLIENT_UUID_LEN + 1]);

/*
 * Checks that a caller's key can be sent as a bare Idempotency-Key token that servers (and
 * libidem's idem_key_parse) take verbatim: 1 to IDEM_CLIENT_KEY_MAX characters of visible ASCII
 * (0x21-0x7E), no comma, not starting with a double quote.  Returns 0, or IDEM_CLIENT_EKEY and,
 * if `why` is not NULL, a static sentence in *why.
 */
IDEM_CLIENT_API int idem_client_key_check(const char *key, const char **why);

/* ---------------------------------------------------------------------------------------------
 * The intent journal
 *
 * An append-only text file; one self-checking record per line:
 *
 *     <crc32: 8 hex digits> <payload length: decimal> <payload>\n
 *
 * where the CRC-32 (IEEE) and the length cover the payload.  Payloads:
 *
 *     K <unix-ms> <intent> <key>       the intent's key, written before the first send
 *     S <unix-ms> <intent> <status>    the final HTTP status, once known
 *
 * Intent names and keys are percent-encoded (bytes outside 0x21-0x7E, and '%').  Every append is
 * one write() followed by fsync(); the file is locked (flock) while it is read and appended to,
 * so several processes may share it.  A record whose checksum or length does not match, or a
 * last line without its newline (a write cut short), is reported as IDEM_CLIENT_ECORRUPT with
 * the file and line number; it is never skipped or used.
 * ------------------------------------------------------------------------------------------- */

#define IDEM_CLIENT_INTENT_MAX 255

struct idem_client_journal;

/* What the journal knows of one intent. */
struct idem_client_intent {
    const char *name;   /* the intent name */
    const char *key;    /* its Idempotency-Key */
    int final_status;   /* the final HTTP status (see idem_client_journal_finish), 0 if unknown */
    int64_t created_ms; /* when the key was journaled (Unix ms) */
    int created;        /* idem_client_journal_begin() only: 1 if this call journaled the key */
};

/*
 * Opens the journal at `path`, creating the file (mode 0600) if it does not exist; the directory
 * must exist.  Reads and checks every record.
 *
 * Returns 0 and *out (new, close with idem_client_journal_close), or IDEM_CLIENT_EJOURNAL (the
 * file cannot be opened, locked or read), IDEM_CLIENT_ECORRUPT (a bad record), IDEM_CLIENT_ETOOBIG
 * (file over 64 MiB), IDEM_CLIENT_ENOMEM.  On failure *out is NULL and, if `errmsg` is not NULL,
 * *errmsg receives a new sentence naming the file and, for a bad record, its line ("PATH:3:
 * checksum mismatch ..."); free it with idem_client_free.
 */
IDEM_CLIENT_API int idem_client_journal_open(const char *path, struct idem_client_journal **out,
                                             char **errmsg);

/* Closes the journal.  NULL is a no-op. */
IDEM_CLIENT_API void idem_client_journal_close(struct idem_client_journal *j);

/* The path given to idem_client_journal_open, borrowed until idem_client_journal_close. */
IDEM_CLIENT_API const char *idem_client_journal_path(const struct idem_client_journal *j);

/* The detail of the last failure on `j` (names file and line), borrowed until the next call on
 * `j`; "" when there was none. */
IDEM_CLIENT_API const char *idem_client_journal_errmsg(const struct idem_client_journal *j);

/*
 * Looks `intent` up, after reading what other processes may have appended.  Sets *out to the
 * intent (borrowed until the next call on `j`), or to NULL when the journal does not know it.
 * Returns 0, or the errors of idem_client_journal_open.
 */
IDEM_CLIENT_API int idem_client_journal_lookup(struct idem_client_journal *j, const char *intent,
                                               const struct idem_client_intent **out);

/*
 * Gives `intent` its key: the journaled one if the intent is known, otherwise `key` (or, when
 * `key` is NULL, a new UUIDv4), which is appended and fsync'd before the call returns.  The
 * lookup and the append happen under one exclusive lock, so two processes naming the same new
 * intent end up with the same key.  *out (borrowed until the next call on `j`) has `created` set
 * when this call wrote the record.
 *
 * Returns 0, IDEM_CLIENT_EINTENT when the intent is journaled with a key other than `key`,
 * IDEM_CLIENT_EINVAL (intent empty, longer than IDEM_CLIENT_INTENT_MAX, or holding a NUL),
 * IDEM_CLIENT_EKEY (see idem_client_key_check), IDEM_CLIENT_ERANDOM, or the errors of
 * idem_client_journal_open.
 */
IDEM_CLIENT_API int idem_client_journal_begin(struct idem_client_journal *j, const char *intent,
                                              const char *key,
                                              const struct idem_client_intent **out);

/*
 * Records the final HTTP status of a known intent (appended and fsync'd).  A 2xx is for good: an
 * intent that succeeded keeps its 2xx, whatever a later run says (a 422 because the body was
 * edited does not undo the purchase).  Any other status is replaced by the next final one (a 401
 * fixed with the right token).  Nothing is written when the status would not change.
 * Returns 0, IDEM_CLIENT_EINVAL for an unknown intent or a status outside 100..999, or the
 * errors of idem_client_journal_open.
 */
IDEM_CLIENT_API int idem_client_journal_finish(struct idem_client_journal *j, const char *intent,
                                               int status);

/* The number of intents known at the last read, and the i-th of them in the order they were
 * first journaled (borrowed until the next call on `j`; NULL when out of range). */
IDEM_CLIENT_API size_t idem_client_journal_count(const struct idem_client_journal *j);
IDEM_CLIENT_API const struct idem_client_intent *
idem_client_journal_at(const struct idem_client_journal *j, size_t i);

/*
 * Rewrites the journal without the finished intents (a final status is journaled) journaled more
 * than `older_than_ms` ago; unfinished intents are always kept, whatever their age, since a retry
 * may still come.  Keep `older_than_ms` above the server's retention of idempotency records (a
 * dropped intent run again gets a new key).  The new file replaces the old one atomically (write,
 * fsync, rename, fsync of the directory); other processes using the journal follow it at their
 * next call.  *dropped and *kept (may be NULL) receive the counts.  Returns 0 or the errors of
 * idem_client_journal_open.
 *
 * The journal also compacts itself, dropping finished intents older than 7 days, when an append
 * takes it past 16 MiB; lookups read only what was appended since the last call, so a journal of
 * many intents stays fast.
 */
IDEM_CLIENT_API int idem_client_journal_compact(struct idem_client_journal *j,
                                                int64_t older_than_ms, size_t *dropped,
                                                size_t *kept);

/* ---------------------------------------------------------------------------------------------
 * The client: one call sends a request and retries it
 * ------------------------------------------------------------------------------------------- */

struct idem_client;
struct idem_client_response;

enum idem_client_outcome {
    IDEM_CLIENT_OUTCOME_NONE = 0,  /* (attempt reports only) another attempt follows */
    IDEM_CLIENT_OUTCOME_FINAL,     /* a final HTTP answer: 2xx, or a status that is not retried */
    IDEM_CLIENT_OUTCOME_EXHAUSTED, /* the last answer was retryable but attempts or time ran out */
    IDEM_CLIENT_OUTCOME_FAILED,    /* a transport failure no retry can fix (bad URL, TLS, cap) */
};

/*
 * What happened in one attempt, passed to the attempt callback right after the attempt and
 * before any pause.  The strings are borrowed until the callback returns.
 */
struct idem_client_attempt {
    int n;                            /* 1 for the first attempt */
    int status;                       /* HTTP status, 0 when no answer came */
    int transport_error;              /* libcurl's CURLcode, 0 when an answer came */
    const char *error;                /* libcurl's sentence for transport_error, NULL when 0 */
    int64_t waited_ms;                /* pause before this attempt (0 for the first) */
    int64_t took_ms;                  /* duration of this attempt */
    int64_t retry_after_ms;           /* the answer's Retry-After, -1 if absent or not understood */
    int64_t next_delay_ms;            /* pause before the next attempt, -1 when none follows */
    enum idem_client_outcome outcome; /* NONE when another attempt follows */
    const char *reason;               /* why it is retried or why it stops: a static sentence */
    /* 1 when the answer carried "Idempotent-Replayed: true" (any case): the server sent back what
     * it stored for the key instead of running the request, which it may do from memory without
     * its store; 0 without that header and without an answer. */
    int replayed;
};

typedef void (*idem_client_attempt_fn)(const struct idem_client_attempt *attempt, void *arg);

/*
 * The retry policy and limits.  Zero fields take the defaults in brackets.  A retry waits
 * uniform[0, min(max_delay_ms, base_delay_ms * 2^(n-1))] ms after attempt n ("full jitter"), or
 * the answer's Retry-After if that is longer.  No retry starts when the pause would end past
 * max_time_ms from the start; each attempt is also cut off at the time left.
 */
struct idem_client_options {
    int max_attempts;           /* attempts in all, first included [5] */
    int64_t max_time_ms;        /* total time for all attempts and pauses [60000] */
    int64_t base_delay_ms;      /* first backoff ceiling [250] */
    int64_t max_delay_ms;       /* largest backoff ceiling (Retry-After may exceed it) [10000] */
    int64_t connect_timeout_ms; /* per connection [10000] */
    int64_t attempt_timeout_ms; /* per attempt, connection included [30000] */
    size_t max_response_bytes;  /* response body cap; a larger body fails the call [16 MiB] */
    const char *user_agent;     /* [idem-client/<version>]; copied */
    idem_client_attempt_fn on_attempt; /* optional per-attempt report */
    void *on_attempt_arg;              /* passed to on_attempt */
};

/*
 * Makes a client: a libcurl easy handle (connections are reused between calls) and a jitter
 * generator seeded from the kernel's random bytes.  NULL `opts` means defaults.
 * Returns 0 and *out (new, close with idem_client_close), IDEM_CLIENT_EINVAL for a negative
 * limit, IDEM_CLIENT_ECURL, or IDEM_CLIENT_ENOMEM.
 */
IDEM_CLIENT_API int idem_client_open(const struct idem_client_options *opts,
                                     struct idem_client **out);

/* Closes the client and its connections.  NULL is a no-op.  A journal set on it stays open. */
IDEM_CLIENT_API void idem_client_close(struct idem_client *c);

/* Re-seeds the jitter generator, so that a test sees the same pauses on every run. */
IDEM_CLIENT_API void idem_client_seed(struct idem_client *c, uint64_t seed);

/* Sets the journal used by requests that name an intent (borrowed: it must outlive its use;
 * NULL unsets it). */
IDEM_CLIENT_API void idem_client_set_journal(struct idem_client *c, struct idem_client_journal *j);

/* One request.  Everything is borrowed for the duration of idem_client_send(). */
struct idem_client_request {
    const char *method;         /* "POST", "PUT", "DELETE", "GET", ... */
    const char *url;            /* http:// or https:// */
    const char *const *headers; /* `nheaders` extra "Name: value" lines */
    size_t nheaders;
    const void *body; /* NULL: no body */
    size_t body_len;
    const char *key;    /* Idempotency-Key to send; NULL: none, unless `intent` gives one */
    const char *intent; /* journal the key under this name first (needs a journal) */
};

/*
 * Sends `req` and retries it under the client's policy until a final answer, a failure no retry
 * can fix, or the attempt / time caps.  Every attempt sends the same key and the same bytes.
 *
 * Retried: connection failures, timeouts, a connection closed or reset before the answer; 429,
 * 502, 503, 504, and 409 when it says it is temporary (a Retry-After header, or a problem whose
 * type mentions "request-in-progress", as an idempotent server answers while the first request
 * with the key still runs).  Every other status is final: 2xx, 400, 401, 403, 404, 413, 415,
 * 422, a 409 business conflict, 500, ...
 *
 * With `intent`, the key comes from idem_client_journal_begin() on the client's journal (given
 * `key`, if any, must match it) and is fsync'd before the first attempt; a final answer's status
 * is then recorded with idem_client_journal_finish().  The journal is only read and written here,
 * never by attempts.
 *
 * Unless the caller sends its own, the request carries "Content-Type: application/json" when it
 * has a body.  Redirects are not followed; only http and https are spoken.
 *
 * Returns 0, *outcome (FINAL, EXHAUSTED or FAILED) and *resp (new, free with
 * idem_client_response_free): the last attempt's answer, status 0 if it had none.  Returns a
 * negative code, with detail in idem_client_errmsg(), when nothing could be sent:
 * IDEM_CLIENT_EINVAL (bad request fields, an Idempotency-Key among `headers` as well as a key, an
 * intent without a journal), IDEM_CLIENT_EKEY, IDEM_CLIENT_ENOMEM, or the journal's errors.  A
 * failure to record the final status does not undo the answer: the call returns 0, and
 * idem_client_response_journal_error() says what went wrong.
 */
IDEM_CLIENT_API int idem_client_send(struct idem_client *c, const struct idem_client_request *req,
                                     struct idem_client_response **resp,
                                     enum idem_client_outcome *outcome);

/* The detail of the last failure on `c`, borrowed until the next call on `c`; "" if none. */
IDEM_CLIENT_API const char *idem_client_errmsg(const struct idem_client *c);

/* ---------------------------------------------------------------------------------------------
 * The answer.  Every string and byte below is borrowed until idem_client_response_free.
 * ------------------------------------------------------------------------------------------- */

/* The final attempt's HTTP status, 0 when it got no answer. */
IDEM_CLIENT_API int idem_client_response_status(const struct idem_client_response *r);

/* The status line as received ("HTTP/1.1 201 Created"), NULL without an answer. */
IDEM_CLIENT_API const char *idem_client_response_status_line(const struct idem_client_response *r);

/* The body (also NUL-terminated, for convenience) and its length in *len (may be NULL). */
IDEM_CLIENT_API const void *idem_client_response_body(const struct idem_client_response *r,
                                                      size_t *len);

/* The header lines after the status line, as received without their CRLF ("Location: /x"). */
IDEM_CLIENT_API size_t idem_client_response_header_count(const struct idem_client_response *r);
IDEM_CLIENT_API const char *idem_client_response_header_line(const struct idem_client_response *r,
                                                             size_t i);

/* The value of the first header named `name` (case-insensitive), without its leading white
 * space; NULL if absent. */
IDEM_CLIENT_API const char *idem_client_response_header(const struct idem_client_response *r,
                                                        const char *name);

/* How many attempts were made, and the milliseconds from the call to its end. */
IDEM_CLIENT_API int idem_client_response_attempts(const struct idem_client_response *r);
IDEM_CLIENT_API int64_t idem_client_response_elapsed_ms(const struct idem_client_response *r);

/* The Idempotency-Key every attempt carried, NULL if none. */
IDEM_CLIENT_API const char *idem_client_response_key(const struct idem_client_response *r);

/* Why the call stopped: a sentence ("final answer: 201", "5 attempts made, the last failed: ...").
 */
IDEM_CLIENT_API const char *idem_client_response_reason(const struct idem_client_response *r);

/* The last attempt's transport error (libcurl's detail), NULL when it got an answer. */
IDEM_CLIENT_API const char *idem_client_response_error(const struct idem_client_response *r);

/* Why the final status could not be journaled (names file and line), NULL when all went well. */
IDEM_CLIENT_API const char *
idem_client_response_journal_error(const struct idem_client_response *r);

/* Frees the answer.  NULL is a no-op. */
IDEM_CLIENT_API void idem_client_response_free(struct idem_client_response *r);

#ifdef __cplusplus
}
#endif
#endif /* IDEM_CLIENT_H */
