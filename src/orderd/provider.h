/* SPDX-License-Identifier: Apache-2.0 */
/*
 * provider.h - orderd's client of the payment + email provider (provider-sim, or a real one with
 * the same API).  Every call that has an effect carries an Idempotency-Key derived from orderd's
 * own records, so calling again is always safe; what this file adds is the one judgement that
 * matters between phases: did the provider decide (2xx, or a 4xx it means), or is the outcome
 * unknown (timeout, connection lost, 5xx, its key still in progress)?  Unknown is never guessed:
 * the caller leaves its record where it was and someone asks again later.
 */
#ifndef ORDERD_PROVIDER_H
#define ORDERD_PROVIDER_H

#include <stdint.h>

#include <jansson.h>

struct provider;

enum provider_outcome {
    PROVIDER_OK = 0,  /* 2xx: done (body in doc) */
    PROVIDER_REFUSED, /* a 4xx the provider decided: declined card, unknown charge... */
    PROVIDER_UNKNOWN, /* no decision heard: timeout, connection error, 5xx, 409 in progress */
};

struct provider_reply {
    enum provider_outcome outcome;
    long status;      /* HTTP status; 0 when none came */
    json_t *doc;      /* the parsed body (new), NULL if none or not JSON */
    int replayed;     /* Idempotent-Replayed: true */
    char detail[256]; /* for logs: what went wrong */
};

/*
 * Reads the provider's answer -- `status` and `len` bytes of body, whatever they hold -- into
 * `r` (its other fields are left alone): the JSON document (nesting bounded), what the status
 * means (provider_reply.c), and a detail for the logs when it is not OK.  Fuzzed on its own.
 */
void provider_reply_read(struct provider_reply *r, long status, const char *body, size_t len);

/*
 * Makes a client for `base_url` ("http://127.0.0.1:8090", or https://), with `timeout_ms` per
 * call (connect and TLS handshake included).  Over https:// the provider's certificate must chain
 * to the system's CA store, or to the PEM certificates of `ca_file` (copied; NULL: the system's)
 * instead, and name the URL's host, which is also sent as SNI; TLS 1.2 is the least accepted.
 * None of it can be turned off.  A handshake that fails has sent nothing; the call's outcome is
 * then PROVIDER_UNKNOWN like that of a refused connection (see provider_reply.detail).
 * curl_global_init() must have run.  Returns 0 and *out, or -1.
 */
int provider_open(const char *base_url, const char *ca_file, int64_t timeout_ms,
                  struct provider **out);
void provider_close(struct provider *p);
const char *provider_url(const struct provider *p);

/* POST `path` with the JSON `body` (borrowed) and Idempotency-Key `key`; fills `r`. */
void provider_post(struct provider *p, const char *path, const char *key, const json_t *body,
                   struct provider_reply *r);

/* GET `path` with `?idempotency_key=<key>` appended (escaped); fills `r`. */
void provider_get_by_key(struct provider *p, const char *path, const char *key,
                         struct provider_reply *r);

/* Frees r->doc. */
void provider_reply_clear(struct provider_reply *r);

/* The first object of a list reply {"data":[...]} (borrowed), or NULL when the list is empty. */
const json_t *provider_first(const struct provider_reply *r);

#endif /* ORDERD_PROVIDER_H */
