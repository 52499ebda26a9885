/* SPDX-License-Identifier: Apache-2.0 */
/*
 * auth.h - bearer tokens.  A token is "idem_" followed by 64 hex digits of 32 random bytes; the
 * store keeps only its SHA-256, so a copy of the database does not hand out live credentials.
 * The principal of a request is the user id its token belongs to.
 */
#ifndef ORDERD_AUTH_H
#define ORDERD_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct idem_store;

#define AUTH_TOKEN_PREFIX "idem_"
#define AUTH_HASH_HEX_LEN 64

/*
 * How long a token found in the store is trusted without asking it again.  A token whose row is
 * deleted or moved to another user keeps working for at most this long in each orderd process
 * (docs/orderd.md).  Unknown tokens are never remembered: a new token works at once.
 */
#define AUTH_CACHE_TTL_MS 5000
#define AUTH_CACHE_SLOTS 4096
/*
 * A token the store does not know is remembered as unknown this long, so a client repeating a
 * revoked or mistyped token is answered 401 without a store read each time.
 */
#define AUTH_NEGATIVE_TTL_MS 1000

/*
 * A bounded memory of token hash -> user id, shared by every connection thread: direct-mapped
 * (a token's hash picks its slot, a newer token takes a slot over), each slot under one of a few
 * striped locks.  Only hashes are kept, as in the store.
 */
struct auth_cache;

/*
 * A cache of `slots` entries trusted for `ttl_ms` (new, free with auth_cache_free).  At most
 * `max_lookups` store reads for tokens it does not know run at once; the others wait up to 2 s
 * for their turn, then are AUTH_BUSY: a flood of made-up tokens cannot take every pooled
 * connection from the requests with real ones.  `max_lookups` 0: no cap.
 */
struct auth_cache *auth_cache_new(int64_t ttl_ms, size_t slots, int max_lookups);
/* NULL is a no-op. */
void auth_cache_free(struct auth_cache *c);

/*
 * Finds the user of the Authorization header value `authorization` ("Bearer <token>"; may be
 * NULL), in `cache` (may be NULL: always the store) and else in the store.  Returns 0 and
 * *user_id (new, free with free()) for a known token; 1 when the header is missing, malformed or
 * the token unknown; a negative IDEM_E* when the store failed.  With `st` NULL the store is not
 * asked: a well-formed token the cache does not know gives AUTH_ASK_STORE (an event-loop thread,
 * which must not block, asks again from a worker).
 */
#define AUTH_ASK_STORE 2
#define AUTH_BUSY 3 /* no lookup slot freed within 2 s: 503, retry */
int auth_principal(struct auth_cache *cache, struct idem_store *st, const char *authorization,
                   char **user_id);

/*
 * Makes sure user `name` exists and gives it a new token.  Returns 0 and *token (new, free with
 * free()), or a negative IDEM_E* with a sentence in `err`.
 */
int auth_token_create(struct idem_store *st, const char *name, char **token, char *err,
                      size_t errlen);

/*
 * `orderd token list`: one line per token to `out` -- its id (the first 12 hex digits of its
 * SHA-256, all that is stored), the user's name, when it was made.  `user` (may be NULL) keeps one
 * user's.  Returns the number listed, or a negative IDEM_E* with a sentence in `err`.
 */
#define AUTH_TOKEN_ID_LEN 12
int auth_token_list(struct idem_store *st, const char *user, FILE *out, char *err, size_t errlen);

/*
 * `orderd token revoke`: deletes the tokens of user `user`, or the one whose id (a prefix of its
 * hash, at least 8 hex digits) is `token_id`, or the token `token` itself.  Exactly one of the
 * three.  *revoked receives how many went.  The store forgets them at once; a running orderd stops
 * accepting one within AUTH_CACHE_TTL_MS.  Returns 0 or a negative IDEM_E* with `err`.
 */
int auth_token_revoke(struct idem_store *st, const char *user, const char *token_id,
                      const char *token, int *revoked, char *err, size_t errlen);

#endif /* ORDERD_AUTH_H */
