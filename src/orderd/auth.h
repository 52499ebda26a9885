/*
 * auth.h - bearer tokens.  A token is "idem_" followed by 64 hex digits of 32 random bytes; the
 * store keeps only its SHA-256, so a copy of the database does not hand out live credentials.
 * The principal of a request is the user id its token belongs to.
 */
#ifndef ORDERD_AUTH_H
#define ORDERD_AUTH_H

#include <stddef.h>

struct idem_store;

#define AUTH_TOKEN_PREFIX "idem_"
#define AUTH_HASH_HEX_LEN 64

/*
 * Finds the user of the Authorization header value `authorization` ("Bearer <token>"; may be
 * NULL).  Returns 0 and *user_id (new, free with free()) for a known token; 1 when the header
 * is missing, malformed or the token unknown; a negative IDEM_E* when the store failed.
 */
int auth_principal(struct idem_store *st, const char *authorization, char **user_id);

/*
 * Makes sure user `name` exists and gives it a new token.  Returns 0 and *token (new, free with
 * free()), or a negative IDEM_E* with a sentence in `err`.
 */
int auth_token_create(struct idem_store *st, const char *name, char **token, char *err,
                      size_t errlen);

#endif /* ORDERD_AUTH_H */
